"""BERT sentence encoders as plain functions over refimpl's ops: llama.cpp's `bert` graph, pooling and normalization.

    model = load("all-MiniLM-L6-v2/")          # a Hugging Face / sentence-transformers directory, or
    model = load("minilm-q8_0.gguf")            # a GGUF of llama.cpp's `bert` architecture (memory-mapped)
    emb = embed(model, ["A man is eating food.", "A man is riding a horse."])   # (2, n_embd) f32, unit rows
    hidden = forward(model, [[101, 7592, 102], [101, 102]])                     # per-token states, one array each

Shapes are NumPy order with llama.cpp's dim names: hidden states (n_tokens, n_embd) are ggml ne [n_embd, n_tokens];
a weight (n_out, n_in) is ne [n_in, n_out]. A batch of texts is padded to one length: activations
(n_seq, n_tokens, n_embd) are ne [n_embd, n_tokens, n_seq], and every padded key is masked out of attention, so
each text's result is computed from its own tokens only (see `forward`).

The graph is llama.cpp's (src/models/bert.cpp, llm_graph_context::build_attn / build_ffn / build_pooling):

    inp_embd     = (token_embd[id] + token_types[type]) + position_embd[pos]           (types: 0 unless given)
    inp_norm     = norm(inp_embd)*w + b                                             token_embd_norm
    per layer    q, k, v = W x + b;  kq = K Q^T (kq);  softmax(kq / sqrt(head_dim) + mask) (kq_soft_max);
                 kqv = V^T softmax;  attn = W_o kqv + b_o (kqv_out);  ffn_inp = norm(attn + x)*w + b
                 ffn_out = W_down act(W_up ffn_inp + b_up) + b_down;  l_out = norm(ffn_out + ffn_inp)*w + b
    result_embd  = the last l_out;  result_embd_pooled = pooled (none / mean / cls / last)

The activation is llama.cpp's ggml_gelu (the tanh approximation, which ggml-cpu evaluates through an f16 table)
for both sources, although Hugging Face's "gelu" (BERT, MiniLM) is the exact erf GELU: measured on
all-MiniLM-L6-v2 (36 varied sentences, refimpl.fetch.golden("bert_minilm"), mean pooling, F32 weights), the smallest
cosine per sentence is

    act        vs sentence-transformers    vs llama.cpp on the converted F32 GGUF (flash attention off / on)
    gelu       0.99999787                  0.99999991 / 0.99999966
    gelu_erf   1.00000000                  0.99999783 / 0.99999802

Both meet 0.99999 against both references, so one graph serves both routes and a directory gives exactly the
floats of its converted F32 GGUF. `load(..., act="gelu_erf")` runs the erf GELU instead (Hugging Face's own
numbers, to 1e-8). config.json's hidden_act must be a GELU ("gelu", "gelu_new", "gelu_pytorch_tanh",
"gelu_fast"): llama.cpp's graph has no other activation for BERT. The converted GGUFs of other types, same measure:

    type    vs sentence-transformers    vs llama.cpp on the same GGUF
    f16     0.99999763                  0.99999956
    bf16    0.99997129                  0.99998504
    q8_0    0.99946010                  0.99875243   (ggml-cpu rounds the activations to q8_0 before each q8_0
                                                      mul_mat; with that rounding emulated: 0.99979723)

`capture=` receives llama.cpp's cb() names from its bert graph: inp_embd, inp_norm-0, Qcur-N, Kcur-N, Vcur-N,
kq-N, kq_soft_max-N, kqv-N, kqv_out-N (twice, as in llama.cpp: the heads concatenated before the output
projection, then after it and its bias; a dict keeps the second), ffn_inp-N, ffn_up-N, ffn_up_b-N, ffn_gelu-N
(ffn_gelu_erf-N for the erf GELU), ffn_down-N, ffn_out-N, result_embd and, from `embed`, result_embd_pooled.
llama.cpp names no tensor for a layer's output; refimpl calls it l_out-N as llama.cpp's other graphs do.
Captured activations are the padded batch: (n_seq, n_tokens, ...) as ggml's ne [..., n_tokens, n_seq].

Without a capture the sublayers are refimpl.ops.fused's ops (a capture runs them op by op, so every named
tensor exists): the tail of each sublayer -- the projection's bias, the residual, norm, * w, + b -- is
`add_norm_affine`, the FFN's up projection, bias and GELU `mul_mat_add_gelu`, each projection with its bias
`mul_mat_add`, and the
attention `attn_qkv` (Q, K, V from one stacked weight, derived at load) or `attn_mha`. Their references are the
op sequences; the numba backend registers one-pass kernels with the ops' bits (and, in numerics="fast", one
attention kernel: f32 sums in index order, an order fast mode allows mul_mat). The forward pass runs in the
backend's `forward_scope` (the numba backend reads its thread count once for the pass there).

Under `refimpl.backend("cuda")` the activations stay on the device between ops (as in refimpl.models.llama:
weights uploaded once, the head permutations run as CUDA kernels, the mask uploaded once per batch); `forward`
returns NumPy states and `embed` pools on the device and copies each pooled vector back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .. import gguf as _gguf
from ..backends import forward_scope
from ..dispatch import tapping
from ..errors import BertError, LoadError, TokenizerError
from ..ops import add, cont, gelu, gelu_erf, get_rows, mul_mat, transpose
from ..ops.fused import add_norm_affine, attn_mha, attn_qkv, mul_mat_add, mul_mat_add_gelu, stack_qkv
from .common import capture_fn, constant, getter, layer_norm, recorded_as, to_host

A = Any  # np.ndarray or QTensor

POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last"}     # llama_pooling_type (4, rank, needs a head)
POOLINGS = ("none", "mean", "cls", "last")
ACTS = {"gelu": gelu, "gelu_erf": gelu_erf}
# config.json hidden_act -> refimpl op that computes it
# config.json hidden_act values that llama.cpp's graph (ggml_gelu) stands for
HF_ACTS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast")


# sane bounds for what a file says, checked before anything is sized from them
MAX_LAYERS = 1024
MAX_DIM = 1 << 17
MAX_VOCAB = 1 << 24
MAX_CTX = 1 << 24


def _count(v, what: str, lo: int = 1, hi: int = MAX_DIM) -> int:
    """An integer hyper-parameter (a JSON/GGUF number that is integral, not a bool) within [lo, hi]."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise BertError(f"{what} is {v!r} ({type(v).__name__}); expected an integer in [{lo}, {hi}]")
    if isinstance(v, (float, np.floating)) and not float(v).is_integer():
        raise BertError(f"{what} is {v!r}; expected an integer in [{lo}, {hi}]")
    n = int(v)
    if not lo <= n <= hi:
        raise BertError(f"{what} is {n}; expected an integer in [{lo}, {hi}]")
    return n


def _eps(v, what: str) -> float:
    """A normalization epsilon: a finite number in (0, 1) (as the f32 ggml_norm receives it)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise BertError(f"{what} is {v!r} ({type(v).__name__}); expected a number in (0, 1)")
    e = float(np.float32(v))
    if not (0.0 < e < 1.0):
        raise BertError(f"{what} is {v!r}; expected a finite number in (0, 1)")
    return e


@dataclass(frozen=True)
class HParams:
    """BERT hyper-parameters: from GGUF metadata (`bert.…` keys) or a Hugging Face config.json."""
    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    head_dim: int
    n_ff: int
    norm_eps: float           # layer_norm_eps, as the f32 ggml_norm receives
    n_token_types: int
    pooling: str | None       # the model's own pooling, None when the source does not say
    act: str                  # "gelu" (ggml_gelu) or "gelu_erf"

    @classmethod
    def from_gguf(cls, kv: dict, n_vocab: int, n_token_types: int | None = None, where="GGUF") -> "HParams":
        arch = kv.get("general.architecture")
        if arch != "bert":
            raise BertError(f"{where}: general.architecture {arch!r}; refimpl.models.bert runs llama.cpp's 'bert' "
                            f"architecture only", where)

        g = getter(kv, f"{arch}.", where, lambda msg: BertError(msg, where))

        def count(key, hi, *default, lo=1):
            return _count(g(key, *default), f"{where}: {arch}.{key}", lo, hi)

        n_embd, n_head = count("embedding_length", MAX_DIM), count("attention.head_count", MAX_DIM)
        if n_embd % n_head:
            raise BertError(f"{where}: {arch}.attention.head_count {n_head} does not divide embedding_length "
                            f"{n_embd}", where)
        if count("attention.head_count_kv", MAX_DIM, n_head) != n_head:
            raise BertError(f"{where}: {arch}.attention.head_count_kv differs from head_count; BERT has no GQA", where)
        if g("attention.causal", False):
            raise BertError(f"{where}: {arch}.attention.causal is true; a BERT encoder attends both ways", where)
        pt = g("pooling_type", None)
        if pt is not None and (isinstance(pt, bool) or not isinstance(pt, (int, np.integer))
                               or int(pt) not in POOLING_NAMES):
            raise BertError(f"{where}: {arch}.pooling_type {pt!r} is not one of {POOLING_NAMES} (rank pooling needs "
                            f"a classifier head refimpl does not run)", where)
        ntt = n_token_types if n_token_types is not None else _count(
            kv.get("tokenizer.ggml.token_type_count", 0), f"{where}: tokenizer.ggml.token_type_count", 0, MAX_VOCAB)
        return cls(arch=arch, n_vocab=_count(n_vocab, f"{where}: token_embd.weight rows", 1, MAX_VOCAB),
                   n_ctx_train=count("context_length", MAX_CTX), n_embd=n_embd,
                   n_layer=count("block_count", MAX_LAYERS), n_head=n_head, head_dim=n_embd // n_head,
                   n_ff=count("feed_forward_length", MAX_DIM),
                   norm_eps=_eps(g("attention.layer_norm_epsilon"), f"{where}: {arch}.attention.layer_norm_epsilon"),
                   n_token_types=ntt, pooling=None if pt is None else POOLING_NAMES[int(pt)], act="gelu")

    @classmethod
    def from_hf_config(cls, cfg: dict, where="config.json", pooling: str | None = None) -> "HParams":
        if not isinstance(cfg, dict):
            raise BertError(f"{where}: the top level is a JSON {type(cfg).__name__}; expected an object", where)

        g = getter(cfg, "", where, lambda msg: BertError(msg, where), source="the config")

        def count(key, hi, *default, lo=1):
            return _count(g(key, *default), f"{where}: {key}", lo, hi)

        archs = cfg.get("architectures") or []
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            raise BertError(f"{where}: architectures {archs!r}; expected a list of names", where)
        if cfg.get("model_type") != "bert" and not any(a.startswith("Bert") for a in archs):
            raise BertError(f"{where}: model_type {cfg.get('model_type')!r} / architectures {archs} is not BERT", where)
        if g("position_embedding_type", "absolute") != "absolute":
            raise BertError(f"{where}: position_embedding_type {cfg['position_embedding_type']!r}; llama.cpp's bert "
                            f"graph has absolute positions only", where)
        if cfg.get("is_decoder"):
            raise BertError(f"{where}: is_decoder is true; only the bidirectional encoder is supported", where)
        act = g("hidden_act", "gelu")
        if not isinstance(act, str) or act not in HF_ACTS:
            raise BertError(f"{where}: hidden_act {act!r} is not one of {sorted(HF_ACTS)}", where)
        n_embd, n_head = count("hidden_size", MAX_DIM), count("num_attention_heads", MAX_DIM)
        if n_embd % n_head:
            raise BertError(f"{where}: num_attention_heads {n_head} does not divide hidden_size {n_embd}", where)
        return cls(arch="bert", n_vocab=count("vocab_size", MAX_VOCAB),
                   n_ctx_train=count("max_position_embeddings", MAX_CTX), n_embd=n_embd,
                   n_layer=count("num_hidden_layers", MAX_LAYERS), n_head=n_head, head_dim=n_embd // n_head,
                   n_ff=count("intermediate_size", MAX_DIM), norm_eps=_eps(g("layer_norm_eps", 1e-12),
                                                                            f"{where}: layer_norm_eps"),
                   n_token_types=count("type_vocab_size", MAX_VOCAB, 2, lo=0), pooling=pooling, act="gelu")


# name -> (shape from hparams, required)
def expected_shapes(hp: HParams) -> dict[str, tuple[tuple, bool]]:
    """Every tensor llama.cpp's bert loader looks for, with its NumPy shape and whether it is required."""
    E, F = hp.n_embd, hp.n_ff
    s = {"token_embd.weight": ((hp.n_vocab, E), True), "token_types.weight": ((hp.n_token_types, E), False),
         "position_embd.weight": ((hp.n_ctx_train, E), True),
         "token_embd_norm.weight": ((E,), True), "token_embd_norm.bias": ((E,), True)}
    for i in range(hp.n_layer):
        p = f"blk.{i}."
        for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
            s[p + n + ".weight"] = ((E, E), True)
            s[p + n + ".bias"] = ((E,), False)
        for n in ("attn_output_norm", "layer_output_norm"):
            s[p + n + ".weight"] = ((E,), True)
            s[p + n + ".bias"] = ((E,), True)
        s[p + "ffn_up.weight"] = ((F, E), True)
        s[p + "ffn_up.bias"] = ((F,), False)
        s[p + "ffn_down.weight"] = ((E, F), True)
        s[p + "ffn_down.bias"] = ((E,), False)
    return s


def _fmt(shape) -> str:
    return f"ne {list(shape)[::-1]} (numpy {tuple(shape)})"


def check_weights(hp: HParams, weights: dict, where="", describe: Callable[[str], str] = repr) -> None:
    """BertError naming the file and tensor for a missing, misshapen or unexpected tensor."""
    layers = {int(n.split(".")[1]) for n in weights if n.startswith("blk.") and n.split(".")[1].isdigit()}
    if hp.n_layer > len(layers) + 1:         # before the expected shapes are built from a count the file gave
        raise BertError(f"{where}: {hp.n_layer} layers in the hyper-parameters, tensors for {len(layers)}")
    want = expected_shapes(hp)
    for name, (shape, required) in want.items():
        t = weights.get(name)
        if t is None:
            if required:
                raise BertError(f"{where}: tensor {describe(name)} is missing; expected {_fmt(shape)}")
            continue
        if tuple(t.shape) != shape:
            raise BertError(f"{where}: tensor {describe(name)} has {_fmt(t.shape)}, expected {_fmt(shape)} "
                             f"(n_vocab {hp.n_vocab}, n_ctx_train {hp.n_ctx_train}, n_embd {hp.n_embd}, "
                             f"n_ff {hp.n_ff}, n_token_types {hp.n_token_types}, n_layer {hp.n_layer})")
    extra = [n for n in weights if n not in want]
    if extra:
        raise BertError(f"{where}: tensor {describe(extra[0])} is not part of a {hp.n_layer}-layer bert model"
                         + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))
    for i in range(hp.n_layer):
        b = [weights.get(f"blk.{i}.{n}.bias") is None for n in ("attn_q", "attn_k", "attn_v")]
        if any(b) and not all(b):
            raise BertError(f"{where}: blk.{i} has biases for some of attn_q/attn_k/attn_v but not all")


@dataclass(frozen=True)
class Layer:
    """Field x <- tensor `blk.{i}.x.weight`, x_b <- `blk.{i}.x.bias` (NumPy order; optional biases may be None)."""
    attn_q: A
    attn_k: A
    attn_v: A
    attn_output: A
    attn_output_norm: A
    attn_output_norm_b: A
    ffn_up: A
    ffn_down: A
    layer_output_norm: A
    layer_output_norm_b: A
    attn_q_b: A = None
    attn_k_b: A = None
    attn_v_b: A = None
    attn_output_b: A = None
    ffn_up_b: A = None
    ffn_down_b: A = None
    attn_qkv: A = None       # derived at load: attn_q, attn_k, attn_v stacked (ops.fused.stack_qkv), or None
    attn_qkv_b: A = None


_DERIVED = ("attn_qkv", "attn_qkv_b")


def _layers(weights: dict, n_layer: int) -> list[Layer]:
    """The layers' weights, and what is derived from them once (the stacked Q/K/V weight that
    ops.fused.attn_qkv takes: one (3n, n_embd) copy of the three f32 matrices, 1.8 MB a layer for MiniLM)."""
    out = []
    for i in range(n_layer):
        p = f"blk.{i}."
        kw = {}
        for f in Layer.__dataclass_fields__:
            if f in _DERIVED:
                continue
            name = p + (f[:-2] + ".bias" if f.endswith("_b") else f + ".weight")
            kw[f] = weights.get(name)
        qkv = stack_qkv(kw["attn_q"], kw["attn_q_b"], kw["attn_k"], kw["attn_k_b"], kw["attn_v"], kw["attn_v_b"])
        if qkv is not None:
            kw["attn_qkv"], kw["attn_qkv_b"] = qkv
        out.append(Layer(**kw))
    return out


@dataclass
class BertModel:
    """Hyper-parameters, weights by llama.cpp tensor name (NumPy order), tokenizer and the model's pooling.

    pooling     the source's own pooling (GGUF bert.pooling_type, sentence-transformers 1_Pooling), or None
    max_length  tokens per text the tokenizer keeps (sentence-transformers max_seq_length, else n_ctx_train)
    source      "gguf" or "hf"
    """
    hparams: HParams
    weights: dict[str, A]
    layers: list[Layer]
    tokenizer: Any = None
    pooling: str | None = None
    max_length: int | None = None
    metadata: dict = field(default_factory=dict, repr=False)
    path: str = ""
    source: str = "gguf"

    def w(self, name: str) -> A:
        return self.weights.get(name)


def _with_act(hp: HParams, act: str | None) -> HParams:
    if act is None:
        return hp
    if act not in ACTS:
        raise ValueError(f"act {act!r} is not one of {sorted(ACTS)}")
    return HParams(**{**vars(hp), "act": act})


def load(path, *, act: str | None = None, tokenizer: bool = True) -> BertModel:
    """Load a BERT encoder from a GGUF file (llama.cpp's `bert` architecture) or a Hugging Face directory.

    GGUF: hyper-parameters from metadata, weights as memory-mapped views (ndarrays / QTensors, not dequantized),
    the WordPiece tokenizer from the vocabulary (`refimpl.tokenizer.from_gguf`), act "gelu" (llama.cpp's).
    Directory: config.json, model.safetensors (read with the `safetensors` package, widened to f32 exactly as
    `refimpl convert --type f32` writes them), the tokenizer files, sentence-transformers' 1_Pooling and
    max_seq_length; the same graph, so the same floats as its converted F32 GGUF.
    `act="gelu_erf"` runs the exact GELU of Hugging Face's "gelu" instead of llama.cpp's ggml_gelu.
    """
    p = Path(path) if not isinstance(path, _gguf.GGUFFile) else None
    if p is not None and p.is_dir():
        return _load_hf(p, act=act, tokenizer=tokenizer)
    f = path if isinstance(path, _gguf.GGUFFile) else _gguf.load(path)
    emb = f.tensors.get("token_embd.weight")
    if emb is None:
        raise BertError(f"{f.path}: tensor 'token_embd.weight' is missing", f.path)
    tt = f.tensors.get("token_types.weight")
    hp = _with_act(HParams.from_gguf(f.metadata, emb.shape[0], None if tt is None else tt.shape[0], where=f.path), act)
    weights = dict(f.tensors)
    check_weights(hp, weights, where=str(f.path))
    tok = None
    if tokenizer:
        from ..tokenizers import from_gguf
        tok = from_gguf(f)
    max_len = getattr(tok, "max_length", None) or hp.n_ctx_train
    return BertModel(hp, weights, _layers(weights, hp.n_layer), tok, hp.pooling, max_len, f.metadata, str(f.path),
                     "gguf")


def _load_hf(src: Path, *, act: str | None, tokenizer: bool) -> BertModel:
    """The directory's model; what the libraries under it raise (JSON, safetensors, a malformed field's KeyError
    or TypeError) comes out as a BertError naming the directory, chained."""
    try:
        return _read_hf(src, act=act, tokenizer=tokenizer)
    except LoadError:
        raise
    except (KeyError, TypeError, AttributeError, IndexError, ValueError, UnicodeDecodeError, OverflowError) as e:
        raise BertError(f"{src}: not a BERT directory refimpl can read: {type(e).__name__}: {e}", src) from e


def _read_hf(src: Path, *, act: str | None, tokenizer: bool) -> BertModel:
    from . import bert_hf as cb
    hp = HParams.from_hf_config(cb.read_config(src), src / "config.json", pooling=cb.hf_pooling(src))
    hp = _with_act(hp, act)
    weights = {k: constant(np.array(v, dtype=np.float32, order="C")) for k, v in cb.hf_tensors(src).items()}
    check_weights(hp, weights, where=str(src), describe=cb.describe)
    max_len = cb.hf_max_length(src)
    tok = None
    if tokenizer:
        from ..tokenizers.wordpiece import WordPieceTokenizer
        tok = WordPieceTokenizer.from_hf_dir(src)
        missing = [t for t, i in (("[CLS]", tok.cls_id), ("[SEP]", tok.sep_id)) if i is None]
        if missing:                        # embed wraps every text in them: refuse at load, not at the first text
            raise TokenizerError(f"{tok.source}: no {' or '.join(missing)} token; a BERT encoder's input needs "
                                 f"both", tok.source)
    if max_len is None:
        max_len = getattr(tok, "max_length", None) or hp.n_ctx_train
    max_len = min(max_len, hp.n_ctx_train)
    if tok is not None and getattr(tok, "max_length", None) != max_len:
        try:
            tok.max_length = max_len                       # sentence-transformers' limit, not the tokenizer's own
        except AttributeError:
            pass
    return BertModel(hp, weights, _layers(weights, hp.n_layer), tok, hp.pooling, max_len,
                     {"config": cb.read_config(src)}, str(src), "hf")


# -- the graph ---------------------------------------------------------------------------------------------

def _norm(x, w, b, eps):
    """llama.cpp's build_norm(LLM_NORM)."""
    return layer_norm(x, w, b, eps)


def key_mask(lengths, n_tokens: int) -> np.ndarray:
    """(n_seq, 1, n_tokens, n_tokens) f32, ne [n_kv, n_tokens, 1, n_seq]: 0 where key j < lengths[s], else -inf.

    llama.cpp's non-causal mask (set_input of llm_graph_input_attn_no_cache) lets a token see every token of its
    own sequence; padded keys are the tokens of no sequence. One mask row serves every head (ne2 = 1).
    """
    j = np.arange(n_tokens)[None, :]
    m = np.where(j < np.asarray(lengths)[:, None], np.float32(0), np.float32(-np.inf)).astype(np.float32)
    return constant(np.ascontiguousarray(np.broadcast_to(m[:, None, None, :], (len(lengths), 1, n_tokens, n_tokens))))


def layer(x, w: Layer, hp: HParams, mask, cap, il: int) -> np.ndarray:
    """x (n_seq, n_tokens, n_embd) -> (n_seq, n_tokens, n_embd): one encoder layer (llama.cpp's bert graph).

    Attention as llama.cpp without flash attention (build_attn_mha): kq = mul_mat(K, Q) per sequence and head,
    soft_max_ext with the mask and 1/sqrt(head_dim), kqv = mul_mat(V^T, kq); the output projection, the residual
    and the norm; the FFN (up, its bias, the activation, down, its bias), the residual and the norm. The
    sublayers are refimpl.ops.fused's ops, whose references are these op sequences; with a capture the dispatch
    runs those sequences (`tapping`), and the tensors get llama.cpp's names."""
    S, T, E = x.shape
    H, D = hp.n_head, hp.head_dim
    flat = x.reshape(S * T, E)
    rows = recorded_as(cap, (S, T, -1))            # the rows of all sequences, (S*T, n), as llama.cpp's (S, T, n)
    with tapping(cap, q=f"Qcur-{il}", k=f"Kcur-{il}", v=f"Vcur-{il}", kq=f"kq-{il}",
                 kq_soft_max=f"kq_soft_max-{il}", kqv=f"kqv-{il}"):
        if w.attn_qkv is not None:
            kqv = attn_qkv(x, w.attn_qkv, w.attn_qkv_b, mask, _scale(hp), H)
        else:
            q, k, v = (cap(name, mul_mat_add(wt, flat, b).reshape(S, T, H, D)) for name, wt, b in (
                (f"Qcur-{il}", w.attn_q, w.attn_q_b), (f"Kcur-{il}", w.attn_k, w.attn_k_b),
                (f"Vcur-{il}", w.attn_v, w.attn_v_b)))
            kqv = attn_mha(q, k, v, mask, _scale(hp))
    with tapping(rows, biased=f"kqv_out-{il}", out=f"ffn_inp-{il}"):       # + the layer input, norm
        ffn_inp = add_norm_affine(mul_mat(w.attn_output, kqv.reshape(S * T, E)), w.attn_output_b, flat,
                                  w.attn_output_norm, w.attn_output_norm_b, hp.norm_eps)
    with tapping(rows, product=f"ffn_up-{il}", biased=f"ffn_up_b-{il}", act=f"ffn_{hp.act}-{il}"):
        if w.ffn_up_b is not None and hp.act == "gelu":
            act = mul_mat_add_gelu(w.ffn_up, ffn_inp, w.ffn_up_b)
        else:
            act = rows(f"ffn_{hp.act}-{il}", ACTS[hp.act](mul_mat_add(w.ffn_up, ffn_inp, w.ffn_up_b)))
    down = mul_mat(w.ffn_down, act)
    if w.ffn_down_b is not None:
        rows(f"ffn_down-{il}", down)
    with tapping(rows, biased=f"ffn_out-{il}", out=f"l_out-{il}"):          # attention bypasses the FFN
        out = add_norm_affine(down, w.ffn_down_b, ffn_inp, w.layer_output_norm, w.layer_output_norm_b,
                              hp.norm_eps)
    return out.reshape(S, T, E)


def _scale(hp: HParams) -> float:
    return 1.0 / float(np.sqrt(np.float32(hp.head_dim)))


def _batch(tokens) -> tuple[list[np.ndarray], bool]:
    """(list of i32 id arrays, whether the input was one flat sequence)."""
    if isinstance(tokens, np.ndarray) and tokens.ndim == 1:
        return [tokens.astype(np.int32)], True
    tokens = list(tokens)
    if tokens and all(isinstance(t, (int, np.integer)) for t in tokens):
        return [np.asarray(tokens, np.int32)], True
    return [np.asarray(t, np.int32).reshape(-1) for t in tokens], False


def forward(model: BertModel, tokens, token_types=None, *, capture=None):
    """Per-token hidden states (result_embd) of each sequence of token ids.

    tokens       a list of sequences (lists / arrays of ids) -> a list of (n_tokens_i, n_embd) f32 arrays;
                 or one flat sequence -> one (n_tokens, n_embd) array
    token_types  same structure (segment ids, default all 0 as llama.cpp hard-codes "sentence A"), or None

    The sequences are padded to the longest and run as one batch (n_seq, n_tokens, n_embd); attention ignores
    the padded keys (`key_mask`) and every other op works row by row, so a sequence's states are those it gets
    alone: the same floats up to the order in which BLAS adds exact f64 products of the same terms (the padded
    keys add exact zeros), which the test suite checks bit for bit.
    """
    out = _forward(model, tokens, token_types, capture=capture)
    return to_host(out) if not isinstance(out, list) else [to_host(h) for h in out]


def _forward(model: BertModel, tokens, token_types=None, *, capture=None):
    """`forward`, its states left where the ops put them (device arrays under the CUDA backend)."""
    hp = model.hparams
    seqs, single = _batch(tokens)
    if not seqs:
        return []
    types = None
    if token_types is not None:
        types, _ = _batch(token_types)
        if len(types) != len(seqs) or any(a.shape != b.shape for a, b in zip(types, seqs)):
            raise ValueError("forward: token_types must have the shape of tokens")
    lengths = [len(s) for s in seqs]
    if min(lengths) == 0:
        raise ValueError("forward: an empty sequence (encode adds [CLS] and [SEP]; pass at least one token)")
    T, S = max(lengths), len(seqs)
    if T > hp.n_ctx_train:
        raise ValueError(f"forward: a sequence of {T} tokens is longer than the model's {hp.n_ctx_train} positions")
    ids = np.zeros((S, T), np.int32)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
    if ids.min() < 0 or ids.max() >= hp.n_vocab:
        raise ValueError(f"forward: token id out of range [0, {hp.n_vocab})")
    cap = capture_fn(capture)
    E = hp.n_embd
    x = get_rows(model.w("token_embd.weight"), ids.reshape(-1)).reshape(S, T, E)
    tt = model.w("token_types.weight")
    if types is not None:
        tids = np.zeros((S, T), np.int32)
        for i, s in enumerate(types):
            tids[i, :len(s)] = s
        if tt is None or tids.min() < 0 or tids.max() >= tt.shape[0]:
            raise ValueError(f"forward: token type out of range [0, {0 if tt is None else tt.shape[0]})")
        x = add(x, get_rows(tt, tids.reshape(-1)).reshape(S, T, E))
    elif tt is not None:
        x = add(x, get_rows(tt, np.zeros(1, np.int32)))                    # llama.cpp: type 0, one row for all
    x = add(x, get_rows(model.w("position_embd.weight"), np.arange(T, dtype=np.int32)))
    cap("inp_embd", x)
    x = _norm(x, model.w("token_embd_norm.weight"), model.w("token_embd_norm.bias"), hp.norm_eps)
    cap("inp_norm-0", x)
    mask = key_mask(lengths, T)
    with forward_scope(S * T, "encoder"):
        for il, w in enumerate(model.layers):
            x = layer(x, w, hp, mask, cap, il)
    cap("result_embd", x)
    out = [x[i, :n] for i, n in enumerate(lengths)]
    return out[0] if single else out


# -- pooling and normalization -------------------------------------------------------------------------------

def pool(h: np.ndarray, pooling: str) -> np.ndarray:
    """One sequence's states h (n_tokens, n_embd) pooled as llama.cpp's build_pooling.

    none  h itself (n_tokens, n_embd)
    mean  (n_embd,): mul_mat(cont(transpose(h)), inp_mean), inp_mean = fl32(1/n_tokens) per token, i.e.
          sum_t h[t] * fl32(1/n) (products summed in f64 and rounded once, as mul_mat's exact mode)
    cls   (n_embd,): the row of the sequence's first position (get_rows)
    last  (n_embd,): the row of its last position
    """
    if pooling == "none":
        return h
    n = h.shape[0]
    if pooling == "mean":
        inp_mean = np.full((1, n), np.float32(1) / np.float32(n), np.float32)      # ne [n_tokens, 1]
        return mul_mat(cont(transpose(h)), inp_mean)[0]                              # ne [n_embd, 1]
    if pooling in ("cls", "last"):
        return get_rows(h, np.array([0 if pooling == "cls" else n - 1], np.int32))[0]
    raise ValueError(f"pooling {pooling!r} is not one of {POOLINGS}")


def normalize(x: np.ndarray) -> np.ndarray:
    """Euclidean normalization of each row (along ne0), as llama.cpp's common_embd_normalize(.., 2):

        s = sum of fl32(x*x) in f64;  scale = fl32(1/sqrt(s)) (0 when s == 0);  out = x * scale in f32

    llama.cpp adds the squares one by one in double; NumPy's pairwise f64 sum can differ from that in the last
    bit of s, which reaches the f32 scale only on a tie.
    """
    x = np.asarray(x, np.float32)
    s = np.sum(np.square(x), axis=-1, keepdims=True, dtype=np.float64)
    with np.errstate(divide="ignore"):
        scale = np.where(s > 0, 1.0 / np.sqrt(s), 0.0).astype(np.float32)
    return x * scale


def embed(model: BertModel, texts, pooling: str | None = "mean", normalize: bool = True, batch_size: int = 32,
          *, capture=None):
    """Sentence embeddings of `texts` (a list of strings, or one string): float32 (n, n_embd).

    Each text is tokenized with [CLS] ... [SEP] (truncated to model.max_length by the tokenizer, which warns),
    batches of `batch_size` texts are padded and run together (`forward`), and each text's states are pooled
    (`pool`; pooling=None takes the model's own, else mean) and, with normalize, scaled to unit Euclidean norm
    (`normalize`). pooling="none" returns a list of (n_tokens_i, n_embd) arrays instead, one row per token.
    """
    if isinstance(texts, str):
        texts = [texts]
    texts = list(texts)
    pooling = pooling or model.pooling or "mean"
    if pooling not in POOLINGS:
        raise ValueError(f"pooling {pooling!r} is not one of {POOLINGS}")
    tok = model.tokenizer
    if tok is None:
        raise ValueError(f"{model.path}: the model was loaded without a tokenizer")
    ids = tok.encode_batch(texts) if hasattr(tok, "encode_batch") else [tok.encode(t) for t in texts]
    return embed_ids(model, ids, pooling, normalize, batch_size, capture=capture)


def embed_ids(model: BertModel, ids, pooling: str | None = "mean", normalize: bool = True, batch_size: int = 32,
              *, capture=None):
    """`embed` for texts already tokenized (lists of token ids, special tokens included)."""
    pooling = pooling or model.pooling or "mean"
    if pooling not in POOLINGS:
        raise ValueError(f"pooling {pooling!r} is not one of {POOLINGS}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    ids = [list(i) for i in ids]
    cap = capture_fn(capture)
    out = []
    for lo in range(0, len(ids), int(batch_size)):
        for h in _forward(model, ids[lo:lo + batch_size], capture=capture):
            v = to_host(pool(h, pooling))
            cap("result_embd_pooled", v)
            out.append(_normalize_rows(v) if normalize else v)
    if pooling == "none":
        return out
    return np.stack(out).astype(np.float32, copy=False) if out else np.zeros((0, model.hparams.n_embd), np.float32)


_normalize_rows = normalize
