"""get_rows with Numba: the selected rows of a quantized table, decoded by the Numba decoders.

Versions:
    get_rows  the selected rows' blocks gathered (a byte copy), then decoded in threads by
              `quants.dequantize_into` (the bits of refimpl.dequantize)
Only QTensor sources take this path (a row gather of an ndarray is a NumPy copy already); everything the
reference rejects, or computes from ndarrays, runs the reference.
"""
from __future__ import annotations

import numpy as np

from ..ops import movement as ref_mv
from ..dispatch import register
from ..shapes import ne4
from ..qtensor import QTensor
from ..types import traits
from . import quants


def _covered(a, rows) -> bool:
    if not isinstance(a, QTensor) or a.type not in quants.DECODABLE or a.type in ref_mv.GET_ROWS_BAD:
        return False
    if not isinstance(rows, np.ndarray) or rows.dtype != np.int32 or a.ndim > 4 or rows.ndim > 3:
        return False
    na, nr = ne4(a.shape), ne4(rows.shape)
    if na[2] != nr[1] or na[3] != nr[2] or nr[3] != 1 or min(na) < 1:
        return False
    return rows.size == 0 or (rows.min() >= 0 and rows.max() < na[1])


@register("get_rows", backend="numba")
def get_rows(a, rows):
    """ggml_get_rows (see refimpl.ops.movement.get_rows): quantized rows decoded in Numba."""
    rows = np.asarray(rows)
    if not _covered(a, rows):
        return ref_mv.get_rows.reference(a, rows)
    tr = traits(a.type)
    na, nr = ne4(a.shape), ne4(rows.shape)
    d4 = a.data.reshape(na[3], na[2], na[1], a.data.shape[-1])
    sel = d4[np.arange(na[3])[:, None, None], np.arange(na[2])[None, :, None], rows.reshape(na[3], na[2], nr[0])]
    src = np.ascontiguousarray(sel).reshape(-1, tr.type_size)               # the selected rows' blocks
    out = quants.dequantize_into(a.type, src, np.empty((src.shape[0], tr.blck_size), np.float32))
    out_shape = tuple(reversed([na[0], nr[0], nr[1], nr[2]]))[4 - max(rows.ndim + 1, 1):]
    return out.reshape(out_shape)
