"""fl32(exp(f64(x))) for f32 x, vectorized, with the bits of libm's f64 exp rounded to f32.

The reference (and the scalar kernels before this) computes an f32 exp as libm's / NumPy's f64 exp
rounded once to f32 -- one call per element, ~6-10 ns, most of a prefill's soft_max_ext and swiglu.
`exp32_into` computes the same f32 values in two passes:

1. a loop LLVM vectorizes: k = nearest integer to x / ln 2 (the 1.5 * 2^52 rounding trick, exact for
   |x| < 2^51), r = (x - k * LN2_HI) - k * LN2_LO (k * LN2_HI exact: LN2_HI has 32 significant bits and
   |k| < 2^8; the first difference is exact, the second rounds once), e^r by its degree-13 Taylor
   polynomial on |r| <= ln 2 / 2 (truncation < 2^-57 relative), scaled by 2^k through the exponent
   bits. The result y is within 4 f64 ulps of e^x (Horner rounding included: < 2^-50 relative).
2. y decides the f32 rounding unless it lies within 2^6 f64 ulps of an f32 rounding boundary (the 29
   bits f32 drops are within 2^6 of one half) or x lies in [-104, -87) or (88, 89] (f32 subnormals, the
   edge of overflow) or is NaN; those elements (about one in 4 million for ordinary inputs, besides the
   range cases) are recomputed as fl32(libm exp(f64 x)). Below -104 (a masked -inf) the result is 0 and
   above 89 inf, without libm.

Why that gives libm's bits: libm's exp is within 1 ulp of e^x and y within 4, so the two differ by at
most 5 f64 ulps; an f32 rounding boundary between them would lie within 5 ulps of y, and every y that
close to one (2^6 ulps margin) took the libm path. tests/kernels/test_vexp.py checks it against NumPy's
f64 exp on 10^7 drawn and on special inputs.

`tanh_poly` does the same for fl32(tanh(f64 y)) (the formula GELU's tanh): y, tanh(y) odd, on a = |y|: below
2^-4 its Taylor polynomial to a^13 (truncation < 2^-64 relative), above (E - 1) / (E + 1) with E = `_exp_core`(2a)
(a clamped at 20, where tanh is 1 in f64), whose cancellation in E - 1 leaves it within 2^-46.5 relative, under
2^7 f64 ulps; TANH_MARGIN is 2^10 ulps, so about one element in 2^18 takes libm's tanh.
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.extending import intrinsic, overload

LN2_HI = 6.93147180369123816490e-01          # fdlibm's split of ln 2: 32 significant bits
LN2_LO = 1.90821492927058770002e-10
INV_LN2 = 1.44269504088896338700e+00
ROUND = 6755399441055744.0                   # 1.5 * 2^52: t + ROUND - ROUND rounds t to an integer
MARGIN = 64                                  # f64 ulps around an f32 rounding boundary that go to libm
LO29 = (1 << 29) - 1
HALF29 = 1 << 28


@intrinsic
def _bits(typingctx, x):
    """The bits of an f64 as int64."""
    if x != types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))
    return types.int64(types.float64), codegen


@intrinsic
def _from_bits(typingctx, i):
    """The f64 with bits i (int64)."""
    if i != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(types.int64), codegen


@intrinsic
def _fma(typingctx, a, b, c):
    """a * b + c rounded once (llvm.fma.f64: vfmadd on the host, vectorized with the loop)."""
    if not (a == b == c == types.float64):
        return None

    def codegen(context, builder, signature, args):
        f = ir.DoubleType()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f, [f, f, f]), "llvm.fma.f64")
        return builder.call(fn, args)
    return types.float64(types.float64, types.float64, types.float64), codegen


_ROUND_BITS = 0x4338000000000000              # _bits(ROUND)
_C13 = 1.0 / 6227020800.0                    # 1/13!: the Taylor polynomial's leading coefficient, then
_COEFFS = (1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0,
           1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0)     # the Horner steps (_exp_poly, _vexp8)


@njit(inline="always")
def _exp_core(x):
    """y within 4 ulps of e^x for f64 x in [-87, 88] (see the module), without range handling: straight-line
    code a loop vectorizes (`tanh_poly`, x in [0, 40]); `_exp_poly` adds the ranges and the ok flag."""
    t = x * INV_LN2 + ROUND                       # rounded twice: k is an integer, all it needs
    kb = _bits(t) - _ROUND_BITS                  # k = round(x / ln 2), from t's low bits
    k = t - ROUND
    r = (x - k * LN2_HI) - k * LN2_LO
    p = _C13
    for c in _COEFFS:                             # Horner: 1/12!, 1/11!, ..., 1/2, 1, 1
        p = _fma(p, r, c)
    return p * _from_bits((kb + 1023) << 52)


@njit(inline="always")
def _exp_poly(x):
    """(y, ok): y within 4 ulps of e^x for f64 x in [-87, 88], ok = y decides fl32(e^x) (see the module);
    below -104 (-inf too) y = 0 and above 89 (+inf too) y = inf, which are fl32(e^x) there (e^-104 < 2^-150,
    half the smallest f32 subnormal; e^89 > the f32 overflow threshold)."""
    y = _exp_core(x)
    low = (_bits(y) & LO29) - HALF29
    plain = (x >= -87.0) & (x <= 88.0)
    ok = (plain & ((low > MARGIN) | (low < -MARGIN))) | (x < -104.0) | (x > 89.0)
    y = 0.0 if x < -104.0 else (np.inf if x > 89.0 else y)
    return y, ok


TANH_MARGIN = 1 << 10                        # f64 ulps around an f32 rounding boundary that go to libm's tanh
_TANH_SMALL = 0.0625
_TANH_COEFFS = (21844.0 / 6081075.0, -1382.0 / 155925.0, 62.0 / 2835.0, -17.0 / 315.0, 2.0 / 15.0)
_TANH_C3 = -1.0 / 3.0


@njit(inline="always")
def tanh_poly(y):
    """(t, bad): t within 2^-46.5 relative of tanh(y) for f64 y (see the module); bad = 1 where t does not decide
    fl32(tanh(y)) (and for NaN), else 0. Straight-line code: a loop of these vectorizes when its function is
    compiled with error_model="numpy" (Python's model checks the division for zero, which stops it)."""
    a = abs(y)
    z = a * a
    p = _TANH_COEFFS[0]
    for c in _TANH_COEFFS[1:]:
        p = p * z + c
    p = p * z + _TANH_C3
    small = y * (1.0 + z * p)                     # odd: the sign of y, -0 included
    e = _exp_core(2.0 * min(a, 20.0))
    big = (e - 1.0) / (e + 1.0)
    t = small if a < _TANH_SMALL else (big if y > 0.0 else -big)
    low = (_bits(t) & LO29) - HALF29
    return t, np.int64((low <= TANH_MARGIN) & (low >= -TANH_MARGIN) | (a != a))


@intrinsic
def _vexp8(typingctx, src, dst, i, sign):
    """`_exp_poly` on 8 lanes: dst[i:i+8] = fl32(y) for x = sign * f64(src[i:i+8]), returning how many lanes are
    not ok (their y must be replaced by libm's). Every operation is _exp_poly's, in its order, on <8 x double>
    (an explicit vector, which LLVM keeps whole: its loop vectorizer prefers 4-lane f64 here). src, dst 1-D
    C-contiguous f32; the caller checks i + 8 <= both sizes."""
    if not (all(isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C" and a.dtype == types.float32
                for a in (src, dst)) and sign == types.float64):
        return None
    sig = types.intp(src, dst, types.intp, types.float64)

    def codegen(context, builder, signature, args):
        sa, da, iv, sv = args
        d, i64 = ir.DoubleType(), ir.IntType(64)
        v8d, v8i, v8f = ir.VectorType(d, 8), ir.VectorType(i64, 8), ir.VectorType(ir.FloatType(), 8)

        def cd(v):
            return ir.Constant(v8d, [ir.Constant(d, v)] * 8)

        def ci(v):
            return ir.Constant(v8i, [ir.Constant(i64, v)] * 8)

        def ptr(aty, a):
            data = context.make_array(aty)(context, builder, a).data
            return builder.bitcast(builder.gep(data, [iv]), v8f.as_pointer())
        x = builder.fpext(builder.load(ptr(signature.args[0], sa), align=4), v8d)
        sgn = builder.insert_element(ir.Constant(v8d, ir.Undefined), sv, ir.Constant(ir.IntType(32), 0))
        zeros8 = ir.Constant(ir.VectorType(ir.IntType(32), 8), [0] * 8)
        sgn = builder.shuffle_vector(sgn, ir.Constant(v8d, ir.Undefined), zeros8)
        x = builder.fmul(sgn, x)
        t = builder.fadd(builder.fmul(x, cd(INV_LN2)), cd(ROUND))
        kb = builder.sub(builder.bitcast(t, v8i), ci(_ROUND_BITS))
        k = builder.fsub(t, cd(ROUND))
        r = builder.fsub(builder.fsub(x, builder.fmul(k, cd(LN2_HI))), builder.fmul(k, cd(LN2_LO)))
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8d, [v8d, v8d, v8d]), "llvm.fma.v8f64")
        p = cd(_C13)
        for c in _COEFFS:
            p = builder.call(fma, [p, r, cd(c)])
        y = builder.fmul(p, builder.bitcast(builder.shl(builder.add(kb, ci(1023)), ci(52)), v8d))
        low = builder.sub(builder.and_(builder.bitcast(y, v8i), ci(LO29)), ci(HALF29))
        plain = builder.and_(builder.fcmp_ordered(">=", x, cd(-87.0)), builder.fcmp_ordered("<=", x, cd(88.0)))
        far = builder.or_(builder.icmp_signed(">", low, ci(MARGIN)), builder.icmp_signed("<", low, ci(-MARGIN)))
        under, over = builder.fcmp_ordered("<", x, cd(-104.0)), builder.fcmp_ordered(">", x, cd(89.0))
        ok = builder.or_(builder.or_(builder.and_(plain, far), under), over)
        y = builder.select(under, cd(0.0), builder.select(over, cd(float("inf")), y))
        builder.store(builder.fptrunc(y, v8f), ptr(signature.args[1], da), align=4)
        bad = builder.bitcast(builder.not_(ok), ir.IntType(8))
        ctpop = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(8), [ir.IntType(8)]),
                                               "llvm.ctpop.i8")
        return builder.zext(builder.call(ctpop, [bad]), i64)
    return sig, codegen


def _exp8_runs(src, dst, n, sign):
    """How many leading elements `exp32_into` did 8 at a time, with the number of them not ok."""


@overload(_exp8_runs)
def _exp8_runs_impl(src, dst, n, sign):
    if all(isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C" for a in (src, dst)):
        def vec(src, dst, n, sign):
            n8 = n - n % 8
            if n8 > min(src.size, dst.size):
                n8 = 0
            bad = 0
            for i in range(0, n8, 8):
                bad += _vexp8(src, dst, i, sign)
            return n8, bad
        return vec
    return lambda src, dst, n, sign: (0, 0)


@njit(inline="always")
def exp32_into(src, dst, n, sign):
    """dst[i] = fl32(exp(sign * f64(src[i]))) for i < n (src, dst f32, sign 1.0 or -1.0), libm's bits.
    src and dst must be different arrays: the elements that take libm's path are found again from src
    after dst is written. Returns the number of elements that took libm's path. Contiguous arrays go 8
    elements at a time through `_vexp8` (the same operations as `_exp_poly`), the rest one at a time."""
    n8, bad = _exp8_runs(src, dst, n, np.float64(sign))
    for i in range(n8, n):
        y, ok = _exp_poly(sign * np.float64(src[i]))
        dst[i] = np.float32(y)
        bad += 0 if ok else 1
    if bad:
        for i in range(n):
            x = sign * np.float64(src[i])
            y, ok = _exp_poly(x)
            if not ok:
                dst[i] = np.float32(np.exp(x))
    return bad


@njit(cache=True, nogil=True)
def exp32(src, dst):
    """`exp32_into` over whole 1-D arrays (for tests and NumPy callers)."""
    return exp32_into(src, dst, src.shape[0], 1.0)


TANH_BLOCK = 256      # elements per block: a block with an element tanh_poly cannot decide is gone over again


@njit(cache=True, nogil=True, error_model="numpy")
def tanh32(src, dst):
    """dst[i] = fl32(tanh(f64(src[i]))), libm's bits: `tanh_poly` over each block of TANH_BLOCK elements (a loop
    LLVM vectorizes), then, in a block where it could not decide an element, libm's tanh for that one (src and
    dst different 1-D f32 arrays; for tests -- the GELU kernel has the same two passes). Returns how many
    elements took libm's path."""
    n = src.shape[0]
    total = 0
    for lo in range(0, n, TANH_BLOCK):
        hi = min(lo + TANH_BLOCK, n)
        bad = 0
        for i in range(lo, hi):
            t, b = tanh_poly(np.float64(src[i]))
            dst[i] = np.float32(t)
            bad += b
        if bad:
            total += bad
            for i in range(lo, hi):
                y = np.float64(src[i])
                if tanh_poly(y)[1]:
                    dst[i] = np.float32(math.tanh(y))
    return total
