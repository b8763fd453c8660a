"""Ternary formats TQ1_0 and TQ2_0 (256 elements, values t in {-1, 0, 1} times one f16 scale)."""
from __future__ import annotations

import numpy as np

from ..types import GGMLType
from .registry import dequantizer, quantizer
from ._common import (add_half_away, blockwise, c_int8, div, f16_field, max_abs, output, pack_fields, put_f16,
                      unpack_fields)

f32 = np.float32
_POW3 = np.array([1, 3, 9, 27, 81], np.uint8)


def _trits(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(amax, t + 1) with t + 1 = lroundf(x / amax) + 1 in 0..2 (uint8), id = amax ? 1/amax : 0
    (amax = MAX(amax, |x|) from 0: NaN when the block ends in NaN, and then id is NaN too).

    lroundf(v) is the truncation of v + copysign(0.49999997f, v) (see `_common.roundf`). For the
    overflowing id of a subnormal block x86 glibc's lroundf(±inf or nan) is LONG_MIN, whose low int32
    + 1 is 1 -- and so is the low byte of cvttss2si's INT_MIN (`c_int8`) + 1.
    """
    amax = max_abs(x)
    idv = np.where(amax != 0, div(f32(1), amax), f32(0))
    with np.errstate(invalid="ignore", over="ignore"):
        v = x * idv
    t = c_int8(add_half_away(v)).view(np.uint8)
    t += 1
    return amax, t


@dequantizer(GGMLType.TQ2_0)
def dequantize_tq2_0(blocks, out=None):
    """block_tq2_0 (66 B): qs[64] | d f16. Element 128g + 32k + m = ((qs[32g+m] >> 2k) & 3) - 1; x = t*d"""
    out = output(blocks, 256, out)
    n = blocks.shape[0]
    t = unpack_fields(blocks[:, :64], 2)                                          # (n, g, k, m)
    t -= 1                                                                       # 255 for -1: as int8
    out[...] = t.view(np.int8).reshape(n, 256)
    out *= f16_field(blocks, 64)
    return out


@quantizer(GGMLType.TQ2_0, "ref")
@blockwise
def quantize_tq2_0(x):
    """d = amax; t = lroundf(x/d) + 1 packed 2 bits per element at shift 2k."""
    n = x.shape[0]
    amax, t = _trits(x)
    out = np.empty((n, 66), np.uint8)
    out[:, :64] = pack_fields(t.reshape(n, 2, 4, 32), 2)             # t & 3 at shift 2k of qs[32g + m]
    put_f16(out, 64, amax)
    return out


# t - 1 of the five trits of every byte b, as ggml decodes them: digit n = ((uint8)(b * 3^n) * 3) >> 8
_TQ1_LUT = (((((np.arange(256)[:, None] * _POW3) & 0xFF) * 3) >> 8) - 1).astype(np.float32)    # (256, 5)


def _tq1_values(dst, b, count: int):
    """dst (n, count, k) f32 <- digits 0..count-1, minus 1, of the bytes b (n, k): one 5-value table row
    per byte, gathered, then laid out digit-major."""
    dst[...] = np.take(_TQ1_LUT[:, :count], b, axis=0, mode="clip").transpose(0, 2, 1)


@dequantizer(GGMLType.TQ1_0)
def dequantize_tq1_0(blocks, out=None):
    """block_tq1_0 (54 B): qs[48] | qh[4] | d f16. Five trits per byte as a fraction: byte m of qs[0..32]
    holds elements m + 32n (n = 0..4), of qs[32..48] elements 160 + m + 16n, qh[j] elements 240 + j + 4n."""
    out = output(blocks, 256, out)
    n = blocks.shape[0]
    _tq1_values(out[:, 0:160].reshape(n, 5, 32), blocks[:, 0:32], 5)
    _tq1_values(out[:, 160:240].reshape(n, 5, 16), blocks[:, 32:48], 5)
    _tq1_values(out[:, 240:256].reshape(n, 4, 4), blocks[:, 48:52], 4)
    out *= f16_field(blocks, 52)
    return out


# (uint8)ceil(q * 256 / 243) for every byte q, as ggml computes it: ((uint16_t)q * 256 + 242) / 243
_TQ1_ENCODE = ((np.arange(256) * 256 + 242) // 243 & 0xFF).astype(np.uint8)


def _encode(t: np.ndarray) -> np.ndarray:
    """(..., 5, k) trits 0..2, first most significant -> bytes ceil(q * 256 / 243) (uint8 arithmetic)."""
    q = np.zeros(t.shape[:-2] + t.shape[-1:], np.uint8)
    for i in range(t.shape[-2]):
        q *= 3
        q += t[..., i, :]
    return np.take(_TQ1_ENCODE, q, mode="clip")


@quantizer(GGMLType.TQ1_0, "ref")
@blockwise
def quantize_tq1_0(x):
    """d = amax; trits t = lroundf(x/d) + 1, five per byte (four in qh) in the layout of
    `dequantize_tq1_0`, each byte ceil(q * 256 / 243) of its base-3 number q."""
    n = x.shape[0]
    amax, t = _trits(x)
    out = np.empty((n, 54), np.uint8)
    out[:, 0:32] = _encode(t[:, 0:160].reshape(n, 5, 32))
    out[:, 32:48] = _encode(t[:, 160:240].reshape(n, 5, 16))
    c4 = t[:, 240:256].reshape(n, 4, 4)
    out[:, 48:52] = _encode(np.concatenate([c4, np.zeros((n, 1, 4), np.uint8)], axis=1))  # 4 trits, shifted by *3
    put_f16(out, 52, amax)
    return out
