"""The README's 'test your own kernel' example runs as written, and catches a planted bug."""
import numpy as np
import pytest
from hypothesis import given

from refimpl.testing import assert_nmse, op_cases


pytestmark = pytest.mark.property

def my_rms_norm(x, eps):
    return x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + eps)


@given(op_cases("rms_norm"))
def test_my_rms_norm(case):
    assert_nmse(my_rms_norm(*case.args), case.run(), 1e-7)


def test_planted_bug_is_found():
    def buggy(x, eps):                       # forgets eps
        return x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True))

    @given(op_cases("rms_norm"))
    def check(case):
        assert_nmse(buggy(*case.args), case.run(), 1e-7)
    with pytest.raises(AssertionError):
        check()
