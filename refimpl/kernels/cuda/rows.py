"""get_rows on the GPU: the token-embedding lookup (and any row gather), f32/f16/i32 or block-quantized sources.

Kernels:
    _gather      one thread per output element (grid_1d(n_out, 256)): out[i3, i2, i, e] = src[i3, i2,
                 rows[i3, i2, i], e], as bits -- f32 and i32 copied as uint32, f16 widened to f32 in integer
                 code exactly as NumPy's cast (NaN payloads kept). Reads 4 (2) bytes and one cached i32 index,
                 writes 4 bytes per element.
    _gather_blk  quantized sources: one thread per byte of the selected rows' blocks (grid_1d(n_sel *
                 row_bytes, 256)) copies the block bytes of the selected rows out of the table, which stays on
                 the device (uploaded once, `_device.weight`); 1 byte read and written per byte. The
                 selected blocks are then decoded on the device by `quants.dequantize_blocks` (the CUDA
                 decoders, bit-exact with refimpl.dequantize) when that module decodes the type; otherwise
                 refimpl.dequantize decodes the selected rows' QTensor on the host and the f32 rows are
                 uploaded. Either way only the selected rows are decoded.
Numerics: data movement and the reference decoders' f32 operations: identical bits to the reference.
Host sources (NumPy arrays, QTensors) are uploaded once per buffer (`_device.weight`), device sources used
in place. Not covered (run the reference on host copies, which raises its errors): bf16 and other
non-block QTensors but F32/F16, sources with strided rows, more than 4 dims, empty operands, indices not
i32, out of range or of the wrong shape.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from ...ops import movement as ref_mv
from ...dispatch import register
from ...shapes import ne4
from ...qtensor import QTensor, dequantize
from ...types import GGMLType, traits
from . import _device
from .unary import fallback

THREADS = 256


@cuda.jit(device=True)
def _f16_to_f32_bits(h):
    """NumPy's float16 -> float32 cast of the half with bits h, as f32 bits (exact; NaN payloads kept)."""
    h = np.int64(h)
    s = (h & 0x8000) << 16
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0x1F:
        return s | 0x7F800000 | (m << 13)
    if e != 0:
        return s | ((e + 112) << 23) | (m << 13)
    if m == 0:
        return s
    p = 0                                        # a subnormal: normalise the mantissa
    while (m & 0x400) == 0:
        m <<= 1
        p += 1
    return s | ((113 - p) << 23) | ((m & 0x3FF) << 13)


@cuda.jit
def _gather(src, rows, out, E, R, n, n2, f16):
    """out (n3, n2, n, E) flat uint32 bits; src (n3, n2, R, E) flat (uint32 bits, or uint16 halves when f16);
    rows (n3, n2, n) flat i32."""
    j = cuda.grid(1)
    if j >= out.shape[0]:
        return
    e = j % E
    q = j // E                                   # the output row: (i3 * n2 + i2) * n + i
    plane = q // n
    k = (plane * R + rows[q]) * E + e
    if f16:
        out[j] = np.uint32(_f16_to_f32_bits(src[k]))
    else:
        out[j] = src[k]


@cuda.jit
def _gather_blk(src, rows, out, row_bytes, R, n):
    """out (n_sel, row_bytes) flat uint8: the bytes of the selected rows of src (planes * R, row_bytes) flat."""
    j = cuda.grid(1)
    if j >= out.shape[0]:
        return
    q = j // row_bytes
    b = j % row_bytes
    out[j] = src[((q // n) * R + rows[q]) * row_bytes + b]


def _indices(a_shape, rows):
    """rows as (host copy, device flat i32 array) when they are valid for a source of a_shape, else None."""
    host = _device.to_host(rows)
    if host.dtype != np.int32 or host.ndim > 3 or host.size == 0 or len(a_shape) > 4 or 0 in a_shape:
        return None
    na, nr = ne4(a_shape), ne4(host.shape)
    if na[2] != nr[1] or na[3] != nr[2] or nr[3] != 1 or host.min() < 0 or host.max() >= na[1]:
        return None
    dev = rows if _device.is_device(rows) else _device.to_device(host)
    return host, dev.reshape(host.size)


def _out_shape(na, host_rows):
    nr = ne4(host_rows.shape)
    return tuple(reversed([na[0], nr[0], nr[1], nr[2]]))[4 - max(host_rows.ndim + 1, 1):]


def _source(a):
    """(device values of a, its element dtype) for an f32/f16/i32 source with packed rows, else None."""
    if _device.is_device(a):
        ok = np.dtype(a.dtype) in (np.float32, np.float16, np.int32) and a.is_c_contiguous()
        return (a, np.dtype(a.dtype)) if ok else None
    if isinstance(a, QTensor) and a.type in (GGMLType.F32, GGMLType.F16):
        dw = _device.weight(a)
        return dw.data, np.dtype(np.float32 if a.type == GGMLType.F32 else np.float16)
    if isinstance(a, np.ndarray) and a.ndim and (a.shape[-1] <= 1 or a.strides[-1] == a.itemsize):
        if a.dtype in (np.float32, np.float16):
            return _device.weight(a).data, a.dtype
        if a.dtype == np.int32:
            return _device.to_device(a), a.dtype
    return None


def _gather_values(dsrc, dtype, idx, shape):
    host, drows = idx
    na = ne4(shape)
    out_shape = _out_shape(na, host)
    n_out = na[0] * host.size
    out = cuda.device_array(n_out, np.int32 if dtype == np.int32 else np.float32)
    f16 = dtype == np.float16
    src = dsrc.reshape(dsrc.size).view(np.uint16 if f16 else np.uint32)
    blocks, threads = _device.grid_1d(n_out, THREADS)
    _gather[blocks, threads](src, drows, out.view(np.uint32), na[0], na[1], host.shape[-1], na[2], f16)
    return out.reshape(*out_shape)


def _device_decoder(t):
    """quants.dequantize_blocks when the CUDA decoders cover type t, else None (then the host decodes)."""
    try:
        from . import quants
    except ImportError:
        return None
    covered = t in getattr(quants, "DECODERS", {}) or t in getattr(quants, "ELEMENTS", {})
    return getattr(quants, "dequantize_blocks", None) if covered else None


def _gather_quantized(a: QTensor, idx):
    host, drows = idx
    na = ne4(a.shape)
    tr = traits(a.type)
    out_shape = _out_shape(na, host)
    decode = _device_decoder(a.type)
    if decode is None:
        d4 = a.data.reshape(na[3], na[2], na[1], a.data.shape[-1])
        r3 = host.reshape(na[3], na[2], host.shape[-1])
        sel = d4[np.arange(na[3])[:, None, None], np.arange(na[2])[None, :, None], r3]
        vals = dequantize(QTensor(a.type, sel, (na[3], na[2], host.shape[-1], na[0])))
        return _device.to_device(vals.reshape(out_shape))
    dw = _device.weight(a)
    row_bytes = dw.row_bytes
    sel = cuda.device_array(host.size * row_bytes, np.uint8)
    blocks, threads = _device.grid_1d(sel.size, THREADS)
    _gather_blk[blocks, threads](dw.data.reshape(dw.data.size), drows, sel, row_bytes, na[1], host.shape[-1])
    vals = decode(a.type, sel.reshape(sel.size // tr.type_size, tr.type_size))
    return vals.reshape(*out_shape)


@register("get_rows", "cuda")
def get_rows(a, rows):
    """ggml_get_rows (see refimpl.ops.movement.get_rows): a row gather on the GPU, decoding only the selected
    rows of a quantized source."""
    shape = tuple(a.shape)
    idx = _indices(shape, rows)
    if idx is not None and isinstance(a, QTensor) and a.traits.blck_size > 1 \
            and a.type not in ref_mv.GET_ROWS_BAD:
        return _gather_quantized(a, idx)
    src = None if idx is None else _source(a)
    if src is None:
        return fallback(ref_mv.get_rows.reference, a, rows)
    return _gather_values(src[0], src[1], idx, shape)


def ptx_signatures() -> list[tuple]:
    """(dispatcher, argument types) of every kernel here, as a real launch types them."""
    from numba import types
    i8, i1, u4 = types.int64, types.int32[::1], types.uint32[::1]
    return [(_gather, (u4, i1, u4, i8, i8, i8, i8, types.boolean)),
            (_gather, (types.uint16[::1], i1, u4, i8, i8, i8, i8, types.boolean)),
            (_gather_blk, (types.uint8[::1], i1, types.uint8[::1], i8, i8, i8))]
