"""mul_mat, mul_mat_id, out_prod, solve_tri: products with any weight type.

Quantized weights are dequantized TILE_ROWS rows at a time, so a whole quantized matrix is never
materialised; dot products are summed in f64 and rounded once to f32 ("exact" numerics).
"""
from __future__ import annotations

import numpy as np

from ..qtensor import QTensor, dequantize
from ..types import NUMPY_DTYPES, GGMLType, traits
from ..dispatch import op
from ..shapes import fail, is_transposed, ne4, rows_packed

# Rows of a quantized weight dequantized at a time: enough for BLAS to run at speed, small enough that the
# whole matrix is never materialised (a 7B-class weight stays quantized).
TILE_ROWS = 512

# ggml-cpu's type_traits_cpu[t].vec_dot_type: the format ggml-cpu converts b (activations) to before the
# dot products of mul_mat / mul_mat_id (src/ggml-cpu/ggml-cpu.c). A weight type is usable by mul_mat iff it
# is a key here (Q8_1 and Q8_K have no vec_dot of their own: activation formats only).
_Q8_0 = (GGMLType.Q1_0, GGMLType.Q2_0, GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q8_0, GGMLType.MXFP4, GGMLType.NVFP4,
         GGMLType.IQ4_NL)
_Q8_K = (GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.IQ2_XXS,
         GGMLType.IQ2_XS, GGMLType.IQ3_XXS, GGMLType.IQ3_S, GGMLType.IQ2_S, GGMLType.IQ1_S, GGMLType.IQ1_M,
         GGMLType.IQ4_XS, GGMLType.TQ1_0, GGMLType.TQ2_0)
VEC_DOT_TYPE: dict[GGMLType, GGMLType] = {
    GGMLType.F32: GGMLType.F32, GGMLType.F16: GGMLType.F16, GGMLType.BF16: GGMLType.BF16,
    GGMLType.Q4_1: GGMLType.Q8_1, GGMLType.Q5_1: GGMLType.Q8_1,
    **{t: GGMLType.Q8_0 for t in _Q8_0}, **{t: GGMLType.Q8_K for t in _Q8_K},
}

# out_prod's src0 types in ggml-cpu (ops.cpp ggml_compute_forward_out_prod): F32 and these block types
# (dequantized row by row); F16 and BF16 abort.
OUT_PROD_QTYPES = frozenset(_Q8_0 + _Q8_K + (GGMLType.Q4_1, GGMLType.Q5_1))

_DTYPE_TYPE = {v: k for k, v in NUMPY_DTYPES.items()}


def ggml_type(x) -> GGMLType:
    """The ggml type of an ndarray (by dtype) or QTensor."""
    if isinstance(x, QTensor):
        return x.type
    dt = np.asarray(x).dtype
    if dt not in _DTYPE_TYPE:
        raise TypeError(f"no ggml type for numpy dtype {dt}")
    return _DTYPE_TYPE[dt]


def _rows_f64(x, lo: int, hi: int, dtype=np.float64) -> np.ndarray:
    """Rows lo:hi of a 2-D weight (ndarray or QTensor), exactly, as f64 (or dtype: f32 is exact too)."""
    return (dequantize(x[lo:hi]) if isinstance(x, QTensor) else np.asarray(x[lo:hi])).astype(dtype, copy=False)


def _activations_f64(b, dtype=np.float64) -> np.ndarray:
    return (dequantize(b) if isinstance(b, QTensor) else np.asarray(b)).astype(dtype, copy=False)


def _check_b(name: str, a, b, ta: GGMLType) -> None:
    """b is f32, or already a's vec_dot_type, or (ggml 0.25.3) f16/bf16 for a weight whose vec_dot_type is
    f32: ggml-cpu widens those rows exactly to f32; any other conversion aborts in ggml-cpu."""
    try:
        tb = ggml_type(b)
    except TypeError:
        fail(name, f"src1 must be f32 or the weight's vec_dot_type {traits(VEC_DOT_TYPE[ta]).name}, got "
             f"{np.asarray(b).dtype}", a=a, b=b)
    widened = VEC_DOT_TYPE[ta] == GGMLType.F32 and tb in (GGMLType.F16, GGMLType.BF16)
    if tb != GGMLType.F32 and tb != VEC_DOT_TYPE[ta] and not widened:
        want = traits(VEC_DOT_TYPE[ta]).name
        fail(name, f"src1 must be f32 or the weight's vec_dot_type {want}, got {traits(tb).name}",
             a=a, b=b)
    if not rows_packed(b):
        fail(name, "src1 rows must be contiguous (nb10 == type size); use np.ascontiguousarray", a=a, b=b)


def check_weights(name: str, a) -> GGMLType:
    try:
        ta = ggml_type(a)
    except TypeError:
        ta = None
    if ta not in VEC_DOT_TYPE:
        fail(name, f"src0 type {np.asarray(a).dtype if ta is None else traits(ta).name} has no CPU vec_dot", a=a)
    if is_transposed(a) or not rows_packed(a):
        fail(name, "src0 must not be transposed or permuted within rows (nb00 == type size)", a=a)
    return ta




def _check_mul_mat(a, b) -> None:
    if not isinstance(b, QTensor):
        b = np.asarray(b)
    ta = check_weights("mul_mat", a)
    na, nb = ne4(a.shape), ne4(b.shape)
    if na[0] != nb[0] or 0 in na[2:] or nb[2] % na[2] or nb[3] % na[3]:
        fail("mul_mat", "need a.ne0 == b.ne0 and b.ne2, b.ne3 multiples of a's", a=a, b=b)
    _check_b("mul_mat", a, b, ta)


@op("mul_mat", check=_check_mul_mat, layout_check=True)
def mul_mat(a, b) -> np.ndarray:
    """ggml_mul_mat(ctx, a, b): dot every row of b with every row of a (C^T = A B^T).

    a    ne [k, n, a2, a3]   numpy (a3, a2, n, k)   e.g. a weight (n_ff, n_embd): any type with a CPU vec_dot
    b    ne [k, m, b2, b3]   numpy (b3, b2, m, k)   e.g. activations (n_tokens, n_embd): f32, or a's vec_dot type
    out  ne [n, m, b2, b3]   numpy (b3, b2, m, n)   f32

        out[..., j, i] = sum_k a[..., i, k] * b[..., j, k]

    a is repeated over b's batch dims (a batch i serves b batches i*r .. i*r+r-1, r = b2 // a2):
    np.repeat, not np.tile. Grouped-query attention relies on it (kq = mul_mat(k, q) with n_head_kv k heads).
    b may be f32 (any weight type), or exactly a's vec_dot_type (VEC_DOT_TYPE: f16 b for f16 weights, a bf16
    QTensor for bf16, a Q8_0/Q8_1/Q8_K QTensor for block weights), or (ggml 0.25.3) f16/bf16 for an f32
    weight, whose rows ggml-cpu widens exactly to f32; anything else aborts in ggml-cpu.
    Rows of a and b must be contiguous and a not transposed (ggml asserts both); b's other dims may be views.

    Exact mode: weights dequantized exactly (TILE_ROWS rows at a time, never the whole matrix), products
    summed in f64, rounded once to f32. Fast mode: the same exactly dequantized f32 tiles, summed in f32 by
    BLAS (sgemm), each output within gamma_k * sum_k |a*b| of the exact one. ggml-cpu first converts f32 b
    to the vec_dot_type (measured NMSE vs exact: f16 ~5e-8, bf16 ~4e-6, Q8_0/Q8_1/Q8_K blocks 1-4e-5; see
    the tolerance table); numerics="ggml" emulates that (refimpl.kernels.ggml.matmul).
    """
    return tiled_mul_mat(a, b, np.float64)


def tiled_mul_mat(a, b, dt) -> np.ndarray:
    """mul_mat's product on checked operands, summed in dt: f64 (exact mode, the reference), or f32 (the fast
    numerics' BLAS sgemm, refimpl.kernels.fast), weights dequantized TILE_ROWS rows at a time."""
    if not isinstance(b, QTensor):
        b = np.asarray(b)
    na, nb = ne4(a.shape), ne4(b.shape)
    a4 = a.reshape(na[::-1]) if isinstance(a, QTensor) else np.asarray(a).reshape(na[::-1])
    b4 = _activations_f64(b, dt).reshape(nb[::-1])
    r2, r3 = nb[2] // na[2], nb[3] // na[3]
    out = np.empty((nb[3], nb[2], nb[1], na[1]), np.float32)
    for i3 in range(na[3]):
        for i2 in range(na[2]):
            bs = b4[i3 * r3:(i3 + 1) * r3, i2 * r2:(i2 + 1) * r2]          # (r3, r2, m, k)
            for lo in range(0, na[1], TILE_ROWS):
                w = _rows_f64(a4[i3, i2], lo, min(lo + TILE_ROWS, na[1]), dt)
                out[i3 * r3:(i3 + 1) * r3, i2 * r2:(i2 + 1) * r2, :, lo:lo + w.shape[0]] = bs @ w.T
    nd = max(len(b.shape), 2)
    return out.reshape(out.shape[4 - nd:])


def _check_mul_mat_id(as_, b, ids) -> None:
    if not isinstance(b, QTensor):
        b = np.asarray(b)
    ids = np.asarray(ids)
    ta = check_weights("mul_mat_id", as_)
    na, nb, ni = ne4(as_.shape), ne4(b.shape), ne4(ids.shape)
    if ids.dtype != np.int32:
        fail("mul_mat_id", f"ids must be i32, got {ids.dtype}", as_=as_, b=b, ids=ids)
    if na[3] != 1 or nb[3] != 1 or ni[2] != 1 or ni[3] != 1:
        fail("mul_mat_id", "as_ and b must be 3-D and ids 2-D", as_=as_, b=b, ids=ids)
    if na[0] != nb[0] or ni[1] != nb[2] or ni[0] % nb[1]:
        fail("mul_mat_id", "need as_.ne0 == b.ne0, ids.ne1 == b.ne2 (n_tokens) and ids.ne0 % b.ne1 == 0",
             as_=as_, b=b, ids=ids)
    _check_b("mul_mat_id", as_, b, ta)
    if ids.size and (ids.min() < 0 or ids.max() >= na[2]):
        fail("mul_mat_id", f"expert id out of range [0, {na[2]})", as_=as_, b=b, ids=ids)


@op("mul_mat_id", check=_check_mul_mat_id)
def mul_mat_id(as_, b, ids: np.ndarray) -> np.ndarray:
    """ggml_mul_mat_id(ctx, as, b, ids): mul_mat with one weight matrix per expert, chosen per token (MoE).

    as_  ne [k, n, n_expert]        numpy (n_expert, n, k)        e.g. ffn_up_exps; any mul_mat weight type
    b    ne [k, n_b, n_tokens]      numpy (n_tokens, n_b, k)      f32 (or as_'s vec_dot type), n_used % n_b == 0
    ids  ne [n_used, n_tokens]      numpy (n_tokens, n_used)      i32 expert ids, 0 <= ids < n_expert
    out  ne [n, n_used, n_tokens]   numpy (n_tokens, n_used, n)   f32

        out[t, e, :] = as_[ids[t, e]] @ b[t, e % n_b]

    b's slot is e modulo n_b (tiling, not repeat): with n_b == 1 every expert of a token sees the same row
    (llama.cpp's ffn_up_exps on the token itself); with n_b == n_used expert e gets its own row (ffn_down).
    Only the experts named in ids are dequantized, TILE_ROWS rows at a time. Numerics as mul_mat.
    Out-of-range ids are undefined in ggml (a debug-only assert); refimpl rejects them.
    """
    return tiled_mul_mat_id(as_, b, ids, np.float64)


def tiled_mul_mat_id(as_, b, ids, dt) -> np.ndarray:
    """mul_mat_id's product on checked operands, summed in dt (as tiled_mul_mat)."""
    if not isinstance(b, QTensor):
        b = np.asarray(b)
    ids = np.asarray(ids)
    na, nb, ni = ne4(as_.shape), ne4(b.shape), ne4(ids.shape)
    n_expert, n, n_used, n_tok, n_b = na[2], na[1], ni[0], ni[1], nb[1]
    w3 = as_.reshape(n_expert, n, na[0]) if isinstance(as_, QTensor) else np.asarray(as_).reshape(n_expert, n, na[0])
    b3 = _activations_f64(b, dt).reshape(n_tok, n_b, nb[0])
    ids2 = ids.reshape(n_tok, n_used)
    slot = np.arange(n_used) % n_b
    out = np.empty((n_tok, n_used, n), np.float32)
    for x in np.unique(ids2):
        t, e = np.nonzero(ids2 == x)
        rows = b3[t, slot[e]]                                          # (uses, k)
        for lo in range(0, n, TILE_ROWS):
            w = _rows_f64(w3[x], lo, min(lo + TILE_ROWS, n), dt)
            out[t, e, lo:lo + w.shape[0]] = rows @ w.T
    return out


@op("out_prod")
def out_prod(a, b: np.ndarray) -> np.ndarray:
    """ggml_out_prod(ctx, a, b): sum over k of outer products of a's and b's k-th rows (Y = B^T A per batch).

    a    ne [m, k, a2, a3]   numpy (a3, a2, k, m)   f32, f16 (0.25.3), or a block QTensor (OUT_PROD_QTYPES)
    b    ne [n, k, b2, b3]   numpy (b3, b2, k, n)   f32, any view (ggml reads it element by element)
    out  ne [m, n, b2, b3]   numpy (b3, b2, n, m)   f32

        out[..., j, i] = sum_k a[..., k, i] * b[..., k, j]

    f32 a is repeated over b's batch dims as in mul_mat (block broadcast, b2 % a2 == 0); a quantized a
    must match b's batch dims exactly (ggml-cpu asserts it). F16 a (ggml 0.25.3's out_prod_f16_f32: rows
    widened exactly, batch dims as for a quantized a); F16 a in ggml 0.15.3 and BF16 a abort in ggml-cpu.
    This is the weight gradient of mul_mat (a = activations, b = output gradients) in ggml's training graphs.
    Exact mode: f64 sums rounded once to f32 (ggml-cpu accumulates sequential f32 FMAs over k).
    """
    if not isinstance(a, QTensor):
        a = np.asarray(a)
    b = np.asarray(b)
    ta = ggml_type(a) if isinstance(a, QTensor) or a.dtype in _DTYPE_TYPE else None
    if ta != GGMLType.F32 and ta != GGMLType.F16 and ta not in OUT_PROD_QTYPES:
        fail("out_prod", f"src0 must be f32, f16 or a block-quantized type, got "
             f"{traits(ta).name if ta is not None else a.dtype}", a=a, b=b)
    if b.dtype != np.float32:
        fail("out_prod", f"src1 must be f32, got {b.dtype}", a=a, b=b)
    if is_transposed(a) or not rows_packed(a):
        fail("out_prod", "src0 must not be transposed or permuted within rows (nb00 == type size)", a=a, b=b)
    na, nb = ne4(a.shape), ne4(b.shape)
    if na[1] != nb[1] or 0 in na[2:] or nb[2] % na[2] or nb[3] % na[3]:
        fail("out_prod", "need a.ne1 == b.ne1 (k) and b.ne2, b.ne3 multiples of a's", a=a, b=b)
    if ta != GGMLType.F32 and (na[2] != nb[2] or na[3] != nb[3]):
        fail("out_prod", "an f16 or quantized src0 is not broadcast: batch dims must equal b's", a=a, b=b)
    a4 = a.reshape(na[::-1])
    b4 = b.reshape(nb[::-1]).astype(np.float64)
    r2, r3 = nb[2] // na[2], nb[3] // na[3]
    out = np.zeros((nb[3], nb[2], nb[0], na[0]), np.float64)
    for i3 in range(na[3]):
        for i2 in range(na[2]):
            bs = b4[i3 * r3:(i3 + 1) * r3, i2 * r2:(i2 + 1) * r2]          # (r3, r2, k, n)
            for lo in range(0, na[1], TILE_ROWS):                          # rows of a are the k index
                hi = min(lo + TILE_ROWS, na[1])
                w = _rows_f64(a4[i3, i2], lo, hi)                          # (k_tile, m)
                out[i3 * r3:(i3 + 1) * r3, i2 * r2:(i2 + 1) * r2] += np.swapaxes(bs[..., lo:hi, :], -1, -2) @ w
    nd = max(len(b.shape), 2)
    return out.astype(np.float32).reshape(out.shape[4 - nd:])


@op("solve_tri")
def solve_tri(a: np.ndarray, b: np.ndarray, left: bool = True, lower: bool = True, uni: bool = False) -> np.ndarray:
    """ggml_solve_tri(ctx, a, b, left, lower, uni): solve A X = B for X, A lower triangular, per batch.

    a    ne [n, n, B1, B2]   numpy (B2, B1, n, n)   f32, contiguous; only the lower triangle is read
    b    ne [k, n, B1, B2]   numpy (B2, B1, n, k)   f32, contiguous
    out  ne [k, n, B1, B2]   numpy (B2, B1, n, k)   f32

        x[i, :] = (b[i, :] - sum_{t<i} a[i, t] * x[t, :]) / a[i, i]      (forward substitution)

    ggml 0.15.3 implements only left=True, lower=True, uni=False (ggml_solve_tri asserts it); the flags are
    kept for ggml's signature and anything else is rejected. A zero diagonal gives inf/nan, as in ggml.
    Exact mode: the substitution runs in f64, rounded once to f32 (ggml-cpu: f32 sums in order t = 0..i-1).
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != np.float32 or b.dtype != np.float32:
        fail("solve_tri", "a and b must be f32", a=a, b=b)
    na, nb = ne4(a.shape), ne4(b.shape)
    if na[0] != na[1] or na[1] != nb[1] or na[2] != nb[2] or na[3] != nb[3]:
        fail("solve_tri", "a must be square [n, n, B1, B2] and b [k, n, B1, B2]", a=a, b=b)
    if not (a.flags.c_contiguous and b.flags.c_contiguous):
        fail("solve_tri", "a and b must be contiguous (ggml asserts it); use np.ascontiguousarray", a=a, b=b)
    if not (left and lower and not uni):
        fail("solve_tri", f"only left=True, lower=True, uni=False is implemented in ggml "
             f"(got left={left}, lower={lower}, uni={uni})", a=a, b=b)
    A = a.reshape(na[::-1]).astype(np.float64)
    B = b.reshape(nb[::-1]).astype(np.float64)
    X = np.empty_like(B)
    with np.errstate(all="ignore"):
        for i in range(na[0]):
            s = np.einsum("...t,...tk->...k", A[..., i, :i], X[..., :i, :])
            X[..., i, :] = (B[..., i, :] - s) / A[..., i, i:i + 1]
    return X.astype(np.float32).reshape(b.shape)
