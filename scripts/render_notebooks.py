"""Execute the teaching notebooks and write each `.ipynb` beside its source with the outputs and figures, so a
reader of the repository (GitHub, any notebook viewer) sees them without running anything.

    python scripts/render_notebooks.py [NAME ...]       # all of notebooks/NN_*.py by default

The percent-format `notebooks/NN_*.py` stay the sources; each `.ipynb` is their cells plus the outputs of one
execution on the real models (NumPy backend, as the notebooks set it). tests/test_notebooks.py checks that every
`.ipynb` holds its source's cells, executed in order, without an error output.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_notebooks import NB_DIR, SOURCES, _kernel_name, execute  # noqa: E402


def main(names: list[str]) -> int:
    import nbformat
    sources = [NB_DIR / (n if n.endswith(".py") else n + ".py") for n in names] if names else SOURCES
    kernel = _kernel_name()
    for src in sources:
        nb, seconds = execute(src, kernel)
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        out = src.with_suffix(".ipynb")
        nbformat.write(nb, out)
        print(f"{out.relative_to(ROOT)}: executed in {seconds:.1f} s, {out.stat().st_size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
