"""Convolution, pooling, resampling, embeddings: im2col and the convolutions built on it, the direct
convolution ops, pool_1d/pool_2d, upscale/interpolate, timestep_embedding.

Layouts follow ggml's (PyTorch's) NCHW in NumPy order: ggml `ne [W, H, C, N]` is NumPy `(N, C, H, W)`,
kernels `ne [KW, KH, IC, OC]` are `(OC, IC, KH, KW)`. Output sizes use ggml's integer formulas:

    conv:            O = (I + 2p - d(k - 1) - 1) / s + 1      (C division: truncates toward zero)
    transposed conv: O = (I - 1) s + k
    pool:            O = (I + 2p - k) / s + 1                 (in f32, then truncated)

Data-movement steps (im2col, pooling windows) copy values exactly; convolution sums are dot products
computed in f64 and rounded once to f32 (ggml-cpu uses f32 SIMD dots); short sequential f32 sums whose
order ggml fixes (pool averages, col2im, im2col_back, pool_2d_back) are repeated in the same order.
"""
from __future__ import annotations

import numpy as np

from ..qtensor import QTensor, dequantize, quantize
from ..types import GGMLType, as_type, type_name
from ..dispatch import op
from ..shapes import fail, ne4, nonempty
from .matmul import mul_mat

# enum ggml_op_pool
POOL_MAX, POOL_AVG = 0, 1
# enum ggml_scale_mode and its flags (ggml.h)
SCALE_MODE_NEAREST, SCALE_MODE_BILINEAR, SCALE_MODE_BICUBIC = 0, 1, 2
SCALE_FLAG_ALIGN_CORNERS, SCALE_FLAG_ANTIALIAS = 1 << 8, 1 << 9

_F32_MAX = np.float32(np.finfo(np.float32).max)


# -- helpers -------------------------------------------------------------------------------------------

def conv_size(n: int, k: int, s: int, p: int, d: int) -> int:
    """ggml_calc_conv_output_size: (n + 2p - d(k-1) - 1) / s + 1 with C's truncating division."""
    num = n + 2 * p - d * (k - 1) - 1
    return (abs(num) // s) * (1 if num >= 0 else -1) + 1


def pool_size(n: int, k: int, s: int, p: float) -> int:
    """ggml_calc_pool_output_size: (n + 2p - k) / s + 1 evaluated in f32, truncated to an integer."""
    f = np.float32
    return int((f(n) + f(2) * f(p) - f(k)) / f(s) + f(1))


def _dtype_of(t, name: str, allowed=(GGMLType.F32, GGMLType.F16)) -> np.dtype:
    """np.float32 / np.float16 from a GGMLType, its name or number, or a NumPy dtype."""
    try:
        tt = {np.dtype(np.float32): GGMLType.F32, np.dtype(np.float16): GGMLType.F16}[np.dtype(t)]
    except (TypeError, KeyError):
        try:
            tt = as_type(t)
        except (TypeError, ValueError):
            fail(name, f"dst_type must be a ggml type or numpy float dtype, got {t!r}")
    if tt not in allowed:
        fail(name, f"dst_type must be one of {[x.name for x in allowed]}, got {tt.name}")
    return np.dtype(np.float16 if tt == GGMLType.F16 else np.float32)


def _is(x, *dtypes) -> bool:
    return not isinstance(x, QTensor) and np.asarray(x).dtype in [np.dtype(d) for d in dtypes]


def _need(name: str, what: str, x, dtypes, **operands) -> None:
    if not _is(x, *dtypes):
        fail(name, f"{what} must be {'/'.join(np.dtype(d).name for d in dtypes)}, got {type_name(x)}", **operands)


def _positive(name: str, **params) -> None:
    for k, v in params.items():
        if v < 1:
            fail(name, f"{k} must be >= 1 (ggml divides by it), got {v}")


def _taps(n_in: int, n_out: int, k: int, s: int, p: int, d: int):
    """Input index of output o, kernel tap j: o*s + j*d - p, shape (n_out, k); and where it is in range."""
    i = np.arange(n_out)[:, None] * s + np.arange(k)[None, :] * d - p
    return np.clip(i, 0, max(n_in - 1, 0)), (i >= 0) & (i < n_in)


def _patches(x: np.ndarray, ks, ss, ps, ds, os) -> np.ndarray:
    """Sliding windows over the last len(ks) axes of x, zero outside: (..., *spatial) -> (..., *os, *ks).
    A pure gather: values are copied, never rounded."""
    nd = len(ks)
    lead = x.ndim - nd
    for j in range(nd):
        ax = lead + 2 * j                        # axes before it are already (o, k) pairs
        idx, ok = _taps(x.shape[ax], os[j], ks[j], ss[j], ps[j], ds[j])
        x = np.take(x, idx, axis=ax)             # (..., o_j, k_j, ...)
        x = np.where(ok.reshape(ok.shape + (1,) * (x.ndim - ax - 2)), x, x.dtype.type(0))
    perm = list(range(lead)) + [lead + 2 * j for j in range(nd)] + [lead + 2 * j + 1 for j in range(nd)]
    return x.transpose(perm)


def _f64(x) -> np.ndarray:
    return (dequantize(x) if isinstance(x, QTensor) else np.asarray(x)).astype(np.float64)


def _as_kernel_type(x: np.ndarray, kernel) -> np.ndarray:
    """Data converted to the kernel's type, as ggml's direct convolutions do before their dot products."""
    return x.astype(np.float16).astype(np.float64) if _is(kernel, np.float16) else x.astype(np.float64)


# -- im2col and friends --------------------------------------------------------------------------------

@op("im2col")
def im2col(a, b: np.ndarray, s0: int = 1, s1: int = 1, p0: int = 0, p1: int = 0, d0: int = 1, d1: int = 1,
           is_2D: bool = True, dst_type=GGMLType.F32) -> np.ndarray:
    """ggml_im2col(ctx, a, b, s0, s1, p0, p1, d0, d1, is_2D, dst_type): every kernel-sized window of b as a row.

    2-D:  a (kernel, only its shape is used)  ne [KW, KH, IC, OC]        numpy (OC, IC, KH, KW)
          b (data)                            ne [IW, IH, IC, N]         numpy (N, IC, IH, IW)   f32 (f16 for f16 dst)
          out                                 ne [IC*KH*KW, OW, OH, N]   numpy (N, OH, OW, IC*KH*KW)
    1-D:  a ne [K, IC, OC] numpy (OC, IC, K); b ne [IL, IC, N] numpy (N, IC, IL); out ne [IC*K, OL, N]
          numpy (N, OL, IC*K); s1, p1, d1 unused.

        out[n, oh, ow, (ic*KH + kh)*KW + kw] = b[n, ic, oh*s1 + kh*d1 - p1, ow*s0 + kw*d0 - p0]   (0 outside)

    O = (I + 2p - d(k-1) - 1) / s + 1 (C division). dst_type F32 copies exactly; F16 rounds the data to f16
    (b f32 or f16; ggml 0.15.3 also requires an f16 kernel a, 0.25.3 reads only its shape, as refimpl
    does). ggml's 2-D kernel reads each (IH, IW) plane of b as
    packed rows (it ignores b's nb1): refimpl reads the values of any view.
    """
    nonempty("im2col", a=a, b=b)
    dt = _dtype_of(dst_type, "im2col")
    b = np.asarray(b)
    na, nb = ne4(a.shape), ne4(b.shape)
    if is_2D and na[2] != nb[2]:
        fail("im2col", "2-D: kernel ne2 (IC) must equal data ne2", a=a, b=b)
    if not is_2D and (na[1] != nb[1] or nb[3] != 1):
        fail("im2col", "1-D: kernel ne1 (IC) must equal data ne1, and data must be 3-D", a=a, b=b)
    if dt == np.float16:
        _need("im2col", "data b", b, [np.float32, np.float16], a=a, b=b)
    else:
        _need("im2col", "data b", b, [np.float32], a=a, b=b)
    _positive("im2col", s0=s0, **({"s1": s1} if is_2D else {}))
    if is_2D:
        OW, OH = conv_size(nb[0], na[0], s0, p0, d0), conv_size(nb[1], na[1], s1, p1, d1)
        if OW <= 0 or OH <= 0:
            fail("im2col", f"b too small compared to a (OW={OW}, OH={OH})", a=a, b=b)
        x = b.reshape(nb[::-1])                                                   # (N, IC, IH, IW)
        cols = _patches(x, (na[1], na[0]), (s1, s0), (p1, p0), (d1, d0), (OH, OW))  # (N, IC, OH, OW, KH, KW)
        cols = cols.transpose(0, 2, 3, 1, 4, 5).reshape(nb[3], OH, OW, nb[2] * na[1] * na[0])
    else:
        OL = conv_size(nb[0], na[0], s0, p0, d0)
        if OL <= 0:
            fail("im2col", f"b too small compared to a (OL={OL})", a=a, b=b)
        x = b.reshape(nb[2], nb[1], nb[0])                                        # (N, IC, IL)
        cols = _patches(x, (na[0],), (s0,), (p0,), (d0,), (OL,))                  # (N, IC, OL, K)
        cols = cols.transpose(0, 2, 1, 3).reshape(nb[2], OL, nb[1] * na[0])
    return cols.astype(dt, order="C")


@op("im2col_back")
def im2col_back(a: np.ndarray, b, ne, s0: int = 1, s1: int = 1, p0: int = 0, p1: int = 0, d0: int = 1,
                d1: int = 1, is_2D: bool = True) -> np.ndarray:
    """ggml_im2col_back(ctx, a, b, ne, s0, s1, p0, p1, d0, d1, is_2D): the gradient of im2col (col2im sum).

    a   (gradient of im2col's out)  ne [IC*KH*KW, OW, OH, N]   numpy (N, OH, OW, IC*KH*KW)   f32
    b   (kernel, only its shape)    ne [KW, KH, IC, OC]        numpy (OC, IC, KH, KW)        f32
    ne  the result's ggml extents [IW, IH, IC, N] -- ggml order, as ggml takes it (1-D: [IL, IC, N, 1])
    out ne [IW, IH, IC, N]   numpy (N, IC, IH, IW)   f32

        out[n, ic, ih, iw] = sum over (kh, kw) with ih = oh*s1 + kh*d1 - p1, iw = ow*s0 + kw*d0 - p0 of
                             a[n, oh, ow, (ic*KH + kh)*KW + kw]

    OH, OW are a's extents. 1-D: a ne [IC*K, OL, N], KH = 1. Summed in f32 over kh, then kw, as ggml-cpu
    does (identical bits).
    """
    a = np.asarray(a)
    _need("im2col_back", "a", a, [np.float32], a=a, b=b)
    _need("im2col_back", "the kernel b", b, [np.float32], a=a, b=b)
    _positive("im2col_back", s0=s0, **({"s1": s1} if is_2D else {}))
    ne = [int(v) for v in ne] + [1] * (4 - len(ne))
    na, nb = ne4(a.shape), ne4(b.shape)
    N, IC, IH, IW = (ne[3], ne[2], ne[1], ne[0]) if is_2D else (ne[2], ne[1], 1, ne[0])
    KH, KW = (nb[1], nb[0]) if is_2D else (1, nb[0])
    OH, OW = (na[2], na[1]) if is_2D else (1, na[1])
    if na[0] != IC * KH * KW or (na[3] if is_2D else na[2]) != N or (not is_2D and (na[3] != 1 or ne[3] != 1)):
        fail("im2col_back", f"a must be ne [IC*KH*KW, OW, OH, N] = [{IC * KH * KW}, OW, OH, {N}] for ne {ne}",
             a=a, b=b)
    g = a.reshape(N, OH, OW, IC, KH, KW)
    out = np.zeros((N, IC, IH, IW), np.float32)
    ih_all, okh = _taps(IH, OH, KH, s1 if is_2D else 1, p1 if is_2D else 0, d1 if is_2D else 1)
    iw_all, okw = _taps(IW, OW, KW, s0, p0, d0)
    for kh in range(KH):                         # ggml's loop order per output pixel: kh, then kw
        oh = np.nonzero(okh[:, kh])[0]
        for kw in range(KW):
            ow = np.nonzero(okw[:, kw])[0]
            src = g[:, oh][:, :, ow][..., kh, kw]                          # (N, oh, ow, IC)
            out[:, :, ih_all[oh, kh][:, None], iw_all[ow, kw][None, :]] += src.transpose(0, 3, 1, 2)
    return out.reshape(tuple(ne[::-1])[(0 if is_2D else 1):])


@op("im2col_3d")
def im2col_3d(a, b: np.ndarray, IC: int, s0: int = 1, s1: int = 1, s2: int = 1, p0: int = 0, p1: int = 0,
              p2: int = 0, d0: int = 1, d1: int = 1, d2: int = 1, dst_type=GGMLType.F32) -> np.ndarray:
    """ggml_im2col_3d(ctx, a, b, IC, s0, s1, s2, p0, p1, p2, d0, d1, d2, dst_type): im2col over depth too.

    a (kernel, shape only)  ne [KW, KH, KD, OC*IC]              numpy (OC*IC, KD, KH, KW)
    b (data)                ne [IW, IH, ID, N*IC]               numpy (N*IC, ID, IH, IW)     f32
    out                     ne [IC*KD*KH*KW, OW, OH, N*OD]      numpy (N*OD, OH, OW, IC*KD*KH*KW)

        out[n*OD + od, oh, ow, ((ic*KD + kd)*KH + kh)*KW + kw] =
            b[n*IC + ic, od*s2 + kd*d2 - p2, oh*s1 + kh*d1 - p1, ow*s0 + kw*d0 - p0]     (0 outside)

    Channels and batch share ggml's dim 3 (N = b.ne3 / IC). dst F32 copies exactly; F16 rounds to f16
    (ggml then needs an f16 kernel). b may be any view with packed rows.
    """
    nonempty("im2col_3d", a=a, b=b)
    dt = _dtype_of(dst_type, "im2col_3d")
    b = np.asarray(b)
    na, nb = ne4(a.shape), ne4(b.shape)
    _need("im2col_3d", "data b", b, [np.float32], a=a, b=b)
    if dt == np.float16:
        _need("im2col_3d", "an f16 dst needs kernel a", a, [np.float16], a=a, b=b)
    _positive("im2col_3d", s0=s0, s1=s1, s2=s2, IC=IC)
    if nb[3] % IC:
        fail("im2col_3d", f"data ne3 must be N*IC with IC={IC}", a=a, b=b)
    N = nb[3] // IC
    OW, OH, OD = (conv_size(nb[0], na[0], s0, p0, d0), conv_size(nb[1], na[1], s1, p1, d1),
                  conv_size(nb[2], na[2], s2, p2, d2))
    if min(OW, OH, OD) <= 0:
        fail("im2col_3d", f"b too small compared to a (OW={OW}, OH={OH}, OD={OD})", a=a, b=b)
    x = b.reshape(N, IC, nb[2], nb[1], nb[0])
    cols = _patches(x, (na[2], na[1], na[0]), (s2, s1, s0), (p2, p1, p0), (d2, d1, d0), (OD, OH, OW))
    cols = cols.transpose(0, 2, 3, 4, 1, 5, 6, 7)                   # (N, OD, OH, OW, IC, KD, KH, KW)
    return cols.reshape(N * OD, OH, OW, IC * na[2] * na[1] * na[0]).astype(dt, order="C")


@op("col2im_1d")
def col2im_1d(a, s0: int, oc: int, p0: int = 0):
    """ggml_col2im_1d(ctx, a, s0, oc, p0): overlap-add columns back into a signal (a transposed conv's tail).

    a    ne [K*OC, T_in]   numpy (T_in, OC*K)   f32, f16 or bf16 (QTensor); contiguous
    out  ne [T_out, OC]    numpy (OC, T_out)    a's type;  T_out = (T_in - 1)*s0 + K - 2*p0

        out[oc, t] = sum over (t_in, k) with t_in*s0 + k == t + p0 of a[t_in, oc*K + k]

    Summed in f32 with t_in ascending, as ggml-cpu does (identical bits), then converted to a's type.
    """
    is_bf16 = isinstance(a, QTensor) and a.type == GGMLType.BF16
    if not is_bf16:
        a = np.asarray(a) if not isinstance(a, QTensor) else a
        _need("col2im_1d", "a", a, [np.float32, np.float16], a=a)
    na = ne4(a.shape)
    if na[2] != 1 or na[3] != 1:
        fail("col2im_1d", "a must be a matrix ne [K*OC, T_in]", a=a)
    if not (a.data if is_bf16 else a).flags.c_contiguous:
        fail("col2im_1d", "a must be contiguous (ggml asserts it); use np.ascontiguousarray", a=a)
    if s0 <= 0 or oc <= 0 or p0 < 0:
        fail("col2im_1d", f"need s0 > 0, oc > 0, p0 >= 0 (got s0={s0}, oc={oc}, p0={p0})", a=a)
    nonempty("col2im_1d", a=a)
    K_OC, T_in = na[0], na[1]
    K = K_OC // oc
    T_out = (T_in - 1) * s0 + K - 2 * p0
    if K * oc != K_OC or K <= 0 or T_out <= 0:
        fail("col2im_1d", f"a.ne0 must be K*oc with K > 0 and T_out = {T_out} > 0 (oc={oc})", a=a)
    cols = (dequantize(a) if is_bf16 else a.astype(np.float32)).reshape(T_in, oc, K)
    out = np.zeros((oc, T_out), np.float32)     # the kept window of the full (T_in - 1)*s0 + K signal
    for k in range(K - 1, -1, -1):               # per output: t_in ascending == k descending
        lo = max(0, -(-(p0 - k) // s0))          # the t_in whose position t_in*s0 + k - p0 is in [0, T_out)
        hi = min(T_in - 1, (T_out - 1 + p0 - k) // s0)
        if lo <= hi:
            start = lo * s0 + k - p0
            out[:, start:start + (hi - lo) * s0 + 1:s0] += cols[lo:hi + 1, :, k].T
    if is_bf16:
        return quantize(out, GGMLType.BF16, method="ref")
    return out.astype(a.dtype)


# -- convolutions built from im2col + mul_mat (no op of their own in ggml) ------------------------------
# `covers` names the ggml op their graphs are built on (an empty `covers` would fall back to the function's
# own name, which for conv_2d / conv_2d_dw is the enum of the *direct* ops).

def _packed(x):
    return x if isinstance(x, QTensor) else np.ascontiguousarray(x)


@op("conv_1d", covers=("IM2COL",))
def conv_1d(a: np.ndarray, b: np.ndarray, s0: int = 1, p0: int = 0, d0: int = 1) -> np.ndarray:
    """ggml_conv_1d(ctx, a, b, s0, p0, d0): 1-D convolution = im2col (f16) + mul_mat.

    a (kernel)  ne [K, IC, OC]    numpy (OC, IC, K)    f16 (an f32 kernel aborts in ggml's f16 im2col)
    b (data)    ne [IL, IC, N]    numpy (N, IC, IL)    f32 or f16
    out         ne [OL, OC, N]    numpy (N, OC, OL)    f32;  OL = (IL + 2*p0 - d0*(K-1) - 1) / s0 + 1

        out[n, oc, ol] = sum_{ic, k} a[oc, ic, k] * f16(b[n, ic, ol*s0 + k*d0 - p0])

    The data is rounded to f16 by im2col (part of ggml's graph), then mul_mat(cols, kernel) in f64.
    ggml's layout quirk for N > 1: it reshapes the [N*OL, OC] product straight to [OL, OC, N], so its
    memory is [OC][N][OL] read as [N][OC][OL]: ggml's result equals
    refimpl's.transpose(1, 0, 2).reshape(N, OC, OL). refimpl returns the true convolution; N == 1 agrees.
    """
    cols = im2col(a, b, s0, 0, p0, 0, d0, 0, False, GGMLType.F16)            # (N, OL, IC*K) f16
    N, OL, K = cols.shape
    OC = ne4(a.shape)[2]
    y = mul_mat(cols.reshape(N * OL, K), _packed(a).reshape(OC, K))          # (OC, N*OL)
    return np.ascontiguousarray(y.reshape(OC, N, OL).transpose(1, 0, 2))


@op("conv_1d_dw", covers=("IM2COL",))
def conv_1d_dw(a: np.ndarray, b: np.ndarray, s0: int = 1, p0: int = 0, d0: int = 1) -> np.ndarray:
    """ggml_conv_1d_dw(ctx, a, b, s0, p0, d0): depthwise 1-D convolution (one filter per channel).

    a (kernel)  ne [K, 1, C]     numpy (C, 1, K)    f16 (ggml's f16 im2col requires it)
    b (data)    ne [L, C, 1]     numpy (1, C, L)    f32 or f16; one sequence (ggml asserts N == 1)
    out         ne [OL, C]       numpy (C, OL)      f32

        out[c, ol] = sum_k a[c, 0, k] * f16(b[c, ol*s0 + k*d0 - p0])

    As ggml: im2col (f16) of b with channels as the batch, then mul_mat(cols, a); a kernel with a multiple
    of b's channels is block-broadcast by mul_mat (kernel c uses data channel c // (C_a / C)).
    """
    b = np.asarray(b)
    nb = ne4(b.shape)
    if nb[2] != 1 or nb[3] != 1:
        fail("conv_1d_dw", "b must be ne [L, C, 1] (ggml's im2col asserts a single sequence)", a=a, b=b)
    cols = im2col(a, b.reshape(nb[1], 1, nb[0]), s0, 0, p0, 0, d0, 0, False, GGMLType.F16)  # (C, OL, K)
    y = mul_mat(cols, _packed(a))                                            # (C_a, 1, OL)
    return y.reshape(y.shape[0], y.shape[2])


@op("conv_2d", covers=("IM2COL",))
def conv_2d(a: np.ndarray, b: np.ndarray, s0: int = 1, s1: int = 1, p0: int = 0, p1: int = 0, d0: int = 1,
            d1: int = 1) -> np.ndarray:
    """ggml_conv_2d(ctx, a, b, s0, s1, p0, p1, d0, d1): 2-D convolution = im2col + mul_mat + permute.

    a (kernel)  ne [KW, KH, IC, OC]   numpy (OC, IC, KH, KW)   f32 or f16
    b (data)    ne [W, H, IC, N]      numpy (N, IC, H, W)      f32 (f32 kernel); f32 or f16 (f16 kernel)
    out         ne [OW, OH, OC, N]    numpy (N, OC, OH, OW)    f32

        out[n, oc, oh, ow] = sum_{ic,kh,kw} a[oc, ic, kh, kw] * b[n, ic, oh*s1 + kh*d1 - p1, ow*s0 + kw*d0 - p0]

    im2col runs in the kernel's type (an f16 kernel rounds the data to f16), then mul_mat in f64.
    s0/p0/d0 act on the width (ne0), s1/p1/d1 on the height.
    """
    if not (_is(a, np.float32) or _is(a, np.float16)):
        fail("conv_2d", f"kernel must be f32 or f16 (im2col runs in its type), got {type_name(a)}", a=a, b=b)
    cols = im2col(a, b, s0, s1, p0, p1, d0, d1, True, np.asarray(a).dtype)     # (N, OH, OW, IC*KH*KW)
    N, OH, OW, K = cols.shape
    OC = ne4(a.shape)[3]
    y = mul_mat(cols.reshape(N * OH * OW, K), _packed(a).reshape(OC, K))       # (OC, N*OH*OW)
    return np.ascontiguousarray(y.reshape(OC, N, OH, OW).transpose(1, 0, 2, 3))


@op("conv_2d_dw", covers=("IM2COL",))
def conv_2d_dw(a: np.ndarray, b: np.ndarray, s0: int = 1, s1: int = 1, p0: int = 0, p1: int = 0, d0: int = 1,
               d1: int = 1) -> np.ndarray:
    """ggml_conv_2d_dw(ctx, a, b, s0, s1, p0, p1, d0, d1): depthwise 2-D convolution via im2col (f16).

    a (kernel)  ne [KW, KH, 1, C]    numpy (C, 1, KH, KW)   f16 (ggml's f16 im2col requires it)
    b (data)    ne [W, H, C, N]      numpy (N, C, H, W)     f32 or f16
    out         ne [OW, OH, C, N]    numpy (N, C, OH, OW)   f32

        out[n, c, oh, ow] = sum_{kh,kw} a[c, 0, kh, kw] * f16(b[n, c, oh*s1 + kh*d1 - p1, ow*s0 + kw*d0 - p0])

    As ggml: im2col of b with (N*C) single-channel images, then mul_mat of the flattened kernel over it
    (block broadcast over N). conv_2d_dw_direct is the direct f32 op.
    """
    nonempty("conv_2d_dw", a=a, b=b)
    na, nb = ne4(a.shape), ne4(b.shape)
    C_a = na[2] * na[3]
    if C_a == 0 or nb[2] % C_a:
        fail("conv_2d_dw", "data channels must be a multiple of the kernel's", a=a, b=b)
    new_a = _packed(a).reshape(C_a, 1, na[1], na[0])
    cols = im2col(new_a, np.asarray(b).reshape(nb[3] * nb[2], 1, nb[1], nb[0]), s0, s1, p0, p1, d0, d1, True,
                  GGMLType.F16)                                                # (N*C, OH, OW, KH*KW)
    _, OH, OW, K = cols.shape
    y = mul_mat(new_a.reshape(1, C_a, 1, K), cols.reshape(nb[3], nb[2], OH * OW, K))   # (N, C, OH*OW, 1)
    return y.reshape(nb[3], nb[2], OH, OW)


@op("conv_3d", covers=("IM2COL_3D",))
def conv_3d(a: np.ndarray, b: np.ndarray, IC: int, s0: int = 1, s1: int = 1, s2: int = 1, p0: int = 0,
            p1: int = 0, p2: int = 0, d0: int = 1, d1: int = 1, d2: int = 1) -> np.ndarray:
    """ggml_conv_3d(ctx, a, b, IC, s0, s1, s2, p0, p1, p2, d0, d1, d2): 3-D convolution = im2col_3d + mul_mat.

    a (kernel)  ne [KW, KH, KD, OC*IC]   numpy (OC*IC, KD, KH, KW)   f32 or f16 (row oc*IC + ic)
    b (data)    ne [W, H, D, N*IC]       numpy (N*IC, D, H, W)       f32        (row n*IC + ic)
    out         ne [OW, OH, OD, N*OC]    numpy (N*OC, OD, OH, OW)    f32        (row n*OC + oc)

        out[n*OC + oc, od, oh, ow] = sum_{ic,kd,kh,kw} a[oc*IC + ic, kd, kh, kw] *
                                     b[n*IC + ic, od*s2 + kd*d2 - p2, oh*s1 + kh*d1 - p1, ow*s0 + kw*d0 - p0]

    im2col_3d runs in the kernel's type (f16 kernel: data rounded to f16), then mul_mat in f64.
    conv_3d_direct is the CONV_3D op.
    """
    nonempty("conv_3d", a=a, b=b)
    if not (_is(a, np.float32) or _is(a, np.float16)):
        fail("conv_3d", f"kernel must be f32 or f16 (im2col_3d runs in its type), got {type_name(a)}", a=a, b=b)
    na = ne4(a.shape)
    if na[3] % IC:
        fail("conv_3d", f"kernel ne3 must be OC*IC with IC={IC}", a=a, b=b)
    OC = na[3] // IC
    cols = im2col_3d(a, b, IC, s0, s1, s2, p0, p1, p2, d0, d1, d2, np.asarray(a).dtype)  # (N*OD, OH, OW, K)
    NOD, OH, OW, K = cols.shape
    N = ne4(np.shape(b))[3] // IC
    y = mul_mat(cols.reshape(NOD * OH * OW, K), _packed(a).reshape(OC, K))     # (OC, N*OD*OH*OW)
    y = y.reshape(OC, N, NOD // N, OH, OW).transpose(1, 0, 2, 3, 4)
    return np.ascontiguousarray(y).reshape(N * OC, NOD // N, OH, OW)


@op("conv_1d_ph", covers=("IM2COL",))
def conv_1d_ph(a: np.ndarray, b: np.ndarray, s: int = 1, d: int = 1) -> np.ndarray:
    """ggml_conv_1d_ph(ctx, a, b, s, d): conv_1d with "half" padding p0 = K // 2 (shapes as conv_1d)."""
    return conv_1d(a, b, s, ne4(a.shape)[0] // 2, d)


@op("conv_1d_dw_ph", covers=("IM2COL",))
def conv_1d_dw_ph(a: np.ndarray, b: np.ndarray, s0: int = 1, d0: int = 1) -> np.ndarray:
    """ggml_conv_1d_dw_ph(ctx, a, b, s0, d0): conv_1d_dw with p0 = K // 2 (shapes as conv_1d_dw)."""
    return conv_1d_dw(a, b, s0, ne4(a.shape)[0] // 2, d0)


@op("conv_2d_sk_p0", covers=("IM2COL",))
def conv_2d_sk_p0(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_conv_2d_sk_p0(ctx, a, b): conv_2d with stride = kernel size, no padding (patchify, as in ViTs)."""
    n = ne4(a.shape)
    return conv_2d(a, b, n[0], n[1], 0, 0, 1, 1)


@op("conv_2d_s1_ph", covers=("IM2COL",))
def conv_2d_s1_ph(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_conv_2d_s1_ph(ctx, a, b): conv_2d with stride 1 and padding KW // 2, KH // 2 ("same" size)."""
    n = ne4(a.shape)
    return conv_2d(a, b, 1, 1, n[0] // 2, n[1] // 2, 1, 1)


# -- direct convolution ops ------------------------------------------------------------------------------

def _direct_kernel(name: str, a, b) -> None:
    if not (_is(a, np.float32) or _is(a, np.float16)):
        fail(name, f"kernel must be f32 or f16, got {type_name(a)}", a=a, b=b)
    _need(name, "data b", b, [np.float32], a=a, b=b)


@op("conv_2d_direct", covers=("CONV_2D",))
def conv_2d_direct(a: np.ndarray, b: np.ndarray, s0: int = 1, s1: int = 1, p0: int = 0, p1: int = 0,
                   d0: int = 1, d1: int = 1) -> np.ndarray:
    """ggml_conv_2d_direct(ctx, a, b, s0, s1, p0, p1, d0, d1): the CONV_2D op, same result as conv_2d.

    a (kernel)  ne [KW, KH, IC, OC]   numpy (OC, IC, KH, KW)   f32 or f16, contiguous
    b (data)    ne [W, H, IC, N]      numpy (N, IC, H, W)      f32, any view
    out         ne [OW, OH, OC, N]    numpy (N, OC, OH, OW)    f32

        out[n, oc, oh, ow] = sum_{ic,kh,kw} a[oc, ic, kh, kw] * b[n, ic, oh*s1 + kh*d1 - p1, ow*s0 + kw*d0 - p0]

    ggml-cpu builds im2col patches in the kernel's type (an f16 kernel rounds the data to f16: refimpl does
    too, so conv_2d_direct == conv_2d) and runs mul_mat on them; refimpl sums in f64.
    """
    nonempty("conv_2d_direct", a=a, b=b)
    b = np.asarray(b)
    _direct_kernel("conv_2d_direct", a, b)
    na, nb = ne4(a.shape), ne4(b.shape)
    if na[2] != nb[2]:
        fail("conv_2d_direct", "kernel ne2 (IC) must equal data ne2", a=a, b=b)
    _positive("conv_2d_direct", s0=s0, s1=s1)
    OW, OH = conv_size(nb[0], na[0], s0, p0, d0), conv_size(nb[1], na[1], s1, p1, d1)
    if OW <= 0 or OH <= 0:
        fail("conv_2d_direct", f"b too small compared to a (OW={OW}, OH={OH})", a=a, b=b)
    x = _as_kernel_type(b.reshape(nb[::-1]), a)
    cols = _patches(x, (na[1], na[0]), (s1, s0), (p1, p0), (d1, d0), (OH, OW))   # (N, IC, OH, OW, KH, KW)
    y = np.einsum("nchwij,ocij->nohw", cols, _f64(a).reshape(na[::-1]), optimize=True)
    return y.astype(np.float32)


@op("conv_2d_dw_direct", covers=("CONV_2D_DW",))
def conv_2d_dw_direct(a: np.ndarray, b: np.ndarray, stride0: int = 1, stride1: int = 1, pad0: int = 0,
                      pad1: int = 0, dilation0: int = 1, dilation1: int = 1) -> np.ndarray:
    """ggml_conv_2d_dw_direct(ctx, a, b, stride0, stride1, pad0, pad1, dilation0, dilation1): depthwise conv.

    a (kernel)  ne [KW, KH, 1, C]    numpy (C, 1, KH, KW)   f32, or f16 (ggml 0.25.3: widened exactly)
    b (data)    ne [W, H, C, N]      numpy (N, C, H, W)     f32
    out         ne [OW, OH, C, N]    numpy (N, C, OH, OW)   f32

        out[n, c, oh, ow] = sum_{kh,kw} a[c, 0, kh, kw] * b[n, c, oh*stride1 + kh*dilation1 - pad1, ...]

    ggml-cpu takes b either contiguous (WHCN) or channels-innermost (CWHN: b a permuted view with the
    channel stride = one element; the kernel must then be channels-innermost too, and the result is
    returned in that layout); any other layout aborts. refimpl reads values, so layout does not matter.
    Sums in f64 (ggml: f32 FMA over kh, kw).
    """
    nonempty("conv_2d_dw_direct", a=a, b=b)
    b = np.asarray(b)
    _need("conv_2d_dw_direct", "kernel a", a, [np.float32, np.float16], a=a, b=b)
    _need("conv_2d_dw_direct", "data b", b, [np.float32], a=a, b=b)
    na, nb = ne4(a.shape), ne4(b.shape)
    if na[2] != 1 or na[3] != nb[2]:
        fail("conv_2d_dw_direct", "kernel must be ne [KW, KH, 1, C] with C = data ne2", a=a, b=b)
    _positive("conv_2d_dw_direct", stride0=stride0, stride1=stride1)
    OW = conv_size(nb[0], na[0], stride0, pad0, dilation0)
    OH = conv_size(nb[1], na[1], stride1, pad1, dilation1)
    if OW <= 0 or OH <= 0:
        fail("conv_2d_dw_direct", f"b too small compared to a (OW={OW}, OH={OH})", a=a, b=b)
    cols = _patches(b.reshape(nb[::-1]).astype(np.float64), (na[1], na[0]), (stride1, stride0), (pad1, pad0),
                    (dilation1, dilation0), (OH, OW))                            # (N, C, OH, OW, KH, KW)
    y = np.einsum("nchwij,cij->nchw", cols, _f64(a).reshape(na[3], na[1], na[0]), optimize=True)
    return y.astype(np.float32)


@op("conv_3d_direct", covers=("CONV_3D",))
def conv_3d_direct(a: np.ndarray, b: np.ndarray, s0: int, s1: int, s2: int, p0: int, p1: int, p2: int,
                   d0: int, d1: int, d2: int, c: int, n: int, oc: int) -> np.ndarray:
    """ggml_conv_3d_direct(ctx, a, b, s0, s1, s2, p0, p1, p2, d0, d1, d2, c, n, oc): the CONV_3D op.

    a (kernel)  ne [KW, KH, KD, oc*c]   numpy (oc*c, KD, KH, KW)   f32 or f16, contiguous (row o*c + ic)
    b (data)    ne [W, H, D, n*c]       numpy (n*c, D, H, W)       f32, any view          (row i*c + ic)
    out         ne [OW, OH, OD, n*oc]   numpy (n*oc, OD, OH, OW)   f32                    (row i*oc + o)

        out[i*oc + o, od, oh, ow] = sum_{ic,kd,kh,kw} a[o*c + ic, kd, kh, kw] *
                                    b[i*c + ic, od*s2 + kd*d2 - p2, oh*s1 + kh*d1 - p1, ow*s0 + kw*d0 - p0]

    Same result as conv_3d. An f16 kernel rounds the data to f16 first (as ggml-cpu's patches); f64 sums.
    A kernel with an empty spatial axis (KW, KH or KD 0, which ggml 0.25.3 accepts) sums nothing: zeros,
    with O = (I + 2p + d - 1) / s + 1 along that axis.
    """
    nonempty("conv_3d_direct", b=b)
    b = np.asarray(b)
    _direct_kernel("conv_3d_direct", a, b)
    na, nb = ne4(a.shape), ne4(b.shape)
    if na[3] != c * oc or nb[3] != c * n:
        fail("conv_3d_direct", f"need kernel ne3 == oc*c ({oc}*{c}) and data ne3 == n*c ({n}*{c})", a=a, b=b)
    _positive("conv_3d_direct", s0=s0, s1=s1, s2=s2)
    OW, OH, OD = (conv_size(nb[0], na[0], s0, p0, d0), conv_size(nb[1], na[1], s1, p1, d1),
                  conv_size(nb[2], na[2], s2, p2, d2))
    if min(OW, OH, OD) <= 0:
        fail("conv_3d_direct", f"b too small compared to a (OW={OW}, OH={OH}, OD={OD})", a=a, b=b)
    if 0 in na:
        return np.zeros((n * oc, OD, OH, OW), np.float32)
    x = _as_kernel_type(b.reshape(n, c, nb[2], nb[1], nb[0]), a)
    cols = _patches(x, (na[2], na[1], na[0]), (s2, s1, s0), (p2, p1, p0), (d2, d1, d0), (OD, OH, OW))
    w = _f64(a).reshape(oc, c, na[2], na[1], na[0])
    y = np.einsum("ncdhwijk,ocijk->nodhw", cols, w, optimize=True)
    return y.astype(np.float32).reshape(n * oc, OD, OH, OW)


@op("conv_transpose_1d")
def conv_transpose_1d(a: np.ndarray, b: np.ndarray, s0: int = 1, p0: int = 0, d0: int = 1) -> np.ndarray:
    """ggml_conv_transpose_1d(ctx, a, b, s0, p0, d0): transposed 1-D convolution (upsampling conv).

    a (kernel)  ne [K, OC, IC]   numpy (IC, OC, K)   f32 or f16
    b (data)    ne [L, IC]       numpy (IC, L)       f32
    out         ne [OL, OC]      numpy (OC, OL)      f32;  OL = (L - 1)*s0 + K

        out[oc, l*s0 + k] += sum_ic a[ic, oc, k] * b[ic, l]        for every l, k

    ggml 0.15.3 implements only p0 == 0, d0 == 1 (asserted). An f16 kernel rounds the data to f16 first
    (as ggml-cpu); f64 sums.
    """
    nonempty("conv_transpose_1d", a=a, b=b)
    b = np.asarray(b)
    _direct_kernel("conv_transpose_1d", a, b)
    na, nb = ne4(a.shape), ne4(b.shape)
    if nb[2] != 1 or nb[3] != 1 or na[2] != nb[1] or na[3] != 1:
        fail("conv_transpose_1d", "need a ne [K, OC, IC] and a matrix b ne [L, IC]", a=a, b=b)
    if p0 != 0 or d0 != 1:
        fail("conv_transpose_1d", f"ggml supports only p0 == 0 and d0 == 1 (got p0={p0}, d0={d0})", a=a, b=b)
    _positive("conv_transpose_1d", s0=s0)
    K, OC, IC, L = na[0], na[1], na[2], nb[0]
    y = np.einsum("iok,il->olk", _f64(a).reshape(IC, OC, K), _as_kernel_type(b.reshape(IC, L), a))
    out = np.zeros((OC, (L - 1) * s0 + K))
    for k in range(K):
        out[:, k:k + (L - 1) * s0 + 1:s0] += y[:, :, k]
    return out.astype(np.float32)


@op("conv_transpose_2d_p0", covers=("CONV_TRANSPOSE_2D",))
def conv_transpose_2d_p0(a: np.ndarray, b: np.ndarray, stride: int) -> np.ndarray:
    """ggml_conv_transpose_2d_p0(ctx, a, b, stride): transposed 2-D convolution, no padding.

    a (kernel)  ne [KW, KH, OC, IC]   numpy (IC, OC, KH, KW)   f32 or f16
    b (data)    ne [W, H, IC, N]      numpy (N, IC, H, W)      f32
    out         ne [OW, OH, OC, N]    numpy (N, OC, OH, OW)    f32;  OW = (W - 1)*stride + KW, same for H

        out[n, oc, h*stride + kh, w*stride + kw] += sum_ic a[ic, oc, kh, kw] * b[n, ic, h, w]

    An f16 kernel rounds the data to f16 first (as ggml-cpu); f64 sums. ggml-cpu computes batch 0 only
    and leaves batches n >= 1 of its result at zero (its loops ignore b's ne3); refimpl computes every
    batch, so the two agree for N == 1 only.
    """
    nonempty("conv_transpose_2d_p0", a=a, b=b)
    b = np.asarray(b)
    _direct_kernel("conv_transpose_2d_p0", a, b)
    na, nb = ne4(a.shape), ne4(b.shape)
    if na[3] != nb[2]:
        fail("conv_transpose_2d_p0", "kernel ne3 (IC) must equal data ne2", a=a, b=b)
    _positive("conv_transpose_2d_p0", stride=stride)
    KW, KH, OC, IC = na
    W, H, N = nb[0], nb[1], nb[3]
    y = np.einsum("iokl,nihw->nohwkl", _f64(a).reshape(IC, OC, KH, KW),
                  _as_kernel_type(b.reshape(N, IC, H, W), a), optimize=True)
    out = np.zeros((N, OC, (H - 1) * stride + KH, (W - 1) * stride + KW))
    for kh in range(KH):
        for kw in range(KW):
            out[:, :, kh:kh + (H - 1) * stride + 1:stride, kw:kw + (W - 1) * stride + 1:stride] += y[..., kh, kw]
    return out.astype(np.float32)


# -- pooling -------------------------------------------------------------------------------------------

def _pool_op(name: str, op_) -> int:
    o = {"max": POOL_MAX, "avg": POOL_AVG}.get(op_, op_) if isinstance(op_, str) else int(op_)
    if o not in (POOL_MAX, POOL_AVG):
        fail(name, f"op must be POOL_MAX (0) or POOL_AVG (1), got {op_!r}")
    return o


def _vmax(v, res):
    """std::max(v, res) as ggml calls it: res unless v is not less (ties and NaN v take v)."""
    return np.where(v < res, res, v)


@op("pool_1d")
def pool_1d(a: np.ndarray, op: int, k0: int, s0: int, p0: int) -> np.ndarray:  # noqa: A002 (ggml's name)
    """ggml_pool_1d(ctx, a, op, k0, s0, p0): max or average over windows of k0 along ne0.

    a    ne [IW, n1, n2, n3]   numpy (n3, n2, n1, IW)   f32 or f16
    out  ne [OW, n1, n2, n3]   numpy (n3, n2, n1, OW)   f32;  OW = (IW + 2*p0 - k0) / s0 + 1 (f32, truncated)

        out[..., ow] = max / mean of a[..., ow*s0 - p0 + j] over j < k0 with the index in range

    AVG divides by the number of in-range elements (padding excluded -- unlike pool_2d); MAX starts at
    -FLT_MAX. op: POOL_MAX (0) / POOL_AVG (1), or "max" / "avg". Same f32 operations in the same order as
    ggml-cpu: identical bits.
    """
    nonempty("pool_1d", a=a)
    o = _pool_op("pool_1d", op)
    a = np.asarray(a)
    _need("pool_1d", "a", a, [np.float32, np.float16], a=a)
    _positive("pool_1d", s0=s0)
    IW = a.shape[-1] if a.ndim else 1
    OW = pool_size(IW, k0, s0, p0)
    if OW <= 0:
        fail("pool_1d", f"output width {OW} <= 0", a=a)
    x = a.astype(np.float32)
    res = np.full(a.shape[:-1] + (OW,), -_F32_MAX if o == POOL_MAX else 0, np.float32)
    count = np.zeros(OW, np.float32)
    for j in range(k0):
        idx, ok = _taps(IW, OW, 1, s0, p0 - j, 1)
        idx, ok = idx[:, 0], ok[:, 0]
        v = x[..., idx]
        res = np.where(ok, _vmax(v, res) if o == POOL_MAX else res + v, res)
        count += ok
    if o == POOL_AVG:
        res = np.where(count > 0, res / np.maximum(count, 1), np.float32(0))
    return res.astype(np.float32)


@op("pool_2d")
def pool_2d(a: np.ndarray, op: int, k0: int, k1: int, s0: int, s1: int, p0: float,  # noqa: A002 (ggml's name)
            p1: float) -> np.ndarray:
    """ggml_pool_2d(ctx, a, op, k0, k1, s0, s1, p0, p1): max or average over k1 x k0 windows.

    a    ne [IW, IH, n2, n3]   numpy (n3, n2, IH, IW)   f32 or f16
    out  ne [OW, OH, n2, n3]   numpy (n3, n2, OH, OW)   f32;  OW = (IW + 2*p0 - k0) / s0 + 1 (f32, truncated)

        out[..., oh, ow] = max / sum of a[..., oh*s1 - p1 + i, ow*s0 - p0 + j] (in range) over i < k1, j < k0

    AVG always divides by k0*k1 (padding counts as zeros -- unlike pool_1d); MAX starts at -FLT_MAX.
    p0, p1 are floats in ggml: the output size uses them as given, the windows use them truncated to int.
    op: POOL_MAX (0) / POOL_AVG (1), or "max" / "avg". ggml-cpu's f32 operations in its order: identical bits.
    """
    nonempty("pool_2d", a=a)
    o = _pool_op("pool_2d", op)
    a = np.asarray(a)
    _need("pool_2d", "a", a, [np.float32, np.float16], a=a)
    _positive("pool_2d", s0=s0, s1=s1)
    n = ne4(a.shape)
    OW, OH = pool_size(n[0], k0, s0, p0), pool_size(n[1], k1, s1, p1)
    if OW <= 0 or OH <= 0:
        fail("pool_2d", f"output size OW={OW}, OH={OH} must be positive", a=a)
    x = a.astype(np.float32).reshape(n[::-1])
    ip0, ip1 = int(p0), int(p1)
    res = np.full((n[3], n[2], OH, OW), -_F32_MAX if o == POOL_MAX else 0, np.float32)
    for i in range(k1):                                          # ky outer, kx inner, as ggml
        iy, oky = _taps(n[1], OH, 1, s1, ip1 - i, 1)
        for j in range(k0):
            ix, okx = _taps(n[0], OW, 1, s0, ip0 - j, 1)
            v = x[:, :, iy[:, 0][:, None], ix[:, 0][None, :]]
            ok = oky[:, 0][:, None] & okx[:, 0][None, :]
            res = np.where(ok, _vmax(v, res) if o == POOL_MAX else res + v, res)
    if o == POOL_AVG:
        res = res / np.float32(k0 * k1)
    return res.reshape(a.shape[:-2] + (OH, OW) if a.ndim >= 2 else (OH, OW))


@op("pool_2d_back")
def pool_2d_back(a: np.ndarray, af: np.ndarray, op: int, k0: int, k1: int, s0: int, s1: int, p0: float,  # noqa: A002
                 p1: float) -> np.ndarray:
    """ggml_pool_2d_back(ctx, a, af, op, k0, k1, s0, s1, p0, p1): the gradient of pool_2d.

    a   (gradient of pool_2d's out)  ne [OW, OH, n2, n3]   numpy (n3, n2, OH, OW)   f32
    af  (pool_2d's input)            ne [IW, IH, n2, n3]   numpy (n3, n2, IH, IW)   f32
    out                              ne [IW, IH, n2, n3]   numpy (n3, n2, IH, IW)   f32

    MAX: each a[oh, ow] goes to the first maximum of its window in af (scanning rows, then columns; only
    values > -FLT_MAX count). AVG: a[oh, ow] / (k0*k1) goes to every in-range element of its window.
    Windows as pool_2d (p truncated to int). Accumulated in f32 in ggml-cpu's order (output rows, then
    columns): identical bits.
    """
    nonempty("pool_2d_back", a=a, af=af)
    o = _pool_op("pool_2d_back", op)
    a, af = np.asarray(a), np.asarray(af)
    _need("pool_2d_back", "a", a, [np.float32], a=a, af=af)
    _need("pool_2d_back", "af", af, [np.float32], a=a, af=af)
    _positive("pool_2d_back", s0=s0, s1=s1)
    na, nf = ne4(a.shape), ne4(af.shape)
    if na[2] * na[3] != nf[2] * nf[3]:
        fail("pool_2d_back", "a and af must have the same number of planes (ne2*ne3)", a=a, af=af)
    P, OH, OW, IH, IW = nf[2] * nf[3], na[1], na[0], nf[1], nf[0]
    g = a.reshape(P, OH, OW)
    out = np.zeros((P, IH, IW), np.float32)
    iy, oky = _taps(IH, OH, k1, s1, int(p1), 1)                  # (OH, k1)
    ix, okx = _taps(IW, OW, k0, s0, int(p0), 1)                  # (OW, k0)
    if o == POOL_MAX:
        win = af.reshape(P, IH, IW)[:, iy[:, None, :, None], ix[None, :, None, :]]   # (P, OH, OW, k1, k0)
        ok = oky[:, None, :, None] & okx[None, :, None, :]
        win = np.where(ok, win, -np.inf).reshape(P, OH, OW, k1 * k0)
        best = np.argmax(win, axis=-1)
        hit = np.take_along_axis(win, best[..., None], -1)[..., 0] > -_F32_MAX
        ky, kx = best // k0, best % k0
        p_, oy, ox = np.nonzero(hit)                             # C order: plane, output row, column
        dy, dx = iy[oy, ky[p_, oy, ox]], ix[ox, kx[p_, oy, ox]]
        np.add.at(out, (p_, dy, dx), g[p_, oy, ox])              # sequential f32 adds, in this order
    else:
        grad = g / np.float32(k0 * k1)
        for ky in range(k1 - 1, -1, -1):         # per input element: output (row, col) ascending
            oy = np.nonzero(oky[:, ky])[0]
            for kx in range(k0 - 1, -1, -1):
                ox = np.nonzero(okx[:, kx])[0]
                out[:, iy[oy, ky][:, None], ix[ox, kx][None, :]] += grad[:, oy][:, :, ox]
    return out.reshape(af.shape)


# -- resampling and embeddings ---------------------------------------------------------------------

def _scale_mode(name: str, mode: int) -> tuple[int, int]:
    m, flags = int(mode) & 0xFF, int(mode) & ~0xFF
    if m not in (SCALE_MODE_NEAREST, SCALE_MODE_BILINEAR, SCALE_MODE_BICUBIC):
        fail(name, f"unknown scale mode {m}")
    if flags & ~(SCALE_FLAG_ALIGN_CORNERS | SCALE_FLAG_ANTIALIAS):
        fail(name, f"unknown scale flags {flags:#x}")
    if flags & SCALE_FLAG_ANTIALIAS and m != SCALE_MODE_BILINEAR:
        fail(name, "SCALE_FLAG_ANTIALIAS is only implemented for bilinear")
    return m, flags


def _trunc_index(i: np.ndarray, sf: np.float32) -> np.ndarray:
    """(int64)(i / sf) in f32: ggml's nearest source index."""
    return (i.astype(np.float32) / sf).astype(np.int64)


@op("interpolate", covers=("UPSCALE",))
def interpolate(a: np.ndarray, ne0: int, ne1: int, ne2: int, ne3: int, mode: int = SCALE_MODE_NEAREST) -> np.ndarray:
    """ggml_interpolate(ctx, a, ne0, ne1, ne2, ne3, mode): resize to ggml extents [ne0, ne1, ne2, ne3].

    a    ne [w, h, c, n]           numpy (n, c, h, w)           f32, any view
    out  ne [ne0, ne1, ne2, ne3]   numpy (ne3, ne2, ne1, ne0)   f32   (ne0..ne3 are ggml dims: ne0 = width)

    Scale factors sf_d = ne_d / a.ne_d (f32). Dims 2, 3 (and 0, 1 in NEAREST): src = trunc(i / sf).
    BILINEAR (dims 0, 1): x = (i + 0.5)/sf - 0.5, x0 = floor(x), the two taps clamped to the edge,
    dx = clamp(x - x0, 0, 1). BICUBIC: Keys kernel a = -0.75 on taps x0-1 .. x0+2, clamped indexing.
    Flags: SCALE_FLAG_ALIGN_CORNERS (offset 0, sf = (ne-1)/(ne_src-1) on dims 0, 1 -- NEAREST included);
    SCALE_FLAG_ANTIALIAS (bilinear only): triangle filter of support max(1, 1/sf), weights normalised
    (PyTorch's antialias=True). Coordinates, taps and weights are computed in f32 as ggml-cpu does; the
    weighted sums in f64, rounded once.
    """
    nonempty("interpolate", a=a)
    m, flags = _scale_mode("interpolate", mode)
    a = np.asarray(a)
    _need("interpolate", "a", a, [np.float32], a=a)
    n = ne4(a.shape)
    x = a.reshape(n[::-1])
    f = np.float32
    sf = [f(t) / f(s) for t, s in zip((ne0, ne1, ne2, ne3), n)]
    off = f(0.5)
    if flags & SCALE_FLAG_ALIGN_CORNERS:
        off = f(0)
        for d, t in ((0, ne0), (1, ne1)):
            if t > 1 and n[d] > 1:
                sf[d] = f(t - 1) / f(n[d] - 1)
    i3, i2 = _trunc_index(np.arange(ne3), sf[3]), _trunc_index(np.arange(ne2), sf[2])
    x = x[i3][:, i2]                                                   # (ne3, ne2, h, w)
    if m == SCALE_MODE_NEAREST:
        out = x[:, :, _trunc_index(np.arange(ne1), sf[1])][..., _trunc_index(np.arange(ne0), sf[0])]
        return np.ascontiguousarray(out)
    if flags & SCALE_FLAG_ANTIALIAS:
        wy = _antialias_weights(ne1, n[1], sf[1], off)                 # (ne1, h)
        wx = _antialias_weights(ne0, n[0], sf[0], off)                 # (ne0, w)
        num = _separable(wy, x, wx)
        tot = np.outer(wy.sum(1), wx.sum(1))
        return np.where(tot > 0, num / np.where(tot > 0, tot, 1), num).astype(np.float32)
    if m == SCALE_MODE_BILINEAR:
        wy = _linear_weights(ne1, n[1], sf[1], off)
        wx = _linear_weights(ne0, n[0], sf[0], off)
    else:
        wy = _cubic_weights(ne1, n[1], sf[1], off)
        wx = _cubic_weights(ne0, n[0], sf[0], off)
    return _separable(wy, x, wx).astype(np.float32)


def _separable(wy: np.ndarray, x: np.ndarray, wx: np.ndarray) -> np.ndarray:
    """sum_hw wy[y, h] x[n, c, h, w] wx[x, w] in f64, as two matrix products (einsum's generic loop is ~50x slower)."""
    return wy @ (x.astype(np.float64) @ wx.T)


def _src_coord(n_out: int, sf: np.float32, off: np.float32) -> np.ndarray:
    """x = (i + off) / sf - off in f32."""
    return (np.arange(n_out).astype(np.float32) + off) / sf - off


def _linear_weights(n_out: int, n_in: int, sf, off) -> np.ndarray:
    """(n_out, n_in) matrix of ggml's bilinear taps along one dim: (1 - dx) at x0, dx at x0 + 1, clamped."""
    x = _src_coord(n_out, sf, off)
    x0 = np.floor(x).astype(np.int64)
    i0, i1 = np.clip(x0, 0, n_in - 1), np.clip(x0 + 1, 0, n_in - 1)
    dx = np.clip(x - i0.astype(np.float32), np.float32(0), np.float32(1))
    w = np.zeros((n_out, n_in))
    r = np.arange(n_out)
    np.add.at(w, (r, i0), (np.float32(1) - dx).astype(np.float64))
    np.add.at(w, (r, i1), dx.astype(np.float64))
    return w


def _cubic_weights(n_out: int, n_in: int, sf, off) -> np.ndarray:
    """(n_out, n_in) matrix of ggml's bicubic taps (Keys, a = -0.75, weights in f32), indices clamped."""
    f = np.float32
    A = f(-0.75)
    w1 = lambda t: ((A + f(2)) * t - (A + f(3))) * t * t + f(1)                   # noqa: E731  |t| <= 1
    w2 = lambda t: ((A * t - f(5) * A) * t + f(8) * A) * t - f(4) * A             # noqa: E731  1 < |t| < 2
    x = _src_coord(n_out, sf, off)
    x0 = np.floor(x).astype(np.int64)
    dx = x - x0.astype(np.float32)
    ws = (w2(dx + f(1)), w1(dx), w1(f(1) - dx), w2(f(2) - dx))
    w = np.zeros((n_out, n_in))
    r = np.arange(n_out)
    for off_i, wt in zip((-1, 0, 1, 2), ws):
        np.add.at(w, (r, np.clip(x0 + off_i, 0, n_in - 1)), wt.astype(np.float64))
    return w


def _antialias_weights(n_out: int, n_in: int, sf, off) -> np.ndarray:
    """(n_out, n_in) triangle-filter weights of ggml's antialiased bilinear along one dim (f32, unnormalised:
    ggml normalises by the 2-D total, which is the product of the two 1-D totals only up to rounding)."""
    f = np.float32
    support = max(f(1), f(1) / sf)
    inv = f(1) / support
    x = (np.arange(n_out).astype(f) + off) / sf
    lo = np.maximum((x - support + off).astype(np.int64), 0)
    hi = np.minimum((x + support + off).astype(np.int64), n_in)
    s = np.arange(n_in)
    t = (s[None, :].astype(f) - x[:, None] + off) * inv
    w = np.maximum(f(1) - np.abs(t), f(0))
    inside = (s[None, :] >= lo[:, None]) & (s[None, :] < hi[:, None])
    return np.where(inside, w, f(0)).astype(np.float64)


@op("upscale", covers=("UPSCALE",))
def upscale(a: np.ndarray, scale_factor: int, mode: int = SCALE_MODE_NEAREST) -> np.ndarray:
    """ggml_upscale(ctx, a, scale_factor, mode): interpolate to ne [w*sf, h*sf, c, n] (sf > 1 an integer).

    a    ne [w, h, c, n]          numpy (n, c, h, w)           f32
    out  ne [w*sf, h*sf, c, n]    numpy (n, c, h*sf, w*sf)     f32     (see interpolate for the modes)
    """
    if scale_factor <= 1:
        fail("upscale", f"scale_factor must be > 1, got {scale_factor}", a=a)
    n = ne4(np.shape(a))
    out = interpolate(a, n[0] * scale_factor, n[1] * scale_factor, n[2], n[3], mode)
    return out.reshape(out.shape[4 - max(np.ndim(a), 2):])


@op("timestep_embedding")
def timestep_embedding(timesteps: np.ndarray, dim: int, max_period: int = 10000) -> np.ndarray:
    """ggml_timestep_embedding(ctx, timesteps, dim, max_period): sinusoidal embedding of diffusion timesteps.

    timesteps  ne [N]        numpy (N,)        f32
    out        ne [dim, N]   numpy (N, dim)    f32

        half = dim // 2;  freq_j = exp(-log(max_period) * j / half)
        out[i, j] = cos(t_i * freq_j),  out[i, half + j] = sin(t_i * freq_j)   (j < half);  0 in column 2*half

    Every step in f32 as ggml-cpu (logf, the product with j, the division by half, expf, t*freq), each
    libm function evaluated in f64 and rounded to f32; cos first, then sin, as in ggml (not sin, cos).
    """
    t = np.asarray(timesteps)
    _need("timestep_embedding", "timesteps", t, [np.float32], timesteps=t)
    nt = ne4(t.shape)
    if nt[1] != 1 or nt[2] != 1 or nt[3] != 1 or (t.ndim and t.strides[-1] != t.itemsize and t.size > 1):
        fail("timestep_embedding", "timesteps must be a packed 1-D tensor ne [N] (ggml reads only row 0)",
             timesteps=t)
    f = np.float32
    half = dim // 2
    logp = f(np.log(np.float64(max_period)))
    j = np.arange(half, dtype=f)
    freq = f(1) * np.exp((-logp * j / f(half)).astype(np.float64)).astype(f)
    arg = (t.reshape(-1)[:, None] * freq[None, :]).astype(np.float64)
    out = np.zeros((nt[0], dim), f)
    out[:, :half] = np.cos(arg).astype(f)
    out[:, half:2 * half] = np.sin(arg).astype(f)
    return out


@op("upscale_ext", covers=("UPSCALE",))
def upscale_ext(a: np.ndarray, ne0: int, ne1: int, ne2: int, ne3: int, mode: int = SCALE_MODE_NEAREST) -> np.ndarray:
    """ggml_upscale_ext(ctx, a, ne0, ne1, ne2, ne3, mode): the older name of interpolate (same op, same result)."""
    return interpolate(a, ne0, ne1, ne2, ne3, mode)
