"""Block formats against live ggml, bit for bit: F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q1_0,
MXFP4, NVFP4, TQ1_0, TQ2_0 (the K-quants and IQ formats have their own files).

Quantize: hypothesis recipes of adversarial blocks (refimpl.testing.block_rows) through each of ggml's
entry points ("chunk" = ggml_quantize_chunk, "ref" = quantize_row_*_ref, "cpu" = the x86 CPU backend's
from_float), compared byte for byte. Dequantize: random bytes (every bit pattern, inf/nan scales too)
compared bit for bit with ggml's to_float.
"""
import numpy as np
import pytest
from hypothesis import given

import refimpl
from refimpl import GGMLType as T
from refimpl.testing import BLOCK_KINDS, assert_bits_equal, block_rows, make_block, qtensors

pytestmark = pytest.mark.property

TYPES = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q8_1, T.Q1_0, T.MXFP4, T.NVFP4,
         T.TQ1_0, T.TQ2_0]
# the entry points ggml has for each type (chunk: no Q8_1; cpu: the types with a CPU from_float)
METHODS = {t: ["chunk", "ref"] for t in TYPES}
METHODS[T.Q8_1] = ["ref", "cpu"]
for t in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q1_0, T.MXFP4, T.NVFP4, T.TQ1_0, T.TQ2_0):
    METHODS[t].append("cpu")
CASES = [(t, m) for t in TYPES for m in METHODS[t]]


def _ids(c):
    return f"{c[0].name}-{c[1]}"


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_quantize_matches_ggml(ggml, case):
    t, method = case

    @given(x=block_rows(t))
    def check(x):
        ours = refimpl.quantize(x, t, method=method)
        theirs = ggml.quantize(x, t, method)
        assert_bits_equal(ours.data, theirs.data, f"quantize {t.name} ({method}) of {x.shape}")
    check()


@pytest.mark.parametrize("t", [t for t in TYPES if t != T.Q8_1], ids=lambda t: t.name)
def test_dequantize_matches_ggml(ggml, t):
    @given(qt=qtensors(t))
    def check(qt):
        assert_bits_equal(refimpl.dequantize(qt), ggml.dequantize(qt), f"dequantize {t.name} {qt}")
    check()


@given(qt=qtensors(T.Q8_1))
def test_q8_1_dequantize_is_q8_0_of_its_d_and_qs(ggml, qt):
    """ggml has no Q8_1 to_float; its dot products read a Q8_1 block as d * qs, which is exactly a Q8_0
    block with the same d and qs -- so ggml's Q8_0 dequantizer is the golden value."""
    b = qt.data.reshape(-1, 36)
    as_q8_0 = np.concatenate([b[:, 0:2], b[:, 4:36]], axis=1).reshape(qt.shape[0], -1)
    golden = ggml.dequantize(refimpl.QTensor(T.Q8_0, as_q8_0, qt.shape))
    assert_bits_equal(refimpl.dequantize(qt), golden, "Q8_1 values")


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_every_block_kind_and_many_rows(ggml, case):
    """Each adversarial block kind at several magnitudes, 1025 rows of it, and ±0 / subnormal edges."""
    t, method = case
    blck = refimpl.traits(t).blck_size
    rng = np.random.default_rng(int(t))
    rows = [make_block(k, max(blck, 32) * 2, rng, e) for k in BLOCK_KINDS for e in (-30, -6, 0, 4, 30)
            if np.isfinite(np.float32(10.0) ** e)]
    x = np.stack(rows)
    x = np.concatenate([x, np.repeat(x[:1], 1025 - len(x), axis=0)]) if len(x) < 1025 else x
    x[-1] = np.float32(-0.0)
    x[-2, :] = np.float32(1e-45)
    x[-3, ::2] = np.float32(np.finfo(np.float32).max)
    ours = refimpl.quantize(x, t, method=method)
    theirs = ggml.quantize(x, t, method)
    assert_bits_equal(ours.data, theirs.data, f"quantize {t.name} ({method})")
    if t != T.Q8_1:
        assert_bits_equal(refimpl.dequantize(ours), ggml.dequantize(theirs), f"dequantize {t.name}")


@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4, T.NVFP4, T.TQ2_0],
                         ids=lambda t: t.name)
def test_roundtrip_error_bound(t):
    """|x - deq(q(x))| is at most one quantization step of the block (a bound from the format itself)."""
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    y = refimpl.dequantize(refimpl.quantize(x, t))
    blk = refimpl.traits(t).blck_size
    amax = np.abs(x).reshape(64, -1, blk).max(axis=2, keepdims=True)
    step = {T.Q4_0: 2 / 15, T.Q4_1: 2 / 15, T.Q5_0: 2 / 31, T.Q5_1: 2 / 31, T.Q8_0: 1 / 127,
            T.MXFP4: 1 / 2, T.NVFP4: 1 / 3, T.TQ2_0: 1.0}[t]
    err = np.abs(x - y).reshape(64, -1, blk)
    assert np.all(err <= amax * step * 1.01)
