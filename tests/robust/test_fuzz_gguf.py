"""Hostile GGUF files: `refimpl.gguf.load`, then reading every tensor, either works or raises GGUFError.

A small valid file (every metadata value type, arrays and strings, F32 / F16 / Q4_0 / Q8_0 tensors of 1 to
4 dims) is mutated: truncated at every byte, every header field set to the values that break readers
(0, -1, 2**63-1, 2**64-1, just past the end of the file, unknown type ids, misaligned offsets), and then
Hypothesis draws combinations of bit flips, byte overwrites, insertions, deletions, truncations and field
values. For each case: no exception but GGUFError (which must name the file and say what was expected),
no crash (a SIGBUS from reading a memory map past the end of the file would kill the run), peak
allocation within 64 x the file size + 1 MiB (tracemalloc) and a few seconds at most.
"""
from __future__ import annotations

import itertools
import struct

import numpy as np
import pytest
from gguf.constants import GGUFValueType as VT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import refimpl
from refimpl import QTensor, gguf
from refimpl.gguf import GGUFError

from ._fuzz import examples, run_case

# -- the valid file every case starts from ---------------------------------------------------------------

pytestmark = pytest.mark.property

INT_TYPES = {VT.UINT8: np.uint8, VT.INT8: np.int8, VT.UINT16: np.uint16, VT.INT16: np.int16,
             VT.UINT32: np.uint32, VT.INT32: np.int32, VT.UINT64: np.uint64, VT.INT64: np.int64}


def base_metadata():
    meta = {"general.architecture": "llama", "general.alignment": 32}
    vts = {"general.architecture": VT.STRING, "general.alignment": VT.UINT32}
    for vt, dt in INT_TYPES.items():
        meta[f"t.{vt.name.lower()}"], vts[f"t.{vt.name.lower()}"] = int(np.iinfo(dt).max), vt
    for key, v, vt in [("t.f32", 0.5, VT.FLOAT32), ("t.f64", -2.25, VT.FLOAT64), ("t.true", True, VT.BOOL),
                       ("t.false", False, VT.BOOL), ("t.str", "héllo", VT.STRING), ("t.empty", "", VT.STRING),
                       ("a.u8", [1, 2, 255], (VT.ARRAY, VT.UINT8)), ("a.i32", [-1, 7], (VT.ARRAY, VT.INT32)),
                       ("a.u64", [2**64 - 1], (VT.ARRAY, VT.UINT64)), ("a.f32", [1.5, -0.0], (VT.ARRAY, VT.FLOAT32)),
                       ("a.f64", [0.1], (VT.ARRAY, VT.FLOAT64)), ("a.bool", [True, False, True], (VT.ARRAY, VT.BOOL)),
                       ("a.str", ["a", "", "ü🦙"], (VT.ARRAY, VT.STRING)), ("a.none", [], (VT.ARRAY, VT.INT16)),
                       ("a.nostr", [], (VT.ARRAY, VT.STRING))]:
        meta[key], vts[key] = v, vt
    return meta, vts


def base_tensors():
    rng = np.random.default_rng(0)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)   # noqa: E731
    return {"f32": f32(3, 8), "f16": f32(2, 2, 4).astype(np.float16), "q4_0": refimpl.quantize(f32(2, 64), "q4_0"),
            "q8_0": refimpl.quantize(f32(32), "q8_0"), "f32.4d": f32(1, 2, 1, 3)}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz_gguf")
    meta, vts = base_metadata()
    path = gguf.save(d / "base.gguf", meta, base_tensors(), value_types=vts)
    return d, path.read_bytes()


# -- an independent walk over the header: where each field of the base file is ----------------------------

_SIZES = {VT.UINT8: 1, VT.INT8: 1, VT.UINT16: 2, VT.INT16: 2, VT.UINT32: 4, VT.INT32: 4, VT.FLOAT32: 4,
          VT.BOOL: 1, VT.UINT64: 8, VT.INT64: 8, VT.FLOAT64: 8}


def header_fields(b: bytes) -> list[tuple[int, int, str]]:
    """(offset, width, kind) of every header field of a valid GGUF file."""
    fields = [(0, 4, "magic"), (4, 4, "version"), (8, 8, "n_tensors"), (16, 8, "n_kv")]
    n_tensors, n_kv = struct.unpack_from("<qq", b, 8)
    p = 24

    def u(fmt, kind):
        nonlocal p
        (v,) = struct.unpack_from(fmt, b, p)
        fields.append((p, struct.calcsize(fmt), kind))
        p += struct.calcsize(fmt)
        return v

    def string(kind):
        nonlocal p
        n = u("<Q", kind)
        p += n

    def value(vt, kind="value"):
        nonlocal p
        if vt == VT.STRING:
            string("string length")
        elif vt == VT.ARRAY:
            et = u("<i", "array element type")
            for _ in range(u("<Q", "array count")):
                value(et, "array element")
        else:
            fields.append((p, _SIZES[vt], "bool" if vt == VT.BOOL else kind))
            p += _SIZES[vt]

    for _ in range(n_kv):
        string("key length")
        value(u("<i", "value type"))
    for _ in range(n_tensors):
        string("tensor name length")
        for _ in range(u("<I", "n_dims")):
            u("<q", "ne")
        u("<i", "ggml type")
        u("<Q", "data offset")
    return fields


_KIND_VALUES = {
    "magic": [int.from_bytes(m, "little") for m in (b"GGML", b"FUGG", b"GGUf", b"\0\0\0\0")],
    "version": [0, 1, 2, 3, 4, 0x03000000, 0x02000000],
    "value type": [*range(-2, 16), 2**31 - 1],
    "array element type": [*range(-2, 16), 2**31 - 1],
    "ggml type": [*range(-1, 45), 2**31 - 1],
    "n_dims": [*range(0, 9), 2**31],
    "ne": [0, 2, 3, 16, 31, 32, 33, 64, 2**31, 2**32, 2**62],
    "data offset": [16, 31, 32, 33, 64, 96, 128, 2**62, 2**63],
    "bool": [2, 3, 127, 128, 255],
}


def special_values(field, size: int) -> list[int]:
    """The values that break readers, for one field of a file of `size` bytes (unsigned, field-wide)."""
    off, w, kind = field
    top = 1 << (8 * w)
    left = size - off - w          # the bytes after the field
    vals = [0, 1, top - 1, top // 2 - 1, top // 2, left - 1, left, left + 1, left + 8, left // 8 + 1,
            size, 2**31, 2**32]
    vals += _KIND_VALUES.get(kind, [])
    return sorted({v % top for v in vals})


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
            off, w = m[1], m[2]
            if off + w <= len(b):
                b[off:off + w] = (m[3] % (1 << (8 * w))).to_bytes(w, "little")
    return bytes(b)


# -- one case ---------------------------------------------------------------------------------------------

_names = itertools.count()


def read_everything(path):
    """load, then read every metadata value and every byte of every tensor (dequantizing block types)."""
    f = gguf.load(path)
    for k, v in f.metadata.items():
        repr(v)
    with np.errstate(all="ignore"):
        for name, t in f.tensors.items():
            a = np.asarray(t)                       # a QTensor dequantizes here
            assert a.shape == tuple(reversed(f.tensor_info[name].ne)), name
            assert isinstance(t, (np.ndarray, QTensor))
            np.sum(a, dtype=np.float64)             # touches every element: a bad view would fault here
    return f


def check_file(d, data: bytes, test: str):
    """Write data to a fresh file and read it as a fuzz case; a GGUFError must name the file and field."""
    path = d / f"case{next(_names)}.gguf"          # a new file (a new inode) per case: no stale maps
    path.write_bytes(data)
    try:
        with refimpl.backend("numpy"):
            r = run_case(test, lambda: read_everything(path), (GGUFError,), input_bytes=len(data))
        if isinstance(r, GGUFError):
            msg = str(r)
            assert r.path == str(path) and msg.startswith(f"{path}: {r.where}: "), msg
            assert r.where and "expected" in msg, msg
        return r
    finally:
        path.unlink()


# -- exhaustive passes ------------------------------------------------------------------------------------

def test_base_file_is_valid(work):
    d, base = work
    f = check_file(d, base, "gguf: base file")
    assert not isinstance(f, Exception)
    assert len(f.tensors) == 5 and f.metadata["a.str"] == ["a", "", "ü🦙"]


def test_truncated_at_every_byte(work):
    d, base = work
    outcomes = [check_file(d, base[:n], "gguf: truncation at every byte") for n in range(len(base))]
    data_start = gguf.load(d / "base.gguf").data_offset
    # every cut inside the header, and every cut that loses tensor bytes, is an error
    assert all(isinstance(r, GGUFError) for r in outcomes[:data_start])


def test_every_header_field_at_every_breaking_value(work):
    d, base = work
    fields = header_fields(base)
    assert len(fields) > 60
    n = 0
    for field in fields:
        off, w, kind = field
        for v in special_values(field, len(base)):
            check_file(d, apply(base, [("field", off, w, v)]), "gguf: header field x breaking value")
            n += 1
    assert n > 800


def test_bool_values_other_than_0_and_1_are_refused(work):
    """The GGUF spec: a bool is 0 or 1, anything else invalid (ggml reads any non-zero byte as true)."""
    d, base = work
    for off, w, kind in header_fields(base):
        if kind == "bool":
            r = check_file(d, apply(base, [("field", off, w, 2)]), "gguf: bool value 2")
            assert isinstance(r, GGUFError) and "BOOL" in str(r) and "0 or 1" in str(r), r


# -- drawn combinations -----------------------------------------------------------------------------------

def _mutation(base: bytes):
    n = len(base)
    fields = header_fields(base)
    field = st.sampled_from(fields).flatmap(
        lambda f: st.one_of(st.sampled_from(special_values(f, n)), st.integers(0, (1 << (8 * f[1])) - 1))
        .map(lambda v: ("field", f[0], f[1], v)))
    pos = st.integers(0, n)
    return st.one_of(
        field,
        st.tuples(st.just("truncate"), pos),
        st.tuples(st.just("flip"), pos, st.integers(0, 7)),
        st.tuples(st.just("byte"), pos, st.sampled_from([0, 1, 0x7F, 0x80, 0xFF]) | st.integers(0, 255)),
        st.tuples(st.just("insert"), pos, st.binary(min_size=1, max_size=16)),
        st.tuples(st.just("delete"), pos, st.integers(1, 16)),
    )


@st.composite
def _mutations(draw, base):
    return draw(st.lists(_mutation(base), min_size=1, max_size=4))


_BASE_FOR_STRATEGY: dict = {}


def _base_bytes() -> bytes:
    """The base file's bytes for building strategies at import time (same content as the fixture's)."""
    if "b" not in _BASE_FOR_STRATEGY:
        import tempfile
        from pathlib import Path
        with tempfile.TemporaryDirectory() as t:
            meta, vts = base_metadata()
            _BASE_FOR_STRATEGY["b"] = gguf.save(Path(t) / "b.gguf", meta, base_tensors(),
                                                value_types=vts).read_bytes()
    return _BASE_FOR_STRATEGY["b"]


@settings(max_examples=examples(2000), deadline=None, suppress_health_check=list(HealthCheck))
@given(muts=st.deferred(lambda: _mutations(_base_bytes())))
def test_drawn_mutations(work, muts):
    d, base = work
    assert base == _base_bytes()
    check_file(d, apply(base, muts), "gguf: drawn mutations")


# -- every ggml type, arbitrary block bytes -----------------------------------------------------------------

def _type_cases():
    from refimpl.types import type_traits
    return sorted(type_traits, key=int)


@pytest.mark.parametrize("t", _type_cases(), ids=lambda t: refimpl.traits(t).name)
def test_every_type_dequantizes_arbitrary_bytes(work, t):
    """Any bytes are a valid tensor of any type (NaN/inf scales included): reading one never raises."""
    d, _ = work
    tr = refimpl.traits(t)
    ne0 = tr.blck_size * 2 if tr.blck_size > 1 else 8
    rng = np.random.default_rng(int(t))
    for fill in ("random", 0x00, 0xFF, 0x7C):          # 0x7C7C: f16 inf; 0xFFFF: f16 NaN
        shape = (3, ne0)
        rb = ne0 // tr.blck_size * tr.type_size
        raw = (rng.integers(0, 256, (3, rb), dtype=np.uint8) if fill == "random"
               else np.full((3, rb), fill, np.uint8))
        x = QTensor(t, raw, shape) if t not in refimpl.types.NUMPY_DTYPES else raw.view(
            refimpl.types.NUMPY_DTYPES[t]).reshape(shape)
        path = gguf.save(d / f"type{int(t)}.gguf", {}, {"x": x})
        r = check_file(d, path.read_bytes(), "gguf: every type x arbitrary bytes")
        assert not isinstance(r, Exception), r
        path.unlink()


def test_metadata_memory_is_bounded_by_the_file_size(work):
    """The worst case for Python objects per byte: a big INT8 array of values outside the small-int cache."""
    d, _ = work
    path = gguf.save(d / "big_i8.gguf", {"a.i8": np.full(1 << 18, -100, np.int8)}, {})
    r = run_case("gguf: metadata memory bound", lambda: gguf.load(path), (GGUFError,),
                 input_bytes=path.stat().st_size, mem_factor=40)
    assert not isinstance(r, Exception) and len(r.metadata["a.i8"]) == 1 << 18
    path.unlink()
