"""UGM: the unigram language model of SentencePiece (T5, XLM-R, nomic-bert-moe; `tokenizer.ggml.model = "t5"`),
as llama.cpp's `llm_tokenizer_ugm` encodes one text fragment. Everything works on UTF-8 bytes, as llama.cpp does.

1. Normalize, left to right. At each position the longest match wins, in this order:
   - a user-defined token's text: llama.cpp walks its trie of user-defined texts as far as the input follows
     it and keeps that many bytes unchanged, whether or not the walk ends on a whole token (kept here);
   - the precompiled charsmap (`tokenizer.ggml.precompiled_charsmap`, SentencePiece's normalizer): a uint32
     byte count, that many bytes of XOR-compressed compact double array (each uint32 entry: BASE in bits
     10-30, shifted left 8 when bit 9 is set; LCHECK in bits 0-7 and 31; LEAF in bit 8), then NUL-terminated
     replacement strings that the array's leaves index;
   - one valid UTF-8 character as it is, or one invalid byte as U+FFFD.
   The normalized bytes then have their spaces escaped to U+2581; with `remove_extra_whitespaces` every run of
   spaces becomes one escaped space before the next non-space and none at the ends; otherwise each space is
   escaped and `add_space_prefix` puts one escaped space before the first non-space.
2. Viterbi over the normalized bytes, one UTF-8 character per step: every vocabulary entry (normal,
   user-defined and unused tokens; a later id with the same text wins) that starts at a reachable position
   offers a path scored by the sum of its tokens' scores in double precision (user-defined tokens score 0);
   a character no token covers alone may be the unknown token at score `min(normal scores) - 10` (in
   float32). A later challenger must score strictly more to replace the best path to a position.
3. Backtrack from the end; a run of unknown tokens becomes one.
"""
from __future__ import annotations

import numpy as np

SPACE = "\u2581".encode()
_UTF8_LEN = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)     # by the lead byte's high four bits
_FFFD = "\ufffd".encode()
NORMAL, USER_DEFINED, UNUSED = 1, 4, 5       # llama_token_type (refimpl.tokenizers.llama.TokenType)


class UGM:
    """The tables llama.cpp builds from a UGM vocabulary, and `encode(text) -> ids` for one fragment."""

    def __init__(self, tokens: list[str], token_type: list[int], scores: list[float], unk_id: int,
                 charsmap: bytes | None, *, add_space_prefix: bool, remove_extra_whitespaces: bool,
                 where: str = "GGUF"):
        if unk_id is None:
            raise ValueError(f"{where}: a UGM (t5) vocabulary needs an unknown token (tokenizer.ggml.unknown_token_id)")
        self.unk_id = unk_id
        self.add_space_prefix = add_space_prefix
        self.remove_extra_whitespaces = remove_extra_whitespaces
        self._pieces: dict[bytes, int] = {}               # what the Viterbi may use, text -> id (later wins)
        self._score: dict[int, float] = {}
        user_prefixes: set[bytes] = set()
        normal = [s for s, t in zip(scores, token_type) if t == NORMAL]
        min_score = np.float32(min(normal)) if normal else np.float32(np.finfo(np.float32).max)
        self.unknown_score = float(min_score - np.float32(10.0))
        for i, (text, t) in enumerate(zip(tokens, token_type)):
            raw = text.encode("utf-8", "surrogateescape")
            if t in (NORMAL, USER_DEFINED, UNUSED) and raw:
                self._pieces[raw] = i
                self._score[i] = 0.0 if t == USER_DEFINED else float(scores[i])
            if t == USER_DEFINED:
                user_prefixes.update(raw[:k] for k in range(1, len(raw) + 1))
        self._user_prefixes = user_prefixes
        self._max_len = max((len(p) for p in self._pieces), default=0)
        self._max_user = max((len(p) for p in user_prefixes), default=0)
        self._xcda = None
        self._repl = b""
        if charsmap:
            if len(charsmap) < 4:
                raise ValueError(f"{where}: tokenizer.ggml.precompiled_charsmap has {len(charsmap)} bytes, "
                                 f"fewer than its 4-byte length")
            n = int.from_bytes(charsmap[:4], "little")
            if n % 4 or 4 + n > len(charsmap):
                raise ValueError(f"{where}: tokenizer.ggml.precompiled_charsmap says its array has {n} bytes; "
                                 f"the key holds {len(charsmap) - 4} after the length")
            self._xcda = np.frombuffer(charsmap, "<u4", n // 4, 4).tolist()
            self._repl = bytes(charsmap[4 + n:])

    # ---- normalization ----------------------------------------------------------------------------

    def _node(self, i: int) -> int:
        if i >= len(self._xcda):
            raise ValueError("the precompiled charsmap's array is walked past its end (index "
                             f"{i} of {len(self._xcda)})")
        return self._xcda[i]

    def _base(self, i: int) -> int:
        v = self._node(i)
        return (v >> 10) << ((v & (1 << 9)) >> 6)

    def _prefix(self, data: bytes, at: int) -> tuple[bytes, int]:
        """`normalize_prefix`: (replacement bytes, bytes consumed) at `at`."""
        if self._max_user:
            k = 0
            while at + k < len(data) and data[at:at + k + 1] in self._user_prefixes:
                k += 1
            if k:
                return data[at:at + k], k
        if self._xcda:
            best_len = best_off = 0
            node = self._base(0)
            for p in range(at, len(data)):
                c = data[p]
                if c == 0:
                    break
                node ^= c
                v = self._node(node)
                if v & ((1 << 31) | 0xFF) != c:
                    break
                leaf = (v >> 8) & 1
                node ^= self._base(node)
                if leaf:
                    best_len = p - at + 1
                    best_off = self._node(node) & ((1 << 31) - 1)
            if best_len:
                if best_off >= len(self._repl):
                    raise ValueError("the precompiled charsmap points past its replacement strings")
                end = self._repl.find(b"\0", best_off)
                if end < 0:
                    raise ValueError("the precompiled charsmap has an unterminated replacement string")
                return self._repl[best_off:end], best_len
        n = _utf8_char_len(data, at)
        return (data[at:at + n], n) if n else (_FFFD, 1)

    def normalize(self, data: bytes) -> bytes:
        """llama.cpp's `normalize` of one fragment's UTF-8 bytes."""
        out = bytearray()
        merge = self.remove_extra_whitespaces
        prepended = in_word = False
        at = 0
        while at < len(data):
            rep, used = self._prefix(data, at)
            for c in rep:
                if c != 0x20:
                    if not in_word:
                        in_word = True
                        if (self.add_space_prefix and not prepended) or merge:
                            out += SPACE
                            prepended = True
                    out.append(c)
                else:
                    in_word = False
                    if not merge:
                        out += SPACE
            at += used
        return bytes(out)

    # ---- Viterbi ---------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """The ids of one raw-text fragment."""
        s = self.normalize(text.encode("utf-8", "surrogateescape"))
        n = len(s)
        if n == 0:
            return []
        unk, pieces, score, max_len = self.unk_id, self._pieces, self._score, self._max_len
        best_id = [unk] * (n + 1)
        best_from = [0] * (n + 1)
        best = [-np.finfo(np.float64).max] * (n + 1)
        best[0] = 0.0
        at = 0
        while at < n:
            width = min(_UTF8_LEN[s[at] >> 4], n - at)
            here = best[at]
            whole = False
            for end in range(at + 1, min(n, at + max_len) + 1):
                tid = pieces.get(s[at:end])
                if tid is None:
                    continue
                if end - at == width:
                    whole = True
                cand = here + score[tid]
                if cand > best[end]:
                    best_id[end], best_from[end], best[end] = tid, at, cand
            if not whole:
                end = at + width
                cand = here + self.unknown_score
                if cand > best[end]:
                    best_id[end], best_from[end], best[end] = unk, at, cand
            at += width
        out: list[int] = []
        pos, prev_unk = n, False
        while True:
            tid = best_id[pos]
            is_unk = tid == unk
            if not (prev_unk and is_unk):
                out.append(tid)
            if best_from[pos] == 0:
                break
            prev_unk = is_unk
            pos = best_from[pos]
        out.reverse()
        return out


def _utf8_char_len(data: bytes, at: int) -> int:
    """The length of the UTF-8 character at `at` as llama.cpp's `unicode_cpt_from_utf8` accepts it, 0 if it
    does not (a stray continuation byte, a truncated sequence, a lead byte above 0xF7)."""
    b = data[at]
    if b < 0x80:
        return 1
    for n, mask in ((2, 0x20), (3, 0x10), (4, 0x08)):
        if not b & 0x40:
            return 0
        if not b & mask:
            if at + n - 1 >= len(data) or any((data[at + k] & 0xC0) != 0x80 for k in range(1, n)):
                return 0
            return n
    return 0
