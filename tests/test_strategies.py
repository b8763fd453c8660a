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
