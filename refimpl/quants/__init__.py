"""Block formats of every ggml type: dequantizers and ggml's reference quantizers, in NumPy.

Each format module registers functions that work on a whole array of blocks at once:

    dequantizer:  (n_blocks, type_size) uint8   ->  (n_blocks, blck_size) float32
    quantizer:    (n_blocks, blck_size) float32 ->  (n_blocks, type_size) uint8

Quantizers are registered per *method*, because ggml has up to three entry points that do not always
agree (`../docs/types.md` lists where they differ):

    "chunk"  `ggml_quantize_chunk` without an importance matrix (what llama-quantize writes) -- the default
    "ref"    `quantize_row_*_ref`, the type traits' `from_float_ref` (file conversion)
    "cpu"    the CPU backend's `from_float` on x86 with AVX2: activations in `mul_mat`, `cpy`/`set_rows`

A method that is not registered for a type falls back to "ref" (the three agree for that type).
"""
from __future__ import annotations

from ._common import CHUNK  # noqa: F401  (elements per step of a dequantizer)
from .registry import DEQUANTIZERS, METHODS, QUANTIZERS, dequantizer, get_quantizer, quantizer  # noqa: F401

# Importing the format modules fills the registries.
from . import floats, legacy, kquants, ternary, fp4, iq, iq_search  # noqa: E402,F401
