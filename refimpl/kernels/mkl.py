"""Intel MKL's sgemm for numerics="fast" f32 products, where the `mkl` package is installed (`refimpl[mkl]`).

numerics="fast" sums a product's f32 terms in whatever order its BLAS takes (the bound in kernels/matmul.py);
on x86 MKL's sgemm runs the shapes of a BERT layer 5-15% faster than OpenBLAS's (MiniLM, 2 threads, measured
side by side: 480x384x1152 375 against 346 GFLOP/s, 2016x384x1536 422 against 399), which is what
sentence-transformers runs on through torch; split over Numba's threads (below) it ran SmolLM2's prefill
shapes at 270-290 GFLOP/s against OpenBLAS's 210-245. So, when the `mkl` wheel is installed, the fast path's
prefill products call MKL -- f32 weights, the decoded tiles of block weights, attention's batched products --;
nothing else does (exact numerics keeps its f64 products, numerics="ggml" its own orders).

MKL runs sequential in this process (MKL_Set_Threading_Layer(SEQUENTIAL), before its first call: no OpenMP
or TBB runtime loads, no workers spin between calls); a product's rows are split over refimpl's kernel threads,
each range (>= MIN_ROWS rows) one cblas_sgemm call: on the thread pool of parallel_ranges (ctypes calls
without the GIL), or with omp=True in a Numba `prange` (`_par_rows`, calling MKL through its address,
`_call_sgemm`). Numba's OpenMP threads start a range in ~5 us where the pool takes 65-100 us, as long as a
SmolLM2 prefill product; but after a prange GNU OpenMP's workers spin for milliseconds, and where the next
kernel runs on the pool they take its core (MiniLM's long batch: 221 ms a batch with the sgemms in a prange
against 188 on the pool, whose attention and norms use the pool). So the caller says which threads the
work around the product runs on: mul_mat's decoded tiles and attention batches (decoded by the prange
decoders) take omp=True, f32 weights the pool. In a forked child (GNU OpenMP's threads do not survive a
fork) or on a pool thread, omp is ignored. A row's result does not depend on the split (ranges of at least
MIN_ROWS rows: MKL takes other kernels for fewer, whose bits differ), and the tests check that a product
equals its unsplit self bit for bit, both ways.

    available()              whether MKL is loaded and used (False without the wheel, off x86-64, or with
                             REFIMPL_MKL=0 in the environment)
    sgemm_nt(x, w, out)      out = x @ w.T for f32 matrices with unit inner strides; False (nothing written)
                             where MKL is not used or the operands do not fit, and the caller runs NumPy
"""
from __future__ import annotations

import ctypes
import os
import threading

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core.extending import intrinsic

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_THREADING_SEQUENTIAL, _INTERFACE_LP64 = 1, 0
MIN_ROWS = 32            # rows per thread at least: below that one call on this thread

_lock = threading.Lock()
_sgemm = None            # the cblas_sgemm ctypes function once loaded; False when MKL is not used
_path = None             # the library it came from
_addr = 0                # cblas_sgemm's address, for _call_sgemm


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
    global _sgemm, _path
    with _lock:
        if _sgemm is not None:
            return _sgemm
        _sgemm = False
        if os.environ.get("REFIMPL_MKL", "1").strip().lower() in ("0", "false", "no", "off"):
            return _sgemm
        path = _find()
        if path is None:
            return _sgemm
        try:
            lib = ctypes.CDLL(path)
            lib.MKL_Set_Threading_Layer.argtypes = [ctypes.c_int]
            lib.MKL_Set_Threading_Layer.restype = ctypes.c_int
            lib.MKL_Set_Interface_Layer.argtypes = [ctypes.c_int]
            lib.MKL_Set_Interface_Layer.restype = ctypes.c_int
            lib.MKL_Set_Interface_Layer(_INTERFACE_LP64)
            if lib.MKL_Set_Threading_Layer(_THREADING_SEQUENTIAL) != _THREADING_SEQUENTIAL:
                return _sgemm                            # MKL already runs threaded in this process: leave it
            f = lib.cblas_sgemm
        except (OSError, AttributeError):
            return _sgemm
        i, p = ctypes.c_int, ctypes.c_void_p
        f.argtypes = [i, i, i, i, i, i, ctypes.c_float, p, i, p, i, ctypes.c_float, p, i]
        f.restype = None
        _sgemm, _path = f, path
        global _addr
        _addr = ctypes.cast(f, ctypes.c_void_p).value
        return _sgemm


def available() -> bool:
    return bool(_load())


def library() -> str | None:
    """The path of the MKL library in use, or None."""
    return _path if available() else None


def _fits(a: np.ndarray) -> bool:
    return (type(a) is np.ndarray and a.dtype == np.float32 and a.ndim == 2 and a.shape[0] > 0 and a.shape[1] > 0
            and a.strides[1] == 4 and a.strides[0] % 4 == 0 and a.strides[0] >= 4 * a.shape[1]
            and a.strides[0] // 4 < 2 ** 31)


@intrinsic
def _call_sgemm(typingctx, fp, m, n, k, a, lda, b, ldb, c, ldc):
    """cblas_sgemm(RowMajor, NoTrans, Trans, m, n, k, 1, a, lda, b, ldb, 0, c, ldc) through its address fp
    (an int: the function is a run-time argument, so a caller compiled with it caches on disk); a, b, c
    addresses, the rest ints, each < 2**31 (the caller checks)."""
    args = (fp, m, n, k, a, lda, b, ldb, c, ldc)
    if not all(isinstance(t, types.Integer) for t in args):
        return None

    def codegen(context, builder, sig, vals):
        i32, f32, i8p = ir.IntType(32), ir.FloatType(), ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [i32] * 6 + [f32, i8p, i32, i8p, i32, f32, i8p, i32])
        v = [context.cast(builder, x, t, types.int64) for x, t in zip(vals, sig.args)]
        fn = builder.inttoptr(v[0], fnty.as_pointer())
        c32 = lambda x: ir.Constant(i32, x)                                   # noqa: E731
        n32 = lambda x: builder.trunc(x, i32)                                 # noqa: E731
        ptr = lambda x: builder.inttoptr(x, i8p)                              # noqa: E731
        builder.call(fn, [c32(_ROW_MAJOR), c32(_NO_TRANS), c32(_TRANS), n32(v[1]), n32(v[2]), n32(v[3]),
                          ir.Constant(f32, 1.0), ptr(v[4]), n32(v[5]), ptr(v[6]), n32(v[7]),
                          ir.Constant(f32, 0.0), ptr(v[8]), n32(v[9])])
        return context.get_dummy_value()
    return types.void(*args), codegen


@njit(cache=True, parallel=True, nogil=True)
def _par_rows(fp, xp, lda, wp, ldb, op, ldc, m, n, k, nchunk):
    """out = x @ w.T with x's rows split into nchunk ranges, one sgemm each on Numba's threads."""
    for c in prange(nchunk):
        lo = m * c // nchunk
        hi = m * (c + 1) // nchunk
        _call_sgemm(fp, hi - lo, n, k, xp + 4 * lda * lo, lda, wp, ldb, op + 4 * ldc * lo, ldc)



def sgemm_nt(x: np.ndarray, w: np.ndarray, out: np.ndarray, omp: bool = False) -> bool:
    """out[...] = x @ w.T through MKL: x (m, k), w (n, k), out (m, n) f32, each with unit inner stride and rows
    any distance apart (views of larger matrices too); out must not overlap x or w. Returns True when done,
    False (out untouched) when MKL is not used or the operands do not fit. omp: split the rows over Numba's
    OpenMP threads instead of the thread pool (see above)."""
    f = _load()
    if not f or not (_fits(x) and _fits(w) and _fits(out)):
        return False
    m, k = x.shape
    n = w.shape[0]
    if w.shape[1] != k or out.shape != (m, n) or max(m, n, k) >= 2 ** 31 or not out.flags.writeable:
        return False
    if np.shares_memory(out, x) or np.shares_memory(out, w):
        return False
    lda, ldb, ldc = x.strides[0] // 4, w.strides[0] // 4, out.strides[0] // 4
    xp, wp, op = x.ctypes.data, w.ctypes.data, out.ctypes.data

    def rows(lo: int, hi: int) -> None:
        f(_ROW_MAJOR, _NO_TRANS, _TRANS, hi - lo, n, k, 1.0, xp + 4 * lda * lo, lda, wp, ldb, 0.0,
          op + 4 * ldc * lo, ldc)

    from ._common import n_threads, parallel_ranges, prange_ok
    nchunk = min(n_threads(), m // MIN_ROWS)
    if nchunk <= 1:
        rows(0, m)
    elif not omp or not prange_ok():
        parallel_ranges(rows, m, MIN_ROWS)
    else:
        _par_rows(_addr, xp, lda, wp, ldb, op, ldc, m, n, k, nchunk)
    return True
