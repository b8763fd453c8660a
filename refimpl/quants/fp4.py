"""FP4 (E2M1) formats: MXFP4 (32 elements, one E8M0 scale) and NVFP4 (64 elements, four UE4M3 scales).

ggml stores the E2M1 values doubled, T = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], and
halves the scales to match: E8M0half(e) = 2^(e-128) (e = 0, 1: the subnormals 2^-128, 2^-127) and
UE4M3half(b) = value(b) / 2.
"""
from __future__ import annotations

import numpy as np

from ..types import GGMLType
from .registry import dequantizer, quantizer
from ._common import blockwise, c_uint8, cvtt_i32, div, output, pack_nibbles_into, pairwise

f32 = np.float32
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)
KV = KVALUES_MXFP4.astype(np.float32)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """E8M0 scale byte -> 2^(e-128) as f32 bits: e < 2 -> 0x00200000 << e, else (e-1) << 23."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << 23).astype(np.uint32)
    return bits.view(np.float32)


def ue4m3_half(b: np.ndarray) -> np.ndarray:
    """UE4M3 byte -> value/2 (0x00 and 0x7F -> 0; exp = bits 6..3 bias 7, man = bits 2..0)."""
    b = b.astype(np.int32)
    exp, man = (b >> 3) & 0xF, b & 7
    sub = np.ldexp(man.astype(np.float32), -9)
    norm = np.ldexp(f32(1.0) + man.astype(np.float32) / f32(8.0), exp - 7).astype(np.float32)
    raw = np.where(exp == 0, sub, norm).astype(np.float32)
    return np.where((b == 0) | (b == 0x7F), f32(0), raw * f32(0.5)).astype(np.float32)


def ue4m3_encode(v: np.ndarray) -> np.ndarray:
    """f32 -> UE4M3 byte as ggml rounds it: v <= 0 or NaN -> 0; clamp 448; subnormal man = (int)(v*512+0.5)
    (<1 -> 0, >7 -> 7); exponent >= 15 -> 0x7E; else 3 mantissa bits + the 4th (half up), carrying."""
    v = np.asarray(v, np.float32)
    pos = v > 0
    v = np.where(v > f32(448), f32(448), v).astype(np.float32)
    bits = v.view(np.uint32).astype(np.int64)
    e = ((bits >> 23) & 0xFF) - 127 + 7
    man = ((bits >> 20) & 7) + ((bits >> 19) & 1)
    carry = man > 7
    e2, man2 = np.where(carry, e + 1, e), np.where(carry, 0, man)
    normal = np.where(e2 >= 15, 0x7E, (e2 << 3) | man2)
    with np.errstate(invalid="ignore", over="ignore"):
        sm = cvtt_i32(v * f32(512.0) + f32(0.5))
    sub = np.where(sm < 1, 0, np.minimum(sm, 7))
    out = np.where(e <= 0, sub, np.where(e >= 15, 0x7E, normal))
    return np.where(pos, out, 0).astype(np.uint8)


MAGNITUDES = KV[:8]                   # 0 1 2 3 4 6 8 12; T[8 + i] = -T[i] (T[8] = 0)


def _best_index(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """ggml's best_index_mxfp4: i = 0..15 in order, keep i if |T[i]*d - x| < the best error so far (f32).

    d >= 0. For x >= 0 a negative level's error |T[i]*d| + x is never below level 0's (x): only i < 8
    can win; for x < 0, by the same argument (and the exact symmetry of the f32 errors) only 0 and
    8..15 can, and level 0 comes before level 8 (both 0). So the loop runs over the eight magnitudes
    against |x| and negative x adds 8 to a nonzero index. NaN x: nothing wins, 0. x (n, k), d (n, 1).
    """
    ax = np.abs(x)
    best = ax.copy()                                   # level 0: |0*d - x| = |x|
    idx = np.zeros(x.shape, np.uint8)
    err = np.empty_like(ax)
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(1, 8):
            np.subtract(MAGNITUDES[i] * d, ax, out=err)
            np.abs(err, out=err)
            # the index kept is the last i that improved, and i grows: a running max of i * better
            np.maximum(idx, (err < best).view(np.uint8) * np.uint8(i), out=idx)
            np.minimum(best, err, out=best)       # = the kept error (NaN only when x is NaN)
    idx += ((x < 0) & (idx > 0)).view(np.uint8) * np.uint8(8)
    return idx


def _pack(q: np.ndarray, half: int) -> np.ndarray:
    """(m, 2*half) nibbles -> (m, half) bytes: q[j] | q[j + half] << 4."""
    return q[:, :half] | (q[:, half:] << 4)


def _nibble_values(out, qs, half: int):
    """out (n, 2*half) <- T[nibble] of qs (n, half): low nibbles first, then the high ones."""
    nib = np.empty(out.shape, np.uint8)
    np.bitwise_and(qs, 0x0F, out=nib[:, :half])
    np.right_shift(qs, 4, out=nib[:, half:])
    np.take(KV, nib, out=out, mode="clip")             # nib < 16: `clip` only skips the bounds check


@dequantizer(GGMLType.MXFP4)
def dequantize_mxfp4(blocks, out=None):
    """block_mxfp4 (17 B): e u8 (E8M0) | qs[16] split-nibble.   x = T[nib] * E8M0half(e)"""
    out = output(blocks, 32, out)
    _nibble_values(out, blocks[:, 1:17], 16)
    out *= e8m0_half(blocks[:, :1])
    return out


@quantizer(GGMLType.MXFP4, "ref")
@blockwise
def quantize_mxfp4(x):
    """e = amax > 0 ? (uint8)(floor(log2f(amax)) - 2 + 127) : 0; nibble = nearest T[i]*d to x."""
    amax = np.fmax(pairwise(np.fmax, np.abs(x)), f32(0))       # MAX from 0, NaN skipped
    with np.errstate(divide="ignore"):
        # log2f correctly rounded to f32 (glibc's log2f is), then floor: the float just below 2^k
        # rounds up to k for larger k, exactly as in C.
        lg = np.log2(amax.astype(np.float64)).astype(np.float32)
    e = np.where(amax > 0, c_uint8(np.floor(lg) - f32(2) + f32(127)), 0).astype(np.uint8)
    q = _best_index(x, e8m0_half(e))
    out = np.empty((len(x), 17), np.uint8)
    out[:, :1] = e
    pack_nibbles_into(out[:, 1:17], q)
    return out


@dequantizer(GGMLType.NVFP4)
def dequantize_nvfp4(blocks, out=None):
    """block_nvfp4 (36 B, 64 elements): d[4] UE4M3 | qs[32]. Sub-block s (16 elements) uses d[s] and
    qs[8s..8s+7], split-nibble within the 16 (low -> j, high -> j+8).  x = T[nib] * UE4M3half(d[s])"""
    out = output(blocks, 64, out)
    n = blocks.shape[0]
    sub = out.reshape(n * 4, 16)
    _nibble_values(sub, blocks[:, 4:36].reshape(n * 4, 8), 8)
    sub *= ue4m3_half(blocks[:, :4]).reshape(n * 4, 1)
    return out


@quantizer(GGMLType.NVFP4, "ref")
@blockwise
def quantize_nvfp4(x):
    """Per 16-element sub-block: d = UE4M3(amax / 6); nibbles nearest to x with the decoded half scale."""
    n = x.shape[0]
    xs = x.reshape(n * 4, 16)
    amax = np.fmax(pairwise(np.fmax, np.abs(xs)), f32(0))
    ue = ue4m3_encode(div(amax, f32(6.0)))
    q = _best_index(xs, ue4m3_half(ue))
    out = np.empty((n, 36), np.uint8)
    out[:, :4] = ue.reshape(n, 4)
    out[:, 4:36] = _pack(q, 8).reshape(n, 32)
    return out
