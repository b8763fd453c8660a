"""`llama.load` on inconsistent models: every bad hyper-parameter, vocabulary size, tensor shape or tensor type
is a ValueError that names the file and the key or tensor (shapes in ggml and NumPy order), raised at load;
a model that loads also runs. First one hand-made case per check, then Hypothesis edits of a tiny model's
metadata and tensors (a model that loads must then run `forward` without any exception).
"""
from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest
from gguf.constants import GGUFValueType as VT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import refimpl
from refimpl import QTensor, gguf
from refimpl.models import llama

from ..models.tiny import write_tiny_llama
from ._fuzz import examples, run_case

pytestmark = pytest.mark.property

DIMS = dict(n_vocab=96, n_embd=16, n_layer=1, n_head=4, n_head_kv=2, n_ff=24)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("model_validation")
    f = gguf.load(write_tiny_llama(d / "base.gguf", **DIMS))
    meta, vts = dict(f.metadata), dict(f.value_types)
    tensors = {k: (v if isinstance(v, QTensor) else np.array(v)) for k, v in f.tensors.items()}
    with refimpl.backend("numpy"):
        _load_and_run(d / "base.gguf")                 # warm up imports outside the measured cases
    return d, meta, vts, tensors


_names = itertools.count()


def _write(d, meta, vts, tensors):
    vts = {k: v for k, v in vts.items() if k in meta}
    for k, v in meta.items():               # a value whose type changed: let save infer it
        if k in vts and (isinstance(v, list) != isinstance(vts[k], tuple) or not _fits(v, vts[k])):
            del vts[k]
        if v == [] and k not in vts:
            vts[k] = (VT.ARRAY, VT.INT32)
    return gguf.save(d / f"m{next(_names)}.gguf", meta, tensors, value_types=vts)


def _fits(v, vt) -> bool:
    sub = vt[1] if isinstance(vt, tuple) else vt
    items = v if isinstance(v, list) else [v]
    if sub == VT.STRING:
        return all(isinstance(x, str) for x in items)
    if sub == VT.BOOL:
        return all(isinstance(x, bool) for x in items)
    if sub in (VT.FLOAT32, VT.FLOAT64):
        return all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in items)
    return all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**31 for x in items)


def _load_and_run(path):
    """Load (where every error must be raised), then run: a model that loads must run without any error."""
    m = llama.load(path)
    try:
        _run(m)
    except Exception as e:
        raise AssertionError(f"{path} loaded but failed to run: {type(e).__name__}: {e}") from e
    return m


def _run(m):
    hp = m.hparams
    with np.errstate(all="ignore"):
        logits = llama.forward(m, [0, 1, hp.n_vocab - 1], llama.new_cache(m, 4))
    assert logits.shape == (3, hp.n_vocab) and logits.dtype == np.float32


def _rng():
    return np.random.default_rng(1)


# -- one case per check -----------------------------------------------------------------------------------

def _f32(*shape):
    return _rng().standard_normal(shape).astype(np.float32)


CASES = {   # id: (metadata edits {key: value or None to delete}, tensor edits {name: array or None}, message regex)
    "missing_key": ({"llama.embedding_length": None}, {}, r"missing 'llama\.embedding_length'"),
    "missing_eps": ({"llama.attention.layer_norm_rms_epsilon": None}, {},
                    r"missing 'llama\.attention\.layer_norm_rms_epsilon'"),
    "missing_arch": ({"general.architecture": None}, {}, "no general.architecture"),
    "unknown_arch": ({"general.architecture": "gemma"}, {}, "'gemma' is not a llama-family model"),
    "head_count_not_dividing": ({"llama.attention.head_count": 5}, {},
                                "head_count 5 does not divide embedding_length 16"),
    "head_count_kv_not_dividing": ({"llama.attention.head_count_kv": 3}, {},
                                   "head_count_kv 3 does not divide head_count 4"),
    "head_count_zero": ({"llama.attention.head_count": 0}, {},
                        r"llama\.attention\.head_count is 0 \(int\); expected an integer >= 1"),
    "block_count_str": ({"llama.block_count": "1"}, {}, r"llama\.block_count is '1' \(str\); expected an integer"),
    "block_count_float": ({"llama.block_count": 1.5}, {}, r"llama\.block_count is 1\.5 \(float\)"),
    "block_count_list": ({"llama.block_count": [1]}, {}, r"llama\.block_count is \[1\] \(list\)"),
    "eps_nan": ({"llama.attention.layer_norm_rms_epsilon": float("nan")}, {},
                r"layer_norm_rms_epsilon is nan \(float\); expected a finite number >= 0"),
    "eps_str": ({"llama.attention.layer_norm_rms_epsilon": "1e-5"}, {}, r"layer_norm_rms_epsilon is '1e-5'"),
    "freq_base_zero": ({"llama.rope.freq_base": 0.0}, {}, r"rope\.freq_base is 0\.0 \(float\); expected a finite "
                                                          r"number > 0"),
    "rope_dims_odd": ({"llama.rope.dimension_count": 3}, {},
                      r"dimension_count is 3; expected an even number <= the head size 4"),
    "rope_dims_big": ({"llama.rope.dimension_count": 8}, {}, r"dimension_count is 8; expected an even number"),
    "scaling_factor_negative": ({"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": -2.0}, {},
                                r"rope\.scaling\.factor is -2\.0"),
    "scaling_unknown": ({"llama.rope.scaling.type": "longrope"}, {}, "'longrope' is not supported"),
    "ff_lengths_differ": ({"llama.feed_forward_length": [24, 32]}, {}, r"feed_forward_length is \[24, 32\]"),
    "ff_lengths_empty": ({"llama.feed_forward_length": []}, {}, r"feed_forward_length is \[\]"),
    "value_length": ({"llama.attention.value_length": 8}, {}, "value_length 8 differs from key_length 4"),
    "vocab_size_key": ({"llama.vocab_size": 97}, {},
                       r"'token_embd\.weight' has ne \[16, 96\] \(numpy \(96, 16\)\): 96 rows, but llama\.vocab_size "
                       r"gives a vocabulary of 97 tokens; expected ne \[16, 97\] \(numpy \(97, 16\)\)"),
    "vocab_tokens": ("drop_token", {}, r"96 rows, but tokenizer\.ggml\.tokens gives a vocabulary of 95 tokens"),
    "embd_missing": ({}, {"token_embd.weight": None}, r"tensor 'token_embd\.weight' is missing"),
    "embd_1d": ({}, {"token_embd.weight": _f32(96)}, r"'token_embd\.weight' has ne \[96\] \(numpy \(96,\)\); "
                                                    r"expected 2 dims"),
    "embd_width": ({}, {"token_embd.weight": _f32(96, 12)},
                   r"'token_embd\.weight' has ne \[12, 96\] \(numpy \(96, 12\)\), expected ne \[16, 96\]"),
    "q_shape": ({}, {"blk.0.attn_q.weight": _f32(12, 16)},
                r"'blk\.0\.attn_q\.weight' has ne \[16, 12\] \(numpy \(12, 16\)\), expected ne \[16, 16\] "
                r"\(numpy \(16, 16\)\)"),
    "k_transposed": ({}, {"blk.0.attn_k.weight": _f32(16, 8)},
                     r"'blk\.0\.attn_k\.weight' has ne \[8, 16\] \(numpy \(16, 8\)\), expected ne \[16, 8\] "
                     r"\(numpy \(8, 16\)\)"),
    "ffn_down_shape": ({}, {"blk.0.ffn_down.weight": _f32(16, 20)}, r"'blk\.0\.ffn_down\.weight' has ne \[20, 16\]"),
    "missing_tensor": ({}, {"blk.0.ffn_up.weight": None}, r"'blk\.0\.ffn_up\.weight' is missing; expected "
                                                          r"ne \[16, 24\] \(numpy \(24, 16\)\)"),
    "missing_output_norm": ({}, {"output_norm.weight": None}, r"'output_norm\.weight' is missing"),
    "output_shape": ({}, {"output.weight": _f32(95, 16)}, r"'output\.weight' has ne \[16, 95\] \(numpy \(95, 16\)\)"),
    "norm_f16": ({}, {"blk.0.attn_norm.weight": _f32(16).astype(np.float16)},
                 r"'blk\.0\.attn_norm\.weight' has type f16; expected f32"),
    "norm_2d": ({}, {"blk.0.ffn_norm.weight": _f32(1, 16)}, r"'blk\.0\.ffn_norm\.weight' has ne \[16, 1\]"),
    "matrix_i32": ({}, {"blk.0.attn_v.weight": np.zeros((8, 16), np.int32)},
                   r"'blk\.0\.attn_v\.weight' has type i32; expected F32, F16, BF16 or a block type"),
    "matrix_q8_1": ({}, {"blk.0.attn_output.weight": QTensor(refimpl.GGMLType.Q8_1, np.zeros((16, 36), np.uint8),
                                                             (16, 32))},
                    r"'blk\.0\.attn_output\.weight' has ne \[32, 16\]"),
    "partial_bias": ({}, {"blk.0.attn_q.bias": _f32(16)},
                     r"'blk\.0\.attn_q\.bias' is present but 'blk\.0\.attn_k\.bias' is missing"),
    "bias_shape": ({}, {"blk.0.attn_q.bias": _f32(16), "blk.0.attn_k.bias": _f32(16), "blk.0.attn_v.bias": _f32(8)},
                   r"'blk\.0\.attn_k\.bias' has ne \[16\] \(numpy \(16,\)\), expected ne \[8\]"),
    "token_type_range": ({"tokenizer.ggml.token_type": [1] * 95 + [9]}, {},
                         r"'tokenizer\.ggml\.token_type': element 95 is 9 \(int\); expected an array of integers in "
                         r"0\.\.6"),
}


def _edit(base, meta_edits, tensor_edits):
    d, meta, vts, tensors = base
    meta, tensors = dict(meta), dict(tensors)
    if meta_edits == "drop_token":
        meta["tokenizer.ggml.tokens"] = meta["tokenizer.ggml.tokens"][:-1]
        meta["tokenizer.ggml.token_type"] = meta["tokenizer.ggml.token_type"][:-1]
        meta.pop("llama.vocab_size")
        meta_edits = {}
    for k, v in meta_edits.items():
        if v is None:
            meta.pop(k, None)
        else:
            meta[k] = v
    for k, v in tensor_edits.items():
        if v is None:
            tensors.pop(k, None)
        else:
            tensors[k] = v
    return _write(d, meta, vts, tensors)


def test_base_model_loads_and_runs(base):
    with refimpl.backend("numpy"):
        m = _load_and_run(_edit(base, {}, {}))
    assert m.hparams.n_vocab == 96 and m.hparams.head_dim == 4


@pytest.mark.parametrize("case", sorted(CASES))
def test_inconsistent_model_is_a_clear_error(base, case):
    meta_edits, tensor_edits, message = CASES[case]
    path = _edit(base, meta_edits, tensor_edits)
    with refimpl.backend("numpy"), pytest.raises(ValueError) as e:
        _load_and_run(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: "), msg
    assert re.search(message, msg), msg
    assert "expected" in msg or "missing" in msg or "not " in msg, msg


# -- drawn edits --------------------------------------------------------------------------------------------

HPARAM_KEYS = ["llama.embedding_length", "llama.attention.head_count", "llama.attention.head_count_kv",
               "llama.block_count", "llama.feed_forward_length", "llama.attention.layer_norm_rms_epsilon",
               "llama.rope.freq_base", "llama.rope.dimension_count", "llama.vocab_size", "llama.context_length",
               "llama.attention.key_length", "llama.attention.value_length", "llama.rope.scaling.type",
               "llama.rope.scaling.factor", "general.architecture"]
VALUES = [None, 0, 1, 2, 3, 4, 5, 8, 12, 16, 24, 32, 95, 96, 97, -1, 2**31, 2**40, 1.5, 1e-5, 0.0, -1.0,
          float("nan"), float("inf"), "x", "linear", "llama", "qwen2", "none", [], [24], [24, 24], [1, 2], True]
TENSORS = ["token_embd.weight", "output.weight", "output_norm.weight", "blk.0.attn_norm.weight",
           "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.0.attn_output.weight",
           "blk.0.ffn_norm.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight",
           "blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias", "blk.1.attn_q.weight"]


def _tensor_variant(name, how, tensors):
    t = tensors.get(name)
    shape = tuple(t.shape) if t is not None else ((16,) if name.endswith("bias") else (16, 16))
    rng = _rng()
    if how == "delete":
        return None
    if how == "transpose":
        return rng.standard_normal(shape[::-1]).astype(np.float32)
    if how == "shrink":
        return rng.standard_normal((max(1, shape[0] - 1),) + shape[1:]).astype(np.float32)
    if how == "flat":
        return rng.standard_normal((math.prod(shape),)).astype(np.float32)
    if how == "f16":
        return rng.standard_normal(shape).astype(np.float16)
    if how == "i32":
        return np.ones(shape, np.int32)
    if how == "q8_0" and shape[-1] % 32 == 0:
        return refimpl.quantize(rng.standard_normal(shape).astype(np.float32), "q8_0")
    return rng.standard_normal(shape).astype(np.float32)          # "f32", or q8_0 of a short row


edits = st.tuples(
    st.lists(st.tuples(st.sampled_from(HPARAM_KEYS), st.sampled_from(VALUES)), max_size=3),
    st.lists(st.tuples(st.sampled_from(TENSORS),
                       st.sampled_from(["delete", "transpose", "shrink", "flat", "f16", "i32", "q8_0", "f32"])),
             max_size=2))


@settings(max_examples=examples(300), deadline=None, suppress_health_check=list(HealthCheck))
@given(e=edits)
def test_drawn_edits_load_and_run_or_raise_value_error(base, e):
    meta_edits, tensor_edits = e
    d, meta, vts, tensors = base
    path = _edit(base, dict(meta_edits), {n: _tensor_variant(n, how, tensors) for n, how in tensor_edits})
    size = path.stat().st_size
    with refimpl.backend("numpy"):
        r = run_case("model validation: drawn edits", lambda: _load_and_run(path), (ValueError,),
                     input_bytes=size, mem_factor=256)
    if isinstance(r, ValueError):
        assert str(r).startswith(f"{path}: "), str(r)
    path.unlink()
