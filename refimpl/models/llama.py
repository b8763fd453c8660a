"""Llama-family decoders as plain functions over refimpl's ops, reading real GGUF files.

    model = load("SmolLM2-135M-Instruct.Q4_1.gguf")       # weights stay quantized and memory-mapped
    cache = new_cache(model, n_ctx=512)
    logits = forward(model, tokens, cache)                 # (len(tokens), n_vocab) f32; appends to cache

Shapes are NumPy order with llama.cpp's dim names: activations (n_tokens, n_embd) are ggml
ne [n_embd, n_tokens]; a weight (n_out, n_in) is ne [n_in, n_out]. Intermediates carry llama.cpp's graph
names (`attn_norm-0`, `Qcur-0`, `kq-0`, `ffn_out-0`, `result_norm`, `result_output`) for `capture=`.

The graph follows llama.cpp's `llm_build_llama`: rms_norm·attn_norm -> Q, K, V -> rope_ext on Q, K ->
softmax(K Q^T / sqrt(head_dim) + causal mask) -> V -> attn_output -> residual -> rms_norm·ffn_norm ->
ffn_down(silu(ffn_gate x) * ffn_up x) -> residual; output_norm, then output (or token_embd when tied).

The model calls ops only and never knows where it runs: under `refimpl.backend("cuda")` (exact numerics) the
backend keeps the activations on its device between ops, uploads each weight and each read-only input (the
mask and positions, `constant`) once, and holds the KV cache a cache made under it allocates
(`refimpl.backends.state_copy`), written with set_rows as llama.cpp writes it.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import gguf as _gguf
from ..backends import forward_scope
from ..dispatch import kv_layout
from ..ops import (add, cast, concat, cont, get_rows, mul, mul_mat, permute, rms_norm, rope_ext,
                   soft_max_ext, swiglu)
from ..ops.matmul import VEC_DOT_TYPE, ggml_type
from ..ops.rope import ROPE_TYPE_NEOX, ROPE_TYPE_NORMAL
from ..qtensor import QTensor
from ..types import GGMLType, traits
from .common import (capture_fn, check_alloc, constant, getter, load_checked, state_copy, to_host,  # noqa: F401
                     write_rows)

A = Any  # np.ndarray or QTensor


# The architectures this graph computes exactly as llama.cpp does, with llama.cpp's rope type for each
# (llama_model_rope_type): the converter permutes llama/mistral Q/K rows so that adjacent pairs (NORMAL)
# reproduce HF's rotate-half; qwen2 keeps halves (NEOX) and adds Q/K/V biases. llama is compared with
# llama.cpp in the tests (SmolLM2 and tiny random models); mistral is llama's graph under another name;
# qwen2 runs but has no llama.cpp golden yet; qwen3 is llama's graph with Q/K norms (tiny random models
# compared with llama.cpp). gemma3 has its own graph (refimpl.models.gemma3); architectures with other norms
# or scalings (granite's multipliers, phi3's fused QKV, ...) are refused (docs/models.md lists them).
ROPE_MODE = {"llama": ROPE_TYPE_NORMAL, "mistral": ROPE_TYPE_NORMAL, "qwen2": ROPE_TYPE_NEOX, "qwen3": ROPE_TYPE_NEOX}
QK_NORM = frozenset({"qwen3"})     # llm_build_qwen3: Q and K RMS-normed per head (attn_q_norm, attn_k_norm) before rope


@dataclass(frozen=True)
class HParams:
    """Read from GGUF metadata (`{arch}.…` keys), never from one checkpoint's defaults."""
    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_rot: int
    rms_eps: float
    rope_base: float
    rope_freq_scale: float
    rope_mode: int
    n_ctx_orig: int = 0             # rope.scaling.original_context_length (YaRN's); 0: n_ctx_train
    rope_ext_factor: float = 0.0    # YaRN (rope_ext's ext_factor ...): yarn_params
    rope_attn_factor: float = 1.0
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0

    @classmethod
    def from_gguf(cls, kv: dict, n_vocab: int, where="GGUF", rope_modes: dict | None = None) -> "HParams":
        """Hyper-parameters from GGUF metadata; n_vocab is used when `{arch}.vocab_size` is absent.
        rope_modes: the architectures accepted, with llama.cpp's rope type of each (default ROPE_MODE;
        refimpl.models.gemma3 passes its own).

        Every value is checked (type, range, divisibility) and a bad one raises ValueError naming `where`
        (the file), the key, the value found and what was expected."""
        rope_modes = ROPE_MODE if rope_modes is None else rope_modes
        arch = kv.get("general.architecture")
        if arch is None:
            raise ValueError(f"{where}: GGUF metadata has no general.architecture; expected one of "
                             f"{sorted(rope_modes)}")
        if not isinstance(arch, str) or arch not in rope_modes:
            raise ValueError(f"{where}: architecture {arch!r} is not a llama-family model refimpl runs "
                             f"(known: {sorted(rope_modes)}; gemma3 and gpt-oss through refimpl.models.gemma3 "
                             f"and refimpl.models.gpt_oss)")

        g = getter(kv, f"{arch}.", where)

        def bad(key, v, expected):
            return ValueError(f"{where}: {arch}.{key} is {v!r} ({type(v).__name__}); expected {expected}")

        def count(key, *default, lo=1):
            v = g(key, *default)
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral) or v < lo:
                raise bad(key, v, f"an integer >= {lo}")
            return int(v)

        def real(key, *default, lo=None, above=None):
            v = g(key, *default)
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real) or not math.isfinite(v) \
                    or (lo is not None and v < lo) or (above is not None and v <= above):
                rng = f" >= {lo}" if lo is not None else f" > {above}" if above is not None else ""
                raise bad(key, v, f"a finite number{rng}")
            return float(v)

        n_embd, n_head = count("embedding_length"), count("attention.head_count")
        n_head_kv = count("attention.head_count_kv", n_head)
        if n_embd % n_head:
            raise ValueError(f"{where}: {arch}.attention.head_count {n_head} does not divide embedding_length {n_embd}")
        if n_head % n_head_kv:
            raise ValueError(f"{where}: {arch}.attention.head_count_kv {n_head_kv} does not divide head_count {n_head}")
        head_dim = count("attention.key_length", n_embd // n_head)
        v_dim = count("attention.value_length", head_dim)
        if v_dim != head_dim:
            raise ValueError(f"{where}: {arch}.attention.value_length {v_dim} differs from key_length {head_dim}; "
                             f"expected them equal (this graph uses one head size for K and V)")
        n_ff = g("feed_forward_length")
        if isinstance(n_ff, list):          # per-layer lengths: llama-family models here use one value
            if not n_ff or any(x != n_ff[0] for x in n_ff):
                raise bad("feed_forward_length", n_ff, "an integer, or a per-layer list of one repeated value")
            n_ff = n_ff[0]
        if isinstance(n_ff, (bool, np.bool_)) or not isinstance(n_ff, numbers.Integral) or n_ff < 1:
            raise bad("feed_forward_length", n_ff, "an integer >= 1")
        n_rot = count("rope.dimension_count", head_dim)
        if n_rot % 2 or n_rot > head_dim:
            raise ValueError(f"{where}: {arch}.rope.dimension_count is {n_rot}; expected an even number <= the "
                             f"head size {head_dim} (RoPE rotates pairs within a head)")
        scaling = g("rope.scaling.type", "linear")                     # llama.cpp's default
        if scaling not in ("none", "linear", "yarn"):
            raise ValueError(f"{where}: {arch}.rope.scaling.type {scaling!r} is not supported yet "
                             f"(only none/linear/yarn)")
        factor = real("rope.scaling.factor", 1.0, lo=0.0) or 1.0      # 0 means "not set", as in llama.cpp
        freq_scale = float(np.float32(1) / np.float32(factor)) if scaling != "none" else 1.0
        n_ctx_train = count("context_length", 0, lo=0)
        yarn = yarn_params(freq_scale, real("rope.scaling.attn_factor", 1.0, above=0.0)) if scaling == "yarn" else {}
        return cls(arch=arch, n_vocab=count("vocab_size", n_vocab), n_ctx_train=n_ctx_train,
                   n_embd=n_embd, n_layer=count("block_count"), n_head=n_head, n_head_kv=n_head_kv,
                   head_dim=head_dim, n_ff=int(n_ff), n_rot=n_rot,
                   rms_eps=real("attention.layer_norm_rms_epsilon", lo=0.0),
                   rope_base=real("rope.freq_base", 10000.0, above=0.0),
                   rope_freq_scale=freq_scale, rope_mode=rope_modes[arch],
                   n_ctx_orig=count("rope.scaling.original_context_length", n_ctx_train, lo=0), **yarn)

    def rope_args(self) -> dict:
        """rope_ext's context arguments besides the base and scale: n_ctx_orig and YaRN's four."""
        return dict(n_ctx_orig=self.n_ctx_orig or self.n_ctx_train, ext_factor=self.rope_ext_factor,
                    attn_factor=self.rope_attn_factor, beta_fast=self.rope_beta_fast, beta_slow=self.rope_beta_slow)


def yarn_params(freq_scale: float, attn_factor: float = 1.0) -> dict:
    """llama.cpp's YaRN context parameters (llama_context's constructor) for `rope.scaling.type = "yarn"`:
    ext_factor 1; attn_factor = mscale(factor) * 1/(1 + 0.1 ln factor) * rope.scaling.attn_factor in f32 steps
    (ggml's rope applies the mscale itself, which the second factor cancels), mscale(s) = 0.1 ln s + 1 for
    s > 1; beta_fast 32, beta_slow 1 (llama_hparams' defaults)."""
    f32 = np.float32
    factor = f32(1) / f32(freq_scale)
    lnf = f32(math.log(factor))
    a = f32(1) if factor <= 1 else f32(f32(0.1) * f32(1) * lnf) + f32(1)
    a = f32(a * (f32(1) / (f32(1) + f32(f32(0.1) * lnf))))
    return dict(rope_ext_factor=1.0, rope_attn_factor=float(f32(a * f32(attn_factor))), rope_beta_fast=32.0,
                rope_beta_slow=1.0)


@dataclass(frozen=True)
class Layer:
    """Field x <- GGUF tensor `blk.{i}.x.weight` (NumPy order); biases (qwen2-style) when present."""
    attn_norm: A
    attn_q: A
    attn_k: A
    attn_v: A
    attn_output: A
    ffn_norm: A
    ffn_gate: A
    ffn_up: A
    ffn_down: A
    bq: A = None
    bk: A = None
    bv: A = None
    attn_q_norm: A = None        # qwen3: per-head RMS norm gains (head_dim,)
    attn_k_norm: A = None


@dataclass
class LlamaModel:
    hparams: HParams
    token_embd: A
    output_norm: A
    output: A                    # token_embd itself when the output is tied
    layers: list[Layer]
    tokenizer: Any = None
    metadata: dict = field(default_factory=dict, repr=False)
    path: str = ""


def _shapes(shape) -> str:
    """A NumPy shape in both orders: 'ne [n_embd, n_vocab] (numpy (n_vocab, n_embd))'."""
    return f"ne {list(shape)[::-1]} (numpy {tuple(shape)})"


_MATRIX_TYPES = "F32, F16, BF16 or a block type with a CPU vec_dot (mul_mat's src0)"


def _tensor(f, name: str, shape: tuple, path, kind: str = "matrix", required: bool = True) -> A:
    """The tensor `name` of GGUFFile f, checked: present (unless not required), of NumPy shape `shape`, and of
    a type the graph can use it as: a "matrix" (mul_mat / get_rows src0) or a "vector" (norm gain or bias,
    the f32 src1 of mul / add). Raises ValueError naming the file, the tensor and both shape orders."""
    t = f.tensors.get(name)
    if t is None:
        if not required:
            return None
        raise ValueError(f"{path}: tensor {name!r} is missing; expected {_shapes(shape)}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{path}: tensor {name!r} has {_shapes(t.shape)}, expected {_shapes(shape)}")
    tt = ggml_type(t)
    if kind == "matrix" and tt not in VEC_DOT_TYPE:
        raise ValueError(f"{path}: tensor {name!r} has type {traits(tt).name}; expected {_MATRIX_TYPES}")
    if kind == "vector" and tt != GGMLType.F32:
        raise ValueError(f"{path}: tensor {name!r} has type {traits(tt).name}; expected f32 (a norm weight or "
                         f"bias is the f32 src1 of mul / add)")
    return t


def load(path, *, tokenizer: bool = True, dequantize_weights: bool = False, progress=None) -> LlamaModel:
    """Load a llama-family GGUF: hyper-parameters from metadata, weights as memory-mapped views
    (ndarrays / QTensors, never dequantized here).

    Everything is checked before a model is returned: the hyper-parameters (`HParams.from_gguf`), the
    vocabulary size (`{arch}.vocab_size`, the number of `tokenizer.ggml.tokens` and token_embd's rows must
    agree, as llama.cpp sizes token_embd from the vocabulary), and every tensor's presence, shape and type;
    a failure is a ValueError naming the file, the key or tensor, and shapes in ggml and NumPy order.

    dequantize_weights=True trades memory for speed: every matrix is dequantized once to f32 at load
    (SmolLM2-135M: about 0.6 GB) instead of TILE_ROWS rows at a time in every mul_mat. Results are
    identical (dequantization is exact either way). progress(i, n) is called as layers are prepared.
    Every refusal is a refimpl.LoadError (GGUFError for the file itself)."""
    return load_checked(path, _load, tokenizer, dequantize_weights, progress)


def hparams_and_embedding(f, kv: dict, **from_gguf) -> tuple[HParams, A]:
    """A llama-family GGUF's hyper-parameters (HParams.from_gguf with `from_gguf`) and token embedding, once it is
    checked: present, 2-D, one row per token of `{arch}.vocab_size` and of tokenizer.ggml.tokens (a ValueError
    naming the file and both shape orders otherwise). Every llama-family loader starts here."""
    path = f.path
    emb = f.tensors.get("token_embd.weight")
    if emb is None:
        raise ValueError(f"{path}: tensor 'token_embd.weight' is missing; expected ne [n_embd, n_vocab] "
                         f"(numpy (n_vocab, n_embd))")
    if len(emb.shape) != 2:
        raise ValueError(f"{path}: tensor 'token_embd.weight' has {_shapes(emb.shape)}; expected 2 dims, "
                         f"ne [n_embd, n_vocab] (numpy (n_vocab, n_embd))")
    tokens = kv.get("tokenizer.ggml.tokens")
    hp = HParams.from_gguf(kv, emb.shape[0], where=path, **from_gguf)
    vocab = {f"{hp.arch}.vocab_size": hp.n_vocab}
    if isinstance(tokens, list):
        vocab["tokenizer.ggml.tokens"] = len(tokens)
    for src, n in vocab.items():
        if emb.shape[0] != n:
            raise ValueError(f"{path}: tensor 'token_embd.weight' has {_shapes(emb.shape)}: {emb.shape[0]} rows, "
                             f"but {src} gives a vocabulary of {n} tokens; expected {_shapes((n, hp.n_embd))}")
    _tensor(f, "token_embd.weight", (hp.n_vocab, hp.n_embd), path)
    return hp, emb


def _load(f, tokenizer: bool, dequantize_weights: bool, progress) -> LlamaModel:
    path, kv = f.path, f.metadata
    hp, emb = hparams_and_embedding(f, kv)
    n_q, n_kv = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
    layers = []
    for i in range(hp.n_layer):
        p = f"blk.{i}."
        t = lambda n, s, kind="matrix": _tensor(f, p + n, s, path, kind)   # noqa: E731
        biases = {x: p + f"attn_{x}.bias" for x in "qkv"}
        have = [name for name in biases.values() if name in f.tensors]
        if have and len(have) != 3:
            missing = [name for name in biases.values() if name not in f.tensors]
            raise ValueError(f"{path}: tensor {have[0]!r} is present but {missing[0]!r} is missing; expected the "
                             f"Q, K and V biases together or none")
        layers.append(Layer(
            attn_norm=t("attn_norm.weight", (hp.n_embd,), "vector"), attn_q=t("attn_q.weight", (n_q, hp.n_embd)),
            attn_k=t("attn_k.weight", (n_kv, hp.n_embd)), attn_v=t("attn_v.weight", (n_kv, hp.n_embd)),
            attn_output=t("attn_output.weight", (hp.n_embd, n_q)),
            ffn_norm=t("ffn_norm.weight", (hp.n_embd,), "vector"),
            ffn_gate=t("ffn_gate.weight", (hp.n_ff, hp.n_embd)), ffn_up=t("ffn_up.weight", (hp.n_ff, hp.n_embd)),
            ffn_down=t("ffn_down.weight", (hp.n_embd, hp.n_ff)),
            bq=t("attn_q.bias", (n_q,), "vector") if have else None,
            bk=t("attn_k.bias", (n_kv,), "vector") if have else None,
            bv=t("attn_v.bias", (n_kv,), "vector") if have else None,
            attn_q_norm=t("attn_q_norm.weight", (hp.head_dim,), "vector") if hp.arch in QK_NORM else None,
            attn_k_norm=t("attn_k_norm.weight", (hp.head_dim,), "vector") if hp.arch in QK_NORM else None))
    output_norm, output, layers, tok = finish_load(f, hp, emb, layers, tokenizer, dequantize_weights, progress)
    return LlamaModel(hp, emb, output_norm, output, layers, tok, kv, str(path))


def finish_load(f, hp: HParams, emb, layers: list, tokenizer: bool, dequantize_weights: bool, progress):
    """What every decoder's load ends with (llama's, refimpl.models.gemma3's): the output norm and the output
    weight checked (token_embd when it is tied), the layers' weights dequantized once if asked (their
    dataclass rebuilt field by field), progress reported, and the GGUF's tokenizer built.
    Returns (output_norm, output, layers, tokenizer or None)."""
    path = f.path
    _tensor(f, "output.weight", (hp.n_vocab, hp.n_embd), path, required=False)
    output_norm = _tensor(f, "output_norm.weight", (hp.n_embd,), path, "vector")
    output = f.tensors.get("output.weight", emb)
    if dequantize_weights:
        from ..qtensor import dequantize
        dq = lambda t: dequantize(t) if isinstance(t, QTensor) else t   # noqa: E731
        done = []
        for i, w in enumerate(layers):
            done.append(type(w)(**{k: dq(v) for k, v in vars(w).items()}))
            if progress:
                progress(i + 1, len(layers) + 1)
        layers = done
        output = dq(output)
    if progress:
        progress(1, 1)
    tok = None
    if tokenizer and "tokenizer.ggml.model" in f.metadata:
        from ..tokenizers import from_gguf
        _gguf.check_tokenizer_metadata(f.metadata, path)
        tok = from_gguf(f)
    return output_norm, output, layers, tok


class KVCache:
    """Preallocated K and V per layer: k[il] (n_ctx, n_head_kv, head_dim), filled in place.

    `n_past` tokens are stored. `copy()` forks a conversation (the buffers are copied once).
    Its layout is the numerics profile's when it is made (refimpl.dispatch.kv_layout): float32 rows over the
    filled cells (exact, fast), or llama.cpp's: float16 cells (its default cache type; `dtype` overrides it)
    and an attention span padded to a multiple of `pad` = 256 cells (the ggml profiles). The buffers live where the
    backend active when the cache is made keeps state (refimpl.backends.state_copy), as llama.cpp allocates
    its cache in a backend buffer; the rows are written with set_rows, as llama.cpp 0.25.3 writes them.
    """

    def __init__(self, n_layer, n_ctx, n_head_kv, head_dim, dtype=None):
        layout_dtype, self.pad = kv_layout()
        dtype = layout_dtype if dtype is None else dtype
        self.k = state_copy(np.zeros((n_layer, n_ctx, n_head_kv, head_dim), dtype))
        self.v = state_copy(np.zeros((n_layer, n_ctx, n_head_kv, head_dim), dtype))
        self.n_past = 0
        self.n_ctx = n_ctx

    def span(self, n_used: int) -> int:
        """The number of cells the attention spans after n_used positions are filled (the mask's width):
        n_used, or llama.cpp's padded count, a multiple of `pad`."""
        return -(-n_used // self.pad) * self.pad

    def store(self, il: int, k, v, pos: int):
        """Write this layer's K, V (T, n_head_kv, head_dim) for positions pos..pos+T-1; return what the
        attention reads: K, V of positions 0..pos+T-1 as f32, or (a padded layout) llama.cpp's view, the
        first span(pos+T) cells as stored (`cells`)."""
        T = k.shape[0]
        if pos + T > self.n_ctx:
            raise ValueError(f"KV cache full: {pos} + {T} tokens > n_ctx {self.n_ctx}")
        write_rows(self.k[il], k, pos)
        write_rows(self.v[il], v, pos)
        if self.pad > 1:
            return self.cells(il, self.span(pos + T))
        kk, vv = self.k[il, :pos + T], self.v[il, :pos + T]
        if kk.dtype != np.float32:
            kk, vv = cast(kk, GGMLType.F32), cast(vv, GGMLType.F32)
        return kk, vv

    def cells(self, il: int, n_kv: int):
        """K, V of this layer's first n_kv cells (n_kv, n_head_kv, head_dim) in the cache's own dtype, as
        llama.cpp's graph views them; cells past n_ctx read as zeros (llama.cpp's cache is a multiple of
        `pad` cells, and a masked cell contributes exact zeros wherever it holds a finite value)."""
        k, v = self.k[il, :n_kv], self.v[il, :n_kv]
        if n_kv > self.n_ctx:
            zeros = np.zeros((n_kv - self.n_ctx,) + tuple(k.shape[1:]), k.dtype)
            k, v = concat(k, zeros, 2), concat(v, zeros, 2)
        return k, v

    def copy(self) -> "KVCache":
        c = KVCache.__new__(KVCache)
        c.k, c.v = state_copy(self.k), state_copy(self.v)
        c.n_past, c.n_ctx, c.pad = self.n_past, self.n_ctx, self.pad
        return c


def new_cache(model: LlamaModel, n_ctx: int | None = None, dtype=None) -> KVCache:
    """An empty KVCache for n_ctx positions (default: the training context, at most 2048), laid out as the active
    numerics profile says (KVCache); dtype overrides the cells' type."""
    hp = model.hparams
    n_ctx = min(hp.n_ctx_train or 2048, 2048) if n_ctx is None else n_ctx
    dtype = kv_layout()[0] if dtype is None else dtype
    if int(n_ctx) != n_ctx or n_ctx < 1:
        raise ValueError(f"new_cache: n_ctx must be a positive integer, got {n_ctx!r}")
    check_alloc(2 * hp.n_layer * int(n_ctx) * hp.n_head_kv * hp.head_dim * np.dtype(dtype).itemsize,
                f"a KV cache of {n_ctx} positions ({hp.n_layer} layers, {hp.n_head_kv} KV heads of {hp.head_dim})")
    return KVCache(hp.n_layer, int(n_ctx), hp.n_head_kv, hp.head_dim, dtype)


def causal_mask(n_tokens: int, n_kv: int, pos: int) -> np.ndarray:
    """(n_tokens, n_kv) f32: 0 where token t (at position pos+t) may attend to kv position j <= pos+t, else -inf."""
    j = np.arange(n_kv)[None, :]
    t = pos + np.arange(n_tokens)[:, None]
    return constant(np.where(j <= t, np.float32(0), np.float32(-np.inf)).astype(np.float32))


# -- attention as llama.cpp's CPU build computes it (numerics="ggml") -----------------------------------------
#
# Without flash attention llama.cpp multiplies the cache itself: kq = mul_mat(K, Q) with K the f16 (or f32)
# cache view ne [head_dim, n_kv, n_head_kv], kqv = mul_mat(V^T, kq) with V stored transposed, so ggml-cpu
# rounds Q and the softmax output to the cache type before the dot products. Two more facts of that build
# (llama-cpp-python 0.3.36, measured against its graph with a cb_eval callback, refimpl.compare):
#
#   n_kv    the graph spans a multiple of 256 cells (KVCache.pad), the unused ones masked with -inf. They add exact
#           zeros, but they change how soft_max_ext's row splits into 8-lane chunks and its tail, and
#           kqv's dot length, hence the roundings.
#   sgemm   llama.cpp compiles llamafile's sgemm: F32/F16 products with >= 2 tokens take tinyBLAS's order.
#           That is the "llamafile" part of the numerics="ggml" profile (refimpl.kernels.ggml.llamafile),
#           chosen by the dispatch: the model just calls mul_mat.

def attention(q, k, v, mask, scale, cap, il, sinks=None) -> np.ndarray:
    """q (T, n_head, head_dim), k, v (n_kv, n_head_kv, head_dim) -> (T, n_head*head_dim); sinks (n_head,)
    f32 or None: per-head attention sinks (gpt-oss), one more logit in each softmax row's denominator.

    As llama.cpp without flash attention: kq = mul_mat(K, Q) per head (GQA: head h reads kv head
    h // (n_head/n_head_kv), mul_mat's block broadcast), softmax with scale and mask, then mul_mat(V^T, kq).
    k and v may be the cache's f16 cells (numerics="ggml": ggml-cpu then rounds Q and the softmax output
    to f16 before the dot products, and products with >= 2 tokens follow llamafile's sgemm, see above).
    """
    T, H, D = q.shape
    qh = permute(q, 0, 2, 1, 3)                                # (H, T, D)    ne [D, T, H]   views, as
    kh = permute(k, 0, 2, 1, 3)                                # (Hkv, n_kv, D)              llama.cpp's
    kq = cap(f"kq-{il}", mul_mat(kh, qh))                      # (H, T, n_kv) ne [n_kv, T, H]
    kq = cap(f"kq_soft_max-{il}", soft_max_ext(kq, mask, scale, 0.0, sinks))
    vt = cont(permute(v, 1, 2, 0, 3))                          # (Hkv, D, n_kv)
    kqv = cap(f"kqv-{il}", mul_mat(vt, kq))                    # (H, T, D)
    return cap(f"kqv_out-{il}", cont(permute(kqv, 0, 2, 1, 3)).reshape(T, H * D))


def layer(x, w: Layer, hp: HParams, cache: KVCache, il: int, pos: int, mask, cap, positions=None) -> np.ndarray:
    """x (n_tokens, n_embd) -> (n_tokens, n_embd); this layer's K, V for pos.. go into the cache.
    positions: pos .. pos+T-1 as int32 (forward passes them, on the device under the CUDA backend)."""
    T, D = x.shape[0], hp.head_dim
    cur = cap(f"attn_norm-{il}", mul(rms_norm(x, hp.rms_eps), w.attn_norm))
    q, k, v = mul_mat(w.attn_q, cur), mul_mat(w.attn_k, cur), mul_mat(w.attn_v, cur)
    if w.bq is not None:
        q, k, v = add(q, w.bq), add(k, w.bk), add(v, w.bv)
    if positions is None:
        positions = np.arange(pos, pos + T, dtype=np.int32)
    rope = lambda t: rope_ext(t, positions, None, n_dims=hp.n_rot, mode=hp.rope_mode,  # noqa: E731
                              freq_base=hp.rope_base, freq_scale=hp.rope_freq_scale, **hp.rope_args())
    q, k, v = q.reshape(T, hp.n_head, D), k.reshape(T, hp.n_head_kv, D), v.reshape(T, hp.n_head_kv, D)
    if w.attn_q_norm is not None:                    # qwen3: per-head RMS norms before rope
        q = cap(f"Qcur_normed-{il}", mul(rms_norm(q, hp.rms_eps), w.attn_q_norm))
        k = cap(f"Kcur_normed-{il}", mul(rms_norm(k, hp.rms_eps), w.attn_k_norm))
    q, k, v = cap(f"Qcur-{il}", rope(q)), cap(f"Kcur-{il}", rope(k)), cap(f"Vcur-{il}", v)
    kk, vv = cache.store(il, k, v, pos)
    attn = mul_mat(w.attn_output, attention(q, kk, vv, mask, 1.0 / float(np.sqrt(D)), cap, il))
    ffn_inp = cap(f"ffn_inp-{il}", add(cap(f"attn_out-{il}", attn), x))
    cur = cap(f"ffn_norm-{il}", mul(rms_norm(ffn_inp, hp.rms_eps), w.ffn_norm))
    cur = cap(f"ffn_out-{il}", mul_mat(w.ffn_down, swiglu(mul_mat(w.ffn_gate, cur), mul_mat(w.ffn_up, cur))))
    return cap(f"l_out-{il}", add(cur, ffn_inp))


def checked_tokens(hp: HParams, tokens, cache: KVCache) -> np.ndarray:
    """tokens as int32 (n,), checked before anything is sized from them: at least one, every id in the
    vocabulary, room for all of them in the cache (every decoder's forward starts here)."""
    tokens = np.asarray(tokens, dtype=np.int32).reshape(-1)
    if tokens.size == 0:
        raise ValueError("forward: no tokens")
    if tokens.min() < 0 or tokens.max() >= hp.n_vocab:
        raise ValueError(f"forward: token id out of range [0, {hp.n_vocab})")
    if cache.n_past + tokens.size > cache.n_ctx:
        raise ValueError(f"KV cache full: {cache.n_past} + {tokens.size} tokens > n_ctx {cache.n_ctx}")
    return tokens


def forward(model: LlamaModel, tokens, cache: KVCache, *, capture=None, last_only: bool = False) -> np.ndarray:
    """Run `tokens` (any number) after the cache's n_past tokens; returns logits (n_tokens, n_vocab) f32
    (only the last row with last_only=True) and advances the cache. Under the CUDA backend the logits are
    the only activations copied back to the host."""
    hp = model.hparams
    tokens = checked_tokens(hp, tokens, cache)
    pos, T = cache.n_past, tokens.size
    cap = capture_fn(capture)
    x = cap("inp_embd", get_rows(model.token_embd, tokens))
    mask = causal_mask(T, cache.span(pos + T), pos)
    positions = constant(np.arange(pos, pos + T, dtype=np.int32))
    with forward_scope(T, "decoder"):
        for il, w in enumerate(model.layers):
            x = layer(x, w, hp, cache, il, pos, mask, cap, positions)
    cache.n_past = pos + T
    if last_only:
        x = x[-1:]
    x = cap("result_norm", mul(rms_norm(x, hp.rms_eps), model.output_norm))
    return to_host(cap("result_output", mul_mat(model.output, x)))


def format_chat(model: LlamaModel, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """The conversation as text, through the GGUF's own chat template (sandboxed Jinja)."""
    from ..chat import render
    tmpl = model.metadata.get("tokenizer.chat_template")
    if not tmpl:
        raise ValueError(f"{model.path}: no tokenizer.chat_template in the GGUF metadata")
    tok = model.tokenizer
    piece = lambda i: tok.token_to_piece(i).decode("utf-8", "replace") if i is not None and i >= 0 else ""  # noqa: E731
    return render(tmpl, messages, add_generation_prompt=add_generation_prompt,
                  bos_token=piece(getattr(tok, "bos_id", None)), eos_token=piece(getattr(tok, "eos_id", None)))


def generate(model: LlamaModel, prompt, max_tokens: int = 64, sampler=None, *, cache: KVCache | None = None,
             stop: tuple[str, ...] = (), add_special: bool = True, on_token=None):
    """Stream text pieces of a continuation of `prompt` (text, or a list of token ids).

    Stops at EOS/EOT, after max_tokens, or when the text so far ends with one of `stop` (the stop string
    itself is not yielded). `cache` (e.g. a forked conversation) is continued if given.
    """
    return decode_loop(forward, model, prompt, max_tokens, sampler, cache=cache, stop=stop, add_special=add_special,
                       on_token=on_token, kq_scale=1.0 / math.sqrt(model.hparams.head_dim))


def decode_loop(forward_fn, model, prompt, max_tokens: int = 64, sampler=None, *, cache: KVCache | None = None,
                stop: tuple[str, ...] = (), add_special: bool = True, on_token=None, kq_scale: float = 1.0):
    """`generate` for any decoder whose `forward_fn(model, tokens, cache, last_only=..., capture=...)` appends to
    a KVCache (llama's here, refimpl.models.gemma3's). A sampler with `needs_attention` (the entropix sampler)
    also gets the last layer's attention logits at the new position: its captured `kq-{n_layer-1}` times
    kq_scale (the soft_max scale of that graph), over the cells in use."""
    from ..sampling import Sampler
    sampler = sampler or Sampler()
    needs = bool(getattr(sampler, "needs_attention", False))
    box: list = [None]
    want = f"kq-{model.hparams.n_layer - 1}"

    def grab(name, x):
        if name == want:
            box[0] = x

    def step(tokens, **kw):
        out = forward_fn(model, tokens, cache, capture=grab if needs else None, **kw)[-1]
        if not needs:
            return out, {}
        kq = np.asarray(box[0])                       # (n_head, n_tokens, n_kv)
        return out, {"scores": kq[:, -1, :cache.n_past].astype(np.float64) * kq_scale}
    tok = model.tokenizer
    ids = tok.encode(prompt, add_special=add_special) if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise ValueError("generate: empty prompt")
    if cache is None:
        cache = new_cache(model, min(model.hparams.n_ctx_train or 2048, len(ids) + max_tokens + 1))
    # stop on every end-of-generation token the vocabulary defines (llama.cpp's EOG set), else EOS/EOT
    end = {int(i) for i in (getattr(tok, "eog_ids", None) or ()) if i is not None and i >= 0}
    end |= {i for i in (getattr(tok, "eos_id", None), getattr(tok, "eot_id", None)) if i is not None and i >= 0}
    history = list(ids)
    logits, extra = step(ids, last_only=True)
    stream = tok.stream()
    text, held = "", ""
    for _ in range(max_tokens):
        t = sampler.sample(logits, history, **extra)
        if on_token:
            on_token(t)
        if t in end:
            break
        history.append(t)
        piece = stream.push(t)
        if stop:
            held += piece
            text += piece
            hit = next((s for s in stop if s in text), None)
            if hit:
                cut = text.index(hit)
                emit = held[: max(0, len(held) - (len(text) - cut))]
                if emit:
                    yield emit
                return
            # hold back a tail that could still become a stop string
            keep = max((len(s) - 1 for s in stop), default=0)
            if len(held) > keep:
                yield held[: len(held) - keep]
                held = held[len(held) - keep:]
        elif piece:
            yield piece
        if cache.n_past >= cache.n_ctx:
            break
        logits, extra = step([t])
    tail = stream.flush() if hasattr(stream, "flush") else ""     # an incomplete UTF-8 end: U+FFFD
    if held or tail:
        yield held + tail
