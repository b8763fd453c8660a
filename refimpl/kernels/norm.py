"""rms_norm and norm with Numba: the reference's operations row by row, in its order.

Versions:
    _rms_norm  f32 squares, their f64 sum (NumPy's pairwise order), f32 mean, scale and products
    _norm      f64 row sum rounded to f32 / n, f32 centring, f64 sum of the f32 squares / n -> f32 variance
    add_norm_affine  a BERT sublayer's tail (bias, residual, norm, * w, + b) in one pass, the op
                     sequence's roundings in its order (refimpl.models.bert)
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
from ..dispatch import register
from ._common import pairwise_sum_f64, parallel_ranges

PAR_MIN = 1 << 17       # elements per thread at least: below, a hand-off to the pool costs more than it saves


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


@njit(inline="always")
def _norm_row(x, eps, o, sq):
    """One row of `norm` (see the module): x, o, sq (n,) f32 (o may be x; sq scratch)."""
    n = x.size
    mean = np.float32(pairwise_sum_f64(x, 0, n) + 0.0) / np.float32(n)     # from +0.0, as ggml (and the reference)
    for i in range(n):
        y = x[i] - mean
        o[i] = y
        sq[i] = y * y
    var = np.float32(pairwise_sum_f64(sq, 0, n) / n)
    scale = np.float32(1.0) / np.sqrt(var + eps)
    for i in range(n):
        o[i] = o[i] * scale


@njit(cache=True, nogil=True, error_model="numpy")
def _norm(a, eps, out, lo, hi):
    sq = np.empty(a.shape[1], np.float32)
    for r in range(lo, hi):
        _norm_row(a[r], eps, out[r], sq)


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


# -- llama.cpp's BERT layer tail fused: (y + bias + residual) -> norm -> * w + b --------------------------------

@njit(cache=True, nogil=True, error_model="numpy")
def _add_norm_affine(y, bias, has_bias, res, has_res, w, b, eps, out, lo, hi):
    """Rows lo..hi-1: t = fl(fl(y + bias) + res) (each term when given), then `_norm_row` on t, then
    fl(fl(n * w) + b): the op sequence's f32 roundings in its order, one row at a time."""
    n = y.shape[1]
    t = np.empty(n, np.float32)
    sq = np.empty(n, np.float32)
    for r in range(lo, hi):
        yr = y[r]
        for i in range(n):
            t[i] = yr[i]
        if has_bias:
            for i in range(n):
                t[i] = t[i] + bias[i]
        if has_res:
            rr = res[r]
            for i in range(n):
                t[i] = t[i] + rr[i]
        o = out[r]
        _norm_row(t, eps, o, sq)
        for i in range(n):
            o[i] = o[i] * w[i]
        for i in range(n):
            o[i] = o[i] + b[i]


def add_norm_affine(y, bias, res, w, b, eps: float):
    """add(norm(add(add(y, bias), res), eps) * w, b) -- llama.cpp's build_norm(LLM_NORM) after a projection's
    bias and the residual, as refimpl.models.bert runs them -- in one pass with the ops' bits: every f32
    rounding of that op sequence, in its order (norm as the `norm` kernel computes it). y, res (rows, n) f32
    C-contiguous (res may be None); bias (may be None), w, b (n,) f32. Returns (rows, n) f32, or None for
    operands it does not cover (the caller runs the ops)."""
    if not (isinstance(y, np.ndarray) and y.dtype == np.float32 and y.ndim == 2 and y.size and y.flags.c_contiguous
            and eps >= 0.0):
        return None
    rows, n = y.shape
    vecs = [v for v in (bias, w, b) if v is not None]
    if not all(isinstance(v, np.ndarray) and v.dtype == np.float32 and v.shape == (n,) for v in vecs) or w is None \
            or b is None:
        return None
    if res is not None and not (isinstance(res, np.ndarray) and res.dtype == np.float32 and res.shape == y.shape
                                and res.flags.c_contiguous):
        return None
    bias_ = np.ascontiguousarray(bias) if bias is not None else np.ascontiguousarray(w)
    res_ = res if res is not None else y
    wc, bc = np.ascontiguousarray(w), np.ascontiguousarray(b)
    out = np.empty_like(y)
    e = np.float32(eps)
    has_bias, has_res = bias is not None, res is not None
    parallel_ranges(lambda lo, hi: _add_norm_affine(y, bias_, has_bias, res_, has_res, wc, bc, e, out, lo, hi),
                    rows, max(1, PAR_MIN // n))
    return out


@register("add_norm_affine", backend="numba")
def _add_norm_affine_op(a, bias, residual, w, b, eps):
    """refimpl.ops.fused.add_norm_affine: `add_norm_affine` above, or NotImplemented for what it does not cover."""
    out = add_norm_affine(a, bias, residual, w, b, eps)
    return NotImplemented if out is None else out
