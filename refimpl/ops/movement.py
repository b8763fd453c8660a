"""Data movement: gathers and scatters, copies and type conversions, views, tiling, padding, windows.

Conventions shared by every op here (NumPy order; ggml `ne` is the shape reversed):

* ggml dim d is NumPy axis -1-d of the 4-D tensor (`as4`): dim 0 = last axis = the row.
* Inputs are ndarrays (F32/F16/F64/I8/I16/I32/I64) or `QTensor`s (BF16 and block types). A non-contiguous
  NumPy view is the ggml view with the same strides; ggml-cpu kernels that assert on a layout (rows
  contiguous: `nb0 == type_size`, or fully contiguous) are mirrored with a GGMLShapeError, so an input
  refimpl accepts is one ggml accepts too.
* Ops that ggml runs in place on a destination (`cpy`, `set_rows`) return a new array or QTensor here;
  the destination's values are never modified.
* Nothing here rounds except the conversions of `cpy`/`cast`/`set_rows` (ggml-cpu's `from_float` of the
  destination type) and the f32 additions of `acc`, `repeat_back`, `get_rows_back`, `add_rel_pos`, which
  follow ggml's order: every op of this family matches ggml bit for bit, so numerics="exact" and "ggml"
  are the same here and no op takes a `numerics` argument.
"""
from __future__ import annotations

import functools

import numpy as np

from ..qtensor import QTensor, dequantize, quantize
from ..types import NUMPY_DTYPES, GGMLType, as_type, traits
from ..dispatch import op
from ..shapes import as4, fail, is_contiguous, ne4, nonempty, rows_packed

_DTYPE_TYPES = {dt: t for t, dt in NUMPY_DTYPES.items()}

# Destination types with a CPU `from_float` (type_traits_cpu in ggml-cpu.c): what cpy/set_rows can write.
# IQ1/IQ2/IQ3 have none (their quantizers need ggml_quantize_init): ggml-cpu would call a NULL pointer.
CPU_FROM_FLOAT = frozenset({
    GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32, GGMLType.Q1_0, GGMLType.Q2_0, GGMLType.Q4_0,
    GGMLType.Q4_1,
    GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.Q8_1, GGMLType.MXFP4, GGMLType.NVFP4,
    GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.IQ4_NL,
    GGMLType.IQ4_XS, GGMLType.Q8_K, GGMLType.TQ1_0, GGMLType.TQ2_0})
# Block types ggml can turn back into f32 (`to_float`); Q8_1 and Q8_K are activation formats without one.
_NO_TO_FLOAT = frozenset({GGMLType.Q8_1, GGMLType.Q8_K})
_FLOATS = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)


# -- helpers -------------------------------------------------------------------------------------------

def _arr(x):
    return x if isinstance(x, QTensor) else np.asarray(x)


def _type(name: str, x) -> GGMLType:
    """The ggml type of an ndarray or QTensor."""
    if isinstance(x, QTensor):
        return x.type
    t = _DTYPE_TYPES.get(np.asarray(x).dtype)
    if t is None:
        fail(name, f"no ggml type for numpy dtype {np.asarray(x).dtype}", a=x)
    return t


def _elems(x) -> np.ndarray:
    """An array of x's elements that data movement can shuffle: a BF16 QTensor as its uint16 bit patterns."""
    if isinstance(x, QTensor):
        if x.traits.blck_size != 1:
            raise TypeError("block types cannot be moved element by element")
        try:
            return x.data.view(np.uint16)
        except ValueError:
            return np.ascontiguousarray(x.data).view(np.uint16)
    return x


def _like(arr: np.ndarray, t: GGMLType):
    """Inverse of _elems: wrap uint16 bit patterns as a BF16 QTensor, else return arr."""
    if t == GGMLType.BF16:
        arr = np.ascontiguousarray(arr)
        return QTensor(t, arr.view(np.uint8).reshape(arr.shape[:-1] + (arr.shape[-1] * 2,)), arr.shape)
    return arr


def _trim(x4: np.ndarray, nd: int):
    """Drop leading size-1 axes of a 4-D result down to nd axes."""
    while x4.ndim > max(nd, 1) and x4.shape[0] == 1:
        x4 = x4[0]
    return x4


def shape_of(name: str, b) -> tuple:
    if isinstance(b, (QTensor, np.ndarray)):
        return tuple(b.shape)
    try:
        return tuple(int(n) for n in b)
    except TypeError:
        fail(name, f"expected a tensor or a NumPy-order shape, got {b!r}")


def _to_f32(x) -> np.ndarray:
    """Exact f32 values (dequantized for block types, bf16 widened, f16 widened, i32 converted as C does)."""
    if isinstance(x, QTensor):
        return dequantize(x)
    return np.asarray(x).astype(np.float32)


def _from_f32(x: np.ndarray, t: GGMLType):
    """f32 values stored as type t with ggml-cpu's `from_float` (what cpy and set_rows write)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if t == GGMLType.F32:
        return x.copy()
    if t == GGMLType.F16:
        with np.errstate(over="ignore", invalid="ignore"):
            return x.astype(np.float16)
    if t == GGMLType.I32:                      # C conversion: truncation toward zero
        with np.errstate(invalid="ignore"):
            return x.astype(np.int32)
    return quantize(x, t, method="cpu")


# -- gathers and scatters --------------------------------------------------------------------------------

# get_rows sources ggml-cpu handles: f32/i32/f16/bf16 and every block type with a to_float
GET_ROWS_BAD = frozenset({GGMLType.I8, GGMLType.I16, GGMLType.I64, GGMLType.F64}) | _NO_TO_FLOAT


@op("get_rows")
def get_rows(a, rows: np.ndarray) -> np.ndarray:
    """ggml_get_rows: gather rows of a by index, dequantized to f32.

    a     ne [E, R, n2, n3]   numpy (n3, n2, R, E)   f32/f16/bf16/i32 or any block type with a to_float
    rows  ne [n, n2, n3]      numpy (n3, n2, n)      i32, 0 <= rows < R
    out   ne [E, n, n2, n3]   numpy (n3, n2, n, E)   f32 (i32 if a is i32)

        out[i3, i2, i, :] = a[i3, i2, rows[i3, i2, i], :]

    E.g. the token embedding lookup: a = tok_embd (n_vocab, n_embd), rows = the token ids (n_tokens,).
    Only the selected QTensor rows are dequantized (exactly: ggml's to_float).
    """
    a = _arr(a)
    rows = np.asarray(rows)
    t = _type("get_rows", a)
    if t in GET_ROWS_BAD:
        fail("get_rows", f"ggml-cpu get_rows does not read {traits(t).name} sources", a=a, rows=rows)
    if rows.dtype != np.int32:
        fail("get_rows", f"indices must be i32, got {rows.dtype}", a=a, rows=rows)
    if not isinstance(a, QTensor) and a.ndim and a.shape[-1] > 1 and a.strides[-1] != a.itemsize:
        # ggml-cpu copies each source row as packed elements whatever nb00 says (a transposed source
        # gives wrong values there, unchecked): refimpl refuses it
        fail("get_rows", "source rows must be contiguous (nb00 == element size); use np.ascontiguousarray",
             a=a, rows=rows)
    na, nr = ne4(a.shape), ne4(rows.shape)
    if na[2] != nr[1] or na[3] != nr[2] or nr[3] != 1:
        fail("get_rows", "rows must be ne [n, a.ne2, a.ne3]", a=a, rows=rows)
    R = na[1]
    if rows.size and (rows.min() < 0 or rows.max() >= R):
        fail("get_rows", f"row index out of range [0, {R})", a=a, rows=rows)
    r3 = rows.reshape(na[3], na[2], nr[0])
    i3 = np.arange(na[3])[:, None, None]
    i2 = np.arange(na[2])[None, :, None]
    out_shape = tuple(reversed([na[0], nr[0], nr[1], nr[2]]))[4 - max(rows.ndim + 1, 1):]
    if isinstance(a, QTensor):
        if rows.size == 0:
            fail("get_rows", "an empty rows tensor is not supported for a quantized source", a=a, rows=rows)
        d4 = a.data.reshape(na[3], na[2], R, a.data.shape[-1])
        sel = QTensor(a.type, d4[i3, i2, r3], (na[3], na[2], nr[0], na[0]))
        return dequantize(sel).reshape(out_shape)
    if na[2] == 1 and na[3] == 1:         # one table (the token embeddings): one gather, no index grids
        sel = np.take(a.reshape(R, na[0]), r3.reshape(-1), axis=0)
    else:
        sel = a.reshape(na[3], na[2], R, na[0])[i3, i2, r3]
    return sel.astype(np.int32 if a.dtype == np.int32 else np.float32, copy=False).reshape(out_shape)


@op("get_rows_back")
def get_rows_back(a: np.ndarray, b: np.ndarray, c) -> np.ndarray:
    """ggml_get_rows_back: the gradient of get_rows -- scatter-add the rows of a to the rows b names.

    a    ne [E, m]   numpy (m, E)   f32/f16 (e.g. the gradient of get_rows' output), m >= n
    b    ne [n]      numpy (n,)     i32 row indices, 0 <= b < R, contiguous
    c    ne [E, R]   numpy (R, E)   only its shape is used (a shape tuple works too)
    out  ne [E, R]   numpy (R, E)   f32

        out = zeros; for i in 0..n-1 in order: out[b[i], :] += f32(a[i, :])

    Repeated indices accumulate in index order, one f32 addition each (np.add.at does the same), so the
    result is bit-exact. Only a's first b.ne0 rows are read (ggml-cpu's loop runs over b; a may have more
    rows, as test-backend-ops' view-of-rows cases send). ggml 0.15.3 asserts nothing about b's range (it
    would write out of bounds), 0.25.3 asserts 0 <= b < R; refimpl requires it and a.ne1 >= b.ne0.
    """
    a, b = np.asarray(a), np.asarray(b)
    cs = shape_of("get_rows_back", c)
    na, nb, nc = ne4(a.shape), ne4(b.shape), ne4(cs)
    if na[2] != 1 or na[3] != 1 or nb[1:] != [1, 1, 1] or nc[2] != 1 or nc[3] != 1 or na[0] != nc[0]:
        fail("get_rows_back", "need a matrix a [E, n], a vector b [n] and a matrix c [E, R]",
             a=a, b=b, c=tuple(cs))
    if b.dtype != np.int32:
        fail("get_rows_back", f"indices must be i32, got {b.dtype}", a=a, b=b)
    if a.dtype not in (np.float32, np.float16):
        fail("get_rows_back", f"ggml-cpu get_rows_back reads f32 or f16, got {a.dtype}", a=a, b=b)
    if na[1] < nb[0]:
        fail("get_rows_back", "a must have a row per index (a.ne1 >= b.ne0)", a=a, b=b)
    if not rows_packed(a) or not is_contiguous(b):
        fail("get_rows_back", "ggml-cpu needs a's rows contiguous and b contiguous", a=a, b=b)
    R = nc[1]
    if b.size and (b.min() < 0 or b.max() >= R):
        fail("get_rows_back", f"row index out of range [0, {R})", a=a, b=b, c=tuple(cs))
    out = np.zeros((R, nc[0]), np.float32)
    np.add.at(out, b.reshape(-1), a.reshape(-1, na[0])[:nb[0]].astype(np.float32))
    return out


@op("set_rows")
def set_rows(a, b: np.ndarray, c: np.ndarray, out: np.ndarray | None = None):
    """ggml_set_rows: scatter the rows of b into rows of a, converted to a's type.

    a    ne [E, R, n2, n3]   numpy (n3, n2, R, E)   any type with a CPU from_float (f32/f16/bf16/i32 and
                                                    the block types but IQ1/IQ2/IQ3), e.g. the KV cache
    b    ne [E, n, n2, n3]   numpy (n3, n2, n, E)   f32 (or f16, which ggml 0.25.3 accepts: widened exactly
                                                    to f32 first), the new rows (e.g. K of n_tokens new tokens)
    c    ne [n, c2, c3]      numpy (c3, c2, n)      i64 or i32 row indices; n2 % c2 == 0, n3 % c3 == 0
    out  a's shape and type: a copy of a with the rows replaced (ggml writes into a and returns a view of
         it; refimpl leaves a untouched and returns the new tensor). Given `out` (an ndarray of a's shape
         and dtype; `a` itself, as ggml does), a's values are written there (nothing to copy when it is a)
         and only the indexed rows change; it is returned.

        out[i3, i2, c[i3 % c3, i2 % c2, i], :] = from_float(b[i3, i2, i, :])

    c is tiled over b's dims 2 and 3 (modulo, not NumPy broadcasting). from_float is ggml-cpu's, so Q8_0
    rounds half to even with 127/amax as on x86 (refimpl.quantize(..., method="cpu")). Rows of a that no
    index names keep their bytes. A repeated index: the last write in (i3, i2, i) order wins, as on one
    ggml thread (with several threads ggml leaves it undefined). Undefined bytes in ggml, not reproduced:
    an IQ4_NL block with max |x| < 1e-15 gets its quants from a stale stack buffer, and a Q8_K block of
    zeros keeps the destination's old bsums (refimpl writes the quantizer's deterministic bytes; the
    values are 0 either way).
    """
    a, b, c = _arr(a), np.asarray(b), np.asarray(c)
    t = _type("set_rows", a)
    na, nb, nc = ne4(a.shape), ne4(b.shape), ne4(c.shape)
    if na[0] != nb[0] or na[2] != nb[2] or na[3] != nb[3] or nb[1] != nc[0] or nc[3] != 1:
        fail("set_rows", "need a [E, R, n2, n3], b [E, n, n2, n3], c [n, c2, c3]", a=a, b=b, c=c)
    if nc[1] == 0 or nc[2] == 0 or nb[2] % nc[1] or nb[3] % nc[2]:
        fail("set_rows", "c's dims 1, 2 must divide b's dims 2, 3 (c is tiled)", a=a, b=b, c=c)
    if b.dtype not in (np.float32, np.float16):
        fail("set_rows", f"b must be f32 or f16, got {b.dtype}", a=a, b=b)
    if b.dtype == np.float16:                 # ggml 0.25.3 takes f16 rows: widened exactly, then as f32
        b = b.astype(np.float32)
    if c.dtype not in (np.int64, np.int32):
        fail("set_rows", f"indices must be i64 or i32, got {c.dtype}", a=a, c=c)
    if t not in CPU_FROM_FLOAT:
        fail("set_rows", f"ggml-cpu has no from_float for {traits(t).name}", a=a)
    if out is not None and not (isinstance(out, np.ndarray) and isinstance(a, np.ndarray)
                                and out.shape == a.shape and out.dtype == a.dtype and out.flags.writeable):
        fail("set_rows", "out must be a writeable array of a's shape and dtype", a=a, out=out)
    if b.size == 0:                           # no rows to write: a as it is
        if out is not None:
            if out is not a:
                out[...] = a
            return out
        return a.copy() if not isinstance(a, QTensor) else QTensor(a.type, np.array(a.data), a.shape)
    if not rows_packed(a) or not rows_packed(b):
        fail("set_rows", "a and b need contiguous rows (nb0 == type size)", a=a, b=b)
    R = na[1]
    if c.size and (c.min() < 0 or c.max() >= R):
        fail("set_rows", f"row index out of range [0, {R})", a=a, c=c)
    n3, n2, n = nb[3], nb[2], nb[1]
    idx = np.tile(c.reshape(nc[2], nc[1], n), (n3 // nc[2], n2 // nc[1], 1))       # (n3, n2, n)
    rows = _from_f32(b.reshape(n3, n2, n, nb[0]), t)
    if isinstance(a, QTensor):
        out = np.array(a.data.reshape(na[3], na[2], R, a.data.shape[-1]), order="C")
        new = rows.data if isinstance(rows, QTensor) else rows.view(np.uint8)
        new = new.reshape(n3, n2, n, out.shape[-1])
    elif out is not None:
        given = out
        if not (out.ctypes.data == a.ctypes.data and out.strides == a.strides):      # not a itself
            if np.shares_memory(out, a):
                fail("set_rows", "out overlaps a without being a", a=a, out=out)
            given[...] = a
        out = given.reshape(na[3], na[2], R, na[0])       # leading 1s added: a view of the caller's array
        new = rows
    else:
        given = None
        out = np.array(a.reshape(na[3], na[2], R, na[0]), order="C")
        new = rows
    for i3 in range(n3):
        for i2 in range(n2):
            r = idx[i3, i2]
            if len(r) < 2 or bool(np.all(r[1:] > r[:-1])):               # increasing: no index repeats
                out[i3, i2, r] = new[i3, i2]
                continue
            last = len(r) - 1 - np.unique(r[::-1], return_index=True)[1]      # the last write wins
            out[i3, i2, r[last]] = new[i3, i2, last]
    if isinstance(a, QTensor):
        return QTensor(a.type, out.reshape(a.data.shape), a.shape)
    if given is not None:
        return given
    return out.reshape(a.shape)


# -- copies and conversions -----------------------------------------------------------------------------

def _dst_spec(name: str, b):
    """(type, NumPy shape or None, the destination tensor or None) of cpy's second argument."""
    if isinstance(b, (QTensor, np.ndarray)):
        return _type(name, b), tuple(b.shape), b
    if isinstance(b, (np.dtype, type)) and not isinstance(b, GGMLType):
        dt = np.dtype(b)
        if dt not in _DTYPE_TYPES:
            fail(name, f"no ggml type for numpy dtype {dt}")
        return _DTYPE_TYPES[dt], None, None
    return as_type(b), None, None


def _convert(name: str, a, t_dst: GGMLType, shape: tuple, dst=None):
    """The values of a in flattened ggml order (dim 0 fastest), stored as t_dst with NumPy shape `shape`:
    ggml_compute_forward_dup's rules, with its layout asserts."""
    t_src = _type(name, a)
    ts, td = traits(t_src), traits(t_dst)
    dst_contig = dst is None or is_contiguous(dst)
    if int(np.prod(shape, dtype=np.int64)) != (a.size if isinstance(a, QTensor) else np.asarray(a).size):
        fail(name, "a and the destination must have the same number of elements", a=a, dst=tuple(shape))
    if len(shape) > 4:
        fail(name, "ggml tensors have at most 4 dims", a=a, dst=tuple(shape))
    if shape and shape[-1] % td.blck_size:
        fail(name, f"the destination's ne0 must be a multiple of {td.name}'s block size {td.blck_size}",
             a=a, dst=tuple(shape))
    if t_src == t_dst:                                               # raw copy, block bytes included
        if isinstance(a, QTensor):
            if ts.blck_size > 1 and not is_contiguous(a) and ne4(shape) != ne4(a.shape) and dst_contig:
                fail(name, "ggml-cpu copies a non-contiguous block-type source into a reshaped contiguous "
                     "destination with the wrong row size (dup_bytes); make a contiguous first",
                     a=a, dst=tuple(shape))
            raw = np.ascontiguousarray(a.data).reshape(-1)
            return QTensor(t_dst, raw.reshape(tuple(shape[:-1]) + (shape[-1] // td.blck_size * td.type_size,)),
                           shape)
        return np.array(a, order="C").reshape(shape)
    if ts.is_quantized:
        if t_dst != GGMLType.F32 or t_src in _NO_TO_FLOAT:
            fail(name, f"ggml-cpu converts {ts.name} only to f32 (and itself)" if t_src not in _NO_TO_FLOAT
                 else f"{ts.name} has no to_float in ggml", a=a, dst=tuple(shape))
        if not dst_contig and (not rows_packed(dst) or shape[-1] % ts.blck_size):
            fail(name, f"ggml-cpu dequantizes {ts.name} into a non-contiguous destination only with contiguous "
                 "rows of whole blocks", a=a, dst=dst)
        return _to_f32(a).reshape(shape)
    supported = ((t_src in _FLOATS and (t_dst in _FLOATS or t_dst in CPU_FROM_FLOAT))
                 or (t_src == GGMLType.I32 and t_dst == GGMLType.F32))
    if not supported:
        fail(name, f"ggml-cpu cpy does not convert {ts.name} to {td.name}", a=a, dst=tuple(shape))
    via_from_float = not (t_dst in _FLOATS or (t_src == GGMLType.F32 and t_dst == GGMLType.I32)
                          or t_src == GGMLType.I32)
    if via_from_float:                                   # dup_to_q: rows of a through the type's from_float
        if not dst_contig or not rows_packed(a):
            fail(name, f"ggml-cpu converts to {td.name} only from contiguous rows into a contiguous "
                 "destination", a=a, dst=tuple(shape))
        n00 = a.shape[-1] if a.ndim else 1
        if n00 % td.blck_size:
            fail(name, f"a's rows (ne0 = {n00}) must be whole {td.name} blocks of {td.blck_size}: ggml "
                 "quantizes each source row separately", a=a, dst=tuple(shape))
    return _from_f32(_to_f32(a).reshape(shape), t_dst)


@op("cpy")
def cpy(a, b):
    """ggml_cpy: copy a into a destination of another type and/or shape (same element count).

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   any type
    b    a type (GGMLType, "q4_0", np.float16 ...): the destination is a's shape in that type
         (= ggml_cast), or a tensor: only its type and shape are used, ne [m0, m1, m2, m3] with
         n0*n1*n2*n3 == m0*m1*m2*m3 (ggml writes into b; refimpl returns a new tensor, b is untouched)
    out  b's shape (or a's), b's type

        out.flat (ggml order, dim 0 fastest) = convert(a.flat)

    Same type: a raw copy (block bytes too). f32/f16/bf16 among themselves through f32 with §2's rounding
    (RNE; bf16 RNE with quieted NaN); f32 -> i32 truncates toward zero, i32 -> f32; f32/f16/bf16 -> i32 or
    a block type through ggml-cpu's from_float (refimpl.quantize(method="cpu"): Q8_0/Q8_1 use x86's
    127/amax, half-even rounding); a block type -> f32 dequantizes exactly. Everything else ggml-cpu
    rejects, and so does refimpl. Quantizing needs contiguous rows of a whose length is a multiple of the
    block size (ggml quantizes each source row). Known ggml-cpu bugs not reproduced: a non-contiguous
    block-type a copied to a same-type contiguous b of another shape uses the wrong row size (refimpl
    rejects that case); IQ4_NL blocks with max |x| < 1e-15 and Q8_K blocks of zeros leave bytes of the
    destination unwritten (quants from a stale stack buffer; bsums), see set_rows.
    """
    a = _arr(a)
    t, shape, dst = _dst_spec("cpy", b)
    return _convert("cpy", a, t, shape if shape is not None else tuple(a.shape), dst)


@op("cast", covers=("CPY",))
def cast(a, type):
    """ggml_cast: a converted to another type, same shape (a CPY node into a new tensor).

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   any type
    out  same shape, `type` (GGMLType, its name, or a NumPy dtype)

    The conversion rules are cpy's.
    """
    t, _, _ = _dst_spec("cast", type)
    if isinstance(a, QTensor) or t not in (GGMLType.F32, GGMLType.F16, GGMLType.I32):
        nonempty("cast", a=a)
    a = _arr(a)
    return _convert("cast", a, t, tuple(a.shape))


@op("dup")
def dup(a):
    """ggml_dup: a contiguous copy of a, same type and shape.

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   any type, any view
    out  same ne, same type, contiguous
    """
    a = _arr(a)
    return _convert("dup", a, _type("dup", a), tuple(a.shape))


@op("cont")
def cont(a, shape=None):
    """ggml_cont / ggml_cont_1d..4d: a contiguous copy of a, optionally with a new shape.

    a      ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   any type, any view (e.g. a permuted head view)
    shape  None: a's shape; or the NumPy-order shape of ggml_cont_Nd (ne reversed), same element count
    out    that shape, a's type, contiguous

        out.flat = a.flat (ggml order, dim 0 fastest)

    E.g. llama's cont of permute(kq, 0, 2, 1, 3): a (n_head, n_tokens, head_dim) view -> contiguous.
    """
    if shape is None and type(a) is np.ndarray and a.dtype in _DTYPE_TYPES:
        return np.array(a, order="C")           # what _convert does for a same-type copy, without its checks
    a = _arr(a)
    sh = tuple(a.shape) if shape is None else shape_of("cont", shape)
    return _convert("cont", a, _type("cont", a), sh)


# -- views (no data movement) ---------------------------------------------------------------------------

@op("reshape")
def reshape(a, shape):
    """ggml_reshape / ggml_reshape_1d..4d: the same contiguous data with another shape (a view).

    a      ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   contiguous (ggml asserts it)
    shape  NumPy-order shape (ggml ne reversed), or a tensor whose shape to take; same element count
    out    a view of a (a QTensor view for block types; the new ne0 must be whole blocks)
    """
    a = _arr(a)
    sh = shape_of("reshape", shape)
    n = a.size
    if not is_contiguous(a):
        fail("reshape", "a must be contiguous (ggml_reshape asserts it); use cont(a, shape)", a=a)
    if int(np.prod(sh, dtype=np.int64)) != n or len(sh) > 4:
        fail("reshape", "the new shape must have a's element count and at most 4 dims", a=a, shape=sh)
    if isinstance(a, QTensor):
        tr = a.traits
        if sh[-1] % tr.blck_size:
            fail("reshape", f"ne0 must be a multiple of the block size {tr.blck_size}", a=a, shape=sh)
        return QTensor(a.type, a.data.reshape(sh[:-1] + (sh[-1] // tr.blck_size * tr.type_size,)), sh)
    return a.reshape(sh)


def _nbytes(a: np.ndarray) -> int:
    """ggml_nbytes of a NumPy view (the byte span it covers)."""
    if a.size == 0:
        return 0
    return a.itemsize + sum((n - 1) * s for n, s in zip(a.shape, a.strides))


@op("view")
def view(a: np.ndarray, shape, strides=None, offset: int = 0) -> np.ndarray:
    """ggml_view_1d..4d: a strided view into a's memory, with ggml's byte strides and byte offset.

    a        ne [...]            numpy (...)            any element type, any view (ggml's view_src)
    shape    ne [m0, m1, m2, m3] numpy (m3, m2, m1, m0) the view's shape, NumPy order
    strides  nb [es, nb1, nb2, nb3] as NumPy byte strides (nb3, nb2, nb1, es): the last must be the
             element size es (ggml's nb0); None: contiguous strides
    offset   bytes from a's first element (ggml's offset); a multiple of es
    out      np.lib.stride_tricks.as_strided view aliasing a, a's type

    E.g. ggml_view_3d(k, head_dim, n_head_kv, n_kv, nb1, nb2, off) is view(k, (n_kv, n_head_kv, head_dim),
    (nb2, nb1, es), off). As ggml asserts, offset + (element count * es) must fit in a; refimpl also
    requires every element of the view to lie inside a (ggml does not check the strided span) and
    non-negative strides. BF16 and block-type QTensors are not viewed here (index their rows instead).
    """
    if isinstance(a, QTensor):
        fail("view", "QTensors are viewed by indexing their rows (a[i], a[::2]), not by byte strides", a=a)
    a = np.asarray(a)
    sh = tuple(int(n) for n in shape)
    es = a.itemsize
    if strides is None:
        strides = tuple(int(np.prod(sh[i + 1:], dtype=np.int64)) * es for i in range(len(sh)))
    strides = tuple(int(s) for s in strides)
    if len(strides) != len(sh) or len(sh) > 4 or not sh:
        fail("view", f"need 1 to 4 dims and one stride per dim, got shape {sh}, strides {strides}", a=a)
    if sh[-1] > 1 and strides[-1] != es:
        fail("view", f"the last stride (ggml nb0) must be the element size {es}", a=a, view=sh)
    if any(s < 0 for s in strides) or offset < 0 or offset % es:
        fail("view", f"strides must be >= 0 and offset ({offset}) a multiple of {es}", a=a, view=sh)
    if any(s < 0 for s in a.strides):
        fail("view", "a cannot have negative strides", a=a)
    span = 0 if 0 in sh else es + sum((n - 1) * s for n, s in zip(sh, strides))
    dense = int(np.prod(sh, dtype=np.int64)) * es
    if dense and offset + dense > _nbytes(a):
        fail("view", f"offset {offset} + {dense} bytes (the view's element count) exceeds a's {_nbytes(a)} "
             "bytes (ggml asserts it)", a=a, view=sh)
    if span and offset + span > _nbytes(a):
        fail("view", f"the view (offset {offset}, {span} bytes) runs past a's {_nbytes(a)} bytes", a=a, view=sh)
    base = np.lib.stride_tricks.as_strided(a, shape=(max(_nbytes(a) // es, 1),), strides=(es,))
    return np.lib.stride_tricks.as_strided(base[offset // es:], shape=sh, strides=strides)


@functools.lru_cache(maxsize=64)
def _permute_axes(ax: tuple) -> tuple | None:
    ax = tuple(int(x) for x in ax)
    if sorted(ax) != [0, 1, 2, 3]:
        return None
    p = [0] * 4
    for i, x in enumerate(ax):
        p[3 - x] = 3 - i
    return tuple(p)


def permute_axes(axis0, axis1, axis2, axis3, a=None) -> tuple:
    """np.transpose's axes of the 4-D NumPy view for ggml_permute(a, axis0..3): p[3 - axis_i] = 3 - i (ggml's
    axes say where each source dim goes, np.transpose's where each result axis comes from)."""
    try:
        p = _permute_axes((axis0, axis1, axis2, axis3))
    except (TypeError, ValueError):
        p = None
    if p is None:
        fail("permute", f"axes {[axis0, axis1, axis2, axis3]} must be a permutation of 0..3", a=a)
    return p


@op("permute")
def permute(a, axis0: int, axis1: int, axis2: int, axis3: int):
    """ggml_permute: reorder dims -- source dim i becomes result dim axis_i (a view).

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   any type (block types: dim 0 must stay, axis0 == 0)
    out  ne[axis_i] = a.ne[i]   = np.transpose(as4(a), p) with p[3 - axis_i] = 3 - i
         a NumPy view (a QTensor view for block types; a BF16 QTensor is returned as a permuted copy,
         since a QTensor's rows are contiguous bytes)

    E.g. llama's permute(q, 0, 2, 1, 3): ne [head_dim, n_head, n_tokens] -> [head_dim, n_tokens, n_head],
    NumPy (n_tokens, n_head, head_dim) -> (n_head, n_tokens, head_dim). Note that ggml's axes say where
    each source dim goes, np.transpose's where each result axis comes from. Leading size-1 axes beyond
    a's own are dropped from the result.
    """
    a = _arr(a)
    p = permute_axes(axis0, axis1, axis2, axis3, a)
    nd = a.ndim
    if type(a) is np.ndarray:
        if nd == 4:
            return a.transpose(p)
        if nd == 3 and p[0] == 0:                 # the missing leading dim stays in front: the 3-D transpose
            return a.transpose(p[1] - 1, p[2] - 1, p[3] - 1)
        return _trim(np.transpose(as4(a), p), nd)
    if isinstance(a, QTensor) and a.traits.blck_size == 1:       # BF16: permute the elements (a copy)
        return _like(_trim(np.transpose(as4(_elems(a)), p), nd), a.type)
    if isinstance(a, QTensor):
        if int(axis0) != 0:
            fail("permute", "a block-type tensor keeps its rows: axis0 must be 0", a=a)
        d4 = a.data.reshape((1,) * (4 - a.ndim) + a.data.shape)
        d = _trim(np.transpose(d4, p), nd)
        return QTensor(a.type, d, d.shape[:-1] + (a.shape[-1],))
    return _trim(np.transpose(as4(a), p), nd)


@op("transpose")
def transpose(a):
    """ggml_transpose: swap dims 0 and 1 (= permute(a, 1, 0, 2, 3)), a view.

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   element types
    out  ne [n1, n0, n2, n3]   numpy (n3, n2, n0, n1)   (a 1-D a of n elements becomes (n, 1))
    """
    return permute(a, 1, 0, 2, 3)


# -- tiling and concatenation ---------------------------------------------------------------------------

_REPEAT_TYPES = (GGMLType.F32, GGMLType.I32, GGMLType.F16, GGMLType.BF16, GGMLType.I16)


@op("repeat")
def repeat(a, b):
    """ggml_repeat / ggml_repeat_4d: tile a to b's shape (np.tile).

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32/f16/bf16/i32/i16, rows contiguous
    b    a tensor (only its shape is used) or a NumPy-order shape (ggml_repeat_4d's ne reversed);
         ne [m0, m1, m2, m3] with m_i % n_i == 0
    out  b's shape, a's type

        out[i3, i2, i1, i0] = a[i3 % n3, i2 % n2, i1 % n1, i0 % n0]

    This is ggml's tiling broadcast (modulo), not NumPy's (which only stretches size-1 axes).
    """
    a = _arr(a)
    t = _type("repeat", a)
    sh = shape_of("repeat", b)
    na, nb = ne4(a.shape), ne4(sh)
    if t not in _REPEAT_TYPES:
        fail("repeat", f"ggml-cpu repeat handles f32/i32/f16/bf16/i16, not {traits(t).name}", a=a)
    if any(x == 0 for x in na) or any(y % x for x, y in zip(na, nb)):
        fail("repeat", "every ne of b must be a multiple of a's", a=a, b=sh)
    if not rows_packed(a):
        fail("repeat", "ggml-cpu repeat needs a's rows contiguous (nb0 == type size)", a=a)
    reps = [y // x for x, y in zip(na[::-1], nb[::-1])]
    out = np.tile(as4(_elems(a)), reps)
    return _like(out.reshape(sh), t)


@op("repeat_back")
def repeat_back(a: np.ndarray, b) -> np.ndarray:
    """ggml_repeat_back: sum the tiles of a down to b's shape (the gradient of repeat).

    a    ne [m0, m1, m2, m3]   numpy (m3, m2, m1, m0)   f32, rows contiguous
    b    a tensor (only its shape is used) or a NumPy-order shape; ne [n0, n1, n2, n3], m_i % n_i == 0
    out  b's shape, f32

        out[k] = sum over tiles t of a[t*n + k]    (tiles in ggml's loop order i3, i2, i1, i0)

    As ggml-cpu: out starts at +0.0 and each tile is added in f32 in that order, so the result is
    bit-exact (np.sum would add pairwise).
    """
    a = np.asarray(a)
    sh = shape_of("repeat_back", b)
    na, nb = ne4(a.shape), ne4(sh)
    if a.dtype != np.float32:
        fail("repeat_back", f"ggml-cpu repeat_back handles f32 only, got {a.dtype}", a=a)
    if any(x == 0 for x in nb) or any(y % x for x, y in zip(nb, na)):
        fail("repeat_back", "every ne of a must be a multiple of b's", a=a, b=sh)
    if not rows_packed(a):
        fail("repeat_back", "ggml-cpu repeat_back needs a's rows contiguous (nb0 == 4)", a=a)
    r = [y // x for x, y in zip(nb, na)]                                     # repeats per ggml dim
    t = as4(a).reshape(r[3], nb[3], r[2], nb[2], r[1], nb[1], r[0], nb[0])
    tiles = t.transpose(0, 2, 4, 6, 1, 3, 5, 7).reshape(-1, nb[3], nb[2], nb[1], nb[0])
    out = np.zeros(nb[::-1], np.float32)
    for tile in tiles:
        out += tile
    return out.reshape(sh)


@op("concat")
def concat(a, b, dim: int):
    """ggml_concat: join a and b along ggml dim `dim` (NumPy axis -1-dim of the 4-D tensors).

    a    ne [n0, n1, n2, n3]           numpy (n3, n2, n1, n0)   any element type (not block types)
    b    same ne except along dim, same type
    out  ne[dim] = a.ne[dim] + b.ne[dim], a's type

        dim 0: along the rows (last NumPy axis), dim 1: NumPy axis -2, ... dim 3: NumPy axis -4

    The result has max(a.ndim, b.ndim, dim + 1) axes. Block types (ggml 0.25.3): rows are joined as raw
    blocks, along dim 0 by whole blocks (ggml 0.15.3's generic concat copied type_size bytes per element index,
    wrong for blocks of more than one element; 0.25.3 copies whole rows).
    """
    a, b = _arr(a), _arr(b)
    ta, tb = _type("concat", a), _type("concat", b)
    if not 0 <= dim < 4:
        fail("concat", f"dim {dim} must be 0..3 (a ggml dim)", a=a, b=b)
    if ta != tb:
        fail("concat", "a and b must have the same type", a=a, b=b)
    na, nb = ne4(a.shape), ne4(b.shape)
    if any(na[d] != nb[d] for d in range(4) if d != dim):
        fail("concat", f"a and b must agree on every dim but {dim}", a=a, b=b)
    if isinstance(a, QTensor) and traits(ta).blck_size != 1:
        # ggml 0.25.3 joins block rows as bytes (dim 0: whole blocks, ne0 a multiple of the block size)
        da, db = (x.data.reshape(tuple(ne4(x.shape)[1:][::-1]) + (x.data.shape[-1],)) for x in (a, b))
        data = np.concatenate([da, db], axis=3 - dim)
        shape = list(na)
        shape[dim] += nb[dim]
        nd = max(a.ndim, b.ndim, dim + 1)
        return QTensor(ta, data.reshape(tuple(shape[::-1][4 - nd:-1]) + (data.shape[-1],)), tuple(shape[::-1][4 - nd:]))
    out = np.concatenate([as4(_elems(a)), as4(_elems(b))], axis=3 - dim)
    return _like(_trim(out, max(a.ndim, b.ndim, dim + 1)), ta)


# -- writing into a view of a copy ----------------------------------------------------------------------

def _view_index(name: str, a: np.ndarray, b: np.ndarray, nb1, nb2, nb3, offset, strict_end: bool):
    """Flat element indices into contiguous a of b's elements (ggml order) for the byte view
    (nb0 = element size, nb1, nb2, nb3, offset); and which of them are the last write to their index."""
    es = a.itemsize
    na = ne4(a.shape)
    dflt = [es * na[0], es * na[0] * na[1], es * na[0] * na[1] * na[2]]
    nbs = [dflt[i] if v is None else int(v) for i, v in enumerate((nb1, nb2, nb3))]
    offset = int(offset)
    if any(v < 0 or v % es for v in nbs + [offset]) or any(v >= 2**31 for v in nbs + [offset]):
        fail(name, f"nb1, nb2, nb3, offset ({nbs + [offset]}) must be non-negative multiples of the element "
             f"size {es} below 2**31 (ggml stores them as int32)", a=a, b=b)
    n = ne4(b.shape)
    if b.size:
        last = offset + sum((k - 1) * s for k, s in zip(n, [es] + nbs))
        if last + es > a.size * es:
            fail(name, f"the view (last element at byte {last}) runs past a's {a.size * es} bytes"
                 + ("" if strict_end else " (ggml's check allows one element past the end; refimpl does not)"),
                 a=a, b=b)
    i = [np.arange(k) for k in n]
    idx = (offset + i[3][:, None, None, None] * nbs[2] + i[2][None, :, None, None] * nbs[1]
           + i[1][None, None, :, None] * nbs[0] + i[0][None, None, None, :] * es) // es
    idx = idx.reshape(-1)
    last = len(idx) - 1 - np.unique(idx[::-1], return_index=True)[1]
    return idx, last


@op("acc")
def acc(a: np.ndarray, b: np.ndarray, nb1=None, nb2=None, nb3=None, offset: int = 0) -> np.ndarray:
    """ggml_acc: a copy of a where the strided byte view (nb1, nb2, nb3, offset) of it gets += b.

    a       ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32, contiguous
    b       ne [m0, m1, m2, m3]   numpy (m3, m2, m1, m0)   f32, rows contiguous, no more elements than a
    nb1..3  BYTE strides of the view into a (ggml order; nb0 is 4), offset in bytes; None: a's own
    out     a's shape, f32

        V = view(out, b.shape, (nb3, nb2, nb1, 4), offset);  V = a-view + b   (one f32 add)

    e.g. acc(a, b, offset=4 * (i1 * n0 + i0)) adds b into a starting at element (i1, i0). Strides and
    offset must be multiples of 4 and the view inside a. If the view overlaps itself, ggml computes every
    element from the original a and the last write in b's order wins; refimpl does the same.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != np.float32 or b.dtype != np.float32:
        fail("acc", "a and b must be f32", a=a, b=b)
    if not is_contiguous(a) or b.size > a.size:
        fail("acc", "a must be contiguous with at least as many elements as b", a=a, b=b)
    if not rows_packed(b):
        fail("acc", "ggml-cpu acc needs b's rows contiguous (nb0 == 4)", a=a, b=b)
    idx, last = _view_index("acc", a, b, nb1, nb2, nb3, offset, strict_end=True)
    flat = a.reshape(-1)
    out = flat.copy()
    out[idx[last]] = flat[idx[last]] + b.reshape(-1)[last]
    return out.reshape(a.shape)


@op("set")
def set(a: np.ndarray, b: np.ndarray, nb1=None, nb2=None, nb3=None, offset: int = 0) -> np.ndarray:  # noqa: A001
    """ggml_set: a copy of a whose strided byte view (nb1, nb2, nb3, offset) is overwritten by b.

    a       ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32 or i32, contiguous
    b       ne [m0, m1, m2, m3]   numpy (m3, m2, m1, m0)   a's type, rows contiguous, no more elements than a
    nb1..3  BYTE strides of the view into a (ggml order; nb0 is the element size), offset in bytes;
            None: a's own strides (so set(a, b, offset=k) is ggml_set_1d and nb1 alone ggml_set_2d)
    out     a's shape and type

        view(out, b.shape, (nb3, nb2, nb1, itemsize), offset)[...] = b

    Strides and offset must be multiples of the element size and the view must lie inside a. Two ggml
    quirks are not reproduced: its bounds check lets the last element start at the end of a (a write
    past it), and it copies the raw bytes of a b of another 4-byte type. A view that overlaps itself:
    the last write in b's order wins, as in ggml.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype not in (np.float32, np.int32) or b.dtype != a.dtype:
        fail("set", "a must be f32 or i32 and b of the same type", a=a, b=b)
    if not is_contiguous(a) or b.size > a.size:
        fail("set", "a must be contiguous with at least as many elements as b", a=a, b=b)
    if not rows_packed(b):
        fail("set", "ggml-cpu set needs b's rows contiguous (nb0 == element size)", a=a, b=b)
    if int(offset) >= 2**30:
        fail("set", "offset must be < 2**30 (ggml asserts it)", a=a, b=b)
    idx, last = _view_index("set", a, b, nb1, nb2, nb3, offset, strict_end=False)
    out = a.reshape(-1).copy()
    out[idx[last]] = b.reshape(-1)[last]
    return out.reshape(a.shape)


@op("set_1d", covers=("SET",))
def set_1d(a: np.ndarray, b: np.ndarray, offset: int) -> np.ndarray:
    """ggml_set_1d: set(a, b, a.nb1, a.nb2, a.nb3, offset) -- b written into a from byte `offset` on.

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32 or i32, contiguous
    b    ne [m0, ...]          numpy (..., m0)          a's type; typically 1-D: a run of m0 elements
    out  a's shape and type;   out.flat[offset/es : offset/es + m0] = b   (for a 1-D b)
    """
    return set(a, b, None, None, None, offset)


@op("set_2d", covers=("SET",))
def set_2d(a: np.ndarray, b: np.ndarray, nb1: int, offset: int) -> np.ndarray:
    """ggml_set_2d: set(a, b, nb1, a.nb2, a.nb3, offset) -- b's rows written nb1 bytes apart.

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32 or i32, contiguous
    b    ne [m0, m1]           numpy (m1, m0)           a's type
    out  a's shape and type;   row j of b lands at byte offset + j*nb1 of out
    """
    return set(a, b, nb1, None, None, offset)


# -- padding, rolling -----------------------------------------------------------------------------------

@op("pad")
def pad(a: np.ndarray, p0: int = 0, p1: int = 0, p2: int = 0, p3: int = 0, *, lp0: int = 0, lp1: int = 0,
        lp2: int = 0, lp3: int = 0, circular: bool = False) -> np.ndarray:
    """ggml_pad / ggml_pad_ext / ggml_pad_circular / ggml_pad_ext_circular: pad each dim.

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32, any view
    p_d  padding after dim d (ggml_pad's p0..p3 = ggml_pad_ext's rp0..rp3); lp_d: padding before it
    out  ne [lp0+n0+p0, lp1+n1+p1, lp2+n2+p2, lp3+n3+p3]   f32

        out = np.pad(a4, [(lp3, p3), (lp2, p2), (lp1, p1), (lp0, p0)])        zeros
        circular: mode="wrap" (a torus), and ggml requires lp_d <= n_d there

    Padding must be non-negative (ggml would crop with negative values; refimpl rejects them).
    """
    return pad_ext(a, lp0, p0, lp1, p1, lp2, p2, lp3, p3, circular=circular)


@op("pad_ext", covers=("PAD",))
def pad_ext(a: np.ndarray, lp0: int = 0, rp0: int = 0, lp1: int = 0, rp1: int = 0, lp2: int = 0, rp2: int = 0,
            lp3: int = 0, rp3: int = 0, *, circular: bool = False) -> np.ndarray:
    """ggml_pad_ext (circular=True: ggml_pad_ext_circular): lp_d before and rp_d after each ggml dim d.

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32, any view
    out  ne [lp0+n0+rp0, ..., lp3+n3+rp3]   f32;  see pad
    """
    a = np.asarray(a)
    lp, rp = [lp0, lp1, lp2, lp3], [rp0, rp1, rp2, rp3]
    if a.dtype != np.float32:
        fail("pad", f"ggml-cpu pad handles f32 only, got {a.dtype}", a=a)
    if any(int(p) < 0 for p in lp + rp):
        fail("pad", f"paddings must be >= 0, got lp {lp}, rp {rp}", a=a)
    n = ne4(a.shape)
    if circular and any(lp[d] > n[d] for d in range(4)):
        fail("pad", f"circular padding before a dim cannot exceed it (ggml wraps once): lp {lp}", a=a)
    if circular and any((lp[d] or rp[d]) and n[d] == 0 for d in range(4)):
        fail("pad", f"circular padding of an empty dim (nothing to wrap): lp {lp}, rp {rp}", a=a)
    widths = [(int(lp[d]), int(rp[d])) for d in (3, 2, 1, 0)]
    out = np.pad(as4(a), widths, mode="wrap" if circular else "constant")
    return _trim(out, max(a.ndim, max([d + 1 for d in range(4) if lp[d] or rp[d]], default=1)))


@op("pad_reflect_1d")
def pad_reflect_1d(a: np.ndarray, p0: int, p1: int) -> np.ndarray:
    """ggml_pad_reflect_1d: reflect-pad the rows, p0 before and p1 after, the edge not repeated.

    a    ne [n0, n1, n2, n3]         numpy (n3, n2, n1, n0)   f32, contiguous
    out  ne [p0+n0+p1, n1, n2, n3]   f32

        out = np.pad(a, [(0, 0)]*3 + [(p0, p1)], mode="reflect")     [a b c d], (1, 1) -> [b a b c d c]

    0 <= p0, p1 < n0 (ggml asserts it).
    """
    a = np.asarray(a)
    if a.dtype != np.float32 or not is_contiguous(a):
        fail("pad_reflect_1d", "a must be contiguous f32", a=a)
    n0 = a.shape[-1] if a.ndim else 1
    if not (0 <= p0 < n0 and 0 <= p1 < n0):
        fail("pad_reflect_1d", f"need 0 <= p0, p1 < ne0, got p0={p0}, p1={p1}", a=a)
    return np.pad(a.reshape(a.shape or (1,)), [(0, 0)] * (max(a.ndim, 1) - 1) + [(p0, p1)], mode="reflect")


@op("roll")
def roll(a: np.ndarray, shift0: int = 0, shift1: int = 0, shift2: int = 0, shift3: int = 0) -> np.ndarray:
    """ggml_roll: rotate each dim by its shift (np.roll), elements leaving one end re-enter at the other.

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32, rows contiguous
    out  same ne, f32

        out = np.roll(a4, (shift3, shift2, shift1, shift0), axis=(0, 1, 2, 3))

    |shift_d| < n_d (ggml asserts it), so a dim of extent 1 takes shift 0.
    """
    a = np.asarray(a)
    s = [int(shift0), int(shift1), int(shift2), int(shift3)]
    n = ne4(a.shape)
    if a.dtype != np.float32:
        fail("roll", f"ggml-cpu roll handles f32 only, got {a.dtype}", a=a)
    if not rows_packed(a):
        fail("roll", "ggml_roll needs a's rows contiguous (nb0 == 4)", a=a)
    if any(abs(s[d]) >= n[d] for d in range(4)):
        fail("roll", f"need |shift_d| < ne_d, got shifts {s}", a=a)
    return np.ascontiguousarray(np.roll(as4(a), (s[3], s[2], s[1], s[0]), axis=(0, 1, 2, 3))).reshape(a.shape)


# -- diagonals and causal masks -------------------------------------------------------------------------

@op("diag")
def diag(a: np.ndarray) -> np.ndarray:
    """ggml_diag: each row vector becomes a diagonal matrix.

    a    ne [n, 1, n2, n3]   numpy (n3, n2, 1, n)   f32, rows contiguous
    out  ne [n, n, n2, n3]   numpy (n3, n2, n, n)   f32;  out[..., i, j] = a[..., 0, j] if i == j else 0
    """
    a = np.asarray(a)
    n = ne4(a.shape)
    if n[1] != 1:
        fail("diag", "a must be a row vector per matrix (ne1 == 1)", a=a)
    if a.dtype != np.float32 or not rows_packed(a):
        fail("diag", "ggml-cpu diag handles f32 with contiguous rows", a=a)
    v = as4(a)[:, :, 0, :]                                                    # (n3, n2, n)
    out = np.zeros((n[3], n[2], n[0], n[0]), np.float32)
    i = np.arange(n[0])
    out[:, :, i, i] = v
    return _trim(out, max(a.ndim, 2))


def _diag_mask(name: str, a: np.ndarray, n_past: int, value: float) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype != np.float32 or not is_contiguous(a):
        fail(name, "a must be contiguous f32", a=a)
    if n_past < 0:
        fail(name, f"n_past must be >= 0, got {n_past}", a=a)
    n = ne4(a.shape)
    i1 = np.arange(n[1])[:, None]
    i0 = np.arange(n[0])[None, :]
    return np.ascontiguousarray(np.where(i0 > n_past + i1, np.float32(value), as4(a))).reshape(a.shape)


@op("diag_mask_inf")
def diag_mask_inf(a: np.ndarray, n_past: int) -> np.ndarray:
    """ggml_diag_mask_inf: the causal mask -- -inf above the diagonal shifted by n_past.

    a    ne [n_kv, n_tokens, n2, n3]   numpy (n3, n2, n_tokens, n_kv)   f32, contiguous (e.g. kq)
    out  same ne, f32

        out[..., i1, i0] = -inf if i0 > n_past + i1 else a[..., i1, i0]

    Token i1 of a batch placed after n_past cached tokens sees keys 0..n_past+i1. n_past >= 0.
    """
    return _diag_mask("diag_mask_inf", a, n_past, -np.inf)


@op("diag_mask_zero")
def diag_mask_zero(a: np.ndarray, n_past: int) -> np.ndarray:
    """ggml_diag_mask_zero: diag_mask_inf with 0 instead of -inf.

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32, contiguous
    out  same ne;  out[..., i1, i0] = 0 if i0 > n_past + i1 else a[..., i1, i0]
    """
    return _diag_mask("diag_mask_zero", a, n_past, 0.0)


# -- windows and relative positions (SAM's image encoder) ------------------------------------------------

@op("win_part")
def win_part(a: np.ndarray, w: int) -> np.ndarray:
    """ggml_win_part: cut an image into w x w windows, zero-padding its right and bottom edges.

    a    ne [C, W, H, 1]         numpy (H, W, C)              f32, contiguous
    out  ne [C, w, w, npx*npy]   numpy (npx*npy, w, w, C)     f32, npx = ceil(W/w), npy = ceil(H/w)

        out[py*npx + px, y, x, :] = a[py*w + y, px*w + x, :]   (0 outside a)

    ggml-cpu reads a as contiguous whatever its strides, so refimpl asks for a contiguous a.
    """
    a = np.asarray(a)
    n = ne4(a.shape)
    if a.dtype != np.float32 or n[3] != 1 or w <= 0:
        fail("win_part", f"a must be f32 with ne3 == 1 and w > 0 (w = {w})", a=a)
    if not is_contiguous(a):
        fail("win_part", "ggml-cpu reads a as contiguous: pass a contiguous array", a=a)
    C, W, H = n[0], n[1], n[2]
    npx, npy = -(-W // w), -(-H // w)
    img = np.zeros((npy * w, npx * w, C), np.float32)
    img[:H, :W] = a.reshape(H, W, C)
    return np.ascontiguousarray(img.reshape(npy, w, npx, w, C).transpose(0, 2, 1, 3, 4)).reshape(npy * npx, w, w, C)


@op("win_unpart")
def win_unpart(a: np.ndarray, w0: int, h0: int, w: int) -> np.ndarray:
    """ggml_win_unpart: the inverse of win_part -- stitch w x w windows into a w0 x h0 image.

    a    ne [C, w, w, np]   numpy (np, w, w, C)   f32, contiguous, np >= ceil(w0/w) * ceil(h0/w)
    out  ne [C, w0, h0]     numpy (h0, w0, C)      f32

        out[y, x, :] = a[(y // w) * npx + x // w, y % w, x % w, :],   npx = ceil(w0/w)

    ggml-cpu reads a as contiguous and indexes windows by npx, trusting a's shape; refimpl checks it.
    """
    a = np.asarray(a)
    n = ne4(a.shape)
    if a.dtype != np.float32 or w <= 0 or w0 <= 0 or h0 <= 0:
        fail("win_unpart", "a must be f32 and w, w0, h0 > 0", a=a)
    npx, npy = -(-w0 // w), -(-h0 // w)
    if n[1] != w or n[2] != w or n[3] < npx * npy:
        fail("win_unpart", f"a must be ne [C, {w}, {w}, >= {npx * npy}] for w0={w0}, h0={h0}, w={w}", a=a)
    if not is_contiguous(a):
        fail("win_unpart", "ggml-cpu reads a as contiguous: pass a contiguous array", a=a)
    win = as4(a)[: npx * npy].reshape(npy, npx, w, w, n[0]).transpose(0, 2, 1, 3, 4)
    return np.ascontiguousarray(win.reshape(npy * w, npx * w, n[0])[:h0, :w0])


@op("get_rel_pos")
def get_rel_pos(a: np.ndarray, qh: int, kh: int) -> np.ndarray:
    """ggml_get_rel_pos: SAM's relative-position table, one row per (query, key) offset.

    a    ne [C, 2k-1]   numpy (2k-1, C)   f16, contiguous; k = qh = kh (ggml asserts both)
    out  ne [C, k, k]   numpy (k, k, C)   f16

        out[i2, i1, :] = a[(k - 1 - i1) + i2, :]

    Only a's first matrix is read (ne2, ne3 > 1 are ignored, as in ggml-cpu). BF16 is rejected: ggml-cpu
    copies the bf16 bit patterns into the f16 result unconverted.
    """
    a = np.asarray(a)
    n = ne4(a.shape)
    if qh != kh or 2 * max(qh, kh) - 1 != n[1]:
        fail("get_rel_pos", f"need qh == kh and a.ne1 == 2*kh - 1 (qh={qh}, kh={kh})", a=a)
    if a.dtype != np.float16:
        fail("get_rel_pos", f"a must be f16, got {a.dtype}", a=a)
    if not is_contiguous(a):
        fail("get_rel_pos", "ggml-cpu reads a as contiguous: pass a contiguous array", a=a)
    k = kh
    pos = (k - 1 - np.arange(k))[None, :] + np.arange(k)[:, None]           # [i2, i1]
    return as4(a)[0, 0][pos]


@op("add_rel_pos")
def add_rel_pos(a: np.ndarray, pw: np.ndarray, ph: np.ndarray) -> np.ndarray:
    """ggml_add_rel_pos: add SAM's decomposed relative positions to an attention map.

    a    ne [K*K, qw*qh, B]   numpy (B, qh*qw, K*K)   f32, contiguous: scores of query (h, w) for key (kh, kw)
    pw   ne [K, qw, qh, B]    numpy (B, qh, qw, K)    f32, contiguous: the key-column term (rel_w)
    ph   same as pw                                    the key-row term (rel_h)
    out  a's shape, f32

        out[b, h*qw + w, kh*K + kw] = a[b, h*qw + w, kh*K + kw] + ph[b, h, w, kh] + pw[b, h, w, kw]

    In ggml-cpu's order: each element receives its ph and its pw term as two f32 additions, ph first
    when kh <= kw, pw first otherwise; refimpl adds in the same order, so the result is bit-exact.
    Only a's first ne3 plane gets the terms (ggml-cpu loops over a.ne2 = B only).
    """
    a, pw, ph = np.asarray(a), np.asarray(pw), np.asarray(ph)
    na, nw = ne4(a.shape), ne4(pw.shape)
    if pw.shape != ph.shape or nw[3] != na[2] or nw[0] * nw[0] != na[0] or nw[1] * nw[2] != na[1]:
        fail("add_rel_pos", "need pw, ph ne [K, qw, qh, B] (same shape) and a ne [K*K, qw*qh, B]",
             a=a, pw=pw, ph=ph)
    if a.dtype != np.float32 or pw.dtype != np.float32 or ph.dtype != np.float32:
        fail("add_rel_pos", "a, pw and ph must be f32", a=a, pw=pw, ph=ph)
    if not (is_contiguous(a) and is_contiguous(pw) and is_contiguous(ph)):
        fail("add_rel_pos", "a, pw and ph must be contiguous (ggml asserts it)", a=a, pw=pw, ph=ph)
    W = nw[0]                                                     # K
    out = np.array(as4(a), order="C")
    x = out[0].reshape(na[2], nw[2], nw[1], W, W)                 # [b, i12, i11, kh, kw]
    h = ph.reshape(nw[3], nw[2], nw[1], W)[..., :, None]          # added along kw
    v = pw.reshape(nw[3], nw[2], nw[1], W)[..., None, :]          # added along kh
    ph_first = np.arange(W)[:, None] <= np.arange(W)[None, :]
    out[0] = np.where(ph_first, (x + h) + v, (x + v) + h).reshape(out[0].shape)
    return out.reshape(a.shape)
