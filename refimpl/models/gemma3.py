"""Gemma 3 as plain functions over refimpl's ops, reading real GGUF files (llama.cpp's `llm_build_gemma3`).

    model = load("gemma-3-270m-q4_k_m.gguf")               # refimpl fetch gemma3
    cache = new_cache(model, n_ctx=512)
    logits = forward(model, tokens, cache)                 # (len(tokens), n_vocab) f32; appends to cache

Shapes and names as in refimpl.models.llama (activations (n_tokens, n_embd) = ggml ne [n_embd, n_tokens],
llama.cpp's graph names for `capture=`: `inp_scaled`, `attn_norm-0`, `Qcur_normed-0`, `Qcur-0`, `kq-0`,
`attn_post_norm-0`, `sa_out-0`, `ffn_norm-0`, `ffn_out-0`, `ffn_post_norm-0`, `l_out-0`, `result_norm`,
`result_output`).

The graph, as llama.cpp 0.25.3 builds it:

    x = token_embd[tokens] * sqrt(n_embd)                                  (inp_scaled)
    per layer il:
        cur = rms_norm(x) * attn_norm
        Q, K, V = attn_q cur, attn_k cur, attn_v cur                      (per head: head_dim = key_length)
        Q = rope(rms_norm(Q) * attn_q_norm), K = rope(rms_norm(K) * attn_k_norm)   (NEOX, per head)
        Q = Q * attention scale (1/sqrt(head_dim); 27B: 1/sqrt(n_embd / n_head))
        attn = attn_output softmax(K Q^T + mask) V                         (no further scale)
        sa_out = rms_norm(attn) * post_attention_norm + x
        ffn = ffn_down(gelu(ffn_gate h) * ffn_up h),  h = rms_norm(sa_out) * ffn_norm   (GEGLU)
        x = rms_norm(ffn) * post_ffw_norm + sa_out
    logits = output rms_norm(x) * output_norm      (output tied to token_embd when absent)
    logits = tanh(logits / cap) * cap              (only where the GGUF sets final_logit_softcapping)

Sliding-window and global layers: with `gemma3.attention.sliding_window` (n_swa) set, layer il is a
sliding-window layer unless il % pattern == pattern - 1 (`attention.sliding_window_pattern`, default 6, or
a per-layer list); those attend only to the last n_swa positions (llama.cpp's LLAMA_SWA_TYPE_STANDARD:
masked where pos - kv_pos >= n_swa) and rotate with `rope.freq_base_swa` (default 10000) and scale 1,
the global layers with `rope.freq_base` and the context's scale. Gemma's norm weights are stored with
their 1 + w already added by the converter: the graph multiplies by them as they are.

The KV cache is refimpl.models.llama's, one buffer per layer for every position (llama.cpp keeps the
sliding-window layers in a smaller ring of cells; the values a position attends to are the same, so the
results are too, and under numerics="ggml" they are llama.cpp's bits as long as the context stays within
that ring: n_ctx <= n_swa + n_ubatch, e.g. 1024 for the 270M model at llama.cpp's default batch).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backends import forward_scope
from ..ops import add, geglu, get_rows, mul, mul_mat, rms_norm, rope_ext, scale, tanh
from . import llama
from .common import capture_fn, constant, getter, load_checked, to_host
from ..ops.rope import ROPE_TYPE_NEOX
from .llama import (HParams, KVCache, attention, causal_mask, format_chat,  # noqa: F401
                    new_cache)

A = Any  # np.ndarray or refimpl.QTensor

ARCHS = {"gemma3": ROPE_TYPE_NEOX}
SWA_PATTERN = 6                 # llama.cpp's load_swa_pattern(ml, 6) for gemma3
ROPE_BASE_SWA = 10000.0         # llama_hparams.rope_freq_base_train_swa's default


@dataclass(frozen=True)
class Gemma3Params:
    """What Gemma 3 adds to the llama hyper-parameters (GGUF `gemma3.…` keys)."""
    n_swa: int                      # 0: every layer global
    is_swa: tuple[bool, ...]        # per layer
    rope_base_swa: float
    attn_scale: float               # Q's scale before the attention (the kq scale itself is 1)
    final_softcap: float            # 0: none
    embd_scale: float               # sqrt(n_embd), as llama.cpp's sqrtf

    @classmethod
    def from_gguf(cls, kv: dict, hp: HParams, where="GGUF") -> "Gemma3Params":
        g = getter(kv, f"{hp.arch}.", where)

        def real(key, default, lo=0.0):
            v = g(key, default)
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < lo:
                raise ValueError(f"{where}: {hp.arch}.{key} is {v!r}; expected a finite number >= {lo}")
            return float(v)

        n_swa = g("attention.sliding_window", 0)
        if isinstance(n_swa, (bool, np.bool_)) or not isinstance(n_swa, numbers.Integral) or n_swa < 0:
            raise ValueError(f"{where}: {hp.arch}.attention.sliding_window is {n_swa!r}; expected an integer >= 0")
        n_swa = int(n_swa)
        if n_swa:
            pattern = g("attention.sliding_window_pattern", SWA_PATTERN)
            if isinstance(pattern, list):
                if len(pattern) != hp.n_layer or not all(isinstance(x, (bool, np.bool_)) for x in pattern):
                    raise ValueError(f"{where}: {hp.arch}.attention.sliding_window_pattern has {len(pattern)} "
                                     f"entries; expected one bool per layer ({hp.n_layer})")
                is_swa = tuple(bool(x) for x in pattern)
            else:
                if isinstance(pattern, (bool, np.bool_)) or not isinstance(pattern, numbers.Integral) or pattern < 0:
                    raise ValueError(f"{where}: {hp.arch}.attention.sliding_window_pattern is {pattern!r}; "
                                     f"expected an integer >= 0 or a per-layer list")
                pattern = int(pattern)          # llama_hparams::set_swa_pattern, dense_first = false
                is_swa = tuple(pattern == 0 or il % pattern < pattern - 1 for il in range(hp.n_layer))
        else:
            is_swa = (False,) * hp.n_layer
        # llama.cpp's 27B rule (n_layer 62): the scale from n_embd / n_head instead of the head size
        d = hp.n_embd // hp.n_head if hp.n_layer == 62 else hp.head_dim
        return cls(n_swa=n_swa, is_swa=is_swa, rope_base_swa=real("rope.freq_base_swa", ROPE_BASE_SWA),
                   attn_scale=float(np.float32(1.0) / np.sqrt(np.float32(d))),
                   final_softcap=real("final_logit_softcapping", 0.0),
                   embd_scale=float(np.sqrt(np.float32(hp.n_embd))))


@dataclass(frozen=True)
class Layer:
    """Field x <- GGUF tensor `blk.{i}.x.weight` (NumPy order)."""
    attn_norm: A
    attn_q: A
    attn_k: A
    attn_v: A
    attn_q_norm: A
    attn_k_norm: A
    attn_output: A
    post_attention_norm: A
    ffn_norm: A
    ffn_gate: A
    ffn_up: A
    ffn_down: A
    post_ffw_norm: A


@dataclass
class Gemma3Model:
    hparams: HParams                # the llama hyper-parameters (new_cache and generate read these)
    gemma: Gemma3Params
    token_embd: A
    output_norm: A
    output: A                       # token_embd itself when the output is tied
    layers: list[Layer]
    tokenizer: Any = None
    metadata: dict = field(default_factory=dict, repr=False)
    path: str = ""


def load(path, *, tokenizer: bool = True, dequantize_weights: bool = False, progress=None) -> Gemma3Model:
    """Load a Gemma 3 GGUF: hyper-parameters from metadata, weights as memory-mapped views, every tensor's
    presence, shape and type checked first (a refimpl.LoadError naming the file, the key or tensor and both
    shape orders otherwise). dequantize_weights and progress as in refimpl.models.llama.load."""
    return load_checked(path, _load, tokenizer, dequantize_weights, progress)


def _load(f, tokenizer: bool, dequantize_weights: bool, progress) -> Gemma3Model:
    path, kv = f.path, f.metadata
    hp, emb = llama.hparams_and_embedding(f, kv, rope_modes=ARCHS)
    gp = Gemma3Params.from_gguf(kv, hp, where=path)
    t0 = llama._tensor
    n_q, n_kv, D = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim, hp.head_dim
    layers = []
    for i in range(hp.n_layer):
        p = f"blk.{i}."
        t = lambda n, s, kind="matrix": t0(f, p + n, s, path, kind)   # noqa: E731
        vec = lambda n, k: t(n, (k,), "vector")                       # noqa: E731
        layers.append(Layer(
            attn_norm=vec("attn_norm.weight", hp.n_embd), attn_q=t("attn_q.weight", (n_q, hp.n_embd)),
            attn_k=t("attn_k.weight", (n_kv, hp.n_embd)), attn_v=t("attn_v.weight", (n_kv, hp.n_embd)),
            attn_q_norm=vec("attn_q_norm.weight", D), attn_k_norm=vec("attn_k_norm.weight", D),
            attn_output=t("attn_output.weight", (hp.n_embd, n_q)),
            post_attention_norm=vec("post_attention_norm.weight", hp.n_embd),
            ffn_norm=vec("ffn_norm.weight", hp.n_embd),
            ffn_gate=t("ffn_gate.weight", (hp.n_ff, hp.n_embd)), ffn_up=t("ffn_up.weight", (hp.n_ff, hp.n_embd)),
            ffn_down=t("ffn_down.weight", (hp.n_embd, hp.n_ff)),
            post_ffw_norm=vec("post_ffw_norm.weight", hp.n_embd)))
        if progress and not dequantize_weights:
            progress(i + 1, hp.n_layer + 1)
    output_norm, output, layers, tok = llama.finish_load(f, hp, emb, layers, tokenizer, dequantize_weights, progress)
    return Gemma3Model(hp, gp, emb, output_norm, output, layers, tok, kv, str(path))


def swa_mask(n_tokens: int, n_kv: int, pos: int, n_swa: int) -> np.ndarray:
    """causal_mask with llama.cpp's standard sliding window: kv position j is also masked where
    (pos + t) - j >= n_swa."""
    j = np.arange(n_kv)[None, :]
    t = pos + np.arange(n_tokens)[:, None]
    return constant(np.where((j <= t) & (t - j < n_swa), np.float32(0), np.float32(-np.inf)).astype(np.float32))


def norm(x, w, eps: float):
    """llama.cpp's build_norm(LLM_NORM_RMS): rms_norm over the rows (the last axis), times the weight."""
    return mul(rms_norm(x, eps), w)


def layer(x, w: Layer, model: Gemma3Model, cache: KVCache, il: int, pos: int, mask, cap, positions) -> np.ndarray:
    """x (n_tokens, n_embd) -> (n_tokens, n_embd), as one iteration of llm_build_gemma3's layer loop; this
    layer's K, V for pos.. go into the cache. mask: this layer's (sliding-window or global)."""
    hp, gp = model.hparams, model.gemma
    T, D = x.shape[0], hp.head_dim
    swa = gp.is_swa[il]
    base, fscale = (gp.rope_base_swa, 1.0) if swa else (hp.rope_base, hp.rope_freq_scale)
    cur = norm(x, w.attn_norm, hp.rms_eps)
    cap(f"attn_norm-{il}", cur)
    q = mul_mat(w.attn_q, cur).reshape(T, hp.n_head, D)
    k = mul_mat(w.attn_k, cur).reshape(T, hp.n_head_kv, D)
    v = mul_mat(w.attn_v, cur).reshape(T, hp.n_head_kv, D)
    rope = lambda t: rope_ext(t, positions, None, n_dims=hp.n_rot, mode=hp.rope_mode,  # noqa: E731
                              freq_base=base, freq_scale=fscale, **hp.rope_args())
    q = norm(q, w.attn_q_norm, hp.rms_eps)
    cap(f"Qcur_normed-{il}", q)
    q = rope(q)
    k = norm(k, w.attn_k_norm, hp.rms_eps)
    cap(f"Kcur_normed-{il}", k)
    k = rope(k)
    cap(f"Qcur-{il}", q)
    cap(f"Kcur-{il}", k)
    cap(f"Vcur-{il}", v)
    q = scale(q, gp.attn_scale)
    kk, vv = cache.store(il, k, v, pos)
    attn = mul_mat(w.attn_output, attention(q, kk, vv, mask, 1.0, cap, il))
    cap(f"attn_out-{il}", attn)
    cur = norm(attn, w.post_attention_norm, hp.rms_eps)
    cap(f"attn_post_norm-{il}", cur)
    sa_out = add(cur, x)
    cap(f"sa_out-{il}", sa_out)
    cur = norm(sa_out, w.ffn_norm, hp.rms_eps)
    cap(f"ffn_norm-{il}", cur)
    cur = mul_mat(w.ffn_down, geglu(mul_mat(w.ffn_gate, cur), mul_mat(w.ffn_up, cur)))
    cap(f"ffn_out-{il}", cur)
    cur = norm(cur, w.post_ffw_norm, hp.rms_eps)
    cap(f"ffn_post_norm-{il}", cur)
    out = add(cur, sa_out)
    cap(f"l_out-{il}", out)
    return out


def forward(model: Gemma3Model, tokens, cache: KVCache, *, capture=None, last_only: bool = False) -> np.ndarray:
    """Run `tokens` after the cache's n_past tokens; returns logits (n_tokens, n_vocab) f32 (only the last row
    with last_only=True) and advances the cache."""
    hp, gp = model.hparams, model.gemma
    tokens = llama.checked_tokens(hp, tokens, cache)
    pos, T = cache.n_past, tokens.size
    cap = capture_fn(capture)
    x = get_rows(model.token_embd, tokens)
    cap("inp_embd", x)
    x = scale(x, gp.embd_scale)
    cap("inp_scaled", x)
    n_kv = cache.span(pos + T)
    masks = {False: causal_mask(T, n_kv, pos)}
    if any(gp.is_swa):
        masks[True] = swa_mask(T, n_kv, pos, gp.n_swa)
    positions = constant(np.arange(pos, pos + T, dtype=np.int32))
    with forward_scope(T, "decoder"):
        for il, w in enumerate(model.layers):
            x = layer(x, w, model, cache, il, pos, masks[gp.is_swa[il]], cap, positions)
    cache.n_past = pos + T
    if last_only:
        x = x[-1:]
    x = norm(x, model.output_norm, hp.rms_eps)
    cap("result_norm", x)
    logits = mul_mat(model.output, x)
    if gp.final_softcap:
        logits = scale(tanh(scale(logits, 1.0 / gp.final_softcap)), gp.final_softcap)
    cap("result_output", logits)
    return to_host(logits)


def generate(model: Gemma3Model, prompt, max_tokens: int = 64, sampler=None, *, cache: KVCache | None = None,
             stop: tuple[str, ...] = (), add_special: bool = True, on_token=None):
    """Stream text pieces of a continuation of `prompt` (refimpl.models.llama.generate's loop over this
    forward): stops at the vocabulary's end-of-generation tokens (<end_of_turn>, <eos>), after max_tokens,
    or at one of `stop`."""
    return llama.decode_loop(forward, model, prompt, max_tokens, sampler, cache=cache, stop=stop,
                             add_special=add_special, on_token=on_token, kq_scale=1.0)   # Q comes pre-scaled
