"""flash_attn_ext with Numba: exact-mode attention four query rows at a time, no (n_tokens, n_kv) score matrix.

Versions:
    _attn  per (sequence, head, block of ROWS64 = 4 query rows): each row's n_kv scores in f64 (q.k summed
           over head_dim in index order from exact f32 x f32 products, then scale or c*tanh(raw*fl(scale/c)),
           then + slope*mask), M = NaN-propagating max with the sink, e = exp(s - M) (0 where s = -inf), Σe
           in f64 by NumPy's pairwise order plus the sink's term, o = Σ_j e_j v_j in f64 in kv order (each
           product rounded, then added); out = fl(o / Σ), 0 where Σ is not > 0 -- the reference's f64
           formula, in a different summation order for the two dot products
    mha_fast  numerics="fast": llama.cpp's attention without flash attention (kq, soft_max_ext, kqv) for
           refimpl.models.bert, one (sequence, head) pair at a time: kq and kqv f32 sums in index order,
           the softmax through softmax.soft_max_row (the op kernel's steps and bits); mha_fast_qkv the
           same on the planes of one fused Q/K/V product
Work items (sequence, head, row block) are split over threads. Both products run in vector registers for
the block's rows together (simd.vqk64_4x16, simd.vpv64_4x16), so that each vector of K or V is loaded and
widened once for four rows: K is handed over transposed in tiles of LANES kv positions (head_dim rows of
LANES values, the last tile padded with zeros), one independent f64 sum per kv position (vectorised without
reassociating any sum); V's rows are read a CHUNK at a time over its dims (that chunk stays in cache). A
tile whose mask is all -inf for every row of the block is skipped when q and K are finite (the reference's
score there is -inf too), and a kv position whose e is 0 for every row adds nothing to o when V is finite.
Measured on 400 drawn cases (GQA, masks, ALiBi, soft-capping, sinks, inf and NaN, every remainder): the
bits of the one-row-at-a-time version this replaced.

Numerics: the reference sums q.k with np.einsum, whose SIMD lanes (those of NumPy's build) accumulate in
another order than index order, and evaluates exp and tanh with NumPy's routines where this uses libm: the
f64 scores differ in their last bits, so an f32 output can differ by an ulp where that straddles an f32
rounding boundary (about 2^-29 of outputs per f64 ulp). Judged element by element by the tolerance table's
("flash_attn_ext", "f32", "f64-kernel") bound; measured: identical bits in every one of 716 cases (5.2M
outputs: the op's cases, named cases and tests/kernels/test_attention_ssm.py's draws). Inputs the reference
would reject run the reference, which raises its errors; every K/V kind it takes is covered (QTensors
dequantized as there).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .. import ops
from ..ops import attention as ref_at
from ..dispatch import register
from ..shapes import ne4
from ..ops.softmax import alibi_slopes
from ..qtensor import QTensor, dequantize
from ._common import pairwise_sum_f64, parallel_ranges
from . import simd
from .softmax import row_max, row_normalize, row_scores
from .vexp import exp32_into

PAR_MIN = 1 << 16       # multiply-adds (n_kv * (head_dim + head_dim_v) per query row) per thread at least
LANES = 16              # kv positions per score vector (and per check of the mask for a skip), dims per o vector
CHUNK = 256             # kv positions of V per pass over its dims


@njit(inline="always")
def _all_neg_inf(m):
    for i in range(m.shape[0]):
        if m[i] != -np.inf:
            return False
    return True


@njit(cache=True, nogil=True, error_model="numpy")
def _softmax_weights(srow, has_sink, sink):
    """srow <- e_j = exp(s_j - M) (0 where s_j = -inf); returns Σe (+ the sink's term), the reference's way:
    M = max(max_j s_j, sink), NaN if any is NaN, taken as 0 unless finite."""
    NKV = srow.shape[0]
    M = -np.inf
    nan = False
    for j in range(NKV):
        x = srow[j]
        if x != x:
            nan = True
        elif x > M:
            M = x
    if has_sink:
        if sink != sink:
            nan = True
        elif sink > M:
            M = sink
    Ms = M if (not nan and np.isfinite(M)) else 0.0
    for j in range(NKV):
        x = srow[j]
        srow[j] = 0.0 if x == -np.inf else np.exp(x - Ms)
    total = pairwise_sum_f64(srow, 0, NKV)
    if has_sink:
        total = total + np.exp(sink - Ms)
    return total


@njit(inline="always")
def _finish(a, scale, c, csc, has_mask, slope, m):
    """The reference's score from the raw f64 dot a: scale (or soft-capping), then + slope * mask."""
    x = c * np.tanh(a * csc) if c != 0.0 else a * scale
    if has_mask:
        x = x + slope * np.float64(m)
    return x


@njit(cache=True, nogil=True, error_model="numpy")
def _attn(q, kt, v, mask, has_mask, slopes, sinks, has_sinks, scale, c, csc, skip_k, skip_v, out, lo, hi):
    """Items lo..hi-1 = (s, h, b) in C order, b a block of R = simd.ROWS64 query rows (the last may be shorter):
    q (S, H, N, DK), kt (S, HK, NT, DK, LANES) (K^T in tiles of LANES kv positions, the last padded with 0),
    v (S, HV, NKV, DV) f32 C-contiguous; mask (m3, m2, Nm, NKV) f32
    tiled over s, h and rows; slopes (H,) f64; sinks (H,) f64; out (S, N, H, DV) f32."""
    H, N, DK = q.shape[1], q.shape[2], q.shape[3]
    NKV, DV = v.shape[2], v.shape[3]
    HK, HV, NT = kt.shape[1], v.shape[1], kt.shape[2]
    rk, rv = H // HK, H // HV
    m3, m2, mn = mask.shape[0], mask.shape[1], mask.shape[2]
    R = simd.ROWS64
    NB = (N + R - 1) // R
    DV16 = DV - DV % LANES
    qf, ktf, vf = q.reshape(-1), kt.reshape(-1), v.reshape(-1)
    srow = np.empty((R, NKV), np.float64)
    sf = srow.reshape(-1)
    acc = np.empty((R, LANES), np.float64)
    o = np.zeros((R, DV), np.float64)
    of = o.reshape(-1)
    live = np.empty(NKV, np.intp)
    total = np.empty(R, np.float64)
    for item in range(lo, hi):
        b = item % NB
        h = (item // NB) % H
        s = item // (NB * H)
        n0 = b * R
        nr = min(R, N - n0)
        q0 = ((s * H + h) * N + n0) * DK
        k0 = (s * HK + h // rk) * NT * DK * LANES
        v0 = (s * HV + h // rv) * NKV * DV
        slope = slopes[h]
        mk = mask[s % m3, h % m2]
        # scores: a tile of LANES kv positions of every row of the block at a time, in registers
        for j0 in range(0, NKV, LANES):
            m = min(LANES, NKV - j0)
            if has_mask and skip_k:
                dead = True
                for r in range(nr):
                    if not _all_neg_inf(mk[(n0 + r) % mn, j0:j0 + m]):
                        dead = False
                        break
                if dead:
                    srow[:nr, j0:j0 + m] = -np.inf
                    continue
            t0 = k0 + (j0 // LANES) * DK * LANES
            if nr == R:
                simd.vqk64_4x16(qf, q0, DK, DK, ktf, t0, LANES, acc, 0, LANES)
            else:
                for r in range(nr):
                    simd.vqk64_1x16(qf, q0 + r * DK, DK, DK, ktf, t0, LANES, acc, r * LANES, LANES)
            for r in range(nr):
                mrow = mk[(n0 + r) % mn]
                for i in range(m):
                    srow[r, j0 + i] = _finish(acc[r, i], scale, c, csc, has_mask, slope, mrow[j0 + i])
        for r in range(nr):
            total[r] = _softmax_weights(srow[r], has_sinks, sinks[h])
        # o = sum_j e_j v_j in kv order over the positions where some row's e is not 0 (a 0 adds nothing to
        # a sum from +0 when V is finite; otherwise every position counts, as 0 * inf is NaN)
        nl = 0
        for j in range(NKV):
            keep = not skip_v
            for r in range(nr):
                if srow[r, j] != 0.0:
                    keep = True
                    break
            if keep:
                live[nl] = j
                nl += 1
        o[:, :] = 0.0
        for c0 in range(0, nl, CHUNK):      # V's rows a chunk at a time (kept in cache over the dims)
            nc = min(CHUNK, nl - c0)
            for d0 in range(0, DV16, LANES):
                if nr == R:
                    simd.vpv64_4x16(sf, 0, NKV, live, c0, nc, vf, v0 + d0, DV, of, d0, DV)
                else:
                    for r in range(nr):
                        simd.vpv64_1x16(sf, r * NKV, NKV, live, c0, nc, vf, v0 + d0, DV, of, r * DV + d0, DV)
        for r in range(nr):
            for d in range(DV16, DV):
                a = 0.0
                for t in range(nl):
                    j = live[t]
                    a += srow[r, j] * np.float64(vf[v0 + j * DV + d])
                o[r, d] = a
            dst = out[s, n0 + r, h]
            t_r = total[r]
            for d in range(DV):
                dst[d] = np.float32(o[r, d] / t_r) if t_r > 0.0 else np.float32(0.0)


def _kv_ok(x) -> bool:
    """A K or V operand the reference accepts: a QTensor of a K/V type, or f32/f16 with contiguous rows."""
    if isinstance(x, QTensor):
        return x.type not in ref_at.NOT_KV and len(x.shape) <= 4
    return (isinstance(x, np.ndarray) and x.dtype in (np.float32, np.float16) and x.ndim <= 4
            and not (x.size and x.shape[-1] > 1 and x.strides[-1] != x.itemsize))


def _dims(q, k, v, mask, max_bias, sinks):
    """(nq, nk, nv, nm) in ggml order when the reference accepts the operands and none is empty, else None."""
    if not (isinstance(q, np.ndarray) and q.dtype == np.float32 and 1 <= q.ndim <= 4 and q.size
            and not (q.shape[-1] > 1 and q.strides[-1] != q.itemsize) and _kv_ok(k) and _kv_ok(v)):
        return None
    nq, nk, nv = ne4(q.shape), ne4(k.shape), ne4(v.shape)
    DK, N, H, S = nq
    if 0 in nk or 0 in nv or nk[0] != DK or H % nk[2] or nk[3] != S or nv[3] != S or nv[1] != nk[1] or H % nv[2]:
        return None
    nm = None
    if mask is not None:
        if not (isinstance(mask, np.ndarray) and mask.dtype == np.float16 and mask.ndim <= 4
                and mask.flags.c_contiguous):
            return None
        nm = ne4(mask.shape)
        if 0 in nm or H % nm[2] or S % nm[3] or nm[0] < nk[1] or nm[1] < N:
            return None
    elif max_bias > 0.0:
        return None
    if sinks is not None and not (isinstance(sinks, np.ndarray) and sinks.dtype == np.float32 and sinks.ndim <= 4
                                  and sinks.size == H and ne4(sinks.shape)[0] == H):
        return None
    return nq, nk, nv, nm


def _f32_values(x, shape4) -> np.ndarray:
    """K or V as f32 (S, heads, n_kv, dim): the exact values the reference takes (QTensors dequantized)."""
    if isinstance(x, QTensor):
        x = dequantize(x)
    return x.reshape(shape4).astype(np.float32, copy=False)


@register("flash_attn_ext", backend="numba")
def flash_attn_ext(q, k, v, mask=None, scale: float = 1.0, max_bias: float = 0.0, logit_softcap: float = 0.0,
                   sinks=None) -> np.ndarray:
    """ggml_flash_attn_ext (see refimpl.ops.attention.flash_attn_ext) row by row in Numba."""
    q = np.asarray(q)
    dims = _dims(q, k, v, mask, max_bias, sinks)
    if dims is None:
        return ref_at.flash_attn_ext.reference(q, k, v, mask, scale, max_bias, logit_softcap, sinks)
    nq, nk, nv, nm = dims
    DK, N, H, S = nq
    q4 = np.ascontiguousarray(q.reshape(nq[::-1]))                                   # (S, H, N, DK)
    NT = (nk[1] + LANES - 1) // LANES
    kp = np.zeros((S, nk[2], NT * LANES, DK), np.float32)
    kp[:, :, :nk[1]] = _f32_values(k, nk[::-1])
    kt = np.ascontiguousarray(kp.reshape(S, nk[2], NT, LANES, DK).transpose(0, 1, 2, 4, 3))  # (S, HK, NT, DK, L)
    v4 = np.ascontiguousarray(_f32_values(v, nv[::-1]))                              # (S, HV, NKV, DV)
    if mask is not None:
        m4 = mask.reshape(nm[::-1])[:, :, :N, :nk[1]].astype(np.float32)             # (m3, m2, N, NKV)
    else:
        m4 = np.zeros((1, 1, 1, nk[1]), np.float32)                                 # read, never added
    slopes = alibi_slopes(H, max_bias).astype(np.float64)
    sk = np.zeros(H) if sinks is None else sinks.reshape(-1).astype(np.float64)
    sc = np.float32(scale)
    c = np.float32(logit_softcap)
    csc = np.float64(sc / c) if c != 0 else 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        skip_k = bool(np.isfinite(sc) and np.isfinite(c) and np.isfinite(csc) and np.all(slopes > 0)
                      and np.all(np.isfinite(slopes)) and np.isfinite(q4).all() and np.isfinite(kt).all())
    skip_v = bool(np.isfinite(v4).all())
    out = np.empty((S, N, H, nv[0]), np.float32)
    R = simd.ROWS64
    per = max(1, PAR_MIN // (nk[1] * (DK + nv[0]) * R))
    parallel_ranges(lambda lo, hi: _attn(q4, kt, v4, m4, mask is not None, slopes, sk, sinks is not None,
                                         np.float64(sc), np.float64(c), csc, skip_k, skip_v, out, lo, hi),
                    S * H * ((N + R - 1) // R), per)
    nd = max(q.ndim, 3)
    return out.reshape(out.shape[4 - nd:])


# -- llama.cpp's attention without flash attention, fused: fast numerics -------------------------------------

@njit(cache=True, nogil=True, error_model="numpy")
def _mha_fast(q, iq, k, ik, v, iv, mask, has_mask, scale, out, lo, hi):
    """(sequence, head) pairs lo..hi-1 (item = s * H + h) of q[:, :, iq] (q (S, T, P, H, D)), k[:, :, ik],
    v[:, :, iv] (k, v (S, N, P', H, D)) f32 C-contiguous -- planes of one projection's output or single
    arrays --, mask (m3, m2, >= T, N) f32 tiled over s and h; out (S, T, H, D) f32. Per query row t of the pair:
        kq[j]  = f32 sum over d in index order of fl(q[t, d] * k[j, d])            (starting from +0)
        p      = softmax.soft_max_row(kq, mask row t, slope 1, no sink, scale)    (soft_max_ext's bits)
        out[d] = f32 sum over j in index order of fl(p[j] * v[j, d])              (starting from +0)
    Both sums run in vector registers (simd.vaxpy*): kq 32 (or 16) kv positions at a time over K^T, out 32,
    16 or 8 dims at a time over V's rows; the dims past the last multiple of 8 by the scalar loop. The
    softmax runs soft_max_row's steps on the pair's T rows together (`row_scores`, `row_max`, one
    exp32_into over the (T, NP) block of padded rows, each row's sum and scale), the same operations on
    each element as row by row, with the exps in whole vectors."""
    T, P, H, D = q.shape[1], q.shape[2], q.shape[3], q.shape[4]
    N, PV = k.shape[1], v.shape[2]
    NP = (N + 15) // 16 * 16               # kv positions padded to whole vectors: columns N.. of K^T stay 0
    m3, m2 = mask.shape[0], mask.shape[1]
    kt = np.zeros((D, NP), np.float32)     # K^T of the pair
    sc = np.empty((T, NP), np.float32)     # the pair's scores, then its probabilities
    e = np.empty((T, NP), np.float32)      # soft_max_row's e and p, rows padded with -inf / 0
    e[:, N:] = -np.inf
    pr = np.empty((T, NP), np.float32)
    ldv = PV * H * D                       # elements from V's row j to row j + 1
    D8 = D - D % 8
    for item in range(lo, hi):
        s, h = item // H, item % H
        for j in range(N):
            kj = k[s, j, ik, h]
            for d in range(D):
                kt[d, j] = kj[d]
        for t in range(T):
            q0 = (((s * T + t) * P + iq) * H + h) * D    # q[s, t, iq, h, 0]
            j0 = 0
            while j0 + 32 <= NP:
                simd.vaxpy32(q, q0, D, kt, j0, NP, sc, t * NP + j0)
                j0 += 32
            if j0 < NP:
                simd.vaxpy16(q, q0, D, kt, j0, NP, sc, t * NP + j0)
            et = e[t]
            row_scores(sc[t], mask[s % m3, h % m2, t] if has_mask else et, has_mask, 1.0, scale, et, N)
            M = row_max(et, N)
            for j in range(N):
                et[j] = et[j] - M
        exp32_into(e.reshape(-1), pr.reshape(-1), T * NP, 1.0)
        v0 = ((s * N * PV + iv) * H + h) * D             # v[s, 0, iv, h, 0]
        for t in range(T):
            pt, st = pr[t], sc[t]
            row_normalize(pt, pairwise_sum_f64(pt, 0, N), st, N)
            o0 = ((s * T + t) * H + h) * D               # out[s, t, h, 0]
            d0 = 0
            while d0 + 32 <= D:
                simd.vaxpy32(sc, t * NP, N, v, v0 + d0, ldv, out, o0 + d0)
                d0 += 32
            if d0 + 16 <= D:
                simd.vaxpy16(sc, t * NP, N, v, v0 + d0, ldv, out, o0 + d0)
                d0 += 16
            if d0 < D8:
                simd.vaxpy8(sc, t * NP, N, v, v0 + d0, ldv, out, o0 + d0)
            o = out[s, t, h]
            for d in range(D8, D):
                acc = np.float32(0.0)
                for j in range(N):
                    acc = acc + st[j] * v[s, j, iv, h, d]
                o[d] = acc


def mha_fast(q, k, v, mask, scale: float):
    """llama.cpp's attention without flash attention (build_attn_mha: kq = mul_mat(K, Q), soft_max_ext with
    the mask and scale, kqv = mul_mat(V^T, kq), heads concatenated) in one pass, as numerics="fast" runs
    those ops: q (S, T, H, D), k, v (S, N, H, D) f32 C-contiguous, as the Q/K/V projections come out (no
    head permutations); mask None or f32/f16 C-contiguous (m3, m2, >= T, N) with S % m3 == H % m2 == 0.
    Returns (S, T, H*D) f32, or None for operands it does not cover (the caller runs the ops).

    Both products sum fl32 products in f32 in index order, an order numerics="fast" allows mul_mat (its
    bound, tests/test_numerics_fast.py); soft_max_ext runs exactly the kernel's row steps on those kq
    values, so its result has the op's bits for them. No (S, H, T, N) score array, no head copies."""
    if not all(isinstance(x, np.ndarray) and x.dtype == np.float32 and x.ndim == 4 and x.flags.c_contiguous
               and x.size for x in (q, k, v)):
        return None
    S, T, H, D = q.shape
    if k.shape != v.shape or k.shape[0] != S or k.shape[2:] != (H, D):
        return None
    return _mha(q.reshape(S, T, 1, H, D), 0, k.reshape(S, -1, 1, H, D), 0, v.reshape(S, -1, 1, H, D), 0, mask,
                scale)


def mha_fast_qkv(qkv, mask, scale: float):
    """`mha_fast` on one projection's output: qkv (S, T, 3, H, D) f32 C-contiguous, planes Q, K, V (a fused
    Q/K/V product (S*T, 3*H*D) reshaped): the same results as mha_fast(qkv[:, :, 0], qkv[:, :, 1],
    qkv[:, :, 2]) on contiguous copies, without the copies. None where mha_fast would return None."""
    if not (isinstance(qkv, np.ndarray) and qkv.dtype == np.float32 and qkv.ndim == 5 and qkv.shape[2] == 3
            and qkv.flags.c_contiguous and qkv.size):
        return None
    return _mha(qkv, 0, qkv, 1, qkv, 2, mask, scale)


def _mha(q5, iq, k5, ik, v5, iv, mask, scale: float):
    S, T, _, H, D = q5.shape
    N = k5.shape[1]
    if mask is not None:
        if not (isinstance(mask, np.ndarray) and mask.dtype in (np.float16, np.float32) and mask.ndim == 4
                and mask.flags.c_contiguous):
            return None
        m3, m2, mt, mn = mask.shape
        if mn != N or mt < T or min(m3, m2) < 1 or S % m3 or H % m2:
            return None
        m4 = mask.astype(np.float32, copy=False)
    else:
        m4 = np.zeros((1, 1, 1, 1), np.float32)
    out = np.empty((S, T, H, D), np.float32)
    sc = np.float32(scale)
    per = max(1, PAR_MIN // max(1, T * N * D))
    parallel_ranges(lambda lo, hi: _mha_fast(q5, iq, k5, ik, v5, iv, m4, mask is not None, sc, out, lo, hi),
                    S * H, per)
    return out.reshape(S, T, H * D)


@register("attn_mha", backend="numba", numerics="fast")
def attn_mha(q, k, v, mask, scale):
    """refimpl.ops.fused.attn_mha under numerics="fast": `mha_fast`, or NotImplemented (the ops run)."""
    out = mha_fast(q, k, v, mask, scale)
    return NotImplemented if out is None else out


@register("attn_qkv", backend="numba", numerics="fast")
def attn_qkv(x, wqkv, bqkv, mask, scale, n_head):
    """refimpl.ops.fused.attn_qkv under numerics="fast": one product of the stacked weight (fast mode's
    mul_mat, each output its own weight row's f32 dot), then `mha_fast_qkv` on its planes."""
    S, T, E = x.shape
    n = wqkv.shape[0] // 3
    qkv = ops.mul_mat_add(wqkv, np.asarray(x).reshape(S * T, E), bqkv).reshape(S, T, 3, n_head, n // n_head)
    out = mha_fast_qkv(np.ascontiguousarray(qkv), mask, scale)
    return NotImplemented if out is None else out
