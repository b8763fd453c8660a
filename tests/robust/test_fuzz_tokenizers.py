"""Hostile GGUF tokenizer metadata: wrong value types, arrays of the wrong length, token types out of range,
special-token ids out of range or of the wrong type, malformed merges, unknown models and pre-tokenizers.

A case is a small GGUF vocabulary (GPT-2 byte-level BPE, or SentencePiece with byte tokens) with drawn
edits to its `tokenizer.*` keys, or with drawn byte mutations of the whole file. Reading it goes
`refimpl.gguf.load` -> `gguf.check_tokenizer_metadata` -> `refimpl.tokenizer.from_gguf` (what
`llama.load` does): each step may refuse the file with a refimpl.LoadError (GGUFError, TokenizerError) and nothing else;
a tokenizer that is built must then decode every id without any error, and encode a few texts or refuse
one it cannot spell with a ValueError (e.g. a SentencePiece vocabulary without the byte token a character
needs: llama.cpp cannot tokenize that text either).
(llama2.c's tokenizer.bin is fuzzed in test_fuzz_llama2c.py.)
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from gguf.constants import GGUFValueType as VT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import refimpl
from refimpl import gguf, tokenizer
from refimpl.gguf import GGUFError

from ..models.tiny import byte_level_vocab
from ._fuzz import examples, run_case

pytestmark = pytest.mark.property

TEXTS = ["Hello world", " a  b\n\tc ", "héllo wörld 日本語 🦙", "<|im_start|>user\nhi<|im_end|>", "",
         "\x00\x7f\u2581 <0x41>"]


def bpe_vocab() -> dict:
    kv = byte_level_vocab(96)
    kv["tokenizer.ggml.tokens"][90:94] = ["<|im_start|>", "<|im_end|>", "<s>", "</s>"]
    kv["tokenizer.ggml.token_type"][90:94] = [3, 3, 3, 4]
    kv.update({"tokenizer.ggml.bos_token_id": 92, "tokenizer.ggml.eos_token_id": 91,
               "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.merges": ["Ġ Ġ", "h e", "l l"],
               "tokenizer.chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"})
    return kv


def spm_vocab() -> dict:
    pieces = [("<unk>", 2), ("<s>", 3), ("</s>", 3)] + [(f"<0x{b:02X}>", 6) for b in range(256)]
    pieces += [(p, 1) for p in ("\u2581", "a", "b", "c", "\u2581a", "ab", "\u2581ab", "bc", "h", "e", "l", "o")]
    pieces += [("<|user|>", 4)]
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": [p for p, _ in pieces],
            "tokenizer.ggml.scores": [0.0] * 259 + [-float(i) for i in range(len(pieces) - 259)],
            "tokenizer.ggml.token_type": [t for _, t in pieces], "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0,
            "tokenizer.ggml.add_space_prefix": True}


BASES = {"bpe": bpe_vocab(), "spm": spm_vocab()}
_TYPES = {"tokenizer.ggml.token_type": (VT.ARRAY, VT.INT32), "tokenizer.ggml.scores": (VT.ARRAY, VT.FLOAT32)}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz_tokenizers")
    for name, kv in BASES.items():     # warm up (imports, the Hugging Face BPE build) outside the measured cases
        _read(_write(d, kv))
    return d


_names = itertools.count()


def _write(d, kv: dict):
    meta = {"general.architecture": "llama", **kv}
    vts = {}
    for k, v in meta.items():
        if isinstance(v, list) and not v:
            vts[k] = _TYPES.get(k, (VT.ARRAY, VT.STRING))
        elif k in _TYPES and isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                                         and -2**31 <= x < 2**31 for x in v):
            vts[k] = _TYPES[k]
    return gguf.save(d / f"t{next(_names)}.gguf", meta, {"w": np.zeros(1, np.float32)}, value_types=vts)


def _read(path):
    f = gguf.load(path)
    gguf.check_tokenizer_metadata(f)
    tok = tokenizer.from_gguf(f)
    try:
        for text in TEXTS:
            for special in (True, False):
                try:
                    ids = tok.encode(text, add_special=special, parse_special=special)
                except ValueError:
                    continue        # a text this vocabulary cannot spell (no token for a byte)
                assert all(0 <= i < tok.n_vocab for i in ids), ids
                tok.decode(ids)
        tok.decode(range(tok.n_vocab), special=True)
        tok.decode(range(tok.n_vocab), special=False)
        s = tok.stream()
        for i in range(tok.n_vocab):
            s.push(i)
        s.flush()
        tok.is_eog(0)
    except Exception as e:
        raise AssertionError(f"{path}: the tokenizer was built but failed to run: {type(e).__name__}: {e}") from e
    return tok


def _case(d, path, test):
    size = path.stat().st_size
    try:
        # building a tokenizer has a fixed cost (regexes, tables) beyond what the file's size explains
        r = run_case(test, lambda: _read(path), (refimpl.LoadError,), input_bytes=size, mem_factor=256,
                     mem_slack=8 << 20)
        if isinstance(r, refimpl.LoadError):
            assert r.path == str(path) or str(path) in str(r), str(r)
        return r
    finally:
        path.unlink()


# -- hand-made cases ----------------------------------------------------------------------------------------

BAD = {   # id: (base, edits, message regex): each a GGUFError from check_tokenizer_metadata
    "tokens_not_strings": ("bpe", {"tokenizer.ggml.tokens": list(range(96))}, r"element 0 is 0 \(int\); expected an "
                                                                              r"array of strings"),
    "tokens_scalar": ("bpe", {"tokenizer.ggml.tokens": "abc"}, r"'abc'; expected an array of strings"),
    "tokens_empty": ("spm", {"tokenizer.ggml.tokens": [], "tokenizer.ggml.scores": [],
                             "tokenizer.ggml.token_type": []}, "expected a non-empty array of strings"),
    "token_type_short": ("bpe", {"tokenizer.ggml.token_type": [1] * 95}, "has 95 elements; expected 96"),
    "token_type_range": ("spm", {"tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * 12 + [7]},
                         r"element 271 is 7 \(int\); expected an array of integers in 0\.\.6"),
    "token_type_negative": ("bpe", {"tokenizer.ggml.token_type": [-1] * 96}, r"element 0 is -1"),
    "token_type_floats": ("bpe", {"tokenizer.ggml.token_type": [1.0] * 96}, r"element 0 is 1\.0 \(float\)"),
    "scores_long": ("spm", {"tokenizer.ggml.scores": [0.0] * 273}, "has 273 elements; expected 272"),
    "scores_strings": ("spm", {"tokenizer.ggml.scores": ["0"] * 272}, r"element 0 is '0' \(str\)"),
    "merges_ints": ("bpe", {"tokenizer.ggml.merges": [1, 2]}, r"element 0 is 1 \(int\); expected an array of strings"),
    "merges_scalar": ("bpe", {"tokenizer.ggml.merges": "Ġ Ġ"}, r"'Ġ Ġ'; expected an array of strings"),
    "bos_id_string": ("bpe", {"tokenizer.ggml.bos_token_id": "1"}, r"'1'; expected an integer token id"),
    "eos_id_float": ("spm", {"tokenizer.ggml.eos_token_id": 2.0}, r"2\.0; expected an integer token id"),
    "add_bos_int": ("bpe", {"tokenizer.ggml.add_bos_token": 1}, r"add_bos_token'.*1; expected a bool"),
    "model_int": ("bpe", {"tokenizer.ggml.model": 2}, r"'tokenizer\.ggml\.model': 2; expected a string"),
    "pre_list": ("bpe", {"tokenizer.ggml.pre": ["default"]}, r"\['default'\]; expected a string"),
    "chat_template_int": ("bpe", {"tokenizer.chat_template": 7}, r"7; expected a string \(a Jinja template\)"),
    "bpe_token_not_utf8": ("bpe", {"tokenizer.ggml.tokens": ["a\udc8a"] + bpe_vocab()["tokenizer.ggml.tokens"][1:]},
                           r"element 0 \('a\\udc8a'\) is not valid UTF-8"),
    "bpe_merge_not_utf8": ("bpe", {"tokenizer.ggml.merges": ["Ġ Ġ", "\udcff a"]}, r"element 1 .* is not valid UTF-8"),
}

TOLERATED = {   # id: (base, edits): accepted, as llama.cpp accepts them
    "bos_id_out_of_range": ("bpe", {"tokenizer.ggml.bos_token_id": 96}),        # ignored: the default is used
    "eos_id_huge": ("spm", {"tokenizer.ggml.eos_token_id": 2**32 - 1}),
    "merge_without_space": ("bpe", {"tokenizer.ggml.merges": ["ĠĠ", "", " ", "a  b", "zz qq"]}),
    "duplicate_tokens": ("spm", {"tokenizer.ggml.tokens": ["a"] * 272}),       # later duplicates win
    "no_merges": ("bpe", {"tokenizer.ggml.merges": None}),
    "no_token_type": ("bpe", {"tokenizer.ggml.token_type": None}),
    "no_scores": ("spm", {"tokenizer.ggml.scores": None}),
}

REFUSED_BY_TOKENIZER = {   # id: (base, edits, message): valid metadata that refimpl.tokenizer cannot run
    "model_unknown": ("bpe", {"tokenizer.ggml.model": "plamo2"}, "tokenizer model 'plamo2' is not supported"),
    "pre_unknown": ("bpe", {"tokenizer.ggml.pre": "nonesuch"}, "pre-tokenizer 'nonesuch' is not supported"),
}


def _edited(base: str, edits: dict) -> dict:
    kv = dict(BASES[base])
    for k, v in edits.items():
        if v is None:
            kv.pop(k, None)
        else:
            kv[k] = v
    return kv


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_tokenizer_metadata_is_a_ggufe(work, case):
    base, edits, message = BAD[case]
    path = _write(work, _edited(base, edits))
    r = _case(work, path, "tokenizers: hand-made malformed")
    assert isinstance(r, GGUFError), r
    assert str(r).startswith(f"{path}: metadata key '{next(iter(edits))}': ") and "expected" in str(r), str(r)
    import re
    assert re.search(message, str(r)), str(r)


@pytest.mark.parametrize("case", sorted(TOLERATED))
def test_tolerated_as_llama_cpp_does(work, case):
    base, edits = TOLERATED[case]
    r = _case(work, _write(work, _edited(base, edits)), "tokenizers: hand-made tolerated")
    assert not isinstance(r, Exception), r


@pytest.mark.parametrize("case", sorted(REFUSED_BY_TOKENIZER))
def test_unsupported_tokenizer_is_a_value_error(work, case):
    base, edits, message = REFUSED_BY_TOKENIZER[case]
    r = _case(work, _write(work, _edited(base, edits)), "tokenizers: hand-made unsupported")
    assert isinstance(r, ValueError) and message in str(r), r


# -- drawn edits --------------------------------------------------------------------------------------------

KEYS = ["tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.scores",
        "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
        "tokenizer.ggml.eot_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
        "tokenizer.ggml.add_space_prefix", "tokenizer.chat_template"]
SCALARS = st.sampled_from([None, 0, 1, 2, 3, 6, 7, -1, 95, 96, 271, 272, 2**31 - 1, 2**32 - 1, 2**40, 0.5, -1e9,
                           float("nan"), float("inf"), True, False, "", "gpt2", "llama", "bert", "rwkv", "t5",
                           "default", "smollm", "llama3", "qwen2", "x y", "\udcff"])
ELEMENTS = st.one_of(st.integers(-2, 8), st.sampled_from([2**31 - 1, -2**31]), st.floats(allow_nan=True, width=32),
                     st.booleans(), st.text(max_size=6),
                     st.sampled_from(["Ġ Ġ", "a b", " ", "", "<0x41>", "<|im_end|>", "\u2581", "h e", "ab c"]))


@st.composite
def array_value(draw, key, base):
    """An array for `key`: the base's with elements changed, cut, extended, or a new homogeneous array."""
    cur = BASES[base].get(key)
    kind = draw(st.sampled_from(["new", "cut", "extend", "change"] if isinstance(cur, list) else ["new"]))
    if kind == "new":
        elem = draw(ELEMENTS)
        return draw(st.lists(st.just(elem) | ELEMENTS.filter(lambda x, e=elem: type(x) is type(e)), max_size=300))
    v = list(cur)
    if kind == "cut":
        return v[:draw(st.integers(0, len(v)))]
    if kind == "extend":
        return v + [v[-1] if v else 0] * draw(st.integers(1, 3))
    for _ in range(draw(st.integers(1, 4))):
        if v:
            i = draw(st.integers(0, len(v) - 1))
            new = draw(ELEMENTS.filter(lambda x, e=v[i]: type(x) is type(e)))
            v[i] = new
    return v


@st.composite
def tokenizer_edits(draw):
    base = draw(st.sampled_from(sorted(BASES)))
    edits = {}
    for key in draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True)):
        edits[key] = draw(st.one_of(SCALARS, array_value(key, base)))
    return base, edits


@settings(max_examples=examples(500), deadline=None, suppress_health_check=list(HealthCheck))
@given(e=tokenizer_edits())
def test_drawn_tokenizer_edits(work, e):
    base, edits = e
    try:
        path = _write(work, _edited(base, edits))
    except ValueError:         # not storable in GGUF (mixed-type array): nothing to read
        return
    _case(work, path, "tokenizers: drawn metadata edits")


@st.composite
def byte_mutations(draw, n):
    out = []
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, n - 1))
        out.append((pos, draw(st.integers(0, 255))))
    return out


_FILES: dict = {}


@settings(max_examples=examples(300), deadline=None, suppress_health_check=list(HealthCheck))
@given(base=st.sampled_from(sorted(BASES)), muts=byte_mutations(4000), cut=st.none() | st.integers(0, 4000))
def test_drawn_byte_mutations_of_tokenizer_files(work, base, muts, cut):
    if base not in _FILES:
        _FILES[base] = _write(work, BASES[base]).read_bytes()
    b = bytearray(_FILES[base])
    for pos, v in muts:
        b[pos % len(b)] = v
    if cut is not None:
        del b[cut % len(b):]
    path = work / f"t{next(_names)}.gguf"
    path.write_bytes(bytes(b))
    _case(work, path, "tokenizers: drawn byte mutations")
