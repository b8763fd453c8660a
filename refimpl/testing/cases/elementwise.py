"""OpCases for the element-wise ops (see refimpl/testing/cases/__init__.py).

Inputs are uniform in [-1, 1] (test-backend-ops' default) unless an op needs another range. Views:
`maybe_view` (permuted / row-step, rows contiguous) where the kernel accepts any row layout; `_padded`
(rows of a wider buffer: ggml_is_contiguous_1) where ggml asserts or assumes dims 2, 3 packed over dim 1.
Operand types are the pairs ggml-cpu's kernels implement (f32, f16, bf16 as a QTensor).
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ...ops.elementwise import QUANT_ADD_TYPES
from ...qtensor import QTensor, quantize
from ...types import as_type
from ._draw import oracle_types, type_traits

from . import OpCase, cases, named, ne_str
from ._draw import maybe_view, ne, shape, values

QUANT_ADD_TYPES = oracle_types(QUANT_ADD_TYPES)


def _g():
    from .. import ggml
    return ggml.lib()


def values_as(x: np.ndarray, t: str):
    """f32 values x as type t: f32 / f16 ndarray or a bf16 QTensor."""
    if t == "f32":
        return x.astype(np.float32)
    if t == "f16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16)
    return quantize(x, "bf16", method="ref")


def _padded(draw, x):
    """x, or the same values as the first ne0 columns of a wider buffer (ggml_view_4d with a larger nb1 and
    nb2 = nb1*ne1, nb3 = nb2*ne2): rows padded, dims 2, 3 packed over dim 1 (ggml_is_contiguous_1)."""
    if not draw(st.booleans()) or x.ndim < 2 or x.shape[-2] == 1:     # (with ne1 = 1 a padded nb1 is dropped)
        return x
    pad = draw(st.integers(1, 5))
    if isinstance(x, QTensor):
        big = np.zeros(x.data.shape[:-1] + (x.data.shape[-1] + 2 * pad,), np.uint8)
        big[..., :x.data.shape[-1]] = x.data
        return QTensor(x.type, big[..., :x.data.shape[-1]], x.shape)
    big = np.zeros(x.shape[:-1] + (x.shape[-1] + pad,), x.dtype)
    big[..., :x.shape[-1]] = x
    return big[..., :x.shape[-1]]


def _view(draw, x):
    """maybe_view for ndarrays (rows stay contiguous); QTensors contiguous or padded."""
    return _padded(draw, x) if isinstance(x, QTensor) else maybe_view(draw, x)


def reshape_bf16(shape):
    """post for QTensor (bf16) results: ggml's result read back with ggml_n_dims dims, given refimpl's NumPy
    shape. check_values compares QTensor bytes without reconciling leading 1s in the shape, so a bf16 result
    of ne [4, 1] would fail on numpy (4,) vs (1, 4); values are untouched."""
    def post(out):
        return out.reshape(*shape) if isinstance(out, QTensor) else out
    return post


def type_tag(x) -> str:
    if isinstance(x, QTensor):
        return x.traits.name.lower()
    return {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}[x.dtype]


def view_tag(x) -> str:
    d = x.data if isinstance(x, QTensor) else x
    return "" if d.flags.c_contiguous else ",view"


# -- binary ops -------------------------------------------------------------------------------------------

BINARY = {"add": "ggml_add", "sub": "ggml_sub", "mul": "ggml_mul", "div": "ggml_div"}
BINARY_TYPES = [("f32", "f32"), ("f16", "f16"), ("f16", "f32"), ("bf16", "bf16"), ("bf16", "f32")]


def _binary_case(op, a, b):
    ta, tb = type_tag(a), type_tag(b)
    tbs = "" if tb == ta else f",type_b={tb}"
    return OpCase(op, (a, b), build=lambda ctx, x, y: getattr(_g(), BINARY[op])(ctx, x, y), type=ta,
                  post=reshape_bf16(a.shape),
                  name=f"{op.upper()}(type={ta}{tbs},ne_a={ne_str(a)},ne_b={ne_str(b)}{view_tag(a)}{view_tag(b)})")


@st.composite
def _binary(draw, op: str):
    ta, tb = draw(st.sampled_from(BINARY_TYPES))
    na = ne(draw)
    nb = [n // draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0])) for n in na]  # tiles
    lo = 0.5 if op == "div" else -1.0                   # div: |b| >= 0.5, as test-backend-ops
    a = _view(draw, values_as(values(draw, shape(na)), ta))
    bv = values(draw, shape(nb), lo, 1.0)
    if op == "div":                                     # either sign, never 0
        bv = bv * np.where(values(draw, shape(nb)) < 0, -1, 1).astype(np.float32)
    b = values_as(bv, tb)
    if not isinstance(b, QTensor):
        b = maybe_view(draw, b, transposed=True)      # src1 may have any layout, even strided rows
    return _binary_case(op, a, b)


def _binary_named(op):
    rng = np.random.default_rng(0)
    out = []
    shapes = [([6], [2]), ([33, 5, 4, 3], [33, 1, 1, 1]), ([1025, 2], [1025, 1]), ([10, 5, 4, 3], [1, 5, 1, 3]),
              ([1, 1], [1, 1]), ([64, 4, 3, 2], [64, 4, 3, 2]), ([16, 6], [4, 3])]
    for na, nb in shapes:
        a = rng.uniform(-1, 1, shape(na)).astype(np.float32)
        b = rng.uniform(0.5, 1, shape(nb)).astype(np.float32) * rng.choice([-1, 1], shape(nb)).astype(np.float32)
        out.append(_binary_case(op, a, b))
    a = rng.uniform(-1, 1, (3, 4, 33)).astype(np.float32)
    b = rng.uniform(0.5, 1, (33, 4)).astype(np.float32).T           # transposed src1 (non-contiguous rows)
    out.append(_binary_case(op, np.ascontiguousarray(a.transpose(1, 0, 2)).transpose(1, 0, 2), b[None]))
    for ta, tb in BINARY_TYPES[1:]:
        a = rng.uniform(-1, 1, (3, 2, 40)).astype(np.float32)
        b = rng.uniform(0.5, 1, (1, 2, 40)).astype(np.float32)
        out.append(_binary_case(op, values_as(a, ta), values_as(b, tb)))
    # infinities, zeros, large values: a/0 = +-inf, 0/0 = nan, f16 overflow to inf
    sp = np.array([[0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 6e4, -6e4, 1e-30, 3.0]], np.float32)
    out.append(_binary_case(op, sp, np.array([[0.0, 0.0, -0.0, 2.0, 1.0, np.inf, 2.0, 2.0, 1e-30, 0.0]], np.float32)))
    out.append(_binary_case(op, sp.astype(np.float16), np.array([[1.0, 3.0, 0.0, 6e4, 2.0, 1.0, 6e4, -6e4, 1.0, 7.0]],
                                                                np.float16)))
    return out


QUANT_TYPES = sorted(QUANT_ADD_TYPES)


@st.composite
def _quant_a(draw, add1=False):
    """A block QTensor a (quantized from uniform values, as a weight file holds it), maybe row-padded.
    add1: ne3 = 1 (ggml-cpu misplaces rows of i3 > 0) and no padding (ggml_add1 asserts ggml_is_padded_1d,
    which the oracle's views of a 2-D/3-D tensor never are)."""
    t = draw(st.sampled_from(QUANT_TYPES))
    blk = type_traits[as_type(t)].blck_size
    n = ne(draw, max_ne0=blk * 2, ne0_multiple=blk, max_dims=3 if add1 else 4)
    x = quantize(values(draw, shape(n)), t)
    return x if add1 else _padded(draw, x)


@st.composite
def _quant_add(draw):
    a = draw(_quant_a())
    b = maybe_view(draw, values(draw, a.shape))
    return _binary_case("add", a, b)


def _quant_add_named():
    rng = np.random.default_rng(15)
    out = []
    for t in QUANT_TYPES:
        blk = type_traits[as_type(t)].blck_size
        x = rng.uniform(-1, 1, (3, 2, 2 * blk)).astype(np.float32)
        out.append(_binary_case("add", quantize(x, t), rng.uniform(-0.1, 0.1, x.shape).astype(np.float32)))
    return out


for _op in BINARY:
    cases(_op)(lambda _op=_op: _binary(_op) if _op != "add" else st.one_of(_binary(_op), _quant_add()))
    named(_op)(lambda _op=_op: _binary_named(_op) + (_quant_add_named() if _op == "add" else []))


# -- add1, add_id ------------------------------------------------------------------------------------------

ADD1_TYPES = [("f32", "f32"), ("f16", "f16"), ("f16", "f32"), ("bf16", "bf16"), ("bf16", "f32")]


def _add1_case(a, b):
    ta, tb = type_tag(a), type_tag(b)
    return OpCase("add1", (a, b), build=lambda ctx, x, y: _g().ggml_add1(ctx, x, y), type=ta,
                  post=reshape_bf16(a.shape), name=f"ADD1(type={ta},type_b={tb},ne={ne_str(a)}{view_tag(a)})")


@cases("add1")
@st.composite
def _add1(draw):
    if draw(st.integers(0, 3)) == 0:        # quantized a; ne3 = 1 (ggml-cpu misplaces rows of i3 > 0)
        return _add1_case(draw(_quant_a(add1=True)), values(draw, (1,)))
    ta, tb = draw(st.sampled_from(ADD1_TYPES))
    n = ne(draw)
    a = values_as(values(draw, shape(n)), ta)
    if len(n) == 4 and min(n) > 1:      # padded rows: the oracle's views are padded_1d only with all ne > 1
        a = _padded(draw, a)
    return _add1_case(a, values_as(values(draw, (1,)), tb))


@named("add1")
def _add1_named():
    rng = np.random.default_rng(2)
    out = [_add1_case(values_as(rng.uniform(-1, 1, shape(n)).astype(np.float32), ta),
                      values_as(np.array([0.25], np.float32), tb))
           for n in ([1], [33, 2], [1025, 3], [16, 5, 4, 3]) for ta, tb in ADD1_TYPES]
    x = np.zeros((3, 4, 5, 40), np.float32)
    x[...] = rng.uniform(-1, 1, x.shape)
    out.append(_add1_case(x[..., :33], np.array([-3.5], np.float32)))      # padded rows
    for t in QUANT_TYPES:
        blk = type_traits[as_type(t)].blck_size
        out.append(_add1_case(quantize(rng.uniform(-1, 1, (2, 3, blk)).astype(np.float32), t),
                              np.array([0.125], np.float32)))
    return out


def _add_id_case(a, b, ids):
    return OpCase("add_id", (a, b, ids), build=lambda ctx, x, y, i: _g().ggml_add_id(ctx, x, y, i),
                  name=f"ADD_ID(type=f32,ne_a={ne_str(a)},n_expert={b.shape[0]}{view_tag(a)}{view_tag(b)})")


@cases("add_id")
@st.composite
def _add_id(draw):
    n0, n_used, n_tok, n3 = draw(st.integers(1, 64)), draw(st.integers(1, 4)), draw(st.integers(1, 5)), \
        draw(st.integers(1, 2))
    n_exp = draw(st.integers(1, 6))
    a = maybe_view(draw, values(draw, (n3, n_tok, n_used, n0)))
    b = maybe_view(draw, values(draw, (n_exp, n0)))
    seed = draw(st.integers(0, 2**32 - 1))
    ids = np.random.default_rng(seed).integers(0, n_exp, (n_tok, n_used)).astype(np.int32)
    return _add_id_case(a, b, ids)


@named("add_id")
def _add_id_named():
    rng = np.random.default_rng(3)
    out = []
    for n0, n_used, n_tok, n_exp in [(1, 1, 1, 1), (33, 4, 7, 8), (1025, 2, 3, 32), (64, 1, 5, 3)]:
        a = rng.uniform(-1, 1, (n_tok, n_used, n0)).astype(np.float32)
        b = rng.uniform(-1, 1, (n_exp, n0)).astype(np.float32)
        ids = rng.integers(0, n_exp, (n_tok, n_used)).astype(np.int32)
        out.append(_add_id_case(a, b, ids))
    a = rng.uniform(-1, 1, (4, 2, 16)).astype(np.float32)
    ids = np.ascontiguousarray(np.array([[1, 0, 2, 2], [0, 0, 1, 2]], np.int32).T)   # (n_tok=4, n_used=2)
    out.append(_add_id_case(a, rng.uniform(-1, 1, (3, 16)).astype(np.float32), ids))
    return out


# -- unary ops ---------------------------------------------------------------------------------------------

F = ("f32", "f16", "bf16")
# op: (types, lo, hi) -- value ranges reach each op's interesting region (gelu's +-10 cut, softplus' 20, ...)
UNARY = {
    "sqr": (F, -10, 10), "sqrt": (F, 0, 10), "log": (F, 0.001, 10), "sin": (F, -10, 10), "cos": (F, -10, 10),
    "abs": (F, -1, 1), "sgn": (F, -1, 1), "neg": (F, -1, 1), "step": (F, -1, 1), "tanh": (F, -5, 5),
    "elu": (F, -5, 5), "relu": (F, -1, 1), "sigmoid": (F, -10, 10), "hardsigmoid": (F, -5, 5),
    "hardswish": (F, -5, 5), "exp": (F, -10, 10), "expm1": (F, -5, 5), "softplus": (F, -25, 25),
    "floor": (F, -5, 5), "ceil": (F, -5, 5), "round": (F, -5, 5), "trunc": (F, -5, 5),
    "silu": (("f32", "f16"), -10, 10), "gelu": (("f32", "f16"), -12, 12), "gelu_quick": (("f32", "f16"), -12, 12),
    "gelu_erf": (("f32", "f16"), -3, 6),      # below -3.5 erff cancels: an ulp of it is 1e-3 relative
}

# values that broke or distinguish implementations: signed zeros, infinities, nans, halves, f16 overflow,
# the cuts
SPECIAL = np.array([0.0, -0.0, 0.5, -0.5, 1.5, -2.5, 2.5, np.inf, -np.inf, 1e-8, -1e-8, 3.0, -3.0, 9.99, 10.0,
                    -10.0, -10.01, 12.3, 20.0, 20.5, -20.0, 88.0, -88.0, 1e5, -1e5, 0.49999997, 65519.0, 65520.0,
                    1e-3, 2.0, np.nan, -np.nan], np.float32)


def _unary_case(op, x, build=None, kwargs=None, params=""):
    t = type_tag(x)
    build = build or (lambda ctx, a: getattr(_g(), f"ggml_{op}")(ctx, a))
    return OpCase(op, (x,), kwargs or {}, build=build, type=t, post=reshape_bf16(x.shape),
                  name=f"UNARY(op={op},type={t},ne={ne_str(x)}{params}{view_tag(x)})")


@st.composite
def _unary(draw, op):
    types, lo, hi = UNARY[op]
    t = draw(st.sampled_from(types))
    n = ne(draw)
    x = values(draw, shape(n), lo, hi)
    if draw(st.integers(0, 4)) == 0:                   # sometimes sprinkle in the special values
        flat = x.reshape(-1)
        k = draw(st.integers(0, len(SPECIAL) - 1))
        flat[: min(flat.size, 3)] = SPECIAL[k]
    return _unary_case(op, _view(draw, values_as(x, t)))


def _unary_named(op):
    types, lo, hi = UNARY[op]
    rng = np.random.default_rng(4)
    out = []
    for n in ([1], [33, 2], [1025, 3], [64, 5, 4, 3]):
        for t in types:
            out.append(_unary_case(op, values_as(rng.uniform(lo, hi, shape(n)).astype(np.float32), t)))
    for t in types:
        out.append(_unary_case(op, values_as(SPECIAL.reshape(2, -1), t)))
    x = rng.uniform(lo, hi, (3, 4, 8, 2)).astype(np.float32)
    out.append(_unary_case(op, np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)))  # permuted
    return out


for _op in UNARY:
    cases(_op)(lambda _op=_op: _unary(_op))
    named(_op)(lambda _op=_op: _unary_named(_op))


# -- xielu, leaky_relu, silu_back ----------------------------------------------------------------------------

def _xielu_case(x, an, ap, beta, eps):
    t = type_tag(x)
    return OpCase("xielu", (x, an, ap, beta, eps), type=t, post=reshape_bf16(x.shape),
                  build=lambda ctx, a: _g().ggml_xielu(ctx, a, an, ap, beta, eps),
                  name=f"UNARY(op=xielu,type={t},ne={ne_str(x)},alpha_n={an},alpha_p={ap},beta={beta},eps={eps}"
                       f"{view_tag(x)})")


@cases("xielu")
@st.composite
def _xielu(draw):
    t = draw(st.sampled_from(F))
    x = _padded(draw, values_as(values(draw, shape(ne(draw)), -5, 5), t))
    an, ap = draw(st.sampled_from([0.8, 0.0, -2.0, 3.5, 25.0])), draw(st.sampled_from([0.8, 0.0, 1.5, -1.0, 21.0]))
    beta, eps = draw(st.sampled_from([0.5, 0.0, 1.0])), draw(st.sampled_from([-1e-6, 0.0, -0.5, 1e-3]))
    return _xielu_case(x, an, ap, beta, eps)


@named("xielu")
def _xielu_named():
    rng = np.random.default_rng(5)
    out = [_xielu_case(values_as(rng.uniform(-5, 5, shape(n)).astype(np.float32), t), 0.8, 0.8, 0.5, -1e-6)
           for n in ([1], [33, 2], [1025, 3], [64, 5, 4, 3]) for t in F]
    out.append(_xielu_case(SPECIAL.reshape(2, -1), 0.8, 0.8, 0.5, -1e-6))
    return out


def _leaky_case(x, slope):
    t = type_tag(x)
    return OpCase("leaky_relu", (x, slope), type=t, build=lambda ctx, a: _g().ggml_leaky_relu(ctx, a, slope, False),
                  name=f"LEAKY_RELU(type={t},ne={ne_str(x)},negative_slope={slope}{view_tag(x)})")


@cases("leaky_relu")
@st.composite
def _leaky_relu(draw):
    x = _padded(draw, values_as(values(draw, shape(ne(draw))), draw(st.sampled_from(["f32", "f16"]))))
    return _leaky_case(x, draw(st.sampled_from([0.1, 0.01, 0.0, 1.0, -0.5, 3.0])))


@named("leaky_relu")
def _leaky_relu_named():
    rng = np.random.default_rng(6)
    out = [_leaky_case(values_as(rng.uniform(-1, 1, shape(n)).astype(np.float32), t), 0.1)
           for n in ([1], [33, 2], [1025, 3], [64, 5, 4, 3]) for t in ("f32", "f16")]
    out += [_leaky_case(values_as(SPECIAL.reshape(2, -1), t), s) for t in ("f32", "f16") for s in (0.1, -2.0)]
    return out


def _silu_back_case(dy, x):
    t = type_tag(dy)
    return OpCase("silu_back", (dy, x), type=t, build=lambda ctx, a, b: _g().ggml_silu_back(ctx, a, b),
                  name=f"SILU_BACK(type={t},ne={ne_str(x)}{view_tag(dy)}{view_tag(x)})")


@cases("silu_back")
@st.composite
def _silu_back(draw):
    t = draw(st.sampled_from(["f32", "f16"]))
    n = ne(draw)
    return _silu_back_case(_padded(draw, values_as(values(draw, shape(n)), t)),
                           _padded(draw, values_as(values(draw, shape(n), -10, 10), t)))


@named("silu_back")
def _silu_back_named():
    rng = np.random.default_rng(7)
    out = []
    for n in ([1], [33, 2], [1025, 3], [64, 5, 4, 3]):
        for t in ("f32", "f16"):
            out.append(_silu_back_case(values_as(rng.uniform(-1, 1, shape(n)).astype(np.float32), t),
                                       values_as(rng.uniform(-10, 10, shape(n)).astype(np.float32), t)))
    return out


# -- GLU ops -------------------------------------------------------------------------------------------------

GLU = {"reglu": (("f32", "f16"), -1, 1), "geglu": (("f32", "f16"), -12, 12), "swiglu": (("f32", "f16"), -10, 10),
       "geglu_erf": (("f32", "f16"), -3, 6), "geglu_quick": (("f32", "f16"), -12, 12),
       "swiglu_oai": (("f32",), -10, 10)}


def _glu_case(op, a, b=None, swapped=False, alpha=1.702, limit=7.0):
    t = type_tag(a)
    g = _g()
    code = getattr(g, f"GGML_GLU_OP_{op.upper()}")
    oai = op == "swiglu_oai"

    def build(ctx, x, y=None):
        if oai and not swapped:
            return g.ggml_swiglu_oai(ctx, x, y, alpha, limit)
        r = g.ggml_glu_split(ctx, x, y, code) if y is not None else g.ggml_glu(ctx, x, code, swapped)
        if oai:                             # ggml_glu leaves alpha, limit (op_params 2, 3) at 0: set them
            r.contents.op_params[2] = int(np.float32(alpha).view(np.int32))
            r.contents.op_params[3] = int(np.float32(limit).view(np.int32))
        return r
    args = (a,) if b is None else (a, b)
    kw = {"swapped": swapped} if swapped else {}
    if oai:
        args, kw = (a, b, alpha, limit), dict(kw)
    params = (",split" if b is not None else "") + (",swapped" if swapped else "") + \
        (f",alpha={alpha},limit={limit}" if oai else "")
    nc = view_tag(a) + (view_tag(b) if b is not None else "")
    return OpCase(op, args, kw, build=build, tensors=tuple(x for x in (a, b) if x is not None), type=t,
                  name=f"GLU(op={op},type={t},ne={ne_str(a)}{params}{nc})")


@st.composite
def _glu(draw, op):
    types, lo, hi = GLU[op]
    t = draw(st.sampled_from(types))
    n = ne(draw)
    split = draw(st.booleans())
    if not split:
        n[0] = max(n[0], 2)                           # a merged row of 1 would give ne0 = 0
    a = _padded(draw, values_as(values(draw, shape(n), lo, hi), t))
    b = _padded(draw, values_as(values(draw, shape(n)), t)) if split else None
    swapped = False if split else draw(st.booleans())
    if op == "swiglu_oai":
        alpha, limit = draw(st.sampled_from([1.702, 1.0, 0.5])), draw(st.sampled_from([7.0, 2.0, 0.5]))
        return _glu_case(op, a, b, swapped, alpha, limit)
    return _glu_case(op, a, b, swapped)


def _glu_named(op):
    types, lo, hi = GLU[op]
    rng = np.random.default_rng(8)
    out = []
    for n in ([2], [1], [66, 2], [2050, 3], [128, 5, 4, 3], [33, 3]):
        for t in types:
            a = values_as(rng.uniform(lo, hi, shape(n)).astype(np.float32), t)
            if n[0] > 1:
                out += [_glu_case(op, a), _glu_case(op, a, swapped=True)]
            if n == [2]:
                continue                                  # its split form is n = [1]'s
            half = [n[0] // 2 or 1] + n[1:]
            out.append(_glu_case(op, values_as(rng.uniform(lo, hi, shape(half)).astype(np.float32), t),
                                 values_as(rng.uniform(-1, 1, shape(half)).astype(np.float32), t)))
    sp = SPECIAL.reshape(1, -1)
    out.append(_glu_case(op, np.concatenate([sp, sp[:, ::-1]], axis=1)))
    out.append(_glu_case(op, sp, np.ascontiguousarray(sp[:, ::-1])))
    return out


for _op in GLU:
    cases(_op)(lambda _op=_op: _glu(_op))
    named(_op)(lambda _op=_op: _glu_named(_op))


# -- scale, clamp, fill, tri, arange -------------------------------------------------------------------------

def _scale_case(x, s, b=0.0):
    build = (lambda ctx, a: _g().ggml_scale(ctx, a, s)) if b == 0.0 else \
        (lambda ctx, a: _g().ggml_scale_bias(ctx, a, s, b))
    return OpCase("scale", (x, s, b), build=build, name=f"SCALE(type=f32,ne={ne_str(x)},scale={s},bias={b})")


@cases("scale")
@st.composite
def _scale(draw):
    x = values(draw, shape(ne(draw)), -10, 10)
    s = draw(st.sampled_from([0.5, 2.0, -1.0, 0.0, 1e-3, 0.125, 3.14159]))
    b = draw(st.sampled_from([0.0, 0.0, 1.0, -0.3, 1e-4, 7.77]))
    return _scale_case(x, s, b)


@named("scale")
def _scale_named():
    rng = np.random.default_rng(9)
    out = [_scale_case(rng.uniform(-1, 1, shape(n)).astype(np.float32), s, b)
           for n in ([1], [33, 2], [1025, 3], [64, 5, 4, 3]) for s, b in ((0.5, 0.0), (0.1, 1.0), (-3.0, 0.25))]
    out += [_scale_case(SPECIAL.reshape(2, -1), s, b) for s, b in ((2.0, 0.0), (1e30, 0.0), (0.1, 0.7), (0.0, 1.0))]
    return out


def _clamp_case(x, lo, hi):
    t = type_tag(x)
    return OpCase("clamp", (x, lo, hi), type=t, build=lambda ctx, a: _g().ggml_clamp(ctx, a, lo, hi),
                  name=f"CLAMP(type={t},ne={ne_str(x)},min={lo},max={hi}{view_tag(x)})")


@cases("clamp")
@st.composite
def _clamp(draw):
    x = _padded(draw, values_as(values(draw, shape(ne(draw)), -2, 2), draw(st.sampled_from(["f32", "f16"]))))
    lo = draw(st.sampled_from([-0.5, -1.0, 0.0, -np.inf, 0.25]))
    hi = draw(st.sampled_from([0.5, 1.0, np.inf, 1.5]))
    return _clamp_case(x, lo, hi)


@named("clamp")
def _clamp_named():
    rng = np.random.default_rng(10)
    out = [_clamp_case(values_as(rng.uniform(-2, 2, shape(n)).astype(np.float32), t), -0.5, 0.5)
           for n in ([1], [33, 2], [1025, 3], [64, 5, 4, 3]) for t in ("f32", "f16")]
    out += [_clamp_case(values_as(SPECIAL.reshape(2, -1), t), lo, hi) for t in ("f32", "f16")
            for lo, hi in ((-1.0, 1.0), (0.5, -0.5), (-np.inf, 0.0))]
    return out


def _fill_case(x, c):
    t = type_tag(x)
    return OpCase("fill", (x, c), type=t, build=lambda ctx, a: _g().ggml_fill(ctx, a, c),
                  name=f"FILL(type={t},ne={ne_str(x)},c={c})")


@cases("fill")
@st.composite
def _fill(draw):
    x = values_as(values(draw, shape(ne(draw))), draw(st.sampled_from(["f32", "f16"])))
    return _fill_case(x, draw(st.sampled_from([0.0, -0.0, 1.0, -2.5, 3.14159, 1e5, -np.inf, 1e-8])))


@named("fill")
def _fill_named():
    return [_fill_case(values_as(np.zeros(shape(n), np.float32), t), c)
            for n in ([1], [33, 2], [1025, 3], [64, 5, 4, 3]) for t in ("f32", "f16") for c in (0.0, -1.5, 7e4)]


def _tri_case(x, typ):
    return OpCase("tri", (x, typ), build=lambda ctx, a: _g().ggml_tri(ctx, a, typ),
                  name=f"TRI(type=f32,ne={ne_str(x)},tri_type={typ})")


@cases("tri")
@st.composite
def _tri(draw):
    n = draw(st.integers(1, 40))
    nd = draw(st.integers(2, 4))
    shp = tuple(draw(st.integers(1, 3)) for _ in range(nd - 2)) + (n, n)
    return _tri_case(values(draw, shp), draw(st.integers(0, 3)))


@named("tri")
def _tri_named():
    rng = np.random.default_rng(11)
    return [_tri_case(rng.uniform(-1, 1, shape(n)).astype(np.float32), t)
            for n in ([1, 1], [33, 33], [7, 7, 3, 2], [64, 64, 2]) for t in range(4)]


def _arange_case(start, stop, step):
    return OpCase("arange", (start, stop, step), build=lambda ctx: _g().ggml_arange(ctx, start, stop, step),
                  tensors=(), name=f"ARANGE(type=f32,start={start},stop={stop},step={step})")


@cases("arange")
@st.composite
def _arange(draw):
    start = draw(st.sampled_from([0.0, -3.0, 1.5, 100.25, -1000.0, 0.1]))
    step = draw(st.sampled_from([1.0, 0.5, 0.1, 3.0, 0.001, 7.3, 1 / 3]))
    n = draw(st.integers(1, 2000))
    return _arange_case(start, float(np.float32(start + n * step)), step)


@named("arange")
def _arange_named():
    return [_arange_case(*p) for p in ((0.0, 1.0, 1.0), (0.0, 10.0, 1.0), (0.0, 1.0, 0.1), (-5.0, 5.0, 0.25),
                                       (0.5, 1025.0, 1.0), (100.0, 100.5, 0.001), (0.0, 4096.0, 1.0 / 3.0))]
