"""refimpl.gguf against gguf.GGUFReader, round trips, and one malformed file per GGUFError case.

GGUFReader is the independent reading of the format: every key's value and value type and every tensor's
name, type, ne, offset and bytes must agree with it, on generated files (every value type, every ggml
type, 0-D to 4-D, custom alignments) and on the real SmolLM2 file when it is cached. Timing and memory
are measured by benchmarks/gguf_load.py, not here.
"""
from __future__ import annotations

import filecmp
import math
import mmap
import os
import struct
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter
from gguf.constants import GGMLQuantizationType, GGUFValueType as VT
from hypothesis import given
from hypothesis import strategies as st

import refimpl
from refimpl import QTensor
from refimpl.gguf import GGUFError, load, save
from refimpl.types import NUMPY_DTYPES, GGMLType, traits, type_traits
from tests._oracles import require_oracle

from ._models import SMOLLM2_FILE, missing_reason, smollm2_path

pytestmark = pytest.mark.property

needs_smollm2 = pytest.mark.skipif(smollm2_path() is None, reason=missing_reason(SMOLLM2_FILE))

INT_TYPES = {VT.UINT8: np.uint8, VT.INT8: np.int8, VT.UINT16: np.uint16, VT.INT16: np.int16,
             VT.UINT32: np.uint32, VT.INT32: np.int32, VT.UINT64: np.uint64, VT.INT64: np.int64}


# -- GGUFReader's view of a file ------------------------------------------------------------------------

def reader_view(path):
    """(metadata {key: value}, value_types {key: type}, tensors [(name, type, ne, offset, bytes)]) per GGUFReader.

    Tensor bytes are cut from the reader's own map at its data offset with ggml's size, because the
    reader's n_bytes comes from gguf's size table (40 bytes per Q8_1 block where ggml has 36).
    """
    r = GGUFReader(path)
    meta, types = {}, {}
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue
        if f.types[0] == VT.ARRAY:   # the element type is stored even for an empty array
            types[key] = (VT.ARRAY, VT(int(f.parts[3][0])))
        else:
            types[key] = f.types[0]
        meta[key] = f.contents()
    tensors = []
    for t in r.tensors:
        tr = traits(t.tensor_type)
        ne = tuple(int(d) for d in t.shape)
        nbytes = math.prod(ne) // tr.blck_size * tr.type_size
        tensors.append((t.name, GGMLType(t.tensor_type), ne, t.data_offset - r.data_offset,
                        bytes(r.data[t.data_offset:t.data_offset + nbytes])))
    return meta, types, tensors, r


def tensor_bytes(x) -> bytes:
    return x.tobytes() if isinstance(x, QTensor) else np.ascontiguousarray(x).tobytes()


def assert_matches_reader(path):
    """refimpl.gguf.load(path) agrees with GGUFReader on every key and tensor."""
    f = load(path)
    meta, types, tensors, r = reader_view(path)
    assert list(f.metadata) == list(meta)
    for key in meta:
        assert f.value_types[key] == types[key], key
        assert f.metadata[key] == meta[key], key
        assert type(f.metadata[key]) is type(meta[key]), key
    assert [t[0] for t in tensors] == list(f.tensors)
    assert f.data_offset == r.data_offset and f.alignment == r.alignment
    for name, t, ne, offset, raw in tensors:
        info = f.tensor_info[name]
        assert (info.type, info.ne, info.offset, info.file_offset) == (t, ne, offset, offset + r.data_offset), name
        x = f.tensors[name]
        assert tuple(x.shape) == ne[::-1], name
        assert tensor_bytes(x) == raw, name
        if t in NUMPY_DTYPES:
            assert isinstance(x, np.ndarray) and x.dtype == NUMPY_DTYPES[t], name
        else:
            assert isinstance(x, QTensor) and x.type == t, name
    return f


def assert_same_tensors(a: dict, b: dict):
    assert list(a) == list(b)
    for name in a:
        x, y = a[name], b[name]
        if isinstance(x, QTensor):
            assert isinstance(y, QTensor) and x == y, name
        else:
            y = np.asarray(y)
            assert isinstance(x, np.ndarray) and x.dtype == y.dtype and x.shape == y.shape, name
            assert x.tobytes() == y.tobytes(), name   # bit identity, NaN payloads and -0.0 included


# -- generated content ----------------------------------------------------------------------------------

def all_value_types_metadata():
    """(metadata, value_types): every scalar type at its limits, arrays of each type, empty arrays and strings."""
    f32 = lambda v: float(np.float32(v))
    meta, vts = {"general.architecture": "llama"}, {"general.architecture": VT.STRING}
    for vt, dt in INT_TYPES.items():
        info = np.iinfo(dt)
        for tag, v in (("min", int(info.min)), ("max", int(info.max)), ("one", 1)):
            meta[f"test.{vt.name.lower()}.{tag}"], vts[f"test.{vt.name.lower()}.{tag}"] = v, vt
        meta[f"test.arr.{vt.name.lower()}"] = [int(info.min), 0, 1, int(info.max)]
        vts[f"test.arr.{vt.name.lower()}"] = (VT.ARRAY, vt)
    scalars = {
        "test.f32": (f32(0.1), VT.FLOAT32), "test.f32.neg": (-1.25, VT.FLOAT32),
        "test.f32.inf": (float("-inf"), VT.FLOAT32), "test.f32.tiny": (f32(1e-45), VT.FLOAT32),
        "test.f64": (0.1, VT.FLOAT64), "test.f64.big": (1e300, VT.FLOAT64),
        "test.bool.true": (True, VT.BOOL), "test.bool.false": (False, VT.BOOL),
        "test.str": ("hello", VT.STRING), "test.str.empty": ("", VT.STRING),
        "test.str.unicode": ("héllo ✓ 🦙 日本語\n\t\"quoted\"", VT.STRING),
        "tokenizer.chat_template": ("{% for m in messages %}{{ m['content'] }}{% endfor %}", VT.STRING),
        "test.arr.f32": ([0.5, -2.0, f32(3.3), float("inf")], (VT.ARRAY, VT.FLOAT32)),
        "test.arr.f64": ([0.1, -1e-300, 2.0], (VT.ARRAY, VT.FLOAT64)),
        "test.arr.bool": ([True, False, True], (VT.ARRAY, VT.BOOL)),
        "test.arr.str": (["a", "", "ü🦙", " Ġthe", "x" * 1000], (VT.ARRAY, VT.STRING)),
    }
    for key, (v, vt) in scalars.items():
        meta[key], vts[key] = v, vt
    for vt in list(INT_TYPES) + [VT.FLOAT32, VT.FLOAT64, VT.BOOL, VT.STRING]:
        meta[f"test.empty.{vt.name.lower()}"], vts[f"test.empty.{vt.name.lower()}"] = [], (VT.ARRAY, vt)
    return meta, vts


def make_tensor(t: GGMLType, shape, rng):
    """A tensor of ggml type t in NumPy shape `shape`: refimpl.quantize where it can, else random blocks."""
    if t in NUMPY_DTYPES:
        dt = NUMPY_DTYPES[t]
        if dt.kind == "f":
            return rng.standard_normal(shape).astype(dt)
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
    try:
        return refimpl.quantize(rng.standard_normal(shape).astype(np.float32), t)
    except Exception:  # noqa: BLE001 -- no reference quantizer for the type: random blocks instead (below)
        # no reference quantizer (imatrix-only types, or one still being written): GGUF only moves the
        # bytes, so random blocks exercise it just as well
        tr = traits(t)
        rb = shape[-1] // tr.blck_size * tr.type_size
        raw = rng.integers(0, 256, size=tuple(shape[:-1]) + (rb,), dtype=np.uint8)
        return QTensor(t, raw, shape)


# types the other readers know: gguf-py 0.19.0 and ggml 0.15.3 (ggml-python) have no Q2_0 (ggml 0.25.3)
OLDER_READERS = [t for t in type_traits if t != GGMLType.Q2_0]


def all_types_tensors(seed=0, types=None):
    """One tensor of every ggml type (or of `types`), cycling through 1-D..4-D shapes (Q8_1 first: see
    reader_view)."""
    rng = np.random.default_rng(seed)
    order = sorted(types or type_traits, key=lambda t: (t != GGMLType.Q8_1, int(t)))
    out = {}
    for i, t in enumerate(order):
        blck = traits(t).blck_size
        ne = [(blck * 2 if blck > 1 else 7), 3, 2, 2][: 1 + i % 4]
        out[f"t{i}.{traits(t).name}"] = make_tensor(t, tuple(reversed(ne)), rng)
    return out


# -- generated files vs GGUFReader ----------------------------------------------------------------------

@pytest.mark.parametrize("alignment", [32, 1, 8, 64, 4096])
def test_generated_file_matches_gguf_reader(tmp_path, alignment):
    meta, vts = all_value_types_metadata()
    tensors = all_types_tensors(types=OLDER_READERS)
    path = save(tmp_path / "all.gguf", meta, tensors, alignment=alignment, value_types=vts)
    f = assert_matches_reader(path)
    assert f.alignment == alignment and f.version == 3 and f.arch == "llama"
    for name, info in f.tensor_info.items():
        assert info.offset % alignment == 0 and info.shape == f.tensors[name].shape


def test_generated_file_round_trips(tmp_path):
    meta, vts = all_value_types_metadata()
    tensors = all_types_tensors(seed=1)
    p1 = save(tmp_path / "a.gguf", meta, tensors, alignment=64, value_types=vts)
    f = load(p1)
    want_meta = dict(meta, **{"general.alignment": 64})   # a custom alignment is recorded as a key
    assert f.metadata == want_meta
    assert all(f.value_types[k] == vts[k] for k in meta) and f.value_types["general.alignment"] == VT.UINT32
    assert_same_tensors(f.tensors, tensors)
    # save(load(x)) writes the same bytes
    p2 = save(tmp_path / "b.gguf", f.metadata, f.tensors, value_types=f.value_types)
    assert filecmp.cmp(p1, p2, shallow=False)


def test_file_from_plain_gguf_writer(tmp_path):
    """A file written by gguf.GGUFWriter alone (not refimpl.gguf.save) reads the same as with GGUFReader."""
    rng = np.random.default_rng(2)
    path = tmp_path / "w.gguf"
    w = GGUFWriter(path, arch="bert")
    w.add_custom_alignment(16)
    w.add_uint32("bert.block_count", 3)
    w.add_float32("bert.attention.layer_norm_epsilon", 1e-12)
    w.add_bool("bert.attention.causal", False)
    w.add_array("tokenizer.ggml.tokens", ["[PAD]", "[UNK]", "hello", "##ing"])
    w.add_array("tokenizer.ggml.token_type", [3, 2, 1, 1])
    w.add_int64("test.i64", -(2**40))
    w.add_uint8("test.u8", 255)
    w.add_float64("test.f64", math.pi)
    w.add_tensor("f32", rng.standard_normal((5, 3)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 3, 4, 5)).astype(np.float16))
    w.add_tensor("i32", np.arange(6, dtype=np.int32))
    q = make_tensor(GGMLType.Q4_0, (3, 64), rng)
    w.add_tensor("q4_0", q.data, raw_dtype=GGMLQuantizationType.Q4_0)
    k = make_tensor(GGMLType.Q6_K, (2, 256), rng)
    w.add_tensor("q6_k", k.data, raw_dtype=GGMLQuantizationType.Q6_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = assert_matches_reader(path)
    assert f.alignment == 16 and f.value_types["tokenizer.ggml.token_type"] == (VT.ARRAY, VT.INT32)
    assert f.tensors["q4_0"] == q and f.tensors["q6_k"] == k
    assert f.tensors["f16"].shape == (2, 3, 4, 5) and f.tensor_info["f16"].ne == (5, 4, 3, 2)


def test_zero_dim_tensor(tmp_path):
    path = save(tmp_path / "s.gguf", {}, {"s": np.array(2.5, np.float32), "v": np.ones(3, np.int8)})
    f = assert_matches_reader(path)
    assert f.tensors["s"].shape == () and f.tensors["s"] == 2.5 and f.tensor_info["s"].ne == ()


# -- ggml's own reader (ggml-python, optional) ----------------------------------------------------------

_GGML_SCALAR = {VT.UINT8: "u8", VT.INT8: "i8", VT.UINT16: "u16", VT.INT16: "i16", VT.UINT32: "u32",
                VT.INT32: "i32", VT.FLOAT32: "f32", VT.UINT64: "u64", VT.INT64: "i64", VT.FLOAT64: "f64",
                VT.BOOL: "bool", VT.STRING: "str"}


def ggml_view(path):
    """What ggml's gguf_init_from_file reads: header facts, {key: (type, value)}, [(name, type, offset, size)]."""
    import ctypes
    g = require_oracle("ggml", "ggml-python, the ggml oracle,")
    ctx = g.gguf_init_from_file(str(path).encode(), g.gguf_init_params(no_alloc=True, ctx=None))
    assert ctx, f"ggml refused {path}"
    try:
        kv = {}
        for i in range(g.gguf_get_n_kv(ctx)):
            key, t = g.gguf_get_key(ctx, i).decode(), VT(g.gguf_get_kv_type(ctx, i))
            if t != VT.ARRAY:
                v = getattr(g, f"gguf_get_val_{_GGML_SCALAR[t]}")(ctx, i)
                kv[key] = (t, v.decode() if t == VT.STRING else v)
                continue
            et, n = VT(g.gguf_get_arr_type(ctx, i)), g.gguf_get_arr_n(ctx, i)
            if et == VT.STRING:
                v = [g.gguf_get_arr_str(ctx, i, j).decode() for j in range(n)]
            else:
                dt = np.dtype({VT.BOOL: "i1", VT.FLOAT32: "<f4", VT.FLOAT64: "<f8"}.get(et) or INT_TYPES[et])
                raw = ctypes.string_at(g.gguf_get_arr_data(ctx, i), n * dt.itemsize) if n else b""
                a = np.frombuffer(raw, dt)
                v = ((a != 0) if et == VT.BOOL else a).tolist()
            kv[key] = ((VT.ARRAY, et), v)
        tensors = [(g.gguf_get_tensor_name(ctx, i).decode(), GGMLType(g.gguf_get_tensor_type(ctx, i)),
                    g.gguf_get_tensor_offset(ctx, i), g.gguf_get_tensor_size(ctx, i))
                   for i in range(g.gguf_get_n_tensors(ctx))]
        head = (g.gguf_get_version(ctx), g.gguf_get_alignment(ctx), g.gguf_get_data_offset(ctx))
        return head, kv, tensors
    finally:
        g.gguf_free(ctx)


@pytest.mark.oracle
@pytest.mark.parametrize("alignment", [32, 1, 64])
def test_ggml_reads_generated_files_alike(tmp_path, alignment):
    """ggml's C reader accepts what save writes (every value and tensor type) and sees what load sees."""
    meta, vts = all_value_types_metadata()
    path = save(tmp_path / "g.gguf", meta, all_types_tensors(seed=6, types=OLDER_READERS), alignment=alignment,
                value_types=vts)
    f = load(path)
    head, kv, tensors = ggml_view(path)
    assert head == (f.version, f.alignment, f.data_offset)
    assert kv == {k: (f.value_types[k], f.metadata[k]) for k in f.metadata}
    assert tensors == [(i.name, i.type, i.offset, i.nbytes) for i in f.tensor_info.values()]


@pytest.mark.oracle
@needs_smollm2
def test_ggml_reads_smollm2_alike():
    f = load(smollm2_path())
    head, kv, tensors = ggml_view(smollm2_path())
    assert head == (f.version, f.alignment, f.data_offset)
    assert kv == {k: (f.value_types[k], f.metadata[k]) for k in f.metadata}
    assert tensors == [(i.name, i.type, i.offset, i.nbytes) for i in f.tensor_info.values()]


# -- the real file --------------------------------------------------------------------------------------

@needs_smollm2
def test_smollm2_matches_gguf_reader():
    f = assert_matches_reader(smollm2_path())
    assert f.arch == "llama" and f.version == 3 and len(f.tensors) == 272
    assert len(f.metadata["tokenizer.ggml.tokens"]) == 49152 and len(f.metadata["tokenizer.ggml.merges"]) == 48900
    assert f.value_types["llama.block_count"] == VT.UINT32 and f.metadata["llama.block_count"] == 30
    emb = f.tensors["token_embd.weight"]
    assert isinstance(emb, QTensor) and emb.type == GGMLType.Q8_0 and emb.shape == (49152, 576)
    assert f.tensor_info["token_embd.weight"].ne == (576, 49152)
    q = f.tensors["blk.0.attn_q.weight"]
    assert isinstance(q, QTensor) and q.type == GGMLType.Q4_1 and q.shape == (576, 576)
    assert f.tensors["blk.0.attn_norm.weight"].dtype == np.float32


@needs_smollm2
def test_smollm2_save_load_reproduces_the_file(tmp_path):
    f = load(smollm2_path())
    out = save(tmp_path / "copy.gguf", f.metadata, f.tensors, value_types=f.value_types)
    assert filecmp.cmp(smollm2_path(), out, shallow=False)   # byte identity: GGUFReader reads it identically
    g = load(out)
    assert g.metadata == f.metadata and g.value_types == f.value_types
    assert_same_tensors(g.tensors, f.tensors)


# -- no copies ------------------------------------------------------------------------------------------

def test_tensors_are_views_of_the_map(tmp_path):
    path = save(tmp_path / "v.gguf", {}, all_types_tensors(seed=3))
    f = load(path)
    base = f.data.base   # np.frombuffer keeps a memoryview of the map
    assert isinstance(getattr(base, "obj", base), mmap.mmap) and not f.data.flags.writeable
    for name, x in f.tensors.items():
        arr = x.data if isinstance(x, QTensor) else x
        assert np.shares_memory(arr, f.data), name
        assert not arr.flags.writeable, name
        assert type(arr) is np.ndarray, name
        info = f.tensor_info[name]
        addr = arr.__array_interface__["data"][0] - f.data.__array_interface__["data"][0]
        assert addr == info.file_offset, name


# -- metadata types chosen by save ----------------------------------------------------------------------

def test_inferred_value_types(tmp_path):
    meta = {
        "u32": 7, "u32.max": 2**32 - 1, "i32": -1, "i64": -(2**31) - 1, "i64.big": 2**32, "u64": 2**63,
        "f32": 0.1, "bool": True, "str": "s", "bytes": b"raw",
        "np.u8": np.uint8(3), "np.i16": np.int16(-3), "np.f64": np.float64(0.1), "np.f32": np.float32(0.5),
        "np.bool": np.bool_(False),
        "arr.i32": [1, 2, 3], "arr.u32": [0, 2**31], "arr.i64": [-1, 2**32], "arr.u64": [0, 2**64 - 1],
        "arr.f32": [1, 0.5], "arr.bool": [True], "arr.str": ["a", "b"], "tuple": (1, 2),
        "nd.f32": np.array([0.5, 1.5], np.float32), "nd.u16": np.array([1, 2], np.uint16),
        "nd.str": np.array(["x", "yz"]), "list.np.u8": [np.uint8(1), np.uint8(2)], "list.mixed": [1, np.uint8(2)],
    }
    want = {
        "u32": VT.UINT32, "u32.max": VT.UINT32, "i32": VT.INT32, "i64": VT.INT64, "i64.big": VT.INT64,
        "u64": VT.UINT64, "f32": VT.FLOAT32, "bool": VT.BOOL, "str": VT.STRING, "bytes": VT.STRING,
        "np.u8": VT.UINT8, "np.i16": VT.INT16, "np.f64": VT.FLOAT64, "np.f32": VT.FLOAT32, "np.bool": VT.BOOL,
        "arr.i32": (VT.ARRAY, VT.INT32), "arr.u32": (VT.ARRAY, VT.UINT32), "arr.i64": (VT.ARRAY, VT.INT64),
        "arr.u64": (VT.ARRAY, VT.UINT64), "arr.f32": (VT.ARRAY, VT.FLOAT32), "arr.bool": (VT.ARRAY, VT.BOOL),
        "arr.str": (VT.ARRAY, VT.STRING), "tuple": (VT.ARRAY, VT.INT32), "nd.f32": (VT.ARRAY, VT.FLOAT32),
        "nd.u16": (VT.ARRAY, VT.UINT16), "nd.str": (VT.ARRAY, VT.STRING), "list.np.u8": (VT.ARRAY, VT.UINT8),
        "list.mixed": (VT.ARRAY, VT.INT32),
    }
    path = save(tmp_path / "t.gguf", meta, {}, arch="llama")
    f = load(path)
    assert list(f.metadata)[0] == "general.architecture" and f.arch == "llama"
    assert {k: f.value_types[k] for k in want} == want
    assert f.metadata["f32"] == float(np.float32(0.1))      # a Python float is stored as f32
    assert f.metadata["bytes"] == "raw" and f.metadata["tuple"] == [1, 2] and f.metadata["nd.str"] == ["x", "yz"]
    assert f.metadata["np.f64"] == 0.1 and f.metadata["u64"] == 2**63
    _, types, _, _ = reader_view(path)
    assert {k: types[k] for k in want} == want


def test_explicit_value_types(tmp_path):
    meta = {"a": 5, "b": [1, 2], "c": [], "d": 1.5, "e": [0.25]}
    vts = {"a": VT.UINT8, "b": VT.INT16, "c": (VT.ARRAY, VT.STRING), "d": VT.FLOAT64, "e": (VT.ARRAY, VT.FLOAT64),
           "unused": VT.INT8}
    f = load(save(tmp_path / "e.gguf", meta, {}, value_types=vts))
    assert f.metadata == meta
    assert f.value_types == {"a": VT.UINT8, "b": (VT.ARRAY, VT.INT16), "c": (VT.ARRAY, VT.STRING),
                             "d": VT.FLOAT64, "e": (VT.ARRAY, VT.FLOAT64)}


@pytest.mark.parametrize("meta, vts, match", [
    ({"k": []}, {}, "empty array"),
    ({"k": [1, "a"]}, {}, "mixes element types"),
    ({"k": [[1], [2]]}, {}, "nested arrays"),
    ({"k": [1]}, {"k": (VT.ARRAY, VT.ARRAY)}, "nested arrays"),
    ({"k": 256}, {"k": VT.UINT8}, "out of range"),
    ({"k": -1}, {"k": VT.UINT32}, "out of range"),
    ({"k": 2**64}, {}, "does not fit"),
    ({"k": 1.5}, {"k": VT.INT32}, "expected an integer"),
    ({"k": "x"}, {"k": VT.FLOAT32}, "expected a number"),
    ({"k": 1}, {"k": VT.BOOL}, "expected a bool"),
    ({"k": 1}, {"k": VT.STRING}, "expected a str"),
    ({"k": 1e39}, {}, "too large for float32"),
    ({"k": {"a": 1}}, {}, "cannot store a dict"),
    ({"k": 1}, {"k": VT.ARRAY}, "value is a int"),
    ({"k": [1]}, {"k": (VT.ARRAY,)}, "expected a GGUFValueType"),
    ({"": 1}, {}, "non-empty"),
    ({"general.alignment": 64}, {"general.alignment": VT.UINT64}, "must be UINT32"),
])
def test_save_rejects_bad_metadata(tmp_path, meta, vts, match):
    with pytest.raises(ValueError, match=match) as e:
        save(tmp_path / "bad.gguf", meta, {}, value_types=vts)
    assert repr(next(iter(meta))) in str(e.value) or match == "non-empty"
    assert list(tmp_path.iterdir()) == []   # nothing written, no temporary left behind


@pytest.mark.parametrize("tensors, kw, match", [
    ({"x" * 64: np.zeros(1, np.float32)}, {}, "GGML_MAX_NAME"),
    ({"x": np.zeros((1, 1, 1, 1, 1), np.float32)}, {}, "dims"),
    ({"x": np.zeros((2, 0), np.float32)}, {}, "each >= 1"),
    ({"x": np.zeros(2, np.uint8)}, {}, "no ggml type"),
    ({"x": np.zeros(2, bool)}, {}, "no ggml type"),
    ({}, {"alignment": 3}, "power of two"),
    ({}, {"arch": "bert", "metadata": {"general.architecture": "llama"}}, "disagrees"),
    ({}, {"alignment": 64, "metadata": {"general.alignment": 32}}, "disagrees"),
])
def test_save_rejects_bad_tensors_and_options(tmp_path, tensors, kw, match):
    meta = kw.pop("metadata", {})
    with pytest.raises(ValueError, match=match):
        save(tmp_path / "bad.gguf", meta, tensors, **kw)


def test_save_tensor_variants(tmp_path):
    rng = np.random.default_rng(4)
    big_endian = rng.standard_normal((3, 4)).astype(">f4")
    strided = rng.standard_normal((4, 6)).astype(np.float32)[::2, ::3]
    q = make_tensor(GGMLType.Q8_0, (6, 64), rng)
    f = load(save(tmp_path / "v.gguf", {}, {"be": big_endian, "strided": strided, "qview": q[::2]}))
    assert f.tensors["be"].dtype == np.float32 and np.array_equal(f.tensors["be"], big_endian)
    assert np.array_equal(f.tensors["strided"], strided)
    assert f.tensors["qview"] == QTensor(q.type, np.ascontiguousarray(q.data[::2]), (3, 64))


def test_save_bfloat16_array(tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes (optional) is not installed")
    x = np.random.default_rng(5).standard_normal((3, 8)).astype(ml_dtypes.bfloat16)
    f = load(save(tmp_path / "bf16.gguf", {}, {"x": x}))
    assert f.tensors["x"].type == GGMLType.BF16 and f.tensors["x"].tobytes() == x.tobytes()


def test_save_overwrites_a_loaded_file(tmp_path):
    path = save(tmp_path / "same.gguf", {"a": 1}, {"w": np.arange(8, dtype=np.float32)})
    f = load(path)
    save(path, {"a": 2}, {"w": f.tensors["w"] * 2})   # renamed over the mapped file: the old map stays valid
    assert np.array_equal(f.tensors["w"], np.arange(8)) and load(path).metadata == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["same.gguf"]
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask   # the usual mode, not a temporary file's 0600


# -- drawn metadata -------------------------------------------------------------------------------------

def _scalar_of(vt):
    if vt in INT_TYPES:
        info = np.iinfo(INT_TYPES[vt])
        return st.integers(int(info.min), int(info.max))
    return {VT.FLOAT32: st.floats(width=32, allow_nan=False), VT.FLOAT64: st.floats(allow_nan=False),
            VT.BOOL: st.booleans(), VT.STRING: st.text(max_size=20)}[vt]


_SCALAR_TYPES = list(INT_TYPES) + [VT.FLOAT32, VT.FLOAT64, VT.BOOL, VT.STRING]
_entry = st.sampled_from(_SCALAR_TYPES).flatmap(lambda vt: st.one_of(
    _scalar_of(vt).map(lambda v: (v, vt)),
    st.lists(_scalar_of(vt), max_size=8).map(lambda v: (v, (VT.ARRAY, vt)))))


@given(entries=st.dictionaries(st.text(min_size=1, max_size=12), _entry, max_size=12))
def test_drawn_metadata_round_trips_and_matches_reader(entries):
    meta = {k: v for k, (v, _) in entries.items()}
    vts = {k: t for k, (_, t) in entries.items()}
    with tempfile.TemporaryDirectory() as d:
        path = save(Path(d) / "h.gguf", meta, {"w": np.ones(3, np.float32)}, value_types=vts)
        f = assert_matches_reader(path)
        assert f.metadata == meta and f.value_types == vts
        assert list(f.metadata) == list(meta)


# -- malformed files ------------------------------------------------------------------------------------

def _s(x) -> bytes:
    x = x.encode() if isinstance(x, str) else x
    return struct.pack("<Q", len(x)) + x


def _kv(key, vtype, payload: bytes) -> bytes:
    return _s(key) + struct.pack("<i", vtype) + payload


def _ti(name, ne, t=GGMLType.F32, offset=0) -> bytes:
    return _s(name) + struct.pack(f"<I{len(ne)}q", len(ne), *ne) + struct.pack("<iQ", int(t), offset)


def _file(kvs=(), tis=(), data=b"", *, magic=b"GGUF", version=3, n_tensors=None, n_kv=None, align=32) -> bytes:
    b = magic + struct.pack("<Iqq", version, len(tis) if n_tensors is None else n_tensors,
                            len(kvs) if n_kv is None else n_kv)
    b += b"".join(kvs) + b"".join(tis)
    b += b"\0" * (-len(b) % align if tis else 0)
    return b + data


_OK_KV = _kv("general.architecture", VT.STRING, _s("llama"))
_W = _ti("w", [4, 2]), _ti("v", [8], offset=32)
_DATA = bytes(range(32)) + bytes(32)

BAD = {   # id: (file bytes, where the message must point, what it must say)
    "empty": (b"", "header", "empty"),
    "short_header": (b"GGUF\x03\x00\x00\x00", "header", "needs 24 bytes"),
    "magic": (_file(magic=b"GGML"), "header magic", "expected b'GGUF'"),
    "version_1": (_file(version=1), "header version", "version 1 is not supported"),
    "version_0": (_file(version=0), "header version", "unknown GGUF version 0"),
    "version_4": (_file(version=4), "header version", "unknown GGUF version 4"),
    "big_endian": (_file(version=0x03000000), "header version", "big-endian"),
    "n_kv_huge": (_file(n_kv=2**60), "header n_kv", "1152921504606846976 key/value pairs"),
    "n_kv_negative": (_file(n_kv=-1), "header n_kv", "expected 0 <= n_kv"),
    "n_tensors_huge": (_file(n_tensors=2**60), "header n_tensors", "1152921504606846976 tensors"),
    "n_tensors_after_kv": (_file([_OK_KV], n_tensors=1), "header n_tensors", "after the metadata"),
    "key_length_huge": (_file([struct.pack("<Q", 2**60) + b"k" * 20]), "metadata entry 0",
                        "key length 1152921504606846976 at offset 24 exceeds"),
    "key_empty": (_file([_kv("", VT.UINT8, b"\1")]), "metadata entry 0", "empty key"),
    "key_duplicate": (_file([_OK_KV, _OK_KV]), "metadata key 'general.architecture'", "duplicate key"),
    "string_value_huge": (_file([_kv("a.b", VT.STRING, struct.pack("<Q", 2**60))]), "metadata key 'a.b'",
                          "string value length 1152921504606846976"),
    "value_type_unknown": (_file([_kv("a.b", 13, b"\0" * 8)]), "metadata key 'a.b'", "unknown value type 13"),
    "value_type_negative": (_file([_kv("a.b", -1, b"\0" * 8)]), "metadata key 'a.b'", "unknown value type -1"),
    "value_truncated": (_file([_kv("a.b", VT.UINT64, b"\0\0")]), "metadata key 'a.b'", "UINT64 value needs 8"),
    "array_nested": (_file([_kv("a.b", VT.ARRAY, struct.pack("<iQ", VT.ARRAY, 1) + b"\0" * 16)]),
                     "metadata key 'a.b'", "nested arrays"),
    "array_elem_unknown": (_file([_kv("a.b", VT.ARRAY, struct.pack("<iQ", 99, 1) + b"\0" * 16)]),
                           "metadata key 'a.b'", "unknown array element type 99"),
    "array_count_huge": (_file([_kv("a.b", VT.ARRAY, struct.pack("<iQ", VT.UINT32, 2**60))]),
                         "metadata key 'a.b'", "array of 1152921504606846976 UINT32"),
    "string_array_count_huge": (_file([_kv("a.b", VT.ARRAY, struct.pack("<iQ", VT.STRING, 2**60))]),
                                "metadata key 'a.b'", "array of 1152921504606846976 strings"),
    "string_array_item_huge": (_file([_kv("a.b", VT.ARRAY, struct.pack("<iQ", VT.STRING, 2) + _s("ok")
                                          + struct.pack("<Q", 2**60))]),
                               "metadata key 'a.b'", "length 1152921504606846976 of string 1"),
    "alignment_type": (_file([_kv("general.alignment", VT.INT32, struct.pack("<i", 32))]),
                       "metadata key 'general.alignment'", "has type INT32; expected UINT32"),
    "alignment_not_pow2": (_file([_kv("general.alignment", VT.UINT32, struct.pack("<I", 48))]),
                           "metadata key 'general.alignment'", "alignment 48; expected a non-zero power of two"),
    "alignment_zero": (_file([_kv("general.alignment", VT.UINT32, struct.pack("<I", 0))]),
                       "metadata key 'general.alignment'", "alignment 0"),
    "tensor_name_huge": (_file([], [struct.pack("<Q", 2**60) + b"\0" * 40]), "tensor info 0",
                         "tensor name length 1152921504606846976"),
    "tensor_name_long": (_file([], [_ti("n" * 64, [4])], bytes(16)), "tensor 'nnnnnnnn",
                         "64 bytes long; expected < 64"),
    "tensor_duplicate": (_file([], [_ti("w", [4]), _ti("w", [4], offset=32)], bytes(48)), "tensor 'w'",
                         "duplicate tensor name"),
    "n_dims": (_file([], [_ti("w", [1, 1, 1, 1, 1])], bytes(4)), "tensor 'w'", "n_dims 5; expected at most 4"),
    "dim_zero": (_file([], [_ti("w", [4, 0])]), "tensor 'w'", r"ne\[1\] = 0"),
    "dim_negative": (_file([], [_ti("w", [-4])]), "tensor 'w'", r"ne\[0\] = -4"),
    "elements_overflow": (_file([], [_ti("w", [2**32, 2**32])]), "tensor 'w'", "int64 overflow"),
    "type_retired": (_file([], [_ti("w", [4], t=4)]), "tensor 'w'", "unknown ggml type id 4"),
    "type_unknown": (_file([], [_ti("w", [4], t=43)]), "tensor 'w'", "unknown ggml type id 43"),
    "type_negative": (_file([], [_ti("w", [4], t=-1)]), "tensor 'w'", "unknown ggml type id -1"),
    "block_size": (_file([], [_ti("w", [48, 2], t=GGMLType.Q4_0)], bytes(64)), "tensor 'w'",
                   "ne\\[0\\] = 48 is not a multiple of q4_0's block size 32"),
    "misaligned": (_file([], [_W[0], _ti("v", [8], offset=33)], _DATA), "tensor 'v'",
                   "offset 33 is not a multiple of the alignment 32"),
    "overlap": (_file([], [_W[0], _ti("v", [8], offset=0)], _DATA), "tensor 'v'",
                "offset 0 overlaps tensor 'w'.*expected offset 32"),
    "gap": (_file([], [_W[0], _ti("v", [8], offset=64)], _DATA + bytes(64)), "tensor 'v'",
            "offset 64 leaves a gap after tensor 'w'; expected offset 32"),
    "first_not_at_zero": (_file([], [_ti("w", [8], offset=32)], bytes(64)), "tensor 'w'",
                          "gap after the start of the data section"),
    "data_truncated": (_file([], _W, _DATA[:40]), "tensor 'v'", "outside the file"),
    "offset_huge": (_file([], [_ti("w", [8], offset=2**60)], bytes(32)), "tensor 'w'", "outside the file"),
    "data_section_past_end": (_file([], [_ti("w", [8])], align=1), "data section", "past the end of the file"),
}


def test_valid_baseline_of_the_malformed_cases(tmp_path):
    """The hand-built layout the malformed cases bend is itself valid, and GGUFReader reads it alike."""
    path = tmp_path / "ok.gguf"
    path.write_bytes(_file([_OK_KV, _kv("x.y", VT.ARRAY, struct.pack("<iQ", VT.STRING, 2) + _s("a") + _s("é"))],
                           _W, _DATA))
    f = assert_matches_reader(path)
    assert f.metadata == {"general.architecture": "llama", "x.y": ["a", "é"]}
    assert np.array_equal(f.tensors["w"], np.frombuffer(_DATA[:32], np.float32).reshape(2, 4))


def test_version_2_is_read(tmp_path):
    path = tmp_path / "v2.gguf"
    path.write_bytes(_file([_OK_KV], _W, _DATA, version=2))
    assert load(path).version == 2


# cases ggml cannot even refuse: it aborts or crashes, so they are kept away from it
GGML_CRASHES = {"alignment_type": "GGML_ASSERT in gguf_get_val_u32", "key_empty": "GGML_ASSERT(!key.empty())",
                "dim_zero": "SIGFPE: INT64_MAX/ne[1] in the element-count check"}

_GGML_REFUSES = """
import ctypes, sys, ggml
for path in sys.argv[1:]:
    ctx_data = ctypes.c_void_p()
    params = ggml.gguf_init_params(no_alloc=False, ctx=ctypes.pointer(ctx_data))   # reads the data too
    ctx = ggml.gguf_init_from_file(path.encode(), params)
    print("refused" if not ctx else "accepted", flush=True)
"""


@pytest.mark.oracle
def test_ggml_refuses_the_malformed_files(tmp_path):
    """Every GGUFError case is a file ggml refuses too (run apart: a ggml abort must not kill pytest)."""
    import subprocess
    import sys
    require_oracle("ggml", "ggml-python, the ggml oracle,")
    cases = [c for c in sorted(BAD) if c not in GGML_CRASHES]
    paths = []
    for c in cases:
        paths.append(tmp_path / f"{c}.gguf")
        paths[-1].write_bytes(BAD[c][0])
    ok = tmp_path / "ok.gguf"
    ok.write_bytes(_file([_OK_KV], _W, _DATA))
    r = subprocess.run([sys.executable, "-c", _GGML_REFUSES, str(ok), *map(str, paths)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    got = r.stdout.split()
    assert got[0] == "accepted"
    assert dict(zip(cases, got[1:])) == {c: "refused" for c in cases}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_file_raises(tmp_path, case):
    raw, where, what = BAD[case]
    path = tmp_path / f"{case}.gguf"
    path.write_bytes(raw)
    tracemalloc.start()
    try:
        with pytest.raises(GGUFError, match=what) as e:
            load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(e.value)
    assert msg.startswith(f"{path}: {where}"), msg
    assert e.value.path == str(path) and isinstance(e.value, ValueError)
    assert "expected" in msg, msg
    assert peak < 1 << 20, f"{case}: {peak} bytes allocated before the error"   # lengths of 2**60 never allocate
