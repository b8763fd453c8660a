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
    for name, key in (("bert_minilm", "st_emb"), ("llama_logits_smollm2", "meta")):
        with np.load(fetch.golden(name), allow_pickle=False) as z:
            assert key in z.files, (name, z.files)


def test_an_unknown_golden_names_what_ships():
    ships = r"refimpl ships: bert_minilm, llama_logits_smollm2"
    with pytest.raises(FileNotFoundError, match=r"no golden 'nope' in .*" + ships):
        fetch.golden("nope")
