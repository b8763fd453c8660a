"""ggml-cpu's elementwise transcendental pieces on the AVX2 build: the SIMD exponential and the C library.

    vexp(x)          ggml_v_expf for __m256 (src/ggml-cpu/vec.h), one lane per element of x
    vsilu(x)         ggml_v_silu: x / (1 + vexp(0 - x))
    c_libm(name, *x)   the process's single-precision libm function (expf, logf, cosf, sinf, tanhf, powf), the same
                     code ggml-cpu calls for scalar tails and caches; elementwise over arrays
    chunk_split(n)   where a row of n elements switches from 8-lane chunks to the scalar tail

vexp follows the kernel's algorithm (semantics §5.3): n = round(x*log2 e) by the 1.5*2^23 shift, a two-step
Cody-Waite reduction, a degree-5 polynomial in FMAs, and 2^n put into the exponent bits; lanes with |n| > 126
take a two-factor scaling and |n| > 192 saturate to 0 or inf. The kernel chooses the fast form for a whole
register only when no lane needs the slow one, and both forms agree on the lanes where the fast one is valid,
so evaluating each lane on its own gives the register's result.
"""
from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np

from .vecdot import fma32

f32, u32 = np.float32, np.uint32
LANES = 8


def _hex(s: str) -> np.float32:
    return f32(float.fromhex(s))


_SHIFT = _hex("0x1.8p23")                 # 1.5 * 2^23: adding it rounds to an integer
_LOG2E = _hex("0x1.715476p+0")
_LN2_HI, _LN2_LO = _hex("0x1.62e4p-1"), _hex("0x1.7f7d1cp-20")
_C5, _C4, _C3 = _hex("0x1.0e4020p-7"), _hex("0x1.573e2ep-5"), _hex("0x1.555e66p-3")
_C2, _C1 = _hex("0x1.fffdb6p-2"), _hex("0x1.ffffecp-1")
_ONE_BITS = u32(0x3F800000)


def vexp(x) -> np.ndarray:
    """ggml_v_expf (AVX2 + FMA), per lane: within ~1.5 ulp of exp; -inf gives 0, +inf gives inf."""
    x = np.asarray(x, f32)
    with np.errstate(all="ignore"):
        z = fma32(x, _LOG2E, _SHIFT)
        n = z - _SHIFT
        b = fma32(-n, _LN2_LO, fma32(-n, _LN2_HI, x))
        e = z.view(u32) << u32(23)                                   # _mm256_slli_epi32: wraps
        k = (e + _ONE_BITS).view(f32)                                 # 2^n for |n| <= 126
        u = b * b
        j = fma32(fma32(fma32(_C5, b, _C4), u, fma32(_C3, b, _C2)), u, _C1 * b)
        out = fma32(j, k, k)
        big = np.abs(n) > 126
        if big.any():
            g = np.where(n <= 0, u32(0x82000000), u32(0))
            s1 = (g + u32(0x7F000000)).view(f32)                      # 2^127, or 2^-125 for n <= 0
            s2 = (e - g).view(f32)
            slow = np.where(np.abs(n) > 192, s1 * s1, fma32(s2, j, s2) * s1)
            out = np.where(big, slow, out)
    return out


def vsilu(x) -> np.ndarray:
    """ggml_v_silu: x / (1 + vexp(0 - x)), each step one f32 rounding."""
    x = np.asarray(x, f32)
    with np.errstate(all="ignore"):
        return x / (f32(1) + vexp(f32(0) - x))


# -- the C library -----------------------------------------------------------------------------------------

_LIB = None
_FNS: dict[str, object] = {}
_NUMPY_F64 = {"expf": np.exp, "logf": np.log, "cosf": np.cos, "sinf": np.sin, "tanhf": np.tanh, "powf": np.power}


def _libm_fn(name: str, nargs: int):
    """The C function `name` (float args, float result), or None where no C library can be loaded."""
    global _LIB
    if name not in _FNS:
        if _LIB is None:
            path = ctypes.util.find_library("m") or "libm.so.6"
            try:
                _LIB = ctypes.CDLL(path)
            except OSError:
                _LIB = False
        fn = getattr(_LIB, name, None) if _LIB else None
        if fn is not None:
            fn.argtypes = [ctypes.c_float] * nargs
            fn.restype = ctypes.c_float
        _FNS[name] = fn
    return _FNS[name]


def c_libm(name: str, *args) -> np.ndarray:
    """The C library's single-precision `name` (expf, logf, cosf, sinf, tanhf; powf with two arguments) of f32
    arrays (broadcast), called once per distinct argument tuple. glibc's versions are not always correctly
    rounded, so only the library itself reproduces ggml's tails bit for bit. Without a loadable C library it
    falls back to the f64 function rounded once (equal except in rare last-bit cases)."""
    arrs = np.broadcast_arrays(*[np.asarray(a, f32) for a in args])
    shape = arrs[0].shape
    fn = _libm_fn(name, len(args))
    if fn is None:
        with np.errstate(all="ignore"):
            return _NUMPY_F64[name](*[a.astype(np.float64) for a in arrs]).astype(f32)
    if not arrs[0].size:
        return np.empty(shape, f32)
    if len(args) == 1:                  # distinct bit patterns: np.unique on values would merge -0.0 and +0.0
        uniq, inv = np.unique(np.ascontiguousarray(arrs[0]).ravel().view(u32), return_inverse=True)
        vals = np.array([fn(float(v)) for v in uniq.view(f32)], f32)
        return vals[inv.reshape(-1)].reshape(shape)
    flat = [a.ravel() for a in arrs]
    return np.array([fn(*(float(a[i]) for a in flat)) for i in range(flat[0].size)], f32).reshape(shape)


def chunk_split(n: int, lanes: int = LANES) -> int:
    """Elements of a row of n handled in full SIMD registers (`for (; i + 7 < n; i += 8)`); the rest is the
    scalar tail."""
    return n - n % lanes
