"""get_rows and set_rows with Numba.

Versions:
    get_rows  the selected rows' blocks gathered (a byte copy), then decoded in threads by
              `quants.dequantize_into` (the bits of refimpl.dequantize). Only QTensor sources take this
              path (a row gather of an ndarray is a NumPy copy already).
    set_rows  an f32/f16 destination (a KV cache) with one batch of rows: the rows stored in index order
              by one loop (the last write of a repeated index wins, as in the reference), no index
              sorting, no copy of the destination when it is `out` -- what a decode step through the
              RPC server does 60 times a token, ~40 us each in the reference's NumPy, ~5 here.
Everything else, and everything the reference rejects, runs the reference (same results, same errors).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..ops import movement as ref_mv
from ..dispatch import register
from ..shapes import ne4
from ..qtensor import QTensor
from ..types import traits
from . import quants


def _covered(a, rows) -> bool:
    if not isinstance(a, QTensor) or a.type not in quants.DECODABLE or a.type in ref_mv.GET_ROWS_BAD:
        return False
    if not isinstance(rows, np.ndarray) or rows.dtype != np.int32 or a.ndim > 4 or rows.ndim > 3:
        return False
    na, nr = ne4(a.shape), ne4(rows.shape)
    if na[2] != nr[1] or na[3] != nr[2] or nr[3] != 1 or min(na) < 1:
        return False
    return rows.size == 0 or (rows.min() >= 0 and rows.max() < na[1])


@register("get_rows", backend="numba")
def get_rows(a, rows):
    """ggml_get_rows (see refimpl.ops.movement.get_rows): quantized rows decoded in Numba."""
    rows = np.asarray(rows)
    if not _covered(a, rows):
        return ref_mv.get_rows.reference(a, rows)
    tr = traits(a.type)
    na, nr = ne4(a.shape), ne4(rows.shape)
    d4 = a.data.reshape(na[3], na[2], na[1], a.data.shape[-1])
    sel = d4[np.arange(na[3])[:, None, None], np.arange(na[2])[None, :, None], rows.reshape(na[3], na[2], nr[0])]
    src = np.ascontiguousarray(sel).reshape(-1, tr.type_size)               # the selected rows' blocks
    out = quants.dequantize_into(a.type, src, np.empty((src.shape[0], tr.blck_size), np.float32))
    out_shape = tuple(reversed([na[0], nr[0], nr[1], nr[2]]))[4 - max(rows.ndim + 1, 1):]
    return out.reshape(out_shape)


_F32, _F16 = np.dtype(np.float32), np.dtype(np.float16)
_IDX = (np.dtype(np.int64), np.dtype(np.int32))


@njit(cache=True, nogil=True)
def _in_range(idx, R) -> bool:
    for i in range(idx.shape[0]):
        if idx[i] < 0 or idx[i] >= R:
            return False
    return True


@njit(cache=True, nogil=True)
def _scatter_rows(dst, rows, idx) -> None:
    """dst[idx[i], :] = rows[i, :] for i in order (the caller checked the indices: `_in_range`)."""
    for i in range(idx.shape[0]):
        r = idx[i]
        for j in range(rows.shape[1]):
            dst[r, j] = rows[i, j]


@register("set_rows", backend="numba")
def set_rows(a, b, c, out=None):
    """ggml_set_rows (see refimpl.ops.movement.set_rows) into an f32/f16 ndarray, one batch (dims 2, 3 of
    size 1): the converted rows scattered by `_scatter_rows`; NotImplemented (the reference) otherwise."""
    if (out is a and type(a) is np.ndarray and type(b) is np.ndarray and type(c) is np.ndarray and a.ndim == 2
            and b.ndim == 2 and c.ndim == 1 and c.size == 1 and b.shape[0] == 1 and a.dtype == _F32
            and b.dtype == _F32 and c.dtype in _IDX and b.shape[1] == a.shape[1] and a.flags.writeable
            and a.strides[1] == 4 and b.strides[1] == 4):
        r = int(c[0])                                 # one f32 row in place (a decode step's cache write)
        if 0 <= r < a.shape[0]:
            a[r] = b[0]
            return a
    if not (type(a) is np.ndarray and a.dtype in (_F32, _F16) and 1 <= a.ndim <= 4
            and type(b) is np.ndarray and b.dtype == _F32 and 1 <= b.ndim <= 4
            and type(c) is np.ndarray and c.dtype in _IDX and 1 <= c.ndim <= 3):
        return NotImplemented
    na, nb, nc = ne4(a.shape), ne4(b.shape), ne4(c.shape)
    E, R, n = na[0], na[1], nb[1]
    if (na[2] != 1 or na[3] != 1 or nb[2] != 1 or nb[3] != 1 or nc[1] != 1 or nc[2] != 1 or nc[3] != 1
            or nb[0] != E or nc[0] != n or n == 0 or E == 0):
        return NotImplemented
    if E > 1 and (a.strides[-1] != a.itemsize or b.strides[-1] != b.itemsize):
        return NotImplemented                         # rows not contiguous: the reference's error
    idx = c.reshape(n)
    if not (0 <= int(idx[0]) < R if n == 1 else _in_range(idx, R)):
        return NotImplemented                         # an index out of range: the reference's error
    if out is None:
        dst = a.copy()
    elif (out is a and a.flags.writeable) or (type(out) is np.ndarray and out.shape == a.shape
                                              and out.dtype == a.dtype and out.flags.writeable
                                              and not np.shares_memory(out, a)):
        dst = out
        if out is not a:
            dst[...] = a
    else:
        return NotImplemented                         # the reference says what is wrong with out
    rows = b.reshape(n, E)
    if a.dtype == _F16:
        with np.errstate(over="ignore", invalid="ignore"):
            rows = rows.astype(np.float16)            # ggml-cpu's from_float for f16, as the reference
        target, rows = dst.reshape(R, E).view(np.uint16), rows.view(np.uint16)
    else:
        target = dst.reshape(R, E)                    # unit axes dropped: a view of dst
    if n == 1:                                        # one row (a decode step's cache write): a row copy
        target[int(idx[0])] = rows[0]
    else:
        _scatter_rows(target, rows, idx)
    return dst
