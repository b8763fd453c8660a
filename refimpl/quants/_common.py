"""Scalar helpers shared by the block formats: field access, f16/bf16, ggml's rounding primitives.

Every quantizer in this package computes in float32, one NumPy operation per C operation, in the order
ggml's reference code (`src/ggml-quants.c`) performs it, so that each intermediate is rounded exactly
where ggml rounds it. Sums that ggml accumulates sequentially are accumulated element by element here
too (`seq_sum`): NumPy's pairwise `np.sum` would round differently.
"""
from __future__ import annotations

import numpy as np

f32 = np.float32


def u8(blocks: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Bytes [start, stop) of every block, (n, stop-start) uint8."""
    return blocks[:, start:stop]


def f16_field(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The little-endian f16 at byte `offset` of every block, widened to f32 (exact), shape (n, 1)."""
    b = np.ascontiguousarray(blocks[:, offset:offset + 2])
    return b.view("<f2").astype(np.float32)


def u16_fields(blocks: np.ndarray, start: int, count: int) -> np.ndarray:
    """`count` little-endian uint16 starting at byte `start`, (n, count) uint16."""
    return np.ascontiguousarray(blocks[:, start:start + 2 * count]).view("<u2")


def u32_fields(blocks: np.ndarray, start: int, count: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[:, start:start + 4 * count]).view("<u4")


def f16_bytes(v: np.ndarray) -> np.ndarray:
    """fl16(v) as two little-endian bytes per value: (n,) or (n, 1) f32 -> (n, 2) uint8 (round to nearest even)."""
    return np.ascontiguousarray(np.asarray(v, np.float32).reshape(-1).astype("<f2")).view(np.uint8).reshape(-1, 2)


def fl16(v):
    """Round to f16 and back (ggml's GGML_FP32_TO_FP16 followed by GGML_FP16_TO_FP32)."""
    return np.asarray(v, np.float32).astype(np.float16).astype(np.float32)


def nearest(v: np.ndarray) -> np.ndarray:
    """ggml's `nearest_int`: round half to even (the 1.5*2^23 trick), as int32."""
    return np.rint(v).astype(np.int32)


def roundf(v: np.ndarray) -> np.ndarray:
    """C `roundf`: round half away from zero, exact for every f32 (v - trunc(v) is exact)."""
    v = np.asarray(v, np.float32)
    t = np.trunc(v)
    frac = np.abs(v - t)
    return np.where(frac >= f32(0.5), t + np.copysign(f32(1.0), v), t).astype(np.float32)


def trunc_int(v: np.ndarray) -> np.ndarray:
    """C float -> integer conversion: truncation toward zero, as int32."""
    return np.trunc(v).astype(np.int32)


def safe_recip(d: np.ndarray) -> np.ndarray:
    """`d ? 1.0f/d : 0.0f` in f32, without warnings for d == 0."""
    d = np.asarray(d, np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = f32(1.0) / d
    return np.where(d != 0, r, f32(0.0)).astype(np.float32)


def signed_absmax(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(amax, max) per row: amax = max|x|, max = the signed value at the first index reaching it."""
    a = np.abs(x)
    i = np.argmax(a, axis=-1)          # first index of the maximum, like ggml's strict '>' scan
    mx = np.take_along_axis(x, i[..., None], axis=-1)
    return np.take_along_axis(a, i[..., None], axis=-1), mx


def seq_sum(terms: np.ndarray, axis: int = -1) -> np.ndarray:
    """Σ in f32, sequentially in index order along `axis` (ggml's `for` loop), keepdims."""
    terms = np.moveaxis(np.asarray(terms, np.float32), axis, -1)
    acc = np.zeros(terms.shape[:-1], np.float32)
    for i in range(terms.shape[-1]):
        acc = acc + terms[..., i]
    return acc[..., None] if axis in (-1, terms.ndim - 1) else np.expand_dims(acc, axis)


def split_nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16) bytes -> (n, 32) values: low nibbles are elements 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 32) values 0..15 -> (n, 16) bytes, the inverse of `split_nibbles`."""
    q = q.astype(np.uint8)
    return q[:, :16] | (q[:, 16:] << 4)
