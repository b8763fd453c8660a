"""refimpl's error family for data that comes in from files.

    LoadError(ValueError)         a file or directory refimpl cannot load; the message names it (and the key,
    |                             tensor or field at fault) and says what was expected
    +-- GGUFError                 refimpl.gguf
    +-- Llama2cError              refimpl.models.llama2c (checkpoints and tokenizer.bin)
    +-- BertError                 refimpl.models.bert (Hugging Face / sentence-transformers directories)
    +-- TokenizerError            refimpl.tokenizers (tokenizer.json, vocab.txt, GGUF vocabularies)
    +-- RWKVError                 refimpl.models.rwkv (.pth / .safetensors / .npz checkpoints)
    ChatTemplateError(ValueError) refimpl.chat: a chat template (code from a model file) that failed, raised,
                                  tried an unsafe operation or exceeded a limit while rendering

Loaders catch what the libraries they call raise (SafetensorError, JSONDecodeError, KeyError, TypeError, ...) at
their boundary and raise one of these from it, so `except refimpl.LoadError` is the one clause a caller needs.
`looks_like(path)` names the format a file's first bytes say it is, for "this is not a GGUF file, it looks like
a safetensors file" messages.
"""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["LoadError", "BertError", "TokenizerError", "RWKVError", "ChatTemplateError", "looks_like",
           "not_this_format", "read_json"]

MAX_JSON_BYTES = 1 << 30          # tokenizer.json of the largest vocabularies is ~20 MB


class LoadError(ValueError):
    """A file or directory refimpl cannot load. `path` is it (a str), when known."""

    def __init__(self, message: str, path=None):
        self.path = None if path is None else str(path)
        super().__init__(message)


class BertError(LoadError):
    """A Hugging Face / sentence-transformers BERT directory refimpl cannot load."""


class TokenizerError(LoadError):
    """A tokenizer file refimpl cannot load (tokenizer.json, vocab.txt, GGUF tokenizer metadata)."""


class RWKVError(LoadError):
    """An RWKV checkpoint refimpl cannot load (.pth, .safetensors, .npz)."""


class ChatTemplateError(ValueError):
    """A chat template that failed, raised an exception, tried an unsafe operation or exceeded a limit."""


def looks_like(path) -> str | None:
    """The format a file's first bytes say it is ("a GGUF file", "a safetensors file", ...), None if unknown."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return None
    if head[:4] == b"GGUF":
        return "a GGUF file"
    if head[:4] == b"fmgg":                       # uint32 0x67676d66 'ggmf', little-endian
        return "an rwkv.cpp model file (magic 'ggmf')"
    if head[:4] in (b"lmgg", b"tjgg", b"algg"):   # 'ggml', 'ggjt', 'ggla'
        return "a legacy ggml (pre-GGUF) model file"
    if head[:2] == b"PK":
        return "a zip archive (a PyTorch .pth / .bin checkpoint, or a .npz)"
    if head[:1] == b"\x80" and len(head) > 1 and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "a Python pickle (an old PyTorch checkpoint)"
    if len(head) >= 9 and head[8:9] == b"{":
        n = int.from_bytes(head[:8], "little")
        if 2 <= n < 100_000_000:
            return "a safetensors file"
    if head[:6] == b"\x93NUMPY":
        return "a NumPy .npy file"
    stripped = head.lstrip()
    if stripped[:1] in (b"{", b"["):
        try:
            json.loads(Path(path).read_text(encoding="utf-8")[:1_000_000] or "x")
            return "a JSON file"
        except (ValueError, OSError):
            return "a text file (JSON-like)"
    if head and all(32 <= b < 127 or b in (9, 10, 13) for b in head):
        return "a text file"
    return None


def not_this_format(path, expected: str) -> str:
    """"PATH: not EXPECTED (it looks like X)" -- the sentence loaders use for a file of another format."""
    kind = looks_like(path)
    return f"{path}: not {expected}" + (f" (it looks like {kind})" if kind else "")


def read_json(path, error: type = LoadError, *, required: bool = False, expect: type | None = None):
    """The parsed JSON file `path` (None if absent and not required). `error` (a LoadError subclass) for a
    missing required file, one over MAX_JSON_BYTES, one that is not UTF-8 JSON (saying what it looks like), or
    a top level that is not `expect` (dict: an object, list: an array)."""
    path = Path(path)
    if not path.is_file():
        if required:
            raise error(f"{path}: missing", path)
        return None
    if path.stat().st_size > MAX_JSON_BYTES:
        raise error(f"{path}: {path.stat().st_size} bytes; a JSON file here is at most {MAX_JSON_BYTES}", path)
    try:
        v = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise error(not_this_format(path, "valid UTF-8 JSON") + f" ({e})", path) from e
    if expect is not None and not isinstance(v, expect):
        want = {dict: "an object", list: "an array"}.get(expect, expect.__name__)
        raise error(f"{path}: the top level is a JSON {type(v).__name__}; expected {want}", path)
    return v
