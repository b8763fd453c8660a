"""ggml's float conversions and roundings that NumPy has no function for (core: the block formats, ops and the
ggml-numerics kernels use them)."""
from __future__ import annotations

import math

import numpy as np

f32, f64 = np.float32, np.float64


# -- C's single-precision libm, as correctly rounded functions ------------------------------------------------

def libm_f32(fn64, x) -> np.ndarray:
    """A C single-precision libm function (expf, logf, cosf, powf, ...) as a correctly rounded one: x taken as
    f32 (a C float argument), the f64 function `fn64` of it, rounded once to f32. glibc's float functions are
    correctly rounded but for rare 1-ulp cases (refimpl.kernels.ggml.simd.c_libm calls the C library itself
    where ggml's numerics need those bits too); NumPy's float32 functions are other approximations."""
    with np.errstate(all="ignore"):
        return fn64(np.asarray(x, f32).astype(f64)).astype(f32)


def expf_f32(x) -> np.ndarray:
    """C's expf (see libm_f32)."""
    return libm_f32(np.exp, x)


_erf64 = np.frompyfunc(math.erf, 1, 1)


def erff_f32(x) -> np.ndarray:
    """C's erff (see libm_f32)."""
    return libm_f32(lambda v: _erf64(v).astype(f64), x)


def fma32(a, b, c) -> np.ndarray:
    """fl32(a*b + c) rounded once, elementwise (a, b, c f32 arrays, broadcast).

    The f64 product of two f32 is exact; the f64 sum p + c may round, and rounding that again to f32 can
    differ from one rounding (a double-rounding tie). So the sum is made "round to odd": its exact error
    comes from a two-sum, and when the sum is inexact and its last significand bit even, it moves one f64
    step towards the exact value. Rounding a round-to-odd value with 29 spare bits to f32 gives the
    correctly rounded f32 of the exact a*b + c.

    Only a sum that lands exactly on an f32 midpoint (its 29 low significand bits 1000...0), or in the f32
    subnormal range, can round twice wrongly; everywhere else the plain f64 sum is already right, so the
    two-sum runs on those elements only.
    """
    p = np.multiply(a, b, dtype=f64)
    c = np.asarray(c, f64)
    with np.errstate(invalid="ignore", over="ignore"):
        s = p + c
        bits = s.view(np.int64)
        risky = ((bits & 0x1FFFFFFF) == 0x10000000) | (np.abs(s) < 2.0 ** -125)
        if risky.any():
            p, c = np.broadcast_arrays(p, c)
            pr, cr, sr = p[risky], c[risky], s[risky]
            t = sr - pr
            e = (pr - (sr - t)) + (cr - t)
            br = sr.view(np.int64)
            fix = (e != 0) & ((br & 1) == 0) & np.isfinite(sr)
            s = np.array(s, copy=True)
            s[risky] = (br + np.where(fix, np.where((e > 0) == (sr > 0), 1, -1), 0)).view(f64)
        return s.astype(f32)


def f16_to_f32(h: np.ndarray) -> np.ndarray:
    """ggml's f16 -> f32 (`GGML_FP16_TO_FP32`): exact, except that a signalling NaN comes out quiet."""
    out = np.asarray(h, "<f2").astype(np.float32)
    nan = np.isnan(out)
    if nan.any():
        out = np.where(nan, (out.view(np.uint32) | np.uint32(0x00400000)).view(np.float32), out)
    return out


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
