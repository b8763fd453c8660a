"""refimpl.tokenizer against llama.cpp's tokenizer (golden files from scripts/gen_llama_goldens.py).

The goldens hold llama.cpp's ids for a few hundred strings on SmolLM2-135M's real vocabulary (and
the same vocabulary under other pre-tokenizers), and for a toy SentencePiece vocabulary stored in the
golden file itself. The SmolLM2 tests need the GGUF in the cache (`refimpl fetch smollm2`) and skip
without it; BPE encoding needs the `tokenizers` package. llama-cpp-python is never needed here.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from refimpl import fetch
from refimpl.tokenizer import PRE_TOKENIZERS, TokenType, from_gguf
from tests._models import SMOLLM2_FILE, missing_reason, smollm2_path

pytestmark = pytest.mark.golden

GOLDEN = Path(__file__).parent / "golden_data"


def _load(name):
    p = GOLDEN / name        # committed golden data: missing means a broken checkout, so fail
    with open(p) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def golden():
    return _load("llama_tokens_smollm2.json")


@pytest.fixture(scope="module")
def golden_pre():
    return _load("llama_tokens_pre.json")


@pytest.fixture(scope="module")
def smollm2_metadata():
    p = smollm2_path()
    if p is None:
        pytest.skip(missing_reason(SMOLLM2_FILE))
    from refimpl import gguf
    return gguf.load(p).metadata


@pytest.fixture(scope="module")
def tok(smollm2_metadata):
    return from_gguf(smollm2_metadata)


@pytest.fixture(scope="module")
def bpe(tok):
    pytest.importorskip("tokenizers", reason="BPE encoding needs the tokenizers package")
    return tok


@pytest.fixture(scope="module")
def spm(golden_pre):
    return from_gguf(golden_pre["spm"]["metadata"])


def _mismatches(strings, expected, encode):
    bad = []
    for s, want in zip(strings, expected):
        got = encode(s)
        if got != want:
            bad.append(f"{s!r}: llama.cpp {want}, refimpl {got}")
    return bad


def _assert_all_match(strings, expected, encode):
    assert len(strings) == len(expected)
    bad = _mismatches(strings, expected, encode)
    assert not bad, (f"{len(strings) - len(bad)}/{len(strings)} strings agree; first differences:\n"
                     + "\n".join(bad[:10]))


# ---- SmolLM2 (gpt2 BPE, pre-tokenizer "smollm") ---------------------------------------------------

def test_smollm2_ids_match_llama_cpp(bpe, golden):
    """llama_tokenize(s, add_special=False, parse_special=True) on every golden string."""
    assert bpe.pre == golden["tokenizer_pre"] == "smollm"
    _assert_all_match(golden["strings"], golden["ids"], lambda s: bpe.encode(s, add_special=False))


def test_smollm2_ids_without_special_parsing(bpe, golden):
    _assert_all_match(golden["strings"], golden["ids_plain"],
                      lambda s: bpe.encode(s, add_special=False, parse_special=False))


def test_smollm2_add_special(bpe, golden):
    """SmolLM2's GGUF says add_bos_token = false: add_special adds nothing, as in llama.cpp."""
    for s, want in golden["ids_add_bos"].items():
        assert bpe.encode(s, add_special=True) == want, s


def test_smollm2_special_ids(tok, golden):
    v = golden["vocab"]
    assert tok.n_vocab == v["n_vocab"] == 49152
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (v["bos"], v["eos"], v["pad"])
    assert tok.eot_id == 2 and tok.tokens[tok.eot_id] == "<|im_end|>"
    if v["eot"] != tok.eot_id:    # llama.cpp picks among several end-of-turn texts in hash-map order
        assert tok.tokens[v["eot"]] in ("<|im_end|>", "<|endoftext|>")
    assert (tok.add_bos, tok.add_eos) == (v["add_bos"], v["add_eos"])
    assert sorted(tok.eog_ids) == v["eog"]
    assert all(tok.is_eog(i) for i in v["eog"]) and not tok.is_eog(v["nl"])
    assert tok.encode("\n", add_special=False) == [v["nl"]]


@pytest.mark.parametrize("special", [True, False])
def test_smollm2_token_to_piece_matches_llama_cpp(tok, golden, special):
    """llama_token_to_piece(id, lstrip=0, special) for all 49152 ids (compared through a SHA-256)."""
    h = hashlib.sha256()
    for i in range(tok.n_vocab):
        p = tok.token_to_piece(i, special=special)
        h.update(len(p).to_bytes(4, "little") + p)
    assert h.hexdigest() == golden["vocab"][f"pieces_sha256_special_{str(special).lower()}"]


def test_smollm2_decode_matches_llama_cpp(tok, golden):
    """decode(llama.cpp's ids) is llama_detokenize's text: the string itself, except where the golden
    file records llama.cpp's bytes."""
    for s, ids in zip(golden["strings"], golden["ids"]):
        want = bytes.fromhex(golden["decode"][s]).decode("utf-8", "replace") if s in golden["decode"] else s
        assert tok.decode(ids) == want, s


@pytest.mark.parametrize("parse_special", [True, False])
def test_smollm2_round_trip(bpe, golden, parse_special):
    bad = [s for s in golden["strings"] if bpe.decode(bpe.encode(s, parse_special=parse_special)) != s]
    assert not bad, bad[:10]


def test_special_tokens_parse_to_single_ids(bpe):
    ids = bpe.encode("<|im_start|>user\nHi<|im_end|>\n")
    assert ids[0] == 1 and ids[-2:] == [2, 198]
    assert bpe.encode("<|im_start|>", parse_special=False) != [1]          # plain text: several tokens
    assert len(bpe.encode("<|im_start|>", parse_special=False)) > 1
    assert bpe.decode([1, 2]) == "<|im_start|><|im_end|>"
    assert bpe.decode([1, 2], special=False) == ""                          # control tokens dropped
    assert bpe.token_to_piece(2) == b"<|im_end|>" and bpe.token_to_piece(2, special=False) == b""


def test_smollm2_chat_template(bpe, golden):
    pytest.importorskip("jinja2")
    c = golden["chat"]
    text = bpe.apply_chat_template(c["messages"], add_generation_prompt=c["add_generation_prompt"])
    assert text == c["text"]
    assert bpe.encode(text) == c["ids"]


# ---- streaming -----------------------------------------------------------------------------------

def _stream(tok, ids, special=True):
    dec = tok.stream(special=special)
    chunks = [dec.push(i) for i in ids]
    return chunks, dec.flush()


def test_stream_equals_decode(tok, golden):
    for s, ids in zip(golden["strings"], golden["ids"]):
        chunks, tail = _stream(tok, ids)
        assert "".join(chunks) + tail == tok.decode(ids) == s, s
        assert tail == ""


@pytest.mark.parametrize("text", ["😀", "👨‍👩‍👧‍👦", "日本語のテキスト", "🇫🇷🇯🇵 ok", "a😀b😀c", "안녕하세요 세계",
                                  "naïve café"])
def test_stream_holds_back_split_characters(bpe, text):
    """A character spread over several tokens appears whole, with the token that completes it."""
    ids = bpe.encode(text, add_special=False)
    pieces = [bpe.token_to_piece(i) for i in ids]
    chunks, tail = _stream(bpe, ids)
    assert "".join(chunks) == text and tail == ""
    assert all("\ufffd" not in c for c in chunks)
    done, prev = b"", ""
    for piece, chunk in zip(pieces, chunks):       # each chunk is exactly the newly completed text
        done += piece
        now = _whole_prefix(done)
        assert chunk == now[len(prev):]
        prev = now


def _whole_prefix(b: bytes) -> str:
    """The longest prefix of b that is complete UTF-8, decoded."""
    for cut in range(len(b), -1, -1):
        try:
            return b[:cut].decode()
        except UnicodeDecodeError:
            pass
    return ""


def test_stream_split_emoji_explicitly(bpe):
    ids = bpe.encode("😀", add_special=False)
    assert len(ids) >= 2, "the emoji should need more than one byte token"
    dec = bpe.stream()
    out = [dec.push(i) for i in ids]
    assert out[:-1] == [""] * (len(ids) - 1) and out[-1] == "😀"


def test_stream_invalid_and_incomplete_bytes(bpe):
    """Bytes that never complete a character become U+FFFD, exactly as decode() does."""
    b = bpe.encode("😀", add_special=False)
    for ids in ([b[0]], [b[0], bpe.encode("A", add_special=False)[0]], b[1:], b[1:] + b):
        chunks, tail = _stream(bpe, ids)
        assert "".join(chunks) + tail == bpe.decode(ids)
        assert "\ufffd" in bpe.decode(ids)


def test_stream_special_flag(tok):
    chunks, _ = _stream(tok, [1, 2], special=False)
    assert chunks == ["", ""]


# ---- other pre-tokenizers, same vocabulary ----------------------------------------------------------

@pytest.mark.parametrize("name", ["default", "gpt-2", "llama3", "qwen2", "starcoder"])
def test_pre_tokenizer_matches_llama_cpp(smollm2_metadata, golden_pre, name):
    pytest.importorskip("tokenizers")
    t = from_gguf({**smollm2_metadata, "tokenizer.ggml.pre": name})
    g = golden_pre["pre"][name]
    assert t.add_bos == g["add_bos"]
    _assert_all_match(golden_pre["strings"], g["ids"], lambda s: t.encode(s, add_special=False))
    for s, ids in zip(golden_pre["strings"], g["ids"]):        # llama_detokenize, clean_spaces included
        want = bytes.fromhex(g["decode"][s]).decode("utf-8", "replace") if s in g["decode"] else s
        assert t.decode(ids) == want, s


def test_unknown_pre_tokenizer_is_refused(smollm2_metadata):
    with pytest.raises(ValueError, match="no-such-pre"):
        from_gguf({**smollm2_metadata, "tokenizer.ggml.pre": "no-such-pre"})
    assert "smollm" in PRE_TOKENIZERS and "llama3" in PRE_TOKENIZERS


# ---- SentencePiece ("llama") vocabulary, from the golden file ---------------------------------------

@pytest.mark.parametrize("add", [True, False])
@pytest.mark.parametrize("special", [True, False])
def test_spm_ids_match_llama_cpp(spm, golden_pre, add, special):
    g = golden_pre["spm"][f"ids_add_{str(add).lower()}_special_{str(special).lower()}"]
    _assert_all_match(golden_pre["strings"], g, lambda s: spm.encode(s, add_special=add, parse_special=special))


def test_spm_decode_matches_llama_cpp(spm, golden_pre):
    g = golden_pre["spm"]
    for s, ids in zip(golden_pre["strings"], g["ids_add_false_special_true"]):
        assert spm.decode(ids) == bytes.fromhex(g["decode"][s]).decode("utf-8", "replace"), s


def test_spm_vocab_facts(spm, golden_pre):
    v = golden_pre["spm"]["vocab"]
    assert (spm.bos_id, spm.eos_id, spm.add_bos, spm.add_eos) == (v["bos"], v["eos"], v["add_bos"], v["add_eos"])
    assert sorted(spm.eog_ids) == v["eog"]
    for special in (True, False):
        h = hashlib.sha256()
        for i in range(spm.n_vocab):
            p = spm.token_to_piece(i, special=special)
            h.update(len(p).to_bytes(4, "little") + p)
        assert h.hexdigest() == v[f"pieces_sha256_special_{str(special).lower()}"]
    assert TokenType.USER_DEFINED in spm.token_type and TokenType.BYTE in spm.token_type


def test_spm_stream_equals_decode_without_prefix_strip(spm, golden_pre):
    for s, ids in zip(golden_pre["strings"], golden_pre["spm"]["ids_add_false_special_true"]):
        chunks, tail = _stream(spm, ids)
        text = "".join(chunks) + tail
        d = spm.decode(ids)
        assert text == d or (text.startswith(" ") and text[1:] == d), s


# ---- the logits golden file tokenizes as we do -------------------------------------------------------

def test_logit_prompts_tokenize_identically(bpe):
    z = np.load(fetch.golden("llama_logits_smollm2"))
    meta = json.loads(str(z["meta"]))
    for i, pr in enumerate(meta["prompts"]):
        assert bpe.encode(pr["text"]) == z[f"p{i}_prompt_ids"].tolist(), pr["name"]
        if pr["messages"]:
            pytest.importorskip("jinja2")
            assert bpe.apply_chat_template(pr["messages"]) == pr["text"]


# ---- packaging ---------------------------------------------------------------------------------------

def test_import_is_lazy(golden_pre):
    """import refimpl, building a tokenizer and decoding never import tokenizers (nor jinja2). (The gguf
    package itself imports sentencepiece when it is installed, so that one is not checked.)"""
    code = ("import sys, json, refimpl, refimpl.tokenizer as t\n"
            "md = json.load(open(sys.argv[1]))['spm']['metadata']\n"
            "tok = t.from_gguf(md); tok.encode('hello world'); tok.decode([5, 6, 7])\n"
            "if sys.argv[2]:\n"
            "    bpe = t.from_gguf(sys.argv[2]); bpe.decode([1, 19556, 2]); bpe.stream().push(905)\n"
            "print(sorted(m for m in ('tokenizers', 'jinja2') if m in sys.modules))\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1]))
    model = smollm2_path()
    out = subprocess.run([sys.executable, "-c", code, str(GOLDEN / "llama_tokens_pre.json"), str(model or "")],
                         capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == "[]"
