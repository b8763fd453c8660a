"""CUDA dequantizers (refimpl/kernels/cuda/quants.py) against refimpl's NumPy dequantizers, bit for bit.

Every type: random bytes (any bit pattern is a valid block, so every code path and inf/NaN scales turn up),
through `refimpl.dequantize` under backend("cuda"); blocks whose scale fields hold each special value
(+-inf, quiet and signalling NaN with payloads, the largest finite, the smallest subnormal, +-0) in every
pairing of d with dmin/m (NaN with NaN included: x86 keeps the first operand's NaN); and the device entry
`dequantize_device` on uploaded weights. Shapes: a few blocks per row, rows of 1..3, so sub-block threads
leave a partial CUDA block (thread counts not multiples of 256 or of the warp size).
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from tests._profiles import examples

import refimpl
from refimpl.kernels.cuda import _device
from refimpl.kernels.cuda import quants as cq
from refimpl.dispatch import kernel_for
from refimpl.quants import DEQUANTIZERS
from refimpl.testing import assert_bits_equal, block_bytes
from refimpl.types import traits

TYPES = sorted(DEQUANTIZERS)
# the simulator runs the kernels' f32 arithmetic as NumPy scalars, which warn on inf/NaN as the reference
# would without its np.errstate
pytestmark = [pytest.mark.equivalence, pytest.mark.filterwarnings("ignore:.*encountered in scalar:RuntimeWarning")]

F16_SPECIAL = [0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE12, 0x7BFF, 0x0001, 0x8000, 0x0000]
F32_SPECIAL = [0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFC01234, 0x7F7FFFFF, 0x00000001, 0x80000000, 0]
# byte offsets of each type's f16 scale fields (ggml-common.h's block structs)
F16_FIELDS = {"q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2), "q8_0": (0,), "q8_1": (0, 2), "q1_0": (0,),
              "q2_0": (0,), "q2_K": (80, 82), "q3_K": (108,), "q4_K": (0, 2), "q5_K": (0, 2), "q6_K": (208,),
              "tq2_0": (64,), "tq1_0": (52,), "iq2_xxs": (0,), "iq2_xs": (0,), "iq2_s": (0,), "iq3_xxs": (0,),
              "iq3_s": (0,), "iq1_s": (0,), "iq4_nl": (0,), "iq4_xs": (0,), "f16": (0,), "bf16": (0,)}


def _numpy(t, blocks):
    with np.errstate(all="ignore"):
        return DEQUANTIZERS[t](blocks)


def _special_blocks(t) -> np.ndarray:
    """Random blocks of t whose scale fields cycle through the special values, every pair for two fields."""
    tr = traits(t)
    n = len(F16_SPECIAL) ** len(F16_FIELDS.get(tr.name, (0,)))
    raw = np.random.default_rng(int(t)).integers(0, 256, (n, tr.type_size), dtype=np.uint8)
    pair = [(v % len(F16_SPECIAL), v // len(F16_SPECIAL)) for v in range(n)]
    if tr.name in F16_FIELDS:
        for b, ix in enumerate(pair):
            for field, j in zip(F16_FIELDS[tr.name], ix):
                raw[b, field:field + 2] = np.frombuffer(np.uint16(F16_SPECIAL[j]).tobytes(), np.uint8)
    elif tr.name in ("q8_K", "f32"):
        for b, (j, _) in enumerate(pair):
            raw[b, 0:4] = np.frombuffer(np.uint32(F32_SPECIAL[j]).tobytes(), np.uint8)
    elif tr.name == "mxfp4":                      # E8M0 exponent byte
        raw[:, 0] = np.resize(np.array([0, 1, 2, 127, 253, 254, 255], np.uint8), n)
    elif tr.name == "nvfp4":                      # four UE4M3 sub-block scales
        raw[:, 0:4] = np.resize(np.array([0x00, 0x01, 0x7E, 0x7F, 0xFF, 0x80, 0x38], np.uint8), (n, 4))
    elif tr.name == "iq1_m":                      # d's f16 bits are the high nibbles of bytes 49, 51, 53, 55
        for b, (j, _) in enumerate(pair):
            h = F16_SPECIAL[j]
            for q in range(4):
                raw[b, 49 + 2 * q] = (raw[b, 49 + 2 * q] & 0x0F) | (((h >> (4 * q)) & 15) << 4)
    else:
        raise AssertionError(f"no special scales listed for {tr.name}")
    return raw


def test_every_type_is_registered():
    assert set(DEQUANTIZERS) == set(cq.DECODERS) | set(cq.ELEMENTS)
    for t in TYPES:
        assert kernel_for(DEQUANTIZERS[t]) is not None, traits(t).name


@pytest.mark.parametrize("t", TYPES, ids=lambda t: traits(t).name)
@settings(max_examples=examples(3))
@given(data=st.data())
def test_dequantize_random_bytes(t, data):
    """refimpl.dequantize under backend("cuda") == the NumPy path, on 1..3 rows of 1..3 random blocks."""
    raw = data.draw(block_bytes(t, max_rows=3, max_blocks=3))
    tr = traits(t)
    qt = refimpl.QTensor(t, raw, (raw.shape[0], raw.shape[1] // tr.type_size * tr.blck_size))
    with refimpl.backend("numpy"), np.errstate(all="ignore"):
        ref = refimpl.dequantize(qt)
    got = refimpl.dequantize(qt)
    assert isinstance(got, np.ndarray)
    assert_bits_equal(got, ref, f"dequantize {tr.name}")


@pytest.mark.parametrize("t", TYPES, ids=lambda t: traits(t).name)
def test_dequantize_special_scales(t):
    """inf / NaN / largest / subnormal / signed-zero scales (all 81 pairings where a block has two f16
    fields, e.g. Q4_1's d and m): same bits. (The simulator runs NumPy scalar arithmetic, which warns.)"""
    raw = _special_blocks(t)
    got = cq.dequantize_blocks(t, _device.to_device(raw))
    assert _device.is_device(got)
    assert_bits_equal(_device.to_host(got), _numpy(t, raw), f"dequantize {traits(t).name}")


@pytest.mark.parametrize("name", ["q4_K", "q5_0", "iq4_xs", "bf16", "f16"])
def test_dequantize_device_of_weights(name):
    """dequantize_device of an uploaded batched (2, 3, k) QTensor keeps the shape and the bits."""
    t = refimpl.as_type(name)
    tr = traits(t)
    k = 2 * max(32, tr.blck_size)
    raw = np.random.default_rng(3).integers(0, 256, (2, 3, k // tr.blck_size * tr.type_size), dtype=np.uint8)
    qt = refimpl.QTensor(t, raw, (2, 3, k))
    with refimpl.backend("numpy"), np.errstate(all="ignore"):
        ref = refimpl.dequantize(qt)
    got = cq.dequantize_device(_device.weight(qt))
    assert_bits_equal(_device.to_host(got), ref, f"dequantize_device {name}")


def test_dequantize_device_of_float_arrays():
    """f16 ndarray weights (finite values, infinities, subnormals) convert exactly; f32 weights are their
    own device array."""
    h = np.array([[1.5, -0.0, 65504, -np.inf, 6e-8, 1e-5, 3.14159, -2.0]], np.float16)
    got = cq.dequantize_device(_device.weight(h))
    assert_bits_equal(_device.to_host(got), h.astype(np.float32), "f16")
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    dw = _device.weight(w)
    assert cq.dequantize_device(dw) is dw.data
