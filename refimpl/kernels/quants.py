"""Numba dequantizers of every ggml block format, bit-exact with refimpl.quants (and so with ggml).

Versions:
    _dq_<type>(src, out, lo, hi, T)   one decoder per type: blocks lo..hi-1 of src (n, type_size) uint8
                                      into out (n, blck_size) f32, every f32 operation in the order of the
                                      NumPy dequantizer it replaces (its docstring restates the layout)
    DECODERS[tid]                     the decoders by ggml type number: `dequantize_into` runs one on ranges
                                      of blocks in threads (they are `nogil`); each compiles on first use,
                                      and mul_mat's decode path inlines them one type at a time
    PAR_DECODERS[tid]                 the same decoders split over Numba's OpenMP threads (a prange
                                      driver each): what refimpl.dequantize runs on a whole tensor

Each NumPy dequantizer in refimpl.quants gets a wrapper with its signature `(blocks, out=None) -> out`,
registered with `register(reference, "numba", KEYS)`, so `refimpl.dequantize` runs it under the numba
backend. T is the tuple of lookup tables (`tables()`): the IQ codebooks of refimpl.quants.iq_tables
as f32, and tables built from the NumPy code's own functions (E2M1 values, NVFP4 scales), so values are
the same by construction. Decoders flip signs with `-x` (LLVM's fneg flips the sign bit of NaN too,
as ggml's compiled `x * (bit ? -1 : 1)` does, see refimpl.quants.iq._flip). Q4_1/Q5_1 blocks whose
min is NaN take `_nan_min` (which NaN `q*d + m` keeps must not depend on LLVM's operand order).
Inner loops run `range(_rt(16, R, 32))`-style run-time trip counts so that LLVM vectorizes them;
the hottest (Q8_0, Q4_K, Q5_K) also index slices from 0, keep nibbles uint8 up to the f32 conversion
(int64 lanes convert 4-8 values per instruction) and take shifts as literals (`_q5_K_chunk`).
"""
from __future__ import annotations

import functools

import numpy as np
from numba import njit, prange  # noqa: F401 -- prange: the drivers' template (per_type) uses it

from ..dispatch import KEYS, register
from ..quants import DEQUANTIZERS
from ..types import GGMLType, traits
from . import simd
from ._common import (f16_to_f32, f16_to_f32_raw, f32_bits, f32_from_bits, n_threads, parallel_ranges, per_type,
                      prange_ok)

_TWO_M24 = np.float32(2.0 ** -24)

# ggml type numbers, as compile-time constants of the dispatch in `decode`
F32_T, F16_T, BF16_T = int(GGMLType.F32), int(GGMLType.F16), int(GGMLType.BF16)
Q4_0, Q4_1, Q5_0, Q5_1 = int(GGMLType.Q4_0), int(GGMLType.Q4_1), int(GGMLType.Q5_0), int(GGMLType.Q5_1)
Q8_0, Q8_1, Q1_0 = int(GGMLType.Q8_0), int(GGMLType.Q8_1), int(GGMLType.Q1_0)
Q2_K, Q3_K, Q4_K = int(GGMLType.Q2_K), int(GGMLType.Q3_K), int(GGMLType.Q4_K)
Q5_K, Q6_K, Q8_K = int(GGMLType.Q5_K), int(GGMLType.Q6_K), int(GGMLType.Q8_K)
IQ2_XXS, IQ2_XS, IQ2_S = int(GGMLType.IQ2_XXS), int(GGMLType.IQ2_XS), int(GGMLType.IQ2_S)
IQ3_XXS, IQ3_S = int(GGMLType.IQ3_XXS), int(GGMLType.IQ3_S)
IQ1_S, IQ1_M = int(GGMLType.IQ1_S), int(GGMLType.IQ1_M)
IQ4_NL, IQ4_XS = int(GGMLType.IQ4_NL), int(GGMLType.IQ4_XS)
TQ1_0, TQ2_0 = int(GGMLType.TQ1_0), int(GGMLType.TQ2_0)
MXFP4, NVFP4 = int(GGMLType.MXFP4), int(GGMLType.NVFP4)

PAR_MIN = 1 << 15       # elements per thread at least: below, starting a thread costs more than it saves


@functools.lru_cache(maxsize=None)
def tables() -> tuple:
    """The lookup tables of the decoders, in the order T[0..9] below (all f32 unless noted)."""
    from ..quants import fp4, iq
    from ..quants.iq_tables import TABLES
    f = lambda a: np.ascontiguousarray(a, np.float32)          # noqa: E731
    return (f(TABLES["iq2xxs"]),                 # 0  (256, 8)
            f(TABLES["iq2xs"]),                  # 1  (512, 8)
            f(TABLES["iq2s"]),                   # 2  (1024, 8)
            f(TABLES["iq3xxs"]),                 # 3  (256, 4)
            f(TABLES["iq3s"]),                   # 4  (512, 4)
            f(iq.iq1_table()),                  # 5  (4096, 8) iq1s grid + 0.125, then grid - 0.125
            np.ascontiguousarray(TABLES["ksigns"], np.uint8),   # 6  (128,) sign masks (uint8)
            f(TABLES["kvalues_iq4nl"]),          # 7  (16,)
            f(fp4.KV),                          # 8  (16,) E2M1 values, doubled
            f(fp4.ue4m3_half(np.arange(256))))   # 9  (256,) UE4M3 byte -> value / 2


# -- byte fields ---------------------------------------------------------------------------------------

@njit(inline="always")
def _u16(src, i, o):
    return np.int64(src[i, o]) | (np.int64(src[i, o + 1]) << 8)


@njit(inline="always")
def _u32(src, i, o):
    return _u16(src, i, o) | (_u16(src, i, o + 2) << 16)


@njit(inline="always")
def _f16(src, i, o):
    return f16_to_f32(src[i, o], src[i, o + 1])


@njit(inline="always")
def _rt(k, r, b):
    """k, computed from the run-time block size r (== b): inner loops run `range(_rt(16, R, 32))`.
    LLVM unrolls a loop of constant trip count completely and then leaves it scalar; a count it
    cannot know at compile time it vectorizes."""
    return k * r // b


@njit(inline="always")
def _i8(b):
    """A byte as the int8 it holds, then f32."""
    return np.float32((np.int64(b) ^ 0x80) - 0x80)


# -- element types as one-element blocks ---------------------------------------------------------------

@njit(inline="always")
def _f16_bits32(h):
    """f16_to_f32 as bits, without branches (LLVM vectorizes it): the normal, subnormal and inf/NaN
    results computed alike and one selected; a signalling NaN comes out quiet."""
    h = np.int64(h)
    sign = (h & 0x8000) << 16
    em = h & 0x7FFF
    m = h & 0x3FF
    normal = sign | ((em << 13) + 0x38000000)
    special = sign | 0x7F800000 | (m << 13) | (0x00400000 if m != 0 else 0)
    sub = sign | f32_bits(np.float32(m) * _TWO_M24)
    return special if em >= 0x7C00 else (normal if em >= 0x0400 else sub)


@njit(cache=True, nogil=True)
def _flat_f16(s16, o32, lo, hi):
    """F16 / BF16 tensors as flat arrays (the dequantize entry point): uint16 in, f32 bits out.
    (Loops index slices from 0: Numba adds a negative-index check to indices it cannot prove >= 0,
    which keeps LLVM from vectorizing.)"""
    s, o = s16[lo:hi], o32[lo:hi]
    for i in range(s.size):
        o[i] = _f16_bits32(s[i])


@njit(cache=True, nogil=True)
def _flat_bf16(s16, o32, lo, hi):
    s, o = s16[lo:hi], o32[lo:hi]
    for i in range(s.size):
        o[i] = np.uint32(s[i]) << np.uint32(16)


@njit(cache=True, nogil=True)
def _dq_f32(src, out, lo, hi, T):
    s = src[lo:hi].reshape(-1).view(np.uint32)
    o = out[lo:hi].reshape(-1).view(np.uint32)
    for i in range(s.size):
        o[i] = s[i]


@njit(cache=True, nogil=True)
def _dq_f16(src, out, lo, hi, T):
    _flat_f16(src[lo:hi].reshape(-1).view(np.uint16), out[lo:hi].reshape(-1).view(np.uint32), 0, hi - lo)


@njit(cache=True, nogil=True)
def _dq_bf16(src, out, lo, hi, T):
    _flat_bf16(src[lo:hi].reshape(-1).view(np.uint16), out[lo:hi].reshape(-1).view(np.uint32), 0, hi - lo)


# -- 32-element legacy formats ---------------------------------------------------------------------------
# Q4_1 Q5_0 Q5_1: each block one vector decode of kernels/simd.py (`vdec_<type>`: the weight values of the
# fast decode dot, stored), the same f32 expressions as the NumPy dequantizers: (q - 16) * d (an exact
# product) and q * d + m by one fused rounding, equal to the two roundings of the reference because q * d is
# exact; a NaN min takes `_nan_min` as before. 4.2-5.2 Gelem/s a core against 3.3-4.2 for the loops
# (Q4_0 and Q8_0 keep their loops, which LLVM vectorizes whole: 5.1 Gelem/s against 3.8 block by block).

@njit(inline="always")
def _vcheck(src, out, lo, hi, ts, bs):
    """The bounds the vector decoders rely on (they read and write raw addresses); nothing to check when the
    range is empty (an empty tensor's strides are arbitrary)."""
    if hi > lo and (lo < 0 or hi > src.shape[0] or hi > out.shape[0] or src.shape[1] != ts or out.shape[1] != bs
                    or src.strides[1] != 1 or out.strides[1] != 4):
        raise ValueError("dequantize kernel: blocks and output do not match")


@njit(cache=True, nogil=True)
def _dq_q4_0(src, out, lo, hi, T):
    R = out.shape[1]            # = 32, but a run-time value (see _rt)
    for i in range(lo, hi):
        d = _f16(src, i, 0)
        for j in range(_rt(16, R, 32)):
            b = src[i, 2 + j]
            out[i, j] = (np.float32(b & 15) - np.float32(8)) * d
            out[i, j + 16] = (np.float32(b >> 4) - np.float32(8)) * d


@njit
def _nan_min(src, i, qs, qh_at, d, m, out):
    """Q4_1 / Q5_1 block i whose min m is NaN: `q*d + m` keeps the NaN of its first operand when both
    are NaN (x86 addps, as NumPy's `out += m` runs it); LLVM may swap the operands of a commutative
    fadd, so the rare block decides explicitly. qh_at < 0: no fifth bit (Q4_1)."""
    qh = _u32(src, i, qh_at) if qh_at >= 0 else 0
    for j in range(16):
        b = np.int64(src[i, qs + j])
        q0 = (b & 15) | (((qh >> j) & 1) << 4)
        q1 = (b >> 4) | (((qh >> (j + 16)) & 1) << 4)
        t0 = np.float32(q0) * d
        t1 = np.float32(q1) * d
        out[i, j] = t0 if t0 != t0 else t0 + m
        out[i, j + 16] = t1 if t1 != t1 else t1 + m


@njit(cache=True, nogil=True)
def _dq_q4_1(src, out, lo, hi, T):
    _vcheck(src, out, lo, hi, 20, 32)
    for i in range(lo, hi):
        simd.vdec_q4_1(src, i, out, i)
        m = _f16(src, i, 2)
        if m != m:
            _nan_min(src, i, 4, -1, _f16(src, i, 0), m, out)


@njit(cache=True, nogil=True)
def _dq_q5_0(src, out, lo, hi, T):
    _vcheck(src, out, lo, hi, 22, 32)
    for i in range(lo, hi):
        simd.vdec_q5_0(src, i, out, i)


@njit(cache=True, nogil=True)
def _dq_q5_1(src, out, lo, hi, T):
    _vcheck(src, out, lo, hi, 24, 32)
    for i in range(lo, hi):
        simd.vdec_q5_1(src, i, out, i)
        m = _f16(src, i, 2)
        if m != m:
            _nan_min(src, i, 8, 4, _f16(src, i, 0), m, out)


@njit(cache=True, nogil=True)
def _dq_q8_0(src, out, lo, hi, T):
    R = out.shape[1]            # = 32, but a run-time value (see _rt)
    s, o = src[lo:hi], out[lo:hi]          # indexed from 0: no negative-index checks (see _flat_f16)
    for i in range(s.shape[0]):
        d = _f16(s, i, 0)
        for j in range(_rt(32, R, 32)):
            o[i, j] = _i8(s[i, 2 + j]) * d


@njit(cache=True, nogil=True)
def _dq_q8_1(src, out, lo, hi, T):
    R = out.shape[1]            # = 32, but a run-time value (see _rt)
    for i in range(lo, hi):
        d = _f16(src, i, 0)
        for j in range(_rt(32, R, 32)):
            out[i, j] = _i8(src[i, 4 + j]) * d


@njit(cache=True, nogil=True)
def _dq_q1_0(src, out, lo, hi, T):
    R = out.shape[1]            # = 128, but a run-time value (see _rt)
    for i in range(lo, hi):
        d = _f16(src, i, 0)
        nd = -d
        for j in range(_rt(128, R, 128)):
            out[i, j] = d if (src[i, 2 + (j >> 3)] >> (j & 7)) & 1 else nd


@njit(cache=True, nogil=True)
def _dq_mxfp4(src, out, lo, hi, T):
    R = out.shape[1]            # = 32, but a run-time value (see _rt)
    kv = T[8]
    for i in range(lo, hi):
        e = np.int64(src[i, 0])
        d = f32_from_bits((0x00200000 << e) if e < 2 else ((e - 1) << 23))
        for j in range(_rt(16, R, 32)):
            b = src[i, 1 + j]
            out[i, j] = kv[b & 15] * d
            out[i, j + 16] = kv[b >> 4] * d


@njit(cache=True, nogil=True)
def _dq_nvfp4(src, out, lo, hi, T):
    R = out.shape[1]            # = 64, but a run-time value (see _rt)
    kv = T[8]
    ue = T[9]
    for i in range(lo, hi):
        for s in range(_rt(4, R, 64)):
            d = ue[src[i, s]]
            for j in range(_rt(8, R, 64)):
                b = src[i, 4 + 8 * s + j]
                out[i, 16 * s + j] = kv[b & 15] * d
                out[i, 16 * s + j + 8] = kv[b >> 4] * d


# -- K-quants ---------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _dq_q2_K(src, out, lo, hi, T):
    R = out.shape[1]            # = 256, but a run-time value (see _rt)
    for i in range(lo, hi):
        d = _f16(src, i, 80)
        dmin = _f16(src, i, 82)
        for h in range(2):
            for half in range(2):               # elements 128h + 32s + 16half + l, sub-block 8h + 2s + half
                j = 8 * h + half
                dl0 = d * np.float32(src[i, j] & 15)
                ml0 = dmin * np.float32(src[i, j] >> 4)
                dl1 = d * np.float32(src[i, j + 2] & 15)
                ml1 = dmin * np.float32(src[i, j + 2] >> 4)
                dl2 = d * np.float32(src[i, j + 4] & 15)
                ml2 = dmin * np.float32(src[i, j + 4] >> 4)
                dl3 = d * np.float32(src[i, j + 6] & 15)
                ml3 = dmin * np.float32(src[i, j + 6] >> 4)
                e0 = 128 * h + 16 * half
                for l in range(_rt(16, R, 256)):
                    b = np.int64(src[i, 16 + 32 * h + 16 * half + l])
                    out[i, e0 + l] = np.float32(b & 3) * dl0 - ml0
                    out[i, e0 + 32 + l] = np.float32((b >> 2) & 3) * dl1 - ml1
                    out[i, e0 + 64 + l] = np.float32((b >> 4) & 3) * dl2 - ml2
                    out[i, e0 + 96 + l] = np.float32(b >> 6) * dl3 - ml3


@njit(inline="always")
def _q3_scale(src, i, j):
    """Sixth-bit scale j (0..63) of Q3_K: low 4 bits from scales[j % 8] (high nibble for j >= 8),
    high 2 bits from bits 2*(j // 4) of scales[8 + j % 4]."""
    b = np.int64(src[i, 96 + (j & 7)])
    low = (b & 15) if j < 8 else (b >> 4)
    high = (np.int64(src[i, 104 + (j & 3)]) >> (2 * (j >> 2))) & 3
    return low | (high << 4)


@njit(cache=True, nogil=True)
def _dq_q3_K(src, out, lo, hi, T):
    R = out.shape[1]            # = 256, but a run-time value (see _rt)
    for i in range(lo, hi):
        d = _f16(src, i, 108)
        for h in range(2):
            for half in range(2):               # elements 128h + 32s + 16half + l, sub-block 8h + 2s + half
                j = 8 * h + half
                dl0 = d * np.float32(_q3_scale(src, i, j) - 32)
                dl1 = d * np.float32(_q3_scale(src, i, j + 2) - 32)
                dl2 = d * np.float32(_q3_scale(src, i, j + 4) - 32)
                dl3 = d * np.float32(_q3_scale(src, i, j + 6) - 32)
                e0 = 128 * h + 16 * half
                for l in range(_rt(16, R, 256)):
                    ll = 16 * half + l
                    b = np.int64(src[i, 32 + 32 * h + ll])
                    hm = np.int64(src[i, ll]) >> (4 * h)          # bits s of hmask[ll] for this h
                    out[i, e0 + l] = np.float32((b & 3) + 4 * (hm & 1) - 4) * dl0
                    out[i, e0 + 32 + l] = np.float32(((b >> 2) & 3) + 4 * ((hm >> 1) & 1) - 4) * dl1
                    out[i, e0 + 64 + l] = np.float32(((b >> 4) & 3) + 4 * ((hm >> 2) & 1) - 4) * dl2
                    out[i, e0 + 96 + l] = np.float32((b >> 6) + 4 * ((hm >> 3) & 1) - 4) * dl3


@njit(inline="always")
def _scale_min_k4(src, i, o, j):
    """ggml's get_scale_min_k4(j, scales) with scales at byte o of block i: (sc, m), 6 bits each."""
    if j < 4:
        return np.int64(src[i, o + j]) & 63, np.int64(src[i, o + j + 4]) & 63
    b = np.int64(src[i, o + j + 4])
    sc = (b & 15) | ((np.int64(src[i, o + j - 4]) >> 6) << 4)
    m = (b >> 4) | ((np.int64(src[i, o + j]) >> 6) << 4)
    return sc, m


@njit(inline="always")
def _q4_K_chunk(src, out, i, c, d, dmin, R):
    """Elements 64c .. 64c+63 of Q4_K block i (sub-blocks 2c, 2c+1: low, then high nibbles of qs[32c:32c+32]).
    The decoders call it once per literal c, so that every shift and offset is a constant; the nibbles
    stay uint8 (LLVM then converts 8 and more per instruction, not int64 lanes)."""
    sc0, m0 = _scale_min_k4(src, i, 4, 2 * c)
    sc1, m1 = _scale_min_k4(src, i, 4, 2 * c + 1)
    D0 = d * np.float32(sc0)
    M0 = dmin * np.float32(m0)
    D1 = d * np.float32(sc1)
    M1 = dmin * np.float32(m1)
    for l in range(_rt(32, R, 256)):           # two loops, as ggml's: one output stream each (3-5% faster
        out[i, 64 * c + l] = np.float32(np.uint8(src[i, 16 + 32 * c + l] & 15)) * D0 - M0  # than both in one)
    for l in range(_rt(32, R, 256)):
        out[i, 64 * c + 32 + l] = np.float32(np.uint8(src[i, 16 + 32 * c + l] >> 4)) * D1 - M1


@njit(cache=True, nogil=True)
def _dq_q4_K(src, out, lo, hi, T):
    R = out.shape[1]            # = 256, but a run-time value (see _rt)
    s, o = src[lo:hi], out[lo:hi]          # indexed from 0 (see _dq_q8_0)
    for i in range(s.shape[0]):
        d = _f16(s, i, 0)
        dmin = _f16(s, i, 2)
        _q4_K_chunk(s, o, i, 0, d, dmin, R)
        _q4_K_chunk(s, o, i, 1, d, dmin, R)
        _q4_K_chunk(s, o, i, 2, d, dmin, R)
        _q4_K_chunk(s, o, i, 3, d, dmin, R)


@njit(inline="always")
def _q5_K_chunk(src, out, i, c, d, dmin, R):
    """Elements 64c .. 64c+63 of Q5_K block i: as _q4_K_chunk, the fifth bits from bits 2c, 2c+1 of qh[l]
    (constant shifts, c being a literal)."""
    sc0, m0 = _scale_min_k4(src, i, 4, 2 * c)
    sc1, m1 = _scale_min_k4(src, i, 4, 2 * c + 1)
    D0 = d * np.float32(sc0)
    M0 = dmin * np.float32(m0)
    D1 = d * np.float32(sc1)
    M1 = dmin * np.float32(m1)
    for l in range(_rt(32, R, 256)):           # one output stream per loop (see _q4_K_chunk)
        q0 = np.uint8(src[i, 48 + 32 * c + l] & 15) | np.uint8(((src[i, 16 + l] >> (2 * c)) & 1) << 4)
        out[i, 64 * c + l] = np.float32(np.uint8(q0)) * D0 - M0
    for l in range(_rt(32, R, 256)):
        q1 = np.uint8(src[i, 48 + 32 * c + l] >> 4) | np.uint8(((src[i, 16 + l] >> (2 * c + 1)) & 1) << 4)
        out[i, 64 * c + 32 + l] = np.float32(np.uint8(q1)) * D1 - M1


@njit(cache=True, nogil=True)
def _dq_q5_K(src, out, lo, hi, T):
    R = out.shape[1]            # = 256, but a run-time value (see _rt)
    s, o = src[lo:hi], out[lo:hi]          # indexed from 0 (see _dq_q8_0)
    for i in range(s.shape[0]):
        d = _f16(s, i, 0)
        dmin = _f16(s, i, 2)
        _q5_K_chunk(s, o, i, 0, d, dmin, R)
        _q5_K_chunk(s, o, i, 1, d, dmin, R)
        _q5_K_chunk(s, o, i, 2, d, dmin, R)
        _q5_K_chunk(s, o, i, 3, d, dmin, R)


@njit(cache=True, nogil=True)
def _dq_q6_K(src, out, lo, hi, T):
    R = out.shape[1]            # = 256, but a run-time value (see _rt)
    for i in range(lo, hi):
        d = _f16(src, i, 208)
        for h in range(2):
            for half in range(2):               # elements 128h + 32k + 16half + l, sub-block 8h + 2k + half
                sc = 192 + 8 * h + half
                dl0 = d * _i8(src[i, sc])
                dl1 = d * _i8(src[i, sc + 2])
                dl2 = d * _i8(src[i, sc + 4])
                dl3 = d * _i8(src[i, sc + 6])
                e0 = 128 * h + 16 * half
                for l in range(_rt(16, R, 256)):
                    ll = 16 * half + l
                    a = np.int64(src[i, 64 * h + ll])
                    b = np.int64(src[i, 64 * h + 32 + ll])
                    qh = np.int64(src[i, 128 + 32 * h + ll])
                    out[i, e0 + l] = np.float32(((a & 15) | ((qh & 3) << 4)) - 32) * dl0
                    out[i, e0 + 32 + l] = np.float32(((b & 15) | (((qh >> 2) & 3) << 4)) - 32) * dl1
                    out[i, e0 + 64 + l] = np.float32(((a >> 4) | (((qh >> 4) & 3) << 4)) - 32) * dl2
                    out[i, e0 + 96 + l] = np.float32(((b >> 4) | (((qh >> 6) & 3) << 4)) - 32) * dl3


@njit(cache=True, nogil=True)
def _dq_q8_K(src, out, lo, hi, T):
    R = out.shape[1]            # = 256, but a run-time value (see _rt)
    for i in range(lo, hi):
        d = f32_from_bits(_u32(src, i, 0))
        for j in range(_rt(256, R, 256)):
            out[i, j] = _i8(src[i, 4 + j]) * d


# -- ternary ------------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _dq_tq2_0(src, out, lo, hi, T):
    R = out.shape[1]            # = 256, but a run-time value (see _rt)
    for i in range(lo, hi):
        d = _f16(src, i, 64)
        for g in range(2):
            for k in range(_rt(4, R, 256)):
                for m in range(_rt(32, R, 256)):
                    t = ((np.int64(src[i, 32 * g + m]) >> (2 * k)) & 3) - 1
                    out[i, 128 * g + 32 * k + m] = np.float32(t) * d


@njit(cache=True, nogil=True)
def _dq_tq1_0(src, out, lo, hi, T):
    """Digit n of a byte b, minus 1, as ggml decodes it: ((uint8)(b * 3^n) * 3 >> 8) - 1 (the values of
    refimpl.quants.ternary._TQ1_LUT), times d: one vector decode per block (`simd.vdec_tq1_0`; 4.4 against
    3.1 Gelem/s for the same arithmetic as a Numba loop, which widened every byte to int64)."""
    _vcheck(src, out, lo, hi, 54, 256)
    for i in range(lo, hi):
        simd.vdec_tq1_0(src, i, out, i)


# -- IQ formats ---------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _dq_iq2_xxs(src, out, lo, hi, T):
    R = out.shape[1]            # = 256, but a run-time value (see _rt)
    grid = T[0]
    ksigns = T[6]
    for i in range(lo, hi):
        d = _f16(src, i, 0)
        for g in range(_rt(8, R, 256)):
            a1 = _u32(src, i, 2 + 8 * g + 4)
            db = (d * (np.float32(0.5) + np.float32(a1 >> 28))) * np.float32(0.25)
            for l in range(_rt(4, R, 256)):
                idx = src[i, 2 + 8 * g + l]
                mask = ksigns[(a1 >> (7 * l)) & 127]
                for j in range(_rt(8, R, 256)):
                    v = grid[idx, j] * db
                    out[i, 32 * g + 8 * l + j] = -v if (mask >> j) & 1 else v


@njit(cache=True, nogil=True)
def _dq_iq2_xs(src, out, lo, hi, T):
    R = out.shape[1]            # = 256, but a run-time value (see _rt)
    grid = T[1]
    ksigns = T[6]
    for i in range(lo, hi):
        d = _f16(src, i, 0)
        for g in range(_rt(8, R, 256)):
            sc = np.int64(src[i, 66 + g])
            db0 = (d * (np.float32(0.5) + np.float32(sc & 15))) * np.float32(0.25)
            db1 = (d * (np.float32(0.5) + np.float32(sc >> 4))) * np.float32(0.25)
            for l in range(_rt(4, R, 256)):
                w = _u16(src, i, 2 + 2 * (4 * g + l))
                idx = w & 511
                mask = ksigns[w >> 9]
                db = db0 if l < 2 else db1
                for j in range(_rt(8, R, 256)):
                    v = grid[idx, j] * db
                    out[i, 32 * g + 8 * l + j] = -v if (mask >> j) & 1 else v


@njit(cache=True, nogil=True)
def _dq_iq2_s(src, out, lo, hi, T):
    R = out.shape[1]            # = 256, but a run-time value (see _rt)
    grid = T[2]
    for i in range(lo, hi):
        d = _f16(src, i, 0)
        for g in range(_rt(8, R, 256)):
            sc = np.int64(src[i, 74 + g])
            db0 = (d * (np.float32(0.5) + np.float32(sc & 15))) * np.float32(0.25)
            db1 = (d * (np.float32(0.5) + np.float32(sc >> 4))) * np.float32(0.25)
            qh = np.int64(src[i, 66 + g])
            for l in range(_rt(4, R, 256)):
                idx = np.int64(src[i, 2 + 4 * g + l]) | ((qh << (8 - 2 * l)) & 0x300)
                mask = src[i, 34 + 4 * g + l]
                db = db0 if l < 2 else db1
                for j in range(_rt(8, R, 256)):
                    v = grid[idx, j] * db
                    out[i, 32 * g + 8 * l + j] = -v if (mask >> j) & 1 else v


@njit(cache=True, nogil=True)
def _dq_iq3_xxs(src, out, lo, hi, T):
    R = out.shape[1]            # = 256, but a run-time value (see _rt)
    grid = T[3]
    ksigns = T[6]
    for i in range(lo, hi):
        d = _f16(src, i, 0)
        for g in range(_rt(8, R, 256)):
            w = _u32(src, i, 66 + 4 * g)
            db = (d * (np.float32(0.5) + np.float32(w >> 28))) * np.float32(0.5)
            for l in range(_rt(4, R, 256)):
                mask = ksigns[(w >> (7 * l)) & 127]
                i0 = src[i, 2 + 8 * g + 2 * l]
                i1 = src[i, 2 + 8 * g + 2 * l + 1]
                for j in range(_rt(4, R, 256)):
                    v = grid[i0, j] * db
                    out[i, 32 * g + 8 * l + j] = -v if (mask >> j) & 1 else v
                    v = grid[i1, j] * db
                    out[i, 32 * g + 8 * l + 4 + j] = -v if (mask >> (4 + j)) & 1 else v


@njit(cache=True, nogil=True)
def _dq_iq3_s(src, out, lo, hi, T):
    R = out.shape[1]            # = 256, but a run-time value (see _rt)
    grid = T[4]
    for i in range(lo, hi):
        d = _f16(src, i, 0)
        for g in range(_rt(8, R, 256)):
            sc = np.int64(src[i, 106 + (g >> 1)])
            nib = (sc & 15) if (g & 1) == 0 else (sc >> 4)
            db = d * np.float32(1 + 2 * nib)
            qh = np.int64(src[i, 66 + g])
            for l in range(_rt(4, R, 256)):
                i0 = np.int64(src[i, 2 + 8 * g + 2 * l]) | ((qh << (8 - 2 * l)) & 256)
                i1 = np.int64(src[i, 2 + 8 * g + 2 * l + 1]) | ((qh << (7 - 2 * l)) & 256)
                mask = src[i, 74 + 4 * g + l]
                for j in range(_rt(4, R, 256)):
                    v = grid[i0, j] * db
                    out[i, 32 * g + 8 * l + j] = -v if (mask >> j) & 1 else v
                    v = grid[i1, j] * db
                    out[i, 32 * g + 8 * l + 4 + j] = -v if (mask >> (4 + j)) & 1 else v


@njit(cache=True, nogil=True)
def _dq_iq1_s(src, out, lo, hi, T):
    R = out.shape[1]            # = 256, but a run-time value (see _rt)
    tab = T[5]
    for i in range(lo, hi):
        d = _f16(src, i, 0)
        for g in range(_rt(8, R, 256)):
            qh = _u16(src, i, 34 + 2 * g)
            dl = d * np.float32(2 * ((qh >> 12) & 7) + 1)
            for l in range(_rt(4, R, 256)):
                idx = np.int64(src[i, 2 + 4 * g + l]) | (((qh >> (3 * l)) & 7) << 8) | ((qh >> 15) << 11)
                for j in range(_rt(8, R, 256)):
                    out[i, 32 * g + 8 * l + j] = tab[idx, j] * dl


@njit(cache=True, nogil=True)
def _dq_iq1_m(src, out, lo, hi, T):
    R = out.shape[1]            # = 256, but a run-time value (see _rt)
    tab = T[5]
    for i in range(lo, hi):
        s0 = _u16(src, i, 48)
        s1 = _u16(src, i, 50)
        s2 = _u16(src, i, 52)
        s3 = _u16(src, i, 54)
        d = f16_to_f32_raw((s0 >> 12) | ((s1 >> 8) & 0x00F0) | ((s2 >> 4) & 0x0F00) | (s3 & 0xF000))
        for g in range(_rt(8, R, 256)):
            sg = _u16(src, i, 48 + 2 * (g >> 1))
            sh = 6 * (g & 1)
            dl1 = d * np.float32(2 * ((sg >> sh) & 7) + 1)
            dl2 = d * np.float32(2 * ((sg >> (sh + 3)) & 7) + 1)
            for l in range(_rt(4, R, 256)):
                qh = np.int64(src[i, 32 + 2 * g + (l >> 1)])
                shift = 8 if (l & 1) == 0 else 4
                dbit = 0x08 if (l & 1) == 0 else 0x80
                idx = np.int64(src[i, 4 * g + l]) | ((qh << shift) & 0x700)
                if qh & dbit:
                    idx |= 2048
                dl = dl1 if l < 2 else dl2
                for j in range(_rt(8, R, 256)):
                    out[i, 32 * g + 8 * l + j] = tab[idx, j] * dl


@njit(cache=True, nogil=True)
def _dq_iq4_nl(src, out, lo, hi, T):
    R = out.shape[1]            # = 32, but a run-time value (see _rt)
    kv = T[7]
    for i in range(lo, hi):
        d = _f16(src, i, 0)
        for j in range(_rt(16, R, 32)):
            b = src[i, 2 + j]
            out[i, j] = kv[b & 15] * d
            out[i, j + 16] = kv[b >> 4] * d


@njit(cache=True, nogil=True)
def _dq_iq4_xs(src, out, lo, hi, T):
    R = out.shape[1]            # = 256, but a run-time value (see _rt)
    kv = T[7]
    for i in range(lo, hi):
        d = _f16(src, i, 0)
        sh = _u16(src, i, 2)
        for ib in range(_rt(8, R, 256)):
            ls = ((np.int64(src[i, 4 + (ib >> 1)]) >> (4 * (ib & 1))) & 15) | (((sh >> (2 * ib)) & 3) << 4)
            dl = d * np.float32(ls - 32)
            for j in range(_rt(16, R, 256)):
                b = src[i, 8 + 16 * ib + j]
                out[i, 32 * ib + j] = kv[b & 15] * dl
                out[i, 32 * ib + j + 16] = kv[b >> 4] * dl


# -- dispatch ---------------------------------------------------------------------------------------------

DECODERS = {F32_T: _dq_f32, F16_T: _dq_f16, BF16_T: _dq_bf16, Q4_0: _dq_q4_0, Q4_1: _dq_q4_1, Q5_0: _dq_q5_0,
            Q5_1: _dq_q5_1, Q8_0: _dq_q8_0, Q8_1: _dq_q8_1, Q1_0: _dq_q1_0, Q2_K: _dq_q2_K, Q3_K: _dq_q3_K,
            Q4_K: _dq_q4_K, Q5_K: _dq_q5_K, Q6_K: _dq_q6_K, Q8_K: _dq_q8_K, IQ2_XXS: _dq_iq2_xxs,
            IQ2_XS: _dq_iq2_xs, IQ2_S: _dq_iq2_s, IQ3_XXS: _dq_iq3_xxs, IQ3_S: _dq_iq3_s, IQ1_S: _dq_iq1_s,
            IQ1_M: _dq_iq1_m, IQ4_NL: _dq_iq4_nl, IQ4_XS: _dq_iq4_xs, TQ1_0: _dq_tq1_0, TQ2_0: _dq_tq2_0,
            MXFP4: _dq_mxfp4, NVFP4: _dq_nvfp4}
DECODABLE = frozenset(t for t in DEQUANTIZERS if int(t) in DECODERS)


# -- thread drivers ------------------------------------------------------------------------------------------
# A whole tensor's decode (the dequantize entry point) splits its blocks in a `prange`: Numba's OpenMP threads
# start a range an order of magnitude sooner than the Python pool of parallel_ranges (docs/benchmarks.md,
# "Thresholds"). One small driver per decoder, from a template as
# kernels/matmul.py's (`per_type`: a driver taking the decoder as an argument would not be cached). mul_mat's
# tiles take them (`decode_tensor`) only where their products run on Numba's threads too, else
# parallel_ranges (`dequantize_into`): OpenMP threads that spin after a prange take the cores from OpenBLAS's
# next sgemm.

_PAR_DQ = """
@njit(cache=True, parallel=True, nogil=True)
def _par_dq_{t}(src, out, T, nchunk):
    n = src.shape[0]
    for c in prange(nchunk):
        _dq_{t}(src, out, n * c // nchunk, n * (c + 1) // nchunk, T)
"""
PAR_DECODERS = {int(traits(n).type): f
                for n, f in per_type(globals(), _PAR_DQ, [traits(t).name for t in DECODERS]).items()}


# The per-tensor path below runs on caches that the previous decode has just flushed (1M elements
# write 4 MB), where each Python-level step costs several microseconds: it takes as few as it can.

_TABLED = frozenset((IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, IQ4_NL, IQ4_XS, MXFP4, NVFP4))


def _decode(dq, src, out, min_blocks, T):
    """dq on all blocks of src into out: one call on this thread unless there is work for several.
    T: tables(), or () for the types that use none (unboxing ten arrays per call costs ~4 us cold)."""
    n = src.shape[0]
    if n < 2 * min_blocks or n_threads() == 1:
        dq(src, out, 0, n, T)
    else:
        parallel_ranges(lambda lo, hi: dq(src, out, lo, hi, T), n, min_blocks)


def _decode_tensor(tid, src, out, min_blocks, T):
    """The dequantize entry point's decode of a whole tensor: its blocks split over Numba's OpenMP threads
    (PAR_DECODERS) where there is work for several, else one call on this thread. In a forked child (GNU
    OpenMP's threads do not survive a fork) or on a pool thread, parallel_ranges as dequantize_into."""
    n = src.shape[0]
    th = n_threads()
    k = min(th, n // min_blocks) if th > 1 else 1
    if k <= 1:
        DECODERS[tid](src, out, 0, n, T)
    elif not prange_ok():
        _decode(DECODERS[tid], src, out, min_blocks, T)
    else:
        PAR_DECODERS[tid](src, out, T, k)


def decode_tensor(t, src: np.ndarray, out: np.ndarray) -> np.ndarray:
    """dequantize_into through the prange drivers (`_decode_tensor`): for callers whose next step runs on
    Numba's threads too (mul_mat's tiles for MKL), not on OpenBLAS's."""
    tid = int(t)
    _decode_tensor(tid, src, out, max(1, PAR_MIN // traits(t).blck_size), tables() if tid in _TABLED else ())
    return out


def dequantize_into(t, src: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Decode all blocks of src (n, type_size) uint8 into out (n, blck_size) f32 (both C-contiguous)."""
    tid = int(t)
    if tid in (F16_T, BF16_T):                 # one element per "block": flat loops
        s16, o32 = src.reshape(-1).view(np.uint16), out.reshape(-1).view(np.uint32)
        flat = _flat_f16 if tid == F16_T else _flat_bf16
        parallel_ranges(lambda lo, hi: flat(s16, o32, lo, hi), s16.size, PAR_MIN)
    elif tid == F32_T:
        out.reshape(-1).view(np.uint32)[...] = src.reshape(-1).view(np.uint32)
    else:                                      # DECODERS[tid] compiles on first use of its type
        _decode(DECODERS[tid], src, out, max(1, PAR_MIN // traits(t).blck_size), tables() if tid in _TABLED else ())
    return out


def _wrapper(t):
    tr = traits(t)
    ref = DEQUANTIZERS[t]
    shape = (tr.type_size,)
    into = functools.partial(_decode_tensor, int(t), min_blocks=max(1, PAR_MIN // tr.blck_size),
                             T=tables() if int(t) in _TABLED else ())

    def dequantize(blocks, out=None):
        blocks = np.ascontiguousarray(blocks, np.uint8)
        if blocks.shape[1:] != shape:
            raise ValueError(f"{tr.name} blocks must be (n, {tr.type_size}) uint8, got {blocks.shape}")
        n = blocks.shape[0]
        if out is None or not (out.flags.c_contiguous and out.dtype == np.float32
                               and out.shape == (n, tr.blck_size)):
            res = np.empty((n, tr.blck_size), np.float32)
            into(blocks, res)
            if out is None:
                return res
            out[...] = res
            return out
        into(blocks, out)
        return out

    dequantize.__name__ = f"dequantize_{tr.name}"
    dequantize.__doc__ = (f"{tr.name} blocks (n, {tr.type_size}) uint8 -> (n, {tr.blck_size}) f32 with Numba; "
                          f"the same bits as refimpl.quants' {ref.__name__}.")
    return ref, dequantize


for _t in sorted(DECODABLE):
    _ref, _fn = _wrapper(_t)
    register(_ref, "numba", KEYS)(_fn)
