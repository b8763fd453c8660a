"""F32, F16 and BF16 as one-element "blocks", so a QTensor can hold any ggml type.

BF16 (2 B): the upper 16 bits of an f32. ggml's `GGML_FP32_TO_BF16`: NaN -> (bits >> 16) | 0x40 (quieted),
otherwise round to nearest even on the upper half, `(bits + 0x7FFF + ((bits >> 16) & 1)) >> 16`;
subnormals are kept (no flush to zero). Decode: `bits << 16`, exact.
F16 (2 B): IEEE binary16, round to nearest even (NumPy's conversion is ggml's, NaN payloads aside).
"""
from __future__ import annotations

import numpy as np

from ..types import GGMLType
from .registry import dequantizer, quantizer
from ._common import blockwise, f16_bits, output


@dequantizer(GGMLType.F32)
def dequantize_f32(blocks, out=None):
    out = output(blocks, 1, out)
    out[...] = blocks.view("<f4")
    return out


@quantizer(GGMLType.F32, "ref")
def quantize_f32(x):
    return np.ascontiguousarray(x, dtype="<f4").view(np.uint8)


@dequantizer(GGMLType.F16)
def dequantize_f16(blocks, out=None):
    """IEEE half -> f32, exact; a signalling NaN comes out quiet (GGML_FP16_TO_FP32 on x86)."""
    out = output(blocks, 1, out)
    out[...] = blocks.view("<f2")
    nan = np.isnan(out)
    if nan.any():
        out.view(np.uint32)[nan] |= np.uint32(0x00400000)
    return out


@quantizer(GGMLType.F16, "ref")
def quantize_f16(x):
    return np.ascontiguousarray(f16_bits(x)).view(np.uint8)


@dequantizer(GGMLType.BF16)
def dequantize_bf16(blocks, out=None):
    """bits << 16."""
    out = output(blocks, 1, out)
    bits = out.view(np.uint32)
    bits[...] = blocks.view("<u2")
    bits <<= 16
    return out


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """GGML_FP32_TO_BF16 as '<u2': (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16, NaN -> (bits >> 16) | 0x40.

    The sum is taken in uint32: it can only wrap for NaN bit patterns, which are replaced.
    """
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    r = bits >> 16
    r &= 1
    r += bits
    r += 0x7FFF
    r >>= 16
    out = r.astype("<u2")
    nan = np.isnan(x)
    if nan.any():
        out[nan] = (bits[nan] >> 16) | 0x40
    return out


@quantizer(GGMLType.BF16, "ref")
@blockwise
def quantize_bf16(x):
    return f32_to_bf16_bits(np.asarray(x, np.float32)).view(np.uint8)
