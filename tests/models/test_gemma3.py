"""The real Gemma 3 270M (Q4_K_M) through refimpl.models.gemma3 against llama.cpp's goldens.

tests/golden_data/gemma3_270m.npz comes from `scripts/gen_llama_goldens.py --only gemma3` (llama-cpp-python
0.3.36, the portable AVX2 build, one thread, f16 KV cache, no weight repacking; its metadata records the
build): for each of 8 prompts llama.cpp's token ids, its 32 greedy tokens, the top-16 logits of every
position of one batched forward over prompt + greedy[:31] ("tf"), and each of those positions' SHA-256 of the
full f32 logits row. The model comes from `refimpl fetch gemma3` (scripts/test.sh fetches it).
"""
import hashlib
import json
import pathlib

import numpy as np
import pytest

import refimpl
from refimpl.fetch import path as fetched
from refimpl.testing import nmse, tol

pytestmark = pytest.mark.golden

GOLDEN = pathlib.Path(__file__).parent.parent / "golden_data" / "gemma3_270m.npz"
TOP1_BAR = 0.95                   # the bar, pooled over the 32 greedy positions of every prompt


@pytest.fixture(scope="module")
def golden():
    z = np.load(GOLDEN, allow_pickle=False)
    return z, json.loads(str(z["meta"]))


@pytest.fixture(scope="module")
def model():
    p = fetched("gemma3")
    if not p.is_file():
        pytest.fail(f"Gemma 3 270M is not in {p.parent}: refimpl fetch gemma3 (scripts/test.sh does)")
    from refimpl.models import gemma3
    return gemma3.load(p)


@pytest.fixture(scope="module")
def runs(model, golden):
    """refimpl's exact-numerics logits over each prompt + llama.cpp's greedy continuation, in one prefill
    (the Numba backend where it is installed: the same exact numerics, faster)."""
    from refimpl.models import gemma3
    z, meta = golden
    out = []
    backend = refimpl.dispatch.current_backend()
    with refimpl.backend(backend), refimpl.numerics("exact"):
        for i, p in enumerate(meta["prompts"]):
            tf = z[f"p{i}_tf_ids"]
            out.append(dict(name=p["name"], n=int(p["n_prompt"]), tf=tf, top_ids=z[f"p{i}_tf_top_ids"],
                            top_logits=z[f"p{i}_tf_top_logits"], greedy=z[f"p{i}_greedy_ids"],
                            logits=gemma3.forward(model, tf, gemma3.new_cache(model, len(tf)))))
    return out


def test_token_ids_are_llama_cpps(model, golden):
    z, meta = golden
    for i, p in enumerate(meta["prompts"]):
        assert model.tokenizer.encode(p["text"]) == z[f"p{i}_prompt_ids"].tolist(), p["name"]


def test_teacher_forced_top1_agreement(runs, record_property):
    """Pooled over the 32 greedy positions of all 8 prompts: refimpl's argmax at each position of the batched
    forward equals llama.cpp's (the same batch's argmax, so both read the same tokens) >= 95 %."""
    hit = tot = 0
    per = {}
    for r in runs:
        ours = r["logits"][r["n"] - 1:].argmax(-1)
        theirs = r["top_ids"][r["n"] - 1:, 0]
        per[r["name"]] = int((ours == theirs).sum())
        hit += per[r["name"]]
        tot += len(theirs)
    record_property("top1", hit / tot)
    print(f"\nGemma 3 270M teacher-forced top-1 agreement: {hit}/{tot} = {hit / tot:.3f} ({per})")
    assert hit / tot >= TOP1_BAR, per


def test_llama_cpps_top16_close(runs):
    """llama.cpp's top-16 logits at every position, read off refimpl's rows: the difference is Q8 activation
    rounding (exact mode keeps f32 activations), within the tolerance table's measured bound."""
    t = tol("gemma3.forward", "q4_k_m", "llama.cpp")
    for r in runs:
        ours = np.take_along_axis(r["logits"], r["top_ids"], axis=1)
        e = nmse(ours, r["top_logits"])
        assert e <= t.nmse, f"{r['name']}: NMSE {e:.2e} > {t.nmse:.1e}"


def test_capture_names_are_llama_cpps(model, golden):
    """Every intermediate refimpl captures has llama.cpp's name for it (llm_build_gemma3's cb names), in the
    graph's order, for a sliding-window and a global layer."""
    from refimpl.models import gemma3
    z, _ = golden
    got: dict = {}
    with refimpl.backend("numpy"):
        gemma3.forward(model, z["p0_prompt_ids"][:3], gemma3.new_cache(model, 3), capture=got)
    per_layer = ["attn_norm", "Qcur_normed", "Kcur_normed", "Qcur", "Kcur", "Vcur", "kq", "kq_soft_max", "kqv",
                 "kqv_out", "attn_out", "attn_post_norm", "sa_out", "ffn_norm", "ffn_out", "ffn_post_norm", "l_out"]
    assert model.gemma.is_swa[:6] == (True,) * 5 + (False,)
    for il in (0, 5):
        assert [n for n in got if n.endswith(f"-{il}")] == [f"{n}-{il}" for n in per_layer]
    assert [n for n in got if "-" not in n] == ["inp_embd", "inp_scaled", "result_norm", "result_output"]


def test_ggml_numerics_bit_identical_to_llama_cpp(model, golden):
    """numerics="ggml" (the NumPy emulations of ggml-cpu's roundings, f16 KV cache): every position of the
    shortest prompt's teacher-forced batch has llama.cpp's logits bit for bit (SHA-256 of the f32 row)."""
    from refimpl.models import gemma3
    z, meta = golden
    i = min(range(len(meta["prompts"])), key=lambda j: meta["prompts"][j]["n_prompt"])
    tf = z[f"p{i}_tf_ids"]
    with refimpl.backend("numpy"), refimpl.numerics("ggml"):
        logits = gemma3.forward(model, tf, gemma3.new_cache(model, len(tf)))
    want = meta["prompts"][i]["tf_row_sha256"]
    got = [hashlib.sha256(np.ascontiguousarray(r, np.float32).tobytes()).hexdigest() for r in logits]
    bad = [k for k, (a, b) in enumerate(zip(got, want)) if a != b]
    assert len(got) == len(want) and not bad, f"positions {bad} of {len(want)} differ from llama.cpp's bits"


def test_sliding_window_masks_the_far_past(model):
    """Sliding-window layers see only the last n_swa positions (llama.cpp's standard window), global layers
    everything: the masks differ exactly there."""
    from refimpl.models import gemma3, llama
    n = model.gemma.n_swa
    m_swa, m_all = gemma3.swa_mask(3, n + 4, n + 1, n), llama.causal_mask(3, n + 4, n + 1)
    assert np.isneginf(m_swa[0, :2]).all() and m_swa[0, 2] == 0 and (m_all[0, :n + 2] == 0).all()
    assert (np.isneginf(m_swa) >= np.isneginf(m_all)).all()


def test_generate_runs_and_stops(model, golden):
    """refimpl.models.gemma3.generate: greedy decoding reproduces the start of llama.cpp's greedy text (its
    logits are not llama.cpp's bits in exact mode, so only the first tokens, where the margins are wide)."""
    from refimpl.models import gemma3
    from refimpl.sampling import Sampler
    z, meta = golden
    ids = z["p0_prompt_ids"].tolist()
    with refimpl.backend(refimpl.dispatch.current_backend()):
        out = []
        text = "".join(gemma3.generate(model, ids, 6, Sampler(temperature=0), on_token=out.append))
    assert out == z["p0_greedy_ids"][:6].tolist() and text.startswith(" the capital")
