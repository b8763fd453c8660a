"""How kernels are chosen: the default backend, REFIMPL_BACKEND, lazy loading, kernel_for."""
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("numba", reason="numba is not installed: refimpl.kernels is Numba code")

import refimpl  # noqa: E402
from refimpl.dispatch import kernel_for  # noqa: E402
from refimpl.quants import DEQUANTIZERS  # noqa: E402


pytestmark = pytest.mark.property

def _run(code, **env):
    e = {k: v for k, v in os.environ.items() if k != "REFIMPL_BACKEND"}
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env=e).stdout.split()


def test_default_is_numba_and_loads_lazily():
    code = ("import sys, numpy as np, refimpl; b = refimpl.ops.current_backend(); a = 'numba' in sys.modules; "
            "refimpl.rms_norm(np.ones((2, 8), np.float32), 1e-6); print(b, a, 'numba' in sys.modules)")
    assert _run(code) == ["numba", "False", "True"]


@pytest.mark.parametrize("name", ["numpy", "numba"])
def test_env_var_overrides(name):
    code = ("import sys, numpy as np, refimpl; refimpl.rms_norm(np.ones((2, 8), np.float32), 1e-6); "
            "print(refimpl.ops.current_backend(), 'numba' in sys.modules)")
    assert _run(code, REFIMPL_BACKEND=name) == [name, str(name == "numba")]


def test_kernel_for_follows_the_backend():
    fn = DEQUANTIZERS[refimpl.GGMLType.Q4_0]
    with refimpl.backend("numpy"):
        assert kernel_for(fn) is None
    with refimpl.backend("numba"):
        k = kernel_for(fn)
    assert k is not None and k is not fn
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    with refimpl.backend("numba"):
        q = refimpl.quantize(x, "q4_0")
        blocks = np.ascontiguousarray(q.data).reshape(-1, 18)
        np.testing.assert_array_equal(refimpl.dequantize(q), k(blocks).reshape(3, 64))
