"""WordPiece tokenizer (BERT family) that gives the ids of the model's Hugging Face tokenizer.

    tok = refimpl.tokenizers.wordpiece.from_hf_dir(refimpl.fetch.path("minilm"))    # or from a GGUF:
    tok = refimpl.tokenizer.from_gguf("all-MiniLM-L6-v2.gguf")           # the same ids
    ids = tok.encode("Héllo, world!")      # [101, 7592, 1010, 2088, 999, 102]  ([CLS] hello , world ! [SEP])
    tok.tokenize("unaffable")              # ['una', '##ffa', '##ble']
    tok.decode(ids, special=False)         # 'hello, world!'

`encode` is Hugging Face `tokenizers` itself (BertTokenizerFast's engine), run on the model's own
`tokenizer.json` where there is one, else on the same pipeline built from the vocabulary (`tokenizers`'
BertNormalizer, BertPreTokenizer and WordPiece, the options of tokenizer_config.json or the GGUF):
    0. Added tokens written in the text (the special "[SEP]", "[MASK]", ...; exact, case-sensitive
       text) are cut out first and become their ids. With `parse_special=False` they are ordinary
       text ("[SEP]" -> "[", "sep", "]").
    1-5. BertNormalizer (clean text, spaces around CJK ideographs, NFD and no nonspacing marks when
       accents are stripped, lower-casing) and BertPreTokenizer (split at whitespace and around
       punctuation), with `tokenizers`' own Unicode tables. Lone surrogates (which `tokenizers`, taking
       UTF-8, cannot receive) are deleted first.
    6. WordPiece, per word: a word longer than `max_input_chars_per_word` (100) characters is [UNK];
       otherwise the longest vocabulary entry that starts the word, then the longest "##" entry that
       continues it, and so on; if some position has no entry, the whole word is one [UNK].
    7. Truncation to `max_length` (counting [CLS] and [SEP]) drops word pieces from the end, with a
       warning that says how many; then `add_special=True` puts [CLS] before and [SEP] after. A pair
       (`encode_pair`) is [CLS] a [SEP] b [SEP], truncated longest-first as `tokenizers` does.

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

import json
import re
import unicodedata
import warnings
from functools import lru_cache
from os import PathLike
from pathlib import Path
from typing import Iterable, Sequence

from ..errors import LoadError, TokenizerError, read_json
from .base import clean_spaces, token_index

__all__ = ["WordPieceTokenizer", "from_hf_dir"]

_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED = 1, 2, 3, 4, 5     # gguf TokenType / llama.h
_PHANTOM = "\u2581"


# White_Space (PropList.txt), which llama.cpp tests before deleting controls
_WHITESPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
                        "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")


def _is_cjk(o: int) -> bool:
    """The CJK ideograph blocks of BERT's `_is_chinese_char`, as `tokenizers` and llama.cpp write them."""
    return (0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0x20000 <= o <= 0x2A6DF
            or 0x2A700 <= o <= 0x2B73F or 0x2B740 <= o <= 0x2B81F or 0x2B920 <= o <= 0x2CEAF
            or 0xF900 <= o <= 0xFAFF or 0x2F800 <= o <= 0x2FA1F)


_SURROGATES = re.compile("[\ud800-\udfff]")


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

        # llama.cpp mode matches in the GGUF's form ("▁word", "piece") and cuts out every occurrence of the
        # longest added-token text first, then the next; Hugging Face mode is `tokenizers`' (`_engines`)
        self._phantom = None
        self._added: dict[str, int] = {}
        if compat == "llama.cpp":
            self._phantom = {self._to_phantom(i): i for i in range(self.n_vocab)}
            self.max_token_chars = max(len(t) for t in self._phantom)
            self._added = {t: i for t, i in ((self._to_phantom(i), i) for i in sorted(self.added_ids)) if t}
        self._word_cache: dict[str, tuple] = {}
        self._hf = None                   # Hugging Face mode's `tokenizers` pipelines (`_engines`)
        self._tokenizer_json: dict | None = None     # the model's own tokenizer.json, where it came from one

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
        tok = cls(tokens, **ids, token_type=types, do_lower_case=lower,
                   strip_accents=norm.get("strip_accents") if norm else False,
                   tokenize_chinese_chars=norm.get("handle_chinese_chars", True) if norm else False,
                   clean_text=norm.get("clean_text", True) if norm else False, max_length=max_length,
                   max_input_chars_per_word=model.get("max_input_chars_per_word", 100),
                   continuing_prefix=model.get("continuing_subword_prefix", "##"), compat=compat, source=src)
        tok._tokenizer_json = tj                 # Hugging Face mode runs `tokenizers` on the file itself
        if compat is None:
            tok._engines()                       # built now: a file `tokenizers` rejects fails here, named
        return tok

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
        if self.compat is None:              # `tokenizers` itself: with the added tokens, or without
            return self._engines()[0 if parse_special else 1].encode(
                _SURROGATES.sub("", text), add_special_tokens=False).ids
        out: list[int] = []
        if parse_special:
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
        return self._encode_text(text)

    def _engines(self):
        """(with the added tokens, without them): the `tokenizers` pipelines of Hugging Face mode, made on
        first use -- from the model's own tokenizer.json, or built from the vocabulary and options."""
        if self._hf is None:
            try:
                from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers
            except ImportError as e:            # a core dependency; said plainly if it is missing anyway
                raise ImportError("WordPiece tokenizers need the `tokenizers` package: pip install tokenizers") from e
            try:
                if self._tokenizer_json is not None:
                    full = Tokenizer.from_str(json.dumps(self._tokenizer_json))
                    plain = Tokenizer.from_str(json.dumps(dict(self._tokenizer_json, added_tokens=[])))
                else:
                    def pipeline():
                        t = Tokenizer(models.WordPiece(dict(self.vocab), unk_token=self.tokens[self.unk_id],
                                                       max_input_chars_per_word=self.max_input_chars_per_word,
                                                       continuing_subword_prefix=self.prefix))
                        t.normalizer = normalizers.BertNormalizer(
                            clean_text=self.clean_text, handle_chinese_chars=self.tokenize_chinese_chars,
                            strip_accents=self.strip_accents, lowercase=self.do_lower_case)
                        t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
                        return t
                    full, plain = pipeline(), pipeline()
                    special = [i for i in sorted(self.added_ids) if self.token_type[i] in (_CONTROL, _UNKNOWN)]
                    user = [i for i in sorted(self.added_ids) if self.token_type[i] == _USER_DEFINED]
                    full.add_special_tokens([AddedToken(self.tokens[i], special=True, normalized=False)
                                             for i in special if self.tokens[i]])
                    full.add_tokens([AddedToken(self.tokens[i], normalized=False) for i in user if self.tokens[i]])
            except Exception as e:              # tokenizers raises plain Exception on what it cannot build
                raise TokenizerError(f"{self.source}: `tokenizers` cannot build this WordPiece tokenizer: {e}",
                                     self.source) from e
            for t in (full, plain):
                t.no_truncation()               # truncation and [CLS]/[SEP] are encode's own (warnings)
                t.no_padding()
            self._hf = (full, plain)
        return self._hf

    def _encode_text(self, text: str) -> list[int]:
        out: list[int] = []
        for w in self.words(text):
            ids = self._word_cache.get(w)
            if ids is None:
                ids = self._word_cache[w] = tuple(self._wordpiece_phantom(w))
                if len(self._word_cache) > 100_000:
                    self._word_cache.clear()
            out.extend(ids)
        return out

    def words(self, text: str) -> list[str]:
        """Steps 1-5: the normalized words of `text` (no special-token handling)."""
        if self.compat == "llama.cpp":
            return self._words_llama_cpp(text)
        engine = self._engines()[1]
        text = _SURROGATES.sub("", text)
        if engine.normalizer is not None:
            text = engine.normalizer.normalize_str(text)
        if engine.pre_tokenizer is None:
            return [text] if text else []
        return [w for w, _ in engine.pre_tokenizer.pre_tokenize_str(text)]

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

    def detokenize(self, ids: Iterable[int], special: bool = True) -> str:
        """llama.cpp's `llama_detokenize(ids, remove_special=False, unparse_special=special)`: the pieces
        (`token_to_piece`) joined as they are, a word's leading space included, then llama.cpp's
        clean_spaces; invalid UTF-8 becomes U+FFFD. `decode` is Hugging Face's."""
        data = b"".join(self.token_to_piece(i, special) for i in ids)
        return clean_spaces(data).decode("utf-8", errors="replace")

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
