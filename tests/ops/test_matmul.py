"""Properties of mul_mat, mul_mat_id, out_prod, solve_tri (golden comparisons live in tests/oracle)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests._profiles import examples

import refimpl
from refimpl import dequantize
from refimpl.ops import GGMLShapeError, matmul as M
from refimpl.ops import mul_mat, mul_mat_id, out_prod, solve_tri
from refimpl.testing import assert_nmse
from refimpl.testing.cases.matmul import WEIGHT_TYPES, weight
from refimpl.testing.tolerances import tol
from refimpl.types import GGMLType, type_traits

pytestmark = pytest.mark.property

seeds = st.integers(0, 2**32 - 1)


def _u(rng, *shape):
    return rng.uniform(-1, 1, shape).astype(np.float32)


def _close(actual, expected, what, key):
    assert_nmse(actual, expected, tol(key, "*", "property").nmse, what)


@settings(max_examples=examples(60))
@given(t=st.sampled_from(WEIGHT_TYPES), seed=seeds, n=st.integers(1, 40), m=st.integers(1, 5))
def test_mul_mat_is_dequantize_then_matmul(t, seed, n, m):
    """The exact-mode contract: weights dequantized exactly, f64 dot products, one rounding."""
    rng = np.random.default_rng(seed)
    k = max(type_traits[t].blck_size, 32)
    a = weight(t, _u(rng, n, k))
    b = _u(rng, m, k)
    w = dequantize(a) if not isinstance(a, np.ndarray) else a
    want = (b.astype(np.float64) @ np.asarray(w, np.float64).T).astype(np.float32)
    _close(mul_mat(a, b), want, f"{t.name} n={n} m={m}", "mul_mat")


@settings(max_examples=examples(20))
@given(t=st.sampled_from([GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.F16, GGMLType.F32]), seed=seeds,
       tile=st.integers(1, 7))
def test_mul_mat_tiles_do_not_change_the_result(t, seed, tile):
    """Dequantizing TILE_ROWS rows at a time is an implementation detail: any tile size, same values."""
    rng = np.random.default_rng(seed)
    a, b = weight(t, _u(rng, 2, 19, 256)), _u(rng, 4, 3, 256)
    full = mul_mat(a, b)
    old = M.TILE_ROWS
    try:
        M.TILE_ROWS = tile
        tiled = mul_mat(a, b)
    finally:
        M.TILE_ROWS = old
    _close(tiled, full, f"TILE_ROWS={tile}", "mul_mat")


def test_mul_mat_broadcast_is_repeat_not_tile():
    """ggml's batch broadcast: a batch i serves b batches i*r .. i*r+r-1 (np.repeat), e.g. GQA."""
    rng = np.random.default_rng(0)
    a, b = _u(rng, 2, 5, 8), _u(rng, 6, 3, 8)
    want = np.einsum("hmk,hnk->hmn", b.astype(np.float64), np.repeat(a, 3, axis=0).astype(np.float64))
    _close(mul_mat(a, b), want.astype(np.float32), "repeat", "mul_mat")
    wrong = np.einsum("hmk,hnk->hmn", b.astype(np.float64), np.tile(a, (3, 1, 1)).astype(np.float64))
    assert not np.allclose(mul_mat(a, b), wrong)


def test_mul_mat_never_dequantizes_the_whole_weight(monkeypatch):
    """Quantized weights are dequantized TILE_ROWS rows at a time (the NumPy path; the numba kernels decode
    a few rows at a time into their own small buffer and never call dequantize)."""
    rng = np.random.default_rng(1)
    a, b = weight(GGMLType.Q4_0, _u(rng, 1100, 64)), _u(rng, 2, 64)
    seen = []
    real = M.dequantize
    monkeypatch.setattr(M, "dequantize", lambda q: seen.append(q.shape[0]) or real(q))
    with refimpl.backend("numpy"):
        mul_mat(a, b)
    assert max(seen) <= M.TILE_ROWS and sum(seen) == 1100


@pytest.mark.parametrize("a_dtype,b_dtype,ok", [(np.float32, np.float32, True), (np.float16, np.float16, True),
                                                (np.float16, np.float32, True), (np.float32, np.float16, True),
                                                ("q8_0", np.float16, False)])
def test_mul_mat_b_types(a_dtype, b_dtype, ok):
    """b is f32, exactly the weight's vec_dot_type, or (ggml 0.25.3) f16/bf16 for an f32 weight, widened;
    anything else aborts in ggml-cpu (0.15.3 aborts on f32 x f16 too)."""
    a = refimpl.quantize(np.ones((3, 32), np.float32), a_dtype) if isinstance(a_dtype, str) else \
        np.ones((3, 32), a_dtype)
    b = np.ones((2, 32), b_dtype)
    if ok:
        assert np.array_equal(mul_mat(a, b), np.full((2, 3), 32, np.float32))
    else:
        with pytest.raises(GGMLShapeError, match="src1 must be f32"):
            mul_mat(a, b)


def test_mul_mat_shape_errors_name_both_orders():
    with pytest.raises(GGMLShapeError, match=r"ne \[8, 3\] \(numpy \(3, 8\)\)"):
        mul_mat(np.ones((3, 8), np.float32), np.ones((2, 9), np.float32))
    with pytest.raises(GGMLShapeError, match="multiples"):
        mul_mat(np.ones((2, 3, 8), np.float32), np.ones((3, 2, 8), np.float32))
    with pytest.raises(GGMLShapeError, match="transposed"):
        mul_mat(np.ones((8, 3), np.float32).T, np.ones((2, 8), np.float32))


@settings(max_examples=examples(30))
@given(t=st.sampled_from([GGMLType.F32, GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.IQ4_XS]),
       seed=seeds, n_used=st.integers(1, 4), bcast=st.booleans())
def test_mul_mat_id_is_mul_mat_per_token(t, seed, n_used, bcast):
    """out[t, e] = mul_mat(as_[ids[t, e]], b[t, e % n_b])."""
    rng = np.random.default_rng(seed)
    k = max(type_traits[t].blck_size, 32)
    as_ = weight(t, _u(rng, 5, 7, k))
    b = _u(rng, 3, 1 if bcast else n_used, k)
    ids = rng.integers(0, 5, (3, n_used)).astype(np.int32)
    out = mul_mat_id(as_, b, ids)
    for tok in range(3):
        for e in range(n_used):
            want = mul_mat(as_[int(ids[tok, e])], b[tok, e % b.shape[1]][None])[0]
            _close(out[tok, e], want, f"token {tok} slot {e}", "mul_mat")


def test_mul_mat_id_rejects_bad_ids():
    as_, b = np.ones((2, 3, 8), np.float32), np.ones((4, 1, 8), np.float32)
    with pytest.raises(GGMLShapeError, match="out of range"):
        mul_mat_id(as_, b, np.full((4, 2), 2, np.int32))
    with pytest.raises(GGMLShapeError, match="i32"):
        mul_mat_id(as_, b, np.zeros((4, 2), np.int64))
    with pytest.raises(GGMLShapeError, match="ids.ne0 % b.ne1"):
        mul_mat_id(as_, np.ones((4, 2, 8), np.float32), np.zeros((4, 3), np.int32))


@settings(max_examples=examples(40))
@given(seed=seeds, m=st.integers(1, 9), n=st.integers(1, 9), k=st.integers(1, 40), r=st.integers(1, 3),
       t=st.sampled_from([GGMLType.F32, GGMLType.Q8_0, GGMLType.Q4_K]))
def test_out_prod_is_transposed_mul_mat(seed, m, n, k, r, t):
    """out_prod(a, b)[j, i] = sum_k a[k, i] b[k, j] = mul_mat(a^T, b^T)[j, i] (and it broadcasts alike)."""
    rng = np.random.default_rng(seed)
    blck = type_traits[t].blck_size
    m = m * blck if blck > 1 else m
    r = r if t == GGMLType.F32 else 1
    a, b = weight(t, _u(rng, 2, k, m)), _u(rng, 2 * r, k, n)
    ad = np.asarray(dequantize(a) if not isinstance(a, np.ndarray) else a)
    want = mul_mat(np.ascontiguousarray(ad.swapaxes(-1, -2)), np.ascontiguousarray(b.swapaxes(-1, -2)))
    _close(out_prod(a, b), want, f"{t.name} m={m} n={n} k={k}", "mul_mat")


def test_out_prod_rejects_what_ggml_cpu_aborts_on():
    """bf16 src0 aborts in ggml-cpu (f16 too in 0.15.3; 0.25.3 widens f16, tests/ops/test_ggml_0_25.py)."""
    with pytest.raises(GGMLShapeError, match="src0 must be f32"):
        out_prod(refimpl.quantize(np.ones((4, 32), np.float32), "bf16"), np.ones((4, 2), np.float32))
    q = weight(GGMLType.Q8_0, np.ones((1, 4, 32), np.float32))
    with pytest.raises(GGMLShapeError, match="not broadcast"):
        out_prod(q, np.ones((2, 4, 2), np.float32))


@settings(max_examples=examples(40))
@given(seed=seeds, n=st.integers(1, 30), k=st.integers(1, 6), B=st.integers(1, 3))
def test_solve_tri_solves(seed, n, k, B):
    """A X = B with A's lower triangle (its upper triangle is never read)."""
    rng = np.random.default_rng(seed)
    a = np.tril(_u(rng, B, n, n) / n) + np.eye(n, dtype=np.float32) * rng.uniform(1, 2, (B, 1, n)).astype(np.float32)
    b = _u(rng, B, n, k)
    x = solve_tri(a + np.triu(_u(rng, B, n, n), 1), b)
    _close(np.tril(a).astype(np.float64) @ x.astype(np.float64), b, f"n={n}", "solve_tri")


def test_solve_tri_only_lower_left():
    a, b = np.eye(3, dtype=np.float32), np.ones((3, 2), np.float32)
    with pytest.raises(GGMLShapeError, match="only left=True"):
        solve_tri(a, b, lower=False)
