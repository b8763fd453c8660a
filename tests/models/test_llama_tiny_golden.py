"""Tiny random Llama GGUFs through refimpl against llama.cpp's logits (no download, no llama-cpp-python).

tests/golden_data/llama_tiny.npz comes from `scripts/gen_llama_goldens.py --only tiny`: each model of its
TINY_MODELS (GQA and MHA, tied and untied output, rope bases 1e4 .. 1e6, weights F32 F16 Q8_0 Q4_0) was
written with tests/models/tiny.py's `write_tiny_llama` and run by llama-cpp-python (CPU, 2 threads, no
repacking, flash attention off, f16 KV cache, one batch with logits for every position). Here the file is
written again from the recorded arguments, checked byte for byte (SHA-256), and refimpl's exact-mode
forward over the same tokens is compared with llama.cpp's logits of every position.

The differences are llama.cpp's numerics, not the model: ggml-cpu converts activations to the weight's
vec_dot type before each mat-mul (Q8_0 for Q8_0/Q4_0 weights, F16 for F16 weights and for the f16 KV cache
in the attention products). Emulating those conversions around refimpl's mul_mat (and storing the cache
in f16) brings the NMSE down to 5.8e-10 and 8.8e-10 (F32), 6.0e-8 (F16), 4.0e-15 (Q8_0) and 3.8e-15 (Q4_0):
what is left for F32/F16 is f32 summation order, which now and then flips an f16 rounding.
"""
import hashlib
import json
import pathlib

import numpy as np
import pytest

from refimpl.models import llama
from refimpl.testing import nmse, tol

from .tiny import write_tiny_llama

pytestmark = pytest.mark.golden

DATA = pathlib.Path(__file__).parent.parent / "golden_data"
# llama_tiny.npz: llama itself; llama_tiny_archs.npz: other llama.cpp architectures refimpl.models.llama runs
# (qwen3: Q/K norms), from `--only tiny-archs` with the same writer and settings
_FILES = [np.load(DATA / f, allow_pickle=False) for f in ("llama_tiny.npz", "llama_tiny_archs.npz")]
MODELS, _ARRAYS = {}, {}
for _z in _FILES:
    for _m in json.loads(str(_z["meta"]))["models"]:
        MODELS[_m["name"]] = _m
        _ARRAYS[_m["name"]] = _z
META = json.loads(str(_FILES[0]["meta"]))


@pytest.fixture(scope="module", params=sorted(MODELS))
def run(request, tmp_path_factory):
    """(model entry, refimpl logits, llama.cpp logits) for one tiny model."""
    m = MODELS[request.param]
    path = write_tiny_llama(tmp_path_factory.mktemp("tiny") / f"{m['name']}.gguf", **m["writer_args"])
    digest = hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()
    assert digest == m["gguf_sha256"], (
        f"{m['name']}: write_tiny_llama({m['writer_args']}) no longer writes the bytes llama.cpp ran "
        f"(SHA-256 {digest} != {m['gguf_sha256']}); regenerate: python scripts/gen_llama_goldens.py --only tiny"
        f"{'-archs' if m['writer_args'].get('arch', 'llama') != 'llama' else ''}")
    model = llama.load(path)
    z = _ARRAYS[m["name"]]
    tokens = z[f"{m['name']}_tokens"]
    ours = llama.forward(model, tokens, llama.new_cache(model, len(tokens)))
    return m, ours, z[f"{m['name']}_logits"]


def test_logits_match_llama_cpp(run, record_property):
    """Logits of every position, the whole vocabulary, within the measured bound for the weight type."""
    m, ours, ref = run
    assert ours.shape == ref.shape
    e, d = nmse(ours, ref), float(np.max(np.abs(ours - ref)))
    record_property("nmse", e)
    record_property("max_abs_diff", d)
    t = tol("llama.forward", m["writer_args"]["wtype"], "llama.cpp")
    assert e <= t.nmse, f"{m['name']}: NMSE {e:.2e} > {t.nmse:.1e} (max |d| {d:.3g})"


def test_argmax_matches_where_llama_cpp_is_decided(run):
    """refimpl's top-1 equals llama.cpp's at every position whose top-2 margin exceeds twice the max |d|."""
    m, ours, ref = run
    top2 = np.sort(ref, axis=1)[:, -2:]
    decided = top2[:, 1] - top2[:, 0] > 2 * np.max(np.abs(ours - ref), axis=1)
    bad = np.flatnonzero(decided & (ours.argmax(1) != ref.argmax(1)))
    assert bad.size == 0, f"{m['name']}: argmax differs at positions {bad.tolist()}"
    assert decided.sum() >= decided.size // 2, f"{m['name']}: only {decided.sum()}/{decided.size} positions decided"
