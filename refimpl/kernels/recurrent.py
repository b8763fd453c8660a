"""rwkv_wkv6 and rwkv_wkv7 with Numba: the reference's recurrences, one (sequence, head) per work item.

Versions:
    _wkv6  kv = fl(k[i]*v[j]); temp = fma(kv, u[i], s); out[j] = fma(temp, r[i], out[j]) over i in order;
           s = fma(s, w[i], kv) -- every f32 operation of refimpl.ops.recurrent.rwkv_wkv6 (0 ulp)
    _wkv7  sa[i] = fl(Σ_j s[i][j]*a[j] in f64); s = fma(sa, b[j], fma(s, w[j], fl(v[i]*k[j])));
           out[i] = fl(Σ_j s[i][j]*r[j] in f64)
`fma` is the hardware fused multiply-add (LLVM's llvm.fma: one rounding), what the reference emulates
exactly in f64. wkv7's two f64 sums run in index order where the reference uses NumPy's einsum: the f32
results agree except where their f64 ulp straddles an f32 rounding boundary. Work items (n_seqs * H)
are split over threads; inputs the reference would reject run the reference.
"""
from __future__ import annotations

import numpy as np
from numba import njit
from numba.core import types
from numba.extending import intrinsic

from ..ops import recurrent as ref_rc
from ..dispatch import register
from ..shapes import ne4
from ._common import parallel_ranges

PAR_MIN = 1 << 16       # state updates (tokens * S * S) per thread at least


@intrinsic
def fma(typingctx, a, b, c):
    """a*b + c rounded once (f32)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        return builder.fma(*args)
    return sig, codegen


@njit(cache=True, nogil=True, error_model="numpy")
def _wkv6(k, v, r, u, w, s_in, tps, y, st, lo, hi):
    """Work items lo..hi-1 = (sequence q, head h): k, v, r, w (T, H, S); u (H, S); s_in, st (n_seqs, H, S, S);
    y (T, H, S)."""
    H, S = u.shape
    s = np.empty((S, S), np.float32)
    acc = np.empty(S, np.float32)
    for job in range(lo, hi):
        q = job // H
        h = job % H
        s[:, :] = s_in[q, h]
        for t in range(q * tps, (q + 1) * tps):
            acc[:] = np.float32(0.0)
            for i in range(S):
                ki = k[t, h, i]
                ui = u[h, i]
                ri = r[t, h, i]
                wi = w[t, h, i]
                for j in range(S):
                    kv = ki * v[t, h, j]
                    acc[j] = fma(fma(kv, ui, s[i, j]), ri, acc[j])
                    s[i, j] = fma(s[i, j], wi, kv)
            y[t, h, :] = acc
        st[q, h] = s


@njit(cache=True, nogil=True, error_model="numpy")
def _wkv7(r, w, k, v, a, b, s_in, tps, y, st, lo, hi):
    """As _wkv6 for RWKV-7: r, w, k, v, a, b (T, H, S); state s[i][j] (i = value index)."""
    H, S = r.shape[1], r.shape[2]
    s = np.empty((S, S), np.float32)
    for job in range(lo, hi):
        q = job // H
        h = job % H
        s[:, :] = s_in[q, h]
        for t in range(q * tps, (q + 1) * tps):
            for i in range(S):
                acc = 0.0
                for j in range(S):
                    acc += np.float64(s[i, j]) * np.float64(a[t, h, j])
                sa = np.float32(acc)
                vi = v[t, h, i]
                acc = 0.0
                for j in range(S):
                    x = fma(sa, b[t, h, j], fma(s[i, j], w[t, h, j], vi * k[t, h, j]))
                    s[i, j] = x
                    acc += np.float64(x) * np.float64(r[t, h, j])
                y[t, h, i] = np.float32(acc)
        st[q, h] = s


def _f32(*xs) -> bool:
    return all(isinstance(x, np.ndarray) and x.dtype == np.float32 and x.ndim <= 4 for x in xs)


def _shape(ref, state, *xs):
    """(S, H, T, n_seqs) when every token tensor is ne [S, H, T] and the state fits, else None."""
    S, H, T, n3 = ne4(ref.shape)
    if n3 != 1 or any(ne4(x.shape) != [S, H, T, 1] for x in xs):
        return None
    n_seqs = ne4(state.shape)[1]
    if min(S, H, T, n_seqs) < 1 or state.size != S * S * H * n_seqs or T % n_seqs:
        return None
    return S, H, T, n_seqs


def _run(kernel, tensors, extra, state, S, H, T, n_seqs):
    """kernel(*tensors as (T, H, S), *extra, s_in, tps, y, st, lo, hi) over all (sequence, head) items;
    the op's output: the T outputs, then the final states (refimpl.ops.recurrent._pack)."""
    c = [np.ascontiguousarray(x).reshape(T, H, S) for x in tensors]
    s_in = np.ascontiguousarray(state).reshape(n_seqs, H, S, S)
    y = np.empty((T, H, S), np.float32)
    st = np.empty((n_seqs, H, S, S), np.float32)
    tps = T // n_seqs
    per = max(1, PAR_MIN // max(1, tps * S * S))
    parallel_ranges(lambda lo, hi: kernel(*c, *extra, s_in, tps, y, st, lo, hi), n_seqs * H, per)
    return np.concatenate([y.reshape(-1, S * H), st.reshape(-1, S * H)])


@register("rwkv_wkv6", backend="numba")
def rwkv_wkv6(k, v, r, tf, td, state):
    """ggml_rwkv_wkv6 (see refimpl.ops.recurrent.rwkv_wkv6) in Numba."""
    args = [np.asarray(x) for x in (k, v, r, tf, td, state)]
    k, v, r, tf, td, state = args
    dims = _shape(k, state, v, r, td) if _f32(*args) else None
    if dims is None or tf.size != dims[0] * dims[1]:
        return ref_rc.rwkv_wkv6.reference(*args)
    S, H, T, n_seqs = dims
    return _run(_wkv6, (k, v, r), (np.ascontiguousarray(tf).reshape(H, S), np.ascontiguousarray(td).reshape(T, H, S)),
                state, S, H, T, n_seqs)


@register("rwkv_wkv7", backend="numba")
def rwkv_wkv7(r, w, k, v, a, b, state):
    """ggml_rwkv_wkv7 (see refimpl.ops.recurrent.rwkv_wkv7) in Numba."""
    args = [np.asarray(x) for x in (r, w, k, v, a, b, state)]
    dims = _shape(args[2], args[6], *args[:6]) if _f32(*args) else None
    if dims is None:
        return ref_rc.rwkv_wkv7.reference(*args)
    return _run(_wkv7, args[:6], (), args[6], *dims)
