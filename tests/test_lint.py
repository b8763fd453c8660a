"""The code passes ruff with the project's configuration (pyproject.toml [tool.ruff]: pycodestyle errors and
warnings, pyflakes; each ignored rule and per-file exception is justified there). ruff comes with the test extra,
so CI runs this; without ruff the test fails rather than skips."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.property

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    if importlib.util.find_spec("ruff") is None:
        pytest.fail("ruff is not installed: pip install 'refimpl[test]'")
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
