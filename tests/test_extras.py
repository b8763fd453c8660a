"""What a plain `pip install refimpl` and `pip install 'refimpl[testing]'` give, each in a fresh virtual
environment (no other packages): generate, chat and embed run on small models, `import refimpl` needs no
optional package, refimpl.testing's strategies need hypothesis and work with the testing extra."""
import os
import subprocess
import venv
from pathlib import Path

import pytest

from tests.models.bert_tiny import write_tiny_bert_hf
from tests.models.tiny import write_tiny_llama

pytestmark = pytest.mark.property

ROOT = Path(__file__).resolve().parents[1]


def _venv(path: Path, spec: str) -> Path:
    venv.EnvBuilder(with_pip=True).create(path)
    py = path / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", spec],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"pip install {spec} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return py


def _run(py: Path, *args, input=None, cwd=None):
    exe = py.with_name("refimpl")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return subprocess.run([str(exe), *map(str, args)] if args[0] != "-c" else [str(py), *args], input=input,
                          capture_output=True, text=True, timeout=600, env=env, cwd=cwd or "/")


def _with_template(src: Path, dst: Path) -> Path:
    """src with a chat template (the tiny models have none): each message's text, then "A:" to answer."""
    import numpy as np

    from refimpl import gguf
    f = gguf.load(src)
    md = dict(f.metadata)
    md["tokenizer.chat_template"] = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}A:"
    gguf.save(dst, md, {k: np.array(v) if not hasattr(v, "type") else v for k, v in f.tensors.items()})
    return dst


def test_a_plain_install_runs_generate_chat_and_embed(tmp_path):
    py = _venv(tmp_path / "plain", str(ROOT))
    llm = write_tiny_llama(tmp_path / "tiny.gguf")
    bert = write_tiny_bert_hf(tmp_path / "bert")
    r = _run(py, "generate", "-m", llm, "-p", "a b", "-n", "4")
    assert r.returncode == 0 and "backend numpy, numerics exact" in r.stderr, r.stderr[-3000:]
    r = _run(py, "chat", "-m", _with_template(llm, tmp_path / "chat.gguf"), "-n", "3", input="hello\n")
    assert r.returncode == 0, r.stderr[-3000:]
    r = _run(py, "embed", "-m", bert, "one sentence", "another")
    assert r.returncode == 0 and len(r.stdout.strip().splitlines()) == 2, r.stderr[-3000:]
    r = _run(py, "-c", "import sys, refimpl; import refimpl.gguf, refimpl.models.llama; "
             "print(sorted(m for m in ('numba', 'hypothesis', 'pytest') if m in sys.modules))")
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr[-3000:]
    r = _run(py, "-c", "import refimpl.testing.strategies")
    assert r.returncode != 0 and "hypothesis" in r.stderr, (r.returncode, r.stderr[-2000:])


def test_the_testing_extra_brings_the_strategies(tmp_path):
    py = _venv(tmp_path / "testing", f"{ROOT}[testing]")
    code = ("from hypothesis import given, settings\n"
            "from refimpl.testing import strategies as rs\n"
            "import refimpl\n"
            "@settings(max_examples=10, deadline=None)\n"
            "@given(rs.tensors(('f32', 'q8_0'), views=False))\n"
            "def t(x):\n"
            "    assert refimpl.dequantize(x).shape == x.shape\n"
            "t(); print('ok')\n")
    r = _run(py, "-c", code)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
