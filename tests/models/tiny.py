"""Tiny random GGUFs written with refimpl.gguf.save, for model tests that need no download (the Llama one,
`write_tiny_llama`, lives in refimpl.models.tiny: the kernels' precompile writes one too)."""
from __future__ import annotations

import numpy as np

import refimpl
from refimpl import gguf
from refimpl.models.tiny import write_tiny_llama  # noqa: F401  (the tests' name for it)
from refimpl.tokenizers.llama import byte_level_vocab


def write_tiny_gpt_oss(path, *, n_vocab=96, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, head_dim=24, n_expert=4,
                       n_expert_used=2, n_ff_exp=64, n_swa=8, rope_base=150000.0, expert_type="mxfp4", seed=0,
                       vocab=True, yarn=None):
    """A gpt-oss GGUF (llama.cpp's "gpt-oss" architecture) with random weights: Q/K/V and output biases,
    per-head attention sinks, post-attention norms, a router with a bias, and n_expert experts (gate, up,
    down, each with a bias) stored as `expert_type` (gpt-oss's own MXFP4 by default), everything else f32.
    head_dim * n_head need not be n_embd (gpt-oss's is not). Sliding-window layers every other one
    (llama.cpp's pattern 2: the even layers), window n_swa. yarn=(factor, original context): RoPE scaling
    "yarn" as the released gpt-oss files set it (theirs: 32, 4096). The same arguments always give the same
    bytes (yarn=None adds no key)."""
    rng = np.random.default_rng(seed)

    def w(*shape, scale=None, wtype="f32"):
        x = rng.standard_normal(shape).astype(np.float32) * np.float32(scale or shape[-1] ** -0.5)
        return x if wtype == "f32" else refimpl.quantize(x, wtype)

    def gain(n):
        return (1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32)

    def bias(*shape):
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)

    nq, nkv = n_head * head_dim, n_head_kv * head_dim
    t = {"token_embd.weight": w(n_vocab, n_embd, scale=1.0), "output_norm.weight": gain(n_embd),
         "output.weight": w(n_vocab, n_embd)}
    for i in range(n_layer):
        p = f"blk.{i}."
        t.update({p + "attn_norm.weight": gain(n_embd),
                  p + "attn_q.weight": w(nq, n_embd), p + "attn_q.bias": bias(nq),
                  p + "attn_k.weight": w(nkv, n_embd), p + "attn_k.bias": bias(nkv),
                  p + "attn_v.weight": w(nkv, n_embd), p + "attn_v.bias": bias(nkv),
                  p + "attn_output.weight": w(n_embd, nq), p + "attn_output.bias": bias(n_embd),
                  p + "attn_sinks.weight": rng.standard_normal(n_head).astype(np.float32),
                  p + "post_attention_norm.weight": gain(n_embd),
                  p + "ffn_gate_inp.weight": w(n_expert, n_embd, scale=1.0), p + "ffn_gate_inp.bias": bias(n_expert),
                  p + "ffn_gate_exps.weight": w(n_expert, n_ff_exp, n_embd, wtype=expert_type),
                  p + "ffn_gate_exps.bias": bias(n_expert, n_ff_exp),
                  p + "ffn_up_exps.weight": w(n_expert, n_ff_exp, n_embd, wtype=expert_type),
                  p + "ffn_up_exps.bias": bias(n_expert, n_ff_exp),
                  p + "ffn_down_exps.weight": w(n_expert, n_embd, n_ff_exp, wtype=expert_type),
                  p + "ffn_down_exps.bias": bias(n_expert, n_embd)})
    a = "gpt-oss"
    md = {"general.architecture": a, "general.name": "tiny-random-gpt-oss",
          f"{a}.context_length": 256, f"{a}.embedding_length": n_embd, f"{a}.block_count": n_layer,
          f"{a}.feed_forward_length": n_ff_exp, f"{a}.expert_feed_forward_length": n_ff_exp,
          f"{a}.expert_count": n_expert, f"{a}.expert_used_count": n_expert_used,
          f"{a}.attention.head_count": n_head, f"{a}.attention.head_count_kv": n_head_kv,
          f"{a}.attention.key_length": head_dim, f"{a}.attention.value_length": head_dim,
          f"{a}.attention.sliding_window": n_swa, f"{a}.rope.freq_base": float(rope_base),
          f"{a}.attention.layer_norm_rms_epsilon": 1e-5, f"{a}.vocab_size": n_vocab}
    if yarn is not None:
        md.update({f"{a}.rope.scaling.type": "yarn", f"{a}.rope.scaling.factor": float(yarn[0]),
                   f"{a}.rope.scaling.original_context_length": int(yarn[1])})
    if vocab:
        md.update(byte_level_vocab(n_vocab))
    gguf.save(path, md, t)
    return path
