"""Element-wise ops: binary ops with ggml's tiling broadcast, unary ops, GLU ops, scale, clamp, fill, tri, arange.

Every op converts its operands to f32, computes one f32 NumPy operation per C operation of ggml-cpu's kernel,
in the kernel's order, and rounds once to the result type (f32, f16 as a float16 ndarray, bf16 as a QTensor).
Two choices make that exact mode differ from ggml-cpu's bits, and only by an ulp or two:

* C's single-precision libm (`expf`, `expm1f`, `logf`, `sinf`, `cosf`, `tanhf`, `erff`) is evaluated in f64
  and rounded to f32 (`_libm`). glibc's float functions are not correctly rounded: they differ from this on
  about 1% of inputs (`sinf`, `cosf`, `erff`), 10-20% (`tanhf` up to 2 ulp, `expm1f`), 0.1% (`expf`, `logf`).
* SILU and SWIGLU use the true exp; ggml-cpu's AVX2 kernels use a SIMD polynomial exp on 8-lane chunks.

Where GCC fuses `a*b + c` in ggml-cpu's compiled code (scale with bias, arange, xielu, silu_back, the GELU
table) refimpl does the same with `fma32` (one rounding). GELU and GELU_QUICK are the formulas (what every
backend but ggml-cpu computes); ggml-cpu reads them from 65536-entry f16 tables, which refimpl builds
(`gelu_table`, `gelu_quick_table`) for the ggml numerics profile.
"""
from __future__ import annotations

import functools

import numpy as np

from ..qtensor import QTensor, dequantize, quantize
from ..rounding import erff_f32, expf_f32, f16_bits, f16_to_f32, fma32, libm_f32
from ..quants.floats import f32_to_bf16_bits
from ..types import GGMLType, type_name
from ..dispatch import op
from ..shapes import check_layout, check_tiles, fail, ne4, nonempty, tile_to

f32 = np.float32
FLOAT_TYPES = ("f32", "f16", "bf16")


# -- operand types and layouts ---------------------------------------------------------------------

def load_f32(name: str, x, types=FLOAT_TYPES, what: str = "a") -> tuple[np.ndarray, str]:
    """x's values in f32 (exact for f16/bf16) and its type name; fail unless the type is in `types`."""
    t = type_name(x)
    if t not in types:
        fail(name, f"{what} must be {'/'.join(types)}, got {t}", **{what: x})
    if isinstance(x, QTensor):                          # bf16 (the only QTensor these ops take): bits << 16
        bits = np.ascontiguousarray(x.data).view("<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(x.shape), t
    x = np.asarray(x)
    return (f16_to_f32(x) if t == "f16" else x.astype(np.float32)), t


def store_as(y: np.ndarray, t: str):
    """f32 values rounded once to type t (ggml's f32 -> f16 / bf16 conversions)."""
    y = np.asarray(y, np.float32)
    if t == "f32":
        return y
    if t == "f16":
        return f16_bits(y).view(np.float16)
    if t == "bf16":
        n = y.shape[-1] if y.ndim else 1
        y = y.reshape(y.shape or (1,))
        return QTensor(GGMLType.BF16, np.ascontiguousarray(f32_to_bf16_bits(y)).view(np.uint8)
                       .reshape(y.shape[:-1] + (2 * n,)), y.shape)
    raise AssertionError(t)


# -- f32 arithmetic primitives ---------------------------------------------------------------------

# -- binary ops: tiling broadcast --------------------------------------------------------------------

# ggml-cpu's binary_op (binary-ops.cpp): (src0, src1) type pairs; the result has src0's type.
_BINARY_TYPES = {"f32": ("f32",), "f16": ("f16", "f32"), "bf16": ("bf16", "f32")}
_F32 = np.dtype(np.float32)


def _check_binary(name: str):
    """The check of a binary op (add, sub, mul, div): a's and b's types (_BINARY_TYPES), a's rows packed, b
    repeating to a's shape; add also takes a block-quantized a with b f32 of a's shape, rows packed. It reads
    layouts only (`layout_check`)."""
    def check(a, b):
        if name == "add" and isinstance(a, QTensor) and a.traits.blck_size > 1:
            if type_name(b) != "f32" or ne4(np.shape(b)) != ne4(a.shape):
                fail("add", "a quantized a needs b f32 of the same shape", a=a, b=b)
            check_layout("add", "rows", b=b)
            return
        ta, tb = type_name(a), type_name(b)
        if ta not in _BINARY_TYPES:
            fail(name, f"a must be {'/'.join(_BINARY_TYPES)}, got {ta}", a=a)
        if tb not in _BINARY_TYPES[ta]:
            fail(name, f"src1 must be {'/'.join(_BINARY_TYPES[ta])} when src0 is {ta}, got {tb}", a=a, b=b)
        check_layout(name, "rows", a=a)
        check_tiles(name, a, b)
    return check


def _values(x, name: str = "", types=FLOAT_TYPES) -> tuple[np.ndarray, str]:
    """load_f32 for reading only: an f32 array as it is (no copy), f16 and bf16 widened exactly; its type name."""
    if type(x) is np.ndarray and x.dtype == _F32 and "f32" in types:
        return x, "f32"
    return load_f32(name, x, types)


def _binary(a, b, fn):
    """fn(a, b tiled to a) in f32, rounded once to a's type (the ops' check has run)."""
    x, t = _values(a)
    with np.errstate(all="ignore"):
        return store_as(fn(x, tile_to(x, _values(b)[0])), t)


# block types ggml-cpu's add/add1 requantize to: those whose CPU type traits have a from_float
# (ggml-cpu.c type_traits_cpu; the IQ1/IQ2/IQ3 types have none, and ggml then copies f32 bytes into the blocks)
QUANT_ADD_TYPES = frozenset(t.name.lower() for t in (
    GGMLType.Q1_0, GGMLType.Q2_0, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
    GGMLType.MXFP4, GGMLType.NVFP4, GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
    GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.TQ1_0, GGMLType.TQ2_0))


def _quant_add(name, a: QTensor, v: np.ndarray) -> QTensor:
    """Dequantize a's rows, add v (f32, a's shape or a scalar), requantize with ggml-cpu's from_float."""
    t = a.traits.name.lower()
    if t not in QUANT_ADD_TYPES:
        fail(name, f"ggml-cpu cannot requantize to {t} (no CPU from_float)", a=a)
    with np.errstate(all="ignore"):
        return quantize(dequantize(a) + v, a.type, method="cpu")


@op("add", check=_check_binary("add"), layout_check=True)
def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_add: a + b, b tiled over a (every ne of a a multiple of b's).

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32/f16/bf16, rows contiguous; or a block QTensor
    b    ne [m0, m1, m2, m3]   with n_i % m_i == 0       a's type, or f32; any layout
    out  a's shape and type;   out[i] = a[i] + b[i mod ne(b)]   (np.tile, not NumPy broadcasting)

    Computed in f32, rounded once to a's type. E.g. x (n_tokens, n_embd) + bias (n_embd,).
    A block-quantized a (a LoRA-merged weight, say) needs b f32 of a's exact shape with packed rows: each
    row is dequantized, added in f32 and requantized with ggml-cpu's from_float (quantize(method="cpu")).
    """
    if isinstance(a, QTensor) and a.traits.blck_size > 1:
        return _quant_add("add", a, np.asarray(b).reshape(a.shape))
    return _binary(a, b, np.add)


@op("sub", check=_check_binary("sub"), layout_check=True)
def sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_sub: a - b, b tiled over a (every ne of a a multiple of b's).

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32/f16/bf16, rows contiguous
    b    ne [m0, m1, m2, m3]   with n_i % m_i == 0       a's type, or f32; any layout
    out  a's shape and type;   out[i] = a[i] - b[i mod ne(b)]

    Computed in f32, rounded once to a's type.
    """
    return _binary(a, b, np.subtract)


@op("mul", check=_check_binary("mul"), layout_check=True)
def mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_mul: a * b, b tiled over a (every ne of a a multiple of b's).

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32/f16/bf16, rows contiguous
    b    ne [m0, m1, m2, m3]   with n_i % m_i == 0       a's type, or f32; any layout
    out  a's shape and type;   out[i] = a[i] * b[i mod ne(b)]

    E.g. the norm weight: rms_norm(x) (n_tokens, n_embd) * attn_norm (n_embd,). f32, rounded once.
    """
    return _binary(a, b, np.multiply)


@op("div", check=_check_binary("div"), layout_check=True)
def div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_div: a / b, b tiled over a (every ne of a a multiple of b's).

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32/f16/bf16, rows contiguous
    b    ne [m0, m1, m2, m3]   with n_i % m_i == 0       a's type, or f32; any layout
    out  a's shape and type;   out[i] = a[i] / b[i mod ne(b)]   (IEEE: x/0 = ±inf, 0/0 = nan)

    Computed in f32, rounded once to a's type.
    """
    return _binary(a, b, np.divide)


@op("add1")
def add1(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_add1: a + the single value of b (deprecated in ggml in favour of add).

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32/f16/bf16 or a block QTensor; rows contiguous,
                                                        dims 2, 3 packed
    b    ne [1, 1, 1, 1]       numpy (1,) or ()          f32 (also a's type for f16/bf16)
    out  a's shape and type;   out = a + b[0]

    Computed in f32, rounded once to a's type; a block-quantized a is dequantized, added to and requantized
    with ggml-cpu's from_float. ggml-cpu writes quantized rows of i3 > 0 to the wrong place (it offsets them
    by i3*nb0 instead of i3*nb3), so its result is only right for ne3 = 1; refimpl computes every row.
    """
    if isinstance(a, QTensor):
        nonempty("add1", a=a)
    check_layout("add1", "contiguous_1", a=a)
    if isinstance(a, QTensor) and a.traits.blck_size > 1:
        if type_name(b) != "f32" or int(np.prod(np.shape(b))) != 1:
            fail("add1", "b must be an f32 scalar when a is quantized", a=a, b=b)
        return _quant_add("add1", a, np.float32(np.asarray(b).reshape(())))
    x, ta = load_f32("add1", a, FLOAT_TYPES)
    tb = type_name(b)
    if tb not in _BINARY_TYPES[ta]:
        fail("add1", f"b must be {'/'.join(_BINARY_TYPES[ta])} when a is {ta}, got {tb}", a=a, b=b)
    if int(np.prod(np.shape(b) if not isinstance(b, QTensor) else b.shape)) != 1:
        fail("add1", "b must be a scalar (ne [1, 1, 1, 1])", a=a, b=b)
    v, _ = load_f32("add1", b, _BINARY_TYPES[ta], "b")
    with np.errstate(all="ignore"):
        return store_as(x + v.reshape(()), ta)


@op("add_id")
def add_id(a: np.ndarray, b: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """ggml_add_id: add to each row of a the row of b that ids selects (MoE expert biases).

    a    ne [n, n_used, n_tokens, n3]   numpy (n3, n_tokens, n_used, n)   f32, rows contiguous
    b    ne [n, n_expert]               numpy (n_expert, n)               f32, rows contiguous
    ids  ne [n_used, n_tokens]          numpy (n_tokens, n_used)          i32, 0 <= ids < n_expert
    out  a's shape, f32

        out[i3, t, e, :] = a[i3, t, e, :] + b[ids[t, e], :]

    b's rows are taken from its first ne2/ne3 plane only (ggml-cpu indexes them by ne1 alone).
    """
    nonempty("add_id", a=a, b=b, ids=ids)
    x, _ = load_f32("add_id", a, ("f32",))
    y, _ = load_f32("add_id", b, ("f32",), "b")
    ids = np.asarray(ids)
    if ids.dtype != np.int32:
        fail("add_id", f"ids must be i32, got {ids.dtype}", a=a, ids=ids)
    na, nb_, ni = ne4(x.shape), ne4(y.shape), ne4(ids.shape)
    if na[0] != nb_[0] or na[1] != ni[0] or na[2] != ni[1]:
        fail("add_id", "need a.ne0 == b.ne0, a.ne1 == ids.ne0, a.ne2 == ids.ne1", a=a, b=b, ids=ids)
    check_layout("add_id", "rows", a=a, b=b)
    rows = y.reshape(-1, nb_[1], nb_[0])[0]
    idx = ids.reshape(ni[3], ni[2], ni[1], ni[0])[0, 0]           # (ne2, ne1) = (n_tokens, n_used)
    if idx.size and (idx.min() < 0 or idx.max() >= nb_[1]):
        fail("add_id", f"ids out of range [0, {nb_[1]})", a=a, b=b, ids=ids)
    with np.errstate(all="ignore"):
        out = x.reshape(na[3], na[2], na[1], na[0]) + rows[idx][None]
    return out.reshape(x.shape)


# -- unary ops -----------------------------------------------------------------------------------------

def map_unary(name, a, f, types=FLOAT_TYPES, layout="rows"):
    """What every unary op shares: a's values in f32 (f16/bf16 exactly), f applied, rounded once to a's type;
    fails (naming op `name`) unless a's type is in `types` and its layout is `layout`. The ggml-numerics
    emulations (refimpl.kernels.ggml) call it with their own f."""
    x, t = _values(a, name, types)
    check_layout(name, layout, a=a)
    with np.errstate(all="ignore"):
        y = f(x)
    return store_as(np.array(y) if y is a else y, t)   # (an f that returns its input: a new array all the same)


def _unary_doc(call: str, math_: str, note: str = "", types: str = "f32/f16/bf16") -> str:
    return (f"""{call}

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   {types}, rows contiguous
    out  a's shape and type

        {math_}
""" + (f"\n    {note}\n" if note else ""))


def _doc(text: str):
    def deco(fn):
        fn.__doc__ = text
        return fn
    return deco


_LIBM_NOTE = ("Computed in f32 from a's values and rounded once to a's type; the libm call is evaluated in f64 "
              "and rounded to f32 (glibc's single-precision function may differ by an ulp or two).")


@op("sqr")
@_doc(_unary_doc("ggml_sqr: the square of each element.", "out = a * a   (f32, rounded once to a's type)"))
def sqr(a):
    return map_unary("sqr", a, lambda x: x * x)


@op("sqrt")
@_doc(_unary_doc("ggml_sqrt: the square root of each element.", "out = sqrtf(a)   (IEEE, correctly rounded; "
                 "nan for a < 0)"))
def sqrt(a):
    return map_unary("sqrt", a, np.sqrt)


@op("log")
@_doc(_unary_doc("ggml_log: the natural logarithm of each element.", "out = logf(a)   (-inf at 0, nan below)",
                 _LIBM_NOTE))
def log(a):
    return map_unary("log", a, lambda x: libm_f32(np.log, x))


@op("sin")
@_doc(_unary_doc("ggml_sin: the sine of each element (radians).", "out = sinf(a)", _LIBM_NOTE))
def sin(a):
    return map_unary("sin", a, lambda x: libm_f32(np.sin, x))


@op("cos")
@_doc(_unary_doc("ggml_cos: the cosine of each element (radians).", "out = cosf(a)", _LIBM_NOTE))
def cos(a):
    return map_unary("cos", a, lambda x: libm_f32(np.cos, x))


@op("abs", covers="UNARY:ABS")
@_doc(_unary_doc("ggml_abs: |a| element-wise.", "out = fabsf(a)"))
def abs(a):  # noqa: A001  (ggml's name; shadows the builtin in this module only)
    return map_unary("abs", a, np.abs)


@op("sgn", covers="UNARY:SGN")
@_doc(_unary_doc("ggml_sgn: the sign of each element.", "out = 1 if a > 0, -1 if a < 0, else 0 (also for "
                 "-0 and nan)"))
def sgn(a):
    return map_unary("sgn", a, lambda x: np.where(x > 0, f32(1), np.where(x < 0, f32(-1), f32(0))))


@op("neg", covers="UNARY:NEG")
@_doc(_unary_doc("ggml_neg: -a element-wise.", "out = -a   (flips the sign bit, also of 0 and nan)"))
def neg(a):
    return map_unary("neg", a, np.negative)


@op("step", covers="UNARY:STEP")
@_doc(_unary_doc("ggml_step: the Heaviside step of each element.", "out = 1 if a > 0 else 0"))
def step(a):
    return map_unary("step", a, lambda x: np.where(x > 0, f32(1), f32(0)))


@op("tanh", covers="UNARY:TANH")
@_doc(_unary_doc("ggml_tanh: the hyperbolic tangent of each element.", "out = tanhf(a)", _LIBM_NOTE))
def tanh(a):
    return map_unary("tanh", a, lambda x: libm_f32(np.tanh, x))


@op("elu", covers="UNARY:ELU")
@_doc(_unary_doc("ggml_elu: exponential linear unit (alpha = 1).", "out = a if a > 0 else expm1f(a)",
                 _LIBM_NOTE))
def elu(a):
    return map_unary("elu", a, lambda x: np.where(x > 0, x, libm_f32(np.expm1, x)))


@op("relu", covers="UNARY:RELU")
@_doc(_unary_doc("ggml_relu: rectified linear unit.", "out = a if a > 0 else 0   (+0 for -0 and nan)"))
def relu(a):
    return map_unary("relu", a, lambda x: np.where(x > 0, x, f32(0)))


@op("sigmoid", covers="UNARY:SIGMOID")
@_doc(_unary_doc("ggml_sigmoid: the logistic function.", "out = 1 / (1 + expf(-a))   (f32 steps)", _LIBM_NOTE))
def sigmoid(a):
    return map_unary("sigmoid", a, lambda x: f32(1) / (f32(1) + expf_f32(-x)))


@op("hardsigmoid", covers="UNARY:HARDSIGMOID")
@_doc(_unary_doc("ggml_hardsigmoid: the piecewise-linear sigmoid.",
                 "out = fminf(1, fmaxf(0, (a + 3) / 6))   (f32 steps; fmaxf/fminf ignore nan: nan -> 0)"))
def hardsigmoid(a):
    return map_unary("hardsigmoid", a, lambda x: np.fmin(f32(1), np.fmax(f32(0), (x + f32(3)) / f32(6))))


@op("hardswish", covers="UNARY:HARDSWISH")
@_doc(_unary_doc("ggml_hardswish: a * hardsigmoid(a).", "out = a * fminf(1, fmaxf(0, (a + 3) / 6))   (f32 steps)"))
def hardswish(a):
    return map_unary("hardswish", a, lambda x: x * np.fmin(f32(1), np.fmax(f32(0), (x + f32(3)) / f32(6))))


@op("exp", covers="UNARY:EXP")
@_doc(_unary_doc("ggml_exp: e**a element-wise.", "out = expf(a)", _LIBM_NOTE))
def exp(a):
    return map_unary("exp", a, expf_f32)


@op("expm1", covers="UNARY:EXPM1")
@_doc(_unary_doc("ggml_expm1: e**a - 1 element-wise.", "out = expf(a) - 1   (two f32 steps, as ggml-cpu: "
                 "not expm1f, so small |a| loses precision exactly as in ggml)", _LIBM_NOTE))
def expm1(a):
    return map_unary("expm1", a, lambda x: expf_f32(x) - f32(1))


@op("softplus", covers="UNARY:SOFTPLUS")
@_doc(_unary_doc("ggml_softplus: a smooth relu.", "out = a if a > 20 else logf(1 + expf(a))   (f32 steps)",
                 _LIBM_NOTE))
def softplus(a):
    return map_unary("softplus", a, _softplus)


def _softplus(x):
    return np.where(x > f32(20), x, libm_f32(np.log, f32(1) + expf_f32(x)))


@op("floor", covers="UNARY:FLOOR")
@_doc(_unary_doc("ggml_floor: round down to an integer.", "out = floorf(a)"))
def floor(a):
    return map_unary("floor", a, np.floor)


@op("ceil", covers="UNARY:CEIL")
@_doc(_unary_doc("ggml_ceil: round up to an integer.", "out = ceilf(a)"))
def ceil(a):
    return map_unary("ceil", a, np.ceil)


@op("round", covers="UNARY:ROUND")
@_doc(_unary_doc("ggml_round: round to the nearest integer, halves away from zero.",
                 "out = roundf(a)   (2.5 -> 3, -2.5 -> -3; np.round would give 2 and -2)"))
def round(a):  # noqa: A001  (ggml's name; shadows the builtin in this module only)
    def roundf(x):
        x64 = x.astype(np.float64)                       # |x| + 0.5 is exact in f64 for every f32 x
        return np.copysign(np.floor(np.abs(x64) + 0.5), x64).astype(np.float32)
    return map_unary("round", a, roundf)


@op("trunc", covers="UNARY:TRUNC")
@_doc(_unary_doc("ggml_trunc: round toward zero.", "out = truncf(a)"))
def trunc(a):
    return map_unary("trunc", a, np.trunc)


@op("silu", covers="UNARY:SILU")
def silu(a):
    """ggml_silu: sigmoid linear unit (swish), e.g. the FFN gate of llama (n_tokens, n_ff).

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32/f16/bf16 (bf16: ggml 0.25.3), rows contiguous
    out  a's shape and type

        out = a / (1 + exp(-a))   (f32 steps, rounded once to a's type)

    exp is the true exponential rounded to f32. ggml-cpu's f32 kernel (AVX2) uses a SIMD polynomial exp on
    8-element chunks and libm expf on the row's tail: results differ from it by about an ulp.
    """
    return map_unary("silu", a, _silu)


def _silu(x):
    return x / (f32(1) + expf_f32(-x))


@op("gelu_erf", covers="UNARY:GELU_ERF")
@_doc(_unary_doc("ggml_gelu_erf: the exact (erf) GELU, e.g. BERT's FFN.",
                 "out = 0.5 * a * (1 + erff(a * 0.70710678))   (f32 steps, no table)",
                 _LIBM_NOTE + " For large negative a the f32 formula cancels (relative error ~1e-5 at "
                 "-4 vs the true GELU), as in ggml. bf16 (ggml 0.25.3): the same f32 steps, rounded once to bf16."))
def gelu_erf(a):
    return map_unary("gelu_erf", a, _gelu_erf)


SQRT_2_INV = f32(0.70710678118654752440084436210484)
SQRT_2_OVER_PI = f32(0.79788456080286535587989211986876)
GELU_COEF_A = f32(0.044715)
_GELU_QUICK_COEF = f32(-1.702)


def _gelu_erf(x):
    return f32(0.5) * x * (f32(1) + erff_f32(x * SQRT_2_INV))


@functools.lru_cache(maxsize=None)
def gelu_table() -> np.ndarray:
    """ggml-cpu's GELU table: 65536 f16 values, indexed by the f16 bit pattern of the input.

        T[h] = fl16(0.5*x*(1 + tanhf(sqrt(2/pi)*x*(1 + 0.044715*x*x))))   x = f16 value h, f32 steps

    with `0.044715*x*x + 1` one fused multiply-add, as GCC compiles ggml_gelu_f32. Built on first use.
    """
    x = f16_to_f32(np.arange(65536, dtype=np.uint16).view(np.float16))
    with np.errstate(all="ignore"):
        y = gelu_tanh_f32(x)
    return f16_bits(y).view(np.float16)


def gelu_tanh_f32(x):
    """ggml_gelu_f32: 0.5*x*(1 + tanhf(sqrt(2/pi)*x*(1 + 0.044715*x*x))), f32 steps, the inner sum one FMA."""
    inner = SQRT_2_OVER_PI * x * fma32(GELU_COEF_A * x, x, f32(1))
    return f32(0.5) * x * (f32(1) + libm_f32(np.tanh, inner))


def gelu_quick_f32(x):
    """ggml_gelu_quick_f32: x * (1 / (1 + expf(-1.702*x))), f32 steps."""
    return x * (f32(1) / (f32(1) + expf_f32(_GELU_QUICK_COEF * x)))


@functools.lru_cache(maxsize=None)
def gelu_quick_table() -> np.ndarray:
    """ggml-cpu's GELU_QUICK table: T[h] = fl16(x * (1 / (1 + expf(-1.702*x)))), x the f16 value h, f32 steps."""
    x = f16_to_f32(np.arange(65536, dtype=np.uint16).view(np.float16))
    with np.errstate(all="ignore"):
        y = gelu_quick_f32(x)
    return f16_bits(y).view(np.float16)


def f16_table_lookup(table: np.ndarray, x: np.ndarray) -> np.ndarray:
    """table[bits of fl16(x)] as f32: the input rounded to f16 (inf beyond its range), the output f16-exact."""
    return f16_to_f32(table[f16_bits(x)])


@op("gelu", covers="UNARY:GELU")
def gelu(a):
    """ggml_gelu: the tanh-approximation GELU, ggml's formula in f32 steps.

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32/f16/bf16 (bf16: ggml 0.25.3), rows contiguous
    out  a's shape and type

        gelu(x) = 0.5*x*(1 + tanh(sqrt(2/pi)*x*(1 + 0.044715*x**2)))      (f32 steps, the inner sum one FMA)

    This is the op every backend computes but ggml-cpu: CUDA (ggml_cuda_op_gelu_single), Vulkan (gelu.comp)
    and ggml-cpu's own bf16 path evaluate the formula. ggml-cpu's f32 and f16 paths read a 65536-entry f16
    table instead (GGML_GELU_FP16: the input rounded to f16, the output f16; 0 below -10 and x above 10 for
    f32), up to ~2^-11 relative from the formula; the ggml numerics profile reproduces that table
    (refimpl.kernels.ggml.ops, `gelu_table`).
    """
    x, t = load_f32("gelu", a)
    check_layout("gelu", "rows", a=a)
    with np.errstate(all="ignore"):
        y = gelu_tanh_f32(x)
    return store_as(y, t)


@op("gelu_quick", covers="UNARY:GELU_QUICK")
def gelu_quick(a):
    """ggml_gelu_quick: x * sigmoid(1.702 x), ggml's formula in f32 steps.

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32/f16/bf16 (bf16: ggml 0.25.3), rows contiguous
    out  a's shape and type

        out = a * (1 / (1 + expf(-1.702 a)))      (f32 steps)

    As gelu: the formula is the op (ggml-cpu's bf16 path, the GPU backends); ggml-cpu's f32 and f16 paths read
    an f16 table (`gelu_quick_table`, no +-10 passthrough: inputs beyond f16's range become +-inf first), which
    the ggml numerics profile reproduces.
    """
    return map_unary("gelu_quick", a, gelu_quick_f32)


@op("xielu", covers="UNARY:XIELU")
def xielu(a, alpha_n: float, alpha_p: float, beta: float, eps: float, *, stored: bool = False):
    """ggml_xielu: the xIELU activation (Apertus).

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32/f16/bf16; rows contiguous, dims 2, 3 packed
    out  a's shape and type

        an = beta + softplus(alpha_n),  ap = softplus(alpha_p)     (ggml_xielu, f32 steps)
        out = ap*a*a + beta*a                      if a > 0
              (expm1f(min(a, eps)) - a)*an + beta*a   otherwise

    Both sums are single-rounding FMAs over the f32 product beta*a, as GCC compiles ggml-cpu's op_xielu.
    stored=True: alpha_n and alpha_p are already an and ap, the values ggml_xielu stores in the node's
    op_params (a graph read back from ggml, e.g. by refimpl serve, carries only those).
    """
    x, t = load_f32("xielu", a, FLOAT_TYPES)
    check_layout("xielu", "contiguous_1", a=a)
    with np.errstate(all="ignore"):
        if stored:
            an, ap = f32(alpha_n), f32(alpha_p)
        else:
            an = f32(beta) + _softplus(np.float32(alpha_n).reshape(1))[0]
            ap = _softplus(np.float32(alpha_p).reshape(1))[0]
        bx = f32(beta) * x
        pos = fma32(ap * x, x, bx)
        neg_ = fma32(libm_f32(np.expm1, np.fmin(x, f32(eps))) - x, an, bx)
        return store_as(np.where(x > 0, pos, neg_), t)


@op("leaky_relu")
def leaky_relu(a, negative_slope: float, inplace: bool = False):
    """ggml_leaky_relu: relu with a slope for negative inputs.

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32/f16
    out  a's shape and type

        out = max(a, 0) + negative_slope * min(a, 0)   (f32: nan -> 0)

    `inplace` only makes ggml write into a; refimpl always returns a new array. ggml-cpu reads rows as
    packed and steps through them by nb1 alone (it assumes ggml_is_contiguous_1 without checking);
    refimpl computes any layout.
    """
    x, t = load_f32("leaky_relu", a, ("f32", "f16"))
    with np.errstate(all="ignore"):
        return store_as(np.where(x > 0, x, f32(0)) + f32(negative_slope) * np.where(x < 0, x, f32(0)), t)


@op("silu_back")
def silu_back(a, b):
    """ggml_silu_back: the gradient of silu, given the output gradient a and silu's input b.

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   dy, f32/f16
    b    same ne and type                               x
    out  same ne and type

        s = 1 / (1 + expf(-x)),   out = dy * s * (1 + x*(1 - s))     (f32 steps; the inner sum one FMA)

    Like leaky_relu, ggml-cpu assumes ggml_is_contiguous_1 operands without checking; refimpl takes any layout.
    """
    dy, t = load_f32("silu_back", a, ("f32", "f16"))
    x, tb = load_f32("silu_back", b, ("f32", "f16"), "b")
    if tb != t or ne4(dy.shape) != ne4(x.shape):
        fail("silu_back", "a and b must have the same shape and type", a=a, b=b)
    with np.errstate(all="ignore"):
        s = f32(1) / (f32(1) + expf_f32(-x))
        return store_as(dy * s * fma32(x, f32(1) - s, f32(1)), t)


# -- GLU: act(x) * g, x and g the two halves of a row (or a and b) -----------------------------------------

def map_glu(name, a, b, swapped, act, types=FLOAT_TYPES):
    """What every GLU op shares: act(x, g, type) rounded once to a's type, for x = a, g = b (split), or the
    two halves of a's rows (swapped: g first)."""
    x, t = load_f32(name, a, types)
    check_layout(name, "contiguous_1", a=a)
    if b is not None:
        g, tb = load_f32(name, b, types, "b")
        check_layout(name, "contiguous_1", b=b)
        if tb != t or ne4(x.shape) != ne4(g.shape):
            fail(name, "a and b must have the same shape and type", a=a, b=b)
        g = g.reshape(x.shape)
    else:
        nc = x.shape[-1] // 2
        x, g = x[..., :nc], x[..., nc:2 * nc]
        if swapped:
            x, g = g, x
    with np.errstate(all="ignore"):
        return store_as(act(x, g, t), t)


_GLU_DOC = """{call}

    a    ne [2n, n1, n2, n3]   numpy (n3, n2, n1, 2n)   {types}; rows contiguous, dims 2, 3 packed
    b    None, or ne [n, n1, n2, n3] like a (then a has n columns: ggml_{name}_split(a, b))
    out  ne [n, n1, n2, n3]    numpy (n3, n2, n1, n)    a's type

        x, g = a[..., :n], a[..., n:2n]   (swapped: x, g = a[..., n:2n], a[..., :n]; split: x, g = a, b)
        out = {math}

    An odd last column of a is ignored (n = ne0 // 2). {note}
"""


@op("reglu", covers="GLU:REGLU")
def reglu(a, b=None, *, swapped: bool = False):
    return map_glu("reglu", a, b, swapped, lambda x, g, t: np.where(x > 0, x * g, f32(0)))


@op("geglu", covers="GLU:GEGLU")
def geglu(a, b=None, *, swapped: bool = False):
    return map_glu("geglu", a, b, swapped, lambda x, g, t: gelu_tanh_f32(x) * g)


@op("swiglu", covers="GLU:SWIGLU")
def swiglu(a, b=None, *, swapped: bool = False):
    return map_glu("swiglu", a, b, swapped, lambda x, g, t: _silu(x) * g)


@op("geglu_erf", covers="GLU:GEGLU_ERF")
def geglu_erf(a, b=None, *, swapped: bool = False):
    return map_glu("geglu_erf", a, b, swapped, lambda x, g, t: _gelu_erf(x) * g)


@op("geglu_quick", covers="GLU:GEGLU_QUICK")
def geglu_quick(a, b=None, *, swapped: bool = False):
    return map_glu("geglu_quick", a, b, swapped, lambda x, g, t: gelu_quick_f32(x) * g)


def cap_clamp(x, g, limit):
    """(std::min(x, limit), std::clamp(g, -limit, limit)) as ggml-cpu's clamped SwiGLUs take them (nan x stays)."""
    xc = np.where(f32(limit) < x, f32(limit), x)
    gc = np.where(g < f32(-limit), f32(-limit), np.where(f32(limit) < g, f32(limit), g))
    return xc, gc


@op("swiglu_oai", covers="GLU:SWIGLU_OAI")
def swiglu_oai(a, b=None, alpha: float = 1.702, limit: float = 7.0, *, swapped: bool = False):
    def act(x, g, t):
        xc, gc = cap_clamp(x, g, limit)
        return xc / (f32(1) + expf_f32(f32(alpha) * -xc)) * (gc + f32(1))
    return map_glu("swiglu_oai", a, b, swapped, act, ("f32",))


_GLU_TYPES = "f32/f16/bf16 (bf16: ggml 0.25.3; f32 steps, rounded once)"
@op("swiglu_clamp", covers="GLU:SWIGLU_CLAMP")
def swiglu_clamp(a, b, limit: float, *, swapped: bool = False):
    def act(x, g, t):
        xc, gc = cap_clamp(x, g, limit)
        return xc / (f32(1) + expf_f32(-xc)) * gc
    return map_glu("swiglu_clamp", a, b, swapped, act, ("f32", "f16"))


reglu.__doc__ = _GLU_DOC.format(call="ggml_reglu: relu-gated linear unit.", name="reglu", types=_GLU_TYPES,
                                math="x * g if x > 0 else 0", note="")
geglu.__doc__ = _GLU_DOC.format(
    call="ggml_geglu: GELU-gated linear unit (e.g. Gemma's FFN).",
    name="geglu", types=_GLU_TYPES, math="gelu(x) * g   (gelu's formula, f32 steps)",
    note="ggml-cpu's f32 and f16 paths take gelu from its f16 table (see gelu); the ggml numerics profile does.")
swiglu.__doc__ = _GLU_DOC.format(
    call="ggml_swiglu: SiLU-gated linear unit, llama's FFN: silu(gate) * up.", name="swiglu", types=_GLU_TYPES,
    math="x / (1 + exp(-x)) * g   (f32 steps)",
    note="exp is the true exponential; ggml-cpu's f32 kernel uses the AVX2 SIMD exp (about an ulp apart).")
geglu_erf.__doc__ = _GLU_DOC.format(call="ggml_geglu_erf: erf-GELU-gated linear unit.", name="geglu_erf",
                                    types=_GLU_TYPES, math="0.5 * x * (1 + erff(x * 0.70710678)) * g   (f32 steps)",
                                    note=_LIBM_NOTE)
geglu_quick.__doc__ = _GLU_DOC.format(call="ggml_geglu_quick: quick-GELU-gated linear unit.", name="geglu_quick",
                                      types=_GLU_TYPES, math="x / (1 + expf(-1.702 x)) * g   (f32 steps)",
                                      note="ggml-cpu's f32 and f16 paths take it from an f16 table (see gelu_quick); "
                                      "the ggml numerics profile does.")
swiglu_oai.__doc__ = _GLU_DOC.format(
    call="ggml_swiglu_oai(a, b, alpha, limit): gpt-oss's clamped SwiGLU (defaults: llama.cpp's gpt-oss values).",
    name="swiglu_oai", types="f32",
    math="xc / (1 + expf(-alpha*xc)) * (gc + 1),  xc = min(x, limit),  gc = clamp(g, -limit, limit)",
    note="ggml_swiglu_oai has no swapped form; swapped=True is ggml_glu(a, SWIGLU_OAI, true) with the same "
         "alpha, limit. " + _LIBM_NOTE)
swiglu_clamp.__doc__ = _GLU_DOC.format(
    call="ggml_swiglu_clamp(a, b, limit) (ggml 0.25.3): SwiGLU with the gate capped and the up clamped to limit.",
    name="swiglu_clamp", types="f32/f16",
    math="xc / (1 + expf(-xc)) * gc,  xc = min(x, limit),  gc = clamp(g, -limit, limit)   (f32 steps)",
    note="Unlike swiglu_oai there is no alpha and no +1 on the up half; nan gates stay nan (std::min). "
         "b may be None (one tensor, split in halves). " + _LIBM_NOTE)
for _f in (reglu, geglu, swiglu, geglu_erf, geglu_quick, swiglu_oai, swiglu_clamp):
    _f.reference.__doc__ = _f.__doc__


# -- scale, clamp, fill, tri, arange ---------------------------------------------------------------------

@op("scale")
def scale(a, s: float, b: float = 0.0):
    """ggml_scale(a, s) / ggml_scale_bias(a, s, b): multiply by a scalar, optionally add a scalar.

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32, or bf16 (ggml 0.25.3), contiguous
    out  a's shape and type

        out = a * s           if b == 0
        out = fma(a, s, b)    otherwise (one rounding: ggml-cpu's vector body and GCC's scalar tail are FMAs)

    bf16 (ggml 0.25.3's scale_bf16): the f32 result above, rounded once to bf16.
    """
    x, t = load_f32("scale", a, ("f32", "bf16"))
    check_layout("scale", "contiguous", a=a)
    with np.errstate(all="ignore"):
        y = x * f32(s) if f32(b) == 0 else fma32(x, f32(s), f32(b))
    return y if t == "f32" else store_as(y, t)


@op("clamp")
def clamp(a, min: float, max: float):  # noqa: A002  (ggml's parameter names)
    """ggml_clamp: limit each element to [min, max].

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32/f16, rows contiguous
    out  a's shape and type

        out = MAX(MIN(a, max), min)    with C's MIN(x, y) = x < y ? x : y (so nan -> max, then MAX)

    ggml_clamp exists only in place (the result is a view of a, computing it overwrites a); refimpl returns
    a new array. ggml-cpu steps through rows by nb1 alone (dims 2, 3 must be packed over dim 1).
    """
    x, t = load_f32("clamp", a, ("f32", "f16"))
    check_layout("clamp", "rows", a=a)
    lo, hi = f32(min), f32(max)
    m = np.where(x < hi, x, hi)
    return store_as(np.where(m > lo, m, lo), t)


@op("fill")
def fill(a, c: float):
    """ggml_fill: a tensor of a's shape and type with every element c.

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32/f16, contiguous (only its shape and type are used)
    out  a's shape and type, = fl(c)
    """
    _, t = load_f32("fill", a, ("f32", "f16"))
    check_layout("fill", "contiguous", a=a)
    return store_as(np.full(np.shape(a), f32(c), np.float32), t)


TRI_TYPE_UPPER_DIAG, TRI_TYPE_UPPER, TRI_TYPE_LOWER_DIAG, TRI_TYPE_LOWER = 0, 1, 2, 3   # enum ggml_tri_type


@op("tri")
def tri(a, type: int):  # noqa: A002  (ggml's parameter name)
    """ggml_tri: keep one triangle of each square matrix, zeros elsewhere.

    a    ne [n, n, n2, n3]     numpy (n3, n2, n, n)     f32, contiguous; row r = i1, column c = i0
    out  a's shape, f32

        type 0 UPPER_DIAG keeps c >= r (np.triu(a)),   1 UPPER keeps c > r (np.triu(a, 1)),
             2 LOWER_DIAG keeps c <= r (np.tril(a)),   3 LOWER keeps c < r (np.tril(a, -1))
    """
    x, _ = load_f32("tri", a, ("f32",))
    check_layout("tri", "contiguous", a=a)
    ne = ne4(x.shape)
    if ne[0] != ne[1]:
        fail("tri", "a must be square in ne0, ne1", a=a)
    keep = {0: np.triu, 1: lambda m: np.triu(m, 1), 2: np.tril, 3: lambda m: np.tril(m, -1)}
    if type not in keep:
        fail("tri", f"invalid tri type {type}", a=a)
    mask = keep[type](np.ones((ne[1], ne[0]), bool))
    return np.where(mask, x.reshape(ne[::-1]), f32(0)).reshape(x.shape)


@op("arange")
def arange(start: float, stop: float, step: float):
    """ggml_arange: start, start + step, ... below stop, in f32.

    out  ne [n]   numpy (n,)   f32,   n = (int) ceilf((stop - start) / step)   (f32 steps)

        out[i] = fma(step, (float) i, start)    (one rounding, as GCC compiles ggml-cpu's start + step*i)

    ggml asserts stop > start (so step must be positive to get any elements).
    """
    start, stop, step = f32(start), f32(stop), f32(step)
    if not stop > start:
        fail("arange", f"stop must be > start (start={start}, stop={stop})")
    with np.errstate(all="ignore"):
        n = int(np.ceil((stop - start) / step))
    return fma32(step, np.arange(n, dtype=np.float64).astype(np.float32), start)
