"""refimpl.tokenizers.wordpiece against Hugging Face `tokenizers` on the real all-MiniLM-L6-v2 vocabulary.

Every expected id comes from `tokenizers` (BertTokenizerFast's engine, loaded from the model's own
tokenizer.json) or, for `compat="llama.cpp"`, from llama.cpp (ids recorded below from
llama-cpp-python 0.3.36 on a GGUF made by its convert_hf_to_gguf.py from the same directory).
The model directory comes from `refimpl fetch minilm`; tests that need it skip without it.
"""
from __future__ import annotations

import json
import shutil
import unicodedata
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests._profiles import examples

import refimpl.fetch
from refimpl.tokenizers.wordpiece import WordPieceTokenizer, from_hf_dir

pytestmark = pytest.mark.golden

tokenizers = pytest.importorskip("tokenizers", reason="the `tokenizers` package (the reference) is not installed")

MINILM = refimpl.fetch.path("minilm")


@pytest.fixture(autouse=True)
def _minilm_present():
    """The real model is part of the test set-up (scripts/test.sh fetches it): missing, the tests fail."""
    if not (MINILM / "tokenizer.json").is_file():
        pytest.fail(f"all-MiniLM-L6-v2 is not in {MINILM}: refimpl fetch minilm (scripts/test.sh does)")

EXAMPLES = settings(max_examples=examples(250), deadline=None, suppress_health_check=[HealthCheck.too_slow])

HARD = [
    "", " ", "   \t\n  ", "Hello, world!", "unaffable", "Héllo Wörld, ça va? Ångström naïve façade",
    "ΟΔΟΣ İstanbul ǅ ﬁ Ⅻ 𝐀𝐁", "日本語のテキストと中文字符，还有한국어", "emoji 😀👍🏽 🇫🇷 family 👨‍👩‍👧",
    "مرحبا بالعالم! 123", "עברית שלום", "हिंदी नमस्ते", "தமிழ் ொ", "ไทย ภาษา",
    "mixed--punct...!!??;;«»„“”‘’ — – … ¿¡ ¶§ $5 + 3 = <8> ^ ` | ~",
    "tab\tnew\nline\rcr\x0bvt\x0cff\x85nel\u2028ls\u3000ideo\u00a0nbsp",
    "nul\x00ctl\x01\x1f\x7f\ufffdrep\u200bzw\u00adshy\u200dzwj\ue000pua\u2066bidi",
    "a" * 99, "b" * 100, "c" * 101, "supercalifragilisticexpialidocious" * 4,
    "[SEP] inside [CLS] text [MASK][UNK][PAD] and [sep] lower [ SEP ] [SEP", "[[SEP]]",
    "combining: e\u0301 a\u0323\u0302 x\u0344 \u1734x", "new in Unicode 9-14: x\u2e4fy a\u0890b \u061d z\u07fd",
    "don't won't y'all it's 'quoted' \"double\"", "3.14159 1,000,000 2024-01-01 12:30",
    "http://example.com/path?q=1&r=2#frag user@example.org", "CamelCaseWords and snake_case_words",
]
# llama.cpp's ids (llama-cpp-python 0.3.36, Llama(gguf, vocab_only=True).tokenize(s, add_bos=True, special=True))
LLAMA_CPP_IDS = {
    "hangul": ("한국어", [101, 1469, 29991, 29999, 102]),
    "devanagari": ("हिंदी", [101, 1339, 29861, 102]),
    "vtab": ("a\x0bb", [101, 1037, 1038, 102]),
    "formfeed": ("a\x0cb", [101, 1037, 1038, 102]),
    "nel": ("a\x85b", [101, 1037, 1038, 102]),
    "long_word": ("a" * 101, [101, 13360] + [11057] * 49 + [102]),
    "tamil": ("தமிழ் ொ", [101, 100, 102]),
    "new_punct": ("x\u2e4fy", [101, 1060, 100, 1061, 102]),
    "new_format": ("a\u0890b", [101, 11113, 102]),
    "accents": ("Ångström café naïve", [101, 17076, 15687, 7668, 15743, 102]),
    "special": ("[SEP] x [sep][CLS]", [101, 102, 1060, 1031, 19802, 1033, 101, 102]),
    "greek": ("ΟΔΟΣ İstanbul", [101, 1169, 29722, 29730, 29733, 9960, 102]),
}

# Text strategies: any Unicode (no surrogates: `tokenizers` takes UTF-8), and one biased to the hard
# cases: punctuation, CJK, combining marks, Hangul, controls, odd whitespace, special-token texts.
any_text = st.text(max_size=60)
hard_char = st.one_of(
    st.characters(categories=["Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So"]),
    st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), st.characters(min_codepoint=0x20000,
                                                                              max_codepoint=0x2FA1F),
    st.characters(categories=["Mn", "Mc", "Me"]), st.characters(min_codepoint=0xAC00, max_codepoint=0xD7A3),
    st.characters(categories=["Cc", "Cf", "Co", "Zs", "Zl", "Zp"]), st.sampled_from(list("\t\n\r\x0b\x0c\x85 ")),
    st.characters(min_codepoint=0x20, max_codepoint=0x24F), st.characters(min_codepoint=0x370, max_codepoint=0xDFF),
    st.sampled_from(["[SEP]", "[CLS]", "[MASK]", "[UNK]", "[PAD]", "[sep]", "the", "##ing", "Hello", "a" * 50]),
)
hard_text = st.lists(hard_char, max_size=40).map("".join)
text = st.one_of(any_text, hard_text)


@pytest.fixture(scope="module")
def hf():
    t = tokenizers.Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    t.no_truncation()
    t.no_padding()
    return t


@pytest.fixture(scope="module")
def tok():
    t = from_hf_dir(MINILM)
    t.max_length = None          # truncation is tested on its own
    return t


def _phantom_gguf_kv(directory) -> dict:
    """The tokenizer metadata llama.cpp's convert_hf_to_gguf.py writes for this BERT directory: the
    vocabulary in phantom-space form ("##x" -> "x", CONTROL tokens as they are, others "▁" + text),
    token types (CONTROL for the added special tokens), the special ids of its SpecialVocab (no cls
    key exists: [CLS] goes in as BOS), add_*_token flags and the BertNormalizer's lowercase."""
    tj = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tj["model"]["vocab"]
    texts = sorted(vocab, key=vocab.get)
    control = {a["id"] for a in tj["added_tokens"] if a["special"]}
    types = [3 if i in control else 1 for i in range(len(texts))]
    phantom = [t if ty == 3 else (t[2:] if t.startswith("##") else "\u2581" + t) for t, ty in zip(texts, types)]
    return {
        "general.architecture": "bert", "bert.context_length": 512,
        "tokenizer.ggml.model": "bert", "tokenizer.ggml.pre": "jina-v2-en",
        "tokenizer.ggml.tokens": phantom, "tokenizer.ggml.token_type": types, "tokenizer.ggml.token_type_count": 2,
        "tokenizer.ggml.bos_token_id": vocab["[CLS]"], "tokenizer.ggml.eos_token_id": vocab["[SEP]"],
        "tokenizer.ggml.unknown_token_id": vocab["[UNK]"], "tokenizer.ggml.seperator_token_id": vocab["[SEP]"],
        "tokenizer.ggml.padding_token_id": vocab["[PAD]"], "tokenizer.ggml.mask_token_id": vocab["[MASK]"],
        "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True,
        "tokenizer.ggml.add_sep_token": False, "tokenizer.ggml.normalizer.lowercase": True,
    }


@pytest.fixture(scope="module")
def gguf_tok():
    from refimpl.tokenizer import from_gguf
    t = from_gguf(_phantom_gguf_kv(MINILM))      # the dispatch refimpl.tokenizer does for "bert"
    assert isinstance(t, WordPieceTokenizer)
    t.max_length = None
    return t


# ---- ids identical to tokenizers ----------------------------------------------------------------

@pytest.mark.parametrize("s", HARD)
def test_hard_sentences_match_tokenizers(tok, gguf_tok, hf, s):
    enc = hf.encode(s)
    assert tok.encode(s) == enc.ids
    assert gguf_tok.encode(s) == enc.ids
    assert tok.tokenize(s) == hf.encode(s, add_special_tokens=False).tokens


@settings(max_examples=examples(1000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s=text)
def test_any_text_matches_tokenizers(tok, gguf_tok, hf, s):
    ids = hf.encode(s).ids
    assert tok.encode(s) == ids
    assert gguf_tok.encode(s) == ids


@EXAMPLES
@given(s=hard_text)
def test_parse_special_false_matches_tokenizers(tok, hf, s):
    hf.encode_special_tokens = True          # special texts are ordinary text
    try:
        ids = hf.encode(s).ids
    finally:
        hf.encode_special_tokens = False
    assert tok.encode(s, parse_special=False) == ids


@pytest.mark.parametrize("lower,strip,chinese", [(False, False, True), (False, None, False), (True, False, True),
                                                 (False, True, True), (True, True, False)])
@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(s=text)
def test_normalizer_options_match_tokenizers(lower, strip, chinese, s):
    """Cased / accent-keeping / no-CJK-split variants against a `tokenizers` pipeline built the same way."""
    hf = _options_reference(lower, strip, chinese)
    ours = _options_ours(lower, strip, chinese)
    assert ours.encode(s) == hf.encode(s).ids


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s=st.text(alphabet=st.characters(max_codepoint=127), max_size=80))
def test_ascii_text_matches_tokenizers(tok, gguf_tok, hf, s):
    assert tok.encode(s) == gguf_tok.encode(s) == hf.encode(s).ids
    assert tok.words(s) == [w for w, _ in hf.pre_tokenizer.pre_tokenize_str(hf.normalizer.normalize_str(s))]


_OPTION_CACHE: dict = {}


def _options_reference(lower, strip, chinese):
    key = ("hf", lower, strip, chinese)
    if key not in _OPTION_CACHE:
        from tokenizers import models, normalizers, pre_tokenizers, processors
        t = tokenizers.Tokenizer(models.WordPiece.from_file(str(MINILM / "vocab.txt"), unk_token="[UNK]"))
        t.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=chinese,
                                                  strip_accents=strip, lowercase=lower)
        t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        t.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
        t.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", t.token_to_id("[CLS]")), ("[SEP]", t.token_to_id("[SEP]"))])
        _OPTION_CACHE[key] = t
    return _OPTION_CACHE[key]


def _options_ours(lower, strip, chinese):
    key = ("ours", lower, strip, chinese)
    if key not in _OPTION_CACHE:
        _OPTION_CACHE[key] = WordPieceTokenizer.from_vocab(MINILM / "vocab.txt", do_lower_case=lower,
                                                           strip_accents=strip, tokenize_chinese_chars=chinese)
    return _OPTION_CACHE[key]


def test_vocab_txt_route_matches_tokenizers(tmp_path, hf):
    """Without tokenizer.json: vocab.txt + tokenizer_config.json give the same tokenizer."""
    for name in ("vocab.txt", "tokenizer_config.json", "sentence_bert_config.json"):
        shutil.copy(MINILM / name, tmp_path / name)
    t = from_hf_dir(tmp_path)
    assert t.max_length == json.loads((MINILM / "sentence_bert_config.json").read_text())["max_seq_length"]
    t.max_length = None
    for s in HARD:
        assert t.encode(s) == hf.encode(s).ids


def test_gguf_padding_and_user_defined_tokens(hf):
    """A converter that pads the vocabulary to config.json's vocab_size with "[PAD<i>]" (UNUSED) and
    keeps a non-special added token (USER_DEFINED, phantom-spelled): padding is never produced and
    decodes to nothing; the added token is cut out of the text as Hugging Face does."""
    kv = _phantom_gguf_kv(MINILM)
    n = len(kv["tokenizer.ggml.tokens"])
    kv["tokenizer.ggml.tokens"] = kv["tokenizer.ggml.tokens"] + ["\u2581<extra>", f"[PAD{n + 1}]", f"[PAD{n + 2}]"]
    kv["tokenizer.ggml.token_type"] = kv["tokenizer.ggml.token_type"] + [4, 5, 5]
    t = WordPieceTokenizer.from_gguf_metadata(kv)
    t.max_length = None
    ref = tokenizers.Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    ref.no_truncation()
    ref.no_padding()
    assert ref.add_tokens(["<extra>"]) == 1 and ref.token_to_id("<extra>") == n
    for s in HARD + ["a<extra>b", f"[PAD{n + 1}]"]:
        assert t.encode(s) == ref.encode(s).ids
    assert t.decode([n, n + 1, t.vocab["hello"]]) == ref.decode([n, t.vocab["hello"]])
    assert t.token_to_piece(n + 1) == b""


def test_special_ids_and_attributes(tok, gguf_tok, hf):
    for t in (tok, gguf_tok):
        assert t.model == "bert" and t.n_vocab == hf.get_vocab_size() == len(t.tokens)
        assert (t.cls_id, t.sep_id, t.unk_id, t.pad_id, t.mask_id) == tuple(
            hf.token_to_id(x) for x in ("[CLS]", "[SEP]", "[UNK]", "[PAD]", "[MASK]"))
        assert (t.bos_id, t.eos_id) == (t.cls_id, t.sep_id)
        assert t.do_lower_case and t.strip_accents in (None, True) and t.tokenize_chinese_chars
    assert tok.tokens == gguf_tok.tokens == [hf.id_to_token(i) for i in range(hf.get_vocab_size())]
    kv = _phantom_gguf_kv(MINILM)
    assert WordPieceTokenizer.from_gguf_metadata(kv).max_length == kv["bert.context_length"]


# ---- truncation, pairs, batches, decoding ------------------------------------------------------

def test_truncation_keeps_cls_sep_and_warns(hf):
    t = from_hf_dir(MINILM)                       # max_length 256 (sentence_bert_config.json)
    s = "the quick brown fox jumps over the lazy dog. " * 40      # 400 pieces
    ref = tokenizers.Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    ref.no_padding()
    ref.enable_truncation(max_length=t.max_length)
    n_pieces = len(hf.encode(s, add_special_tokens=False).ids)
    with pytest.warns(UserWarning, match=f"{n_pieces - (t.max_length - 2)} tokens dropped"):
        ids = t.encode(s)
    assert ids == ref.encode(s).ids and len(ids) == t.max_length
    assert ids[0] == t.cls_id and ids[-1] == t.sep_id
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(t.encode("short text")) < t.max_length


@pytest.mark.parametrize("la,lb", [(10, 10), (300, 5), (5, 300), (200, 200), (127, 128)])
def test_pair_matches_tokenizers(la, lb):
    t = from_hf_dir(MINILM)
    ref = tokenizers.Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    ref.no_padding()
    ref.enable_truncation(max_length=t.max_length)
    a, b = " ".join(["alpha"] * la), " ".join(["beta"] * lb)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ids, types = t.encode_pair(a, b)
    enc = ref.encode(a, b)
    assert ids == enc.ids and types == enc.type_ids


def test_encode_batch(tok, hf):
    assert tok.encode_batch(HARD) == [e.ids for e in hf.encode_batch(HARD)]


@EXAMPLES
@given(s=text, special=st.booleans())
def test_decode_matches_tokenizers(tok, hf, s, special):
    ids = hf.encode(s).ids
    assert tok.decode(ids, special=special) == hf.decode(ids, skip_special_tokens=not special)


def test_token_to_piece_is_llama_cpp_piece(tok):
    hello, ing = tok.vocab["hello"], tok.vocab["##ing"]
    assert tok.token_to_piece(hello) == b" hello" and tok.token_to_piece(ing) == b"ing"
    assert tok.token_to_piece(tok.cls_id) == b"[CLS]" and tok.token_to_piece(tok.cls_id, special=False) == b""
    dec = tok.stream()
    assert "".join(dec.push(i) for i in (hello, ing)) + dec.flush() == " helloing"


# ---- compat="llama.cpp" -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cpp_tok():
    t = WordPieceTokenizer.from_gguf_metadata(_phantom_gguf_kv(MINILM), compat="llama.cpp")
    t.max_length = None
    return t


@pytest.mark.parametrize("name", sorted(LLAMA_CPP_IDS))
def test_llama_cpp_compat_matches_recorded_llama_cpp(cpp_tok, name):
    s, ids = LLAMA_CPP_IDS[name]
    assert cpp_tok.encode(s) == ids


@pytest.mark.parametrize("name", ["hangul", "devanagari", "vtab", "long_word", "new_format"])
def test_llama_cpp_differs_from_tokenizers_where_documented(hf, name):
    s, ids = LLAMA_CPP_IDS[name]
    assert hf.encode(s).ids != ids


@EXAMPLES
@given(s=st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E)
                 | st.sampled_from(list("\t\n éàüçñ—“”")), max_size=80))
def test_llama_cpp_compat_equals_tokenizers_on_everyday_text(cpp_tok, hf, s):
    """On Latin text without long words the two tokenizers agree (the differences are all elsewhere)."""
    if any(len(w) > 100 for w in s.split()):
        return
    assert cpp_tok.encode(s) == hf.encode(s).ids


@EXAMPLES
@given(s=st.lists(st.characters(min_codepoint=0xAC00, max_codepoint=0xD7A3) | st.just(" "), max_size=20).map("".join))
def test_llama_cpp_compat_keeps_first_codepoint_of_nfd(cpp_tok, hf, s):
    """llama.cpp's NFD keeps one codepoint: a Hangul syllable reads as its leading consonant."""
    leading = "".join(unicodedata.normalize("NFD", c)[0] for c in s)
    assert cpp_tok.encode(s) == hf.encode(leading).ids


def test_lone_surrogates_are_deleted(tok, hf):
    """`tokenizers` takes UTF-8, which has no lone surrogates: they are deleted, as control characters are."""
    for s in ("a\ud800b", "\udfff", "x \udc00y [SEP]"):
        clean = "".join(c for c in s if not 0xD800 <= ord(c) <= 0xDFFF)
        assert tok.encode(s) == hf.encode(clean).ids
