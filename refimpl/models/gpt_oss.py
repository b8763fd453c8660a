"""gpt-oss as plain functions over refimpl's ops (llama.cpp's "gpt-oss" architecture, `llama_model_openai_moe`).

    model = load("tiny-gpt-oss.gguf")
    cache = new_cache(model, n_ctx=256)
    logits = forward(model, tokens, cache)                 # (len(tokens), n_vocab) f32; appends to cache

Shapes and names as in refimpl.models.llama (activations (n_tokens, n_embd) = ggml ne [n_embd, n_tokens];
llama.cpp's graph names for `capture=`: `attn_norm-0`, `Qcur-0`, `kq-0`, `kq_soft_max-0`, `attn_out-0`,
`ffn_inp-0`, `attn_post_norm-0`, `ffn_moe_logits_biased-0`, `ffn_moe_topk-0`, `ffn_moe_weights_softmax-0`,
`ffn_moe_up_biased-0`, `ffn_moe_gate_biased-0`, `ffn_moe_swiglu_oai-0`, `ffn_moe_down_biased-0`,
`ffn_moe_out-0`, `l_out-0`, `result_norm`, `result_output`).

The graph, as llama.cpp 0.25.3 builds it:

    x = token_embd[tokens]
    per layer il:
        cur = rms_norm(x) * attn_norm
        Q, K, V = attn_q cur + bq, attn_k cur + bk, attn_v cur + bv     (per head: head_dim = key_length,
                                                                         n_head * head_dim need not be n_embd)
        Q, K = rope(Q), rope(K)                                         (NEOX; per-layer base, below)
        kq = softmax(K Q^T / sqrt(head_dim) + mask, sinks)              (soft_max_ext's per-head sinks: one
                                                                         more logit in each row's denominator)
        ffn_inp = attn_output (V kq) + attn_output.bias + x
        h = rms_norm(ffn_inp) * post_attention_norm
        router = ffn_gate_inp h + ffn_gate_inp.bias                     (n_tokens, n_expert)
        sel = the n_expert_used largest router logits (argsort_top_k), w = softmax(router[sel])
        up, gate = ffn_{up,gate}_exps[sel] h + their biases[sel]        (mul_mat_id, add_id)
        y = ffn_down_exps[sel] swiglu_oai(gate, up, 1.702, 7.0) + ffn_down_exps.bias[sel]
        x = sum over the chosen experts of y * w  (+ ffn_inp)          (times expert_weights_scale if set)
    logits = output rms_norm(x) * output_norm

Sliding-window and global layers: layer il is a sliding-window layer unless il % pattern == pattern - 1
(`attention.sliding_window_pattern`, default 2: the even layers; or a per-layer list), masked where
pos - kv_pos >= `attention.sliding_window` (llama.cpp's LLAMA_SWA_TYPE_STANDARD), rotating with
`rope.freq_base_swa` (default: `rope.freq_base`); both kinds take the file's RoPE scaling, "yarn" in the
released gpt-oss files (factor 32 over 4096 positions: refimpl.models.llama.yarn_params). The expert weights
are usually MXFP4; any mul_mat type works.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backends import forward_scope
from ..ops import (add, add_id, argsort_top_k, get_rows, mul, mul_mat, mul_mat_id, rope_ext, scale,
                   soft_max_ext, swiglu_oai)
from . import llama
from .common import capture_fn, constant, getter, load_checked, to_host
from .gemma3 import norm, swa_mask
from ..ops.rope import ROPE_TYPE_NEOX
from .llama import (HParams, KVCache, attention, causal_mask, format_chat,  # noqa: F401
                    new_cache)

A = Any  # np.ndarray or refimpl.QTensor

ARCHS = {"gpt-oss": ROPE_TYPE_NEOX}
SWA_PATTERN = 2                 # llama.cpp's load_swa_pattern(ml, 2) for gpt-oss
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0    # llama.cpp's LLM_FFN_SWIGLU_OAI_MOE constants


@dataclass(frozen=True)
class GptOssParams:
    """What gpt-oss adds to the llama hyper-parameters (GGUF `gpt-oss.…` keys)."""
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_swa: int
    is_swa: tuple[bool, ...]        # per layer
    rope_base_swa: float
    expert_weights_scale: float     # 0 or 1: none

    @classmethod
    def from_gguf(cls, kv: dict, hp: HParams, where="GGUF") -> "GptOssParams":
        g = getter(kv, f"{hp.arch}.", where)

        def count(key, *default, lo=1):
            v = g(key, *default)
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral) or v < lo:
                raise ValueError(f"{where}: {hp.arch}.{key} is {v!r}; expected an integer >= {lo}")
            return int(v)

        def real(key, default):
            v = g(key, default)
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{where}: {hp.arch}.{key} is {v!r}; expected a finite number >= 0")
            return float(v)

        n_expert = count("expert_count")
        n_used = count("expert_used_count")
        if n_used > n_expert:
            raise ValueError(f"{where}: {hp.arch}.expert_used_count {n_used} exceeds expert_count {n_expert}")
        n_swa = count("attention.sliding_window", lo=0)
        pattern = g("attention.sliding_window_pattern", SWA_PATTERN)
        if isinstance(pattern, list):
            if len(pattern) != hp.n_layer or not all(isinstance(x, (bool, np.bool_)) for x in pattern):
                raise ValueError(f"{where}: {hp.arch}.attention.sliding_window_pattern has {len(pattern)} entries; "
                                 f"expected one bool per layer ({hp.n_layer})")
            is_swa = tuple(bool(x) for x in pattern)
        else:
            pattern = count("attention.sliding_window_pattern", SWA_PATTERN, lo=0)
            is_swa = tuple(pattern == 0 or il % pattern < pattern - 1 for il in range(hp.n_layer))
        if not n_swa:
            is_swa = (False,) * hp.n_layer
        return cls(n_expert=n_expert, n_expert_used=n_used, n_ff_exp=count("expert_feed_forward_length"),
                   n_swa=n_swa, is_swa=is_swa, rope_base_swa=real("rope.freq_base_swa", hp.rope_base),
                   expert_weights_scale=real("expert_weights_scale", 0.0))


@dataclass(frozen=True)
class Layer:
    """Field x <- GGUF tensor `blk.{i}.x.weight`, x_b <- `blk.{i}.x.bias` (NumPy order)."""
    attn_norm: A
    attn_q: A
    attn_q_b: A
    attn_k: A
    attn_k_b: A
    attn_v: A
    attn_v_b: A
    attn_output: A
    attn_output_b: A
    attn_sinks: A
    post_attention_norm: A
    ffn_gate_inp: A
    ffn_gate_inp_b: A
    ffn_gate_exps: A
    ffn_gate_exps_b: A
    ffn_up_exps: A
    ffn_up_exps_b: A
    ffn_down_exps: A
    ffn_down_exps_b: A


@dataclass
class GptOssModel:
    hparams: HParams                # the llama hyper-parameters (new_cache and generate read these)
    oss: GptOssParams
    token_embd: A
    output_norm: A
    output: A
    layers: list[Layer]
    tokenizer: Any = None
    metadata: dict = field(default_factory=dict, repr=False)
    path: str = ""


def load(path, *, tokenizer: bool = True, dequantize_weights: bool = False, progress=None) -> GptOssModel:
    """Load a gpt-oss GGUF: hyper-parameters from metadata, weights as memory-mapped views, every tensor's
    presence, shape and type checked first (a refimpl.LoadError naming the file, the key or tensor and both
    shape orders otherwise). dequantize_weights and progress as in refimpl.models.llama.load."""
    return load_checked(path, _load, tokenizer, dequantize_weights, progress)


def _load(f, tokenizer: bool, dequantize_weights: bool, progress) -> GptOssModel:
    path, kv = f.path, f.metadata
    arch = kv.get("general.architecture")
    if isinstance(arch, str) and f"{arch}.feed_forward_length" not in kv:      # gpt-oss sizes only its experts
        kv = dict(kv, **{f"{arch}.feed_forward_length": kv.get(f"{arch}.expert_feed_forward_length")})
    hp, emb = llama.hparams_and_embedding(f, kv, rope_modes=ARCHS)
    op = GptOssParams.from_gguf(kv, hp, where=path)
    t0 = llama._tensor
    E, F, n_embd = op.n_expert, op.n_ff_exp, hp.n_embd
    n_q, n_kv = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
    layers = []
    for i in range(hp.n_layer):
        p = f"blk.{i}."
        t = lambda n, s, kind="matrix": t0(f, p + n, s, path, kind)   # noqa: E731
        vec = lambda n, *s: t(n, s, "vector")                         # noqa: E731
        layers.append(Layer(
            attn_norm=vec("attn_norm.weight", n_embd),
            attn_q=t("attn_q.weight", (n_q, n_embd)), attn_q_b=vec("attn_q.bias", n_q),
            attn_k=t("attn_k.weight", (n_kv, n_embd)), attn_k_b=vec("attn_k.bias", n_kv),
            attn_v=t("attn_v.weight", (n_kv, n_embd)), attn_v_b=vec("attn_v.bias", n_kv),
            attn_output=t("attn_output.weight", (n_embd, n_q)), attn_output_b=vec("attn_output.bias", n_embd),
            attn_sinks=vec("attn_sinks.weight", hp.n_head),
            post_attention_norm=vec("post_attention_norm.weight", n_embd),
            ffn_gate_inp=t("ffn_gate_inp.weight", (E, n_embd)), ffn_gate_inp_b=vec("ffn_gate_inp.bias", E),
            ffn_gate_exps=t("ffn_gate_exps.weight", (E, F, n_embd)), ffn_gate_exps_b=vec("ffn_gate_exps.bias", E, F),
            ffn_up_exps=t("ffn_up_exps.weight", (E, F, n_embd)), ffn_up_exps_b=vec("ffn_up_exps.bias", E, F),
            ffn_down_exps=t("ffn_down_exps.weight", (E, n_embd, F)),
            ffn_down_exps_b=vec("ffn_down_exps.bias", E, n_embd)))
        if progress and not dequantize_weights:
            progress(i + 1, hp.n_layer + 1)
    output_norm, output, layers, tok = llama.finish_load(f, hp, emb, layers, tokenizer, dequantize_weights, progress)
    return GptOssModel(hp, op, emb, output_norm, output, layers, tok, f.metadata, str(path))


def moe(h, w: Layer, op: GptOssParams, cap, il: int):
    """llama.cpp's build_moe_ffn for gpt-oss (LLM_FFN_SWIGLU_OAI_MOE, gating SOFTMAX_WEIGHT): h (T, n_embd)
    -> (T, n_embd), the chosen experts' outputs weighted by the softmax of their router logits and summed."""
    T, n_used = h.shape[0], op.n_expert_used
    logits = add(mul_mat(w.ffn_gate_inp, h), w.ffn_gate_inp_b)             # (T, n_expert)
    cap(f"ffn_moe_logits_biased-{il}", logits)
    sel = argsort_top_k(logits, n_used)                                     # (T, n_used) i32
    cap(f"ffn_moe_topk-{il}", sel)
    weights = get_rows(logits.reshape(T, op.n_expert, 1), sel)              # (T, n_used, 1)
    weights = soft_max_ext(weights.reshape(T, n_used)).reshape(T, n_used, 1)
    cap(f"ffn_moe_weights_softmax-{il}", weights)
    if op.expert_weights_scale not in (0.0, 1.0):
        weights = scale(weights, op.expert_weights_scale)
    h3 = h.reshape(T, 1, h.shape[1])
    up = add_id(mul_mat_id(w.ffn_up_exps, h3, sel), w.ffn_up_exps_b, sel)           # (T, n_used, n_ff_exp)
    cap(f"ffn_moe_up_biased-{il}", up)
    gate = add_id(mul_mat_id(w.ffn_gate_exps, h3, sel), w.ffn_gate_exps_b, sel)
    cap(f"ffn_moe_gate_biased-{il}", gate)
    act = swiglu_oai(gate, up, SWIGLU_ALPHA, SWIGLU_LIMIT)
    cap(f"ffn_moe_swiglu_oai-{il}", act)
    y = add_id(mul_mat_id(w.ffn_down_exps, act, sel), w.ffn_down_exps_b, sel)       # (T, n_used, n_embd)
    cap(f"ffn_moe_down_biased-{il}", y)
    y = mul(y, weights)
    out = y[:, 0, :]
    for e in range(1, n_used):                      # llama.cpp: one add per further expert, in order
        out = add(out, y[:, e, :])
    return out


def layer(x, w: Layer, model: GptOssModel, cache: KVCache, il: int, pos: int, mask, cap, positions) -> np.ndarray:
    """x (n_tokens, n_embd) -> (n_tokens, n_embd), as one iteration of llama_model_openai_moe's layer loop;
    this layer's K, V for pos.. go into the cache. mask: this layer's (sliding-window or global)."""
    hp, op = model.hparams, model.oss
    T, D = x.shape[0], hp.head_dim
    base = op.rope_base_swa if op.is_swa[il] else hp.rope_base
    cur = norm(x, w.attn_norm, hp.rms_eps)
    cap(f"attn_norm-{il}", cur)
    q = add(mul_mat(w.attn_q, cur), w.attn_q_b).reshape(T, hp.n_head, D)
    k = add(mul_mat(w.attn_k, cur), w.attn_k_b).reshape(T, hp.n_head_kv, D)
    v = add(mul_mat(w.attn_v, cur), w.attn_v_b).reshape(T, hp.n_head_kv, D)
    rope = lambda t: rope_ext(t, positions, None, n_dims=hp.n_rot, mode=hp.rope_mode,  # noqa: E731
                              freq_base=base, freq_scale=hp.rope_freq_scale, **hp.rope_args())
    q, k = rope(q), rope(k)
    cap(f"Qcur-{il}", q)
    cap(f"Kcur-{il}", k)
    cap(f"Vcur-{il}", v)
    kk, vv = cache.store(il, k, v, pos)
    attn = attention(q, kk, vv, mask, 1.0 / float(np.sqrt(np.float32(D))), cap, il, sinks=w.attn_sinks)
    attn = add(mul_mat(w.attn_output, attn), w.attn_output_b)
    cap(f"attn_out-{il}", attn)
    ffn_inp = add(attn, x)
    cap(f"ffn_inp-{il}", ffn_inp)
    cur = norm(ffn_inp, w.post_attention_norm, hp.rms_eps)
    cap(f"attn_post_norm-{il}", cur)
    cur = moe(cur, w, op, cap, il)
    cap(f"ffn_moe_out-{il}", cur)
    out = add(cur, ffn_inp)
    cap(f"l_out-{il}", out)
    return out


def forward(model: GptOssModel, tokens, cache: KVCache, *, capture=None, last_only: bool = False) -> np.ndarray:
    """Run `tokens` after the cache's n_past tokens; returns logits (n_tokens, n_vocab) f32 (only the last row
    with last_only=True) and advances the cache."""
    hp, op = model.hparams, model.oss
    tokens = llama.checked_tokens(hp, tokens, cache)
    pos, T = cache.n_past, tokens.size
    cap = capture_fn(capture)
    x = get_rows(model.token_embd, tokens)
    cap("inp_embd", x)
    n_kv = cache.span(pos + T)
    masks = {False: causal_mask(T, n_kv, pos)}
    if any(op.is_swa):
        masks[True] = swa_mask(T, n_kv, pos, op.n_swa)
    positions = constant(np.arange(pos, pos + T, dtype=np.int32))
    with forward_scope(T, "decoder"):
        for il, w in enumerate(model.layers):
            x = layer(x, w, model, cache, il, pos, masks[op.is_swa[il]], cap, positions)
    cache.n_past = pos + T
    if last_only:
        x = x[-1:]
    x = norm(x, model.output_norm, hp.rms_eps)
    cap("result_norm", x)
    logits = mul_mat(model.output, x)
    cap("result_output", logits)
    return to_host(logits)


def generate(model: GptOssModel, prompt, max_tokens: int = 64, sampler=None, *, cache: KVCache | None = None,
             stop: tuple[str, ...] = (), add_special: bool = True, on_token=None):
    """Stream text pieces of a continuation of `prompt` (refimpl.models.llama.generate's loop over this
    forward)."""
    return llama.decode_loop(forward, model, prompt, max_tokens, sampler, cache=cache, stop=stop,
                             add_special=add_special, on_token=on_token)
