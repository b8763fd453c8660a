"""refimpl.tokenizers.rwkv: byte round trips, greedy longest match, and the real World vocabulary.

Most tests build small vocabularies (all 256 single bytes plus drawn multi-byte tokens) as GGUF
metadata, the way llama.cpp's converter stores RWKV tokens (Python's bytes repr without b'' quotes),
and check properties against references written here. The World-vocabulary tests need the `rwkv`
package (it ships rwkv_vocab_v20230424.txt and TRIE_TOKENIZER, the reference) and skip without it;
their llama.cpp ids were recorded with llama-cpp-python 0.3.36 from a vocab-only GGUF laid out as
convert_hf_to_gguf.py lays out the World vocabulary.
"""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tests._profiles import examples

from refimpl.tokenizers.rwkv import RWKVTokenizer, escape_token, unescape_token
from refimpl.tokenizer import from_gguf

pytestmark = pytest.mark.golden

EXAMPLES = settings(max_examples=examples(250), deadline=None, suppress_health_check=[HealthCheck.too_slow])
NORMAL, CONTROL, UNUSED = 1, 3, 5


def _kv(pieces: list[bytes], specials: dict[int, str] | None = None) -> dict:
    """GGUF metadata of an RWKV vocabulary: texts as repr(bytes)[2:-1], CONTROL where given as text."""
    specials = specials or {}
    texts = [specials.get(i, repr(p)[2:-1]) for i, p in enumerate(pieces)]
    types = [CONTROL if i in specials else NORMAL for i in range(len(pieces))]
    return {"tokenizer.ggml.model": "rwkv", "tokenizer.ggml.tokens": texts, "tokenizer.ggml.token_type": types}


ALL_BYTES = [bytes([b]) for b in range(256)]
multi_byte_tokens = st.lists(st.one_of(st.binary(min_size=2, max_size=6),
                                       st.text(min_size=1, max_size=4).map(lambda s: s.encode())), max_size=60)


@st.composite
def vocab_and_text(draw, text=st.text(max_size=40)):
    """A vocabulary covering every byte (shuffled ids, duplicates allowed) and a text that reuses its tokens."""
    extra = draw(multi_byte_tokens)
    pieces = draw(st.permutations(ALL_BYTES + extra))
    words = [p.decode("utf-8", "ignore") for p in extra] or [""]
    parts = draw(st.lists(st.one_of(text, st.sampled_from(words)), max_size=6))
    return pieces, "".join(parts)


def _brute_force(pieces: list[bytes], data: bytes) -> list[int]:
    """Greedy longest match by scanning the whole vocabulary at each position; among equal byte
    strings the highest id (llama.cpp's trie keeps the last one inserted)."""
    out, pos = [], 0
    while pos < len(data):
        cands = [(len(p), i) for i, p in enumerate(pieces) if p and data.startswith(p, pos)]
        assert cands, "the vocabulary covers every byte"
        n, i = max(cands)
        out.append(i)
        pos += n
    return out


# ---- generated vocabularies ---------------------------------------------------------------------

@EXAMPLES
@given(vt=vocab_and_text())
def test_round_trip_is_byte_exact(vt):
    pieces, text = vt
    tok = from_gguf(_kv(pieces))
    assert isinstance(tok, RWKVTokenizer)
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode_bytes(ids) == text.encode("utf-8")


@EXAMPLES
@given(pieces=multi_byte_tokens.map(lambda extra: ALL_BYTES + extra), data=st.binary(max_size=60))
def test_round_trip_of_any_bytes(pieces, data):
    tok = from_gguf(_kv(pieces))
    assert tok.decode_bytes(tok.encode_bytes(data)) == data


@EXAMPLES
@given(vt=vocab_and_text())
def test_greedy_longest_match_equals_brute_force(vt):
    pieces, text = vt
    assert from_gguf(_kv(pieces)).encode(text) == _brute_force(pieces, text.encode("utf-8"))


@EXAMPLES
@given(data=st.binary(max_size=40))
def test_escape_round_trip(data):
    assert unescape_token(repr(data)[2:-1]) == data
    assert escape_token(data) == repr(data)[2:-1]


def test_unescape_follows_llama_cpp_rules():
    assert unescape_token("\\t\\n\\r") == b"\t\n\r"
    assert unescape_token("\\x00\\xff\\x7f") == b"\x00\xff\x7f"
    assert unescape_token("\\\\ \\' \\q") == b"\\ ' q"       # backslash before any other char: that char
    assert unescape_token("中") == "中".encode()


@EXAMPLES
@given(vt=vocab_and_text(text=st.text(alphabet=st.characters(min_codepoint=0x80, exclude_characters="\ufffd",
                                                                    exclude_categories=("Cs",)),
                                       max_size=20)))
def test_stream_emits_whole_characters(vt):
    """Multi-byte characters split across tokens come out whole: never a U+FFFD on the way."""
    pieces, text = vt
    assume("\ufffd" not in text)
    tok = from_gguf(_kv(pieces))
    dec = tok.stream()
    parts = [dec.push(i) for i in tok.encode(text)] + [dec.flush()]
    assert "".join(parts) == text
    assert "\ufffd" not in "".join(parts)


def test_special_text_is_parsed_and_control_dropped_on_request():
    pieces = [b"<s>"] + ALL_BYTES + [b"ab"]
    tok = from_gguf(_kv(pieces, {0: "<s>"}) | {"tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 0})
    ab, a, b = len(pieces) - 1, 1 + ord("a"), 1 + ord("b")
    assert tok.encode("ab<s>a") == [ab, 0, a]
    assert tok.encode("ab<s>a", add_special=True) == tok.encode("ab<s>a", add_special=False)   # nothing added
    assert tok.decode([ab, 0, b]) == "ab<s>b" and tok.decode([ab, 0, b], special=False) == "abb"
    assert tok.eog_ids == {0} and tok.bos_id == tok.eos_id == 0


def test_byte_without_token_is_an_error_naming_it():
    tok = from_gguf(_kv([bytes([b]) for b in range(128)]))
    with pytest.raises(ValueError, match="0xc3"):
        tok.encode("é")


def test_world_vocab_file_format(tmp_path):
    """from_world_vocab reads `id literal length` lines (str or bytes literals, spaces and quotes
    inside) and lays them out as llama.cpp's converter does."""
    lines = ["1 'a' 1", "2 b'\\xff' 1", "3 ' x y' 4", "4 \"it's\" 4", "5 '\\n\\n' 2", "6 '中' 3"]
    lines += [f"{i} {b!r} 1" for i, b in enumerate([bytes([b]) for b in range(256)
                                                    if b not in b"a\xff"], start=7)]
    p = tmp_path / "vocab.txt"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tok = RWKVTokenizer.from_world_vocab(p, vocab_size=300)
    assert tok.tokens[0] == "<s>" and tok.token_type[0] == CONTROL
    assert tok.token_bytes[1:7] == [b"a", b"\xff", b" x y", b"it's", b"\n\n", "中".encode()]
    assert tok.tokens[299] == "[PAD299]" and tok.token_type[299] == UNUSED and tok.n_vocab == 300
    space = 7 + 0x20                       # single bytes follow from id 7, 'a' (0x61) and 0xff left out
    assert tok.encode("it's 中 x y") == [4, space, 6, 3]
    assert tok.decode(tok.encode("it's 中 x y\n\n")) == "it's 中 x y\n\n"
    assert tok.encode(" x y\n\n") == [3, 5]
    bad = tmp_path / "bad.txt"
    bad.write_text("1 'ab' 3\n", encoding="utf-8")
    with pytest.raises(ValueError, match="bad.txt:1"):
        RWKVTokenizer.from_world_vocab(bad)


# ---- the real World vocabulary (from the `rwkv` package) ----------------------------------------

def _world_vocab_path() -> Path | None:
    spec = importlib.util.find_spec("rwkv")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(list(spec.submodule_search_locations)[0]) / "rwkv_vocab_v20230424.txt"
    return p if p.is_file() else None


WORLD = _world_vocab_path()
needs_world = pytest.mark.skipif(WORLD is None, reason="the `rwkv` package (with rwkv_vocab_v20230424.txt and "
                                                       "TRIE_TOKENIZER) is not installed: pip install rwkv")

# llama.cpp's ids (llama-cpp-python 0.3.36, tokenize(s, add_bos=True, special=True))
LLAMA_CPP_IDS = [
    ("Hello world\n\n", [33155, 40213, 261]),
    ("<s> x", [0, 355]),                       # the CONTROL text; llama.cpp gives 0 with special=False too
    ("[PAD65530]y", [65530, 122]),              # an UNUSED padding token is still in llama.cpp's trie
]
FIXED = ["", "Hello world\n\n", "User: hi\n\nAssistant:", "中文 日本語 한국어 😀👍🏽", "\x00\x01\x7f\t\r\n",
         "a\\b'c\"d", " " * 300, "-" * 200, "def f(x):\n    return x ** 2\n", "Ünïcödé façade naïve",
         "مرحبا", "\U0010ffff\ufffd"]


@pytest.fixture(scope="module")
def world():
    return RWKVTokenizer.from_world_vocab(WORLD, vocab_size=65536)


@pytest.fixture(scope="module")
def trie_tokenizer():
    from rwkv.rwkv_tokenizer import TRIE_TOKENIZER
    return TRIE_TOKENIZER(str(WORLD))


def _converter_kv(path: Path, vocab_size: int = 65536) -> dict:
    """The tokenizer metadata convert_hf_to_gguf.py writes for the World vocabulary."""
    tokens, types = ["<s>"], [CONTROL]
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split(" ")
        tok = ast.literal_eval(" ".join(parts[1:-1]))
        tokens.append(repr(tok.encode("utf-8") if isinstance(tok, str) else tok)[2:-1])
        types.append(NORMAL)
    tokens += [f"[PAD{i}]" for i in range(len(tokens), vocab_size)]
    types += [UNUSED] * (vocab_size - len(types))
    return {"tokenizer.ggml.model": "rwkv", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 0, "tokenizer.ggml.eot_token_id": 261}


@needs_world
def test_world_vocab_gguf_layout(world):
    g = from_gguf(_converter_kv(WORLD))
    assert g.tokens == world.tokens and g.token_type == world.token_type and g.n_vocab == world.n_vocab == 65536
    assert (g.bos_id, g.eos_id, g.eot_id, g.eog_ids) == (world.bos_id, world.eos_id, world.eot_id, world.eog_ids)
    assert world.token_bytes[world.eot_id] == b"\n\n" and world.eog_ids == {0, 261}


@needs_world
@pytest.mark.parametrize("text,ids", LLAMA_CPP_IDS)
def test_world_vocab_matches_recorded_llama_cpp(world, text, ids):
    assert world.encode(text) == ids


@needs_world
@pytest.mark.parametrize("text", FIXED)
def test_world_vocab_matches_trie_tokenizer(world, trie_tokenizer, text):
    assert world.encode(text) == trie_tokenizer.encode(text)
    assert world.decode(world.encode(text)) == text


# any text: every code point but lone surrogates, which are not text (no UTF-8 bytes; see the test below)
@needs_world
@EXAMPLES
@given(text=st.one_of(st.text(max_size=80), st.lists(st.sampled_from(["\n\n", " the", "ing", "中", "  ", "😀", "é"])
                                                     | st.characters(exclude_categories=("Cs",)),
                                                     max_size=30).map("".join)))
def test_world_vocab_matches_trie_tokenizer_on_any_text(world, trie_tokenizer, text):
    assume("<s>" not in text)          # llama.cpp's extra token; the rwkv package has no id 0
    ids = world.encode(text)
    assert ids == trie_tokenizer.encode(text)
    assert trie_tokenizer.decodeBytes(ids) == text.encode("utf-8") == world.decode_bytes(ids)


@needs_world
@pytest.mark.parametrize("text", ["\ud800", "ok \udfff", "\udc80<s>x"])
def test_world_vocab_refuses_lone_surrogates(world, trie_tokenizer, text):
    """A str holding a lone surrogate has no UTF-8 bytes: encode says so (ValueError naming the character and
    pointing to encode_bytes) instead of tokenizing something else; the rwkv package refuses it too."""
    with pytest.raises(ValueError, match="not valid Unicode .*encode_bytes"):
        world.encode(text)
    with pytest.raises(UnicodeEncodeError):
        trie_tokenizer.encode(text)
