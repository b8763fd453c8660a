"""The registries of block formats: `dequantizer(t)` and `quantizer(t, *methods)` fill them, each format module
registering its functions on import (refimpl/quants/__init__.py imports them all); `get_quantizer` looks one up."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..types import GGMLType

DEQUANTIZERS: dict[GGMLType, Callable[[np.ndarray], np.ndarray]] = {}
QUANTIZERS: dict[tuple[GGMLType, str], Callable[[np.ndarray], np.ndarray]] = {}
METHODS = ("chunk", "ref", "cpu")


def dequantizer(t: GGMLType):
    def deco(fn):
        DEQUANTIZERS[t] = fn
        return fn
    return deco


def quantizer(t: GGMLType, *methods: str):
    methods = methods or ("ref",)
    for m in methods:
        assert m in METHODS, m

    def deco(fn):
        for m in methods:
            QUANTIZERS[(t, m)] = fn
        return fn
    return deco


def get_quantizer(t: GGMLType, method: str = "chunk"):
    if method not in METHODS:
        raise ValueError(f"unknown quantize method {method!r}; one of {METHODS}")
    fn = QUANTIZERS.get((t, method)) or QUANTIZERS.get((t, "ref"))
    if fn is None:
        raise ValueError(f"no {method!r} quantizer for ggml type {t.name}: ggml quantizes it only with an importance "
                         "matrix, or not at all")
    return fn
