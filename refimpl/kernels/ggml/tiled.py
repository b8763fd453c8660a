"""ggml 0.25.3's tiled K-quant and IQ matmul, as llama.cpp's CPU build runs it under numerics="ggml".

ggml 0.25.3's ggml_compute_forward_mul_mat (ggml-cpu/ggml-cpu.c) first offers a product to the tiled kernels of
ggml-cpu/tiled/ (ggml 0.15.3 has none; ggml-python's build, profile "ggml-nollamafile", keeps vec_dot). They take
it when (`takes_tiled`)

    a's type is Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S or IQ1_M,
    b has at least 8 rows (src1->ne[1] >= 8: tokens per batch matrix; MUL_MAT_ID: rows routed to an expert),
    the weights are not in a repacked buffer (llama.cpp's CPU_REPACK; never over RPC), GGML_CPU_TILED_MM unset.

b's rows are converted to Q8_K by the same from_float as vec_dot's. Then, on the AVX2 build (names as in
`mul_mat` below; w the weight's signed integer levels, sc its integer sub-block scales, both as the type's
dequantizer reads them; q the Q8_K codes, d1 their block scale), every output sums over the 256-element blocks
in order, in f32:

    s1  = sum_s sc_s * sum_e w_e q_e                       exact integer (int32 lanes, maddubs pairs fit i16)
    s2  = sum_s min_s * bsum_s                              exact integer, types with mins (Q2_K, Q4_K, Q5_K)
    res = fl(d0 * f32(s1))                                  d0 the block's d (IQ types: d * 1/8 or 1/4, exact)
    res = fma(-dmin, f32(s2), res)                          types with mins
    acc = fma(res, d1, acc)

The integer part does not depend on the tile shapes (the narrow path for <= 16 rows and the 16x16 microtiles
give the same sums), so neither does the result, nor on the thread count. One exception to exactness: IQ4_XS
multiplies |w| by _mm256_sign_epi8(q, w), which leaves q = -128 negative where w < 0 (vecdot.sign_quirk), as
its vec_dot does. The other IQ types and Q3_K/Q6_K bias the activations by +128 instead and subtract the bias
exactly (tiled_repack_src0's correction), so their sums are the true ones.

    mul_mat(a, b)   a ne [k, n, a2, a3]  numpy (a3, a2, n, k)   QTensor of a TILED type (else NotImplemented)
                    b ne [k, m, b2, b3]  numpy (b3, b2, m, k)   f32 (or Q8_K), m >= 8
                    out ne [n, m, b2, b3] numpy (b3, b2, m, n)  f32
"""
from __future__ import annotations

import numpy as np

from ...qtensor import QTensor
from ...rounding import fma32
from ...types import GGMLType, type_traits
from . import matmul as _mm
from .vecdot import sign_quirk

f32 = np.float32
MIN_ROWS = 8               # ggml_tiled_min_batch: profitable from 8 rows of b (GGML_CPU_TILED_MM_FORCE aside)
_STEP = 1 << 22            # weight rows x activation rows x blocks per step (bounds the f64 temporaries)


def _per_element(sc: np.ndarray, subblk: int) -> np.ndarray:
    """(n, nblk, 256 // subblk) sub-block scales -> (n, nblk, 256), one per element."""
    return np.repeat(sc, subblk, axis=-1)


def _q2_K(blk):
    q, sc, mn, d, dmin = _mm._q2_K(blk)
    return q, _per_element(sc, 16), mn, 16, d, dmin


def _q3_K(blk):
    q, sc, d = _mm._q3_K(blk)
    return q, _per_element(sc, 16), None, 16, d, None


def _q4_K(blk):
    q, sc, mn, d, dmin = _mm._q4_K(blk)
    return q, _per_element(sc, 32), mn, 32, d, dmin


def _q5_K(blk):
    q, sc, mn, d, dmin = _mm._q5_K(blk)
    return q, _per_element(sc, 32), mn, 32, d, dmin


def _q6_K(blk):
    u, sc, d = _mm._q6_K(blk)
    return u - 32, _per_element(sc, 16), None, 16, d, None


def _iq4_xs(blk):
    x, ls, d = _mm._iq4_xs(blk)
    return x, _per_element(ls, 32), None, 32, d, None


def _grid(fields):
    """IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S: signed grid levels and odd scales per element; the tile's d is
    d * factor (exact: a power of two)."""
    def read(blk):
        x, sc, d, factor = fields(blk)
        n, nb = blk.shape[:2]
        return x.reshape(n, nb, 256), np.broadcast_to(sc, x.shape).reshape(n, nb, 256), None, 32, d * f32(factor), None
    return read


def _iq1_s(blk):
    """block_iq1_s: levels 8*grid + delta (delta -1 where bit 15 of qh[g] is set, else +1), scale 2*((qh >> 12) & 7)
    + 1 per 32, tile d = d/8 (tiled_unpack_src0 for block_iq1_s)."""
    grid, sign, ls, d = _mm._iq1_s(blk)
    n, nb = blk.shape[:2]
    w = (8 * grid + sign[..., None, None]).reshape(n, nb, 256)
    return w, _per_element(ls, 32), None, 32, d * f32(0.125), None


def _iq1_m(blk):
    """block_iq1_m: levels 8*grid + delta (per 8 elements), 3-bit odd scale per 16 (the kernel reads one per 16:
    the per-8 scales of matmul._iq1_m pair up), tile d = d/8."""
    grid, delta, sc, d = _mm._iq1_m(blk)
    n, nb = blk.shape[:2]
    w = (8 * grid + delta[..., None]).reshape(n, nb, 256)
    return w, _per_element(sc.reshape(n, nb, 32), 8), None, 16, d * f32(0.125), None


# type -> field reader: (w (n, nblk, 256) signed levels, sc (n, nblk, 256) per-element integer scales,
# mins (n, nblk, 256 // subblk) or None, subblk, d0 (n, nblk) f32, dmin (n, nblk) f32 or None)
TILED = {
    GGMLType.Q2_K: _q2_K, GGMLType.Q3_K: _q3_K, GGMLType.Q4_K: _q4_K, GGMLType.Q5_K: _q5_K,
    GGMLType.Q6_K: _q6_K, GGMLType.IQ4_XS: _iq4_xs,
    GGMLType.IQ2_XXS: _grid(_mm._iq2_xxs), GGMLType.IQ2_XS: _grid(_mm._iq2_xs), GGMLType.IQ2_S: _grid(_mm._iq2_s),
    GGMLType.IQ3_XXS: _grid(_mm._iq3_xxs), GGMLType.IQ3_S: _grid(_mm._iq3_s),
    GGMLType.IQ1_S: _iq1_s, GGMLType.IQ1_M: _iq1_m,
}
SIGN_TRICK = (GGMLType.IQ4_XS,)     # |w| * sign(q, w) (the +-128 quirk); the others bias q by +128 exactly


def _products(t: GGMLType, W: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """The tiled kernel's outputs for weight blocks W (n, nblk, type_size) and Q8_K activation blocks
    Y (m, nblk, 292): (m, n) f32."""
    w, sc, mins, subblk, d0, dmin = TILED[t](W)
    dy, q, bsums = _mm._q8_K(Y)
    n, nblk = w.shape[:2]
    m = q.shape[0]
    q = q.reshape(m, nblk, 256)
    X = (w * sc).astype(np.float64)                                                # (n, nblk, 256)
    fix = None
    if t in SIGN_TRICK:
        quirk = sign_quirk(w.reshape(n, -1), q.reshape(m, -1))
        if quirk is not None:
            fix = ((quirk[0] * sc.reshape(n, -1)).reshape(n, nblk, 256).astype(np.float64),
                   quirk[1].reshape(m, nblk, 256).astype(np.float64))
    if mins is not None:
        B = bsums.reshape(m, nblk, -1, subblk // 16).sum(-1).astype(np.float64)  # (m, nblk, 256 // subblk)
        mins = mins.astype(np.float64)
    acc = np.zeros((n, m), f32)
    Qf = q.astype(np.float64)
    for b in range(nblk):
        s1 = X[:, b] @ Qf[:, b].T                                                  # exact: |s1| < 2^31
        if fix is not None:
            s1 += fix[0][:, b] @ fix[1][:, b].T
        res = d0[:, b][:, None] * s1.astype(f32)
        if mins is not None:
            s2 = mins[:, b] @ B[:, b].T
            res = fma32(-dmin[:, b][:, None], s2.astype(f32), res)
        acc = fma32(res, dy[:, b][None, :], acc)
    return acc.T


def _dots(t: GGMLType, w, y) -> np.ndarray:
    """(rows of y, rows of w) f32 for a 2-D weight slice w and Q8_K activation rows y, in bounded steps."""
    ts = type_traits[t].type_size
    W, Y = _mm._blocks(_mm._rows(w), ts), _mm._blocks(_mm._rows(y), type_traits[GGMLType.Q8_K].type_size)
    n, m, nblk = W.shape[0], Y.shape[0], W.shape[1]
    out = np.empty((m, n), f32)
    if n == 0 or m == 0:
        return out
    nt = max(1, min(n, _STEP // max(1, m * nblk * 256 // 64)))
    for i in range(0, n, nt):
        out[:, i:i + nt] = _products(t, W[i:i + nt], Y)
    return out


def takes_tiled(a, b) -> bool:
    """Whether ggml 0.25.3's CPU backend multiplies a by b in its tiled kernels (module docstring)."""
    return (isinstance(a, QTensor) and GGMLType(a.type) in TILED and len(b.shape) >= 2
            and b.shape[-2] >= MIN_ROWS)


def mul_mat(a, b):
    """The tiled kernels' order where ggml 0.25.3 takes them (module docstring), registered for the "tiled"
    key of the "ggml" profile; NotImplemented elsewhere (llamafile's, then vec_dot's emulation run)."""
    if not takes_tiled(a, b):
        return NotImplemented
    return _mm.mul_mat(a, b, dots=_dots)          # b to Q8_K (the same vec_dot_type), ggml's broadcast


def mul_mat_id(as_, b, ids):
    """ggml 0.25.3's mul_mat_id: each expert's routed rows go to the tiled kernels when there are >= 8 of them
    and its type is TILED, else to vec_dot (matmul.py), as ggml_compute_forward_mul_mat_id decides per expert.

    as_ (n_expert, n, k), b (n_tokens, n_b, k), ids (n_tokens, n_used) i32 -> (n_tokens, n_used, n) f32."""
    if not (isinstance(as_, QTensor) and GGMLType(as_.type) in TILED):
        return NotImplemented
    n_tok, n_used = ids.shape[-2], ids.shape[-1]
    _, counts = np.unique(np.asarray(ids).reshape(n_tok, n_used), return_counts=True)
    if counts.max(initial=0) < MIN_ROWS:
        return NotImplemented                                   # every expert takes vec_dot
    return _mm.mul_mat_id(as_, b, ids, dots=_expert_dots)


def _expert_dots(t, w, rows):
    """One expert: the tiled kernels for >= MIN_ROWS routed rows, else vec_dot."""
    return (_dots if rows.shape[0] >= MIN_ROWS else _mm._dots)(t, w, rows)
