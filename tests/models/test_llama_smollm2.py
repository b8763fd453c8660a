"""The real SmolLM2-135M-Instruct (Q4_1) through refimpl against llama.cpp's goldens.

refimpl.fetch.golden("llama_logits_smollm2") comes from scripts/gen_llama_goldens.py (llama-cpp-python,
the portable AVX2 build, batched prefill with logits for every position, f16 KV cache, no weight
repacking; its metadata records the build). For each prompt it holds llama.cpp's 32 greedy tokens, and
the top-16 logits at every position of prompt + greedy continuation run in one batch ("tf").
"""
import json

import numpy as np
import pytest

from refimpl.fetch import golden
from refimpl.testing import nmse, tol

from .._models import smollm2_path

pytestmark = pytest.mark.golden

GOLDEN = golden("llama_logits_smollm2")


@pytest.fixture(scope="module")
def model():
    path = smollm2_path()
    if path is None:
        pytest.fail("SmolLM2 GGUF not in the cache: refimpl fetch smollm2 (scripts/test.sh does)")
    from refimpl.models import llama
    return llama.load(path, dequantize_weights=True)


@pytest.fixture(scope="module")
def golden():
    z = np.load(GOLDEN, allow_pickle=False)
    meta = json.loads(str(z["meta"]))
    return z, meta


@pytest.fixture(scope="module")
def runs(model, golden):
    """refimpl's logits over each prompt + llama.cpp's greedy continuation, in one prefill."""
    from refimpl.models import llama
    z, meta = golden
    out = []
    for i, p in enumerate(meta["prompts"]):
        tf = z[f"p{i}_tf_ids"]
        logits = llama.forward(model, tf, llama.new_cache(model, len(tf)))
        out.append(dict(name=p["name"], n_prompt=int(p["n_prompt"]), tf=tf, logits=logits,
                        top_ids=z[f"p{i}_tf_top_ids"], top_logits=z[f"p{i}_tf_top_logits"],
                        last=z[f"p{i}_last_logits"].astype(np.float32), greedy=z[f"p{i}_greedy_ids"]))
    return out


def test_prompt_token_ids_match_llama_cpp(model, golden):
    z, meta = golden
    for i, p in enumerate(meta["prompts"]):
        ids = model.tokenizer.encode(p["text"], add_special=True)
        assert ids == z[f"p{i}_prompt_ids"].tolist(), p["name"]


def test_teacher_forced_top1_agreement(runs):
    """argmax of refimpl's logits equals llama.cpp's top-1 at >= 95% of all positions."""
    agree = total = 0
    for r in runs:
        ours = r["logits"].argmax(axis=1)
        agree += int(np.sum(ours == r["top_ids"][:, 0]))
        total += len(ours)
    assert agree / total >= 0.95, f"{agree}/{total}"


def test_greedy_continuation_matches_where_llama_cpp_is_decided(runs):
    """refimpl's greedy choice equals llama.cpp's for the first 16 generated tokens, except where
    llama.cpp's own top-2 margin is below the logit error measured at that position."""
    for r in runs:
        n0 = r["n_prompt"]
        for j in range(16):
            pos = n0 - 1 + j
            ours = int(r["logits"][pos].argmax())
            want = int(r["greedy"][j])
            if ours == want:
                continue
            top = r["top_logits"][pos]
            margin = float(top[0] - top[1])
            err = float(np.max(np.abs(r["logits"][pos][r["top_ids"][pos]] - top)))
            assert margin < 2 * err, (f"{r['name']}: token {j}: refimpl {ours} != llama.cpp {want} with "
                                      f"llama.cpp margin {margin:.3f} > 2x measured error {err:.3f}")


def test_last_position_logits_close(runs):
    """Full last-prompt-position logits against llama.cpp's (stored as f16)."""
    t = tol("llama.forward", "q4_1", "llama.cpp")
    for r in runs:
        ours = r["logits"][r["n_prompt"] - 1]
        e = nmse(ours, r["last"])
        assert e <= t.nmse, f"{r['name']}: NMSE {e:.2e} > {t.nmse:.1e}; max |d| {np.abs(ours - r['last']).max():.3f}"
