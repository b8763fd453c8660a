"""Models as plain functions over refimpl's ops.

Each model family is a module (or package) of refimpl.models with the same few functions: `load(path or
GGUFFile)`, `forward(model, tokens, ...)`, and for the decoders `new_cache`, `generate` and `format_chat`.
FAMILIES says which one runs a GGUF's general.architecture; `family(arch)` and `family_of(model)` return the
module (imported on first use, so `import refimpl` imports no model).
"""
from __future__ import annotations

import importlib
from types import ModuleType

# general.architecture -> the module that runs it (the modules' own ARCHS / ROPE_MODE tables say the same;
# tests/models check that the two agree)
FAMILIES: dict[str, str] = {
    "llama": "llama", "mistral": "llama", "qwen2": "llama", "qwen3": "llama",
    "gemma3": "gemma3",
    "gpt-oss": "gpt_oss",
    "bert": "bert",
    "rwkv6": "rwkv", "rwkv7": "rwkv",
}


def family(arch: str | None) -> ModuleType:
    """The module that runs a GGUF of general.architecture `arch`; refimpl.models.llama for an architecture
    no family claims (its loader refuses it with the list of those it runs)."""
    return importlib.import_module(f"{__name__}.{FAMILIES.get(arch or '', 'llama')}")


def family_of(model) -> ModuleType:
    """The module a loaded model belongs to (its forward, generate, new_cache, format_chat)."""
    parts = type(model).__module__.split(".")
    if parts[:2] != __name__.split(".") or len(parts) < 3:
        raise TypeError(f"not a refimpl model: {type(model).__name__}")
    return importlib.import_module(".".join(parts[:3]))
