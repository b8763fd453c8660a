"""numerics="ggml" end to end: refimpl's Llama forward against llama.cpp's stored logits, bit for bit.

Under numerics="ggml" with an f16 KV cache refimpl follows llama.cpp's CPU graph (refimpl/models/llama.py,
"attention as llama.cpp's CPU build computes it"): the f16 cache cells go into the attention products, the
attention spans a multiple of 256 cells, and products over >= 2 tokens take llamafile's tinyBLAS order.

    tiny random Llamas (llama_tiny.npz, and qwen3's in llama_tiny_archs.npz)
                                         F32, F16, Q8_0, Q4_0: identical bits at every position (the
                                         F32/F16 weight products over >= 2 tokens in llamafile's tinyBLAS
                                         order, as llama.cpp's build; ggml-python's build, the op-level
                                         oracle, has llamafile off, so the op emulation is vec_dot's).
    SmolLM2-135M Q4_1 (llama_greedy64_smollm2.npz, if the GGUF is cached)
                                         a short prompt: its logits and 8 greedy tokens identical to
                                         llama.cpp's, the top-16 logits of each step bit for bit. The full
                                         64 tokens on every golden prompt take about 10 minutes here:
                                         scripts/faithful_greedy64.py (docs/numerics.md records the result).
"""
import json
import pathlib

import numpy as np
import pytest

import refimpl
from refimpl.models import llama
from refimpl.testing import assert_bits_equal, nmse, tol

from .._models import smollm2_path
from .tiny import write_tiny_llama

pytestmark = pytest.mark.golden

DATA = pathlib.Path(__file__).parent.parent / "golden_data"
# llama itself, and the other architectures refimpl.models.llama runs (qwen3), with the same writer
_FILES = [np.load(DATA / f, allow_pickle=False) for f in ("llama_tiny.npz", "llama_tiny_archs.npz")]
TINY, _OF = {}, {}
for _z in _FILES:
    for _m in json.loads(str(_z["meta"]))["models"]:
        TINY[_m["name"]], _OF[_m["name"]] = _m, _z
N_GREEDY_CI = 8


@pytest.fixture(autouse=True)
def _numpy_backend():
    """The emulations are NumPy code (kernels of other backends implement exact mode only)."""
    with refimpl.backend("numpy"):
        yield


def _forward(model, tokens, mode, **cache_kw):
    with refimpl.numerics(mode):
        return llama.forward(model, tokens, llama.new_cache(model, len(tokens), **cache_kw))


@pytest.fixture(scope="module", params=sorted(TINY))
def tiny(request, tmp_path_factory):
    """(entry, model, tokens, llama.cpp's logits) for one tiny model."""
    m = TINY[request.param]
    path = write_tiny_llama(tmp_path_factory.mktemp("tiny") / f"{m['name']}.gguf", **m["writer_args"])
    z = _OF[m["name"]]
    return m, llama.load(path), z[f"{m['name']}_tokens"], z[f"{m['name']}_logits"]


def test_tiny_ggml_mode_matches_llama_cpp(tiny, record_property):
    """Identical bits for every weight type (F32/F16 weight products in llamafile's tinyBLAS order, as
    llama.cpp's build), where exact mode is at NMSE 4e-8 (F32) .. 2e-4 (Q8_0)."""
    m, model, tokens, ref = tiny
    wtype = m["writer_args"]["wtype"]
    ours = _forward(model, tokens, "ggml")
    exact = _forward(model, tokens, "exact")
    e, e_exact = nmse(ours, ref), nmse(exact, ref)
    record_property("nmse_ggml", e)
    record_property("nmse_exact", e_exact)
    t = tol("llama.forward", wtype, "llama.cpp-ggml")
    if t.exact:
        assert_bits_equal(ours, ref, m["name"])
    else:
        assert e <= t.nmse, f"{m['name']}: NMSE {e:.2e} > {t.nmse:.1e}"
    assert e <= e_exact / 100, f"{m['name']}: ggml {e:.2e} vs exact {e_exact:.2e}"


def test_ggml_mode_spans_llama_cpp_kv_cells(tiny):
    """ggml mode: an f16 cache by default and 256-cell attention rows (masked cells softmax to 0);
    exact mode: an f32 cache and rows over the filled cells only."""
    m, model, tokens, _ = tiny
    hp = model.hparams
    with refimpl.numerics("ggml"):
        c = llama.new_cache(model, 8)
        assert c.k.dtype == np.float16 and c.span(5) == 256 and c.span(257) == 512
        got = {}
        llama.forward(model, tokens[:5], c, capture=got)
    assert got["kq-0"].shape == (hp.n_head, 5, 256)
    assert np.all(got["kq_soft_max-0"][..., 5:] == 0)
    with refimpl.numerics("exact"):
        c = llama.new_cache(model, 8)
        assert c.k.dtype == np.float32 and c.span(5) == 5
        got = {}
        llama.forward(model, tokens[:5], llama.new_cache(model, 8), capture=got)
    assert got["kq-0"].shape == (hp.n_head, 5, 5)


def test_single_token_decodes_never_take_sgemm(tiny, monkeypatch):
    """A one-token forward has one column in every product, where llama.cpp always runs ggml's vec_dot:
    token-by-token decoding gives the same bits under numerics="ggml" and "ggml-nollamafile" (the profile
    of a build without llamafile)."""
    m, model, tokens, _ = tiny

    def steps(mode):
        with refimpl.numerics(mode):
            c = llama.new_cache(model, 6)
            return np.concatenate([llama.forward(model, [t], c) for t in tokens[:6]])
    assert_bits_equal(steps("ggml-nollamafile"), steps("ggml"), m["name"])


# -- SmolLM2-135M Q4_1 ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2():
    path = smollm2_path()
    if path is None:
        pytest.fail("SmolLM2 GGUF not in the cache: refimpl fetch smollm2 (scripts/test.sh does)")
    return llama.load(path)          # quantized weights: ggml mode multiplies the Q4_1 blocks themselves


@pytest.fixture(scope="module")
def greedy64():
    z = np.load(DATA / "llama_greedy64_smollm2.npz", allow_pickle=False)
    return z, json.loads(str(z["meta"]))


def _greedy(model, ids, n, mode):
    """refimpl's own greedy continuation: the prompt in one forward, then one forward per token; returns
    (prompt's last logits, tokens, logits each token was picked from)."""
    with refimpl.numerics(mode):
        c = llama.new_cache(model, len(ids) + n)
        o = llama.forward(model, ids, c, last_only=True)[-1]
        first, toks, rows = o, [], []
        for k in range(n):
            rows.append(o)
            toks.append(int(o.argmax()))
            if k + 1 < n:
                o = llama.forward(model, [toks[-1]], c)[-1]
    return first, toks, np.stack(rows)


def test_smollm2_prompt_and_greedy_match_llama_cpp(smollm2, greedy64, record_property):
    """The shortest golden prompt: ggml mode's last logits equal llama.cpp's (f32, every id), its first
    N_GREEDY_CI greedy tokens equal llama.cpp's and the top-16 logits of every step match bit for bit;
    exact mode is >= 100x farther (NMSE ~1e-3: Q8_1 activation rounding)."""
    z, meta = greedy64
    i = min(range(len(meta["prompts"])), key=lambda j: meta["prompts"][j]["n_prompt"])
    ids = z[f"p{i}_prompt_ids"]
    last, toks, rows = _greedy(smollm2, ids, N_GREEDY_CI, "ggml")
    assert_bits_equal(last, z[f"p{i}_last_logits"], "prompt logits")
    assert toks == z[f"p{i}_greedy_ids"][:N_GREEDY_CI].tolist()
    top = np.take_along_axis(rows, z[f"p{i}_greedy_top_ids"][:N_GREEDY_CI], axis=1)
    assert_bits_equal(top, z[f"p{i}_greedy_top_logits"][:N_GREEDY_CI], "greedy top-16 logits")
    with refimpl.numerics("exact"):
        exact = llama.forward(smollm2, ids, llama.new_cache(smollm2, len(ids)), last_only=True)[-1]
    e_exact = nmse(exact, z[f"p{i}_last_logits"])
    record_property("nmse_exact", e_exact)
    assert nmse(last, z[f"p{i}_last_logits"]) <= e_exact / 100 and e_exact > 1e-5
