"""refimpl/kernels/faithful.py: mul_mat with numerics="ggml" under the numba backend against the NumPy
emulation (refimpl/kernels/ggml/matmul.py, itself golden-tested bit for bit against ggml), bit for bit.

Every weight type with a kernel: hypothesis cases of the golden test (tests/oracle/test_faithful.py
`faithful_cases`: weights quantized from drawn f32 values or random block bytes with finite scales; 1 to 8
activation rows in f32 or already in the vec_dot type, random Q8 bytes with -128 levels included;
broadcast batches, strided rows), then a matrix large enough for several threads, extreme levels (lane
sums past 2^24, every activation -128), mul_mat_id (same kernels), and a few cases against live ggml. The Q8_0 / Q8_1
activation
quantizers: bytes against the NumPy ones on adversarial blocks (NaN, inf, ties, huge, subnormal).
"""
import numpy as np
import pytest

pytest.importorskip("numba", reason="numba is not installed: refimpl.kernels is Numba code")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tests._profiles import examples  # noqa: E402

import refimpl  # noqa: E402
from refimpl.kernels import faithful as kf  # noqa: E402
from refimpl.dispatch import kernel_for  # noqa: E402
from refimpl.kernels.ggml.matmul import QUANT_DOTS  # noqa: E402
from refimpl.ops.matmul import VEC_DOT_TYPE, mul_mat  # noqa: E402
from refimpl.qtensor import quantize  # noqa: E402
from refimpl.quants import get_quantizer  # noqa: E402
from refimpl.testing import block_rows  # noqa: E402
from refimpl.types import GGMLType, type_traits  # noqa: E402
from tests.oracle.test_faithful import _ggml_mul_mat, _random_blocks, faithful_cases  # noqa: E402

pytestmark = pytest.mark.equivalence

TYPES = sorted((t for t, fn in QUANT_DOTS.items() if any(ref is fn for ref, *_ in kf._KERNELS)), key=int)
N = max(10, settings().max_examples // 2)


def _name(t) -> str:
    return type_traits[t].name


def _both(a, b):
    """(NumPy emulation, numba kernel) results of mul_mat(a, b, numerics="ggml")."""
    with np.errstate(all="ignore"):
        with refimpl.backend("numpy"):
            ref = mul_mat(a, b, numerics="ggml")
        with refimpl.backend("numba"):
            got = mul_mat(a, b, numerics="ggml")
    return ref, got


def assert_same_bits(got, ref, what: str) -> None:
    assert got.dtype == ref.dtype == np.float32 and got.shape == ref.shape, what
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32), err_msg=what)


def test_every_kernel_is_dispatched():
    """Under numba, mul_mat's faithful path finds a kernel for each covered type (the tests below would
    otherwise compare the NumPy code with itself); under numpy it finds none."""
    assert {GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.Q4_K,
            GGMLType.Q6_K} <= set(TYPES)
    with refimpl.backend("numba"):
        assert all(kernel_for(QUANT_DOTS[t]) is not None for t in TYPES)
    with refimpl.backend("numpy"):
        assert all(kernel_for(QUANT_DOTS[t]) is None for t in TYPES)


@pytest.mark.parametrize("t", TYPES, ids=_name)
@settings(max_examples=examples(N))
@given(data=st.data())
def test_kernel_bits_equal_numpy(t, data):
    a, b, name = data.draw(faithful_cases(t))
    ref, got = _both(a, b)
    assert_same_bits(got, ref, name)


@pytest.mark.parametrize("t", TYPES, ids=_name)
def test_kernel_threads(t):
    """Enough weight rows and activation rows for every thread: the ranges split at arbitrary rows."""
    import numba
    rng = np.random.default_rng(int(t))
    k = 4 * type_traits[t].blck_size if type_traits[t].blck_size == 256 else 320
    a = quantize(rng.normal(0, 1, (203, k)).astype(np.float32), t)
    b = rng.normal(0, 1, (17, k)).astype(np.float32)
    old = numba.get_num_threads()
    numba.set_num_threads(min(4, numba.config.NUMBA_NUM_THREADS))
    try:
        ref, got = _both(a, b)
    finally:
        numba.set_num_threads(old)
    assert_same_bits(got, ref, f"{_name(t)} threaded")


@settings(max_examples=examples(N))
@given(data=st.data())
def test_mul_mat_id_kernel_bits_equal_numpy(data):
    """mul_mat_id's faithful path dots through the same kernels (matmul._dots), expert by expert."""
    from refimpl.ops.matmul import mul_mat_id
    from refimpl.testing.cases.matmul import mul_mat_id_cases
    case = data.draw(mul_mat_id_cases(tuple(TYPES)))
    with np.errstate(all="ignore"):
        with refimpl.backend("numpy"):
            ref = case.run(lambda *a, **k: mul_mat_id(*a, numerics="ggml", **k))
        with refimpl.backend("numba"):
            got = case.run(lambda *a, **k: mul_mat_id(*a, numerics="ggml", **k))
    assert_same_bits(got, ref, case.name)


# byte offsets of the f16 block scales (d, dmin / m) of each covered weight type
SCALE_FIELDS = {GGMLType.Q4_0: [0], GGMLType.Q4_1: [0, 2], GGMLType.Q5_0: [0], GGMLType.Q5_1: [0, 2],
                GGMLType.Q8_0: [0], GGMLType.IQ4_NL: [0], GGMLType.IQ4_XS: [0], GGMLType.Q2_K: [80, 82],
                GGMLType.Q3_K: [108], GGMLType.Q4_K: [0, 2], GGMLType.Q5_K: [0, 2], GGMLType.Q6_K: [208]}


@pytest.mark.parametrize("t", TYPES, ids=_name)
def test_kernel_extreme_levels(t):
    """Every weight byte but the f16 scales 0x00, 0x80 or 0xFF (the largest levels and sub-block scales:
    lane sums past 2^24 where the type allows, so their conversion to f32 rounds) against activations that
    are all -128 (the sign quirk of the signed byte products)."""
    tr, ta = type_traits[t], type_traits[VEC_DOT_TYPE[t]]
    k = 512
    b = _random_blocks(VEC_DOT_TYPE[t], (3, k), 2)
    qb = b.data.reshape(-1, ta.type_size)
    qoff = {GGMLType.Q8_K: 4, GGMLType.Q8_0: 2, GGMLType.Q8_1: 4}[b.type]
    qb[:, qoff:qoff + (256 if b.type == GGMLType.Q8_K else 32)] = 0x80
    for fill in (0x00, 0x80, 0xFF):
        a = _random_blocks(t, (5, k), fill)
        raw = a.data.reshape(-1, tr.type_size)
        scales = {o + i: raw[:, o + i].copy() for o in SCALE_FIELDS[t] for i in (0, 1)}
        raw[:] = fill
        for o, v in scales.items():
            raw[:, o] = v
        ref, got = _both(a, b)
        assert_same_bits(got, ref, f"{_name(t)} bytes {fill:#x} x -128")


@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q4_K, GGMLType.Q6_K], ids=_name)
def test_kernel_bits_equal_ggml(ggml, t):
    """A decode and a batch case against live ggml itself (SmolLM2's hidden size 576)."""
    rng = np.random.default_rng(3)
    k = 576 if type_traits[t].blck_size == 32 else 768
    a = quantize(rng.normal(0, 1, (40, k)).astype(np.float32), t)
    for m in (1, 6):
        b = rng.normal(0, 1, (m, k)).astype(np.float32)
        with refimpl.backend("numba"):
            got = mul_mat(a, b, numerics="ggml")
        assert_same_bits(got, _ggml_mul_mat(ggml, a, b).reshape(got.shape), f"{_name(t)} m={m} vs ggml")


# -- the activation conversion -------------------------------------------------------------------------------

@pytest.mark.parametrize("t", [GGMLType.Q8_0, GGMLType.Q8_1], ids=_name)
@settings(max_examples=examples(N))
@given(x=block_rows(GGMLType.Q8_0, max_rows=4, max_blocks=8))
def test_q8_cpu_quantizer_bytes(t, x):
    ref_fn = get_quantizer(t, "cpu")
    with refimpl.backend("numba"):
        fn = kernel_for(ref_fn)
    assert fn is not None
    blocks = x.reshape(-1, 32)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(fn(blocks), ref_fn(blocks), err_msg=f"{_name(t)} cpu quantizer")


@pytest.mark.parametrize("t", [GGMLType.Q8_0, GGMLType.Q8_1], ids=_name)
def test_q8_cpu_quantizer_non_finite(t):
    """NaN and inf in a block, all-NaN blocks, values that overflow x*id past int32."""
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (6, 32)).astype(np.float32)
    x[0, 3] = np.nan
    x[1, 5] = np.inf
    x[2, :] = np.nan
    x[3, 7] = -np.inf
    x[4] = np.float32(3e38) * np.sign(x[4])
    x[5, :] = 0.0
    ref_fn = get_quantizer(t, "cpu")
    with refimpl.backend("numba"):
        fn = kernel_for(ref_fn)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(fn(x), ref_fn(x))
