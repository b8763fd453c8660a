"""The 32-element block formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, and the 128-element Q1_0.

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
from . import dequantizer, quantizer
from ._common import (add, c_int8, first_min_max, c_uint8, cvt_i32_rne, div, f16_bytes, f16_field, mul, pack_nibbles, roundf,
                      seq_sum, signed_absmax, split_nibbles, take_first, tree, u32_fields)

f32 = np.float32


def _recip(d):
    """`d ? 1.0f/d : 0.0f`"""
    return np.where(d != 0, div(f32(1.0), d), f32(0.0)).astype(np.float32)


def _qh_bits(qh: np.ndarray) -> np.ndarray:
    """(n, 1) uint32 -> (n, 32) bit j of qh as 0/1 (element j's 5th bit)."""
    return ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _pack_qh(q5: np.ndarray) -> np.ndarray:
    """(n, 32) 5-bit values -> (n, 4) bytes of the little-endian u32 of their 5th bits."""
    bits = ((q5.astype(np.uint32) >> 4) & 1) << np.arange(32, dtype=np.uint32)
    return np.bitwise_or.reduce(bits, axis=1).astype("<u4").reshape(-1, 1).view(np.uint8)


_minmax = first_min_max


def _amax(x):
    return tree(np.fmax, np.abs(x))


# -- Q4_0 ------------------------------------------------------------------------------------------
@dequantizer(GGMLType.Q4_0)
def dequantize_q4_0(blocks):
    """block_q4_0 (18 B): d f16 | qs[16].   x[j] = (nibble_j - 8) * d"""
    d = f16_field(blocks, 0)
    q = split_nibbles(blocks[:, 2:18]).astype(np.int32) - 8
    return mul(q.astype(np.float32), d)


@quantizer(GGMLType.Q4_0, "ref")
def quantize_q4_0(x):
    """d = max / -8 (max = signed first-argmax |x|); q = min(15, (int8)(x/d + 8.5)); store fl16(d)."""
    _, mx = signed_absmax(x)
    d = div(mx, f32(-8))
    q = np.minimum(15, c_int8(mul(x, _recip(d)) + f32(8.5)))
    return np.concatenate([f16_bytes(d), pack_nibbles(q)], axis=1)


# -- Q4_1 ------------------------------------------------------------------------------------------
@dequantizer(GGMLType.Q4_1)
def dequantize_q4_1(blocks):
    """block_q4_1 (20 B): d f16 | m f16 | qs[16].   x[j] = nibble_j * d + m"""
    d, m = f16_field(blocks, 0), f16_field(blocks, 2)
    q = split_nibbles(blocks[:, 4:20]).astype(np.float32)
    return add(mul(q, d), m)


@quantizer(GGMLType.Q4_1, "ref")
def quantize_q4_1(x):
    """d = (max - min) / 15; q = min(15, (int8)((x - min)/d + 0.5)); store fl16(d), fl16(min)."""
    mn, mx = _minmax(x)
    with np.errstate(over="ignore", invalid="ignore"):
        d = div(mx - mn, f32(15))
        q = np.minimum(15, c_int8(mul(x - mn, _recip(d)) + f32(0.5)))
    return np.concatenate([f16_bytes(d), f16_bytes(mn), pack_nibbles(q)], axis=1)


# -- Q5_0 ------------------------------------------------------------------------------------------
@dequantizer(GGMLType.Q5_0)
def dequantize_q5_0(blocks):
    """block_q5_0 (22 B): d f16 | qh u32 | qs[16].   q5_j = nibble_j | bit j of qh << 4;  x = (q5 - 16) * d"""
    d = f16_field(blocks, 0)
    q = split_nibbles(blocks[:, 6:22]) | (_qh_bits(u32_fields(blocks, 2, 1)) << 4)
    return mul((q.astype(np.int32) - 16).astype(np.float32), d)


@quantizer(GGMLType.Q5_0, "ref")
def quantize_q5_0(x):
    """d = max / -16; q = min(31, (int8)(x/d + 16.5))."""
    _, mx = signed_absmax(x)
    d = div(mx, f32(-16))
    q = np.minimum(31, c_int8(mul(x, _recip(d)) + f32(16.5))).astype(np.uint8)
    return np.concatenate([f16_bytes(d), _pack_qh(q), pack_nibbles(q & 0x0F)], axis=1)


# -- Q5_1 ------------------------------------------------------------------------------------------
@dequantizer(GGMLType.Q5_1)
def dequantize_q5_1(blocks):
    """block_q5_1 (24 B): d f16 | m f16 | qh u32 | qs[16].   x = q5 * d + m"""
    d, m = f16_field(blocks, 0), f16_field(blocks, 2)
    q = split_nibbles(blocks[:, 8:24]) | (_qh_bits(u32_fields(blocks, 4, 1)) << 4)
    return add(mul(q.astype(np.float32), d), m)


@quantizer(GGMLType.Q5_1, "ref")
def quantize_q5_1(x):
    """d = (max - min) / 31; q = (uint8)((x - min)/d + 0.5) (no clamp)."""
    mn, mx = _minmax(x)
    with np.errstate(over="ignore", invalid="ignore"):
        d = div(mx - mn, f32(31))
        q = c_uint8(mul(x - mn, _recip(d)) + f32(0.5))
    return np.concatenate([f16_bytes(d), f16_bytes(mn), _pack_qh(q), pack_nibbles(q & 0x0F)], axis=1)


# -- Q8_0 ------------------------------------------------------------------------------------------
@dequantizer(GGMLType.Q8_0)
def dequantize_q8_0(blocks):
    """block_q8_0 (34 B): d f16 | qs[32] int8.   x = q * d"""
    d = f16_field(blocks, 0)
    return mul(blocks[:, 2:34].view(np.int8).astype(np.float32), d)


@quantizer(GGMLType.Q8_0, "ref")
def quantize_q8_0(x):
    """d = amax / 127; q = roundf(x / d) (half away from zero)."""
    d = div(_amax(x), f32(127))
    q = c_int8(roundf(mul(x, _recip(d))))
    return np.concatenate([f16_bytes(d), q.astype(np.int8).view(np.uint8)], axis=1)


def _q8_cpu(x):
    """x86 AVX/AVX2 `quantize_row_q8_0/1`: id = amax ? 127/amax : 0, round half even, saturate to int8."""
    amax = _amax(x)
    d = div(amax, f32(127))
    idv = np.where(amax != 0, div(f32(127), amax), f32(0)).astype(np.float32)
    q32 = cvt_i32_rne(mul(x, idv))                 # _mm256_round_ps + _mm256_cvtps_epi32
    return d, q32, np.clip(q32, -128, 127)         # packs_epi32 / packs_epi16 saturate


@quantizer(GGMLType.Q8_0, "cpu")
def quantize_q8_0_cpu(x):
    d, _, q = _q8_cpu(x)
    return np.concatenate([f16_bytes(d), q.astype(np.int8).view(np.uint8)], axis=1)


# -- Q8_1 ------------------------------------------------------------------------------------------
@dequantizer(GGMLType.Q8_1)
def dequantize_q8_1(blocks):
    """block_q8_1 (36 B): d f16 | s f16 | qs[32] int8.   x = q * d  (s = d * Σq is for vec_dot only;
    ggml has no Q8_1 `to_float`, this is the value its dot products use)"""
    d = f16_field(blocks, 0)
    return mul(blocks[:, 4:36].view(np.int8).astype(np.float32), d)


@quantizer(GGMLType.Q8_1, "ref")
def quantize_q8_1(x):
    """As Q8_0's reference, plus s = fl16(Σq * d) (Σ of the stored int8 values, d unrounded f32)."""
    d = div(_amax(x), f32(127))
    q = c_int8(roundf(mul(x, _recip(d))))
    s = mul(np.sum(q, axis=1, keepdims=True).astype(np.float32), d)
    return np.concatenate([f16_bytes(d), f16_bytes(s), q.astype(np.int8).view(np.uint8)], axis=1)


@quantizer(GGMLType.Q8_1, "cpu")
def quantize_q8_1_cpu(x):
    """x86 AVX2: s = fl16(d * Σ of the int32 values before saturation, wrapping like int32)."""
    d, q32, q = _q8_cpu(x)
    tot = np.sum(q32, axis=1, keepdims=True)
    tot = ((tot + 2**31) % 2**32 - 2**31).astype(np.int32)
    s = mul(d, tot.astype(np.float32))
    return np.concatenate([f16_bytes(d), f16_bytes(s), q.astype(np.int8).view(np.uint8)], axis=1)


# -- Q1_0 ------------------------------------------------------------------------------------------
@dequantizer(GGMLType.Q1_0)
def dequantize_q1_0(blocks):
    """block_q1_0 (18 B, 128 elements): d f16 | qs[16]; element j is bit j%8 of qs[j/8]: x = bit ? d : -d"""
    d = f16_field(blocks, 0)
    bits = np.unpackbits(blocks[:, 2:18], axis=1, bitorder="little").astype(bool)
    return np.where(bits, d, -d).astype(np.float32)


@quantizer(GGMLType.Q1_0, "ref")
def quantize_q1_0(x):
    """d = (Σ|x|, sequential f32) / 128; bit j = (x_j >= 0)."""
    d = div(seq_sum(np.abs(x)), f32(128))
    bits = np.packbits(x >= 0, axis=1, bitorder="little")
    return np.concatenate([f16_bytes(d), bits], axis=1)
