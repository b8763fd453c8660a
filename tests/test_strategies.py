"""The public hypothesis strategies draw what they promise: ggml shapes, every type, real views."""
import pytest
import numpy as np
from hypothesis import given, settings, strategies as st

import refimpl
from refimpl import QTensor
from refimpl.testing import block_rows, tensors
from refimpl.types import NUMPY_DTYPES, type_traits

pytestmark = pytest.mark.property

ALL = [t for t in type_traits if t not in (refimpl.GGMLType.I64,)]


@given(data=st.data())
@settings(max_examples=200)
def test_tensors_have_ggml_shapes_types_and_views(data):
    t = data.draw(st.sampled_from(ALL))
    x = data.draw(tensors(types=[t]))
    tr = refimpl.traits(t)
    assert 1 <= len(x.shape) <= 4
    assert x.shape[-1] % tr.blck_size == 0
    if t in NUMPY_DTYPES:
        assert isinstance(x, np.ndarray) and x.dtype == NUMPY_DTYPES[t]
    else:
        assert isinstance(x, QTensor) and x.type == t
        assert x.data.shape[-1] == x.shape[-1] // tr.blck_size * tr.type_size


def test_tensors_include_non_contiguous_views():
    seen = set()

    @given(tensors(types=["f32"], max_dims=3))
    @settings(max_examples=200)
    def collect(x):
        seen.add(x.flags.c_contiguous)
    collect()
    assert seen == {True, False}


@given(block_rows("q4_K"))
def test_block_rows_are_float32_rows_of_whole_blocks(x):
    assert x.dtype == np.float32 and x.ndim == 2 and x.shape[1] % 256 == 0


def test_a_failure_shrinks_to_few_simple_values():
    """Tensors of up to 16 elements draw their values through hypothesis (hypothesis.extra.numpy.arrays), so a
    failure among them reduces to a one-element tensor of a simple value, not a small shape of random floats."""
    from hypothesis import find
    quick = settings(max_examples=2000, derandomize=True, database=None)
    small = dict(views=False, max_ne0=4, max_ne=2, max_dims=2)
    x = find(tensors(**small), lambda x: np.asarray(x).max() > 1.0, settings=quick)
    assert x.shape == (1,) and float(x[0]) == 2.0
    y = find(tensors(min_value=-1, max_value=1, **small), lambda x: np.asarray(x).size > 3 and
             np.abs(x).sum() > 1.5, settings=quick)
    assert y.size == 4 and set(np.abs(y).ravel().tolist()) <= {0.0, 0.5, 1.0}


@given(tensors(types=["f32"], min_dims=2, max_dims=3, min_value=-2, max_value=2,
               elements=st.sampled_from([-2.0, 0.0, 2.0])))
@settings(max_examples=100)
def test_hnp_style_arguments(x):
    assert 2 <= x.ndim <= 3 and np.all(np.abs(x) <= 2)
