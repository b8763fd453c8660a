"""OpCases for the normalization ops (see refimpl/testing/cases/__init__.py)."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from . import OpCase, cases, named, ne_str
from ._draw import maybe_view, ne, shape, values


def _g():
    from .. import ggml
    return ggml.lib()


@cases("rms_norm")
@st.composite
def _rms_norm(draw):
    n = ne(draw, max_ne0=128)
    x = maybe_view(draw, values(draw, shape(n), -10, 10))
    eps = draw(st.sampled_from([0.0, 1e-6, 1e-5, 1e-1, 10.0]))
    return OpCase("rms_norm", (x, eps), build=lambda ctx, a: _g().ggml_rms_norm(ctx, a, eps),
                  name=f"RMS_NORM(type=f32,ne={ne_str(x)},eps={eps})")


@named("rms_norm")
def _rms_norm_named():
    rng = np.random.default_rng(1)
    out = []
    for n in ([64, 5, 4, 3], [33, 2], [1025, 3], [1, 4]):
        for eps in (0.0, 1e-6, 10.0):
            x = rng.uniform(-1, 1, shape(n)).astype(np.float32)
            out.append(OpCase("rms_norm", (x, eps), build=lambda ctx, a, eps=eps: _g().ggml_rms_norm(ctx, a, eps),
                              name=f"RMS_NORM(type=f32,ne={ne_str(x)},eps={eps})"))
    z = np.zeros((3, 64), np.float32)
    out.append(OpCase("rms_norm", (z, 1e-6), build=lambda ctx, a: _g().ggml_rms_norm(ctx, a, 1e-6),
                      name="RMS_NORM(type=f32,ne=[64,3],eps=1e-06,zeros)"))
    return out
