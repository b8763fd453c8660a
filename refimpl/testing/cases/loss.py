"""OpCases for cross_entropy_loss and cross_entropy_loss_back (see refimpl/testing/cases/__init__.py).

ggml-cpu's cross_entropy_loss reads row r at r*nb1 whatever the higher dims' strides (its kernel's TODO), so the
only views drawn are 2-D row-step views, which it reads right; cross_entropy_loss_back asserts contiguous inputs.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from . import OpCase, cases, named, ne_str
from ._draw import ne, shape, values


def _g():
    from .. import ggml
    return ggml.lib()


def _labels(rng, shp, kind):
    if kind == "one_hot":
        y = np.zeros(shp, np.float32)
        idx = rng.integers(0, shp[-1], shp[:-1])
        np.put_along_axis(y, idx[..., None], 1.0, axis=-1)
        return y
    if kind == "soft":
        e = np.exp(rng.uniform(-3, 3, shp))
        return (e / e.sum(-1, keepdims=True)).astype(np.float32)
    return rng.uniform(0, 1, shp).astype(np.float32)


def _row_step(x: np.ndarray) -> np.ndarray:
    """x as 2-D (rows, n0) with rows 2*n0 apart in a larger buffer: a view ggml's kernel reads right."""
    n0 = x.shape[-1]
    big = np.zeros((x.size // n0, 2 * n0), np.float32)
    big[:, :n0] = x.reshape(-1, n0)
    return big[:, :n0]


def loss_case(logits, labels, tag=""):
    nc = ",view" if not (logits.flags.c_contiguous and labels.flags.c_contiguous) else ""
    return OpCase("cross_entropy_loss", (logits, labels),
                  build=lambda ctx, a, b: _g().ggml_cross_entropy_loss(ctx, a, b),
                  name=f"CROSS_ENTROPY_LOSS(type=f32,ne={ne_str(logits)}{nc}{tag})")


def loss_back_case(grad, logits, labels, tag=""):
    return OpCase("cross_entropy_loss_back", (grad, logits, labels),
                  build=lambda ctx, a, b, c: _g().ggml_cross_entropy_loss_back(ctx, a, b, c),
                  name=f"CROSS_ENTROPY_LOSS_BACK(type=f32,ne={ne_str(logits)},grad={float(grad[0]):g}{tag})")


@cases("cross_entropy_loss")
@st.composite
def _cross_entropy_loss(draw):
    n = ne(draw, max_ne0=200)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = values(draw, shape(n), *draw(st.sampled_from([(-1, 1), (-10, 10), (-80, 80)])))
    y = _labels(rng, shape(n), draw(st.sampled_from(["one_hot", "soft", "uniform"])))
    if draw(st.booleans()):
        x, y = x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1])
        if draw(st.booleans()):
            x = _row_step(x)
        if draw(st.booleans()):
            y = _row_step(y)
    return loss_case(x, y)


@named("cross_entropy_loss")
def _cross_entropy_loss_named():
    rng = np.random.default_rng(31)
    out = []
    for n in ([1, 4], [33, 3], [1025, 2], [32000, 2], [10, 5, 4, 3]):
        out.append(loss_case(rng.uniform(-1, 1, shape(n)).astype(np.float32), _labels(rng, shape(n), "soft")))
    x = rng.uniform(-30, 30, (8, 100)).astype(np.float32)
    out.append(loss_case(x, _labels(rng, x.shape, "one_hot"), ",one_hot"))
    out.append(loss_case(_row_step(x), _row_step(_labels(rng, x.shape, "soft"))))
    return out


@cases("cross_entropy_loss_back")
@st.composite
def _cross_entropy_loss_back(draw):
    n = ne(draw, max_ne0=200)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = values(draw, shape(n), *draw(st.sampled_from([(-1, 1), (-10, 10), (-80, 80)])))
    y = _labels(rng, shape(n), draw(st.sampled_from(["one_hot", "soft", "uniform"])))
    grad = np.array([draw(st.sampled_from([1.0, 0.5, -2.0, 1e-3]))], np.float32)
    return loss_back_case(grad, x, y)


@named("cross_entropy_loss_back")
def _cross_entropy_loss_back_named():
    rng = np.random.default_rng(32)
    out = []
    for n in ([1, 4], [33, 3], [1025, 2], [10, 5, 4, 3]):
        out.append(loss_back_case(np.array([1.0], np.float32), rng.uniform(-1, 1, shape(n)).astype(np.float32),
                                  _labels(rng, shape(n), "soft")))
    x = rng.uniform(-30, 30, (8, 100)).astype(np.float32)
    out.append(loss_back_case(np.array([0.25], np.float32), x, _labels(rng, x.shape, "one_hot"), ",one_hot"))
    return out
