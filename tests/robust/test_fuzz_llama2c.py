"""Hostile llama2.c files: checkpoints (versions 0, 1, 2; shared or separate classifier) and tokenizer.bin.

Every case either loads, and then runs (`llama.forward` on two tokens; encode and decode for a tokenizer),
or raises `llama2c.Llama2cError` naming the file; nothing else, within 64 x the file size + 1 MiB of peak
allocation and a few seconds. Header fields get the values that break readers (0, -1, INT32_MIN/MAX, off
by one, doubled), files are truncated at every header byte, then Hypothesis draws bit flips, byte
overwrites, insertions, deletions and truncations.
"""
from __future__ import annotations

import itertools
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import refimpl
from refimpl.models import llama, llama2c
from refimpl.models.llama2c import Llama2cError

from ..models.test_llama2c import PIECES, SCORES, V, random_weights, write_checkpoint, write_tokenizer
from ._fuzz import examples, run_case

pytestmark = pytest.mark.property

CFG = dict(dim=8, hidden_dim=12, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=V, seq_len=4)
BASES = [(0, False), (0, True), (1, False), (1, True), (2, False), (2, True)]   # (version, shared)


def _checkpoint_bytes(tmp, version: int, shared: bool) -> bytes:
    p = tmp / f"v{version}{'s' if shared else 'c'}.bin"
    write_checkpoint(p, CFG, random_weights(CFG, seed=version, shared=shared), version, shared, group_size=4)
    return p.read_bytes()


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz_llama2c")
    bases = {vs: _checkpoint_bytes(d, *vs) for vs in BASES}
    tok = d / "tokenizer.bin"
    write_tokenizer(tok, PIECES, SCORES)
    with refimpl.backend("numpy"):           # warm up (imports, first calls) outside the measured cases
        for vs, b in bases.items():
            (d / "warm.bin").write_bytes(b)
            _run_checkpoint(d / "warm.bin", tok)
        _run_tokenizer(tok, V)
    return d, bases, tok.read_bytes()


def header_fields(version: int) -> list[tuple[int, int, str]]:
    """(offset, width, name) of the header fields of a checkpoint of this version."""
    base = 0 if version == 0 else 8
    fields = [(base + 4 * i, 4, name) for i, name in enumerate(llama2c.CONFIG_FIELDS)]
    if version:
        fields += [(0, 4, "magic"), (4, 4, "version"), (36, 1, "shared_classifier")]
    if version == 2:
        fields.append((37, 4, "group_size"))
    return fields


def special_values(data: bytes, field) -> list[int]:
    off, w, name = field
    if w == 1:
        return [0, 1, 2, 255]
    (v,) = struct.unpack_from("<i", data, off)
    vals = {0, 1, -1, 2, 3, 4, -2**31, 2**31 - 1, v - 1, v + 1, 2 * v, -v, v // 2, 2**16, 2**30}
    if name == "version":
        vals |= {0, 1, 2, 3}
    if name == "magic":
        vals |= {0, llama2c.MAGIC ^ 1, int.from_bytes(b"GGUF", "little")}
    return sorted(x for x in vals if -2**31 <= x < 2**31)


def apply(base: bytes, muts) -> bytes:
    b = bytearray(base)
    for m in muts:
        kind, pos = m[0], m[1]
        if kind == "truncate":
            del b[pos % (len(b) + 1):]
        elif not b:
            continue
        elif kind == "flip":
            b[pos % len(b)] ^= 1 << m[2]
        elif kind == "byte":
            b[pos % len(b)] = m[2]
        elif kind == "insert":
            p = pos % (len(b) + 1)
            b[p:p] = m[2]
        elif kind == "delete":
            p = pos % len(b)
            del b[p:p + m[2]]
        elif kind == "field":
            off, w, v = m[1], m[2], m[3]
            if off + w <= len(b):
                b[off:off + w] = (v % (1 << (8 * w))).to_bytes(w, "little")
    return bytes(b)


# -- one case -----------------------------------------------------------------------------------------------

def _run_checkpoint(path, tokenizer_path):
    model = llama2c.load(path, tokenizer_path)
    hp = model.hparams
    with np.errstate(all="ignore"):
        logits = llama.forward(model, [1, 2 % hp.n_vocab], llama.new_cache(model, 4))
    assert logits.shape == (2, hp.n_vocab)
    return model


def _run_tokenizer(path, n_vocab):
    tok = llama2c.load_tokenizer(path, n_vocab)
    try:
        ids = tok.encode("ab c\u00fc\u4e2d")
    except Llama2cError:
        raise
    except ValueError:           # the vocabulary lacks what encoding needs (' ', a byte token): not a file error
        ids = []
    tok.decode(ids)
    tok.decode(range(tok.n_vocab), special=True)
    return tok


_names = itertools.count()


def _case(d, data: bytes, test: str, run):
    path = d / f"case{next(_names)}.bin"
    path.write_bytes(data)
    try:
        with refimpl.backend("numpy"):
            r = run_case(test, lambda: run(path), (Llama2cError,), input_bytes=len(data))
        if isinstance(r, Llama2cError):
            assert r.path == str(path) and str(r).startswith(f"{path}: "), str(r)
        return r
    finally:
        path.unlink()


def check_checkpoint(work, data: bytes, test: str):
    d, _, tok = work
    return _case(d, data, test, lambda p: _run_checkpoint(p, d / "tokenizer.bin"))


def check_tokenizer(work, data: bytes, test: str, n_vocab=V):
    d, _, _ = work
    return _case(d, data, test, lambda p: _run_tokenizer(p, n_vocab))


# -- checkpoints --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("vs", BASES, ids=lambda vs: f"v{vs[0]}-{'shared' if vs[1] else 'separate'}")
def test_checkpoint_header_fields_at_breaking_values(work, vs):
    _, bases, _ = work
    base = bases[vs]
    assert not isinstance(check_checkpoint(work, base, "llama2c: base checkpoints"), Exception)
    for field in header_fields(vs[0]):
        for v in special_values(base, field):
            check_checkpoint(work, apply(base, [("field", field[0], field[1], v)]),
                             "llama2c: header field x breaking value")


@pytest.mark.parametrize("vs", BASES, ids=lambda vs: f"v{vs[0]}-{'shared' if vs[1] else 'separate'}")
def test_checkpoint_truncated(work, vs):
    """Cut at every byte of the header and at every 61st byte after it: always an error."""
    _, bases, _ = work
    base = bases[vs]
    cuts = [*range(0, 300), *range(300, len(base), 61), len(base) - 1]
    for n in cuts:
        r = check_checkpoint(work, base[:n], "llama2c: truncation")
        assert isinstance(r, Llama2cError), n


def test_sizes_cannot_overflow_into_a_match(work):
    """Header fields whose product overflows int64 must not wrap into the file's size."""
    _, bases, _ = work
    base = bytearray(bases[(1, True)])
    struct.pack_into("<7i", base, 8, 2**30, 2**30, 2**30, 2**1, 2**1, 2**30, 2**30)
    r = check_checkpoint(work, bytes(base), "llama2c: overflowing sizes")
    assert isinstance(r, Llama2cError) and "does not match the header" in str(r)


def test_gguf_given_as_a_checkpoint(work, tmp_path):
    from refimpl import gguf
    p = gguf.save(tmp_path / "m.gguf", {"general.architecture": "llama"}, {"w": np.zeros(4, np.float32)})
    for data, check in ((p.read_bytes(), check_checkpoint), (p.read_bytes(), check_tokenizer)):
        r = check(work, data, "llama2c: a GGUF instead")
        assert isinstance(r, Llama2cError) and "GGUF" in str(r) and r.field == "magic"


def _mutation(n: int):
    pos = st.integers(0, n)
    head = st.integers(0, 300)                 # most of the interesting bytes are in the header
    return st.one_of(
        st.tuples(st.just("truncate"), pos),
        st.tuples(st.just("flip"), head | pos, st.integers(0, 7)),
        st.tuples(st.just("byte"), head | pos, st.integers(0, 255)),
        st.tuples(st.just("field"), st.sampled_from(range(0, 44, 4)), st.just(4),
                  st.sampled_from([0, 1, -1, 2, 8, 12, 2**31 - 1, -2**31]) | st.integers(-2**31, 2**31 - 1)),
        st.tuples(st.just("insert"), head | pos, st.binary(min_size=1, max_size=8)),
        st.tuples(st.just("delete"), head | pos, st.integers(1, 8)),
    )


@settings(max_examples=examples(600), deadline=None, suppress_health_check=list(HealthCheck))
@given(vs=st.sampled_from(BASES), muts=st.lists(_mutation(25000), min_size=1, max_size=3))
def test_checkpoint_drawn_mutations(work, vs, muts):
    _, bases, _ = work
    check_checkpoint(work, apply(bases[vs], muts), "llama2c: drawn checkpoint mutations")


# -- tokenizer.bin ------------------------------------------------------------------------------------------

def tokenizer_fields(data: bytes) -> list[tuple[int, int, str]]:
    fields = [(0, 4, "max_token_length")]
    off, i = 4, 0
    while off < len(data):
        fields += [(off, 4, f"score {i}"), (off + 4, 4, f"length {i}")]
        (n,) = struct.unpack_from("<i", data, off + 4)
        off += 8 + n
        i += 1
    return fields


def test_tokenizer_fields_at_breaking_values(work):
    _, _, tok = work
    assert not isinstance(check_tokenizer(work, tok, "llama2c tokenizer: base"), Exception)
    fields = tokenizer_fields(tok)
    picked = fields[:12] + fields[12::37] + fields[-4:]        # the first tokens, a sample, the last
    for off, w, name in picked:
        (v,) = struct.unpack_from("<i", tok, off)
        if name.startswith("score"):
            vals = [0x7FC00000, 0x7F800000, 0xFF800000, 0xCE6E6B28]   # NaN, inf, -inf, -1e9 as f32 bits
        else:
            vals = [0, 1, -1, v + 1, v - 1, 2**31 - 1, -2**31, 2**20, 2**20 + 1, len(tok)]
        for x in vals:
            check_tokenizer(work, apply(tok, [("field", off, w, x)]), "llama2c tokenizer: field x breaking value")


def test_tokenizer_truncated_and_vocab_mismatch(work):
    _, _, tok = work
    for n in [*range(0, 64), *range(64, len(tok), 53)]:
        check_tokenizer(work, tok[:n], "llama2c tokenizer: truncation")
    for n_vocab in (None, 0, 3, V - 1, V + 1, 2**31):
        r = check_tokenizer(work, tok, "llama2c tokenizer: vocab size", n_vocab=n_vocab)
        assert isinstance(r, Llama2cError) == (n_vocab not in (None,)), (n_vocab, r)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=list(HealthCheck))
@given(muts=st.lists(_mutation(2500), min_size=1, max_size=3), known_vocab=st.booleans())
def test_tokenizer_drawn_mutations(work, muts, known_vocab):
    _, _, tok = work
    check_tokenizer(work, apply(tok, muts), "llama2c tokenizer: drawn mutations", n_vocab=V if known_vocab else None)
