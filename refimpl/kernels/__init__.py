"""Compiled kernels (Numba; numba.cuda under kernels/cuda). Imported only when a backend asks for them,
so `import refimpl` never imports Numba.

One module per op family, each listing its versions at the top:

    quants.py      dequantize every block format (the decoders mul_mat and get_rows use too)
    quantize.py    ggml's reference quantizers of the common types
    matmul.py      mul_mat with any weight type, never materialising a dequantized weight
    blas.py        the GEMMs split over refimpl's threads (SciPy's BLAS from Numba, threadpoolctl), forward scope
    mkl.py         MKL's sgemm for fast numerics where the optional `mkl` wheel is installed
    norm.py        rms_norm, norm
    softmax.py     soft_max_ext
    rope.py        rope_ext, rope_ext_back (NORMAL and NEOX)
    rows.py        get_rows, set_rows
    sort.py        argsort, top_k, argsort_top_k (integer keys: a partition for top_k)
    unary.py       silu, gelu, sigmoid, exp, relu, swiglu, geglu
    recurrent.py   rwkv_wkv6, rwkv_wkv7
    simd.py        vector dot products and block decoders written as LLVM IR (fast decode, dequantize)
    vexp.py        fl32(exp(f64 x)) vectorized, libm's bits (soft_max_ext, silu, sigmoid, exp, swiglu)
    _common.py     scalar helpers (ggml's conversions and roundings) and the thread pool

Work is split over `numba.get_num_threads()` threads (NUMBA_NUM_THREADS, `numba.set_num_threads`) by
`_common.parallel_ranges`: the kernels release the GIL, and a pool of Python threads runs them on ranges
of rows or blocks.

Every kernel registers itself for the op (`register(name, "numba")`) or the NumPy function
(`register(fn, "numba", KEYS)`) it replaces, takes the same arguments, raises the same errors, and falls
back to the NumPy reference for inputs it does not cover. Kernels are `@njit(cache=True)`: compiled on
first use, then loaded from `__pycache__`. Numba checks a cached function against its own source file
only, not against the kernels it calls from other files, so importing this package drops the whole
cache whenever any kernel source differs from the one it was compiled from (`_check_cache`). The first
compile of a process says so in one line on stderr (`_announce_compiles`; REFIMPL_PROGRESS=0 silences it):
on a fresh install the first forward waits seconds for it.
"""
from __future__ import annotations

import glob
import hashlib
import os

_FAMILIES = ("quants", "quantize", "matmul", "norm", "softmax", "rope", "rows", "unary", "recurrent", "attention",
             "ssm", "faithful", "sort")
_STAMP = "refimpl_kernels.sources"


def _check_cache() -> None:
    """Delete this package's Numba cache files if the kernel sources changed since they were written
    (a stamp file with the sources' hash sits next to them). Skipped when NUMBA_CACHE_DIR moves the
    cache elsewhere."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    here = os.path.dirname(__file__)
    h = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(here, "*.py"))):
        with open(path, "rb") as f:
            h.update(os.path.basename(path).encode() + b"\0" + f.read())
    digest = h.hexdigest()
    cache = os.path.join(here, "__pycache__")
    stamp = os.path.join(cache, _STAMP)
    try:
        with open(stamp) as f:
            if f.read().strip() == digest:
                return
    except OSError:
        pass
    try:
        os.makedirs(cache, exist_ok=True)
        for path in glob.glob(os.path.join(cache, "*.nb[ic]")):
            try:
                os.remove(path)
            except OSError:
                pass
        tmp = f"{stamp}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(digest)
        os.replace(tmp, stamp)
    except OSError:                      # a read-only install: Numba then caches elsewhere or not at all
        pass


def load() -> None:
    """Import every kernel module (refimpl's op dispatch calls this on the first op under "numba").
    A module that fails to import is reported (ImportError) after all the others are loaded."""
    import importlib
    failed = []
    for name in _FAMILIES:
        try:
            importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":      # only a family that is not part of this install is skipped
                failed.append(f"{name}: {e}")
        except ImportError as e:
            failed.append(f"{name}: {e}")
    from ..backends import register_scope
    from . import blas
    register_scope("numba", blas.forward_scope)
    _announce_compiles()
    if failed:
        raise ImportError("; ".join(failed))


def _announce_compiles() -> None:
    """One progress note at the first compile of a kernel of this package in the process (Numba's event API
    broadcasts "numba:compile" on a cache miss only: a kernel loaded from the cache says nothing)."""
    from numba.core import event

    from ..progress import note
    cache = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(os.path.dirname(__file__), "__pycache__")

    class _FirstCompile(event.Listener):
        def on_start(self, ev):
            if getattr(ev.data.get("dispatcher"), "__module__", "").startswith(__name__):
                event.unregister("numba:compile", self)
                note(f"compiling the Numba kernels the first ops use (seconds, once: cached in {cache})")

        def on_end(self, ev):
            pass

    event.register("numba:compile", _FirstCompile())


_check_cache()         # before any kernel module of this package is imported (they load their cache lazily)
