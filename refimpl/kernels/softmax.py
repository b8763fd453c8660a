"""soft_max_ext with Numba: the reference's operations row by row, in its order.

Versions:
    _soft_max  w = fl(a*scale), then with a mask fl(f64(w) + f64(slope_h) * f64(mask)); M = the row's
               NaN-propagating max (and the sink's); e = fl(exp(f64(fl(w - M)))); Σe in f64 (NumPy's
               pairwise order, plus the sink's term); out = e * fl(1/Σ)
Rows are split over threads. exp is libm's f64 exp rounded to f32 (`vexp.exp32_into`: vectorized, the same
bits), as the reference's NumPy f64 exp rounded to f32: both are within an f64 ulp, so the f32 values agree
except where that ulp straddles an f32 rounding boundary. Inputs other than a C-contiguous f32 a (and
f16/f32 mask, f32 sinks) run the NumPy reference, which also raises its errors.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..ops import softmax as ref_sm
from ..dispatch import register
from ..shapes import ne4
from . import simd
from ._common import pairwise_sum_f64, parallel_ranges
from .vexp import exp32_into

PAR_MIN = 1 << 14       # elements per thread at least


@njit(inline="always")
def row_scores(x, mr, has_mask, sl, scale, e, n):
    """soft_max_row's first steps: e[:n] = fl(x*scale), then with a mask fl(f64(e) + sl * f64(mr))."""
    for i in range(n):
        e[i] = x[i] * scale
    if has_mask:
        for i in range(n):
            e[i] = np.float32(np.float64(e[i]) + sl * np.float64(mr[i]))


@njit(inline="always")
def row_max(e, n):
    """The reference's NaN-propagating max of e[:n]; e's size nv >= n, e[n:] = -inf (`scratch`). Whole vectors
    (simd.vmax16) where nv is a multiple of 16 and the row has no NaN, else the reference's scan (which
    decides which NaN); a max of +-0 may differ in its sign there, which the subtraction that follows
    cannot see."""
    nv = e.size
    M = simd.vmax16(e, nv // 16) if nv >= n and nv >= 16 and nv % 16 == 0 else np.float32(np.nan)
    if M != M:
        M = e[0]
        for i in range(1, n):
            v = e[i]
            if v > M or v != v:
                if M == M:
                    M = v
    return M


@njit(inline="always")
def soft_max_row(x, mr, has_mask, sl, sk, has_sinks, scale, e, p, o):
    """One row of soft_max_ext: o = softmax(fl(x*scale) [+ sl*mr]) with the sink sk, the reference's steps
    (see the module). x, o (n,) f32 (o may be x); mr (n,) f32 mask row; sl the row's slope (f64); e, p f32
    scratch of one size nv >= n, a multiple of 16, with e[n:] = -inf (`scratch`), different arrays
    (exp32_into reads its inputs again for libm's fallback). The max and the exps run on whole vectors over
    the padding (exp(-inf) = 0 there, never read); the sum takes p[:n] only, in the reference's order."""
    n = x.size
    nv = e.size
    row_scores(x, mr, has_mask, sl, scale, e, n)
    M = row_max(e, n)
    if has_sinks and (sk > M or sk != sk) and M == M:
        M = sk
    for i in range(n):
        e[i] = e[i] - M
    exp32_into(e, p, nv if nv % 16 == 0 and nv <= p.size else n, 1.0)
    total = pairwise_sum_f64(p, 0, n)
    if has_sinks:
        total = total + np.float64(np.float32(np.exp(np.float64(sk - M))))
    row_normalize(p, total, o, n)


@njit(inline="always")
def row_normalize(p, total, o, n):
    """soft_max_row's last step: o[:n] = p[:n] * fl32(1 / total) (total the f64 sum of the row's exps)."""
    inv = np.float32(1.0 / total)
    for i in range(n):
        o[i] = p[i] * inv


@njit(inline="always")
def scratch(n):
    """soft_max_row's e and p for rows of n: n rounded up to 16, e's padding -inf."""
    nv = max(16, (n + 15) // 16 * 16)
    e = np.empty(nv, np.float32)
    e[n:] = -np.inf
    return e, np.empty(nv, np.float32)


@njit(cache=True, nogil=True, error_model="numpy")
def _soft_max(a, na1, na2, mask, has_mask, slopes, sinks, has_sinks, scale, out, lo, hi):
    """Rows lo..hi-1 of a (rows, n) f32, row r = (s, h, t) with t = r % na1, h = r // na1 % na2;
    mask (m3, m2, >= na1, n) f32 tiled over h and s; slopes, sinks (na2,) f32."""
    e, p = scratch(a.shape[1])
    m3, m2 = mask.shape[0], mask.shape[1]
    for r in range(lo, hi):
        t = r % na1
        h = (r // na1) % na2
        s = r // (na1 * na2)
        mr = mask[s % m3, h % m2, t] if has_mask else e
        soft_max_row(a[r], mr, has_mask, np.float64(slopes[h]), sinks[h], has_sinks, scale, e, p, out[r])


def _covered(a, mask, max_bias, sinks) -> bool:
    if not (isinstance(a, np.ndarray) and a.dtype == np.float32 and 1 <= a.ndim <= 4 and a.size
            and a.flags.c_contiguous):
        return False
    na = ne4(a.shape)
    if mask is not None:
        if not (isinstance(mask, np.ndarray) and mask.dtype in (np.float16, np.float32) and mask.ndim <= 4
                and mask.flags.c_contiguous):
            return False
        nm = ne4(mask.shape)
        if nm[0] != na[0] or nm[1] < na[1] or min(nm) < 1 or na[2] % nm[2] or na[3] % nm[3]:
            return False
    elif max_bias > 0.0:
        return False
    if sinks is not None:
        if not (isinstance(sinks, np.ndarray) and sinks.dtype == np.float32 and sinks.ndim <= 4
                and ne4(sinks.shape)[0] == na[2] and sinks.size == na[2]):
            return False
    return True


@register("soft_max_ext", backend="numba")
def soft_max_ext(a, mask=None, scale: float = 1.0, max_bias: float = 0.0, sinks=None) -> np.ndarray:
    """ggml_soft_max_ext (see refimpl.ops.softmax.soft_max_ext), row by row in Numba."""
    if not _covered(a, mask, max_bias, sinks):
        return ref_sm.soft_max_ext.reference(a, mask, scale, max_bias, sinks)
    na = ne4(a.shape)
    a2 = a.reshape(-1, na[0])
    if mask is not None:
        nm = ne4(mask.shape)
        m4 = mask.reshape(nm[::-1]).astype(np.float32, copy=False)
    else:
        m4 = np.zeros((1, 1, 1, 1), np.float32)
    slopes = ref_sm.alibi_slopes(na[2], max_bias)
    sk = np.zeros(na[2], np.float32) if sinks is None else np.ascontiguousarray(sinks, np.float32).reshape(-1)
    out = np.empty_like(a2)
    sc = np.float32(scale)
    parallel_ranges(lambda lo, hi: _soft_max(a2, na[1], na[2], m4, mask is not None, slopes, sk, sinks is not None,
                                             sc, out, lo, hi), a2.shape[0], max(1, PAR_MIN // na[0]))
    return out.reshape(a.shape)
