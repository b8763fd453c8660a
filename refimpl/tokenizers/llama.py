"""Tokenizers from a GGUF file's vocabulary that give llama.cpp's token ids.

    tok = refimpl.tokenizer.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    ids = tok.encode("<|im_start|>user\\nHi<|im_end|>\\n")   # [1, 4093, 198, 26843, 2, 198]
    tok.decode(ids)                                           # the same text back
    dec = tok.stream()                                        # for generation:
    "".join(dec.push(i) for i in ids) + dec.flush()           # only whole UTF-8 characters

What is reproduced from llama.cpp's `llama-vocab.cpp` (`llama_tokenize`, `llama_token_to_piece`,
`llama_detokenize`), and how:

`tokenizer.ggml.model == "gpt2"`: byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM, StarCoder, ...).
    1. Special tokens are cut out of the text first (`tokenizer_st_partition`): every token of type
       CONTROL, USER_DEFINED or UNKNOWN, longest text first, splits every remaining text fragment at
       every occurrence. With `parse_special=False` only USER_DEFINED tokens are cut out (CONTROL and
       UNKNOWN texts are then tokenized as plain text), as in llama.cpp.
    2. Each text fragment is pre-tokenized by the regexes that `tokenizer.ggml.pre` names (applied
       one after the other, each splitting the pieces of the last; a piece is a match or the text
       between matches), every piece is mapped byte by byte to GPT-2's printable byte alphabet, and
       the merges are applied lowest rank first (leftmost first on ties). A final symbol that is not
       in the vocabulary becomes one token per byte.
    3. `encode(..., add_special=True)` puts BOS / EOS around the result when
       `tokenizer.ggml.add_bos_token` / `add_eos_token` say so (when absent: the pre-tokenizer's
       default, true only for the Llama 3 family).
    Step 2's regex split and BPE run in Hugging Face `tokenizers` (`models.BPE` built from the GGUF
    vocabulary and merges, a `Split` pre-tokenizer per llama.cpp regex, `ByteLevel` without its own
    regex): a well-kept, compiled implementation of exactly this algorithm. Step 1, BOS/EOS and
    every decode are done here, because llama.cpp's special-token rules differ from Hugging Face's
    added-token rules. llama.cpp matches its regexes with hand-written scanners (GPT-2, Llama 3,
    Qwen2) and `std::regex` over a category-collapsed text; both equal the regexes below (checked on
    520 strings for five pre-tokenizers) except, possibly, on codepoints whose Unicode category
    changed between the Unicode versions of the two libraries' tables.

    Pre-tokenizers supported (`tokenizer.ggml.pre`): "default" (and missing), the GPT-2 family
    ("gpt-2", "phi-2", "mpt", "olmo", "jais", ...), the StarCoder family ("smollm", "starcoder",
    "refact", "command-r", "codeshell", "exaone", "minerva-7b"), the Llama 3 family ("llama3",
    "llama-bpe", "falcon3", "dbrx", "smaug-bpe", ...), the Qwen2 family ("qwen2", "stablelm2",
    "deepseek-r1-qwen", "megrez", ...) and the rest of llama.cpp's plain-regex names, whose regexes are
    in pretok_regexes.py ("deepseek-llm", "deepseek-coder", "deepseek-v3", "falcon", "qwen35", "tekken",
    "gpt-4o", "llama4", "bloom", "chameleon", ...): `PRE_TOKENIZERS` lists them all, each checked against
    llama.cpp (tests/test_vocab_vectors.py), and the ones written differently there: the regexes that
    llama.cpp's hand-written splitters implement ("kimi-k2", "afmoe"), a zero-width split ("superbpe"),
    "chatglm-bpe", "glm4", "glm5" (no default BOS), "jina-v1-en", "jina-v2-code", "roberta-bpe" (GPT-2's
    regex; llama.cpp marks them add_sep, which only its embedding tools read), "whitespace" (BPE over raw
    UTF-8 split at whitespace) and the SPM-style BPE of "gemma4", "granite-embed-multi-311m" and
    "sarvam-moe" (below). docs/tokenizers.md lists every name with its regexes.

`tokenizer.ggml.model == "gemma4"`: Gemma 4's BPE over raw UTF-8, as llama.cpp runs it. Spaces become U+2581
    first; the text is split only into runs of line breaks and the text between them; a run of line breaks
    that is a token is taken whole, everything else is BPE (the GGUF's merges, lowest rank first) whose
    leftovers become byte tokens `<0xXX>`. Decoding turns U+2581 back into spaces.

`tokenizer.ggml.model == "llama"`: SentencePiece (Llama 1/2, Mistral, TinyLlama, ...).
    Runs llama.cpp's own SPM algorithm (merge the adjacent pair whose concatenation is the
    highest-scoring vocabulary entry, leftmost on ties; a character left that is no token becomes
    byte tokens `<0xXX>`) after the same special-token partition, with a leading space
    on the first fragment and after each special token when `tokenizer.ggml.add_space_prefix` (default
    true) and spaces escaped as U+2581. This is written out here (40 lines) rather than run through the
    `sentencepiece` package: llama.cpp's rules are not SentencePiece's (it merges into any vocabulary
    text, CONTROL and USER_DEFINED included; it adds the space prefix after every special token; byte
    fallback falls back once more to a one-character token), a ModelProto would have to be built by
    hand from the GGUF (protobuf), and SentencePiece itself, given the very same pieces, disagrees with
    llama.cpp on 2 of the 520 golden strings (a user-defined piece at the start) where this agrees on all.

Decoding (`token_to_piece`, `decode`, `stream`) needs no library. A NORMAL BPE token's text is mapped
back through GPT-2's byte alphabet; a SentencePiece token's U+2581 become spaces; BYTE tokens give their
byte; USER_DEFINED tokens their text; CONTROL and UNKNOWN tokens their text when `special=True`
(default) and nothing when False; UNUSED tokens nothing. `decode` is `llama_detokenize`
(with `remove_special=False`): the pieces joined, the first piece's leading space dropped for
SentencePiece vocabularies with a space prefix, and, for the pre-tokenizers where llama.cpp sets
`clean_spaces` ("default", GPT-2, Llama 3, StarCoder but not "smollm"/"command-r"), " ?" " !" " ." " ,"
" ' " and " 's" " 'm" " 're" " 've" contracted; then UTF-8 with invalid bytes replaced by U+FFFD.
`stream()` is llama.cpp's generation loop: the raw pieces, emitted one complete character at a time.

Defaults, and why: `encode(text, add_special=True, parse_special=True)`. Special tokens written in
the text are parsed as their ids by default because that is how chat prompts (the output of
`tokenizer.chat_template`) reach the model in llama.cpp's tools (`common_tokenize(..., parse_special
= true)`) and in Hugging Face tokenizers; pass `parse_special=False` for untrusted text, so a user
cannot inject `<|im_end|>`. `decode(ids, special=True)` renders control tokens so that
`decode(encode(s)) == s` also for texts with special tokens; pass `special=False` to drop them.

`eot_id` is `tokenizer.ggml.eot_token_id` or, as llama.cpp does, the first of `<|eot_id|>`,
`<|im_end|>`, `<|end|>`, `<end_of_turn>`, `<|endoftext|>`, ... present in the vocabulary (llama.cpp
scans an unordered map, so with several candidates its pick is unspecified; ours takes that list's
order: SmolLM2 gets `<|im_end|>` (2), where llama.cpp of llama-cpp-python 0.3.36 reports
`<|endoftext|>` (0); both are in the EOG set). `eog_ids` is llama.cpp's end-of-generation set
(EOS, EOT, EOM, FIM pad/repo/sep and every token with an end-of-turn text), used by `is_eog`; for
SmolLM2 it is {0, 2, 4}: `<reponame>` (4) counts as llama.cpp's FIM repo token.

Only `refimpl.tokenizer` knows about `tokenizers`, and only when a BPE text is first encoded:
`import refimpl` and loading a model never import it (`pip install 'refimpl[tokenizers]'`).
"""
from __future__ import annotations

import functools

import heapq
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from .base import EOG_TEXTS, EOT_TEXTS, StreamDecoder, clean_spaces, token_index  # noqa: F401
from .pretok_regexes import REGEXES
from .ugm import UGM



class TokenType:
    """`tokenizer.ggml.token_type` values (gguf's TokenType, llama.h's llama_token_type)."""
    UNDEFINED, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = range(7)


# ---------------------------------------------------------------------------------------------
# Pre-tokenizer regexes, as llama.cpp applies them per `tokenizer.ggml.pre` (llama-vocab.cpp,
# llm_tokenizer_bpe). Syntax: Oniguruma, as Hugging Face tokenizers' Regex takes it.

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")
_NEWLINES = "[^\n]+|[\n]+"


@dataclass(frozen=True)
class _Pre:
    regexes: tuple           # applied in order, each splitting the pieces of the previous one
    clean_spaces: bool = True
    ignore_merges: bool = False    # a piece that is a whole vocabulary entry is taken as is
    add_bos: bool = False          # default when tokenizer.ggml.add_bos_token is absent
    no_bos: bool = False           # no default BOS id (tokenizer.ggml.bos_token_id still names one)
    byte_encode: bool = True       # GPT-2's byte alphabet; False: BPE over raw UTF-8, byte tokens <0xXX>
    escape: bool = False           # spaces become U+2581 before the split (and back when decoding)
    newline_tokens: bool = False   # a run of line breaks that is a token is taken whole (gemma4)


def _family(names: str, pre: _Pre) -> dict:
    return {n: pre for n in names.split()}


PRE_TOKENIZERS: dict[str, _Pre] = {
    "default": _Pre(_DEFAULT),
    **_family("gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert "
              "exaone4 mpt olmo jais jina-v1-en jina-v2-code roberta-bpe", _Pre((_GPT2,))),
    **_family("starcoder refact codeshell exaone minerva-7b mellum2", _Pre((r"\p{N}", _GPT2))),
    **_family("smollm command-r", _Pre((r"\p{N}", _GPT2), clean_spaces=False)),
    **_family("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
              _Pre((_LLAMA3,), ignore_merges=True, add_bos=True)),
    **_family("dbrx smaug-bpe", _Pre((_LLAMA3,))),
    **_family("stablelm2 megrez", _Pre((_QWEN2,))),
    **_family("qwen2 deepseek-r1-qwen kormo f2llmv2 hunyuan solar-open", _Pre((_QWEN2,), clean_spaces=False)),
    **_family("trillion granite-docling", _Pre((_GPT2,), clean_spaces=False)),
    # SPM-style BPE over raw UTF-8: spaces escaped to U+2581, the text split only at line breaks
    **_family("gemma4 granite-embed-multi-311m", _Pre((_NEWLINES,), byte_encode=False, escape=True,
                                                      newline_tokens=True)),
    "sarvam-moe": _Pre((_NEWLINES,), clean_spaces=False, byte_encode=False, escape=True),
}
# the rest of llama.cpp's names (llama-vocab.cpp's load): (names, its pre-tokenizer type, clean_spaces,
# ignore_merges, add_bos), the regexes of that type from pretok_regexes.py
for _names, _type, _clean, _ignore, _bos in (
        ("deepseek-llm", "DEEPSEEK_LLM", False, False, False),
        ("deepseek-coder", "DEEPSEEK_CODER", False, False, False),
        ("deepseek-v3 hunyuan-dense hy_v4 joyai-llm", "DEEPSEEK3_LLM", False, False, False),
        ("spark2_5", "SPARK2_5", False, False, False),
        ("youtu", "YOUTU", False, True, False),
        ("falcon", "FALCON", True, False, False),
        ("qwen35", "QWEN35", False, False, False),
        ("jais-2", "JAIS2", True, False, False),
        ("poro-chat", "PORO", False, False, False),
        ("bloom gpt3-finnish", "PORO", True, False, False),
        ("viking", "VIKING", False, False, False),
        ("tekken", "TEKKEN", False, True, True),
        ("chameleon", "CHAMELEON", False, False, True),
        ("gpt-4o llama4 kanana2 talkie minimax-m2", "GPT4O", False, False, False),
        ("granite-embed-multi-97m", "GRANITE_EMB_MULTI", False, True, False),
        ("tiny_aya cohere2moe", "TINY_AYA", False, False, False),
        ("bailingmoe bailingmoe2 llada-moe", "BAILINGMOE", False, False, False),
        ("seed-coder", "SEED_CODER", False, False, False),
        ("ufakzeka", "UFAKZEKA", False, False, False),
        ("grok-2", "QWEN2", False, False, False),
        ("laguna", "LAGUNA", False, False, False),
        ("exaone-moe", "EXAONE_MOE", True, False, False),
        ("minicpm5", "MINICPM5", True, True, False),
        ("superbpe", "SUPERBPE", False, False, False),
        ("kimi-k2", "KIMI_K2", False, False, False),
        ("afmoe", "AFMOE", False, False, False)):
    _rx = (_QWEN2,) if _type == "QWEN2" else REGEXES[_type]
    PRE_TOKENIZERS.update(_family(_names, _Pre(_rx, clean_spaces=_clean, ignore_merges=_ignore, add_bos=_bos)))
PRE_TOKENIZERS.update(
    {"chatglm-bpe": _Pre(REGEXES["CHATGLM4"], no_bos=True),
     **_family("glm4 glm5", _Pre(REGEXES["CHATGLM4"], ignore_merges=True, no_bos=True)),
     "whitespace": _Pre(REGEXES["WHITESPACE"], byte_encode=False)})


# ---------------------------------------------------------------------------------------------
# GPT-2's byte alphabet: every byte is shown as one printable character. Bytes that are printable
# Latin-1 stand for themselves; the other 68 take the codepoints 256, 257, ... in byte order.

def _byte_alphabet() -> list[str]:
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, extra = [], 0
    for b in range(256):
        if b in printable:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


BYTE_TO_CHAR = _byte_alphabet()
CHAR_TO_BYTE = {c: b for b, c in enumerate(BYTE_TO_CHAR)}


def byte_level_vocab(n_vocab: int) -> dict:
    """Minimal `tokenizer.*` metadata that llama.cpp (and refimpl's tokenizer) accept: a GPT-2 byte-level BPE,
    for GGUFs written with random weights (tests, the kernels' precompile).

    llama.cpp will not load a GGUF without `tokenizer.ggml.model`; "gpt2" also needs `tokenizer.ggml.tokens`
    and a non-empty `tokenizer.ggml.merges` ("none" loads in llama.cpp but refimpl's loader builds no
    tokenizer from it). Tokens: "Ġ" (space), "Ċ" (newline), printable ASCII, the other byte symbols of
    GPT-2's byte alphabet, then "<|extra_i|>"; the last id is "ĠĠ", the one merge. All NORMAL.
    """
    order = [0x20, 0x0A, *range(0x21, 0x7F)]            # " " is "Ġ", "\n" is "Ċ", then printable ASCII
    order += [b for b in range(256) if b not in order]
    tokens = [BYTE_TO_CHAR[b] for b in order][: n_vocab - 1]
    tokens += [f"<|extra_{i}|>" for i in range(len(tokens), n_vocab - 1)] + ["ĠĠ"]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [1] * n_vocab, "tokenizer.ggml.merges": ["Ġ Ġ"]}

# llama.cpp's texts for end-of-turn tokens (`special_eot_id` is the first present unless the GGUF
# names it) and for the other end-of-generation tokens; these are forced to CONTROL.
_FIM_TEXTS = {   # FIM tokens that llama.cpp counts as end of generation
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_SPECIAL = (TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN)
_C_SPACE = " \t\n\v\f\r"          # C's isspace


def _strip_attributes(kv: dict, token_to_id: dict, special_ids: list[int]) -> tuple[frozenset, frozenset]:
    """The ids llama.cpp gives LSTRIP and RSTRIP by model, pre-tokenizer and architecture name: `<mask>`
    takes the whitespace before it for jina-v2-de/-es/-code, nomic-bert-moe and jina-bert-v3, `[MASK]` for
    modern-bert; for phi-3 every special token and `</s>` take the whitespace after them, but `<unk>`,
    `<s>` and `<|endoftext|>` do not."""
    pre = kv.get("tokenizer.ggml.pre") or ""
    arch = kv.get("general.architecture") or ""
    name = (kv.get("general.name") or "").lower()
    has = lambda s, subs: any(x in s for x in subs)          # noqa: E731
    lstrip, rstrip = set(), set()
    if has(pre, ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or has(arch, ("nomic-bert-moe", "jina-bert-v3")):
        if "<mask>" in token_to_id:
            lstrip.add(token_to_id["<mask>"])
    elif has(name, ("phi-3", "phi3")):
        rstrip.update(special_ids)
        rstrip.update(token_to_id[t] for t in ("</s>",) if t in token_to_id)
        rstrip.difference_update(token_to_id[t] for t in ("<unk>", "<s>", "<|endoftext|>") if t in token_to_id)
    elif has(name, ("modern-bert",)):
        if "[MASK]" in token_to_id:
            lstrip.add(token_to_id["[MASK]"])
    return frozenset(lstrip), frozenset(rstrip)


def _check_whitespace_runs(texts: list[str]) -> None:
    """llama.cpp's "whitespace" pre-tokenizer keeps the whitespace between words as pieces of raw UTF-8,
    and a piece of two or more characters holding a space stops it (GGML_ASSERT in find_bpe_rank: a BPE
    pair may not contain a space). refimpl refuses the same inputs rather than invent ids for them."""
    for t in texts:
        for m in re.finditer(r"[^\S]{2,}", t):
            if " " in m.group():
                raise ValueError(f"pre-tokenizer 'whitespace': the run of whitespace {m.group()!r} at character "
                                 f"{m.start()} holds a space, on which llama.cpp aborts (GGML_ASSERT in "
                                 f"find_bpe_rank); it has no ids for this text")


def _special_id(kv: dict, n: int, key: str, default=None):
    """tokenizer.ggml.<key>_token_id when it names a token of the n, else the default when that does."""
    v = kv.get(f"tokenizer.ggml.{key}_token_id", default)
    return v if v is not None and 0 <= v < n else (default if default is not None and default < n else None)


class Tokenizer:
    """A GGUF vocabulary with llama.cpp's encode / decode. Build it with `from_gguf`.

    Attributes: `model` ("gpt2" or "llama"), `pre` (the pre-tokenizer name), `tokens` (token texts),
    `token_type` (TokenType per id, after llama.cpp's CONTROL overrides), `scores`, `n_vocab`,
    `bos_id`, `eos_id`, `eot_id`, `eom_id`, `unk_id`, `pad_id` (an id or None), `add_bos`, `add_eos`,
    `add_space_prefix`, `eog_ids`, `chat_template` (str or None).
    """

    def __init__(self, metadata: dict):
        kv = metadata
        self.model = kv.get("tokenizer.ggml.model", "llama")
        self.tokens: list[str] = list(kv["tokenizer.ggml.tokens"])
        self.n_vocab = len(self.tokens)
        n = self.n_vocab
        tt = kv.get("tokenizer.ggml.token_type")
        self.token_type = list(tt) if tt is not None else [TokenType.NORMAL] * n
        sc = kv.get("tokenizer.ggml.scores")
        self.scores = [float(s) for s in sc] if sc is not None else [0.0] * n
        self.chat_template = kv.get("tokenizer.chat_template")
        self.token_to_id = {t: i for i, t in enumerate(self.tokens)}     # later duplicates win, as in llama.cpp

        defaults = self._set_model(kv)
        sid = functools.partial(_special_id, kv, n)
        self.bos_id = sid("bos", defaults["bos"])
        self.eos_id = sid("eos", defaults["eos"])
        self.unk_id = sid("unknown", defaults["unk"])
        self.pad_id = sid("padding", defaults.get("pad"))
        self.eot_id = sid("eot")
        self.eom_id = sid("eom")
        self.add_bos = bool(kv.get("tokenizer.ggml.add_bos_token", defaults["add_bos"]))
        self.add_eos = bool(kv.get("tokenizer.ggml.add_eos_token", defaults.get("add_eos", False)))
        self.add_space_prefix = bool(kv.get("tokenizer.ggml.add_space_prefix", defaults["space_prefix"]))

        self.eog_ids = self._end_of_generation(sid)

        # special tokens cut out of the text before tokenization, longest text first
        self._special_ids = sorted((i for i in range(n) if self.token_type[i] in _SPECIAL and self.tokens[i]),
                                   key=lambda i: -len(self.tokens[i].encode("utf-8", "surrogateescape")))
        self._lstrip, self._rstrip = _strip_attributes(kv, self.token_to_id, self._special_ids)
        self._pieces: list[bytes | None] = [None] * n     # token_to_piece(special=True), filled lazily
        self._bpe = None
        self._ugm = None
        if self.model == "t5":
            cm = kv.get("tokenizer.ggml.precompiled_charsmap")
            self._charsmap = bytes(x & 0xFF for x in cm) if cm is not None else None      # int8 or uint8
            self.remove_extra_whitespaces = bool(kv.get("tokenizer.ggml.remove_extra_whitespaces", False))
            self._ugm_model()             # built now, so that a malformed charsmap is an error of the file

    def _set_model(self, kv: dict) -> dict:
        """The tokenizer model's pre-tokenizer, merges and text cleanup; returns llama.cpp's defaults for its
        special ids and flags (what the GGUF does not say)."""
        if self.model == "gpt2":
            self.pre = kv.get("tokenizer.ggml.pre") or "default"
            if self.pre not in PRE_TOKENIZERS:
                raise ValueError(f"pre-tokenizer {self.pre!r} is not supported; supported: "
                                 f"{sorted(PRE_TOKENIZERS)}")
            self._pre = PRE_TOKENIZERS[self.pre]
            self.merges = list(kv.get("tokenizer.ggml.merges", []))
            defaults = dict(bos=None if self._pre.no_bos else 11, eos=11, unk=None, add_bos=self._pre.add_bos,
                            space_prefix=False)
            self._clean_spaces = self._pre.clean_spaces
        elif self.model == "gemma4":
            # BPE over raw UTF-8 (no GPT-2 byte alphabet): spaces escaped to U+2581 first, the text split only
            # at line breaks, byte tokens <0xXX> for what no merge reaches (llama.cpp's "gemma4" tokenizer,
            # whose pre-tokenizer is "gemma4" whatever the GGUF says)
            self.pre = "gemma4"
            self._pre = PRE_TOKENIZERS["gemma4"]
            self.merges = list(kv.get("tokenizer.ggml.merges", []))
            defaults = dict(bos=None, eos=None, unk=None, add_bos=False, space_prefix=False)
            self._clean_spaces = True
        elif self.model == "llama":
            self.pre = "default"
            self._pre = None
            self.merges = []
            defaults = dict(bos=1, eos=2, unk=0, add_bos=True, space_prefix=True)
            self._clean_spaces = False
        elif self.model == "t5":
            # UGM: SentencePiece's unigram model (refimpl.tokenizers.ugm); llama.cpp's defaults for "t5"
            self.pre = "default"
            self._pre = None
            self.merges = []
            defaults = dict(bos=None, eos=1, unk=2, pad=0, add_bos=False, add_eos=True, space_prefix=False)
            self._clean_spaces = False
        else:
            raise ValueError(f"tokenizer model {self.model!r} is not supported "
                             f"(only 'gpt2', 'gemma4', 'llama' and 't5')")
        return defaults

    def _end_of_generation(self, sid) -> frozenset:
        """llama.cpp's text-based detection: EOT, EOM and FIM tokens (forced to CONTROL, as are the EOG
        texts), and the EOG set: the end-of-generation ids. sid(key): a valid special id from the GGUF."""
        present = lambda texts: [self.token_to_id[t] for t in texts if t in self.token_to_id]   # noqa: E731
        if self.eot_id is None and present(EOT_TEXTS):
            self.eot_id = present(EOT_TEXTS)[0]
        if self.eom_id is None and present(("<|eom_id|>",)):
            self.eom_id = present(("<|eom_id|>",))[0]
        eog = set(present(EOG_TEXTS))
        for key, texts in _FIM_TEXTS.items():
            i = sid(key)
            if i is None and present(texts):
                i = present(texts)[0]
            if i is not None:
                eog.add(i)
                self._force_control(i)
        for i in present(EOG_TEXTS):
            self._force_control(i)
        for i in (self.eos_id, self.eot_id, self.eom_id):
            if i is not None:
                eog.add(i)
                if i == self.eot_id or i == self.eom_id:
                    self._force_control(i)
        return frozenset(eog)

    def _force_control(self, i: int) -> None:
        if self.token_type[i] not in (TokenType.CONTROL, TokenType.UNUSED):
            self.token_type[i] = TokenType.CONTROL

    def __repr__(self):
        return (f"Tokenizer(model={self.model!r}, pre={self.pre!r}, n_vocab={self.n_vocab}, bos_id={self.bos_id}, "
                f"eos_id={self.eos_id}, eot_id={self.eot_id}, add_bos={self.add_bos}, add_eos={self.add_eos})")

    # ---- encoding -----------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """`llama_tokenize(text, add_special, parse_special)`: token ids.

        add_special: BOS / EOS as the GGUF's add_bos_token / add_eos_token say.
        parse_special: special-token texts in `text` become their ids (see the module docstring).
        """
        frags = self._partition(text, parse_special)
        out = [self.bos_id] if add_special and self.add_bos and self.bos_id is not None else []
        if self.model in ("gpt2", "gemma4") and self._pre.newline_tokens:
            for f in frags:
                out.extend(self._gemma4_encode(f) if isinstance(f, str) else [f])
        elif self.model in ("gpt2", "gemma4"):
            raw = [f.replace(" ", "\u2581") if self._pre.escape else f for f in frags if isinstance(f, str)]
            if self.pre == "whitespace":
                _check_whitespace_runs(raw)
            enc = iter(self._bpe_encode_batch(raw)) if raw else iter(())
            for f in frags:
                if isinstance(f, str):
                    out.extend(next(enc))
                else:
                    out.append(f)
        elif self.model == "t5":
            for f in frags:
                out.extend(self._ugm_model().encode(f) if isinstance(f, str) else [f])
        else:
            prev_special = True
            for f in frags:
                if isinstance(f, str):
                    if self.add_space_prefix and prev_special:
                        f = " " + f
                    out.extend(self._spm_encode(f.replace(" ", "\u2581")))
                    prev_special = False
                else:
                    out.append(f)
                    prev_special = True
        if add_special and self.add_eos and self.eos_id is not None:
            out.append(self.eos_id)
        return out

    def _partition(self, text: str, parse_special: bool) -> list:
        """`tokenizer_st_partition`: text fragments (str) and special token ids (int), in order. A token
        with llama.cpp's LSTRIP / RSTRIP attribute also takes the whitespace before / after it."""
        frags: list = [text] if text else []
        for tid in self._special_ids:
            if not parse_special and self.token_type[tid] != TokenType.USER_DEFINED:
                continue
            s = self.tokens[tid]
            if not any(isinstance(f, str) and s in f for f in frags):
                continue
            lstrip, rstrip = tid in self._lstrip, tid in self._rstrip
            new = []
            for f in frags:
                if not isinstance(f, str) or s not in f:
                    new.append(f)
                    continue
                parts = f.split(s)
                for k, p in enumerate(parts):
                    if k:
                        new.append(tid)
                        if rstrip:
                            p = p.lstrip(_C_SPACE)
                    if lstrip and k < len(parts) - 1:
                        p = p.rstrip(_C_SPACE)
                    if p:
                        new.append(p)
            frags = new
        return frags

    def _ugm_model(self):
        if self._ugm is None:
            self._ugm = UGM(self.tokens, self.token_type, self.scores, self.unk_id, self._charsmap,
                            add_space_prefix=self.add_space_prefix,
                            remove_extra_whitespaces=self.remove_extra_whitespaces)
        return self._ugm

    def _gemma4_encode(self, text: str) -> list[int]:
        """One raw fragment through llama.cpp's gemma4 BPE: spaces -> U+2581, split into line-break runs and
        the text between them; a run of line breaks that is a token is that token (llama.cpp takes it
        whole), the rest goes through BPE."""
        words = re.findall(r"[^\n]+|\n+", text.replace(" ", "\u2581"))
        todo = [w for w in words if not (w[0] == "\n" and w in self.token_to_id)]
        enc = iter(self._bpe_encode_batch(todo)) if todo else iter(())
        out: list[int] = []
        for w in words:
            out.extend([self.token_to_id[w]] if w[0] == "\n" and w in self.token_to_id else next(enc))
        return out

    def _bpe_encode_batch(self, texts: list[str]) -> list[list[int]]:
        if self._bpe is None:
            self._bpe = self._build_bpe()
        n = self.n_vocab
        return [[i for i in e.ids if i < n] for e in self._bpe.encode_batch(texts, add_special_tokens=False)]

    def _build_bpe(self):
        try:
            from tokenizers import Regex, Tokenizer as HFTokenizer, models, pre_tokenizers
        except ImportError as e:
            raise ImportError("byte-level BPE encoding needs the `tokenizers` package "
                              "(pip install 'refimpl[tokenizers]')") from e
        merges = []
        for m in self.merges:
            k = m.find(" ", 1)      # llama.cpp splits at the first space after the first character
            merges.append((m[:k], m[k + 1:]) if k > 0 else ("", ""))
        vocab = dict(self.token_to_id)
        known = vocab.keys()
        # Hugging Face refuses merges whose parts or result are not tokens; llama.cpp could only use
        # such a merge as an intermediate step that byte fallback then undoes. Dropped here.
        merges = [(a, b) for a, b in merges if a in known and b in known and a + b in known]
        raw_utf8 = not self._pre.byte_encode        # byte tokens <0xXX> as the fallback (dropped if absent)
        if raw_utf8:
            # a character that is no token stays in its word as a symbol no merge joins, and at the end each
            # of its bytes is <0xXX> or nothing (llama.cpp); Hugging Face would drop it before merging, so the
            # missing byte tokens get ids past the vocabulary, which encode then drops
            vocab.update({f"<0x{b:02X}>": self.n_vocab + b for b in range(256) if f"<0x{b:02X}>" not in known})
        model = models.BPE(vocab=vocab, merges=merges, ignore_merges=self._pre.ignore_merges, fuse_unk=False,
                           byte_fallback=raw_utf8)
        tok = HFTokenizer(model)
        if not self._pre.newline_tokens:            # (those arrive split, by _gemma4_encode)
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in self._pre.regexes]
                + ([] if raw_utf8 else [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))
        return tok

    def _spm_encode(self, text: str) -> list[int]:
        """llama.cpp's `llm_tokenizer_spm_session::tokenize` on an escaped fragment."""
        if not text:
            return []
        vocab, scores = self.token_to_id, self.scores
        sym = list(text)                       # one symbol per codepoint
        nxt = list(range(1, len(sym))) + [-1]
        prv = list(range(-1, len(sym) - 1))
        heap = []

        def add(left: int, right: int):
            if left < 0 or right < 0:
                return
            s = sym[left] + sym[right]
            tid = vocab.get(s)
            if tid is None:
                return
            heapq.heappush(heap, (-scores[tid], left, right, s))   # best score, then leftmost

        for i in range(1, len(sym)):
            add(i - 1, i)
        while heap:
            _, left, right, s = heapq.heappop(heap)
            if not sym[left] or not sym[right] or sym[left] + sym[right] != s or nxt[left] != right:
                continue
            sym[left], sym[right] = s, ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            add(prv[left], left)
            add(left, nxt[left])

        # Every merge made a vocabulary entry, so a final symbol is a token or one character that
        # is not; that one becomes byte tokens (llama.cpp's `resegment` never finds a merge to undo).
        out: list[int] = []
        i = 0
        while i != -1:
            tid = vocab.get(sym[i])
            if tid is not None:
                out.append(tid)
            else:
                out.extend(self._byte_token(b) for b in sym[i].encode("utf-8", "surrogateescape"))
            i = nxt[i]
        return out

    def _byte_token(self, b: int) -> int:
        tid = self.token_to_id.get(f"<0x{b:02X}>")
        if tid is None:
            tid = self.token_to_id.get(chr(b)) if b < 0x80 else None
        if tid is None:
            raise ValueError(f"the vocabulary has no byte token <0x{b:02X}> to fall back to for byte {b}")
        return tid

    # ---- decoding -----------------------------------------------------------------------------

    def token_to_piece(self, token_id: int, special: bool = True) -> bytes:
        """`llama_token_to_piece(id, lstrip=0, special)`: the bytes this token stands for."""
        token_id = token_index(token_id, len(self.tokens))
        t = self.token_type[token_id]
        if t in (TokenType.CONTROL, TokenType.UNKNOWN) and not special:
            return b""
        p = self._pieces[token_id]
        if p is None:
            p = self._pieces[token_id] = self._piece(token_id)
        return p

    def _piece(self, i: int) -> bytes:
        text, t = self.tokens[i], self.token_type[i]
        raw = text.encode("utf-8", "surrogateescape")
        if t in _SPECIAL:
            return raw
        if t == TokenType.BYTE:
            m = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", text)
            if m:
                return bytes([int(m.group(1), 16)])
            return bytes([CHAR_TO_BYTE[text]]) if text in CHAR_TO_BYTE else raw
        if t != TokenType.NORMAL:
            return b""                                    # UNUSED, UNDEFINED: llama.cpp emits nothing
        if self.model in ("llama", "t5") or (self._pre is not None and self._pre.escape):
            return raw.replace("\u2581".encode(), b" ")
        return bytes(CHAR_TO_BYTE[c] for c in text) if all(c in CHAR_TO_BYTE for c in text) else raw

    def decode(self, ids: Iterable[int], special: bool = True) -> str:
        """`llama_detokenize(ids, remove_special=False, unparse_special=special)` as text."""
        pieces = [self.token_to_piece(i, special) for i in ids]
        if self.add_space_prefix and pieces and pieces[0].startswith(b" "):
            pieces[0] = pieces[0][1:]
        data = b"".join(pieces)
        if self._clean_spaces:
            data = clean_spaces(data)
        return data.decode("utf-8", errors="replace")

    def stream(self, special: bool = True) -> "StreamDecoder":
        """A decoder for generation: `push(id)` returns only complete UTF-8 characters."""
        return StreamDecoder(self, special)

    def is_eog(self, token_id: int) -> bool:
        """`llama_vocab_is_eog`: does this token end generation?"""
        return token_id in self.eog_ids

    # ---- chat ---------------------------------------------------------------------------------

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                            template: str | None = None) -> str:
        """Render the GGUF's `tokenizer.chat_template` (refimpl.chat, sandboxed jinja2) to prompt text;
        `encode` it (special tokens are parsed) to get the prompt ids."""
        from ..chat import render
        template = template or self.chat_template
        if not template:
            raise ValueError("this GGUF has no tokenizer.chat_template")
        text = lambda i: self.tokens[i] if i is not None else ""   # noqa: E731
        return render(template, list(messages), add_generation_prompt=add_generation_prompt,
                      bos_token=text(self.bos_id), eos_token=text(self.eos_id))
