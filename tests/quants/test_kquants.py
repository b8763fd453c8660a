"""K-quants against live ggml, bit for bit: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and Q8_K.

Quantize: hypothesis recipes of adversarial blocks (refimpl.testing.block_rows) and fixed hard cases
through each of ggml's entry points ("chunk" = ggml_quantize_chunk without imatrix, "ref" =
quantize_row_*_ref, "cpu" = the CPU backend's from_float), compared byte for byte. ggml_quantize_chunk
has no Q8_K case, so Q8_K is checked for "ref" and "cpu" only. Dequantize: random bytes (every bit
pattern, inf/nan scales too) and ggml-quantized data, compared bit for bit with ggml's to_float.
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import refimpl
from refimpl import GGMLType as T
from refimpl.testing import BLOCK_KINDS, assert_bits_equal, block_rows, make_block, qtensors

pytestmark = pytest.mark.property

K_TYPES = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
TYPES = K_TYPES + [T.Q8_K]
METHODS = {t: ["chunk", "ref", "cpu"] for t in K_TYPES}
METHODS[T.Q8_K] = ["ref", "cpu"]
CASES = [(t, m) for t in TYPES for m in METHODS[t]]


def _ids(c):
    return f"{c[0].name}-{c[1]}"


def check_quantize(ggml, x, t, method):
    ours = refimpl.quantize(x, t, method=method)
    theirs = ggml.quantize(x, t, method)
    assert_bits_equal(ours.data, theirs.data, f"quantize {t.name} ({method}) of {x.shape}")
    return theirs


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_quantize_matches_ggml(ggml, case):
    t, method = case

    @given(x=block_rows(t))
    def check(x):
        check_quantize(ggml, x, t, method)
    check()


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_dequantize_random_bytes_matches_ggml(ggml, t):
    @given(qt=qtensors(t))
    def check(qt):
        assert_bits_equal(refimpl.dequantize(qt), ggml.dequantize(qt), f"dequantize {t.name} {qt}")
    check()


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_dequantize_quantized_data_matches_ggml(ggml, t):
    @given(x=block_rows(t))
    def check(x):
        qt = ggml.quantize(x, t, "ref")
        assert_bits_equal(refimpl.dequantize(qt), ggml.dequantize(qt),
                          f"dequantize {t.name} of quantized {x.shape}")
    check()


@st.composite
def mixed_sub_blocks(draw, max_rows: int = 3, max_blocks: int = 4):
    """(rows, n_blocks*256) f32 whose 16- or 32-value sub-blocks each have their own kind and scale, so
    one super-block mixes e.g. an f16-overflowing sub-block with subnormal or all-zero ones."""
    rows, nb = draw(st.integers(1, max_rows)), draw(st.integers(1, max_blocks))
    sub = draw(st.sampled_from([16, 32]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = rows * nb * 256 // sub
    parts = [make_block(k, sub, rng, int(e)) for k, e in zip(rng.choice(BLOCK_KINDS, n), rng.integers(-8, 9, n))]
    return np.concatenate(parts).reshape(rows, nb * 256)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_quantize_mixed_sub_blocks_matches_ggml(ggml, t):
    method = METHODS[t][0]

    @given(x=mixed_sub_blocks())
    def check(x):
        qt = check_quantize(ggml, x, t, method)
        assert_bits_equal(refimpl.dequantize(qt), ggml.dequantize(qt), f"dequantize {t.name} of {x.shape}")
    check()


def test_ggml_cpu_q8_K_is_its_ref(ggml):
    """ggml-cpu's quantize_row_q8_K (the activation quantizer of every K-quant mul_mat) writes the same
    bytes as quantize_row_q8_K_ref, so refimpl registers one function for both."""
    @given(x=block_rows(T.Q8_K))
    def check(x):
        assert_bits_equal(ggml.quantize(x, T.Q8_K, "cpu").data, ggml.quantize(x, T.Q8_K, "ref").data,
                          "Q8_K cpu vs ref")
    check()


# -- fixed adversarial inputs ------------------------------------------------------------------------

def _fixed_cases():
    rng = np.random.default_rng(20240611)
    small = rng.standard_normal(256).astype(np.float32) * np.float32(1e-3)
    out = {}
    out["zero"] = np.zeros((2, 512), np.float32)
    out["signed_zero"] = np.where(np.arange(512) % 3 == 0, -0.0, 0.0).astype(np.float32).reshape(1, 512)
    out["neg_zero"] = np.full((1, 256), -0.0, np.float32)
    out["constant"] = np.stack([np.full(256, v, np.float32) for v in (0.7, -3.25, 1e-20, 6e4, -2e9)])
    out["constant_sub_block"] = np.repeat(rng.standard_normal(16).astype(np.float32), 16)[None]
    for pos, v in ((0, 1e4), (37, -1e4), (255, 3e7), (128, -1e12)):
        o = small.copy()
        o[pos] = v
        out[f"outlier_{pos}_{v:g}"] = o[None]
    sign = rng.choice([-1, 1], (3, 256))
    out["f16_overflow"] = (sign * 10.0 ** rng.uniform(4.8, 8, (3, 256))).astype(np.float32)
    out["f16_overflow_positive"] = (10.0 ** rng.uniform(4.8, 8, (1, 256))).astype(np.float32)
    out["near_f32_max"] = (rng.choice([-1, 1], (2, 256)) * rng.uniform(1e37, 3.4e38, (2, 256))).astype(np.float32)
    out["subnormal"] = (rng.standard_normal((2, 256)) * 10.0 ** rng.uniform(-45, -38, (2, 256))).astype(np.float32)
    out["min_subnormal"] = np.where(rng.random((1, 256)) < 0.5, -1, 1).astype(np.float32) * np.float32(1.4e-45)
    out["tiny_normal"] = (rng.standard_normal((1, 256)) * 1e-37).astype(np.float32)
    out["below_group_eps"] = (rng.standard_normal((1, 256)) * 1e-16).astype(np.float32)
    out["first_argmax_tie"] = np.tile(np.array([1.5, -2.0, 2.0, -2.0], np.float32), 64)[None]
    out["first_argmax_tie_neg"] = np.tile(np.array([-2.0, 2.0, 0.25, 1.0], np.float32), 64)[None]
    out["ties"] = (rng.integers(-64, 65, (2, 256)) * 0.5).astype(np.float32)
    out["ramp"] = np.linspace(-1, 1, 512, dtype=np.float32)[None]
    out["positive_ramp"] = np.linspace(1, 2, 256, dtype=np.float32)[None]
    for name, v in (("inf", np.inf), ("neg_inf", -np.inf), ("nan", np.nan)):   # C's behaviour, not a contract
        o = rng.standard_normal((2, 256)).astype(np.float32)
        o[0, [3, 200]] = v
        o[1, 0] = v                          # at element 0: make_qkx2_quants starts its min/max there
        out[name] = o
    kinds = rng.choice(BLOCK_KINDS, 1025)
    out["rows_1025"] = np.stack([make_block(k, 256, rng, int(rng.integers(-8, 9))) for k in kinds])
    return out


FIXED = _fixed_cases()


@pytest.mark.parametrize("name", sorted(FIXED))
@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_fixed_inputs_match_ggml(ggml, case, name):
    t, method = case
    qt = check_quantize(ggml, FIXED[name], t, method)
    assert_bits_equal(refimpl.dequantize(qt), ggml.dequantize(qt), f"dequantize {t.name} of {name}")


def test_q8_K_has_no_chunk_quantizer_in_ggml(ggml):
    """Why Q8_K registers only "ref" and "cpu": ggml_quantize_chunk has no Q8_K case."""
    with pytest.raises(ValueError):
        ggml.quantize(np.ones((1, 256), np.float32), T.Q8_K, "chunk")
    from refimpl.quants import QUANTIZERS
    assert (T.Q8_K, "chunk") not in QUANTIZERS


def test_q8_K_scale_sign_and_bsums():
    """Q8_K facts the dot products rely on: the largest-magnitude value becomes -127 (so d < 0 when it
    is positive), and bsums are the int sums of qs over each 16 values."""
    x = np.linspace(-1, 2, 256, dtype=np.float32)[None]
    raw = refimpl.quantize(x, T.Q8_K, method="ref").data.reshape(-1)
    d = raw[0:4].view("<f4")[0]
    qs = raw[4:260].view(np.int8)
    bsums = raw[260:292].view("<i2")
    assert d < 0 and qs[-1] == -127
    np.testing.assert_array_equal(bsums, qs.astype(np.int32).reshape(16, 16).sum(1))
