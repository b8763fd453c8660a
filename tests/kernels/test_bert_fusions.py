"""The kernels refimpl.models.bert fuses its op sequences into on the Numba backend, each with the bits of the
sequence it replaces (every f32 rounding, in its order):

    kernels.norm.add_norm_affine   add(norm(add(add(y, bias), res)) * w, b): a sublayer's tail
    kernels.unary.add_bias_        add(y, bias) in place: the projections' biases (mul_mat_add); gelu=True:
                                   gelu(add(y, bias)) in place, the formula (mul_mat_add_gelu)

Drawn shapes, optional operands, non-finite values and edge values; and the model, which runs them in exact and
fast numerics without a capture, gives exactly the states of its op path in exact numerics.
"""
import numpy as np
import pytest

pytest.importorskip("numba", reason="numba is not installed: refimpl.kernels is Numba code")

from hypothesis import given, settings, strategies as st  # noqa: E402
from tests._profiles import examples  # noqa: E402

import refimpl  # noqa: E402
import refimpl.kernels  # noqa: E402
from refimpl.ops import add, gelu, mul, mul_mat, mul_mat_add_gelu, norm  # noqa: E402
from refimpl.testing import assert_bits_equal  # noqa: E402

refimpl.kernels.load()
from refimpl.kernels.norm import add_norm_affine  # noqa: E402
from refimpl.kernels.unary import add_bias_  # noqa: E402


pytestmark = pytest.mark.equivalence

def op_sequence(y, bias, res, w, b, eps):
    with refimpl.backend("numba"), np.errstate(all="ignore"):
        t = y if bias is None else add(y, bias)
        t = t if res is None else add(t, res)
        return add(mul(norm(t, eps), w), b)


@st.composite
def tails(draw):
    rows, n = draw(st.integers(1, 40)), draw(st.sampled_from([1, 2, 7, 32, 384, 1000]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    sd = draw(st.sampled_from([1e-3, 1.0, 1e3]))
    y = rng.normal(0, sd, (rows, n)).astype(np.float32)
    if draw(st.booleans()):
        y.reshape(-1)[rng.integers(0, y.size, 3)] = rng.choice(np.array([np.inf, -np.inf, np.nan], np.float32), 3)
    if draw(st.booleans()):
        y[rng.integers(0, rows)] = np.float32(2.5)                  # a constant row: variance 0
    bias = rng.normal(0, 1, n).astype(np.float32) if draw(st.booleans()) else None
    res = rng.normal(0, sd, (rows, n)).astype(np.float32) if draw(st.booleans()) else None
    w = (1 + 0.3 * rng.normal(0, 1, n)).astype(np.float32)
    b = rng.normal(0, 0.1, n).astype(np.float32)
    eps = draw(st.sampled_from([0.0, 1e-12, 1e-5, 1.0]))
    return y, bias, res, w, b, eps


@settings(max_examples=examples(80), deadline=None)
@given(case=tails())
def test_add_norm_affine_has_the_op_sequence_bits(case):
    got = add_norm_affine(*case)
    assert got is not None
    assert_bits_equal(got, op_sequence(*case), f"add_norm_affine {case[0].shape} bias {case[1] is not None} "
                      f"res {case[2] is not None} eps {case[5]}")


def test_add_norm_affine_declines_what_it_does_not_cover():
    y = np.ones((3, 4), np.float32)
    v = np.ones(4, np.float32)
    assert add_norm_affine(y.astype(np.float16), v, y, v, v, 1e-5) is None
    assert add_norm_affine(y, v[:3], y, v, v, 1e-5) is None
    assert add_norm_affine(y, v, y[:, ::2], v, v, 1e-5) is None
    assert add_norm_affine(y, v, y.T.copy(), v, v, 1e-5) is None
    assert add_norm_affine(y, v, y, None, v, 1e-5) is None
    assert add_norm_affine(y, v, y, v, v, -1.0) is None


@pytest.mark.parametrize("numerics", ["exact", "ggml"])
@settings(max_examples=examples(40), deadline=None)
@given(rows=st.integers(1, 30), n=st.sampled_from([1, 5, 16, 31, 64, 1536]), seed=st.integers(0, 2 ** 32 - 1),
       sd=st.sampled_from([0.1, 3.0, 30.0]), special=st.booleans())
def test_add_bias_and_mul_mat_add_gelu_have_the_op_sequence_bits(numerics, rows, n, seed, sd, special):
    rng = np.random.default_rng(seed)
    y = rng.normal(0, sd, (rows, n)).astype(np.float32)
    bias = rng.normal(0, sd, n).astype(np.float32)
    if special:                                           # non-finite values and both sides of gelu's +-10
        edge = np.array([np.inf, -np.inf, np.nan, 10, -10, 9.999999, -9.999999, 0, -0.0, 65520], np.float32)
        y.reshape(-1)[rng.integers(0, y.size, 6)] = rng.choice(edge, 6)
        bias[rng.integers(0, n)] = rng.choice(edge)
    with refimpl.backend("numpy"), np.errstate(all="ignore"):
        want = add(y, bias)
        want_gelu = gelu(want)
    got = y.copy()
    assert add_bias_(got, bias) is got
    assert_bits_equal(got, want, f"add_bias_ ({rows}, {n})")
    got = y.copy()
    assert add_bias_(got, bias, gelu=True) is got
    assert_bits_equal(got, want_gelu, f"add_bias_ ({rows}, {n}) gelu")
    # the fused op (the product, the bias in place, the profile's gelu kernel) against the op sequence in NumPy
    w = rng.normal(0, 1, (n, 32)).astype(np.float32)
    xin = rng.normal(0, 1, (rows, 32)).astype(np.float32)
    with refimpl.numerics(numerics), np.errstate(all="ignore"):
        with refimpl.backend("numba"):
            prod = mul_mat(w, xin)
            got = mul_mat_add_gelu(w, xin, bias)
        with refimpl.backend("numpy"):
            want = gelu(add(prod, bias))
    assert_bits_equal(got, want, f"mul_mat_add_gelu ({rows}, {n}) {numerics}")


def test_add_bias_declines_what_it_does_not_cover():
    y = np.ones((3, 4), np.float32)
    for args in ((y.astype(np.float16), np.ones(4, np.float32)), (y, np.ones(3, np.float32)),
                 (y[:, ::2], np.ones(2, np.float32)), (y, np.ones(4, np.float64))):
        before = np.array(args[0], copy=True)
        assert add_bias_(*args) is None
        assert np.array_equal(args[0], before)


def test_bert_exact_states_are_the_op_path_bits(tmp_path):
    """The model's fused tails (no capture) against its op path (a capture) in exact numerics: the same bits."""
    pytest.importorskip("safetensors", reason="the safetensors package reads Hugging Face weights")
    from refimpl.models import bert
    from tests.models.bert_tiny import write_tiny_bert_hf
    model = bert.load(write_tiny_bert_hf(tmp_path / "tiny"))
    ids = [[4] + list(range(7, 7 + n)) + [5] for n in (3, 17, 9)]
    with refimpl.backend("numba"), refimpl.numerics("exact"):
        fused = bert.forward(model, ids)
        ops_path = bert.forward(model, ids, capture={})
    for i, (a, b) in enumerate(zip(fused, ops_path)):
        assert_bits_equal(a, b, f"sequence {i}")
