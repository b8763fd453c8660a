"""Properties of flash_attn_ext (math identities, no ggml needed)."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from refimpl import GGMLShapeError
from refimpl.ops import flash_attn_ext, mul_mat, soft_max_ext
from refimpl.testing import assert_nmse, tol
from refimpl.testing.golden import check_values

pytestmark = pytest.mark.property

TOL = tol("flash_attn_ext", "f32", "property")


@st.composite
def _attn(draw):
    S, HKV = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    H = HKV * draw(st.integers(1, 3))
    N, NKV = draw(st.integers(1, 6)), draw(st.integers(1, 40))
    DK, DV = draw(st.sampled_from([8, 32, 64])), draw(st.sampled_from([8, 16, 32]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.uniform(-1, 1, (S, H, N, DK)).astype(np.float32)
    k = rng.uniform(-1, 1, (S, HKV, NKV, DK)).astype(draw(st.sampled_from([np.float32, np.float16])))
    v = rng.uniform(-1, 1, (S, HKV, NKV, DV)).astype(k.dtype)
    mask = None
    if draw(st.booleans()):
        mask = rng.uniform(-1, 1, (1, 1, N, NKV))
        mask[rng.random(mask.shape) < 0.3] = -np.inf
        mask[..., 0] = 0.0                                   # one visible position per row
        mask = mask.astype(np.float16)
    return q, k, v, mask, rng


@given(_attn(), st.sampled_from([1.0, 0.125]), st.sampled_from([0.0, 4.0]), st.booleans())
def test_equals_softmax_qk_v_composed_from_refimpl_ops(inp, scale, max_bias, with_sinks):
    q, k, v, mask, rng = inp
    if mask is None:
        max_bias = 0.0
    H = q.shape[1]
    sinks = rng.uniform(-2, 2, H).astype(np.float32) if with_sinks else None
    kq = mul_mat(k, q)                                                       # (S, H, N, NKV), k rows per head block
    p = soft_max_ext(kq, mask, scale, max_bias, sinks)
    vt = np.ascontiguousarray(np.swapaxes(v, -1, -2))                        # (S, HKV, DV, NKV)
    want = mul_mat(vt, p).transpose(0, 2, 1, 3)                               # (S, N, H, DV)
    got = flash_attn_ext(q, k, v, mask, scale, max_bias, 0.0, sinks)
    assert got.shape == want.shape
    bound = TOL.bound(q, k, v, mask, scale, max_bias, 0.0, sinks)
    check_values(got, want, TOL, "flash_attn_ext vs softmax(qk)v", bound=bound)


@given(_attn())
def test_output_is_a_convex_combination_of_values(inp):
    q, k, v, mask, _ = inp
    out = flash_attn_ext(q, k, v, mask, 0.5).astype(np.float64)             # (S, N, H, DV)
    r = q.shape[1] // k.shape[1]
    vv = np.repeat(v.astype(np.float64), r, axis=1)                          # (S, H, NKV, DV)
    lo, hi = vv.min(axis=2)[:, None], vv.max(axis=2)[:, None]
    assert np.all(out >= lo - 1e-6) and np.all(out <= hi + 1e-6)


@given(_attn())
def test_gqa_is_a_block_broadcast_of_kv_heads(inp):
    q, k, v, mask, _ = inp
    r = q.shape[1] // k.shape[1]
    got = flash_attn_ext(q, k, v, mask, 0.3)
    want = flash_attn_ext(q, np.repeat(k, r, axis=1), np.repeat(v, r, axis=1), mask, 0.3)
    np.testing.assert_array_equal(got, want)


def test_softcap_limits_scores():
    rng = np.random.default_rng(3)
    q = rng.uniform(-1, 1, (1, 2, 16)).astype(np.float32) * 50
    k, v = rng.uniform(-1, 1, (1, 9, 16)).astype(np.float32), rng.uniform(-1, 1, (1, 9, 8)).astype(np.float32)
    big = flash_attn_ext(q, k, v, scale=1.0, logit_softcap=1e6)              # tanh(x/c)*c ~ x
    assert_nmse(big, flash_attn_ext(q, k, v, scale=1.0), 1e-9)
    tiny = flash_attn_ext(q, k, v, scale=1.0, logit_softcap=1e-6)             # all scores ~ 0: mean of v
    assert_nmse(tiny[:, 0], np.broadcast_to(v.mean(axis=1), tiny[:, 0].shape), 1e-9)


def test_fully_masked_rows_are_zero():
    rng = np.random.default_rng(4)
    q, k, v = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((2, 3, 8), (1, 5, 8), (1, 5, 4)))
    mask = np.zeros((3, 5), np.float16)
    mask[1] = -np.inf
    for sinks in (None, np.zeros(2, np.float32)):
        out = flash_attn_ext(q, k, v, mask, 1.0, sinks=sinks)
        assert np.all(out[1] == 0.0) and np.all(np.isfinite(out))


def test_flash_attn_rejects_what_ggml_rejects():
    q = np.zeros((4, 3, 8), np.float32)
    kv = np.zeros((2, 5, 8), np.float16)
    with pytest.raises(GGMLShapeError):
        flash_attn_ext(q, np.zeros((3, 5, 8), np.float16), kv)               # 4 heads on 3 kv heads
    with pytest.raises(GGMLShapeError):
        flash_attn_ext(q, np.zeros((2, 5, 16), np.float16), kv)              # head_dim mismatch
    with pytest.raises(GGMLShapeError):
        flash_attn_ext(q, kv, kv, np.zeros((3, 5), np.float32))              # mask must be f16
    with pytest.raises(GGMLShapeError):
        flash_attn_ext(q, kv, kv, max_bias=8.0)                              # ALiBi needs a mask
    with pytest.raises(GGMLShapeError):
        flash_attn_ext(q.astype(np.float16), kv, kv)                          # q must be f32
