"""Fusions the models call: each op's NumPy body is literally the sequence of ggml ops it stands for
(tests/ops/test_fused.py checks the bits against that sequence), so the reference still reads as the math,
and backends register one-pass kernels for them (refimpl/kernels/norm.py, unary.py, attention.py). None is
a ggml op: `covers=()`. Each body names its intermediates with `tap(role, x)` (the roles in the table); under a
`dispatch.tapping` (a model's capture) the dispatch runs the body, and llama.cpp's names reach the capture.

    op               the sequence                                          where             taps
    mul_mat_add      ggml_add(ggml_mul_mat(w, x), bias)                    a projection      product, biased
    mul_mat_add_gelu ggml_gelu(ggml_add(ggml_mul_mat(w, x), bias))         BERT's FFN up     product, biased, act
    add_norm_affine  ggml_add(ggml_mul(ggml_norm(x + bias + residual), w), b)   BERT's post-norm residual:
                                                                                             biased, out
    attn_mha         kq = mul_mat(K, Q); soft_max_ext; kqv = mul_mat(V^T, kq)   build_attn_mha:
                                                                                   kq, kq_soft_max, kqv, kqv_out
    attn_qkv         attn_mha on the Q, K, V projections of one stacked weight       q, k, v, and attn_mha's
"""
from __future__ import annotations

import numpy as np

from ..dispatch import op, tap
from .elementwise import add, gelu, mul
from .matmul import mul_mat
from .movement import cont, permute
from .norm import norm
from .softmax import soft_max_ext


@op("mul_mat_add", covers=(), taps=True)
def mul_mat_add(a, b, bias=None) -> np.ndarray:
    """ggml_add(ctx, ggml_mul_mat(ctx, a, b), bias): a projection with its bias (llama.cpp's build_lora_mm, then
    ggml_add of the `.bias` tensor).

    a     ne [k, n]   numpy (n, k)   the weight, any mul_mat type
    b     ne [k, m]   numpy (m, k)   f32 activations, e.g. (n_tokens, n_embd)
    bias  ne [n]      numpy (n,)     f32, or None (then this is mul_mat)
    out   ne [n, m]   numpy (m, n)   f32

    Kernels: kernels/unary.py (numba: the bias added in place on the product it owns)."""
    y = tap("product", mul_mat(a, b))
    return y if bias is None else tap("biased", add(y, bias))


@op("mul_mat_add_gelu", covers=(), taps=True)
def mul_mat_add_gelu(a, b, bias) -> np.ndarray:
    """ggml_gelu(ctx, ggml_add(ctx, ggml_mul_mat(ctx, a, b), bias)): BERT's FFN up projection, its bias, then
    GELU (the profile's: the formula, or ggml-cpu's f16 table in ggml numerics).

    a     ne [k, n]   numpy (n, k)   the weight, any mul_mat type
    b     ne [k, m]   numpy (m, k)   f32 activations
    bias  ne [n]      numpy (n,)     f32
    out   ne [n, m]   numpy (m, n)   f32

    Kernels: kernels/unary.py (numba: the bias added in place on the product it owns, then the gelu kernel)."""
    y = tap("biased", add(tap("product", mul_mat(a, b)), bias))
    return tap("act", gelu(y))


@op("add_norm_affine", covers=(), taps=True)
def add_norm_affine(a, bias, residual, w, b, eps: float) -> np.ndarray:
    """llama.cpp's build_norm(LLM_NORM) after a projection's bias and the residual, as BERT's layers run it:

        cur = a + bias (bias may be None);  cur = cur + residual (may be None);  out = norm(cur, eps) * w + b

    a, residual  ne [n, m]   numpy (m, n)   f32
    bias, w, b   ne [n]      numpy (n,)     f32
    out          ne [n, m]   numpy (m, n)   f32

    Kernels: kernels/norm.py (numba: one pass, every f32 rounding of the sequence in its order)."""
    cur = tap("biased", a if bias is None else add(a, bias))
    if residual is not None:
        cur = add(cur, residual)
    return tap("out", add(mul(norm(cur, eps), w), b))


@op("attn_mha", covers=(), taps=True)
def attn_mha(q, k, v, mask, scale: float) -> np.ndarray:
    """llama.cpp's attention without flash attention (build_attn_mha), heads concatenated:

        kq = mul_mat(K, Q)  ne [n_kv, n_tokens, n_head, n_seq];  kq = soft_max_ext(kq, mask, scale)
        kqv = mul_mat(V^T, kq)  ne [head_dim, n_tokens, n_head, n_seq];  out = kqv permuted to tokens first

    q        ne [head_dim, n_head, n_tokens, n_seq]   numpy (n_seq, n_tokens, n_head, head_dim)   f32
    k, v     ne [head_dim, n_head, n_kv, n_seq]       numpy (n_seq, n_kv, n_head, head_dim)       f32
    mask     ne [n_kv, >= n_tokens, 1, n_seq]         numpy (n_seq, 1, >= n_tokens, n_kv)          f32, or None
    out      ne [n_head*head_dim, n_tokens, n_seq]    numpy (n_seq, n_tokens, n_head*head_dim)    f32

    Q stays a permuted view as ggml's permute is (llama.cpp's build then takes vec_dot for kq, not llamafile's
    sgemm: that rule reads src1's strides). Kernels: kernels/attention.py (numba, numerics="fast": one pass)."""
    S, T, H, D = q.shape
    qh = permute(q, 0, 2, 1, 3)                                           # (S, H, T, D)     ne [D, T, H, S]
    kh = cont(permute(k, 0, 2, 1, 3))                                     # (S, H, n_kv, D)  ne [D, n_kv, H, S]
    kq = tap("kq", mul_mat(kh, qh))                                       # (S, H, T, n_kv)  ne [n_kv, T, H, S]
    kq = tap("kq_soft_max", soft_max_ext(kq, mask, scale, 0.0))
    vt = cont(permute(v, 1, 2, 0, 3))                                     # (S, H, D, n_kv)  ne [n_kv, D, H, S]
    kqv = tap("kqv", mul_mat(vt, kq))                                     # (S, H, T, D)     ne [D, T, H, S]
    return tap("kqv_out", cont(permute(kqv, 0, 2, 1, 3)).reshape(S, T, H * D))


@op("attn_qkv", covers=(), taps=True)
def attn_qkv(x, wqkv, bqkv, mask, scale: float, n_head: int) -> np.ndarray:
    """attn_mha on the Q, K and V projections of x, with the three weights stacked into one (`stack_qkv`):

        q, k, v = mul_mat_add(wqkv[i*n:(i+1)*n], x, bqkv[i*n:(i+1)*n]) for i = 0, 1, 2   (n = n_head*head_dim)

    x     ne [n_embd, n_tokens, n_seq]   numpy (n_seq, n_tokens, n_embd)   f32
    wqkv  ne [n_embd, 3n]                numpy (3n, n_embd)                f32: attn_q, attn_k, attn_v rows
    bqkv  ne [3n]                        numpy (3n,)                       f32, or None
    out   ne [n, n_tokens, n_seq]        numpy (n_seq, n_tokens, n)        f32

    Kernels: kernels/attention.py (numba, numerics="fast": one product of the stacked weight, attention on its
    planes: each output is the f32 dot fast mode's mul_mat computes for its own weight row)."""
    S, T, E = x.shape
    n = wqkv.shape[0] // 3
    flat = x.reshape(S * T, E)
    bs = (None,) * 3 if bqkv is None else (bqkv[:n], bqkv[n:2 * n], bqkv[2 * n:])
    q, k, v = (tap(role, mul_mat_add(wqkv[i * n:(i + 1) * n], flat, bs[i]).reshape(S, T, n_head, n // n_head))
               for i, role in enumerate(("q", "k", "v")))
    return attn_mha(q, k, v, mask, scale)


def stack_qkv(wq, bq, wk, bk, wv, bv):
    """(wqkv, bqkv) for attn_qkv: the three f32 weights (n, n_embd) stacked into one (3n, n_embd) matrix and
    their biases into one (3n,) vector (None without biases), both read-only; None unless all three weights
    are f32 NumPy matrices of one shape with all or none of the biases. A model stacks them once, at load."""
    ws, bs = (wq, wk, wv), (bq, bk, bv)
    if not all(type(a) is np.ndarray and a.dtype == np.float32 and a.ndim == 2 and a.shape == ws[0].shape
               for a in ws):
        return None
    if all(b is None for b in bs):
        return _frozen(np.concatenate(ws)), None
    if all(type(b) is np.ndarray and b.dtype == np.float32 and b.shape == (a.shape[0],) for a, b in zip(ws, bs)):
        return _frozen(np.concatenate(ws)), _frozen(np.concatenate(bs))
    return None


def _frozen(a: np.ndarray) -> np.ndarray:
    """a read-only: a weight, which no op changes (a backend may keep one copy of it)."""
    a.flags.writeable = False
    return a
