"""The README's 'test your own kernel' example runs as written (the code is read from README.md), the docs
show the same code, and a planted bug is caught."""
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given

import refimpl
from refimpl.testing import assert_nmse, op_cases


pytestmark = pytest.mark.property
ROOT = Path(__file__).resolve().parents[1]


def _example(path: Path) -> str:
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)
    (code,) = [b for b in blocks if "def my_rms_norm" in b]
    return code


def test_docs_show_the_readme_example():
    assert _example(ROOT / "docs" / "testing.md") == _example(ROOT / "README.md")


def test_readme_example_passes():
    ns: dict = {}
    exec(compile(_example(ROOT / "README.md"), "README.md", "exec"), ns)   # defines and decorates the test
    ns["test_my_rms_norm"]()


def test_readme_kernel_where_f32_squares_underflow():
    """(1e-45)**2 rounds to 0 in f32, so with eps 0 ggml's scale is 1/sqrt(0) = inf; squaring in f64 gives 1."""
    ns: dict = {}
    exec(compile(_example(ROOT / "README.md"), "README.md", "exec"), ns)
    x = np.full((2, 5), 1e-45, np.float32)
    with np.errstate(divide="ignore"):
        mine = ns["my_rms_norm"](x, 0.0)
    assert np.all(np.isposinf(refimpl.rms_norm(x, 0.0))) and np.all(np.isposinf(mine))


def test_planted_bug_is_found():
    def buggy(x, eps):                       # forgets eps
        ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float64)
        return x / np.sqrt(ms.astype(np.float32))

    @given(op_cases("rms_norm"))
    def check(case):
        with np.errstate(divide="ignore", invalid="ignore"):
            assert_nmse(buggy(*case.args), case.run(), 1e-7)
    with pytest.raises(AssertionError):
        check()
