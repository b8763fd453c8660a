"""numerics="ggml" against live ggml: identical bits, not closeness.

mul_mat for every weight type with a faithful kernel (refimpl/ops/faithful): hypothesis shapes (k a
multiple of the block size, decode n=1 and batches, block broadcast over dims 2/3, strided views) and
adversarial values (Q8 rounding ties, zero blocks, outliers, a wide dynamic range across blocks, random
block bytes, pre-converted activations holding -128). Then a fixed-seed report of exact-mode vs
faithful-mode NMSE against ggml per type (`pytest -s` prints it; docs/numerics.md quotes it).
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests._profiles import examples

from refimpl.kernels.ggml.matmul import SUPPORTED
from refimpl.ops.matmul import VEC_DOT_TYPE, mul_mat
from refimpl.qtensor import QTensor, quantize
from refimpl.testing import named_cases, nmse, op_cases
from refimpl.testing.cases._draw import maybe_view
from refimpl.testing.tolerances import tol
from refimpl.types import GGMLType, type_traits

# ggml-python's build has no llamafile sgemm: its numerics profile is "ggml-nollamafile"
pytestmark = pytest.mark.oracle

GGML_PY = "ggml-nollamafile"

FLOATS = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
# codebook types: ggml quantizes them only with an importance matrix or a slow lattice search, so their
# weights are random block bytes here
GRID_TYPES = (GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S, GGMLType.IQ3_XXS, GGMLType.IQ3_S,
              GGMLType.IQ1_S, GGMLType.IQ1_M)
# the types ggml-python (0.15.3) has: Q2_0 (0.25.3) is checked by test-backend-ops in ggml numerics (tests/rpc)
TYPES = sorted((t for t in SUPPORTED if t != GGMLType.Q2_0), key=int)
# examples per weight type: a quarter of the profile's (dev 10, ci 75), each one ggml graph
EXAMPLES = max(10, settings().max_examples // 4)


@pytest.fixture(autouse=True)
def _numpy_backend():
    """The emulations are NumPy code: run every op through its reference, whatever REFIMPL_BACKEND says
    (kernels of other backends implement exact mode only)."""
    import refimpl
    with refimpl.backend("numpy"):
        yield


def _name(t) -> str:
    return type_traits[t].name


def _ggml_mul_mat(oracle, a, b):
    # valid by construction (refimpl's mul_mat checked the shapes first): run in-process, no fork
    return oracle.run(lambda ctx, x, y: oracle.lib().ggml_mul_mat(ctx, x, y), a, b, isolate=False)


def assert_same_bits(actual, expected, what: str) -> None:
    """Bit equality of two f32 (or two f16) results; NaNs only need to sit in the same places (payloads
    may differ)."""
    a, e = np.asarray(actual), np.asarray(expected)
    if a.dtype != e.dtype:
        raise AssertionError(f"{what}: dtype {a.dtype} != expected {e.dtype}")
    e = e.reshape(a.shape)
    na, ne_ = np.isnan(a), np.isnan(e)
    if not np.array_equal(na, ne_):
        raise AssertionError(f"{what}: NaN at {np.argwhere(na != ne_)[:5].tolist()} in one result only")
    u, i = {2: (np.uint16, np.int16), 4: (np.uint32, np.int32)}[a.dtype.itemsize]
    bad = (a.view(u) != e.view(u)) & ~na
    if bad.any():
        ix = np.argwhere(bad)[:5]
        ulp = np.abs(a.view(i).astype(np.int64) - e.view(i).astype(np.int64))[bad].max()
        raise AssertionError(f"{what}: {bad.sum()} of {a.size} differ (max {ulp} ulp), first at "
                             f"{ix.tolist()}: {a[tuple(ix[0])]!r} != {e[tuple(ix[0])]!r}")


# -- values -----------------------------------------------------------------------------------------------

VALUE_KINDS = ("uniform", "normal", "ties", "sparse", "outliers", "wide")


def _values(kind: str, shape, seed: int, t: GGMLType) -> np.ndarray:
    """f32 test values; `t` bounds the range where f16 would overflow."""
    rng = np.random.default_rng(seed)
    k = shape[-1]
    if kind == "uniform":
        x = rng.uniform(-1, 1, shape)
    elif kind == "normal":
        x = rng.normal(0, 1, shape)
    elif kind == "ties":            # amax 127 per 32-block: 127/amax = 1 and every x*id is a half-integer tie
        x = rng.integers(-254, 255, shape) / 2.0
        if k % 32 == 0:
            x.reshape(-1, 32)[:, 0] = 127.0 * rng.choice([-1, 1], x.size // 32)
    elif kind == "sparse":          # exact zeros, whole zero blocks
        x = rng.normal(0, 1, shape) * (rng.random(shape) < 0.3)
        if k % 32 == 0:
            x.reshape(-1, 32)[rng.random(x.size // 32) < 0.4] = 0.0
    elif kind == "outliers":
        x = rng.normal(0, 1, shape)
        x[rng.random(shape) < 0.02] *= 1000.0
    else:                           # block-wise magnitudes over 2^-20 .. 2^12: large cancellations in the sums
        g = 32 if k % 32 == 0 else 1
        scale = 2.0 ** rng.uniform(-20, 12, x_shape := (int(np.prod(shape)) // g, 1))
        x = (rng.normal(0, 1, x_shape[:1] + (g,)) * scale).reshape(shape)
    return x.astype(np.float32)


def _random_blocks(t: GGMLType, shape, seed: int) -> QTensor:
    """Random block bytes of type t with sane scales: f16 `d` (and Q4_1/Q5_1/K-quant `dmin`, Q8_1 `s`) set
    to finite values of a few magnitudes, Q8_K's f32 `d` too; every level and sub-scale byte random."""
    tr = type_traits[t]
    rng = np.random.default_rng(seed)
    nblk = int(np.prod(shape)) // tr.blck_size
    raw = rng.integers(0, 256, (nblk, tr.type_size), dtype=np.uint8)
    def d():
        v = rng.uniform(0.001, 0.05, nblk) * rng.choice([-1, 1], nblk)
        return v.astype("<f2").view(np.uint8).reshape(-1, 2)
    offs = {GGMLType.Q4_0: [0], GGMLType.Q4_1: [0, 2], GGMLType.Q5_0: [0], GGMLType.Q5_1: [0, 2],
            GGMLType.Q8_0: [0], GGMLType.Q8_1: [0, 2], GGMLType.IQ4_NL: [0], GGMLType.IQ4_XS: [0],
            GGMLType.Q2_K: [80, 82], GGMLType.Q3_K: [108], GGMLType.Q4_K: [0, 2], GGMLType.Q5_K: [0, 2],
            GGMLType.Q6_K: [208], GGMLType.Q1_0: [0], GGMLType.TQ1_0: [52], GGMLType.TQ2_0: [64],
            **{g: [0] for g in GRID_TYPES if g != GGMLType.IQ1_M}}
    if t == GGMLType.MXFP4:                          # E8M0 scales 2^-10 .. 2^2
        raw[:, 0] = rng.integers(118, 131, nblk)
    if t == GGMLType.IQ1_M:                          # d's four nibbles: the top nibbles of the u16 scales
        dv = d()[:, 0:2].copy().view("<u2").astype(np.uint32)[:, 0]
        sc = raw[:, 48:56].copy().view("<u2")
        for i in range(4):
            sc[:, i] = (sc[:, i] & 0x0FFF) | (((dv >> (4 * i)) & 0xF) << 12).astype(np.uint16)
        raw[:, 48:56] = sc.view(np.uint8)
    if t == GGMLType.Q8_K:
        dk = rng.uniform(0.001, 0.05, nblk) * rng.choice([-1, 1], nblk)
        raw[:, 0:4] = dk.astype("<f4").view(np.uint8).reshape(-1, 4)
        raw[:, 260:292] = rng.integers(-2032, 2033, (nblk, 16)).astype("<i2").view(np.uint8)   # bsums in range
    for o in offs.get(t, []):
        raw[:, o:o + 2] = d()
    return QTensor(t, raw.reshape(tuple(shape[:-1]) + (-1,)), shape)


def _weights(t: GGMLType, shape, kind: str, seed: int, random_bytes: bool):
    x = _values(kind, shape, seed, t)
    if t == GGMLType.F32:
        return x
    if t == GGMLType.F16:
        return np.clip(x, -6e4, 6e4).astype(np.float16)
    if t == GGMLType.BF16:
        return quantize(x, t, method="ref")
    return _random_blocks(t, shape, seed) if random_bytes or t in GRID_TYPES else quantize(x, t)


def _row_step(q: QTensor) -> QTensor:
    """The same rows as a view with a doubled row stride (ggml_view with a larger nb1)."""
    d = q.data.reshape(-1, q.data.shape[-1])
    big = np.zeros((d.shape[0] * 2, d.shape[1]), np.uint8)
    big[::2] = d
    return QTensor(q.type, big[::2].reshape(q.data.shape), q.shape)


@st.composite
def faithful_cases(draw, t: GGMLType):
    """(a, b, name): a weight of type t and activations (f32, or already t's vec_dot_type)."""
    blck = type_traits[t].blck_size
    if blck == 1:
        k = draw(st.one_of(st.integers(1, 100), st.sampled_from([127, 128, 255, 256, 300, 1027])))
    elif blck == 32:
        k = 32 * draw(st.integers(1, 12))
    else:
        k = 256 * draw(st.integers(1, 4))
    n = draw(st.integers(1, 20))
    m = draw(st.sampled_from([1, 1, 2, 3, 5, 8]))
    a2, a3, r2, r3 = (draw(st.integers(1, 2)) for _ in range(4))
    wkind, xkind = draw(st.sampled_from(VALUE_KINDS)), draw(st.sampled_from(VALUE_KINDS))
    random_bytes = t not in FLOATS and draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    a = _weights(t, (a3, a2, n, k), wkind, seed, random_bytes)
    b = _values(xkind, (a3 * r3, a2 * r2, m, k), seed + 1, t)
    tb = VEC_DOT_TYPE[t]
    pre = tb != GGMLType.F32 and draw(st.booleans())
    if pre:     # b handed over in the vec_dot type: converted as ggml would, or random Q8 bytes (-128 levels)
        if tb == GGMLType.F16:
            b = np.clip(b, -6e4, 6e4).astype(np.float16)
        elif tb == GGMLType.BF16:
            b = quantize(b, tb, method="ref")
        else:
            b = _random_blocks(tb, b.shape, seed + 2) if draw(st.booleans()) else quantize(b, tb, method="cpu")
    if isinstance(a, QTensor):
        a = _row_step(a) if draw(st.booleans()) else a
    else:
        a = maybe_view(draw, a)
    if isinstance(b, QTensor):
        b = _row_step(b) if draw(st.booleans()) else b
    else:
        b = maybe_view(draw, b)
    name = (f"MUL_MAT(type_a={_name(t)},type_b={_name(tb) if pre else 'f32'},m={n},n={m},k={k},bs=[{a2},{a3}],"
            f"nr=[{r2},{r3}],w={wkind}{'+bytes' if random_bytes else ''},x={xkind})")
    return a, b, name


@pytest.mark.parametrize("t", TYPES, ids=_name)
def test_mul_mat_faithful_is_bit_exact(ggml, t):
    assert tol("mul_mat", _name(t), "ggml-faithful").exact

    @settings(max_examples=examples(EXAMPLES))
    @given(case=faithful_cases(t))
    def check(case):
        a, b, name = case
        with np.errstate(all="ignore"):
            r = mul_mat(a, b, numerics=GGML_PY)
        assert_same_bits(r, _ggml_mul_mat(ggml, a, b), name)
    check()


@pytest.mark.parametrize("t", [GGMLType.F32, GGMLType.F16], ids=_name)
def test_mul_mat_faithful_non_finite(ggml, t):
    """inf and NaN operands: the same NaN positions and the same infinities."""
    rng = np.random.default_rng(5)
    a = rng.normal(0, 1, (9, 77)).astype(np.float32)
    b = rng.normal(0, 1, (4, 77)).astype(np.float32)
    a[1, 3], a[2, 40], b[0, 70], b[2, 5] = np.inf, np.nan, -np.inf, np.inf
    a = a.astype(np.float16) if t == GGMLType.F16 else a
    with np.errstate(all="ignore"):
        r = mul_mat(a, b, numerics=GGML_PY)
    assert_same_bits(r, _ggml_mul_mat(ggml, a, b), f"{_name(t)} non-finite")


@pytest.mark.parametrize("t", [GGMLType.Q6_K, GGMLType.IQ4_XS, GGMLType.Q8_0], ids=_name)
def test_mul_mat_faithful_large_lane_sums(ggml, t):
    """Extreme levels everywhere, so the int32 lane sums pass 2^24 and their conversion to f32 rounds."""
    k, blck = 512, type_traits[t].blck_size
    a = _random_blocks(t, (6, k), 1)
    raw = a.data.reshape(-1, type_traits[t].type_size)
    if t == GGMLType.Q6_K:
        raw[:, 0:192] = 0xFF                          # u = 63 everywhere
        raw[:, 192:208] = 0x80                        # scales -128
    elif t == GGMLType.IQ4_XS:
        raw[:, 2:8] = 0x00                            # scales -32
        raw[:, 8:136] = 0x00                          # K[0] = -127
    else:
        raw[:, 2:34] = 0x80                           # -128
    b = _random_blocks(VEC_DOT_TYPE[t], (3, k), 2)
    qb = b.data.reshape(-1, type_traits[b.type].type_size)
    qoff = {GGMLType.Q8_K: 4, GGMLType.Q8_0: 2}[b.type]
    qb[:, qoff:qoff + (256 if b.type == GGMLType.Q8_K else 32)] = 0x80      # -128
    assert blck <= k
    assert_same_bits(mul_mat(a, b, numerics=GGML_PY), _ggml_mul_mat(ggml, a, b), f"{_name(t)} extreme lanes")


def test_mul_mat_id_faithful_is_bit_exact(ggml):
    """mul_mat_id's golden cases (refimpl.testing.op_cases) for the weight types with a faithful kernel."""
    from refimpl.ops.matmul import mul_mat_id
    from refimpl.testing.cases.matmul import mul_mat_id_cases

    @settings(max_examples=examples(2 * EXAMPLES))
    @given(case=mul_mat_id_cases(tuple(TYPES)))
    def check(case):
        with np.errstate(all="ignore"):
            r = case.run(lambda *a, **k: mul_mat_id(*a, numerics=GGML_PY, **k))
        assert_same_bits(r, case.run_ggml(), case.name)
    check()


# -- the row ops around mul_mat ----------------------------------------------------------------------------

ROW_OPS = ("rms_norm", "norm", "soft_max_ext", "rope_ext", "silu", "swiglu")


@pytest.mark.parametrize("op", ROW_OPS)
def test_row_op_faithful_is_bit_exact(ggml, op):
    """Every golden case of the op (refimpl.testing.op_cases and the named ones), numerics=GGML_PY: identical
    bits, f16 results included."""
    assert tol(op, "*", "ggml-faithful").exact

    def check_case(case):
        with np.errstate(all="ignore"):
            r = case.run(lambda *a, **k: getattr(__import__("refimpl").ops, op)(*a, numerics=GGML_PY, **k))
        assert_same_bits(r, case.run_ggml(), case.name)

    for case in named_cases(op):
        check_case(case)

    @settings(max_examples=examples(EXAMPLES))
    @given(case=op_cases(op))
    def check(case):
        check_case(case)
    check()


# -- report: exact vs faithful NMSE against ggml ---------------------------------------------------------

REPORT_SHAPES = {"decode": (256, 1, 1024), "batch": (64, 16, 1024)}     # (weight rows, activation rows, k)


def test_faithful_nmse_report(ggml):
    """Exact-mode and faithful-mode NMSE against ggml per weight type (fixed seeds, unit-normal activations,
    weights quantized from U(-1, 1)). Faithful must be 0 (bit-exact); for types ggml rounds activations for,
    exact mode sits at 1e-8 (f16) .. 1e-4 (Q8 blocks)."""
    rows = []
    for t in TYPES:
        for shape_name, (n, m, k) in REPORT_SHAPES.items():
            rng = np.random.default_rng(int(t) * 100 + len(shape_name))
            a = _weights(t, (n, k), "uniform", int(rng.integers(1 << 30)), False)
            b = rng.normal(0, 1, (m, k)).astype(np.float32)
            e = _ggml_mul_mat(ggml, a, b).reshape(m, n)
            ex, fa = nmse(mul_mat(a, b), e), nmse(mul_mat(a, b, numerics=GGML_PY), e)
            rows.append((_name(t), shape_name, ex, fa))
            assert fa == 0.0, f"{_name(t)} {shape_name}: faithful NMSE {fa:.3e} (not bit-exact)"
            assert fa <= ex / 100
    print("\nmul_mat NMSE vs ggml (exact mode | faithful mode)")
    for name, shape_name, ex, fa in rows:
        print(f"  {name:7s} {shape_name:6s}  {ex:9.2e} | {fa:.1e}")


def test_faithful_row_ops_report(ggml):
    """Exact-mode vs faithful-mode NMSE against ggml for the row ops, over their named golden cases: the
    worst case and the share of cases whose exact-mode bits already match."""
    import refimpl
    print("\nrow ops vs ggml over the named cases (exact: worst NMSE, bit-exact cases | faithful)")
    for op in ROW_OPS:
        fn = getattr(refimpl.ops, op)
        worst_ex = worst_fa = 0.0
        same = 0
        cases = named_cases(op)
        for case in cases:
            e = case.run_ggml()
            with np.errstate(all="ignore"):
                ex = case.run(lambda *a, **k: fn(*a, numerics="exact", **k))
                fa = case.run(lambda *a, **k: fn(*a, numerics=GGML_PY, **k))
            e64 = np.asarray(e, np.float64).reshape(np.shape(ex))
            fin = np.isfinite(e64)
            worst_ex = max(worst_ex, nmse(np.asarray(ex, np.float64)[fin], e64[fin]))
            worst_fa = max(worst_fa, nmse(np.asarray(fa, np.float64)[fin], e64[fin]))
            a_, e_ = np.ascontiguousarray(ex), np.ascontiguousarray(np.asarray(e).reshape(np.shape(ex)))
            same += bool(np.array_equal(a_.view(np.uint8), e_.view(np.uint8)))
        assert worst_fa == 0.0, f"{op}: faithful NMSE {worst_fa:.2e}"
        print(f"  {op:12s} {worst_ex:9.2e}  {same:3d}/{len(cases):<3d} | {worst_fa:.1e}")


def test_mul_mat_faithful_fma_rounds_once(ggml):
    """An FMA whose f64 sum lands on an f32 rounding tie: fma((1+2^-12)^2 + 2^-80) is 1 + 2^-11 + 2^-23;
    rounding the f64 sum (exactly the tie 1 + 2^-11 + 2^-24) again to f32 would give 1 + 2^-11. Random
    operands never hit this (0 in 8e7 draws), so it is built: k = 2 runs F32's scalar FMA tail twice."""
    x = np.array([[2.0 ** -40, 1 + 2.0 ** -12]], np.float32)
    r = mul_mat(x, x, numerics=GGML_PY)
    assert r[0, 0] == np.float32(1 + 2.0 ** -11 + 2.0 ** -23)
    assert_same_bits(r, _ggml_mul_mat(ggml, x, x), "fma tie")
