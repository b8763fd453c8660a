"""The teaching notebooks' committed forms: the jupytext percent-format sources `notebooks/NN_*.py` are the
truth; the `.ipynb` beside each is generated from it (`jupytext --to ipynb notebooks/NN_*.py`) and committed
without outputs. The tests check that the committed `.ipynb` holds the same cells and carries no outputs.

Every notebook executes, top to bottom, on the real models (SmolLM2, MiniLM) in the docs build
(tests/test_docs.py), which renders the pages with their outputs and plots and fails when a cell raises;
`execute(source)` below runs one on its own (`python -m tests.test_notebooks 04_llama`).

Skipped only when the notebook tooling (jupytext, nbclient, ipykernel, matplotlib: the `notebooks`
extra) is not installed. The notebooks fetch the models they read (`refimpl.fetch.fetch`) if scripts/test.sh
has not already put them in the cache.
"""
from __future__ import annotations

import hashlib
import pathlib
import sys
import time

import pytest

pytestmark = pytest.mark.property

ROOT = pathlib.Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"
SOURCES = sorted(NB_DIR.glob("[0-9][0-9]_*.py"))
TIMEOUT = 300          # per cell, seconds: the slowest cell takes well under a minute


def _tools():
    missing = [m for m in ("jupytext", "nbclient", "nbformat", "ipykernel", "matplotlib")
               if not _importable(m)]
    if missing:
        pytest.skip(f"notebook tooling not installed ({', '.join(missing)}): pip install -e '.[notebooks]'")
    import jupytext
    import nbclient
    return jupytext, nbclient


def _importable(name: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(name) is not None


def _kernel_name() -> str:
    """'python3' when it is this interpreter's ipykernel (the native kernel, or a registered spec that
    runs sys.executable); otherwise a spec for this interpreter is registered under the user's prefix."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    ksm = KernelSpecManager()
    try:
        spec = ksm.get_kernel_spec("python3")
        exe = spec.argv[0]
        if (exe in ("python", "python3", "{python}")
                or pathlib.Path(exe).resolve() == pathlib.Path(sys.executable).resolve()):
            return "python3"
    except NoSuchKernel:
        pass
    from ipykernel.kernelspec import install
    name = "refimpl-" + hashlib.sha1(sys.executable.encode()).hexdigest()[:10]
    install(user=True, kernel_name=name, display_name=f"Python ({sys.executable})")
    return name


def execute(source: pathlib.Path, kernel_name: str = "python3"):
    """Run the notebook of a percent-format source in a fresh kernel (cwd = notebooks/); return the
    executed notebook and the seconds it took."""
    jupytext, nbclient = _tools()
    nb = jupytext.read(source)
    nb.metadata["kernelspec"] = {"name": kernel_name, "display_name": "Python 3", "language": "python"}
    t0 = time.perf_counter()
    nbclient.NotebookClient(nb, timeout=TIMEOUT, kernel_name=kernel_name,
                            resources={"metadata": {"path": str(NB_DIR)}}).execute()
    return nb, time.perf_counter() - t0


def test_sources_exist():
    assert len(SOURCES) >= 8, [s.name for s in SOURCES]


@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_ipynb_is_generated_from_source_without_outputs(source):
    """The committed .ipynb has the source's cells (regenerate: jupytext --to ipynb SOURCE) and no outputs."""
    jupytext, _ = _tools()
    ipynb = source.with_suffix(".ipynb")
    assert ipynb.exists(), f"{ipynb.name} is missing: jupytext --to ipynb {source.relative_to(ROOT)}"
    want = [(c.cell_type, c.source) for c in jupytext.read(source).cells]
    nb = jupytext.read(ipynb)
    got = [(c.cell_type, c.source) for c in nb.cells]
    assert got == want, f"{ipynb.name} is out of date with {source.name}: jupytext --to ipynb {source.name}"
    dirty = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count"))]
    assert not dirty, f"{ipynb.name}: cells {dirty} carry outputs; regenerate it from {source.name}"


if __name__ == "__main__":
    for name in sys.argv[1:]:
        src = NB_DIR / (name if name.endswith(".py") else name + ".py")
        _, seconds = execute(src, _kernel_name())
        print(f"{src.stem}: executed in {seconds:.1f} s")
