"""gpt-oss (refimpl.models.gpt_oss) on tiny random GGUFs against llama.cpp's logits (no download, no
llama-cpp-python): tests/golden_data/gpt_oss_tiny.npz from `scripts/gen_llama_goldens.py --only tiny-gpt-oss`,
each model of its TINY_GPT_OSS_MODELS written by tests/models/tiny.py's `write_tiny_gpt_oss` (attention sinks,
Q/K/V and output biases, sliding-window layers, a biased router and MXFP4 or f32 experts with biases; one
with the released files' RoPE scaling, YaRN with factor 32) and
run by llama-cpp-python (CPU, 2 threads, no repacking, flash attention off, f16 KV cache, one batch of 32
tokens with logits for every position). The file is written again here from the recorded arguments and
checked byte for byte (SHA-256); refimpl's exact mode is compared per element with the tolerance table,
and numerics="ggml" (f16 cache) must give llama.cpp's bits.
"""
import dataclasses
import hashlib
import json
import pathlib

import numpy as np
import pytest

import refimpl
from refimpl.errors import LoadError
from refimpl.models import gpt_oss
from refimpl.testing import nmse, tol

from .tiny import write_tiny_gpt_oss

pytestmark = pytest.mark.golden

Z = np.load(pathlib.Path(__file__).parent.parent / "golden_data" / "gpt_oss_tiny.npz", allow_pickle=False)
MODELS = {m["name"]: m for m in json.loads(str(Z["meta"]))["models"]}


@pytest.fixture(scope="module", params=sorted(MODELS))
def tiny(request, tmp_path_factory):
    """(model entry, loaded model, tokens, llama.cpp logits)."""
    m = MODELS[request.param]
    path = write_tiny_gpt_oss(tmp_path_factory.mktemp("oss") / f"{m['name']}.gguf", **m["writer_args"])
    digest = hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()
    assert digest == m["gguf_sha256"], (
        f"{m['name']}: write_tiny_gpt_oss no longer writes the bytes llama.cpp ran; regenerate: "
        f"python scripts/gen_llama_goldens.py --only tiny-gpt-oss")
    return m, gpt_oss.load(path), Z[f"{m['name']}_tokens"], Z[f"{m['name']}_logits"]


def test_the_models_cross_their_sliding_window_and_yarns_original_context():
    for m in MODELS.values():
        assert m["n_tokens"] > m["writer_args"]["n_swa"]
    yarn = [m for m in MODELS.values() if m["writer_args"].get("yarn")]
    assert yarn and all(m["n_tokens"] > m["writer_args"]["yarn"][1] for m in yarn)


def test_yarn_sets_llama_cpps_context_parameters(tiny):
    """rope.scaling.type "yarn": ext_factor 1, freq_scale 1/factor, attn_factor 1 (llama.cpp divides out
    the mscale that ggml's rope applies again), the original context from the GGUF."""
    m, model, _, _ = tiny
    hp = model.hparams
    if not m["writer_args"].get("yarn"):
        assert (hp.rope_ext_factor, hp.rope_freq_scale, hp.rope_attn_factor) == (0.0, 1.0, 1.0)
        return
    factor, orig = m["writer_args"]["yarn"]
    assert (hp.rope_ext_factor, hp.rope_freq_scale, hp.rope_attn_factor) == (1.0, 1 / factor, 1.0)
    assert hp.rope_args()["n_ctx_orig"] == orig


def test_exact_mode_logits_match_llama_cpp(tiny, record_property):
    m, model, tokens, ref = tiny
    ours = gpt_oss.forward(model, tokens, gpt_oss.new_cache(model, len(tokens)))
    e = nmse(ours, ref)
    record_property("nmse", e)
    t = tol("gpt_oss.forward", m["writer_args"]["expert_type"], "llama.cpp")
    assert e <= t.nmse, f"{m['name']}: NMSE {e:.2e} > {t.nmse:.1e} (max |d| {np.abs(ours - ref).max():.3g})"
    top2 = np.sort(ref, axis=1)[:, -2:]
    decided = top2[:, 1] - top2[:, 0] > 2 * np.max(np.abs(ours - ref), axis=1)
    assert not np.any(decided & (ours.argmax(1) != ref.argmax(1)))
    assert decided.sum() >= decided.size // 2


def test_ggml_numerics_give_llama_cpps_bits(tiny):
    m, model, tokens, ref = tiny
    with refimpl.numerics("ggml"):
        ours = gpt_oss.forward(model, tokens, gpt_oss.new_cache(model, 64, dtype=np.float16))
    diff = np.flatnonzero((ours != ref).any(axis=1))
    assert diff.size == 0, f"{m['name']}: positions {diff.tolist()} differ from llama.cpp's bits"


def test_decode_one_token_at_a_time_equals_the_batch(tiny):
    """Single-token forwards through the cache give the batch's logits (exact mode: the same sums)."""
    m, model, tokens, _ = tiny
    full = gpt_oss.forward(model, tokens, gpt_oss.new_cache(model, len(tokens)))
    cache = gpt_oss.new_cache(model, len(tokens))
    rows = np.concatenate([gpt_oss.forward(model, [t], cache) for t in tokens])
    assert nmse(rows, full) < 1e-10


def test_sinks_and_the_window_change_the_result(tiny):
    """What the golden pins is exercised: without sinks or without the sliding window the logits move past
    the tolerance and ten times as far from llama.cpp's as the model's own."""
    m, model, tokens, ref = tiny
    e = nmse(gpt_oss.forward(model, tokens, gpt_oss.new_cache(model, len(tokens))), ref)
    no_sinks = dataclasses.replace(model, layers=[dataclasses.replace(w, attn_sinks=np.full_like(w.attn_sinks,
                                                                                                 -1e30))
                                                  for w in model.layers])
    no_swa = dataclasses.replace(model, oss=dataclasses.replace(model.oss, is_swa=(False,) * len(model.layers)))
    t = tol("gpt_oss.forward", m["writer_args"]["expert_type"], "llama.cpp")
    for other in (no_sinks, no_swa):
        assert nmse(gpt_oss.forward(other, tokens, gpt_oss.new_cache(other, len(tokens))), ref) > max(t.nmse, 10 * e)


def test_refusals_name_the_file_and_the_key(tmp_path):
    from refimpl import gguf
    p = write_tiny_gpt_oss(tmp_path / "ok.gguf")
    f = gguf.load(p)
    md = dict(f.metadata)
    tensors = {k: f.tensors[k] for k in f.tensors}
    bad = tmp_path / "longrope.gguf"
    gguf.save(bad, dict(md, **{"gpt-oss.rope.scaling.type": "longrope"}), tensors)
    with pytest.raises(LoadError, match=r"longrope.gguf.*rope.scaling.type 'longrope' is not supported"):
        gpt_oss.load(bad)
    bad = tmp_path / "nosinks.gguf"
    gguf.save(bad, md, {k: v for k, v in tensors.items() if k != "blk.1.attn_sinks.weight"})
    with pytest.raises(LoadError, match=r"nosinks.gguf.*'blk.1.attn_sinks.weight' is missing; expected ne \[4\]"):
        gpt_oss.load(bad)
    bad = tmp_path / "used.gguf"
    gguf.save(bad, dict(md, **{"gpt-oss.expert_used_count": 9}), tensors)
    with pytest.raises(LoadError, match=r"used.gguf.*expert_used_count 9 exceeds expert_count 4"):
        gpt_oss.load(bad)
