"""Numba kernels of mul_mat with numerics="ggml": ggml-cpu's integer dot products, bit for bit.

Each kernel replaces one dot function of refimpl/kernels/ggml/matmul.py (registered with
`register(<that function>, "numba", KEYS)`; `matmul._dots` asks `kernel_for` and calls it under the numba
backend) and computes the same bits: the same integer lanes (element e of a block feeds register lane
(e % 32) // 4; integer sums are exact, so their order is free), converted to f32 by one rounding, the
same f32 operations in the same order, `fma32` rounding once (LLVM's llvm.fma.f32: vfmadd, or a correctly
rounded libm call), `_hsum` = vecdot.hsum_b. No fastmath.

Versions (`_rows_<type>(W, <activation arrays>, out, lo, hi, T, R)`: weight rows lo..hi-1 against every
activation row; a thread per range of weight rows; T a lookup table, R = 32 passed at run time):
    Q4_0 Q5_0 Q8_0 x Q8_0   `_signed_q8_0`: acc = fma(fl(d_x*d_y), lanes, acc) per block, signed byte products
                            with the sign quirk (a level < 0 times an activation -128 counts as level * 128);
                            matmul._signed_x_q8_0
    IQ4_NL x Q8_0           `_paired_q8_0`: even / odd blocks in two accumulators, an odd last block added by
                            the scalar tail; matmul._paired_q8_0
    Q4_1 Q5_1 x Q8_1        `_unsigned_q8_1`: plus summs += m_x*s_y in f32; matmul._unsigned_x_q8_1
    Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS x Q8_K   one function each: the lanes of (sub-block scale * level) * a
                            and the type's min / offset term, as its dot function's docstring says
    `_qz_q8_cpu`            the x86 `from_float` of Q8_0 / Q8_1 (the activation conversion), registered for
                            refimpl.quants.legacy.quantize_q8_0_cpu / quantize_q8_1_cpu (Q8_K's quantizer
                            already has its kernel in quantize.py)

Weight rows are decoded one at a time into int32 levels already multiplied by their sub-block scale (and
f32 block scales); the activations are read once per call by the NumPy readers of matmul.py (`_q8_0`,
`_q8_1`, `_q8_K`), so their scales are the same f32 values by construction. The other weight types run the
NumPy code under every backend. Speed (1 thread): the 32-element types ~2 GFLOP/s for one activation row and
~3.3 for 128 (SmolLM2's Q4_1 1536x576: 10-13x the NumPy emulation), the K-quants 3-4 and 8 (12-28x); the
per-block overhead of the 8-lane reduction dominates the 32-element types.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.extending import intrinsic

from ..dispatch import KEYS, register
from .ggml import matmul as fm
from ..quants import legacy
from ._common import f16_bits, f16_to_f32, parallel_ranges

_JIT = dict(cache=True, nogil=True)
MIN_MACS = 1 << 16       # integer multiply-adds per thread at least


# -- f32 primitives --------------------------------------------------------------------------------------

@intrinsic
def fma32(typingctx, a, b, c):
    """fl32(a*b + c) with one rounding (vecdot.fma32): LLVM's llvm.fma.f32 on f32 operands."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f = ir.FloatType()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f, [f, f, f]), "llvm.fma.f32")
        return builder.call(fn, args)
    return sig, codegen


@njit(inline="always")
def _hsum(v):
    """vecdot.hsum_b of 8 f32 lanes: t_i = v_i + v_{i+4}, then (t0 + t2) + (t1 + t3)."""
    t0, t1, t2, t3 = v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]
    return (t0 + t2) + (t1 + t3)


@njit(inline="always")
def _fma8(d, lanes, acc):
    for l in range(8):
        acc[l] = fma32(d, lanes[l], acc[l])


@njit(inline="always")
def _f16(W, i, b, o):
    """The f16 at byte o of block b of weight row i, as f32 (exact; a signalling NaN comes out quiet)."""
    return f16_to_f32(W[i, b, o], W[i, b, o + 1])


# -- integer lanes ---------------------------------------------------------------------------------------
# x: one weight row's int32 levels (scale included), a: activation rows (m, k) int8; p: 32 int32 partial
# sums (one per byte position of a register), L: the 8 lane sums as f32. Inner loops index slices from 0
# (Numba omits its negative-index checks there) and run `range(R)` / `range(R // 2)` with R = 32 passed at run
# time: LLVM unrolls a loop of constant trip count and leaves it scalar, one it cannot count it vectorizes
# (kernels/quants.py `_rt`; 50x here).

@njit(inline="always")
def _lanes(x, a, j, o, ng, off, p, L, R):
    """Lane sums of x[e] * a[j, e] over the ng 32-element groups at o (vecdot.int_lanes), minus the
    integer off[l], rounded once to f32."""
    xs, As = x[o:o + 32 * ng], a[j, o:o + 32 * ng]
    for e in range(R):
        p[e] = 0
    for g in range(ng):
        xg, ag = xs[32 * g:32 * g + 32], As[32 * g:32 * g + 32]
        for e in range(R):
            p[e] += xg[e] * ag[e]
    for l in range(8):
        L[l] = np.float32(p[4 * l] + p[4 * l + 1] + p[4 * l + 2] + p[4 * l + 3] - off[l])


@njit(inline="always")
def _lanes_quirk(x, s, a, j, o, ng, p, L, R):
    """As `_lanes`, with the signed byte products of mul_sum_i8_pairs / mul_add_epi8 (vecdot.sign_quirk):
    where the sign source s[e] < 0 and a == -128, the product is x[e] * 128."""
    xs, ss, As = x[o:o + 32 * ng], s[o:o + 32 * ng], a[j, o:o + 32 * ng]
    for e in range(R):
        p[e] = 0
    for g in range(ng):
        xg, sg, ag = xs[32 * g:32 * g + 32], ss[32 * g:32 * g + 32], As[32 * g:32 * g + 32]
        for e in range(R):
            av = np.int32(ag[e])
            p[e] += xg[e] * (np.int32(128) if (av == -128 and sg[e] < 0) else av)
    for l in range(8):
        L[l] = np.float32(p[4 * l] + p[4 * l + 1] + p[4 * l + 2] + p[4 * l + 3])


# -- weight row decoders: row i of W (n, nblk, type_size) uint8 into x (k,) int32 and f32 scales ----------
# `_dec_<type>(W, i, x, dx, aux, T, R)`: levels into x, d into dx (nblk,), Q4_1/Q5_1's m into aux.

@njit(inline="always")
def _nibbles(W, i, b, o, x, base, off, R):
    """16 bytes at o -> x[base + j] = low nibble + off, x[base + 16 + j] = high nibble + off."""
    q, xs = W[i, b, o:o + 16], x[base:base + 32]
    for t in range(R // 2):
        xs[t] = (np.int32(q[t]) & 15) + off
        xs[t + 16] = (np.int32(q[t]) >> 4) + off


@njit(inline="always")
def _qh5(W, i, b, o, x, base, R):
    """Q5_0/Q5_1 qh: bit j of the little-endian u32 at o adds 16 to x[base + j]."""
    qh = (np.int64(W[i, b, o]) | (np.int64(W[i, b, o + 1]) << 8) | (np.int64(W[i, b, o + 2]) << 16)
          | (np.int64(W[i, b, o + 3]) << 24))
    xs = x[base:base + 32]
    for t in range(R):
        xs[t] += np.int32(((qh >> t) & 1) << 4)


@njit(inline="always")
def _dec_q4_0(W, i, x, dx, aux, T, R):
    """block_q4_0: d f16 | qs[16]; levels nibble - 8 (matmul._q4_0_dot)."""
    for b in range(W.shape[1]):
        dx[b] = _f16(W, i, b, 0)
        _nibbles(W, i, b, 2, x, 32 * b, -8, R)


@njit(inline="always")
def _dec_q5_0(W, i, x, dx, aux, T, R):
    """block_q5_0: d f16 | qh[4] | qs[16]; levels (nibble | qh bit << 4) - 16."""
    for b in range(W.shape[1]):
        dx[b] = _f16(W, i, b, 0)
        _nibbles(W, i, b, 6, x, 32 * b, -16, R)
        _qh5(W, i, b, 2, x, 32 * b, R)


@njit(inline="always")
def _dec_q8_0(W, i, x, dx, aux, T, R):
    """block_q8_0: d f16 | qs[32] int8."""
    for b in range(W.shape[1]):
        dx[b] = _f16(W, i, b, 0)
        q, xs = W[i, b, 2:34], x[32 * b:32 * b + 32]
        for t in range(R):
            xs[t] = (np.int32(q[t]) ^ 0x80) - 0x80


@njit(inline="always")
def _dec_iq4_nl(W, i, x, dx, aux, T, R):
    """block_iq4_nl: d f16 | qs[16]; levels T[nibble] (kvalues_iq4nl), nibbles split as Q4_0."""
    for b in range(W.shape[1]):
        dx[b] = _f16(W, i, b, 0)
        q, xs = W[i, b, 2:18], x[32 * b:32 * b + 32]
        for t in range(R // 2):
            xs[t] = T[np.int32(q[t]) & 15]
            xs[t + 16] = T[np.int32(q[t]) >> 4]


@njit(inline="always")
def _dec_q4_1(W, i, x, dx, mx, T, R):
    """block_q4_1: d f16 | m f16 | qs[16]; unsigned nibbles."""
    for b in range(W.shape[1]):
        dx[b] = _f16(W, i, b, 0)
        mx[b] = _f16(W, i, b, 2)
        _nibbles(W, i, b, 4, x, 32 * b, 0, R)


@njit(inline="always")
def _dec_q5_1(W, i, x, dx, mx, T, R):
    """block_q5_1: d f16 | m f16 | qh[4] | qs[16]; unsigned 5-bit levels."""
    for b in range(W.shape[1]):
        dx[b] = _f16(W, i, b, 0)
        mx[b] = _f16(W, i, b, 2)
        _nibbles(W, i, b, 8, x, 32 * b, 0, R)
        _qh5(W, i, b, 4, x, 32 * b, R)


# -- Q8_0 / Q8_1 activations ------------------------------------------------------------------------------

@njit(inline="always")
def _signed_q8_0(dec, W, a, dy, out, lo, hi, T, R):
    """matmul._signed_x_q8_0: per block acc = fma(fl(d_x*d_y), lanes, acc) (sign quirk), hsum."""
    nblk, m, k = W.shape[1], a.shape[0], a.shape[1]
    x, dx = np.empty(k, np.int32), np.empty(nblk, np.float32)
    p, L, acc = np.empty(32, np.int32), np.empty(8, np.float32), np.empty(8, np.float32)
    for i in range(lo, hi):
        dec(W, i, x, dx, dx, T, R)
        for j in range(m):
            acc[:] = 0
            for b in range(nblk):
                _lanes_quirk(x, x, a, j, 32 * b, 1, p, L, R)
                _fma8(dx[b] * dy[j, b], L, acc)
            out[j, i] = _hsum(acc)


@njit(inline="always")
def _paired_q8_0(dec, W, a, dy, out, lo, hi, T, R):
    """matmul._paired_q8_0: even blocks into acc0, odd into acc1 (fma with fl(d_y*d_x), sign quirk);
    hsum(acc0 + acc1); an odd last block then s = fma(fl(d_y*d_x), f32(exact dot), s)."""
    nblk, m, k = W.shape[1], a.shape[0], a.shape[1]
    x, dx = np.empty(k, np.int32), np.empty(nblk, np.float32)
    p, L = np.empty(32, np.int32), np.empty(8, np.float32)
    acc = np.empty((2, 8), np.float32)
    npair = nblk - nblk % 2
    for i in range(lo, hi):
        dec(W, i, x, dx, dx, T, R)
        for j in range(m):
            acc[:] = 0
            for b in range(npair):
                _lanes_quirk(x, x, a, j, 32 * b, 1, p, L, R)
                _fma8(dy[j, b] * dx[b], L, acc[b % 2])
            s = _hsum(acc[0] + acc[1])
            if npair < nblk:
                sumi = 0
                xs, As = x[32 * npair:32 * npair + 32], a[j, 32 * npair:32 * npair + 32]
                for e in range(R):
                    sumi += xs[e] * np.int32(As[e])
                s = fma32(dy[j, npair] * dx[npair], np.float32(sumi), s)
            out[j, i] = s


@njit(inline="always")
def _unsigned_q8_1(dec, W, a, dy, sy, out, lo, hi, T, R):
    """matmul._unsigned_x_q8_1: acc = fma(fl(d_x*d_y), lanes, acc), summs = summs + m_x*s_y (f32);
    hsum(acc) + summs."""
    nblk, m, k = W.shape[1], a.shape[0], a.shape[1]
    x, dx, mx = np.empty(k, np.int32), np.empty(nblk, np.float32), np.empty(nblk, np.float32)
    p, L, acc = np.empty(32, np.int32), np.empty(8, np.float32), np.empty(8, np.float32)
    off = np.zeros(8, np.int32)
    for i in range(lo, hi):
        dec(W, i, x, dx, mx, T, R)
        for j in range(m):
            acc[:] = 0
            summs = np.float32(0)
            for b in range(nblk):
                _lanes(x, a, j, 32 * b, 1, off, p, L, R)
                _fma8(dx[b] * dy[j, b], L, acc)
                summs = summs + mx[b] * sy[j, b]
            out[j, i] = _hsum(acc) + summs


@njit(**_JIT)
def _rows_q4_0(W, a, dy, out, lo, hi, T, R):
    _signed_q8_0(_dec_q4_0, W, a, dy, out, lo, hi, T, R)


@njit(**_JIT)
def _rows_q5_0(W, a, dy, out, lo, hi, T, R):
    _signed_q8_0(_dec_q5_0, W, a, dy, out, lo, hi, T, R)


@njit(**_JIT)
def _rows_q8_0(W, a, dy, out, lo, hi, T, R):
    _signed_q8_0(_dec_q8_0, W, a, dy, out, lo, hi, T, R)


@njit(**_JIT)
def _rows_iq4_nl(W, a, dy, out, lo, hi, T, R):
    _paired_q8_0(_dec_iq4_nl, W, a, dy, out, lo, hi, T, R)


@njit(**_JIT)
def _rows_q4_1(W, a, dy, sy, out, lo, hi, T, R):
    _unsigned_q8_1(_dec_q4_1, W, a, dy, sy, out, lo, hi, T, R)


@njit(**_JIT)
def _rows_q5_1(W, a, dy, sy, out, lo, hi, T, R):
    _unsigned_q8_1(_dec_q5_1, W, a, dy, sy, out, lo, hi, T, R)


# -- K-quants x Q8_K -----------------------------------------------------------------------------------------
# A decoder fills x (k,) with scale * level, dx / dmx (nblk,) f32 and mn (nblk, 16) int32 (the type's min
# or sub-block scales, whatever its min / offset term needs).

@njit(inline="always")
def _kscales(W, i, b, o, sc, mn):
    """Q4_K/Q5_K 12 scale bytes at o -> 6-bit scales sc[0..8] and mins mn[0..8] (matmul._kscales)."""
    s = W[i, b, o:o + 12]
    for j in range(4):
        sc[j] = np.int32(s[j]) & 63
        mn[j] = np.int32(s[j + 4]) & 63
        sc[j + 4] = (np.int32(s[j + 8]) & 15) | ((np.int32(s[j]) >> 6) << 4)
        mn[j + 4] = (np.int32(s[j + 8]) >> 4) | ((np.int32(s[j + 4]) >> 6) << 4)


@njit(inline="always")
def _dec_q4_K(W, i, x, dx, dmx, mn, sc, R):
    """block_q4_K: d f16 | dmin f16 | scales[12] | qs[128]; element 64c + l = low nibble of qs[32c + l],
    64c + 32 + l its high nibble; sub-block of 32 j: x = sc_j * q."""
    for b in range(W.shape[1]):
        dx[b], dmx[b] = _f16(W, i, b, 0), _f16(W, i, b, 2)
        _kscales(W, i, b, 4, sc, mn[b])
        for c in range(4):
            q, xl, xh = W[i, b, 16 + 32 * c:48 + 32 * c], x[256 * b + 64 * c:], x[256 * b + 64 * c + 32:]
            s0, s1 = sc[2 * c], sc[2 * c + 1]
            for t in range(R):
                xl[t] = s0 * (np.int32(q[t]) & 15)
                xh[t] = s1 * (np.int32(q[t]) >> 4)


@njit(inline="always")
def _dec_q5_K(W, i, x, dx, dmx, mn, sc, R):
    """block_q5_K: d f16 | dmin f16 | scales[12] | qh[32] | qs[128]; as Q4_K, plus 16 * bit 2c of qh[l]
    (element 64c + l) and bit 2c + 1 (element 64c + 32 + l)."""
    for b in range(W.shape[1]):
        dx[b], dmx[b] = _f16(W, i, b, 0), _f16(W, i, b, 2)
        _kscales(W, i, b, 4, sc, mn[b])
        qh = W[i, b, 16:48]
        for c in range(4):
            q, xl, xh = W[i, b, 48 + 32 * c:80 + 32 * c], x[256 * b + 64 * c:], x[256 * b + 64 * c + 32:]
            s0, s1 = sc[2 * c], sc[2 * c + 1]
            for t in range(R):
                h = np.int32(qh[t])
                xl[t] = s0 * ((np.int32(q[t]) & 15) | (((h >> (2 * c)) & 1) << 4))
                xh[t] = s1 * ((np.int32(q[t]) >> 4) | (((h >> (2 * c + 1)) & 1) << 4))


@njit(inline="always")
def _dec_q6_K(W, i, x, dx, dmx, mn, sc, R):
    """block_q6_K: ql[128] | qh[64] | scales[16] int8 | d f16; x = sc_{e/16} * u (u the unsigned 6-bit
    value, see matmul._q6_K); mn = the 16 scales (for the -32 offset term)."""
    for b in range(W.shape[1]):
        dx[b] = _f16(W, i, b, 208)
        for j in range(R // 2):
            mn[b, j] = (np.int32(W[i, b, 192 + j]) ^ 0x80) - 0x80
        for h in range(2):
            qh = W[i, b, 128 + 32 * h:160 + 32 * h]
            for n4 in range(4):
                ql = W[i, b, 64 * h + 32 * (n4 % 2):64 * h + 32 * (n4 % 2) + 32]
                xs = x[256 * b + 128 * h + 32 * n4:]
                s0, s1 = mn[b, 8 * h + 2 * n4], mn[b, 8 * h + 2 * n4 + 1]
                sh = 4 * (n4 // 2)
                for t in range(R):
                    u = ((np.int32(ql[t]) >> sh) & 15) | (((np.int32(qh[t]) >> (2 * n4)) & 3) << 4)
                    xs[t] = (s0 if t < 16 else s1) * u


@njit(inline="always")
def _dec_q2_K(W, i, x, dx, dmx, mn, sc, R):
    """block_q2_K: scales[16] | qs[64] | d f16 | dmin f16; element 128h + 32s + l = (qs[32h + l] >> 2s) & 3,
    times the low nibble of scales[e/16]; mn = the high nibbles (mins)."""
    for b in range(W.shape[1]):
        dx[b], dmx[b] = _f16(W, i, b, 80), _f16(W, i, b, 82)
        for j in range(R // 2):
            mn[b, j] = np.int32(W[i, b, j]) >> 4
        for h in range(2):
            q = W[i, b, 16 + 32 * h:48 + 32 * h]
            for s in range(4):
                xs = x[256 * b + 128 * h + 32 * s:]
                s0 = np.int32(W[i, b, 8 * h + 2 * s]) & 15
                s1 = np.int32(W[i, b, 8 * h + 2 * s + 1]) & 15
                for t in range(R):
                    xs[t] = (s0 if t < 16 else s1) * ((np.int32(q[t]) >> (2 * s)) & 3)


@njit(inline="always")
def _dec_q3_K(W, i, x, dx, dmx, mn, sc, R):
    """block_q3_K: hmask[32] | qs[64] | scales[12] | d f16; element 128h + 32s + l: (qs[32h + l] >> 2s) & 3,
    minus 4 unless bit 4h + s of hmask[l] is set, times the signed 6-bit scale of its 16 (matmul._q3_K)."""
    for b in range(W.shape[1]):
        dx[b] = _f16(W, i, b, 108)
        s12 = W[i, b, 96:108]
        for j in range(R // 2):
            lo4 = (np.int32(s12[j]) & 15) if j < 8 else (np.int32(s12[j - 8]) >> 4)
            hi2 = (np.int32(s12[8 + j % 4]) >> (2 * (j // 4))) & 3
            sc[j] = (lo4 | (hi2 << 4)) - 32
        hm = W[i, b, 0:32]
        for h in range(2):
            q = W[i, b, 32 + 32 * h:64 + 32 * h]
            for s in range(4):
                xs = x[256 * b + 128 * h + 32 * s:]
                s0, s1 = sc[8 * h + 2 * s], sc[8 * h + 2 * s + 1]
                for t in range(R):
                    v = ((np.int32(q[t]) >> (2 * s)) & 3) - 4 * (1 - ((np.int32(hm[t]) >> (4 * h + s)) & 1))
                    xs[t] = (s0 if t < 16 else s1) * v


@njit(inline="always")
def _dec_iq4_xs(W, i, x, sg, dx, sc, T, R):
    """block_iq4_xs: d f16 | scales_h u16 | scales_l[4] | qs[128]; sub-block ib of 32: x = (ls - 32) * K,
    K = T[nibble] with the nibbles of its 16 bytes split as Q4_0 (matmul._iq4_xs). The sign quirk follows
    the sign of K, not of the scaled level: sg = K."""
    for b in range(W.shape[1]):
        dx[b] = _f16(W, i, b, 0)
        sh = np.int32(W[i, b, 2]) | (np.int32(W[i, b, 3]) << 8)
        for ib in range(8):
            ls = ((np.int32(W[i, b, 4 + ib // 2]) >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4)
            s0 = ls - 32
            q = W[i, b, 8 + 16 * ib:24 + 16 * ib]
            o = 256 * b + 32 * ib
            xs, ss = x[o:o + 32], sg[o:o + 32]
            for t in range(R // 2):
                ss[t] = T[np.int32(q[t]) & 15]
                ss[t + 16] = T[np.int32(q[t]) >> 4]
            for t in range(R):
                xs[t] = s0 * ss[t]


@njit(inline="always")
def _kbuffers(W, a):
    """Per-thread scratch of the K-quant kernels: x (k,) int32, dx, dmx (nblk,) f32, mn (nblk, 16) int32,
    sc (16,) int32, p (32,) int32, L and acc (8,) f32."""
    nblk, k = W.shape[1], a.shape[1]
    return (np.empty(k, np.int32), np.empty(nblk, np.float32), np.empty(nblk, np.float32),
            np.zeros((nblk, 16), np.int32), np.zeros(16, np.int32), np.empty(32, np.int32),
            np.empty(8, np.float32), np.empty(8, np.float32))


@njit(inline="always")
def _bpair(bs, j, b, t):
    """B_t = bsum_2t + bsum_2t+1, wrapped to int16 (_mm_hadd_epi16; matmul._kmins)."""
    v = bs[j, b, 2 * t] + bs[j, b, 2 * t + 1]
    return ((v + 32768) & 0xFFFF) - 32768


@njit(**_JIT)
def _rows_q4_K(W, a, dy, bs, out, lo, hi, T, R):
    """matmul._q4_K_dot: per block acc_m = fma(fl(dmin_x*-d_y), P_t, acc_m) on 4 lanes, P_t = m_2t B_2t +
    m_2t+1 B_2t+1 (`_bpair`), and acc = fma(fl(d_x*d_y), lanes, acc); hsum(acc) + ((acc_m0 + acc_m2) +
    (acc_m1 + acc_m3))."""
    x, dx, dmx, mn, sc, p, L, acc = _kbuffers(W, a)
    accm, off = np.empty(4, np.float32), np.zeros(8, np.int32)
    for i in range(lo, hi):
        _dec_q4_K(W, i, x, dx, dmx, mn, sc, R)
        for j in range(a.shape[0]):
            acc[:] = 0
            accm[:] = 0
            for b in range(W.shape[1]):
                dm = dmx[b] * -dy[j, b]
                for t in range(4):
                    P = mn[b, 2 * t] * _bpair(bs, j, b, 2 * t) + mn[b, 2 * t + 1] * _bpair(bs, j, b, 2 * t + 1)
                    accm[t] = fma32(dm, np.float32(P), accm[t])
                _lanes(x, a, j, 256 * b, 8, off, p, L, R)
                _fma8(dx[b] * dy[j, b], L, acc)
            out[j, i] = _hsum(acc) + ((accm[0] + accm[2]) + (accm[1] + accm[3]))


@njit(**_JIT)
def _rows_q5_K(W, a, dy, bs, out, lo, hi, T, R):
    """matmul._q5_K_dot: per block summs = fma(fl(dmin_x*-d_y), f32(sum_t m_t B_t), summs) (scalar) and
    acc = fma(fl(d_x*d_y), lanes, acc); hsum(acc) + summs."""
    x, dx, dmx, mn, sc, p, L, acc = _kbuffers(W, a)
    off = np.zeros(8, np.int32)
    for i in range(lo, hi):
        _dec_q5_K(W, i, x, dx, dmx, mn, sc, R)
        for j in range(a.shape[0]):
            acc[:] = 0
            summs = np.float32(0)
            for b in range(W.shape[1]):
                P = 0
                for t in range(8):
                    P += mn[b, t] * _bpair(bs, j, b, t)
                summs = fma32(dmx[b] * -dy[j, b], np.float32(P), summs)
                _lanes(x, a, j, 256 * b, 8, off, p, L, R)
                _fma8(dx[b] * dy[j, b], L, acc)
            out[j, i] = _hsum(acc) + summs


@njit(**_JIT)
def _rows_q6_K(W, a, dy, bs, out, lo, hi, T, R):
    """matmul._q6_K_dot: lane l = lanes(sc*u*a) - 32*(sc_2l bsum_2l + sc_2l+1 bsum_2l+1), one rounding to
    f32; acc = fma(fl(d_x*d_y), lanes, acc); hsum."""
    x, dx, dmx, mn, sc, p, L, acc = _kbuffers(W, a)
    off = np.empty(8, np.int32)
    for i in range(lo, hi):
        _dec_q6_K(W, i, x, dx, dmx, mn, sc, R)
        for j in range(a.shape[0]):
            acc[:] = 0
            for b in range(W.shape[1]):
                for t in range(8):
                    off[t] = 32 * (mn[b, 2 * t] * bs[j, b, 2 * t] + mn[b, 2 * t + 1] * bs[j, b, 2 * t + 1])
                _lanes(x, a, j, 256 * b, 8, off, p, L, R)
                _fma8(dx[b] * dy[j, b], L, acc)
            out[j, i] = _hsum(acc)


@njit(**_JIT)
def _rows_q2_K(W, a, dy, bs, out, lo, hi, T, R):
    """matmul._q2_K_dot: per block acc = fma(fl(dmin_x*-d_y), P, acc), P_l = m_2l bsum_2l + m_2l+1 bsum_2l+1,
    then acc = fma(fl(d_x*d_y), lanes, acc) (the same 8 lanes, in that order); hsum."""
    x, dx, dmx, mn, sc, p, L, acc = _kbuffers(W, a)
    off, P = np.zeros(8, np.int32), np.empty(8, np.float32)
    for i in range(lo, hi):
        _dec_q2_K(W, i, x, dx, dmx, mn, sc, R)
        for j in range(a.shape[0]):
            acc[:] = 0
            for b in range(W.shape[1]):
                for t in range(8):
                    P[t] = np.float32(mn[b, 2 * t] * bs[j, b, 2 * t] + mn[b, 2 * t + 1] * bs[j, b, 2 * t + 1])
                _fma8(dmx[b] * -dy[j, b], P, acc)
                _lanes(x, a, j, 256 * b, 8, off, p, L, R)
                _fma8(dx[b] * dy[j, b], L, acc)
            out[j, i] = _hsum(acc)


@njit(**_JIT)
def _rows_q3_K(W, a, dy, bs, out, lo, hi, T, R):
    """matmul._q3_K_dot: acc = fma(fl(d_x*d_y), lanes, acc); hsum."""
    x, dx, dmx, mn, sc, p, L, acc = _kbuffers(W, a)
    off = np.zeros(8, np.int32)
    for i in range(lo, hi):
        _dec_q3_K(W, i, x, dx, dmx, mn, sc, R)
        for j in range(a.shape[0]):
            acc[:] = 0
            for b in range(W.shape[1]):
                _lanes(x, a, j, 256 * b, 8, off, p, L, R)
                _fma8(dx[b] * dy[j, b], L, acc)
            out[j, i] = _hsum(acc)


@njit(**_JIT)
def _rows_iq4_xs(W, a, dy, bs, out, lo, hi, T, R):
    """matmul._iq4_xs_dot: acc = fma(fl(d_x*d_y), lanes (sign quirk on K), acc); hsum."""
    x, dx, dmx, mn, sc, p, L, acc = _kbuffers(W, a)
    sg = np.empty(a.shape[1], np.int32)
    for i in range(lo, hi):
        _dec_iq4_xs(W, i, x, sg, dx, sc, T, R)
        for j in range(a.shape[0]):
            acc[:] = 0
            for b in range(W.shape[1]):
                _lanes_quirk(x, sg, a, j, 256 * b, 8, p, L, R)
                _fma8(dx[b] * dy[j, b], L, acc)
            out[j, i] = _hsum(acc)


# -- the activation conversion: x86 from_float of Q8_0 / Q8_1 ------------------------------------------------

@njit(error_model="numpy", **_JIT)
def _qz_q8_cpu(x, out, lo, hi, q8_1, R):
    """legacy._q8_cpu on blocks lo..hi-1 of x (n, 32) f32: amax = max |x| (NaN skipped, as fmax),
    d = amax/127, id = amax ? 127/amax : 0, q32 = cvtps2dq(x*id) (round half even; NaN / out of int32
    range -> INT_MIN), q = q32 saturated to int8. Q8_0: d f16 | qs; Q8_1: d f16 | s f16 | qs with
    s = fl16(d * f32(sum of q32, wrapping like int32))."""
    o = 4 if q8_1 else 2
    for i in range(lo, hi):
        xs = x[i]
        amax = abs(xs[0])
        for t in range(1, R):
            v = abs(xs[t])
            if amax != amax or v > amax:
                amax = v
        d = amax / np.float32(127)
        idv = np.float32(127) / amax if amax != 0 else np.float32(0)
        tot = 0
        for t in range(R):
            v = xs[t] * idv
            q = np.int64(np.rint(v)) if (v > np.float32(-2147483648.0) and v < np.float32(2147483648.0)) \
                else np.int64(-2147483648)
            tot += q
            out[i, o + t] = min(max(q, -128), 127) & 0xFF
        h = f16_bits(d)
        out[i, 0], out[i, 1] = h & 0xFF, h >> 8
        if q8_1:
            tot = ((tot + 2147483648) & 0xFFFFFFFF) - 2147483648
            h = f16_bits(d * np.float32(tot))
            out[i, 2], out[i, 3] = h & 0xFF, h >> 8


def _q8_cpu_kernel(ref, q8_1: bool):
    """A kernel with the signature of `ref` (legacy.quantize_q8_0_cpu / _q8_1_cpu): (n, 32) f32 -> bytes."""
    ts = 36 if q8_1 else 34

    def quantize(x):
        x = np.ascontiguousarray(x, np.float32)
        if x.ndim != 2 or x.shape[1] != 32:
            raise ValueError(f"{ref.__name__} takes (n, 32) f32 blocks, got {x.shape}")
        out = np.empty((x.shape[0], ts), np.uint8)
        parallel_ranges(lambda lo, hi: _qz_q8_cpu(x, out, lo, hi, q8_1, 32), x.shape[0], 1 << 10)
        return out
    quantize.__name__ = ref.__name__
    quantize.__doc__ = f"{ref.__name__} with Numba: the same bytes."
    return quantize


# -- registration --------------------------------------------------------------------------------------------

_NO_TABLE = np.zeros(1, np.int32)        # T of the types without a lookup table


def _acts_q8_0(Y):
    dy, a = fm._q8_0(Y)
    return a.astype(np.int8), dy


def _acts_q8_1(Y):
    dy, sy, a = fm._q8_1(Y)
    return a.astype(np.int8), dy, sy


def _acts_q8_K(Y):
    dy, a, bs = fm._q8_K(Y)
    return a.astype(np.int8), dy, np.ascontiguousarray(bs)


def _kernel(ref, rows, acts, table=_NO_TABLE):
    """The wrapper registered for the dot function `ref`: (W (n, nblk, ts), Y (m, nblk, tsa)) uint8 blocks ->
    (m, n) f32, weight rows split over threads."""
    def dot(blk, blk_a):
        W = np.ascontiguousarray(blk)
        n, m = W.shape[0], blk_a.shape[0]
        out = np.empty((m, n), np.float32)
        if n == 0 or m == 0:
            return out
        args = acts(np.ascontiguousarray(blk_a))
        k = args[0].shape[1]
        work = lambda lo, hi: rows(W, *args, out, lo, hi, table, 32)          # noqa: E731
        parallel_ranges(work, n, max(1, MIN_MACS // max(1, m * k)))
        return out
    dot.__name__ = ref.__name__
    dot.__doc__ = f"matmul.{ref.__name__} with Numba: the same bits."
    return dot


_KERNELS = [  # (NumPy dot function, rows kernel, activation reader, table)
    (fm._q4_0_dot, _rows_q4_0, _acts_q8_0, _NO_TABLE), (fm._q5_0_dot, _rows_q5_0, _acts_q8_0, _NO_TABLE),
    (fm._q8_0_dot, _rows_q8_0, _acts_q8_0, _NO_TABLE), (fm._iq4_nl_dot, _rows_iq4_nl, _acts_q8_0, fm.K_IQ4NL),
    (fm._q4_1_dot, _rows_q4_1, _acts_q8_1, _NO_TABLE), (fm._q5_1_dot, _rows_q5_1, _acts_q8_1, _NO_TABLE),
    (fm._q2_K_dot, _rows_q2_K, _acts_q8_K, _NO_TABLE), (fm._q3_K_dot, _rows_q3_K, _acts_q8_K, _NO_TABLE),
    (fm._q4_K_dot, _rows_q4_K, _acts_q8_K, _NO_TABLE), (fm._q5_K_dot, _rows_q5_K, _acts_q8_K, _NO_TABLE),
    (fm._q6_K_dot, _rows_q6_K, _acts_q8_K, _NO_TABLE), (fm._iq4_xs_dot, _rows_iq4_xs, _acts_q8_K, fm.K_IQ4NL),
]

for _ref, _rows, _acts, _table in _KERNELS:
    register(_ref, "numba", KEYS)(_kernel(_ref, _rows, _acts, np.ascontiguousarray(_table, np.int32)))
register(legacy.quantize_q8_0_cpu, "numba", KEYS)(_q8_cpu_kernel(legacy.quantize_q8_0_cpu, False))
register(legacy.quantize_q8_1_cpu, "numba", KEYS)(_q8_cpu_kernel(legacy.quantize_q8_1_cpu, True))
