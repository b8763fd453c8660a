"""ggml's layout predicates (refimpl.shapes): the answers read from NumPy's attributes for an ndarray are those of
ggml's ne/nb rule, which every other array (a QTensor, a device array) goes through."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from refimpl import shapes

pytestmark = pytest.mark.property


class _Strided:
    """An array that is not an ndarray (as a device array is): the predicates take the ne/nb path for it."""

    def __init__(self, a):
        self.shape, self.strides, self.dtype = a.shape, a.strides, a.dtype


@st.composite
def views(draw):
    nd = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=nd, max_size=nd)))
    a = np.zeros(tuple(s * 2 for s in shape) or (), np.float32)
    steps = tuple(draw(st.sampled_from([1, 2])) for _ in shape)
    v = a[tuple(slice(0, s * k, k) for s, k in zip(shape, steps))] if shape else a
    if nd >= 2 and draw(st.booleans()):
        v = np.swapaxes(v, -1, -2)
    return v


@given(views())
def test_the_ndarray_answers_are_ggmls(v):
    for f in (shapes.rows_packed, shapes.is_contiguous, shapes.is_contiguous_1, shapes.is_transposed):
        assert f(v) == f(_Strided(v)), (f.__name__, v.shape, v.strides)
