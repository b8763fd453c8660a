"""OpCases for the element-wise ops (see refimpl/testing/cases/__init__.py)."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from . import OpCase, cases, named, ne_str
from ._draw import maybe_view, ne, shape, values


def _g():
    from .. import ggml
    return ggml.lib()


@st.composite
def _binary(draw, op: str, gfn: str):
    na = ne(draw)
    nb = [n // draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0])) for n in na]  # tiles
    a = maybe_view(draw, values(draw, shape(na)))
    b = values(draw, shape(nb))
    return OpCase(op, (a, b), build=lambda ctx, x, y: getattr(_g(), gfn)(ctx, x, y),
                  name=f"{op.upper()}(type=f32,ne_a={ne_str(a)},ne_b={ne_str(b)})")


@cases("add")
def _add():
    return _binary("add", "ggml_add")


@named("add")
def _add_named():
    rng = np.random.default_rng(0)
    out = []
    for na, nb in [([6], [2]), ([33, 5, 4, 3], [33, 1, 1, 1]), ([1025, 2], [1025, 1]), ([10, 5, 4, 3], [1, 5, 1, 3])]:
        a, b = rng.uniform(-1, 1, shape(na)).astype(np.float32), rng.uniform(-1, 1, shape(nb)).astype(np.float32)
        out.append(OpCase("add", (a, b), build=lambda ctx, x, y: _g().ggml_add(ctx, x, y),
                          name=f"ADD(type=f32,ne_a={ne_str(a)},ne_b={ne_str(b)})"))
    return out
