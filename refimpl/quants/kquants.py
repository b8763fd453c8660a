"""The K-quant ("super-block") formats: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, and Q8_K (activations only).

Every block holds 256 values (QK_K), split into sub-blocks of 16 (Q2_K, Q3_K, Q6_K, Q8_K sums) or 32
(Q4_K, Q5_K) with their own small integer scale (and min), and one or two f16 super-scales. The
byte layout of each type is restated in its dequantizer's docstring (ggml-common.h, `block_q*_K`).

Reference quantizers are ggml's `quantize_row_q*_K_ref`. Without an importance matrix
`ggml_quantize_chunk` runs exactly these, and so does the CPU backend's `from_float` on every
architecture (Q8_K included: the x86 `quantize_row_q8_K` calls the reference), so one function serves
the methods "chunk", "ref" and "cpu". `ggml_quantize_chunk` has no Q8_K case (it aborts), so Q8_K is
registered for "ref" and "cpu" only.

The scale searches (ggml's `make_qkx2_quants`, `make_qx_quants`, `make_q3_quants`) are written
once each, vectorised over all sub-blocks of all blocks; their steps (candidate scales, sweeps) run
one after the other, as in C, since a step may start from what the previous one adopted. Everything
is f32, one NumPy operation per C operation; sums are sequential (`_sum`), and `_nearest_int`
(`_common.nearest_int`) is ggml's `nearest_int` bit for bit, including what it returns for
inf/NaN/huge arguments, which the searches do meet on subnormal and f16-overflowing blocks. The
searches lay their per-element work out transposed, (elements, sub-blocks), so that the sequential
sums add contiguous slabs.
"""
from __future__ import annotations

import numpy as np

from ..types import GGMLType
from .registry import dequantizer, quantizer
from ._common import (LOW_NIBBLES, blockwise, f16_bytes, f16_field, f32, output, seq_sum, signed_absmax,
                      unpack_fields)
from ._common import nearest_int as _nearest_int
from ._common import fl16 as _common_fl16

QK_K = 256
GROUP_MAX_EPS = f32(1e-15)


# -- primitives --------------------------------------------------------------------------------------

def _sum(terms: np.ndarray) -> np.ndarray:
    """Σ over the last axis in f32, sequentially from +0 in index order (a C `for` loop), no keepdims."""
    return seq_sum(terms, keepdims=False)


def _first_absmax(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(amax, max) over the last axis of x (m, k) as ggml scans it: start at 0, keep an |x| only if
    strictly larger (`signed_absmax`, without keepdims). max is the signed value at the first index
    reaching amax (0 when no |x| exceeds 0; NaN never wins)."""
    amax, mx = signed_absmax(x)
    return amax[:, 0], mx[:, 0]


def _positive_max(v: np.ndarray) -> np.ndarray:
    """`m = 0; for each v: if (v > m) m = v;` over the last axis (NaN never wins)."""
    return np.max(np.where(v > 0, v, f32(0)), axis=-1).astype(np.float32)


def _fl16(v) -> np.ndarray:
    """Round to f16 and back (GGML_FP32_TO_FP16 then GGML_FP16_TO_FP32); overflow to inf is expected."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _common_fl16(v)


# -- the scale searches ------------------------------------------------------------------------------

def _minmax_search(x, w, nmax: int, rmin: float, rdelta: float, nstep: int, use_mad: bool):
    """ggml's `make_qkx2_quants` on every row of x (m, n), weights w (m, n).

    Fits x ≈ scale*L + min (L in 0..nmax, min <= 0) minimising Σ w*err, err = |.| (use_mad) or squared:
    first L from the range [min(x, 0), max(x)], then the least-squares (scale, min) for the levels of
    each iscale = (rmin + rdelta*k + nmax) / (max - min), k = 0..nstep, kept if its error is smaller.
    `min` is the running one: once a candidate is kept, the later candidates' iscale and levels
    (nearest(iscale*(x - min))) use its min, not min(x, 0).
    Returns (scale (m,), -min (m,), L (m, n) int32). A row with max == min gets scale 0 and L 0.
    """
    x = np.asarray(x, np.float32)
    xt, wt = np.ascontiguousarray(x.T), np.ascontiguousarray(w.T)
    lo, hi = xt[0].copy(), xt[0].copy()
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        sum_w, sum_x = wt[0].copy(), wt[0] * xt[0]
        for xi, wi in zip(xt[1:], wt[1:]):
            lo = np.where(xi < lo, xi, lo)
            hi = np.where(xi > hi, xi, hi)
            sum_w = sum_w + wi
            sum_x = sum_x + wi * xi
        lo = np.where(lo > 0, f32(0), lo)
        flat = hi == lo

        def error(s, m, levels):          # Σ w * err(s*L + m - x), sequential; levels (n, m)
            diff = (s * levels + m) - xt
            return seq_sum(wt * (np.abs(diff) if use_mad else diff * diff), axis=0, keepdims=False)

        # (the work is laid out transposed, (n, m): element j of every row is one contiguous slab)
        iscale = f32(nmax) / (hi - lo)
        scale = f32(1) / iscale
        L = np.clip(_nearest_int(iscale * (xt - lo)), 0, nmax)
        best = error(scale, lo, L.astype(np.float32))

        # Candidates one after the other: an adopted candidate's min (<= 0) replaces `min`, and the
        # later candidates' iscale and levels are computed from the new min.
        for k in range(nstep + 1):
            coef = (f32(rmin) + f32(rdelta) * f32(k)) + f32(nmax)
            isc = coef / (hi - lo)
            La = np.clip(_nearest_int(isc * (xt - lo)), 0, nmax).astype(np.float32)
            wl = wt * La
            sum_l, sum_l2, sum_xl = seq_sum(np.stack([wl, wl * La, wl * xt], axis=1), axis=0, keepdims=False)
            D = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            pos = this_min > 0
            this_min = np.where(pos, f32(0), this_min)
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
            cur = error(this_scale, this_min, La)
            take = (D > 0) & (cur < best) & ~flat
            best = np.where(take, cur, best)
            scale = np.where(take, this_scale, scale)
            lo = np.where(take, this_min, lo)
            L = np.where(take, La.astype(np.int32), L)
    scale = np.where(flat, f32(0), scale).astype(np.float32)
    L = np.where(flat[:, None], 0, L.T)
    return scale, (-lo).astype(np.float32), L


def _qx_search(x, nmax: int):
    """ggml's `make_qx_quants(n, nmax, x, L, rmse_type=1, NULL)` on every row of x (m, n), weights x².

    Levels l = clamp(nearest(iscale*x), -nmax, nmax-1) for iscale = -nmax/max, then -(nmax + 0.1t)/max
    for t = -9..9 (t != 0); the least-squares scale Σwxl/Σwl² of a candidate is kept when it explains
    more (Σwxl² > best*Σwl²). Returns (scale (m,), L (m, n) = l + nmax); rows with max|x| < 1e-15 give 0, 0.
    """
    x = np.asarray(x, np.float32)
    amax, mx = _first_absmax(x)
    zero = amax < GROUP_MAX_EPS
    tries = [0] + [t for t in range(-9, 10) if t]
    xt = np.ascontiguousarray(x.T)                     # (n, m): element j of every row is one slab
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        w = xt * xt
        wx = w * xt
        for t in tries:                                # candidates in ggml's order, one at a time
            coef = f32(-nmax) if t == 0 else -(f32(nmax) + f32(0.1) * f32(t))
            lv = np.clip(_nearest_int((coef / mx) * xt), -nmax, nmax - 1).astype(np.float32)   # (n, m)
            sumlx, suml2 = seq_sum(np.stack([wx * lv, (w * lv) * lv], axis=1), axis=0, keepdims=False)
            if t == 0:
                scale = np.where(suml2 != 0, sumlx / suml2, f32(0)).astype(np.float32)
                best = scale * sumlx
                L = lv
            else:
                take = (suml2 > 0) & (sumlx * sumlx > best * suml2)
                L = np.where(take, lv, L)
                scale = np.where(take, sumlx / suml2, scale)
                best = np.where(take, scale * sumlx, best)
    L = np.where(zero[:, None], 0, L.T.astype(np.int32) + nmax)
    return np.where(zero, f32(0), scale).astype(np.float32), L


def _q3_search(x, nmax: int = 4):
    """ggml's `make_q3_quants(n, nmax, x, L, do_rmse=true)` on every row of x (m, n), weights x².

    Start from l = clamp(nearest(-nmax/max * x), -nmax, nmax-1), then up to 5 sweeps over the elements:
    re-fit one level against the others' least-squares scale and keep it if Σwxl²/Σwl² grows. (ggml stops
    after a sweep that changes nothing; such a sweep leaves the state as it was, so running all 5 is the
    same.) Returns (Σwxl/Σwl² (m,), L (m, n) = l + nmax); rows with max|x| < 1e-15 give 0 and L = 0.
    """
    x = np.asarray(x, np.float32)
    amax, mx = _first_absmax(x)
    zero = amax < GROUP_MAX_EPS
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        iscale = f32(-nmax) / mx
        L = np.clip(_nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
        w = x * x
        wx = w * x
        Lf = L.astype(np.float32)
        sumlx, suml2 = _sum(wx * Lf), _sum((w * Lf) * Lf)
        Lt, xt, wt, wxt = (np.ascontiguousarray(a.T) for a in (L, x, w, wx))
        for _sweep in range(5):
            for i in range(x.shape[1]):
                li = Lt[i].astype(np.float32)
                slx = sumlx - wxt[i] * li
                sl2 = suml2 - (wt[i] * li) * li
                new = np.clip(_nearest_int((xt[i] * sl2) / slx), -nmax, nmax - 1)
                nf = new.astype(np.float32)
                slx2 = slx + wxt[i] * nf
                sl22 = sl2 + (wt[i] * nf) * nf
                take = ((slx > 0) & (new != Lt[i]) & (sl22 > 0)
                        & ((slx2 * slx2) * suml2 > (sumlx * sumlx) * sl22))
                Lt[i] = np.where(take, new, Lt[i])
                sumlx = np.where(take, slx2, sumlx)
                suml2 = np.where(take, sl22, suml2)
        scale = np.where(suml2 > 0, sumlx / suml2, f32(0)).astype(np.float32)
    L = np.where(zero[:, None], 0, Lt.T + nmax)
    return np.where(zero, f32(0), scale).astype(np.float32), L


def _requantize(x, D, M, lo: int, hi: int, L):
    """Levels from the stored scales: clamp(nearest((x + M)/D), lo, hi) where D != 0, else keep L.

    x, L (nb, n_sub, sub); D, M (nb, n_sub) f32 (M None: no min). As in ggml, a sub-block whose stored
    scale D is 0 keeps the levels of its search (D NaN is not skipped: `if (!d)` is false for NaN).
    """
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        num = x if M is None else x + M[..., None]
        new = np.clip(_nearest_int(num / D[..., None]), lo, hi)
    return np.where((D != 0)[..., None], new, L)


# -- field packing -----------------------------------------------------------------------------------

def _pack_2bit(L):
    """(nb, 256) levels 0..3 -> qs (nb, 64): element 128h + 32s + l at bits 2s of qs[32h + l]."""
    q = L.reshape(-1, 2, 4, 32).astype(np.uint8)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(-1, 64)


def _unpack_2bit(qs):
    """qs (nb, 64) -> (nb, 256) uint8 values 0..3, the inverse of `_pack_2bit`."""
    return unpack_fields(qs, 2).reshape(-1, 256)


def _pack_scale_min_k4(ls, lm):
    """Eight 6-bit scales and mins (nb, 8) -> the 12 `scales` bytes of Q4_K/Q5_K."""
    ls, lm = ls.astype(np.uint8), lm.astype(np.uint8)
    return np.concatenate([ls[:, :4] | ((ls[:, 4:] >> 4) << 6),
                           lm[:, :4] | ((lm[:, 4:] >> 4) << 6),
                           (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)], axis=1)


def _unpack_scale_min_k4(s):
    """ggml's `get_scale_min_k4` for j = 0..7: 12 bytes (nb, 12) -> (sc, m), each (nb, 8) uint8.

    j < 4: sc = s[j] & 63, m = s[j+4] & 63;  j >= 4: sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4,
    m = (s[j+4] >> 4) | (s[j] >> 6) << 4.
    """
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    m = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc, m


def _pack_q3_scales(l):
    """Sixteen 6-bit values (nb, 16), 0..63 -> the 12 `scales` bytes of Q3_K.

    Low 4 bits of j: s[j] (j < 8) or the high nibble of s[j-8]; high 2 bits: bits 2*(j//4) of s[8 + j%4].
    """
    l = l.astype(np.uint8)
    low = (l[:, :8] & 0xF) | ((l[:, 8:] & 0xF) << 4)
    h = (l >> 4).reshape(-1, 4, 4)                     # [j//4, j%4]
    high = h[:, 0] | (h[:, 1] << 2) | (h[:, 2] << 4) | (h[:, 3] << 6)
    return np.concatenate([low, high], axis=1)


def _unpack_q3_scales(s):
    """The 12 `scales` bytes of Q3_K (nb, 12) -> sixteen values 0..63 (nb, 16) int32 (subtract 32)."""
    low = np.concatenate([s[:, :8] & 0xF, s[:, :8] >> 4], axis=1)
    high = (s[:, 8:12][:, None, :] >> (2 * np.arange(4, dtype=np.uint8))[None, :, None]) & 3   # [j//4, j%4]
    return (low | (high.reshape(-1, 16) << 4)).astype(np.int32)


# -- Q2_K ----------------------------------------------------------------------------------------------

@dequantizer(GGMLType.Q2_K)
def dequantize_q2_K(blocks, out=None):
    """Q2_K, 84 bytes per 256 values (2.625 bpw): `scales[16]` u8 | `qs[64]` | `d` f16 | `dmin` f16.

    16 sub-blocks of 16; scales[j]: low nibble = scale, high nibble = min of sub-block j (e // 16).
    Element e = 128h + 32s + l (h 0..1, s 0..3, l 0..31): q = (qs[32h + l] >> 2s) & 3,
        y[e] = (d * (scales[j] & 15)) * q - (dmin * (scales[j] >> 4))
    (each product and the difference rounded to f32 in that order, as ggml's dequantize_row_q2_K).
    """
    out = output(blocks, QK_K, out)
    n = blocks.shape[0]
    sc = blocks[:, 0:16]
    dl = f16_field(blocks, 80) * (sc & 0xF)
    ml = f16_field(blocks, 82) * (sc >> 4)
    sub = out.reshape(n, 16, 16)
    sub[...] = _unpack_2bit(blocks[:, 16:80]).reshape(n, 16, 16)
    sub *= dl[..., None]
    sub -= ml[..., None]
    return out


@quantizer(GGMLType.Q2_K, "chunk", "ref", "cpu")
@blockwise
def quantize_q2_K(x):
    """ggml's quantize_row_q2_K_ref.

    Per sub-block of 16: `_minmax_search(nmax=3, w=|x|, rmin=-0.5, rdelta=0.1, nstep=15, abs error)`
    -> (scale_j, min_j). maxs, maxm = the largest scale and min (from 0, strict >). Scale nibble
    nearest(15/maxs * scale_j) (all 0 if maxs <= 0), d = fl16(maxs/15); mins likewise into the high
    nibble and dmin. Levels are then recomputed with the stored values, D = d*sc, M = dmin*m:
    clamp(nearest((x + M)/D), 0, 3), except in sub-blocks with D == 0.
    """
    nb = x.shape[0]
    xs = x.reshape(nb * 16, 16)
    scale, mins, L = _minmax_search(xs, np.abs(xs), 3, -0.5, 0.1, 15, True)
    scale, mins = scale.reshape(nb, 16), mins.reshape(nb, 16)
    maxs, maxm = _positive_max(scale), _positive_max(mins)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ls = np.where(maxs[:, None] > 0, _nearest_int((f32(15) / maxs)[:, None] * scale), 0)
        lm = np.where(maxm[:, None] > 0, _nearest_int((f32(15) / maxm)[:, None] * mins), 0)
        d = np.where(maxs > 0, maxs / f32(15), f32(0))
        dmin = np.where(maxm > 0, maxm / f32(15), f32(0))
    scales = ((ls & 0xFF) | (lm << 4)).astype(np.uint8)      # the C byte store keeps the low 8 bits
    with np.errstate(invalid="ignore", over="ignore"):
        D = _fl16(d)[:, None] * (scales & 0xF).astype(np.float32)
        M = _fl16(dmin)[:, None] * (scales >> 4).astype(np.float32)
    L = _requantize(x.reshape(nb, 16, 16), D, M, 0, 3, L.reshape(nb, 16, 16)).reshape(nb, QK_K)
    return np.concatenate([scales, _pack_2bit(L), f16_bytes(d), f16_bytes(dmin)], axis=1)


# -- Q3_K ----------------------------------------------------------------------------------------------

@dequantizer(GGMLType.Q3_K)
def dequantize_q3_K(blocks, out=None):
    """Q3_K, 110 bytes per 256 values (3.4375 bpw): `hmask[32]` | `qs[64]` | `scales[12]` | `d` f16.

    16 sub-blocks of 16 with signed 6-bit scales sc_j - 32 (packing: `_unpack_q3_scales`).
    Element e = 128h + 32s + l: low 2 bits (qs[32h + l] >> 2s) & 3, high bit = bit (4h + s) of
    hmask[l]; q = low2 - (high bit ? 0 : 4) in -4..3.
        y[e] = (d * (sc_{e//16} - 32)) * q
    """
    out = output(blocks, QK_K, out)
    n = blocks.shape[0]
    dl = f16_field(blocks, 108) * (_unpack_q3_scales(blocks[:, 96:108]) - 32).astype(np.float32)
    q = _unpack_2bit(blocks[:, 32:96])
    q |= unpack_fields(blocks[:, 0:32], 1, at=2).reshape(n, QK_K)            # [4h + s, l]: low2 + 4*high
    q -= 4
    sub = out.reshape(n, 16, 16)
    sub[...] = q.view(np.int8).reshape(n, 16, 16)
    sub *= dl[..., None]
    return out


@quantizer(GGMLType.Q3_K, "chunk", "ref", "cpu")
@blockwise
def quantize_q3_K(x):
    """ggml's quantize_row_q3_K_ref.

    Per sub-block of 16: `_q3_search` -> scale_j. max_scale = the signed scale of largest |scale_j|
    (first one). If it is not 0: iscale = -32/max_scale, sc_j = clamp((int8)nearest(iscale*scale_j),
    -32, 31) + 32, d = fl16(1/iscale); else d = 0 and the scales bytes are 0. Levels are recomputed with
    D = fl16(d)*(sc_j - 32): clamp(nearest(x/D), -4, 3) + 4 (kept from the search where D == 0); a level
    above 3 sets its hmask bit and loses 4.
    """
    nb = x.shape[0]
    scale, L = _q3_search(x.reshape(nb * 16, 16))
    scale = scale.reshape(nb, 16)
    _, max_scale = _first_absmax(scale)
    some = max_scale != 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = f32(-32) / max_scale
        l8 = _nearest_int(iscale[:, None] * scale) & 0xFF
        l8 = l8 - ((l8 & 0x80) << 1)                     # (int8_t) of the int
        sc = np.where(some[:, None], np.clip(l8, -32, 31) + 32, 0)
        d = np.where(some, f32(1) / iscale, f32(0))
    scales = np.where(some[:, None], _pack_q3_scales(sc), np.uint8(0)).astype(np.uint8)
    with np.errstate(invalid="ignore", over="ignore"):
        D = _fl16(d)[:, None] * (_unpack_q3_scales(scales) - 32).astype(np.float32)
    L = _requantize(x.reshape(nb, 16, 16), D, None, -4, 3, L.reshape(nb, 16, 16) - 4) + 4
    L = L.reshape(nb, QK_K)
    high = L > 3
    hmask = np.zeros((nb, 32), np.uint8)
    for b in range(8):                                   # element 32b + l -> bit b of hmask[l]
        hmask |= high[:, 32 * b:32 * b + 32].astype(np.uint8) << b
    qs = _pack_2bit(np.where(high, L - 4, L))
    return np.concatenate([hmask, qs, scales, f16_bytes(d)], axis=1)


# -- Q4_K / Q5_K ---------------------------------------------------------------------------------------

def _scale_min_factors(blocks):
    """(d*sc_j, dmin*m_j) of the eight 32-sub-blocks of Q4_K/Q5_K, each (nb, 8) f32."""
    d, dmin = f16_field(blocks, 0), f16_field(blocks, 2)
    sc, m = _unpack_scale_min_k4(blocks[:, 4:16])
    with np.errstate(invalid="ignore", over="ignore"):
        return d * sc.astype(np.float32), dmin * m.astype(np.float32)


def _nibbles_k4(qs):
    """qs (n, 128) -> (n, 8, 32) uint8: chunk c = qs[32c..32c+31] gives sub-block 2c (low nibbles) and
    2c+1 (high nibbles)."""
    return unpack_fields(qs, 4).reshape(-1, 8, 32)


@dequantizer(GGMLType.Q4_K)
def dequantize_q4_K(blocks, out=None):
    """Q4_K, 144 bytes per 256 values (4.5 bpw): `d` f16 | `dmin` f16 | `scales[12]` | `qs[128]`.

    8 sub-blocks of 32 with 6-bit scale sc_j and min m_j (packing: `_unpack_scale_min_k4`).
    Chunk c = 0..3 of 64 values uses qs[32c .. 32c+31]: low nibbles are elements 64c + l (sub-block 2c),
    high nibbles 64c + 32 + l (sub-block 2c+1).
        y = (d * sc_j) * q - (dmin * m_j)
    """
    out = output(blocks, QK_K, out)
    D, M = _scale_min_factors(blocks)
    sub = out.reshape(-1, 8, 32)
    sub[...] = _nibbles_k4(blocks[:, 16:144])
    sub *= D[..., None]
    sub -= M[..., None]
    return out


@dequantizer(GGMLType.Q5_K)
def dequantize_q5_K(blocks, out=None):
    """Q5_K, 176 bytes per 256 values (5.5 bpw): `d` f16 | `dmin` f16 | `scales[12]` | `qh[32]` | `qs[128]`.

    As Q4_K, plus a fifth bit worth 16: element 64c + l takes bit 2c of qh[l], element 64c + 32 + l
    takes bit 2c+1.
        y = (d * sc_j) * q - (dmin * m_j),  q in 0..31
    """
    out = output(blocks, QK_K, out)
    n = blocks.shape[0]
    D, M = _scale_min_factors(blocks)
    q = _nibbles_k4(blocks[:, 48:176])
    q |= unpack_fields(blocks[:, 16:48], 1, at=4).reshape(n, 8, 32)              # bit j of qh[l], worth 16
    sub = out.reshape(n, 8, 32)
    sub[...] = q
    sub *= D[..., None]
    sub -= M[..., None]
    return out


def _quantize_k4(x, nmax: int, rmin: float, nstep: int):
    """quantize_row_q4_K_ref / q5_K_ref up to the level packing: (scales bytes, d, dmin, L (nb, 256)).

    Per sub-block of 32: sum_x2 = Σx² (sequential), av = sqrtf(sum_x2/32), w = av + |x|,
    `_minmax_search(nmax, w, rmin, 0.1, nstep, squared error)`. maxs, maxm as for Q2_K;
    ls_j = min(63, (uint8)nearest(63/maxs * scale_j)) (63/maxs taken as 0 when maxs <= 0), lm_j likewise;
    d = fl16(maxs/63), dmin = fl16(maxm/63); then levels clamp(nearest((x + dmin*m_j)/(d*sc_j)), 0, nmax)
    where d*sc_j != 0.
    """
    nb = x.shape[0]
    xs = x.reshape(nb * 8, 32)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        av = np.sqrt(_sum(xs * xs) / f32(32))
        w = av[:, None] + np.abs(xs)
    scale, mins, L = _minmax_search(xs, w, nmax, rmin, 0.1, nstep, False)
    scale, mins = scale.reshape(nb, 8), mins.reshape(nb, 8)
    maxs, maxm = _positive_max(scale), _positive_max(mins)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv_s = np.where(maxs > 0, f32(63) / maxs, f32(0))
        inv_m = np.where(maxm > 0, f32(63) / maxm, f32(0))
        ls = np.minimum(63, _nearest_int(inv_s[:, None] * scale) & 0xFF)
        lm = np.minimum(63, _nearest_int(inv_m[:, None] * mins) & 0xFF)
    d, dmin = maxs / f32(63), maxm / f32(63)
    with np.errstate(invalid="ignore", over="ignore"):
        D = _fl16(d)[:, None] * ls.astype(np.float32)
        M = _fl16(dmin)[:, None] * lm.astype(np.float32)
    L = _requantize(x.reshape(nb, 8, 32), D, M, 0, nmax, L.reshape(nb, 8, 32)).reshape(nb, QK_K)
    return _pack_scale_min_k4(ls, lm), d, dmin, L


@quantizer(GGMLType.Q4_K, "chunk", "ref", "cpu")
@blockwise
def quantize_q4_K(x):
    """ggml's quantize_row_q4_K_ref: `_quantize_k4` with nmax 15, rmin -1.0, 20 steps; nibble packing."""
    scales, d, dmin, L = _quantize_k4(x, 15, -1.0, 20)
    q = L.reshape(-1, 4, 2, 32).astype(np.uint8)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)
    return np.concatenate([f16_bytes(d), f16_bytes(dmin), scales, qs], axis=1)


@quantizer(GGMLType.Q5_K, "chunk", "ref", "cpu")
@blockwise
def quantize_q5_K(x):
    """ggml's quantize_row_q5_K_ref: `_quantize_k4` with nmax 31, rmin -0.5, 15 steps; bit 4 into qh."""
    scales, d, dmin, L = _quantize_k4(x, 31, -0.5, 15)
    q = L.reshape(-1, 8, 32).astype(np.uint8)                     # [2c + half, l]
    qh = np.zeros((len(q), 32), np.uint8)
    for b in range(8):
        qh |= (q[:, b] >> 4) << b
    low = (q & 0xF).reshape(-1, 4, 2, 32)
    qs = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(-1, 128)
    return np.concatenate([f16_bytes(d), f16_bytes(dmin), scales, qh, qs], axis=1)


# -- Q6_K ----------------------------------------------------------------------------------------------

@dequantizer(GGMLType.Q6_K)
def dequantize_q6_K(blocks, out=None):
    """Q6_K, 210 bytes per 256 values (6.5625 bpw): `ql[128]` | `qh[64]` | `scales[16]` int8 | `d` f16.

    Half h = 0..1 uses ql[64h ..], qh[32h ..]; for l = 0..31 and k = 0..3, element 128h + 32k + l has
    low nibble from ql[64h + l + 32*(k & 1)] (k < 2: low nibble, else high) and bits 4-5 from
    (qh[32h + l] >> 2k) & 3; q = v6 - 32.
        y[e] = (d * scales[e//16]) * q
    """
    out = output(blocks, QK_K, out)
    n = blocks.shape[0]
    dl = f16_field(blocks, 208) * blocks[:, 192:208].view(np.int8)
    ql = np.ascontiguousarray(blocks[:, 0:128]).view("<u8").reshape(n, 2, 2, 4)    # [h, k & 1, u64 word]
    q = np.empty((n, 2, 4, 4), "<u8")                                              # [h, k, u64 word]
    np.bitwise_and(ql, LOW_NIBBLES, out=q[:, :, 0:2])                              # k = 0, 1: low nibbles
    np.bitwise_and(ql >> np.uint64(4), LOW_NIBBLES, out=q[:, :, 2:4])              # k = 2, 3: high nibbles
    q = q.view(np.uint8).reshape(n, 2, 4, 32)                                      # [h, k, l]
    q |= unpack_fields(blocks[:, 128:192], 2, at=4)
    q -= 32
    sub = out.reshape(n, 16, 16)
    sub[...] = q.view(np.int8).reshape(n, 16, 16)
    sub *= dl[..., None]
    return out


@quantizer(GGMLType.Q6_K, "chunk", "ref", "cpu")
@blockwise
def quantize_q6_K(x):
    """ggml's quantize_row_q6_K_ref.

    Per sub-block of 16: `_qx_search(nmax=32)` -> scale_j. max_scale = the signed scale of largest
    |scale_j| (first one); if |max_scale| < 1e-15 the block is all zero bytes. Else iscale =
    -128/max_scale, d = fl16(1/iscale), scales[j] = (int8)min(127, nearest(iscale*scale_j)); levels
    clamp(nearest(x/(d*scales[j])), -32, 31) + 32 (kept from the search where that product is 0).
    """
    nb = x.shape[0]
    scale, L = _qx_search(x.reshape(nb * 16, 16), 32)
    scale = scale.reshape(nb, 16)
    amax, max_scale = _first_absmax(scale)
    zero = amax < GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = f32(-128) / max_scale
        d = np.where(zero, f32(0), f32(1) / iscale)
        s = np.minimum(127, _nearest_int(iscale[:, None] * scale)) & 0xFF
        s = np.where(zero[:, None], 0, s - ((s & 0x80) << 1))      # (int8_t)
        D = _fl16(d)[:, None] * s.astype(np.float32)
    L = _requantize(x.reshape(nb, 16, 16), D, None, -32, 31, L.reshape(nb, 16, 16) - 32) + 32
    q = L.reshape(nb, 2, 4, 32).astype(np.uint8)                  # [h, k, l]
    ql = ((q[:, :, 0:2] & 0xF) | ((q[:, :, 2:4] & 0xF) << 4)).reshape(nb, 128)
    qh = ((q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4)
          | ((q[:, :, 3] >> 4) << 6)).reshape(nb, 64)
    out = np.concatenate([ql, qh, s.astype(np.int8).view(np.uint8), f16_bytes(d)], axis=1)
    return np.where(zero[:, None], np.uint8(0), out).astype(np.uint8)


# -- Q8_K ----------------------------------------------------------------------------------------------

@dequantizer(GGMLType.Q8_K)
def dequantize_q8_K(blocks, out=None):
    """Q8_K, 292 bytes per 256 values: `d` f32 | `qs[256]` int8 | `bsums[16]` int16 (Σ qs per 16).

    The activation format of the K-quant dot products. y = d * q (bsums are not read).
    """
    out = output(blocks, QK_K, out)
    out[...] = blocks[:, 4:260].view(np.int8)
    out *= np.ascontiguousarray(blocks[:, 0:4]).view("<f4")
    return out


@quantizer(GGMLType.Q8_K, "ref", "cpu")
@blockwise
def quantize_q8_K(x):
    """ggml's quantize_row_q8_K_ref (also the CPU backend's from_float on every architecture).

    max = the signed first-argmax of |x|; a block with max|x| == 0 is all zero (ggml leaves its
    bsums unwritten; here they are 0, as in a zero-filled buffer). Else iscale = -127/max,
    q = (int8)min(127, nearest(iscale*x)), bsums[j] = Σ of q over elements 16j..16j+15, d = 1/iscale
    (f32: negative whenever the largest-magnitude value is positive; that value becomes -127).
    """
    nb = x.shape[0]
    amax, mx = _first_absmax(x)
    zero = amax == 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = f32(-127) / mx
        q = np.minimum(127, _nearest_int(iscale[:, None] * x)) & 0xFF
        q = np.where(zero[:, None], 0, q - ((q & 0x80) << 1))       # (int8_t)
        d = np.where(zero, f32(0), f32(1) / iscale).astype("<f4")
    bsums = q.reshape(nb, 16, 16).sum(axis=-1).astype("<i2")       # int sum, stored as int16
    return np.concatenate([d.reshape(nb, 1).view(np.uint8), q.astype(np.int8).view(np.uint8),
                           bsums.view(np.uint8)], axis=1)
