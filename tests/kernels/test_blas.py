"""kernels.blas: the numba backend's GEMMs -- MKL's sgemm split over refimpl's threads where MKL is in use, else
NumPy's matmul -- and the backend's forward scope.

What must hold: a split product has the bits of the unsplit call, in a prange and on the thread pool, split by
x's rows or by the weight's, for views whose rows lie apart, and writes nothing outside its output; it is an
f32 product within the f32 summation bound; operands the Fortran call does not take (and every product
without MKL) are NumPy's, bit for bit; inside the forward scope the kernels' thread count is the one read at
entry, and outside it follows `numba.set_num_threads`; a forked child's split product takes the pool and
finishes.
"""
import contextlib

import numpy as np
import pytest

numba = pytest.importorskip("numba", reason="numba is not installed: refimpl.kernels is Numba code")

from hypothesis import given, settings, strategies as st  # noqa: E402

from refimpl.kernels import _common, blas, mkl  # noqa: E402
from tests.test_numerics_fast import assert_within_fast_bound  # noqa: E402

pytestmark = pytest.mark.equivalence
needs_mkl = pytest.mark.skipif(not mkl.available(), reason="the optional mkl wheel is not installed (refimpl[mkl]): "
                               "without it every product is NumPy's (test_without_mkl_products_are_numpys)")


@contextlib.contextmanager
def _threads(n):
    before = numba.get_num_threads()
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    try:
        yield
    finally:
        numba.set_num_threads(before)


def _case(rng, m, n, k, pad):
    xb = rng.standard_normal((m, k + pad)).astype(np.float32)
    w = (rng.standard_normal((n, k)) * 10.0 ** rng.integers(-3, 4, (n, 1))).astype(np.float32)
    big = np.full((m, n + 2 * pad), np.float32(7.0))
    return xb[:, :k], w, big, big[:, pad:pad + n]         # x rows k + pad apart; out a column range


@needs_mkl
@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 200), n=st.integers(1, 200), k=st.integers(1, 400), pad=st.integers(0, 4),
       seed=st.integers(0, 2 ** 32 - 1))
def test_split_products_keep_the_bits_of_one_call(m, n, k, pad, seed):
    x, w, big, out = _case(np.random.default_rng(seed), m, n, k, pad)
    one = np.empty((m, n), np.float32)
    with _threads(1):
        blas.gemm_nt(x, w, one)                                   # one sgemm call
    for omp in (True, False):                                     # the prange, then the pool
        out[...] = 0
        with _threads(2):
            blas.gemm_nt(x, w, out, omp=omp)
        assert np.array_equal(out.view(np.uint32), one.view(np.uint32)), (omp, "the split changed a result")
        assert (big[:, :pad] == 7.0).all() and (big[:, pad + n:] == 7.0).all(), "wrote outside the view"
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    assert_within_fast_bound(one, x64 @ w64.T, np.abs(x64) @ np.abs(w64).T, k, f"gemm_nt {m}x{k}x{n}")


def test_operands_the_call_does_not_take_go_to_numpy():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 48)).astype(np.float32)
    w = rng.standard_normal((40, 48)).astype(np.float32)
    with _threads(2):
        for xs, ws in ((x[:, ::2], w[:, ::2]), (np.asfortranarray(x), w), (x.astype(np.float64), w.astype(np.float64)),
                       (x.astype(np.float16), w.astype(np.float16))):
            out = np.empty((64, 40), xs.dtype)
            blas.gemm_nt(xs, ws, out)
            assert np.array_equal(out, np.matmul(xs, ws.T)), (xs.dtype, xs.flags.c_contiguous)
        y = np.zeros((64, 100), np.float32)
        y[:, :48] = x
        blas.gemm_nt(y[:, :40], w[:, :40], y[:, 8:48])          # out overlaps x: NumPy's (it copies)
        assert np.array_equal(y[:, 8:48], np.matmul(x[:, :40], w[:, :40].T))


def test_without_mkl_products_are_numpys(monkeypatch):
    monkeypatch.setattr(blas, "_funcs", {})
    monkeypatch.setattr(mkl, "_lib", False)
    assert blas.numba_gemm(np.float32) is None
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((96, 64)).astype(np.float32), rng.standard_normal((50, 64)).astype(np.float32)
    out = np.empty((96, 50), np.float32)
    with _threads(2):
        blas.gemm_nt(x, w, out, omp=True)
    assert np.array_equal(out, np.matmul(x, w.T))


def test_the_forward_scope_fixes_the_thread_count_for_the_pass():
    with _threads(1):
        assert _common.n_threads() == 1
        with blas.forward_scope(1, "decoder"):
            numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
            assert _common.n_threads() == 1                     # read at entry
            with blas.forward_scope(64, "encoder"):
                assert _common.n_threads() == numba.get_num_threads()
            assert _common.n_threads() == 1
        assert _common.n_threads() == numba.get_num_threads()    # outside: Numba's setting again


@needs_mkl
def test_a_split_product_in_a_forked_child():
    """GNU OpenMP's threads do not survive a fork, nor do the thread pool's: in a child of a process whose
    split product started them, a split product takes a new thread pool instead of the prange, finishes, and
    equals the parent's."""
    from refimpl.kernels._common import parallel_ranges
    from tests.kernels._fork import in_forked_child
    rng = np.random.default_rng(5)
    x = rng.standard_normal((256, 300)).astype(np.float32)
    w = rng.standard_normal((90, 300)).astype(np.float32)
    with _threads(2):
        parallel_ranges(lambda lo, hi: None, 4, 1)                   # the thread pool exists before the fork
        parent = np.empty((256, 90), np.float32)
        blas.gemm_nt(x, w, parent, omp=True)                         # starts the OpenMP threads here

        def child():
            got = np.empty((256, 90), np.float32)
            blas.gemm_nt(x, w, got, omp=True)
            return got
        got = in_forked_child(child, "gemm_nt")
    assert np.array_equal(got.view(np.uint32), parent.view(np.uint32))
