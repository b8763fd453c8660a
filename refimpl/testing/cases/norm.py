"""OpCases for the normalization ops (see refimpl/testing/cases/__init__.py)."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from . import OpCase, cases, named, ne_str
from ._draw import maybe_view, ne, shape, values


def _g():
    from .. import ggml
    return ggml.lib()


EPS = [0.0, 1e-6, 1e-5, 1e-1, 10.0]
ROWS = ([64, 5, 4, 3], [33, 2], [1025, 3], [1, 4])   # rows of 1, 33, 1025 broke other backends


def _row_op(op, ggml_fn, x, eps, tag=""):
    name = f"{op.upper()}(type=f32,ne={ne_str(x)},eps={eps}{tag}{',view' if not x.flags.c_contiguous else ''})"
    return OpCase(op, (x, eps), build=lambda ctx, a: getattr(_g(), ggml_fn)(ctx, a, eps), name=name)


@cases("rms_norm")
@st.composite
def _rms_norm(draw):
    n = ne(draw, max_ne0=128)
    x = maybe_view(draw, values(draw, shape(n), -10, 10))
    return _row_op("rms_norm", "ggml_rms_norm", x, draw(st.sampled_from(EPS)))


@named("rms_norm")
def _rms_norm_named():
    rng = np.random.default_rng(1)
    out = []
    for n in ROWS:
        for eps in (0.0, 1e-6, 10.0):
            out.append(_row_op("rms_norm", "ggml_rms_norm", rng.uniform(-1, 1, shape(n)).astype(np.float32), eps))
    out.append(_row_op("rms_norm", "ggml_rms_norm", np.zeros((3, 64), np.float32), 1e-6, ",zeros"))
    return out


@cases("norm")
@st.composite
def _norm(draw):
    n = ne(draw, max_ne0=128)
    lo, hi = draw(st.sampled_from([(-1, 1), (-10, 10), (99, 101)]))   # (99, 101): mean >> spread
    x = maybe_view(draw, values(draw, shape(n), lo, hi))
    return _row_op("norm", "ggml_norm", x, draw(st.sampled_from(EPS)))


@named("norm")
def _norm_named():
    rng = np.random.default_rng(3)
    out = []
    for n in ROWS:
        for eps in (0.0, 1e-5, 10.0):
            out.append(_row_op("norm", "ggml_norm", rng.uniform(-1, 1, shape(n)).astype(np.float32), eps))
    out.append(_row_op("norm", "ggml_norm", np.full((3, 64), 2.5, np.float32), 1e-5, ",constant"))
    # rows of -0.0: ggml's mean is +0.0 (its sum starts there), so every output is -0.0 - 0.0 = -0.0
    out.append(_row_op("norm", "ggml_norm", np.full((2, 17), -0.0, np.float32), 1e-5, ",negzero"))
    x = rng.uniform(-1, 1, (4, 6, 77)).astype(np.float32)
    out.append(_row_op("norm", "ggml_norm", np.ascontiguousarray(x.transpose(1, 0, 2)).transpose(1, 0, 2), 1e-5))
    # strided rows (a transposed view): ggml-cpu's scalar path sums mean and variance in f32
    for lo in (-1.0, 99.0):
        x = np.ascontiguousarray(rng.uniform(lo, lo + 2, (300, 5)).astype(np.float32)).T
        c = _row_op("norm", "ggml_norm", x, 1e-5, ",transposed")
        c.type = "f32_strided_rows"
        out.append(c)
    return out


@cases("l2_norm")
@st.composite
def _l2_norm(draw):
    n = ne(draw, max_ne0=128)
    x = maybe_view(draw, values(draw, shape(n), -10, 10), transposed=True)   # ggml's kernel takes any layout
    return _row_op("l2_norm", "ggml_l2_norm", x, draw(st.sampled_from([0.0, 1e-12, 1e-6, 1e-1, 10.0])))


@named("l2_norm")
def _l2_norm_named():
    rng = np.random.default_rng(4)
    out = []
    for n in ROWS:
        for eps in (0.0, 1e-12, 10.0):
            out.append(_row_op("l2_norm", "ggml_l2_norm", rng.uniform(-1, 1, shape(n)).astype(np.float32), eps))
    out.append(_row_op("l2_norm", "ggml_l2_norm", np.zeros((2, 64), np.float32), 1e-12, ",zeros"))
    x = rng.uniform(-1, 1, (64, 5)).astype(np.float32)
    out.append(_row_op("l2_norm", "ggml_l2_norm", np.ascontiguousarray(x.T).T, 1e-6, ",transposed"))
    return out


def _group_case(x, n_groups, eps):
    return OpCase("group_norm", (x, n_groups, eps),
                  build=lambda ctx, a: _g().ggml_group_norm(ctx, a, n_groups, eps),
                  name=f"GROUP_NORM(type=f32,ne={ne_str(x)},num_groups={n_groups},eps={eps}"
                       f"{',view' if not x.flags.c_contiguous else ''})")


@cases("group_norm")
@st.composite
def _group_norm(draw):
    n = ne(draw, max_ne0=16, max_ne=8, min_dims=1)
    x = maybe_view(draw, values(draw, shape(n), -10, 10))
    C = n[2] if len(n) > 2 else 1
    groups = draw(st.integers(1, C + 2))
    return _group_case(x, groups, draw(st.sampled_from([0.0, 1e-6, 1e-1, 10.0])))


@named("group_norm")
def _group_norm_named():
    rng = np.random.default_rng(5)
    out = []
    # test-backend-ops' shapes; 10 channels in 4 groups: groups of 3, 3, 3, 1
    for n, groups in (([64, 64, 320, 1], 32), ([9, 9, 1280, 1], 32), ([5, 7, 10, 2], 4), ([33, 1, 6, 3], 6),
                      ([1, 1, 3, 1], 5)):
        x = rng.uniform(-1, 1, shape(n)).astype(np.float32)
        out.append(_group_case(x, groups, 1e-6))
    x = rng.uniform(-1, 1, (2, 8, 6, 5)).astype(np.float32)
    out.append(_group_case(np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3), 3, 1e-5))
    return out


def _rms_back_case(dy, x, eps):
    nc = ",view" if not (dy.flags.c_contiguous and x.flags.c_contiguous) else ""
    return OpCase("rms_norm_back", (dy, x, eps), build=lambda ctx, a, b: _g().ggml_rms_norm_back(ctx, a, b, eps),
                  name=f"RMS_NORM_BACK(type=f32,ne={ne_str(x)},eps={eps}{nc})")


@cases("rms_norm_back")
@st.composite
def _rms_norm_back(draw):
    n = ne(draw, max_ne0=128)
    dy = maybe_view(draw, values(draw, shape(n)))
    x = maybe_view(draw, values(draw, shape(n), -10, 10))
    return _rms_back_case(dy, x, draw(st.sampled_from([1e-6, 1e-5, 1e-1, 10.0])))


@named("rms_norm_back")
def _rms_norm_back_named():
    rng = np.random.default_rng(6)
    out = []
    for n in ROWS:
        for eps in (1e-6, 10.0):
            out.append(_rms_back_case(rng.uniform(-1, 1, shape(n)).astype(np.float32),
                                      rng.uniform(-1, 1, shape(n)).astype(np.float32), eps))
    return out
