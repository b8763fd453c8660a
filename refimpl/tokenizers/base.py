"""What every tokenizer of this package shares: llama.cpp's end-of-turn / end-of-generation texts and the
streaming decoder (bytes held back until they form whole UTF-8 characters)."""
from __future__ import annotations

import codecs
import operator
import re

EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
              "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
EOG_TEXTS = EOT_TEXTS + ("<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "</s>", "<|eom_id|>",
                           "[EOS]", "<eos>", "<turn|>", "<|tool_response>", "[e~[")


class StreamDecoder:
    """Incremental detokenizer: `push(id)` returns the text completed by this token (possibly ""),
    holding back the bytes of a character split across tokens (an emoji or CJK character is often
    2 to 4 byte tokens); `flush()` returns what is left (U+FFFD for an incomplete tail). Invalid
    bytes become U+FFFD exactly as in `decode`. The pieces are raw: no `clean_spaces` and no
    stripped space prefix (as llama.cpp's generation loop prints them)."""

    def __init__(self, tokenizer, special: bool = True):      # any tokenizer of this package
        self.tokenizer = tokenizer
        self.special = special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self.tokenizer.token_to_piece(int(token_id), self.special))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


def token_index(token_id, n_vocab: int) -> int:
    """token_id as an index into a vocabulary of n_vocab tokens: an integer in [0, n_vocab), else ValueError
    (a negative id would otherwise silently pick a token from the end, as Python indexing does)."""
    try:
        i = operator.index(token_id)
    except TypeError:
        raise ValueError(f"token id {token_id!r} is not an integer") from None
    if not 0 <= i < n_vocab:
        raise ValueError(f"token id {i} out of range [0, {n_vocab})")
    return i


def clean_spaces(data: bytes) -> bytes:
    """llama_detokenize's `clean_spaces` passes: " ?" " !" " ." " ," lose their space, " ' " becomes "'", and
    " 's" " 'm" " 're" " 've" lose their space (" 't" " 'd" " 'll" keep it)."""
    data = re.sub(rb" ([?!.,])", rb"\1", data)
    data = re.sub(rb" ' ", rb"'", data)
    return re.sub(rb" '(?=s|m|re|ve)", rb"'", data)
