"""OpCases for opt_step_adamw and opt_step_sgd (see refimpl/testing/cases/__init__.py).

ggml updates a (and AdamW's m, v) in place; the graph returns the step's node and, for AdamW, m and v read
back after the step, so refimpl's (a', m', v') is compared whole. ggml asserts that a is a parameter and
reads rows as packed: the inputs are contiguous.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from . import OpCase, cases, named, ne_str
from ._draw import ne, shape


def _g():
    from .. import ggml
    return ggml.lib()


def _param(a):
    """Mark a as trainable. The runner hands inputs to the graph as views of their memory, and
    ggml_set_param asserts a leaf, so the flag (public in ggml.h's struct ggml_tensor) is set directly."""
    g = _g()
    a.contents.flags |= g.GGML_TENSOR_FLAG_PARAM
    return a


def _adamw_build(ctx, a, grad, m, v, p):
    return _g().ggml_opt_step_adamw(ctx, _param(a), grad, m, v, p), m, v


def _sgd_build(ctx, a, grad, p):
    return _g().ggml_opt_step_sgd(ctx, _param(a), grad, p)


def adamw_params(alpha=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, wd=0.01, t=1) -> np.ndarray:
    """ggml_opt's 7 AdamW values for step t: alpha, beta1, beta2, eps, wd and the bias corrections."""
    return np.array([alpha, beta1, beta2, eps, wd, 1 / (1 - beta1 ** t), 1 / (1 - beta2 ** t)], np.float32)


def adamw_case(rng, n, params, tag=""):
    shp = shape(n)
    a, grad, m = (rng.uniform(-1, 1, shp).astype(np.float32) for _ in range(3))
    v = rng.uniform(0, 1, shp).astype(np.float32)                  # a second moment is >= 0
    return OpCase("opt_step_adamw", (a, grad, m, v, params), build=_adamw_build,
                  post=lambda out: tuple(o.reshape(shp) for o in out),        # ggml's read drops size-1 dims
                  name=f"OPT_STEP_ADAMW(type=f32,ne={ne_str(a)}{tag})")


def sgd_case(rng, n, params, tag=""):
    shp = shape(n)
    a, grad = (rng.uniform(-1, 1, shp).astype(np.float32) for _ in range(2))
    return OpCase("opt_step_sgd", (a, grad, params), build=_sgd_build, post=lambda out: out.reshape(shp),
                  name=f"OPT_STEP_SGD(type=f32,ne={ne_str(a)}{tag})")


@cases("opt_step_adamw")
@st.composite
def _opt_step_adamw(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    p = adamw_params(alpha=draw(st.sampled_from([1e-3, 0.1, 1.0])), wd=draw(st.sampled_from([0.0, 0.01, 0.5])),
                     t=draw(st.integers(1, 1000)))
    return adamw_case(rng, ne(draw, max_ne0=200), p)


@named("opt_step_adamw")
def _opt_step_adamw_named():
    rng = np.random.default_rng(41)
    return [adamw_case(rng, n, adamw_params(t=t), f",t={t}") for n, t in (([10, 5, 4, 3], 1), ([1025, 2], 7),
                                                                        ([1, 1], 100))]


@cases("opt_step_sgd")
@st.composite
def _opt_step_sgd(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    p = np.array([draw(st.sampled_from([1e-3, 0.1, 1.0])), draw(st.sampled_from([0.0, 0.01, 0.5]))], np.float32)
    return sgd_case(rng, ne(draw, max_ne0=200), p)


@named("opt_step_sgd")
def _opt_step_sgd_named():
    rng = np.random.default_rng(42)
    return [sgd_case(rng, [10, 5, 4, 3], np.array([0.1, 0.01], np.float32)),
            sgd_case(rng, [1025, 2], np.array([1e-3, 0.0], np.float32))]
