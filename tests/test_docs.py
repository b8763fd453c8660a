"""The documentation site builds in strict mode: a warning (a broken link, an unresolved cross-reference, an op
without a docstring) fails the test.

`mkdocs build --strict` of mkdocs.yml into a temporary directory, with the generated pages of
docs/gen_ops_reference.py (the op reference, block layouts, notebook pages). mkdocstrings does not report a
missing docstring, so the test also checks that every public op has one, and that the generated op pages
list every op. The build executes every teaching notebook (notebooks/NN_*.py) on the real models, as the site
shows them: a cell that raises fails the build (mkdocs-jupyter's allow_errors: false), and each notebook's page
must carry its outputs and its plots. Skipped only when the `docs` extra (mkdocs, mkdocstrings[python],
mkdocs-jupyter) or the notebook tooling (the `notebooks` extra: ipykernel, matplotlib) is missing.
"""
from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.property

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS_TOOLS = ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python", "mkdocs_jupyter", "material")


def _missing_tools() -> list[str]:
    out = []
    for m in DOCS_TOOLS:
        try:
            found = importlib.util.find_spec(m) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            out.append(m)
    return out


@pytest.fixture(scope="module")
def gen():
    """docs/gen_ops_reference.py as a module (it is the MkDocs hook)."""
    spec = importlib.util.spec_from_file_location("gen_ops_reference", ROOT / "docs" / "gen_ops_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_public_op_has_a_docstring(gen):
    assert gen.missing_docstrings() == []


def test_every_public_op_has_a_reference_entry(gen):
    from refimpl.ops import OPS
    pages = gen.generated_pages()
    listed = {line[3:].strip() for uri, text in pages.items() if uri.startswith("ops/") and uri != "ops/index.md"
              for line in text.splitlines() if line.startswith("## ")}
    assert set(OPS) <= listed, sorted(set(OPS) - listed)
    assert all(f"ops/{f}.md" in pages for f in gen.families())


def test_mkdocs_build_strict(tmp_path):
    missing = _missing_tools()
    if missing:
        pytest.skip(f"docs tooling not installed ({', '.join(missing)}): pip install -e '.[docs]'")
    lacking = [m for m in ("ipykernel", "matplotlib") if importlib.util.find_spec(m) is None]
    if lacking:
        pytest.skip(f"notebook tooling not installed ({', '.join(lacking)}): pip install -e '.[notebooks]'")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", REFIMPL_DOCS_EXECUTE="true")
    env.pop("REFIMPL_BACKEND", None)
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                        "--site-dir", str(site)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    log = r.stdout + r.stderr
    warnings = [ln for ln in log.splitlines() if ln.startswith(("WARNING", "ERROR"))]
    assert r.returncode == 0 and not warnings, "\n".join(warnings) or log[-4000:]
    for page in ("index.html", "ops/index.html", "ops/norm/index.html", "layouts/index.html", "models/index.html",
                 "testing/index.html", "notebooks/index.html", "notebooks/01_ggml_tensors/index.html"):
        assert (site / page).exists(), page
    testing = (site / "testing" / "index.html").read_text(encoding="utf-8")
    assert "refimpl: shrunk example" not in testing, "the shrunk example was not run into the testing page"
    assert "x=array([100.], dtype=float32)" in testing, "the testing page's shrunk example (run by the hook)"
    norm = (site / "ops" / "norm" / "index.html").read_text(encoding="utf-8")
    assert "ggml_rms_norm" in norm and "numpy (r3, r2, r1, n)" in norm
    sources = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
    assert len(sources) >= 8, [s.name for s in sources]
    for src in sources:                  # every notebook executed: its outputs and plots are on its page
        html = (site / "notebooks" / src.stem / "index.html").read_text(encoding="utf-8")
        assert "jp-OutputArea-output" in html, f"{src.name}: the page shows no outputs"
        assert "data:image/png;base64," in html, f"{src.name}: the page shows no plot"
        assert "Traceback (most recent call last)" not in html, f"{src.name}: a cell failed"
