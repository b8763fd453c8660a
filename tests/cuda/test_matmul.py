"""CUDA mul_mat (refimpl/kernels/cuda/matmul.py) against the NumPy reference, in exact numerics.

Both kernels: decode (1 and 3 rows of b: one warp per weight row; 3 or 5 weight rows, i.e. a partial
block of WARPS warps, alone or after a full one) and prefill (9 and 33 rows of b, 33 and 37 weight rows:
partial and multiple TILE x TILE tiles; k of two blocks, i.e. several TK steps for 256-element blocks and
a partial step for the rest): decode for every weight type, both for each type family (F32, F16, BF16,
Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K); activation-by-activation products with both operands on the device,
3-D and 4-D, broadcast over b's batch dims (np.repeat); the weight upload cache; shape errors; inputs
that fall back.
The bound is the tolerance table's ("mul_mat", "*", "property") -- two f64 sums of the same exact products
in different orders, each rounded once to f32 -- and the NMSE measured is printed (0 so far: the f32
roundings of the two f64 sums have agreed on every element).
"""
import numpy as np
import pytest

import refimpl
from refimpl.kernels.cuda import _device
from refimpl.kernels.cuda import matmul as cm
from refimpl.shapes import GGMLShapeError
from refimpl.ops.matmul import VEC_DOT_TYPE
from refimpl.testing import assert_nmse, nmse, tol
from refimpl.types import traits

pytestmark = pytest.mark.equivalence

BOUND = tol("mul_mat", "*", "property").nmse
TYPES = ["f32", "f16"] + sorted(traits(t).name for t in VEC_DOT_TYPE if traits(t).name not in ("f32", "f16"))
FAMILIES = ["f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q8_0", "q4_K", "q6_K"]
_GRID = ("iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m")  # no fast quantizer: random blocks


def _k(t: str) -> int:
    """Two blocks of t (64 elements for the one-element types' rows)."""
    return 2 * max(32, traits(refimpl.as_type(t)).blck_size)


def _weight(t: str, n: int, k: int, rng):
    """A weight (n, k) of type t: f32/f16 ndarray or QTensor (random blocks with d = 2^-8 for grid types)."""
    w = rng.uniform(-1, 1, (n, k)).astype(np.float32)
    if t == "f32":
        return w
    if t == "f16":
        return w.astype(np.float16)
    if t not in _GRID:
        with refimpl.backend("numpy"):
            return refimpl.quantize(w, t)
    tr = traits(refimpl.as_type(t))
    blocks = rng.integers(0, 256, (n * k // tr.blck_size, tr.type_size), dtype=np.uint8)
    if t == "iq1_m":                   # d's f16 bits: the high nibbles of bytes 49, 51, 53, 55 (0x1C00)
        blocks[:, [49, 51, 53, 55]] = (blocks[:, [49, 51, 53, 55]] & 0x0F) | np.array([0, 0, 0xC0, 0x10], np.uint8)
    else:
        blocks[:, 0:2] = np.frombuffer(np.float16(2.0 ** -8).tobytes(), np.uint8)
    return refimpl.QTensor.from_bytes(blocks, t, (n, k))


def _check(a, b, what):
    with refimpl.backend("numpy"):
        ref = refimpl.mul_mat(_device.to_host(a) if _device.is_device(a) else a, _device.to_host(b))
    got = refimpl.mul_mat(a, b)
    assert _device.is_device(got), what
    got = _device.to_host(got)
    assert_nmse(got, ref, BOUND, what)
    print(f"{what}: NMSE {nmse(got, ref):.1e}")


@pytest.mark.parametrize("t", TYPES)
def test_decode_one_row_every_type(t):
    """One token (m = 1) through every weight type; 3 weight rows: a block with an idle warp."""
    rng = np.random.default_rng(1)
    k = _k(t)
    _check(_weight(t, 3, k, rng), rng.uniform(-1, 1, (1, k)).astype(np.float32), f"decode {t} m=1")


@pytest.mark.parametrize("t", FAMILIES)
@pytest.mark.parametrize("m", [3, 9])
def test_decode_and_prefill(t, m):
    """m = 3: decode; m = 9: prefill with 37 weight rows (two n tiles, the second partial, one partial m
    tile), k of two blocks."""
    rng = np.random.default_rng(m)
    k, n = _k(t), (5 if m <= cm.DECODE_ROWS else 37)
    _check(_weight(t, n, k, rng), rng.uniform(-1, 1, (m, k)).astype(np.float32), f"{t} m={m} n={n}")


def test_prefill_tiles_in_both_dims():
    """m = 33, n = 33, k = 300: two partial tiles along m and n, three TK steps, the last partial."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((33, 300)).astype(np.float32)
    _check(a, rng.standard_normal((33, 300)).astype(np.float32), "f32 33x33x300")


@pytest.mark.parametrize("m", [3, 9])
def test_activation_products_broadcast(m):
    """kq-like: a (1, 2, 3, 40) and b (2, 4, m, 40) both on the device: b batch (i3, i2) uses a batch
    (0, i2 // 2) (np.repeat, r2 = 2, r3 = 2); m = 3 decode, m = 9 prefill."""
    rng = np.random.default_rng(m)
    a = _device.to_device(rng.standard_normal((1, 2, 3, 40)).astype(np.float32))
    b = _device.to_device(rng.standard_normal((2, 4, m, 40)).astype(np.float32))
    _check(a, b, f"4-D activations m={m}")
    rep = np.repeat(np.repeat(_device.to_host(a), 2, axis=1), 2, axis=0)        # np.repeat, not np.tile
    want = np.einsum("abnk,abmk->abmn", rep.astype(np.float64), _device.to_host(b).astype(np.float64))
    assert_nmse(_device.to_host(refimpl.mul_mat(a, b)), want.astype(np.float32), BOUND, "np.repeat broadcast")


def test_activation_products_3d():
    """kqv-like 3-D: a (2, 6, 16) on the device, b (4, 3, 16) from NumPy: r2 = 2."""
    rng = np.random.default_rng(5)
    a = _device.to_device(rng.standard_normal((2, 6, 16)).astype(np.float32))
    _check(a, rng.standard_normal((4, 3, 16)).astype(np.float32), "3-D activations")


def test_batched_quantized_weight():
    """A (2, 5, 64) Q8_0 weight against b (2, 2, 64): each weight batch serves its b batch."""
    rng = np.random.default_rng(9)
    with refimpl.backend("numpy"):
        a = refimpl.quantize(rng.uniform(-1, 1, (2, 5, 64)).astype(np.float32), "q8_0")
    _check(a, rng.uniform(-1, 1, (2, 2, 64)).astype(np.float32), "batched q8_0")


def test_weights_are_uploaded_once(monkeypatch):
    """A second call with the same QTensor and a device b copies nothing to the device: the weight is
    cached in _device._CACHE under its host buffer."""
    rng = np.random.default_rng(2)
    a = _weight("q4_0", 5, 64, rng)
    b = _device.to_device(rng.uniform(-1, 1, (2, 64)).astype(np.float32))
    first = _device.to_host(refimpl.mul_mat(a, b))
    cached = _device._CACHE[id(a.data)]
    uploads = []
    real = _device.cuda.to_device
    monkeypatch.setattr(_device.cuda, "to_device", lambda *x, **kw: uploads.append(x) or real(*x, **kw))
    second = _device.to_host(refimpl.mul_mat(a, b))
    assert uploads == [] and _device._CACHE[id(a.data)] is cached
    np.testing.assert_array_equal(second, first)


@pytest.mark.parametrize("on_device", [False, True])
def test_shape_error_names_op_and_both_orders(on_device):
    """k mismatch (b on the host or the device) and a batch dim of b not a multiple of a's: GGMLShapeError
    naming mul_mat and each operand in ggml ne order and NumPy order."""
    rng = np.random.default_rng(0)
    a = _weight("q4_0", 5, 64, rng)
    b = rng.uniform(-1, 1, (3, 32)).astype(np.float32)
    b = _device.to_device(b) if on_device else b
    with pytest.raises(GGMLShapeError) as e:
        refimpl.mul_mat(a, b)
    msg = str(e.value)
    assert msg.startswith("mul_mat:")
    assert "ne [64, 5]" in msg and "numpy (5, 64)" in msg and "ne [32, 3]" in msg and "numpy (3, 32)" in msg
    with pytest.raises(GGMLShapeError, match=r"mul_mat: .*ne \[16, 2, 3\] \(numpy \(3, 2, 16\)\)"):
        refimpl.mul_mat(np.zeros((2, 4, 16), np.float32), np.zeros((3, 2, 16), np.float32))


def test_uncovered_inputs_fall_back_to_the_reference():
    """b already in the weight's vec_dot type (f16 for f16 weights): the reference's result, on the device."""
    rng = np.random.default_rng(4)
    a = rng.uniform(-1, 1, (5, 40)).astype(np.float16)
    b = rng.uniform(-1, 1, (3, 40)).astype(np.float16)
    got = refimpl.mul_mat(a, b)
    assert _device.is_device(got)
    np.testing.assert_array_equal(_device.to_host(got), refimpl.mul_mat.reference(a, b))
