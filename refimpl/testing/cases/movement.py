"""OpCases for the data-movement ops (see refimpl/testing/cases/__init__.py).

Every op of this family is exact (copies, conversions with ggml-cpu's from_float, f32 additions in ggml's
order), so the cases lean on what breaks data movement: views of every kind ggml can build (row steps,
permuted dims, offsets, transposed rows where the kernel reads any stride), odd extents (1, 33, 1025),
all-zero and adversarial blocks for the conversions, tiling of indices and shapes.
"""
from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from ...qtensor import QTensor, quantize
from ...ops.movement import CPU_FROM_FLOAT
from ...quants import QUANTIZERS
from ...types import NUMPY_DTYPES, GGMLType
from ._draw import oracle_types, type_traits
from ..strategies import BLOCK_KINDS, make_block, tensors
from . import OpCase, cases, named, ne_str
from ._draw import maybe_view, ne, shape, values

CPU_FROM_FLOAT = oracle_types(CPU_FROM_FLOAT)


def _g():
    from .. import ggml
    return ggml.lib()


def tname(t) -> str:
    return type_traits[GGMLType(t)].name.lower()


def _ne4(shp) -> list[int]:
    return list(shp[::-1]) + [1] * (4 - len(shp))


def _l(xs) -> str:
    """A list in test-backend-ops' printable form: [1,2,3] (no spaces, so ids stay one shell word)."""
    return "[" + ",".join(str(int(x)) for x in xs) + "]"


def _qpost(shp):
    """`post` for ops whose result can be a QTensor (BF16, block types): ggml's result comes back with
    ggml_n_dims axes and QTensors are compared byte for byte with equal data shapes, so ggml's QTensor is
    given refimpl's NumPy shape -- the same ne, only leading size-1 axes differ."""
    shp = tuple(shp)

    def post(out):
        if isinstance(out, QTensor) and out.shape != shp and _ne4(out.shape) == _ne4(shp):
            return QTensor(out.type, out.data.reshape(shp[:-1] + out.data.shape[-1:]), shp)
        return out
    return post


def undefined_bytes(x, td) -> bool:
    """True when ggml-cpu's from_float of type td leaves bytes of some block of x unwritten (so the
    result holds stale memory): IQ4_NL blocks with max |x| < 1e-15 (the quants come from a stack buffer
    of the previous call), Q8_K blocks of zeros (bsums not written). Cases avoid them; see set_rows/cpy."""
    td = GGMLType(td)
    if td not in (GGMLType.IQ4_NL, GGMLType.Q8_K):
        return False
    v = np.abs(np.asarray(x, np.float32)).reshape(-1, type_traits[td].blck_size).max(axis=1)
    return bool(np.any(v < 1e-15) if td == GGMLType.IQ4_NL else np.any(v == 0))


def _permuted_shape(shp, axes):
    from ...ops.movement import permute
    return permute(np.empty(shp, np.uint8), *axes).shape


# every type get_rows accepts as a source in ggml-cpu (all block types with a to_float, f32/f16/bf16/i32)
GET_ROWS_TYPES = [t for t in type_traits if t.name not in ("I8", "I16", "I64", "F64", "Q8_1", "Q8_K")]
BLOCK_TYPES = [t for t, tr in type_traits.items() if tr.blck_size > 1]
ELEMENT_TYPES = [GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I8, GGMLType.I16, GGMLType.I32,
                 GGMLType.I64, GGMLType.F64]
FLOATS = [GGMLType.F32, GGMLType.F16, GGMLType.BF16]
QUANT_DST = sorted((t for t in CPU_FROM_FLOAT if type_traits[t].blck_size > 1), key=int)


# -- drawing tensors of a given type, shape and view ---------------------------------------------------

def store(vals: np.ndarray, t, rng=None):
    """float values (NumPy shape) held as ggml type t: ndarray, or QTensor for BF16 and block types."""
    t = GGMLType(t)
    if t in NUMPY_DTYPES:
        dt = NUMPY_DTYPES[t]
        if dt.kind in "iu":
            rng = rng or np.random.default_rng(int(np.abs(vals).sum() * 1000) % 2**32)
            info = np.iinfo(dt)
            return rng.integers(max(info.min, -1000), min(info.max, 1000) + 1, vals.shape).astype(dt)
        with np.errstate(over="ignore", invalid="ignore"):
            return np.clip(np.nan_to_num(vals, nan=0.0), -10, 10).astype(dt)
    if (t, "ref") in QUANTIZERS or (t, "chunk") in QUANTIZERS:
        return quantize(vals, t)
    tr = type_traits[t]           # quantized by ggml only with an importance matrix: random bytes are valid
    rng = rng or np.random.default_rng(0)
    raw = rng.integers(0, 256, vals.shape[:-1] + (vals.shape[-1] // tr.blck_size * tr.type_size,), dtype=np.uint8)
    return QTensor(t, raw, vals.shape)


def _permute_leading(x, perm):
    """x viewed with its leading (row) axes stored in permuted order, as ggml_permute of a contiguous
    tensor makes it (the row axis stays put)."""
    inv = list(np.argsort(perm))
    k = len(perm)
    if isinstance(x, QTensor):
        d = np.ascontiguousarray(np.transpose(x.data, perm + [k])).transpose(inv + [k])
        return QTensor(x.type, d, x.shape)
    return np.ascontiguousarray(np.transpose(x, perm + [k])).transpose(inv + [k])


@st.composite
def tensor(draw, t, shp, views=("contiguous", "row_step", "permuted", "offset"), transposed=False,
           kinds=BLOCK_KINDS, lo=None):
    """A tensor of ggml type t and NumPy shape shp, as one of the views ggml can build.
    `transposed` also lets the row axis be strided (for kernels that read any nb0)."""
    t = GGMLType(t)
    nd = len(shp)
    view = draw(st.sampled_from(views))
    if nd == 1 and view in ("row_step", "permuted"):
        view = "contiguous"
    if view == "offset" and nd == 1 and t not in NUMPY_DTYPES:
        view = "contiguous"
    big = list(shp)
    ax = 0
    if view == "row_step":
        ax = draw(st.integers(0, nd - 2))
        big[ax] *= 2
    if view == "offset":
        big[0] += 1
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(kinds))
    vals = make_block(kind, int(np.prod(big)), rng, draw(st.integers(-3, 1))).reshape(big)
    base = store(vals, t, rng)
    if view == "row_step":
        return base[tuple(slice(None, None, 2) if i == ax else slice(None) for i in range(nd - 1))]
    if view == "offset":
        return base[1:]
    if view == "permuted":
        if transposed and not isinstance(base, QTensor):
            perm = list(draw(st.permutations(range(nd))))
            return np.ascontiguousarray(np.transpose(base, perm)).transpose(np.argsort(perm))
        return _permute_leading(base, list(draw(st.permutations(range(nd - 1)))))
    return base


def _ne_list(draw, nd_min=1, nd_max=4, n0_max=40, n_max=4, n0_mult=1):
    return ne(draw, max_ne0=n0_max * n0_mult, max_ne=n_max, min_dims=nd_min, max_dims=nd_max, ne0_multiple=n0_mult)


# -- get_rows -------------------------------------------------------------------------------------------

def _get_rows_case(a, rows, t):
    name = f"GET_ROWS(type={tname(t)},ne_a={ne_str(a)},ne_rows={ne_str(rows)})"
    return OpCase("get_rows", (a, rows), build=lambda ctx, x, r: _g().ggml_get_rows(ctx, x, r), type=tname(t),
                  name=name)


@cases("get_rows")
@st.composite
def _get_rows(draw):
    t = draw(st.sampled_from(GET_ROWS_TYPES))
    a = draw(tensors(types=[t], max_dims=4))
    if isinstance(a, np.ndarray) and a.ndim and a.shape[-1] > 1 and a.strides[-1] != a.itemsize:
        a = np.ascontiguousarray(a)      # ggml-cpu reads source rows as packed (see get_rows)
    if a.ndim < 2:
        a = a.reshape(1, -1) if not hasattr(a, "traits") else a.reshape(1, a.shape[-1])
    sh = a.shape
    R = sh[-2]
    n = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**32 - 1))
    rows = np.random.default_rng(seed).integers(0, R, sh[:-2] + (n,)).astype(np.int32)
    rows = draw(tensor_view(rows))
    return _get_rows_case(a, rows, t)


@st.composite
def tensor_view(draw, x: np.ndarray):
    """x itself or the same values as a row-step / permuted view (for index tensors)."""
    return maybe_view(draw, x, transposed=True)


@named("get_rows")
def _get_rows_named():
    """Quantized sources of several types, 1025 rows to pick from, rows of 1 and 33, repeated indices,
    batched indices (ne2), and all-zero blocks."""
    rng = np.random.default_rng(3)
    out = []
    for t in (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0,
              GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K,
              GGMLType.Q6_K, GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.MXFP4, GGMLType.IQ2_XXS, GGMLType.TQ2_0):
        E = max(type_traits[t].blck_size, 32) * 2
        a = store(rng.uniform(-1, 1, (1025, E)).astype(np.float32), t, rng)
        rows = rng.integers(0, 1025, 7).astype(np.int32)
        rows[:2] = [0, 1024]
        out.append(_get_rows_case(a, rows, t))
    a = rng.uniform(-1, 1, (3, 1025)).astype(np.float32)                       # rows of 1025 elements
    out.append(_get_rows_case(a, np.array([2, 2, 0, 1], np.int32), GGMLType.F32))
    for E in (1, 33):
        a = rng.uniform(-1, 1, (5, E)).astype(np.float32)
        out.append(_get_rows_case(a, np.array([4, 0, 4], np.int32), GGMLType.F32))
    a = rng.integers(-100, 100, (2, 3, 6, 33)).astype(np.int32)                # i32 source, batched
    out.append(_get_rows_case(a, rng.integers(0, 6, (2, 3, 4)).astype(np.int32), GGMLType.I32))
    a = quantize(np.zeros((4, 256), np.float32), GGMLType.Q4_K)                # all-zero blocks
    out.append(_get_rows_case(a, np.array([3, 1], np.int32), GGMLType.Q4_K))
    big = quantize(rng.uniform(-1, 1, (8, 64)).astype(np.float32), GGMLType.Q8_0)
    out.append(_get_rows_case(big[::2], np.array([3, 0], np.int32), GGMLType.Q8_0))  # row-step view
    return out


# -- get_rows_back --------------------------------------------------------------------------------------

def _get_rows_back_case(a, b, c):
    return OpCase("get_rows_back", (a, b, c), build=lambda ctx, x, i, y: _g().ggml_get_rows_back(ctx, x, i, y),
                  type=str(a.dtype).replace("float", "f"),
                  name=f"GET_ROWS_BACK(type={str(a.dtype).replace('float', 'f')},ne_a={ne_str(a)},"
                       f"ne_b={ne_str(b)},ne_c={ne_str(c)})")


@cases("get_rows_back")
@st.composite
def _get_rows_back(draw):
    t = draw(st.sampled_from([GGMLType.F32, GGMLType.F16]))
    E, n, R = draw(st.integers(1, 40)), draw(st.integers(1, 8)), draw(st.integers(1, 6))
    a = draw(tensor(t, (n, E), views=("contiguous", "row_step", "offset")))
    seed = draw(st.integers(0, 2**32 - 1))
    b = np.random.default_rng(seed).integers(0, R, n).astype(np.int32)          # repeats accumulate
    c = np.zeros((R, E), np.float32)
    return _get_rows_back_case(a, b, c)


@named("get_rows_back")
def _get_rows_back_named():
    rng = np.random.default_rng(4)
    out = []
    for E, n, R in ((1, 5, 2), (33, 9, 4), (1025, 3, 3)):
        a = rng.uniform(-1, 1, (n, E)).astype(np.float32)
        b = rng.integers(0, R, n).astype(np.int32)
        out.append(_get_rows_back_case(a, b, np.zeros((R, E), np.float32)))
    a = rng.uniform(-1, 1, (6, 64)).astype(np.float16)
    out.append(_get_rows_back_case(a, np.array([1, 1, 1, 0, 1, 1], np.int32), np.zeros((2, 64), np.float32)))
    return out


# -- set_rows -------------------------------------------------------------------------------------------

def _set_rows_case(a, b, c, t):
    nm = (f"SET_ROWS(type={tname(t)},type_idx={'i64' if c.dtype == np.int64 else 'i32'},ne_a={ne_str(a)},"
          f"ne_b={ne_str(b)},ne_c={ne_str(c)})")
    return OpCase("set_rows", (a, b, c), build=lambda ctx, x, y, i: _g().ggml_set_rows(ctx, x, y, i),
                  type=tname(t), name=nm, post=_qpost(a.shape))


@cases("set_rows")
@st.composite
def _set_rows(draw):
    t = draw(st.sampled_from(sorted(CPU_FROM_FLOAT, key=int)))
    blck = type_traits[t].blck_size
    E = blck * draw(st.integers(1, 2)) if blck > 1 else draw(st.integers(1, 40))
    R = draw(st.integers(1, 6))
    n = draw(st.integers(1, R))
    c2, c3 = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    n2, n3 = c2 * draw(st.integers(1, 2)), c3 * draw(st.integers(1, 2))
    a = draw(tensor(t, (n3, n2, R, E), views=("contiguous", "row_step", "permuted", "offset")))
    b = draw(tensor(GGMLType.F32, (n3, n2, n, E), views=("contiguous", "row_step", "permuted", "offset")))
    if draw(st.booleans()):                  # adversarial rows for the quantizers, not clipped to [-10, 10]
        seed = draw(st.integers(0, 2**32 - 1))
        kind = draw(st.sampled_from(BLOCK_KINDS))
        b = make_block(kind, b.size, np.random.default_rng(seed), draw(st.integers(-8, 8))).reshape(b.shape)
    assume(not undefined_bytes(b, t))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    idx = np.stack([rng.permutation(R)[:n] for _ in range(c3 * c2)]).reshape(c3, c2, n)   # distinct per plane
    c = idx.astype(draw(st.sampled_from([np.int64, np.int32])))
    c = draw(tensor_view(c))
    return _set_rows_case(a, b, c, t)


@named("set_rows")
def _set_rows_named():
    """Every destination type (KV-cache style: a few new rows into a larger cache), all-zero rows,
    i32 and i64 indices, tiled indices, rows of 1/33/1025."""
    rng = np.random.default_rng(5)
    out = []
    for t in sorted(CPU_FROM_FLOAT, key=int):
        E = max(type_traits[t].blck_size, 64) * (2 if type_traits[t].blck_size < 256 else 1)
        a = store(rng.uniform(-1, 1, (1, 2, 7, E)).astype(np.float32), t, rng)
        b = rng.uniform(-1, 1, (1, 2, 3, E)).astype(np.float32)
        if not undefined_bytes(np.zeros(E), t):
            b[0, 1, 0] = 0.0                                                      # an all-zero row
        c = np.array([[6, 0, 3]], np.int64)                                       # tiled over ne2
        out.append(_set_rows_case(a, b, c, t))
    for E in (1, 33, 1025):
        a = rng.uniform(-1, 1, (4, E)).astype(np.float32)
        b = rng.uniform(-1, 1, (2, E)).astype(np.float32)
        out.append(_set_rows_case(a, b, np.array([3, 1], np.int32), GGMLType.F32))
    a = np.zeros((2, 4, 5, 64), np.float16)                                       # c tiled over ne2 and ne3
    b = rng.uniform(-1, 1, (2, 4, 2, 64)).astype(np.float32)
    out.append(_set_rows_case(a, b, np.array([[[4, 2]], [[0, 1]]], np.int64)[:1, :, :], GGMLType.F16))
    return out


# -- cpy, cast, dup, cont ---------------------------------------------------------------------------------

def _cpy_dst_types(ts):
    if ts in FLOATS:
        return sorted(set(FLOATS) | {GGMLType.I32} | set(QUANT_DST), key=int)
    if ts == GGMLType.I32:
        return [GGMLType.F32, GGMLType.I32]
    if type_traits[ts].blck_size > 1:
        return [GGMLType.F32, ts]
    return [ts]


CPY_SRC_TYPES = [t for t in type_traits if t not in (GGMLType.Q8_1, GGMLType.Q8_K)]


def _zeros(t, shp):
    tr = type_traits[GGMLType(t)]
    if GGMLType(t) in NUMPY_DTYPES:
        return np.zeros(shp, NUMPY_DTYPES[GGMLType(t)])
    return QTensor(t, np.zeros(tuple(shp[:-1]) + (shp[-1] // tr.blck_size * tr.type_size,), np.uint8), shp)


def _factor_shape(draw, total: int, n0_mult: int) -> tuple:
    """A random NumPy shape (1 to 4 axes) of `total` elements whose last axis is a multiple of n0_mult."""
    rest = total // n0_mult
    k0 = draw(st.sampled_from([d for d in range(1, rest + 1) if rest % d == 0]))
    dims = [k0 * n0_mult]
    rest //= k0
    for _ in range(draw(st.integers(0, 2))):
        d = draw(st.sampled_from([d for d in range(1, rest + 1) if rest % d == 0]))
        dims.append(d)
        rest //= d
    if rest > 1 or draw(st.booleans()):
        dims.append(rest)
    return tuple(dims[::-1])


def _cpy_case(a, b, ts, td):
    nm = (f"CPY(type_src={tname(ts)},type_dst={tname(td)},ne_src={ne_str(a)},ne_dst={ne_str(b)}"
          + (",view_src" if not _contig(a) else "") + (",view_dst" if not _contig(b) else "") + ")")
    return OpCase("cpy", (a, b), build=lambda ctx, x, y: _g().ggml_cpy(ctx, x, y), type=tname(td), name=nm,
                  post=_qpost(b.shape))


def _contig(x) -> bool:
    return bool((x.data if isinstance(x, QTensor) else x).flags.c_contiguous)


def _via_from_float(ts, td) -> bool:
    """ggml-cpu converts through the destination's from_float (dup_to_q): contiguous rows in, contiguous out."""
    return ts != td and (type_traits[td].blck_size > 1 or (ts in (GGMLType.F16, GGMLType.BF16) and td == GGMLType.I32))


@cases("cpy")
@st.composite
def _cpy(draw):
    ts = draw(st.sampled_from(CPY_SRC_TYPES))
    td = draw(st.sampled_from(_cpy_dst_types(ts)))
    bs, bd = type_traits[ts].blck_size, type_traits[td].blck_size
    ff = _via_from_float(ts, td)
    mult = int(np.lcm(bs, bd))
    sa = shape(_ne_list(draw, n0_max=max(2, 48 // mult) if mult > 1 else 40, n0_mult=mult))
    a = draw(tensor(ts, sa, transposed=not ff and bs == 1))
    assume(ts == td or not undefined_bytes(a, td))
    sb = sa
    if draw(st.booleans()):                                       # a destination of another shape
        sb = _factor_shape(draw, int(np.prod(sa)), bd)
    if bs > 1 and ts == td and not _contig(a) and _ne4(sb) != _ne4(sa):
        sb = sa                                                   # ggml-cpu's dup_bytes bug (see cpy)
    if ff or bd > 1 or (bs > 1 and sb[-1] % bs):
        b = _zeros(td, sb)                                        # destinations ggml needs contiguous
    else:
        b = draw(tensor(td, sb, transposed=bs == 1))
    return _cpy_case(a, b, ts, td)


@named("cpy")
def _cpy_named():
    """f32 to every CPU from_float type (ggml's CPY(type_src=f32,type_dst=q...,ne=[256,4,1,1])), all-zero
    blocks, permuted sources (permute_src=[0,2,1,3]), quantized to f32, raw same-type copies, reshaping
    copies and strided destinations."""
    rng = np.random.default_rng(6)
    out = []
    x = rng.uniform(-1, 1, (4, 256)).astype(np.float32)
    for td in sorted(set(FLOATS) | {GGMLType.I32} | set(QUANT_DST), key=int):
        out.append(_cpy_case(x, _zeros(td, x.shape), GGMLType.F32, td))
    z = np.zeros((2, 256), np.float32)
    for td in (GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.IQ4_XS, GGMLType.MXFP4, GGMLType.TQ1_0):
        out.append(_cpy_case(z, _zeros(td, z.shape), GGMLType.F32, td))
    p = np.ascontiguousarray(rng.uniform(-1, 1, (3, 2, 33)).astype(np.float32).transpose(1, 0, 2)).transpose(1, 0, 2)
    for td in (GGMLType.F16, GGMLType.BF16, GGMLType.F32, GGMLType.I32):
        out.append(_cpy_case(p, _zeros(td, p.shape), GGMLType.F32, td))
    h = rng.uniform(-1, 1, (5, 64)).astype(np.float16)
    for td in (GGMLType.F32, GGMLType.BF16, GGMLType.I32, GGMLType.Q8_0, GGMLType.Q4_0):
        out.append(_cpy_case(h, _zeros(td, h.shape), GGMLType.F16, td))
    for ts in (GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.IQ4_XS, GGMLType.IQ2_XS):
        q = store(rng.uniform(-1, 1, (3, 256)).astype(np.float32), ts, rng)
        out.append(_cpy_case(q, _zeros(GGMLType.F32, (3, 256)), ts, GGMLType.F32))
        out.append(_cpy_case(q, _zeros(ts, (3, 256)), ts, ts))
        out.append(_cpy_case(q, _zeros(GGMLType.F32, (6, 128)), ts, GGMLType.F32))
    i = rng.integers(-1000, 1000, (7, 3)).astype(np.int32)
    out.append(_cpy_case(i, _zeros(GGMLType.F32, (21,)), GGMLType.I32, GGMLType.F32))
    f = rng.uniform(-1, 1, (4, 2, 32)).astype(np.float32)                     # reshaping copy
    out.append(_cpy_case(f, _zeros(GGMLType.F32, (16, 16)), GGMLType.F32, GGMLType.F32))
    out.append(_cpy_case(f, _zeros(GGMLType.Q8_0, (8, 32)), GGMLType.F32, GGMLType.Q8_0))
    dst = np.zeros((32, 4), np.float16).T                                      # a transposed destination
    out.append(_cpy_case(rng.uniform(-1, 1, (4, 32)).astype(np.float32), dst, GGMLType.F32, GGMLType.F16))
    return out


def _cast_case(a, ts, td):
    return OpCase("cast", (a, td), build=lambda ctx, x: _g().ggml_cast(ctx, x, int(td)), tensors=(a,),
                  post=_qpost(a.shape),
                  type=tname(td), name=f"CAST(type_src={tname(ts)},type_dst={tname(td)},ne={ne_str(a)})")


@cases("cast")
@st.composite
def _cast(draw):
    ts = draw(st.sampled_from([GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32, GGMLType.Q4_0,
                               GGMLType.Q4_K, GGMLType.Q8_0]))
    td = draw(st.sampled_from(_cpy_dst_types(ts)))
    mult = int(np.lcm(type_traits[ts].blck_size, type_traits[td].blck_size))
    sa = shape(_ne_list(draw, n0_max=max(2, 48 // mult) if mult > 1 else 40, n0_mult=mult))
    a = draw(tensor(ts, sa, transposed=not _via_from_float(ts, td) and type_traits[ts].blck_size == 1))
    assume(ts == td or not undefined_bytes(a, td))
    return _cast_case(a, ts, td)


@named("cast")
def _cast_named():
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, (3, 1025)).astype(np.float32)
    out = [_cast_case(x, GGMLType.F32, td) for td in (GGMLType.F16, GGMLType.BF16, GGMLType.I32)]
    x = (rng.uniform(-1, 1, (2, 64)) * 300).astype(np.float32)
    x[0, :4] = [2.7, -2.7, 0.5, -0.5]                                             # truncation toward zero
    out.append(_cast_case(x, GGMLType.F32, GGMLType.I32))
    out.append(_cast_case(rng.integers(-2**30, 2**30, (2, 8)).astype(np.int32), GGMLType.I32, GGMLType.F32))
    return out


def _dup_case(a, t):
    return OpCase("dup", (a,), build=lambda ctx, x: _g().ggml_dup(ctx, x), type=tname(t), post=_qpost(a.shape),
                  name=f"DUP(type={tname(t)},ne={ne_str(a)}{'' if _contig(a) else ',view'})")


@cases("dup")
@st.composite
def _dup(draw):
    t = draw(st.sampled_from(list(type_traits)))
    blck = type_traits[t].blck_size
    sa = shape(_ne_list(draw, n0_max=max(2, 64 // blck) if blck > 1 else 40, n0_mult=blck))
    return _dup_case(draw(tensor(t, sa, transposed=blck == 1)), t)


@named("dup")
def _dup_named():
    rng = np.random.default_rng(8)
    out = []
    x = rng.uniform(-1, 1, (2, 3, 4, 33)).astype(np.float32)
    out.append(_dup_case(x.transpose(1, 0, 2, 3), GGMLType.F32))                  # permute [0,1,3,2]-style
    out.append(_dup_case(x.astype(np.float16)[:, ::2], GGMLType.F16))
    q = quantize(rng.uniform(-1, 1, (6, 256)).astype(np.float32), GGMLType.Q4_K)
    out.append(_dup_case(q[::3], GGMLType.Q4_K))
    return out


def _cont_case(a, t, shp=None):
    if shp is None:
        build = lambda ctx, x: _g().ggml_cont(ctx, x)                             # noqa: E731
    else:
        n = _ne4(shp)
        build = lambda ctx, x: _g().ggml_cont_4d(ctx, x, *n)                      # noqa: E731
    return OpCase("cont", (a,) if shp is None else (a, shp), build=build, tensors=(a,), type=tname(t),
                  post=_qpost(a.shape if shp is None else shp),
                  name=f"CONT(type={tname(t)},ne={ne_str(a)}" + ("" if shp is None else f",ne_dst={_l(_ne4(shp))}")
                       + ("" if _contig(a) else ",view") + ")")


@cases("cont")
@st.composite
def _cont(draw):
    t = draw(st.sampled_from(list(type_traits)))
    blck = type_traits[t].blck_size
    sa = shape(_ne_list(draw, n0_max=max(2, 64 // blck) if blck > 1 else 40, n0_mult=blck))
    a = draw(tensor(t, sa, transposed=blck == 1))
    shp = None
    if draw(st.booleans()) and (blck == 1 or _contig(a)):                          # ggml_cont_Nd
        shp = _factor_shape(draw, int(np.prod(sa)), blck)
    return _cont_case(a, t, shp)


@named("cont")
def _cont_named():
    """llama's cont(permute(kqv, 0, 2, 1, 3)) and cont of a transposed matrix, cont_2d flattening heads."""
    rng = np.random.default_rng(9)
    kqv = rng.uniform(-1, 1, (7, 4, 64)).astype(np.float32).transpose(1, 0, 2)     # (n_head, n_tokens, hd) view
    x = rng.uniform(-1, 1, (33, 5)).astype(np.float32).T
    return [_cont_case(kqv, GGMLType.F32), _cont_case(x, GGMLType.F32),
            _cont_case(kqv, GGMLType.F32, (4, 7 * 64)),
            _cont_case(rng.uniform(-1, 1, (3, 1025)).astype(np.float16), GGMLType.F16, (1025, 3))]


# -- views, proven through ggml_cont(view) ---------------------------------------------------------------

def _reshape_case(a, t, shp):
    n = _ne4(shp)
    return OpCase("reshape", (a, shp), build=lambda ctx, x: _g().ggml_cont(ctx, _g().ggml_reshape_4d(ctx, x, *n)),
                  post=_qpost(shp),
                  tensors=(a,), type=tname(t), name=f"RESHAPE(type={tname(t)},ne={ne_str(a)},ne_new={_l(n)})")


@cases("reshape")
@st.composite
def _reshape(draw):
    t = draw(st.sampled_from(list(type_traits)))
    blck = type_traits[t].blck_size
    sa = shape(_ne_list(draw, n0_max=max(2, 64 // blck) if blck > 1 else 40, n0_mult=blck))
    a = draw(tensor(t, sa, views=("contiguous", "offset")))
    return _reshape_case(a, t, _factor_shape(draw, int(np.prod(sa)), blck) or sa)


@named("reshape")
def _reshape_named():
    rng = np.random.default_rng(10)
    x = rng.uniform(-1, 1, (7, 4 * 64)).astype(np.float32)          # Qcur (n_tokens, n_embd) -> (n_tokens, n_head, hd)
    q = quantize(rng.uniform(-1, 1, (4, 512)).astype(np.float32), GGMLType.Q4_0)
    return [_reshape_case(x, GGMLType.F32, (7, 4, 64)), _reshape_case(q, GGMLType.Q4_0, (8, 8, 32))]


def _view_case(a, shp, strides, offset):
    n = _ne4(shp)
    nb = [a.itemsize] + list(strides[::-1])[1:]
    while len(nb) < 4:                                  # dims NumPy does not have: packed after the last
        nb.append(nb[-1] * n[len(nb) - 1])
    return OpCase("view", (a, shp, strides, offset),
                  build=lambda ctx, x: _g().ggml_cont(ctx, _g().ggml_view_4d(ctx, x, *n, *nb[1:], offset)),
                  tensors=(a,), type=str(a.dtype).replace("float", "f").replace("int", "i"),
                  name=f"VIEW(ne_src={ne_str(a)},ne={_l(n)},nb={_l(nb)},offset={offset})")


@cases("view")
@st.composite
def _view(draw):
    a = values(draw, (draw(st.integers(1, 4)), draw(st.integers(1, 5)), draw(st.integers(1, 40))))
    a = a.astype(draw(st.sampled_from([np.float32, np.float16, np.int32, np.int8])))
    es, total = a.itemsize, a.size
    nd = draw(st.integers(1, 4))
    shp = [draw(st.integers(1, 6)) for _ in range(nd)]
    strides = [es]
    for i in range(nd - 1, 0, -1):                   # NumPy axes from the row outwards
        strides.insert(0, es * draw(st.integers(0, 3 * int(np.prod(shp[i:])))))
    span = es + sum((n - 1) * s for n, s in zip(shp, strides))
    room = total * es - max(span, int(np.prod(shp)) * es)
    if room < 0:
        shp, strides = [1] * nd, [es] * nd
        room = total * es - es
    offset = es * draw(st.integers(0, room // es))
    return _view_case(a, tuple(shp), tuple(strides), offset)


@named("view")
def _view_named():
    """llama's K-cache view: view_3d(k, head_dim, n_head_kv, n_kv, nb1, nb2, offset) of a bigger cache."""
    rng = np.random.default_rng(11)
    cache = rng.uniform(-1, 1, (16, 2 * 64)).astype(np.float16)        # (n_ctx, n_head_kv * head_dim)
    return [_view_case(cache, (5, 2, 64), (cache.strides[0], 128, 2), 3 * cache.strides[0]),
            _view_case(cache, (2, 5, 64), (128, cache.strides[0], 2), 0)]


def _permute_case(a, t, axes):
    return OpCase("permute", (a, *axes), build=lambda ctx, x: _g().ggml_cont(ctx, _g().ggml_permute(ctx, x, *axes)),
                  post=_qpost(_permuted_shape(a.shape, axes)),
                  tensors=(a,), type=tname(t), name=f"PERMUTE(type={tname(t)},ne={ne_str(a)},permute={_l(axes)})")


@cases("permute")
@st.composite
def _permute(draw):
    t = draw(st.sampled_from(list(type_traits)))
    blck = type_traits[t].blck_size
    sa = shape(_ne_list(draw, n0_max=max(2, 64 // blck) if blck > 1 else 12, n0_mult=blck))
    a = draw(tensor(t, sa, transposed=blck == 1))
    axes = list(draw(st.permutations(range(4))))
    if blck > 1:
        axes = [0] + list(draw(st.permutations([1, 2, 3])))
    return _permute_case(a, t, tuple(axes))


@named("permute")
def _permute_named():
    rng = np.random.default_rng(12)
    q = rng.uniform(-1, 1, (7, 4, 64)).astype(np.float32)            # (n_tokens, n_head, head_dim)
    return [_permute_case(q, GGMLType.F32, (0, 2, 1, 3)), _permute_case(q, GGMLType.F32, (1, 2, 0, 3)),
            _permute_case(rng.uniform(-1, 1, (2, 3, 4, 5)).astype(np.float32), GGMLType.F32, (3, 1, 0, 2))]


def _transpose_case(a, t):
    return OpCase("transpose", (a,), build=lambda ctx, x: _g().ggml_cont(ctx, _g().ggml_transpose(ctx, x)),
                  post=_qpost(_permuted_shape(a.shape, (1, 0, 2, 3))),
                  type=tname(t), name=f"TRANSPOSE(type={tname(t)},ne={ne_str(a)})")


@cases("transpose")
@st.composite
def _transpose(draw):
    t = draw(st.sampled_from([t for t in ELEMENT_TYPES]))
    sa = shape(_ne_list(draw, n0_max=33))
    return _transpose_case(draw(tensor(t, sa, transposed=True)), t)


@named("transpose")
def _transpose_named():
    rng = np.random.default_rng(13)
    return [_transpose_case(rng.uniform(-1, 1, (33, 1025)).astype(np.float32), GGMLType.F32),
            _transpose_case(rng.uniform(-1, 1, (5,)).astype(np.float32), GGMLType.F32)]


# -- repeat, repeat_back, concat ---------------------------------------------------------------------------

REPEAT_TYPES = [GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32, GGMLType.I16]


def _repeat_case(a, t, shp):
    n = _ne4(shp)
    return OpCase("repeat", (a, shp), build=lambda ctx, x: _g().ggml_repeat_4d(ctx, x, *n), tensors=(a,),
                  post=_qpost(shp),
                  type=tname(t),
                  name=f"REPEAT(type={tname(t)},ne={ne_str(a)},nr={_l([y // x for x, y in zip(_ne4(a.shape), n)])})")


@cases("repeat")
@st.composite
def _repeat(draw):
    t = draw(st.sampled_from(REPEAT_TYPES))
    na = _ne_list(draw, n0_max=16, n_max=3)
    reps = [draw(st.integers(1, 3)) for _ in range(4)]
    a = draw(tensor(t, shape(na), views=("contiguous", "row_step", "permuted", "offset")))
    nb = [x * r for x, r in zip(_ne4(shape(na)), reps)]
    return _repeat_case(a, t, shape(nb))


@named("repeat")
def _repeat_named():
    rng = np.random.default_rng(14)
    out = []
    for na, nr in (([10, 5, 4, 3], [2, 2, 2, 2]), ([1, 1, 1, 1], [33, 3, 1, 2]), ([1025, 1], [1, 2, 1, 1])):
        a = rng.uniform(-1, 1, shape(na)).astype(np.float32)
        out.append(_repeat_case(a, GGMLType.F32, shape([x * r for x, r in zip(na, nr)])))
    a = rng.uniform(-1, 1, (3, 8)).astype(np.float32)
    b = np.zeros((2, 6, 16), np.float32)                       # ggml_repeat(a, b): b's shape
    out.append(OpCase("repeat", (a, b), build=lambda ctx, x, y: _g().ggml_repeat(ctx, x, y), type="f32",
                      name="REPEAT(type=f32,ne=[8,3,1,1],nr=[2,2,2,1],b)"))
    return out


def _repeat_back_case(a, b):
    return OpCase("repeat_back", (a, b), build=lambda ctx, x, y: _g().ggml_repeat_back(ctx, x, y),
                  name=f"REPEAT_BACK(type=f32,ne={ne_str(b)},"
                       f"nr={_l([y // x for x, y in zip(_ne4(b.shape), _ne4(a.shape))])}"
                       + ("" if _contig(a) else ",view") + ")")


@cases("repeat_back")
@st.composite
def _repeat_back(draw):
    nb = _ne_list(draw, n0_max=12, n_max=3)
    reps = [draw(st.integers(1, 4)) for _ in range(4)]
    na = [x * r for x, r in zip(_ne4(shape(nb)), reps)]
    a = draw(tensor(GGMLType.F32, shape(na), views=("contiguous", "row_step", "permuted", "offset")))
    return _repeat_back_case(a, np.zeros(shape(nb), np.float32))


@named("repeat_back")
def _repeat_back_named():
    rng = np.random.default_rng(15)
    out = []
    for nb, nr in (([10, 5, 4, 3], [2, 2, 2, 2]), ([1, 1, 1, 1], [1025, 3, 1, 2]), ([33, 1], [1, 7, 1, 1])):
        a = (rng.uniform(-1, 1, shape([x * r for x, r in zip(nb, nr)])) * 10 ** rng.uniform(-3, 3)).astype(np.float32)
        out.append(_repeat_back_case(a, np.zeros(shape(nb), np.float32)))
    return out


def _concat_case(a, b, t, dim):
    n = _ne4(a.shape)
    n[dim] += _ne4(b.shape)[dim]
    nd = max(len(a.shape), len(b.shape), dim + 1)
    return OpCase("concat", (a, b, dim), build=lambda ctx, x, y: _g().ggml_concat(ctx, x, y, dim), type=tname(t),
                  post=_qpost(tuple(n[:nd][::-1])),
                  name=f"CONCAT(type={tname(t)},ne_a={ne_str(a)},ne_b={ne_str(b)},dim={dim}"
                       + ("" if _contig(a) and _contig(b) else ",v") + ")")


@cases("concat")
@st.composite
def _concat(draw):
    t = draw(st.sampled_from(ELEMENT_TYPES))
    dim = draw(st.integers(0, 3))
    na = _ne_list(draw, n0_max=20, n_max=3)
    na = na + [1] * (dim + 1 - len(na))
    nb = list(na)
    nb[dim] = draw(st.integers(1, 4))
    a = draw(tensor(t, shape(na), transposed=True))
    b = draw(tensor(t, shape(nb), transposed=True))
    return _concat_case(a, b, t, dim)


@named("concat")
def _concat_named():
    """ggml's CONCAT(type=f32,ne_a=[11,12,13,14],ne_b_d=7,dim=...,v=...) for every dim, i32, a 1025 row."""
    rng = np.random.default_rng(16)
    out = []
    for dim in range(4):
        na = [11, 12, 13, 14]
        nb = list(na)
        nb[dim] = 7
        a = rng.uniform(-1, 1, shape(na)).astype(np.float32)
        b = rng.uniform(-1, 1, shape(nb)).astype(np.float32)
        out.append(_concat_case(a, b, GGMLType.F32, dim))
        bt = np.ascontiguousarray(b.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)   # v: b non-contiguous
        out.append(_concat_case(a, bt, GGMLType.F32, dim))
    i = rng.integers(-5, 5, (2, 1025)).astype(np.int32)
    out.append(_concat_case(i, i[:1], GGMLType.I32, 1))
    return out


# -- acc, set ---------------------------------------------------------------------------------------------

@st.composite
def _byte_view(draw, a_shape, es):
    """(b's NumPy shape, nb1, nb2, nb3, offset): a byte view of a contiguous a of a_shape that fits in it."""
    total = int(np.prod(a_shape)) * es
    nd = draw(st.integers(1, 4))
    sb = [draw(st.integers(1, 5)) for _ in range(nd)]
    nbs = [es * draw(st.integers(0, 12)) for _ in range(3)]            # overlapping views allowed
    n = _ne4(tuple(sb))
    span = es + sum((k - 1) * s for k, s in zip(n, [es] + nbs))
    if span > total:
        sb, nbs = [1] * nd, [es] * 3
        span = es
    offset = es * draw(st.integers(0, (total - span) // es))
    return tuple(sb), nbs, offset


def _acc_set_case(op, a, b, nbs, offset):
    g = {"acc": "ggml_acc", "set": "ggml_set"}[op]
    t = "f32" if a.dtype == np.float32 else "i32"
    return OpCase(op, (a, b, *nbs, offset), build=lambda ctx, x, y: getattr(_g(), g)(ctx, x, y, *nbs, offset),
                  tensors=(a, b), type=t,
                  name=f"{op.upper()}(type={t},ne_a={ne_str(a)},ne_b={ne_str(b)},nb={_l(nbs)},offset={offset})")


@st.composite
def _acc_set(draw, op):
    t = np.float32 if op == "acc" else draw(st.sampled_from([np.float32, np.int32]))
    na = shape(_ne_list(draw, n0_max=20, n_max=4))
    a = draw(tensor(GGMLType.F32 if t == np.float32 else GGMLType.I32, na, views=("contiguous", "offset")))
    sb, nbs, offset = draw(_byte_view(na, 4))
    b = draw(tensor(GGMLType.F32 if t == np.float32 else GGMLType.I32, sb,
                    views=("contiguous", "row_step", "permuted", "offset")))
    if b.size > a.size:
        b = b.reshape(-1)[:1].copy()
    return _acc_set_case(op, a, b, nbs, offset)


@cases("acc")
def _acc():
    return _acc_set("acc")


@cases("set")
def _set():
    return _acc_set("set")


def _acc_set_named(op):
    """The typical uses: b written into a block of a at an element offset with a's own strides; the
    whole a; a single element at the very end; a 1025-long row."""
    rng = np.random.default_rng(17)
    a = rng.uniform(-1, 1, (3, 4, 33)).astype(np.float32)
    nb = [a.strides[1], a.strides[0], a.nbytes]
    out = [_acc_set_case(op, a, rng.uniform(-1, 1, (2, 3, 5)).astype(np.float32), nb, 4 * (33 + 2)),
           _acc_set_case(op, a, rng.uniform(-1, 1, a.shape).astype(np.float32), nb, 0),
           _acc_set_case(op, a, np.float32([7.0]), nb, a.nbytes - 4)]
    r = rng.uniform(-1, 1, (2, 1025)).astype(np.float32)
    out.append(_acc_set_case(op, r, rng.uniform(-1, 1, (1025,)).astype(np.float32), [r.strides[0]] * 3,
                             r.strides[0]))
    bs = rng.uniform(-1, 1, (6, 3, 5)).astype(np.float32)[::2]                    # b a row-step view
    out.append(_acc_set_case(op, a, bs, nb, 4 * 33))
    if op == "set":
        i = rng.integers(-9, 9, (4, 6)).astype(np.int32)
        out.append(_acc_set_case(op, i, np.int32([[1, 2], [3, 4]]), [i.strides[0], i.nbytes, i.nbytes], 8))
    return out


@named("acc")
def _acc_named():
    return _acc_set_named("acc")


@named("set")
def _set_named():
    return _acc_set_named("set")


@named("set_1d")
def _set_1d_named():
    rng = np.random.default_rng(18)
    a = rng.uniform(-1, 1, (4, 10)).astype(np.float32)
    b = rng.uniform(-1, 1, (13,)).astype(np.float32)
    return [OpCase("set_1d", (a, b, 4 * 7), build=lambda ctx, x, y: _g().ggml_set_1d(ctx, x, y, 4 * 7),
                   name="SET_1D(type=f32,ne_a=[10,4],ne_b=[13],offset=28)")]


@named("set_2d")
def _set_2d_named():
    rng = np.random.default_rng(19)
    a = rng.uniform(-1, 1, (6, 10)).astype(np.float32)
    b = rng.uniform(-1, 1, (3, 4)).astype(np.float32)
    return [OpCase("set_2d", (a, b, 80, 8), build=lambda ctx, x, y: _g().ggml_set_2d(ctx, x, y, 80, 8),
                   name="SET_2D(type=f32,ne_a=[10,6],ne_b=[4,3],nb1=80,offset=8)")]


# -- pad, pad_reflect_1d, roll ---------------------------------------------------------------------------

def _pad_case(a, lp, rp, circular, op="pad"):
    fn = "ggml_pad_ext_circular" if circular else "ggml_pad_ext"
    args = [v for pair in zip(lp, rp) for v in pair]
    if op == "pad":
        call = (a, *rp)
        kw = dict(lp0=lp[0], lp1=lp[1], lp2=lp[2], lp3=lp[3], circular=circular)
    else:
        call, kw = (a, *args), dict(circular=circular)
    return OpCase(op, call, kw, build=lambda ctx, x: getattr(_g(), fn)(ctx, x, *args), tensors=(a,),
                  name=f"{op.upper()}(type=f32,ne_a={ne_str(a)},lp={_l(lp)},rp={_l(rp)},circular={int(circular)}"
                       + ("" if _contig(a) else ",v") + ")")


@st.composite
def _pads(draw, op):
    na = _ne_list(draw, n0_max=20, n_max=4)
    a = draw(tensor(GGMLType.F32, shape(na), transposed=True))
    circular = draw(st.booleans())
    n = _ne4(shape(na))
    lp = [draw(st.integers(0, min(3, n[d]) if circular else 3)) for d in range(4)]
    rp = [draw(st.integers(0, 3)) for _ in range(4)]
    return _pad_case(a, lp, rp, circular, op)


@cases("pad")
def _pad():
    return _pads("pad")


@cases("pad_ext")
def _pad_ext():
    return _pads("pad_ext")


@named("pad")
def _pad_named():
    rng = np.random.default_rng(20)
    a = rng.uniform(-1, 1, (3, 4, 5, 33)).astype(np.float32)
    t = rng.uniform(-1, 1, (1025, 2)).astype(np.float32).T
    return [_pad_case(a, [0] * 4, [1, 2, 3, 4], False), _pad_case(a, [1, 0, 2, 1], [0, 3, 0, 1], False),
            _pad_case(a, [3, 4, 4, 3], [3, 4, 5, 3], True), _pad_case(t, [0, 1, 0, 0], [7, 0, 0, 0], False),
            _pad_case(np.float32([[1.0]]), [0] * 4, [0] * 4, False)]


def _reflect_case(a, p0, p1):
    return OpCase("pad_reflect_1d", (a, p0, p1), build=lambda ctx, x: _g().ggml_pad_reflect_1d(ctx, x, p0, p1),
                  name=f"PAD_REFLECT_1D(type=f32,ne_a={ne_str(a)},pad_0={p0},pad_1={p1})")


@cases("pad_reflect_1d")
@st.composite
def _pad_reflect_1d(draw):
    na = _ne_list(draw, n0_max=20, n_max=3)
    a = draw(tensor(GGMLType.F32, shape(na), views=("contiguous", "offset")))
    return _reflect_case(a, draw(st.integers(0, na[0] - 1)), draw(st.integers(0, na[0] - 1)))


@named("pad_reflect_1d")
def _pad_reflect_1d_named():
    rng = np.random.default_rng(21)
    return [_reflect_case(np.float32([1, 2, 3, 4]), 1, 1),
            _reflect_case(rng.uniform(-1, 1, (3, 2, 512)).astype(np.float32), 10, 9),
            _reflect_case(rng.uniform(-1, 1, (1025,)).astype(np.float32), 1024, 0)]


def _roll_case(a, s):
    return OpCase("roll", (a, *s), build=lambda ctx, x: _g().ggml_roll(ctx, x, *s),
                  name=f"ROLL(type=f32,ne={ne_str(a)},shift={_l(s)}" + ("" if _contig(a) else ",v") + ")")


@cases("roll")
@st.composite
def _roll(draw):
    na = _ne_list(draw, n0_max=20, n_max=5)
    a = draw(tensor(GGMLType.F32, shape(na)))
    n = _ne4(shape(na))
    return _roll_case(a, tuple(draw(st.integers(-(k - 1), k - 1)) for k in n))


@named("roll")
def _roll_named():
    rng = np.random.default_rng(22)
    a = rng.uniform(-1, 1, (3, 4, 5, 33)).astype(np.float32)
    return [_roll_case(a, (1, -2, 3, -1)), _roll_case(a, (-32, 0, 0, 2)),
            _roll_case(rng.uniform(-1, 1, (2, 1025)).astype(np.float32), (1000, 1, 0, 0))]


# -- diag, diag_mask -------------------------------------------------------------------------------------

def _diag_case(a):
    return OpCase("diag", (a,), build=lambda ctx, x: _g().ggml_diag(ctx, x),
                  name=f"DIAG(type=f32,ne={ne_str(a)}" + ("" if _contig(a) else ",v") + ")")


@cases("diag")
@st.composite
def _diag(draw):
    n0, n2, n3 = draw(st.integers(1, 20)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    return _diag_case(draw(tensor(GGMLType.F32, (n3, n2, 1, n0))))


@named("diag")
def _diag_named():
    rng = np.random.default_rng(23)
    return [_diag_case(rng.uniform(-1, 1, (33,)).astype(np.float32)),
            _diag_case(rng.uniform(-1, 1, (2, 3, 1, 10)).astype(np.float32))]


def _mask_case(op, a, n_past):
    g = "ggml_" + op
    return OpCase(op, (a, n_past), build=lambda ctx, x: getattr(_g(), g)(ctx, x, n_past),
                  name=f"{op.upper()}(type=f32,ne={ne_str(a)},n_past={n_past})")


@st.composite
def _masks(draw, op):
    na = _ne_list(draw, nd_min=2, n0_max=20, n_max=6)
    a = draw(tensor(GGMLType.F32, shape(na), views=("contiguous", "offset")))
    return _mask_case(op, a, draw(st.integers(0, 6)))


@cases("diag_mask_inf")
def _diag_mask_inf():
    return _masks("diag_mask_inf")


@cases("diag_mask_zero")
def _diag_mask_zero():
    return _masks("diag_mask_zero")


def _masks_named(op):
    rng = np.random.default_rng(24)
    kq = rng.uniform(-1, 1, (1, 4, 7, 12)).astype(np.float32)     # (n_head, n_tokens=7, n_kv=12) after 5 cached
    return [_mask_case(op, kq, 5), _mask_case(op, kq, 0),
            _mask_case(op, rng.uniform(-1, 1, (33, 1025)).astype(np.float32), 3),
            _mask_case(op, np.float32([[1.0]]), 0)]


@named("diag_mask_inf")
def _diag_mask_inf_named():
    return _masks_named("diag_mask_inf")


@named("diag_mask_zero")
def _diag_mask_zero_named():
    return _masks_named("diag_mask_zero")


# -- win_part, win_unpart, get_rel_pos, add_rel_pos -------------------------------------------------------

def _win_part_case(a, w):
    return OpCase("win_part", (a, w), build=lambda ctx, x: _g().ggml_win_part(ctx, x, w),
                  name=f"WIN_PART(type=f32,ne={ne_str(a)},w={w})")


@cases("win_part")
@st.composite
def _win_part(draw):
    sa = (draw(st.integers(1, 9)), draw(st.integers(1, 9)), draw(st.integers(1, 8)))
    a = draw(tensor(GGMLType.F32, sa[draw(st.integers(0, 2)):], views=("contiguous", "offset")))
    return _win_part_case(a, draw(st.integers(1, 5)))


@named("win_part")
def _win_part_named():
    rng = np.random.default_rng(25)
    a = rng.uniform(-1, 1, (9, 14, 33)).astype(np.float32)         # SAM: (H, W, C) into 7x7 windows
    return [_win_part_case(a, 7), _win_part_case(a, 14), _win_part_case(a, 1)]


def _win_unpart_case(a, w0, h0, w):
    return OpCase("win_unpart", (a, w0, h0, w), build=lambda ctx, x: _g().ggml_win_unpart(ctx, x, w0, h0, w),
                  name=f"WIN_UNPART(type=f32,ne={ne_str(a)},w0={w0},h0={h0},w={w})")


@cases("win_unpart")
@st.composite
def _win_unpart(draw):
    w = draw(st.integers(1, 4))
    w0, h0 = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    npx, npy = -(-w0 // w), -(-h0 // w)
    C = draw(st.integers(1, 8))
    a = draw(tensor(GGMLType.F32, (npx * npy, w, w, C), views=("contiguous", "offset")))
    return _win_unpart_case(a, w0, h0, w)


@named("win_unpart")
def _win_unpart_named():
    rng = np.random.default_rng(26)
    return [_win_unpart_case(rng.uniform(-1, 1, (4, 7, 7, 33)).astype(np.float32), 14, 9, 7),
            _win_unpart_case(rng.uniform(-1, 1, (1, 7, 7, 3)).astype(np.float32), 7, 7, 7)]


def _rel_pos_case(a, k):
    return OpCase("get_rel_pos", (a, k, k), build=lambda ctx, x: _g().ggml_get_rel_pos(ctx, x, k, k), type="f16",
                  name=f"GET_REL_POS(type=f16,ne={ne_str(a)},qh={k},kh={k})")


@cases("get_rel_pos")
@st.composite
def _get_rel_pos(draw):
    k, C = draw(st.integers(1, 9)), draw(st.integers(1, 40))
    return _rel_pos_case(draw(tensor(GGMLType.F16, (2 * k - 1, C), views=("contiguous", "offset"))), k)


@named("get_rel_pos")
def _get_rel_pos_named():
    rng = np.random.default_rng(27)
    return [_rel_pos_case(rng.uniform(-1, 1, (27, 64)).astype(np.float16), 14),
            _rel_pos_case(rng.uniform(-1, 1, (1, 33)).astype(np.float16), 1)]


def _add_rel_pos_case(a, pw, ph, tag=""):
    return OpCase("add_rel_pos", (a, pw, ph), build=lambda ctx, x, w, h: _g().ggml_add_rel_pos(ctx, x, w, h),
                  name=f"ADD_REL_POS(type=f32,ne_a={ne_str(a)},ne_p={ne_str(pw)}{tag})")


@cases("add_rel_pos")
@st.composite
def _add_rel_pos(draw):
    K, qw, qh, B = (draw(st.integers(1, 6)) for _ in range(4))
    scale = [10.0 ** draw(st.integers(-4, 4)) for _ in range(3)]
    a = values(draw, (B, qh * qw, K * K)) * np.float32(scale[0])
    pw = values(draw, (B, qh, qw, K)) * np.float32(scale[1])
    ph = values(draw, (B, qh, qw, K)) * np.float32(scale[2])
    return _add_rel_pos_case(a, pw, ph)


@named("add_rel_pos")
def _add_rel_pos_named():
    rng = np.random.default_rng(28)
    K, qw, qh, B = 14, 14, 14, 2
    a = rng.uniform(-1, 1, (B, qh * qw, K * K)).astype(np.float32)
    pw = (rng.uniform(-1, 1, (B, qh, qw, K)) * 1e3).astype(np.float32)
    ph = (rng.uniform(-1, 1, (B, qh, qw, K)) * 1e-3).astype(np.float32)
    return [_add_rel_pos_case(a, pw, ph, ",scales=1:1e3:1e-3"),
            _add_rel_pos_case(a * 1e4, ph, pw, ",scales=1e4:1e-3:1e3")]
