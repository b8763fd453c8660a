"""Normalizations over rows (ggml dim 0 = the last NumPy axis)."""
from __future__ import annotations

import numpy as np

from ._core import op
from ._shapes import fail, fmt


@op("rms_norm")
def rms_norm(a: np.ndarray, eps: float) -> np.ndarray:
    """ggml_rms_norm: scale each row (along ne0) to unit root-mean-square.

    a    ne [n, r1, r2, r3]   numpy (r3, r2, r1, n)   f32
    out  same ne, f32

        out = a / sqrt(mean(a**2 over ne0) + eps)

    No gain: llama.cpp multiplies by the norm weight with a separate mul.
    As in ggml-cpu, squares are rounded to f32 and summed in f64, mean and scale are f32.
    """
    a = np.asarray(a)
    if a.dtype != np.float32:
        fail("rms_norm", f"src0 must be f32, got {a.dtype}", a=a)
    n = a.shape[-1]
    ss = np.sum(np.square(a), axis=-1, keepdims=True, dtype=np.float64)
    mean = (ss / n).astype(np.float32)
    scale = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
    return a * scale
