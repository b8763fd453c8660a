"""Data movement: get_rows, cpy, concat, repeat, permute, views, padding, ..."""
from __future__ import annotations

import numpy as np

from ..qtensor import QTensor, dequantize
from ._core import op
from ._shapes import fail, fmt, ne4


@op("get_rows")
def get_rows(a, rows: np.ndarray) -> np.ndarray:
    """ggml_get_rows: gather rows of a by index, dequantized to f32.

    a     ne [E, R, n2, n3]   numpy (n3, n2, R, E)   any type (only the selected QTensor rows are dequantized)
    rows  ne [n, n2, n3]      numpy (n3, n2, n)      i32, 0 <= rows < R
    out   ne [E, n, n2, n3]   numpy (n3, n2, n, E)   f32 (i32 if a is i32)

        out[i3, i2, i, :] = a[i3, i2, rows[i3, i2, i], :]
    """
    if not isinstance(a, QTensor):
        a = np.asarray(a)
    rows = np.asarray(rows)
    if rows.dtype != np.int32:
        fail("get_rows", f"indices must be i32, got {rows.dtype}", a=a, rows=rows)
    na, nr = ne4(a.shape), ne4(rows.shape)
    if na[2] != nr[1] or na[3] != nr[2] or nr[3] != 1:
        fail("get_rows", "rows must be ne [n, a.ne2, a.ne3]", a=a, rows=rows)
    R = na[1]
    if rows.size and (rows.min() < 0 or rows.max() >= R):
        fail("get_rows", f"row index out of range [0, {R})", a=a, rows=rows)
    r3 = rows.reshape(na[3], na[2], nr[0])
    i3 = np.arange(na[3])[:, None, None]
    i2 = np.arange(na[2])[None, :, None]
    out_shape = tuple(reversed([na[0], nr[0], nr[1], nr[2]]))[4 - max(rows.ndim + 1, 1):]
    if isinstance(a, QTensor):
        d4 = a.data.reshape(na[3], na[2], R, a.data.shape[-1])
        sel = QTensor(a.type, d4[i3, i2, r3], (na[3], na[2], nr[0], na[0]))
        return dequantize(sel).reshape(out_shape)
    sel = a.reshape(na[3], na[2], R, na[0])[i3, i2, r3]
    return sel.astype(np.int32 if a.dtype == np.int32 else np.float32).reshape(out_shape)
