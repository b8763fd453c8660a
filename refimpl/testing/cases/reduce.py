"""OpCases for the reduce ops (see refimpl/testing/cases/__init__.py)."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ...qtensor import QTensor
from . import OpCase, cases, named, ne_str
from ._draw import maybe_view, ne, shape, values
from .elementwise import reshape_bf16, type_tag, values_as, view_tag


def _g():
    from .. import ggml
    return ggml.lib()


def _case(op, x, extra=""):
    t = type_tag(x) if not (isinstance(x, np.ndarray) and x.dtype == np.int32) else "i32"
    return OpCase(op, (x,), build=lambda ctx, a: getattr(_g(), f"ggml_{op}")(ctx, a), type=t,
                  post=reshape_bf16((1,)) if op == "sum" else None,
                  name=f"{op.upper()}(type={t},ne={ne_str(x)}{extra}{view_tag(x)})")


# -- sum (f32/f16/bf16), sum_rows, mean, cumsum (f32) ------------------------------------------------------

@cases("sum")
@st.composite
def _sum(draw):
    t = draw(st.sampled_from(["f32", "f16", "bf16"]))
    x = values_as(values(draw, shape(ne(draw, max_ne0=256))), t)
    return _case("sum", x if isinstance(x, QTensor) else maybe_view(draw, x))


@st.composite
def _rows(draw, op):
    x = values(draw, shape(ne(draw, max_ne0=256)), -10, 10)
    return _case(op, maybe_view(draw, x))


for _op in ("sum_rows", "mean", "cumsum"):
    cases(_op)(lambda _op=_op: _rows(_op))


def _rows_named(op, types=("f32",)):
    rng = np.random.default_rng(12)
    out = []
    for n in ([1], [33, 2], [1025, 3], [64, 5, 4, 3], [4096, 2], [1, 7, 3]):
        for t in types:
            out.append(_case(op, values_as(rng.uniform(-1, 1, shape(n)).astype(np.float32), t)))
    # cancellation and magnitude spread: where the f64 (sum) vs f32 (cumsum) accumulation shows
    x = np.array([[1e8, 1.0, -1e8, 1e-3, 3.0, -2.0, 1e-7, 7e7, -7e7, 0.5]], np.float32)
    out.append(_case(op, x, ",cancel"))
    out.append(_case(op, np.array([[np.inf, 1.0, 2.0], [-np.inf, np.inf, 0.0], [0.0, -0.0, -0.0]], np.float32),
                     ",inf"))
    # rows of -0.0: ggml's sums start at +0.0, so they sum to +0.0 (found by the shrinking value strategies)
    out.append(_case(op, np.full((2, 17), -0.0, np.float32), ",negzero"))
    x = rng.uniform(-1, 1, (3, 4, 40)).astype(np.float32)
    out.append(_case(op, np.ascontiguousarray(x.transpose(1, 0, 2)).transpose(1, 0, 2)))       # permuted rows
    return out


named("sum")(lambda: _rows_named("sum", ("f32", "f16", "bf16")) +
             [_case("sum", values_as(np.full((64, 1000), 10.0, np.float32), "f16"), ",f16_overflow")])
for _op in ("sum_rows", "mean", "cumsum"):
    named(_op)(lambda _op=_op: _rows_named(_op))


# -- argmax -----------------------------------------------------------------------------------------------

@cases("argmax")
@st.composite
def _argmax(draw):
    n0, n1 = draw(st.integers(1, 300)), draw(st.integers(1, 8))
    if draw(st.booleans()):                     # few distinct values: ties in most rows
        seed = draw(st.integers(0, 2**32 - 1))
        x = np.random.default_rng(seed).integers(-3, 4, (n1, n0)).astype(np.float32)
    else:
        x = values(draw, (n1, n0))
    x = x if draw(st.booleans()) else x[0]
    return _case("argmax", maybe_view(draw, x))


@named("argmax")
def _argmax_named():
    rng = np.random.default_rng(13)
    out = [_case("argmax", rng.uniform(-1, 1, shape(n)).astype(np.float32)) for n in ([1], [33, 2], [1025, 3],
                                                                                     [32000, 2])]
    ties = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [-1, -1, -5, -1], [0, -0.0, 0, -0.0]], np.float32)
    out.append(_case("argmax", ties, ",ties"))
    inf = np.array([[-np.inf, -np.inf, -np.inf], [-np.inf, np.inf, np.inf], [1, np.inf, -np.inf]], np.float32)
    out.append(_case("argmax", inf, ",inf"))
    nan = np.array([[5, np.nan, 1, 0], [5, 1, np.nan, np.nan], [np.nan, 3, 9, 9], [np.nan, np.nan, np.nan, np.nan],
                    [1, np.nan, np.nan, 2]], np.float32)
    out.append(_case("argmax", nan, ",nan"))
    x = np.zeros((5, 2 * 40), np.float32)
    x[:, :40] = rng.integers(-2, 3, (5, 40))
    out.append(_case("argmax", x[:, :40], ",rows_padded"))
    return out


# -- count_equal: 1-D / 2-D only (ggml-cpu miscounts 3-D and 4-D inputs, see refimpl.ops.reduce) ---------------

def _ce_case(a, b, extra=""):
    return OpCase("count_equal", (a, b), build=lambda ctx, x, y: _g().ggml_count_equal(ctx, x, y), type="i32",
                  name=f"COUNT_EQUAL(type=i32,ne={ne_str(a)}{extra}{view_tag(a)}{view_tag(b)})")


@cases("count_equal")
@st.composite
def _count_equal(draw):
    n0, n1 = draw(st.integers(1, 200)), draw(st.integers(1, 8))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    k = draw(st.sampled_from([1, 2, 5, 1000]))
    a, b = (rng.integers(0, k, (n1, n0)).astype(np.int32) for _ in range(2))
    if draw(st.booleans()):
        a, b = a[0], b[0]
    return _ce_case(maybe_view(draw, a, transposed=True), maybe_view(draw, b, transposed=True))


@named("count_equal")
def _count_equal_named():
    rng = np.random.default_rng(14)
    out = []
    for n in ([1], [33, 2], [1025, 3], [4096, 7]):
        a = rng.integers(0, 3, shape(n)).astype(np.int32)
        out.append(_ce_case(a, rng.integers(0, 3, shape(n)).astype(np.int32)))
        out.append(_ce_case(a, a.copy(), ",equal"))
    a = rng.integers(0, 2, (40, 6)).astype(np.int32)
    out.append(_ce_case(a.T, np.ascontiguousarray(a.T)))                         # transposed a
    return out
