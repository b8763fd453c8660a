"""WordPiece tokenizer (BERT family) that gives the ids of the model's Hugging Face tokenizer.

    tok = refimpl.tokenizers.wordpiece.from_hf_dir(refimpl.fetch.path("minilm"))    # or from a GGUF:
    tok = refimpl.tokenizer.from_gguf("all-MiniLM-L6-v2.gguf")           # the same ids
    ids = tok.encode("Héllo, world!")      # [101, 7592, 1010, 2088, 999, 102]  ([CLS] hello , world ! [SEP])
    tok.tokenize("unaffable")              # ['una', '##ffa', '##ble']
    tok.decode(ids, special=False)         # 'hello, world!'

`encode` reproduces Hugging Face `tokenizers` (BertTokenizerFast; the same rules that its
`tokenizer.json` names: BertNormalizer, BertPreTokenizer, WordPiece, TemplateProcessing):
    0. Added tokens written in the text (the special "[SEP]", "[MASK]", ...; exact, case-sensitive
       text) are cut out first and become their ids; the longest one wins where two start at the
       same place. With `parse_special=False` they are ordinary text ("[SEP]" -> "[", "sep", "]").
    1. Clean text: NUL, U+FFFD and every control character (categories Cc, Cf, Co; tab, newline and
       carriage return excepted) are deleted, so "a\\x0bb" is one word; every White_Space
       character that is left becomes a space.
    2. Chinese characters: every codepoint of the CJK ideograph blocks (`_is_cjk`; note the range
       0x2B920.., not 0x2B820.., as in `tokenizers`) gets a space on each side: one word each.
    3. Strip accents (`strip_accents`, which when None follows `do_lower_case`): NFD, then delete
       the nonspacing marks (Mn). Spacing marks (Mc) stay: "हिंदी" keeps its vowel sign U+093F.
    4. Lower-case (`do_lower_case`), character by character (no final-sigma rule: "ΟΔΟΣ" -> "οδοσ").
    5. Split at whitespace (dropped) and around every punctuation character (kept, one word each):
       categories P* and the ASCII symbols $ + < = > ^ ` | ~.
    6. WordPiece, per word: a word longer than `max_input_chars_per_word` (100) characters is [UNK];
       otherwise take the longest vocabulary entry that starts the word, then the longest "##" entry
       that continues it, and so on; if some position has no entry, the whole word is one [UNK].
    7. Truncation to `max_length` (counting [CLS] and [SEP]) drops word pieces from the end, with a
       warning that says how many; then `add_special=True` puts [CLS] before and [SEP] after. A pair
       (`encode_pair`) is [CLS] a [SEP] b [SEP], truncated longest-first as `tokenizers` does.

Unicode tables. `tokenizers` takes the categories of steps 1, 3 and 5 from the `unicode_categories`
crate, whose tables are Unicode 8.0's, and NFD from a crate at Unicode 12; Python 3.11's `unicodedata`
is Unicode 14.0. The codepoints whose answer differs between the two (105 punctuation, 13 format
controls, 385 nonspacing marks, 1 NFD decomposition; found by running `tokenizers` over every codepoint)
are listed in `_PUNCT_CHANGED`, `_CONTROL_CHANGED`, `_MN_CHANGED` and `_NFD_CHANGED`, so the result
equals `tokenizers` on any text. Lower-casing in `tokenizers` is Rust's, of a newer Unicode: it also
lower-cases 55 codepoints unassigned in Unicode 14.0; such a character is in no BERT vocabulary, so
its word is [UNK] either way and the ids are the same. On a Python with a newer `unicodedata`, newly
assigned codepoints may be classified differently from `tokenizers`. Surrogates (which `tokenizers`
cannot receive) are deleted as control characters.

`compat="llama.cpp"` reproduces llama.cpp's own WPM tokenizer instead (`llm_tokenizer_wpm_session`
in llama-vocab.cpp), which differs from Hugging Face on real text:
    - its NFD keeps only the first codepoint of a character's decomposition, so a Hangul syllable
      becomes its leading consonant: "한국어" gives the ids of "ᄒᄀᄋ" (HF: the full jamo sequence);
    - it deletes every mark (categories Mn, Mc, Me) where HF deletes Mn only: "हिंदी" loses U+093F
      (HF keeps it); this and the above apply only when accents are stripped;
    - vertical tab, form feed and U+0085 separate words (HF deletes them): "a\\x0bb" is "a", "b";
    - there is no 100-character limit: "a" * 101 is 51 pieces (HF: [UNK]);
    - lower-casing uses the simple (one-codepoint) mapping; categories come from llama.cpp's own
      tables, of a newer Unicode than `tokenizers`' (U+2E4F is punctuation, a word boundary, there
      and not in HF; U+0890 is a format control, deleted, there and not in HF). Here they are taken
      from Python's `unicodedata` (14.0 on Python 3.11), so characters first assigned in Unicode
      15.0 or later (U+0CF3, U+0ECE, ...) are still classified differently from llama.cpp.
    Words are matched in the GGUF's own "phantom space" form ("▁" + word, continuation pieces
    without "##"), which gives the same ids as the "##" form.

GGUF vocabularies (`from_gguf_metadata`) are stored by llama.cpp's converter in that phantom-space
form: a token that had the "##" prefix is stored without it, every other non-CONTROL token with a
leading U+2581, CONTROL tokens ([CLS], [SEP], ...) as they are. `tokens` holds the original texts
back ("##ing", "hello", "[CLS]"); a USER_DEFINED token (an added token that is not special) is
cut out of the text like the special ones, and UNUSED entries (padding up to the model's
vocab_size) are never produced and decode to nothing. Special ids come from
`tokenizer.ggml.bos_token_id` ([CLS]; there is no cls key), `seperator_token_id` (sic, [SEP]),
`unknown_token_id`, `padding_token_id`, `mask_token_id`, with llama.cpp's defaults 101, 102,
100, 0, 103; lower-casing from
`tokenizer.ggml.normalizer.lowercase` (default true) and `normalizer.strip_accents` (default: the
same); `max_length` from `{arch}.context_length`. [CLS] ... [SEP] are always added with
`add_special`, as llama.cpp does for WPM whatever `add_bos_token` / `add_eos_token` say.

Decoding is Hugging Face's (`tokenizers`' WordPiece decoder): tokens joined by spaces, a "##" piece
glued to the one before, and " ." " ?" " !" " ," glued back per token; `special=False` drops the
special tokens. `token_to_piece` is llama.cpp's piece: b" word", b"ing" for "##ing", b"[CLS]".
"""
from __future__ import annotations

import re
import unicodedata
import warnings
from functools import lru_cache
from os import PathLike
from pathlib import Path
from typing import Iterable, Sequence

from ..errors import LoadError, TokenizerError, read_json
from .base import token_index

__all__ = ["WordPieceTokenizer", "from_hf_dir"]

_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED = 1, 2, 3, 4, 5     # gguf TokenType / llama.h
_PHANTOM = "\u2581"


def _codepoints(spec: str) -> frozenset:
    """'61D 1B7D-1B7E ...' (hex codepoints and inclusive ranges) -> a set of ints."""
    out = set()
    for part in spec.split():
        a, _, b = part.partition("-")
        out.update(range(int(a, 16), int(b or a, 16) + 1))
    return frozenset(out)


# Codepoints whose category test gives a different answer in Unicode 8.0 (what `tokenizers` uses)
# than in Unicode 14.0 (Python 3.11): each set toggles the unicodedata answer.
_PUNCT_CHANGED = _codepoints(   # P* now, not then (new characters); U+166D was Po, is So now
    "61D 9FD A76 C77 C84 166D 1B7D-1B7E 2E43-2E4F 2E52-2E5D 10EAD 10F55-10F59 10F86-10F89 1144B-1144F "
    "1145A-1145B 1145D 11660-1166C 116B9 1183B 11944-11946 119E2 11A3F-11A46 11A9A-11A9C 11A9E-11AA2 "
    "11C41-11C45 11C70-11C71 11EF7-11EF8 11FFF 12FF1-12FF2 16E97-16E9A 16FE2 1E95E-1E95F")
_CONTROL_CHANGED = _codepoints("890-891 8E2 110CD 13430-13438")     # Cf now, unassigned then
_MN_CHANGED = _codepoints(      # Mn now, not then (new characters); U+1734 was Mn, is Mc now
    "7FD 898-89F 8CA-8E1 9FE AFA-AFF B55 C04 C3C D00 D3B-D3C D81 EBA 1734 180F 1885-1886 1ABF-1ACE "
    "1DF6-1DFB A82C A8C5 A8FF A9BD 10D24-10D27 10EAB-10EAC 10F46-10F50 10F82-10F85 11070 11073-11074 "
    "110C2 111C9 111CF 1123E 1133B 11438-1143F 11442-11444 11446 1145E 1182F-11837 11839-1183A "
    "1193B-1193C 1193E 11943 119D4-119D7 119DA-119DB 119E0 11A01-11A0A 11A33-11A38 11A3B-11A3E 11A47 "
    "11A51-11A56 11A59-11A5B 11A8A-11A96 11A98-11A99 11C30-11C36 11C38-11C3D 11C3F 11C92-11CA7 "
    "11CAA-11CB0 11CB2-11CB3 11CB5-11CB6 11D31-11D36 11D3A 11D3C-11D3D 11D3F-11D45 11D47 11D90-11D91 "
    "11D95 11D97 11EF3-11EF4 16F4F 16FE4 1CF00-1CF2D 1CF30-1CF46 1E000-1E006 1E008-1E018 1E01B-1E021 "
    "1E023-1E024 1E026-1E02A 1E130-1E136 1E2AE 1E2EC-1E2EF 1E944-1E94A")
_NFD_CHANGED = "\U00011938"     # decomposes since Unicode 13 (a starter, so NFD can be split at it)

# White_Space (PropList.txt); HF tests it after deleting controls, llama.cpp before.
_WHITESPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
                        "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
_ASCII_PUNCT = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def _is_cjk(o: int) -> bool:
    """The CJK ideograph blocks of BERT's `_is_chinese_char`, as `tokenizers` and llama.cpp write them."""
    return (0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0x20000 <= o <= 0x2A6DF
            or 0x2A700 <= o <= 0x2B73F or 0x2B740 <= o <= 0x2B81F or 0x2B920 <= o <= 0x2CEAF
            or 0xF900 <= o <= 0xFAFF or 0x2F800 <= o <= 0x2FA1F)


# ---- character classes, Hugging Face ----------------------------------------------------------

@lru_cache(maxsize=None)
def _hf_deleted(c: str) -> bool:
    if c in "\t\n\r":
        return False
    o, cat = ord(c), unicodedata.category(c)
    return o == 0 or o == 0xFFFD or cat == "Cs" or ((cat in ("Cc", "Cf", "Co")) != (o in _CONTROL_CHANGED))


@lru_cache(maxsize=None)
def _hf_mn(c: str) -> bool:
    return (unicodedata.category(c) == "Mn") != (ord(c) in _MN_CHANGED)


@lru_cache(maxsize=None)
def _hf_punct(c: str) -> bool:
    return c in _ASCII_PUNCT or (unicodedata.category(c)[0] == "P") != (ord(c) in _PUNCT_CHANGED)


def _hf_nfd(s: str) -> str:
    if _NFD_CHANGED in s:
        return _NFD_CHANGED.join(unicodedata.normalize("NFD", p) for p in s.split(_NFD_CHANGED))
    return unicodedata.normalize("NFD", s)


# ASCII text (`_words_ascii`): the classes above evaluated once on the 128 ASCII characters
_ASCII_CHARS = [chr(i) for i in range(128)]
_ASCII_PLAIN = all(not _hf_mn(c) and _hf_nfd(c) == c and not _is_cjk(ord(c)) and c.lower().isascii()
                   and len(c.lower()) == 1 for c in _ASCII_CHARS)
_ASCII_CLEAN = {ord(c): (None if _hf_deleted(c) else " ") for c in _ASCII_CHARS
                if _hf_deleted(c) or c in _WHITESPACE}
_ASCII_WORDS = re.compile("[{p}]|[^{p}{w}]+".format(p=re.escape("".join(c for c in _ASCII_CHARS if _hf_punct(c))),
                                                   w=re.escape("".join(c for c in _ASCII_CHARS if c in _WHITESPACE))))


# ---- character classes, llama.cpp (unicode.cpp's flags, from UnicodeData categories) -----------

@lru_cache(maxsize=None)
def _cpp_deleted(c: str) -> bool:        # after the whitespace test
    o = ord(c)
    return o == 0 or o == 0xFFFD or unicodedata.category(c) in ("Cc", "Cf", "Co", "Cs")


@lru_cache(maxsize=None)
def _cpp_nfd(c: str) -> str:             # first codepoint of the full decomposition
    return unicodedata.normalize("NFD", c)[0]


@lru_cache(maxsize=None)
def _cpp_lower(c: str) -> str:           # UnicodeData's simple lowercase mapping
    return "i" if c == "\u0130" else c.lower()


@lru_cache(maxsize=None)
def _cpp_punct(c: str) -> bool:
    cat = unicodedata.category(c)
    return cat[0] == "P" or (ord(c) < 0x7F and cat[0] == "S") or _is_cjk(ord(c))


class WordPieceTokenizer:
    """A WordPiece vocabulary with Hugging Face BertTokenizerFast's encode / decode (or llama.cpp's).

    Build it with `from_hf_dir`, `from_vocab` or `from_gguf_metadata`. Attributes: `model` ("bert"),
    `tokens` (vocabulary texts, continuation pieces with their "##"), `token_type` (gguf TokenType:
    CONTROL for special tokens, USER_DEFINED for other added tokens, UNUSED for a GGUF's padding
    entries, else NORMAL), `n_vocab`, `cls_id`, `sep_id`, `pad_id`, `unk_id`, `mask_id`,
    `bos_id` (= cls_id), `eos_id` (= sep_id), `special_ids` (dropped by decode(special=False)),
    `added_ids` (cut out of the text before normalization), `max_length` (int or None),
    `do_lower_case`, `strip_accents` (None: follow do_lower_case), `tokenize_chinese_chars`,
    `clean_text`, `max_input_chars_per_word`, `compat` (None or "llama.cpp").
    """

    model = "bert"

    def __init__(self, tokens: Sequence[str], *, cls_id: int | None = None, sep_id: int | None = None,
                 unk_id: int | None = None, pad_id: int | None = None, mask_id: int | None = None,
                 special_ids: Iterable[int] | None = None, token_type: Sequence[int] | None = None,
                 do_lower_case: bool = True,
                 strip_accents: bool | None = None, tokenize_chinese_chars: bool = True,
                 clean_text: bool = True, max_length: int | None = None,
                 max_input_chars_per_word: int = 100, continuing_prefix: str = "##",
                 compat: str | None = None, source: str = "vocabulary"):
        """tokens: the vocabulary texts by id ("##" continuation form). Unset special ids are found by
        their usual texts "[CLS]" "[SEP]" "[UNK]" "[PAD]" "[MASK]". token_type (gguf TokenType per id)
        says which tokens are special (CONTROL, UNKNOWN), other added tokens (USER_DEFINED) and never
        matched (UNUSED); without it, special_ids (default: those five) are CONTROL, the rest NORMAL.
        Special and added tokens are cut out of the text, special ones dropped by decode(special=False).
        `source` names the file in error messages."""
        if compat not in (None, "llama.cpp"):
            raise ValueError(f"compat must be None or 'llama.cpp', not {compat!r}")
        self.tokens: list[str] = list(tokens)
        self.n_vocab = len(self.tokens)
        if token_type is not None:
            token_type = [int(t) for t in token_type]
            if len(token_type) != self.n_vocab:
                raise ValueError(f"{source}: {len(token_type)} token types for {self.n_vocab} tokens")
        self.vocab: dict[str, int] = {t: i for i, t in enumerate(self.tokens)     # later duplicates win
                                      if token_type is None or token_type[i] != _UNUSED}
        self.source = source

        def find(given, text, required=False):
            if given is not None:
                if not 0 <= given < self.n_vocab:
                    raise ValueError(f"{source}: {text} id {given} is outside the vocabulary (n_vocab "
                                     f"{self.n_vocab})")
                return int(given)
            if text in self.vocab:
                return self.vocab[text]
            if required:
                raise ValueError(f"{source}: no {text} token in the vocabulary")
            return None

        self.unk_id = find(unk_id, "[UNK]", required=True)
        self.cls_id = find(cls_id, "[CLS]")
        self.sep_id = find(sep_id, "[SEP]")
        self.pad_id = find(pad_id, "[PAD]")
        self.mask_id = find(mask_id, "[MASK]")
        self.bos_id, self.eos_id = self.cls_id, self.sep_id
        if token_type is None:
            if special_ids is None:
                special_ids = [i for i in (self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id)
                               if i is not None]
            special = {int(i) for i in special_ids}
            token_type = [_CONTROL if i in special else _NORMAL for i in range(self.n_vocab)]
        self.token_type: list[int] = token_type
        self.special_ids = frozenset(i for i, t in enumerate(token_type) if t in (_CONTROL, _UNKNOWN))
        self.added_ids = frozenset(i for i, t in enumerate(token_type) if t in (_CONTROL, _UNKNOWN, _USER_DEFINED))
        self.do_lower_case = bool(do_lower_case)
        self.strip_accents = strip_accents
        self.tokenize_chinese_chars = bool(tokenize_chinese_chars)
        self.clean_text = bool(clean_text)
        self.max_length = int(max_length) if max_length else None
        self.max_input_chars_per_word = int(max_input_chars_per_word)
        self.prefix = continuing_prefix
        self.compat = compat
        self.eog_ids = frozenset(i for i in (self.sep_id,) if i is not None)
        self.max_token_chars = max((len(t) for t in self.tokens), default=1)

        # added-token texts: HF cuts out the leftmost match (the longest there; one regex with the
        # longest texts first), llama.cpp every occurrence of the longest text first, then the next
        self._phantom = None
        added = {self.tokens[i]: i for i in sorted(self.added_ids)}
        if compat == "llama.cpp":       # llama.cpp matches in the GGUF's form: "▁word", "piece"
            self._phantom = {self._to_phantom(i): i for i in range(self.n_vocab)}
            self.max_token_chars = max(len(t) for t in self._phantom)
            added = {self._to_phantom(i): i for i in sorted(self.added_ids)}
        self._added = {t: i for t, i in added.items() if t}
        texts = sorted(self._added, key=len, reverse=True)
        self._special_re = re.compile("|".join(map(re.escape, texts))) if texts else None
        self._word_cache: dict[str, tuple] = {}

    def _to_phantom(self, i: int) -> str:
        t = self.tokens[i]
        if self.token_type[i] in (_CONTROL, _UNKNOWN, _UNUSED):
            return t
        return t[len(self.prefix):] if t.startswith(self.prefix) else _PHANTOM + t

    def __repr__(self):
        return (f"WordPieceTokenizer(n_vocab={self.n_vocab}, cls_id={self.cls_id}, sep_id={self.sep_id}, "
                f"unk_id={self.unk_id}, do_lower_case={self.do_lower_case}, strip_accents="
                f"{self.strip_accents}, max_length={self.max_length}, compat={self.compat!r})")

    # ---- constructors -------------------------------------------------------------------------

    @classmethod
    def from_vocab(cls, path, do_lower_case: bool = True, strip_accents: bool | None = None,
                   tokenize_chinese_chars: bool = True, max_length: int | None = None,
                   compat: str | None = None, **kw) -> "WordPieceTokenizer":
        """A BERT `vocab.txt` (one token per line, the line number is the id)."""
        with open(path, encoding="utf-8") as f:
            tokens = [line.rstrip("\n") for line in f]
        return cls(tokens, do_lower_case=do_lower_case, strip_accents=strip_accents,
                   tokenize_chinese_chars=tokenize_chinese_chars, max_length=max_length, compat=compat,
                   source=str(path), **kw)

    @classmethod
    def from_hf_dir(cls, path, compat: str | None = None) -> "WordPieceTokenizer":
        """A Hugging Face / sentence-transformers model directory: `tokenizer.json` if present, else
        `vocab.txt` with the options of `tokenizer_config.json`. max_length: sentence_bert_config.json's
        `max_seq_length`, else tokenizer_config.json's `model_max_length` unless it is a placeholder.
        A malformed file raises TokenizerError naming it."""
        return _guarded(Path(path), cls._from_hf_dir, path, compat)

    @classmethod
    def _from_hf_dir(cls, path, compat: str | None = None) -> "WordPieceTokenizer":
        d = Path(path)
        cfg = _read_json(d / "tokenizer_config.json") or {}
        max_length = (_read_json(d / "sentence_bert_config.json") or {}).get("max_seq_length")
        if max_length is None:
            m = cfg.get("model_max_length")
            max_length = m if isinstance(m, int) and 0 < m <= 1 << 20 else None   # HF's unset is 1e30
        if (d / "tokenizer.json").is_file():
            return cls.from_tokenizer_json(d / "tokenizer.json", max_length=max_length, compat=compat)
        if not (d / "vocab.txt").is_file():
            raise TokenizerError(f"{d}: neither tokenizer.json nor vocab.txt", d)
        specials = {}
        for key in ("cls", "sep", "unk", "pad", "mask"):
            t = cfg.get(f"{key}_token")
            specials[key] = t.get("content") if isinstance(t, dict) else t
        tok = cls.from_vocab(d / "vocab.txt", do_lower_case=cfg.get("do_lower_case", True),
                             strip_accents=cfg.get("strip_accents"),
                             tokenize_chinese_chars=cfg.get("tokenize_chinese_chars", True),
                             max_length=max_length, compat=compat)
        if any(v and v not in ("[CLS]", "[SEP]", "[UNK]", "[PAD]", "[MASK]") for v in specials.values()):
            ids = {k: tok.vocab.get(v) for k, v in specials.items() if v}
            missing = [v for k, v in specials.items() if v and ids[k] is None]
            if missing:
                raise ValueError(f"{d / 'tokenizer_config.json'}: special tokens {missing} are not in vocab.txt")
            tok = cls(tok.tokens, **{f"{k}_id": i for k, i in ids.items()}, do_lower_case=tok.do_lower_case,
                      strip_accents=tok.strip_accents, tokenize_chinese_chars=tok.tokenize_chinese_chars,
                      max_length=max_length, compat=compat, source=str(d / "vocab.txt"))
        return tok

    @classmethod
    def from_tokenizer_json(cls, path, max_length: int | None = None,
                            compat: str | None = None) -> "WordPieceTokenizer":
        """A `tokenizers` file with a BertNormalizer, BertPreTokenizer and WordPiece model."""
        return _guarded(Path(path), cls._from_tokenizer_json, path, max_length, compat)

    @classmethod
    def _from_tokenizer_json(cls, path, max_length: int | None = None,
                             compat: str | None = None) -> "WordPieceTokenizer":
        src = str(path)
        tj = _read_json(Path(path))
        if tj is None:
            raise TokenizerError(f"{src}: missing", src)
        model = tj.get("model") or {}
        if not isinstance(model, dict) or model.get("type") != "WordPiece":
            raise TokenizerError(f"{src}: model type {model.get('type') if isinstance(model, dict) else model!r} "
                                 f"is not WordPiece", src)
        vocab = model.get("vocab")
        if not isinstance(vocab, dict) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                  for i in vocab.values()):
            raise TokenizerError(f"{src}: model.vocab must map tokens to integer ids", src)
        if vocab and (min(vocab.values()) < 0 or max(vocab.values()) >= len(vocab)):
            # checked before the id list is sized from the largest id
            raise TokenizerError(f"{src}: vocabulary ids span [{min(vocab.values())}, {max(vocab.values())}] for "
                                 f"{len(vocab)} tokens; expected 0..{len(vocab) - 1}", src)
        tokens = [None] * (max(vocab.values()) + 1 if vocab else 0)
        for t, i in vocab.items():
            tokens[i] = t
        if any(t is None for t in tokens):
            raise ValueError(f"{src}: vocabulary ids are not 0..{len(tokens) - 1} (id "
                             f"{tokens.index(None)} is missing)")
        norm = tj.get("normalizer") or {}
        if norm and norm.get("type") != "BertNormalizer":
            raise ValueError(f"{src}: normalizer {norm.get('type')!r} is not supported (only BertNormalizer)")
        pre = (tj.get("pre_tokenizer") or {}).get("type")
        if pre not in (None, "BertPreTokenizer"):
            raise ValueError(f"{src}: pre_tokenizer {pre!r} is not supported (only BertPreTokenizer)")
        types = [_NORMAL] * len(tokens)
        for a in tj.get("added_tokens") or []:
            if a.get("normalized") and not a.get("special"):
                raise ValueError(f"{src}: added token {a['content']!r} is matched after normalization "
                                 f"(normalized: true), which is not supported")
            if a["id"] >= len(tokens) or tokens[a["id"]] != a["content"]:
                raise ValueError(f"{src}: added token {a['content']!r} (id {a['id']}) is not that vocabulary entry")
            types[a["id"]] = _CONTROL if a.get("special") else _USER_DEFINED
        ids = {}
        post = tj.get("post_processor") or {}
        if post.get("type") == "TemplateProcessing":
            single = [next(iter(p.values()))["id"] for p in post.get("single", []) if "SpecialToken" in p]
            st = post.get("special_tokens", {})
            if len(single) == 2 and all(s in st for s in single):
                ids["cls_id"], ids["sep_id"] = st[single[0]]["ids"][0], st[single[1]]["ids"][0]
        elif post.get("type") == "BertProcessing":
            ids["cls_id"], ids["sep_id"] = post["cls"][1], post["sep"][1]
        unk = model.get("unk_token", "[UNK]")
        if unk not in vocab:
            raise ValueError(f"{src}: unk_token {unk!r} is not in the vocabulary")
        ids["unk_id"] = vocab[unk]
        pad = tj.get("padding") or {}
        if "pad_id" in pad and pad.get("pad_token") in vocab:
            ids["pad_id"] = pad["pad_id"]
        lower = norm.get("lowercase", True) if norm else False
        return cls(tokens, **ids, token_type=types, do_lower_case=lower,
                   strip_accents=norm.get("strip_accents") if norm else False,
                   tokenize_chinese_chars=norm.get("handle_chinese_chars", True) if norm else False,
                   clean_text=norm.get("clean_text", True) if norm else False, max_length=max_length,
                   max_input_chars_per_word=model.get("max_input_chars_per_word", 100),
                   continuing_prefix=model.get("continuing_subword_prefix", "##"), compat=compat, source=src)

    @classmethod
    def from_gguf_metadata(cls, kv: dict, compat: str | None = None) -> "WordPieceTokenizer":
        """A GGUF's `tokenizer.ggml.*` metadata as llama.cpp's converter writes it for BERT (see the
        module docstring); `kv` is `refimpl.gguf.load(path).metadata`."""
        if "tokenizer.ggml.tokens" not in kv:
            raise ValueError("GGUF has no tokenizer.ggml.tokens")
        stored = list(kv["tokenizer.ggml.tokens"])
        n = len(stored)

        def sid(key, default):
            v = kv.get(f"tokenizer.ggml.{key}_token_id")
            v = default if v is None else int(v)
            if v is not None and not 0 <= v < n:
                raise ValueError(f"GGUF tokenizer.ggml.{key}_token_id = {v} is outside the vocabulary ({n})")
            return v

        ids = dict(cls_id=sid("cls", None), unk_id=sid("unknown", 100), sep_id=sid("seperator", 102),
                   pad_id=sid("padding", 0), mask_id=sid("mask", 103))
        if ids["cls_id"] is None:
            ids["cls_id"] = sid("bos", 101)
        types = kv.get("tokenizer.ggml.token_type")
        if types is None:
            types = [_CONTROL if i in ids.values() else _NORMAL for i in range(n)]
        types = [int(t) for t in types]
        if len(types) != n:
            raise ValueError(f"GGUF tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
        tokens = [t if ty in (_CONTROL, _UNKNOWN, _UNUSED) else (t[1:] if t.startswith(_PHANTOM) else "##" + t)
                  for t, ty in zip(stored, types)]
        lower = bool(kv.get("tokenizer.ggml.normalizer.lowercase", True))
        strip = bool(kv.get("tokenizer.ggml.normalizer.strip_accents", lower))
        arch = kv.get("general.architecture", "bert")
        ctx = kv.get(f"{arch}.context_length")
        return cls(tokens, **ids, token_type=types,
                   do_lower_case=lower, strip_accents=strip, tokenize_chinese_chars=True,
                   max_length=int(ctx) if ctx else None, compat=compat, source="GGUF")

    # ---- encoding -----------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True,
               truncate: bool = True) -> list[int]:
        """Token ids of `text`: [CLS] pieces [SEP] with add_special (see the module docstring).

        parse_special: special-token texts in `text` ("[SEP]") become their ids; False for untrusted text.
        truncate: cut to `max_length` (if set), warning how many tokens were dropped.
        """
        return self._encode(text, add_special, parse_special, truncate)

    def _encode(self, text, add_special, parse_special, truncate, stacklevel=3):
        ids = self._pieces(text, parse_special)
        if truncate and self.max_length:
            keep = self.max_length - (2 if add_special else 0)
            if len(ids) > keep:
                warnings.warn(f"text of {len(ids)} tokens truncated to {max(keep, 0)} (max_length "
                              f"{self.max_length}): {len(ids) - keep} tokens dropped", stacklevel=stacklevel)
                ids = ids[:max(keep, 0)]
        return self._wrap(ids) if add_special else ids

    def encode_pair(self, text: str, pair: str, add_special: bool = True, parse_special: bool = True,
                    truncate: bool = True) -> tuple[list[int], list[int]]:
        """(ids, token_type_ids) of [CLS] text [SEP] pair [SEP] (types 0 up to the first [SEP], then 1).
        Truncation is longest-first, as `tokenizers`: the longer side keeps max(shorter, room -
        shorter) pieces, and if both must shrink they get room // 2 and the rest."""
        a, b = self._pieces(text, parse_special), self._pieces(pair, parse_special)
        if truncate and self.max_length and len(a) + len(b) > self.max_length - (3 if add_special else 0):
            room = max(self.max_length - (3 if add_special else 0), 0)
            n1, n2 = sorted((len(a), len(b)))
            n2 = n1 if n1 > room else max(n1, room - n1)
            if n1 + n2 > room:
                n1, n2 = room // 2, room // 2 + room % 2
            na, nb = (n2, n1) if len(a) > len(b) else (n1, n2)
            warnings.warn(f"pair of {len(a)} + {len(b)} tokens truncated to {na} + {nb} (max_length "
                          f"{self.max_length}): {len(a) - na + len(b) - nb} tokens dropped", stacklevel=2)
            a, b = a[:na], b[:nb]
        if not add_special:
            return a + b, [0] * len(a) + [1] * len(b)
        ids = self._wrap(a) + b + [self._need(self.sep_id, "[SEP]")]
        return ids, [0] * (len(a) + 2) + [1] * (len(b) + 1)

    def encode_batch(self, texts: Iterable[str], add_special: bool = True,
                     parse_special: bool = True) -> list[list[int]]:
        """`encode` of each text (no padding)."""
        out = []
        for t in texts:              # a loop, not a comprehension: the warning names the caller's line
            out.append(self._encode(t, add_special, parse_special, True))
        return out

    def tokenize(self, text: str, parse_special: bool = True) -> list[str]:
        """The vocabulary texts of the pieces of `text`, without [CLS] / [SEP] ("##" pieces as such)."""
        return [self.tokens[i] for i in self._pieces(text, parse_special)]

    def _need(self, i, text):
        if i is None:
            raise ValueError(f"{self.source}: no {text} token, so add_special cannot be used")
        return i

    def _wrap(self, ids: list[int]) -> list[int]:
        return [self._need(self.cls_id, "[CLS]")] + ids + [self._need(self.sep_id, "[SEP]")]

    def _pieces(self, text: str, parse_special: bool) -> list[int]:
        out: list[int] = []
        pos = 0
        if parse_special and self.compat == "llama.cpp":
            frags: list = [text]
            for s in sorted(self._added, key=len, reverse=True):
                new: list = []
                for f in frags:
                    if not isinstance(f, str) or s not in f:
                        new.append(f)
                        continue
                    for k, part in enumerate(f.split(s)):
                        new.extend(([self._added[s]] if k else []) + [part])
                frags = new
            for f in frags:
                out.extend(self._encode_text(f) if isinstance(f, str) else [f])
            return out
        if parse_special and self._special_re is not None:
            for m in self._special_re.finditer(text):
                out.extend(self._encode_text(text[pos:m.start()]))
                out.append(self._added[m.group()])
                pos = m.end()
        out.extend(self._encode_text(text[pos:]))
        return out

    def _encode_text(self, text: str) -> list[int]:
        out: list[int] = []
        for w in self.words(text):
            ids = self._word_cache.get(w)
            if ids is None:
                ids = self._word_cache[w] = tuple(self._wordpiece(w))
                if len(self._word_cache) > 100_000:
                    self._word_cache.clear()
            out.extend(ids)
        return out

    def words(self, text: str) -> list[str]:
        """Steps 1-5: the normalized words of `text` (no special-token handling)."""
        if self.compat == "llama.cpp":
            return self._words_llama_cpp(text)
        if text.isascii() and _ASCII_PLAIN:
            return self._words_ascii(text)
        return self._words_hf(text)

    def _words_ascii(self, text: str) -> list[str]:
        """`_words_hf` for ASCII text, with str methods and one regex: there the steps reduce to deleting the
        control characters and mapping whitespace to spaces (clean_text), lowercasing, and splitting at
        whitespace and around punctuation (no CJK, no accents; checked on every ASCII character at import)."""
        if self.clean_text:
            text = text.translate(_ASCII_CLEAN)
        if self.do_lower_case:
            text = text.lower()
        return _ASCII_WORDS.findall(text)

    def _words_hf(self, text: str) -> list[str]:
        """`words` for the Hugging Face tokenizer, one character at a time."""
        if self.clean_text:
            text = "".join(" " if c in _WHITESPACE else c for c in text if not _hf_deleted(c))
        if self.tokenize_chinese_chars:
            text = "".join(f" {c} " if _is_cjk(ord(c)) else c for c in text)
        strip = self.do_lower_case if self.strip_accents is None else self.strip_accents
        if strip:
            text = "".join(c for c in _hf_nfd(text) if not _hf_mn(c))
        if self.do_lower_case:
            text = "".join(c.lower() for c in text)      # per character: no final-sigma rule
        words, cur = [], []
        for c in text:
            if c in _WHITESPACE:
                if cur:
                    words.append("".join(cur))
                    cur = []
            elif _hf_punct(c):
                if cur:
                    words.append("".join(cur))
                    cur = []
                words.append(c)
            else:
                cur.append(c)
        if cur:
            words.append("".join(cur))
        return words

    def _words_llama_cpp(self, text: str) -> list[str]:
        strip = self.do_lower_case if self.strip_accents is None else self.strip_accents
        words, cur = [], []
        for c in text:
            if strip:
                c = _cpp_nfd(c)
            if c in _WHITESPACE:
                if cur:
                    words.append("".join(cur))
                    cur = []
                continue
            if _cpp_deleted(c) or (strip and unicodedata.category(c)[0] == "M"):
                continue
            s = _cpp_lower(c) if self.do_lower_case else c
            if _cpp_punct(c):
                if cur:
                    words.append("".join(cur))
                    cur = []
                words.append(s)
            else:
                cur.append(s)
        if cur:
            words.append("".join(cur))
        return words

    def _wordpiece(self, word: str) -> list[int]:
        """Greedy longest-match-first: the word's pieces, or [UNK] for the whole word."""
        if self._phantom is not None:
            return self._wordpiece_phantom(word)
        if len(word) > self.max_input_chars_per_word:
            return [self.unk_id]
        vocab, out, start, n = self.vocab, [], 0, len(word)
        while start < n:
            end = min(n, start + self.max_token_chars)
            while end > start:
                tid = vocab.get(word[start:end] if start == 0 else self.prefix + word[start:end])
                if tid is not None:
                    break
                end -= 1
            else:
                return [self.unk_id]
            out.append(tid)
            start = end
        return out

    def _wordpiece_phantom(self, word: str) -> list[int]:
        w = _PHANTOM + word
        vocab, out, start, n = self._phantom, [], 0, len(w)
        while start < n:
            for end in range(min(n, start + self.max_token_chars), start, -1):
                tid = vocab.get(w[start:end])
                if tid is not None:
                    out.append(tid)
                    start = end
                    break
            else:
                return [self.unk_id]
        return out

    # ---- decoding -----------------------------------------------------------------------------

    def token_to_piece(self, token_id: int, special: bool = True) -> bytes:
        """llama.cpp's piece: b" " + word for a word-start token, the text after "##" for a
        continuation, a special token's text (b"" when special=False)."""
        i = token_index(token_id, len(self.tokens))
        t, ty = self.tokens[i], self.token_type[i]
        if ty in (_CONTROL, _UNKNOWN):
            return t.encode() if special else b""
        if ty == _USER_DEFINED:
            return self._to_phantom(i).encode()           # llama.cpp: the stored text, as it is
        if ty != _NORMAL:
            return b""                                     # UNUSED
        return (t[len(self.prefix):] if t.startswith(self.prefix) else " " + t).encode()

    def decode(self, ids: Iterable[int], special: bool = True) -> str:
        """Hugging Face's decode (`tokenizers`' WordPiece decoder with cleanup): pieces joined by
        spaces, "##" pieces glued on, " ." " ?" " !" " ," contracted per token; special=False drops
        the special tokens."""
        idx = [token_index(i, len(self.tokens)) for i in ids]
        toks = [self.tokens[i] for i in idx
                if self.token_type[i] != _UNUSED and (special or i not in self.special_ids)]
        out = []
        for k, t in enumerate(toks):
            if k:
                t = t[len(self.prefix):] if t.startswith(self.prefix) else " " + t
            for a, b in _CLEANUP:
                t = t.replace(a, b)
            out.append(t)
        return "".join(out)

    def stream(self, special: bool = True):
        """A decoder for generated ids (`refimpl.tokenizer.StreamDecoder` over `token_to_piece`)."""
        from .base import StreamDecoder
        return StreamDecoder(self, special)

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids


_CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
            (" 'm", "'m"), (" do not", " don't"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def _read_json(p: Path):
    """A JSON object file (None if absent); TokenizerError naming it otherwise (errors.read_json)."""
    return read_json(p, TokenizerError, expect=dict)


def _guarded(where, fn, *args, **kwargs):
    """fn(*args, **kwargs), with what a malformed field raises deep inside (KeyError, TypeError, ...) turned
    into a TokenizerError naming `where`, chained."""
    try:
        return fn(*args, **kwargs)
    except LoadError:
        raise
    except (KeyError, TypeError, AttributeError, IndexError, ValueError, OverflowError) as e:
        raise TokenizerError(f"{where}: not a WordPiece tokenizer refimpl can read: {type(e).__name__}: {e}",
                             where) from e


def from_hf_dir(path: str | PathLike, compat: str | None = None) -> WordPieceTokenizer:
    """`WordPieceTokenizer.from_hf_dir`: the tokenizer of a Hugging Face / sentence-transformers directory."""
    return WordPieceTokenizer.from_hf_dir(path, compat=compat)
