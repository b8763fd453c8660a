"""OpCases for the softmax ops (see refimpl/testing/cases/__init__.py).

ggml asserts that soft_max's input and mask are contiguous (and soft_max_ext_back's inputs), so these cases
draw no views for them.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from . import OpCase, cases, named, ne_str
from ._draw import values


def _g():
    from .. import ggml
    return ggml.lib()


def soft_max_case(x, mask=None, scale=1.0, max_bias=0.0, sinks=None, tag=""):
    def build(ctx, a, m, s):
        t = _g().ggml_soft_max_ext(ctx, a, m, scale, max_bias)
        if s is not None:
            _g().ggml_soft_max_add_sinks(t, s)
        return t
    mk = ""
    if mask is not None:
        mk = f",m_prec={'f16' if mask.dtype == np.float16 else 'f32'},m_ne={ne_str(mask)}"
    name = (f"SOFT_MAX(type=f32,ne={ne_str(x)},mask={int(mask is not None)}{mk},sinks={int(sinks is not None)},"
            f"scale={scale},max_bias={max_bias}{tag})")
    return OpCase("soft_max_ext", (x, mask, scale, max_bias, sinks), build=build, tensors=(x, mask, sinks),
                  name=name)


def _mask_values(rng, shp, p_inf):
    m = rng.uniform(-1, 1, shp)
    m[rng.random(shp) < p_inf] = -np.inf
    return m


@cases("soft_max_ext")
@st.composite
def _soft_max_ext(draw):
    n0 = draw(st.sampled_from([1, 2, 7, 8, 9, 16, 31, 33, 64, 100]))   # AVX2 chunks of 8 plus a libm tail
    n1, n2, n3 = draw(st.integers(1, 5)), draw(st.integers(1, 6)), draw(st.integers(1, 3))
    nd = draw(st.integers(2, 4))
    ne_ = [n0, n1, n2, n3][:nd] if nd > 2 else [n0, n1]
    ne_ += [1] * (4 - len(ne_))
    x = values(draw, tuple(reversed(ne_[:nd])), *draw(st.sampled_from([(-1, 1), (-10, 10), (-60, 60)])))
    mask = None
    max_bias = 0.0
    if draw(st.booleans()):
        pad = draw(st.integers(0, 3))
        m2 = draw(st.sampled_from(sorted({1, ne_[2]} | {d for d in range(1, ne_[2] + 1) if ne_[2] % d == 0})))
        m3 = draw(st.sampled_from(sorted({1, ne_[3]})))
        shp = (m3, m2, ne_[1] + pad, n0)
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        m = _mask_values(rng, shp, draw(st.sampled_from([0.0, 0.2, 0.9])))
        if m3 == 1 and draw(st.booleans()):           # fewer NumPy dims, same ggml ne
            m = m[0, 0] if m2 == 1 and draw(st.booleans()) else m[0]
        mask = m.astype(draw(st.sampled_from([np.float16, np.float32])))
        max_bias = draw(st.sampled_from([0.0, 0.0, 3.0, 8.0]))
    scale = draw(st.sampled_from([1.0, 0.1, 0.125, 0.7, 2.0]))
    sinks = None
    if draw(st.booleans()):
        sinks = values(draw, (ne_[2],), -2, 2)
    return soft_max_case(x, mask, scale, max_bias, sinks)


@named("soft_max_ext")
def _soft_max_ext_named():
    """Rows of 1/33/1025, masks with padding rows, f16 and f32 masks broadcast over heads and sequences,
    ALiBi with a non-power-of-2 head count, -inf entries and whole -inf rows (with and without sinks)."""
    rng = np.random.default_rng(7)
    u = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)   # noqa: E731
    out = []
    for n0 in (1, 33, 1025):
        out.append(soft_max_case(u(3, 4, n0)))
    out.append(soft_max_case(u(3, 4, 5, 64), _mask_values(rng, (1, 1, 8, 64), 0.3).astype(np.float16), 0.5, 8.0,
                             tag=",padded_mask"))
    out.append(soft_max_case(u(2, 6, 5, 37), _mask_values(rng, (2, 3, 5, 37), 0.3).astype(np.float32), 0.7, 3.0))
    out.append(soft_max_case(u(1, 5, 7, 33), _mask_values(rng, (1, 1, 7, 33), 0.0).astype(np.float16), 1.0, 3.0,
                             tag=",alibi_5_heads"))
    out.append(soft_max_case(u(2, 4, 4, 16), _mask_values(rng, (1, 1, 7, 16), 0.5).astype(np.float16),
                             0.125, 0.0, u(4)))
    # a causal mask: row i sees columns <= i
    causal = np.triu(np.full((6, 6), -np.inf, np.float32), 1).astype(np.float16)
    out.append(soft_max_case(u(4, 6, 6), causal, 0.125, tag=",causal"))
    # whole rows masked: NaN without sinks (ggml has no guard), zeros with a sink
    m = _mask_values(rng, (3, 40), 0.2).astype(np.float16)
    m[1] = -np.inf
    out.append(soft_max_case(u(2, 3, 40), m, 1.0, tag=",inf_row"))
    out.append(soft_max_case(u(2, 3, 40), m, 1.0, 0.0, u(2), tag=",inf_row"))
    # large logits: exp must not overflow (max subtraction)
    out.append(soft_max_case((u(2, 4, 100) * 80).astype(np.float32), scale=1.0, tag=",large"))
    return out


def _back_case(dy, y, scale):
    return OpCase("soft_max_ext_back", (dy, y, scale, 0.0),
                  build=lambda ctx, a, b: _g().ggml_soft_max_ext_back(ctx, a, b, scale, 0.0),
                  name=f"SOFT_MAX_BACK(type=f32,ne={ne_str(y)},scale={scale},max_bias=0.0)")


def _softmax_rows(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


@cases("soft_max_ext_back")
@st.composite
def _soft_max_ext_back(draw):
    nd = draw(st.integers(1, 4))
    shp = tuple([draw(st.integers(1, 4)) for _ in range(nd - 1)] + [draw(st.integers(1, 100))])
    y = _softmax_rows(values(draw, shp, -5, 5).astype(np.float64))
    dy = values(draw, shp)
    return _back_case(dy, y, draw(st.sampled_from([1.0, 0.125, 0.7, 2.0])))


@named("soft_max_ext_back")
def _soft_max_ext_back_named():
    rng = np.random.default_rng(8)
    out = []
    for shp in ((3, 4, 1), (2, 33), (3, 1025), (2, 3, 4, 64)):
        y = _softmax_rows(rng.uniform(-3, 3, shp))
        out.append(_back_case(rng.uniform(-1, 1, shp).astype(np.float32), y, 0.5))
    return out
