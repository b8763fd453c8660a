"""IQ formats against the live ggml: the stored codebooks, every dequantizer, the IQ4 quantizers.

Dequantizers: random bytes (every bit pattern, NaN/inf scales included) must give ggml's exact bits.
Quantizers: identical bytes to `ggml.quantize(x, type, method)` for each registered method, with one
documented exception: IQ4_NL "ref"/"cpu" blocks with max|x| < 1e-15 that come before any other block
of the call, whose nibbles ggml takes from uninitialised stack memory (see quantize_iq4_nl_ref).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.qtensor import QTensor, dequantize, quantize
from refimpl.quants import DEQUANTIZERS, QUANTIZERS
from refimpl.quants.iq_tables import TABLE_SPECS, TABLES, probe
from refimpl.testing import assert_bits_equal, block_rows, qtensors
from refimpl.types import GGMLType, traits

pytestmark = pytest.mark.property

DEQ_TYPES = [GGMLType.IQ1_S, GGMLType.IQ1_M, GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S,
             GGMLType.IQ3_XXS, GGMLType.IQ3_S, GGMLType.IQ4_NL, GGMLType.IQ4_XS]
QUANT_CASES = [(GGMLType.IQ4_NL, m) for m in ("chunk", "ref", "cpu")] + \
              [(GGMLType.IQ4_XS, m) for m in ("chunk", "ref", "cpu")]
_ids = lambda v: v.name.lower() if isinstance(v, GGMLType) else str(v)  # noqa: E731


# -- tables ----------------------------------------------------------------------------------------

def _ggml_dequantize(ggml):
    def deq(type_name, blocks):
        tr = traits(type_name)
        qt = QTensor(tr.type, np.ascontiguousarray(blocks).reshape(1, -1), (1, blocks.shape[0] * tr.blck_size))
        return ggml.dequantize(qt).reshape(blocks.shape[0], tr.blck_size)
    return deq


def test_stored_tables_match_ggml(ggml):
    """refimpl/data/iq_tables.npz is what ggml's dequantizers say today (rerun scripts/gen_iq_tables.py)."""
    live = probe(_ggml_dequantize(ggml))
    assert set(TABLES) == set(TABLE_SPECS) == set(live)
    for name, (dtype, shape) in TABLE_SPECS.items():
        assert TABLES[name].dtype == dtype and TABLES[name].shape == shape, name
        np.testing.assert_array_equal(TABLES[name], live[name], err_msg=name)


def test_table_properties():
    k = TABLES["ksigns"]
    assert np.array_equal(k & 127, np.arange(128))                         # 7 stored bits kept
    assert all(bin(int(v)).count("1") % 2 == 0 for v in k)                 # 8th bit: even parity
    assert np.all(np.diff(TABLES["kvalues_iq4nl"].astype(int)) > 0)        # best_index needs sorted levels
    assert set(np.unique(TABLES["iq1s"])) == {-1, 0, 1}
    for name in ("iq2xxs", "iq2xs", "iq2s", "iq3xxs", "iq3s"):             # distinct codewords
        assert len(np.unique(TABLES[name], axis=0)) == len(TABLES[name]), name
    assert not TABLES["iq2s"].flags.writeable


# -- dequantizers ------------------------------------------------------------------------------------

def test_registered():
    for t in DEQ_TYPES:
        assert t in DEQUANTIZERS, t.name
    for t, m in QUANT_CASES:
        assert (t, m) in QUANTIZERS, (t.name, m)


@pytest.mark.parametrize("t", DEQ_TYPES, ids=_ids)
@given(data=st.data())
def test_dequantize_bits_equal_ggml(ggml, t, data):
    qt = data.draw(qtensors(t), label="qt")
    assert_bits_equal(dequantize(qt), ggml.dequantize(qt), f"dequantize {t.name}")


# -- quantizers --------------------------------------------------------------------------------------

def _leading_skipped(x: np.ndarray, t: GGMLType, method: str) -> np.ndarray:
    """Blocks (flat order) whose bytes ggml leaves undefined: IQ4_NL ref/cpu blocks with max|x| < 1e-15
    before the first block it actually quantizes."""
    blocks = np.asarray(x, np.float32).reshape(-1, traits(t).blck_size)
    if t != GGMLType.IQ4_NL or method == "chunk":
        return np.zeros(len(blocks), bool)
    a = np.abs(blocks)
    skipped = np.where(np.isnan(a), 0, a).max(axis=1) < np.float32(1e-15)
    return np.logical_and.accumulate(skipped)


def check_quantize(ggml, x: np.ndarray, t: GGMLType, method: str) -> None:
    tr = traits(t)
    ours, theirs = quantize(x, t, method=method), ggml.quantize(x, t, method)
    a = ours.data.reshape(-1, tr.type_size)
    b = theirs.data.reshape(-1, tr.type_size)
    undef = _leading_skipped(x, t, method)
    assert_bits_equal(a[~undef], b[~undef], f"quantize {tr.name} {method}: bytes")
    if undef.any():      # same d (0); ggml's nibbles are stack garbage: compare the decoded values
        assert_bits_equal(a[undef, :2], b[undef, :2], f"quantize {tr.name} {method}: d of skipped blocks")
        da = dequantize(QTensor(t, a[undef], (int(undef.sum()), tr.blck_size)))
        db = ggml.dequantize(QTensor(t, b[undef], (int(undef.sum()), tr.blck_size)))
        assert np.array_equal(da, db) and not np.any(da), f"quantize {tr.name} {method}: skipped blocks"


@pytest.mark.parametrize("t,method", QUANT_CASES, ids=_ids)
@given(data=st.data())
def test_quantize_bytes_equal_ggml(ggml, t, method, data):
    x = data.draw(block_rows(t), label="x")
    check_quantize(ggml, x, t, method)


def _adversarial(blck: int) -> dict[str, np.ndarray]:
    """Fixed rows (n = 2 * blck unless stated) that each break a different step of the IQ4 search."""
    rng = np.random.default_rng(1234)
    n = 2 * blck
    normal = rng.standard_normal(n).astype(np.float32)
    outlier = (rng.standard_normal(n) * 1e-3).astype(np.float32)
    outlier[[5, blck + 31]] = [-2e3, 7e2]
    mixed = normal.copy()
    mixed[:32] = 0.0                                       # one zero sub-block (IQ4_XS) / block (IQ4_NL)
    mixed[64:96] = -3.25                                   # a constant one
    cases = {
        "zero": np.zeros(n, np.float32),
        "neg_zero": np.full(n, -0.0, np.float32),
        "signed_zero": np.where(rng.random(n) < 0.5, -0.0, 0.0).astype(np.float32),
        "constant": np.full(n, 0.7, np.float32),
        "constant_neg": np.full(n, -1e-3, np.float32),
        "outlier": outlier,
        "mixed": mixed,
        "f16_overflow": (rng.choice([-1, 1], n) * 10.0 ** rng.uniform(4.8, 8, n)).astype(np.float32),
        "f16_max": np.tile(np.float32([65504.0, -1e5, 3e4, 1.0]), n // 4),
        "huge": (normal * np.float32(1e30)).astype(np.float32),
        "subnormal": (rng.standard_normal(n) * 1e-40).astype(np.float32),
        "tiny_normal": (rng.standard_normal(n) * 1e-14).astype(np.float32),   # just above the 1e-15 cut
        "at_eps": np.where(np.arange(n) % 7 == 0, np.float32(1e-15), np.float32(0)).astype(np.float32),
        "ints": rng.integers(-8, 9, n).astype(np.float32),
        "levels": np.tile(np.float32([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]),
                          n // 16),
        # max = -127 makes 1/d exactly 1 in the first pass: every other value is a midpoint between two
        # levels, where best_index must pick the upper one.
        "midpoints": np.tile(np.float32([-127, -115.5, -93.5, -74, -57, -42, -28.5, -16, -4.5, 7, 19, 31.5,
                                         45.5, 61, 79, 101]), n // 16),
        "ties": (rng.integers(-64, 65, n) * 0.25).astype(np.float32),
        "positive": (np.abs(normal) + 0.01).astype(np.float32),
    }
    # NaN never wins the arg-max scan (a NaN-only block counts as zero); inf makes d infinite.
    cases["nan"] = normal.copy()
    cases["nan"][[3, blck + 7]] = np.nan
    cases["nan_block"] = np.concatenate([np.full(blck, np.nan, np.float32), normal[:blck]])
    cases["inf"] = normal.copy()
    cases["inf"][[2, blck + 9]] = [np.inf, -np.inf]
    # Zero blocks after a quantized block: IQ4_NL ref/cpu repeat that block's nibbles.
    cases["zero_after"] = np.concatenate([normal[:blck], np.zeros(blck, np.float32)])
    return {k: v.reshape(1, -1) for k, v in cases.items()} | {
        "rows_1025": (rng.standard_normal((1025, blck)) * 10.0 ** rng.uniform(-3, 3, (1025, 1))).astype(np.float32),
        "zero_rows": np.concatenate([np.zeros((2, n), np.float32), normal.reshape(1, n), np.zeros((2, n), np.float32)]),
    }


@pytest.mark.parametrize("t,method", QUANT_CASES, ids=_ids)
@pytest.mark.parametrize("case", list(_adversarial(32)), ids=str)
def test_quantize_adversarial(ggml, t, method, case):
    check_quantize(ggml, _adversarial(traits(t).blck_size)[case], t, method)


def test_iq4_nl_methods_differ(ggml):
    """The ntry = 7 search ("chunk") and the plain least-squares scale ("ref") give different bytes."""
    x = np.random.default_rng(7).standard_normal((64, 256)).astype(np.float32)
    a, b = quantize(x, GGMLType.IQ4_NL, method="chunk"), quantize(x, GGMLType.IQ4_NL, method="ref")
    assert a != b
    assert a == ggml.quantize(x, GGMLType.IQ4_NL, "chunk") and b == ggml.quantize(x, GGMLType.IQ4_NL, "ref")


def test_iq4_xs_all_zero_stores_negative_zero_scale():
    """IQ4_XS d = -max_scale/32 with max_scale = 0 is -0.0: the f16 bytes are 00 80."""
    q = quantize(np.zeros((1, 256), np.float32), GGMLType.IQ4_XS).data
    assert q[0, 0] == 0x00 and q[0, 1] == 0x80
    assert np.all(q[0, 8:] == 0x88) and np.all(q[0, 4:8] == 0x00) and q[0, 2] == 0xAA and q[0, 3] == 0xAA
