"""Record the outputs of live ggml that the notebooks show, for readers without ggml-python.

    python scripts/gen_ggml_outputs.py

Runs the notebooks that call `refimpl.testing.ggml.live_or_recorded` (01_ggml_tensors, 07_golden_testing) with
ggml-python installed and $REFIMPL_RECORD_GGML set, so each live output is written, with a digest of the inputs
it was computed from, to refimpl/data/goldens/ggml_outputs.npz (read back through
`refimpl.fetch.golden("ggml_outputs")`). Needs the pinned ggml-python (`refimpl.testing.ggml.PROFILE`) and the
notebook tooling; tests/test_notebooks.py checks that the file holds what live ggml computes.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from refimpl.fetch import GOLDENS  # noqa: E402
from refimpl.testing import ggml as oracle  # noqa: E402
from tests.test_notebooks import NB_DIR, RECORDING_NOTEBOOKS, _kernel_name, execute  # noqa: E402


def main() -> int:
    if not oracle.available():
        print("gen_ggml_outputs: ggml-python is not installed (pip install -e '.[test]')", file=sys.stderr)
        return 2
    oracle.check_profile()
    out = GOLDENS / f"{oracle.RECORDED}.npz"
    tmp = out.with_suffix(".tmp.npz")
    tmp.unlink(missing_ok=True)
    os.environ[oracle.RECORD_ENV] = str(tmp)
    for name in RECORDING_NOTEBOOKS:
        _, seconds = execute(NB_DIR / f"{name}.py", _kernel_name())
        print(f"{name}: executed in {seconds:.1f} s")
    tmp.replace(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
