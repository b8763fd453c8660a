"""Element-wise ops: binary ops with ggml's tiling broadcast, unary ops, GLU ops, scale, clamp, ..."""
from __future__ import annotations

import numpy as np

from ._core import op
from ._shapes import fail, fmt, tile_to


def _f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def _binary(name, a, b, fn):
    a = np.asarray(a)
    if a.dtype not in (np.float32, np.float16):
        fail(name, f"src0 must be f32 or f16, got {a.dtype}", a=a)
    bt = tile_to(name, a, b)
    with np.errstate(all="ignore"):
        return fn(a.astype(np.float32), bt.astype(np.float32)).astype(a.dtype)


@op("add")
def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_add: a + b, b tiled over a (every ne of a a multiple of b's).

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32/f16
    b    ne [m0, m1, m2, m3]   with n_i % m_i == 0       f32/f16
    out  a's shape and type;   out[i] = a[i] + b[i mod ne(b)]   (np.tile, not NumPy broadcasting)

    Computed in f32, rounded once to a's type.
    """
    return _binary("add", a, b, np.add)
