"""Intel MKL's sgemm for numerics="fast" f32 products, where the `mkl` package is installed (`refimpl[mkl]`).

numerics="fast" sums a product's f32 terms in whatever order its BLAS takes (the bound in kernels/matmul.py);
on x86 MKL's sgemm runs the shapes of a BERT layer 5-15% faster than OpenBLAS's (MiniLM, 2 threads, measured
side by side on an Intel Xeon: 480x384x1152 375 against 346 GFLOP/s, 2016x384x1536 422 against 399), which is
what sentence-transformers runs on through torch. So, when the `mkl` wheel is installed, the fast path's
products that kernels/blas.py splits over refimpl's threads call MKL's sgemm -- f32 weights, the decoded
tiles of block weights, attention's batched products --; nothing else does (exact numerics keeps its f64
products, numerics="ggml" its own orders).

Only MKL's documented C entry points, each declared once with its types: MKL_Set_Interface_Layer(LP64) and
MKL_Set_Threading_Layer(SEQUENTIAL) before the first call -- no OpenMP or TBB runtime loads, no MKL worker
spins between calls; refimpl's threads split the rows (kernels/blas.py) -- and the Fortran `sgemm`. The
threading layer is MKL's setting for the whole process and cannot be changed back once MKL has run: where
something else in the process already runs MKL threaded (the call returns another layer), this module
stays off. REFIMPL_MKL=0 turns it off before it loads.

    available()              whether MKL is loaded and used (False without the wheel, off x86-64, or with
                             REFIMPL_MKL=0 in the environment)
    library()                the path of the libmkl_rt in use, or None
    fortran_sgemm(proto)     MKL's `sgemm` as a ctypes function of prototype proto (kernels/blas.GEMM_T), or None
"""
from __future__ import annotations

import ctypes
import os
import threading

_THREADING_SEQUENTIAL, _INTERFACE_LP64 = 1, 0

_lock = threading.Lock()
_lib = None              # the libmkl_rt (ctypes) once loaded; False when MKL is not used
_path = None             # its path


def _find() -> str | None:
    try:
        import importlib.metadata as md
        dist = md.distribution("mkl")
    except Exception:                                    # noqa: BLE001 -- not installed: no MKL
        return None
    for f in dist.files or ():
        name = str(f).rsplit("/", 1)[-1]
        if name.startswith("libmkl_rt.so"):
            p = dist.locate_file(f)
            if os.path.exists(p):
                return os.path.realpath(p)
    return None


def _load():
    global _lib, _path
    with _lock:
        if _lib is not None:
            return _lib
        _lib = False
        if os.environ.get("REFIMPL_MKL", "1").strip().lower() in ("0", "false", "no", "off"):
            return _lib
        path = _find()
        if path is None:
            return _lib
        try:
            lib = ctypes.CDLL(path)
            lib.MKL_Set_Threading_Layer.argtypes = [ctypes.c_int]
            lib.MKL_Set_Threading_Layer.restype = ctypes.c_int
            lib.MKL_Set_Interface_Layer.argtypes = [ctypes.c_int]
            lib.MKL_Set_Interface_Layer.restype = ctypes.c_int
            lib.MKL_Set_Interface_Layer(_INTERFACE_LP64)
            if lib.MKL_Set_Threading_Layer(_THREADING_SEQUENTIAL) != _THREADING_SEQUENTIAL:
                return _lib                              # MKL already runs threaded in this process: leave it
            lib.sgemm                                    # noqa: B018 -- the Fortran entry point must exist
        except (OSError, AttributeError):
            return _lib
        _lib, _path = lib, path
        return _lib


def available() -> bool:
    return bool(_load())


def library() -> str | None:
    """The path of the MKL library in use, or None."""
    return _path if available() else None


def fortran_sgemm(proto):
    """MKL's Fortran `sgemm` (LP64: every argument by reference) as a function of the ctypes prototype proto,
    looked up by name in the library (ctypes' documented `proto((name, library))`); None where MKL is not
    used."""
    lib = _load()
    return proto(("sgemm", lib)) if lib else None
