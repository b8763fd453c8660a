"""Hostile BERT / sentence-transformers directories: every file of a tiny model's directory mutated.

Every case either loads and then embeds two texts, or raises an error of refimpl's family (refimpl.LoadError:
BertError, TokenizerError) naming a file of the directory; nothing else (no SafetensorError, KeyError,
TypeError, AttributeError, IndexError, MemoryError), within the memory and time bounds of `run_case`.
JSON files get each key set to the values that break readers (null, a list, an object, a string, huge,
negative, fractional, true), keys deleted and the top level replaced; every file is truncated and gets bit
flips and byte overwrites (Hypothesis draws those).
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import refimpl
from refimpl.models import bert

from ..models.bert_tiny import write_tiny_bert_hf
from ._fuzz import examples, run_case

pytestmark = pytest.mark.property

FILES = ["config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json", "modules.json",
         "1_Pooling/config.json", "sentence_bert_config.json"]
BAD_VALUES = [None, [], [1, 2], {}, {"a": 1}, "x", "", 10 ** 9, 2 ** 63, -1, 0, 1.5, 1e300, -1e300, True, False]
ALLOWED = (refimpl.LoadError,)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = write_tiny_bert_hf(tmp_path_factory.mktemp("fuzz_bert") / "base")
    with refimpl.backend("numpy"):
        _load_and_embed(d)                       # warm up imports outside the measured cases
    return d, {f: (d / f).read_bytes() for f in FILES}


def _load_and_embed(d):
    with refimpl.backend("numpy"):
        m = bert.load(d)
        e = bert.embed(m, ["the man is eating food.", "hello"])
    assert e.shape == (2, m.hparams.n_embd) and np.isfinite(e).all()
    return m


def _case(tmp_path, files, name, i):
    d = tmp_path / f"c{i}"
    if d.exists():
        shutil.rmtree(d)
    for f, data in files.items():
        (d / f).parent.mkdir(parents=True, exist_ok=True)
        (d / f).write_bytes(data)
    size = sum(len(b) for b in files.values())
    r = run_case(name, lambda: _load_and_embed(d), ALLOWED, input_bytes=size, mem_factor=64, mem_slack=64 << 20,
                 seconds=10.0)
    if isinstance(r, refimpl.LoadError):
        assert str(d) in str(r), f"{type(r).__name__} does not name the directory or its file: {r}"
    return r


def _json_edits(data: bytes):
    """(label, new bytes) for every key of a JSON file set to every bad value, deleted, and the top level
    replaced."""
    v = json.loads(data)
    tops = [[], {}, "x", 1, None]
    for t in tops:
        yield f"top={t!r}", json.dumps(t).encode()
    items = list(v.items()) if isinstance(v, dict) else list(enumerate(v))
    for k, _ in items:
        for bad in BAD_VALUES:
            w = json.loads(data)
            w[k] = bad
            yield f"{k}={bad!r}", json.dumps(w).encode()
        if isinstance(v, dict):
            w = json.loads(data)
            del w[k]
            yield f"del {k}", json.dumps(w).encode()
    if isinstance(v, list):                      # modules.json: each module's fields
        for i, mod in enumerate(v):
            for k in list(mod):
                for bad in (None, [], 1, "../../etc", "/abs"):
                    w = json.loads(data)
                    w[i][k] = bad
                    yield f"[{i}].{k}={bad!r}", json.dumps(w).encode()


JSON_FILES = [f for f in FILES if f.endswith(".json")]


@pytest.mark.parametrize("fname", JSON_FILES)
def test_every_json_field_set_to_what_breaks_readers(base, tmp_path, fname):
    d, files = base
    for i, (label, new) in enumerate(_json_edits(files[fname])):
        _case(tmp_path, dict(files, **{fname: new}), f"bert dir: {fname} fields", i)


@pytest.mark.parametrize("fname", FILES)
def test_every_file_truncated(base, tmp_path, fname):
    d, files = base
    data = files[fname]
    cuts = sorted({0, 1, 7, 8, 9, len(data) // 3, len(data) // 2, len(data) - 1} & set(range(len(data))))
    for i, n in enumerate(cuts):
        _case(tmp_path, dict(files, **{fname: data[:n]}), "bert dir: truncations", i)


@pytest.mark.parametrize("fname", FILES)
def test_bit_flips_and_overwrites(base, tmp_path, fname):
    d, files = base
    data = files[fname]
    hi = min(len(data), 4096) - 1                        # the headers, keys and first values

    @settings(max_examples=examples(120), deadline=None, suppress_health_check=list(HealthCheck))
    @given(muts=st.lists(st.tuples(st.sampled_from(["flip", "byte"]), st.integers(0, hi), st.integers(0, 255)),
                         min_size=1, max_size=4))
    def check(muts):
        b = bytearray(data)
        for kind, pos, val in muts:
            if kind == "flip":
                b[pos] ^= 1 << (val % 8)
            else:
                b[pos] = val
        _case(tmp_path, dict(files, **{fname: bytes(b)}), "bert dir: bit flips and overwrites", 0)
    check()


def test_a_missing_file(base, tmp_path):
    d, files = base
    for i, f in enumerate(FILES):
        _case(tmp_path, {k: v for k, v in files.items() if k != f}, "bert dir: a file missing", i)
