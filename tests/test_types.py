"""Type traits against ggml's own table, and the QTensor container."""
import subprocess
import sys

import numpy as np
import pytest

import refimpl
from refimpl import GGMLType as T, QTensor
from refimpl.types import type_traits


pytestmark = pytest.mark.property

def test_traits_match_ggml_for_every_type(ggml):
    g, _, _ = ggml._libs()
    for i in range(g.GGML_TYPE_COUNT):
        blck = int(g.ggml_blck_size(i))
        if blck == 0:           # retired ids (Q4_0_4_4, ...): refimpl must not know them either
            assert all(int(t) != i for t in type_traits), i
            continue
        tr = refimpl.traits(i)
        assert (tr.blck_size, tr.type_size) == (blck, int(g.ggml_type_size(i))), tr
        assert tr.name == ggml.type_name(i)
        assert tr.is_quantized == bool(g.ggml_is_quantized(i))


def test_q8_1_size_is_ggmls_not_the_gguf_packages():
    from gguf.constants import GGML_QUANT_SIZES
    assert refimpl.traits("q8_1").type_size == 36
    assert GGML_QUANT_SIZES[T.Q8_1][1] == 40   # the gguf package's table, which refimpl does not use


def test_type_lookup_by_name_number_and_enum():
    assert refimpl.as_type("Q4_K") is T.Q4_K and refimpl.as_type(12) is T.Q4_K
    with pytest.raises(ValueError, match="unknown ggml type name"):
        refimpl.as_type("q4_2")


def test_every_type_ggml_dequantizes_has_a_refimpl_dequantizer(ggml):
    from refimpl.quants import DEQUANTIZERS
    g, base, _ = ggml._libs()
    missing = [tr.name for tr in type_traits.values()
               if (hasattr(base, f"dequantize_row_{tr.name}") or g.ggml_get_type_traits(int(tr.type)).contents.to_float)
               and tr.type not in DEQUANTIZERS]
    assert not missing, f"ggml dequantizes these, refimpl does not: {missing}"


def test_every_type_ggml_quantizes_without_imatrix_has_a_refimpl_quantizer(ggml):
    from refimpl.quants import QUANTIZERS
    g, base, _ = ggml._libs()
    missing = [tr.name for tr in type_traits.values() if tr.is_quantized
               and hasattr(base, f"quantize_{tr.name}") and not ggml.requires_imatrix(tr.type)
               and (tr.type, "ref") not in QUANTIZERS and (tr.type, "chunk") not in QUANTIZERS]
    assert not missing, f"ggml quantizes these without an importance matrix, refimpl does not: {missing}"


def test_qtensor_indexing_stays_quantized_and_asarray_dequantizes():
    x = np.random.default_rng(0).standard_normal((3, 4, 64)).astype(np.float32)
    q = refimpl.quantize(x, "q4_0")
    assert q.shape == (3, 4, 64) and q.ne == [64, 4, 3] and q.data.shape == (3, 4, 36)
    row = q[1, 2]
    assert isinstance(row, QTensor) and row.shape == (64,)
    assert np.shares_memory(row.data, q.data)
    np.testing.assert_array_equal(np.asarray(q)[1, 2], np.asarray(row))
    np.testing.assert_array_equal(np.asarray(q[:, 1:3]), np.asarray(q)[:, 1:3])
    np.testing.assert_array_equal(np.asarray(q[..., 0, :]), np.asarray(q)[:, 0])
    assert q[::-1].shape == (3, 4, 64)
    with pytest.raises(IndexError, match="row of 64 elements is taken whole"):
        q[0, 0, :32]


def test_qtensor_from_bytes_and_errors():
    raw = refimpl.quantize(np.full((2, 32), 127, np.float32), "q8_0").tobytes()   # d = 1, q = 127
    q = QTensor.from_bytes(raw, "q8_0", (2, 32))
    np.testing.assert_array_equal(np.asarray(q), np.full((2, 32), 127, np.float32))
    with pytest.raises(ValueError, match=r"needs 102 bytes, got 68"):
        QTensor.from_bytes(raw, "q8_0", (3, 32))
    with pytest.raises(ValueError, match=r"ne \[48, 2\] \(numpy \(2, 48\)\).*block size 32"):
        refimpl.quantize(np.ones((2, 48), np.float32), "q4_0")
    with pytest.raises(ValueError, match="importance matrix"):
        refimpl.quantize(np.ones((1, 256), np.float32), "iq2_xxs")


def test_import_does_not_pull_in_numba():
    """`import refimpl` stays light (its cold time is measured in benchmarks/import_time.py)."""
    code = ("import sys, refimpl, refimpl.gguf; "
            "print(sorted(m for m in ('numba', 'llvmlite', 'ggml') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
