"""Element-wise ops of the model hot paths on the GPU: binary ops with ggml's tiling broadcast, scale, the
unary activations and the GLU ops; also the exact-f32 arithmetic primitives the other CUDA modules use.

Kernels (one thread per output element, grid_1d(n, THREADS) = ceil(n/256) blocks of 256 threads; a thread
past the end returns):
    _binary   add, sub, mul, div: out[i] = a[i] op b[j], j = i's (i0, i1, i2, i3) modulo b's ne (np.tile);
              reads 4 + 4 bytes (b mostly from cache when it is tiled), writes 4 bytes per element
    _scale    out = a*s, or fma(a, s, b) with one rounding when b != 0; reads 4, writes 4 bytes per element
    _unary    silu, gelu, gelu_erf, relu, sigmoid, tanh, exp, sqr, sqrt, neg: reads 4, writes 4 bytes per
              element (gelu: ggml's formula, as the reference; ggml-cpu's f16 table is the ggml profile's)
    _glu      swiglu, geglu, reglu, fused (x, g the two halves of a's rows, swapped or not) or split (a, b):
              one thread per output element, reads 4 + 4 bytes, writes 4 bytes
Numerics: every f32 operation of the reference, in its order, one IEEE rounding each. NVVM contracts
`a*b + c` into an FMA by default (numba passes no `-fma=0`), so products that feed a sum go through
`fmul`/`fadd`/`fsub` (libdevice's __nv_fmul_rn etc., never contracted) and the one intended FMA (scale with a
bias) is `ffma`. libm functions are the f64 function rounded once to f32, as the reference's `_libm`: on the
GPU libdevice's f64 exp/tanh/erf (<= 1-2 f64 ulp), so an f32 result can differ from the reference only
where that f64 error straddles an f32 rounding boundary (about 2^-28 of inputs).
NaN payloads: the GPU's arithmetic NaN is 0x7fffffff where x86 gives 0xffc00000 (sqrt(-1), 0*inf, ...);
the values agree as NaN. In numba's simulator the primitives are NumPy f32/f64 scalar operations.
Inputs not covered (f16/bf16 tensors, non-contiguous a, more than 4 dims, empty, shapes ggml rejects) run
the NumPy reference on host copies (`fallback`), which also raises its errors.
"""
from __future__ import annotations

import math

import numpy as np
from numba import config, cuda

from ...ops import elementwise as ref_ew
from ...dispatch import register
from ...residency import host_args
from ...rounding import fma32
from ...shapes import ne4
from . import _device

SIM = bool(config.ENABLE_CUDASIM)
THREADS = 256

# -- exact arithmetic primitives (shared with norm, softmax, rope) -------------------------------------------

if SIM:
    @cuda.jit(device=True)
    def fmul(a, b):
        return np.float32(a) * np.float32(b)

    @cuda.jit(device=True)
    def fadd(a, b):
        return np.float32(a) + np.float32(b)

    @cuda.jit(device=True)
    def fsub(a, b):
        return np.float32(a) - np.float32(b)

    @cuda.jit(device=True)
    def ffma(a, b, c):
        return np.float32(fma32(a, b, c))

    @cuda.jit(device=True)
    def fsqrt(a):
        with np.errstate(invalid="ignore"):
            return np.sqrt(np.float32(a))

    @cuda.jit(device=True)
    def dexp(x):
        with np.errstate(all="ignore"):
            return np.exp(np.float64(x))

    @cuda.jit(device=True)
    def dtanh(x):
        return np.tanh(np.float64(x))

    @cuda.jit(device=True)
    def derf(x):
        return math.erf(np.float64(x))

    @cuda.jit(device=True)
    def dcos(x):
        return np.cos(np.float64(x))

    @cuda.jit(device=True)
    def dsin(x):
        return np.sin(np.float64(x))
else:
    from numba.cuda import libdevice

    @cuda.jit(device=True)
    def fmul(a, b):
        return libdevice.fmul_rn(a, b)

    @cuda.jit(device=True)
    def fadd(a, b):
        return libdevice.fadd_rn(a, b)

    @cuda.jit(device=True)
    def fsub(a, b):
        return libdevice.fsub_rn(a, b)

    @cuda.jit(device=True)
    def ffma(a, b, c):
        return libdevice.fmaf(a, b, c)

    @cuda.jit(device=True)
    def fsqrt(a):
        return libdevice.fsqrt_rn(a)

    @cuda.jit(device=True)
    def dexp(x):
        return libdevice.exp(np.float64(x))

    @cuda.jit(device=True)
    def dtanh(x):
        return libdevice.tanh(np.float64(x))

    @cuda.jit(device=True)
    def derf(x):
        return libdevice.erf(np.float64(x))

    @cuda.jit(device=True)
    def dcos(x):
        return libdevice.cos(np.float64(x))

    @cuda.jit(device=True)
    def dsin(x):
        return libdevice.sin(np.float64(x))


# -- host side helpers shared by the CUDA modules -------------------------------------------------------------

def fallback(ref, *args, **kwargs):
    """The NumPy reference on host copies of the arguments, its result uploaded (a QTensor result, bf16 or
    quantized, cannot be a device array and is returned as is)."""
    args = host_args(args)
    kwargs = dict(zip(kwargs, host_args(tuple(kwargs.values()))))
    out = ref(*args, **kwargs)
    return _device.to_device(out) if isinstance(out, np.ndarray) else out


def f32_operand(x, any_layout: bool = False):
    """x as a C-contiguous f32 device array with at most 4 dims and elements, or None when the kernels do not
    cover it. A NumPy x is uploaded (any_layout: a strided one is packed first, a pure copy)."""
    if _device.is_device(x):
        ok = np.dtype(x.dtype) == np.float32 and x.is_c_contiguous()
    elif isinstance(x, np.ndarray):
        ok = x.dtype == np.float32 and (any_layout or x.flags.c_contiguous)
    else:
        return None
    if not ok or x.ndim > 4 or x.size == 0:
        return None
    return _device.to_device(x)


def flat(x):
    """A C-contiguous device array as 1-D (a view)."""
    return x.reshape(x.size)


# -- device math of one element ---------------------------------------------------------------------------

ADD, SUB, MUL, DIV = 0, 1, 2, 3
SILU, GELU, GELU_ERF, RELU, SIGMOID, TANH, EXP, SQR, SQRT, NEG = range(10)
SWIGLU, GEGLU, REGLU = 0, 1, 2
ONE = np.float32(1.0)
ZERO = np.float32(0.0)
HALF = np.float32(0.5)
SQRT_2_INV = ref_ew.SQRT_2_INV


@cuda.jit(device=True)
def silu(x):
    return x / fadd(ONE, np.float32(dexp(-x)))


SQRT_2_OVER_PI = ref_ew.SQRT_2_OVER_PI
GELU_COEF_A = ref_ew.GELU_COEF_A


@cuda.jit(device=True)
def gelu(x):
    """ggml's tanh-approximation GELU in the reference's f32 steps (refimpl.ops.elementwise.gelu_tanh_f32):
    0.5*x*(1 + tanh(sqrt(2/pi)*x*fma(0.044715*x, x, 1))), tanh the f64 function rounded once."""
    inner = fmul(fmul(SQRT_2_OVER_PI, x), ffma(fmul(GELU_COEF_A, x), x, ONE))
    return fmul(fmul(HALF, x), fadd(ONE, np.float32(dtanh(inner))))


@cuda.jit(device=True)
def _unary_one(kind, x):
    if kind == SILU:
        return silu(x)
    if kind == GELU:
        return gelu(x)
    if kind == GELU_ERF:
        return fmul(fmul(HALF, x), fadd(ONE, np.float32(derf(fmul(x, SQRT_2_INV)))))
    if kind == RELU:
        return x if x > ZERO else ZERO
    if kind == SIGMOID:
        return ONE / fadd(ONE, np.float32(dexp(-x)))
    if kind == TANH:
        return np.float32(dtanh(x))
    if kind == EXP:
        return np.float32(dexp(x))
    if kind == SQR:
        return fmul(x, x)
    if kind == SQRT:
        return fsqrt(x)
    return -x


@cuda.jit(device=True)
def _glu_one(kind, x, g):
    if kind == SWIGLU:
        return fmul(silu(x), g)
    if kind == GEGLU:
        return fmul(gelu(x), g)
    return fmul(x, g) if x > ZERO else ZERO


# -- kernels ---------------------------------------------------------------------------------------------------

@cuda.jit
def _binary(kind, a, b, out, n0, n1, n2, b0, b1, b2, b3):
    """out[i] = a[i] op b[j]: a, out flat (n3, n2, n1, n0); b flat (b3, b2, b1, b0), tiled."""
    i = cuda.grid(1)
    if i >= out.shape[0]:
        return
    i0 = i % n0
    r = i // n0
    i1 = r % n1
    r = r // n1
    i2 = r % n2
    i3 = r // n2
    j = (((i3 % b3) * b2 + i2 % b2) * b1 + i1 % b1) * b0 + i0 % b0
    x = a[i]
    y = b[j]
    if kind == ADD:
        out[i] = fadd(x, y)
    elif kind == SUB:
        out[i] = fsub(x, y)
    elif kind == MUL:
        out[i] = fmul(x, y)
    else:
        out[i] = x / y


@cuda.jit
def _scale(a, s, b, has_b, out):
    i = cuda.grid(1)
    if i >= out.shape[0]:
        return
    out[i] = ffma(a[i], s, b) if has_b else fmul(a[i], s)


@cuda.jit
def _unary(kind, a, out):
    i = cuda.grid(1)
    if i >= out.shape[0]:
        return
    out[i] = _unary_one(kind, a[i])


@cuda.jit
def _glu(kind, x, g, out, nc, xs, xo, gs, go):
    """out (rows, nc) flat; x element (r, c) at x[r*xs + xo + c], g's at g[r*gs + go + c]."""
    i = cuda.grid(1)
    if i >= out.shape[0]:
        return
    r = i // nc
    c = i % nc
    k = r * xs + xo + c
    out[i] = _glu_one(kind, x[k], g[r * gs + go + c])


# -- launchers -----------------------------------------------------------------------------------------------

def _launch(kernel, n, *args):
    blocks, threads = _device.grid_1d(n, THREADS)
    kernel[blocks, threads](*args)


def _binary_op(kind, ref, a, b):
    da, db = f32_operand(a), f32_operand(b, any_layout=True)
    if da is None or db is None or db.ndim > 4:
        return fallback(ref, a, b)
    na, nb = ne4(da.shape), ne4(db.shape)
    if any(y == 0 or x % y for x, y in zip(na, nb)):
        return fallback(ref, a, b)          # the reference raises its GGMLShapeError
    out = cuda.device_array(da.shape, np.float32)
    _launch(_binary, da.size, kind, flat(da), flat(db), flat(out), na[0], na[1], na[2], *nb)
    return out


@register("add", "cuda")
def add(a, b):
    """ggml_add (see refimpl.ops.elementwise.add): f32, b tiled over a, on the GPU."""
    return _binary_op(ADD, ref_ew.add.reference, a, b)


@register("sub", "cuda")
def sub(a, b):
    """ggml_sub (see refimpl.ops.elementwise.sub): f32, b tiled over a, on the GPU."""
    return _binary_op(SUB, ref_ew.sub.reference, a, b)


@register("mul", "cuda")
def mul(a, b):
    """ggml_mul (see refimpl.ops.elementwise.mul): f32, b tiled over a, on the GPU."""
    return _binary_op(MUL, ref_ew.mul.reference, a, b)


@register("div", "cuda")
def div(a, b):
    """ggml_div (see refimpl.ops.elementwise.div): f32, b tiled over a, on the GPU."""
    return _binary_op(DIV, ref_ew.div.reference, a, b)


@register("scale", "cuda")
def scale(a, s: float, b: float = 0.0):
    """ggml_scale / ggml_scale_bias (see refimpl.ops.elementwise.scale) on the GPU."""
    da = f32_operand(a)
    if da is None:
        return fallback(ref_ew.scale.reference, a, s, b)
    out = cuda.device_array(da.shape, np.float32)
    bb = np.float32(b)
    _launch(_scale, da.size, flat(da), np.float32(s), bb, bool(bb != 0), flat(out))
    return out


def _unary_op(kind, ref, a):
    da = f32_operand(a)
    if da is None:
        return fallback(ref, a)
    out = cuda.device_array(da.shape, np.float32)
    _launch(_unary, da.size, kind, flat(da), flat(out))
    return out


def _unary_kernel(name, kind):
    ref = getattr(ref_ew, name)

    def k(a):
        return _unary_op(kind, ref.reference, a)
    k.__name__ = name
    k.__doc__ = f"ggml_{name} (see refimpl.ops.elementwise.{name}): f32 on the GPU, one thread per element."
    return register(name, "cuda")(k)


for _name, _kind in (("gelu", GELU), ("gelu_erf", GELU_ERF), ("relu", RELU), ("sigmoid", SIGMOID),
                     ("tanh", TANH), ("exp", EXP), ("sqr", SQR), ("sqrt", SQRT), ("neg", NEG)):
    _unary_kernel(_name, _kind)


@register("silu", "cuda")
def silu_op(a, *, numerics: str | None = None):
    """ggml_silu (see refimpl.ops.elementwise.silu): f32 on the GPU (exact mode; the dispatcher runs the
    reference for numerics="ggml")."""
    return _unary_op(SILU, ref_ew.silu.reference, a)


def _glu_op(kind, ref, a, b, swapped):
    da = f32_operand(a)
    db = None if b is None else f32_operand(b)
    if da is None or (b is not None and (db is None or ne4(db.shape) != ne4(da.shape))):
        return fallback(ref, a, b, swapped=swapped)
    shape = tuple(da.shape)
    n = shape[-1]
    if b is None:
        nc = n // 2
        x, g = flat(da), flat(da)
        xo, go = (nc, 0) if swapped else (0, nc)
        xs = gs = n
    else:
        nc, x, g, xo, go, xs, gs = n, flat(da), flat(db), 0, 0, n, n
    out = cuda.device_array(shape[:-1] + (nc,), np.float32)
    if out.size:
        _launch(_glu, out.size, kind, x, g, flat(out), nc, xs, xo, gs, go)
    return out


@register("swiglu", "cuda")
def swiglu(a, b=None, *, swapped: bool = False, numerics: str | None = None):
    """ggml_swiglu (see refimpl.ops.elementwise.swiglu): silu(x) * g on the GPU."""
    return _glu_op(SWIGLU, ref_ew.swiglu.reference, a, b, swapped)


@register("geglu", "cuda")
def geglu(a, b=None, *, swapped: bool = False):
    """ggml_geglu (see refimpl.ops.elementwise.geglu): gelu(x) * g through ggml-cpu's table, on the GPU."""
    return _glu_op(GEGLU, ref_ew.geglu.reference, a, b, swapped)


@register("reglu", "cuda")
def reglu(a, b=None, *, swapped: bool = False):
    """ggml_reglu (see refimpl.ops.elementwise.reglu): relu(x) * g on the GPU."""
    return _glu_op(REGLU, ref_ew.reglu.reference, a, b, swapped)


def ptx_signatures() -> list[tuple]:
    """(dispatcher, argument types) of every kernel here, as a real launch types them."""
    from numba import types
    f1, i8 = types.float32[::1], types.int64
    return [
        (_binary, (i8, f1, f1, f1, i8, i8, i8, i8, i8, i8, i8)),
        (_scale, (f1, types.float32, types.float32, types.boolean, f1)),
        (_unary, (i8, f1, f1)),
        (_glu, (i8, f1, f1, f1, i8, i8, i8, i8, i8)),
    ]
