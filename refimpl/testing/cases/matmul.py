"""OpCases for mul_mat, mul_mat_id, out_prod, solve_tri (see refimpl/testing/cases/__init__.py)."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ...ops.matmul import OUT_PROD_QTYPES, VEC_DOT_TYPE
from ...qtensor import QTensor, quantize
from ...quants import QUANTIZERS
from ...types import GGMLType
from ._draw import NEW_IN_0_25, oracle_types, type_traits

from . import OpCase, cases, named, ne_str
from ._draw import maybe_view, values

VEC_DOT_TYPE = {k: v for k, v in VEC_DOT_TYPE.items() if k not in NEW_IN_0_25}
OUT_PROD_QTYPES = oracle_types(OUT_PROD_QTYPES)


def _g():
    from .. import ggml
    return ggml.lib()


# weight types with a CPU vec_dot in ggml (every type a model can store, minus activation-only Q8_1/Q8_K)
WEIGHT_TYPES = sorted(VEC_DOT_TYPE, key=int)


def _random_blocks(t, x: np.ndarray) -> QTensor:
    """Random bytes of type t with x's shape -- for the IQ types ggml quantizes only with an importance
    matrix -- with each block's f16 super-scale `d` set to a small finite value (random bytes would make
    it inf/nan now and then, and 6e4-sized weights)."""
    tr = type_traits[t]
    rng = np.random.default_rng(int(abs(x).sum() * 1000) % 2**32)
    nblk = x.size // tr.blck_size
    raw = rng.integers(0, 256, (nblk, tr.type_size), dtype=np.uint8)
    d = (rng.uniform(0.002, 0.02, nblk) * rng.choice([-1, 1], nblk)).astype(np.float16).view(np.uint16)
    if t == GGMLType.IQ1_M:     # d's four nibbles are the top nibbles of the four u16 scales (bytes 48..55)
        sc = raw[:, 48:56].copy().view("<u2")
        for i in range(4):
            sc[:, i] = (sc[:, i] & 0x0FFF) | (((d.astype(np.uint32) >> (4 * i)) & 0xF) << 12).astype(np.uint16)
        raw[:, 48:56] = sc.view(np.uint8)
    else:                         # every other IQ type starts with `d` (f16)
        raw[:, 0:2] = d.astype("<u2")[:, None].view(np.uint8)
    return QTensor(t, raw.reshape(x.shape[:-1] + (-1,)), x.shape)


def weight(t, x: np.ndarray):
    """x (float32, NumPy shape) stored as type t the way a model file would hold it."""
    if t == GGMLType.F32:
        return x
    if t == GGMLType.F16:
        return x.astype(np.float16)
    if (t, "ref") in QUANTIZERS or (t, "chunk") in QUANTIZERS:
        return quantize(x, t)
    return _random_blocks(t, x)


def activations(t, x: np.ndarray):
    """x as b of type t: f32, f16 ndarray, or a bf16 / Q8_x QTensor (quantized the way ggml-cpu would)."""
    if t == GGMLType.F32:
        return x
    if t == GGMLType.F16:
        return x.astype(np.float16)
    return quantize(x, t, method="ref" if t == GGMLType.BF16 else "cpu")


def tname(t) -> str:
    return type_traits[t].name


def _qview(draw, a):
    """a, or the same rows as a row-step view into a larger tensor (ggml_view with a larger nb1..nb3)."""
    if isinstance(a, np.ndarray):
        return maybe_view(draw, a)
    if draw(st.booleans()) and a.ndim >= 2:
        big = np.zeros((a.data.shape[0] * 2,) + a.data.shape[1:], np.uint8)
        big[::2] = a.data
        return QTensor(a.type, big[::2], a.shape)
    return a


def _nc(x) -> bool:
    return not (x.data if isinstance(x, QTensor) else x).flags.c_contiguous


def _mm(ctx, x, y):
    return _g().ggml_mul_mat(ctx, x, y)


# Exact mode differs from ggml by ggml-cpu's conversion of f32 b to the weight's vec_dot_type (f16, bf16, Q8
# blocks): random noise on every product. Over few outputs NMSE is a ratio of two small sums with a heavy tail
# (one output near 0 makes it unbounded), so lossy cases draw at least MIN_OUTPUTS outputs.
MIN_OUTPUTS = 64


def lossy(t, tb) -> bool:
    """Does ggml-cpu round b before the dots (so exact mode differs from it by more than f32 rounding)?"""
    return t != GGMLType.F32 and tb != VEC_DOT_TYPE[t]


@st.composite
def mul_mat_cases(draw, types=tuple(WEIGHT_TYPES)):
    """MUL_MAT cases over `types`: every b type ggml-cpu accepts, block broadcast, views of a and b."""
    t = draw(st.sampled_from(types))
    tb = draw(st.sampled_from([GGMLType.F32, GGMLType.F32, VEC_DOT_TYPE[t]]))
    blck = max(type_traits[t].blck_size, type_traits[tb].blck_size)
    k = blck * draw(st.integers(1, 3)) if blck > 1 else draw(st.integers(1, 96))
    n = draw(st.integers(1, 9))
    m = draw(st.integers(1, 5))
    a2, a3 = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    r2, r3 = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    if lossy(t, tb):
        m = max(m, -(-MIN_OUTPUTS // (n * a2 * a3 * r2 * r3)))
    a = _qview(draw, weight(t, values(draw, (a3, a2, n, k))))
    b = values(draw, (a3 * r3, a2 * r2, m, k))
    b = maybe_view(draw, b) if tb == GGMLType.F32 else _qview(draw, activations(tb, b))
    v = ",v=" + "".join("ab"[i] for i, x in enumerate((a, b)) if _nc(x)) if _nc(a) or _nc(b) else ""
    return OpCase("mul_mat", (a, b), build=_mm, type=tname(t),
                  name=f"MUL_MAT(type_a={tname(t)},type_b={tname(tb)},m={n},n={m},k={k},bs=[{a2},{a3}],"
                       f"nr=[{r2},{r3}]{v})")


@cases("mul_mat")
def _mul_mat():
    return mul_mat_cases()


@named("mul_mat")
def _mul_mat_named():
    """Shapes that broke other backends: rows of 1/33/1025, k not a multiple of 256 where allowed (K-quants
    and other 256-blocks need k % 256 == 0), GQA block broadcast, permuted and f16/bf16/Q8 activations."""
    rng = np.random.default_rng(2)
    u = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)  # noqa: E731
    out = []
    for t in WEIGHT_TYPES:
        blck = type_traits[t].blck_size
        for n, m, k in ((16, 1, 256), (33, 3, 256), (1025, 1, 256), (7, 2, max(blck, 32) * 3), (3, 33, 96)):
            if k % blck:
                continue
            a = weight(t, u(n, k))
            out.append(OpCase("mul_mat", (a, u(m, k)), build=_mm, type=tname(t),
                              name=f"MUL_MAT(type_a={tname(t)},type_b=f32,m={n},n={m},k={k})"))
    for t in (GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q4_K):   # b = vec_dot type
        tb = VEC_DOT_TYPE[t]
        out.append(OpCase("mul_mat", (weight(t, u(33, 256)), activations(tb, u(5, 256))), build=_mm,
                          type=tname(t), name=f"MUL_MAT(type_a={tname(t)},type_b={tname(tb)},m=33,n=5,k=256)"))
    # GQA: 4 query heads share each of 2 kv heads (block broadcast over ne2), k/q permuted as in llama.cpp
    kv, q = u(1, 2, 10, 64), u(1, 8, 3, 64)
    out.append(OpCase("mul_mat", (kv, q), build=_mm,
                      name="MUL_MAT(type_a=f32,type_b=f32,m=10,n=3,k=64,bs=[2,1],nr=[4,1])"))
    kp = np.ascontiguousarray(u(10, 2, 64)).transpose(1, 0, 2)[None]     # (n_kv, n_head_kv, hd) -> heads first
    qp = np.ascontiguousarray(u(3, 8, 64)).transpose(1, 0, 2)[None]
    out.append(OpCase("mul_mat", (kp.astype(np.float16), qp), build=_mm, type="f16",
                      name="MUL_MAT(type_a=f16,type_b=f32,m=10,n=3,k=64,bs=[2,1],nr=[4,1],per=[0,2,1,3])"))
    out.append(OpCase("mul_mat", (u(3, 2, 16, 32), u(3, 2 * 3, 4, 32)), build=_mm,
                      name="MUL_MAT(type_a=f32,type_b=f32,m=16,n=4,k=32,bs=[2,3],nr=[3,1])"))
    out.append(OpCase("mul_mat", (weight(GGMLType.Q8_0, u(2, 1, 16, 64)), u(2, 3, 7, 64)), build=_mm,
                      type="q8_0", name="MUL_MAT(type_a=q8_0,type_b=f32,m=16,n=7,k=64,bs=[1,2],nr=[3,1])"))
    return out


# -- mul_mat_id ----------------------------------------------------------------------------------------

def _mmid(ctx, x, y, i):
    return _g().ggml_mul_mat_id(ctx, x, y, i)


def _ids(rng, n_tok, n_mats, n_used, distinct=True) -> np.ndarray:
    """Expert ids (n_tok, n_used): distinct per token, as a router's top-k gives; else with repeats.
    Returned as the first n_used columns of a (n_tok, n_mats) buffer: a ggml view, as test-backend-ops."""
    if distinct and n_used <= n_mats:
        full = np.stack([rng.permutation(n_mats) for _ in range(n_tok)]).astype(np.int32)
    else:
        full = rng.integers(0, n_mats, (n_tok, max(n_mats, n_used))).astype(np.int32)
    return full[:, :n_used]


@st.composite
def mul_mat_id_cases(draw, types=tuple(WEIGHT_TYPES)):
    t = draw(st.sampled_from(types))
    tb = draw(st.sampled_from([GGMLType.F32, GGMLType.F32, VEC_DOT_TYPE[t]]))
    blck = max(type_traits[t].blck_size, type_traits[tb].blck_size)
    k = blck * draw(st.integers(1, 2)) if blck > 1 else draw(st.integers(1, 64))
    n_mats = draw(st.integers(1, 6))
    n_used = draw(st.integers(1, 4))
    bcast = draw(st.booleans())
    m, n_tok = draw(st.integers(1, 9)), draw(st.integers(1, 5))
    if lossy(t, tb):
        m = max(m, -(-MIN_OUTPUTS // (n_used * n_tok)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ids = _ids(rng, n_tok, n_mats, n_used, distinct=draw(st.booleans()))
    as_ = weight(t, values(draw, (n_mats, m, k)))
    b = values(draw, (n_tok, 1 if bcast else n_used, k))
    b = maybe_view(draw, b) if tb == GGMLType.F32 else activations(tb, b)
    return OpCase("mul_mat_id", (as_, b, ids), build=_mmid, type=tname(t),
                  name=f"MUL_MAT_ID(type_a={tname(t)},type_b={tname(tb)},n_mats={n_mats},n_used={n_used},"
                       f"b={int(bcast)},m={m},n={n_tok},k={k})")


@cases("mul_mat_id")
def _mul_mat_id():
    return mul_mat_id_cases()


@named("mul_mat_id")
def _mul_mat_id_named():
    """test-backend-ops' shapes in small: every weight type at k = 3 blocks, b broadcast and not, one expert,
    33 and 1025 rows, tokens that all pick one expert, repeated ids within a token."""
    rng = np.random.default_rng(3)
    u = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)  # noqa: E731
    out = []

    def case(t, n_mats, n_used, bcast, m, n_tok, k, ids=None, tb=GGMLType.F32, tag=""):
        ids = _ids(rng, n_tok, n_mats, n_used) if ids is None else ids
        b = activations(tb, u(n_tok, 1 if bcast else n_used, k))
        out.append(OpCase("mul_mat_id", (weight(t, u(n_mats, m, k)), b, ids), build=_mmid, type=tname(t),
                          name=f"MUL_MAT_ID(type_a={tname(t)},type_b={tname(tb)},n_mats={n_mats},"
                               f"n_used={n_used},b={int(bcast)},m={m},n={n_tok},k={k}{tag})"))

    for t in WEIGHT_TYPES:
        case(t, 4, 2, False, 16, 5, 3 * max(type_traits[t].blck_size, 32) if type_traits[t].blck_size < 256
             else 256)
    for bcast in (False, True):
        case(GGMLType.F16, 8, 4, bcast, 33, 7, 64)
        case(GGMLType.Q4_K, 8, 4, bcast, 33, 3, 256)
    case(GGMLType.F16, 1, 1, False, 8, 16, 1)
    case(GGMLType.Q8_0, 4, 2, False, 1025, 2, 64)
    case(GGMLType.Q4_0, 4, 3, True, 9, 6, 64, ids=np.full((6, 3), 2, np.int32), tag=",ids=all_2")
    case(GGMLType.F32, 3, 4, False, 5, 4, 16, ids=rng.integers(0, 3, (4, 4)).astype(np.int32), tag=",ids=repeats")
    case(GGMLType.Q4_1, 4, 2, False, 16, 3, 64, tb=GGMLType.Q8_1)
    return out


# -- out_prod ------------------------------------------------------------------------------------------

def _op(ctx, x, y):
    return _g().ggml_out_prod(ctx, x, y)


OUT_PROD_TYPES = [GGMLType.F32] + sorted(OUT_PROD_QTYPES, key=int)


def _out_prod_case(a, b_kn, t, m, n, k, bs, nr, trans_b):
    """b_kn numpy (..., k, n); trans_b: the same values as a transposed view of a (..., n, k) buffer."""
    b = np.ascontiguousarray(np.swapaxes(b_kn, -1, -2)).swapaxes(-1, -2) if trans_b else b_kn
    return OpCase("out_prod", (a, b), build=_op, type=tname(t),
                  name=f"OUT_PROD(type_a={tname(t)},type_b=f32,m={m},n={n},k={k},bs={bs},nr={nr},"
                       f"trans_b={int(trans_b)})".replace(" ", ""))


@cases("out_prod")
@st.composite
def _out_prod(draw):
    t = draw(st.sampled_from([GGMLType.F32] * 4 + OUT_PROD_TYPES))
    blck = type_traits[t].blck_size
    m = blck * draw(st.integers(1, 2)) if blck > 1 else draw(st.integers(1, 40))
    n, k = draw(st.integers(1, 9)), draw(st.integers(1, 40))
    a2, a3 = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    r2, r3 = (draw(st.integers(1, 2)), draw(st.integers(1, 2))) if t == GGMLType.F32 else (1, 1)
    a = weight(t, values(draw, (a3, a2, k, m)))
    a = maybe_view(draw, a) if t == GGMLType.F32 else a
    b = values(draw, (a3 * r3, a2 * r2, k, n))
    trans_b = draw(st.booleans())
    if not trans_b:
        b = maybe_view(draw, b, transposed=True)
    return _out_prod_case(a, b, t, m, n, k, [a2, a3], [r2, r3], trans_b)


@named("out_prod")
def _out_prod_named():
    rng = np.random.default_rng(4)
    u = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)  # noqa: E731
    out = []
    for t in OUT_PROD_TYPES:
        blck = type_traits[t].blck_size
        m = max(blck, 32)
        out.append(_out_prod_case(weight(t, u(2, 3, 16, m)), u(2, 3, 16, 7), t, m, 7, 16, [3, 2], [1, 1], False))
    for trans_b in (False, True):     # test-backend-ops' default, scaled down: bs [10,10] nr [2,2]
        out.append(_out_prod_case(u(2, 3, 32, 32), u(4, 6, 32, 33), GGMLType.F32, 32, 33, 32, [3, 2], [2, 2], trans_b))
    out.append(_out_prod_case(u(1025, 1), u(1025, 3), GGMLType.F32, 1, 3, 1025, [1, 1], [1, 1], False))
    out.append(_out_prod_case(weight(GGMLType.Q4_K, u(33, 256)), u(33, 1), GGMLType.Q4_K, 256, 1, 33,
                              [1, 1], [1, 1], True))
    return out


# -- solve_tri -----------------------------------------------------------------------------------------

def _st(ctx, x, y):
    return _g().ggml_solve_tri(ctx, x, y, True, True, False)


def _tril(rng, shape, lo, hi, diag_lo, diag_hi) -> np.ndarray:
    n = shape[-1]
    a = np.tril(rng.uniform(lo, hi, shape)).astype(np.float32)
    idx = np.arange(n)
    a[..., idx, idx] = rng.uniform(diag_lo, diag_hi, shape[:-2] + (n,))
    upper = np.triu(np.ones((n, n), bool), 1)
    a[..., upper] = rng.uniform(-1, 1, shape[:-2] + (int(upper.sum()),))   # ignored by ggml: garbage allowed
    return a


def _solve_case(a, b):
    return OpCase("solve_tri", (a, b), build=_st,
                  name=f"SOLVE_TRI(type=f32,ne_lhs={ne_str(a)},ne_rhs={ne_str(b)})")


@cases("solve_tri")
@st.composite
def _solve_tri(draw):
    n, k = draw(st.integers(1, 24)), draw(st.integers(1, 8))
    B1, B2 = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    a = _tril(rng, (B2, B1, n, n), -1.0 / n, 1.0 / n, 0.5, 2.0)    # well conditioned: diagonally dominant
    return _solve_case(a, values(draw, (B2, B1, n, k)))


@named("solve_tri")
def _solve_tri_named():
    """test-backend-ops' init (tril values in [0.1, 1]) at its default and small sizes, n = 1 and 33 rows."""
    rng = np.random.default_rng(5)
    out = []
    for lhs, rhs in (((3, 4, 10, 10), (3, 4, 10, 3)), ((1, 1, 1, 1), (1, 1, 1, 5)), ((1, 2, 6, 6), (1, 2, 6, 1))):
        out.append(_solve_case(_tril(rng, lhs, 0.1, 1.0, 0.1, 1.0), rng.uniform(-1, 1, rhs).astype(np.float32)))
    out.append(_solve_case(_tril(rng, (2, 1, 33, 33), -0.03, 0.03, 1.0, 2.0),
                           rng.uniform(-1, 1, (2, 1, 33, 64)).astype(np.float32)))
    return out
