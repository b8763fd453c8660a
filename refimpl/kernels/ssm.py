"""ssm_scan (Mamba's selective scan) with Numba: the reference's recurrence, one (sequence, head) per work item.

Versions:
    _scan  per token: xdt = fl(x[p]*d); h[p, n] = fl(fl(h[p, n]*dA[n or 0]) + fl(B[n]*xdt)); then
           Mamba-1 (A.ne0 = d_state): y[p] = fl(... fl(0 + fl(h[p, 0]*C[0])) + ...) in n order, f32;
           Mamba-2 (A.ne0 = 1): y[p] = fl(Σ_n f64(h[p, n]) * f64(C[n])) by NumPy's pairwise order --
           every f32 operation of refimpl.ops.recurrent.ssm_scan, in its order (identical bits)
The token-wise softplus d = softplus(dt) and decay dA = expf(fl(d*A)) depend on dt and A only: they are
computed up front by the reference's own NumPy helpers (the same exp and log), so the kernel only runs the
state recurrence. Work items (n_seqs * n_head) are split over threads; inputs the reference would reject
(or with an empty dimension) run the reference, which raises its errors.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..ops import recurrent as ref_rc
from ..dispatch import register
from ..rounding import expf_f32
from ..shapes import ne4
from ._common import pairwise_sum_f64, parallel_ranges

PAR_MIN = 1 << 16       # state updates (n_seq_tokens * head_dim * d_state) per thread at least


@njit(cache=True, nogil=True, error_model="numpy")
def _scan(s0, ids, x, d, dA, B, C, y, st, lo, hi):
    """Items lo..hi-1 = (sequence q, head e): s0 (n_rs, H, P, N); x (n_seqs, T, H, P); d (n_seqs, T, H);
    dA (n_seqs, T, H, 1 or N); B, C (n_seqs, T, G, N); y like x; st (n_seqs, H, P, N); all f32."""
    H, P, NS = s0.shape[1], s0.shape[2], s0.shape[3]
    T, G = x.shape[1], B.shape[2]
    rep = H // G
    mamba1 = dA.shape[3] != 1
    h = np.empty((P, NS), np.float32)
    prod = np.empty(NS, np.float64)
    for item in range(lo, hi):
        q = item // H
        e = item % H
        g = e // rep
        h[:, :] = s0[ids[q], e]
        for t in range(T):
            dt = d[q, t, e]
            da = dA[q, t, e]
            b = B[q, t, g]
            c = C[q, t, g]
            for p in range(P):
                xdt = x[q, t, e, p] * dt
                hp = h[p]
                for n in range(NS):
                    hp[n] = hp[n] * da[n if mamba1 else 0] + b[n] * xdt
                if mamba1:
                    acc = np.float32(0.0)
                    for n in range(NS):
                        acc = acc + hp[n] * c[n]
                    y[q, t, e, p] = acc
                else:
                    for n in range(NS):
                        prod[n] = np.float64(hp[n]) * np.float64(c[n])
                    y[q, t, e, p] = np.float32(pairwise_sum_f64(prod, 0, NS))
        st[q, e] = h


def _dims(s, x, dt, A, B, C, ids):
    """(d_state, head_dim, n_head, n_tok, n_seqs, n_group, A.ne0) when the reference accepts the operands and
    no dimension is empty, else None."""
    if not (all(isinstance(v, np.ndarray) and v.dtype == np.float32 and v.ndim <= 4 for v in (s, x, dt, A, B, C))
            and isinstance(ids, np.ndarray) and ids.dtype == np.int32 and ids.ndim <= 4):
        return None
    nS, nX, nD, nA, nB, nI = (ne4(v.shape) for v in (s, x, dt, A, B, ids))
    d_state, head_dim, n_head, n_tok, n_seqs = nS[0], nX[0], nX[1], nX[2], nX[3]
    n_group = nB[1]
    if (0 in nS or 0 in nX or 0 in nB or nD != [n_head, n_tok, n_seqs, 1] or nS[1:3] != [head_dim, n_head]
            or nB != [d_state, n_group, n_tok, n_seqs] or ne4(C.shape) != nB or nI != [n_seqs, 1, 1, 1]
            or nA[1:] != [n_head, 1, 1] or nA[0] not in (1, d_state) or n_head % n_group
            or ids.min() < 0 or ids.max() >= nS[3]):
        return None
    return d_state, head_dim, n_head, n_tok, n_seqs, n_group, nA[0]


@register("ssm_scan", backend="numba")
def ssm_scan(s, x, dt, A, B, C, ids, K: int = 1) -> np.ndarray:
    """ggml_ssm_scan (see refimpl.ops.recurrent.ssm_scan) in Numba; rollback snapshots (K > 1) by the
    reference."""
    if K != 1:
        return NotImplemented
    args = [np.asarray(v) for v in (s, x, dt, A, B, C, ids)]
    dims = _dims(*args)
    if dims is None:
        return ref_rc.ssm_scan.reference(*args)
    s, x, dt, A, B, C, ids = args
    d_state, head_dim, n_head, n_tok, n_seqs, n_group, na0 = dims
    cont = np.ascontiguousarray
    d = cont(ref_rc.softplus_f32(dt.reshape(n_seqs, n_tok, n_head)))                   # (n_seqs, n_tok, n_head)
    dA = cont(expf_f32(d[..., None] * A.reshape(n_head, na0)))                # (n_seqs, n_tok, n_head, na0)
    s0 = cont(s.reshape(-1, n_head, head_dim, d_state))
    x4 = cont(x.reshape(n_seqs, n_tok, n_head, head_dim))
    B4, C4 = (cont(v.reshape(n_seqs, n_tok, n_group, d_state)) for v in (B, C))
    y = np.empty((n_seqs, n_tok, n_head, head_dim), np.float32)
    st = np.empty((n_seqs, n_head, head_dim, d_state), np.float32)
    ids1 = cont(ids.reshape(-1))
    per = max(1, PAR_MIN // (n_tok * head_dim * d_state))
    parallel_ranges(lambda lo, hi: _scan(s0, ids1, x4, d, dA, B4, C4, y, st, lo, hi), n_seqs * n_head, per)
    return np.concatenate([y.reshape(-1), st.reshape(-1)])
