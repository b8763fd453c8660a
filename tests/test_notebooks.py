"""The teaching notebooks' committed forms: the jupytext percent-format sources `notebooks/NN_*.py` are the
truth; the `.ipynb` beside each is that source executed (`python scripts/render_notebooks.py NAME`), committed
with its outputs and figures so that the repository shows them. The tests check that each `.ipynb` holds its
source's cells, executed in order, without an error output.

Every notebook executes, top to bottom, on the real models (SmolLM2, MiniLM) in the docs build
(tests/test_docs.py), which renders the pages with their outputs and plots and fails when a cell raises;
`execute(source)` below runs one on its own (`python -m tests.test_notebooks 04_llama`).

Skipped only when the notebook tooling (jupytext, nbclient, ipykernel, matplotlib: the `notebooks`
extra) is not installed. The notebooks fetch the models they read (`refimpl.fetch.fetch`) if scripts/test.sh
has not already put them in the cache.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import sys
import time

import pytest

pytestmark = pytest.mark.property

ROOT = pathlib.Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"
SOURCES = sorted(NB_DIR.glob("[0-9][0-9]_*.py"))
TIMEOUT = 300          # per cell, seconds: the slowest cell takes well under a minute
# the notebooks whose ggml cells go through refimpl.testing.ggml.live_or_recorded (scripts/gen_ggml_outputs.py)
RECORDING_NOTEBOOKS = ("01_ggml_tensors", "07_golden_testing")


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
def test_ipynb_is_its_source_executed(source):
    """The committed .ipynb is the source's cells with the outputs of one execution, so that a reader of the
    repository sees the figures without running anything (regenerate: python scripts/render_notebooks.py NAME):
    the same cells, every code cell executed in order, no error output, each figure a PNG, the file small."""
    jupytext, _ = _tools()
    ipynb = source.with_suffix(".ipynb")
    assert ipynb.exists(), f"{ipynb.name} is missing: python scripts/render_notebooks.py {source.stem}"
    want = [(c.cell_type, c.source) for c in jupytext.read(source).cells]
    nb = jupytext.read(ipynb)
    got = [(c.cell_type, c.source) for c in nb.cells]
    assert got == want, (f"{ipynb.name} is out of date with {source.name}: "
                         f"python scripts/render_notebooks.py {source.stem}")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.get("execution_count") for c in code] == list(range(1, len(code) + 1)), (
        f"{ipynb.name} was not executed top to bottom: python scripts/render_notebooks.py {source.stem}")
    outputs = [o for c in code for o in c.get("outputs", ())]
    assert not [o for o in outputs if o.get("output_type") == "error"], f"{ipynb.name} carries an error output"
    figures = [o for o in outputs if "image/png" in o.get("data", {})]
    assert figures, f"{ipynb.name} shows no figure"
    assert ipynb.stat().st_size < 1_000_000, f"{ipynb.name}: {ipynb.stat().st_size} bytes; keep it under 1 MB"

def _printed(nb) -> str:
    return "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", ()))


def test_recorded_ggml_outputs_are_what_live_ggml_computes(tmp_path, monkeypatch):
    """refimpl/data/goldens/ggml_outputs.npz, shown to readers without ggml-python, holds exactly what the live
    ggml computes in the notebooks now, from the same inputs (else: python scripts/gen_ggml_outputs.py)."""
    import numpy as np

    from refimpl import fetch
    from refimpl.testing import ggml as oracle
    assert oracle.available(), "ggml-python (the test oracle) is not installed: pip install -e '.[test]'"
    _tools()
    monkeypatch.setenv(oracle.RECORD_ENV, str(tmp_path / "now.npz"))
    for name in RECORDING_NOTEBOOKS:
        execute(NB_DIR / f"{name}.py", _kernel_name())
    with np.load(tmp_path / "now.npz") as now, np.load(fetch.golden(oracle.RECORDED)) as shipped:
        assert sorted(now.files) == sorted(shipped.files), "python scripts/gen_ggml_outputs.py"
        for k in now.files:
            assert now[k].dtype == shipped[k].dtype and np.array_equal(now[k], shipped[k]), (
                f"{k}: the recorded output differs from live ggml's: python scripts/gen_ggml_outputs.py")


def test_without_ggml_python_the_notebooks_show_the_recorded_outputs(tmp_path, monkeypatch):
    """With ggml-python hidden (a `ggml` package that fails to import, first on the kernel's path) the notebooks
    that show ggml's outputs run to the end, say that what they show was recorded, and still compare it."""
    _tools()
    fake = tmp_path / "hide" / "ggml"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("ggml-python hidden by tests/test_notebooks.py")\n')
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(fake.parent), os.environ.get("PYTHONPATH")])))
    monkeypatch.delenv("REFIMPL_RECORD_GGML", raising=False)
    printed = {name: _printed(execute(NB_DIR / f"{name}.py", _kernel_name())[0]) for name in RECORDING_NOTEBOOKS}
    assert "real ggml available: False" in printed["01_ggml_tensors"]
    assert "[ggml-python is not installed: 01_permute_cont is what" in printed["01_ggml_tensors"]
    assert "| equal: True" in printed["01_ggml_tensors"]
    for name in ("07_soft_max_ext_case3", "07_rms_norm", "07_mul_mat_q4_1"):
        assert f"[ggml-python is not installed: {name} is what" in printed["07_golden_testing"], name
    assert "identical bits: True" in printed["07_golden_testing"]
    assert "numerics='ggml' vs ggml: identical bits: True" in printed["07_golden_testing"]


if __name__ == "__main__":
    for name in sys.argv[1:]:
        src = NB_DIR / (name if name.endswith(".py") else name + ".py")
        _, seconds = execute(src, _kernel_name())
        print(f"{src.stem}: executed in {seconds:.1f} s")
