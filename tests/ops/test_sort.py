"""Properties of argsort, top_k, argsort_top_k (no ggml needed)."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from refimpl import GGMLShapeError
from refimpl.ops import argsort, argsort_top_k, top_k
from refimpl.ops.sort import SORT_ORDER_ASC, SORT_ORDER_DESC
from refimpl.testing import ggml_ne


pytestmark = pytest.mark.property

@st.composite
def rows(draw):
    """f32 tensors (NumPy order) whose rows often tie: few distinct values, +0 and -0, +-inf."""
    ne = draw(ggml_ne)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    pool = np.array(draw(st.lists(st.sampled_from([0.0, -0.0, 1.0, -1.5, 3e38, -np.inf, np.inf, 1e-45, 2.5]),
                                  min_size=1, max_size=6)) + list(rng.uniform(-1, 1, 3)), np.float32)
    return pool[rng.integers(0, len(pool), tuple(reversed(ne)))]


@given(a=rows(), order=st.sampled_from([SORT_ORDER_ASC, SORT_ORDER_DESC]))
def test_argsort_gives_a_stable_sorting_permutation(a, order):
    idx = argsort(a, order)
    assert idx.dtype == np.int32 and idx.shape == a.shape
    assert np.array_equal(np.sort(idx, axis=-1), np.broadcast_to(np.arange(a.shape[-1]), a.shape))
    v = np.take_along_axis(a, idx.astype(np.int64), -1)
    with np.errstate(invalid="ignore"):                                  # inf - inf
        step = np.diff(v, axis=-1) if order == SORT_ORDER_ASC else -np.diff(v, axis=-1)
    assert not (step < 0).any()                                         # sorted (inf - inf is nan, not < 0)
    ties = v[..., 1:] == v[..., :-1]
    assert (np.diff(idx, axis=-1)[ties] > 0).all()                      # equal values in index order


@given(a=rows(), data=st.data())
def test_top_k_is_the_first_k_of_the_descending_argsort(a, data):
    k = data.draw(st.integers(0, a.shape[-1]))
    got = top_k(a, k)
    assert got.dtype == np.int32 and got.shape == a.shape[:-1] + (k,)
    assert np.array_equal(got, argsort(a, SORT_ORDER_DESC)[..., :k])
    assert np.array_equal(argsort_top_k(a, k), got)
    kept = np.take_along_axis(a, got.astype(np.int64), -1)              # the k largest values, as a multiset
    assert np.array_equal(np.sort(kept, axis=-1), np.sort(a, axis=-1)[..., a.shape[-1] - k:])


def test_sort_examples():
    a = np.array([[3.0, -1.0, 2.0, 2.0, -0.0, 0.0]], np.float32)
    assert argsort(a).tolist() == [[1, 4, 5, 2, 3, 0]]                   # -0 == +0: index order
    assert argsort(a, SORT_ORDER_DESC).tolist() == [[0, 2, 3, 4, 5, 1]]
    assert top_k(a, 3).tolist() == [[0, 2, 3]]
    nan = np.array([1.0, np.nan, 2.0], np.float32)                       # ggml: undefined; here nan is largest
    assert argsort(nan).tolist() == [0, 2, 1] and top_k(nan, 1).tolist() == [1]


def test_sort_errors():
    a = np.zeros((2, 5), np.float32)
    with pytest.raises(GGMLShapeError, match="f32"):
        argsort(a.astype(np.float16))
    with pytest.raises(GGMLShapeError, match="order"):
        argsort(a, 2)
    with pytest.raises(GGMLShapeError, match="k <= a.ne0"):
        top_k(a, 6)
    with pytest.raises(GGMLShapeError, match="k <= a.ne0"):
        argsort_top_k(a, -1)
