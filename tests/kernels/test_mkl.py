"""kernels.mkl: MKL's sgemm for numerics="fast" f32-weight products, used where the `mkl` wheel is installed.

What must hold: the product is an f32 product within the f32 summation bound of the f64 one (any order of
the k fl32 terms), the rows split over threads give the bits of one unsplit call, views with row strides
(a column range of a larger output, rows of a larger input) land where NumPy's would, operands it does not
take are declined with nothing written, REFIMPL_MKL=0 turns it off, and mul_mat in fast numerics sends its
f32-weight prefill products here (and stays within the fast bound of exact mode). Skipped without the
optional `mkl` wheel (`pip install refimpl[mkl]`); the test command installs it.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("numba", reason="numba is not installed: refimpl.kernels is Numba code")

from hypothesis import given, settings, strategies as st  # noqa: E402

from refimpl.kernels import mkl  # noqa: E402

pytestmark = pytest.mark.equivalence

if not mkl.available():
    pytest.skip("the optional mkl wheel is not installed (or REFIMPL_MKL=0): refimpl[mkl]", allow_module_level=True)

import numba  # noqa: E402

import refimpl  # noqa: E402
from tests.test_numerics_fast import assert_within_fast_bound  # noqa: E402


def _bound_check(got, x, w, what):
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    s = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T
    assert_within_fast_bound(got, exact, s, x.shape[1], what)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 300), n=st.integers(1, 200), k=st.integers(1, 700), pad=st.integers(0, 5),
       seed=st.integers(0, 2 ** 32 - 1))
def test_sgemm_nt_is_an_f32_product_and_splits_without_changing_bits(m, n, k, pad, seed):
    rng = np.random.default_rng(seed)
    xb = rng.standard_normal((m, k + pad), dtype=np.float32)
    w = (rng.standard_normal((n, k)) * 10.0 ** rng.integers(-3, 4, (n, 1))).astype(np.float32)
    x = xb[:, :k]                                     # rows k + pad apart
    big = np.full((m, n + 2 * pad), np.float32(7.0))
    out = big[:, pad:pad + n]                         # a column range of a larger matrix
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = np.empty((m, n), np.float32)
        assert mkl.sgemm_nt(x, w, one)
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        assert mkl.sgemm_nt(x, w, out)
        out2 = np.empty((m, n), np.float32)
        assert mkl.sgemm_nt(x, w, out2, omp=True)                 # the same split in a prange
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(out.view(np.uint32), one.view(np.uint32)), "the split changed a result"
    assert np.array_equal(out2.view(np.uint32), one.view(np.uint32)), "the prange split changed a result"
    assert (big[:, :pad] == 7.0).all() and (big[:, pad + n:] == 7.0).all(), "wrote outside the view"
    _bound_check(out, x, w, f"sgemm_nt {m}x{k} @ ({n}x{k}).T")


def test_sgemm_nt_declines_what_it_does_not_take():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 16), dtype=np.float32)
    w = rng.standard_normal((4, 16), dtype=np.float32)
    out = np.full((8, 4), np.float32(3.0))
    assert not mkl.sgemm_nt(x.astype(np.float64), w, out)           # f64
    assert not mkl.sgemm_nt(x[:, ::2], w[:, ::2], out)               # inner stride 2
    assert not mkl.sgemm_nt(x, w[:, :8], out)                        # k differs
    assert not mkl.sgemm_nt(x, w, out[:, :3])                        # out's shape
    assert not mkl.sgemm_nt(x, w, out.T.copy().T)                    # out column-major
    keep = x.copy()
    assert not mkl.sgemm_nt(x[:, :4], w[:, :4], x[:, 2:6])          # out overlaps x
    assert (out == 3.0).all() and np.array_equal(x, keep)


def test_mkl_is_off_with_refimpl_mkl_0():
    code = "from refimpl.kernels import mkl; print(mkl.available(), mkl.library())"
    env = dict(os.environ, REFIMPL_MKL="0")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert r.stdout.split() == ["False", "None"]


def test_fast_mul_mat_sends_f32_weight_products_to_mkl(monkeypatch):
    rng = np.random.default_rng(2)
    w = rng.standard_normal((96, 320), dtype=np.float32)
    b = rng.standard_normal((2, 70, 320), dtype=np.float32)           # more rows than a decode step
    calls = []
    orig = mkl.sgemm_nt
    monkeypatch.setattr(mkl, "sgemm_nt", lambda *a, **kw: calls.append((a[0].shape, kw.get("omp", False)))
                        or orig(*a, **kw))
    with refimpl.backend("numba"):
        fast = refimpl.mul_mat(w, b, numerics="fast")
        exact = refimpl.mul_mat(w, b, numerics="exact")
    assert calls == [((140, 320), False)]                     # f32 weights: on the thread pool
    s = np.abs(b).astype(np.float64) @ np.abs(w).astype(np.float64).T
    assert_within_fast_bound(fast, exact.astype(np.float64), s, 320, "mul_mat fast through MKL")


def _fast_and_exact(a, b):
    with refimpl.backend("numba"):
        return refimpl.mul_mat(a, b, numerics="fast"), refimpl.mul_mat(a, b, numerics="exact")


@pytest.mark.parametrize("t", ["q4_1", "q8_0", "q4_K", "f16"])
def test_fast_prefill_of_block_weights_goes_to_mkl_on_any_thread_count(t, monkeypatch):
    """Quantized (and f16) weights in a fast prefill: the tile decoded by the prange decoders, the product by
    MKL -- so no OpenBLAS thread is left spinning for the decode steps that follow -- within the fast bound
    of exact mode, and the same bits on 1 and 2 threads (decoding is exact; MKL's row ranges keep >= 32)."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((160, 512)).astype(np.float32)
    a = w.astype(np.float16) if t == "f16" else refimpl.quantize(w, t)
    b = rng.standard_normal((130, 512)).astype(np.float32)
    calls = []
    orig = mkl.sgemm_nt
    monkeypatch.setattr(mkl, "sgemm_nt", lambda *x, **kw: calls.append((x[1].shape, kw.get("omp"))) or orig(*x, **kw))
    before = numba.get_num_threads()
    outs = []
    try:
        for th in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(th)
            fast, exact = _fast_and_exact(a, b)
            outs.append(fast)
    finally:
        numba.set_num_threads(before)
    assert calls and all(c == ((160, 512), True) for c in calls), calls      # on Numba's threads, as the decode
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32)), "threads changed the bits"
    wd = refimpl.dequantize(a) if t != "f16" else a.astype(np.float32)
    s = np.abs(b).astype(np.float64) @ np.abs(wd).astype(np.float64).T
    assert_within_fast_bound(outs[1], exact.astype(np.float64), s, 512, f"fast prefill {t} through MKL")


@pytest.mark.parametrize("view", [False, True])
def test_fast_batched_products_go_to_mkl(view, monkeypatch):
    """Attention's batched f32 products (ggml's broadcast: weight batch (i3, i2) serves r3 x r2 batches of b),
    the weight also a view whose rows lie apart (a KV cache's first columns): through MKL, within the fast
    bound."""
    rng = np.random.default_rng(4)
    base = rng.standard_normal((2, 3, 40, 64 if view else 48)).astype(np.float32)
    a = base[..., :48]                                                                       # (2, 3, 40, 48)
    b = rng.standard_normal((4, 12, 70, 48)).astype(np.float32)                             # r3 = 2, r2 = 4
    calls = []
    orig = mkl.sgemm_nt
    monkeypatch.setattr(mkl, "sgemm_nt", lambda *x, **kw: calls.append(x[0].shape) or orig(*x, **kw))
    fast, exact = _fast_and_exact(a, b)
    assert calls, "MKL was not called"
    ar = np.repeat(np.repeat(np.abs(a).astype(np.float64), 2, axis=0), 4, axis=1)
    s = np.abs(b).astype(np.float64) @ np.swapaxes(ar, -1, -2)
    assert fast.shape == exact.shape == (4, 12, 70, 40)
    assert_within_fast_bound(fast, exact.astype(np.float64), s, 48, "batched mul_mat through MKL")


def test_sgemm_nt_in_a_forked_child():
    """GNU OpenMP's threads do not survive a fork, nor do the thread pool's: in a child of a process whose
    sgemm_nt started them (2 threads where Numba has them), a split product takes a new thread pool instead
    of the prange driver, finishes, and equals the parent's."""
    from refimpl.kernels._common import parallel_ranges
    from tests.kernels._fork import in_forked_child
    rng = np.random.default_rng(5)
    x = rng.standard_normal((256, 300)).astype(np.float32)
    w = rng.standard_normal((90, 300)).astype(np.float32)
    before = numba.get_num_threads()
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    try:
        parallel_ranges(lambda lo, hi: None, 4, 1)                   # the thread pool exists before the fork
        parent = np.empty((256, 90), np.float32)
        assert mkl.sgemm_nt(x, w, parent, omp=True)                  # starts the OpenMP threads here

        def child():
            got = np.empty((256, 90), np.float32)
            assert mkl.sgemm_nt(x, w, got, omp=True)
            return got
        got = in_forked_child(child, "sgemm_nt")
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(got.view(np.uint32), parent.view(np.uint32))
