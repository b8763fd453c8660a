"""f32 roundings NumPy has no function for (core: ops and the ggml-numerics kernels both use them)."""
from __future__ import annotations

import numpy as np

f32, f64 = np.float32, np.float64


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
