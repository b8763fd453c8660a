"""The command line on the real SmolLM2: generate prints a continuation, chat holds a conversation."""
import subprocess
import sys

import pytest

from ._models import smollm2_path


pytestmark = pytest.mark.property

def run(*args, input=None):
    return subprocess.run([sys.executable, "-m", "refimpl", *args], capture_output=True, text=True,
                          input=input, timeout=900)


@pytest.fixture(scope="module")
def model():
    p = smollm2_path()
    if p is None:
        pytest.fail("SmolLM2 GGUF not in the cache: refimpl fetch smollm2 (scripts/test.sh does)")
    return str(p)


def test_generate_greedy_continues_the_prompt(model):
    r = run("generate", "-m", model, "-p", "The capital of France is", "-n", "3")
    assert r.returncode == 0, r.stderr
    # llama.cpp's greedy continuation of this prompt starts " Paris." (tests/golden_data)
    assert r.stdout.startswith("The capital of France is Paris"), r.stdout
    assert "3 tokens" in r.stderr


def test_the_warmup_leaves_no_trace(model):
    """The warmup (a two-token run on a scratch cache before the prompt) changes nothing in what is generated:
    the same greedy continuation with and without it (--no-warmup), and it is llama.cpp's (" Paris")."""
    args = ("generate", "-m", model, "-p", "The capital of France is", "-n", "6")
    warm, cold = run(*args), run(*args, "--no-warmup")
    assert warm.returncode == 0 and cold.returncode == 0, (warm.stderr, cold.stderr)
    assert warm.stdout == cold.stdout and warm.stdout.startswith("The capital of France is Paris"), warm.stdout


def test_chat_keeps_the_history(model):
    r = run("chat", "-m", model, "-n", "6", input="What is the capital of France?\nAnd of Italy?\n")
    assert r.returncode == 0, r.stderr
    replies = [line for line in r.stdout.split("> ") if line.strip()]
    assert len(replies) == 2, r.stdout
    assert "Paris" in replies[0]


def test_inspect_lists_the_real_file(model):
    r = run("inspect", model)
    assert r.returncode == 0, r.stderr
    assert "arch 'llama'" in r.stdout and "Q4_1 x210" in r.stdout


def test_version_has_one_source():
    """`refimpl --version` prints the package's version, which the installed metadata takes from the same place
    (pyproject's dynamic version: refimpl/__init__.py)."""
    import importlib.metadata

    import refimpl
    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"refimpl {refimpl.__version__}", (r.stdout, r.stderr)
    assert importlib.metadata.version("refimpl") == refimpl.__version__


def test_generate_runs_gemma3():
    """`refimpl generate -m` on the real Gemma 3 270M (refimpl.models.gemma3): greedy, llama.cpp's first tokens
    (tests/golden_data/gemma3_270m.npz: " the capital of the country of France.")."""
    from refimpl.fetch import path
    p = path("gemma3")
    if not p.is_file():
        pytest.fail("Gemma 3 GGUF not in the cache: refimpl fetch gemma3 (scripts/test.sh does)")
    r = run("generate", "-m", str(p), "-p", "The capital of France is", "-n", "6", "--temp", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("The capital of France is the capital of the country"), r.stdout
    assert "(gemma3, 18 layers)" in r.stderr and "6 tokens" in r.stderr
