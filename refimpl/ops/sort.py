"""Sorting ops: argsort, top_k, argsort_top_k. Rows are ggml dim 0, the last NumPy axis.

ggml's CPU kernels use std::sort / std::partial_sort, which are not stable: the order of equal values (and
which of several equal values top_k keeps) is unspecified there. refimpl sorts stably, so among equal values
the lower index comes first and is kept. NaN breaks the strict weak ordering std::sort needs, so ggml's
result for rows holding NaN is undefined; here NaN counts as larger than every number (NumPy's placement:
last in ascending order, first in descending order and in top_k).
ggml's kernels read row i at `data + i*nb1` with packed elements and do not check it: on a permuted or
transposed view of a 3-D/4-D tensor they sort the wrong values. refimpl takes any NumPy layout.
"""
from __future__ import annotations

import numpy as np

from ..dispatch import op
from ..shapes import fail

# enum ggml_sort_order
SORT_ORDER_ASC = 0
SORT_ORDER_DESC = 1


def _rows_f32(name: str, a) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype != np.float32:
        fail(name, f"src0 must be f32 (the CPU kernel has no other type), got {a.dtype}", a=a)
    if a.ndim > 4:
        fail(name, "ggml tensors have at most 4 dims", a=a)
    return a


def _desc(a: np.ndarray) -> np.ndarray:
    """Stable descending order: ties keep index order (np.argsort(-a) would too, but puts NaN last)."""
    n = a.shape[-1]
    rev = np.argsort(a[..., ::-1], axis=-1, kind="stable")[..., ::-1]
    return (n - 1 - rev).astype(np.int32)


@op("argsort")
def argsort(a: np.ndarray, order: int = SORT_ORDER_ASC) -> np.ndarray:
    """ggml_argsort: per row, the permutation of indices that sorts it.

    a      ne [n, r1, r2, r3]   numpy (r3, r2, r1, n)   f32
    order  SORT_ORDER_ASC (0) or SORT_ORDER_DESC (1)   (enum ggml_sort_order)
    out    same ne              numpy (r3, r2, r1, n)   i32

        np.take_along_axis(a, out, -1) is a sorted in the given order

    Stable here (equal values keep index order); ggml's std::sort leaves their order unspecified.
    """
    a = _rows_f32("argsort", a)
    if order not in (SORT_ORDER_ASC, SORT_ORDER_DESC):
        fail("argsort", f"order must be SORT_ORDER_ASC (0) or SORT_ORDER_DESC (1), got {order!r}", a=a)
    if a.ndim == 0:
        a = a.reshape(1)
    if order == SORT_ORDER_ASC:
        return np.argsort(a, axis=-1, kind="stable").astype(np.int32)
    return _desc(a)


def _top_k(name: str, a, k: int) -> np.ndarray:
    a = _rows_f32(name, a)
    if a.ndim == 0:
        a = a.reshape(1)
    if int(k) != k or not 0 <= k <= a.shape[-1]:
        fail(name, f"need 0 <= k <= a.ne0, got k = {k!r}", a=a)
    return np.ascontiguousarray(_desc(a)[..., :int(k)])


@op("top_k")
def top_k(a: np.ndarray, k: int) -> np.ndarray:
    """ggml_top_k: per row, the indices of the k largest values.

    a    ne [n, r1, r2, r3]   numpy (r3, r2, r1, n)   f32, k <= n
    out  ne [k, r1, r2, r3]   numpy (r3, r2, r1, k)   i32

    Here in descending order of value (equal values: lower index first, and kept first at the cut).
    ggml documents its order as unspecified: its CPU kernel partially sorts descending and then swaps
    entries 0 and 1 (for k > 1), and with ties at the k-th value it may keep any of them -- compare as sets
    of values. Same indices as argsort_top_k, which keeps ggml's order.
    """
    return _top_k("top_k", a, k)


@op("argsort_top_k", covers=("ARGSORT",))
def argsort_top_k(a: np.ndarray, k: int) -> np.ndarray:
    """ggml_argsort_top_k: argsort(a, SORT_ORDER_DESC) viewed to its first k columns (no op of its own).

    a    ne [n, r1, r2, r3]   numpy (r3, r2, r1, n)   f32, k <= n
    out  ne [k, r1, r2, r3]   numpy (r3, r2, r1, k)   i32, ordered by descending value (ggml returns a
                                                      strided view of the full argsort; this is a copy)
    """
    return _top_k("argsort_top_k", a, k)
