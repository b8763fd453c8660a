"""CUDA dequantizers of every ggml block format, bit-exact with refimpl.quants (and so with ggml).

Versions:
    _dq_<type>(src, i, s, out, p, T2, T1, T1b, KS)   device function, one per type: sub-block s (32
                      elements, 32s .. 32s+31) of block i of src (n, type_size) uint8 into out[p:p+32]
                      (a global, shared or local f32 array), every f32 operation in the order of the Numba
                      decoder it ports (refimpl/kernels/quants.py, `_dq_<type>`; the block layouts are
                      restated in refimpl/quants/). matmul.py decodes its weights with the same functions.
    _el_<type>(src, i) device function for the one-element "blocks" of F32, F16, BF16.

Kernels (one compiled per type, on first use: `dequant_kernel(t)`):
    block types   grid_1d(n_blocks * blck_size / 32, 256): one thread per 32-element sub-block; it reads
                  its block's scales and its 4..32 bytes of quants (type_size / sub-blocks per block, plus
                  the block's scale bytes again per sub-block) and writes 128 bytes of f32. Sub-blocks of a
                  block are adjacent threads, so a warp reads and writes contiguous memory.
    F32/F16/BF16  grid_1d(n, 256): one thread per element, type_size bytes in, 4 bytes out.
Memory traffic per element: type_size / blck_size bytes read (plus the per-sub-block re-read of scales,
from L1), 4 bytes written; lookup tables (IQ grids, E2M1, UE4M3) from L1/L2, uploaded once per process.

Tables: T2 (a 2-D f32 codebook), T1, T1b (1-D f32 value tables) and KS (the ksigns uint8 table), taken from
refimpl.kernels.quants.tables() so values are those of the Numba and NumPy decoders; a type that needs
fewer gets one-element stand-ins. `_tables(t)` uploads them once, lazily.

Bit-exactness on a real GPU: NVVM contracts `a * b + c` into one FMA and the GPU returns a canonical NaN
(0x7FFFFFFF) from any arithmetic with a NaN. The decoders therefore multiply with `__fmul_rn` (never
contracted; plain `*` in the simulator, which runs NumPy's f32 arithmetic) and repair NaN results the x86
way NumPy sees them (`_nan2`: the first NaN operand, quieted; the default NaN 0xFFC00000 for inf*0 or
inf-inf); signs flip on the bits (`_neg`), as the Numba decoders' `-x` does. Denormals are kept (no ftz).
Registered with `register(DEQUANTIZERS[t], "cuda", KEYS)`, so `refimpl.dequantize` runs them under
backend("cuda") (host arrays in and out); `dequantize_device(dw)` keeps the result on the device.
"""
from __future__ import annotations

import functools

import numba
import numpy as np
from numba import cuda

from ...dispatch import KEYS, register
from ...quants import DEQUANTIZERS
from ...types import GGMLType, traits
from . import _device
from ._device import SIMULATOR, DeviceWeight

THREADS = 256
_TWO_M24 = np.float32(2.0 ** -24)

if SIMULATOR:
    @cuda.jit(device=True)
    def _fmul_rn(a, b):
        """The simulator runs NumPy's f32 multiply: one rounding, nothing to contract."""
        return a * b
else:                                              # pragma: no cover - needs a GPU
    from numba.cuda.libdevice import fmul_rn as _fmul_rn


# -- f32 bits and x86-faithful arithmetic ---------------------------------------------------------------

@cuda.jit(device=True)
def _f32(b):
    """The f32 with bits b (0 .. 2^32-1)."""
    return np.uint32(b).view(np.float32)


@cuda.jit(device=True)
def _bits(x):
    return np.int64(np.float32(x).view(np.uint32))


@cuda.jit(device=True)
def _nan2(a, b):
    """The NaN x86 SSE gives for `a op b`: a's (quieted) if a is NaN, else b's, else the default -qNaN."""
    if a != a:
        return _f32(_bits(a) | 0x00400000)
    if b != b:
        return _f32(_bits(b) | 0x00400000)
    return _f32(0xFFC00000)


@cuda.jit(device=True)
def _mul(a, b):
    r = _fmul_rn(a, b)
    return r if r == r else _nan2(a, b)


@cuda.jit(device=True)
def _add(a, b):
    r = a + b
    return r if r == r else _nan2(a, b)


@cuda.jit(device=True)
def _sub(a, b):
    r = a - b
    return r if r == r else _nan2(a, b)


@cuda.jit(device=True)
def _neg(x):
    """-x on the sign bit (NaN included)."""
    return _f32(_bits(x) ^ 0x80000000)


@cuda.jit(device=True)
def _fi(q):
    """An integer as f32 (exact for the small values of quants and scales)."""
    return np.float32(q)


# -- byte fields ----------------------------------------------------------------------------------------

@cuda.jit(device=True)
def _b(src, i, o):
    return np.int64(src[i, o])


@cuda.jit(device=True)
def _u16(src, i, o):
    return _b(src, i, o) | (_b(src, i, o + 1) << 8)


@cuda.jit(device=True)
def _u32(src, i, o):
    return _u16(src, i, o) | (_u16(src, i, o + 2) << 16)


@cuda.jit(device=True)
def _i8(b):
    """A byte as the int8 it holds, as f32."""
    return np.float32((b ^ 0x80) - 0x80)


@cuda.jit(device=True)
def _half_bits(h, quiet):
    """IEEE half bits -> f32 bits, exact; with quiet, a NaN gets bit 22 (ggml's F16C conversion)."""
    s = (h & 0x8000) << 16
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0x1F:
        r = s | 0x7F800000 | (m << 13)
        if m != 0 and quiet:
            r |= 0x00400000
        return r
    if e != 0:
        return s | ((e + 112) << 23) | (m << 13)
    if m == 0:
        return s
    return s | _bits(np.float32(m) * _TWO_M24)


@cuda.jit(device=True)
def _f16(src, i, o):
    """ggml's GGML_FP16_TO_FP32 of the little-endian f16 at byte o of block i."""
    return _f32(_half_bits(_u16(src, i, o), True))


# -- one-element types -------------------------------------------------------------------------------------

@cuda.jit(device=True)
def _el_f32(src, i):
    return _f32(_u32(src, i, 0))


@cuda.jit(device=True)
def _el_f16(src, i):
    return _f16(src, i, 0)


@cuda.jit(device=True)
def _el_bf16(src, i):
    return _f32(_u16(src, i, 0) << 16)


# -- 32-element legacy formats (s == 0) ----------------------------------------------------------------------

@cuda.jit(device=True)
def _dq_q4_0(src, i, s, out, p, T2, T1, T1b, KS):
    d = _f16(src, i, 0)
    for j in range(16):
        b = _b(src, i, 2 + j)
        out[p + j] = _mul(_fi((b & 15) - 8), d)
        out[p + j + 16] = _mul(_fi((b >> 4) - 8), d)


@cuda.jit(device=True)
def _dq_q4_1(src, i, s, out, p, T2, T1, T1b, KS):
    d = _f16(src, i, 0)
    m = _f16(src, i, 2)
    for j in range(16):
        b = _b(src, i, 4 + j)
        out[p + j] = _add(_mul(_fi(b & 15), d), m)
        out[p + j + 16] = _add(_mul(_fi(b >> 4), d), m)


@cuda.jit(device=True)
def _dq_q5_0(src, i, s, out, p, T2, T1, T1b, KS):
    d = _f16(src, i, 0)
    qh = _u32(src, i, 2)
    for j in range(16):
        b = _b(src, i, 6 + j)
        q0 = (b & 15) | (((qh >> j) & 1) << 4)
        q1 = (b >> 4) | (((qh >> (j + 16)) & 1) << 4)
        out[p + j] = _mul(_fi(q0 - 16), d)
        out[p + j + 16] = _mul(_fi(q1 - 16), d)


@cuda.jit(device=True)
def _dq_q5_1(src, i, s, out, p, T2, T1, T1b, KS):
    d = _f16(src, i, 0)
    m = _f16(src, i, 2)
    qh = _u32(src, i, 4)
    for j in range(16):
        b = _b(src, i, 8 + j)
        q0 = (b & 15) | (((qh >> j) & 1) << 4)
        q1 = (b >> 4) | (((qh >> (j + 16)) & 1) << 4)
        out[p + j] = _add(_mul(_fi(q0), d), m)
        out[p + j + 16] = _add(_mul(_fi(q1), d), m)


@cuda.jit(device=True)
def _dq_q8_0(src, i, s, out, p, T2, T1, T1b, KS):
    d = _f16(src, i, 0)
    for j in range(32):
        out[p + j] = _mul(_i8(_b(src, i, 2 + j)), d)


@cuda.jit(device=True)
def _dq_q8_1(src, i, s, out, p, T2, T1, T1b, KS):
    d = _f16(src, i, 0)
    for j in range(32):
        out[p + j] = _mul(_i8(_b(src, i, 4 + j)), d)


@cuda.jit(device=True)
def _dq_iq4_nl(src, i, s, out, p, T2, T1, T1b, KS):
    d = _f16(src, i, 0)
    for j in range(16):
        b = _b(src, i, 2 + j)
        out[p + j] = _mul(T1[b & 15], d)
        out[p + j + 16] = _mul(T1[b >> 4], d)


@cuda.jit(device=True)
def _dq_mxfp4(src, i, s, out, p, T2, T1, T1b, KS):
    """T1: the E2M1 values, doubled; the E8M0 scale halved (2^(e-128), as bits)."""
    e = _b(src, i, 0)
    d = _f32((0x00200000 << e) if e < 2 else ((e - 1) << 23))
    for j in range(16):
        b = _b(src, i, 1 + j)
        out[p + j] = _mul(T1[b & 15], d)
        out[p + j + 16] = _mul(T1[b >> 4], d)


# -- Q1_0 (128 elements), Q2_0 and NVFP4 (64) -------------------------------------------------------------

@cuda.jit(device=True)
def _dq_q1_0(src, i, s, out, p, T2, T1, T1b, KS):
    d = _f16(src, i, 0)
    nd = _neg(d)
    for j in range(32):
        e = 32 * s + j
        out[p + j] = d if (_b(src, i, 2 + (e >> 3)) >> (e & 7)) & 1 else nd


@cuda.jit(device=True)
def _dq_q2_0(src, i, s, out, p, T2, T1, T1b, KS):
    """Element e (0..63): bits 2*(e % 4) of qs[e / 4], x = (q - 1) * d (the NumPy decoder's f32 multiply)."""
    d = _f16(src, i, 0)
    for j in range(32):
        e = 32 * s + j
        out[p + j] = _mul(_fi(((_b(src, i, 2 + (e >> 2)) >> (2 * (e & 3))) & 3) - 1), d)


@cuda.jit(device=True)
def _dq_nvfp4(src, i, s, out, p, T2, T1, T1b, KS):
    """T1: E2M1 values doubled; T1b: UE4M3 byte -> value / 2. Sub-block s holds scales 2s, 2s+1."""
    for h in range(2):
        ss = 2 * s + h
        d = T1b[_b(src, i, ss)]
        for j in range(8):
            b = _b(src, i, 4 + 8 * ss + j)
            out[p + 16 * h + j] = _mul(T1[b & 15], d)
            out[p + 16 * h + j + 8] = _mul(T1[b >> 4], d)


# -- K-quants (256 elements, sub-block s = 0..7) -------------------------------------------------------------

@cuda.jit(device=True)
def _dq_q2_K(src, i, s, out, p, T2, T1, T1b, KS):
    """Elements 128h + 32r + 16half + l (s = 4h + r): 2 bits r of qs[32h + 16half + l], scale byte 2s+half."""
    d = _f16(src, i, 80)
    dmin = _f16(src, i, 82)
    h = s >> 2
    r = s & 3
    for half in range(2):
        sc = _b(src, i, 2 * s + half)
        dl = _mul(d, _fi(sc & 15))
        ml = _mul(dmin, _fi(sc >> 4))
        for l in range(16):
            q = (_b(src, i, 16 + 32 * h + 16 * half + l) >> (2 * r)) & 3
            out[p + 16 * half + l] = _sub(_mul(_fi(q), dl), ml)


@cuda.jit(device=True)
def _q3_scale(src, i, j):
    """Sixth-bit scale j (0..15) of Q3_K: low 4 bits from scales[j % 8] (high nibble for j >= 8), high 2
    bits from bits 2*(j // 4) of scales[8 + j % 4]."""
    b = _b(src, i, 96 + (j & 7))
    low = (b & 15) if j < 8 else (b >> 4)
    high = (_b(src, i, 104 + (j & 3)) >> (2 * (j >> 2))) & 3
    return low | (high << 4)


@cuda.jit(device=True)
def _dq_q3_K(src, i, s, out, p, T2, T1, T1b, KS):
    """As Q2_K's layout; the third bit is bit 4h + r of hmask[16half + l]."""
    d = _f16(src, i, 108)
    h = s >> 2
    r = s & 3
    for half in range(2):
        dl = _mul(d, _fi(_q3_scale(src, i, 2 * s + half) - 32))
        for l in range(16):
            ll = 16 * half + l
            q = (_b(src, i, 32 + 32 * h + ll) >> (2 * r)) & 3
            hm = (_b(src, i, ll) >> (4 * h + r)) & 1
            out[p + ll] = _mul(_fi(q + 4 * hm - 4), dl)


@cuda.jit(device=True)
def _scale_min_k4(src, i, j):
    """ggml's get_scale_min_k4(j, scales) with scales at byte 4: (sc, m), 6 bits each, packed in one int."""
    if j < 4:
        return ((_b(src, i, 4 + j) & 63) << 8) | (_b(src, i, 8 + j) & 63)
    b = _b(src, i, 8 + j)
    sc = (b & 15) | ((_b(src, i, j) >> 6) << 4)
    m = (b >> 4) | ((_b(src, i, 4 + j) >> 6) << 4)
    return (sc << 8) | m


@cuda.jit(device=True)
def _dq_q4_K(src, i, s, out, p, T2, T1, T1b, KS):
    """Elements 64c + 32(s & 1) + l, c = s >> 1: the low (s even) or high nibble of qs[32c + l]."""
    d = _f16(src, i, 0)
    dmin = _f16(src, i, 2)
    scm = _scale_min_k4(src, i, s)
    D = _mul(d, _fi(scm >> 8))
    M = _mul(dmin, _fi(scm & 255))
    c = s >> 1
    sh = 4 * (s & 1)
    for l in range(32):
        q = (_b(src, i, 16 + 32 * c + l) >> sh) & 15
        out[p + l] = _sub(_mul(_fi(q), D), M)


@cuda.jit(device=True)
def _dq_q5_K(src, i, s, out, p, T2, T1, T1b, KS):
    """Q4_K's layout from byte 48, the fifth bit s of qh[l]."""
    d = _f16(src, i, 0)
    dmin = _f16(src, i, 2)
    scm = _scale_min_k4(src, i, s)
    D = _mul(d, _fi(scm >> 8))
    M = _mul(dmin, _fi(scm & 255))
    c = s >> 1
    sh = 4 * (s & 1)
    for l in range(32):
        q = ((_b(src, i, 48 + 32 * c + l) >> sh) & 15) | (((_b(src, i, 16 + l) >> s) & 1) << 4)
        out[p + l] = _sub(_mul(_fi(q), D), M)


@cuda.jit(device=True)
def _dq_q6_K(src, i, s, out, p, T2, T1, T1b, KS):
    """Elements 128h + 32r + 16half + l (s = 4h + r): a nibble of ql[64h + 32(r & 1) + ll] (high for
    r >= 2), two bits 2r of qh[32h + ll]; int8 scale 192 + 2s + half."""
    d = _f16(src, i, 208)
    h = s >> 2
    r = s & 3
    sh = 4 * (r >> 1)
    for half in range(2):
        dl = _mul(d, _i8(_b(src, i, 192 + 2 * s + half)))
        for l in range(16):
            ll = 16 * half + l
            lo = (_b(src, i, 64 * h + 32 * (r & 1) + ll) >> sh) & 15
            hi = (_b(src, i, 128 + 32 * h + ll) >> (2 * r)) & 3
            out[p + ll] = _mul(_fi((lo | (hi << 4)) - 32), dl)


@cuda.jit(device=True)
def _dq_q8_K(src, i, s, out, p, T2, T1, T1b, KS):
    d = _f32(_u32(src, i, 0))
    for j in range(32):
        out[p + j] = _mul(_i8(_b(src, i, 4 + 32 * s + j)), d)


# -- ternary -----------------------------------------------------------------------------------------------

@cuda.jit(device=True)
def _dq_tq2_0(src, i, s, out, p, T2, T1, T1b, KS):
    """Elements 128g + 32k + m (s = 4g + k): bits 2k of qs[32g + m], minus 1."""
    d = _f16(src, i, 64)
    g = s >> 2
    k = s & 3
    for m in range(32):
        out[p + m] = _mul(_fi(((_b(src, i, 32 * g + m) >> (2 * k)) & 3) - 1), d)


@cuda.jit(device=True)
def _dq_tq1_0(src, i, s, out, p, T2, T1, T1b, KS):
    """Base-3 digit n of a byte b, minus 1: ((uint8)(b * 3^n) * 3 >> 8) - 1. Elements 32n + m take digit n
    of qs[m] (n < 5), 160 + 16n + m digit n of qs[32 + m], 240 + 4n + j digit n of qh[j] (n < 4)."""
    d = _f16(src, i, 52)
    for j in range(32):
        e = 32 * s + j
        if e < 160:
            n = e >> 5
            o = e & 31
        elif e < 240:
            n = (e - 160) >> 4
            o = 32 + ((e - 160) & 15)
        else:
            n = (e - 240) >> 2
            o = 48 + ((e - 240) & 3)
        p3 = 1
        for _ in range(n):
            p3 *= 3
        t = ((((_b(src, i, o) * p3) & 0xFF) * 3) >> 8) - 1
        out[p + j] = _mul(_fi(t), d)


# -- IQ formats (256 elements, sub-block s = 0..7 is ggml's ib32) -------------------------------------------

@cuda.jit(device=True)
def _signed(v, mask, j):
    return _neg(v) if (mask >> j) & 1 else v


@cuda.jit(device=True)
def _dq_iq2_xxs(src, i, s, out, p, T2, T1, T1b, KS):
    d = _f16(src, i, 0)
    a1 = _u32(src, i, 2 + 8 * s + 4)
    db = _mul(_mul(d, _add(np.float32(0.5), _fi(a1 >> 28))), np.float32(0.25))
    for l in range(4):
        idx = _b(src, i, 2 + 8 * s + l)
        mask = np.int64(KS[(a1 >> (7 * l)) & 127])
        for j in range(8):
            out[p + 8 * l + j] = _signed(_mul(T2[idx, j], db), mask, j)


@cuda.jit(device=True)
def _dq_iq2_xs(src, i, s, out, p, T2, T1, T1b, KS):
    d = _f16(src, i, 0)
    sc = _b(src, i, 66 + s)
    db0 = _mul(_mul(d, _add(np.float32(0.5), _fi(sc & 15))), np.float32(0.25))
    db1 = _mul(_mul(d, _add(np.float32(0.5), _fi(sc >> 4))), np.float32(0.25))
    for l in range(4):
        w = _u16(src, i, 2 + 2 * (4 * s + l))
        mask = np.int64(KS[w >> 9])
        db = db0 if l < 2 else db1
        for j in range(8):
            out[p + 8 * l + j] = _signed(_mul(T2[w & 511, j], db), mask, j)


@cuda.jit(device=True)
def _dq_iq2_s(src, i, s, out, p, T2, T1, T1b, KS):
    d = _f16(src, i, 0)
    sc = _b(src, i, 74 + s)
    db0 = _mul(_mul(d, _add(np.float32(0.5), _fi(sc & 15))), np.float32(0.25))
    db1 = _mul(_mul(d, _add(np.float32(0.5), _fi(sc >> 4))), np.float32(0.25))
    qh = _b(src, i, 66 + s)
    for l in range(4):
        idx = _b(src, i, 2 + 4 * s + l) | ((qh << (8 - 2 * l)) & 0x300)
        mask = _b(src, i, 34 + 4 * s + l)
        db = db0 if l < 2 else db1
        for j in range(8):
            out[p + 8 * l + j] = _signed(_mul(T2[idx, j], db), mask, j)


@cuda.jit(device=True)
def _dq_iq3_xxs(src, i, s, out, p, T2, T1, T1b, KS):
    d = _f16(src, i, 0)
    w = _u32(src, i, 66 + 4 * s)
    db = _mul(_mul(d, _add(np.float32(0.5), _fi(w >> 28))), np.float32(0.5))
    for l in range(4):
        mask = np.int64(KS[(w >> (7 * l)) & 127])
        i0 = _b(src, i, 2 + 8 * s + 2 * l)
        i1 = _b(src, i, 2 + 8 * s + 2 * l + 1)
        for j in range(4):
            out[p + 8 * l + j] = _signed(_mul(T2[i0, j], db), mask, j)
            out[p + 8 * l + 4 + j] = _signed(_mul(T2[i1, j], db), mask, 4 + j)


@cuda.jit(device=True)
def _dq_iq3_s(src, i, s, out, p, T2, T1, T1b, KS):
    d = _f16(src, i, 0)
    sc = _b(src, i, 106 + (s >> 1))
    nib = (sc & 15) if (s & 1) == 0 else (sc >> 4)
    db = _mul(d, _fi(1 + 2 * nib))
    qh = _b(src, i, 66 + s)
    for l in range(4):
        i0 = _b(src, i, 2 + 8 * s + 2 * l) | ((qh << (8 - 2 * l)) & 256)
        i1 = _b(src, i, 2 + 8 * s + 2 * l + 1) | ((qh << (7 - 2 * l)) & 256)
        mask = _b(src, i, 74 + 4 * s + l)
        for j in range(4):
            out[p + 8 * l + j] = _signed(_mul(T2[i0, j], db), mask, j)
            out[p + 8 * l + 4 + j] = _signed(_mul(T2[i1, j], db), mask, 4 + j)


@cuda.jit(device=True)
def _dq_iq1_s(src, i, s, out, p, T2, T1, T1b, KS):
    """T2: the IQ1 grid + 0.125 (rows 0..2047), then - 0.125 (rows 2048..4095), bit 15 of qh choosing."""
    d = _f16(src, i, 0)
    qh = _u16(src, i, 34 + 2 * s)
    dl = _mul(d, _fi(2 * ((qh >> 12) & 7) + 1))
    for l in range(4):
        idx = _b(src, i, 2 + 4 * s + l) | (((qh >> (3 * l)) & 7) << 8) | ((qh >> 15) << 11)
        for j in range(8):
            out[p + 8 * l + j] = _mul(T2[idx, j], dl)


@cuda.jit(device=True)
def _dq_iq1_m(src, i, s, out, p, T2, T1, T1b, KS):
    """d's f16 bits are the top nibbles of the four u16 scales (NumPy's cast: a NaN is not quieted)."""
    s0 = _u16(src, i, 48)
    s1 = _u16(src, i, 50)
    s2 = _u16(src, i, 52)
    s3 = _u16(src, i, 54)
    d = _f32(_half_bits((s0 >> 12) | ((s1 >> 8) & 0x00F0) | ((s2 >> 4) & 0x0F00) | (s3 & 0xF000), False))
    sg = _u16(src, i, 48 + 2 * (s >> 1))
    sh = 6 * (s & 1)
    dl1 = _mul(d, _fi(2 * ((sg >> sh) & 7) + 1))
    dl2 = _mul(d, _fi(2 * ((sg >> (sh + 3)) & 7) + 1))
    for l in range(4):
        qh = _b(src, i, 32 + 2 * s + (l >> 1))
        shift = 8 if (l & 1) == 0 else 4
        dbit = 0x08 if (l & 1) == 0 else 0x80
        idx = _b(src, i, 4 * s + l) | ((qh << shift) & 0x700)
        if qh & dbit:
            idx |= 2048
        dl = dl1 if l < 2 else dl2
        for j in range(8):
            out[p + 8 * l + j] = _mul(T2[idx, j], dl)


@cuda.jit(device=True)
def _dq_iq4_xs(src, i, s, out, p, T2, T1, T1b, KS):
    d = _f16(src, i, 0)
    sh = _u16(src, i, 2)
    ls = ((_b(src, i, 4 + (s >> 1)) >> (4 * (s & 1))) & 15) | (((sh >> (2 * s)) & 3) << 4)
    dl = _mul(d, _fi(ls - 32))
    for j in range(16):
        b = _b(src, i, 8 + 16 * s + j)
        out[p + j] = _mul(T1[b & 15], dl)
        out[p + j + 16] = _mul(T1[b >> 4], dl)


# -- registry and tables -------------------------------------------------------------------------------------

_T = GGMLType
DECODERS = {_T.Q4_0: _dq_q4_0, _T.Q4_1: _dq_q4_1, _T.Q5_0: _dq_q5_0, _T.Q5_1: _dq_q5_1, _T.Q8_0: _dq_q8_0,
            _T.Q8_1: _dq_q8_1, _T.Q1_0: _dq_q1_0, _T.Q2_0: _dq_q2_0, _T.Q2_K: _dq_q2_K, _T.Q3_K: _dq_q3_K,
            _T.Q4_K: _dq_q4_K, _T.Q5_K: _dq_q5_K, _T.Q6_K: _dq_q6_K, _T.Q8_K: _dq_q8_K, _T.TQ1_0: _dq_tq1_0,
            _T.TQ2_0: _dq_tq2_0, _T.IQ2_XXS: _dq_iq2_xxs, _T.IQ2_XS: _dq_iq2_xs, _T.IQ2_S: _dq_iq2_s,
            _T.IQ3_XXS: _dq_iq3_xxs, _T.IQ3_S: _dq_iq3_s, _T.IQ1_S: _dq_iq1_s, _T.IQ1_M: _dq_iq1_m,
            _T.IQ4_NL: _dq_iq4_nl, _T.IQ4_XS: _dq_iq4_xs, _T.MXFP4: _dq_mxfp4, _T.NVFP4: _dq_nvfp4}
ELEMENTS = {_T.F32: _el_f32, _T.F16: _el_f16, _T.BF16: _el_bf16}

# (T2, T1, T1b, KS) of each type: indices into refimpl.kernels.quants.tables(), None for a stand-in
_TABLE_IDX = {_T.IQ2_XXS: (0, None, None, 6), _T.IQ2_XS: (1, None, None, 6), _T.IQ2_S: (2, None, None, None),
              _T.IQ3_XXS: (3, None, None, 6), _T.IQ3_S: (4, None, None, None), _T.IQ1_S: (5, None, None, None),
              _T.IQ1_M: (5, None, None, None), _T.IQ4_NL: (None, 7, None, None),
              _T.IQ4_XS: (None, 7, None, None), _T.MXFP4: (None, 8, None, None), _T.NVFP4: (None, 8, 9, None)}
_STAND_INS = (np.zeros((1, 1), np.float32), np.zeros(1, np.float32), np.zeros(1, np.float32),
              np.zeros(1, np.uint8))


@functools.lru_cache(maxsize=None)
def _table(idx):
    """Table idx of refimpl.kernels.quants.tables() (or stand-in -1-k) on the device, uploaded once."""
    if idx < 0:
        return cuda.to_device(_STAND_INS[-1 - idx])
    from .. import quants as numba_quants
    return cuda.to_device(numba_quants.tables()[idx])


def tables(t) -> tuple:
    """(T2, T1, T1b, KS) device arrays for type t's decoder."""
    idx = _TABLE_IDX.get(GGMLType(t), (None,) * 4)
    return tuple(_table(-1 - k if j is None else j) for k, j in enumerate(idx))


def sub_blocks(t) -> int:
    """32-element sub-blocks per block of t."""
    return traits(t).blck_size // 32


# -- kernels --------------------------------------------------------------------------------------------------

def _make_dequant(dq, spb):
    def dequant(src, out, n_sub, T2, T1, T1b, KS):
        """Sub-block t = i * spb + s of src (n, type_size) into out[32t : 32t + 32] (out flat f32)."""
        t = cuda.grid(1)
        if t >= n_sub:
            return
        i = t // spb
        dq(src, i, t - i * spb, out, 32 * t, T2, T1, T1b, KS)
    return cuda.jit(dequant)


def _make_elements(el):
    def elements(src, out, n):
        """Element t of src (n, type_size) into out[t]."""
        t = cuda.grid(1)
        if t < n:
            out[t] = el(src, t)
    return cuda.jit(elements)


@functools.lru_cache(maxsize=None)
def dequant_kernel(t):
    """The dequantize kernel of type t (compiled on its first launch)."""
    t = GGMLType(t)
    if t in ELEMENTS:
        return _make_elements(ELEMENTS[t])
    return _make_dequant(DECODERS[t], sub_blocks(t))


def dequantize_blocks(t, src):
    """src (n, type_size) uint8 device array -> (n, blck_size) f32 device array."""
    t = GGMLType(t)
    tr = traits(t)
    n = src.shape[0]
    out = cuda.device_array(n * tr.blck_size, np.float32)
    if n:
        if t in ELEMENTS:
            blocks, threads = _device.grid_1d(n, THREADS)
            dequant_kernel(t)[blocks, threads](src, out, n)
        else:
            n_sub = n * sub_blocks(t)
            blocks, threads = _device.grid_1d(n_sub, THREADS)
            dequant_kernel(t)[blocks, threads](src, out, n_sub, *tables(t))
    return out.reshape(n, tr.blck_size)


def dequantize_device(dw: DeviceWeight):
    """A DeviceWeight's f32 values on the device, NumPy shape dw.shape (an F32 weight: its own array).
    F16 values convert as ggml's GGML_FP16_TO_FP32 does (a signalling NaN comes out quiet, where NumPy's
    astype keeps it)."""
    if dw.type == GGMLType.F32:
        return dw.data
    size = int(np.prod(dw.shape, dtype=np.int64))
    if size == 0:
        return cuda.device_array(dw.shape, np.float32)
    if dw.type == GGMLType.F16:                  # f16 values: their bytes, as one-element F16 blocks
        src = dw.data.reshape(size).view(np.uint8).reshape(size, 2)
    else:
        ts = traits(dw.type).type_size
        src = dw.data.reshape(dw.data.size // ts, ts)
    return dequantize_blocks(dw.type, src).reshape(dw.shape)


def _wrapper(t):
    tr = traits(t)
    ref = DEQUANTIZERS[t]

    def dequantize(blocks, out=None):
        blocks = np.ascontiguousarray(blocks, np.uint8)
        if blocks.ndim != 2 or blocks.shape[1] != tr.type_size:
            raise ValueError(f"{tr.name} blocks must be (n, {tr.type_size}) uint8, got {blocks.shape}")
        res = dequantize_blocks(t, cuda.to_device(blocks)).copy_to_host()
        if out is None:
            return res
        out[...] = res
        return out

    dequantize.__name__ = f"dequantize_{tr.name}"
    dequantize.__doc__ = (f"{tr.name} blocks (n, {tr.type_size}) uint8 -> (n, {tr.blck_size}) f32 on the GPU; "
                          f"the same bits as refimpl.quants' {ref.__name__}.")
    return ref, dequantize


for _t in sorted(t for t in DEQUANTIZERS if t in DECODERS or t in ELEMENTS):
    _ref, _fn = _wrapper(_t)
    register(_ref, "cuda", KEYS)(_fn)


def ptx_signatures() -> list[tuple]:
    """(kernel, argument types) of every dequantize kernel, as a real launch types them."""
    u8, f32 = numba.types.uint8, numba.types.float32
    i64 = numba.types.int64
    tabs = (f32[:, ::1], f32[::1], f32[::1], u8[::1])
    sigs = [(dequant_kernel(t), (u8[:, ::1], f32[::1], i64)) for t in ELEMENTS]
    sigs += [(dequant_kernel(t), (u8[:, ::1], f32[::1], i64) + tabs) for t in DECODERS]
    return sigs
