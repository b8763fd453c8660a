"""Properties of the element-wise ops (math identities and bounds from the math; no ggml needed)."""
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, strategies as st

import refimpl
from refimpl import GGMLShapeError, QTensor, quantize
from refimpl.ops import abs as ggml_abs, round as ggml_round
from refimpl.ops import (add, add1, add_id, arange, clamp, div, exp, expm1, fill, gelu, gelu_erf, gelu_quick, geglu,
                         geglu_erf, geglu_quick, hardsigmoid, hardswish, leaky_relu, mul, neg, reglu, relu, scale,
                         sgn, sigmoid, silu, silu_back, softplus, sqr, sub, swiglu, swiglu_oai, tanh, tri)
from refimpl.ops.elementwise import gelu_table
from refimpl.rounding import fma32 as _fma
from refimpl.testing import tol

pytestmark = pytest.mark.property

f32 = np.float32
shapes = st.lists(st.integers(1, 9), min_size=1, max_size=4).map(tuple)


@st.composite
def arrays(draw, lo=-10.0, hi=10.0, shp=None):
    shp = shp or draw(shapes)
    return np.random.default_rng(draw(st.integers(0, 2**32 - 1))).uniform(lo, hi, shp).astype(np.float32)


# -- exact identities: both sides are the same f32 operations ----------------------------------------------

@given(arrays())
def test_sign_magnitude_and_relu_identities(x):
    assert np.array_equal(mul(sgn(x), ggml_abs(x)), x)
    assert np.array_equal(add(relu(x), neg(relu(neg(x)))), x)
    assert np.array_equal(hardswish(x), mul(x, hardsigmoid(x)))
    assert np.array_equal(sqr(x), mul(x, x))
    assert np.array_equal(leaky_relu(x, 0.0), relu(x))
    assert np.array_equal(expm1(x), sub(exp(x), np.ones(1, np.float32)))


@given(arrays(), st.integers(1, 4))
def test_binary_ops_tile_b_over_a(x, k):
    b = x[..., : max(1, x.shape[-1] // k)] if x.shape[-1] % max(1, x.shape[-1] // k) == 0 else x[..., :1]
    reps = (1,) * (x.ndim - 1) + (x.shape[-1] // b.shape[-1],)
    for op, f in ((add, np.add), (sub, np.subtract), (mul, np.multiply)):
        assert np.array_equal(op(x, b), f(x, np.tile(b, reps)))
    assert np.array_equal(sub(x, x), np.zeros_like(x))


def test_binary_ops_reject_what_ggml_rejects():
    a = np.ones((4, 6), np.float32)
    with pytest.raises(GGMLShapeError, match="repeat"):
        add(a, np.ones((4, 4), np.float32))             # 6 is not a multiple of 4
    with pytest.raises(GGMLShapeError, match="src1 must be f32"):
        add(a, np.ones((4, 6), np.float16))             # f32 + f16: no ggml-cpu kernel
    with pytest.raises(GGMLShapeError, match="rows"):
        mul(np.ones((6, 4), np.float32).T, a)           # src0 rows strided



def test_an_empty_a_is_an_empty_result_without_tiling_b():
    # ggml_can_repeat accepts b over an empty a (0 % ne == 0) and ggml-cpu computes nothing; tiling b to a's
    # 2^28 empty rows first took 8 s and gigabytes (found by fuzzing the RPC server)
    a = np.zeros((1 << 28, 0), np.float32)
    r = add(a, np.ones((4, 16), np.float32))
    assert r.shape == a.shape and r.dtype == np.float32
@given(arrays(-4, 4))
def test_f16_and_bf16_are_the_f32_result_rounded_once(x):
    h = x.astype(np.float16)
    assert np.array_equal(add(h, h), (h.astype(f32) * 2).astype(np.float16))
    q = quantize(x.reshape(-1, x.shape[-1]), "bf16", method="ref")
    out = div(q, np.full(1, 3, f32))
    assert isinstance(out, QTensor) and out == quantize(np.asarray(q) / f32(3), "bf16", method="ref")


def test_round_is_half_away_from_zero():
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, -0.49999997, 1e8, -0.0], f32)
    assert np.array_equal(ggml_round(x), np.array([1, 2, 3, -1, -3, 0, -0.0, 1e8, -0.0], f32))
    assert np.signbit(ggml_round(x))[[3, 4, 6, 8]].all()


@given(arrays())
def test_glu_forms_agree(x):
    """merged == split == swapped (with the halves exchanged), and = act(x) * g."""
    g = x[..., ::-1].copy()
    both, swapped_both = np.concatenate([x, g], -1), np.concatenate([g, x], -1)
    for op in (reglu, geglu, swiglu, geglu_erf, geglu_quick, swiglu_oai):
        split = op(x, g)
        assert np.array_equal(op(both), split)
        assert np.array_equal(op(swapped_both, swapped=True), split)
    assert np.array_equal(swiglu(x, g), mul(silu(x), g))
    assert np.array_equal(geglu(x, g), mul(gelu(x), g))
    assert np.array_equal(geglu_quick(x, g), mul(gelu_quick(x), g))
    assert np.array_equal(reglu(x, g), mul(relu(x), g))


def test_glu_odd_row_ignores_last_column():
    a = np.arange(7, dtype=f32).reshape(1, 7)
    assert np.array_equal(reglu(a), np.array([[0 * 3, 1 * 4, 2 * 5]], f32))


# -- bounds from the math -------------------------------------------------------------------------------------

@given(arrays(-30, 30))
def test_sigmoid_tanh_softplus_bounds(x):
    s = sigmoid(x)
    assert ((s >= 0) & (s <= 1)).all() and ((tanh(x) >= -1) & (tanh(x) <= 1)).all()
    assert np.array_equal(tanh(-x), -tanh(x))                                    # odd (correctly rounded)
    assert np.allclose(s + sigmoid(-x), 1, **tol("sigmoid", "f32", "symmetry").allclose())
    sp = softplus(x).astype(np.float64)
    exact = np.logaddexp(0, x.astype(np.float64))
    assert (sp >= np.maximum(x, 0)).all()
    assert (np.abs(sp - exact) <= 2 ** -22 * (1 + exact)).all()     # f32 roundings of 1 + e^x, log and e^x


@given(arrays(-9.9, 9.9))
def test_gelu_is_the_formula_and_ggml_cpus_table_within_f16_precision_of_it(x):
    """exact: the formula's f32 steps (a few f32 roundings of the f64 value); ggml numerics: ggml-cpu's table,
    input rounded to f16 (|dx| <= 2^-11 |x|, gelu' <= 1.13) and the output rounded to f16 (2^-11 |y|)."""
    xd = x.astype(np.float64)
    exact = 0.5 * xd * (1 + np.tanh(np.sqrt(2 / np.pi) * xd * (1 + 0.044715 * xd * xd)))
    quick = xd / (1 + np.exp(-1.702 * xd))
    steps = 8 * 2 ** -24                                  # the formula's f32 operations, each rounded once
    assert (np.abs(gelu(x) - exact) <= steps * (np.abs(exact) + np.abs(xd)) + 2 ** -126).all()
    assert (np.abs(gelu_quick(x) - quick) <= steps * (np.abs(quick) + np.abs(xd)) + 2 ** -126).all()
    with refimpl.numerics("ggml"):
        bound = 1.13 * 2 ** -11 * np.abs(xd) + 2 ** -11 * np.abs(exact) + 2 ** -24 + 1e-6 * np.abs(exact)
        assert (np.abs(gelu(x) - exact) <= bound).all()
        assert (np.abs(gelu_quick(x) - quick) <= 1.1 * 2 ** -11 * np.abs(xd) + 2 ** -11 * np.abs(quick)
                + 2 ** -24).all()


def test_ggml_cpus_gelu_f16_is_the_table_and_f32_cuts_at_10():
    h = np.arange(65536, dtype=np.uint16).view(np.float16).reshape(256, 256)
    with refimpl.numerics("ggml"):
        assert np.array_equal(gelu(h).view(np.uint16), gelu_table().reshape(256, 256).view(np.uint16))
        x = np.array([-10.0, -10.5, 10.0, 12.3, -1e5], f32)
        assert np.array_equal(gelu(x), np.array([0, 0, 10.0, 12.3, 0], f32))
        q = gelu_quick(np.array([12.3, 1e5, -1e5], f32))
    assert q[0] == f32(12.296875) and q[1] == np.inf and np.isnan(q[2])       # no passthrough in gelu_quick


@given(arrays(-4, 4))
def test_erf_gelu_silu_silu_back_near_f64(x):
    """a few f32 roundings (2^-24 relative each) of terms no larger than |x|, 1 and the result."""
    from math import erf
    xd = x.astype(np.float64)
    exact = 0.5 * xd * (1 + np.vectorize(erf)(xd / np.sqrt(2)))
    assert (np.abs(gelu_erf(x) - exact) <= 2 ** -21 * (np.abs(xd) + np.abs(exact))).all()
    exact = xd / (1 + np.exp(-xd))
    assert (np.abs(silu(x) - exact) <= 2 ** -21 * np.abs(exact)).all()
    dy = x[..., ::-1].copy().astype(np.float64)
    s = 1 / (1 + np.exp(-xd))
    exact = dy * s * (1 + xd * (1 - s))
    assert (np.abs(silu_back(dy.astype(f32), x) - exact) <= 2 ** -20 * np.abs(dy) * (1 + np.abs(xd))).all()


@given(arrays(-3, 3), st.sampled_from([-1.0, 0.0, 0.25]), st.sampled_from([0.25, 1.0, 2.0]))
def test_clamp_bounds(x, lo, hi):
    c = clamp(x, lo, hi)
    assert ((c >= lo) & (c <= hi)).all()
    inside = (x >= lo) & (x <= hi)
    assert np.array_equal(c[inside], x[inside])


# -- scale's fused multiply-add: one rounding of the exact value ------------------------------------------------

def _round_f32(q: Fraction) -> np.float32:
    """The f32 nearest the rational q (ties to even), found among the neighbours of a first guess."""
    c = np.float32(float(q))
    cand = [np.nextafter(c, f32(-np.inf)), c, np.nextafter(c, f32(np.inf))]
    dist = [abs(Fraction(float(v)) - q) for v in cand]
    best = min(dist)
    picks = [v for v, d in zip(cand, dist) if d == best]
    return min(picks, key=lambda v: int(np.float32(v).view(np.uint32)) & 1)


@given(arrays(-100, 100, (64,)), st.floats(-10, 10, width=32), st.floats(-10, 10, width=32))
def test_scale_bias_is_one_rounding(x, s, b):
    out = scale(x, s, b)
    want = [_round_f32(Fraction(float(v)) * Fraction(float(f32(s))) + Fraction(float(f32(b))))
            if f32(b) != 0 else f32(v) * f32(s) for v in x]
    assert np.array_equal(out, np.array(want, f32))


def test_fma_single_rounding_on_hard_cases():
    # a*b + c where rounding a*b first (or the f64 sum first) is off by one ulp
    a = np.array([1 + 2 ** -12, 1 + 2 ** -23, 3.0], f32)
    b = np.array([1 - 2 ** -12, 1 - 2 ** -23, f32(1 / 3)], f32)
    c = np.array([-1.0, -1.0, -1.0], f32)
    want = [_round_f32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))) for x, y, z in zip(a, b, c)]
    assert np.array_equal(_fma(a, b, c), np.array(want, f32))


# -- fill, tri, arange, add1, add_id ----------------------------------------------------------------------------

@given(shapes, st.floats(-1e6, 1e6, width=32))
def test_fill(shp, c):
    assert (fill(np.zeros(shp, f32), c) == f32(c)).all()
    assert fill(np.zeros(shp, np.float16), c).dtype == np.float16


@given(st.integers(1, 12), st.integers(1, 3))
def test_tri_parts_sum_to_the_matrix(n, batch):
    a = np.random.default_rng(n).uniform(0.5, 1, (batch, n, n)).astype(f32)
    assert np.array_equal(tri(a, 0) + tri(a, 3), a)                      # UPPER_DIAG + LOWER
    assert np.array_equal(tri(a, 1) + tri(a, 2), a)                      # UPPER + LOWER_DIAG
    assert np.array_equal(tri(a, 2), np.tril(a))


@given(st.floats(-100, 100, width=32), st.floats(1 / 64, 5, width=32), st.integers(1, 500))
def test_arange(start, step, n):
    stop = float(f32(start) + f32(n) * f32(step))
    if not f32(stop) > f32(start):
        return
    out = arange(start, stop, step)
    assert len(out) == int(np.ceil((f32(stop) - f32(start)) / f32(step)))
    assert out[0] == f32(start) and (np.diff(out) > 0).all()


@given(arrays())
def test_add1_is_add_of_a_scalar(x):
    assert np.array_equal(add1(x, np.array([0.75], f32)), add(x, np.array([0.75], f32)))


def test_add_id_adds_the_selected_rows():
    rng = np.random.default_rng(0)
    a, b = rng.uniform(-1, 1, (2, 3, 5, 8)).astype(f32), rng.uniform(-1, 1, (4, 8)).astype(f32)
    ids = rng.integers(0, 4, (3, 5)).astype(np.int32)
    assert np.array_equal(add_id(a, b, ids), a + b[ids][None])
    with pytest.raises(GGMLShapeError, match="out of range"):
        add_id(a, b, np.full((3, 5), 4, np.int32))
