"""The 32-element block formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, the 128-element Q1_0 and the 64-element
Q2_0 (ggml 0.25.3).

Element order inside a 32-block is split-nibble: byte qs[j] holds element j in its low nibble and element
j+16 in its high nibble. All f16 fields are little-endian IEEE half.

Quantizers reproduce `quantize_row_*_ref` operation by operation in f32, including what ggml's x86 build
does where C leaves a cast undefined (blocks of subnormals, whose 1/d overflows to inf: see `c_int8`).
Q8_0 and Q8_1 also have the x86 CPU backend's activation quantizer (method "cpu"): id = 127/amax,
round half to even, saturating packs -- it differs from the reference on ties and by the 1-ulp
difference of id.
"""
from __future__ import annotations

import numpy as np

from ..types import GGMLType
from .registry import dequantizer, quantizer
from ._common import (add_half_away, blockwise, c_int8, c_uint8, cvt_i32_rne, cvtt_i32, div, f16_field,
                      first_min_max, max_abs, output, pack_nibbles_into, pairwise, put_f16, roundf, seq_sum,
                      signed_absmax)

f32 = np.float32


def _recip(d):
    """`d ? 1.0f/d : 0.0f`"""
    return np.where(d != 0, div(f32(1.0), d), f32(0.0))


def _nibbles_into(out, qs):
    """out (n, 32) f32 <- the split nibbles of qs (n, 16): low nibbles are elements 0..15, high 16..31."""
    out[:, :16] = qs & 0x0F
    out[:, 16:] = qs >> 4


def _nibbles5_into(out, qs, qh):
    """As `_nibbles_into`, plus bit j of the little-endian u32 qh (n, 4 bytes) as bit 4 of element j."""
    high = np.unpackbits(qh, axis=1, bitorder="little") * np.uint8(16)  # (n, 32): 16 * bit j
    out[:, :16] = (qs & 0x0F) | high[:, :16]
    out[:, 16:] = (qs >> 4) | high[:, 16:]


def _blocks(n, type_size):
    return np.empty((n, type_size), np.uint8)


_BYTE_LSBS = np.uint64(0x0101010101010101)
_GATHER_LSBS = np.uint64(0x0102040810204080)     # b * this >> 56: bit i = the low bit of byte i of b


def _pack_qh_into(dst, q):
    """dst (n, 4) <- bit 4 of each q (n, 32) uint8, as the bits of a little-endian u32 (element j -> bit j).

    Per u64 word of 8 elements: isolate bit 4 of every byte, then one multiply moves byte i's bit to
    bit 56 + i (the partial products are distinct powers of two, so nothing carries)."""
    w = np.ascontiguousarray(q, np.uint8).view("<u8").reshape(-1)
    bits = (w >> np.uint64(4)) & _BYTE_LSBS
    bits *= _GATHER_LSBS
    bits >>= np.uint64(56)
    dst[...] = bits.astype(np.uint8).reshape(-1, 4)


def _min_int8(q, k: int):
    """MIN(k, q) on int8, in place (against a filled array: NumPy's integer minimum has no fast loop
    for a scalar operand)."""
    return np.minimum(q, np.full_like(q, k), out=q)


def _amax(x):
    """max |x| per block, NaN skipped, keepdims: the x86 CPU path's vector max for NaN-free blocks."""
    return pairwise(np.fmax, np.abs(x))


# -- Q4_0 ------------------------------------------------------------------------------------------
@dequantizer(GGMLType.Q4_0)
def dequantize_q4_0(blocks, out=None):
    """block_q4_0 (18 B): d f16 | qs[16].   x[j] = (nibble_j - 8) * d"""
    out = output(blocks, 32, out)
    _nibbles_into(out, blocks[:, 2:18])
    out -= f32(8)
    out *= f16_field(blocks, 0)
    return out


@quantizer(GGMLType.Q4_0, "ref")
@blockwise
def quantize_q4_0(x):
    """d = max / -8 (max = signed first-argmax |x|); q = min(15, (int8)(x/d + 8.5)); store fl16(d)."""
    _, mx = signed_absmax(x)
    d = div(mx, f32(-8))
    with np.errstate(invalid="ignore", over="ignore"):
        v = x * _recip(d)
        v += f32(8.5)
    q = _min_int8(c_int8(v), 15).view(np.uint8)           # MIN on int8, then the byte
    out = _blocks(len(x), 18)
    put_f16(out, 0, d)
    pack_nibbles_into(out[:, 2:18], q)
    return out


# -- Q4_1 ------------------------------------------------------------------------------------------
@dequantizer(GGMLType.Q4_1)
def dequantize_q4_1(blocks, out=None):
    """block_q4_1 (20 B): d f16 | m f16 | qs[16].   x[j] = nibble_j * d + m"""
    out = output(blocks, 32, out)
    _nibbles_into(out, blocks[:, 4:20])
    out *= f16_field(blocks, 0)
    out += f16_field(blocks, 2)
    return out


@quantizer(GGMLType.Q4_1, "ref")
@blockwise
def quantize_q4_1(x):
    """d = (max - min) / 15; q = min(15, (int8)((x - min)/d + 0.5)); store fl16(d), fl16(min)."""
    mn, mx = first_min_max(x)
    with np.errstate(over="ignore", invalid="ignore"):
        d = div(mx - mn, f32(15))
        v = x - mn
        v *= _recip(d)
        v += f32(0.5)
    q = _min_int8(c_int8(v), 15).view(np.uint8)
    out = _blocks(len(x), 20)
    put_f16(out, 0, d)
    put_f16(out, 2, mn)
    pack_nibbles_into(out[:, 4:20], q)
    return out


# -- Q5_0 ------------------------------------------------------------------------------------------
@dequantizer(GGMLType.Q5_0)
def dequantize_q5_0(blocks, out=None):
    """block_q5_0 (22 B): d f16 | qh u32 | qs[16].   q5_j = nibble_j | bit j of qh << 4;  x = (q5 - 16) * d"""
    out = output(blocks, 32, out)
    _nibbles5_into(out, blocks[:, 6:22], blocks[:, 2:6])
    out -= f32(16)
    out *= f16_field(blocks, 0)
    return out


@quantizer(GGMLType.Q5_0, "ref")
@blockwise
def quantize_q5_0(x):
    """d = max / -16; q = min(31, (int8)(x/d + 16.5))."""
    _, mx = signed_absmax(x)
    d = div(mx, f32(-16))
    with np.errstate(invalid="ignore", over="ignore"):
        v = x * _recip(d)
        v += f32(16.5)
    q = _min_int8(c_int8(v), 31).view(np.uint8)
    out = _blocks(len(x), 22)
    put_f16(out, 0, d)
    _pack_qh_into(out[:, 2:6], q)
    pack_nibbles_into(out[:, 6:22], q, low_mask=True)
    return out


# -- Q5_1 ------------------------------------------------------------------------------------------
@dequantizer(GGMLType.Q5_1)
def dequantize_q5_1(blocks, out=None):
    """block_q5_1 (24 B): d f16 | m f16 | qh u32 | qs[16].   x = q5 * d + m"""
    out = output(blocks, 32, out)
    _nibbles5_into(out, blocks[:, 8:24], blocks[:, 4:8])
    out *= f16_field(blocks, 0)
    out += f16_field(blocks, 2)
    return out


@quantizer(GGMLType.Q5_1, "ref")
@blockwise
def quantize_q5_1(x):
    """d = (max - min) / 31; q = (uint8)((x - min)/d + 0.5) (no clamp)."""
    mn, mx = first_min_max(x)
    with np.errstate(over="ignore", invalid="ignore"):
        d = div(mx - mn, f32(31))
        v = x - mn
        v *= _recip(d)
        v += f32(0.5)
    q = c_uint8(v)
    out = _blocks(len(x), 24)
    put_f16(out, 0, d)
    put_f16(out, 2, mn)
    _pack_qh_into(out[:, 4:8], q)
    pack_nibbles_into(out[:, 8:24], q, low_mask=True)
    return out


# -- Q8_0 ------------------------------------------------------------------------------------------
@dequantizer(GGMLType.Q8_0)
def dequantize_q8_0(blocks, out=None):
    """block_q8_0 (34 B): d f16 | qs[32] int8.   x = q * d"""
    out = output(blocks, 32, out)
    out[...] = blocks[:, 2:34].view(np.int8)
    out *= f16_field(blocks, 0)
    return out


def _round_q8(x, id_):
    """(int8_t)roundf(x * id), as the truncating cast of x*id + copysign(0.49999997f, x*id) (see `roundf`)."""
    with np.errstate(invalid="ignore", over="ignore"):
        v = x * id_
    return c_int8(add_half_away(v))


@quantizer(GGMLType.Q8_0, "ref")
@blockwise
def quantize_q8_0(x):
    """d = amax / 127 (amax = MAX(amax, |x|) from 0); q = roundf(x / d) (half away from zero)."""
    d = div(max_abs(x), f32(127))
    out = _blocks(len(x), 34)
    put_f16(out, 0, d)
    out[:, 2:34] = _round_q8(x, _recip(d)).view(np.uint8)
    return out


def _q8_cpu(x):
    """x86 AVX/AVX2 `quantize_row_q8_0/1`: id = amax ? 127/amax : 0, round half even, saturate to int8."""
    amax = _amax(x)
    d = div(amax, f32(127))
    idv = np.where(amax != 0, div(f32(127), amax), f32(0)).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        q32 = cvt_i32_rne(x * idv)                 # _mm256_round_ps + _mm256_cvtps_epi32
    return d, q32, np.clip(q32, -128, 127)         # packs_epi32 / packs_epi16 saturate


@quantizer(GGMLType.Q8_0, "cpu")
@blockwise
def quantize_q8_0_cpu(x):
    d, _, q = _q8_cpu(x)
    out = _blocks(len(x), 34)
    put_f16(out, 0, d)
    out[:, 2:34] = q.astype(np.int8).view(np.uint8)
    return out


# -- Q8_1 ------------------------------------------------------------------------------------------
@dequantizer(GGMLType.Q8_1)
def dequantize_q8_1(blocks, out=None):
    """block_q8_1 (36 B): d f16 | s f16 | qs[32] int8.   x = q * d  (s = d * Σq is for vec_dot only;
    ggml has no Q8_1 `to_float`, this is the value its dot products use)"""
    out = output(blocks, 32, out)
    out[...] = blocks[:, 4:36].view(np.int8)
    out *= f16_field(blocks, 0)
    return out


@quantizer(GGMLType.Q8_1, "ref")
@blockwise
def quantize_q8_1(x):
    """As Q8_0's reference, plus s = fl16(Σq * d) (Σ of the stored int8 values, d unrounded f32)."""
    d = div(max_abs(x), f32(127))
    q = _round_q8(x, _recip(d))
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.sum(q, axis=1, keepdims=True, dtype=np.int32).astype(np.float32) * d
    out = _blocks(len(x), 36)
    put_f16(out, 0, d)
    put_f16(out, 2, s)
    out[:, 4:36] = q.view(np.uint8)
    return out


@quantizer(GGMLType.Q8_1, "cpu")
@blockwise
def quantize_q8_1_cpu(x):
    """x86 AVX2: s = fl16(d * Σ of the int32 values before saturation, wrapping like int32)."""
    d, q32, q = _q8_cpu(x)
    tot = np.sum(q32, axis=1, keepdims=True)
    tot = ((tot + 2**31) % 2**32 - 2**31).astype(np.int32)
    with np.errstate(invalid="ignore", over="ignore"):
        s = d * tot.astype(np.float32)
    out = _blocks(len(x), 36)
    put_f16(out, 0, d)
    put_f16(out, 2, s)
    out[:, 4:36] = q.astype(np.int8).view(np.uint8)
    return out


# -- Q1_0 ------------------------------------------------------------------------------------------
@dequantizer(GGMLType.Q1_0)
def dequantize_q1_0(blocks, out=None):
    """block_q1_0 (18 B, 128 elements): d f16 | qs[16]; element j is bit j%8 of qs[j/8]: x = bit ? d : -d"""
    out = output(blocks, 128, out)
    out[...] = f16_field(blocks, 0)
    clear = np.unpackbits(blocks[:, 2:18], axis=1, bitorder="little") ^ 1
    out.view(np.uint32)[...] ^= clear.astype(np.uint32) << 31     # -d: a sign flip, NaN included
    return out


@quantizer(GGMLType.Q1_0, "ref")
def quantize_q1_0(x):
    """d = (Σ|x|, sequential f32) / 128; bit j = (x_j >= 0)."""
    out = _blocks(len(x), 18)
    put_f16(out, 0, div(seq_sum(np.abs(x)), f32(128)))
    out[:, 2:18] = np.packbits(x >= 0, axis=1, bitorder="little")
    return out


# -- Q2_0 (ggml 0.25.3) ------------------------------------------------------------------------------
@dequantizer(GGMLType.Q2_0)
def dequantize_q2_0(blocks, out=None):
    """block_q2_0 (18 B, 64 elements): d f16 | qs[16]; element j is bits 2*(j%4).. of qs[j/4]:
    x = (q - 1) * d, q in 0..3 (00 = -d, 01 = 0, 10 = +d, 11 = +2d)."""
    out = output(blocks, 64, out)
    q = (blocks[:, 2:18, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3            # (n, 16, 4): element 4b + k
    with np.errstate(invalid="ignore", over="ignore"):
        out[...] = (q.reshape(-1, 64).astype(f32) - f32(1)) * f16_field(blocks, 0)
    return out


@quantizer(GGMLType.Q2_0, "ref")
def quantize_q2_0(x):
    """quantize_row_q2_0_ref: d = max |x| (`if (a > amax) amax = a`: NaN never wins), id = d > 0 ? 1/d : 0,
    q = clamp((int)roundf(x*id) + 1, 0, 3); the f16 d is stored, the f32 d scales. A NaN or inf x*id casts to
    INT_MIN on x86 (cvttss2si), so it packs as 0 (-d), as ggml's build does."""
    out = _blocks(len(x), 18)
    a = np.abs(x)
    amax = np.max(np.where(np.isnan(a), f32(0), a), axis=1, keepdims=True, initial=f32(0)).astype(f32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        idv = np.where(amax > 0, div(f32(1), amax), f32(0))
        v = roundf(x * idv)
    q = np.clip(cvtt_i32(v).astype(np.int64) + 1, 0, 3).astype(np.uint8).reshape(-1, 16, 4)
    put_f16(out, 0, amax)
    out[:, 2:18] = q[..., 0] | (q[..., 1] << 2) | (q[..., 2] << 4) | (q[..., 3] << 6)
    return out
