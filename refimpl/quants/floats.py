"""F32, F16 and BF16 as one-element "blocks", so a QTensor can hold any ggml type.

BF16 (2 B): the upper 16 bits of an f32. ggml's `GGML_FP32_TO_BF16`: NaN -> (bits >> 16) | 0x40 (quieted),
otherwise round to nearest even on the upper half, `(bits + 0x7FFF + ((bits >> 16) & 1)) >> 16`;
subnormals are kept (no flush to zero). Decode: `bits << 16`, exact.
F16 (2 B): IEEE binary16, round to nearest even (NumPy's conversion is ggml's, NaN payloads aside).
"""
from __future__ import annotations

import numpy as np

from ..types import GGMLType
from . import dequantizer, quantizer
from ._common import f16_bits, f16_to_f32


@dequantizer(GGMLType.F32)
def dequantize_f32(blocks):
    return np.ascontiguousarray(blocks).view("<f4").astype(np.float32)


@quantizer(GGMLType.F32, "ref")
def quantize_f32(x):
    return np.ascontiguousarray(x, dtype="<f4").view(np.uint8)


@dequantizer(GGMLType.F16)
def dequantize_f16(blocks):
    return f16_to_f32(np.ascontiguousarray(blocks).view("<f2"))


@quantizer(GGMLType.F16, "ref")
def quantize_f16(x):
    return np.ascontiguousarray(f16_bits(x)).view(np.uint8)


@dequantizer(GGMLType.BF16)
def dequantize_bf16(blocks):
    bits = np.ascontiguousarray(blocks).view("<u2").astype(np.uint32) << 16
    return bits.view(np.float32)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = ((bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    quiet = ((bits >> 16) | 0x40).astype(np.uint16)
    return np.where(np.isnan(x), quiet, rounded).astype("<u2")


@quantizer(GGMLType.BF16, "ref")
def quantize_bf16(x):
    return np.ascontiguousarray(f32_to_bf16_bits(np.asarray(x, np.float32))).view(np.uint8)
