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
from tests._profiles import examples  # noqa: E402

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
@settings(max_examples=examples(30), deadline=None)
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


@settings(max_examples=examples(25), deadline=None)
@given(m=st.integers(1, 200), n=st.integers(1, 700), k=st.integers(1, 300), batch=st.sampled_from([(), (1, 3)]),
       seed=st.integers(0, 2 ** 16))
def test_matmul_t_has_the_bits_of_one_call(m, n, k, batch, seed):
    """Exact numerics' f64 tiles: split over the weight's rows with BLAS on one thread, or not split, every
    output has the bits of NumPy's one `x @ w.T` on BLAS's own threads, rounded once into the output."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(batch + (m, k))
    w = rng.standard_normal((n, k)) * 10.0 ** rng.integers(-3, 4, (n, 1))
    want = (x @ w.T).astype(np.float32)
    old = blas.SPLIT_MIN_MACS
    try:
        blas.SPLIT_MIN_MACS = 1                        # split whatever has rows enough, as a large product
        for th in (1, 2):
            with _threads(th):
                out = np.full(batch + (m, n), np.nan, np.float32)
                blas.matmul_t(x, w, out)
                assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), (th, x.shape, w.shape)
    finally:
        blas.SPLIT_MIN_MACS = old


def test_single_blas_thread_restores_blas_when_the_outermost_scope_ends():
    """Nested scopes on the main thread share one limit: BLAS runs on one thread while any is open and gets its
    setting back when the outermost ends; a scope on another thread (where OpenBLAS ignores a change) leaves
    the setting alone; an exact pass's forward scope on several threads opens one, on one thread or in a fast
    pass it does not."""
    import threading

    from threadpoolctl import threadpool_info

    import refimpl

    def blas_threads():
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    before = blas_threads()
    with blas.single_blas_thread():
        assert set(blas_threads()) == {1}
        with blas.single_blas_thread():
            assert set(blas_threads()) == {1}
        assert set(blas_threads()) == {1}
    assert blas_threads() == before
    seen = []

    def other():
        with blas.single_blas_thread():
            seen.append(blas_threads())
    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == [before] and blas_threads() == before
    with _threads(2), refimpl.numerics("exact"), blas.forward_scope(128, "llama"):
        assert set(blas_threads()) == {1}
    with _threads(1), refimpl.numerics("exact"), blas.forward_scope(128, "llama"):
        assert blas_threads() == before                 # one Numba thread: BLAS as it is set
    with _threads(2), refimpl.numerics("fast"), blas.forward_scope(128, "llama"):
        assert blas_threads() == before
    assert blas_threads() == before
