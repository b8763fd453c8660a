"""Hostile RWKV checkpoints (.safetensors and .npz of every version) and hostile token ids for decode.

A checkpoint case either loads and runs two tokens, or raises refimpl.LoadError (RWKVError) naming the file;
a decode case returns text or raises ValueError naming the id; nothing else, within `run_case`'s bounds.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import refimpl
from refimpl import gguf
from refimpl.models import rwkv

from ..models.rwkv_tiny import write_tiny_rwkv
from ..models.tiny import write_tiny_llama
from ._fuzz import examples, run_case

pytestmark = pytest.mark.property

VERSIONS = ["4", "5.2", "6", "7"]


def _load_and_run(p):
    with refimpl.backend("numpy"), np.errstate(all="ignore"):
        m = rwkv.load(p)
        out, _ = rwkv.forward(m, [1, 2], rwkv.new_state(m))      # damaged values may give any floats
    assert out.shape == (m.hparams.vocab,)
    return m


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz_rwkv")
    out = {}
    for v in VERSIONS:
        for ext in (".safetensors", ".npz"):
            p = write_tiny_rwkv(d / f"v{v}{ext}", v, n_layer=1, n_embd=32, head_size=16, vocab=64)
            out[(v, ext)] = p.read_bytes()
            _load_and_run(p)                                           # warm up outside the measured cases
    return out


@pytest.mark.parametrize("key", [(v, e) for v in VERSIONS for e in (".safetensors", ".npz")],
                         ids=lambda k: f"v{k[0]}{k[1]}")
def test_damaged_rwkv_checkpoints(bases, tmp_path, key):
    data = bases[key]
    hi = len(data) - 1

    @settings(max_examples=examples(60), deadline=None, suppress_health_check=list(HealthCheck))
    @given(kind=st.sampled_from(["truncate", "flip", "overwrite"]), pos=st.integers(0, hi),
           val=st.integers(0, 255), head=st.booleans())
    def check(kind, pos, val, head):
        if head:                                                       # the header / zip directory
            pos = pos % min(len(data), 512) if kind != "truncate" else pos
        b = bytearray(data)
        if kind == "truncate":
            b = b[:pos]
        elif kind == "flip":
            b[pos] ^= 1 << (val % 8)
        else:
            b[pos] = val
        p = tmp_path / f"c{key[1]}"
        p.write_bytes(bytes(b))
        r = run_case("rwkv checkpoints: damaged bytes", lambda: _load_and_run(p), (refimpl.LoadError,),
                     input_bytes=len(data), mem_factor=64, mem_slack=64 << 20, seconds=10.0)
        if isinstance(r, refimpl.LoadError):
            assert str(p) in str(r), r
    check()


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz_decode")
    return [refimpl.tokenizer.from_gguf(gguf.load(write_tiny_llama(d / "t.gguf")))]


@settings(max_examples=examples(300), deadline=None, suppress_health_check=list(HealthCheck))
@given(ids=st.lists(st.one_of(st.integers(-2**40, 2**40), st.integers(-3, 200)), max_size=6))
def test_decode_of_any_ids(tokenizers, ids):
    for tok in tokenizers:
        n = len(tok.tokens)
        r = run_case("decode: token ids", lambda: tok.decode(ids), (ValueError,), input_bytes=8 * len(ids) + 8)
        ok = all(0 <= i < n for i in ids)
        assert isinstance(r, str) if ok else (isinstance(r, ValueError) and "out of range" in str(r)), (ids, r)
