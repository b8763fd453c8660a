"""Hugging Face BERT directories (sentence-transformers ones included) to llama.cpp's `bert` GGUF architecture.

    refimpl convert all-MiniLM-L6-v2/ minilm-f32.gguf --type f32        # or f16, bf16, q8_0
    convert(Path("all-MiniLM-L6-v2"), Path("minilm-f32.gguf"), "f32")

Reads config.json, model.safetensors (or the shards that model.safetensors.index.json lists; with the
`safetensors` package, BF16 through the file's own header), tokenizer.json or vocab.txt,
tokenizer_config.json, and the sentence-transformers files modules.json / 1_Pooling/config.json, and writes
what llama.cpp's own converter (convert_hf_to_gguf.py) writes for these models, so that llama.cpp loads and
runs the file and its metadata, tensor names, types and shapes agree key for key:

Tensors, in the order of the safetensors files, renamed (`bert.` prefixes, `.gamma`/`.beta` accepted):

    embeddings.word_embeddings          token_embd         (n_vocab, n_embd)       ne [n_embd, n_vocab]
    embeddings.token_type_embeddings    token_types        (n_token_types, n_embd)
    embeddings.position_embeddings      position_embd      (n_ctx_train, n_embd)
    embeddings.LayerNorm                token_embd_norm    (n_embd,)  .weight and .bias
    encoder.layer.N.attention.self.query / key / value        blk.N.attn_q / attn_k / attn_v   (n_embd, n_embd)
    encoder.layer.N.attention.output.dense                    blk.N.attn_output                (n_embd, n_embd)
    encoder.layer.N.attention.output.LayerNorm                blk.N.attn_output_norm
    encoder.layer.N.intermediate.dense                        blk.N.ffn_up                     (n_ff, n_embd)
    encoder.layer.N.output.dense                              blk.N.ffn_down                   (n_embd, n_ff)
    encoder.layer.N.output.LayerNorm                          blk.N.layer_output_norm

  each with its `.bias`; PyTorch's Linear weight (out, in) is already NumPy order, ne [in, out]. Dropped:
  embeddings.position_ids, the pooler, the masked-LM and next-sentence heads (cls.*). Anything else is an error
  naming the tensor (a classification head, say, which llama.cpp's reranker path would need).

Types: 1-D tensors, `*_norm.weight`, position_embd and token_types stay F32; every other weight (token_embd
included) takes the outtype. F16 is NumPy's round-to-nearest-even cast, BF16 and Q8_0 are
`refimpl.quantize` (ggml's reference rounding, which is also gguf-py's); a Q8_0 tensor whose rows are not
whole 32-blocks falls back to F16, as llama.cpp's converter does. Source F16 is widened exactly to F32 first
when the outtype is f32; BF16 sources are widened to F32 before anything else.

Metadata:
    general.*                 from the model card (README.md front matter) and config.json through gguf-py's
                              `gguf.Metadata` (the same library code llama.cpp's converter calls), plus
                              general.type "model", general.file_type (llama_ftype: f32 0, f16 1, q8_0 7,
                              bf16 32) and general.quantization_version 2
    bert.block_count, context_length (max_position_embeddings), embedding_length, feed_forward_length,
    attention.head_count, attention.layer_norm_epsilon (f32), attention.causal (false),
    pooling_type              from 1_Pooling/config.json through modules.json: mean 1, cls 2, lasttoken 3;
                              absent without sentence-transformers files (llama.cpp then uses none)
    tokenizer.ggml.model "bert", token_type_count (type_vocab_size), tokens, token_type, pre,
    special token ids (bos, eos, unknown, seperator [sic], padding, mask), add_bos/add_eos/add_sep, and
    normalizer.lowercase / normalizer.strip_accents as tokenizer.json's normalizer says.

The token list is the WordPiece vocabulary in id order (ids the vocabulary skips up to config.json's
vocab_size become "[PAD<i>]", UNUSED) in llama.cpp's "phantom space" spelling: a word-initial piece gets a
leading U+2581, a continuation piece loses its "##", and CONTROL tokens are kept as they are. Token types:
added tokens marked special (or spelled like "<|...|>") are CONTROL (3), other added tokens USER_DEFINED (4),
the rest NORMAL (1).

`tokenizer.ggml.pre` is a label llama.cpp's converter looks up from a hash of a probe text's tokenization and
that llama.cpp ignores for WordPiece vocabularies: for the lowercasing BERT WordPiece tokenizers (MiniLM,
bge-small-en, ...) its table gives "jina-v2-en", which is written for every lowercasing WordPiece tokenizer
here; others get "default" (llama.cpp's converter refuses tokenizers whose hash it does not know).

Special tokens and add_* flags follow gguf-py's SpecialVocab reading of tokenizer.json and
tokenizer_config.json: bos defaults to the CLS token and eos to the SEP token; a TemplateProcessing
post-processor "[CLS] $A [SEP]" sets add_bos and add_eos, and its pair template decides add_sep (true only
with two separators between A and B, or one and no trailing token); ids come from tokenizer.json's added
tokens, then config.json's `<type>_token_id`. Where llama.cpp's converter differs deliberately: without a
tokenizer.json (vocab.txt only) the ids are also looked up in the vocabulary, BERT's fixed template stands
in for the post-processor, and normalizer.lowercase comes from tokenizer_config.json's do_lower_case --
there llama.cpp's converter writes no ids and no lowercase flag, and llama.cpp would then not lowercase.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ..models.bert_hf import describe, gguf_name, hf_name, hf_pooling, hf_tensors, read_config, read_json  # noqa: F401
from ..types import GGMLType

OUTTYPES = ("f32", "f16", "bf16", "q8_0")
FILE_TYPE = {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}          # llama_ftype (gguf.LlamaFileType)
WEIGHT_TYPE = {"f32": GGMLType.F32, "f16": GGMLType.F16, "bf16": GGMLType.BF16, "q8_0": GGMLType.Q8_0}
POOLING_TYPE = {"none": 0, "mean": 1, "cls": 2, "last": 3}       # llama_pooling_type
QUANT_VERSION = 2                                                # GGML_QNT_VERSION
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 2, 3, 4, 5
PHANTOM = "\u2581"
_ALWAYS_F32 = ("position_embd.weight", "token_types.weight")

def _content(entry) -> str | None:
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and isinstance(entry.get("content"), str):
        return entry["content"]
    return None


def _looks_special(text: str) -> bool:
    return (text.startswith("<|") and text.endswith("|>")) or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))


def read_vocab(src: Path, n_vocab: int) -> tuple[list[str], list[int], dict]:
    """(tokens as the vocabulary spells them, token types, tokenizer.json or {}) for ids 0..n_vocab-1."""
    tj = read_json(src / "tokenizer.json") or {}
    added: dict[str, dict] = {}
    if tj:
        model = tj.get("model", {})
        if model.get("type") != "WordPiece":
            raise ValueError(f"{src / 'tokenizer.json'}: model type {model.get('type')!r}; the bert converter "
                             f"needs a WordPiece vocabulary")
        by_id = {int(i): t for t, i in model["vocab"].items()}
        for a in tj.get("added_tokens", []):
            by_id[int(a["id"])] = a["content"]
            added[a["content"]] = a
    else:
        vt = src / "vocab.txt"
        if not vt.is_file():
            raise FileNotFoundError(f"{src}: neither tokenizer.json nor vocab.txt")
        lines = vt.read_text(encoding="utf-8").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        by_id = {i: t for t, i in {t: i for i, t in enumerate(lines)}.items()}   # a repeated line: the last id
        tc = read_json(src / "tokenizer_config.json") or {}
        for i, a in (tc.get("added_tokens_decoder") or {}).items():
            by_id[int(i)] = a["content"]
            added[a["content"]] = a
        # transformers makes every special token the config names an added, special token
        smap = {**(read_json(src / "special_tokens_map.json") or {}), **tc}
        ids = {t: i for i, t in by_id.items()}
        for k in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
            t = _content(smap.get(k))
            if t is not None and t in ids and t not in added:
                added[t] = {"id": ids[t], "content": t, "special": True}
    if by_id and max(by_id) >= n_vocab:
        raise ValueError(f"{src}: token id {max(by_id)} is outside config.json's vocab_size {n_vocab}")
    tokens, types = [], []
    for i in range(n_vocab):
        t = by_id.get(i)
        if t is None:
            tokens.append(f"[PAD{i}]")
            types.append(TOKEN_UNUSED)
        elif t in added:
            tokens.append(t)
            types.append(TOKEN_CONTROL if added[t].get("special") or _looks_special(t) else TOKEN_USER_DEFINED)
        else:
            tokens.append(t)
            types.append(TOKEN_NORMAL)
    return tokens, types, tj


def phantom_space(tokens: list[str], types: list[int]) -> list[str]:
    """llama.cpp's WordPiece spelling: "##piece" -> "piece", "word" -> U+2581 "word"; CONTROL tokens as they are."""
    return [t if ty == TOKEN_CONTROL else t[2:] if t.startswith("##") else PHANTOM + t for t, ty in zip(tokens, types)]


_CLS, _SEP = {"SpecialToken": {"id": "[CLS]"}}, {"SpecialToken": {"id": "[SEP]"}}
_BERT_TEMPLATE = {"type": "TemplateProcessing",             # BertTokenizer's: [CLS] A [SEP] (B [SEP])
                  "single": [_CLS, {"Sequence": {"id": "A"}}, _SEP],
                  "pair": [_CLS, {"Sequence": {"id": "A"}}, _SEP, {"Sequence": {"id": "B"}}, _SEP]}


def _special(e):
    return e.get("SpecialToken", {}).get("id")


def special_tokens(src: Path, cfg: dict, tj: dict, tokens_plain: dict[str, int]) -> dict:
    """tokenizer.ggml.* special-token ids, add_* flags and normalizer flags, in llama.cpp's converter order."""
    tc = read_json(src / "tokenizer_config.json") or {}
    names = {t: _content(tc.get(f"{t}_token")) for t in ("bos", "eos", "unk", "sep", "pad", "cls", "mask")}
    names["bos"] = names["bos"] or names["cls"]
    names["eos"] = names["eos"] or names["sep"]
    add: dict[str, bool] = {}
    post = tj.get("post_processor") if tj else (_BERT_TEMPLATE if tc.get("tokenizer_class", "BertTokenizer")
                                                  .startswith("Bert") else None)
    for p in (post or {}).get("processors", [post] if post else []):
        if p.get("type") == "RobertaProcessing":
            add.update(bos=True, eos=True, sep=True)
        elif p.get("type") == "TemplateProcessing":
            single, pair = p.get("single", []), p.get("pair", [])
            first = _special(single[0]) if len(single) > 1 else None
            last = _special(single[-1]) if len(single) > 1 else None
            if first:
                if not names["bos"]:
                    names["bos"] = first
                add["bos"] = first in (names["bos"], names["cls"])
            if last:
                if last != names["eos"]:
                    names["eos"] = last
                add["eos"] = True
            mid = pair[(1 if first and pair and _special(pair[0]) == first else 0):
                       (-1 if last and pair and _special(pair[-1]) == last else None)]
            seq = lambda e: e.get("Sequence", {}).get("id")        # noqa: E731
            if len(mid) > 2 and seq(mid[0]) == "A" and seq(mid[-1]) == "B":
                mid = mid[1:-1]
                seps = (names["sep"], names["eos"])
                add_sep = bool(_special(mid[0]) in seps and not last)
                if len(mid) == 2 and _special(mid[1]) in seps:
                    add_sep = True
                add["sep"] = add_sep
    for t in ("bos", "eos", "unk", "sep", "pad", "cls", "mask"):
        v = tc.get(f"add_{t}_token")
        if isinstance(v, bool) and t not in add:
            add[t] = v
    added_ids = {a["content"]: int(a["id"]) for a in (tj.get("added_tokens", []) if tj else [])}
    out: dict = {}
    keys = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id", "sep": "seperator_token_id",
            "pad": "padding_token_id", "mask": "mask_token_id"}   # no cls id: llama.cpp's converter writes none
    for t, key in keys.items():
        name = names[t]
        tid = added_ids.get(name) if tj else tokens_plain.get(name)
        if tid is None:
            tid = cfg.get(f"{t}_token_id")
        if tid is not None:
            out[f"tokenizer.ggml.{key}"] = int(tid)
    for t in ("bos", "eos", "sep"):
        if t in add:
            out[f"tokenizer.ggml.add_{t}_token"] = bool(add[t])
    lower = strip = None
    if tj:
        def walk(n):
            nonlocal lower, strip
            if not n:
                return
            if n.get("type") == "Lowercase":
                lower = True
            elif n.get("type") == "StripAccents":
                strip = True
            elif n.get("type") == "BertNormalizer":
                lower = n.get("lowercase", lower)
                strip = n.get("strip_accents", strip)
            elif n.get("type") == "Sequence":
                for m in n.get("normalizers", []):
                    walk(m)
        walk(tj.get("normalizer"))
    elif isinstance(tc.get("do_lower_case"), bool):
        lower = tc["do_lower_case"]
    if lower is not None:
        out["tokenizer.ggml.normalizer.lowercase"] = bool(lower)
    if strip is not None:
        out["tokenizer.ggml.normalizer.strip_accents"] = bool(strip)
    return out


# -- metadata and tensors -----------------------------------------------------------------------------

def _general(src: Path, n_params: int) -> dict:
    """general.* from the model card and config.json, through gguf-py's Metadata (llama.cpp's converter's)."""
    import gguf
    meta = gguf.Metadata.load(None, src, None, n_params)
    if meta.name is None:
        meta.name = src.name
    if meta.size_label is None and n_params > 0:
        meta.size_label = gguf.size_label(n_params, n_params, 0, 0)
    w = gguf.GGUFWriter(None, "bert")
    w.add_type(gguf.GGUFType.MODEL)
    meta.set_gguf_meta_model(w)
    out = {}
    for kv in w.kv_data:
        for k, v in kv.items():
            out[k] = (v.value, v.type if v.sub_type is None else (v.type, v.sub_type))
    return out


def tensor_type(name: str, x, outtype: str) -> GGMLType:
    """The GGUF type llama.cpp's converter gives tensor `name` for `outtype` (see the module docstring)."""
    if x.ndim <= 1 or name.endswith("_norm.weight") or name in _ALWAYS_F32 or not name.endswith(".weight"):
        return GGMLType.F32
    t = WEIGHT_TYPE[outtype]
    if t == GGMLType.Q8_0 and x.shape[-1] % 32:
        print(f"refimpl convert: {name}: rows of {x.shape[-1]} are not whole Q8_0 blocks of 32; writing F16",
              file=sys.stderr)
        return GGMLType.F16
    return t


def _as_type(x: np.ndarray, t: GGMLType):
    from ..qtensor import quantize
    if t == GGMLType.F32:
        return np.ascontiguousarray(x, dtype=np.float32)
    if t == GGMLType.F16:
        return np.ascontiguousarray(x.astype(np.float32, copy=False).astype(np.float16))
    return quantize(x.astype(np.float32, copy=False), t)


def build(src, outtype: str = "f32") -> tuple[dict, dict, dict]:
    """(metadata, value_types, tensors) of the GGUF file `convert` writes, without writing it."""
    from ..gguf import GGUFValueType as V
    from ..models.bert import HParams, check_weights
    src = Path(src)
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype {outtype!r} is not one of {', '.join(OUTTYPES)}")
    cfg = read_config(src)
    hp = HParams.from_hf_config(cfg, src / "config.json")
    weights = hf_tensors(src)
    check_weights(hp, weights, where=str(src))
    tokens, types, tj = read_vocab(src, hp.n_vocab)
    first_id: dict[str, int] = {}
    for i, t in enumerate(tokens):
        first_id.setdefault(t, i)
    specials = special_tokens(src, cfg, tj, first_id)
    n_params = int(sum(x.size for x in weights.values()))

    md: dict = {}
    vt: dict = {}

    def put(key, value, vtype=None):
        md[key] = value
        if vtype is not None:
            vt[key] = vtype

    for k, (v, t) in _general(src, n_params).items():
        put(k, v, t)
    put("bert.block_count", hp.n_layer, V.UINT32)
    put("bert.context_length", hp.n_ctx_train, V.UINT32)
    put("bert.embedding_length", hp.n_embd, V.UINT32)
    put("bert.feed_forward_length", hp.n_ff, V.UINT32)
    put("bert.attention.head_count", hp.n_head, V.UINT32)
    put("bert.attention.layer_norm_epsilon", float(cfg.get("layer_norm_eps", 1e-12)), V.FLOAT32)
    put("general.file_type", FILE_TYPE[outtype], V.UINT32)
    put("bert.attention.causal", False, V.BOOL)
    pooling = hf_pooling(src)
    if pooling is not None:
        put("bert.pooling_type", POOLING_TYPE[pooling], V.UINT32)
    put("general.quantization_version", QUANT_VERSION, V.UINT32)
    put("tokenizer.ggml.token_type_count", hp.n_token_types, V.UINT32)
    put("tokenizer.ggml.model", "bert", V.STRING)
    lower = specials.get("tokenizer.ggml.normalizer.lowercase")
    put("tokenizer.ggml.pre", "jina-v2-en" if lower else "default", V.STRING)
    put("tokenizer.ggml.tokens", phantom_space(tokens, types), (V.ARRAY, V.STRING))
    put("tokenizer.ggml.token_type", types, (V.ARRAY, V.INT32))
    for k, v in specials.items():
        put(k, v, V.BOOL if isinstance(v, bool) else V.UINT32)

    tensors = {name: _as_type(x, tensor_type(name, x, outtype)) for name, x in weights.items()}
    return md, vt, tensors


def convert(src, out, outtype: str = "f32") -> Path:
    """Write the `bert` GGUF file for the Hugging Face directory `src` with weights of `outtype`."""
    from .. import gguf
    md, vt, tensors = build(src, outtype)
    return gguf.save(out, md, tensors, value_types=vt)
