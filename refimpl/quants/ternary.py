"""Ternary formats TQ1_0 and TQ2_0 (256 elements, values t in {-1, 0, 1} times one f16 scale)."""
from __future__ import annotations

import numpy as np

from ..types import GGMLType
from . import dequantizer, quantizer
from ._common import cvtt_i32, div, f16_bytes, f16_field, mul, roundf

f32 = np.float32
_POW3 = np.array([1, 3, 9, 27, 81], np.int32)


def _trits(x: np.ndarray) -> np.ndarray:
    """t + 1 = lroundf(x / amax) + 1 in 0..2, with id = amax ? 1/amax : 0 (and what x86 glibc returns for
    the overflowing id of a subnormal block: lroundf(±inf or nan) = LONG_MIN, whose low int32 + 1 is 1)."""
    amax = np.fmax.reduce(np.abs(x), axis=1, keepdims=True, initial=f32(0))
    idv = np.where(amax != 0, div(f32(1), amax), f32(0)).astype(np.float32)
    v = mul(x, idv)
    r = roundf(np.where(np.isfinite(v), v, 0))
    t = np.where(np.isfinite(v), cvtt_i32(r) + 1, 1)
    return amax, t.astype(np.int32)


# t - 1 of every 2-bit field of every byte value: _TQ2_LUT[b, k] = ((b >> 2k) & 3) - 1
_TQ2_LUT = (((np.arange(256)[:, None] >> (2 * np.arange(4))) & 3) - 1).astype(np.float32)


@dequantizer(GGMLType.TQ2_0)
def dequantize_tq2_0(blocks):
    """block_tq2_0 (66 B): qs[64] | d f16. Element 128g + 32k + m = ((qs[32g+m] >> 2k) & 3) - 1; x = t*d"""
    n = blocks.shape[0]
    d = f16_field(blocks, 64)
    t = _TQ2_LUT[blocks[:, :64]].reshape(n, 2, 32, 4).transpose(0, 1, 3, 2)   # (n, g, k, m)
    return mul(t.reshape(n, 256), d)


@quantizer(GGMLType.TQ2_0, "ref")
def quantize_tq2_0(x):
    """d = amax; t = lroundf(x/d) + 1 packed 2 bits per element at shift 2k."""
    n = x.shape[0]
    amax, t = _trits(x)
    t = (t & 3).reshape(n, 2, 4, 32) << (2 * np.arange(4))[None, None, :, None]
    qs = (t.sum(axis=2) & 0xFF).astype(np.uint8).reshape(n, 64)
    return np.concatenate([qs, f16_bytes(amax)], axis=1)


def _digits(b: np.ndarray, count: int) -> np.ndarray:
    """Base-3 digits of fixed-point bytes: digit n = ((uint8)(b * 3^n) * 3) >> 8. (..., k) -> (..., count, k)"""
    b = b.astype(np.int32)[..., None, :]
    q = (b * _POW3[:count, None]) & 0xFF
    return (q * 3) >> 8


# t - 1 of digit n of every byte value, as ggml decodes it: _TQ1_LUT[b, n]
_TQ1_LUT = (_digits(np.arange(256)[:, None], 5)[:, :, 0] - 1).astype(np.float32)


@dequantizer(GGMLType.TQ1_0)
def dequantize_tq1_0(blocks):
    """block_tq1_0 (54 B): qs[48] | qh[4] | d f16. Five trits per byte as a fraction: byte m of qs[0..32]
    holds elements m + 32n (n = 0..4), of qs[32..48] elements 160 + m + 16n, qh[j] elements 240 + j + 4n."""
    n = blocks.shape[0]
    d = f16_field(blocks, 52)
    a = _TQ1_LUT[blocks[:, 0:32]].transpose(0, 2, 1).reshape(n, 160)
    b = _TQ1_LUT[blocks[:, 32:48]].transpose(0, 2, 1).reshape(n, 80)
    c = _TQ1_LUT[blocks[:, 48:52], :4].transpose(0, 2, 1).reshape(n, 16)
    return mul(np.concatenate([a, b, c], axis=1), d)


def _encode(t: np.ndarray) -> np.ndarray:
    """(..., 5, k) trits 0..2, first most significant -> bytes ceil(q * 256 / 243) (uint8 arithmetic)."""
    q = np.zeros(t.shape[:-2] + t.shape[-1:], np.int32)
    for i in range(t.shape[-2]):
        q = (q * 3 + t[..., i, :]) & 0xFF
    return (((q * 256) + 242) // 243 & 0xFF).astype(np.uint8)


@quantizer(GGMLType.TQ1_0, "ref")
def quantize_tq1_0(x):
    n = x.shape[0]
    amax, t = _trits(x)
    a = _encode(t[:, 0:160].reshape(n, 5, 32))
    b = _encode(t[:, 160:240].reshape(n, 5, 16))
    c4 = t[:, 240:256].reshape(n, 4, 4)
    c = _encode(np.concatenate([c4, np.zeros((n, 1, 4), np.int32)], axis=1))  # 4 trits, shifted by *3
    return np.concatenate([a, b, c, f16_bytes(amax)], axis=1)
