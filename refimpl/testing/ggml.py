"""Real ggml as the test oracle, through the `ggml-python` bindings (optional dependency).

Everything here calls the pinned ggml (ggml-python 0.0.45 = ggml 0.15.3, built portably with AVX2/FMA/F16C
and without AVX-512, see `PROFILE`) on NumPy inputs and returns NumPy outputs. refimpl's tests compare
against these functions; users can do the same for their own kernels.

    dequantize(qt)                  ggml's `dequantize_row_*` / type traits `to_float`
    quantize(x, type, method)       "chunk": `ggml_quantize_chunk` (no imatrix), "ref": `quantize_row_*_ref`,
                                    "cpu": the CPU backend's `quantize_row_*` (type traits `from_float`)
    type_size(t), blck_size(t)      `ggml_type_size`, `ggml_blck_size`

Calls that ggml would answer with an abort (a type without that quantizer, a type that needs an
importance matrix) raise ValueError here instead of reaching ggml.
"""
from __future__ import annotations

import ctypes
import functools
import os

import numpy as np

from ..qtensor import QTensor
from ..types import GGMLType, as_type, traits

# The build every golden value in this repository was produced with.
PROFILE = ("ggml-python==0.0.45 (ggml 0.15.3), CMAKE_ARGS=-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON "
           "-DGGML_FMA=ON -DGGML_F16C=ON (x86-64 AVX2 portable profile, no AVX-512)")


def available() -> bool:
    try:
        _libs()
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=None)
def _libs():
    try:
        import ggml  # noqa: F401  (ggml-python; loads libggml-base/-cpu)
    except ImportError as e:
        raise ImportError("refimpl.testing.ggml needs ggml-python==0.0.45 (pip install 'refimpl[test]')") from e
    libdir = os.path.join(os.path.dirname(ggml.__file__), "lib")
    base = ctypes.CDLL(os.path.join(libdir, "libggml-base.so"))
    cpu = ctypes.CDLL(os.path.join(libdir, "libggml-cpu.so"))
    return ggml, base, cpu


def build_features() -> dict[str, int]:
    """The SIMD features the loaded ggml was compiled with (`ggml_cpu_has_*`)."""
    g, _, _ = _libs()
    names = ("avx", "avx2", "fma", "f16c", "avx512", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_int8", "llamafile")
    return {n: int(getattr(g, f"ggml_cpu_has_{n}")()) for n in names}


def check_profile() -> None:
    """Raise unless the loaded ggml is the portable AVX2 build the goldens assume (see PROFILE)."""
    f = build_features()
    want = {"avx": 1, "avx2": 1, "fma": 1, "f16c": 1, "avx512": 0, "avx512_vnni": 0, "avx512_bf16": 0,
            "avx_vnni": 0, "amx_int8": 0}
    bad = {k: f[k] for k in want if f[k] != want[k]}
    if bad:
        raise RuntimeError(f"the installed ggml-python is not the portable AVX2 build refimpl's goldens assume "
                           f"(differs in {bad}); reinstall it with scripts/setup.sh. Expected: {PROFILE}")


def _fn(lib, name, argtypes, restype=None):
    f = getattr(lib, name)
    f.argtypes, f.restype = argtypes, restype
    return f


_P = ctypes.c_void_p
_row_fn = ([_P, _P, ctypes.c_int64], None)


def type_size(t) -> int:
    g, _, _ = _libs()
    return int(g.ggml_type_size(int(as_type(t))))


def blck_size(t) -> int:
    g, _, _ = _libs()
    return int(g.ggml_blck_size(int(as_type(t))))


def type_name(t) -> str:
    g, _, _ = _libs()
    return g.ggml_type_name(int(as_type(t))).decode()


def requires_imatrix(t) -> bool:
    g, _, _ = _libs()
    return bool(g.ggml_quantize_requires_imatrix(int(as_type(t))))


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(_P)


def dequantize(qt: QTensor) -> np.ndarray:
    """ggml's own float values of a QTensor's bytes (f32, same logical shape)."""
    g, base, _ = _libs()
    tr = traits(qt.type)
    raw = np.ascontiguousarray(qt.data).reshape(-1)
    out = np.empty(qt.size, np.float32)
    if qt.size == 0:
        return out.reshape(qt.shape)
    name = f"dequantize_row_{tr.name}"
    if hasattr(base, name):
        _fn(base, name, *_row_fn)(_ptr(raw), _ptr(out), qt.size)
    else:
        to_float = g.ggml_get_type_traits(int(qt.type)).contents.to_float
        if not to_float:
            raise ValueError(f"ggml has no dequantizer for {tr.name}")
        to_float(_ptr(raw), out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), qt.size)
    return out.reshape(qt.shape)


def quantize(x, type, method: str = "chunk") -> QTensor:
    """Quantize with ggml itself: x numpy (..., n) f32 -> QTensor (dst buffer zero-filled first)."""
    g, base, cpu = _libs()
    t = as_type(type)
    tr = traits(t)
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = x.shape[-1]
    if n % tr.blck_size:
        raise ValueError(f"{tr.name}: row length {n} is not a multiple of {tr.blck_size}")
    rows = x.size // n if n else 0
    rb = n // tr.blck_size * tr.type_size
    dst = np.zeros(rows * rb, np.uint8)
    if rows:
        if method == "chunk":
            if not hasattr(base, f"quantize_{tr.name}") and t not in (GGMLType.F16, GGMLType.BF16, GGMLType.F32):
                raise ValueError(f"ggml_quantize_chunk does not handle {tr.name}")
            if requires_imatrix(t):
                raise ValueError(f"ggml_quantize_chunk needs an importance matrix for {tr.name}")
            f = _fn(base, "ggml_quantize_chunk",
                    [ctypes.c_int, _P, _P, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, _P], ctypes.c_size_t)
            f(int(t), _ptr(x), _ptr(dst), 0, rows, n, None)
        elif method == "ref":
            name = f"quantize_row_{tr.name}_ref"
            if hasattr(base, name):
                _fn(base, name, *_row_fn)(_ptr(x), _ptr(dst), x.size)
            else:
                ref = g.ggml_get_type_traits(int(t)).contents.from_float_ref
                if not ref:
                    raise ValueError(f"ggml has no reference quantizer for {tr.name}")
                ref(x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), _ptr(dst), x.size)
        elif method == "cpu":
            name = f"quantize_row_{tr.name}"
            if not hasattr(cpu, name):
                raise ValueError(f"the ggml CPU backend has no from_float for {tr.name}")
            _fn(cpu, name, *_row_fn)(_ptr(x), _ptr(dst), x.size)
        else:
            raise ValueError(f"unknown method {method!r}")
    return QTensor(t, dst.reshape(x.shape[:-1] + (rb,)), x.shape)
