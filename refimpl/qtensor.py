"""QTensor: a tensor stored in ggml's block format, plus `quantize` and `dequantize`.

Shapes are NumPy order (ggml `ne` reversed). A QTensor of logical shape `(..., n)` (n elements per row,
a multiple of the block size) holds `data`, raw bytes of NumPy shape `(..., row_bytes)`: each row is
`n // blck_size` consecutive blocks, exactly as ggml lays them out in memory and in GGUF files.
"""
from __future__ import annotations

import math

import numpy as np

from .types import as_type, traits

__all__ = ["QTensor", "quantize", "dequantize"]


def _fmt(shape) -> str:
    return f"ne {list(shape[::-1])} (numpy {tuple(shape)})"


class QTensor:
    """A block-quantized (or BF16/F16/F32-as-bytes) tensor.

    type   GGMLType
    shape  logical NumPy shape; ne = shape[::-1]
    data   uint8 ndarray of NumPy shape shape[:-1] + (row_bytes,); may be a read-only memmap view

    Indexing selects along the leading (row) axes and returns a QTensor view; the row axis itself can only
    be taken whole. `np.asarray(qt)` dequantizes to float32; nothing else dequantizes implicitly.
    """

    __slots__ = ("type", "data", "shape", "__weakref__")      # weak references: caches keyed by a weight
    __array_priority__ = 10

    def __init__(self, type, data: np.ndarray, shape):
        t = as_type(type)
        tr = traits(t)
        shape = tuple(int(s) for s in shape)
        if not shape:
            raise ValueError(f"QTensor of {tr.name} needs at least one dimension")
        n = shape[-1]
        if n % tr.blck_size:
            raise ValueError(f"QTensor of {tr.name}: row length {n} ({_fmt(shape)}) is not a multiple of "
                             f"the block size {tr.blck_size}")
        data = np.asarray(data)
        if data.dtype != np.uint8:
            raise TypeError(f"QTensor data must be uint8 bytes, got {data.dtype}")
        want = shape[:-1] + (n // tr.blck_size * tr.type_size,)
        if data.shape != want:
            raise ValueError(f"QTensor of {tr.name} with {_fmt(shape)} needs data of numpy shape {want}, "
                             f"got {data.shape}")
        if data.strides[-1] != 1:
            raise ValueError("QTensor rows must be contiguous bytes (data.strides[-1] == 1)")
        self.type, self.data, self.shape = t, data, shape

    def layout_key(self) -> tuple:
        """What a layout check reads of this tensor (refimpl.dispatch._layout_key): type, shape, the bytes' strides."""
        return (self.type, self.shape, self.data.strides)

    @classmethod
    def from_bytes(cls, raw, type, shape) -> "QTensor":
        """Wrap raw ggml bytes (bytes, bytearray, memoryview or uint8 array) without copying."""
        t, shape = as_type(type), tuple(int(s) for s in shape)
        tr = traits(t)
        if not shape or any(s < 0 for s in shape):
            raise ValueError(f"{tr.name} tensor shape {shape}: expected at least one dimension, none negative")
        buf = np.frombuffer(raw, np.uint8) if not isinstance(raw, np.ndarray) else raw.reshape(-1)
        if shape[-1] % tr.blck_size:
            raise ValueError(f"{tr.name}: row length {shape[-1]} ({_fmt(shape)}) is not a multiple of "
                             f"the block size {tr.blck_size}")
        rb = shape[-1] // tr.blck_size * tr.type_size
        need = rb * int(np.prod(shape[:-1], dtype=np.int64))
        if buf.size != need:
            raise ValueError(f"{tr.name} tensor with {_fmt(shape)} needs {need} bytes, got {buf.size}")
        return cls(t, buf.reshape(shape[:-1] + (rb,)), shape)

    # -- shape ------------------------------------------------------------------------------------
    @property
    def ne(self) -> list[int]:
        return list(self.shape[::-1])

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)          # (not np.prod: slow on a cold call, and this is called per op)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    @property
    def traits(self):
        return traits(self.type)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key) -> "QTensor":
        key = key if isinstance(key, tuple) else (key,)
        lead = len(self.shape) - 1
        if any(k is None for k in key):
            raise IndexError("QTensor indexing does not add axes (np.newaxis)")
        if Ellipsis in key:
            i = key.index(Ellipsis)
            rest = [k for k in key if k is not Ellipsis]
            key = key[:i] + (slice(None),) * (lead + 1 - len(rest)) + key[i + 1:]   # NumPy's meaning
            if Ellipsis in key:
                raise IndexError("an index can only have a single ellipsis ('...')")
        if len(key) == lead + 1 and isinstance(key[-1], slice) and key[-1] == slice(None):
            key = key[:-1]                     # q[i, :] -- the whole row, which is the only choice
        if len(key) > lead:
            raise IndexError(f"QTensor of {_fmt(self.shape)}: only the {lead} leading (row) axes can be "
                             f"indexed; a row of {self.shape[-1]} elements is taken whole")
        data = self.data[key + (slice(None),)]
        if data.ndim == 0:
            raise IndexError("QTensor index removed the row axis")
        lead_shape = data.shape[:-1]
        return QTensor(self.type, data, lead_shape + (self.shape[-1],))

    def reshape(self, *shape) -> "QTensor":
        """Reshape the leading axes (the row length must stay); a view when the rows allow it."""
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        shape = tuple(int(s) for s in shape)
        if -1 in shape[:-1]:
            known = int(np.prod([s for s in shape[:-1] if s != -1], dtype=np.int64))
            rows = self.size // self.shape[-1]
            shape = tuple(rows // known if s == -1 else s for s in shape[:-1]) + shape[-1:]
        if shape[-1] != self.shape[-1] or np.prod(shape, dtype=np.int64) != self.size:
            raise ValueError(f"cannot reshape QTensor of {_fmt(self.shape)} to {_fmt(shape)}: only the "
                             f"leading axes can change")
        return QTensor(self.type, self.data.reshape(shape[:-1] + self.data.shape[-1:]), shape)

    # -- conversion -------------------------------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        out = dequantize(self)
        return out if dtype is None else out.astype(dtype)

    def dequantize(self) -> np.ndarray:
        return dequantize(self)

    def tobytes(self) -> bytes:
        return np.ascontiguousarray(self.data).tobytes()

    def __eq__(self, other):  # byte identity, not element-wise comparison
        return (isinstance(other, QTensor) and self.type == other.type and self.shape == other.shape
                and np.array_equal(self.data, other.data))

    __hash__ = None

    def __repr__(self) -> str:
        return f"QTensor({traits(self.type).name}, {_fmt(self.shape)}, {self.nbytes} bytes)"


def quantize(x, type, *, method: str = "chunk") -> QTensor:
    """Quantize an array to a ggml type with ggml's reference quantizer (no importance matrix).

    x     numpy (..., n) float (converted to f32), n a multiple of the type's block size
    type  GGMLType, its number or its name ("q4_0")
    method "chunk" (default): `ggml_quantize_chunk` as llama-quantize runs it; "ref": the type traits'
           `quantize_row_*_ref`; "cpu": the x86 CPU backend's `from_float` (activations, `cpy`).
           They differ only for Q8_0/Q8_1 ("cpu" rounds half to even with 127/amax) and IQ4_NL
           ("chunk" runs a 15-step scale search); see docs/types.md.
    """
    from .dispatch import kernel_for
    from .quants import get_quantizer
    t = as_type(type)
    tr = traits(t)
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0:
        raise ValueError(f"quantize to {tr.name}: need at least one dimension, got a scalar")
    n = x.shape[-1]
    if n % tr.blck_size:
        raise ValueError(f"quantize to {tr.name}: row length {n} ({_fmt(x.shape)}) is not a multiple of "
                         f"the block size {tr.blck_size}")
    fn = get_quantizer(t, method)
    fn = kernel_for(fn) or fn                   # a compiled kernel of the same function, if the backend has one
    blocks = np.ascontiguousarray(x).reshape(-1, tr.blck_size)
    raw = fn(blocks) if blocks.shape[0] else np.zeros((0, tr.type_size), np.uint8)
    if raw.shape != (blocks.shape[0], tr.type_size) or raw.dtype != np.uint8:
        raise AssertionError(f"{tr.name} quantizer returned {raw.dtype}{raw.shape}")
    return QTensor(t, raw.reshape(x.shape[:-1] + (n // tr.blck_size * tr.type_size,)), x.shape)


_DQ: dict = {}


def dequantize(qt) -> np.ndarray:
    """Float32 values of a QTensor, bit-exact with ggml's `to_float` for its type.

    A plain ndarray is returned as float32 (F16/F32/F64 values converted exactly where possible).
    """
    if not isinstance(qt, QTensor):
        x = np.asarray(qt) if qt is not None else None
        if x is None or x.dtype.kind not in "biuf":
            raise ValueError(f"dequantize: expected a QTensor or an array of numbers, got {type(qt).__name__}"
                             + (f" of {x.dtype}" if x is not None else ""))
        return x.astype(np.float32)
    if not _DQ:                                 # imported on first use (refimpl.quants imports this module)
        from .dispatch import kernel_for
        from .quants import DEQUANTIZERS
        from .quants import CHUNK
        _DQ.update(kernel_for=kernel_for, DEQUANTIZERS=DEQUANTIZERS, CHUNK=CHUNK)
    kernel_for, CHUNK = _DQ["kernel_for"], _DQ["CHUNK"]
    tr = traits(qt.type)
    fn = _DQ["DEQUANTIZERS"].get(qt.type)
    if fn is None:
        raise ValueError(f"ggml type {tr.name} has no dequantizer")
    nb = qt.shape[-1] // tr.blck_size
    rows = qt.size // qt.shape[-1] if qt.shape[-1] else 0
    if rows == 0 or nb == 0:
        return np.zeros(qt.shape, np.float32)
    blocks = np.ascontiguousarray(qt.data).reshape(rows * nb, tr.type_size)
    # Blocks are independent: decode CHUNK elements at a time straight into the result, so that the
    # dequantizer's temporaries stay in cache (a dequantizer fills and returns the `out` slice it is
    # given; one that returns another array is copied in). inf/NaN scales are part of every format:
    # no warnings.
    out = np.empty((rows * nb, tr.blck_size), np.float32)
    k = kernel_for(fn)                          # a compiled kernel fills all blocks in one call
    if k is not None:
        return k(blocks, out=out).reshape(qt.shape)
    step = max(1, CHUNK // tr.blck_size)
    with np.errstate(all="ignore"):
        for i in range(0, len(blocks), step):
            part = out[i:i + step]
            got = fn(blocks[i:i + step], out=part)
            if got is not part:
                part[...] = got
    return out.reshape(qt.shape)
