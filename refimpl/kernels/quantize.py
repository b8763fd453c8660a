"""Numba versions of ggml's reference quantizers, byte-exact with refimpl.quants (and so with ggml).

Versions (each `_qz_<type>(x, out, lo, hi, T)`: blocks lo..hi-1 of x (n, blck_size) f32 into out
(n, type_size) uint8; every f32 operation of the NumPy quantizer, in its order):
    Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q8_1    quantize_row_*_ref ("chunk" and "ref" are the same function)
    Q2_K Q3_K Q4_K Q5_K Q6_K Q8_K    quantize_row_*_K_ref with their scale searches (`_minmax_lanes`
                                     = make_qkx2_quants, `_qx_lanes` = make_qx_quants, `_q3_lanes` =
                                     make_q3_quants), the sub-blocks of several blocks as SIMD lanes
    IQ4_NL ("chunk"), IQ4_XS         quantize_iq4_nl / quantize_iq4_xs without an importance matrix
    IQ4_NL ("ref")                   quantize_row_iq4_nl_ref: blocks in parallel, then one pass in order
                                     (`_iq4_nl_stale`) giving skipped blocks the previous block's levels
    TQ1_0 TQ2_0 MXFP4                quantize_row_*_ref
    ENCODERS[tid]                    the quantizers by ggml type number, `nogil`: `quantize_into` runs one
                                     on ranges of blocks in threads; each compiles on first use

The NumPy code is written as vectorised emulations of ggml's C loops; the loops here are those C loops
again, with each NumPy emulation's documented semantics (first-index scans, NaN never winning a strict
comparison, sequential f32 sums from +0, `nearest_int`'s bit trick, x86's float -> int8 casts).
`error_model="numpy"`: a float division by zero gives inf/NaN, as in C, instead of raising.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import njit

from ..dispatch import KEYS, register
from ..quants import QUANTIZERS, fp4, iq, kquants, legacy, ternary
from ..types import GGMLType, traits
from ._common import (add_half_away, c_int8, c_uint8, f16_bits, f32_bits, f32_from_bits, fl16, nearest_int,
                      parallel_ranges, recip0)

FLT_MAX = np.float32(np.finfo(np.float32).max)
_JIT = dict(cache=True, nogil=True, error_model="numpy")

Q4_0, Q4_1, Q5_0, Q5_1 = int(GGMLType.Q4_0), int(GGMLType.Q4_1), int(GGMLType.Q5_0), int(GGMLType.Q5_1)
Q8_0, Q8_1 = int(GGMLType.Q8_0), int(GGMLType.Q8_1)
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K = (int(GGMLType.Q2_K), int(GGMLType.Q3_K), int(GGMLType.Q4_K),
                                      int(GGMLType.Q5_K), int(GGMLType.Q6_K), int(GGMLType.Q8_K))
IQ4_NL, IQ4_XS = int(GGMLType.IQ4_NL), int(GGMLType.IQ4_XS)
TQ1_0, TQ2_0, MXFP4 = int(GGMLType.TQ1_0), int(GGMLType.TQ2_0), int(GGMLType.MXFP4)
IQ4_NL_REF = 1000 + IQ4_NL      # the "ref" method of IQ4_NL (no scale search), a pseudo type number

PAR_MIN = 1 << 12       # elements per thread at least


@functools.lru_cache(maxsize=None)
def tables() -> tuple:
    """T[0] kvalues_iq4nl f32 (16,); T[1..3] iq.best_index's tables over floor(x) + 128 (mu uint8,
    K[mu-1], K[mu]); T[4] the E2M1 magnitudes 0 1 2 3 4 6 8 12 (f32)."""
    mu, lo, hi = iq.best_index_tables()
    return (np.ascontiguousarray(iq.kf(), np.float32), np.ascontiguousarray(mu, np.uint8),
            np.ascontiguousarray(lo, np.float32), np.ascontiguousarray(hi, np.float32),
            np.ascontiguousarray(fp4.MAGNITUDES, np.float32))


# -- shared pieces -----------------------------------------------------------------------------------------

@njit(inline="always")
def _put_f16(out, i, o, v):
    h = f16_bits(v)
    out[i, o] = h & 0xFF
    out[i, o + 1] = (h >> 8) & 0xFF


@njit(inline="always")
def _signed_absmax(x, i, o, n):
    """ggml's `amax = max = 0; for v: if (amax < fabsf(v)) {amax = fabsf(v); max = v;}` over x[i, o:o+n]."""
    amax = np.float32(0.0)
    mx = np.float32(0.0)
    for j in range(n):
        v = x[i, o + j]
        av = abs(v)
        if amax < av:
            amax = av
            mx = v
    return amax, mx


@njit(inline="always")
def _signed_absmax_1d(v, n):
    amax = np.float32(0.0)
    mx = np.float32(0.0)
    for j in range(n):
        av = abs(v[j])
        if amax < av:
            amax = av
            mx = v[j]
    return amax, mx


@njit(inline="always")
def _max_abs(x, i, o, n):
    """ggml's `amax = 0; for v: amax = MAX(amax, fabsf(v))` with MAX(a, b) = a > b ? a : b."""
    amax = np.float32(0.0)
    for j in range(n):
        av = abs(x[i, o + j])
        amax = amax if amax > av else av
    return amax


@njit(inline="always")
def _min_max(x, i, n):
    """ggml's `min = FLT_MAX; max = -FLT_MAX; for v: if (v < min) min = v; if (v > max) max = v;`."""
    mn = FLT_MAX
    mx = -FLT_MAX
    for j in range(n):
        v = x[i, j]
        if v < mn:
            mn = v
        if v > mx:
            mx = v
    return mn, mx


@njit(inline="always")
def _clip(v, lo, hi):
    return lo if v < lo else (hi if v > hi else v)


@njit(inline="always")
def _positive_max(v, n):
    """`m = 0; for each v: if (v > m) m = v;` (NaN never wins)."""
    m = np.float32(0.0)
    for j in range(n):
        if v[j] > m:
            m = v[j]
    return m


# -- legacy 32-element formats -----------------------------------------------------------------------------

@njit(**_JIT)
def _qz_q4_0(x, out, lo, hi, T):
    for i in range(lo, hi):
        _, mx = _signed_absmax(x, i, 0, 32)
        d = mx / np.float32(-8.0)
        idv = recip0(d)
        _put_f16(out, i, 0, d)
        for j in range(16):
            q0 = min(15, c_int8(x[i, j] * idv + np.float32(8.5)))
            q1 = min(15, c_int8(x[i, j + 16] * idv + np.float32(8.5)))
            out[i, 2 + j] = (q0 & 0xFF) | ((q1 << 4) & 0xF0)


@njit(**_JIT)
def _qz_q4_1(x, out, lo, hi, T):
    for i in range(lo, hi):
        mn, mx = _min_max(x, i, 32)
        d = (mx - mn) / np.float32(15.0)
        idv = recip0(d)
        _put_f16(out, i, 0, d)
        _put_f16(out, i, 2, mn)
        for j in range(16):
            q0 = min(15, c_int8((x[i, j] - mn) * idv + np.float32(0.5)))
            q1 = min(15, c_int8((x[i, j + 16] - mn) * idv + np.float32(0.5)))
            out[i, 4 + j] = (q0 & 0xFF) | ((q1 << 4) & 0xF0)


@njit(inline="always")
def _put_q5(out, i, o, q0, q1, j, qh):
    """Nibbles of bytes q0 (element j) and q1 (element j + 16) at out[i, o + j]; their bit 4 into qh."""
    out[i, o + j] = (q0 & 0x0F) | ((q1 & 0x0F) << 4)
    return qh | (((q0 >> 4) & 1) << j) | (((q1 >> 4) & 1) << (j + 16))


@njit(**_JIT)
def _qz_q5_0(x, out, lo, hi, T):
    for i in range(lo, hi):
        _, mx = _signed_absmax(x, i, 0, 32)
        d = mx / np.float32(-16.0)
        idv = recip0(d)
        _put_f16(out, i, 0, d)
        qh = 0
        for j in range(16):
            q0 = min(31, c_int8(x[i, j] * idv + np.float32(16.5))) & 0xFF
            q1 = min(31, c_int8(x[i, j + 16] * idv + np.float32(16.5))) & 0xFF
            qh = _put_q5(out, i, 6, q0, q1, j, qh)
        for k in range(4):
            out[i, 2 + k] = (qh >> (8 * k)) & 0xFF


@njit(**_JIT)
def _qz_q5_1(x, out, lo, hi, T):
    for i in range(lo, hi):
        mn, mx = _min_max(x, i, 32)
        d = (mx - mn) / np.float32(31.0)
        idv = recip0(d)
        _put_f16(out, i, 0, d)
        _put_f16(out, i, 2, mn)
        qh = 0
        for j in range(16):
            q0 = c_uint8((x[i, j] - mn) * idv + np.float32(0.5))
            q1 = c_uint8((x[i, j + 16] - mn) * idv + np.float32(0.5))
            qh = _put_q5(out, i, 8, q0, q1, j, qh)
        for k in range(4):
            out[i, 4 + k] = (qh >> (8 * k)) & 0xFF


@njit(**_JIT)
def _qz_q8_0(x, out, lo, hi, T):
    for i in range(lo, hi):
        d = _max_abs(x, i, 0, 32) / np.float32(127.0)
        idv = recip0(d)
        _put_f16(out, i, 0, d)
        for j in range(32):
            out[i, 2 + j] = c_int8(add_half_away(x[i, j] * idv)) & 0xFF


@njit(**_JIT)
def _qz_q8_1(x, out, lo, hi, T):
    for i in range(lo, hi):
        d = _max_abs(x, i, 0, 32) / np.float32(127.0)
        idv = recip0(d)
        tot = 0
        for j in range(32):
            q = c_int8(add_half_away(x[i, j] * idv))
            tot += q
            out[i, 4 + j] = q & 0xFF
        _put_f16(out, i, 0, d)
        _put_f16(out, i, 2, np.float32(tot) * d)


# -- ternary and FP4 ---------------------------------------------------------------------------------------

@njit(inline="always")
def _trit(v, idv):
    """(int8_t)roundf(v * id) + 1 as a uint8: 0..2 for |v * id| <= 1."""
    return (c_int8(add_half_away(v * idv)) + 1) & 0xFF


@njit(**_JIT)
def _qz_tq2_0(x, out, lo, hi, T):
    for i in range(lo, hi):
        amax = _max_abs(x, i, 0, 256)
        idv = recip0(amax)
        for g in range(2):
            for m in range(32):
                b = 0
                for k in range(4):
                    b |= (_trit(x[i, 128 * g + 32 * k + m], idv) & 3) << (2 * k)
                out[i, 32 * g + m] = b
        _put_f16(out, i, 64, amax)


@njit(inline="always")
def _tq1_byte(q):
    """ceil(q * 256 / 243) as ggml computes it for a uint8 q: ((uint16_t)q * 256 + 242) / 243, to uint8."""
    return ((q * 256 + 242) // 243) & 0xFF


@njit(**_JIT)
def _qz_tq1_0(x, out, lo, hi, T):
    for i in range(lo, hi):
        amax = _max_abs(x, i, 0, 256)
        idv = recip0(amax)
        for m in range(32):                               # byte m: elements m + 32n, n = 0..4
            q = 0
            for n in range(5):
                q = (q * 3 + _trit(x[i, m + 32 * n], idv)) & 0xFF
            out[i, m] = _tq1_byte(q)
        for m in range(16):                               # byte 32 + m: elements 160 + m + 16n
            q = 0
            for n in range(5):
                q = (q * 3 + _trit(x[i, 160 + m + 16 * n], idv)) & 0xFF
            out[i, 32 + m] = _tq1_byte(q)
        for j in range(4):                                # qh[j]: elements 240 + j + 4n, n = 0..3, then a 0
            q = 0
            for n in range(4):
                q = (q * 3 + _trit(x[i, 240 + j + 4 * n], idv)) & 0xFF
            q = (q * 3) & 0xFF
            out[i, 48 + j] = _tq1_byte(q)
        _put_f16(out, i, 52, amax)


@njit(inline="always")
def _mxfp4_index(v, d, mag):
    """fp4._best_index for one value: the last of the magnitudes 1..7 that improves on the running
    error (a running NaN-propagating minimum from |v|), + 8 for negative v."""
    av = abs(v)
    best = av
    idx = 0
    for k in range(1, 8):
        err = abs(mag[k] * d - av)
        if err < best:
            idx = k
        if best == best and (err != err or err < best):
            best = err
    if v < 0 and idx > 0:
        idx += 8
    return idx


@njit(**_JIT)
def _qz_mxfp4(x, out, lo, hi, T):
    mag = T[4]
    for i in range(lo, hi):
        amax = np.float32(0.0)
        for j in range(32):                               # fmax from 0: NaN skipped
            av = abs(x[i, j])
            if av > amax:
                amax = av
        e = 0
        if amax > 0:
            lg = np.float32(np.log2(np.float64(amax)))
            e = c_uint8(np.float32(np.floor(lg)) - np.float32(2.0) + np.float32(127.0))
        d = f32_from_bits((0x00200000 << e) if e < 2 else ((e - 1) << 23))
        out[i, 0] = e
        for j in range(16):
            q0 = _mxfp4_index(x[i, j], d, mag)
            q1 = _mxfp4_index(x[i, j + 16], d, mag)
            out[i, 1 + j] = q0 | (q1 << 4)


# -- the K-quant scale searches -----------------------------------------------------------------------------

# The searches run on "lanes": the sub-blocks of several blocks side by side, x transposed to (n, m)
# (element i of lane j at X[i, j]), so that each step is a loop over lanes that LLVM vectorizes while
# every lane keeps its own sequential f32 sums in element order, exactly as the scalar C loop has them.

@njit(error_model="numpy")
def _minmax_lanes(X, W, nmax, rmin, rdelta, nstep, use_mad, L, scale, mins):
    """kquants._minmax_search (ggml's make_qkx2_quants) on every lane of X (n, m) with weights W:
    fills L (n, m) with the levels (as f32), scale (m,) and mins (m,) = -min. A lane with max == min
    gets scale 0 and L = 0."""
    n, m = X.shape
    f = np.float32
    lo = np.empty(m, f)
    hi = np.empty(m, f)
    sum_w = np.empty(m, f)
    sum_x = np.empty(m, f)
    best = np.empty(m, f)
    sc = np.empty(m, f)
    isc = np.empty(m, f)
    sl = np.empty(m, f)
    sl2 = np.empty(m, f)
    sxl = np.empty(m, f)
    ts = np.empty(m, f)
    tm = np.empty(m, f)
    dd = np.empty(m, f)
    cur = np.empty(m, f)
    flat = np.empty(m, np.bool_)
    take = np.empty(m, np.bool_)
    La = np.empty((n, m), f)
    for j in range(m):
        lo[j] = X[0, j]
        hi[j] = X[0, j]
        sum_w[j] = W[0, j]
        sum_x[j] = W[0, j] * X[0, j]
    for i in range(1, n):
        for j in range(m):
            xi = X[i, j]
            lo[j] = xi if xi < lo[j] else lo[j]
            hi[j] = xi if xi > hi[j] else hi[j]
            sum_w[j] = sum_w[j] + W[i, j]
            sum_x[j] = sum_x[j] + W[i, j] * xi
    for j in range(m):
        lo[j] = f(0.0) if lo[j] > 0 else lo[j]
        flat[j] = hi[j] == lo[j]
        isc[j] = f(nmax) / (hi[j] - lo[j])
        sc[j] = f(1.0) / isc[j]
        best[j] = f(0.0)
    for i in range(n):
        for j in range(m):
            l = f(_clip(nearest_int(isc[j] * (X[i, j] - lo[j])), 0, nmax))
            L[i, j] = l
            diff = (sc[j] * l + lo[j]) - X[i, j]
            best[j] = best[j] + W[i, j] * (abs(diff) if use_mad else diff * diff)
    for k in range(nstep + 1):
        coef = (f(rmin) + f(rdelta) * f(k)) + f(nmax)
        for j in range(m):
            isc[j] = coef / (hi[j] - lo[j])
            sl[j] = f(0.0)
            sl2[j] = f(0.0)
            sxl[j] = f(0.0)
        for i in range(n):
            for j in range(m):
                la = f(_clip(nearest_int(isc[j] * (X[i, j] - lo[j])), 0, nmax))
                La[i, j] = la
                wl = W[i, j] * la
                sl[j] = sl[j] + wl
                sl2[j] = sl2[j] + wl * la
                sxl[j] = sxl[j] + wl * X[i, j]
        for j in range(m):
            D = sum_w[j] * sl2[j] - sl[j] * sl[j]
            t_s = (sum_w[j] * sxl[j] - sum_x[j] * sl[j]) / D
            t_m = (sl2[j] * sum_x[j] - sl[j] * sxl[j]) / D
            pos = t_m > 0
            ts[j] = sxl[j] / sl2[j] if pos else t_s
            tm[j] = f(0.0) if pos else t_m
            dd[j] = D
            cur[j] = f(0.0)
        for i in range(n):
            for j in range(m):
                diff = (ts[j] * La[i, j] + tm[j]) - X[i, j]
                cur[j] = cur[j] + W[i, j] * (abs(diff) if use_mad else diff * diff)
        for j in range(m):
            tk = dd[j] > 0 and cur[j] < best[j] and not flat[j]
            take[j] = tk
            best[j] = cur[j] if tk else best[j]
            sc[j] = ts[j] if tk else sc[j]
            lo[j] = tm[j] if tk else lo[j]
        for i in range(n):
            for j in range(m):
                L[i, j] = La[i, j] if take[j] else L[i, j]
    for j in range(m):
        scale[j] = f(0.0) if flat[j] else sc[j]
        mins[j] = -lo[j]
    for i in range(n):
        for j in range(m):
            L[i, j] = f(0.0) if flat[j] else L[i, j]


@njit(inline="always")
def _lane_absmax(X, amax, mx):
    """_signed_absmax of every lane of X (n, m) into amax, mx (m,)."""
    n, m = X.shape
    for j in range(m):
        amax[j] = np.float32(0.0)
        mx[j] = np.float32(0.0)
    for i in range(n):
        for j in range(m):
            v = X[i, j]
            av = abs(v)
            tk = amax[j] < av
            amax[j] = av if tk else amax[j]
            mx[j] = v if tk else mx[j]


@njit(error_model="numpy")
def _qx_lanes(X, nmax, L, scale):
    """kquants._qx_search (make_qx_quants, rmse_type 1, weights x^2) on every lane of X (n, m): fills
    scale (m,) and L (n, m) = level + nmax as f32 (0 for a lane with max |x| < 1e-15)."""
    n, m = X.shape
    f = np.float32
    amax = np.empty(m, f)
    mx = np.empty(m, f)
    best = np.empty(m, f)
    scl = np.empty(m, f)
    slx = np.empty(m, f)
    sl2 = np.empty(m, f)
    take = np.empty(m, np.bool_)
    Lt = np.empty((n, m), f)
    _lane_absmax(X, amax, mx)
    for ti in range(19):
        t = 0 if ti == 0 else (ti - 10 if ti <= 9 else ti - 9)        # 0, -9..-1, 1..9
        coef = f(-nmax) if t == 0 else -(f(nmax) + f(0.1) * f(t))
        for j in range(m):
            scl[j] = coef / mx[j]
            slx[j] = f(0.0)
            sl2[j] = f(0.0)
        for i in range(n):
            for j in range(m):
                x = X[i, j]
                lv = f(_clip(nearest_int(scl[j] * x), -nmax, nmax - 1))
                Lt[i, j] = lv
                w = x * x
                slx[j] = slx[j] + (w * x) * lv
                sl2[j] = sl2[j] + (w * lv) * lv
        if t == 0:
            for j in range(m):
                s0 = slx[j] / sl2[j] if sl2[j] != 0 else f(0.0)
                scale[j] = s0
                best[j] = s0 * slx[j]
            for i in range(n):
                for j in range(m):
                    L[i, j] = Lt[i, j]
        else:
            for j in range(m):
                tk = sl2[j] > 0 and slx[j] * slx[j] > best[j] * sl2[j]
                take[j] = tk
                s1 = slx[j] / sl2[j]
                scale[j] = s1 if tk else scale[j]
                best[j] = s1 * slx[j] if tk else best[j]
            for i in range(n):
                for j in range(m):
                    L[i, j] = Lt[i, j] if take[j] else L[i, j]
    for j in range(m):
        take[j] = amax[j] < f(1e-15)
        scale[j] = f(0.0) if take[j] else scale[j]
    for i in range(n):
        for j in range(m):
            L[i, j] = f(0.0) if take[j] else L[i, j] + f(nmax)


@njit(error_model="numpy")
def _q3_lanes(X, nmax, L, scale):
    """kquants._q3_search (make_q3_quants, do_rmse) on every lane of X (n, m): fills scale (m,) and
    L (n, m) = level + nmax as f32 (0 for a lane with max |x| < 1e-15)."""
    n, m = X.shape
    f = np.float32
    amax = np.empty(m, f)
    mx = np.empty(m, f)
    isc = np.empty(m, f)
    sumlx = np.empty(m, f)
    suml2 = np.empty(m, f)
    _lane_absmax(X, amax, mx)
    for j in range(m):
        isc[j] = f(-nmax) / mx[j]
        sumlx[j] = f(0.0)
        suml2[j] = f(0.0)
    for i in range(n):
        for j in range(m):
            x = X[i, j]
            lf = f(_clip(nearest_int(isc[j] * x), -nmax, nmax - 1))
            L[i, j] = lf
            w = x * x
            sumlx[j] = sumlx[j] + (w * x) * lf
            suml2[j] = suml2[j] + (w * lf) * lf
    for _sweep in range(5):
        for i in range(n):
            for j in range(m):
                x = X[i, j]
                w = x * x
                wx = w * x
                li = L[i, j]
                slx = sumlx[j] - wx * li
                sl2 = suml2[j] - (w * li) * li
                nf = f(_clip(nearest_int((x * sl2) / slx), -nmax, nmax - 1))
                slx2 = slx + wx * nf
                sl22 = sl2 + (w * nf) * nf
                tk = (slx > 0 and nf != li and sl22 > 0
                      and (slx2 * slx2) * suml2[j] > (sumlx[j] * sumlx[j]) * sl22)
                L[i, j] = nf if tk else li
                sumlx[j] = slx2 if tk else sumlx[j]
                suml2[j] = sl22 if tk else suml2[j]
    zero = np.empty(m, np.bool_)
    for j in range(m):
        zero[j] = amax[j] < f(1e-15)
        s = sumlx[j] / suml2[j] if suml2[j] > 0 else f(0.0)
        scale[j] = f(0.0) if zero[j] else s
    for i in range(n):
        for j in range(m):
            L[i, j] = f(0.0) if zero[j] else L[i, j] + f(nmax)


@njit(inline="always")
def _requantize(x, i, o, n, D, M, lo, hi, L, lo_off):
    """Levels from a stored scale: L[lo_off + j] = clamp(nearest((x + M)/D), lo, hi) where D != 0."""
    if D != 0:
        for j in range(n):
            L[lo_off + j] = _clip(nearest_int((x[i, o + j] + M) / D), lo, hi)


@njit(inline="always")
def _pack_2bit(out, i, o, L):
    """L (256,) levels 0..3 -> 64 bytes at out[i, o]: element 128h + 32s + l at bits 2s of byte 32h + l."""
    for h in range(2):
        for l in range(32):
            out[i, o + 32 * h + l] = ((L[128 * h + l] & 3) | ((L[128 * h + 32 + l] & 3) << 2)
                                      | ((L[128 * h + 64 + l] & 3) << 4) | ((L[128 * h + 96 + l] & 3) << 6))


# -- K-quants -------------------------------------------------------------------------------------------------
# Blocks are searched G at a time: their sub-blocks become the lanes of one `_*_lanes` call (64 lanes).

@njit(inline="always")
def _lanes_in(x, i0, nbk, nsub, sub, X):
    """X[k, nsub*b + j] = x[i0 + b, sub*j + k]: sub-block j of block i0 + b as lane nsub*b + j."""
    for b in range(nbk):
        for j in range(nsub):
            for k in range(sub):
                X[k, nsub * b + j] = x[i0 + b, sub * j + k]


@njit(inline="always")
def _lanes_out(Lf, b, nsub, sub, L, off):
    """L[sub*j + k] = Lf[k, nsub*b + j] + off (the levels of block b, as int)."""
    for j in range(nsub):
        for k in range(sub):
            L[sub * j + k] = np.int64(Lf[k, nsub * b + j]) + off


@njit(**_JIT)
def _qz_q2_K(x, out, lo, hi, T):
    G = 4
    L = np.empty(256, np.int64)
    for i0 in range(lo, hi, G):
        nbk = min(G, hi - i0)
        m = 16 * nbk
        X = np.empty((16, m), np.float32)
        W = np.empty((16, m), np.float32)
        Lf = np.empty((16, m), np.float32)
        scale = np.empty(m, np.float32)
        mins = np.empty(m, np.float32)
        _lanes_in(x, i0, nbk, 16, 16, X)
        for k in range(16):
            for j in range(m):
                W[k, j] = abs(X[k, j])
        _minmax_lanes(X, W, 3, -0.5, 0.1, 15, True, Lf, scale, mins)
        for b in range(nbk):
            i = i0 + b
            _lanes_out(Lf, b, 16, 16, L, 0)
            sb = scale[16 * b:16 * b + 16]
            mb = mins[16 * b:16 * b + 16]
            maxs = _positive_max(sb, 16)
            maxm = _positive_max(mb, 16)
            inv_s = np.float32(15.0) / maxs
            inv_m = np.float32(15.0) / maxm
            d = maxs / np.float32(15.0) if maxs > 0 else np.float32(0.0)
            dmin = maxm / np.float32(15.0) if maxm > 0 else np.float32(0.0)
            dd = fl16(d)
            dm = fl16(dmin)
            for j in range(16):
                ls = nearest_int(inv_s * sb[j]) if maxs > 0 else 0
                lm = nearest_int(inv_m * mb[j]) if maxm > 0 else 0
                sc = ((ls & 0xFF) | (lm << 4)) & 0xFF
                out[i, j] = sc
                _requantize(x, i, 16 * j, 16, dd * np.float32(sc & 0xF), dm * np.float32(sc >> 4), 0, 3, L,
                            16 * j)
            _pack_2bit(out, i, 16, L)
            _put_f16(out, i, 80, d)
            _put_f16(out, i, 82, dmin)


@njit(inline="always")
def _q3_scale_byte(l, k):
    """Byte k of the 12 `scales` bytes of Q3_K from sixteen 6-bit values l (kquants._pack_q3_scales)."""
    if k < 8:
        return (l[k] & 0xF) | ((l[k + 8] & 0xF) << 4)
    c = k - 8
    return (((l[c] >> 4) & 3) | (((l[4 + c] >> 4) & 3) << 2) | (((l[8 + c] >> 4) & 3) << 4)
            | (((l[12 + c] >> 4) & 3) << 6))


@njit(inline="always")
def _q3_unpack(out, i, j):
    """Sixteen-scale value j (0..63) back from the packed bytes at out[i, 96:108]."""
    b = np.int64(out[i, 96 + (j & 7)])
    low = (b & 15) if j < 8 else (b >> 4)
    high = (np.int64(out[i, 104 + (j & 3)]) >> (2 * (j >> 2))) & 3
    return low | (high << 4)


@njit(**_JIT)
def _qz_q3_K(x, out, lo, hi, T):
    G = 4
    L = np.empty(256, np.int64)
    sc = np.empty(16, np.int64)
    for i0 in range(lo, hi, G):
        nbk = min(G, hi - i0)
        m = 16 * nbk
        X = np.empty((16, m), np.float32)
        Lf = np.empty((16, m), np.float32)
        scales = np.empty(m, np.float32)
        _lanes_in(x, i0, nbk, 16, 16, X)
        _q3_lanes(X, 4, Lf, scales)
        for b in range(nbk):
            i = i0 + b
            _lanes_out(Lf, b, 16, 16, L, -4)
            scale = scales[16 * b:16 * b + 16]
            _, max_scale = _signed_absmax_1d(scale, 16)
            some = max_scale != 0
            iscale = np.float32(-32.0) / max_scale
            d = np.float32(1.0) / iscale if some else np.float32(0.0)
            for j in range(16):
                l8 = nearest_int(iscale * scale[j]) & 0xFF
                l8 = l8 - ((l8 & 0x80) << 1)
                sc[j] = _clip(l8, -32, 31) + 32 if some else 0
            for k in range(12):
                out[i, 96 + k] = _q3_scale_byte(sc, k) if some else 0
            dd = fl16(d)
            for j in range(16):
                D = dd * np.float32(_q3_unpack(out, i, j) - 32)
                _requantize(x, i, 16 * j, 16, D, np.float32(0.0), -4, 3, L, 16 * j)
            for l in range(32):
                hm = 0
                for bit in range(8):
                    if L[32 * bit + l] + 4 > 3:
                        hm |= 1 << bit
                out[i, l] = hm
            for e in range(256):
                v = L[e] + 4
                L[e] = v - 4 if v > 3 else v
            _pack_2bit(out, i, 32, L)
            _put_f16(out, i, 108, d)


@njit(inline="always")
def _pack_scale_min_k4(out, i, o, ls, lm):
    """Eight 6-bit scales and mins -> the 12 `scales` bytes of Q4_K/Q5_K at out[i, o] (uint8 arithmetic)."""
    for j in range(4):
        out[i, o + j] = (ls[j] | (((ls[j + 4] >> 4) << 6) & 0xFF)) & 0xFF
        out[i, o + 4 + j] = (lm[j] | (((lm[j + 4] >> 4) << 6) & 0xFF)) & 0xFF
        out[i, o + 8 + j] = ((ls[j + 4] & 0xF) | ((lm[j + 4] & 0xF) << 4)) & 0xFF


@njit(error_model="numpy")
def _qz_k4(x, out, lo, hi, nmax, rmin, nstep, q5):
    """quantize_row_q4_K_ref (q5 False: nmax 15, rmin -1, 20 steps) / q5_K_ref (q5 True: 31, -0.5, 15).

    kquants._quantize_k4 per block: sum_x2 = Σx² (sequential), av = sqrtf(sum_x2/32), w = av + |x|,
    `_minmax_lanes`; 6-bit scales and mins from maxs/63, maxm/63; levels requantized with the stored
    d*sc, dmin*m; then the nibble (and Q5_K's qh) packing."""
    G = 8
    L = np.empty(256, np.int64)
    ls = np.empty(8, np.int64)
    lm = np.empty(8, np.int64)
    for i0 in range(lo, hi, G):
        nbk = min(G, hi - i0)
        m = 8 * nbk
        X = np.empty((32, m), np.float32)
        W = np.empty((32, m), np.float32)
        Lf = np.empty((32, m), np.float32)
        scale = np.empty(m, np.float32)
        mins = np.empty(m, np.float32)
        _lanes_in(x, i0, nbk, 8, 32, X)
        for j in range(m):
            sum_x2 = np.float32(0.0)
            for k in range(32):
                sum_x2 = sum_x2 + X[k, j] * X[k, j]
            av = np.sqrt(sum_x2 / np.float32(32.0))
            for k in range(32):
                W[k, j] = av + abs(X[k, j])
        _minmax_lanes(X, W, nmax, rmin, 0.1, nstep, False, Lf, scale, mins)
        for b in range(nbk):
            i = i0 + b
            _lanes_out(Lf, b, 8, 32, L, 0)
            sb = scale[8 * b:8 * b + 8]
            mb = mins[8 * b:8 * b + 8]
            maxs = _positive_max(sb, 8)
            maxm = _positive_max(mb, 8)
            inv_s = np.float32(63.0) / maxs if maxs > 0 else np.float32(0.0)
            inv_m = np.float32(63.0) / maxm if maxm > 0 else np.float32(0.0)
            for j in range(8):
                ls[j] = min(63, nearest_int(inv_s * sb[j]) & 0xFF)
                lm[j] = min(63, nearest_int(inv_m * mb[j]) & 0xFF)
            d = maxs / np.float32(63.0)
            dmin = maxm / np.float32(63.0)
            dd = fl16(d)
            dm = fl16(dmin)
            for j in range(8):
                _requantize(x, i, 32 * j, 32, dd * np.float32(ls[j]), dm * np.float32(lm[j]), 0, nmax, L, 32 * j)
            _put_f16(out, i, 0, d)
            _put_f16(out, i, 2, dmin)
            _pack_scale_min_k4(out, i, 4, ls, lm)
            if q5:
                for l in range(32):
                    qh = 0
                    for bit in range(8):
                        qh |= ((L[32 * bit + l] & 0xFF) >> 4) << bit
                    out[i, 16 + l] = qh & 0xFF
                for c in range(4):
                    for l in range(32):
                        out[i, 48 + 32 * c + l] = (L[64 * c + l] & 0xF) | ((L[64 * c + 32 + l] & 0xF) << 4)
            else:
                for c in range(4):
                    for l in range(32):
                        out[i, 16 + 32 * c + l] = ((L[64 * c + l] & 0xFF) | ((L[64 * c + 32 + l] << 4) & 0xFF)) & 0xFF


@njit(**_JIT)
def _qz_q4_K(x, out, lo, hi, T):
    _qz_k4(x, out, lo, hi, 15, -1.0, 20, False)


@njit(**_JIT)
def _qz_q5_K(x, out, lo, hi, T):
    _qz_k4(x, out, lo, hi, 31, -0.5, 15, True)


@njit(**_JIT)
def _qz_q6_K(x, out, lo, hi, T):
    G = 4
    L = np.empty(256, np.int64)
    s = np.empty(16, np.int64)
    for i0 in range(lo, hi, G):
        nbk = min(G, hi - i0)
        m = 16 * nbk
        X = np.empty((16, m), np.float32)
        Lf = np.empty((16, m), np.float32)
        scales = np.empty(m, np.float32)
        _lanes_in(x, i0, nbk, 16, 16, X)
        _qx_lanes(X, 32, Lf, scales)
        for b in range(nbk):
            i = i0 + b
            _lanes_out(Lf, b, 16, 16, L, -32)
            scale = scales[16 * b:16 * b + 16]
            amax, max_scale = _signed_absmax_1d(scale, 16)
            if amax < np.float32(1e-15):
                for k in range(210):
                    out[i, k] = 0
                continue
            iscale = np.float32(-128.0) / max_scale
            d = np.float32(1.0) / iscale
            dd = fl16(d)
            for j in range(16):
                v = min(127, nearest_int(iscale * scale[j])) & 0xFF
                s[j] = v - ((v & 0x80) << 1)
                out[i, 192 + j] = s[j] & 0xFF
                _requantize(x, i, 16 * j, 16, dd * np.float32(s[j]), np.float32(0.0), -32, 31, L, 16 * j)
            for h in range(2):
                for l in range(32):
                    q0 = (L[128 * h + l] + 32) & 0xFF
                    q1 = (L[128 * h + 32 + l] + 32) & 0xFF
                    q2 = (L[128 * h + 64 + l] + 32) & 0xFF
                    q3 = (L[128 * h + 96 + l] + 32) & 0xFF
                    out[i, 64 * h + l] = (q0 & 0xF) | ((q2 & 0xF) << 4)
                    out[i, 64 * h + 32 + l] = (q1 & 0xF) | ((q3 & 0xF) << 4)
                    out[i, 128 + 32 * h + l] = ((q0 >> 4) | ((q1 >> 4) << 2) | ((q2 >> 4) << 4)
                                                | ((q3 >> 4) << 6)) & 0xFF
            _put_f16(out, i, 208, d)


@njit(**_JIT)
def _qz_q8_K(x, out, lo, hi, T):
    for i in range(lo, hi):
        amax, mx = _signed_absmax(x, i, 0, 256)
        zero = amax == 0
        iscale = np.float32(-127.0) / mx
        d = np.float32(0.0) if zero else np.float32(1.0) / iscale
        db = f32_bits(d)
        for k in range(4):
            out[i, k] = (db >> (8 * k)) & 0xFF
        for j in range(16):
            tot = 0
            for k in range(16):
                q = 0
                if not zero:
                    q = min(127, nearest_int(iscale * x[i, 16 * j + k])) & 0xFF
                    q = q - ((q & 0x80) << 1)
                tot += q
                out[i, 4 + 16 * j + k] = q & 0xFF
            out[i, 260 + 2 * j] = tot & 0xFF
            out[i, 261 + 2 * j] = (tot >> 8) & 0xFF


# -- IQ4_NL / IQ4_XS -----------------------------------------------------------------------------------------

@njit(inline="always")
def _level_slot(v):
    """floor(v) clamped to -128..127 (NaN -> 127, as np.fmin / np.fmax do), + 128: the table slot."""
    c = np.floor(v)
    if c != c or c > np.float32(127.0):
        c = np.float32(127.0)
    elif c < np.float32(-128.0):
        c = np.float32(-128.0)
    return np.int64(c) + 128


@njit(inline="always")
def _best_index(v, T):
    """iq.best_index of one value: the nearest of the 16 IQ4 levels (ties up; NaN -> 15)."""
    k = _level_slot(v)
    r = np.int64(T[1][k])
    if (v - T[2][k]) < (T[3][k] - v):
        r -= 1
    return r


@njit(inline="always")
def _nearest_level(v, T):
    """K[_best_index(v)] (iq._nearest_level)."""
    k = _level_slot(v)
    lo = T[2][k]
    hi = T[3][k]
    return lo if (v - lo) < (hi - v) else hi


@njit(error_model="numpy")
def _iq4_scale(x, i, o, ntry, T, L):
    """iq._iq4_scales for the 32 values x[i, o:o+32]: returns (scale, skipped) and the first pass's
    levels in L[0:32]."""
    K = T[0]
    K0 = K[0]
    amax, mx = _signed_absmax(x, i, o, 32)
    skip = amax < np.float32(1e-15)
    d = (-mx if ntry > 0 else mx) / K0
    idv = np.float32(1.0) / d
    sqx = np.float32(0.0)
    sq2 = np.float32(0.0)
    for j in range(32):
        v = x[i, o + j]
        L[j] = _best_index(idv * v, T)
        q = K[L[j]]
        wq = (v * v) * q
        sqx = sqx + wq * v
        sq2 = sq2 + wq * q
    d = sqx / sq2 if sq2 > 0 else np.float32(0.0)
    best = d * sqx
    if ntry > 0:
        for t in range(-ntry, ntry + 1):
            idt = (np.float32(t) + K0) / mx
            tqx = np.float32(0.0)
            tq2 = np.float32(0.0)
            for j in range(32):
                v = x[i, o + j]
                q = _nearest_level(idt * v, T)
                wq = (v * v) * q
                tqx = tqx + wq * v
                tq2 = tq2 + wq * q
            if tq2 > 0 and tqx * tqx > best * tq2:
                d = tqx / tq2
                best = d * tqx
    return (np.float32(0.0) if skip else d), skip


@njit(inline="always")
def _put_levels(out, i, o, L):
    for j in range(16):
        out[i, o + j] = (L[j] | (L[j + 16] << 4)) & 0xFF


@njit(**_JIT)
def _qz_iq4_nl(x, out, lo, hi, T):
    L = np.empty(32, np.int64)
    for i in range(lo, hi):
        scale, _ = _iq4_scale(x, i, 0, 7, T, L)
        r = recip0(scale)
        for j in range(32):
            L[j] = _best_index(r * x[i, j], T)
        _put_f16(out, i, 0, scale)
        _put_levels(out, i, 2, L)


@njit(**_JIT)
def _qz_iq4_nl_ref(x, out, lo, hi, T, skipped):
    """quantize_row_iq4_nl_ref, each block with its own first-pass levels; skipped blocks (max |x| <
    1e-15, d = 0) are marked in `skipped` and get their levels from `_iq4_nl_stale`."""
    L = np.empty(32, np.int64)
    for i in range(lo, hi):
        scale, skip = _iq4_scale(x, i, 0, -1, T, L)
        _put_f16(out, i, 0, scale)
        skipped[i] = skip
        if not skip:
            _put_levels(out, i, 2, L)


@njit(cache=True)
def _iq4_nl_stale(out, skipped):
    """In order, a skipped block takes the levels of the last quantized block before it (nibble 8 before
    the first): ggml's quantize_row_iq4_nl_ref packs whatever its reused level buffer holds."""
    last = -1
    for i in range(out.shape[0]):
        if skipped[i]:
            for j in range(16):
                out[i, 2 + j] = out[last, 2 + j] if last >= 0 else 0x88
        else:
            last = i


@njit(**_JIT)
def _qz_iq4_xs(x, out, lo, hi, T):
    L = np.empty(32, np.int64)
    s = np.empty(8, np.float32)
    for i in range(lo, hi):
        for ib in range(8):
            s[ib], _ = _iq4_scale(x, i, 32 * ib, 7, T, L)
        _, max_scale = _signed_absmax_1d(s, 8)
        d = -max_scale / np.float32(32.0)
        rd = recip0(d)
        sh = 0
        for ib in range(8):
            l = _clip(nearest_int(rd * s[ib]), -32, 31)
            dl = d * np.float32(l)
            rdl = recip0(dl)
            for j in range(32):
                L[j] = _best_index(rdl * x[i, 32 * ib + j], T)
            _put_levels(out, i, 8 + 16 * ib, L)
            u = l + 32
            if ib % 2 == 0:
                out[i, 4 + ib // 2] = u & 15
            else:
                out[i, 4 + ib // 2] |= (u & 15) << 4
            sh |= (u >> 4) << (2 * ib)
        _put_f16(out, i, 0, d)
        out[i, 2] = sh & 0xFF
        out[i, 3] = (sh >> 8) & 0xFF


ENCODERS = {Q4_0: _qz_q4_0, Q4_1: _qz_q4_1, Q5_0: _qz_q5_0, Q5_1: _qz_q5_1, Q8_0: _qz_q8_0, Q8_1: _qz_q8_1,
            Q2_K: _qz_q2_K, Q3_K: _qz_q3_K, Q4_K: _qz_q4_K, Q5_K: _qz_q5_K, Q6_K: _qz_q6_K, Q8_K: _qz_q8_K,
            IQ4_NL: _qz_iq4_nl, IQ4_XS: _qz_iq4_xs, TQ1_0: _qz_tq1_0, TQ2_0: _qz_tq2_0, MXFP4: _qz_mxfp4}


# -- registration ------------------------------------------------------------------------------------------

# the NumPy function each kernel reproduces: (reference, ggml type, kernel type number)
_KERNELS = [
    (legacy.quantize_q4_0, GGMLType.Q4_0, Q4_0), (legacy.quantize_q4_1, GGMLType.Q4_1, Q4_1),
    (legacy.quantize_q5_0, GGMLType.Q5_0, Q5_0), (legacy.quantize_q5_1, GGMLType.Q5_1, Q5_1),
    (legacy.quantize_q8_0, GGMLType.Q8_0, Q8_0), (legacy.quantize_q8_1, GGMLType.Q8_1, Q8_1),
    (kquants.quantize_q2_K, GGMLType.Q2_K, Q2_K), (kquants.quantize_q3_K, GGMLType.Q3_K, Q3_K),
    (kquants.quantize_q4_K, GGMLType.Q4_K, Q4_K), (kquants.quantize_q5_K, GGMLType.Q5_K, Q5_K),
    (kquants.quantize_q6_K, GGMLType.Q6_K, Q6_K), (kquants.quantize_q8_K, GGMLType.Q8_K, Q8_K),
    (iq.quantize_iq4_nl_chunk, GGMLType.IQ4_NL, IQ4_NL), (iq.quantize_iq4_nl_ref, GGMLType.IQ4_NL, IQ4_NL_REF),
    (iq.quantize_iq4_xs, GGMLType.IQ4_XS, IQ4_XS), (ternary.quantize_tq1_0, GGMLType.TQ1_0, TQ1_0),
    (ternary.quantize_tq2_0, GGMLType.TQ2_0, TQ2_0), (fp4.quantize_mxfp4, GGMLType.MXFP4, MXFP4),
]


def quantize_into(tid: int, t, x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Quantize all blocks of x (n, blck_size) f32 into out (n, type_size) uint8 (both C-contiguous),
    ranges of blocks in parallel threads."""
    tr = traits(t)
    T = tables()
    if tid == IQ4_NL_REF:
        skipped = np.zeros(x.shape[0], np.uint8)
        parallel_ranges(lambda lo, hi: _qz_iq4_nl_ref(x, out, lo, hi, T, skipped), x.shape[0], PAR_MIN // 32)
        if x.shape[0]:
            _iq4_nl_stale(out, skipped)
        return out
    qz = ENCODERS[tid]                           # compiled on first use of its type
    parallel_ranges(lambda lo, hi: qz(x, out, lo, hi, T), x.shape[0], max(1, PAR_MIN // tr.blck_size))
    return out


def _wrapper(ref, t, tid):
    tr = traits(t)

    def quantize(x):
        x = np.ascontiguousarray(x, np.float32)
        if x.ndim != 2 or x.shape[1] != tr.blck_size:
            raise ValueError(f"{tr.name} quantizer takes (n, {tr.blck_size}) f32 blocks, got {x.shape}")
        return quantize_into(tid, t, x, np.empty((x.shape[0], tr.type_size), np.uint8))

    quantize.__name__ = ref.__name__
    quantize.__doc__ = (f"{tr.name} blocks (n, {tr.blck_size}) f32 -> (n, {tr.type_size}) uint8 with Numba; the "
                        f"same bytes as refimpl.quants' {ref.__name__}.")
    return quantize


for _ref, _t, _tid in _KERNELS:
    assert any(fn is _ref for fn in QUANTIZERS.values()), _ref
    register(_ref, "numba", KEYS)(_wrapper(_ref, _t, _tid))
