"""The real all-MiniLM-L6-v2 against its references, from refimpl.fetch.golden("bert_minilm")
(scripts/gen_bert_goldens.py): sentence-transformers' ids and embeddings, and llama.cpp's ids and embeddings for
the GGUFs `refimpl convert` writes; and `refimpl convert` against what llama.cpp's own converter writes
(tests/golden_data/bert_minilm_convert.json).

Thresholds (cosine of each sentence's embedding to the reference's):
    0.99999  F32 (and F16) weights, against sentence-transformers and against llama.cpp on the same GGUF
    0.999    Q8_0 weights against sentence-transformers (exact numerics: the weights' rounding only)
    0.998    Q8_0 against llama.cpp in exact numerics: llama.cpp also rounds every activation to Q8_0 before
             each Q8_0 mul_mat (measured 0.99875)
"""
from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from refimpl import fetch, gguf
from refimpl.convert import convert
from refimpl.models import bert
from refimpl.tokenizers.wordpiece import WordPieceTokenizer

pytestmark = pytest.mark.golden

DATA = Path(__file__).resolve().parents[1] / "golden_data"
MAX_LEN = 256                          # the model's max_seq_length (sentence_bert_config.json)


@pytest.fixture(scope="module")
def minilm() -> Path:
    p = fetch.path("minilm")
    if not (p / "config.json").is_file():
        pytest.fail(f"{p} is missing: run `refimpl fetch minilm` (scripts/test.sh does)")
    return p


@pytest.fixture(scope="module")
def golden():
    with np.load(fetch.golden("bert_minilm"), allow_pickle=False) as z:
        g = {k: z[k] for k in z.files}
    g["sentences"] = json.loads(str(g["sentences"]))
    return g


def ragged(g, key) -> list[list[int]]:
    ids, off = g[f"{key}_ids"], g[f"{key}_off"]
    return [ids[off[i]:off[i + 1]].tolist() for i in range(len(off) - 1)]


def truncated(ids: list[int]) -> list[int]:
    return ids if len(ids) <= MAX_LEN else ids[:MAX_LEN - 1] + ids[-1:]


@pytest.fixture(scope="module")
def ggufs(minilm, tmp_path_factory):
    d = tmp_path_factory.mktemp("minilm")
    return {t: convert(minilm, d / f"minilm-{t}.gguf", t) for t in ("f32", "f16", "q8_0")}


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


# -- token ids ---------------------------------------------------------------------------------------------------

def test_ids_equal_sentence_transformers_from_the_hf_dir(minilm, golden):
    tok = WordPieceTokenizer.from_hf_dir(minilm)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ids = [tok.encode(s) for s in golden["sentences"]]
    assert ids == ragged(golden, "st")
    assert any("dropped" in str(x.message) for x in w)          # the one sentence over 256 tokens warns


def test_ids_equal_sentence_transformers_from_the_gguf(ggufs, golden):
    tok = WordPieceTokenizer.from_gguf_metadata(gguf.load(ggufs["f32"]).metadata)
    ids = [truncated(tok.encode(s)) for s in golden["sentences"]]
    assert ids == ragged(golden, "st")


def test_llama_cpp_compat_ids_equal_llama_cpp(ggufs, golden):
    """compat="llama.cpp" reproduces llama.cpp's own WPM tokenizer, which differs from Hugging Face's on Hangul
    (its accent stripping keeps the first code point of a decomposed syllable): the golden set has one such
    sentence, and the default tokenizer must differ from llama.cpp exactly there."""
    kv = gguf.load(ggufs["f32"]).metadata
    lc = ragged(golden, "lc_f32")
    compat = WordPieceTokenizer.from_gguf_metadata(kv, compat="llama.cpp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert [compat.encode(s) for s in golden["sentences"]] == lc
        hf = [WordPieceTokenizer.from_gguf_metadata(kv).encode(s) for s in golden["sentences"]]
    differ = [s for s, a, b in zip(golden["sentences"], hf, lc) if a != b]
    assert differ == ["한국어 문장도 토큰화됩니다."]


# -- embeddings --------------------------------------------------------------------------------------------------

def test_f32_embeddings_match_sentence_transformers(minilm, ggufs, golden):
    ids = ragged(golden, "st")
    for src in (minilm, ggufs["f32"]):
        emb = bert.embed_ids(bert.load(src), ids)
        c = cosines(emb, golden["st_emb"])
        assert c.min() >= 0.99999, (src, c.min(), int(c.argmin()))
        assert np.allclose(np.linalg.norm(emb.astype(np.float64), axis=1), 1.0, atol=1e-6)


def test_embed_from_text_equals_embed_from_ids(minilm, golden):
    model = bert.load(minilm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = bert.embed(model, golden["sentences"])
    assert np.array_equal(a, bert.embed_ids(model, ragged(golden, "st")))


def test_q8_0_embeddings_stay_close_to_sentence_transformers(ggufs, golden):
    emb = bert.embed_ids(bert.load(ggufs["q8_0"]), ragged(golden, "st"))
    c = cosines(emb, golden["st_emb"])
    assert c.min() >= 0.999, (c.min(), int(c.argmin()))


@pytest.mark.parametrize("t, bound", [("f32", 0.99999), ("f16", 0.99999), ("q8_0", 0.998)])
def test_embeddings_match_llama_cpp_on_the_converted_gguf(ggufs, golden, t, bound):
    ids = [truncated(x) for x in ragged(golden, f"lc_{t}")]
    emb = bert.embed_ids(bert.load(ggufs[t]), ids)
    c = cosines(emb, golden[f"lc_{t}_emb"])
    assert c.min() >= bound, (t, c.min(), int(c.argmin()))


# -- the converter against llama.cpp's -----------------------------------------------------------------------------

def _digest(v):
    return hashlib.sha256(json.dumps(list(v), ensure_ascii=False).encode()).hexdigest()


@pytest.mark.parametrize("t", ["f32", "f16", "q8_0"])
def test_convert_writes_what_llama_cpps_converter_writes(ggufs, t):
    ref = json.loads((DATA / "bert_minilm_convert.json").read_text())[t]
    f = gguf.load(ggufs[t])
    for k, v in ref["metadata"].items():
        assert k in f.metadata, k
        ours = f.metadata[k]
        if isinstance(v, dict) and "sha256" in v:
            assert (len(ours), _digest(ours)) == (v["len"], v["sha256"]), k
        elif isinstance(v, float):
            assert np.float32(ours) == np.float32(v), k
        else:
            assert ours == v, k
    extra = {k for k in f.metadata if not k.startswith("general.")} - set(ref["metadata"])
    assert not extra, f"keys llama.cpp's converter does not write: {sorted(extra)}"
    assert sorted(f.tensor_info) == sorted(ref["tensors"])          # (the table is stored with sorted keys)
    for name, info in f.tensor_info.items():
        r = ref["tensors"][name]
        data = f.data[info.file_offset:info.file_offset + info.nbytes].tobytes()
        got = (info.type.name, list(info.ne), hashlib.sha256(data).hexdigest())
        assert got == (r["type"], r["ne"], r["sha256"]), name


def test_q8_0_in_ggml_numerics_is_llama_cpp_bit_for_bit(ggufs, golden):
    """numerics="ggml" (activations rounded to Q8_0 before each Q8_0 mul_mat, ggml's lane order, its exp and
    GELU table) reproduces llama.cpp's pooled embeddings of the Q8_0 GGUF exactly (exact mode: cosine 0.9988).
    Three short sentences keep the NumPy emulation's cost small."""
    import refimpl
    ids = ragged(golden, "lc_q8_0")[:3]
    with refimpl.numerics("ggml"):
        emb = bert.embed_ids(bert.load(ggufs["q8_0"]), ids, normalize=False)
    assert np.array_equal(emb.view(np.uint32), golden["lc_q8_0_emb"][:3].view(np.uint32))


@pytest.mark.parametrize("t", ["f32", "f16"])
def test_float_ggufs_in_ggml_numerics_are_llama_cpp_bit_for_bit(ggufs, golden, t):
    """F32 / F16 weights under numerics="ggml": llamafile's tinyBLAS order where llama.cpp takes it (weights with
    a multiple of 4 rows and a contiguous src1), vec_dot where it does not (BERT's permuted Q for kq), glibc's
    expf in the softmax: llama.cpp's pooled embeddings bit for bit. One text per batch, as llama.cpp decodes them
    (a padded batch changes the tinyBLAS tiles)."""
    import refimpl
    ids = ragged(golden, f"lc_{t}")[:3]
    with refimpl.numerics("ggml"):
        emb = bert.embed_ids(bert.load(ggufs[t]), ids, normalize=False, batch_size=1)
    assert np.array_equal(emb.view(np.uint32), golden[f"lc_{t}_emb"][:3].view(np.uint32))
