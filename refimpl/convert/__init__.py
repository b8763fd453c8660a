"""Checkpoints in other formats to GGUF files that llama.cpp loads: `convert(src, out, outtype)`.

    from refimpl.convert import convert
    convert("all-MiniLM-L6-v2/", "minilm-f32.gguf", "f32")     # a Hugging Face directory -> GGUF

A source is matched against a small registry: for a Hugging Face directory, `config.json`'s `architectures`
(first) and `model_type` pick the converter; a converter for another kind of source (a single checkpoint
file, say) registers a `detect(path)` predicate instead. Each converter lives in its own module
`refimpl.convert.<module>`, imported only when used, which provides

    convert(src: Path, out: Path, outtype: str) -> Path
    OUTTYPES                                          (optional) the outtypes it writes, checked first

and is registered here with one `Converter(...)` line in `REGISTRY` (or, at run time, `register(...)`).
"""
from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

__all__ = ["Converter", "REGISTRY", "register", "find_converter", "convert"]


@dataclass(frozen=True)
class Converter:
    """One entry of the registry.

    name           shown in messages and `refimpl convert --help`
    module         refimpl.convert.<module>, imported on use
    model_types    config.json `model_type` values it converts
    architectures  config.json `architectures` entries it converts (checked before model_type)
    detect         for sources that are not a Hugging Face directory: detect(path) -> bool
    """
    name: str
    module: str
    model_types: tuple[str, ...] = ()
    architectures: tuple[str, ...] = ()
    detect: Callable[[Path], bool] | None = None

    def load(self):
        return importlib.import_module(f"{__name__}.{self.module}")


REGISTRY: list[Converter] = [
    Converter("bert", "bert", model_types=("bert",), architectures=("BertModel", "BertForMaskedLM")),
    Converter("rwkv", "rwkv", model_types=("rwkv6", "rwkv7"),
              architectures=("Rwkv6ForCausalLM", "Rwkv7ForCausalLM", "RWKV7ForCausalLM"),
              detect=lambda p: importlib.import_module(f"{__name__}.rwkv").detect(p)),
]


def register(conv: Converter) -> Converter:
    """Add a converter (ahead of the built-in ones, so that a more specific one can take over a source)."""
    REGISTRY.insert(0, conv)
    return conv


def _config(src: Path) -> dict | None:
    p = src / "config.json"
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e})") from None


def find_converter(src) -> Converter:
    """The registered converter for `src`; ValueError naming what was looked at when none fits."""
    src = Path(src)
    if not src.exists():
        raise FileNotFoundError(f"{src}: no such file or directory")
    for conv in REGISTRY:
        if conv.detect is not None and conv.detect(src):
            return conv
    cfg = _config(src) if src.is_dir() else None
    if cfg is None:
        raise ValueError(f"{src}: not a Hugging Face model directory (no config.json) and no registered converter "
                         f"recognizes it; known: {', '.join(c.name for c in REGISTRY)}")
    archs = cfg.get("architectures") or []
    for conv in REGISTRY:
        if any(a in conv.architectures for a in archs):
            return conv
    mtype = cfg.get("model_type")
    for conv in REGISTRY:
        if mtype in conv.model_types:
            return conv
    known = sorted({a for c in REGISTRY for a in c.architectures} | {m for c in REGISTRY for m in c.model_types})
    raise ValueError(f"{src / 'config.json'}: architectures {archs} / model_type {mtype!r} have no converter; "
                     f"known: {', '.join(known)}")


def convert(src, out, outtype: str = "f32") -> Path:
    """Convert `src` to the GGUF file `out` with weights of `outtype`; returns `out`."""
    conv = find_converter(src)
    mod = conv.load()
    known = getattr(mod, "OUTTYPES", None)
    if known is not None and outtype not in known:
        raise ValueError(f"{conv.name} converter: outtype {outtype!r} is not one of {', '.join(known)}")
    return mod.convert(Path(src), Path(out), outtype)
