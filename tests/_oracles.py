"""The oracles a test may need: a missing one fails the test (a broken build), never skips it."""
import importlib

import pytest


def require_oracle(module: str, what: str):
    """Import an oracle's package, or fail the test."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pytest.fail(f"{what} cannot be imported ({e}): the oracle is required (bash scripts/setup.sh test builds it)",
                    pytrace=False)


def require_llama_cpp() -> None:
    """llama-cpp-python found (not imported: its libggml must stay out of a process that loads ggml-python's),
    or fail the test."""
    from refimpl.compare import llama_cpp_available
    if not llama_cpp_available():
        pytest.fail("llama-cpp-python, the llama.cpp oracle, is not installed (bash scripts/setup.sh test builds "
                    "it)", pytrace=False)
