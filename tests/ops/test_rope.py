"""Properties of rope_ext / rope_multi and their _back ops (math identities, no ggml needed)."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from refimpl import GGMLShapeError
from refimpl.ops import rope_ext, rope_ext_back, rope_multi, rope_multi_back
from refimpl.ops.rope import ROPE_TYPE_IMROPE, ROPE_TYPE_MROPE, ROPE_TYPE_NEOX, ROPE_TYPE_NORMAL, rope_cache
from refimpl.testing import assert_nmse, tol

pytestmark = pytest.mark.property

TOL = tol("rope_ext", "f32", "property").nmse


@st.composite
def _rope_input(draw):
    D = draw(st.sampled_from([2, 4, 8, 32, 64, 128]))
    n_dims = draw(st.sampled_from(sorted({2, D // 2 if D % 4 == 0 else D, D})))
    T, H = draw(st.integers(1, 6)), draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.uniform(-1, 1, (T, H, D)).astype(np.float32)
    pos = rng.integers(0, 5000, T).astype(np.int32)
    kw = dict(n_dims=n_dims, mode=draw(st.sampled_from([ROPE_TYPE_NORMAL, ROPE_TYPE_NEOX])),
              freq_base=draw(st.sampled_from([10000.0, 500000.0])))
    if draw(st.booleans()):                                          # YaRN, with mscale held at 1
        kw.update(n_ctx_orig=4096, freq_scale=0.25)
    return x, pos, kw


def _pairs(x, n_dims, mode):
    if mode == ROPE_TYPE_NORMAL:
        return x[..., 0:n_dims:2], x[..., 1:n_dims:2]
    return x[..., :n_dims // 2], x[..., n_dims // 2:n_dims]


@given(_rope_input())
def test_rope_preserves_pair_norms_and_leaves_the_rest(inp):
    x, pos, kw = inp
    kw = {**kw, "ext_factor": 0.0}                                   # no YaRN magnitude scaling
    out = rope_ext(x, pos, **kw)
    a0, a1 = _pairs(x.astype(np.float64), kw["n_dims"], kw["mode"])
    b0, b1 = _pairs(out.astype(np.float64), kw["n_dims"], kw["mode"])
    assert_nmse(b0**2 + b1**2, a0**2 + a1**2, TOL)
    np.testing.assert_array_equal(out[..., kw["n_dims"]:], x[..., kw["n_dims"]:])


@given(_rope_input())
def test_rope_back_inverts_rope(inp):
    x, pos, kw = inp
    kw = {**kw, "ext_factor": 0.0}
    assert_nmse(rope_ext_back(rope_ext(x, pos, **kw), pos, **kw), x, TOL)


@given(_rope_input())
def test_rope_scores_depend_on_relative_position(inp):
    x, pos, kw = inp
    kw = {**kw, "ext_factor": 0.0, "freq_scale": 1.0}
    q, k = x, x[::-1].copy()
    pos = pos % 1000
    shift = np.int32(37)
    s0 = np.sum(rope_ext(q, pos, **kw).astype(np.float64) * rope_ext(k, pos[::-1].copy(), **kw), -1)
    s1 = np.sum(rope_ext(q, pos + shift, **kw).astype(np.float64) * rope_ext(k, pos[::-1] + shift, **kw), -1)
    # theta is an f32 recurrence: at position p an ulp of theta is ~p * 6e-8 rad. Scores of random vectors can
    # be near 0: judge the error against |q| |k| rather than the scores themselves
    size = np.linalg.norm(q.astype(np.float64), axis=-1) * np.linalg.norm(k.astype(np.float64), axis=-1)
    assert np.mean(np.square((s1 - s0) / size)) <= tol("rope_ext_relative", "f32", "property").nmse


def test_rope_at_position_zero_is_identity_and_attn_factor_scales():
    x = np.random.default_rng(0).uniform(-1, 1, (1, 2, 16)).astype(np.float32)
    np.testing.assert_array_equal(rope_ext(x, np.zeros(1, np.int32), n_dims=16), x)
    np.testing.assert_array_equal(rope_ext(x, np.zeros(1, np.int32), n_dims=16, attn_factor=2.0), 2 * x)


def test_normal_and_neox_pair_different_dims():
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (3, 2, 8)).astype(np.float32)
    pos = np.array([1, 5, 9], np.int32)
    perm = np.array([0, 2, 4, 6, 1, 3, 5, 7])                        # interleaved -> halves
    a = rope_ext(x, pos, n_dims=8, mode=ROPE_TYPE_NORMAL)
    b = rope_ext(np.ascontiguousarray(x[..., perm]), pos, n_dims=8, mode=ROPE_TYPE_NEOX)
    np.testing.assert_array_equal(a[..., perm], b)


def test_theta_is_the_iterated_f32_product():
    pos = np.array([4095], np.int32)
    cos, sin = rope_cache(pos, None, 64, 64, freq_base=10000.0)
    theta_scale = np.float32(10000.0 ** np.float64(np.float32(-2.0) / np.float32(64)))
    th = np.float32(4095.0)
    for i in range(32):
        assert cos[0, i] == np.float32(np.cos(np.float64(th))) and sin[0, i] == np.float32(np.sin(np.float64(th)))
        th = np.float32(th * theta_scale)
    pow_based = np.cos(4095.0 * 10000.0 ** (-2.0 * np.arange(32) / 64))
    assert np.max(np.abs(cos[0] - pow_based)) > 1e-5                # the recurrence is the definition


@pytest.mark.parametrize("mode", [ROPE_TYPE_MROPE, ROPE_TYPE_IMROPE])
def test_mrope_with_equal_positions_is_neox(mode):
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, (5, 3, 32)).astype(np.float32)
    p = rng.integers(0, 100, 5).astype(np.int32)
    got = rope_multi(x, np.tile(p, 4), n_dims=32, sections=[4, 6, 6, 0], mode=mode)
    np.testing.assert_array_equal(got, rope_ext(x, p, n_dims=32, mode=ROPE_TYPE_NEOX))
    back = rope_multi_back(got, np.tile(p, 4), n_dims=32, sections=[4, 6, 6, 0], mode=mode)
    assert_nmse(back, x, TOL)


def test_mrope_sections_pick_their_positions():
    x = np.ones((1, 1, 16), np.float32)
    pos = np.array([3, 5, 7, 11], np.int32)                          # t, h, w, e for the one token
    got = rope_multi(x, pos, n_dims=16, sections=[2, 2, 2, 2], mode=ROPE_TYPE_MROPE)
    for i, p in enumerate([3, 3, 5, 5, 7, 7, 11, 11]):               # pair i uses its section's position
        ref = rope_ext(x, np.array([p], np.int32), n_dims=16, mode=ROPE_TYPE_NEOX)
        assert got[0, 0, i] == ref[0, 0, i] and got[0, 0, i + 8] == ref[0, 0, i + 8]


def test_rope_rejects_what_ggml_rejects():
    x = np.zeros((2, 1, 8), np.float32)
    p = np.zeros(2, np.int32)
    with pytest.raises(GGMLShapeError):
        rope_ext(x, p, n_dims=8, mode=1)                             # the n_past bit
    with pytest.raises(GGMLShapeError):
        rope_ext(x, p, n_dims=10)                                    # n_dims > head_dim
    with pytest.raises(GGMLShapeError):
        rope_ext(x, p, n_dims=7)                                     # odd n_dims
    with pytest.raises(GGMLShapeError):
        rope_ext(x, p.astype(np.int64), n_dims=8)                    # positions are i32
    with pytest.raises(GGMLShapeError):
        rope_ext(x, np.zeros(3, np.int32), n_dims=8)                 # one position per token
    with pytest.raises(GGMLShapeError):
        rope_multi(x, np.zeros(2, np.int32), n_dims=8, sections=[2, 2, 0, 0])   # 4 positions per token
    with pytest.raises(GGMLShapeError):
        rope_multi(x, np.zeros(8, np.int32), n_dims=8, sections=[2, 2, 0, 0], mode=24)  # vision: n_dims = D/2
    with pytest.raises(GGMLShapeError):
        rope_ext(np.zeros((8, 2), np.float32).T[None], np.zeros(1, np.int32), n_dims=8)  # strided rows


@given(_rope_input(), st.sampled_from([0.25, 0.125]))
def test_yarn_scales_pair_norms_by_mscale(inp, freq_scale):
    x, pos, kw = inp
    kw = {**kw, "n_ctx_orig": 4096, "freq_scale": freq_scale, "ext_factor": 1.0, "attn_factor": 0.9}
    mscale = 0.9 * (1.0 + 0.1 * np.log(1.0 / freq_scale))
    out = rope_ext(x, pos, **kw)
    a0, a1 = _pairs(x.astype(np.float64), kw["n_dims"], kw["mode"])
    b0, b1 = _pairs(out.astype(np.float64), kw["n_dims"], kw["mode"])
    assert_nmse(b0**2 + b1**2, mscale**2 * (a0**2 + a1**2), TOL)
