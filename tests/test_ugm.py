"""The UGM (T5-style unigram) tokenizer on vocabularies small enough to work out by hand. llama.cpp's own ids on
a real UGM vocabulary (nomic-bert-moe) are tests/test_vocab_vectors.py's; these pin the rules one at a time.

Scores of the vocabulary below: "▁a" -1, "▁ab" -3, "b" -1.5, "▁" -2, "a" -2.5, "c" -4 (the lowest normal score,
so the unknown token scores -4 - 10 = -14)."""
from __future__ import annotations

import pytest

from refimpl import tokenizer
from refimpl.tokenizers.ugm import UGM

S = "\u2581"
TOKENS = ["<pad>", "</s>", "<unk>", S + "a", S + "ab", "b", S, "a", "c"]
TYPES = [3, 3, 2, 1, 1, 1, 1, 1, 1]          # CONTROL, CONTROL, UNKNOWN, NORMAL...
SCORES = [0.0, 0.0, 0.0, -1.0, -3.0, -1.5, -2.0, -2.5, -4.0]

pytestmark = pytest.mark.property


def ugm(scores=SCORES, *, prefix=True, merge=False, tokens=TOKENS, types=TYPES):
    return UGM(tokens, types, scores, 2, None, add_space_prefix=prefix, remove_extra_whitespaces=merge)


def test_the_best_scoring_path_wins():
    # "▁ab": "▁a" + "b" = -2.5 beats "▁ab" = -3 and "▁" + "a" + "b" = -6
    assert ugm().encode("ab") == [3, 5]
    # with "▁ab" at -2 the single token wins
    assert ugm(SCORES[:4] + [-2.0] + SCORES[5:]).encode("ab") == [4]


def test_a_tie_keeps_the_path_found_first():
    # "▁ab" = -2.5 = "▁a" + "b": the path reaching the end first (the longer token, offered from position 0)
    # stays, as llama.cpp replaces a best path only on a strictly higher score
    assert ugm(SCORES[:4] + [-2.5] + SCORES[5:]).encode("ab") == [4]


def test_uncovered_characters_are_one_unknown_token_per_run():
    # "z" is in no token: the unknown token (-14 each); consecutive unknowns become one
    assert ugm().encode("azz") == [3, 2]
    assert ugm().encode("zaz") == [6, 2, 7, 2]
    assert ugm().unknown_score == -14.0


def test_space_handling():
    u = ugm()
    assert u.normalize(b"  a b") == (S * 3 + "a" + S + "b").encode()       # each space escaped, one prefix
    assert ugm(prefix=False).normalize(b"a b") == ("a" + S + "b").encode()
    assert ugm(merge=True).normalize(b"  a   b  ") == (S + "a" + S + "b").encode()
    assert u.encode("") == [] and ugm(merge=True).encode("   ") == []


def test_user_defined_tokens_score_zero_and_pass_normalization_unchanged():
    tokens, types, scores = TOKENS + ["ab"], TYPES + [4], SCORES + [-100.0]
    u = ugm(scores, prefix=False, tokens=tokens, types=types)
    assert u.encode("ab") == [9]                 # score 0, not -100, beats "a" + "b" = -4


def test_invalid_utf8_becomes_the_replacement_character():
    assert ugm(prefix=False).normalize("\udcff".encode("utf-8", "surrogateescape")) == "\ufffd".encode()


def test_a_truncated_charsmap_is_a_clear_error():
    bad = (100).to_bytes(4, "little") + bytes(8)
    with pytest.raises(ValueError, match="precompiled_charsmap says its array has 100 bytes; the key holds 8"):
        UGM(TOKENS, TYPES, SCORES, 2, bad, add_space_prefix=True, remove_extra_whitespaces=False)
    with pytest.raises(ValueError, match="precompiled_charsmap has 2 bytes"):
        UGM(TOKENS, TYPES, SCORES, 2, b"\0\0", add_space_prefix=True, remove_extra_whitespaces=False)


def test_a_t5_vocabulary_gets_llama_cpps_defaults():
    """llama.cpp's "t5" model: no BOS, EOS (id 1) appended with add_special, unknown id 2, no space prefix
    unless the metadata asks for one."""
    kv = {"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": TOKENS, "tokenizer.ggml.token_type": TYPES,
          "tokenizer.ggml.scores": SCORES}
    tok = tokenizer.from_gguf(kv)
    assert (tok.bos_id, tok.eos_id, tok.unk_id, tok.pad_id) == (None, 1, 2, 0)
    assert tok.encode("a b", add_special=True) == [7, 6, 5, 1]
    tok = tokenizer.from_gguf(dict(kv, **{"tokenizer.ggml.add_space_prefix": True}))
    assert tok.encode("ab</s>", add_special=False, parse_special=True) == [3, 5, 1]
    assert tok.decode([3, 5, 1]) == "ab</s>"


def test_a_malformed_charsmap_is_an_error_of_the_file(tmp_path):
    from refimpl import gguf
    from refimpl.errors import TokenizerError
    p = tmp_path / "bad-ugm.gguf"
    gguf.save(p, {"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": TOKENS, "tokenizer.ggml.token_type": TYPES,
                  "tokenizer.ggml.scores": SCORES,
                  "tokenizer.ggml.precompiled_charsmap": list((100).to_bytes(4, "little") + bytes(8))}, {})
    with pytest.raises(TokenizerError, match="bad-ugm.gguf.*precompiled_charsmap says its array has 100 bytes"):
        tokenizer.from_gguf(p)
