"""Every tokenizer llama.cpp knows, from a GGUF file's vocabulary, giving llama.cpp's token ids.

    tok = refimpl.tokenizers.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")    # also refimpl.tokenizer.from_gguf

    llama.py      BPE (gpt2: byte-level, with every pre-tokenizer of PRE_TOKENIZERS), SPM (llama), gemma4's BPE
                  and UGM (t5) -- Tokenizer
    ugm.py        UGM: SentencePiece's unigram model as llama.cpp encodes it (normalizer charsmap, Viterbi)
    wordpiece.py  WordPiece (bert), and Hugging Face's tokenizer.json / vocab.txt for BERT checkpoints
    rwkv.py       RWKV World (rwkv): greedy longest match over a byte trie
    base.py       llama.cpp's end-of-generation texts and the streaming decoder they share
"""
from __future__ import annotations

from os import PathLike

from ..errors import LoadError, TokenizerError
from .base import StreamDecoder
from .llama import BYTE_TO_CHAR, CHAR_TO_BYTE, PRE_TOKENIZERS, Tokenizer, TokenType  # noqa: F401

__all__ = ["Tokenizer", "StreamDecoder", "from_gguf", "PRE_TOKENIZERS", "TokenType"]


def from_gguf(src) -> Tokenizer:
    """The tokenizer of a GGUF file: a path or a `refimpl.gguf.GGUFFile` (or its metadata dict). What cannot
    be built from its metadata raises TokenizerError naming the file."""
    if isinstance(src, (str, bytes, PathLike)):
        from .. import gguf
        src = gguf.load(src)
    where = getattr(src, "path", "GGUF")
    try:
        return _from_gguf(src, where)
    except LoadError:
        raise
    except (ValueError, KeyError, TypeError, IndexError) as e:
        msg = str(e) if str(where) in str(e) else f"{where}: {e}"
        raise TokenizerError(msg, None if where == "GGUF" else where) from e


def _from_gguf(src, where) -> Tokenizer:
    from ..gguf import check_tokenizer_metadata
    kv = src if isinstance(src, dict) else src.metadata
    if "tokenizer.ggml.tokens" not in kv:
        raise TokenizerError(f"{where}: no tokenizer.ggml.tokens: no vocabulary to build a tokenizer from")
    check_tokenizer_metadata(kv, where)                      # types and lengths, before anything is built
    model = kv.get("tokenizer.ggml.model", "llama")
    if model == "bert":                                      # WordPiece (BERT family)
        from .wordpiece import WordPieceTokenizer
        return WordPieceTokenizer.from_gguf_metadata(kv)
    if model == "rwkv":                                      # RWKV World: greedy longest match
        from .rwkv import RWKVTokenizer
        return RWKVTokenizer.from_gguf_metadata(kv)
    return Tokenizer(kv)
