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
        numba.set_num_threads(max(2, before))
        assert mkl.sgemm_nt(x, w, out)
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(out.view(np.uint32), one.view(np.uint32)), "the split changed a result"
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
    monkeypatch.setattr(mkl, "sgemm_nt", lambda *a: calls.append(a[0].shape) or orig(*a))
    with refimpl.backend("numba"):
        fast = refimpl.mul_mat(w, b, numerics="fast")
        exact = refimpl.mul_mat(w, b, numerics="exact")
    assert calls == [(140, 320)]
    s = np.abs(b).astype(np.float64) @ np.abs(w).astype(np.float64).T
    assert_within_fast_bound(fast, exact.astype(np.float64), s, 320, "mul_mat fast through MKL")
