"""The kernels refimpl.models.bert fuses its op sequences into on the Numba backend, each with the bits of the
sequence it replaces (every f32 rounding, in its order):

    kernels.norm.add_norm_affine   add(norm(add(add(y, bias), res)) * w, b): a sublayer's tail
    kernels.unary.bias_gelu_       gelu(add(y, bias)), in place: the FFN's up projection bias and activation;
                                   add(y, bias) in place (act=False): the Q, K, V projections' biases

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
from refimpl.ops import add, gelu, mul, norm  # noqa: E402
from refimpl.testing import assert_bits_equal  # noqa: E402

refimpl.kernels.load()
from refimpl.kernels.norm import add_norm_affine  # noqa: E402
from refimpl.kernels.unary import bias_gelu_  # noqa: E402


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


@pytest.mark.parametrize("act", [True, False])
@settings(max_examples=examples(40), deadline=None)
@given(rows=st.integers(1, 30), n=st.sampled_from([1, 5, 16, 31, 64, 1536]), seed=st.integers(0, 2 ** 32 - 1),
       sd=st.sampled_from([0.1, 3.0, 30.0]), special=st.booleans())
def test_bias_gelu_has_the_op_sequence_bits(act, rows, n, seed, sd, special):
    rng = np.random.default_rng(seed)
    y = rng.normal(0, sd, (rows, n)).astype(np.float32)
    bias = rng.normal(0, sd, n).astype(np.float32)
    if special:                                           # non-finite values and both sides of gelu's +-10
        edge = np.array([np.inf, -np.inf, np.nan, 10, -10, 9.999999, -9.999999, 0, -0.0, 65520], np.float32)
        y.reshape(-1)[rng.integers(0, y.size, 6)] = rng.choice(edge, 6)
        bias[rng.integers(0, n)] = rng.choice(edge)
    with refimpl.backend("numba"), refimpl.numerics("ggml" if act else "exact"), np.errstate(all="ignore"):
        want = gelu(add(y, bias)) if act else add(y, bias)        # act: ggml-cpu's table, which bias_gelu_ reads
    got = y.copy()
    assert bias_gelu_(got, bias, act=act) is got
    assert_bits_equal(got, want, f"bias_gelu_ ({rows}, {n}) act={act}")


def test_bias_gelu_declines_what_it_does_not_cover():
    y = np.ones((3, 4), np.float32)
    for args in ((y.astype(np.float16), np.ones(4, np.float32)), (y, np.ones(3, np.float32)),
                 (y[:, ::2], np.ones(2, np.float32)), (y, np.ones(4, np.float64))):
        before = np.array(args[0], copy=True)
        assert bias_gelu_(*args) is None
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
