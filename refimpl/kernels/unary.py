"""silu, gelu, sigmoid, exp, relu, swiglu, geglu with Numba (f32): the reference's f32 steps element by element.

Versions:
    silu    x / (1 + fl(exp(f64(-x))))                                  (refimpl.ops.elementwise._silu)
    gelu    0.5*x*(1 + fl(tanh(f64(s*x*fma(a*x, x, 1)))))  f32 steps   (elementwise.gelu_tanh_f32; the op)
    gelu    0 if x <= -10, x if x >= 10, else T[f16 bits of x] as f32   (T = elementwise.gelu_table(); ggml-cpu's,
            registered for the ggml profile only)
    sigmoid 1 / (1 + fl(exp(f64(-x))));  exp  fl(exp(f64(x)));  relu  x if x > 0 else +0 (NaN -> +0)
    swiglu  silu(x) * g;   geglu  gelu(x) * g, either gelu as the profile has it
add_bias_ adds a bias in place (the add op's bits; mul_mat_add and mul_mat_add_gelu, refimpl.models.bert's FFN).
Elements are split over threads; the table gelu looks up 16 at a time (`simd.vgelu16`: the hardware f32 -> f16
conversion, which rounds as ggml's does, NaN lanes given ggml's sign | 0x7E00). exp is `vexp.exp32_into`
(vectorized, libm's f64 exp rounded to f32 bit for bit) where the reference rounds NumPy's f64 exp, and the
formula gelu's tanh is libm's f64 tanh where the reference has NumPy's: the f32 values agree except where their
f64 ulp straddles an f32 rounding boundary. f16 / bf16 inputs and non-contiguous layouts run the NumPy reference.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit

from .. import ops
from ..ops import elementwise as ref_ew
from ..dispatch import register
from ..shapes import ne4
from ..rounding import f16_to_f32
from ._common import f16_bits, parallel_ranges
from .vexp import TANH_BLOCK, exp32_into, tanh_poly
from .simd import vgelu16
from .faithful import fma32

PAR_MIN = 1 << 16       # elements per thread at least
SILU, GELU, SIGMOID, EXP, RELU, GELU_TABLE = 0, 1, 2, 3, 4, 5
_S, _A = ref_ew.SQRT_2_OVER_PI, ref_ew.GELU_COEF_A       # f32 constants of the formula


@functools.lru_cache(maxsize=None)
def gelu_table_f32() -> np.ndarray:
    """elementwise.gelu_table() widened to f32 as the reference's lookup does (f16_to_f32)."""
    return np.ascontiguousarray(f16_to_f32(ref_ew.gelu_table()))


@njit(inline="always")
def _silu_into(x, o):
    """o = x / (1 + fl(exp(f64(-x)))) over 1-D x, o of one size (different arrays): o first holds
    fl(exp(-x)) (`exp32_into`, the exps vectorized with libm's bits), then the quotients."""
    n = x.size
    exp32_into(x, o, n, -1.0)
    for i in range(n):
        o[i] = x[i] / (np.float32(1.0) + o[i])


@njit(inline="always")
def _gelu_inner(x):
    """The f64 argument of the formula GELU's tanh: s*x*fma(a*x, x, 1) in f32 steps."""
    return np.float64(_S * x * fma32(_A * x, x, np.float32(1.0)))


@njit(inline="always")
def _gelu_formula_into(x, o):
    """o = elementwise.gelu_tanh_f32(x) over 1-D x, o of one size (different arrays): the same f32 operations in
    the same order, tanh(f64) rounded once -- `vexp.tanh_poly` in blocks of TANH_BLOCK (a loop LLVM vectorizes),
    then libm's tanh for the elements of a block it could not decide, as `vexp.tanh32` does."""
    n = x.size
    for lo in range(0, n, TANH_BLOCK):
        hi = min(lo + TANH_BLOCK, n)
        bad = 0
        for i in range(lo, hi):
            v = x[i]
            t, b = tanh_poly(_gelu_inner(v))
            o[i] = np.float32(0.5) * v * (np.float32(1.0) + np.float32(t))
            bad += b
        if bad:
            for i in range(lo, hi):
                v = x[i]
                y = _gelu_inner(v)
                if tanh_poly(y)[1]:
                    o[i] = np.float32(0.5) * v * (np.float32(1.0) + np.float32(math.tanh(y)))


@njit(inline="always")
def _gelu(x, tab):
    if x <= np.float32(-10.0):
        return np.float32(0.0)
    if x >= np.float32(10.0):
        return x
    return tab[f16_bits(x)]


@njit(inline="always")
def _gelu_into(x, tab, o):
    """o = _gelu(x) over 1-D x, o of one size (o may be x): 16 at a time (`simd.vgelu16`: the same lookups),
    then the tail."""
    n = x.size
    n16 = n - n % 16
    for i in range(0, n16, 16):
        vgelu16(x, i, tab, o)
    for i in range(n16, n):
        o[i] = _gelu(x[i], tab)


@njit(cache=True, nogil=True, error_model="numpy")
def _unary(kind, x, tab, out, lo, hi):
    xs, o = x[lo:hi], out[lo:hi]           # indices from 0: no negative-index checks, so LLVM vectorizes
    n = xs.size
    if kind == SILU:
        _silu_into(xs, o)
    elif kind == GELU:
        _gelu_formula_into(xs, o)
    elif kind == GELU_TABLE:
        _gelu_into(xs, tab, o)
    elif kind == SIGMOID:                  # fl(exp(-x)) first (vectorized, libm's bits), then 1 / (1 + e)
        exp32_into(xs, o, n, -1.0)
        for i in range(n):
            o[i] = np.float32(1.0) / (np.float32(1.0) + o[i])
    elif kind == EXP:
        exp32_into(xs, o, n, 1.0)
    else:                                  # relu: x > 0 is false for -0 and NaN, which give +0
        for i in range(n):
            v = xs[i]
            o[i] = v if v > np.float32(0.0) else np.float32(0.0)


@njit(cache=True, nogil=True, error_model="numpy")
def _glu(kind, x, g, tab, out, lo, hi):
    """Rows lo..hi-1 of x, g (rows, n) (views into a's halves or a and b) into out (rows, n)."""
    n = out.shape[1]
    for r in range(lo, hi):
        if kind == SILU or kind == GELU:   # the row's silu or gelu, then the products
            gr, o = g[r], out[r]
            if kind == SILU:
                _silu_into(x[r], o)
            else:
                _gelu_formula_into(x[r], o)
            for i in range(n):
                o[i] = o[i] * gr[i]
            continue
        for i in range(n):                 # GELU_TABLE
            v = x[r, i]
            if v <= np.float32(-10.0):
                out[r, i] = np.float32(0.0)
            elif v >= np.float32(10.0):
                out[r, i] = v * g[r, i]
            else:
                out[r, i] = tab[f16_bits(v)] * g[r, i]


def _f32c(a) -> bool:
    return isinstance(a, np.ndarray) and a.dtype == np.float32 and a.flags.c_contiguous and a.size > 0


def _apply(kind, a):
    flat = a.reshape(-1)
    out = np.empty_like(flat)
    tab = gelu_table_f32()
    if flat.size < 2 * PAR_MIN:            # one range: straight to the kernel (a decode step's small vectors)
        _unary(kind, flat, tab, out, 0, flat.size)
    else:
        parallel_ranges(lambda lo, hi: _unary(kind, flat, tab, out, lo, hi), flat.size, PAR_MIN)
    return out.reshape(a.shape)


@register("silu", backend="numba")
def silu(a):
    """ggml_silu (see refimpl.ops.elementwise.silu) in Numba."""
    return _apply(SILU, a) if _f32c(a) else ref_ew.silu.reference(a)


@register("gelu", backend="numba")
def gelu(a):
    """ggml_gelu (see refimpl.ops.elementwise.gelu), the formula, in Numba."""
    return _apply(GELU, a) if _f32c(a) else ref_ew.gelu.reference(a)


@register("gelu", backend="numba", numerics="ggml")
def gelu_table(a):
    """ggml-cpu's gelu (refimpl.kernels.ggml.ops.gelu) in Numba, through its f16 table: the ggml profile's
    (the exact op is the formula, refimpl.ops.elementwise.gelu)."""
    return _apply(GELU_TABLE, a) if _f32c(a) else NotImplemented


@register("sigmoid", backend="numba")
def sigmoid(a):
    """ggml_sigmoid (see refimpl.ops.elementwise.sigmoid) in Numba; exp with libm's bits (`vexp`)."""
    return _apply(SIGMOID, a) if _f32c(a) else ref_ew.sigmoid.reference(a)


@register("exp", backend="numba")
def exp(a):
    """ggml_exp (see refimpl.ops.elementwise.exp) in Numba: fl32(exp(f64 x)) with libm's bits (`vexp`)."""
    return _apply(EXP, a) if _f32c(a) else ref_ew.exp.reference(a)


@register("relu", backend="numba")
def relu(a):
    """ggml_relu (see refimpl.ops.elementwise.relu) in Numba."""
    return _apply(RELU, a) if _f32c(a) else ref_ew.relu.reference(a)


def _glu_apply(kind, a, b, swapped):
    n = a.shape[-1]
    a2 = a.reshape(-1, n)
    if b is None:
        nc = n // 2
        x, g = a2[:, :nc], a2[:, nc:2 * nc]
        if swapped:
            x, g = g, x
    else:
        nc = n
        x, g = a2, b.reshape(-1, n)
    out = np.empty((a2.shape[0], nc), np.float32)
    tab = gelu_table_f32()
    if nc:
        parallel_ranges(lambda lo, hi: _glu(kind, x, g, tab, out, lo, hi), a2.shape[0], max(1, PAR_MIN // nc))
    return out.reshape(a.shape[:-1] + (nc,))


def _glu_covered(a, b) -> bool:
    if not _f32c(a) or a.ndim > 4:
        return False
    return b is None or (_f32c(b) and ne4(b.shape) == ne4(a.shape) and b.ndim <= 4)


@register("swiglu", backend="numba")
def swiglu(a, b=None, *, swapped: bool = False):
    """ggml_swiglu (see refimpl.ops.elementwise.swiglu) in Numba."""
    if not _glu_covered(a, b):
        return ref_ew.swiglu.reference(a, b, swapped=swapped)
    return _glu_apply(SILU, a, b, swapped)


@register("geglu", backend="numba")
def geglu(a, b=None, *, swapped: bool = False):
    """ggml_geglu (see refimpl.ops.elementwise.geglu), the GELU formula, in Numba."""
    if not _glu_covered(a, b):
        return ref_ew.geglu.reference(a, b, swapped=swapped)
    return _glu_apply(GELU, a, b, swapped)


@register("geglu", backend="numba", numerics="ggml")
def geglu_table(a, b=None, *, swapped: bool = False):
    """ggml-cpu's geglu in Numba, through its f16 GELU table: the ggml profile's (see gelu)."""
    if not _glu_covered(a, b):
        return NotImplemented
    return _glu_apply(GELU_TABLE, a, b, swapped)


# -- a projection's bias and GELU fused (refimpl.models.bert's FFN) --------------------------------------------

@njit(cache=True, nogil=True, error_model="numpy")
def _add_bias(y, bias, gelu, lo, hi):
    """Rows lo..hi-1 of y (rows, n), in place: y = fl(y + bias), then with gelu y = the formula GELU of that
    (the sum goes through a row buffer, which `_gelu_formula_into` reads while it writes the row)."""
    n = y.shape[1]
    tmp = np.empty(n, np.float32)
    for r in range(lo, hi):
        row = y[r]
        if gelu:
            for i in range(n):
                tmp[i] = row[i] + bias[i]
            _gelu_formula_into(tmp, row)
        else:
            for i in range(n):
                row[i] = row[i] + bias[i]


def add_bias_(y, bias, gelu: bool = False):
    """y <- add(y, bias) in place, the add op's bits; gelu=True: y <- gelu(add(y, bias)), gelu the op (the
    formula). y (rows, n) f32 C-contiguous, a temporary the caller owns (a projection's output: working in place
    spares a new array, whose fresh pages cost more than the GELU here); bias (n,) f32. Returns y, or None for
    operands it does not cover (y untouched; the caller runs the ops)."""
    if not (isinstance(y, np.ndarray) and y.dtype == np.float32 and y.ndim == 2 and y.size and y.flags.c_contiguous
            and isinstance(bias, np.ndarray) and bias.dtype == np.float32 and bias.shape == (y.shape[1],)):
        return None
    b = np.ascontiguousarray(bias)
    rows, n = y.shape
    parallel_ranges(lambda lo, hi: _add_bias(y, b, gelu, lo, hi), rows, max(1, PAR_MIN // n))
    return y


@register("mul_mat_add_gelu", backend="numba")
def mul_mat_add_gelu(a, b, bias):
    """refimpl.ops.fused.mul_mat_add_gelu (exact and fast numerics, whose gelu is the formula): the product
    (mul_mat's kernels), then the bias and the GELU in one pass, in place on that product, which this function
    owns (the bits of add, then of gelu)."""
    y = ops.mul_mat(a, b)
    if add_bias_(y, bias, gelu=True) is None:
        return ops.gelu(ops.add(y, bias))
    return y


@register("mul_mat_add", backend="numba")
def mul_mat_add(a, b, bias=None):
    """refimpl.ops.fused.mul_mat_add: the product (mul_mat's kernels), then the bias added in place on that
    product, which this function owns (the add op's bits)."""
    y = ops.mul_mat(a, b)
    if bias is None:
        return y
    if add_bias_(y, bias) is None:
        return ops.add(y, bias)
    return y
