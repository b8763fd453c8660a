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


def f16_to_f32(h: np.ndarray) -> np.ndarray:
    """ggml's f16 -> f32 (`GGML_FP16_TO_FP32`): exact, except that a signalling NaN comes out quiet."""
    out = np.asarray(h, "<f2").astype(np.float32)
    nan = np.isnan(out)
    if nan.any():
        out = np.where(nan, (out.view(np.uint32) | np.uint32(0x00400000)).view(np.float32), out)
    return out


def f16_field(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The little-endian f16 at byte `offset` of every block, as f32 (`f16_to_f32`), shape (n, 1)."""
    return f16_to_f32(np.ascontiguousarray(blocks[:, offset:offset + 2]).view("<f2"))


def u16_fields(blocks: np.ndarray, start: int, count: int) -> np.ndarray:
    """`count` little-endian uint16 starting at byte `start`, (n, count) uint16."""
    return np.ascontiguousarray(blocks[:, start:start + 2 * count]).view("<u2")


def u32_fields(blocks: np.ndarray, start: int, count: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[:, start:start + 4 * count]).view("<u4")


def f16_bits(v) -> np.ndarray:
    """ggml's f32 -> f16 (`GGML_FP32_TO_FP16`): round to nearest even, overflow to inf, and every NaN
    to the quiet NaN 0x7E00 carrying the input's sign. Returns '<u2'."""
    v = np.asarray(v, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        bits = v.astype("<f2").view("<u2")
    nan = np.isnan(v)
    if nan.any():
        bits = np.where(nan, (np.signbit(v).astype(np.uint16) << 15) | 0x7E00, bits).astype("<u2")
    return bits


def f16_bytes(v) -> np.ndarray:
    """fl16(v) as two little-endian bytes per value: (n,) or (n, 1) f32 -> (n, 2) uint8."""
    return np.ascontiguousarray(f16_bits(np.asarray(v, np.float32).reshape(-1))).view(np.uint8).reshape(-1, 2)


def fl16(v):
    """Round to f16 and back (ggml's GGML_FP32_TO_FP16 followed by GGML_FP16_TO_FP32)."""
    return np.asarray(v, np.float32).astype(np.float16).astype(np.float32)


def nearest(v: np.ndarray) -> np.ndarray:
    """ggml's `nearest_int`: round half to even (the 1.5*2^23 trick), as int32."""
    return np.rint(v).astype(np.int32)


def roundf(v: np.ndarray) -> np.ndarray:
    """C `roundf`: round half away from zero. np.rint rounds ties to even; the ties (v - rint(v) exactly
    ±0.5, an exact f32 difference) that went toward zero are moved one away."""
    v = np.asarray(v, np.float32)
    r = np.rint(v)
    with np.errstate(invalid="ignore"):
        d = v - r
        tie = np.abs(d) == np.float32(0.5)
    if tie.any():
        fix = tie & ((d > 0) == (v > 0))
        r = np.where(fix, r + np.float32(2) * d, r).astype(np.float32)
    return r


def trunc_int(v: np.ndarray) -> np.ndarray:
    """C float -> integer conversion: truncation toward zero, as int32."""
    return np.trunc(v).astype(np.int32)


def safe_recip(d: np.ndarray) -> np.ndarray:
    """`d ? 1.0f/d : 0.0f` in f32, without warnings for d == 0."""
    d = np.asarray(d, np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = f32(1.0) / d
    return np.where(d != 0, r, f32(0.0)).astype(np.float32)


def _first_extreme(x: np.ndarray, a: np.ndarray, arg) -> np.ndarray:
    """x at the first index where `a` reaches its extreme (`arg` = np.argmax / np.argmin), keepdims;
    NaN in `a` is never chosen (rows holding one take a slow exact path)."""
    i = arg(a, axis=-1)[..., None]
    pick = np.take_along_axis(a, i, axis=-1)
    bad = np.isnan(pick)
    if bad.any():
        rows = np.nonzero(bad[..., 0])
        fill = -np.inf if arg is np.argmax else np.inf
        sub = np.where(np.isnan(a[rows]), fill, a[rows])
        i[rows] = arg(sub, axis=-1)[..., None]
    return np.take_along_axis(x, i, axis=-1)


def signed_absmax(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(amax, max) along the last axis, keepdims, as ggml's scan `if (amax < fabsf(v)) {amax = |v|; max = v;}`.

    amax starts at 0: the first index with the largest |x| wins, an all-zero block gives max = +0.0
    (never -0.0), and NaN never wins (its comparison is false).
    """
    a = np.abs(x)
    mx = _first_extreme(x, a, np.argmax)
    amax = np.abs(mx)
    amax = np.where(np.isnan(amax), np.float32(0), amax).astype(np.float32)   # all-NaN block
    return amax, np.where(amax > 0, mx, np.float32(0.0)).astype(np.float32)


def first_min_max(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's scan `if (v < min) min = v; if (v > max) max = v;` (keepdims): the first index attaining
    each extreme wins, so a zero extreme keeps the sign of its first occurrence; NaN is never taken."""
    return _first_extreme(x, x, np.argmin), _first_extreme(x, x, np.argmax)


def seq_sum(terms: np.ndarray, axis: int = -1) -> np.ndarray:
    """Σ in f32, sequentially in index order along `axis` (ggml's `for` loop), keepdims."""
    terms = np.moveaxis(np.asarray(terms, np.float32), axis, -1)
    acc = np.zeros(terms.shape[:-1], np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
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


# -- C conversions on x86-64 (what ggml's compiled code does, including the undefined cases) ---------

_INT_MIN = np.int64(-(2**31))


def cvtt_i32(v: np.ndarray) -> np.ndarray:
    """x86 `cvttss2si`: truncate f32 to int32; NaN, ±inf and out-of-range give INT_MIN (0x80000000).

    This is what GCC emits for C float -> int / int8_t / uint8_t casts; a narrower cast then keeps the
    low byte. Inputs that land here are ones where ggml's C is formally undefined (1/d overflowing to
    inf for subnormal blocks), and refimpl reproduces the bytes ggml's x86 build writes for them.
    """
    v = np.asarray(v, np.float32)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(v) & (np.abs(v) < np.float32(2.0**31))
        t = np.where(ok, np.trunc(np.where(ok, v, 0)), 0).astype(np.int64)
    return np.where(ok, t, _INT_MIN)


def _in_range(v: np.ndarray, lo: float, hi: float) -> bool:
    """All of v strictly inside (lo, hi) (False if any NaN)."""
    return v.size == 0 or bool(v.min() > lo and v.max() < hi)


def c_int8(v: np.ndarray) -> np.ndarray:
    """C `(int8_t)f` on x86-64 (cvttss2si, keep the low byte), as int8."""
    if _in_range(v, -129.0, 128.0):
        return v.astype(np.int8)
    return (cvtt_i32(v) & 0xFF).astype(np.uint8).view(np.int8)


def c_uint8(v: np.ndarray) -> np.ndarray:
    """C `(uint8_t)f` on x86-64, as uint8."""
    if _in_range(v, -1.0, 256.0):
        return v.astype(np.uint8)
    return (cvtt_i32(v) & 0xFF).astype(np.uint8)


def cvt_i32_rne(v: np.ndarray) -> np.ndarray:
    """x86 `cvtps2dq` (round to nearest even): NaN/inf/out of range -> INT_MIN, as int64."""
    v = np.asarray(v, np.float32)
    if _in_range(v, -2.0**31, 2.0**31):
        return np.rint(v).astype(np.int64)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(v) & (np.abs(v) < np.float32(2.0**31))
        r = np.where(ok, np.rint(np.where(ok, v, 0)), 0).astype(np.int64)
    return np.where(ok, r, _INT_MIN)


def div(a, b) -> np.ndarray:
    """f32 a / b with IEEE results (inf, nan) and no warnings."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.divide(np.float32(a) if np.isscalar(a) else a, np.float32(b) if np.isscalar(b) else b,
                         dtype=np.float32)


def mul(a, b) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        return np.multiply(a, b, dtype=np.float32)


def add(a, b) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return np.add(a, b, dtype=np.float32)


# -- fast reductions over the short last axis of a block array -------------------------------------
# NumPy reduces (n, 32) arrays along axis 1 slowly (one short inner loop per row); halving the row
# with element-wise ops is 5-10x faster and, for max/min, gives exactly the same values.

def tree(op, a: np.ndarray) -> np.ndarray:
    """op-reduce the last axis by repeated halving (keepdims). op must be associative and exact (max/min)."""
    while a.shape[-1] > 1:
        n = a.shape[-1]
        if n % 2:
            a = np.concatenate([op(a[..., : n // 2], a[..., n // 2: n - 1]), a[..., n - 1:]], axis=-1)
        else:
            a = op(a[..., : n // 2], a[..., n // 2:])
    return a


def first_where(mask: np.ndarray) -> np.ndarray:
    """Index of the first True along the last axis (keepdims; n if none), as intp."""
    n = mask.shape[-1]
    idx = np.where(mask, np.arange(n, dtype=np.int32), np.int32(n))
    return tree(np.minimum, idx).astype(np.intp)


def take_first(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    i = np.minimum(first_where(mask), x.shape[-1] - 1)
    return np.take_along_axis(x, i, axis=-1)
