"""argsort, top_k and argsort_top_k with one integer key per element.

Versions:
    _keys  per row, in one pass: key(x) * n + j as int64 -- key the f32's order as an integer in 0 .. 2^32-1
           (the sign-magnitude bits made two's-complement-monotone, -0 taken as +0 so that it ties with 0,
           every NaN the largest key), reversed for descending order; each element's key is distinct (its
           index is in it), so an unstable sort of the keys gives the reference's stable order, and the
           index is the key modulo n
    top_k  np.partition of the keys to their k smallest (descending: the k largest values, the lower
           index first among equals and at the cut), then only those k sorted: O(n + k log k) per row,
           where the reference sorts the whole row stably (test-backend-ops' TOP_K: rows of up to 524,299
           values, k mostly 1 to 15)
Registered for every numerics key: an order has no roundings, so every profile gets the reference's result
(ggml numerics included). Equal values order as in the reference: NaN above every number and the NaNs among
themselves by index, -0 equal to 0. Everything else (not f32, more than 4 dims, a bad k or order) runs the
reference: same results, same errors.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..dispatch import KEYS, register
from ..ops import sort as ref_sort

PARTITION_MAX = 8       # top_k partitions when k <= n / PARTITION_MAX, else sorts the whole row's keys


@njit(cache=True, nogil=True)
def _keys(bits, desc, out):
    """out[r, j] = key * n + j for the f32 bit patterns bits (R, n) int32; key ascending in the value
    (descending when desc), NaN the largest value, -0 the same key as +0."""
    R, n = bits.shape
    for r in range(R):
        for j in range(n):
            b = np.int64(bits[r, j])
            if b == -2147483648:                  # -0.0: +0.0's key
                b = 0
            if (b & 0x7FFFFFFF) > 0x7F800000:     # NaN
                k = np.int64(0xFFFFFFFF)
            elif b < 0:
                k = np.int64(0x7FFFFFFF) - (b & 0x7FFFFFFF)
            else:
                k = b + np.int64(0x80000000)
            if desc:
                k = np.int64(0xFFFFFFFF) - k
            out[r, j] = k * n + j


def _rows(a) -> np.ndarray | None:
    """a as contiguous f32 rows (R, n), or None where the reference should run."""
    if not (isinstance(a, np.ndarray) and a.dtype == np.float32 and 1 <= a.ndim <= 4 and a.size):
        return None
    return np.ascontiguousarray(a).reshape(-1, a.shape[-1])


def _order(a2: np.ndarray, desc: bool, k: int) -> np.ndarray:
    """The first k indices of each row's stable (ascending or descending) order, as int32."""
    n = a2.shape[1]
    keys = np.empty(a2.shape, np.int64)
    _keys(a2.view(np.int32), desc, keys)
    if k * PARTITION_MAX <= n:
        keys = np.partition(keys, k - 1, axis=-1)[:, :k]
    keys = np.sort(keys, axis=-1)[:, :k]
    return (keys % n).astype(np.int32)


@register("argsort", backend="numba", numerics=KEYS)
def argsort(a, order: int = ref_sort.SORT_ORDER_ASC) -> np.ndarray:
    """ggml_argsort (see refimpl.ops.sort.argsort) by one sort of integer keys."""
    a2 = _rows(a)
    if a2 is None or order not in (ref_sort.SORT_ORDER_ASC, ref_sort.SORT_ORDER_DESC):
        return ref_sort.argsort.reference(a, order)
    return _order(a2, order == ref_sort.SORT_ORDER_DESC, a2.shape[1]).reshape(a.shape)


def _top_k(name: str, a, k) -> np.ndarray:
    a2 = _rows(a)
    if a2 is None or isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 < k <= a.shape[-1]:
        return getattr(ref_sort, name).reference(a, k)
    return _order(a2, True, int(k)).reshape(a.shape[:-1] + (int(k),))


@register("top_k", backend="numba", numerics=KEYS)
def top_k(a, k: int) -> np.ndarray:
    """ggml_top_k (see refimpl.ops.sort.top_k): the k largest by a partition of integer keys."""
    return _top_k("top_k", a, k)


@register("argsort_top_k", backend="numba", numerics=KEYS)
def argsort_top_k(a, k: int) -> np.ndarray:
    """ggml_argsort_top_k (see refimpl.ops.sort.argsort_top_k): as top_k (the same indices, same order)."""
    return _top_k("argsort_top_k", a, k)
