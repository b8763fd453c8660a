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


def test_after_precompile_the_main_job_compiles_nothing(tmp_path):
    """refimpl.textgen.precompile (scripts/setup.sh runs it at install) compiles, on a one-layer miniature with
    SmolLM2's shapes and types, every kernel the main job's generation with the real SmolLM2 then runs: that run
    loads them all from Numba's cache and compiles nothing (no note), where a fresh cache compiles for seconds
    between loading the model and the first token."""
    from refimpl import fetch
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    pre = subprocess.run([sys.executable, "-c", "from refimpl.textgen import precompile; precompile()"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert pre.returncode == 0, pre.stderr
    assert NOTE in pre.stderr                    # it did compile, into the empty cache
    main_job = [sys.executable, "-m", "refimpl", "generate", "-m", str(fetch.fetch("smollm2")),
                "-p", "Once upon a time", "-n", "8"]
    run = subprocess.run(main_job, capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr
    assert NOTE not in run.stderr, run.stderr
