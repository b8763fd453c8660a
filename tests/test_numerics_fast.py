"""numerics="fast": mul_mat and mul_mat_id sum f32 products in f32, in any order; nothing else changes.

    mul_mat / mul_mat_id   every output within the f32 summation bound of exact mode's (tolerance table,
                           ("mul_mat", "*", "fast")): both backends -- "numpy" (BLAS sgemm on f32 tiles) and
                           "numba" (fused 32-lane f32 decode kernels for Q4_0..Q8_0 with <= DECODE_ROWS rows of
                           b, BLAS for f32 weights of >= 2^18 elements and for prefill, the exact f64 kernels
                           for other decode products)
    numerics="fast"        the keyword runs the kernel with the mode current: the same bits as the context
                           manager, and really f32 sums (differs from exact on inputs where f32 sums must)
    other ops              exact mode bit for bit (rms_norm, soft_max_ext, rope_ext, swiglu, add)
    tiny Llama             logits within ("llama.fast", "*", "exact") of exact mode, the same greedy tokens
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests._profiles import examples

import refimpl
from refimpl import dequantize
from refimpl.ops import add, mul_mat, mul_mat_id, rms_norm, rope_ext, soft_max_ext, swiglu
from refimpl.dispatch import NUMERICS
from refimpl.qtensor import QTensor
from refimpl.testing import BLOCK_KINDS, assert_bits_equal, assert_nmse, make_block, tol
from refimpl.types import as_type, traits

pytestmark = pytest.mark.property

BACKENDS = ["numpy", "numba"]
TYPES = ["f32", "f16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_K", "q6_K"]
FUSED = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0"]       # types with a fused f32 decode kernel (kernels/matmul FAST)
DECODE_ROWS = 8                                        # refimpl.kernels.matmul.DECODE_ROWS (not imported: numba)
KINDS = [k for k in BLOCK_KINDS if k != "f16_overflow"]   # finite weights and sums: the bound assumes no overflow
seeds = st.integers(0, 2**32 - 1)


def _gamma(k: int, u: float) -> float:
    return k * u / (1 - k * u)


FAST_BOUND = tol("mul_mat", "*", "fast")      # a formula, not a Tol field: assert_within_fast_bound


def assert_within_fast_bound(fast, exact, s, k: int, what: str) -> None:
    """|fast - exact| <= (gamma_k(2^-24) + gamma_k(2^-53)) * s + spacing(|exact|) + k * 2^-149 element-wise,
    s = sum_i |w_i b_i| per output (FAST_BOUND.why)."""
    fast, exact = np.asarray(fast), np.asarray(exact)
    assert fast.dtype == np.float32 and fast.shape == exact.shape, (what, fast.dtype, fast.shape, exact.shape)
    assert np.isfinite(exact).all() and np.isfinite(s).all(), f"{what}: the case has non-finite values"
    bound = ((_gamma(k, 2.0 ** -24) + _gamma(k, 2.0 ** -53)) * s
             + np.spacing(np.abs(exact)).astype(np.float64) + k * 2.0 ** -149)
    err = np.abs(fast.astype(np.float64) - exact.astype(np.float64))
    bad = np.argwhere(~(err <= bound))
    if len(bad):
        lines = [f"  at {tuple(int(i) for i in ix)}: fast {fast[tuple(ix)]!r} exact {exact[tuple(ix)]!r} "
                 f"|d| {err[tuple(ix)]:.3e} > bound {bound[tuple(ix)]:.3e}" for ix in bad[:8]]
        raise AssertionError(f"{what}: {len(bad)} of {fast.size} outputs outside the fast bound (k={k}): "
                             f"{FAST_BOUND.why}\n" + "\n".join(lines))


def _weights_f64(a) -> np.ndarray:
    """The exactly dequantized weight (what both modes multiply), as f64."""
    return (dequantize(a) if isinstance(a, QTensor) else np.asarray(a)).astype(np.float64)


def _abs_dots(a, b) -> np.ndarray:
    """sum_i |w_i b_i| for every output of mul_mat(a, b): |b| @ |w|^T with ggml's batch broadcast (np.repeat)."""
    w, x = np.abs(_weights_f64(a)), np.abs(np.asarray(b, np.float64))
    w4, x4 = w.reshape((1,) * (4 - w.ndim) + w.shape), x.reshape((1,) * (4 - x.ndim) + x.shape)
    w4 = np.repeat(np.repeat(w4, x4.shape[0] // w4.shape[0], axis=0), x4.shape[1] // w4.shape[1], axis=1)
    return (x4 @ np.swapaxes(w4, -1, -2)).reshape(x.shape[:-1] + (w.shape[-2],))


def _values(rng, kind: str, e: int, shape) -> np.ndarray:
    return make_block(kind, int(np.prod(shape)), rng, e).reshape(shape)


def _weight(t: str, x: np.ndarray):
    """x (f32, NumPy shape) stored as weight type t."""
    if t == "f32":
        return x
    if t == "f16":
        return x.astype(np.float16)
    return refimpl.quantize(x, t)


def _draw_k(draw, t: str) -> int:
    blck = traits(as_type(t)).blck_size
    if blck == 1:
        return draw(st.integers(1, 300))                     # f32/f16: any k, most not a multiple of 32
    return blck * draw(st.integers(1, 2 if blck == 256 else 8))


@st.composite
def mul_mat_cases(draw, decode: bool):
    """(type, a, b): a (a3, a2, n, k) with 2-4 dims, b (a3*r3, a2*r2, m, k) with at least a's dims; r2*r3*m
    rows of b meet each weight matrix: <= DECODE_ROWS (decode) or more (prefill)."""
    t = draw(st.sampled_from(TYPES))
    k, n = _draw_k(draw, t), draw(st.integers(1, 40))
    a3, a2 = draw(st.sampled_from([(1, 1), (1, 1), (1, 2), (1, 3), (2, 2)]))
    r3, r2 = draw(st.sampled_from([(1, 1), (1, 1), (1, 2), (1, 3), (2, 2)]))
    r = r2 * r3
    m = draw(st.integers(1, DECODE_ROWS // r) if decode else st.integers(DECODE_ROWS // r + 1, DECODE_ROWS // r + 6))
    a_nd = 4 if a3 > 1 else 3 if a2 > 1 else 2
    b_nd = 4 if a3 * r3 > 1 else 3 if a2 * r2 > 1 else draw(st.sampled_from([2, 3]))
    rng = np.random.default_rng(draw(seeds))
    w = _values(rng, draw(st.sampled_from(KINDS)), draw(st.integers(-3, 1)), (a3, a2, n, k))
    b = _values(rng, draw(st.sampled_from(KINDS)), draw(st.integers(-3, 1)), (a3 * r3, a2 * r2, m, k))
    return t, _weight(t, w.reshape(w.shape[4 - a_nd:])), b.reshape(b.shape[4 - b_nd:])


def _check_mul_mat_fast(t, a, b):
    exact = mul_mat.reference(a, b)
    s, k = _abs_dots(a, b), b.shape[-1]
    for be in BACKENDS:
        with refimpl.backend(be):
            fast = mul_mat(a, b, numerics="fast")
        assert_within_fast_bound(fast, exact, s, k, f"mul_mat {t} a{a.shape} b{b.shape} {be}")


@settings(max_examples=examples(60))
@given(case=mul_mat_cases(decode=True))
def test_mul_mat_fast_decode_within_bound(case):
    """<= DECODE_ROWS rows of b per weight matrix (the fused decode kernels), 2-D and batched weights."""
    _check_mul_mat_fast(*case)


@settings(max_examples=examples(30))
@given(case=mul_mat_cases(decode=False))
def test_mul_mat_fast_prefill_within_bound(case):
    """More rows of b per weight matrix (f32 BLAS tiles), 2-D and batched weights."""
    _check_mul_mat_fast(*case)


@pytest.mark.parametrize("t", TYPES)
@pytest.mark.parametrize("m", [1, 3, DECODE_ROWS + 1])
def test_mul_mat_fast_large_within_bound(t, m):
    """Shapes the drawn cases do not reach: k = 1024 (3-D b against a 2-D weight) and enough weight rows
    for the threaded decode drivers and for two TILE_ROWS (512) tiles in prefill."""
    rng = np.random.default_rng(m)
    n, k = 600, 1024 if t != "f32" else 1000
    a = _weight(t, rng.standard_normal((n, k)).astype(np.float32))
    b = rng.standard_normal((2, m, k)).astype(np.float32) if m > 1 else rng.standard_normal((m, k)).astype(np.float32)
    _check_mul_mat_fast(t, a, b)


@pytest.mark.parametrize("t", FUSED + ["f32"])
def test_fused_decode_sees_the_exact_weights(t):
    """One-hot rows of b pick single weight columns: fast mode returns the dequantized values themselves
    (every product w*1 and w*0 exact), so the fused kernels decode bit for bit as refimpl.dequantize."""
    rng = np.random.default_rng(7)
    n, k = 50, 96 if t != "f32" else 45
    a = _weight(t, rng.standard_normal((n, k)).astype(np.float32))
    cols = np.array([0, 1, 17, 31, 32, k - 1])
    b = np.zeros((len(cols), k), np.float32)
    b[np.arange(len(cols)), cols] = 1.0
    want = _weights_f64(a).astype(np.float32)[:, cols].T
    for be in BACKENDS:
        with refimpl.backend(be):
            got = mul_mat(a, b, numerics="fast")
        np.testing.assert_array_equal(got, want, err_msg=f"{t} {be}")


def test_decode_rows_is_the_kernels():
    """The decode/prefill split the drawn cases straddle is the numba kernel's."""
    pytest.importorskip("numba")
    from refimpl.kernels import matmul as km
    assert km.DECODE_ROWS == DECODE_ROWS


@st.composite
def mul_mat_id_cases(draw):
    """(type, as_ (n_expert, n, k), b (n_tok, n_b, k), ids (n_tok, n_used) i32), n_b 1 or n_used."""
    t = draw(st.sampled_from(TYPES))
    k, n = _draw_k(draw, t), draw(st.integers(1, 24))
    n_expert, n_used, n_tok = draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 12))
    n_b = draw(st.sampled_from([1, n_used]))
    rng = np.random.default_rng(draw(seeds))
    w = _values(rng, draw(st.sampled_from(KINDS)), draw(st.integers(-3, 1)), (n_expert, n, k))
    b = _values(rng, draw(st.sampled_from(KINDS)), draw(st.integers(-3, 1)), (n_tok, n_b, k))
    ids = rng.integers(0, n_expert, (n_tok, n_used)).astype(np.int32)
    return t, _weight(t, w), b, ids


@settings(max_examples=examples(40))
@given(case=mul_mat_id_cases())
def test_mul_mat_id_fast_within_bound(case):
    t, as_, b, ids = case
    exact = mul_mat_id.reference(as_, b, ids)
    w = np.abs(_weights_f64(as_))
    x = np.abs(b.astype(np.float64))
    slot = np.arange(ids.shape[1]) % b.shape[1]
    s = np.einsum("tek,tenk->ten", x[:, slot], w[ids])          # out[t, e, :] = as_[ids[t, e]] @ b[t, e % n_b]
    for be in BACKENDS:
        with refimpl.backend(be):
            fast = mul_mat_id(as_, b, ids, numerics="fast")
        assert_within_fast_bound(fast, exact, s, b.shape[-1], f"mul_mat_id {t} {as_.shape} b{b.shape} {be}")


# -- selecting the mode ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("be", BACKENDS)
@pytest.mark.parametrize("t", ["f32", "f16", "q4_0", "q8_0", "q4_K"])
@pytest.mark.parametrize("m", [1, 3, DECODE_ROWS + 4])
def test_numerics_keyword_is_the_context_manager(be, t, m):
    """numerics="fast" on the op == the op inside `with refimpl.numerics("fast")`, bit for bit; and
    numerics="exact" inside the context overrides it back to exact mode."""
    rng = np.random.default_rng(3)
    a = _weight(t, rng.standard_normal((40, 512)).astype(np.float32))
    b = rng.standard_normal((m, 512)).astype(np.float32)
    ids = rng.integers(0, 2, (m, 2)).astype(np.int32)
    a3 = _weight(t, rng.standard_normal((2, 40, 512)).astype(np.float32))
    with refimpl.backend(be):
        kw = mul_mat(a, b, numerics="fast")
        kw_id = mul_mat_id(a3, b[:, None], ids, numerics="fast")
        exact = mul_mat(a, b)
        with refimpl.numerics("fast"):
            ctx = mul_mat(a, b)
            ctx_id = mul_mat_id(a3, b[:, None], ids)
            back = mul_mat(a, b, numerics="exact")
    assert_bits_equal(kw, ctx, f"mul_mat {t} {be}: keyword vs context")
    assert_bits_equal(kw_id, ctx_id, f"mul_mat_id {t} {be}: keyword vs context")
    assert_bits_equal(back, exact, f"mul_mat {t} {be}: numerics='exact' inside the fast context")


@pytest.mark.parametrize("be,t,m", [(be, t, m) for be in BACKENDS for t in FUSED + ["f32", "f16"]
                                    for m in (1, DECODE_ROWS + 4) if (be, t, m) != ("numba", "f16", 1)])
def test_numerics_keyword_really_sums_in_f32(be, t, m):
    """k = 2048 random products: an f32 sum in any order misses the correctly rounded f64 sum somewhere among
    160 outputs (each differs with probability ~1/2), so fast != exact, yet within the bound. A fast path that
    silently ran exact mode would fail here. (Not f16 decode under numba: no fused kernel, fast runs the
    exact f64 kernel there, within the bound. 160 x 2048 f32 weights reach the numba backend's BLAS decode,
    FAST_BLAS_MIN = 2^18 elements; smaller f32 decode products also run the exact kernel.)"""
    rng = np.random.default_rng(11)
    k = 2048
    a = _weight(t, rng.standard_normal((160, k)).astype(np.float32))
    b = rng.standard_normal((m, k)).astype(np.float32)
    exact = mul_mat.reference(a, b)
    with refimpl.backend(be):
        fast = mul_mat(a, b, numerics="fast")
    assert_within_fast_bound(fast, exact, _abs_dots(a, b), k, f"{t} {be}")
    assert np.count_nonzero(fast != exact) > 0, f"{t} {be} m={m}: fast mode returned exact mode's bits"


def test_unknown_mode_is_rejected_with_the_modes_named():
    for raise_it in (lambda: refimpl.numerics("bogus").__enter__(),
                     lambda: mul_mat(np.ones((2, 4), np.float32), np.ones((1, 4), np.float32), numerics="bogus")):
        with pytest.raises(ValueError, match="bogus") as e:
            raise_it()
        for mode in NUMERICS:
            assert repr(mode) in str(e.value), (mode, str(e.value))
    assert set(NUMERICS) == {"exact", "ggml", "ggml-nollamafile", "fast"}


# -- everything else is exact mode ---------------------------------------------------------------------------

def _other_ops(rng, T: int, H: int, D: int) -> dict:
    """name -> callable running one op on (T, H, D)-shaped data, as a Llama layer uses it."""
    x = rng.standard_normal((T, H, D)).astype(np.float32) * 3
    y = rng.standard_normal((T, H, D)).astype(np.float32)
    kq = rng.standard_normal((H, T, T + 3)).astype(np.float32) * 4
    mask = np.where(np.arange(T + 3)[None, :] > np.arange(T)[:, None] + 3, -np.inf, 0).astype(np.float32)
    pos = np.arange(5, 5 + T, dtype=np.int32)
    return {"rms_norm": lambda: rms_norm(x, 1e-5),
            "soft_max_ext": lambda: soft_max_ext(kq, mask, 0.125, 0.0),
            "soft_max_ext_alibi": lambda: soft_max_ext(kq, mask, 0.125, 8.0),
            "rope_ext": lambda: rope_ext(x, pos, None, n_dims=D, freq_base=50000.0),
            "rope_ext_neox": lambda: rope_ext(x, pos, None, n_dims=D, mode=2, freq_base=10000.0),
            "swiglu": lambda: swiglu(x, y),
            "add": lambda: add(x, y[:1])}


@pytest.mark.parametrize("be", BACKENDS)
@pytest.mark.parametrize("shape", [(1, 4, 16), (7, 2, 64), (33, 8, 32)])
def test_other_ops_are_exact_mode(be, shape):
    """The documented contract: only mul_mat / mul_mat_id change under numerics="fast"."""
    ops = _other_ops(np.random.default_rng(sum(shape)), *shape)
    with refimpl.backend(be):
        for name, run in ops.items():
            exact = run()
            with refimpl.numerics("fast"):
                fast = run()
            assert_bits_equal(fast, exact, f"{name} {shape} {be}")


# -- a tiny Llama ---------------------------------------------------------------------------------------------

TOKENS = [5, 17, 3, 90, 42, 42, 7, 0, 64, 11, 33, 2, 8, 71, 19, 50]


@pytest.fixture(scope="module", params=["f32", "q8_0", "q4_0", "q4_1"])
def tiny_llama(request, tmp_path_factory):
    from refimpl.models import llama
    from .models.tiny import write_tiny_llama
    return llama.load(write_tiny_llama(tmp_path_factory.mktemp("fast") / "tiny.gguf", wtype=request.param))


@pytest.mark.parametrize("be", BACKENDS)
def test_tiny_llama_fast_logits_close_to_exact(tiny_llama, be):
    """Prefill of 16 tokens (f32 tiles) and the same tokens one at a time (decode kernels): logits at every
    position close to exact mode's one-shot prefill, and the same argmax everywhere."""
    from refimpl.models import llama
    m = tiny_llama
    with refimpl.backend(be):
        exact = llama.forward(m, TOKENS, llama.new_cache(m, 32))
        with refimpl.numerics("fast"):
            prefill = llama.forward(m, TOKENS, llama.new_cache(m, 32))
            c = llama.new_cache(m, 32)
            steps = np.concatenate([llama.forward(m, [t], c) for t in TOKENS])
    bound = tol("llama.fast", "*", "exact").nmse
    for what, got in (("prefill", prefill), ("token by token", steps)):
        assert_nmse(got, exact, bound, f"fast {what} vs exact ({be})")
        # (numba, f32 weights, one token at a time: every tiny f32 matrix is under FAST_BLAS_MIN, so decode
        # runs the exact kernels -- fast mode may keep exact mode's bits there)
        if not (be == "numba" and what == "token by token" and isinstance(m.layers[0].attn_q, np.ndarray)):
            assert not np.array_equal(got, exact), f"{what}: fast mode gave exact mode's bits"
        np.testing.assert_array_equal(got.argmax(-1), exact.argmax(-1), err_msg=f"{what} ({be}): argmax")


def test_tiny_llama_fast_greedy_decode_matches_exact(tiny_llama):
    """24 greedy tokens after a 4-token prompt, decoded one at a time: the same tokens in both modes."""
    from refimpl.models import llama

    def greedy(mode):
        with refimpl.numerics(mode):
            c = llama.new_cache(tiny_llama, 32)
            logits, out = llama.forward(tiny_llama, TOKENS[:4], c), []
            for _ in range(24):
                out.append(int(np.argmax(logits[-1])))
                logits = llama.forward(tiny_llama, [out[-1]], c)
        return out
    assert greedy("fast") == greedy("exact")
