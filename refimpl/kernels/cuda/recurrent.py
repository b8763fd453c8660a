"""rwkv_wkv6 and rwkv_wkv7 on the GPU: one block per (head, sequence), one thread per state column (wkv6) or
row (wkv7), the sequence's tokens walked in order inside the kernel, the S x S state in shared memory.

Kernels (S = head_size <= MAX_S = 64; T tokens, n_seqs sequences of tps = T / n_seqs tokens):
    _wkv6  grid (H, n_seqs), block S threads. Thread j owns state column j (s[i][j], i = key index) and
           output j. Per token the block stages k, r, w (and once u) in shared memory; thread j then runs
           the reference's recurrence over i in order: kv = fl(k[i]*v[j]); acc = fma(fma(kv, u[i], s), r[i],
           acc); s = fma(s, w[i], kv). Every operation is the reference's, in its order, and cuda.fma is
           fma.rn.f32 (rounded once, as the reference's exact emulation): identical bits.
    _wkv7  grid (H, n_seqs), block S threads. Thread i owns state row i (s[i][j], i = value index), stored
           transposed in shared memory (st[j, i]: the 32 lanes of a warp hit 32 banks). Per token the block
           stages r, w, k, a, b; thread i computes sa = fl(sum_j s[i][j]*a[j] in f64), the update
           s = fma(sa, b[j], fma(s, w[j], fl(v[i]*k[j]))) and out[i] = fl(sum_j s[i][j]*r[j] in f64), both
           sums in j order as the numba kernel does (the reference sums with NumPy's einsum). Results agree with
           the reference bit for bit unless an f64 sum's last-bit difference straddles an f32 rounding
           boundary (on a GPU, NVVM also contracts the f64 multiply-adds into fma.rn.f64, as the PTX
           shows): well inside ("rwkv_wkv7", "f32", "ggml"), NMSE 1e-7.
numba's simulator computes cuda.fma as a*b + c, rounded twice; tests/cuda/test_recurrent.py gives it the
single rounding of the hardware's fma.rn.f32 (wkv6's PTX has no f32 add NVVM could contract: its kv product
only feeds FMAs).
Memory traffic per block: the initial state S*S*4 bytes read, the final state S*S*4 written once; per token
4*S*4 (wkv6: k, v, r, w; u once) or 6*S*4 (wkv7) bytes read and S*4 written; all loads and stores coalesced.
Shared memory: the 64 x 64 f32 state (16 KB) and 4 (wkv6) or 5 (wkv7) staged vectors of 64 floats per block.

The output is the reference's: a device array (T + S*n_seqs, S*H), T token outputs then the final states in
the state's layout. Inputs the kernels do not cover (not f32, head size > MAX_S, shapes the reference
rejects) run the reference on host copies (which raises its GGMLShapeError for bad shapes).
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32, float64, types

from ...ops import recurrent as ref_rc
from ...dispatch import register
from ...shapes import ne4
from ._device import is_device, to_device, to_host

MAX_S = 64           # largest head size (RWKV-6/7 checkpoints use 64)


@cuda.jit
def _wkv6(k, v, r, w, u, s_in, tps, out):
    """k, v, r, w (T, H, S) f32; u (H, S); s_in (n_seqs, H, S, S); out flat (T*H*S + n_seqs*H*S*S)."""
    h = cuda.blockIdx.x
    q = cuda.blockIdx.y
    j = cuda.threadIdx.x
    T, H, S = k.shape[0], k.shape[1], k.shape[2]
    if h >= H or q >= s_in.shape[0] or j >= S:
        return
    st = cuda.shared.array((MAX_S, MAX_S), float32)        # st[i, j] = s[i][j]: thread j owns column j
    k_sh = cuda.shared.array(MAX_S, float32)
    r_sh = cuda.shared.array(MAX_S, float32)
    w_sh = cuda.shared.array(MAX_S, float32)
    u_sh = cuda.shared.array(MAX_S, float32)
    u_sh[j] = u[h, j]
    for i in range(S):
        st[i, j] = s_in[q, h, i, j]
    for t in range(q * tps, (q + 1) * tps):
        k_sh[j] = k[t, h, j]
        r_sh[j] = r[t, h, j]
        w_sh[j] = w[t, h, j]
        cuda.syncthreads()
        vj = v[t, h, j]
        acc = float32(0.0)
        for i in range(S):
            kv = k_sh[i] * vj
            acc = cuda.fma(cuda.fma(kv, u_sh[i], st[i, j]), r_sh[i], acc)
            st[i, j] = cuda.fma(st[i, j], w_sh[i], kv)
        out[(t * H + h) * S + j] = acc
        cuda.syncthreads()                                   # the next token overwrites k_sh, r_sh, w_sh
    base = T * H * S + (q * H + h) * S * S
    for i in range(S):
        out[base + i * S + j] = st[i, j]


@cuda.jit
def _wkv7(r, w, k, v, a, b, s_in, tps, out):
    """r, w, k, v, a, b (T, H, S) f32; s_in (n_seqs, H, S, S); out flat (T*H*S + n_seqs*H*S*S)."""
    h = cuda.blockIdx.x
    q = cuda.blockIdx.y
    tid = cuda.threadIdx.x
    T, H, S = k.shape[0], k.shape[1], k.shape[2]
    if h >= H or q >= s_in.shape[0] or tid >= S:
        return
    st = cuda.shared.array((MAX_S, MAX_S), float32)        # st[j, i] = s[i][j]: thread i owns row i
    r_sh = cuda.shared.array(MAX_S, float32)
    w_sh = cuda.shared.array(MAX_S, float32)
    k_sh = cuda.shared.array(MAX_S, float32)
    a_sh = cuda.shared.array(MAX_S, float32)
    b_sh = cuda.shared.array(MAX_S, float32)
    for i2 in range(S):                                      # coalesced: thread tid reads column tid
        st[tid, i2] = s_in[q, h, i2, tid]
    i = tid
    for t in range(q * tps, (q + 1) * tps):
        r_sh[tid] = r[t, h, tid]
        w_sh[tid] = w[t, h, tid]
        k_sh[tid] = k[t, h, tid]
        a_sh[tid] = a[t, h, tid]
        b_sh[tid] = b[t, h, tid]
        cuda.syncthreads()                                   # (also: the initial state is in place)
        vi = v[t, h, i]
        acc = float64(0.0)
        for j in range(S):
            acc += float64(st[j, i]) * float64(a_sh[j])
        sa = float32(acc)
        acc = float64(0.0)
        for j in range(S):
            x = cuda.fma(sa, b_sh[j], cuda.fma(st[j, i], w_sh[j], vi * k_sh[j]))
            st[j, i] = x
            acc += float64(x) * float64(r_sh[j])
        out[(t * H + h) * S + i] = float32(acc)
        cuda.syncthreads()                                   # the next token overwrites the staged vectors
    base = T * H * S + (q * H + h) * S * S
    for i2 in range(S):                                      # coalesced: thread tid writes column tid
        out[base + i2 * S + tid] = st[tid, i2]


def _f32(*xs) -> bool:
    return all(hasattr(x, "dtype") and np.dtype(x.dtype) == np.float32 and len(x.shape) <= 4 for x in xs)


def _dims(ref, state, *xs):
    """(S, H, T, n_seqs) when every token tensor is ne [S, H, T] like ref, the state fits and S <= MAX_S,
    else None (the reference then runs, and raises for the shapes it rejects)."""
    S, H, T, n3 = ne4(ref.shape)
    if n3 != 1 or any(ne4(x.shape) != [S, H, T, 1] for x in xs):
        return None
    n_seqs = ne4(state.shape)[1]
    size = int(np.prod(state.shape))
    if min(S, H, T, n_seqs) < 1 or S > MAX_S or size != S * S * H * n_seqs or T % n_seqs:
        return None
    return S, H, T, n_seqs


def _dev(x, shape):
    """x as a C-contiguous f32 device array of NumPy shape `shape` (device arrays reshaped in place)."""
    if is_device(x) and x.is_c_contiguous():
        return x.reshape(shape)
    return to_device(np.ascontiguousarray(to_host(x), np.float32).reshape(shape))


def _launch(kernel, tensors, extra, state, S, H, T, n_seqs):
    """kernel[(H, n_seqs), S](*tensors as (T, H, S), *extra, s_in, tps, out); out reshaped to the op's
    (T + S*n_seqs, S*H)."""
    args = [_dev(x, (T, H, S)) for x in tensors]
    s_in = _dev(state, (n_seqs, H, S, S))
    out = cuda.device_array(T * H * S + n_seqs * H * S * S, np.float32)
    kernel[(H, n_seqs), S](*args, *extra, s_in, np.int64(T // n_seqs), out)
    return out.reshape(T + S * n_seqs, S * H)


@register("rwkv_wkv6", "cuda")
def rwkv_wkv6(k, v, r, tf, td, state):
    """ggml_rwkv_wkv6 (see refimpl.ops.recurrent.rwkv_wkv6) on the GPU: a device array (T + S*n_seqs, S*H)."""
    dims = _dims(k, state, v, r, td) if _f32(k, v, r, tf, td, state) else None
    if dims is None or int(np.prod(tf.shape)) != dims[0] * dims[1]:
        return to_device(ref_rc.rwkv_wkv6.reference(*(to_host(x) for x in (k, v, r, tf, td, state))))
    return _launch(_wkv6, (k, v, r, td), (_dev(tf, (dims[1], dims[0])),), state, *dims)


@register("rwkv_wkv7", "cuda")
def rwkv_wkv7(r, w, k, v, a, b, state):
    """ggml_rwkv_wkv7 (see refimpl.ops.recurrent.rwkv_wkv7) on the GPU: a device array (T + S*n_seqs, S*H)."""
    xs = (r, w, k, v, a, b)
    dims = _dims(k, state, *xs) if _f32(*xs, state) else None
    if dims is None:
        return to_device(ref_rc.rwkv_wkv7.reference(*(to_host(x) for x in (*xs, state))))
    return _launch(_wkv7, xs, (), state, *dims)


def ptx_signatures() -> list[tuple]:
    """(kernel, argument types) of the launches above."""
    f32, i64 = types.float32, types.int64
    tok, st, flat = f32[:, :, ::1], f32[:, :, :, ::1], f32[::1]
    return [(_wkv6, (tok, tok, tok, tok, f32[:, ::1], st, i64, flat)),
            (_wkv7, (tok, tok, tok, tok, tok, tok, st, i64, flat))]
