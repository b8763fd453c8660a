"""What ggml 0.25.3 added to ops refimpl already had, as identities with the ops' older forms (no ggml needed;
test-backend-ops against ggml 0.25.3 itself is tests/rpc/test_backend_ops.py)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from tests._profiles import examples

import refimpl
from refimpl import GGMLShapeError, QTensor, dequantize, quantize
from refimpl.testing import tol
from refimpl.ops import (conv_2d_dw_direct, conv_3d_direct, gelu, gelu_erf, gelu_quick, geglu, geglu_quick,
                         get_rows_back, mul_mat, out_prod, silu, ssm_scan, swiglu, swiglu_clamp, swiglu_oai, xielu)

pytestmark = pytest.mark.property

f32 = np.float32


def _rng(seed=0):
    return np.random.default_rng(seed)


def _bf16_values(x):
    return dequantize(quantize(x, "bf16"))


@pytest.mark.parametrize("op", [silu, gelu, gelu_quick, gelu_erf])
def test_bf16_unary_is_the_f32_formula_of_the_widened_values_rounded_once(op):
    """bf16 in, bf16 out: the value is the f32 op on the exact widened inputs, rounded once to bf16 (gelu and
    gelu_quick take the formula, not the f16 table: compare with their bf16 of an f32 formula evaluation)."""
    x = _rng(1).uniform(-8, 8, (5, 64)).astype(f32)
    q = quantize(x, "bf16")
    out = op(q)
    assert isinstance(out, QTensor) and out.type == refimpl.GGMLType.BF16 and out.shape == x.shape
    xv = dequantize(q)
    if op in (gelu, gelu_quick):       # the f32 paths go through ggml-cpu's f16 table; bf16 must not
        from refimpl.ops.elementwise import gelu_quick_f32, gelu_tanh_f32
        with np.errstate(all="ignore"):
            want = (gelu_tanh_f32 if op is gelu else gelu_quick_f32)(xv)
    else:
        want = op(xv)
    np.testing.assert_array_equal(dequantize(out), _bf16_values(want))


@pytest.mark.parametrize("op", [swiglu, geglu, geglu_quick])
def test_bf16_glu_has_the_shape_and_type_of_its_f32_form(op):
    x = _rng(2).uniform(-4, 4, (3, 2, 64)).astype(f32)
    out = op(quantize(x, "bf16"))
    ref = op(dequantize(quantize(x, "bf16")))
    assert out.type == refimpl.GGMLType.BF16 and out.shape == ref.shape
    np.testing.assert_allclose(dequantize(out), ref, **tol("glu", "bf16", "vs-f32").allclose())


@settings(max_examples=examples(30))
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 5), k=st.sampled_from([1, 7, 32, 100]))
def test_mul_mat_of_f32_weights_by_f16_or_bf16_rows_is_the_widened_product(seed, m, k):
    """ggml 0.25.3 widens f16/bf16 activations exactly to f32 for an f32 weight: the same bits as passing the
    widened rows, in exact and ggml numerics (fast numerics may sum the two in different orders)."""
    rng = _rng(seed)
    a = rng.standard_normal((4, k)).astype(f32)
    b16 = rng.standard_normal((m, k)).astype(np.float16)
    bb = quantize(rng.standard_normal((m, k)).astype(f32), "bf16")
    for mode in ("exact", "ggml"):
        np.testing.assert_array_equal(mul_mat(a, b16, numerics=mode), mul_mat(a, b16.astype(f32), numerics=mode))
        np.testing.assert_array_equal(mul_mat(a, bb, numerics=mode), mul_mat(a, dequantize(bb), numerics=mode))


def test_mul_mat_still_refuses_a_conversion_ggml_aborts_on():
    a = quantize(_rng().standard_normal((4, 32)).astype(f32), "q4_0")
    with pytest.raises(GGMLShapeError, match="vec_dot_type"):
        mul_mat(a, np.ones((2, 32), np.float16))


def test_out_prod_of_f16_src0_is_the_widened_product():
    rng = _rng(3)
    a = rng.standard_normal((2, 5, 7)).astype(np.float16)           # ne [m=7, k=5, 2]
    b = rng.standard_normal((2, 5, 3)).astype(f32)                  # ne [n=3, k=5, 2]
    np.testing.assert_array_equal(out_prod(a, b), out_prod(a.astype(f32), b))
    with pytest.raises(GGMLShapeError, match="not broadcast"):
        out_prod(a[:1], b)                                          # an f16 src0 is not broadcast, as in ggml


def test_conv_2d_dw_direct_takes_an_f16_kernel_widened():
    rng = _rng(4)
    k = rng.standard_normal((3, 1, 3, 3)).astype(np.float16)
    x = rng.standard_normal((1, 3, 8, 8)).astype(f32)
    np.testing.assert_array_equal(conv_2d_dw_direct(k, x, 1, 1, 1, 1), conv_2d_dw_direct(k.astype(f32), x, 1, 1, 1, 1))


def test_conv_3d_direct_with_an_empty_kernel_axis_sums_nothing():
    x = _rng(5).standard_normal((1, 2, 2, 2)).astype(f32)
    out = conv_3d_direct(np.zeros((1, 1, 1, 0), f32), x, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1)
    assert out.shape == (1, 2, 2, 3) and not out.any()             # OW = (2 + 0 + 1 - 1) / 1 + 1 = 3


def test_get_rows_back_reads_the_first_rows_of_a_longer_gradient():
    rng = _rng(6)
    grad = rng.standard_normal((4, 16)).astype(f32)
    rows = np.array([2, 0], np.int32)
    np.testing.assert_array_equal(get_rows_back(grad, rows, (5, 16)), get_rows_back(grad[:2], rows, (5, 16)))


@settings(max_examples=examples(40))
@given(seed=st.integers(0, 2**32 - 1), limit=st.sampled_from([0.5, 1.0, 7.0]))
def test_swiglu_clamp_is_silu_of_the_capped_gate_times_the_clamped_up(seed, limit):
    """Against the math in f64: |error| within a few f32 roundings of the f32 steps."""
    x = _rng(seed).uniform(-10, 10, (3, 64)).astype(f32)
    out = swiglu_clamp(x, None, limit)
    g = np.minimum(x[:, :32].astype(np.float64), limit)
    u = np.clip(x[:, 32:].astype(np.float64), -limit, limit)
    want = g / (1 + np.exp(-g)) * u
    assert np.all(np.abs(out - want) <= 4 * 2 ** -24 * np.abs(want) + 1e-30)


def test_swiglu_clamp_differs_from_swiglu_oai_only_by_alpha_and_the_plus_one():
    x = _rng(7).uniform(-3, 3, (2, 64)).astype(f32)
    u = x[:, 32:]
    np.testing.assert_allclose(swiglu_clamp(x[:, :32], u, 7.0), swiglu_oai(x[:, :32], u - 1, 1.0, 7.0),
                               **tol("swiglu_clamp", "f32", "vs-oai").allclose())


def test_xielu_from_stored_op_params_is_xielu_of_its_alphas():
    """stored=True takes what ggml_xielu writes into op_params: beta + softplus(alpha_n), softplus(alpha_p)."""
    x = _rng(8).uniform(-5, 5, (4, 32)).astype(f32)
    alpha_n, alpha_p, beta, eps = 0.8, 0.3, 0.5, -1e-6
    sp = lambda v: np.log1p(np.exp(np.float64(v)))                              # noqa: E731
    an, ap = f32(beta + sp(alpha_n)), f32(sp(alpha_p))
    a, b = xielu(x, an, ap, beta, eps, stored=True), xielu(x, alpha_n, alpha_p, beta, eps)
    np.testing.assert_allclose(a, b, **tol("xielu", "f32", "stored").allclose())


def test_ssm_scan_rollback_slots_are_the_states_after_each_prefix():
    """Slot j of K holds the state after token n_tok-1-j: the final state of the same scan over the prefix
    (what test-backend-ops' SSM_SCAN_ROLLBACK checks), bit for bit."""
    rng = _rng(9)
    d_state, head_dim, n_head, n_group, n_tok, n_seqs, K = 16, 4, 4, 2, 6, 2, 3
    s = rng.uniform(-1, 1, (n_seqs, n_head, head_dim, d_state)).astype(f32)
    x = rng.uniform(-1, 1, (n_seqs, n_tok, n_head, head_dim)).astype(f32)
    dt = rng.uniform(-1, 1, (n_seqs, n_tok, n_head)).astype(f32)
    A = rng.uniform(-1, -0.5, (n_head, 1)).astype(f32)
    B = rng.uniform(-1, 1, (n_seqs, n_tok, n_group, d_state)).astype(f32)
    C = rng.uniform(-1, 1, (n_seqs, n_tok, n_group, d_state)).astype(f32)
    ids = np.array([1, 0], np.int32)
    out = ssm_scan(s, x, dt, A, B, C, ids, K=K)
    assert out.size == x.size + K * s.size
    states = out[x.size:].reshape(K, n_seqs, n_head, head_dim, d_state)
    for j in range(K):
        t = n_tok - j
        pre = ssm_scan(s, x[:, :t], dt[:, :t], A, B[:, :t], C[:, :t], ids)
        np.testing.assert_array_equal(states[j], pre[x[:, :t].size:].reshape(n_seqs, n_head, head_dim, d_state))
    np.testing.assert_array_equal(out[:x.size], ssm_scan(s, x, dt, A, B, C, ids)[:x.size])
    short = ssm_scan(s, x[:, :2], dt[:, :2], A, B[:, :2], C[:, :2], ids, K=4)   # slots ggml never writes
    assert np.isnan(short[x[:, :2].size:].reshape(4, -1)[2:]).all()
    with pytest.raises(GGMLShapeError, match="K must be"):
        ssm_scan(s, x, dt, np.ones((n_head, d_state), f32), B, C, ids, K=2)      # Mamba-1 has no rollback


def test_lightning_indexer_is_relu_scores_weighted_over_heads_plus_the_mask():
    """Against its definition through other ops: q.k per head (mul_mat), relu, weighted head sum, + mask."""
    from refimpl.ops import lightning_indexer
    rng = _rng(10)
    ns, n_batch, n_head, n_embd, n_kv, nm = 2, 3, 4, 32, 5, 1
    q = rng.standard_normal((ns, n_batch, n_head, n_embd)).astype(f32)
    k = rng.standard_normal((ns, n_kv, 1, n_embd)).astype(np.float16)
    w = rng.standard_normal((ns, 1, n_batch, n_head)).astype(f32)
    mask = np.where(rng.random((nm, 1, n_batch, n_kv)) < 0.3, -np.inf, 0).astype(np.float16)
    out = lightning_indexer(q, k, w, mask)
    assert out.shape == (ns, 1, n_batch, n_kv)
    qk = np.einsum("sthe,sje->sthj", q.astype(np.float64), k.reshape(ns, n_kv, n_embd).astype(np.float64))
    want = np.einsum("sthj,sth->stj", np.maximum(qk, 0), w.reshape(ns, n_batch, n_head).astype(np.float64))
    want = want[:, None] + mask.astype(np.float64)
    fin = np.isfinite(want)
    assert np.array_equal(fin, np.isfinite(out))
    t = tol("lightning_indexer", "f32", "property")
    assert np.all(np.abs(out[fin] - want[fin]) <= t.atol + t.rtol * np.abs(want[fin]))


def test_dsv4_hc_comb_is_doubly_normalized():
    """After the last normalization over src, every dst column sums to sum/(eps + sum) ~ 1; with many
    iterations the rows approach 1 too (Sinkhorn)."""
    from refimpl.ops import dsv4_hc_comb
    rng = _rng(11)
    mixes = rng.standard_normal((7, 24)).astype(f32)
    out = dsv4_hc_comb(mixes, np.float32([1, 1, 0.7]), rng.standard_normal(24).astype(f32), 1e-6, 20)
    assert out.shape == (7, 4, 4) and np.all(out > 0)
    np.testing.assert_allclose(out.sum(axis=1), 1, **tol("dsv4_hc_comb", "f32", "sinkhorn").allclose())
    np.testing.assert_allclose(out.sum(axis=2), 1, **tol("dsv4_hc_comb", "f32", "sinkhorn-rows").allclose())


def test_dsv4_hc_post_without_comb_is_the_identity_comb_and_hc_pre_is_a_weighted_sum():
    from refimpl.ops import dsv4_hc_post, dsv4_hc_pre, dsv4_hc_pre_gated
    rng = _rng(12)
    n_tok, hc, n_embd = 3, 4, 16
    x = rng.standard_normal((n_tok, n_embd)).astype(f32)
    res = rng.standard_normal((n_tok, hc, n_embd)).astype(f32)
    post = rng.standard_normal((n_tok, hc)).astype(f32)
    eye = np.broadcast_to(np.eye(hc, dtype=f32), (n_tok, hc, hc)).copy()
    np.testing.assert_array_equal(dsv4_hc_post(x, res, post), dsv4_hc_post(x, res, post, eye))
    w = rng.standard_normal((n_tok, hc)).astype(f32)
    want = np.einsum("thi,th->ti", res.astype(np.float64), w.astype(np.float64))
    np.testing.assert_allclose(dsv4_hc_pre(res, w), want, **tol("dsv4_hc_pre", "f32", "property").allclose())
    gate = rng.standard_normal((n_tok, hc, n_embd)).astype(f32)
    want = 0.5 * np.einsum("thi,thi->ti", res.astype(np.float64), 1 / (1 + np.exp(-gate.astype(np.float64))))
    np.testing.assert_allclose(dsv4_hc_pre_gated(res, gate, 0.5), want,
                               **tol("dsv4_hc_pre", "f32", "property").allclose())
