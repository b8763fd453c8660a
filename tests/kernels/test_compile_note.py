"""A compile says so: the first Numba compile of a refimpl kernel in a process prints one progress line on
stderr; a kernel loaded from Numba's cache prints nothing; REFIMPL_PROGRESS=0 silences the line."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("numba", reason="numba is not installed: refimpl.kernels is Numba code")

pytestmark = pytest.mark.property

SCRIPT = ("import numpy as np, refimpl\n"
          "with refimpl.backend('numba'):\n"
          "    refimpl.rms_norm(np.ones((3, 8), np.float32), 1e-5)\n"
          "    refimpl.rms_norm(np.ones((5, 8), np.float32), 1e-5)\n")
NOTE = "refimpl: compiling the Numba kernels"


def _stderr(cache_dir, **env) -> str:
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "NUMBA_CACHE_DIR": str(cache_dir), **env})
    assert run.returncode == 0, run.stderr
    return run.stderr


def test_the_first_compile_says_so_once_and_a_cached_kernel_says_nothing(tmp_path):
    first = _stderr(tmp_path)
    assert first.count(NOTE) == 1, first
    assert str(tmp_path) in first                 # where the compiled kernels are kept
    assert NOTE not in _stderr(tmp_path)          # loaded from the cache: nothing compiled


def test_refimpl_progress_0_silences_the_note(tmp_path):
    assert NOTE not in _stderr(tmp_path, REFIMPL_PROGRESS="0")
