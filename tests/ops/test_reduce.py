"""Properties of the reductions (bounds from the math, identities; no ggml needed)."""
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from refimpl import GGMLShapeError
from refimpl.ops import argmax, count_equal, cumsum, mean, sum as ggml_sum, sum_rows

pytestmark = pytest.mark.property

f32 = np.float32
shapes = st.lists(st.integers(1, 40), min_size=1, max_size=4).map(tuple)


@st.composite
def arrays(draw, lo=-10.0, hi=10.0, shp=None):
    shp = shp or draw(shapes)
    return np.random.default_rng(draw(st.integers(0, 2**32 - 1))).uniform(lo, hi, shp).astype(np.float32)


def _ulp(v):
    return np.spacing(np.abs(np.float32(v))).astype(np.float64)


@given(arrays())
def test_sum_is_the_f64_sum_rounded_once(x):
    """f64 accumulation errs by at most n * 2^-53 * sum|x|, far below the final f32 rounding (half an ulp)."""
    exact = math.fsum(x.astype(np.float64).ravel())
    slack = x.size * 2.0 ** -53 * float(np.abs(x).astype(np.float64).sum())
    s = ggml_sum(x)
    assert s.shape == (1,) and s.dtype == np.float32
    assert abs(float(s[0]) - exact) <= 0.5 * _ulp(exact) + slack


@given(arrays())
def test_sum_rows_mean_cumsum_agree(x):
    n = x.shape[-1]
    sr = sum_rows(x)
    assert sr.shape == x.shape[:-1] + (1,)
    assert np.array_equal(mean(x), sr / f32(n))                             # the same f32 sum, divided in f32
    c = cumsum(x)
    assert np.array_equal(c[..., :1], x[..., :1])
    assert np.array_equal(c[..., 1:], c[..., :-1] + x[..., 1:])             # sequential: each step one f32 add
    # the f32 prefix sum drifts from the f64 one by at most n * 2^-24 * sum|x|
    bound = n * 2.0 ** -24 * np.abs(x).astype(np.float64).sum(-1, keepdims=True)
    assert (np.abs(c[..., -1:] - sr.astype(np.float64)) <= bound + _ulp(sr)).all()
    assert np.array_equal(ggml_sum(x), ggml_sum(np.ascontiguousarray(x.T).T))   # layout-independent


def test_f16_sum_accumulates_in_f32_and_rounds_once():
    x = np.full((3, 1000), 30.0, np.float16)
    assert ggml_sum(x).dtype == np.float16 and ggml_sum(x)[0] == np.inf        # 90000 > f16 max
    y = np.full((1, 4096), 1.0, np.float16)
    assert ggml_sum(y)[0] == 4096                                               # an f16 accumulator would stop at 2048


@given(st.integers(1, 200), st.integers(1, 6), st.integers(0, 2**32 - 1), st.sampled_from([2, 5, 1000]))
def test_argmax_is_the_last_maximum(n, r, seed, k):
    x = np.random.default_rng(seed).integers(0, k, (r, n)).astype(np.float32)
    i = argmax(x)
    assert i.dtype == np.int32 and i.shape == (r,)
    m = x.max(-1)
    assert (x[np.arange(r), i] == m).all()
    assert all((x[j, i[j] + 1:] < m[j]).all() for j in range(r))               # nothing after it ties


def test_argmax_nan_resets_the_scan_as_ggml():
    x = np.array([[5, np.nan, 1, 0], [5, 1, np.nan, np.nan], [np.nan, np.nan], [-np.inf, -np.inf]], dtype=object)
    rows = [np.array(r, np.float32) for r in x]
    assert [int(argmax(r[None])[0]) for r in rows] == [2, 0, 0, 1]
    with pytest.raises(GGMLShapeError, match="matrix"):
        argmax(np.zeros((2, 2, 3), np.float32))


@given(st.integers(1, 50), st.integers(1, 5), st.integers(0, 2**32 - 1))
def test_count_equal(n, r, seed):
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, 3, (r, n)).astype(np.int32), rng.integers(0, 3, (r, n)).astype(np.int32)
    c = count_equal(a, b)
    assert c.dtype == np.int64 and c.shape == (1,)
    assert c[0] == count_equal(b, a)[0] == int((a == b).sum())
    assert count_equal(a, a)[0] == a.size and count_equal(a.T, np.ascontiguousarray(a.T))[0] == a.size
    with pytest.raises(GGMLShapeError, match="i32"):
        count_equal(a.astype(np.float32), b)
