"""Properties of soft_max_ext and soft_max_ext_back (math identities, no ggml needed)."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from refimpl import GGMLShapeError
from refimpl.ops import soft_max_ext, soft_max_ext_back
from refimpl.ops.softmax import alibi_slopes
from refimpl.testing import assert_nmse, tol


pytestmark = pytest.mark.property

def _tol(what="soft_max_ext"):
    return tol(what, "f32", "property").nmse


@st.composite
def _scores(draw, max_cols=80):
    shp = (draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, max_cols)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return rng.uniform(-20, 20, shp).astype(np.float32), rng


@given(_scores(), st.sampled_from([1.0, 0.125, 3.0]))
def test_rows_sum_to_one(xr, scale):
    x, _ = xr
    s = np.sum(soft_max_ext(x, scale=scale).astype(np.float64), axis=-1)
    assert_nmse(s, np.ones_like(s), _tol())


@given(_scores())
def test_sinks_take_probability_mass(xr):
    x, rng = xr
    sinks = rng.uniform(-3, 3, x.shape[0]).astype(np.float32)
    w = x.astype(np.float64)
    M = np.maximum(w.max(-1, keepdims=True), sinks[:, None, None])
    e, es = np.exp(w - M), np.exp(sinks[:, None, None] - M)
    want = e / (e.sum(-1, keepdims=True) + es)
    got = soft_max_ext(x, sinks=sinks)
    assert_nmse(got, want, _tol())
    p_sink = (es / (e.sum(-1, keepdims=True) + es))[..., 0]
    assert_nmse(got.astype(np.float64).sum(-1), 1.0 - p_sink, _tol())     # rows sum to 1 - p(sink)


@given(_scores(40), st.sampled_from([0.0, 2.0, 8.0]), st.sampled_from([np.float16, np.float32]))
def test_equals_f64_softmax_of_scaled_masked_scores(xr, max_bias, mtype):
    x, rng = xr
    H, T, N = x.shape
    mask = rng.uniform(-2, 2, (T + 2, N))                       # padded rows are ignored
    mask[rng.random(mask.shape) < 0.3] = -np.inf
    mask[:, 0] = 0.0                                            # keep one column visible per row
    mask = mask.astype(mtype)
    slopes = alibi_slopes(H, max_bias).astype(np.float64)
    w = 0.5 * x.astype(np.float64) + slopes[:, None, None] * mask[:T].astype(np.float64)
    e = np.exp(w - w.max(-1, keepdims=True))
    got = soft_max_ext(x, mask, 0.5, max_bias)
    assert_nmse(got, e / e.sum(-1, keepdims=True), _tol())
    assert np.all(got[:, np.isneginf(mask[:T].astype(np.float32))] == 0.0)


def test_mask_tiles_over_heads():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (6, 3, 8)).astype(np.float32)
    m = rng.uniform(-1, 1, (2, 3, 8)).astype(np.float16)        # head h uses mask h % 2 (np.tile)
    got = soft_max_ext(x, m)
    for h in range(6):
        np.testing.assert_array_equal(got[h], soft_max_ext(x[h], m[h % 2]))


def test_alibi_slopes_are_ggmls():
    np.testing.assert_array_equal(alibi_slopes(8, 8.0), (0.5 ** np.arange(1, 9)).astype(np.float32))
    s = alibi_slopes(6, 8.0).astype(np.float64)                  # n_log2 = 4: m0 = 1/4, m1 = 1/2
    slopes = tol("soft_max_ext", "f32", "alibi-slopes").allclose()
    np.testing.assert_allclose(s, [0.25, 0.0625, 0.25**3, 0.25**4, 0.5, 0.125], **slopes)
    np.testing.assert_array_equal(alibi_slopes(5, 0.0), np.ones(5, np.float32))


@given(_scores(), st.sampled_from([1.0, 0.5]), st.sampled_from([0.0, 8.0]))
def test_soft_max_back_is_the_vector_jacobian_product(xr, scale, max_bias):
    """dx = scale * y * (dy - y.dy) whatever max_bias: ALiBi's slope * mask is a constant of the input."""
    x, rng = xr
    y64 = np.exp(x - x.max(-1, keepdims=True).astype(np.float64))
    y64 /= y64.sum(-1, keepdims=True)
    dy = rng.uniform(-1, 1, x.shape)
    want = scale * y64 * (dy - np.sum(y64 * dy, -1, keepdims=True))
    got = soft_max_ext_back(dy.astype(np.float32), y64.astype(np.float32), scale, max_bias)
    size = np.sqrt(np.mean(np.square(scale * y64 * dy))) + 1e-30   # dy - dot cancels: judge against the terms
    assert np.mean(np.square(got - want)) / size**2 <= _tol("soft_max_ext_back")


def test_softmax_rejects_what_ggml_rejects():
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(GGMLShapeError):
        soft_max_ext(x.transpose(1, 0, 2))                       # not contiguous
    with pytest.raises(GGMLShapeError):
        soft_max_ext(x, np.zeros((2, 4), np.float16))            # mask has fewer rows
    with pytest.raises(GGMLShapeError):
        soft_max_ext(x, np.zeros((3, 5), np.float16))            # mask ne0 != a.ne0
    with pytest.raises(GGMLShapeError):
        soft_max_ext(x, max_bias=8.0)                            # ALiBi needs a mask
    with pytest.raises(GGMLShapeError):
        soft_max_ext(x, sinks=np.zeros(3, np.float32))           # one sink per head (ne2 = 2)
    with pytest.raises(GGMLShapeError):
        soft_max_ext_back(x, x.reshape(2, 4, 3), 1.0)            # dy and y of different shapes
