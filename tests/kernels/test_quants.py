"""Numba block-format kernels against refimpl's NumPy dequantizers and quantizers, bit for bit.

Dequantize: every type, random bytes (all bit patterns: inf/NaN scales included), through the
single-thread and the threaded path. Quantize: every type with a kernel, both "chunk" and "ref" methods,
on adversarial block recipes (refimpl.testing.block_rows) and on a fixed batch of every block kind.
"""
import numpy as np
import pytest

pytest.importorskip("numba", reason="numba is not installed: refimpl.kernels is Numba code")

from hypothesis import given, settings, strategies as st  # noqa: E402
from tests._profiles import examples  # noqa: E402

import refimpl  # noqa: E402
from refimpl.kernels import quantize as kq  # noqa: E402
from refimpl.kernels import quants as kd  # noqa: E402
from refimpl.dispatch import kernel_for  # noqa: E402
from refimpl.quants import DEQUANTIZERS, get_quantizer  # noqa: E402
from refimpl.testing import BLOCK_KINDS, assert_bits_equal, block_bytes, block_rows, make_block  # noqa: E402
from refimpl.types import traits  # noqa: E402

pytestmark = pytest.mark.equivalence

DECODE_TYPES = sorted(kd.DECODABLE)
# (type, method) whose NumPy quantizer has a kernel (a method falls back to "ref" where ggml's agree)
QUANT_CASES = sorted({(t, m) for ref, t, _ in kq._KERNELS for m in ("chunk", "ref", "cpu")
                      if get_quantizer(t, m) is ref})
# a tenth of the profile's examples per type: each example holds up to 4 x 8 blocks of mixed kinds
N = max(8, settings().max_examples // 10)


def _numpy(fn, *args):
    with np.errstate(all="ignore"):
        return fn(*args)


@pytest.mark.parametrize("t", DECODE_TYPES, ids=lambda t: t.name)
@settings(max_examples=examples(N))
@given(data=st.data())
def test_dequantize_bits(t, data):
    raw = data.draw(block_bytes(t, max_rows=4, max_blocks=8))
    tr = traits(t)
    blocks = np.ascontiguousarray(raw).reshape(-1, tr.type_size)
    assert_bits_equal(kd.dequantize_into(t, blocks, np.empty((len(blocks), tr.blck_size), np.float32)),
                      _numpy(DEQUANTIZERS[t], blocks), f"dequantize {tr.name}")


@pytest.mark.parametrize("name, ts, bs", [("q4_1", 20, 32), ("q5_0", 22, 32), ("q5_1", 24, 32), ("tq1_0", 54, 256)])
def test_vector_decoders_refuse_mismatched_arrays(name, ts, bs):
    """The vector decoders (kernels/simd.py `vdec_*`) write raw addresses; the kernels that call them check
    the block size, the output width and the range first, so a wrong call raises instead of writing past
    an array."""
    kern = getattr(kd, f"_dq_{name}")
    src = np.zeros((4, ts), np.uint8)
    with pytest.raises(ValueError, match="do not match"):
        kern(src, np.empty((4, bs // 2), np.float32), 0, 4, ())              # output rows too short
    with pytest.raises(ValueError, match="do not match"):
        kern(src, np.empty((3, bs), np.float32), 0, 4, ())                   # past the output's last row
    with pytest.raises(ValueError, match="do not match"):
        kern(np.zeros((4, ts + 2), np.uint8), np.empty((4, bs), np.float32), 0, 4, ())   # another block size
    kern(src, np.empty((0, bs), np.float32), 0, 0, ())                      # an empty range checks nothing


@pytest.mark.parametrize("t", DECODE_TYPES, ids=lambda t: t.name)
def test_dequantize_threaded_and_dispatched(t, monkeypatch):
    """A tensor large enough for several threads, through refimpl.dequantize under both backends: on one
    thread, and split over 2 (and 3 where Numba has them: unequal ranges) by the type's prange driver."""
    import numba
    tr = traits(t)
    n = (1 << 17) // tr.blck_size + 3
    raw = np.random.default_rng(int(t)).integers(0, 256, (n, tr.type_size), dtype=np.uint8)
    qt = refimpl.QTensor(t, raw.reshape(1, -1), (1, n * tr.blck_size))
    with refimpl.backend("numpy"):
        ref = refimpl.dequantize(qt)
    driver, calls = kd.PAR_DECODERS[int(t)], []
    monkeypatch.setitem(kd.PAR_DECODERS, int(t), lambda *a: calls.append(a[-1]) or driver(*a))
    before = numba.get_num_threads()
    try:
        for th in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS), min(3, numba.config.NUMBA_NUM_THREADS)}):
            numba.set_num_threads(th)
            with refimpl.backend("numba"):
                assert kernel_for(DEQUANTIZERS[t]) is not None
                got = refimpl.dequantize(qt)
            assert_bits_equal(got, ref, f"dequantize {tr.name}, {th} threads")
    finally:
        numba.set_num_threads(before)
    assert calls == list(range(2, min(3, numba.config.NUMBA_NUM_THREADS) + 1)), "the prange driver did not split"


def test_dequantize_in_a_forked_child():
    """GNU OpenMP's threads do not survive a fork, nor do the thread pool's: in a child of a process whose
    dequantize started them (2 threads where Numba has them), a tensor's decode takes a new thread pool
    instead of the prange driver, finishes, and equals the parent's."""
    import numba
    from refimpl.kernels._common import parallel_ranges
    from tests.kernels._fork import in_forked_child
    t = refimpl.as_type("q4_K")
    raw = np.random.default_rng(5).integers(0, 256, (1024, traits(t).type_size), dtype=np.uint8)
    qt = refimpl.QTensor(t, raw.reshape(1, -1), (1, 1024 * 256))
    before = numba.get_num_threads()
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    try:
        parallel_ranges(lambda lo, hi: None, 4, 1)                # the thread pool exists before the fork
        with refimpl.backend("numba"):
            parent = refimpl.dequantize(qt)                       # starts the OpenMP threads here

        def child():
            with refimpl.backend("numba"):
                return refimpl.dequantize(qt)
        got = in_forked_child(child, "dequantize")
    finally:
        numba.set_num_threads(before)
    assert_bits_equal(got, parent, "dequantize in a forked child")


@pytest.mark.parametrize("case", QUANT_CASES, ids=lambda c: f"{c[0].name}-{c[1]}")
@settings(max_examples=examples(N))
@given(data=st.data())
def test_quantize_bytes(case, data):
    t, method = case
    x = data.draw(block_rows(t, max_rows=4, max_blocks=8))
    with refimpl.backend("numpy"):
        ref = refimpl.quantize(x, t, method=method)
    with refimpl.backend("numba"):
        got = refimpl.quantize(x, t, method=method)
    assert_bits_equal(got.data, ref.data, f"quantize {traits(t).name} ({method}) of {x.shape}")


@pytest.mark.parametrize("case", QUANT_CASES, ids=lambda c: f"{c[0].name}-{c[1]}")
def test_quantize_every_kind_threaded(case):
    """Blocks of every kind at every scale 10^-8 .. 10^8, many at once (the threaded path)."""
    t, method = case
    tr = traits(t)
    rng = np.random.default_rng(int(t))
    x = np.stack([make_block(k, tr.blck_size, rng, e) for e in range(-8, 9) for k in BLOCK_KINDS
                  for _ in range(1 if tr.blck_size == 256 else 4)])
    ref = _numpy(get_quantizer(t, method), x)
    with refimpl.backend("numba"):
        got = kernel_for(get_quantizer(t, method))(x)
    assert_bits_equal(got, ref, f"quantize {tr.name} ({method}), {len(x)} blocks")


def test_iq4_nl_ref_reuses_the_previous_levels():
    """quantize_row_iq4_nl_ref: an all-zero block packs the levels of the last quantized block before it
    (0x88 before the first), also when that block was quantized by another thread."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5000, 32)).astype(np.float32)
    x[[0, 1, 2500, 2501, 4999]] = 0
    ref = _numpy(get_quantizer(refimpl.GGMLType.IQ4_NL, "ref"), x)
    with refimpl.backend("numba"):
        got = kernel_for(get_quantizer(refimpl.GGMLType.IQ4_NL, "ref"))(x)
    assert_bits_equal(got, ref, "iq4_nl ref")
    assert (got[0, 2:] == 0x88).all() and (got[2500, 2:] == got[2499, 2:]).all()
