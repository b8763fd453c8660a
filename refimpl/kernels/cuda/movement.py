"""Data movement on the GPU: what the models copy between ops (permuted heads, KV-cache rows, concat, pad).

Kernels (one thread per output element; `_device.grid_1d(n, THREADS)` blocks of THREADS = 256 threads):

    _gather     dst.flat[i] = src.flat[sum_d o_d * stride_d], o = the 4-D index of i in dst's shape, or 0
                where o_d >= limit_d. One kernel for a permuted copy (strides permuted), a broadcast (stride 0),
                a cast (dst of another dtype: one rounding, as NumPy's astype) and zero padding (limits).
                Traffic: reads one src element, writes one dst element (permuted reads are not coalesced).
    _concat     out = [a, b] along one axis of (outer, n, inner): reads one element of a or b, writes one.
    _copy_flat  dst.flat[i] = src.flat[i] with a cast: the KV-cache row writes (dst a contiguous view of the
                cache). Reads one element, writes one; coalesced.
    _fill       dst.flat[i] = value (a fresh cache or state). Writes one element.

Functions the models call with device arrays (`_device.is_device`), all results contiguous device arrays:

    permute(x, axes)       np.ascontiguousarray(x.transpose(axes))      (x contiguous, ndim <= 4)
    broadcast(x, shape)    np.ascontiguousarray(np.broadcast_to(x, shape))
    cast(x, dtype)         x.astype(dtype)
    pad_rows(x, n)         np.pad(x, ((0, n - len(x)), (0, 0), ...))    zeros after the rows
    assign(dst, src)       dst[...] = src for a contiguous view dst (a cache row range), cast to dst's dtype
    zeros(shape, dtype), full(shape, value, dtype), clone(x)

    _scatter_rows  dst[idx[r] * E + e] = src[r * E + e]: set_rows into a cache or state plane, in place.
                Reads one element, writes one.

Registered ops (device inputs; NumPy inputs, QTensors and non-contiguous views run the reference on host
copies, uploaded): `concat`, `cont`, `dup`, `permute` (the permuted values, contiguous), `cast` (f32/f16),
`repeat` (size-1 axes stretched), `set_rows` (in place into a device destination, as ggml writes its KV
cache). All copy values unchanged or round once as the reference, so they equal it bit for bit (tolerance
table: ("concat", "*", "ggml") and ("cont", "*", "ggml") are exact). `state_copy` is the backend's
refimpl.backends.state_copy: a writable device copy (never the upload-once cache's).
"""
from __future__ import annotations

import numpy as np
from numba import cuda, types

from ...ops import movement as ref
from ...dispatch import register
from ...shapes import fail, ne4
from ...types import NUMPY_DTYPES, as_type
from . import _device

THREADS = 256
_NUMBA_DTYPES = (np.float32, np.float16, np.int32)      # element types the kernels move (ggml f32/f16/i32)


# -- kernels ----------------------------------------------------------------------------------------------

@cuda.jit
def _gather(src, dst, n1, n2, n3, s0, s1, s2, s3, l0, l1, l2, l3):
    i = cuda.grid(1)
    if i >= dst.size:
        return
    o3 = i % n3
    r = i // n3
    o2 = r % n2
    r = r // n2
    o1 = r % n1
    o0 = r // n1
    if o0 >= l0 or o1 >= l1 or o2 >= l2 or o3 >= l3:
        dst[i] = 0
    else:
        dst[i] = src[o0 * s0 + o1 * s1 + o2 * s2 + o3 * s3]


@cuda.jit
def _concat(a, b, out, na, nb, inner):
    i = cuda.grid(1)
    if i >= out.size:
        return
    r = i % inner
    q = i // inner
    j = q % (na + nb)
    o = q // (na + nb)
    if j < na:
        out[i] = a[(o * na + j) * inner + r]
    else:
        out[i] = b[(o * nb + j - na) * inner + r]


@cuda.jit
def _copy_flat(src, dst):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i]


@cuda.jit
def _fill(dst, value):
    i = cuda.grid(1)
    if i < dst.size:
        dst[i] = value


def ptx_signatures() -> list[tuple]:
    """(dispatcher, argument types) of every kernel as the models launch it (f32 activations, f16 caches)."""
    f32, f16, i64 = types.float32[::1], types.float16[::1], types.int64
    return [(_gather, (src, dst) + (i64,) * 11) for src, dst in ((f32, f32), (f16, f32), (f32, f16))] + [
        (_concat, (f32, f32, f32, i64, i64, i64)),
        (_copy_flat, (f32, f32)), (_copy_flat, (f32, f16)), (_copy_flat, (f16, f32)),
        (_fill, (f32, types.float32)), (_fill, (f16, types.float16)),
        (_scatter_rows, (f32, types.int64[::1], f32, i64)), (_scatter_rows, (f32, types.int64[::1], f16, i64))]


# -- launchers ----------------------------------------------------------------------------------------------

def _flat(x):
    """A contiguous device array as 1-D (a view)."""
    return x.reshape(x.size) if x.ndim != 1 else x


def _c_strides(shape) -> list[int]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return out[::-1]


def _launch_gather(src, out, strides, limits=None):
    """out (contiguous, ndim <= 4) from the flat contiguous src: out[o] = src.flat[o . strides], 0 past limits."""
    pad = 4 - out.ndim
    shape = (1,) * pad + tuple(out.shape)
    st = [0] * pad + list(strides)
    lim = shape if limits is None else (1,) * pad + tuple(limits)
    if out.size:
        blocks, threads = _device.grid_1d(out.size, THREADS)
        _gather[blocks, threads](_flat(src), _flat(out), shape[1], shape[2], shape[3], *st, *lim)
    return out


def _check(name: str, x):
    if not _device.is_device(x) or not x.is_c_contiguous():
        raise ValueError(f"movement.{name}: expected a contiguous device array, got {type(x).__name__} "
                         f"of numpy shape {tuple(x.shape)}")
    if x.ndim > 4:
        raise ValueError(f"movement.{name}: ggml tensors have at most 4 dims, got numpy shape {tuple(x.shape)}")


def permute(x, axes):
    """np.ascontiguousarray(x.transpose(axes)) for a contiguous device array x (ndim <= 4)."""
    _check("permute", x)
    axes = tuple(int(a) for a in axes)
    if sorted(axes) != list(range(x.ndim)):
        raise ValueError(f"movement.permute: axes {axes} are not a permutation of {x.ndim} axes")
    st = _c_strides(x.shape)
    out = cuda.device_array(tuple(x.shape[a] for a in axes), x.dtype)
    return _launch_gather(x, out, [st[a] for a in axes])


def broadcast(x, shape):
    """np.ascontiguousarray(np.broadcast_to(x, shape)) for a contiguous device array x."""
    _check("broadcast", x)
    shape = tuple(int(n) for n in shape)
    lead = len(shape) - x.ndim
    xs = (1,) * lead + tuple(x.shape)
    if lead < 0 or any(a not in (1, b) for a, b in zip(xs, shape)):
        raise ValueError(f"movement.broadcast: numpy shape {tuple(x.shape)} does not broadcast to {shape}")
    st = [0 if a == 1 else s for a, s in zip(xs, _c_strides(xs))]
    return _launch_gather(x, cuda.device_array(shape, x.dtype), st)


def cast(x, dtype):
    """x.astype(dtype) (one rounding per element, as NumPy) for a contiguous device array x."""
    _check("cast", x)
    if np.dtype(x.dtype) == np.dtype(dtype):
        return x
    out = cuda.device_array(tuple(x.shape), dtype)
    if x.size:
        _copy_flat[_device.grid_1d(x.size, THREADS)](_flat(x), _flat(out))
    return out


def pad_rows(x, n: int):
    """x with zero rows appended along axis 0 up to n rows (np.pad); x itself when it has n rows already."""
    _check("pad_rows", x)
    if n == x.shape[0]:
        return x
    if n < x.shape[0]:
        raise ValueError(f"movement.pad_rows: {x.shape[0]} rows do not fit in {n}")
    out = cuda.device_array((int(n),) + tuple(x.shape)[1:], x.dtype)
    return _launch_gather(x, out, _c_strides(x.shape), limits=x.shape)


def assign(dst, src):
    """dst[...] = src, cast to dst's dtype: dst a contiguous device view (e.g. cache.k[il, pos:pos + T]), src
    a device or host array of dst's size."""
    _check("assign", dst)
    src = _device.to_device(src)
    if src.size != dst.size:
        raise ValueError(f"movement.assign: {src.size} elements (numpy {tuple(src.shape)}) into "
                         f"{dst.size} (numpy {tuple(dst.shape)})")
    if not src.is_c_contiguous():
        raise ValueError("movement.assign: the source must be contiguous")
    if dst.size:
        _copy_flat[_device.grid_1d(dst.size, THREADS)](_flat(src), _flat(dst))
    return dst


def full(shape, value, dtype=np.float32):
    out = cuda.device_array(tuple(int(n) for n in shape), dtype)
    if out.size:
        _fill[_device.grid_1d(out.size, THREADS)](_flat(out), np.dtype(dtype).type(value))
    return out


def zeros(shape, dtype=np.float32):
    return full(shape, 0, dtype)


def clone(x):
    """A device copy of a contiguous device array (a device-to-device memcpy)."""
    _check("clone", x)
    out = cuda.device_array(tuple(x.shape), x.dtype)
    if x.size:
        out.copy_to_device(x)
    return out


# -- registered ops ---------------------------------------------------------------------------------------

def _movable(*xs) -> bool:
    """All device arrays, contiguous, of one element type the kernels move (others go to the reference)."""
    return all(_device.is_device(x) and x.is_c_contiguous() and x.ndim <= 4 for x in xs) and \
        len({np.dtype(x.dtype) for x in xs}) == 1 and np.dtype(xs[0].dtype) in [np.dtype(t) for t in _NUMBA_DTYPES]


def _reference(fn, *args, **kwargs):
    return _device.to_device(fn(*[_device.to_host(a) for a in args], **kwargs))


@register("concat", "cuda")
def concat(a, b, dim: int):
    """ggml_concat of two device arrays (see refimpl.ops.movement.concat); a copy, bit-exact."""
    if not (_device.is_device(a) or _device.is_device(b)):
        return _reference(ref.concat.reference, a, b, dim)
    if not _movable(_device.to_device(a), _device.to_device(b)):
        return _reference(ref.concat.reference, a, b, dim)
    a, b = _device.to_device(a), _device.to_device(b)
    sa, sb = tuple(a.shape), tuple(b.shape)
    if not 0 <= dim < 4:
        fail("concat", f"dim {dim} must be 0..3 (a ggml dim)", a=sa, b=sb)
    na, nb = ne4(sa), ne4(sb)
    if any(na[d] != nb[d] for d in range(4) if d != dim):
        fail("concat", f"a and b must agree on every dim but {dim}", a=sa, b=sb)
    out4 = [x + (y if d == dim else 0) for d, (x, y) in enumerate(zip(na, nb))][::-1]
    inner = int(np.prod(out4[4 - dim:]))
    nd = max(len(sa), len(sb), dim + 1)
    while len(out4) > nd and out4[0] == 1:          # leading size-1 axes dropped down to nd, as the reference
        out4 = out4[1:]
    out = cuda.device_array(tuple(out4), a.dtype)
    if out.size:
        _concat[_device.grid_1d(out.size, THREADS)](_flat(a), _flat(b), _flat(out), na[dim], nb[dim], inner)
    return out


@register("cont", "cuda")
def cont(a, shape=None):
    """ggml_cont of a device array: a contiguous copy, optionally reshaped (same element count); bit-exact."""
    if not _device.is_device(a) or not _movable(a):
        return _reference(ref.cont.reference, a, shape)
    sh = tuple(a.shape) if shape is None else ref.shape_of("cont", shape)
    if int(np.prod(sh, dtype=np.int64)) != a.size:
        fail("cont", "a and the destination must have the same number of elements", a=tuple(a.shape), dst=sh)
    if len(sh) > 4:
        fail("cont", "ggml tensors have at most 4 dims", a=tuple(a.shape), dst=sh)
    return clone(a).reshape(sh)


@register("dup", "cuda")
def dup(a):
    """ggml_dup of a device array: a device copy (bit-exact). Anything else: the reference."""
    if not (_device.is_device(a) and _movable(a)):
        return NotImplemented
    return clone(a)


@register("permute", "cuda")
def permute_op(a, axis0: int, axis1: int, axis2: int, axis3: int):
    """ggml_permute of a device array: its values in the permuted order, as a contiguous device array.

    ggml's permute is a view; device arrays here are contiguous and no op writes through a permuted view, so
    the values (bit-exact) are all a caller can observe. NumPy arrays get the reference's view."""
    if not (_device.is_device(a) and _movable(a)):
        return NotImplemented
    p = ref.permute_axes(axis0, axis1, axis2, axis3, a)
    nd = a.ndim
    out = permute(a.reshape((1,) * (4 - nd) + tuple(a.shape)), p)
    sh = tuple(out.shape)
    while len(sh) > max(nd, 1) and sh[0] == 1:        # leading size-1 axes dropped, as the reference
        sh = sh[1:]
    return out.reshape(sh)


@register("cast", "cuda")
def cast_op(a, type):  # noqa: A002  (the op's own argument name)
    """ggml_cast of a device f32/f16 array to f32/f16 (one rounding, RNE): a new device array."""
    if not (_device.is_device(a) and _movable(a)) or np.dtype(a.dtype) == np.dtype(np.int32):
        return NotImplemented
    try:
        dt = NUMPY_DTYPES.get(as_type(type))
    except (TypeError, ValueError, KeyError):
        try:
            dt = np.dtype(type)
        except TypeError:
            return NotImplemented                         # the reference raises its error
    if dt not in (np.dtype(np.float32), np.dtype(np.float16)):
        return NotImplemented
    return clone(a) if np.dtype(a.dtype) == dt else cast(a, dt)


@register("repeat", "cuda")
def repeat_op(a, b):
    """ggml_repeat of a device array where the tiling only stretches size-1 axes (NumPy's broadcast, the
    models' case); other tilings run the reference."""
    if not (_device.is_device(a) and _movable(a)):
        return NotImplemented
    sh = tuple(b.shape) if hasattr(b, "shape") else ref.shape_of("repeat", b)
    xs = (1,) * (len(sh) - a.ndim) + tuple(a.shape)
    if len(sh) > 4 or len(xs) != len(sh) or any(x not in (1, y) for x, y in zip(xs, sh)):
        return NotImplemented
    return broadcast(a, sh)


@cuda.jit
def _scatter_rows(src, idx, dst, width):
    i = cuda.grid(1)
    if i >= src.size:
        return
    dst[idx[i // width] * width + i % width] = src[i]


@register("set_rows", "cuda")
def set_rows(a, b, c, out=None):
    """ggml_set_rows into a device array: the KV-cache and recurrent-state writes. Covered: a a contiguous
    f32/f16 device array of rows (numpy (R, E), or more axes of one plane) written in place (out=a, as ggml
    does) or into a copy (out=None); b f32 rows (device or host) of a's row length; c distinct int32/int64
    indices in range. One thread per element of b; f32 -> f16 rounds to nearest even, as ggml's from_float.
    Anything else runs the reference on host copies (a device `out` then receives its values)."""
    if not _device.is_device(a):
        return NotImplemented                             # a NumPy destination: the reference, in place
    if out is not None and out is not a:
        return _set_rows_reference(a, b, c, out)
    ci = np.asarray(_device.to_host(c))
    sa, sb = tuple(a.shape), tuple(b.shape)
    E = sa[-1] if sa else 0
    R = a.size // E if E else 0
    ok = (_movable(a) and np.dtype(a.dtype) in (np.dtype(np.float32), np.dtype(np.float16))
          and ci.dtype in (np.int32, np.int64) and ci.ndim == 1 and len(sb) >= 1 and len(sa) >= 2
          and all(n == 1 for n in sa[:-2]) and sb[-1:] == (E,) and b.size == ci.size * E
          and np.dtype(b.dtype) == np.dtype(np.float32))
    if ok and ci.size:
        ok = bool(ci.min() >= 0 and ci.max() < R and np.unique(ci).size == ci.size)
    if not ok:
        return _set_rows_reference(a, b, c, out)
    dst = a if out is a else clone(a)
    src = _device.to_device(b)
    if not src.is_c_contiguous():
        return _set_rows_reference(a, b, c, out)
    if src.size:
        idx = cuda.to_device(np.ascontiguousarray(ci, np.int64))
        _scatter_rows[_device.grid_1d(src.size, THREADS)](_flat(src), idx, _flat(dst), E)
    return dst


def _set_rows_reference(a, b, c, out):
    """The reference's values for a device destination: computed on host copies; into a device `out` (or a
    new device array when out is None)."""
    res = ref.set_rows.reference(_device.to_host(a), _device.to_host(b), _device.to_host(c))
    if out is None:
        return _device.to_device(res) if isinstance(res, np.ndarray) else res
    if not _device.is_device(out) or tuple(out.shape) != tuple(res.shape) or \
            np.dtype(out.dtype) != np.dtype(res.dtype):
        fail("set_rows", "out must be a writeable array of a's shape and dtype", a=tuple(a.shape),
             out=tuple(getattr(out, "shape", ())))
    out.copy_to_device(np.ascontiguousarray(res))
    return out


def state_copy(x):
    """A writable device copy of x (NumPy or device): the buffer a KV cache or a recurrent state lives in."""
    if _device.is_device(x) and x.is_c_contiguous():
        return clone(x)
    return cuda.to_device(np.array(_device.to_host(x), order="C"))
