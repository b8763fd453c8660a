"""The Numba kernels of flash_attn_ext (refimpl/kernels/attention.py) and ssm_scan (refimpl/kernels/ssm.py)
against their NumPy references, through the ops' dispatch: `backend("numba")` vs `backend("numpy")`.

ssm_scan repeats the reference's f32 operations in its order: identical bits. flash_attn_ext evaluates the
reference's f64 formula with its own order for the sums q.k and e.v (and libm's exp and tanh): non-finite
values must sit at the same places, the rest is held element by element to the bound derived for an f64
implementation in another summation order (the ("flash_attn_ext", "f32", "f64-kernel") entry). Inputs come
from the ops' own case strategies (refimpl.testing.op_cases, named_cases) and from strategies here that
make sure of GQA, -inf masks (whole kv tiles too), n_kv off the 64-wide tile, f16 and quantized K/V,
soft-capping, ALiBi, sinks, several sequences; and a few non-finite inputs.
"""
import contextlib

import numpy as np
import pytest

pytest.importorskip("numba", reason="numba is not installed: refimpl.kernels is Numba code")

from hypothesis import given, settings, strategies as st  # noqa: E402
from tests._profiles import examples  # noqa: E402

import refimpl  # noqa: E402
import refimpl.kernels  # noqa: E402
from refimpl import GGMLShapeError, quantize  # noqa: E402
from refimpl.ops import OPS, flash_attn_ext, ssm_scan  # noqa: E402
from refimpl.testing import assert_bits_equal, named_cases, op_cases, tol  # noqa: E402
from refimpl.testing.golden import check_values  # noqa: E402

refimpl.kernels.load()
from refimpl.kernels import attention as k_attn, ssm as k_ssm  # noqa: E402

pytestmark = pytest.mark.equivalence

FA_TOL = tol("flash_attn_ext", "f32", "f64-kernel")
N_DRAWN = 30


def _both(fn, *args, **kwargs):
    """(numba result, NumPy result) of op fn, or (exception, exception)."""
    out = []
    for b in ("numba", "numpy"):
        with refimpl.backend(b), np.errstate(all="ignore"):
            try:
                out.append(fn(*args, **kwargs))
            except (GGMLShapeError, ValueError, TypeError) as e:
                out.append(e)
    return out


def _same_errors(got, ref, what):
    assert isinstance(ref, Exception), f"{what}: the reference did not raise"
    assert type(got) is type(ref) and str(got) == str(ref), f"{what}: {got!r} != {ref!r}"


def _assert_attention_close(got, ref, args, kw, what):
    assert isinstance(got, np.ndarray) and got.dtype == ref.dtype == np.float32, what
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    check_values(got, ref, FA_TOL, what, bound=FA_TOL.bound(*args, **kw))


def _check_case(case):
    got, ref = _both(getattr(refimpl.ops, case.op), *case.args, **case.kwargs)
    if isinstance(ref, Exception):
        _same_errors(got, ref, str(case))
    elif case.op == "ssm_scan":
        assert_bits_equal(got, ref, str(case))
    else:
        _assert_attention_close(got, ref, case.args, case.kwargs, str(case))


@contextlib.contextmanager
def split_work():
    """Every kernel's per-thread minimum at 1 item and 3 threads: the work is cut into ranges whose
    boundaries fall inside heads and sequences."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(k_attn, "PAR_MIN", 1)
        mp.setattr(k_ssm, "PAR_MIN", 1)
        mp.setattr("refimpl.kernels._common.n_threads", lambda: 3)
        yield


@contextlib.contextmanager
def kernel_runs(module, fn):
    """Asserts that module.fn (the compiled kernel) ran inside the block: valid drawn inputs must not
    quietly take the reference fallback."""
    calls = []
    orig = getattr(module, fn)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module, fn, lambda *a: calls.append(1) or orig(*a))
        yield
    assert calls, f"{module.__name__}.{fn} did not run"


# -- the kernels are registered and used ----------------------------------------------------------------------

@pytest.mark.parametrize("name, module", [("flash_attn_ext", k_attn), ("ssm_scan", k_ssm)])
def test_kernel_is_registered(name, module):
    assert OPS[name].kernels.get("numba") is getattr(module, name)


def test_kernels_run_under_numba_only(monkeypatch):
    calls = []
    for mod, fn in ((k_attn, "_attn"), (k_ssm, "_scan")):
        orig = getattr(mod, fn)
        monkeypatch.setattr(mod, fn, lambda *a, _o=orig, _n=fn: calls.append(_n) or _o(*a))
    fa = named_cases("flash_attn_ext")[0]
    sc = named_cases("ssm_scan")[-1]
    for b, expected in (("numba", {"_attn", "_scan"}), ("numpy", set())):
        calls.clear()
        with refimpl.backend(b):
            fa.run()
            sc.run()
        assert set(calls) == expected, b


# -- flash_attn_ext ------------------------------------------------------------------------------------------

@settings(max_examples=examples(N_DRAWN))
@given(case=op_cases("flash_attn_ext"))
def test_flash_attn_matches_reference_on_op_cases(case):
    _check_case(case)


def test_flash_attn_matches_reference_named():
    for case in named_cases("flash_attn_ext"):
        _check_case(case)


KV_KINDS = ["f16", "f32", "q8_0", "bf16"]


def _kv(x, kind):
    return x.astype(np.float16) if kind == "f16" else x if kind == "f32" else quantize(x, kind)


@st.composite
def fa_inputs(draw):
    """(args, kwargs) of flash_attn_ext with every feature the kernel handles drawn on purpose."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kk, vk = draw(st.sampled_from(KV_KINDS)), draw(st.sampled_from(KV_KINDS))
    DK = draw(st.sampled_from([32, 64] if "q8_0" in (kk, vk) or "bf16" in (kk, vk) else [8, 40, 64]))
    DV = DK if vk in ("q8_0", "bf16") else draw(st.sampled_from([8, 16, DK]))
    S, HKV, r = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 4]))
    H = HKV * r                                                    # r > 1: grouped-query attention
    N = draw(st.one_of(st.integers(1, 9), st.integers(64, 70)))
    NKV = draw(st.one_of(st.integers(1, 200), st.sampled_from([64, 128])))
    u = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)       # noqa: E731
    q = u(S, H, N, DK) * draw(st.sampled_from([1.0, 4.0]))
    k, v = _kv(u(S, HKV, NKV, DK), kk), _kv(u(S, HKV, NKV, DV), vk)
    kw = dict(scale=draw(st.sampled_from([1.0, 0.125, 0.37])), logit_softcap=draw(st.sampled_from([0.0, 1.0, 50.0])))
    kind = draw(st.sampled_from(["none", "random", "causal"]))
    if kind != "none":
        m3, m2 = draw(st.sampled_from(sorted({1, S}))), draw(st.sampled_from(sorted({1, HKV, H})))
        rows, cols = N + draw(st.sampled_from([0, 3])), NKV + draw(st.sampled_from([0, 5]))
        m = rng.uniform(-1, 1, (m3, m2, rows, cols))
        if kind == "random":
            m[rng.random(m.shape) < draw(st.sampled_from([0.2, 0.7, 1.0]))] = -np.inf
        else:                                                      # causal: whole kv tiles are -inf
            m[..., np.arange(cols)[None, :] > np.arange(rows)[:, None] + draw(st.integers(0, NKV))] = -np.inf
        kw["mask"] = m.astype(np.float16)
        kw["max_bias"] = draw(st.sampled_from([0.0, 3.0, 8.0]))
    if draw(st.booleans()):
        kw["sinks"] = rng.uniform(-2, 2, H).astype(np.float32)
    if S == 1 and draw(st.booleans()):                             # 3-D operands, as llama.cpp's one sequence
        q, k, v = q[0], k[0], v[0]
    return (q, k, v), kw


@settings(max_examples=examples(N_DRAWN))
@given(inp=fa_inputs())
def test_flash_attn_matches_reference(inp):
    args, kw = inp
    with kernel_runs(k_attn, "_attn"):
        got, ref = _both(flash_attn_ext, *args, **kw)
    _assert_attention_close(got, ref, args, kw, f"{[np.shape(a) for a in args]} {sorted(kw)}")


@settings(max_examples=examples(10))
@given(inp=fa_inputs())
def test_flash_attn_matches_reference_split_over_threads(inp):
    args, kw = inp
    with split_work(), kernel_runs(k_attn, "_attn"):
        got, ref = _both(flash_attn_ext, *args, **kw)
    _assert_attention_close(got, ref, args, kw, f"{[np.shape(a) for a in args]} {sorted(kw)}")


def test_flash_attn_named_split_over_threads():
    with split_work():
        for case in named_cases("flash_attn_ext")[:8]:
            _check_case(case)


def _fa_base(rng, NKV=70):
    u = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)       # noqa: E731
    q, k, v = u(4, 5, 32), u(2, NKV, 32).astype(np.float16), u(2, NKV, 32).astype(np.float16)
    m = rng.uniform(-1, 1, (5, NKV))
    m[:, 64:] = -np.inf                                            # a whole masked tile (the skipped path)
    m[1] = -np.inf                                                 # a fully masked row
    return q, k, v, m.astype(np.float16)


@pytest.mark.parametrize("what", ["masked_row", "masked_row_sinks", "v_inf_masked", "v_nan", "q_nan", "k_inf",
                                  "mask_posinf", "mask_nan", "slopes_underflow", "scale_inf", "sink_nan"])
def test_flash_attn_edge_values(what):
    """Fully masked rows (0), and non-finite q, K, V, mask, slopes, scale, sinks: the kernel's skips must not
    change the reference's answer (a NaN, or a 0 from a NaN total)."""
    rng = np.random.default_rng(7)
    q, k, v, m = _fa_base(rng)
    kw = dict(mask=m, scale=0.2)
    if what == "masked_row_sinks":
        kw["sinks"] = rng.uniform(-2, 2, 4).astype(np.float32)
    elif what == "v_inf_masked":
        v[1, 66, 3] = np.inf                                       # at a masked position: 0 * inf = NaN
    elif what == "v_nan":
        v[0, 5, 0] = np.nan
    elif what == "q_nan":
        q[2, 3, 7] = np.nan
    elif what == "k_inf":
        k[0, 65, 1] = -np.inf
    elif what == "mask_posinf":
        m[3, 10] = np.inf
    elif what == "mask_nan":
        m[0, 2] = np.nan
    elif what == "slopes_underflow":
        kw["max_bias"] = 1000.0                                    # f32 slopes round to 0: 0 * -inf = NaN
    elif what == "scale_inf":
        kw["scale"] = np.inf
    elif what == "sink_nan":
        kw["sinks"] = np.array([0.5, np.nan, -1.0, 2.0], np.float32)
    with kernel_runs(k_attn, "_attn"):
        got, ref = _both(flash_attn_ext, q, k, v, **kw)
    _assert_attention_close(got, ref, (q, k, v), kw, what)
    if what.startswith("masked_row"):
        assert_bits_equal(got[1], ref[1], what)
        assert not np.any(got[1]), what


@pytest.mark.parametrize("bad", ["q_f16", "k_f64", "k_heads", "n_seq", "mask_f32", "mask_short", "alibi_no_mask",
                                 "sinks_len", "k_i8", "q_empty"])
def test_flash_attn_rejects_as_the_reference(bad):
    rng = np.random.default_rng(3)
    q, k, v, m = _fa_base(rng)
    args, kw = [q, k, v], dict(mask=m)
    if bad == "q_f16":
        args[0] = q.astype(np.float16)
    elif bad == "k_f64":
        args[1] = k.astype(np.float64)
    elif bad == "k_heads":
        args[1], args[2] = k[:1].repeat(3, 0), v[:1].repeat(3, 0)          # 3 kv heads for 4 query heads
    elif bad == "n_seq":
        args[0] = np.stack([q, q])
    elif bad == "mask_f32":
        kw["mask"] = m.astype(np.float32)
    elif bad == "mask_short":
        kw["mask"] = np.ascontiguousarray(m[:, :40])
    elif bad == "alibi_no_mask":
        kw = dict(max_bias=2.0)
    elif bad == "sinks_len":
        kw["sinks"] = np.zeros(3, np.float32)
    elif bad == "k_i8":
        args[1] = quantize(k.astype(np.float32), "q8_1")
    elif bad == "q_empty":
        args[0] = q[:, :0]
    got, ref = _both(flash_attn_ext, *args, **kw)
    if isinstance(ref, Exception):
        _same_errors(got, ref, bad)
    else:                                                        # accepted (an empty q): the reference's result
        assert_bits_equal(got, ref, bad)


# -- ssm_scan ------------------------------------------------------------------------------------------------

@settings(max_examples=examples(N_DRAWN))
@given(case=op_cases("ssm_scan"))
def test_ssm_scan_matches_reference_on_op_cases(case):
    _check_case(case)


def test_ssm_scan_matches_reference_named():
    for case in named_cases("ssm_scan"):
        _check_case(case)


@st.composite
def ssm_inputs(draw):
    """Several sequences (sharing initial states or not) of up to 40 tokens, Mamba-1 and Mamba-2, d_state
    across NumPy's pairwise-sum block of 128."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    d_state = draw(st.sampled_from([1, 7, 16, 64, 129, 200]))
    head_dim, n_group = draw(st.integers(1, 6)), draw(st.integers(1, 2))
    n_head = n_group * draw(st.integers(1, 3))
    n_tok, n_seqs = draw(st.integers(1, 40)), draw(st.integers(2, 4))
    n_rs = n_seqs + draw(st.integers(0, 2))
    ids = rng.integers(0, n_rs, n_seqs) if draw(st.booleans()) else rng.permutation(n_rs)[:n_seqs]
    mamba1 = draw(st.booleans())
    u = lambda *s, lo=-1.0, hi=1.0: rng.uniform(lo, hi, s).astype(np.float32)   # noqa: E731
    dtr = draw(st.sampled_from([1.0, 25.0]))
    return (u(n_rs, n_head, head_dim, d_state), u(n_seqs, n_tok, n_head, head_dim),
            u(n_seqs, n_tok, n_head, lo=-dtr, hi=dtr), u(n_head, d_state if mamba1 else 1, lo=-4.0, hi=0.5),
            u(n_seqs, n_tok, n_group, d_state), u(n_seqs, n_tok, n_group, d_state), ids.astype(np.int32))


@settings(max_examples=examples(N_DRAWN))
@given(args=ssm_inputs())
def test_ssm_scan_matches_reference(args):
    with kernel_runs(k_ssm, "_scan"):
        got, ref = _both(ssm_scan, *args)
    assert_bits_equal(got, ref, f"{[a.shape for a in args]}")


@settings(max_examples=examples(10))
@given(args=ssm_inputs())
def test_ssm_scan_matches_reference_split_over_threads(args):
    with split_work(), kernel_runs(k_ssm, "_scan"):
        got, ref = _both(ssm_scan, *args)
    assert_bits_equal(got, ref, f"{[a.shape for a in args]}")


def test_ssm_scan_named_split_over_threads():
    with split_work():
        for case in named_cases("ssm_scan"):
            _check_case(case)


@pytest.mark.parametrize("bad", ["ids_i64", "ids_range", "A_shape", "groups", "x_f16", "dt_shape"])
def test_ssm_scan_rejects_as_the_reference(bad):
    s, x, dt, A, B, C, ids = _ssm_small()
    args = dict(s=s, x=x, dt=dt, A=A, B=B, C=C, ids=ids)
    if bad == "ids_i64":
        args["ids"] = ids.astype(np.int64)
    elif bad == "ids_range":
        args["ids"] = np.array([0, 3], np.int32)
    elif bad == "A_shape":
        args["A"] = np.ones((4, 3), np.float32)
    elif bad == "groups":
        args["B"], args["C"] = (np.concatenate([b] * 3, axis=2) for b in (B, C))   # 3 groups for 4 heads
    elif bad == "x_f16":
        args["x"] = x.astype(np.float16)
    elif bad == "dt_shape":
        args["dt"] = dt[:, :1]
    got, ref = _both(ssm_scan, *args.values())
    _same_errors(got, ref, bad)


def _ssm_small():
    rng = np.random.default_rng(5)
    u = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)      # noqa: E731
    return (u(3, 4, 2, 16), u(2, 5, 4, 2), u(2, 5, 4), u(4, 1), u(2, 5, 1, 16), u(2, 5, 1, 16),
            np.array([2, 0], np.int32))


# -- the kernel's two vector products against their stated order, in Python floats --------------------------

@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 40), rows=st.sampled_from([1, 4]))
@settings(max_examples=examples(30), deadline=None)
def test_row_block_products_are_their_stated_sums(seed, n, rows):
    """simd.vqk64_* and simd.vpv64_*: each lane the f64 sum in index order that their docstrings state --
    q.k from exact products (f32 x f32 fits an f64), e.v each product rounded, then added -- computed here
    one Python float operation at a time (Python floats are IEEE f64: the same roundings)."""
    from numba import njit
    from refimpl.kernels import simd

    rng = np.random.default_rng(seed)
    lda, ldb, nkv = n + 3, 21, 50
    a = (rng.standard_normal(rows * lda + 2) * 2.0 ** rng.integers(-30, 30, rows * lda + 2)).astype(np.float32)
    B = rng.standard_normal(n * ldb + 16 + 5).astype(np.float32)
    e = rng.random((rows, nkv)) * 2.0 ** rng.integers(-60, 5, (rows, nkv))
    e[rng.random((rows, nkv)) < 0.2] = 0.0
    J = np.sort(rng.choice(nkv, size=min(n, nkv), replace=False)).astype(np.intp)
    V = rng.standard_normal(nkv * 19 + 16).astype(np.float32)
    qk, pv = (simd.vqk64_4x16, simd.vpv64_4x16) if rows == 4 else (simd.vqk64_1x16, simd.vpv64_1x16)

    @njit
    def run(a, B, e, J, V, sc, o):
        qk(a, 2, lda, n, B, 5, ldb, sc, 1, 17)
        pv(e.reshape(-1), 0, nkv, J, 1, max(J.size - 1, 0), V, 3, 19, o, 2, 18)

    sc = np.full(rows * 17 + 1, -1.0)
    o0 = rng.standard_normal(rows * 18 + 2)
    o = o0.copy()
    run(a, B, e, J, V, sc, o)
    for r in range(rows):
        for lane in range(16):
            want = 0.0
            for i in range(n):
                want = want + float(a[2 + r * lda + i]) * float(B[5 + i * ldb + lane])
            assert sc[1 + r * 17 + lane].tobytes() == np.float64(want).tobytes(), (r, lane)
            want = float(o0[2 + r * 18 + lane])
            for t in range(1, J.size):
                want = want + float(e[r, J[t]]) * float(V[3 + J[t] * 19 + lane])
            assert o[2 + r * 18 + lane].tobytes() == np.float64(want).tobytes(), (r, lane)
