"""The public hypothesis strategies draw what they promise: ggml shapes, every type, real views."""
import pytest
import numpy as np
from hypothesis import given, settings, strategies as st
from tests._profiles import examples

import refimpl
from refimpl import QTensor
from refimpl.testing import block_rows, tensors
from refimpl.types import NUMPY_DTYPES, type_traits

pytestmark = pytest.mark.property

ALL = [t for t in type_traits if t not in (refimpl.GGMLType.I64,)]


@given(data=st.data())
@settings(max_examples=examples(200))
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
    @settings(max_examples=examples(200))
    def collect(x):
        seen.add(x.flags.c_contiguous)
    collect()
    assert seen == {True, False}


@given(block_rows("q4_K"))
def test_block_rows_are_float32_rows_of_whole_blocks(x):
    assert x.dtype == np.float32 and x.ndim == 2 and x.shape[1] % 256 == 0


def test_a_failure_shrinks_to_few_simple_values():
    """Tensors of up to 16 elements draw their values through hypothesis, one element at a time with the
    simple values (strategies.SIMPLE, mapped onto the range) first, so a failure among them reduces to a
    small tensor of simple values, not a small shape of random floats."""
    from hypothesis import find
    from refimpl.testing.strategies import SIMPLE
    quick = settings(max_examples=2000, derandomize=True, database=None)
    small = dict(views=False, max_ne0=4, max_ne=2, max_dims=2)
    x = find(tensors(**small), lambda x: np.asarray(x).max() > 1.0, settings=quick)
    assert x.shape == (1,) and float(x[0]) == 10.0           # SIMPLE[0] = 1.0 of [-1, 1] on [-10, 10]
    y = find(tensors(min_value=-1, max_value=1, **small), lambda x: np.asarray(x).size > 3 and
             np.abs(x).sum() > 1.5, settings=quick)
    assert y.size == 4 and y.ravel().tolist() == list(SIMPLE[:4])
    # a failure that needs one particular value: that value is simple too, the others from SIMPLE
    z = find(tensors(min_value=-1, max_value=1, **small),
             lambda x: ((np.asarray(x) > 0.3) & (np.asarray(x) < 0.35)).any(), settings=quick)
    inside = [v for v in z.ravel().tolist() if 0.3 < v < 0.35]
    assert z.size <= 4 and inside == [0.3125] and set(z.ravel().tolist()) - {0.3125} <= set(SIMPLE)


def test_op_case_values_shrink_too():
    """Op cases draw their values through hypothesis as well (one choice per element up to 16 elements): a
    failure that a small case shows ends at one element of a simple value, its name printable for ggml."""
    from hypothesis import find
    from refimpl.testing import op_cases
    quick = settings(max_examples=1000, derandomize=True, database=None)
    c = find(op_cases("rms_norm"), lambda c: c.args[0].size <= 16 and np.abs(np.asarray(c.args[0])).max() > 5,
             settings=quick)
    assert c.args[0].size == 1 and float(np.asarray(c.args[0]).ravel()[0]) == 10.0     # SIMPLE[0] on [-10, 10]
    assert c.name.startswith("RMS_NORM(type=f32,ne=[1]")


@given(tensors(types=["f32"], min_dims=2, max_dims=3, min_value=-2, max_value=2,
               elements=st.sampled_from([-2.0, 0.0, 2.0])))
@settings(max_examples=examples(100))
def test_hnp_style_arguments(x):
    assert 2 <= x.ndim <= 3 and np.all(np.abs(x) <= 2)


@given(x=tensors(types=st.sampled_from(["f16", "q8_0"]), min_dims=2, max_dims=2, min_ne0=5, max_ne0=6, min_ne=3,
                 max_ne=3, min_blocks=2, max_blocks=2, views=False),
       rows=block_rows(st.just("q4_0"), min_rows=2, max_rows=2, min_blocks=3, max_blocks=3))
@settings(max_examples=examples(60))
def test_min_max_pairs_and_strategy_arguments(x, rows):
    """hnp's conventions: min_/max_ pairs for every size, and a strategy wherever a type is asked for."""
    if isinstance(x, QTensor):
        assert x.type == refimpl.GGMLType.Q8_0 and x.shape == (3, 64)
    else:
        assert x.dtype == np.float16 and x.shape[0] == 3 and 5 <= x.shape[1] <= 6
    assert rows.shape == (2, 96)
