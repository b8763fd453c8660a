"""Where the tests look for real model files (downloaded once, never committed).

The cache directory is `$REFIMPL_CACHE` when set, else `~/.cache/refimpl` (where `refimpl fetch` puts
them). A test that needs a model asks for its path and skips, saying which file is missing, when the
helper returns None, so the suite also passes on a machine without the downloads.
"""
from __future__ import annotations

import os
from pathlib import Path

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"   # 98 MB: llama, Q4_1 + Q8_0 + F32, 49152-token BPE vocab


def cache_dir() -> Path:
    return Path(os.environ.get("REFIMPL_CACHE") or Path.home() / ".cache" / "refimpl").expanduser()


def model_path(name: str) -> Path | None:
    p = cache_dir() / name
    return p if p.is_file() else None


def smollm2_path() -> Path | None:
    """SmolLM2-135M-Instruct Q4_1 GGUF in the cache, or None when it has not been fetched."""
    return model_path(SMOLLM2_FILE)


def missing_reason(name: str) -> str:
    return f"{name} is not in {cache_dir()} (set REFIMPL_CACHE or run `refimpl fetch`)"
