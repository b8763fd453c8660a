"""GGUF files: a lazy, validating reader (`load`) and a writer built on `gguf.GGUFWriter` (`save`).

Lazy: `load` parses and checks the header and maps the file; tensor data is never read, copied or
dequantized until the caller touches it.

    f = refimpl.gguf.load("model.gguf")
    f.metadata["llama.block_count"]        # 30            (plain Python values)
    f.value_types["llama.block_count"]     # GGUFValueType.UINT32
    f.tensors["token_embd.weight"]         # QTensor(q8_0, ne [576, 49152] (numpy (49152, 576)), ...)
    f.tensor_info["token_embd.weight"]     # TensorInfo(type=Q8_0, ne=(576, 49152), offset=0, nbytes=...)
    refimpl.gguf.save("copy.gguf", f.metadata, f.tensors, value_types=f.value_types)   # same bytes

Layout (version 3; 2 is read too, 1 is rejected; all little-endian; docs: GGML_SEMANTICS.md §7.1):

    "GGUF"  u32 version  i64 n_tensors  i64 n_kv
    n_kv x      key: u64 len + utf-8 bytes   i32 value_type   value
                (an array value is i32 elem_type, u64 count, count elements; no arrays of arrays;
                a BOOL is one byte, 0 or 1)
    n_tensors x name: u64 len + bytes (< 64)   u32 n_dims (<= 4)   n_dims x i64 ne   i32 ggml_type
                u64 offset (from the start of the data section)
    zero padding to `general.alignment` (u32, a power of two, default 32), then the data section: each
    tensor's ggml bytes, padded to the alignment, at exactly the offset the running padded sizes give.

Reading. The file is memory-mapped once; the header is parsed with `struct` over the map and numeric
arrays with `np.frombuffer`, so loading a 100 MB model with a 49k-token vocabulary takes tens of
milliseconds and touches only the header's pages. Tensors are read-only views of the map, never copied
or dequantized: F32/F16/F64/I8/I16/I32/I64 become plain ndarrays, BF16 and every block format a
`QTensor` whose `data` is the map's bytes. `ne` is reversed into the NumPy shape once, here. Metadata
values become plain Python values (`int`, `float`, `bool`, `str`, or a `list` of one of those); strings
are decoded as UTF-8 with `surrogateescape`, so invalid bytes survive a round trip instead of failing.

Every check ggml's `gguf_init_from_file` makes (and llama.cpp's "tensor data within file bounds") is
made before anything large is allocated, and a failure raises `GGUFError` naming the file, the header
field / key / tensor, what was found and what was expected. Every count and length is checked against
the bytes left in the file before it is used, so a hostile file costs at most about 40 bytes of Python
objects per byte of file (an array of one-byte integers becomes a list), and every tensor view lies
inside the file (reading a tensor can never fault on the map). tests/robust/test_fuzz_gguf.py mutates
files to hold the reader to this. `check_tokenizer_metadata` checks the `tokenizer.*` keys' types and
lengths before a tokenizer is built from them.

Writing. `save` goes through `gguf.GGUFWriter` (a tiny subclass only adds empty arrays, which GGUF
allows and GGUFWriter refuses). A value's GGUF type comes from `value_types[key]` when given (what
`load` returns, so a load/save round trip is exact), otherwise from the value:

    bool / np.bool_          BOOL
    int                      UINT32 if 0 <= v < 2**32 (llama.cpp reads hparams and token ids as u32
                             and checks the type strictly), else INT32, INT64 or UINT64 by range
    float                    FLOAT32 (llama.cpp's eps / rope values are f32; pass FLOAT64 explicitly)
    NumPy scalar             its own type (np.uint8 -> UINT8, np.float64 -> FLOAT64, ...)
    str / bytes              STRING
    list / tuple of ints     array of INT32 if all fit (llama.cpp's token_type and per-layer arrays),
                             else UINT32, INT64, UINT64
    list of floats / bools / strings   array of FLOAT32 / BOOL / STRING
    1-D ndarray              array of its dtype's type (float32 -> FLOAT32, int32 -> INT32, str -> STRING)
    empty list               needs value_types (the element type cannot be guessed)

`value_types[key]` is a `GGUFValueType` for a scalar and `(GGUFValueType.ARRAY, elem_type)` for an array;
for a list value a bare element type (`GGUFValueType.UINT8`) is accepted too.
"""
from __future__ import annotations

import mmap
import numbers
import os
import secrets
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from gguf import GGUFWriter
from gguf.constants import (GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION, GGMLQuantizationType,
                            GGUFValueType, Keys)
from gguf.quants import quant_shape_to_byte_shape

from .errors import LoadError, looks_like
from .progress import enabled as progress_enabled
from .qtensor import QTensor
from .types import NUMPY_DTYPES, GGMLType, traits, type_traits

__all__ = ["GGUFError", "GGUFFile", "TensorInfo", "load", "save", "GGUFValueType", "SUPPORTED_VERSIONS",
           "check_tokenizer_metadata"]

SUPPORTED_VERSIONS = (2, GGUF_VERSION)   # what ggml reads; version 1 used 32-bit counts and is refused
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64                       # tensor names are < 64 bytes (ggml.h GGML_MAX_NAME)
KEY_ARCH = Keys.General.ARCHITECTURE
KEY_ALIGNMENT = Keys.General.ALIGNMENT
_I64_MAX = 2**63 - 1
_MIN_KV_BYTES = 8 + 4 + 1                # key length, value type, the smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8   # name length, n_dims, ggml type, offset

_T = GGUFValueType
# value type -> (struct format, NumPy dtype); BOOL is one byte, 0 or 1 (the GGUF spec calls any other value
# invalid and this reader refuses it; ggml reads it as `!= 0`)
_FIXED = {
    _T.UINT8: ("<B", "<u1"), _T.INT8: ("<b", "<i1"), _T.UINT16: ("<H", "<u2"), _T.INT16: ("<h", "<i2"),
    _T.UINT32: ("<I", "<u4"), _T.INT32: ("<i", "<i4"), _T.FLOAT32: ("<f", "<f4"), _T.BOOL: ("<B", "<u1"),
    _T.UINT64: ("<Q", "<u8"), _T.INT64: ("<q", "<i8"), _T.FLOAT64: ("<d", "<f8"),
}
_STRUCTS = {t: struct.Struct(fmt) for t, (fmt, _) in _FIXED.items()}
_DTYPES = {t: np.dtype(dt) for t, (_, dt) in _FIXED.items()}
_INT_RANGE = {t: (int(np.iinfo(_DTYPES[t]).min), int(np.iinfo(_DTYPES[t]).max))
              for t in (_T.UINT8, _T.INT8, _T.UINT16, _T.INT16, _T.UINT32, _T.INT32, _T.UINT64, _T.INT64)}
_INT_TYPES = frozenset(_INT_RANGE)
_VALUE_TYPE_IDS = frozenset(int(t) for t in _T)
_U32, _I32, _U64, _I64 = (struct.Struct(f) for f in ("<I", "<i", "<Q", "<q"))
_HEADER = struct.Struct("<4sIqq")
_TRAITS_BY_ID = {int(t): tr for t, tr in type_traits.items()}   # ids 4, 5, 31-33, 36-38 are retired
_MAGIC = struct.pack("<I", GGUF_MAGIC)   # b"GGUF"


class GGUFError(LoadError):
    """A malformed GGUF file. `path` is the file, `where` the header field, key or tensor at fault."""

    def __init__(self, path, where: str, message: str):
        self.where = where
        super().__init__(f"{path}: {where}: {message}", path)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor-info record, as stored.

    ne      ggml order (ne[0] fastest); the NumPy shape is `shape` = ne reversed
    offset  from the start of the data section (the value in the file); `file_offset` is absolute
    nbytes  ggml_nbytes: the tensor's bytes without the alignment padding
    """
    name: str
    type: GGMLType
    ne: tuple
    offset: int
    nbytes: int
    file_offset: int

    @property
    def shape(self) -> tuple:
        return tuple(reversed(self.ne))


class GGUFFile:
    """A loaded GGUF file (see `load`).

    path         Path of the file
    version      GGUF version (2 or 3)
    alignment    data alignment (`general.alignment`, else 32)
    data_offset  absolute offset of the data section
    metadata     dict key -> Python value, in file order (`general.alignment` included when present)
    value_types  dict key -> GGUFValueType, or (GGUFValueType.ARRAY, elem_type) for arrays
    tensor_info  dict name -> TensorInfo, in file order
    tensors      dict name -> read-only ndarray (F32 F16 F64 I8 I16 I32 I64) or QTensor (BF16 and every
                 block type), views of the memory map in NumPy order (shape = ne reversed)
    data         the whole file as a read-only uint8 array (the map every tensor is a view of)
    """

    def __init__(self, path, version, alignment, data_offset, metadata, value_types, tensor_info, tensors, data):
        self.path, self.version, self.alignment, self.data_offset = path, version, alignment, data_offset
        self.metadata, self.value_types = metadata, value_types
        self.tensor_info, self.tensors, self.data = tensor_info, tensors, data

    @property
    def arch(self) -> str | None:
        """`general.architecture` (None when the file has no such key)."""
        return self.metadata.get(KEY_ARCH)

    def __repr__(self) -> str:
        return (f"GGUFFile({str(self.path)!r}, v{self.version}, arch={self.arch!r}, "
                f"{len(self.metadata)} keys, {len(self.tensors)} tensors)")


def _value_type_name(vt) -> str:
    if isinstance(vt, tuple):
        return f"ARRAY[{vt[1].name}]"
    return vt.name


# -- reading ------------------------------------------------------------------------------------------

class _Parser:
    """A cursor over the mapped bytes that raises GGUFError for anything a ggml reader would refuse."""

    def __init__(self, path, mm: mmap.mmap):
        self.path, self.mm, self.size, self.pos = path, mm, len(mm), 0

    def fail(self, where: str, message: str):
        raise GGUFError(self.path, where, message)

    def need(self, n: int, where: str, what: str) -> None:
        left = self.size - self.pos
        if n > left:
            self.fail(where, f"{what} needs {n} bytes at offset {self.pos}, but the file ({self.size} bytes) "
                             f"has only {left} left; expected the header to continue")

    def unpack(self, st: struct.Struct, where: str, what: str):
        self.need(st.size, where, what)
        (v,) = st.unpack_from(self.mm, self.pos)
        self.pos += st.size
        return v

    def string(self, where: str, what: str) -> str:
        n = self.unpack(_U64, where, f"{what} length")
        left = self.size - self.pos
        if n > left:
            self.fail(where, f"{what} length {n} at offset {self.pos - 8} exceeds the {left} bytes left in the "
                             f"file; expected a length that fits the file")
        s = str(self.mm[self.pos:self.pos + n], "utf-8", "surrogateescape")
        self.pos += n
        return s

    def value_type(self, where: str, what: str) -> GGUFValueType:
        t = self.unpack(_I32, where, what)
        if t not in _VALUE_TYPE_IDS:
            self.fail(where, f"unknown {what} {t} at offset {self.pos - 4}; expected one of "
                             f"{', '.join(f'{int(v)} ({v.name})' for v in _T)}")
        return _T(t)

    def value(self, vt: GGUFValueType, where: str):
        if vt == _T.STRING:
            return self.string(where, "string value")
        v = self.unpack(_STRUCTS[vt], where, f"{vt.name} value")
        if vt == _T.BOOL:
            if v not in (0, 1):
                self.fail(where, f"BOOL value {v} at offset {self.pos - 1}; expected 0 or 1 (the GGUF spec calls "
                                 f"any other byte invalid; ggml would read it as true)")
            return v == 1
        return v

    def array(self, where: str):
        et = self.value_type(where, "array element type")
        if et == _T.ARRAY:
            self.fail(where, "array of arrays (nested arrays); expected an array of a scalar or string type, "
                             "the only arrays ggml reads")
        n = self.unpack(_U64, where, "array length")
        left = self.size - self.pos
        if et == _T.STRING:
            if n > left // 8:
                self.fail(where, f"array of {n} strings cannot fit in the {left} bytes left in the file "
                                 f"(each takes at least 8 bytes); expected a count that fits the file")
            return et, self._strings(n, where)
        dt = _DTYPES[et]
        if n > left // dt.itemsize:
            self.fail(where, f"array of {n} {et.name} ({n * dt.itemsize} bytes) exceeds the {left} bytes "
                             f"left in the file; expected a count that fits the file")
        a = np.frombuffer(self.mm, dt, count=n, offset=self.pos)
        if et == _T.BOOL:
            bad = np.flatnonzero(a > 1)
            if bad.size:
                self.fail(where, f"BOOL array element {bad[0]} is {a[bad[0]]} (offset "
                                 f"{self.pos + bad[0]}); expected 0 or 1 (the GGUF spec calls any other byte "
                                 f"invalid; ggml would read it as true)")
            a = a != 0
        self.pos += n * dt.itemsize
        return et, a.tolist()

    def _strings(self, n: int, where: str) -> list:
        # the hot loop of a load: ~100k tokens and merges in a llama vocabulary
        mm, size, p = self.mm, self.size, self.pos
        unpack_u64 = _U64.unpack_from
        out = []   # grown, not preallocated: memory follows the strings actually read
        append = out.append
        for i in range(n):
            if p + 8 > size:
                self.pos = p
                self.need(8, where, f"length of string {i}")
            (ln,) = unpack_u64(mm, p)
            p += 8
            e = p + ln
            if e > size:
                self.fail(where, f"length {ln} of string {i} at offset {p - 8} exceeds the {size - p} bytes left "
                                 f"in the file; expected a length that fits the file")
            append(str(mm[p:e], "utf-8", "surrogateescape"))
            p = e
        self.pos = p
        return out


def load(path) -> GGUFFile:
    """Read a GGUF file: validate its header, map it, and wrap its tensors without copying them. The file
    is read in its order: header, key/value pairs, tensor infos, then the data section (padded to the
    alignment) whose tensors are views of the mapping.

    Raises GGUFError (a ValueError) for a malformed file, OSError when it cannot be opened.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        try:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:   # an empty file cannot be mapped
            raise GGUFError(path, "header", f"the file is empty; expected a GGUF header of {_HEADER.size} "
                                            f"bytes") from None
    P = _Parser(path, mm)
    version, n_tensors, n_kv = _header(P)
    metadata, value_types = _key_values(P, n_kv)
    alignment = _alignment(P, metadata, value_types)
    infos = _tensor_infos(P, n_tensors)
    data_offset = -(-P.pos // alignment) * alignment
    if infos and data_offset > P.size:
        P.fail("data section", f"starts at offset {data_offset} (after padding to {alignment}), past the end of "
                               f"the file ({P.size} bytes); expected tensor data")

    data = np.frombuffer(mm, np.uint8)
    tensor_info, tensors = _tensor_data(P, data, infos, data_offset, alignment)
    return GGUFFile(path, version, alignment, data_offset, metadata, value_types, tensor_info, tensors, data)


def _header(P: _Parser) -> tuple[int, int, int]:
    """(version, n_tensors, n_kv) of the header, each checked against what the file can hold."""
    P.need(_HEADER.size, "header", "the header (magic, version, n_tensors, n_kv)")
    magic, version, n_tensors, n_kv = _HEADER.unpack_from(P.mm, 0)
    P.pos = _HEADER.size
    if magic != _MAGIC:
        kind = looks_like(P.path)
        P.fail("header magic", f"{magic!r} at offset 0; expected {_MAGIC!r}: not a GGUF file"
               + (f" (it looks like {kind})" if kind else ""))
    if (version & 0xFFFF) == 0 and version:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        P.fail("header version", f"reads 0x{version:08x}, i.e. version {swapped} byte-swapped: a big-endian "
                                 f"GGUF file; expected a little-endian file (version 2 or 3)")
    if version == 1:
        P.fail("header version", "GGUF version 1 is not supported (it used 32-bit counts and lengths); "
                                 "expected version 2 or 3")
    if version not in SUPPORTED_VERSIONS:
        P.fail("header version", f"unknown GGUF version {version}; expected one of {SUPPORTED_VERSIONS}")
    left = P.size - P.pos
    if n_kv < 0 or n_kv > left // _MIN_KV_BYTES:
        P.fail("header n_kv", f"{n_kv} key/value pairs; expected 0 <= n_kv <= {left // _MIN_KV_BYTES}, the "
                              f"most the {left} bytes after the header can hold ({_MIN_KV_BYTES} bytes each at least)")
    if n_tensors < 0 or n_tensors > left // _MIN_TENSOR_INFO_BYTES:
        P.fail("header n_tensors", f"{n_tensors} tensors; expected 0 <= n_tensors <= "
                                   f"{left // _MIN_TENSOR_INFO_BYTES}, the most the {left} bytes after the "
                                   f"header can hold ({_MIN_TENSOR_INFO_BYTES} bytes each at least)")

    return version, n_tensors, n_kv


def _key_values(P: _Parser, n_kv: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The n_kv key/value pairs: (metadata, each key's GGUF value type)."""
    metadata: dict[str, Any] = {}
    value_types: dict[str, Any] = {}
    for i in range(n_kv):
        where = f"metadata entry {i}"
        key = P.string(where, "key")
        if not key:
            P.fail(where, "empty key; expected a non-empty key (ggml asserts it)")
        if key in metadata:
            P.fail(f"metadata key {key!r}", f"duplicate key (entry {i}); expected every key once")
        where = f"metadata key {key!r}"
        vt = P.value_type(where, "value type")
        if vt == _T.ARRAY:
            et, metadata[key] = P.array(where)
            value_types[key] = (_T.ARRAY, et)
        else:
            metadata[key] = P.value(vt, where)
            value_types[key] = vt
    return metadata, value_types


def _alignment(P: _Parser, metadata: dict, value_types: dict) -> int:
    """general.alignment (a UINT32 power of two), or GGUF's default."""
    alignment = GGUF_DEFAULT_ALIGNMENT
    if KEY_ALIGNMENT in metadata:
        where = f"metadata key {KEY_ALIGNMENT!r}"
        if value_types[KEY_ALIGNMENT] != _T.UINT32:
            P.fail(where, f"has type {_value_type_name(value_types[KEY_ALIGNMENT])}; expected UINT32")
        alignment = metadata[KEY_ALIGNMENT]
        if alignment == 0 or alignment & (alignment - 1):
            P.fail(where, f"alignment {alignment}; expected a non-zero power of two")
    return alignment


def _tensor_infos(P: _Parser, n_tensors: int) -> list[tuple]:
    """(name, type, ne, offset, nbytes) of each tensor info, in file order."""
    left = P.size - P.pos
    if n_tensors > left // _MIN_TENSOR_INFO_BYTES:
        P.fail("header n_tensors", f"{n_tensors} tensors cannot fit in the {left} bytes after the metadata "
                                   f"({_MIN_TENSOR_INFO_BYTES} bytes each at least); expected a count that "
                                   f"fits the file")
    infos = []   # (name, type, ne, offset, nbytes)
    seen: set[str] = set()
    for i in range(n_tensors):
        where = f"tensor info {i}"
        name = P.string(where, "tensor name")
        nb = len(name.encode("utf-8", "surrogateescape"))
        if nb >= GGML_MAX_NAME:
            P.fail(f"tensor {name!r}", f"name is {nb} bytes long; expected < {GGML_MAX_NAME} (GGML_MAX_NAME)")
        where = f"tensor {name!r}"
        if name in seen:
            P.fail(where, f"duplicate tensor name (tensor info {i}); expected every name once")
        seen.add(name)
        n_dims = P.unpack(_U32, where, "n_dims")
        if n_dims > GGML_MAX_DIMS:
            P.fail(where, f"n_dims {n_dims}; expected at most {GGML_MAX_DIMS} (GGML_MAX_DIMS)")
        P.need(8 * n_dims, where, f"{n_dims} dims")
        ne = struct.unpack_from(f"<{n_dims}q", P.mm, P.pos)
        P.pos += 8 * n_dims
        n = 1
        for j, d in enumerate(ne):
            if d <= 0:
                P.fail(where, f"ne[{j}] = {d} (ne {list(ne)}); expected every dimension >= 1")
            n *= d
            if n > _I64_MAX:
                P.fail(where, f"ne {list(ne)} has more than 2**63-1 elements (int64 overflow); expected a "
                              f"representable element count")
        t = P.unpack(_I32, where, "ggml type")
        tr = _TRAITS_BY_ID.get(t)
        if tr is None:
            P.fail(where, f"unknown ggml type id {t}; expected one of {sorted(_TRAITS_BY_ID)} (refimpl.types)")
        ne0 = ne[0] if ne else 1
        if ne0 % tr.blck_size:
            P.fail(where, f"ne[0] = {ne0} is not a multiple of {tr.name}'s block size {tr.blck_size}; expected "
                          f"whole blocks per row")
        nbytes = n // tr.blck_size * tr.type_size
        offset = P.unpack(_U64, where, "data offset")
        infos.append((name, tr.type, tuple(ne), offset, nbytes))
    return infos


def _tensor_data(P: _Parser, data: np.ndarray, infos: list, data_offset: int, alignment: int):
    """(TensorInfo by name, tensor view by name): the data packed in order, each padded to the alignment,
    inside the file."""
    tensor_info: dict[str, TensorInfo] = {}
    tensors: dict[str, Any] = {}
    expected, prev = 0, None
    for name, t, ne, offset, nbytes in infos:
        where = f"tensor {name!r}"
        if offset % alignment:
            P.fail(where, f"data offset {offset} is not a multiple of the alignment {alignment}; expected "
                          f"offset {expected}")
        start = data_offset + offset
        if offset > P.size or start + nbytes > P.size:
            P.fail(where, f"data [{start}, {start + nbytes}) (offset {offset} + {nbytes} bytes) lies outside the "
                          f"file ({P.size} bytes); expected tensor data within the file")
        if offset < expected:
            P.fail(where, f"data offset {offset} overlaps tensor {prev!r}, whose padded data ends at {expected}; "
                          f"expected offset {expected} (tensors packed in file order)")
        if offset > expected:
            P.fail(where, f"data offset {offset} leaves a gap after "
                          f"{'the start of the data section' if prev is None else f'tensor {prev!r}'}; expected "
                          f"offset {expected} (ggml requires the running padded sizes)")
        expected += -(-nbytes // alignment) * alignment
        prev = name
        tensor_info[name] = TensorInfo(name, t, ne, offset, nbytes, start)
        tensors[name] = _view(data, t, ne, start, nbytes)
    return tensor_info, tensors


def _view(data: np.ndarray, t: GGMLType, ne: tuple, start: int, nbytes: int):
    """The tensor at data[start:start+nbytes] in NumPy order: an ndarray, or a QTensor over raw bytes."""
    raw = data[start:start + nbytes]
    shape = tuple(reversed(ne))
    dt = NUMPY_DTYPES.get(t)
    if dt is not None:
        return raw.view(dt).reshape(shape)
    shape = shape or (1,)   # a 0-dim bf16 tensor: a QTensor needs its row axis
    tr = traits(t)
    return QTensor(t, raw.reshape(shape[:-1] + (shape[-1] // tr.blck_size * tr.type_size,)), shape)


# -- the tokenizer keys -------------------------------------------------------------------------------

_TOKEN_TYPES = range(7)   # llama_token_type: UNDEFINED NORMAL UNKNOWN CONTROL USER_DEFINED UNUSED BYTE
_TOKENIZER_SCALARS = {   # key suffix -> (what, test)
    "model": ("a string", lambda v: isinstance(v, str)),
    "pre": ("a string", lambda v: isinstance(v, str)),
    "token_type_count": ("an integer >= 0", lambda v: _is_int(v) and v >= 0),
    **{f"add_{x}": ("a bool", lambda v: isinstance(v, bool))
       for x in ("bos_token", "eos_token", "sep_token", "space_prefix")},
    "remove_extra_whitespaces": ("a bool", lambda v: isinstance(v, bool)),
}


def _valid_utf8(t: str) -> bool:
    try:
        t.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def check_tokenizer_metadata(metadata, path="GGUF") -> None:
    """Check the `tokenizer.*` keys of a GGUF file (or its metadata dict) before a tokenizer is built.

    The types are the GGUF spec's (and what llama.cpp's loader insists on): `tokenizer.ggml.tokens` a
    non-empty array of strings, `scores` an array of numbers and `token_type` an array of integers in
    0..6 (llama_token_type), both as long as `tokens`; `merges` and `added_tokens` arrays of strings;
    every `*_token_id` an integer; `add_bos_token` and the other switches bools; `model`, `pre` and
    `tokenizer.chat_template` strings; for a byte-level BPE ("gpt2") vocabulary, tokens and merges valid
    UTF-8. Raises GGUFError naming the key, the value found and what was expected. Like llama.cpp, it
    accepts a special-token id outside the vocabulary (the tokenizer ignores it) and a merge without a
    space (it merges nothing).
    """
    if isinstance(metadata, GGUFFile):
        path, metadata = metadata.path, metadata.metadata

    def fail(key, found, expected):
        shown = repr(found)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        raise GGUFError(path, f"metadata key {key!r}", f"{shown}; expected {expected}")

    def array_of(key, test, what, *, n=None, nonempty=False):
        v = metadata.get(key)
        if v is None:
            return None
        if not isinstance(v, list):
            fail(key, v, f"an array of {what}")
        if nonempty and not v:
            fail(key, v, f"a non-empty array of {what}")
        for i, x in enumerate(v):
            if not test(x):
                raise GGUFError(path, f"metadata key {key!r}", f"element {i} is {x!r} ({type(x).__name__}); "
                                                               f"expected an array of {what}")
        if n is not None and len(v) != n:
            raise GGUFError(path, f"metadata key {key!r}", f"has {len(v)} elements; expected {n}, one per "
                                                           f"token of tokenizer.ggml.tokens")
        return v

    tokens = array_of("tokenizer.ggml.tokens", lambda x: isinstance(x, str), "strings", nonempty=True)
    n = None if tokens is None else len(tokens)
    array_of("tokenizer.ggml.scores", lambda x: isinstance(x, numbers.Real) and not isinstance(x, bool),
             "numbers", n=n)
    array_of("tokenizer.ggml.token_type", lambda x: _is_int(x) and x in _TOKEN_TYPES,
             "integers in 0..6 (llama_token_type)", n=n)
    merges = array_of("tokenizer.ggml.merges", lambda x: isinstance(x, str), "strings ('left right')")
    array_of("tokenizer.ggml.added_tokens", lambda x: isinstance(x, str), "strings")
    array_of("tokenizer.ggml.precompiled_charsmap", lambda x: _is_int(x) and -128 <= x <= 255,
             "bytes (int8 or uint8)")
    if metadata.get("tokenizer.ggml.model") == "gpt2":
        # byte-level BPE texts are GPT-2's byte alphabet: always valid UTF-8 (the reader keeps invalid
        # bytes as lone surrogates, which no BPE implementation can take)
        for key, texts in (("tokenizer.ggml.tokens", tokens), ("tokenizer.ggml.merges", merges)):
            try:
                "".join(texts or ()).encode("utf-8")
            except UnicodeEncodeError:
                i = next(i for i, t in enumerate(texts) if not _valid_utf8(t))
                raise GGUFError(path, f"metadata key {key!r}", f"element {i} ({texts[i]!r}) is not valid UTF-8; "
                                                               f"expected the text of a byte-level BPE vocabulary")
    for key, v in metadata.items():
        if not key.startswith("tokenizer."):
            continue
        if key == "tokenizer.chat_template" or key.startswith("tokenizer.chat_template."):
            if not isinstance(v, str):
                fail(key, v, "a string (a Jinja template)")
        elif key.startswith("tokenizer.ggml.") and key.endswith("_token_id"):
            if not _is_int(v):
                fail(key, v, "an integer token id")
        elif key.startswith("tokenizer.ggml.") and key[len("tokenizer.ggml."):] in _TOKENIZER_SCALARS:
            what, test = _TOKENIZER_SCALARS[key[len("tokenizer.ggml."):]]
            if not test(v):
                fail(key, v, what)


# -- writing ------------------------------------------------------------------------------------------

class _Writer(GGUFWriter):
    """GGUFWriter, plus empty arrays (valid GGUF, which `GGUFWriter._pack_val` refuses)."""

    def _pack_val(self, val, vtype, add_vtype, sub_type=None):
        if vtype == _T.ARRAY and len(val) == 0:
            head = self._pack("I", vtype) if add_vtype else b""
            return head + self._pack("I", sub_type) + self._pack("Q", 0)
        return super()._pack_val(val, vtype, add_vtype, sub_type=sub_type)


def _np_value_type(dt: np.dtype, key: str) -> GGUFValueType:
    if dt.kind == "b":
        return _T.BOOL
    if dt.kind in "US" or dt == np.dtype(object):
        return _T.STRING
    for t, d in _DTYPES.items():
        if t != _T.BOOL and d.kind == dt.kind and d.itemsize == dt.itemsize:
            return t
    if dt.kind == "f" and dt.itemsize == 2:
        return _T.FLOAT32
    raise ValueError(f"metadata key {key!r}: NumPy dtype {dt} has no GGUF value type")


def _scalar_type(v, key: str) -> GGUFValueType:
    if isinstance(v, np.generic):
        return _np_value_type(v.dtype, key)
    if isinstance(v, bool):
        return _T.BOOL
    if isinstance(v, int):
        for t in (_T.UINT32, _T.INT32, _T.INT64, _T.UINT64):
            lo, hi = _INT_RANGE[t]
            if lo <= v <= hi:
                return t
        raise ValueError(f"metadata key {key!r}: integer {v} does not fit any GGUF integer type")
    if isinstance(v, float):
        return _T.FLOAT32
    if isinstance(v, (str, bytes)):
        return _T.STRING
    raise ValueError(f"metadata key {key!r}: cannot store a {type(v).__name__} in GGUF; expected bool, int, float, "
                     f"str or a list of one of those")


def _array_type(v, key: str) -> GGUFValueType:
    if isinstance(v, np.ndarray):
        return _np_value_type(v.dtype, key)
    if len(v) == 0:
        raise ValueError(f"metadata key {key!r}: empty array; give its element type in value_types")
    kinds = {_scalar_type(x, key) if not isinstance(x, (list, tuple, np.ndarray)) else _T.ARRAY for x in v}
    if _T.ARRAY in kinds:
        raise ValueError(f"metadata key {key!r}: nested arrays cannot be stored in GGUF")
    if len(kinds) == 1 and (not kinds <= _INT_TYPES or all(isinstance(x, np.generic) for x in v)):
        return kinds.pop()   # one kind: bools, floats, strings, or NumPy integers of one dtype
    if kinds <= _INT_TYPES:   # Python ints: the smallest of INT32, UINT32, INT64, UINT64 that holds them
        lo, hi = min(v), max(v)
        for t in (_T.INT32, _T.UINT32, _T.INT64, _T.UINT64):
            if _INT_RANGE[t][0] <= lo and hi <= _INT_RANGE[t][1]:
                return t
    if kinds <= _INT_TYPES | {_T.FLOAT32, _T.FLOAT64}:
        return _T.FLOAT64 if _T.FLOAT64 in kinds else _T.FLOAT32
    raise ValueError(f"metadata key {key!r}: array mixes element types "
                     f"{sorted(k.name for k in kinds)}; GGUF arrays hold one type")


def _check_scalar(x, t: GGUFValueType, key: str):
    """x as the Python value GGUFWriter packs for type t, or ValueError naming the key."""
    bad = lambda why: ValueError(f"metadata key {key!r}: {x!r} cannot be stored as {t.name}: {why}")
    if t == _T.STRING:
        if isinstance(x, bytes):
            return x
        if isinstance(x, (str, np.str_)):
            return str(x).encode("utf-8", "surrogateescape")
        raise bad("expected a str")
    if t == _T.BOOL:
        if isinstance(x, (bool, np.bool_)):
            return bool(x)
        raise bad("expected a bool")
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise bad("expected a number")
    if t in _INT_RANGE:
        if not isinstance(x, numbers.Integral):
            raise bad("expected an integer")
        lo, hi = _INT_RANGE[t]
        if not lo <= int(x) <= hi:
            raise bad(f"out of range [{lo}, {hi}]")
        return int(x)
    x = float(x)
    if t == _T.FLOAT32 and np.isfinite(x) and abs(x) > float(np.finfo(np.float32).max):
        raise bad("too large for float32")
    return x


def _normalize_type(vt, value, key: str):
    """(vtype, sub_type) from a value_types entry (or None: inferred from the value)."""
    is_array = isinstance(value, (list, tuple, np.ndarray))
    if vt is None:
        return (_T.ARRAY, _array_type(value, key)) if is_array else (_scalar_type(value, key), None)
    if isinstance(vt, tuple):
        if len(vt) != 2 or _T(vt[0]) != _T.ARRAY:
            raise ValueError(f"value_types[{key!r}] = {vt!r}; expected a GGUFValueType or (ARRAY, elem_type)")
        vt, sub = _T(vt[0]), _T(vt[1])
    else:
        vt = _T(vt)
        vt, sub = (_T.ARRAY, None if vt == _T.ARRAY else vt) if is_array else (vt, None)
    if vt == _T.ARRAY:
        if not is_array:
            raise ValueError(f"metadata key {key!r}: value_types says ARRAY but the value is a "
                             f"{type(value).__name__}")
        if sub is None:
            sub = _array_type(value, key)
        if sub == _T.ARRAY:
            raise ValueError(f"metadata key {key!r}: nested arrays cannot be stored in GGUF")
        return vt, sub
    if is_array:
        raise ValueError(f"metadata key {key!r}: value_types says {vt.name} but the value is an array")
    return vt, None


_GGUF_TYPES = {int(t): t for t in GGMLQuantizationType}


def _tensor_args(name: str, x):
    """(array to write, raw_shape, raw_dtype) for GGUFWriter.add_tensor."""
    nb = len(name.encode("utf-8", "surrogateescape"))
    if nb >= GGML_MAX_NAME:
        raise ValueError(f"tensor {name!r}: name is {nb} bytes; ggml needs < {GGML_MAX_NAME} (GGML_MAX_NAME)")
    shape = tuple(x.shape)
    if len(shape) > GGML_MAX_DIMS or any(d < 1 for d in shape):
        raise ValueError(f"tensor {name!r}: numpy shape {shape}; GGUF needs 0..{GGML_MAX_DIMS} dims, each >= 1")
    if isinstance(x, QTensor):
        if int(x.type) not in _GGUF_TYPES:
            # a type gguf-py does not know yet (Q2_0): whole blocks as opaque items and the element shape,
            # which GGUFWriter then writes as given (it converts only uint8 byte shapes, with its own table)
            blocks = np.ascontiguousarray(x.data).view(np.dtype((np.void, x.traits.type_size)))
            return blocks, shape, x.type
        # GGUFWriter turns a uint8 "byte shape" back into the logical shape with gguf's own size table
        # (40 bytes for Q8_1 where ggml has 36), so hand it the byte shape *it* expects, and the real bytes.
        return x.data, quant_shape_to_byte_shape(shape, GGMLQuantizationType(int(x.type))), x.type
    x = np.asarray(x)
    if x.dtype.name == "bfloat16":   # ml_dtypes.bfloat16: written as ggml BF16
        x = np.ascontiguousarray(x)
        return x.view(np.uint8), quant_shape_to_byte_shape(shape, GGMLType.BF16), GGMLType.BF16
    native = x.dtype.newbyteorder("=")
    if not any(native == d for d in NUMPY_DTYPES.values()):
        raise ValueError(f"tensor {name!r}: dtype {x.dtype} has no ggml type; expected one of "
                         f"{sorted(str(d) for d in NUMPY_DTYPES.values())}, a QTensor or bfloat16")
    if x.dtype != native:
        x = x.astype(native)
    return x, None, None


def save(path, metadata: Mapping[str, Any], tensors: Mapping[str, Any], *, arch: str | None = None,
         alignment: int | None = None, value_types: Mapping[str, Any] | None = None) -> Path:
    """Write a GGUF v3 file through `gguf.GGUFWriter`.

    metadata     key -> value, written in order; types from `value_types` or the rules in the module doc
    tensors      name -> ndarray (F32 F16 F64 I8 I16 I32 I64, or ml_dtypes.bfloat16) or QTensor, in NumPy
                 order (ne = shape reversed), written in order, each padded to the alignment
    arch         general.architecture, written first unless metadata has it (it must then agree)
    alignment    data alignment; None: metadata's `general.alignment`, else 32. A value other than 32 that
                 metadata does not give is added as `general.alignment` (UINT32)
    value_types  key -> GGUFValueType or (ARRAY, elem_type), e.g. a loaded file's `.value_types`

    The file is written next to `path` and renamed over it, so a file that is still mapped by `load`
    can be overwritten safely. Returns the path.
    """
    path = Path(path)
    value_types = value_types or {}
    if arch is not None and metadata.get(KEY_ARCH, arch) != arch:
        raise ValueError(f"arch={arch!r} disagrees with metadata {KEY_ARCH!r} = {metadata[KEY_ARCH]!r}")
    if KEY_ALIGNMENT in metadata:
        meta_align = metadata[KEY_ALIGNMENT]
        if alignment is not None and alignment != meta_align:
            raise ValueError(f"alignment={alignment} disagrees with metadata {KEY_ALIGNMENT!r} = {meta_align}")
        alignment = meta_align
    alignment = GGUF_DEFAULT_ALIGNMENT if alignment is None else alignment
    if not isinstance(alignment, numbers.Integral) or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"alignment {alignment!r}: expected a non-zero power of two")

    kvs = []   # (key, value, vtype, sub_type), validated before anything is written
    for key, value in metadata.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"metadata key {key!r}: expected a non-empty str")
        vt, sub = _normalize_type(value_types.get(key), value, key)
        if key == KEY_ALIGNMENT and vt != _T.UINT32:
            raise ValueError(f"metadata key {key!r} must be UINT32 (ggml reads it so), got {vt.name}")
        if vt == _T.ARRAY:
            items = value.tolist() if isinstance(value, np.ndarray) else value
            value = [_check_scalar(x, sub, key) for x in items]
        else:
            value = _check_scalar(value, vt, key)
        kvs.append((key, value, vt, sub))
    items = [(name, *_tensor_args(name, x)) for name, x in tensors.items()]

    # not mkstemp: that would leave the file mode 0600; GGUFWriter's open() gives the usual umask mode
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    w = None
    try:
        w = _Writer(tmp, arch="")   # "" adds no key: every key is written below, in order
        if arch is not None and KEY_ARCH not in metadata:
            w.add_key_value(KEY_ARCH, arch.encode("utf-8"), _T.STRING)
        for key, value, vt, sub in kvs:
            w.add_key_value(key, value, vt, sub_type=sub)
        if alignment != GGUF_DEFAULT_ALIGNMENT and KEY_ALIGNMENT not in metadata:
            w.add_custom_alignment(alignment)
        w.data_alignment = alignment
        for name, arr, raw_shape, raw_dtype in items:
            w.add_tensor(name, arr, raw_shape=raw_shape,
                         raw_dtype=None if raw_dtype is None else _GGUF_TYPES.get(int(raw_dtype), raw_dtype))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file(progress=progress_enabled())     # gguf-py's own tqdm bar, on a terminal only
        w.close()
        os.replace(tmp, path)
    except BaseException:
        if w is not None:
            w.close()
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
