"""Properties of the normalization ops (math identities, no ggml needed)."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from refimpl import GGMLShapeError
from refimpl.ops import group_norm, l2_norm, norm, rms_norm, rms_norm_back
from refimpl.testing import assert_nmse, f32_tensor, ggml_ne, tol


pytestmark = pytest.mark.property

def _close(actual, expected, what):
    expected = np.broadcast_to(np.asarray(expected, np.float64), np.shape(actual))
    assert_nmse(actual, expected, tol(what, "f32", "property").nmse, what)


@given(a=ggml_ne.flatmap(f32_tensor), eps=st.sampled_from([0.0, 1e-6, 1e-5, 1e-1]))
def test_rms_norm_sets_mean_square(a, eps):            # mean(out**2) == ms / (ms + eps)
    ms = np.mean(np.square(a, dtype=np.float64), axis=-1)
    # rows whose f32 squares underflow: with eps 0 they divide by 0, with eps > 0 their outputs are f32
    # subnormals (a row [1e-45] gives 3e-43, a few significant bits), outside the relation's precision
    a, ms = a[ms > 1e-30], ms[ms > 1e-30]
    out_ms = np.mean(np.square(rms_norm(a, eps), dtype=np.float64), axis=-1)
    _close(out_ms, ms / (ms + eps), "rms_norm")


@given(a=ggml_ne.flatmap(f32_tensor), eps=st.sampled_from([1e-6, 1e-5, 1e-1]))
def test_norm_gives_zero_mean_and_unit_variance(a, eps):   # var(out) == var / (var + eps)
    out = norm(a, eps).astype(np.float64)
    var = np.var(a.astype(np.float64), axis=-1)
    # the mean is only known to an ulp of max|a| (<= 10): scale the residual mean back to a's units
    assert np.all(np.abs(np.mean(out, axis=-1) * np.sqrt(var + eps)) <= 1e-5)
    _close(np.var(out, axis=-1), var / (var + eps), "norm")


@given(a=ggml_ne.flatmap(f32_tensor), eps=st.sampled_from([0.0, 1e-12, 1e-6]))
def test_l2_norm_gives_unit_rows(a, eps):
    nrm = np.linalg.norm(a.astype(np.float64), axis=-1)
    # rows whose f32 squares are subnormal (norm < ~1e-18: ggml squares in f32) lose their precision there
    keep = nrm > max(eps, 1e-15)
    out = l2_norm(a, eps).astype(np.float64)
    _close(np.linalg.norm(out, axis=-1)[keep], 1.0, "l2_norm")


def test_l2_norm_eps_bounds_the_norm_not_its_square():
    a = np.full((1, 4), 1e-3, np.float32)            # ||a|| = 2e-3 < eps = 1e-2
    np.testing.assert_allclose(l2_norm(a, 1e-2), a / np.float32(1e-2), **tol("l2_norm", "f32", "eps").allclose())


@given(data=st.data())
def test_group_norm_is_norm_over_each_group(data):
    W, H, N = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 4)), data.draw(st.integers(1, 2))
    groups, cpg = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3))
    a = np.random.default_rng(data.draw(st.integers(0, 2**31))).uniform(-3, 3, (N, groups * cpg, H, W))
    a = a.astype(np.float32)
    out = group_norm(a, groups, 1e-5)
    flat = a.reshape(N, groups, cpg * H * W)
    _close(out.reshape(flat.shape), norm(flat, 1e-5), "group_norm")


def test_group_norm_last_group_is_smaller():
    a = np.random.default_rng(0).uniform(-1, 1, (1, 10, 3, 4)).astype(np.float32)
    out = group_norm(a, 4, 0.0)                       # ceil(10/4) = 3: groups of 3, 3, 3, 1 channels
    last = a[:, 9:].reshape(1, 1, -1)
    _close(out[:, 9:].reshape(1, 1, -1), norm(last, 0.0), "group_norm")


@given(a=ggml_ne.flatmap(f32_tensor), eps=st.sampled_from([1e-6, 1e-3, 1e-1]))
def test_rms_norm_back_is_the_gradient_of_rms_norm(a, eps):
    x = a.astype(np.float64)
    dy = np.cos(np.arange(a.size, dtype=np.float64)).reshape(a.shape)
    n = x.shape[-1]
    ms = np.mean(x * x, axis=-1, keepdims=True) + eps
    # d/dx of x / sqrt(ms): (dy - x * mean(x*dy) / ms) / sqrt(ms)
    want = (dy - x * np.mean(x * dy, axis=-1, keepdims=True) / ms) / np.sqrt(ms)
    got = rms_norm_back(dy.astype(np.float32), a, eps).astype(np.float64)
    # the two terms cancel (dx ~ eps when a row is one value): judge the error against the terms' size
    size = np.sqrt(np.mean(np.square(dy / np.sqrt(ms))))
    assert np.mean(np.square(got - want)) / size**2 <= tol("rms_norm_back", "f32", "property").nmse
    del n


def test_norms_reject_what_ggml_rejects():
    x = np.ones((3, 4), np.float32)
    with pytest.raises(GGMLShapeError):
        norm(x.astype(np.float16), 1e-5)
    with pytest.raises(GGMLShapeError):
        rms_norm(x, -1.0)
    with pytest.raises(GGMLShapeError):
        rms_norm(np.ones((4, 3), np.float32).T, 1e-5)     # ggml asserts contiguous rows
    with pytest.raises(GGMLShapeError):
        rms_norm_back(x, np.ones((3, 5), np.float32), 1e-5)
    with pytest.raises(GGMLShapeError):
        group_norm(x, 0, 1e-5)
