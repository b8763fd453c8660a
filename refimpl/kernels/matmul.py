"""mul_mat with Numba: any weight type, never materialising a dequantized weight matrix.

Versions (exact numerics; numerics="ggml" and every case below not covered run the NumPy reference):
    decode   (<= DECODE_ROWS rows of b per weight matrix)  `_gemv_<type>`: a thread per range of weight
             rows; rows decoded eight at a time into an L1-sized f32 buffer (`quants._dq_<type>`, the
             bits of refimpl.dequantize), each dotted with every row of b in f64 -- LANES f64 partial
             sums, rounded once to f32. The reference sums the same exact f64 products with BLAS, in BLAS's
             order: results agree to the f64 rounding of the sum, i.e. identical f32 but where that
             rounding straddles an f32 rounding boundary (NMSE ~1e-30; tolerance ("mul_mat", "*", "property")).
    prefill  (more rows)  the reference's own computation -- TILE_ROWS weight rows at a time as f64, one
             BLAS `b @ w.T` per tile -- with the tile decoded by the Numba decoders in threads
             (`quants.dequantize_into`). Identical bits to the reference.

Weights: a QTensor of any type with a CPU vec_dot (`GEMV`), or an f32 / f16 ndarray; b: f32
with packed rows (anything else, e.g. b already in the weight's vec_dot type, goes to the reference).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..ops import matmul as ref_mm
from ..ops._core import current_numerics, register
from ..ops._shapes import ne4
from ..qtensor import QTensor
from ..types import GGMLType, traits
from . import quants
from ._common import parallel_ranges

DECODE_ROWS = 8          # rows of b up to which the fused decode-dot path runs
GEMV_MIN_MACS = 1 << 18  # multiply-adds per thread at least
LANES = 32               # f64 partial sums of the decode dot products


@njit(inline="always")
def _dot_f64(x, y, k, acc):
    """Σ f64(x[i]) * y[i] over i < k (x f32, y f64): LANES partial sums (acc, scratch), lane l taking
    i = l, l + LANES, ... in order, then added in lane order -- every product exact, the sum one of the
    f64 orders BLAS might use."""
    L = acc.size
    for l in range(L):
        acc[l] = 0.0
    nfull = k // L
    for c in range(nfull):
        base = c * L
        for l in range(L):
            acc[l] = acc[l] + np.float64(x[base + l]) * y[base + l]
    s = 0.0
    for l in range(L):
        s += acc[l]
    for i in range(nfull * L, k):
        s += np.float64(x[i]) * y[i]
    return s


@njit(inline="always")
def _gemv(dq, W2, nb, B, out, lo, hi, T):
    """out[j, r] = f32(Σ_k w_r[k] * B[j, k]) for weight rows r in lo..hi-1: W2 (n*nb, type_size) uint8
    blocks (row r = blocks r*nb .. r*nb+nb-1), B (M, k) f64, out (M, n) f32. Rows are decoded eight at
    a time by dq (a `quants._dq_<type>`) into an L1-sized f32 buffer, each then dotted with every row
    of B. Inlined into one small function per type (`GEMV`), so that each compiles on its own."""
    k = B.shape[1]
    G = 8
    buf = np.empty((G * nb, k // nb), np.float32)
    flat = buf.reshape(G * k)
    acc = np.empty(LANES, np.float64)
    for r0 in range(lo, hi, G):
        g = min(G, hi - r0)
        dq(W2[r0 * nb:(r0 + g) * nb], buf, 0, g * nb, T)
        for q in range(g):
            row = flat[q * k:(q + 1) * k]
            for j in range(B.shape[0]):
                out[j, r0 + q] = np.float32(_dot_f64(row, B[j], k, acc))


@njit(cache=True, nogil=True)
def _gemv_f16(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_f16, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_bf16(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_bf16, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_q4_0(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_q4_0, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_q4_1(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_q4_1, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_q5_0(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_q5_0, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_q5_1(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_q5_1, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_q8_0(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_q8_0, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_q1_0(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_q1_0, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_q2_K(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_q2_K, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_q3_K(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_q3_K, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_q4_K(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_q4_K, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_q5_K(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_q5_K, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_q6_K(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_q6_K, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_iq2_xxs(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_iq2_xxs, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_iq2_xs(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_iq2_xs, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_iq2_s(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_iq2_s, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_iq3_xxs(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_iq3_xxs, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_iq3_s(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_iq3_s, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_iq1_s(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_iq1_s, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_iq1_m(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_iq1_m, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_iq4_nl(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_iq4_nl, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_iq4_xs(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_iq4_xs, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_tq1_0(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_tq1_0, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_tq2_0(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_tq2_0, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_mxfp4(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_mxfp4, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_nvfp4(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_nvfp4, W2, nb, B, out, lo, hi, T)


@njit(cache=True, nogil=True)
def _gemv_f32(W, B, out, lo, hi):
    """_gemv for f32 weight rows W (n, k)."""
    k = B.shape[1]
    acc = np.empty(LANES, np.float64)
    for r in range(lo, hi):
        w = W[r]
        for j in range(B.shape[0]):
            out[j, r] = np.float32(_dot_f64(w, B[j], k, acc))


GEMV = {int(GGMLType[n.upper()]): globals()[f"_gemv_{n}"] for n in (
    "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q1_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq2_xxs",
    "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m", "iq4_nl", "iq4_xs", "tq1_0", "tq2_0", "mxfp4", "nvfp4")}


def _weights(a):
    """(tid, blocks (rows..., nb, type_size) uint8) of a weight, or (None, the f32 array) for f32 weights.
    A QTensor whose rows are not adjacent in memory (a strided view) has its bytes copied, still encoded."""
    if isinstance(a, QTensor):
        tr = traits(a.type)
        data = np.ascontiguousarray(a.data)
        return int(a.type), data.reshape(a.shape[:-1] + (a.shape[-1] // tr.blck_size, tr.type_size))
    if a.dtype == np.float16:
        return int(GGMLType.F16), np.ascontiguousarray(a).view(np.uint8).reshape(a.shape + (2,))
    return None, np.ascontiguousarray(a)


def _covered(a, b) -> bool:
    """The inputs this kernel computes: the reference's checks all pass (so it would not raise), b f32."""
    if isinstance(b, QTensor) or b.dtype != np.float32 or b.ndim > 4 or not ref_mm._rows_packed(b):
        return False
    if isinstance(a, QTensor):
        if a.type not in ref_mm.VEC_DOT_TYPE or int(a.type) not in GEMV:
            return False
    elif not isinstance(a, np.ndarray) or a.dtype not in (np.float32, np.float16):
        return False
    if a.ndim > 4 or ref_mm._transposed(a) or not ref_mm._rows_packed(a):
        return False
    na, nb = ne4(a.shape), ne4(b.shape)
    return (na[0] == nb[0] and na[0] > 0 and min(na) > 0 and min(nb) > 0
            and nb[2] % na[2] == 0 and nb[3] % na[3] == 0)


@register("mul_mat", backend="numba")
def mul_mat(a, b, *, numerics: str | None = None) -> np.ndarray:
    """ggml_mul_mat(ctx, a, b) (see refimpl.ops.matmul.mul_mat): decode path fused per weight row, prefill
    path the reference's f64 BLAS tiles with Numba-decoded weights."""
    if not isinstance(b, QTensor):
        b = np.asarray(b)
    if not isinstance(a, QTensor):
        a = np.asarray(a)
    if current_numerics(numerics) != "exact" or not _covered(a, b):
        return ref_mm.mul_mat.reference(a, b, numerics=numerics)
    na, nb = ne4(a.shape), ne4(b.shape)
    tid, W = _weights(a)
    W = W.reshape((na[3], na[2], na[1]) + W.shape[-2:] if tid is not None else (na[3], na[2], na[1], na[0]))
    b4 = b.reshape(nb[::-1])
    r2, r3 = nb[2] // na[2], nb[3] // na[3]
    n, k = na[1], na[0]
    T = quants.tables()
    out = np.empty((nb[3], nb[2], nb[1], n), np.float32)
    for i3 in range(na[3]):
        for i2 in range(na[2]):
            bs = b4[i3 * r3:(i3 + 1) * r3, i2 * r2:(i2 + 1) * r2]                # (r3, r2, m, k)
            o = out[i3 * r3:(i3 + 1) * r3, i2 * r2:(i2 + 1) * r2]
            w = W[i3, i2]
            M = r3 * r2 * nb[1]
            if M <= DECODE_ROWS:
                B = np.ascontiguousarray(bs.reshape(M, k), np.float64)
                res = np.empty((M, n), np.float32)
                per = max(1, GEMV_MIN_MACS // (k * M))
                if tid is None:
                    parallel_ranges(lambda lo, hi: _gemv_f32(w, B, res, lo, hi), n, per)
                else:
                    w2, gemv = w.reshape(-1, w.shape[-1]), GEMV[tid]
                    parallel_ranges(lambda lo, hi: gemv(w2, w.shape[1], B, res, lo, hi, T), n, per)
                o[...] = res.reshape(o.shape)
                continue
            bs64 = bs.astype(np.float64)
            w2 = w.reshape(-1, w.shape[-1]) if tid is not None else None
            for lo in range(0, n, ref_mm.TILE_ROWS):
                hi = min(lo + ref_mm.TILE_ROWS, n)
                if tid is None:
                    t32 = w[lo:hi]
                else:                               # the tile's blocks, decoded in threads
                    nbk = w.shape[1]                   # blocks per row
                    blocks = w2[lo * nbk:hi * nbk]
                    t32 = quants.dequantize_into(tid, blocks, np.empty((blocks.shape[0], k // nbk), np.float32))
                o[..., lo:hi] = bs64 @ t32.reshape(hi - lo, k).astype(np.float64).T
    nd = max(len(b.shape), 2)
    return out.reshape(out.shape[4 - nd:])
