"""kernels._common.pairwise_sum_f64: NumPy's pairwise summation in f64 (what the reference's row sums,
`np.sum(row, dtype=np.float64)`, compute on one buffer), which the norm, softmax, attention and ssm kernels
use for their bits. A block's eight accumulators run as one f64 vector (`simd.vsum8`) on contiguous rows and
lane by lane on strided ones; rows up to ~4,000 elements recurse without allocating. Every length class
(< 8, one block, every split depth, the allocating walk), offsets, f32 and f64, contiguous and strided rows,
magnitudes that make the order visible and non-finite values: the bits of NumPy's sum of the same elements.
"""
import numpy as np
import pytest

pytest.importorskip("numba", reason="numba is not installed: refimpl.kernels is Numba code")

from hypothesis import given, settings, strategies as st  # noqa: E402
from tests._profiles import examples  # noqa: E402
from numba import njit  # noqa: E402

from refimpl.kernels._common import pairwise_sum_f64  # noqa: E402


pytestmark = pytest.mark.equivalence

@njit(cache=False)
def _sum(x, lo, n):
    return pairwise_sum_f64(x, lo, n)


def _numpy(x, lo, n) -> float:
    # one contiguous buffer of at most 8192 elements: NumPy's reduction is one pairwise_sum call
    return float(np.sum(np.ascontiguousarray(x[lo:lo + n]), dtype=np.float64)) if n else 0.0


def _same(a: float, b: float) -> bool:
    return (a != a and b != b) or np.float64(a).view(np.uint64) == np.float64(b).view(np.uint64)


@settings(max_examples=examples(300), deadline=None)
@given(n=st.one_of(st.integers(0, 300), st.integers(300, 8192)), lo=st.integers(0, 9),
       dtype=st.sampled_from([np.float32, np.float64]), strided=st.booleans(), seed=st.integers(0, 2**32 - 1),
       special=st.sampled_from([None, np.nan, np.inf, -np.inf]))
def test_pairwise_sum_is_numpys(n, lo, dtype, strided, seed, special):
    rng = np.random.default_rng(seed)
    base = (rng.standard_normal(n + lo) * 10.0 ** rng.uniform(-8, 8, n + lo)).astype(dtype)
    if special is not None and n:
        base[lo + rng.integers(n)] = special
    x = np.repeat(base, 2)[::2] if strided else base                   # same values, stride 2 elements
    assert x.flags.c_contiguous != strided or x.size < 2
    got, want = _sum(x, lo, n), _numpy(base, lo, n)
    assert _same(got, want), (n, lo, dtype, strided, got, want)


@pytest.mark.parametrize("n", [7, 8, 9, 127, 128, 129, 136, 255, 256, 264, 384, 576, 1536, 2048, 4096, 4104, 8192])
def test_pairwise_sum_lengths_at_the_splits(n):
    rng = np.random.default_rng(n)
    for dtype in (np.float32, np.float64):
        x = (rng.standard_normal(n + 3) * 10.0 ** rng.uniform(-12, 12, n + 3)).astype(dtype)
        for lo in (0, 3):
            assert _same(_sum(x, lo, n), _numpy(x, lo, n)), (n, dtype, lo)


def test_pairwise_sum_rejects_a_range_outside_the_row():
    x = np.ones(100, np.float32)
    with pytest.raises(IndexError, match="pairwise_sum_f64"):
        _sum(x, 50, 60)
