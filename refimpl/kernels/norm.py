"""rms_norm and norm with Numba: the reference's operations row by row, in its order.

Versions:
    _rms_norm  f32 squares, their f64 sum (NumPy's pairwise order), f32 mean, scale and products
    _norm      f64 row sum rounded to f32 / n, f32 centring, f64 sum of the f32 squares / n -> f32 variance
Rows are split over threads (`parallel_ranges`). The f64 sums use NumPy's pairwise summation
(`pairwise_sum_f64`), so the f32 results are the reference's bits; NumPy may split a row between two
iterator buffers when it reduces many rows at once, which changes the last bits of its f64 sum and, very
rarely, an f32 result (by one ulp). Inputs other than C-contiguous f32 run the NumPy reference.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..ops.norm import norm as _norm_op
from ..ops.norm import rms_norm as _rms_norm_op
from ..ops._core import register
from ._common import pairwise_sum_f64, parallel_ranges

PAR_MIN = 1 << 17       # elements per thread at least (a hand-off to the pool costs ~70 us: SmolLM2's
                        # 128 x 576 prefill rows took 142 us on two threads, 72 on one)


@njit(cache=True, nogil=True, error_model="numpy")
def _rms_norm(a, eps, out, lo, hi):
    n = a.shape[1]
    sq = np.empty(n, np.float32)
    for r in range(lo, hi):
        x = a[r]
        for i in range(n):
            sq[i] = x[i] * x[i]
        mean = np.float32(pairwise_sum_f64(sq, 0, n) / n)
        scale = np.float32(1.0) / np.sqrt(mean + eps)
        o = out[r]
        for i in range(n):
            o[i] = x[i] * scale


@njit(cache=True, nogil=True, error_model="numpy")
def _norm(a, eps, out, lo, hi):
    n = a.shape[1]
    sq = np.empty(n, np.float32)
    for r in range(lo, hi):
        x = a[r]
        o = out[r]
        mean = np.float32(pairwise_sum_f64(x, 0, n)) / np.float32(n)
        for i in range(n):
            y = x[i] - mean
            o[i] = y
            sq[i] = y * y
        var = np.float32(pairwise_sum_f64(sq, 0, n) / n)
        scale = np.float32(1.0) / np.sqrt(var + eps)
        for i in range(n):
            o[i] = o[i] * scale


def _covered(a, eps) -> bool:
    return (isinstance(a, np.ndarray) and a.dtype == np.float32 and a.ndim >= 1 and a.size > 0
            and a.flags.c_contiguous and eps >= 0.0)


def _rows(kernel, a, eps):
    n = a.shape[-1]
    a2 = a.reshape(-1, n)
    out = np.empty_like(a2)
    e = np.float32(eps)
    rows, per = a2.shape[0], max(1, PAR_MIN // n)
    if rows < 2 * per:                     # one range: straight to the kernel (a decode step's few rows)
        kernel(a2, e, out, 0, rows)
    else:
        parallel_ranges(lambda lo, hi: kernel(a2, e, out, lo, hi), rows, per)
    return out.reshape(a.shape)


@register("rms_norm", backend="numba")
def rms_norm(a, eps: float) -> np.ndarray:
    """ggml_rms_norm (see refimpl.ops.norm.rms_norm), row by row in Numba."""
    if not _covered(a, eps):
        return _rms_norm_op.reference(a, eps)
    return _rows(_rms_norm, a, eps)


@register("norm", backend="numba")
def norm(a, eps: float) -> np.ndarray:
    """ggml_norm (see refimpl.ops.norm.norm), row by row in Numba."""
    if not _covered(a, eps):
        return _norm_op.reference(a, eps)
    return _rows(_norm, a, eps)
