"""Properties of cross_entropy_loss and cross_entropy_loss_back (math identities, no ggml needed)."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from refimpl import GGMLShapeError
from refimpl.ops import cross_entropy_loss, cross_entropy_loss_back
from refimpl.testing import assert_nmse, tol


pytestmark = pytest.mark.property

@st.composite
def _logits_labels(draw):
    shp = tuple(draw(st.integers(1, 4)) for _ in range(draw(st.integers(0, 2)))) + (draw(st.integers(1, 300)),)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.uniform(-20, 20, shp).astype(np.float32)
    e = np.exp(rng.uniform(-3, 3, shp))
    return x, (e / e.sum(-1, keepdims=True)).astype(np.float32)


def _log_softmax64(x):
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@given(_logits_labels())
def test_loss_is_mean_cross_entropy(xy):
    x, y = xy
    nr = x.size // x.shape[-1]
    want = -np.sum(y.astype(np.float64) * _log_softmax64(x)) / nr
    got = cross_entropy_loss(x, y)
    assert got.shape == (1,) and got.dtype == np.float32
    assert_nmse(got, [want], tol("cross_entropy_loss", "f32", "property").nmse)


@given(_logits_labels())
def test_loss_is_at_least_the_label_entropy(xy):      # Gibbs: H(y, p) >= H(y), equal when p == y
    x, y = xy
    y64 = y.astype(np.float64)
    nr = x.size // x.shape[-1]
    h = -np.sum(np.where(y64 > 0, y64 * np.log(np.where(y64 > 0, y64, 1)), 0)) / nr
    assert cross_entropy_loss(x, y)[0] >= h * (1 - 1e-6) - 1e-6
    z = np.log(np.maximum(y, 1e-30)).astype(np.float32)        # logits whose softmax is y
    np.testing.assert_allclose(cross_entropy_loss(z, y)[0], h, **tol("cross_entropy_loss", "f32", "gibbs").allclose())


@given(_logits_labels(), st.sampled_from([1.0, -0.5, 3.0]))
def test_loss_back_is_the_gradient(xy, g):
    x, y = xy
    nr = x.size // x.shape[-1]
    got = cross_entropy_loss_back(np.array([g], np.float32), x, y).astype(np.float64)
    # softmax - labels cancels to an ulp of 1: compare softmax itself, got*nr/g + labels
    softmax = got * nr / g + y
    assert_nmse(softmax, np.exp(_log_softmax64(x)), tol("cross_entropy_loss_back", "f32", "property").nmse)


def test_loss_back_matches_finite_differences_of_the_loss():
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (3, 7))
    y = rng.uniform(0, 1, (3, 7))
    y /= y.sum(-1, keepdims=True)                               # the formula assumes rows of labels sum to 1
    loss = lambda z: -np.sum(y * _log_softmax64(z)) / 3          # noqa: E731
    h, fd = 1e-6, np.zeros_like(x)
    for i in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[i] = h
        fd[i] = (loss(x + d) - loss(x - d)) / (2 * h)
    got = cross_entropy_loss_back(np.ones(1, np.float32), x.astype(np.float32), y.astype(np.float32))
    np.testing.assert_allclose(got, fd, **tol("cross_entropy_loss_back", "f32", "finite-differences").allclose())


def test_losses_reject_what_ggml_rejects():
    x = np.zeros((2, 5), np.float32)
    with pytest.raises(GGMLShapeError):
        cross_entropy_loss(x, np.zeros((2, 6), np.float32))
    with pytest.raises(GGMLShapeError):
        cross_entropy_loss(x.astype(np.float16), x)
    with pytest.raises(GGMLShapeError):
        cross_entropy_loss_back(np.ones(2, np.float32), x, x)              # the gradient is one value
    with pytest.raises(GGMLShapeError):
        cross_entropy_loss_back(np.ones(1, np.float32), np.zeros((5, 2), np.float32).T, x)   # not contiguous
