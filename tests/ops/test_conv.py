"""Properties of the conv family: convolutions against direct loops, adjoint pairs, pooling identities,
resampling identities (golden comparisons live in tests/oracle)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests._profiles import examples

from refimpl.ops import GGMLShapeError
from refimpl.ops.conv import (POOL_AVG, POOL_MAX, SCALE_FLAG_ALIGN_CORNERS, SCALE_MODE_BILINEAR, SCALE_MODE_NEAREST,
                              col2im_1d, conv_1d, conv_1d_dw, conv_2d, conv_2d_direct, conv_2d_dw, conv_2d_dw_direct,
                              conv_3d, conv_3d_direct, conv_transpose_1d, conv_transpose_2d_p0, im2col, im2col_3d,
                              im2col_back, interpolate, pool_1d, pool_2d, pool_2d_back, timestep_embedding, upscale)
from refimpl.testing import assert_nmse
from refimpl.testing.tolerances import tol

pytestmark = pytest.mark.property

seeds = st.integers(0, 2**32 - 1)


def _u(rng, *shape, dtype=np.float32):
    return rng.uniform(-1, 1, shape).astype(dtype)


def _close(actual, expected, what):
    assert_nmse(actual, expected, tol("conv_2d", "*", "property").nmse, what)


def _out(n, k, s, p, d):
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def direct_conv2d(w, x, s0, s1, p0, p1, d0, d1):
    """Textbook loops in f64: out[n, o, y, x] = sum w[o, c, i, j] * x[n, c, y*s1 + i*d1 - p1, x*s0 + j*d0 - p0]."""
    N, C, H, W = x.shape
    O, _, KH, KW = w.shape
    OH, OW = _out(H, KH, s1, p1, d1), _out(W, KW, s0, p0, d0)
    xp = np.zeros((N, C, H + 2 * p1 + KH * d1, W + 2 * p0 + KW * d0))
    xp[:, :, p1:p1 + H, p0:p0 + W] = x
    out = np.zeros((N, O, OH, OW))
    for i in range(KH):
        for j in range(KW):
            patch = xp[:, :, i * d1:i * d1 + (OH - 1) * s1 + 1:s1, j * d0:j * d0 + (OW - 1) * s0 + 1:s0]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j].astype(np.float64))
    return out


conv_params = st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(0, 2), st.integers(0, 2),
                        st.integers(1, 2), st.integers(1, 2))


@settings(max_examples=examples(40))
@given(seed=seeds, prm=conv_params, kh=st.integers(1, 3), kw=st.integers(1, 3), f16=st.booleans())
def test_conv_2d_is_a_direct_convolution(seed, prm, kh, kw, f16):
    """conv_2d (im2col + mul_mat), conv_2d_direct and a textbook loop agree (f16 kernels see f16 data)."""
    s0, s1, p0, p1, d0, d1 = prm
    rng = np.random.default_rng(seed)
    w = _u(rng, 3, 2, kh, kw, dtype=np.float16 if f16 else np.float32)
    x = _u(rng, 2, 2, 4 + kh * d1, 5 + kw * d0)
    xr = x.astype(np.float16).astype(np.float32) if f16 else x
    want = direct_conv2d(w, xr.astype(np.float64), s0, s1, p0, p1, d0, d1)
    _close(conv_2d(w, x, s0, s1, p0, p1, d0, d1), want, "conv_2d")
    _close(conv_2d_direct(w, x, s0, s1, p0, p1, d0, d1), want, "conv_2d_direct")


@settings(max_examples=examples(30))
@given(seed=seeds, prm=conv_params)
def test_depthwise_convs_are_per_channel_convolutions(seed, prm):
    s0, s1, p0, p1, d0, d1 = prm
    rng = np.random.default_rng(seed)
    w, x = _u(rng, 3, 1, 3, 2), _u(rng, 2, 3, 9, 8)
    want = np.concatenate([direct_conv2d(w[c:c + 1], x[:, c:c + 1].astype(np.float64), s0, s1, p0, p1, d0, d1)
                           for c in range(3)], axis=1)
    _close(conv_2d_dw_direct(w, x, s0, s1, p0, p1, d0, d1), want, "conv_2d_dw_direct")
    w16 = w.astype(np.float16)
    want16 = np.concatenate([direct_conv2d(w16[c:c + 1], x[:, c:c + 1].astype(np.float16).astype(np.float64),
                                           s0, s1, p0, p1, d0, d1) for c in range(3)], axis=1)
    _close(conv_2d_dw(w16, x, s0, s1, p0, p1, d0, d1), want16, "conv_2d_dw")


@settings(max_examples=examples(30))
@given(seed=seeds, s=st.integers(1, 3), p=st.integers(0, 2), d=st.integers(1, 2), k=st.integers(1, 4))
def test_conv_1d_is_a_2d_convolution_of_height_one(seed, s, p, d, k):
    rng = np.random.default_rng(seed)
    w, x = _u(rng, 4, 3, k, dtype=np.float16), _u(rng, 1, 3, 12)
    want = direct_conv2d(w[:, :, None], x[:, :, None].astype(np.float16).astype(np.float64), s, 1, p, 0, d, 1)
    _close(conv_1d(w, x, s, p, d), want[:, :, 0], "conv_1d")
    wd = _u(rng, 3, 1, k, dtype=np.float16)
    want_dw = np.concatenate([direct_conv2d(wd[c:c + 1, :, None], x[:, c:c + 1, None].astype(np.float16)
                                            .astype(np.float64), s, 1, p, 0, d, 1) for c in range(3)], axis=1)
    _close(conv_1d_dw(wd, x, s, p, d), want_dw[0, :, 0], "conv_1d_dw")


def test_conv_1d_batches_are_independent():
    """refimpl returns the true batched convolution (ggml's N > 1 layout quirk is documented, not copied)."""
    rng = np.random.default_rng(3)
    w, x = _u(rng, 4, 2, 3, dtype=np.float16), _u(rng, 3, 2, 10)
    out = conv_1d(w, x, 1, 1, 1)
    for n in range(3):
        assert np.array_equal(out[n], conv_1d(w, x[n:n + 1], 1, 1, 1)[0])


@settings(max_examples=examples(20))
@given(seed=seeds, s=st.integers(1, 2), p=st.integers(0, 1), d=st.integers(1, 2), f16=st.booleans())
def test_conv_3d_matches_conv_3d_direct_and_conv_2d_at_depth_one(seed, s, p, d, f16):
    rng = np.random.default_rng(seed)
    IC, OC, N = 2, 3, 2
    w = _u(rng, OC * IC, 1, 3, 2, dtype=np.float16 if f16 else np.float32)
    x = _u(rng, N * IC, 1, 7, 6)
    a = conv_3d(w, x, IC, s, s, 1, p, p, 0, d, d, 1)
    _close(conv_3d_direct(w, x, s, s, 1, p, p, 0, d, d, 1, IC, N, OC), a, "conv_3d_direct")
    want = conv_2d(w.reshape(OC, IC, 3, 2), x.reshape(N, IC, 7, 6), s, s, p, p, d, d)
    _close(a.reshape(N, OC, *a.shape[-2:]), want, "conv_3d vs conv_2d")


@settings(max_examples=examples(30))
@given(seed=seeds, prm=conv_params, two_d=st.booleans())
def test_im2col_back_is_the_adjoint_of_im2col(seed, prm, two_d):
    """<im2col(x), g> == <x, im2col_back(g)> for every x, g."""
    s0, s1, p0, p1, d0, d1 = prm
    rng = np.random.default_rng(seed)
    if two_d:
        k, x = _u(rng, 1, 2, 2, 3), _u(rng, 2, 2, 7, 8)
        ne = [8, 7, 2, 2]
    else:
        k, x = _u(rng, 1, 2, 3), _u(rng, 2, 2, 8)
        ne, s1, p1, d1 = [8, 2, 2, 1], 1, 0, 1
    cols = im2col(k, x, s0, s1, p0, p1, d0, d1, two_d, np.float32)
    g = _u(rng, *cols.shape)
    back = im2col_back(g, k, ne, s0, s1, p0, p1, d0, d1, two_d)
    lhs, rhs = np.sum(cols.astype(np.float64) * g), np.sum(x.astype(np.float64) * back.reshape(x.shape))
    assert abs(lhs - rhs) <= 1e-5 * (1 + abs(lhs))


def test_im2col_3d_is_im2col_at_depth_one():
    rng = np.random.default_rng(4)
    k, x = _u(rng, 2 * 3, 1, 2, 3), _u(rng, 1 * 3, 1, 6, 7)
    a = im2col_3d(k, x, 3, 2, 1, 1, 1, 0, 0, 1, 2, 1)
    b = im2col(k.reshape(2, 3, 2, 3), x.reshape(1, 3, 6, 7), 2, 1, 1, 0, 1, 2, True, np.float32)
    assert np.array_equal(a, b)


@settings(max_examples=examples(30))
@given(seed=seeds, K=st.integers(1, 6), oc=st.integers(1, 3), T=st.integers(1, 9), s=st.integers(1, 4))
def test_col2im_1d_is_the_transposed_convolution_tail(seed, K, oc, T, s):
    """col2im_1d(columns) with p0 = 0 is conv_transpose_1d once the columns are the per-tap products."""
    rng = np.random.default_rng(seed)
    IC = 2
    w, x = _u(rng, IC, oc, K), _u(rng, IC, T)
    cols = np.einsum("iok,il->lok", w.astype(np.float64), x.astype(np.float64)).astype(np.float32)
    _close(col2im_1d(cols.reshape(T, oc * K), s, oc, 0), conv_transpose_1d(w, x, s), "col2im_1d")


@settings(max_examples=examples(30))
@given(seed=seeds, s=st.integers(1, 3), K=st.integers(1, 4))
def test_conv_transpose_1d_is_the_adjoint_of_a_strided_convolution(seed, s, K):
    """<conv_transpose_1d(w, y), x> == <y, conv(w^T, x)> with the strided correlation written out."""
    rng = np.random.default_rng(seed)
    IC, OC, L = 3, 2, 6
    w, y = _u(rng, IC, OC, K), _u(rng, IC, L)
    out = conv_transpose_1d(w, y, s)
    x = _u(rng, *out.shape).astype(np.float64)
    fwd = np.array([[sum(w[i, o, k] * x[o, l * s + k] for o in range(OC) for k in range(K)) for l in range(L)]
                    for i in range(IC)])
    assert abs(np.sum(out * x) - np.sum(y * fwd)) <= 1e-5 * (1 + np.abs(fwd).sum())


@settings(max_examples=examples(20))
@given(seed=seeds, s=st.integers(1, 3))
def test_conv_transpose_2d_is_separable_to_1d(seed, s):
    """A kernel of height 1 over data of height 1 is conv_transpose_1d."""
    rng = np.random.default_rng(seed)
    w, x = _u(rng, 3, 2, 1, 4), _u(rng, 1, 3, 1, 5)
    _close(conv_transpose_2d_p0(w, x, s)[0, :, 0], conv_transpose_1d(w[:, :, 0], x[0, :, 0], s), "ct2d")


def test_conv_transpose_rejects_padding():
    with pytest.raises(GGMLShapeError, match="p0 == 0"):
        conv_transpose_1d(np.ones((2, 2, 3), np.float32), np.ones((2, 4), np.float32), 1, 1, 1)


# -- pooling ------------------------------------------------------------------------------------------

@settings(max_examples=examples(30))
@given(seed=seeds, op=st.sampled_from([POOL_MAX, POOL_AVG]))
def test_pools_of_size_one_are_the_identity(seed, op):
    rng = np.random.default_rng(seed)
    x = _u(rng, 2, 3, 5, 7)
    assert np.array_equal(pool_2d(x, op, 1, 1, 1, 1, 0, 0), x)
    assert np.array_equal(pool_1d(x, op, 1, 1, 0), x)


@settings(max_examples=examples(30))
@given(seed=seeds, k=st.integers(1, 4), s=st.integers(1, 3), p=st.integers(0, 3))
def test_pool_avg_padding_rules_differ_between_1d_and_2d(seed, k, s, p):
    """pool_1d AVG divides by the in-range count, pool_2d AVG by k0*k1 (padding counted as zeros)."""
    rng = np.random.default_rng(seed)
    x = _u(rng, 3, 12).astype(np.float64)
    n_out = (12 + 2 * p - k) // s + 1
    xp = np.zeros(12 + 2 * p + k)
    sums, counts = [], []
    for r in range(3):
        xp[p:p + 12] = x[r]
        sums.append([xp[o * s:o * s + k].sum() for o in range(n_out)])
        counts.append([sum(0 <= o * s - p + j < 12 for j in range(k)) for o in range(n_out)])
    sums, counts = np.array(sums), np.array(counts)
    want1 = np.where(counts > 0, sums / np.maximum(counts, 1), 0)
    _close(pool_1d(x.astype(np.float32), POOL_AVG, k, s, p), want1, "pool_1d avg")
    _close(pool_2d(x.astype(np.float32)[:, None, :], POOL_AVG, k, 1, s, 1, p, 0)[:, 0], sums / k, "pool_2d avg")


def test_pool_max_of_an_all_padding_window_is_minus_flt_max():
    out = pool_1d(np.ones((1, 2), np.float32), POOL_MAX, 1, 1, 2)
    assert out[0, 0] == -np.finfo(np.float32).max and out[0, 2] == 1


@settings(max_examples=examples(30))
@given(seed=seeds, k=st.integers(1, 3), s=st.integers(1, 3), p=st.integers(0, 1))
def test_pool_2d_back_avg_is_the_adjoint_of_pool_2d_avg(seed, k, s, p):
    rng = np.random.default_rng(seed)
    x = _u(rng, 2, 6, 7)
    y = pool_2d(x, POOL_AVG, k, k, s, s, p, p)
    g = _u(rng, *y.shape)
    back = pool_2d_back(g, x, POOL_AVG, k, k, s, s, p, p)
    assert abs(np.sum(y.astype(np.float64) * g) - np.sum(x.astype(np.float64) * back)) <= 1e-5 * x.size


@settings(max_examples=examples(30))
@given(seed=seeds, k=st.integers(1, 3), s=st.integers(1, 3))
def test_pool_2d_back_max_routes_each_gradient_to_its_maximum(seed, k, s):
    rng = np.random.default_rng(seed)
    x = _u(rng, 1, 6, 7)
    g = np.ones_like(pool_2d(x, POOL_MAX, k, k, s, s, 0, 0))
    back = pool_2d_back(g, x, POOL_MAX, k, k, s, s, 0, 0)
    assert back.sum() == g.size
    hit = back > 0
    assert np.all(np.isin(x[hit], pool_2d(x, POOL_MAX, k, k, s, s, 0, 0)))


# -- resampling and embeddings ----------------------------------------------------------------------

@settings(max_examples=examples(30))
@given(seed=seeds, sf=st.integers(2, 4))
def test_nearest_integer_upscale_is_repeat(seed, sf):
    rng = np.random.default_rng(seed)
    x = _u(rng, 2, 3, 4, 5)
    want = np.repeat(np.repeat(x, sf, axis=-1), sf, axis=-2)
    assert np.array_equal(upscale(x, sf, SCALE_MODE_NEAREST), want)
    assert np.array_equal(interpolate(x, 5 * sf, 4 * sf, 3, 2, SCALE_MODE_NEAREST), want)


@settings(max_examples=examples(30))
@given(seed=seeds, mode=st.sampled_from([SCALE_MODE_BILINEAR, SCALE_MODE_BILINEAR | SCALE_FLAG_ALIGN_CORNERS, 2]))
def test_same_size_interpolation_is_the_identity(seed, mode):
    rng = np.random.default_rng(seed)
    x = _u(rng, 1, 2, 5, 6)
    _close(interpolate(x, 6, 5, 2, 1, mode), x, f"mode {mode}")


def test_align_corners_keeps_the_corners():
    rng = np.random.default_rng(5)
    x = _u(rng, 1, 1, 4, 5)
    y = interpolate(x, 13, 9, 1, 1, SCALE_MODE_BILINEAR | SCALE_FLAG_ALIGN_CORNERS)
    assert np.allclose(y[..., [0, 0, -1, -1], [0, -1, 0, -1]], x[..., [0, 0, -1, -1], [0, -1, 0, -1]],
                       **tol("interpolate", "f32", "corners").allclose())


@settings(max_examples=examples(30))
@given(seed=seeds, dim=st.integers(1, 40))
def test_timestep_embedding_is_on_the_unit_circle(seed, dim):
    rng = np.random.default_rng(seed)
    t = rng.uniform(0, 1000, 5).astype(np.float32)
    e = timestep_embedding(t, dim, 10000).astype(np.float64)
    h = dim // 2
    unit = tol("timestep_embedding", "f32", "unit-circle").allclose()
    assert np.allclose(e[:, :h] ** 2 + e[:, h:2 * h] ** 2, 1, **unit)
    if h:
        assert np.allclose(e[:, 0], np.cos(t.astype(np.float64)), **unit)
    if dim % 2:
        assert np.all(e[:, -1] == 0)
