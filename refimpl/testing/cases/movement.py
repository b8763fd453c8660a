"""OpCases for the data-movement ops (see refimpl/testing/cases/__init__.py)."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ...types import type_traits
from ..strategies import tensors
from . import OpCase, cases, named, ne_str
from ._draw import values


def _g():
    from .. import ggml
    return ggml.lib()


# every type get_rows accepts as a source in ggml-cpu (all block types, f32/f16/bf16/i32)
GET_ROWS_TYPES = [t for t in type_traits if t.name not in ("I8", "I16", "I64", "F64", "Q8_1", "Q8_K")]


@cases("get_rows")
@st.composite
def _get_rows(draw):
    t = draw(st.sampled_from(GET_ROWS_TYPES))
    a = draw(tensors(types=[t], min_dims=2) if False else tensors(types=[t], max_dims=4))
    if a.ndim < 2:
        a = a.reshape(1, -1) if not hasattr(a, "traits") else a.reshape(1, a.shape[-1])
    sh = a.shape
    R = sh[-2]
    n = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**32 - 1))
    rows = np.random.default_rng(seed).integers(0, R, sh[:-2] + (n,)).astype(np.int32)
    name = f"GET_ROWS(type={type_traits[t].name.lower()},ne_a={ne_str(a)},ne_rows={ne_str(rows)})"
    return OpCase("get_rows", (a, rows), build=lambda ctx, x, r: _g().ggml_get_rows(ctx, x, r),
                  type=type_traits[t].name.lower(), name=name)
