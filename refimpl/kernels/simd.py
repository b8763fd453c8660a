"""Vector dot products written as LLVM IR: one call = one weight row against one f32 activation row.

Numba compiles `for t in range(32): acc[t] = fma(w(q[t]), x[t], acc[t])` with the weight decoded from
nibbles into mostly scalar code (4.5-6 GFLOP/s a core here); these intrinsics state the vector form
directly -- per 32-element block: one load of the quants, the nibble / bit split as byte vectors, one
int -> f32 conversion, the type's f32 decode, one `llvm.fma.v32f32` into 32 f32 lane sums held in
registers across the row -- and let LLVM pick the instructions for the host (AVX2: four ymm accumulators).
The IR is target independent (no x86 intrinsics), so it compiles, slower, on any CPU Numba supports.

Intrinsics (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 blocks unless noted):
    vdot_<type>(W, i0, nb, x, x0) -> f32     fast numerics' decode dot: W (blocks, type_size) uint8
                                             C-contiguous, blocks i0 .. i0+nb-1 one weight row; x f32
                                             C-contiguous, elements x0 .. x0 + 32*nb - 1 (matmul._fast)
    vdot64_<type>(W, i0, nb, x, x0) -> f64   exact numerics' decode dot: x f64, 32 f64 lanes added in lane
                                             order, the bits of matmul._dot_f64 (matmul._gemv_simd)
    vdec_<type>(src, i, out, j)              block src[i] decoded into out[j, :32] (Q4_1 Q5_0 Q5_1: the
                                             dequantizers in quants.py); vdec_tq1_0 a whole TQ1_0 block,
                                             out[j, :256]
    vdot_f32(A, a0, X, x0, k) -> f32         f32 rows, 32 f32 lanes (attention's decode products); A may be
                                             uint16 f16 bits, widened exactly as loaded (an f16 KV cache)
    vdot64_f32(A, a0, X, x0, k) -> f64       an f32 (or f16-bits) row times an f64 one, `_dot_f64`'s lanes and
                                             order (exact numerics' attention and f32-weight decode products)
    vgelu16(x, i, tab, out)                  ggml's table GELU of x[i:i+16] into out[i:i+16] (unary.py)
    vsum8(x, lo, m) -> f64                   NumPy's pairwise-sum block, its eight f64 lane sums as one vector
                                             (_common.pairwise_sum_f64)
    vaxpy8/16/32(a, a0, n, B, b0, ldb, out, o0)
                                             out[o0:+L] = sum over i of fl(a[a0+i] * B[b0+i*ldb:+L]), L f32
                                             lane sums in i order held in registers (attention.py's products)
    vqk64_4x16(a, a0, lda, n, B, b0, ldb, out, o0, ldo)
                                             four f32 rows of a against 16 columns of B: 4 x 16 f64 lane
                                             sums of exact products in i order, in registers (exact numerics'
                                             attention scores); vqk64_1x16 one row
    vpv64_4x16(e, e0, lde, J, j0, nj, V, v0, ldv, out, o0, ldo)
                                             out's 4 x 16 f64 lanes += e[r, J[t]] * V[J[t], :16] over t in
                                             order, each product rounded, then added (attention's e.v)
    vmax16(x, m) -> f32                      max of x[:16m] in 16 lanes, NaN if any is NaN (softmax rows)
The callers check every bound the IR relies on (once per call); the IR itself does not, and its typing
accepts only C-contiguous arrays, since it computes flat addresses.

Arithmetic (numerics="fast"; kernels/matmul.py states the contract): every weight value is the exact f32
of refimpl.dequantize -- Q4_0 (q-8)*d, Q5_0 (q-16)*d, Q8_0 q*d (exact products: an f16 scale times a
small integer), Q4_1 / Q5_1 fl(q*d + m) by one fused multiply-add, which equals the decoder's
fl(fl(q*d) + m) because q*d is exact -- multiplied into lane t % 32 with one rounding; the 32 lanes are
added pairwise at the end of the row.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

_I8, _I16, _I32, _F16, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.HalfType(), ir.FloatType()
_V32F = ir.VectorType(_F32, 32)
_V32I8 = ir.VectorType(_I8, 32)
_V16I8 = ir.VectorType(_I8, 16)
_V32I32 = ir.VectorType(_I32, 32)


def _splat(builder, value, vty):
    """vty with every element `value` (an SSA value of its element type)."""
    v = builder.insert_element(ir.Constant(vty, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(vty, ir.Undefined), ir.Constant(ir.VectorType(_I32, vty.count),
                                                                                   [0] * vty.count))


def _const_vec(vty, values):
    return ir.Constant(vty, [ir.Constant(vty.element, v) for v in values])


def _load(builder, base, off, ty):
    """Load a value of type ty from byte address base + off (no alignment assumed)."""
    p = builder.bitcast(builder.gep(base, [ir.Constant(ir.IntType(64), off)]), ty.as_pointer())
    return builder.load(p, align=1)


def _f16(builder, base, off):
    """The little-endian f16 at base + off as f32 (exact; fpext of half)."""
    return builder.fpext(builder.bitcast(_load(builder, base, off, _I16), _F16), _F32)


def _nibbles(builder, base, off):
    """16 bytes at base + off -> <32 x i8>: elements 0..15 the low nibbles, 16..31 the high ones."""
    qs = _load(builder, base, off, _V16I8)
    lo = builder.and_(qs, _const_vec(_V16I8, [15] * 16))
    hi = builder.lshr(qs, _const_vec(_V16I8, [4] * 16))
    return builder.shuffle_vector(lo, hi, _const_vec(ir.VectorType(_I32, 32), list(range(32))))


def _high_bits(builder, base, off):
    """Q5 qh: the little-endian u32 at base + off -> <32 x i8> with bit t of it, times 16, in element t."""
    qh = _splat(builder, _load(builder, base, off, _I32), _V32I32)
    bits = builder.and_(builder.lshr(qh, _const_vec(_V32I32, list(range(32)))), _const_vec(_V32I32, [1] * 32))
    return builder.trunc(builder.shl(bits, _const_vec(_V32I32, [4] * 32)), _V32I8)


def _fma(builder, a, b, c):
    """llvm.fma on three values of one type: a scalar or a vector of f32 or f64 (one rounding per lane)."""
    ty = a.type
    el = ty.element if isinstance(ty, ir.VectorType) else ty
    name = ("f64" if isinstance(el, ir.DoubleType) else "f32")
    if isinstance(ty, ir.VectorType):
        name = f"v{ty.count}{name}"
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty] * 3), f"llvm.fma.{name}")
    return builder.call(fn, [a, b, c])


# -- block decoders: (builder, block address) -> <32 x float> of the exact weight values -----------------------

def _q4_0(b, p):
    d = _splat(b, _f16(b, p, 0), _V32F)
    q = b.sub(_nibbles(b, p, 2), _const_vec(_V32I8, [8] * 32))
    return b.fmul(b.sitofp(q, _V32F), d)


def _q4_1(b, p):
    d, m = _splat(b, _f16(b, p, 0), _V32F), _splat(b, _f16(b, p, 2), _V32F)
    return _fma(b, b.uitofp(_nibbles(b, p, 4), _V32F), d, m)


def _q5_0(b, p):
    d = _splat(b, _f16(b, p, 0), _V32F)
    q = b.sub(b.or_(_nibbles(b, p, 6), _high_bits(b, p, 2)), _const_vec(_V32I8, [16] * 32))
    return b.fmul(b.sitofp(q, _V32F), d)


def _q5_1(b, p):
    d, m = _splat(b, _f16(b, p, 0), _V32F), _splat(b, _f16(b, p, 2), _V32F)
    q = b.or_(_nibbles(b, p, 8), _high_bits(b, p, 4))
    return _fma(b, b.uitofp(q, _V32F), d, m)


def _q8_0(b, p):
    d = _splat(b, _f16(b, p, 0), _V32F)
    return b.fmul(b.sitofp(_load(b, p, 2, _V32I8), _V32F), d)


def _hsum32(builder, v):
    """Sum of the 32 lanes, pairwise: halves added until one lane is left."""
    n = 32
    while n > 1:
        n //= 2
        mask = ir.VectorType(_I32, n)
        lo = builder.shuffle_vector(v, v, ir.Constant(mask, list(range(n))))
        hi = builder.shuffle_vector(v, v, ir.Constant(mask, list(range(n, 2 * n))))
        v = builder.fadd(lo, hi)
    return builder.extract_element(v, ir.Constant(_I32, 0))


def _lanes_in_order(builder, v):
    """Sum of the 32 lanes in lane order, from 0.0 (matmul._dot_f64's ending)."""
    s = ir.Constant(v.type.element, 0.0)
    for t in range(32):
        s = builder.fadd(s, builder.extract_element(v, ir.Constant(_I32, t)))
    return s


# Bytes ahead of the current block to prefetch: weights stream from memory once per token, and the hardware
# prefetcher alone leaves the loads waiting (docs/benchmarks.md, "Thresholds").
PREFETCH = 2048


def _prefetch(builder, ptr, ahead: int):
    """llvm.prefetch (read, high locality, data) of the cache line `ahead` bytes past ptr: a hint, which
    never faults, also past the end of the weights."""
    fnty = ir.FunctionType(ir.VoidType(), [_I8.as_pointer(), _I32, _I32, _I32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
    builder.call(fn, [builder.gep(ptr, [ir.Constant(ir.IntType(64), ahead)]), ir.Constant(_I32, 0),
                      ir.Constant(_I32, 3), ir.Constant(_I32, 1)])


def _make(decode, type_size: int, name: str, wide: bool = False):
    """vdot_<name> (f32 activations and lanes, lanes added pairwise) or, wide, vdot64_<name> (f64
    activations and lanes -- the f32 weight times the f64 value is exact, so each fused multiply-add rounds
    only the sum -- lanes added in order from 0.0, as matmul._dot_f64 ends)."""
    nty, lty = (types.float64, ir.DoubleType()) if wide else (types.float32, _F32)
    vty = ir.VectorType(lty, 32)

    @intrinsic
    def vdot(typingctx, W, i0, nb, x, x0):
        if not (isinstance(W, types.Array) and W.dtype == types.uint8 and W.layout == "C"
                and isinstance(x, types.Array) and x.dtype == nty and x.layout == "C"):
            return None
        sig = nty(W, types.intp, types.intp, x, types.intp)

        def codegen(context, builder, signature, args):
            Wv, i0v, nbv, xv, x0v = args
            wp = context.make_array(signature.args[0])(context, builder, Wv).data
            xp = context.make_array(signature.args[3])(context, builder, xv).data
            ts = ir.Constant(i0v.type, type_size)
            acc = cgutils.alloca_once_value(builder, ir.Constant(vty, [0.0] * 32))
            with cgutils.for_range(builder, nbv) as loop:
                blk = builder.gep(wp, [builder.mul(builder.add(i0v, loop.index), ts)])
                _prefetch(builder, blk, PREFETCH)
                w = decode(builder, blk)
                if wide:
                    w = builder.fpext(w, vty)
                xo = builder.add(x0v, builder.mul(loop.index, ir.Constant(i0v.type, 32)))
                xs = builder.load(builder.bitcast(builder.gep(xp, [xo]), vty.as_pointer()), align=4)
                builder.store(_fma(builder, w, xs, builder.load(acc)), acc)
            v = builder.load(acc)
            return _lanes_in_order(builder, v) if wide else _hsum32(builder, v)
        return sig, codegen
    vdot.__name__ = vdot.__qualname__ = f"vdot{'64' if wide else ''}_{name}"
    return vdot


vdot_q4_0 = _make(_q4_0, 18, "q4_0")
vdot_q4_1 = _make(_q4_1, 20, "q4_1")
vdot_q5_0 = _make(_q5_0, 22, "q5_0")
vdot_q5_1 = _make(_q5_1, 24, "q5_1")
vdot_q8_0 = _make(_q8_0, 34, "q8_0")


def _make_row_dot(wide: bool):
    """vdot_f32 (f32 rows, 32 f32 lanes with one fused rounding per product, lanes added pairwise, the tail
    fused in order) or, wide, vdot64_f32 (an f32 row times an f64 one: 32 f64 lanes, each product rounded
    and then added as matmul._dot_f64 does, lanes added in order from 0.0, the tail in order). A's row may
    be f16 bits (uint16) instead, each widened to its f32 value exactly as it is loaded: an f16 KV cache
    read in place gives the sums of its f32 copy."""
    xty, lty = (types.float64, ir.DoubleType()) if wide else (types.float32, _F32)
    vty = ir.VectorType(lty, 32)

    def step(builder, a, x, acc):
        """acc + a * x for A's value(s) a (f32) and X's x: fused in f32; in f64 the product, then the sum."""
        if wide:
            return builder.fadd(acc, builder.fmul(builder.fpext(a, x.type), x))
        return _fma(builder, a, x, acc)

    @intrinsic
    def vdot(typingctx, A, a0, X, x0, k):
        if not (isinstance(A, types.Array) and A.dtype in (types.float32, types.uint16) and A.layout == "C"
                and isinstance(X, types.Array) and X.dtype == xty and X.layout == "C"):
            return None
        sig = xty(A, types.intp, X, types.intp, types.intp)
        half = A.dtype == types.uint16

        def load_a(builder, p, n):
            """n (32 or 1) of A's values at p as f32: f16 bits widened exactly (fpext of half)."""
            if not half:
                return builder.load(builder.bitcast(p, _V32F.as_pointer()), align=4) if n == 32 else builder.load(p)
            if n == 1:
                return builder.fpext(builder.bitcast(builder.load(p), _F16), _F32)
            h = builder.load(builder.bitcast(p, ir.VectorType(_I16, 32).as_pointer()), align=2)
            return builder.fpext(builder.bitcast(h, ir.VectorType(_F16, 32)), _V32F)

        def codegen(context, builder, signature, args):
            Av, a0v, Xv, x0v, kv = args
            ap = context.make_array(signature.args[0])(context, builder, Av).data
            xp = context.make_array(signature.args[2])(context, builder, Xv).data
            c32 = ir.Constant(kv.type, 32)
            nfull = builder.sdiv(kv, c32)
            acc = cgutils.alloca_once_value(builder, ir.Constant(vty, [0.0] * 32))
            with cgutils.for_range(builder, nfull) as loop:
                o = builder.mul(loop.index, c32)
                ao, xo = builder.gep(ap, [builder.add(a0v, o)]), builder.gep(xp, [builder.add(x0v, o)])
                av = load_a(builder, ao, 32)
                xv = builder.load(builder.bitcast(xo, vty.as_pointer()), align=4)
                builder.store(step(builder, av, xv, builder.load(acc)), acc)
            v = builder.load(acc)
            s = cgutils.alloca_once_value(builder, _lanes_in_order(builder, v) if wide else _hsum32(builder, v))
            with cgutils.for_range(builder, builder.sub(kv, builder.mul(nfull, c32))) as loop:
                t = builder.add(builder.mul(nfull, c32), loop.index)
                av = load_a(builder, builder.gep(ap, [builder.add(a0v, t)]), 1)
                xv = builder.load(builder.gep(xp, [builder.add(x0v, t)]))
                builder.store(step(builder, av, xv, builder.load(s)), s)
            return builder.load(s)
        return sig, codegen
    return vdot


vdot_f32 = _make_row_dot(False)
vdot_f32.__name__ = vdot_f32.__qualname__ = "vdot_f32"
vdot_f32.__doc__ = """Σ A[a0 + t] * X[x0 + t] over t < k, f32 operands and sums: 32 lanes with one rounding per product
    (lane t % 32 for the first 32 * (k // 32) terms), added pairwise, then the rest in order. A and X
    C-contiguous f32 of any shape (flat element offsets); the caller checks the bounds."""
vdot64_f32 = _make_row_dot(True)
vdot64_f32.__name__ = vdot64_f32.__qualname__ = "vdot64_f32"
vdot64_f32.__doc__ = """Σ f64(A[a0 + t]) * X[x0 + t] over t < k, A f32 and X f64 C-contiguous of any shape
    (flat element offsets): exact numerics' f32-row dot, the bits of matmul._dot_f64 -- 32 f64 lanes (lane
    t % 32 for the first 32 * (k // 32) terms), each product rounded, then added (as _dot_f64 for any f64 X;
    for X widened from f32 the products are exact), the lanes added in order from 0.0, then the rest in
    order. The caller checks the bounds."""


# -- block decoding: the same vectors stored (refimpl.dequantize's values) ----------------------------------

def _row_address(context, builder, aryty, ary, i):
    """Byte address of row i of a 2-D array (data + i * strides[0]); the caller checks i and the inner stride."""
    a = context.make_array(aryty)(context, builder, ary)
    stride0 = cgutils.unpack_tuple(builder, a.strides, 2)[0]
    base = builder.bitcast(a.data, _I8.as_pointer())
    return builder.gep(base, [builder.mul(i, stride0)])


def _make_dec(decode, name: str, doc: str | None = None, stores: bool = False):
    """vdec_<name>(src, i, out, j): block src[i] (row-contiguous bytes) decoded into row j of out (f32,
    row-contiguous). decode(builder, block address) returns the block's 32 values as one vector, which
    vdec stores at out[j, :32]; with stores=True, decode(builder, block address, f32 address) stores the
    block's values itself (a block wider than one vector)."""
    @intrinsic
    def vdec(typingctx, src, i, out, j):
        if not (isinstance(src, types.Array) and src.dtype == types.uint8 and src.ndim == 2
                and isinstance(out, types.Array) and out.dtype == types.float32 and out.ndim == 2):
            return None
        sig = types.none(src, types.intp, out, types.intp)

        def codegen(context, builder, signature, args):
            s, iv, o, jv = args
            blk = _row_address(context, builder, signature.args[0], s, iv)
            dst = _row_address(context, builder, signature.args[2], o, jv)
            if stores:
                decode(builder, blk, builder.bitcast(dst, _F32.as_pointer()))
            else:
                builder.store(decode(builder, blk), builder.bitcast(dst, _V32F.as_pointer()), align=4)
            return context.get_dummy_value()
        return sig, codegen
    vdec.__name__ = vdec.__qualname__ = f"vdec_{name}"
    vdec.__doc__ = doc or (f"Block src[i] ({name}, row-contiguous bytes) decoded into out[j, :32] (f32, "
                           f"row-contiguous): the vector of vdot_{name}. The caller checks i, j and both inner "
                           "strides.")
    return vdec


def _tq1_0_digits(b, v, n_lanes, d, dst, first, count):
    """Base-3 digits 0..count-1 of the <n x i8> bytes v as ggml reads them, ((u8)(v * 3^n) * 3 >> 8) - 1,
    each times d (an exact product: the digit is -1, 0 or 1), stored at dst[first + n * n_lanes ...]."""
    vi8, vi16, vf = ir.VectorType(_I8, n_lanes), ir.VectorType(_I16, n_lanes), ir.VectorType(_F32, n_lanes)
    dv = _splat(b, d, vf)
    for n in range(count):
        q = b.mul(v, _const_vec(vi8, [3 ** n % 256] * n_lanes))                # wraps modulo 256, as (uint8)
        t = b.lshr(b.mul(b.zext(q, vi16), _const_vec(vi16, [3] * n_lanes)), _const_vec(vi16, [8] * n_lanes))
        t = b.trunc(t, vi8)
        t = b.sub(t, _const_vec(vi8, [1] * n_lanes))
        out = b.gep(dst, [ir.Constant(ir.IntType(64), first + n * n_lanes)])
        b.store(b.fmul(b.sitofp(t, vf), dv), b.bitcast(out, vf.as_pointer()), align=4)


def _tq1_0_block(b, p, dst):
    """One TQ1_0 block (qs[48] | qh[4] | d:f16) at byte address p into the 256 f32 at dst: qs[0:32] give
    elements 0..159 (digit n of byte m -> 32n + m), qs[32:48] 160..239, qh 240..255 (four digits each)."""
    d = _f16(b, p, 52)
    _tq1_0_digits(b, _load(b, p, 0, _V32I8), 32, d, dst, 0, 5)
    _tq1_0_digits(b, _load(b, p, 32, _V16I8), 16, d, dst, 160, 5)
    _tq1_0_digits(b, _load(b, p, 48, ir.VectorType(_I8, 4)), 4, d, dst, 240, 4)


vdec_tq1_0 = _make_dec(_tq1_0_block, "tq1_0", stores=True, doc=(
    "TQ1_0 block src[i] (54 row-contiguous bytes) decoded into out[j, :256] (f32, row-contiguous): the values "
    "of the loop in quants._dq_tq1_0. The caller checks i, j and both inner strides."))


vdec_q4_1 = _make_dec(_q4_1, "q4_1")
vdec_q5_0 = _make_dec(_q5_0, "q5_0")
vdec_q5_1 = _make_dec(_q5_1, "q5_1")


# -- exact numerics: the same vectors, f64 lanes ------------------------------------------------------------

vdot64_q4_0 = _make(_q4_0, 18, "q4_0", wide=True)
vdot64_q4_1 = _make(_q4_1, 20, "q4_1", wide=True)
vdot64_q5_0 = _make(_q5_0, 22, "q5_0", wide=True)
vdot64_q5_1 = _make(_q5_1, 24, "q5_1", wide=True)
vdot64_q8_0 = _make(_q8_0, 34, "q8_0", wide=True)


# -- ggml's GELU table lookup, 16 elements a call -------------------------------------------------------------

_V16F, _V16I32 = ir.VectorType(_F32, 16), ir.VectorType(_I32, 16)


def _f32_data(context, builder, aryty, ary):
    return builder.bitcast(context.make_array(aryty)(context, builder, ary).data, _F32.as_pointer())


@intrinsic
def vgelu16(typingctx, x, i, tab, out):
    """out[i:i+16] = unary._gelu(x[i:i+16]): 0 where x <= -10, x where x >= 10, else tab[f16 bits of x],
    with the f16 bits of ggml's conversion (round to nearest even; NaN -> sign | 0x7E00, where the hardware
    conversion would keep payload bits). x, tab, out 1-D C-contiguous f32; the caller checks i + 16 <= the
    sizes of x and out, and tab has 65536 entries."""
    if not all(isinstance(a, types.Array) and a.dtype == types.float32 and a.ndim == 1 and a.layout == "C"
               for a in (x, tab, out)):
        return None
    sig = types.none(x, types.intp, tab, out)

    def codegen(context, builder, signature, args):
        xa, iv, ta, oa = args
        px = builder.gep(_f32_data(context, builder, signature.args[0], xa), [iv])
        po = builder.gep(_f32_data(context, builder, signature.args[3], oa), [iv])
        pt = _f32_data(context, builder, signature.args[2], ta)
        v = builder.load(builder.bitcast(px, _V16F.as_pointer()), align=4)
        idx = builder.zext(builder.bitcast(builder.fptrunc(v, ir.VectorType(_F16, 16)), ir.VectorType(_I16, 16)),
                           _V16I32)
        sign = builder.and_(builder.lshr(builder.bitcast(v, _V16I32), _const_vec(_V16I32, [16] * 16)),
                            _const_vec(_V16I32, [0x8000] * 16))
        nan_idx = builder.or_(sign, _const_vec(_V16I32, [0x7E00] * 16))
        idx = builder.select(builder.fcmp_unordered("uno", v, v), nan_idx, idx)
        g = ir.Constant(_V16F, ir.Undefined)
        for lane in range(16):
            k = builder.zext(builder.extract_element(idx, ir.Constant(_I32, lane)), ir.IntType(64))
            g = builder.insert_element(g, builder.load(builder.gep(pt, [k])), ir.Constant(_I32, lane))
        low = builder.fcmp_ordered("<=", v, _const_vec(_V16F, [-10.0] * 16))
        high = builder.fcmp_ordered(">=", v, _const_vec(_V16F, [10.0] * 16))
        r = builder.select(low, _const_vec(_V16F, [0.0] * 16), builder.select(high, v, g))
        builder.store(r, builder.bitcast(po, _V16F.as_pointer()), align=4)
        return context.get_dummy_value()
    return sig, codegen


# -- NumPy's pairwise-sum block: eight f64 lane sums ------------------------------------------------------------

_V8D = ir.VectorType(ir.DoubleType(), 8)


@intrinsic
def vsum8(typingctx, x, lo, m):
    """The eight accumulators of NumPy's pairwise_sum block over x[lo : lo + 8m] (m >= 1), as one f64 vector:
    lane j starts at f64(x[lo + j]) and adds f64(x[lo + 8k + j]) for k = 1 .. m-1 in order -- each lane the
    same chain of roundings as NumPy's r[j] -- then returns ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)).
    x 1-D C-contiguous f32 or f64; the caller checks lo + 8m <= x.size."""
    if not (isinstance(x, types.Array) and x.ndim == 1 and x.layout == "C"
            and x.dtype in (types.float32, types.float64)):
        return None
    sig = types.float64(x, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        xa, lov, mv = args
        aty = signature.args[0]
        ety, size = (_F32, 4) if aty.dtype == types.float32 else (ir.DoubleType(), 8)
        vty = ir.VectorType(ety, 8)
        base = builder.gep(builder.bitcast(context.make_array(aty)(context, builder, xa).data, ety.as_pointer()),
                           [lov])

        def load(k):
            v = builder.load(builder.bitcast(builder.gep(base, [k]), vty.as_pointer()), align=size)
            return builder.fpext(v, _V8D) if ety is _F32 else v

        acc = cgutils.alloca_once_value(builder, load(ir.Constant(ir.IntType(64), 0)))
        with cgutils.for_range(builder, builder.sub(mv, ir.Constant(mv.type, 1))) as loop:
            k = builder.mul(builder.add(loop.index, ir.Constant(mv.type, 1)), ir.Constant(mv.type, 8))
            builder.store(builder.fadd(builder.load(acc), load(k)), acc)
        r = builder.load(acc)
        lane = [builder.extract_element(r, ir.Constant(_I32, j)) for j in range(8)]
        return builder.fadd(builder.fadd(builder.fadd(lane[0], lane[1]), builder.fadd(lane[2], lane[3])),
                            builder.fadd(builder.fadd(lane[4], lane[5]), builder.fadd(lane[6], lane[7])))
    return sig, codegen


# -- f32 column sums in registers: attention's products ----------------------------------------------------------

def _make_vaxpy(lanes: int):
    vty = ir.VectorType(_F32, lanes)

    @intrinsic
    def vaxpy(typingctx, a, a0, n, B, b0, ldb, out, o0):
        if not all(isinstance(x, types.Array) and x.dtype == types.float32 and x.layout == "C" for x in (a, B, out)):
            return None
        sig = types.none(a, types.intp, types.intp, B, types.intp, types.intp, out, types.intp)

        def codegen(context, builder, signature, args):
            aa, a0v, nv, ba, b0v, ldv, oa, o0v = args
            pa = builder.gep(_f32_data(context, builder, signature.args[0], aa), [a0v])
            pb = builder.gep(_f32_data(context, builder, signature.args[3], ba), [b0v])
            po = builder.gep(_f32_data(context, builder, signature.args[6], oa), [o0v])
            acc = cgutils.alloca_once_value(builder, ir.Constant(vty, [0.0] * lanes))
            with cgutils.for_range(builder, nv) as loop:
                i = loop.index
                row = builder.load(builder.bitcast(builder.gep(pb, [builder.mul(i, ldv)]), vty.as_pointer()), align=4)
                prod = builder.fmul(_splat(builder, builder.load(builder.gep(pa, [i])), vty), row)
                builder.store(builder.fadd(builder.load(acc), prod), acc)
            builder.store(builder.load(acc), builder.bitcast(po, vty.as_pointer()), align=4)
            return context.get_dummy_value()
        return sig, codegen
    vaxpy.__doc__ = (f"out[o0 : o0+{lanes}] = Σ_i fl(a[a0+i] * B[b0 + i*ldb : +{lanes}]) for i = 0 .. n-1, each lane "
                     "an f32 sum from +0 in i order, held in registers (fmul, then fadd: two roundings). a, B, out "
                     "C-contiguous f32 of any rank, offsets in elements; the caller checks every bound.")
    return vaxpy


vaxpy8, vaxpy16, vaxpy32 = _make_vaxpy(8), _make_vaxpy(16), _make_vaxpy(32)


# -- f64 column sums of several rows at once, in registers: exact numerics' attention ----------------------------

_F64 = ir.DoubleType()


def _make_rows64(rows: int, lanes: int):
    """vqk64_<rows>x<lanes> and vpv64_<rows>x<lanes>: `rows` rows' lane sums held in registers together, so
    that each vector of B (or V) is loaded and widened once for all of them."""
    vty = ir.VectorType(_F64, lanes)
    wide = ir.VectorType(_F32, lanes)

    def f32_array(x):
        return isinstance(x, types.Array) and x.dtype == types.float32 and x.layout == "C"

    @intrinsic
    def vqk64(typingctx, a, a0, lda, n, B, b0, ldb, out, o0, ldo):
        if not (f32_array(a) and f32_array(B) and isinstance(out, types.Array) and out.dtype == types.float64
                and out.layout == "C"):
            return None
        sig = types.none(a, types.intp, types.intp, types.intp, B, types.intp, types.intp, out, types.intp,
                         types.intp)

        def codegen(context, builder, signature, args):
            aa, a0v, ldav, nv, ba, b0v, ldbv, oa, o0v, ldov = args
            pa = builder.gep(_f32_data(context, builder, signature.args[0], aa), [a0v])
            pb = builder.gep(_f32_data(context, builder, signature.args[4], ba), [b0v])
            po = builder.gep(builder.bitcast(context.make_array(signature.args[7])(context, builder, oa).data,
                                             _F64.as_pointer()), [o0v])
            accs = [cgutils.alloca_once_value(builder, ir.Constant(vty, [0.0] * lanes)) for _ in range(rows)]
            with cgutils.for_range(builder, nv) as loop:
                i = loop.index
                col = builder.load(builder.bitcast(builder.gep(pb, [builder.mul(i, ldbv)]), wide.as_pointer()),
                                   align=4)
                col = builder.fpext(col, vty)
                for r in range(rows):
                    x = builder.load(builder.gep(pa, [builder.add(builder.mul(ir.Constant(i.type, r), ldav), i)]))
                    # the product of two f32 values is exact in f64: one fused rounding = fmul then fadd
                    xs = _splat(builder, builder.fpext(x, _F64), vty)
                    builder.store(_fma(builder, xs, col, builder.load(accs[r])), accs[r])
            for r in range(rows):
                dst = builder.gep(po, [builder.mul(ir.Constant(ldov.type, r), ldov)])
                builder.store(builder.load(accs[r]), builder.bitcast(dst, vty.as_pointer()), align=8)
            return context.get_dummy_value()
        return sig, codegen

    @intrinsic
    def vpv64(typingctx, e, e0, lde, J, j0, nj, V, v0, ldv, out, o0, ldo):
        if not (isinstance(e, types.Array) and e.dtype == types.float64 and e.layout == "C"
                and isinstance(J, types.Array) and J.dtype == types.intp and J.layout == "C"
                and f32_array(V) and isinstance(out, types.Array) and out.dtype == types.float64
                and out.layout == "C"):
            return None
        sig = types.none(e, types.intp, types.intp, J, types.intp, types.intp, V, types.intp, types.intp, out,
                         types.intp, types.intp)

        def codegen(context, builder, signature, args):
            ea, e0v, ldev, ja, j0v, njv, va, v0v, ldvv, oa, o0v, ldov = args
            pe = builder.gep(builder.bitcast(context.make_array(signature.args[0])(context, builder, ea).data,
                                             _F64.as_pointer()), [e0v])
            pj = builder.gep(builder.bitcast(context.make_array(signature.args[3])(context, builder, ja).data,
                                             ir.IntType(64).as_pointer()), [j0v])
            pv = builder.gep(_f32_data(context, builder, signature.args[6], va), [v0v])
            po = builder.gep(builder.bitcast(context.make_array(signature.args[9])(context, builder, oa).data,
                                             _F64.as_pointer()), [o0v])
            dsts = [builder.bitcast(builder.gep(po, [builder.mul(ir.Constant(ldov.type, r), ldov)]),
                                    vty.as_pointer()) for r in range(rows)]
            accs = [cgutils.alloca_once_value(builder, builder.load(dsts[r], align=8)) for r in range(rows)]
            with cgutils.for_range(builder, njv) as loop:
                j = builder.load(builder.gep(pj, [loop.index]))
                row = builder.load(builder.bitcast(builder.gep(pv, [builder.mul(j, ldvv)]), wide.as_pointer()),
                                   align=4)
                row = builder.fpext(row, vty)
                for r in range(rows):
                    x = builder.load(builder.gep(pe, [builder.add(builder.mul(ir.Constant(j.type, r), ldev), j)]))
                    prod = builder.fmul(_splat(builder, x, vty), row)
                    builder.store(builder.fadd(builder.load(accs[r]), prod), accs[r])
            for r in range(rows):
                builder.store(builder.load(accs[r]), dsts[r], align=8)
            return context.get_dummy_value()
        return sig, codegen

    vqk64.__doc__ = (f"out[o0 + r*ldo : +{lanes}] = Σ_i f64(a[a0 + r*lda + i]) * f64(B[b0 + i*ldb : +{lanes}]) for "
                     f"r < {rows}, i = 0 .. n-1: each lane an f64 sum from +0 in i order of exact products (the "
                     "scores of several query rows against K^T's columns). a, B C-contiguous f32, out f64, any "
                     "rank, offsets in elements; the caller checks every bound.")
    vpv64.__doc__ = (f"out[o0 + r*ldo : +{lanes}] += Σ_t e[e0 + r*lde + J[t]] * f64(V[v0 + J[t]*ldv : +{lanes}]) for "
                     f"r < {rows}, t = j0 .. j0+nj-1: each lane goes on from out's value in t order, each product "
                     "rounded, then added (fmul, fadd). e, out C-contiguous f64, J intp, V f32; the caller checks "
                     "every bound.")
    return vqk64, vpv64


ROWS64 = 4      # query rows per call of vqk64_4x16 / vpv64_4x16
vqk64_4x16, vpv64_4x16 = _make_rows64(ROWS64, 16)
vqk64_1x16, vpv64_1x16 = _make_rows64(1, 16)


# -- a row's maximum, 16 lanes at a time (softmax) -----------------------------------------------------------------

@intrinsic
def vmax16(typingctx, x, m):
    """max(x[0 : 16m]) (m >= 1) by `v > M ? v : M` in 16 lanes, then across the lanes; NaN when any element is
    NaN (the caller then takes its scalar loop, which decides which NaN). Which zero a maximum of +-0 returns may
    differ from a scalar scan's; softmax subtracts it, where either gives the same bits. x 1-D C-contiguous
    f32; the caller checks 16m <= x.size."""
    if not (isinstance(x, types.Array) and x.ndim == 1 and x.layout == "C" and x.dtype == types.float32):
        return None
    sig = types.float32(x, types.intp)

    def codegen(context, builder, signature, args):
        xa, mv = args
        px = _f32_data(context, builder, signature.args[0], xa)
        b16 = ir.VectorType(ir.IntType(1), 16)
        acc = cgutils.alloca_once_value(builder, _const_vec(_V16F, [float("-inf")] * 16))
        nan = cgutils.alloca_once_value(builder, ir.Constant(b16, [0] * 16))
        with cgutils.for_range(builder, mv) as loop:
            off = builder.mul(loop.index, ir.Constant(mv.type, 16))
            v = builder.load(builder.bitcast(builder.gep(px, [off]), _V16F.as_pointer()), align=4)
            builder.store(builder.or_(builder.load(nan), builder.fcmp_unordered("uno", v, v)), nan)
            a = builder.load(acc)
            builder.store(builder.select(builder.fcmp_ordered(">", v, a), v, a), acc)
        a = builder.load(acc)
        n = 16
        while n > 1:                                 # halves compared until one lane is left
            n //= 2
            mask = ir.VectorType(_I32, n)
            lo = builder.shuffle_vector(a, a, ir.Constant(mask, list(range(n))))
            hi = builder.shuffle_vector(a, a, ir.Constant(mask, list(range(n, 2 * n))))
            a = builder.select(builder.fcmp_ordered(">", hi, lo), hi, lo)
        r = builder.extract_element(a, ir.Constant(_I32, 0))
        any_nan = builder.icmp_unsigned("!=", builder.bitcast(builder.load(nan), ir.IntType(16)),
                                        ir.Constant(ir.IntType(16), 0))
        return builder.select(any_nan, ir.Constant(_F32, float("nan")), r)
    return sig, codegen
