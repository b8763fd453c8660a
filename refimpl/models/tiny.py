"""Llama-architecture GGUFs with random weights, written with refimpl.gguf.save: the tests' models that need no
download (tests/models/tiny.py), and the miniature `refimpl.textgen.precompile` compiles the kernels on."""
from __future__ import annotations

import numpy as np

from .. import gguf
from ..qtensor import quantize
from ..tokenizers.llama import byte_level_vocab


def write_tiny_llama(path, *, n_vocab=96, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=96,
                     rope_base=50000.0, tied=False, wtype="f32", embd_type=None, seed=0, vocab=True, arch="llama"):
    """A llama-architecture GGUF with random weights (norm gains spread around 1, GQA when n_head_kv < n_head).
    arch="qwen3": the same tensors plus each layer's Q/K norm gains (attn_q_norm, attn_k_norm), drawn after
    all the others, and the metadata under "qwen3." (a llama file's bytes do not depend on the option).

    wtype: the matrices' type; embd_type: token_embd's (default wtype), e.g. SmolLM2's Q4_1 layers with a Q8_0
    embedding. vocab=True adds `byte_level_vocab(n_vocab)` so that llama.cpp loads the file; the weights do not depend
    on it. The same arguments always give the same bytes (tests/models/test_llama_tiny_golden.py checks a
    SHA-256 of each file llama.cpp ran).
    """
    rng = np.random.default_rng(seed)
    hd = n_embd // n_head

    def w(*shape, scale=None, t=wtype):
        x = rng.standard_normal(shape).astype(np.float32) * np.float32(scale or shape[-1] ** -0.5)
        return x if t == "f32" else quantize(x, t)

    def gain(n):
        return (1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32)

    t = {"token_embd.weight": w(n_vocab, n_embd, scale=1.0, t=embd_type or wtype), "output_norm.weight": gain(n_embd)}
    if not tied:
        t["output.weight"] = w(n_vocab, n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        t.update({p + "attn_norm.weight": gain(n_embd), p + "attn_q.weight": w(n_head * hd, n_embd),
                  p + "attn_k.weight": w(n_head_kv * hd, n_embd), p + "attn_v.weight": w(n_head_kv * hd, n_embd),
                  p + "attn_output.weight": w(n_embd, n_head * hd), p + "ffn_norm.weight": gain(n_embd),
                  p + "ffn_gate.weight": w(n_ff, n_embd), p + "ffn_up.weight": w(n_ff, n_embd),
                  p + "ffn_down.weight": w(n_embd, n_ff)})
    if arch == "qwen3":
        for i in range(n_layer):
            t[f"blk.{i}.attn_q_norm.weight"], t[f"blk.{i}.attn_k_norm.weight"] = gain(hd), gain(hd)
    elif arch != "llama":
        raise ValueError(f"write_tiny_llama: arch {arch!r} (llama or qwen3)")
    a = arch
    md = {"general.architecture": arch, "general.name": f"tiny-random-{arch}",
          f"{a}.context_length": 256, f"{a}.embedding_length": n_embd, f"{a}.block_count": n_layer,
          f"{a}.feed_forward_length": n_ff, f"{a}.attention.head_count": n_head,
          f"{a}.attention.head_count_kv": n_head_kv, f"{a}.rope.freq_base": float(rope_base),
          f"{a}.attention.layer_norm_rms_epsilon": 1e-5, f"{a}.rope.dimension_count": hd,
          f"{a}.vocab_size": n_vocab}
    if vocab:
        md.update(byte_level_vocab(n_vocab))
    gguf.save(path, md, t)
    return path
