"""The IQ ("importance") formats: grid codebooks (IQ1/IQ2/IQ3) and non-linear 4-bit levels (IQ4).

Dequantizers for all nine, quantizers for IQ4_NL and IQ4_XS. The IQ1/IQ2/IQ3 quantizers are lattice
searches over the grids, written elsewhere; the codebooks come from `iq_tables.TABLES` (read out of
ggml, see that module), named below as in ggml-common.h:

    grid2xxs = iq2xxs_grid (256 x 8 magnitudes)   grid2xs = iq2xs_grid (512 x 8)   grid2s = iq2s_grid (1024 x 8)
    grid3xxs = iq3xxs_grid (256 x 4)              grid3s  = iq3s_grid (512 x 4)
    grid1s   = iq1s_grid (2048 x 8 values in {-1, 0, 1})
    ksigns   = ksigns_iq2xs: 7 stored sign bits -> 8-bit mask (bit j set: element j negated)
    K        = kvalues_iq4nl = [-127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89 113]

A 256-element super-block is 8 groups of 32 (index g), each 4 sub-groups of 8 (index l); element
`32g + 8l + j`. All f16 fields little-endian; `d` is widened to f32 exactly, and every product is
evaluated in f32 in ggml's order, e.g. `db = (d * (0.5 + s)) * 0.25`, then `db * mag`, then the sign
applied as a sign flip (see `_flip`) -- so output bits, NaN and -0 included, are ggml's.
"""
from __future__ import annotations

import functools

import numpy as np

from ..types import GGMLType
from .registry import dequantizer, quantizer
from ._common import blockwise, f16_bytes, f16_field, output, seq_sum, signed_absmax, u16_fields, u32_fields
from ._common import nearest_int as _nearest_int
from .iq_tables import TABLES

f32 = np.float32
_L = np.arange(4)                       # sub-group index l
_BIT8 = (1 << np.arange(8)).astype(np.uint8)
# sign mask byte -> the f32 sign bit of each of its 8 elements (bit j set: element j negated)
_SIGN_BITS = np.where(np.arange(256)[:, None] & _BIT8, 0x80000000, 0).astype(np.uint32)     # (256, 8)


@functools.lru_cache(maxsize=None)
def _table(name: str) -> np.ndarray:
    """TABLES[name] as f32 (values exact); `"ksigns_bits"`: the sign bits of each ksigns mask (128, 8)."""
    if name == "ksigns_bits":
        return _SIGN_BITS[TABLES["ksigns"]]
    return TABLES[name].astype(f32)


def _grid(dst: np.ndarray, name: str, idx: np.ndarray) -> None:
    """dst (..., k) f32 <- the codebook rows table[idx] (idx (...), every value a valid row)."""
    np.take(_table(name), idx, axis=0, out=dst, mode="clip")


def _flip(v: np.ndarray, masks: np.ndarray, table: np.ndarray = _SIGN_BITS) -> None:
    """Negate v (..., 8) f32 in place where bit j of the sign mask (...) is set (table: mask -> bits).

    ggml writes `v * (bit ? -1.f : 1.f)`, which its compiler turns into a sign flip: a NaN v comes out
    with its sign bit flipped too (a real f32 multiply by -1 would return the NaN unchanged on x86), so
    the flip is an XOR of the sign bit.
    """
    v.view(np.uint32)[...] ^= np.take(table, masks, axis=0, mode="clip")


def _quiet(fn):
    """Run fn with NumPy's floating-point warnings off: inf/NaN scales are part of the format."""
    @functools.wraps(fn)
    def wrapped(*args, **kw):
        with np.errstate(all="ignore"):
            return fn(*args, **kw)
    return wrapped


def _half_scale(d: np.ndarray, nib: np.ndarray, half: float) -> np.ndarray:
    """ggml's `d * (0.5f + nib) * half` for IQ2/IQ3_XXS, f32, left to right."""
    return (d * (f32(0.5) + nib.astype(f32))) * f32(half)


def _nibble_scales(sc: np.ndarray) -> np.ndarray:
    """scales (n, 8) bytes -> (n, 8, 4) nibbles: sub-groups 0, 1 of group g take the low nibble of
    scales[g], sub-groups 2, 3 the high one."""
    nib = np.empty(sc.shape + (4,), np.uint8)
    nib[..., 0:2] = (sc & 15)[..., None]
    nib[..., 2:4] = (sc >> 4)[..., None]
    return nib


# -- dequantizers ---------------------------------------------------------------------------------

@dequantizer(GGMLType.IQ2_XXS)
@_quiet
def dequantize_iq2_xxs(blocks, out=None):
    """IQ2_XXS (256 elements, 66 B): `d` f16 | `qs` 32 x u16.

    Group g reads the u32 pair (a0, a1) at qs[4g..4g+3]: byte l of a0 indexes grid2xxs for sub-group
    l, sign mask ksigns[(a1 >> 7l) & 127], scale db = d * (0.5 + (a1 >> 28)) * 0.25;
        x[32g + 8l + j] = db * grid2xxs[a0 byte l][j] * (mask bit j ? -1 : 1)
    """
    out = output(blocks, 256, out)
    n = blocks.shape[0]
    v = out.reshape(n, 8, 4, 8)
    a1 = u32_fields(blocks, 2, 16)[:, 1::2]                                  # (n, 8)
    _grid(v, "iq2xxs", blocks[:, 2:66].reshape(n, 8, 8)[:, :, 0:4])
    v *= _half_scale(f16_field(blocks, 0), a1 >> 28, 0.25)[:, :, None, None]
    _flip(v, (a1[:, :, None] >> (7 * _L).astype(np.uint32)) & 127, _table("ksigns_bits"))
    return out


@dequantizer(GGMLType.IQ2_XS)
@_quiet
def dequantize_iq2_xs(blocks, out=None):
    """IQ2_XS (256 elements, 74 B): `d` f16 | `qs` 32 x u16 | `scales` 8 bytes.

    Sub-group (g, l) reads w = qs[4g + l]: grid2xs[w & 511], sign mask ksigns[w >> 9]; scale
    db = d * (0.5 + nibble) * 0.25 with the low nibble of scales[g] for l = 0, 1, the high one for l = 2, 3;
        x[32g + 8l + j] = db * grid2xs[w & 511][j] * (mask bit j ? -1 : 1)
    """
    out = output(blocks, 256, out)
    n = blocks.shape[0]
    v = out.reshape(n, 8, 4, 8)
    w = u16_fields(blocks, 2, 32).reshape(n, 8, 4)
    _grid(v, "iq2xs", w & 511)
    v *= _half_scale(f16_field(blocks, 0)[:, :, None], _nibble_scales(blocks[:, 66:74]), 0.25)[..., None]
    _flip(v, w >> 9, _table("ksigns_bits"))
    return out


@dequantizer(GGMLType.IQ2_S)
@_quiet
def dequantize_iq2_s(blocks, out=None):
    """IQ2_S (256 elements, 82 B): `d` f16 | `qs` 64 bytes | `qh` 8 | `scales` 8.

    qs[0:32] hold the low 8 bits of the grid indices, qs[32:64] explicit sign masks (no parity table).
    Sub-group (g, l): index qs[4g + l] | ((qh[g] << (8 - 2l)) & 0x300) into grid2s, sign mask
    qs[32 + 4g + l]; scales as IQ2_XS;
        x[32g + 8l + j] = db * grid2s[index][j] * (mask bit j ? -1 : 1)
    """
    out = output(blocks, 256, out)
    n = blocks.shape[0]
    v = out.reshape(n, 8, 4, 8)
    qh = blocks[:, 66:74].astype(np.int32)[:, :, None]
    _grid(v, "iq2s", blocks[:, 2:34].reshape(n, 8, 4) | ((qh << (8 - 2 * _L)) & 0x300))
    v *= _half_scale(f16_field(blocks, 0)[:, :, None], _nibble_scales(blocks[:, 74:82]), 0.25)[..., None]
    _flip(v, blocks[:, 34:66].reshape(n, 8, 4))
    return out


@dequantizer(GGMLType.IQ3_XXS)
@_quiet
def dequantize_iq3_xxs(blocks, out=None):
    """IQ3_XXS (256 elements, 98 B): `d` f16 | `qs` 96 bytes.

    qs[0:64] are grid3xxs indices, qs[64:96] eight u32 words w_g. Group g: db = d * (0.5 + (w_g >> 28)) * 0.5;
    sub-group l: sign mask ksigns[(w_g >> 7l) & 127]; elements 0..3 from grid3xxs[qs[8g + 2l]],
    4..7 from grid3xxs[qs[8g + 2l + 1]];
        x[32g + 8l + j] = db * mag_j * (mask bit j ? -1 : 1)
    """
    out = output(blocks, 256, out)
    n = blocks.shape[0]
    v = out.reshape(n, 8, 4, 8)
    w = u32_fields(blocks, 66, 8)
    _grid(out.reshape(n, 8, 4, 2, 4), "iq3xxs", blocks[:, 2:66].reshape(n, 8, 4, 2))
    v *= _half_scale(f16_field(blocks, 0), w >> 28, 0.5)[:, :, None, None]
    _flip(v, (w[:, :, None] >> (7 * _L).astype(np.uint32)) & 127, _table("ksigns_bits"))
    return out


@dequantizer(GGMLType.IQ3_S)
@_quiet
def dequantize_iq3_s(blocks, out=None):
    """IQ3_S (256 elements, 110 B): `d` f16 | `qs` 64 | `qh` 8 | `signs` 32 | `scales` 4.

    Group g: db = d * (1 + 2 * nibble), the low nibble of scales[g // 2] for even g, the high one for
    odd g. Sub-group l: elements 0..3 from grid3s[qs[8g + 2l] | ((qh[g] << (8 - 2l)) & 256)], elements
    4..7 from grid3s[qs[8g + 2l + 1] | ((qh[g] << (7 - 2l)) & 256)]; sign mask signs[4g + l] (raw bits);
        x[32g + 8l + j] = db * mag_j * (mask bit j ? -1 : 1)
    """
    out = output(blocks, 256, out)
    n = blocks.shape[0]
    v = out.reshape(n, 8, 4, 8)
    qs = blocks[:, 2:66].reshape(n, 8, 4, 2).astype(np.int32)
    qh = blocks[:, 66:74].astype(np.int32)[:, :, None]
    qs[..., 0] |= (qh << (8 - 2 * _L)) & 256
    qs[..., 1] |= (qh << (7 - 2 * _L)) & 256
    _grid(out.reshape(n, 8, 4, 2, 4), "iq3s", qs)
    sc = blocks[:, 106:110]
    nib = np.stack([sc & 15, sc >> 4], axis=-1).reshape(n, 8)
    v *= (f16_field(blocks, 0) * (1 + 2 * nib.astype(np.int32)).astype(f32))[:, :, None, None]
    _flip(v, blocks[:, 74:106].reshape(n, 8, 4))
    return out


# iq1s_grid + delta for both deltas: rows 0..2047 hold grid + 0.125, rows 2048.. grid - 0.125 (exact)
@functools.lru_cache(maxsize=None)
def iq1_table() -> np.ndarray:
    g = TABLES["iq1s"].astype(f32)
    return np.concatenate([g + f32(0.125), g - f32(0.125)])


@dequantizer(GGMLType.IQ1_S)
@_quiet
def dequantize_iq1_s(blocks, out=None):
    """IQ1_S (256 elements, 50 B): `d` f16 | `qs` 32 bytes | `qh` 8 x u16.

    Group g: dl = d * (2 * ((qh[g] >> 12) & 7) + 1), delta = -0.125 if qh[g] bit 15 else +0.125;
    sub-group l: 11-bit index qs[4g + l] | (((qh[g] >> 3l) & 7) << 8) into grid1s;
        x[32g + 8l + j] = dl * (grid1s[index][j] + delta)
    """
    out = output(blocks, 256, out)
    n = blocks.shape[0]
    qh = u16_fields(blocks, 34, 8).astype(np.int32)
    idx = blocks[:, 2:34].reshape(n, 8, 4).astype(np.int32) | (((qh[:, :, None] >> (3 * _L)) & 7) << 8)
    idx |= (qh[:, :, None] >> 15) << 11                                    # the delta's sign: table half
    v = out.reshape(n, 8, 4, 8)
    np.take(iq1_table(), idx, axis=0, out=v, mode="clip")
    v *= (f16_field(blocks, 0) * (2 * ((qh >> 12) & 7) + 1).astype(f32))[:, :, None, None]
    return out


@dequantizer(GGMLType.IQ1_M)
@_quiet
def dequantize_iq1_m(blocks, out=None):
    """IQ1_M (256 elements, 56 B): `qs` 32 bytes | `qh` 16 | `scales` 8 (four u16 s0..s3), no `d` field.

    The f16 super-scale d has bits (s0 >> 12) | ((s1 >> 8) & 0xF0) | ((s2 >> 4) & 0xF00) | (s3 & 0xF000).
    Group g: dl1 = d * (2 * ((s[g/2] >> 6(g%2)) & 7) + 1) for sub-groups 0, 1 and
    dl2 = d * (2 * ((s[g/2] >> (6(g%2) + 3)) & 7) + 1) for 2, 3. Grid indices into grid1s:
    qs[4g] | ((qh[2g] << 8) & 0x700), qs[4g+1] | ((qh[2g] << 4) & 0x700), and the same with qh[2g+1]
    for sub-groups 2, 3; delta of sub-group l = -0.125 if bit 3 (even l) / bit 7 (odd l) of
    qh[2g + l//2] is set, else +0.125;
        x[32g + 8l + j] = dl * (grid1s[index][j] + delta)
    """
    out = output(blocks, 256, out)
    n = blocks.shape[0]
    s = u16_fields(blocks, 48, 4).astype(np.int32)
    bits = ((s[:, 0] >> 12) | ((s[:, 1] >> 8) & 0x00F0) | ((s[:, 2] >> 4) & 0x0F00) | (s[:, 3] & 0xF000))
    d = bits.astype("<u2").view("<f2").astype(f32)[:, None]
    sg = s[:, np.arange(8) // 2]                                  # (n, 8): s[g // 2]
    sh = 6 * (np.arange(8) % 2)
    dl = np.empty((n, 8, 4), f32)
    dl[..., 0:2] = (d * (2 * ((sg >> sh) & 7) + 1).astype(f32))[..., None]
    dl[..., 2:4] = (d * (2 * ((sg >> (sh + 3)) & 7) + 1).astype(f32))[..., None]
    qs = blocks[:, 0:32].reshape(n, 8, 4).astype(np.int32)
    qh = blocks[:, 32:48].reshape(n, 8, 2).astype(np.int32)[:, :, [0, 0, 1, 1]]
    idx = qs | ((qh << np.array([8, 4, 8, 4])) & 0x700)
    idx |= ((qh & np.array([0x08, 0x80, 0x08, 0x80])) != 0) << 11      # the delta's sign: table half
    v = out.reshape(n, 8, 4, 8)
    np.take(iq1_table(), idx, axis=0, out=v, mode="clip")
    v *= dl[..., None]
    return out


def _iq4_values(out, qs):
    """out (m, 32) f32 <- K[nibble] of the split-nibble bytes qs (m, 16)."""
    nib = np.empty(out.shape, np.uint8)
    np.bitwise_and(qs, 0x0F, out=nib[:, :16])
    np.right_shift(qs, 4, out=nib[:, 16:])
    np.take(_table("kvalues_iq4nl"), nib, out=out, mode="clip")


@dequantizer(GGMLType.IQ4_NL)
@_quiet
def dequantize_iq4_nl(blocks, out=None):
    """IQ4_NL (32 elements, 18 B): `d` f16 | `qs` 16 bytes, split nibbles.

        x[j] = d * K[qs[j] & 15],  x[j + 16] = d * K[qs[j] >> 4]   (j = 0..15)
    """
    out = output(blocks, 32, out)
    _iq4_values(out, blocks[:, 2:18])
    out *= f16_field(blocks, 0)
    return out


@dequantizer(GGMLType.IQ4_XS)
@_quiet
def dequantize_iq4_xs(blocks, out=None):
    """IQ4_XS (256 elements, 136 B): `d` f16 | `scales_h` u16 | `scales_l` 4 bytes | `qs` 128 bytes.

    Sub-block ib (32 elements): 6-bit ls = ((scales_l[ib/2] >> 4(ib%2)) & 15) | (((scales_h >> 2ib) & 3) << 4),
    dl = d * (ls - 32); bytes qs[16ib .. 16ib+15] split-nibble as IQ4_NL;
        x[32ib + j] = dl * K[nibble j]
    """
    out = output(blocks, 256, out)
    n = blocks.shape[0]
    sh = u16_fields(blocks, 2, 1).astype(np.int32)                # (n, 1)
    sl = blocks[:, 4:8].astype(np.int32)
    ib = np.arange(8)
    ls = ((sl[:, ib // 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4)
    _iq4_values(out.reshape(n * 8, 32), blocks[:, 8:136].reshape(n * 8, 16))
    sub = out.reshape(n, 8, 32)
    sub *= (f16_field(blocks, 0) * (ls - 32).astype(f32))[:, :, None]
    return out


# -- IQ4 quantizers -------------------------------------------------------------------------------
# ggml's quantize_row_iq4_nl_impl, without an importance matrix, for 32-element (sub-)blocks x:
#   weights w = x*x; amax, max = first arg-max of |x| (strict '>' scan from 0, so NaN never wins);
#   amax < 1e-15: scale 0, block skipped.
#   d = (ntry > 0 ? -max : max) / K[0];  L = best(x * (1/d));  (Σwqx, Σwq²) with q = K[L], Σ sequential;
#   d = Σwq² > 0 ? Σwqx/Σwq² : 0;  best = d*Σwqx
#   for t in -ntry..ntry: id = (t + K[0]) / max; sums of best(id*x); keep d = Σwqx/Σwq² when
#       Σwq² > 0 and Σwqx*Σwqx > best*Σwq²  (then best = d*Σwqx)
# ntry = -1 for quantize_row_iq4_nl_ref (no search), 7 for ggml_quantize_chunk and IQ4_XS.

_EPS = f32(1e-15)


def kf() -> np.ndarray:
    return TABLES["kvalues_iq4nl"].astype(f32)


@functools.lru_cache(maxsize=None)
def best_index_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every integer c in -128..127 (index c + 128): mu = clip(#{i: K[i] <= c}, 1, 15), K[mu-1], K[mu]."""
    k = kf()
    mu = np.clip(np.searchsorted(k, np.arange(-128, 128, dtype=f32), side="right"), 1, 15).astype(np.uint8)
    return mu, k[mu - 1], k[mu]


def best_index(x: np.ndarray) -> np.ndarray:
    """ggml's best_index_int8(16, K, x): the index of the level nearest x, as uint8.

    x <= K[0] -> 0, x >= K[15] -> 15; otherwise the binary search finds mu with K[mu-1] <= x < K[mu]
    and returns mu - 1 if x - K[mu-1] < K[mu] - x (f32), else mu (ties go up). NaN -> 15, as in ggml
    (every comparison is false, so the search runs to the top).

    The levels are integers, so K[i] <= x exactly when K[i] <= floor(x): mu comes from a table over
    floor(x) clamped to -128..127 (fmin/fmax send NaN to 127, i.e. mu = 15). The final comparison is
    ggml's, and it also yields the two early returns (x <= K[0]: x - K[0] <= 0 < K[1] - x; x >= K[15]:
    x - K[14] > 0 >= K[15] - x).
    """
    mu_t, lo_t, hi_t = best_index_tables()
    x = np.asarray(x, f32)
    c = np.floor(x)
    np.fmin(c, f32(127), out=c)
    np.fmax(c, f32(-128), out=c)
    c += f32(128)
    i = c.astype(np.uint8)
    with np.errstate(invalid="ignore"):
        lower = (x - np.take(lo_t, i)) < (np.take(hi_t, i) - x)
    r = np.take(mu_t, i)
    r -= lower.view(np.uint8)
    return r


def _argmax_abs(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(amax, max) over the last axis of x (m, k) as ggml's scan `if (fabsf(v) > amax) {amax = fabsf(v);
    max = v;}` from amax = max = 0: the first index of the largest |v|; NaN is never taken; all-zero ->
    (0, 0). (`signed_absmax` without keepdims.)"""
    amax, mx = signed_absmax(x)
    return amax[:, 0], mx[:, 0]


def _nearest_level(x: np.ndarray) -> np.ndarray:
    """K[best_index(x)] as f32, from the same tables and comparison as `best_index`."""
    _, lo_t, hi_t = best_index_tables()
    c = np.floor(x)
    np.fmin(c, f32(127), out=c)
    np.fmax(c, f32(-128), out=c)
    c += f32(128)
    i = c.astype(np.uint8)
    lo, hi = np.take(lo_t, i), np.take(hi_t, i)
    with np.errstate(invalid="ignore"):
        return np.where((x - lo) < (hi - x), lo, hi)


def _sums(w: np.ndarray, x: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Σ w*q*x and Σ w*q*q over axis 0 (the elements of a block, laid out transposed), f32,
    sequential in j (ggml's loop)."""
    wq = w * q
    return seq_sum(np.stack([wq * x, wq * q], axis=1), axis=0, keepdims=False)


def _iq4_scales(x: np.ndarray, ntry: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The per-(sub-)block search of quantize_row_iq4_nl_impl: x (m, 32) f32 ->
    (scale (m,) f32, 0 for skipped blocks; L (m, 32) of the first pass; skipped (m,) bool).

    The elementwise work is laid out transposed, (32, m), so that each of ggml's sequential sums
    adds contiguous slabs; the tries run one after the other, as in C."""
    k = kf()
    x = np.asarray(x, f32)
    xt = np.ascontiguousarray(x.T)
    with np.errstate(all="ignore"):
        w = xt * xt
        amax, mx = _argmax_abs(x)
        skip = amax < _EPS
        d = (-mx if ntry > 0 else mx) / k[0]
        idv = f32(1.0) / d
        L = best_index(idv * xt)
        sqx, sq2 = _sums(w, xt, np.take(k, L))
        d = np.where(sq2 > 0, sqx / sq2, f32(0.0)).astype(f32)
        best = d * sqx
        for t in range(-ntry, ntry + 1) if ntry > 0 else ():
            tqx, tq2 = _sums(w, xt, _nearest_level((f32(t) + k[0]) / mx * xt))
            better = (tq2 > 0) & (tqx * tqx > best * tq2)
            d = np.where(better, tqx / tq2, d).astype(f32)
            best = np.where(better, d * tqx, best).astype(f32)
        scale = np.where(skip, f32(0.0), d).astype(f32)
    return scale, L.T, skip


def _recip0(v: np.ndarray) -> np.ndarray:
    """`v ? 1/v : 0` in f32."""
    with np.errstate(all="ignore"):
        return np.where(v != 0, f32(1.0) / v, f32(0.0)).astype(f32)


def _pack_l(L: np.ndarray) -> np.ndarray:
    """(m, 32) levels -> (m, 16) bytes: L[j] | L[j + 16] << 4."""
    L = L.astype(np.uint8)
    return L[:, :16] | (L[:, 16:] << 4)


@quantizer(GGMLType.IQ4_NL, "ref", "cpu")
def quantize_iq4_nl_ref(x):
    """quantize_row_iq4_nl_ref (also the CPU backend's from_float): the search above with ntry = -1.

    Block: `d` f16 | `qs` 16 bytes of split nibbles (see dequantize_iq4_nl). d = fl16(Σwqx/Σwq²) of the
    first pass and its levels L, which are *not* recomputed with the final d.

    A block with amax < 1e-15 gets d = 0 and no levels of its own: ggml packs whatever its level buffer
    holds, i.e. the levels of the previous quantized block of the same call (blocks here are taken in
    order, as one call over the whole array, which is how refimpl.testing.ggml calls it). Before the
    first non-skipped block of a call the buffer is uninitialised stack memory in ggml (bytes vary);
    refimpl writes nibble 8 there (0x88 bytes, K[8] = 1, so the block still decodes to +0.0).
    All these blocks decode to ±0.0 either way.
    """
    m = x.shape[0]
    scale, L, skip = _iq4_scales(x, -1)
    last = np.maximum.accumulate(np.where(skip, -1, np.arange(m)))      # last quantized block so far
    L = np.where((last >= 0)[:, None], L[np.maximum(last, 0)], 8)
    return np.concatenate([f16_bytes(scale), _pack_l(L)], axis=1)


@quantizer(GGMLType.IQ4_NL, "chunk")
@blockwise
def quantize_iq4_nl_chunk(x):
    """quantize_iq4_nl (ggml_quantize_chunk, no imatrix): the search above with ntry = 7.

    Block: `d` f16 | `qs` 16 bytes of split nibbles. d = fl16(best scale); the levels are recomputed
    with the unrounded scale, L = best(x * (d ? 1/d : 0)), so a block with amax < 1e-15 gets d = 0 and
    L = best(0) = 8 (0x88 bytes; NaN elements give 15).
    """
    scale, _, _ = _iq4_scales(x, 7)
    with np.errstate(all="ignore"):
        L = best_index(_recip0(scale)[:, None] * x)
    return np.concatenate([f16_bytes(scale), _pack_l(L)], axis=1)


@quantizer(GGMLType.IQ4_XS, "chunk", "ref", "cpu")
@blockwise
def quantize_iq4_xs(x):
    """quantize_iq4_xs (ggml_quantize_chunk; quantize_row_iq4_xs_ref and the CPU from_float call it too).

    Block: `d` f16 | `scales_h` u16 | `scales_l` 4 bytes | `qs` 128 bytes (see dequantize_iq4_xs).
    Each 32-element sub-block gets a scale s_ib from the ntry = 7 search above (0 when amax < 1e-15);
    max_scale = the first s with the largest |s| (0 if none), d = -max_scale / 32, stored as fl16(d);
    l_ib = clamp(nearest_int(s_ib * (d ? 1/d : 0)), -32, 31); levels recomputed per sub-block with
    dl = d * l_ib: L = best(x * (dl ? 1/dl : 0)); l_ib + 32 stored as low nibble (scales_l) and
    2 high bits (scales_h bits 2ib, 2ib+1).
    """
    n = x.shape[0]
    xs = np.asarray(x, f32).reshape(n * 8, 32)
    s, _, _ = _iq4_scales(xs, 7)
    s = s.reshape(n, 8)
    _, max_scale = _argmax_abs(s)
    with np.errstate(all="ignore"):
        d = -max_scale / f32(32)
        l = np.clip(_nearest_int(_recip0(d)[:, None] * s), -32, 31)
        dl = d[:, None] * l.astype(f32)
        L = best_index(_recip0(dl).reshape(n * 8, 1) * xs)
    u = (l + 32).astype(np.int32)
    lo, hi = u & 15, u >> 4
    scales_l = (lo[:, 0::2] | (lo[:, 1::2] << 4)).astype(np.uint8)
    scales_h = (hi << (2 * np.arange(8))).sum(axis=1).astype("<u2")
    return np.concatenate([f16_bytes(d), scales_h[:, None].view(np.uint8), scales_l,
                           _pack_l(L).reshape(n, 128)], axis=1)
