"""The reference outputs refimpl ships (refimpl/data/goldens/, `refimpl.fetch.golden`): the notebooks read them
outside a checkout, so they must be package data, and an unknown name must say what ships."""
import tomllib
from pathlib import Path

import numpy as np
import pytest

from refimpl import fetch

pytestmark = pytest.mark.property

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_goldens_are_package_data_and_read():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["refimpl"]
    assert "data/goldens/*.npz" in data
    for name, key in (("bert_minilm", "st_emb"), ("llama_logits_smollm2", "meta"), ("ggml_outputs", "07_rms_norm")):
        with np.load(fetch.golden(name), allow_pickle=False) as z:
            assert key in z.files, (name, z.files)


def test_an_unknown_golden_names_what_ships():
    ships = r"refimpl ships: bert_minilm, ggml_outputs, llama_logits_smollm2"
    with pytest.raises(FileNotFoundError, match=r"no golden 'nope' in .*" + ships):
        fetch.golden("nope")


def test_a_recorded_ggml_output_is_refused_for_other_inputs_or_an_unknown_name(monkeypatch, capsys):
    """Without ggml-python, live_or_recorded shows what was recorded only for the very inputs it was computed
    from: other inputs (here a shape the notebook's rms_norm input does not have) and an unknown name raise,
    naming the output, and print nothing that could pass for ggml's result."""
    from refimpl.testing import ggml as oracle
    monkeypatch.setattr(oracle, "available", lambda: False)
    never = lambda: pytest.fail("compute() called without ggml")  # noqa: E731
    with pytest.raises(ValueError, match=r"'07_rms_norm' was computed from other inputs"):
        oracle.live_or_recorded("07_rms_norm", never, np.zeros((7, 575), np.float32))
    with pytest.raises(KeyError, match=r"no recorded ggml output 'nope' \(recorded: 01_permute_cont, "):
        oracle.live_or_recorded("nope", never, np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="not object arrays"):
        oracle.live_or_recorded("07_rms_norm", never, np.array([object()]))
    assert capsys.readouterr().out == ""
