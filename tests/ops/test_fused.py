"""refimpl.ops.fused: each op's reference is the op sequence it stands for, bit for bit; and what a backend
registers for it (numba's one-pass kernels) gives the reference's bits (attn_mha / attn_qkv in numerics="fast"
are checked against fast mode's bound in tests/kernels/test_mha_fast.py)."""
import numpy as np
import pytest

import refimpl
from refimpl import ops
from refimpl.ops.fused import add_norm_affine, attn_mha, attn_qkv, mul_mat_add, mul_mat_add_gelu, stack_qkv
from refimpl.testing import assert_bits_equal

pytestmark = pytest.mark.property

RNG = np.random.default_rng(7)


def _f32(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _seq_mha(q, k, v, mask, scale):
    """The op sequence of llama.cpp's build_attn_mha, spelled out with refimpl.ops."""
    S, T, H, D = q.shape
    kq = ops.mul_mat(np.ascontiguousarray(k.transpose(0, 2, 1, 3)), q.transpose(0, 2, 1, 3))
    kq = ops.soft_max_ext(kq, mask, scale, 0.0)
    kqv = ops.mul_mat(np.ascontiguousarray(v.transpose(0, 2, 3, 1)), kq)
    return np.ascontiguousarray(kqv.transpose(0, 2, 1, 3)).reshape(S, T, H * D)


CASES = [(1, 5, 2, 8), (3, 7, 4, 16), (2, 33, 1, 32)]


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("S,T,H,D", CASES)
def test_the_fused_ops_are_their_op_sequences(backend, S, T, H, D):
    if backend == "numba":
        pytest.importorskip("numba", reason="numba is not installed: no kernels to compare")
    E, F = H * D, 4 * H * D
    x = _f32(S * T, E)
    w, b = _f32(E, E, scale=0.2), _f32(E)
    res, g, beta = _f32(S * T, E), _f32(E), _f32(E)
    up_w, up_b = _f32(F, E, scale=0.2), _f32(F)
    with refimpl.backend(backend):
        assert_bits_equal(mul_mat_add(w, x, b), ops.add(ops.mul_mat(w, x), b), "mul_mat_add")
        assert_bits_equal(mul_mat_add(w, x, None), ops.mul_mat(w, x), "mul_mat_add, no bias")
        assert_bits_equal(mul_mat_add_gelu(up_w, x, up_b), ops.gelu(ops.add(ops.mul_mat(up_w, x), up_b)),
                          "mul_mat_add_gelu")
        for bias, r in ((b, res), (None, res), (b, None)):
            cur = x if bias is None else ops.add(x, bias)
            cur = cur if r is None else ops.add(cur, r)
            want = ops.add(ops.mul(ops.norm(cur, 1e-12), g), beta)
            assert_bits_equal(add_norm_affine(x, bias, r, g, beta, 1e-12), want,
                              f"add_norm_affine bias={bias is not None} residual={r is not None}")
        q, k, v = _f32(S, T, H, D), _f32(S, T, H, D), _f32(S, T, H, D)
        lengths = [T - i % max(1, T // 2) for i in range(S)]
        mask = np.where(np.arange(T)[None, :] < np.asarray(lengths)[:, None], 0, -np.inf).astype(np.float32)
        mask = np.ascontiguousarray(np.broadcast_to(mask[:, None, None, :], (S, 1, T, T)))
        scale = 1.0 / float(np.sqrt(np.float32(D)))
        assert_bits_equal(attn_mha(q, k, v, mask, scale), _seq_mha(q, k, v, mask, scale), "attn_mha")
        wq, wk, wv = (_f32(E, E, scale=0.2) for _ in range(3))
        bq, bk, bv = _f32(E), _f32(E), _f32(E)
        wqkv, bqkv = stack_qkv(wq, bq, wk, bk, wv, bv)
        x3 = x.reshape(S, T, E)
        qs, ks, vs = (ops.add(ops.mul_mat(wt, x), bt).reshape(S, T, H, D) for wt, bt in ((wq, bq), (wk, bk), (wv, bv)))
        assert_bits_equal(attn_qkv(x3, wqkv, bqkv, mask, scale, H), _seq_mha(qs, ks, vs, mask, scale), "attn_qkv")


def test_stack_qkv_only_stacks_three_f32_matrices_of_one_shape():
    w = _f32(8, 4)
    assert stack_qkv(w, None, w, None, w, None)[1] is None and stack_qkv(w, None, w, None, w, None)[0].shape == (24, 4)
    assert stack_qkv(w, None, w, None, w.astype(np.float16), None) is None
    assert stack_qkv(w, _f32(8), w, None, w, None) is None
    assert stack_qkv(w, None, w, None, _f32(4, 4), None) is None


def test_the_fused_ops_are_composites_not_ggml_ops():
    for name in ("mul_mat_add", "mul_mat_add_gelu", "add_norm_affine", "attn_mha", "attn_qkv"):
        assert ops.OPS[name].covers == ()
