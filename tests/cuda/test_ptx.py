"""Every CUDA kernel module exposes `ptx_signatures()`, and quants.py / matmul.py compile to PTX for a real GPU
(sm_90) with NVVM in a child process without the simulator (the simulator runs Python, so it proves nothing
about device code). The other modules' PTX is compiled by their own test files (test_ops, test_attention,
test_recurrent, test_models), with module-specific checks on the PTX. Skipped only where no libNVVM is found."""
import importlib
import os
import subprocess
import sys

import pytest

from refimpl.kernels.cuda import _FAMILIES

pytestmark = pytest.mark.equivalence

_SCRIPT = """
import sys, types
import numba.cuda.dispatcher as disp
# device functions called by a kernel ask the current device for its compute capability: there is no GPU
disp.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
from numba import cuda
import importlib
for name in sys.argv[1:]:
    mod = importlib.import_module("refimpl.kernels.cuda." + name)
    for kernel, sig in mod.ptx_signatures():
        ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
        assert ".target sm_90" in ptx and ".entry" in ptx, (name, kernel.py_func.__name__)
        print(name, kernel.py_func.__name__, ptx.count("fma.rn.f32"))
"""


def _jitted_here(mod) -> list[str]:
    """Names of the numba.cuda functions (kernels or device functions) that `mod` itself defines."""
    return [k for k, v in vars(mod).items()
            if hasattr(v, "py_func") and getattr(v.py_func, "__module__", None) == mod.__name__]


def test_every_family_lists_its_kernels():
    """A module that compiles CUDA code lists its launches; one that only composes others' (fused) lists none."""
    for name in _FAMILIES:
        mod = importlib.import_module(f"refimpl.kernels.cuda.{name}")
        sigs = mod.ptx_signatures()
        assert bool(sigs) == bool(_jitted_here(mod)), (name, _jitted_here(mod))
        for kernel, sig in sigs:
            assert hasattr(kernel, "py_func") and isinstance(sig, tuple), (name, kernel)


def test_quants_and_matmul_compile_to_ptx_without_f32_fma():
    """29 dequantize kernels and the mul_mat kernels: valid sm_90 code, and no f32 FMA anywhere (the decoders
    multiply through __fmul_rn so q*d + m keeps the reference's two roundings)."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    p = subprocess.run([sys.executable, "-c", _SCRIPT, "quants", "matmul"], capture_output=True, text=True,
                       env=env, timeout=900)
    if p.returncode != 0 and ("NVVM" in p.stderr and "not" in p.stderr.lower() and "found" in p.stderr.lower()):
        pytest.skip("numba finds no libNVVM (the CUDA toolkit's compiler) to compile PTX")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [line.split() for line in p.stdout.splitlines()]
    want = sum(len(importlib.import_module(f"refimpl.kernels.cuda.{m}").ptx_signatures()) for m in ("quants", "matmul"))
    assert len(rows) == want
    assert [r for r in rows if r[2] != "0"] == []
