"""The numba backend's GEMMs: NumPy's matmul, or MKL's sgemm split over refimpl's threads where MKL is in use.

    gemm_nt(x, w, out, omp=False)   out[...] = x @ w.T (2-D, unit inner strides, views with row strides too)
    matmul_t(x, w, out)             out[...] = x @ w.T in f64 (exact numerics' tiles): NumPy's matmul on BLAS's
                                    one thread, w's rows split over refimpl's threads
    forward_scope(n_tokens, w)      the numba backend's context around a model's forward pass: the kernels'
                                    thread count read once for the pass (`_common.threads_fixed`)

MKL (kernels/mkl.py) runs sequential in this process, so `gemm_nt` splits an f32 product over refimpl's
threads, one MKL `sgemm` call per range of rows -- of the larger operand: x's, or the weight's (out's
columns), so that each call packs the other operand whole --: in a Numba prange (`_par_rows`) where the work
around the product runs on Numba's OpenMP threads (omp=True: a block weight's tiles decoded by the prange
decoders, a prefill's attention), else on the thread pool of `parallel_ranges` (f32 weights: BERT, whose
other kernels run there). GNU OpenMP's workers spin for milliseconds after a prange and the pool's threads
would meet them; a range starts in ~5-10 us in a prange, ~65-100 us on the pool. In a forked child or on a
pool thread omp is ignored. Ranges keep >= MIN_ROWS rows (MKL takes other kernels for fewer) and a row's
result does not depend on the split (tested bit for bit against the unsplit call).

MKL's sgemm is passed to the drivers as a first-class function (Numba's documented ctypes support), so they
compile once and cache on disk. Everything else in f32 -- without MKL, operands the Fortran call does not
take -- is `np.matmul(x, w.T, out=out)` on BLAS's own threads. NumPy's OpenBLAS
keeps its workers spinning ~0.1 s after a threaded call (OPENBLAS_THREAD_TIMEOUT, its documented setting,
read when the library loads: `OPENBLAS_THREAD_TIMEOUT=4` makes them sleep at once), and they take the cores
from the Numba kernels that follow: exact numerics' f64 tiles of a prefill, on BLAS's threads, left SmolLM2's
exact decode at 2 threads 14 % slower than when OpenBLAS's jobs ran on refimpl's threads (best of 3
interleaved rounds, AMD EPYC, docs/benchmarks.md). So `matmul_t` runs them with BLAS limited to one thread
(threadpoolctl, its public API, on the main thread: see single_blas_thread; so does the forward scope of
an exact pass, so that no other product of the pass leaves workers spinning either) and splits the
weight's rows over refimpl's threads: OpenBLAS splits a product by rows and columns, never along k, so
each output has the bits of the unsplit call (tested).
"""
from __future__ import annotations

import contextlib
import ctypes
import threading

import numpy as np
from numba import njit, prange

from ..dispatch import current_numerics
from . import mkl
from ._common import n_threads, parallel_ranges, prange_ok, threads_fixed

MIN_ROWS = 32            # rows per range at least (fewer take other micro-kernels in MKL)

_P = ctypes.c_void_p
GEMM_T = ctypes.CFUNCTYPE(None, *([_P] * 13))     # Fortran ?gemm: every argument by reference
_funcs: dict = {}


def numba_gemm(dtype):
    """The Fortran ?gemm `gemm_nt` splits for dtype: MKL's sgemm for f32 where kernels/mkl.py is in use, else
    None."""
    key = np.dtype(dtype).char
    if key not in _funcs:
        _funcs[key] = mkl.fortran_sgemm(GEMM_T) if key == "f" else None
    return _funcs[key]


@njit(cache=True, nogil=True)
def _rows(fn, x, w, out, lo, hi, one, zero):
    """out[lo:hi] = x[lo:hi] @ w.T by one Fortran ?gemm call: column-major C^T (n, m) = W^T' X^T, i.e.
    gemm('T', 'N', n, m, k, 1, w, ldw, x, ldx, 0, out, ldo)."""
    if hi <= lo:
        return
    k = x.shape[1]
    n = w.shape[0]
    isz = x.itemsize
    ints = np.empty(6, np.int32)
    ints[0] = n
    ints[1] = hi - lo
    ints[2] = k
    ints[3] = max(w.strides[0] // isz, k)
    ints[4] = max(x.strides[0] // isz, k)
    ints[5] = max(out.strides[0] // isz, n)
    ch = np.empty(2, np.uint8)
    ch[0] = 84              # 'T'
    ch[1] = 78              # 'N'
    xs = x[lo:hi]
    os_ = out[lo:hi]
    fn(ch[0:].ctypes, ch[1:].ctypes, ints[0:].ctypes, ints[1:].ctypes, ints[2:].ctypes, one.ctypes,
       w.ctypes, ints[3:].ctypes, xs.ctypes, ints[4:].ctypes, zero.ctypes, os_.ctypes, ints[5:].ctypes)


@njit(cache=True, nogil=True)
def _cols(fn, x, w, out, lo, hi, one, zero):
    """out[:, lo:hi] = x @ w[lo:hi].T by one ?gemm call (a range of the weight's rows)."""
    if hi > lo:
        _rows(fn, x, w[lo:hi], out[:, lo:hi], 0, x.shape[0], one, zero)


@njit(cache=True, nogil=True, parallel=True)
def _par_rows(fn, x, w, out, nchunk, by_w, one, zero):
    """x's rows (by_w: w's rows, i.e. out's columns) split into nchunk ranges, one ?gemm per prange
    iteration."""
    m = w.shape[0] if by_w else x.shape[0]
    for c in prange(nchunk):
        lo, hi = m * c // nchunk, m * (c + 1) // nchunk
        if by_w:
            _cols(fn, x, w, out, lo, hi, one, zero)
        else:
            _rows(fn, x, w, out, lo, hi, one, zero)


def _fits(a: np.ndarray, dt) -> bool:
    return (type(a) is np.ndarray and a.dtype == dt and a.ndim == 2 and a.shape[0] > 0 and a.shape[1] > 0
            and a.strides[1] == a.itemsize and a.strides[0] % a.itemsize == 0
            and a.strides[0] >= a.itemsize * a.shape[1] and a.strides[0] // a.itemsize < 2 ** 31)


def gemm_nt(x: np.ndarray, w: np.ndarray, out: np.ndarray, omp: bool = False) -> None:
    """out[...] = x @ w.T: x (m, k), w (n, k), out (m, n), one dtype; views with row strides (unit inner
    stride) are fine. f32 where MKL is in use: split over refimpl's threads (in a prange with omp, else on the
    thread pool; see above); anything else, or operands the Fortran call does not take (out overlapping an
    input, ...), is NumPy's `np.matmul(x, w.T, out=out)`."""
    dt = x.dtype
    fn = numba_gemm(dt) if dt == np.float32 else None
    m = x.shape[0] if x.ndim == 2 else 0
    if (fn is None or not (_fits(x, dt) and _fits(w, dt) and _fits(out, dt)) or w.shape[1] != x.shape[1]
            or out.shape != (m, w.shape[0]) or max(out.shape + x.shape) >= 2 ** 31 or not out.flags.writeable
            or np.shares_memory(out, x) or np.shares_memory(out, w)):
        np.matmul(x, w.T, out=out)
        return
    one, zero = np.ones(1, dt), np.zeros(1, dt)
    n = w.shape[0]
    by_w = n > m                 # split the larger operand: each call packs the other one whole
    nchunk = min(n_threads(), (n if by_w else m) // MIN_ROWS)
    if nchunk <= 1:
        _rows(fn, x, w, out, 0, m, one, zero)
    elif omp and prange_ok():
        _par_rows(fn, x, w, out, nchunk, by_w, one, zero)
    elif by_w:
        parallel_ranges(lambda lo, hi: _cols(fn, x, w, out, lo, hi, one, zero), n, MIN_ROWS)
    else:
        parallel_ranges(lambda lo, hi: _rows(fn, x, w, out, lo, hi, one, zero), m, MIN_ROWS)


SPLIT_MIN_MACS = 1 << 22     # multiply-adds per thread at least before matmul_t splits a product

_blas = None                 # threadpoolctl's controller of the BLAS libraries (made on first use)
_blas_depth = 0              # the main thread's open single_blas_thread() scopes
_blas_limit = None           # their limit (threadpoolctl's), restored when the outermost ends


@contextlib.contextmanager
def single_blas_thread():
    """BLAS on one thread until the block ends, where the block runs on the main thread (threadpoolctl's
    public limit; nested scopes share it, the outermost restores the setting). NumPy's OpenBLAS (0.3.31)
    ignores a thread-count change made on any other thread -- measured: neither a limit nor its restoring
    takes effect there --, so a scope on another thread leaves BLAS as it is."""
    global _blas, _blas_depth, _blas_limit
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _blas_depth == 0:
        if _blas is None:
            from threadpoolctl import ThreadpoolController
            _blas = ThreadpoolController().select(user_api="blas")
        _blas_limit = _blas.limit(limits=1)
    _blas_depth += 1
    try:
        yield
    finally:
        _blas_depth -= 1
        if _blas_depth == 0:
            _blas_limit.restore_original_limits()
            _blas_limit = None


def matmul_t(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """out[...] = x @ w.T: x (..., m, k) and w (n, k) f64, out (..., m, n) of any float type (assigned, so
    rounded once). On several of refimpl's threads, with BLAS on one (see the module doc): w's rows split over
    refimpl's threads (the pool) where there is enough work, each range one NumPy matmul. On one thread,
    NumPy's matmul as BLAS is set: there is no Numba thread for its workers to take a core from."""
    n, k = w.shape
    m = int(np.prod(x.shape[:-1], dtype=np.int64))
    th = n_threads()
    if th <= 1:
        out[...] = x @ w.T
        return
    with single_blas_thread():
        if n < 2 * MIN_ROWS or m * n * k < th * SPLIT_MIN_MACS:
            out[...] = x @ w.T
            return

        def part(lo: int, hi: int) -> None:
            out[..., lo:hi] = x @ w[lo:hi].T
        parallel_ranges(part, n, max(MIN_ROWS, n // th))


@contextlib.contextmanager
def forward_scope(n_tokens: int, workload: str):
    """The numba backend's scope around a model's forward pass (refimpl.backends.forward_scope): the kernels'
    thread count read once for the pass (Numba's public getter takes ~1 us, and a decode step asks hundreds
    of times); in exact numerics on several threads, BLAS on one for the pass (the module doc: its f64
    products split over refimpl's threads instead, and no BLAS worker spins against the Numba kernels)."""
    with threads_fixed():
        if current_numerics() == "exact" and n_threads() > 1:
            with single_blas_thread():
                yield
        else:
            yield
