"""Numba op kernels against the NumPy reference (`op.reference`), on the ops' own case strategies
(refimpl.testing.op_cases: valid shapes, views, f16/bf16 operands, edge values) and fixed named cases.

Kernels that repeat the reference's operations in its order must give identical bits; mul_mat's decode
path sums its exact f64 products in another order than BLAS and is held to the tolerance of two f64
sums rounded once to f32. Inputs a kernel does not cover fall back to the reference (also checked here:
same result, same error).
"""
import numpy as np
import pytest

pytest.importorskip("numba", reason="numba is not installed: refimpl.kernels is Numba code")

from hypothesis import given, settings, strategies as st  # noqa: E402
from tests._profiles import examples  # noqa: E402

import refimpl  # noqa: E402
import refimpl.kernels  # noqa: E402
from refimpl import GGMLShapeError, QTensor  # noqa: E402
from refimpl.ops import OPS  # noqa: E402
from refimpl.testing import assert_bits_equal, assert_nmse, named_cases, op_cases, tol  # noqa: E402

pytestmark = pytest.mark.equivalence

OPS_WITH_KERNELS = ["rms_norm", "norm", "soft_max_ext", "rope_ext", "rope_ext_back", "get_rows", "silu",
                    "sigmoid", "exp", "relu", "swiglu", "gelu", "geglu", "rwkv_wkv6", "rwkv_wkv7", "mul_mat",
                    "argsort", "top_k", "argsort_top_k"]
# ggml-cpu's f16 GELU table in Numba: kernels of the ggml profile only (the exact op is the formula)
GGML_PROFILE_KERNELS = ["gelu", "geglu"]
N = max(10, settings().max_examples // 4)

refimpl.kernels.load()


def _values(x):
    return x.data if isinstance(x, QTensor) else np.asarray(x)


def _compare(op, got, ref, what):
    if op == "mul_mat" and not isinstance(got, QTensor):
        fin = np.isfinite(ref)
        assert np.array_equal(fin, np.isfinite(got)), f"{what}: inf/nan at other places"
        assert_nmse(got[fin], ref[fin], tol("mul_mat", "*", "property").nmse, what)
        return
    assert_bits_equal(_values(got), _values(ref), what)


def _check(case):
    info = OPS[case.op]
    assert "numba" in info.kernels, f"{case.op} has no numba kernel"
    with refimpl.backend("numpy"), np.errstate(all="ignore"):
        try:
            ref = case.run(info.fn)
        except (GGMLShapeError, ValueError, TypeError) as e:
            ref = e
    with refimpl.backend("numba"):                          # through the op's dispatch
        if isinstance(ref, Exception):
            with pytest.raises(type(ref)) as e:
                case.run()
            assert str(e.value) == str(ref)
            return
        got = case.run()
    _compare(case.op, got, ref, str(case))


@pytest.mark.parametrize("op", OPS_WITH_KERNELS)
@settings(max_examples=examples(N))
@given(data=st.data())
def test_kernel_matches_reference(op, data):
    _check(data.draw(op_cases(op)))


@pytest.mark.parametrize("op", OPS_WITH_KERNELS)
def test_kernel_matches_reference_named(op):
    for case in named_cases(op):
        _check(case)


def test_kernels_are_chosen_by_the_backend():
    """The op dispatches to the kernel under "numba" and to the NumPy body under "numpy"."""
    from refimpl.kernels import norm as kn
    a = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    calls = []
    orig = kn._rows
    kn._rows = lambda *args: calls.append(1) or orig(*args)
    try:
        with refimpl.backend("numba"):
            refimpl.rms_norm(a, 1e-6)
        with refimpl.backend("numpy"):
            refimpl.rms_norm(a, 1e-6)
    finally:
        kn._rows = orig
    assert calls == [1]


def test_fallbacks_give_the_reference_errors():
    a = np.ones((2, 8), np.float64)
    with refimpl.backend("numba"), pytest.raises(GGMLShapeError, match="must be f32"):
        refimpl.rms_norm(a, 1e-6)
    with refimpl.backend("numba"), pytest.raises(GGMLShapeError, match="a.ne0 == b.ne0"):
        refimpl.mul_mat(np.ones((4, 32), np.float32), np.ones((2, 64), np.float32))
    w = refimpl.quantize(np.ones((4, 32), np.float32), "q4_0")
    with refimpl.backend("numba"), pytest.raises(GGMLShapeError, match="out of range"):
        refimpl.get_rows(w, np.array([4], np.int32))


@pytest.mark.parametrize("op", OPS_WITH_KERNELS)
def test_kernel_matches_reference_split_over_threads(op, monkeypatch):
    """The named cases again with every kernel's per-thread minimum at 1 item: the work is split into
    as many ranges as there are threads, so the range boundaries are exercised."""
    from refimpl.kernels import matmul, norm, quants, recurrent, rope, softmax, unary
    for mod in (norm, softmax, rope, unary, quants, recurrent):
        monkeypatch.setattr(mod, "PAR_MIN", 1)
    monkeypatch.setattr(matmul, "GEMV_MIN_MACS", 1)
    monkeypatch.setattr("refimpl.kernels._common.n_threads", lambda: 3)
    for case in named_cases(op)[:12]:
        _check(case)


@pytest.mark.parametrize("op", ["silu", "sigmoid", "exp", "swiglu", "soft_max_ext"])
def test_exp_fallback_reads_the_inputs(op):
    """An element outside the vector exp's fast path (NaN, or past +-87) sends `vexp.exp32_into` back over
    its inputs for libm's values; the kernels give it separate input and output arrays, so the other
    elements keep their exps (a silu row with NaNs and |x| ~ 9 once came out wrong when the exps were
    computed in place: NaN triggered the second pass, which then read exps instead of inputs)."""
    rng = np.random.default_rng(3)
    x = (rng.uniform(-10, 10, (4, 56))).astype(np.float32)
    x[0, :3] = np.nan
    x[1, 5] = 95.0
    x[2, 7] = -120.0
    x[3, 0] = -np.inf
    args = {"silu": (x,), "sigmoid": (x,), "exp": (x,), "swiglu": (x, x[::-1].copy()),
            "soft_max_ext": (x * np.float32(12),)}[op]
    with refimpl.backend("numpy"), np.errstate(all="ignore"):
        ref = getattr(refimpl, op)(*args)
    with refimpl.backend("numba"):
        got = getattr(refimpl, op)(*args)
    assert_bits_equal(got, ref, f"{op} with exps on libm's path")


@pytest.mark.parametrize("numerics", ["exact", "ggml"])
@pytest.mark.parametrize("n", [65536 + 5, 1 << 20, 1 << 22])
def test_gelu_every_f16_and_bit_pattern(n, numerics):
    """Both GELU kernels on every f16 value, on random f32 bit patterns (NaNs with payloads, subnormals,
    values that round to f16 inf) and normal draws, with a tail shorter than 16; the large sizes also run
    split over threads. exact: the formula (`vexp.tanh_poly` vectorized, libm's tanh for the ~2^-18 it cannot
    decide: the largest size has some) against NumPy's f64 tanh rounded once; ggml: the 16-lane table lookup
    (`simd.vgelu16`: hardware f32 -> f16 conversion, NaN lanes set to ggml's sign | 0x7E00), both sides
    of +-10, against the ggml profile's NumPy table."""
    rng = np.random.default_rng(n)
    every_f16 = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    m = n - every_f16.size
    bits = rng.integers(0, 2 ** 32, m // 2, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([every_f16, bits, (rng.standard_normal(m - m // 2) * 3).astype(np.float32)])
    with refimpl.numerics(numerics):
        with refimpl.backend("numpy"), np.errstate(all="ignore"):
            ref = refimpl.gelu(x)
        with refimpl.backend("numba"):
            got = refimpl.gelu(x)
    assert_bits_equal(got, ref, f"gelu ({numerics}) on {n} values")


@settings(max_examples=examples(N))
@given(data=st.data())
def test_set_rows_kernel_is_the_reference(data):
    """The KV-cache scatter (set_rows into an f32/f16 array, one batch) in Numba: the reference's bytes for
    every index order, repeats included (the last write wins), with out=None, out=a (in place, as the RPC
    server writes a cache) and out=another array; what it does not cover, the reference computes."""
    R, E, n = data.draw(st.integers(1, 9)), data.draw(st.integers(1, 40)), data.draw(st.integers(1, 12))
    dt = data.draw(st.sampled_from([np.float32, np.float16]))
    lead = data.draw(st.sampled_from([(), (1,), (1, 1)]))
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(lead + (R, E)) * 100).astype(dt)
    b = (rng.standard_normal(lead + (n, E)) * 1e5).astype(np.float32)      # f16 overflow to inf included
    b.reshape(-1)[rng.integers(0, b.size)] = np.nan
    c = rng.integers(0, R, n).astype(data.draw(st.sampled_from([np.int64, np.int32])))
    mode = data.draw(st.sampled_from(["none", "self", "other"]))
    results = []
    for backend in ("numpy", "numba"):
        a2 = a.copy()
        with refimpl.backend(backend):
            if mode == "none":
                got = refimpl.set_rows(a2, b, c)
                assert_bits_equal(a2, a, "set_rows leaves a as it was")
            elif mode == "self":
                got = refimpl.set_rows(a2, b, c, out=a2)
                assert got is a2
            else:
                o = np.zeros_like(a)
                got = refimpl.set_rows(a2, b, c, out=o)
                assert got is o
        results.append(np.array(got).view(np.uint32 if dt == np.float32 else np.uint16))
    assert np.array_equal(results[0], results[1]), f"set_rows kernel vs reference, R={R} E={E} n={n} {dt}"


def test_set_rows_kernel_leaves_errors_to_the_reference():
    a = np.zeros((4, 8), np.float16)
    b = np.ones((2, 8), np.float32)
    for c, msg in ((np.array([0, 4], np.int64), "out of range"), (np.array([-1, 0], np.int64), "out of range")):
        with refimpl.backend("numba"), pytest.raises(GGMLShapeError, match=msg):
            refimpl.set_rows(a, b, c, out=a)
        assert not a.any(), "nothing is written before the error"
    with refimpl.backend("numba"), pytest.raises(GGMLShapeError, match="contiguous rows"):
        refimpl.set_rows(a, np.ones((2, 16), np.float32)[:, ::2], np.array([0, 1], np.int64))
    with refimpl.backend("numba"), pytest.raises(GGMLShapeError, match="writeable"):
        ro = a.copy()
        ro.flags.writeable = False
        refimpl.set_rows(ro, b, np.array([0, 1], np.int64), out=ro)


@pytest.mark.parametrize("op", GGML_PROFILE_KERNELS)
@settings(max_examples=examples(N))
@given(data=st.data())
def test_ggml_profile_kernel_matches_the_ggml_emulation(op, data):
    """Under numerics="ggml", the Numba table kernel gives the bits of refimpl.kernels.ggml's NumPy table."""
    case = data.draw(op_cases(op))
    with refimpl.numerics("ggml"):
        with refimpl.backend("numpy"), np.errstate(all="ignore"):
            try:
                ref = case.run()
            except (GGMLShapeError, ValueError, TypeError):
                return
        with refimpl.backend("numba"), np.errstate(all="ignore"):
            got = case.run()
    assert_bits_equal(_values(got), _values(ref), str(case))


@pytest.mark.parametrize("n, k", [(1, 1), (7, 3), (64, 8), (1000, 3), (1000, 124), (1000, 125), (1000, 999),
                                  (4099, 1), (4099, 4099)])
def test_sort_kernels_order_ties_and_specials_as_the_reference(n, k):
    """argsort, top_k and argsort_top_k under "numba" (integer keys; top_k partitions when k <= n/8) against
    the reference's stable order on rows full of ties: -0 beside +0, NaNs of both signs and payloads, +-inf,
    denormals, repeated values at and around top_k's cut."""
    rng = np.random.default_rng(n * 1000 + k)
    pool = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1.0, -1.0, 2.5, 2.5],
                    np.float32)
    a = rng.choice(pool, size=(3, 2, n))
    a[1] = rng.standard_normal((2, n)).astype(np.float32)
    a[2, :, ::3] = np.float32(7.0)                      # ties at the cut of top_k
    a.view(np.uint32)[0, 0, :n // 2][np.isnan(a[0, 0, :n // 2])] |= np.uint32(0x1234)      # NaN payloads
    for fn, kw in ((refimpl.argsort, {"order": 0}), (refimpl.argsort, {"order": 1}), (refimpl.top_k, {"k": k}),
                   (refimpl.argsort_top_k, {"k": k})):
        with refimpl.backend("numpy"):
            ref = fn(a, **kw)
        with refimpl.backend("numba"):
            got = fn(a, **kw)
        assert_bits_equal(got, ref, f"{fn.__name__} {kw} n={n}")


def test_sort_kernels_serve_every_numerics_profile():
    """An order has no roundings: the sort kernels run under the ggml profiles too (the served suite's ggml
    numerics took NumPy's stable argsort, twice exact numerics' time on TOP_K), with the reference's result."""
    from refimpl.kernels import sort as ks
    a = np.random.default_rng(3).standard_normal((2, 5000)).astype(np.float32)
    calls = []
    orig = ks._order
    ks._order = lambda *args: calls.append(1) or orig(*args)
    try:
        for prof in ("exact", "fast", "ggml", "ggml-nollamafile"):
            with refimpl.backend("numba"), refimpl.numerics(prof):
                got = refimpl.top_k(a, 5)
            with refimpl.backend("numpy"):
                assert_bits_equal(got, refimpl.top_k(a, 5), prof)
    finally:
        ks._order = orig
    assert len(calls) == 4
