"""refimpl: the reference implementation of ggml in NumPy.

Shapes are NumPy order; ggml's `ne` is the same list reversed. See docs/ and ../README.md.
"""
from .types import GGMLType, traits, type_traits, as_type
from .errors import LoadError, BertError, TokenizerError, RWKVError
from .qtensor import QTensor, quantize, dequantize
from . import ops
from .ops import *  # noqa: F401,F403  every op as refimpl.<name>
from .ops import backend, numerics

__version__ = "0.1.0"
__all__ = ["GGMLType", "QTensor", "quantize", "dequantize", "traits", "type_traits", "as_type", "gguf", "ops",
           "backend", "numerics", "LoadError", "BertError", "TokenizerError",
           "RWKVError"] + [
               n for n in ops.__all__ if n not in ("OPS", "op", "register")]


_LAZY = ("gguf", "fetch", "sampling", "tokenizer", "tokenizers", "chat", "models", "testing")


def __getattr__(name):
    if name in _LAZY:   # imported on first use: `refimpl.gguf.load(...)`, `refimpl.sampling.Sampler`
        import importlib
        return importlib.import_module(f".{name}", __name__)
    if name == "Sampler":
        from .sampling import Sampler
        return Sampler
    raise AttributeError(f"module 'refimpl' has no attribute {name!r}")
