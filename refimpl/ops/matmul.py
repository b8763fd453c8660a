"""mul_mat, mul_mat_id, out_prod: products with any weight type."""
from __future__ import annotations

import numpy as np

from ..qtensor import QTensor, dequantize
from ._core import current_numerics, op
from ._shapes import fail, fmt, ne4

# Rows of a quantized weight dequantized at a time: enough for BLAS to run at speed, small enough that the
# whole matrix is never materialised (a 7B-class weight stays quantized).
TILE_ROWS = 512

# numerics="ggml" emulations, keyed by weight type name; filled by the faithful-numerics work.
FAITHFUL: dict = {}


def _weights_f32(a, i3, i2, lo, hi) -> np.ndarray:
    if isinstance(a, QTensor):
        return dequantize(a[i3, i2, lo:hi] if a.ndim == 4 else a[lo:hi])
    return np.asarray(a[i3, i2, lo:hi] if a.ndim == 4 else a[lo:hi], dtype=np.float32)


@op("mul_mat")
def mul_mat(a, b: np.ndarray, *, numerics: str | None = None) -> np.ndarray:
    """ggml_mul_mat: dot every row of b with every row of a (C^T = A B^T).

    a    ne [k, n, a2, a3]   numpy (a3, a2, n, k)   e.g. a weight (n_out, n_in); any type, QTensor too
    b    ne [k, m, b2, b3]   numpy (b3, b2, m, k)   e.g. activations (n_tokens, n_in); f32/f16
    out  ne [n, m, b2, b3]   numpy (b3, b2, m, n)   f32

        out[..., j, i] = sum_k a[..., i, k] * b[..., j, k]

    a is repeated over b's batch dims (a batch i serves b batches i*r .. i*r+r-1, r = b2 // a2):
    np.repeat, not np.tile. Grouped-query attention relies on it.
    Exact mode: weights dequantized exactly (TILE_ROWS rows at a time, never the whole matrix), products
    summed in f64, rounded once to f32. numerics="ggml": ggml's activation conversion and dot order
    (refimpl/ops/matmul.py FAITHFUL).
    """
    mode = current_numerics(numerics)
    b = np.asarray(b)
    na, nb = ne4(a.shape), ne4(b.shape)
    if na[0] != nb[0] or nb[2] % na[2] or nb[3] % na[3]:
        fail("mul_mat", "need a.ne0 == b.ne0 and b.ne2, b.ne3 multiples of a's", a=a, b=b)
    if b.dtype not in (np.float32, np.float16):
        fail("mul_mat", f"src1 must be f32 or f16, got {b.dtype}", a=a, b=b)
    if mode == "ggml":
        key = a.traits.name if isinstance(a, QTensor) else str(np.asarray(a).dtype)
        if key not in FAITHFUL:
            raise ValueError(f"mul_mat: numerics='ggml' is not available for {key} weights; use 'exact'")
        return FAITHFUL[key](a, b)
    a4 = a.reshape(*ne4(a.shape)[::-1]) if isinstance(a, QTensor) else np.asarray(a).reshape(na[::-1])
    b4 = b.reshape(nb[::-1]).astype(np.float64)
    r2, r3 = nb[2] // na[2], nb[3] // na[3]
    out = np.empty((nb[3], nb[2], nb[1], na[1]), np.float32)
    for i3 in range(na[3]):
        for i2 in range(na[2]):
            bs = b4[i3 * r3:(i3 + 1) * r3, i2 * r2:(i2 + 1) * r2]          # (r3, r2, m, k)
            for lo in range(0, na[1], TILE_ROWS):
                w = _weights_f32(a4, i3, i2, lo, min(lo + TILE_ROWS, na[1])).astype(np.float64)
                out[i3 * r3:(i3 + 1) * r3, i2 * r2:(i2 + 1) * r2, :, lo:lo + w.shape[0]] = bs @ w.T
    nd = max(len(b.shape), 2)
    return out.reshape(out.shape[4 - nd:])
