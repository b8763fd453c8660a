"""RWKV "World" tokenizer: greedy longest match over byte strings, with llama.cpp's ids.

    tok = refimpl.tokenizer.from_gguf("rwkv-6-world-1b6.gguf")       # tokenizer.ggml.model == "rwkv"
    tok = RWKVTokenizer.from_world_vocab("rwkv_vocab_v20230424.txt")  # the same vocabulary, from the source
    ids = tok.encode("Hello world\\n\\n")     # [33155, 40213, 261]
    tok.decode(ids)                          # the same text back, byte for byte
    dec = tok.stream()                       # for generation: only whole UTF-8 characters
    "".join(dec.push(i) for i in ids) + dec.flush()

What is reproduced from llama.cpp's `llama-vocab.cpp` (`llm_tokenizer_rwkv`, `llama_unescape_rwkv_token`):

Vocabulary. Every token is a byte string (the 65529 World tokens include the 256 single bytes, so
every text can be encoded, and pieces of UTF-8 characters, so a token need not be valid UTF-8).
A GGUF stores each as text, escaped as Python writes a bytes literal without its b'' quotes: "\\\\"
for a backslash, "\\'" for a quote, "\\t" "\\n" "\\r", "\\xhh" (lowercase hex) for any other byte
outside printable ASCII; llama.cpp undoes exactly these escapes ("\\" before any other character
gives that character). llama.cpp's converter (convert_hf_to_gguf.py `_set_vocab_rwkv_world`) writes
id 0 as "<s>" (CONTROL), ids 1..65529 from `rwkv_vocab_v20230424.txt` in file order (NORMAL), then
"[PAD{id}]" (UNUSED) up to the model's vocab_size (65536); BOS = EOS = 0, EOT = 261 ("\\n\\n").

Encoding (`encode(text, add_special, parse_special)`):
    1. With parse_special (default), CONTROL / USER_DEFINED / UNKNOWN token texts ("<s>") are cut out
       of the text first and become their ids, longest first (llama.cpp's `tokenizer_st_partition`).
    2. Each remaining UTF-8 fragment is split greedily: at each position the longest token whose
       bytes start there, over all tokens (CONTROL and UNUSED ones too: "[PAD65530]" in the text is
       that unused token, as in llama.cpp). Where tokens share bytes, the later id wins.
    3. Nothing is added: llama.cpp's RWKV path adds neither BOS nor EOS, whatever `add_special` and
       `tokenizer.ggml.add_bos_token` say.
    A byte that starts no token would be llama.cpp's unknown token, which RWKV vocabularies do not
    set (llama.cpp would emit -1): here it is `unk_id` if set, else a ValueError naming the byte.
    The `rwkv` package's TRIE_TOKENIZER gives the same ids for text without special texts (its
    vocabulary has no "<s>" and no padding tokens).

Decoding: `token_to_piece` is the token's bytes (b"" for CONTROL / UNKNOWN with special=False);
`decode` joins them and reads UTF-8 with invalid bytes replaced by U+FFFD (`decode_bytes` gives the
raw bytes); `stream()` holds back a character split across tokens, as `refimpl.tokenizer.StreamDecoder`.
`eog_ids` is llama.cpp's end-of-generation set: EOS, EOT, EOM and tokens with an end-of-turn text.
"""
from __future__ import annotations

import ast
from os import PathLike
from typing import Iterable, Sequence

from .base import token_index

__all__ = ["RWKVTokenizer", "escape_token", "unescape_token"]

_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED = 1, 2, 3, 4, 5     # gguf TokenType values
_SPECIAL = (_CONTROL, _USER_DEFINED, _UNKNOWN)
_ESCAPES = {"t": 0x09, "n": 0x0A, "r": 0x0D}


def unescape_token(text: str) -> bytes:
    """A GGUF RWKV token text -> its bytes (llama.cpp's `llama_unescape_rwkv_token`).

    "\\t" "\\n" "\\r" are those bytes, "\\xhh" is byte hh, "\\" before any other character is that
    character; everything else stands for its own UTF-8 bytes."""
    out = bytearray()
    raw = text.encode("utf-8", "surrogateescape")
    i, n = 0, len(raw)
    while i < n:
        b = raw[i]
        if b != 0x5C or i + 1 >= n:          # not a backslash (a trailing one is dropped below)
            if b != 0x5C:
                out.append(b)
            i += 1
            continue
        c = chr(raw[i + 1])
        if c == "x":
            out.append(_hex2(raw[i + 2:i + 4], text))
            i += 4
        else:
            out.append(_ESCAPES.get(c, raw[i + 1]))
            i += 2
    return bytes(out)


def _hex2(pair: bytes, text: str) -> int:
    if len(pair) != 2:
        raise ValueError(f"RWKV token {text!r}: \\x escape needs two hex digits")
    v = 0
    for d in pair:   # llama.cpp reads lowercase hex: 'a'.. as 10.., anything else as a digit
        v = (v << 4) + ((d - 0x61 + 10) if 0x61 <= d < 0x80 else (d - 0x30))
    return v & 0xFF


def escape_token(data: bytes) -> str:
    """Bytes -> the GGUF text llama.cpp's converter writes (Python's bytes repr without b'' quotes)."""
    return repr(bytes(data))[2:-1]


class _Trie:
    """Byte trie of the vocabulary: `step[node][byte] -> node`, `value[node]` -> token id or -1."""

    def __init__(self, pieces: Sequence[bytes]):
        self.step: list[dict] = [{}]
        self.value: list[int] = [-1]
        for tid, p in enumerate(pieces):
            node = 0
            for b in p:
                nxt = self.step[node].get(b)
                if nxt is None:
                    nxt = len(self.step)
                    self.step[node][b] = nxt
                    self.step.append({})
                    self.value.append(-1)
                node = nxt
            if p:
                self.value[node] = tid           # a later duplicate replaces the earlier id

    def longest(self, data: bytes, pos: int) -> tuple[int, int]:
        """(token id, end) of the longest token that starts at data[pos], or (-1, pos)."""
        step, value = self.step, self.value
        node, best, end = 0, -1, pos
        for i in range(pos, len(data)):
            node = step[node].get(data[i])
            if node is None:
                break
            if value[node] >= 0:
                best, end = value[node], i + 1
        return best, end


class RWKVTokenizer:
    """An RWKV World vocabulary with llama.cpp's encode / decode. Build it with `from_gguf_metadata`
    or `from_world_vocab`.

    Attributes: `model` ("rwkv"), `tokens` (GGUF texts, escaped), `token_bytes` (their bytes),
    `token_type`, `n_vocab`, `bos_id`, `eos_id`, `eot_id`, `eom_id`, `unk_id`, `pad_id` (an id or
    None), `eog_ids`, `add_bos` / `add_eos` (False: llama.cpp adds nothing for RWKV), `chat_template`.
    """

    model = "rwkv"

    def __init__(self, tokens: Sequence[str], token_type: Sequence[int] | None = None, *,
                 bos_id: int | None = None, eos_id: int | None = None, eot_id: int | None = None,
                 eom_id: int | None = None, unk_id: int | None = None, pad_id: int | None = None,
                 chat_template: str | None = None, source: str = "vocabulary"):
        self.tokens: list[str] = list(tokens)
        self.n_vocab = len(self.tokens)
        self.token_bytes: list[bytes] = [unescape_token(t) for t in self.tokens]
        self.token_type = [int(t) for t in token_type] if token_type is not None else [_NORMAL] * self.n_vocab
        if len(self.token_type) != self.n_vocab:
            raise ValueError(f"{source}: {len(self.token_type)} token types for {self.n_vocab} tokens")
        self.source = source

        def check(name, i):
            if i is None:
                return None
            if not 0 <= int(i) < self.n_vocab:
                raise ValueError(f"{source}: {name} id {i} is outside the vocabulary (n_vocab {self.n_vocab})")
            return int(i)

        self.bos_id, self.eos_id = check("bos", bos_id), check("eos", eos_id)
        self.eot_id, self.eom_id = check("eot", eot_id), check("eom", eom_id)
        self.unk_id, self.pad_id = check("unknown", unk_id), check("padding", pad_id)
        self.add_bos = self.add_eos = False
        self.chat_template = chat_template

        from .base import EOG_TEXTS, EOT_TEXTS          # llama.cpp's text-based detection
        text_to_id = {t: i for i, t in enumerate(self.tokens)}
        if self.eot_id is None:
            self.eot_id = next((text_to_id[t] for t in EOT_TEXTS if t in text_to_id), None)
        if self.eom_id is None:
            self.eom_id = text_to_id.get("<|eom_id|>")
        eog = {text_to_id[t] for t in EOG_TEXTS if t in text_to_id}
        eog.update(i for i in (self.eos_id, self.eot_id, self.eom_id) if i is not None)
        self.eog_ids = frozenset(eog)

        self._special_ids = sorted((i for i in range(self.n_vocab)
                                    if self.token_type[i] in _SPECIAL and self.tokens[i]),
                                   key=lambda i: -len(self.tokens[i].encode("utf-8", "surrogateescape")))
        self._trie: _Trie | None = None

    def __repr__(self):
        return (f"RWKVTokenizer(n_vocab={self.n_vocab}, bos_id={self.bos_id}, eos_id={self.eos_id}, "
                f"eot_id={self.eot_id})")

    # ---- constructors -------------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, kv: dict) -> "RWKVTokenizer":
        """A GGUF's metadata (`refimpl.gguf.load(path).metadata`) with tokenizer.ggml.model == "rwkv"."""
        if "tokenizer.ggml.tokens" not in kv:
            raise ValueError("GGUF has no tokenizer.ggml.tokens")
        tokens = list(kv["tokenizer.ggml.tokens"])
        n = len(tokens)

        def sid(key):       # llama.cpp: an id outside the vocabulary is ignored (with a warning)
            v = kv.get(f"tokenizer.ggml.{key}_token_id")
            return int(v) if v is not None and 0 <= int(v) < n else None

        return cls(tokens, kv.get("tokenizer.ggml.token_type"), bos_id=sid("bos"), eos_id=sid("eos"),
                   eot_id=sid("eot"), eom_id=sid("eom"), unk_id=sid("unknown"), pad_id=sid("padding"),
                   chat_template=kv.get("tokenizer.chat_template"), source="GGUF")

    @classmethod
    def from_world_vocab(cls, path: str | PathLike, vocab_size: int | None = None) -> "RWKVTokenizer":
        """`rwkv_vocab_v20230424.txt` (lines `id literal length`, the literal a Python str or bytes),
        laid out as llama.cpp's converter lays it out in a GGUF: id 0 "<s>" (CONTROL, BOS and EOS),
        the file's tokens from id 1, EOT 261; with `vocab_size`, "[PAD{id}]" (UNUSED) tokens up to it."""
        tokens, types = ["<s>"], [_CONTROL]
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                line = line.rstrip("\n")
                if not line:
                    continue
                first, last = line.find(" "), line.rfind(" ")
                if first < 0 or last <= first:
                    raise ValueError(f"{path}:{lineno}: expected 'id literal length', got {line!r}")
                try:
                    tid, length = int(line[:first]), int(line[last + 1:])
                    value = ast.literal_eval(line[first + 1:last])
                except (ValueError, SyntaxError) as e:
                    raise ValueError(f"{path}:{lineno}: cannot parse {line!r} ({e})") from e
                data = value.encode("utf-8") if isinstance(value, str) else value
                if not isinstance(data, bytes) or len(data) != length:
                    raise ValueError(f"{path}:{lineno}: token {value!r} is not {length} bytes")
                if tid != len(tokens):
                    raise ValueError(f"{path}:{lineno}: id {tid} out of order (expected {len(tokens)})")
                tokens.append(escape_token(data))
                types.append(_NORMAL)
        if vocab_size is not None:
            if vocab_size < len(tokens):
                raise ValueError(f"{path}: vocab_size {vocab_size} is smaller than its {len(tokens)} tokens")
            for i in range(len(tokens), vocab_size):
                tokens.append(f"[PAD{i}]")
                types.append(_UNUSED)
        eot = 261 if len(tokens) > 261 else None
        return cls(tokens, types, bos_id=0, eos_id=0, eot_id=eot, source=str(path))

    # ---- encoding -----------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """`llama_tokenize(text, add_special, parse_special)`: token ids (add_special adds nothing
        for RWKV, as in llama.cpp). parse_special: special-token texts ("<s>") become their ids."""
        out: list[int] = []
        for f in self._partition(text, parse_special):
            if isinstance(f, str):
                try:
                    data = f.encode("utf-8")
                except UnicodeEncodeError as e:      # a lone surrogate: no UTF-8 bytes to tokenize
                    raise ValueError(f"RWKV tokenizer: the text is not valid Unicode ({e.reason}: "
                                     f"{f[e.start]!r} at position {e.start} of a text piece); tokenize raw "
                                     f"bytes with encode_bytes") from None
                out.extend(self.encode_bytes(data))
            else:
                out.append(f)
        return out

    def encode_bytes(self, data: bytes) -> list[int]:
        """Greedy longest match of raw bytes (step 2 of the module docstring)."""
        if self._trie is None:
            self._trie = _Trie(self.token_bytes)
        trie, out, pos, n = self._trie, [], 0, len(data)
        while pos < n:
            tid, end = trie.longest(data, pos)
            if tid < 0:
                if self.unk_id is None:
                    raise ValueError(f"{self.source}: no token starts with byte 0x{data[pos]:02x} (at offset "
                                     f"{pos}) and the vocabulary has no unknown token")
                tid, end = self.unk_id, pos + 1
            out.append(tid)
            pos = end
        return out

    def encode_batch(self, texts: Iterable[str], add_special: bool = True,
                     parse_special: bool = True) -> list[list[int]]:
        return [self.encode(t, add_special, parse_special) for t in texts]

    def _partition(self, text: str, parse_special: bool) -> list:
        """`tokenizer_st_partition`: text fragments (str) and special token ids (int), in order."""
        frags: list = [text] if text else []
        if not parse_special:
            ids = [i for i in self._special_ids if self.token_type[i] == _USER_DEFINED]
        else:
            ids = self._special_ids
        for tid in ids:
            s = self.tokens[tid]
            if not any(isinstance(f, str) and s in f for f in frags):
                continue
            new = []
            for f in frags:
                if not isinstance(f, str) or s not in f:
                    new.append(f)
                    continue
                for k, p in enumerate(f.split(s)):
                    if k:
                        new.append(tid)
                    if p:
                        new.append(p)
            frags = new
        return frags

    # ---- decoding -----------------------------------------------------------------------------

    def token_to_piece(self, token_id: int, special: bool = True) -> bytes:
        """`llama_token_to_piece(id, 0, special)`: the token's bytes (b"" for a CONTROL or UNKNOWN
        token when special=False)."""
        i = token_index(token_id, len(self.token_bytes))
        if not special and self.token_type[i] in (_CONTROL, _UNKNOWN):
            return b""
        return self.token_bytes[i]

    def decode_bytes(self, ids: Iterable[int], special: bool = True) -> bytes:
        return b"".join(self.token_to_piece(i, special) for i in ids)

    def decode(self, ids: Iterable[int], special: bool = True) -> str:
        """`llama_detokenize` as text: the bytes joined, invalid UTF-8 replaced by U+FFFD."""
        return self.decode_bytes(ids, special).decode("utf-8", errors="replace")

    def stream(self, special: bool = True):
        """A decoder for generation: `push(id)` returns only complete UTF-8 characters, `flush()` the rest."""
        from .base import StreamDecoder
        return StreamDecoder(self, special)

    def is_eog(self, token_id: int) -> bool:
        """`llama_vocab_is_eog`: does this token end generation?"""
        return token_id in self.eog_ids
