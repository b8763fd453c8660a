"""Hugging Face BERT checkpoints as the models layer reads them: config.json, the safetensors weights (names mapped
to llama.cpp's GGUF names), sentence-transformers' pooling and max length. refimpl.models.bert loads a checkpoint
directory with these; refimpl.convert.bert writes a GGUF from the same reading.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import BertError, not_this_format
from ..errors import read_json as _read_json

_TOP = {"embeddings.word_embeddings": "token_embd", "embeddings.token_type_embeddings": "token_types",
        "embeddings.position_embeddings": "position_embd", "embeddings.LayerNorm": "token_embd_norm"}
_LAYER = {"attention.self.query": "attn_q", "attention.self.key": "attn_k", "attention.self.value": "attn_v",
          "attention.output.dense": "attn_output", "attention.output.LayerNorm": "attn_output_norm",
          "intermediate.dense": "ffn_up", "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm"}
_DROP = re.compile(r"(embeddings\.position_ids|pooler\..*|cls\.predictions\..*|cls\.seq_relationship\..*)")


# -- reading a Hugging Face directory ------------------------------------------------------------------

def read_json(path: Path, required: bool = False, expect: type | None = None):
    """The parsed JSON file (None if absent and not required); BertError naming it otherwise (errors.read_json)."""
    return _read_json(path, BertError, required=required, expect=expect)


def read_config(src: Path) -> dict:
    return read_json(Path(src) / "config.json", required=True, expect=dict)


def gguf_name(hf_name: str, where="") -> str | None:
    """llama.cpp's name for a Hugging Face BERT tensor; None for one that is dropped; BertError otherwise."""
    n = hf_name[5:] if hf_name.startswith("bert.") else hf_name
    if n.endswith(".gamma"):
        n = n[:-6] + ".weight"
    elif n.endswith(".beta"):
        n = n[:-5] + ".bias"
    if _DROP.fullmatch(n):
        return None
    base, _, suffix = n.rpartition(".")
    if suffix in ("weight", "bias"):
        if base in _TOP:
            return f"{_TOP[base]}.{suffix}"
        m = re.fullmatch(r"encoder\.layer\.(\d+)\.(.+)", base)
        if m and m.group(2) in _LAYER:
            return f"blk.{int(m.group(1))}.{_LAYER[m.group(2)]}.{suffix}"
    raise BertError(f"{where}: tensor {hf_name!r} has no counterpart in llama.cpp's bert architecture "
                    f"(known: embeddings.*, encoder.layer.N.attention/intermediate/output.*; dropped: pooler, cls.*)",
                    where or None)


def hf_name(name: str) -> str | None:
    """The Hugging Face name of llama.cpp tensor `name` (without a `bert.` prefix), or None."""
    base, _, suffix = name.rpartition(".")
    for k, v in _TOP.items():
        if v == base:
            return f"{k}.{suffix}"
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    if m:
        for k, v in _LAYER.items():
            if v == m.group(2):
                return f"encoder.layer.{m.group(1)}.{k}.{suffix}"
    return None


def describe(name: str) -> str:
    """A tensor named for messages about a Hugging Face directory: "'blk.0.attn_q.weight' (... 'encoder...')"."""
    h = hf_name(name)
    return f"{name!r}" + (f" (Hugging Face {h!r})" if h else "")


def safetensors_files(src: Path) -> list[Path]:
    """model.safetensors, or the shards of model.safetensors.index.json in file-name order."""
    single = src / "model.safetensors"
    if single.is_file():
        return [single]
    index = read_json(src / "model.safetensors.index.json", expect=dict)
    if index is not None:
        wm = index.get("weight_map", {})
        if not isinstance(wm, dict) or not all(isinstance(f, str) and "/" not in f and f not in ("", ".", "..")
                                               for f in wm.values()):
            raise BertError(f"{src / 'model.safetensors.index.json'}: weight_map must map names to file names in "
                            f"the directory", src)
        return [src / f for f in sorted(set(wm.values()))]
    raise BertError(f"{src}: no model.safetensors (nor model.safetensors.index.json); refimpl reads "
                            f"safetensors checkpoints only")


def _raw_bf16(path: Path, name: str) -> np.ndarray:
    """A BF16 tensor widened (exactly) to f32: NumPy has no bfloat16, so read its bytes via the file header
    (8-byte little-endian header length, JSON header with `data_offsets` relative to the data section)."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        if not 2 <= n <= size - 8:
            raise BertError(f"{path}: safetensors header length {n} does not fit the file's {size} bytes", path)
        header = json.loads(fh.read(n))
    e = header[name]
    lo, hi = (int(v) for v in e["data_offsets"])
    shape = [int(d) for d in e["shape"]]
    if not (0 <= lo <= hi <= size - 8 - n) or hi - lo != 2 * int(np.prod(shape)):
        raise BertError(f"{path}: tensor {name!r}: data_offsets [{lo}, {hi}) do not hold a BF16 {shape} inside the "
                        f"file's {size} bytes", path)
    raw = np.fromfile(path, dtype="<u2", count=(hi - lo) // 2, offset=8 + n + lo)
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(shape)


def iter_safetensors(path: Path) -> Iterator[tuple[str, np.ndarray]]:
    """(name, array) of every tensor of one safetensors file, in the file's key order (safe_open, NumPy)."""
    from safetensors import SafetensorError, safe_open
    try:
        with safe_open(str(path), framework="np") as f:
            for name in f.keys():
                if f.get_slice(name).get_dtype() == "BF16":
                    x = _raw_bf16(path, name)
                else:
                    x = f.get_tensor(name)
                yield name, x
    except (SafetensorError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise BertError(not_this_format(path, "a readable safetensors file") + f" ({type(e).__name__}: {e})",
                        path) from e


def hf_tensors(src) -> dict[str, np.ndarray]:
    """Every weight of a BERT directory under its llama.cpp name, NumPy order, in file order.

    F32 and F16 arrays as stored; BF16 and F64 widened/rounded to f32 (llama.cpp's converter does the same).
    """
    src = Path(src)
    out: dict[str, np.ndarray] = {}
    for path in safetensors_files(src):
        for name, x in iter_safetensors(path):
            gname = gguf_name(name, where=str(path))
            if gname is None:
                continue
            if x.dtype.kind != "f":
                raise ValueError(f"{path}: tensor {name!r} ({gname!r}) has dtype {x.dtype}; expected floats")
            if x.dtype not in (np.float32, np.float16):
                x = x.astype(np.float32)
            if gname in out:
                raise ValueError(f"{path}: tensor {name!r} maps to {gname!r}, which an earlier tensor already gave")
            out[gname] = x
    return out


def hf_pooling(src) -> str | None:
    """The sentence-transformers pooling (none/mean/cls/last) that modules.json / 1_Pooling say, else None."""
    src = Path(src)
    modules = read_json(src / "modules.json", expect=list) or []
    if not all(isinstance(m, dict) for m in modules):
        raise BertError(f"{src / 'modules.json'}: expected an array of objects", src)
    path = next((m.get("path", "") for m in modules if str(m.get("type", "")).endswith("Pooling")), None)
    if path is None:
        return None
    if not isinstance(path, str) or ".." in Path(path).parts or Path(path).is_absolute():
        raise BertError(f"{src / 'modules.json'}: pooling module path {path!r} is not a folder of the directory", src)
    cfg = read_json(src / path / "config.json", required=True, expect=dict)
    if cfg.get("pooling_mode_mean_tokens"):
        return "mean"
    if cfg.get("pooling_mode_cls_token"):
        return "cls"
    if cfg.get("pooling_mode_lasttoken"):
        return "last"
    mode = {"mean": "mean", "cls": "cls", "lasttoken": "last"}.get(cfg.get("pooling_mode"))
    if mode is None:
        raise ValueError(f"{src / path / 'config.json'}: pooling {cfg} is not one llama.cpp has (mean, cls, lasttoken)")
    return mode


def hf_max_length(src) -> int | None:
    """sentence-transformers' max_seq_length (sentence_bert_config.json), else None."""
    where = Path(src) / "sentence_bert_config.json"
    cfg = read_json(where, expect=dict) or {}
    n = cfg.get("max_seq_length")
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 1 << 24:
        raise BertError(f"{where}: max_seq_length {n!r}; expected an integer in [1, {1 << 24}]", where)
    return n


# -- vocabulary ---------------------------------------------------------------------------------------
