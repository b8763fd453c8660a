"""kernels.mkl: MKL's sgemm for numerics="fast" f32 products, used where the `mkl` wheel is installed.

What must hold: MKL's Fortran sgemm is the f32 ?gemm kernels/blas.py splits (the bits-on-split and bound
properties of tests/kernels/test_blas.py then run on it), REFIMPL_MKL=0 turns it off (NumPy's matmul instead),
and mul_mat in fast numerics sends its f32-weight, block-weight and batched prefill products there, within
the fast bound of exact mode and with the same bits on 1 and 2 threads. Skipped without the optional `mkl`
wheel (`pip install refimpl[mkl]`); the test command installs it.
"""
import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("numba", reason="numba is not installed: refimpl.kernels is Numba code")

from refimpl.kernels import blas, mkl  # noqa: E402

pytestmark = pytest.mark.equivalence

if not mkl.available():
    pytest.skip("the optional mkl wheel is not installed (or REFIMPL_MKL=0): refimpl[mkl]", allow_module_level=True)

import numba  # noqa: E402

import refimpl  # noqa: E402
from tests.test_numerics_fast import assert_within_fast_bound  # noqa: E402


def _addr(f):
    return ctypes.cast(f, ctypes.c_void_p).value


def test_mkl_sgemm_is_the_split_f32_gemm():
    f = blas.numba_gemm(np.float32)
    assert f is not None and _addr(f) == _addr(mkl.fortran_sgemm(blas.GEMM_T))
    assert blas.numba_gemm(np.float64) is None                      # exact numerics' f64 tiles: NumPy's
    assert mkl.library() and "mkl_rt" in os.path.basename(mkl.library())


def test_mkl_is_off_with_refimpl_mkl_0():
    code = ("import numpy as np; from refimpl.kernels import blas, mkl; "
            "print(mkl.available(), mkl.library(), blas.numba_gemm(np.float32))")
    env = dict(os.environ, REFIMPL_MKL="0")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert r.stdout.split() == ["False", "None", "None"]


def test_fast_mul_mat_sends_f32_weight_products_to_mkl(monkeypatch):
    rng = np.random.default_rng(2)
    w = rng.standard_normal((96, 320), dtype=np.float32)
    b = rng.standard_normal((2, 70, 320), dtype=np.float32)           # more rows than a decode step
    calls = []
    orig = blas.gemm_nt
    monkeypatch.setattr(blas, "gemm_nt", lambda *a, **kw: calls.append((a[0].shape, kw.get("omp", False)))
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
    orig = blas.gemm_nt
    monkeypatch.setattr(blas, "gemm_nt", lambda *x, **kw: calls.append((x[1].shape, kw.get("omp"))) or orig(*x, **kw))
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
    orig = blas.gemm_nt
    monkeypatch.setattr(blas, "gemm_nt", lambda *x, **kw: calls.append(x[0].shape) or orig(*x, **kw))
    fast, exact = _fast_and_exact(a, b)
    assert calls, "MKL was not called"
    ar = np.repeat(np.repeat(np.abs(a).astype(np.float64), 2, axis=0), 4, axis=1)
    s = np.abs(b).astype(np.float64) @ np.swapaxes(ar, -1, -2)
    assert fast.shape == exact.shape == (4, 12, 70, 40)
    assert_within_fast_bound(fast, exact.astype(np.float64), s, 48, "batched mul_mat through MKL")
