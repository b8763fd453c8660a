"""Scalar helpers shared by the block formats: field access, f16/bf16, ggml's rounding primitives.

Every quantizer in this package computes in float32, one NumPy operation per C operation, in the order
ggml's reference code (`src/ggml-quants.c`) performs it, so that each intermediate is rounded exactly
where ggml rounds it. Sums that ggml accumulates sequentially are accumulated element by element here
too (`seq_sum`): NumPy's pairwise `np.sum` would round differently.

Speed without changing a bit (the conventions every format module follows):

* Work in chunks of about `CHUNK` elements: `refimpl.dequantize` hands each dequantizer slices of
  blocks together with the matching slice of the output (`out`), and quantizers are wrapped in
  `blockwise`. Temporaries then stay in the CPU cache and are recycled instead of page-faulted in.
* Write results into preallocated arrays (`out[...] = q; out *= d`) rather than building them with
  `np.concatenate`; an in-place `*=` is the same f32 multiply as `*`.
* Reduce a block's elements by combining neighbours over the flat array (`pairwise`): NumPy reduces
  the short last axis of an (n, 32) array one row at a time, which is several times slower.
* Do byte arithmetic (nibbles, bit planes) in uint8/int8 and convert to f32 once.
"""
from __future__ import annotations

import functools

import numpy as np

from ..rounding import f16_bits, f16_to_f32  # noqa: F401  (core; the formats use them)

f32 = np.float32
FLT_MAX = np.float32(np.finfo(np.float32).max)
CHUNK = 1 << 17          # elements per step of a dequantizer or a `blockwise` quantizer (512 KiB of f32)


# -- chunked work ------------------------------------------------------------------------------------

def output(blocks: np.ndarray, blck_size: int, out: np.ndarray | None = None) -> np.ndarray:
    """The (n_blocks, blck_size) f32 array a dequantizer fills: `out` when the caller passed one
    (`refimpl.dequantize` does, a slice of its result), else a new one."""
    return np.empty((blocks.shape[0], blck_size), np.float32) if out is None else out


def blockwise(fn):
    """Run a block quantizer `fn` (n, blck) f32 -> (n, type_size) uint8 on CHUNK elements at a time.

    Only for quantizers whose blocks are independent (every ggml reference quantizer except
    IQ4_NL's, which reuses the previous block's levels): the bytes are the same, the memory is bounded
    and the temporaries stay in cache. The unwrapped function is `.reference`.
    """
    @functools.wraps(fn)
    def run(x):
        n = x.shape[0]
        step = max(1, CHUNK // max(1, x.shape[1]))
        if n <= step:
            return fn(x)
        first = fn(x[:step])
        out = np.empty((n, first.shape[1]), np.uint8)
        out[:step] = first
        for i in range(step, n, step):
            out[i:i + step] = fn(x[i:i + step])
        return out
    run.reference = fn
    return run


def u8(blocks: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Bytes [start, stop) of every block, (n, stop-start) uint8."""
    return blocks[:, start:stop]


def f16_field(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The little-endian f16 at byte `offset` of every block, as f32 (`f16_to_f32`), shape (n, 1)."""
    return f16_to_f32(blocks[:, offset:offset + 2].view("<f2"))


def u16_fields(blocks: np.ndarray, start: int, count: int) -> np.ndarray:
    """`count` little-endian uint16 starting at byte `start`, (n, count) uint16 (a view of the bytes)."""
    return blocks[:, start:start + 2 * count].view("<u2")


def u32_fields(blocks: np.ndarray, start: int, count: int) -> np.ndarray:
    return blocks[:, start:start + 4 * count].view("<u4")


def f16_bytes(v) -> np.ndarray:
    """fl16(v) as two little-endian bytes per value: (n,) or (n, 1) f32 -> (n, 2) uint8."""
    return np.ascontiguousarray(f16_bits(np.asarray(v, np.float32).reshape(-1))).view(np.uint8).reshape(-1, 2)


def put_f16(blocks: np.ndarray, offset: int, v) -> None:
    """Store fl16(v) (`f16_bits`; v (n,) or (n, 1)) as the little-endian f16 at byte `offset` of every
    block of the uint8 block array `blocks` (n, type_size)."""
    blocks[:, offset:offset + 2].view("<u2")[:, 0] = f16_bits(v).reshape(-1)


def fl16(v):
    """Round to f16 and back (ggml's GGML_FP32_TO_FP16 followed by GGML_FP16_TO_FP32)."""
    return np.asarray(v, np.float32).astype(np.float16).astype(np.float32)


def nearest_int(v) -> np.ndarray:
    """ggml's `nearest_int`: add 1.5*2^23 in f32, keep the low 23 bits, subtract 2^22. int32.

    Round half to even for |v| < 2^22 (= np.rint); beyond that the C trick wraps, ±inf gives -2^22 and
    ggml's default NaN gives 0, and so does this.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        t = np.add(v, f32(12582912.0), dtype=np.float32)
    t = t.view(np.int32)
    t &= 0x007FFFFF
    t -= 0x00400000
    return t


nearest = nearest_int          # the name this helper had before kquants' exact version moved here

JUST_BELOW_HALF = np.nextafter(f32(0.5), f32(0))      # 0.49999997f
_SIGN = np.uint32(0x80000000)


def add_half_away(v: np.ndarray) -> np.ndarray:
    """v += copysign(0.49999997f, v) in place (v a writable f32 array; returned): its truncation is now
    roundf of the old v (see `roundf`). The copysign is done on the bits (np.copysign is slow)."""
    s = v.view(np.uint32) & _SIGN
    s |= JUST_BELOW_HALF.view(np.uint32)
    with np.errstate(invalid="ignore", over="ignore"):
        v += s.view(np.float32)
    return v


def roundf(v: np.ndarray) -> np.ndarray:
    """C `roundf`: round half away from zero, as trunc(v + copysign(0.49999997f, v)).

    The f32 sum rounds exactly so that its truncation is roundf(v) (checked for all 2^32 floats: a
    fraction below 0.5 stays below the next integer, 0.5 itself reaches it, and the spacing of floats
    >= 2^23 absorbs the addend); ±0, ±inf and NaN come through unchanged. Because a C float -> int cast
    truncates too, `c_int8(add_half_away(v))` is `(int8_t)roundf(v)` without the trunc.
    """
    r = add_half_away(np.array(v, np.float32))
    return np.trunc(r, out=r)


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
    """(amax, max) along the last axis, keepdims, as ggml's scan `if (amax < fabsf(v)) {amax = |v|; max = v;}`.

    amax starts at 0: the first index with the largest |x| wins, an all-zero block gives max = +0.0
    (never -0.0), and NaN never wins (its comparison is false).

    From the block's max and min (NaN-skipping `pairwise` reductions): the one of larger magnitude is
    `max`; only a block holding both +a and -a (a = amax) needs the first index, found row by row.
    """
    hi, lo = pairwise(np.fmax, x), pairwise(np.fmin, x)        # NaN only for an all-NaN block
    neg = np.negative(lo)
    with np.errstate(invalid="ignore"):
        mx = np.where(hi >= neg, hi, lo)
        tie = hi == neg                                        # +a and -a both in the block (or a = 0)
    if tie.any():
        rows = np.nonzero(tie[:, 0] & (hi[:, 0] > 0))[0]
        sub = x[rows]
        j = np.argmax(np.abs(sub) == hi[rows], axis=-1)
        mx[rows, 0] = sub[np.arange(len(rows)), j]
    amax = np.fmax(np.abs(mx), f32(0))                        # all-NaN block: nothing taken, 0
    return amax, np.where(amax > 0, mx, f32(0.0))


def max_abs(x: np.ndarray) -> np.ndarray:
    """ggml's `amax = 0; for each v: amax = MAX(amax, fabsf(v));` over the last axis (n, k), keepdims.

    MAX(a, b) is `a > b ? a : b`, so a NaN replaces the running value and the next element replaces
    the NaN: amax is the largest |v| after the block's last NaN, or NaN when the block ends in one.
    Without NaN that is max |x| (from the NaN-propagating `pairwise` maximum; NaN rows are redone).
    """
    a = np.abs(x)
    amax = pairwise(np.maximum, a)
    rows = np.nonzero(np.isnan(amax[:, 0]))[0]
    if len(rows):
        sub = a[rows]
        k = sub.shape[1]
        last = k - 1 - np.argmax(np.isnan(sub[:, ::-1]), axis=1)          # index of the last NaN
        after = np.arange(k) > last[:, None]
        tail = np.max(np.where(after, sub, f32(0)), axis=1)
        amax[rows, 0] = np.where(last == k - 1, np.nan, tail)
    return amax


def _first_zero(x: np.ndarray, v: np.ndarray) -> np.ndarray:
    """v (n, 1) with each zero replaced by the first zero (±0.0) of its row of x: the sign a C scan keeps."""
    rows = np.nonzero(v[:, 0] == 0)[0]
    if len(rows):
        sub = x[rows]
        v[rows, 0] = sub[np.arange(len(rows)), np.argmax(sub == 0, axis=-1)]
    return v


def first_min_max(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's scan `min = FLT_MAX; max = -FLT_MAX; for each v: if (v < min) min = v; if (v > max) max = v;`
    (keepdims). NaN is never taken (an all-NaN block keeps FLT_MAX / -FLT_MAX, a block of +inf keeps
    min = FLT_MAX), and the first index attaining each extreme wins, so a zero extreme keeps the sign of
    its first occurrence."""
    mn = np.fmin(pairwise(np.fmin, x), FLT_MAX)
    mx = np.fmax(pairwise(np.fmax, x), -FLT_MAX)
    return _first_zero(x, mn), _first_zero(x, mx)


def seq_sum(terms: np.ndarray, axis: int = -1, keepdims: bool = True) -> np.ndarray:
    """Σ in f32 along `axis`, sequentially from +0 in index order (ggml's `for` loop)."""
    t = np.ascontiguousarray(np.moveaxis(np.asarray(terms, np.float32), axis, 0))   # one slab per term
    acc = np.zeros(t.shape[1:], np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for term in t:
            acc += term
    return np.expand_dims(acc, axis) if keepdims else acc


def split_nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16) bytes -> (n, 32) values: low nibbles are elements 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 32) values 0..15 -> (n, 16) bytes, the inverse of `split_nibbles`."""
    q = q.astype(np.uint8)
    return q[:, :16] | (q[:, 16:] << 4)


def unpack_fields(qs: np.ndarray, bits: int, at: int = 0) -> np.ndarray:
    """The bit fields of 32-byte groups: qs (n, 32*g) uint8 -> (n, g, 8 // bits, 32) uint8 with
    [i, group, k, l] = ((qs[i, 32*group + l] >> bits*k) & (2^bits - 1)) << at  (at + bits <= 8).

    ggml's layout of 2-bit planes (Q2_K, Q3_K, TQ2_0, Q6_K's high bits), bit planes (Q3_K's hmask,
    Q5_K's qh) and nibbles (Q4_K, Q5_K, Q6_K's low bits). Computed on u64 words (eight fields, masked
    per byte so that nothing moves between bytes), one long loop per field; `at` places the field
    where it is OR-ed in (NumPy's uint8 left shift is slow).
    """
    n, groups = qs.shape[0], qs.shape[1] // 32
    per = 8 // bits
    w = np.ascontiguousarray(qs).view("<u8").reshape(n * groups, 4)
    mask = np.uint64((((1 << bits) - 1) << at) * 0x0101010101010101)
    out = np.empty((n * groups, per, 4), "<u8")
    for k in range(per):
        shift = bits * k - at
        moved = w >> np.uint64(shift) if shift >= 0 else w << np.uint64(-shift)
        np.bitwise_and(moved, mask, out=out[:, k])
    return out.view(np.uint8).reshape(n, groups, per, 32)


def pack_fields(q: np.ndarray, bits: int) -> np.ndarray:
    """The inverse of `unpack_fields`: q (n, g, 8 // bits, 32) uint8 fields -> (n, 32*g) bytes
    Σ_k (q[.., k, l] & (2^bits - 1)) << bits*k, on u64 words like `unpack_fields`."""
    n, groups, per = q.shape[:3]
    mask = np.uint64(((1 << bits) - 1) * 0x0101010101010101)
    w = np.ascontiguousarray(q, np.uint8).view("<u8").reshape(n * groups, per, 4)
    p = w[:, 0] & mask
    for k in range(1, per):
        p |= (w[:, k] & mask) << np.uint64(bits * k)
    return p.view(np.uint8).reshape(n, 32 * groups)


LOW_NIBBLES = np.uint64(0x0F0F0F0F0F0F0F0F)        # the low nibble of each byte of a u64 word
HIGH_NIBBLES = np.uint64(0xF0F0F0F0F0F0F0F0)


def pack_nibbles_into(dst: np.ndarray, q: np.ndarray, low_mask: bool = False) -> None:
    """dst (n, 16), bytes of a block array, <- q[j] | (q[j + 16] << 4) for q (n, 32) uint8, the shifted
    byte cut to 8 bits as a C uint8_t store does (low_mask: q[j] & 15 too).

    Computed on little-endian u64 words (8 bytes each, shifts cannot carry across bytes once masked)
    of the flat arrays, so each step is one long loop rather than one 16-byte loop per block.
    """
    w = np.ascontiguousarray(q, np.uint8).view("<u8").reshape(-1)       # words per block: lo0 lo1 hi0 hi1
    out = dst.view("<u8")                                               # (n, 2)
    for k in (0, 1):
        p = w[2 + k::4] << np.uint64(4)
        p &= HIGH_NIBBLES
        p |= (w[k::4] & LOW_NIBBLES) if low_mask else w[k::4]
        out[:, k] = p


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
# NumPy reduces (n, 32) arrays along axis 1 slowly (one short inner loop per row); combining elements
# with element-wise ops is several times faster and, for max/min, gives exactly the same values.

def pairwise(op, a: np.ndarray) -> np.ndarray:
    """op-reduce the last axis (keepdims) by combining neighbours 2i, 2i+1 of the flat array, level by
    level: every level is one long strided loop. The axis length must be a power of two (else `tree`);
    op must be associative and exact (max/min, fmax/fmin: NaN handling as op's)."""
    n, k = a.shape[:-1], a.shape[-1]
    if k & (k - 1):
        return tree(op, a)
    rows = a.size // k if k else 0
    flat = a.reshape(-1)
    while flat.size > rows:
        flat = op(flat[0::2], flat[1::2])
    return flat.reshape(n + (1,))



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
