"""Recurrent and state-space ops: Mamba's ssm_conv / ssm_scan, RWKV's wkv6 / wkv7, gated linear attention,
the gated delta rule.

All are F32-only in ggml. The recurrences walk the tokens in order and carry their state in f32, as ggml's
CPU kernels do (the state lives in the output tensor between tokens). Within a token, each f32 quantity
ggml stores (an output, a state element) is computed from the f32 operands with the kernel's f32
operations: a multiply-add the kernel's source fuses (the vector FMAs of wkv6, gla, wkv7, gated_delta_net)
is rounded once, as there (`fma32`); sums the kernel runs sequentially are summed in f32 in its order;
sums it runs in SIMD lanes are summed in f64 and rounded once (the order of the lanes belongs to
numerics="ggml", not implemented here). Bits can also differ where GCC contracts a scalar `a*b + c` into
an FMA on its own. Each op's docstring says which applies; the tolerance table gives the measured NMSE
of this exact mode against ggml (rwkv_wkv6: identical bits).

Token layout of the RWKV-style ops (wkv6, gla, wkv7): T tokens of all sequences concatenated, sequence
`t // (T // n_seqs)`, so T must be a multiple of n_seqs. Their state has ggml ne [S*S*H, n_seqs] (NumPy
(n_seqs, S*S*H)), ordered [seq][head][row][col]; their output ne [S*H, T + S*n_seqs] (NumPy
(T + S*n_seqs, S*H)) holds the T per-token outputs, then the final states in the state's layout:
    y = out[:T].reshape(T, H, S);   states = out[T:].reshape(n_seqs, H, S, S)
"""
from __future__ import annotations

import numpy as np

from ..dispatch import op
from ..rounding import expf_f32, fma32
from ..shapes import fail, ne4, need_f32



@op("ssm_conv")
def ssm_conv(sx: np.ndarray, c: np.ndarray) -> np.ndarray:
    """ggml_ssm_conv: Mamba's depthwise causal 1-D convolution over the tokens of each sequence.

    sx   ne [d_conv-1+n_t, d_inner, n_s]   numpy (n_s, d_inner, d_conv-1+n_t)   f32: per channel, the
         d_conv-1 carried-over conv states then the sequence's n_t tokens
    c    ne [d_conv, d_inner]              numpy (d_inner, d_conv)              f32 conv1d weight
    out  ne [d_inner, n_t, n_s]            numpy (n_s, n_t, d_inner)            f32

        out[s, t, ch] = sum_{k < d_conv} sx[s, ch, t + k] * c[ch, k]

    As ggml-cpu: products rounded to f32 and summed in f32 in k order (not in f64: the kernel avoids
    ggml_vec_dot_f32 on purpose). Identical bits to the AVX2 build when d_conv is a multiple of 4; otherwise
    its last d_conv % 4 terms are fused multiply-adds (GCC contraction), a last-bit difference.
    ggml asserts rows of sx and c contiguous and reads c as if fully contiguous; any NumPy layout is fine here.
    """
    sx, c = np.asarray(sx), np.asarray(c)
    need_f32("ssm_conv", sx=sx, c=c)
    ns, nc = ne4(sx.shape), ne4(c.shape)
    if ns[3] != 1:
        fail("ssm_conv", "sx must be 3-D (ne3 == 1)", sx=sx, c=c)
    if nc[2] != 1 or nc[3] != 1:
        fail("ssm_conv", "c must be a matrix ne [d_conv, d_inner]", sx=sx, c=c)
    d_conv, d_inner = nc[0], nc[1]
    n_t = ns[0] - d_conv + 1
    if ns[1] != d_inner or n_t < 0:
        fail("ssm_conv", "need sx.ne1 == c.ne1 (d_inner) and sx.ne0 >= c.ne0 - 1 (d_conv - 1 + n_t)",
             sx=sx, c=c)
    x = sx.reshape(ns[2], d_inner, ns[0])
    out = np.zeros((ns[2], d_inner, n_t), np.float32)
    for k in range(d_conv):                                   # sequential f32 sum over k, as ggml
        out += x[:, :, k:k + n_t] * c[None, :, k:k + 1]
    return np.ascontiguousarray(out.transpose(0, 2, 1))


def softplus_f32(x: np.ndarray) -> np.ndarray:
    """ggml_compute_softplus_f32: x > 20 ? x : logf(1 + expf(x)), every step rounded to f32 as in C
    (so 1 + expf(x) is exactly 1, and the result 0, for x below about -17)."""
    x = np.asarray(x, np.float32)
    s = np.float32(1.0) + expf_f32(np.minimum(x, np.float32(20.0)))
    return np.where(x > np.float32(20.0), x, np.log(s.astype(np.float64)).astype(np.float32))


@op("ssm_scan")
def ssm_scan(s: np.ndarray, x: np.ndarray, dt: np.ndarray, A: np.ndarray, B: np.ndarray, C: np.ndarray,
             ids: np.ndarray, K: int = 1) -> np.ndarray:
    """ggml_ssm_scan: Mamba's selective scan (Mamba-2 with a scalar decay per head, Mamba-1 per state).

    s    ne [d_state, head_dim, n_head, n_rs]        numpy (n_rs, n_head, head_dim, d_state)   f32 states
    x    ne [head_dim, n_head, n_seq_tokens, n_seqs] numpy (n_seqs, n_seq_tokens, n_head, head_dim)
    dt   ne [n_head, n_seq_tokens, n_seqs]           numpy (n_seqs, n_seq_tokens, n_head)
    A    ne [1 or d_state, n_head]                   numpy (n_head, 1 or d_state)   1: Mamba-2, d_state: Mamba-1
    B, C ne [d_state, n_group, n_seq_tokens, n_seqs] numpy (n_seqs, n_seq_tokens, n_group, d_state)
    ids  ne [n_seqs]                                 i32, 0 <= ids < n_rs: the initial state of each sequence
    out  ne [x.size + d_state*head_dim*n_head*n_seqs] numpy (same,) f32: y (x's ne, contiguous) then the
         final state of each sequence in s's layout (sequence i at slot i, not ids[i])
             y = out[:x.size].reshape(n_seqs, n_seq_tokens, n_head, head_dim)
             states = out[x.size:].reshape(n_seqs, n_head, head_dim, d_state)

    Per sequence q, starting from h = s[ids[q]], for each token t, head e (group g = e // (n_head/n_group)):
        d = softplus(dt[e]);   h[e, p, n] = h[e, p, n] * exp(d * A[e, n or 0]) + B[g, n] * (x[e, p] * d)
        y[e, p] = sum_n h[e, p, n] * C[g, n]

    K > 1 (ggml 0.25.3, Mamba-2 only: rollback snapshots for speculative decoding): out holds K state slots
    after y, out[x.size:].reshape(K, n_seqs, n_head, head_dim, d_state); slot 0 the final state, slot j the
    state after token n_seq_tokens-1-j. ggml never writes slots j >= n_seq_tokens; refimpl fills them with NaN.

    B and C serve heads in blocks (np.repeat, like mul_mat's batch broadcast), not tiled.
    softplus is ggml's: x > 20 ? x : logf(1 + expf(x)) in f32 steps. The decay expf(fl(d*A)) and the state
    update follow the kernel's f32 operations. The sum y: Mamba-1's kernel sums in f32 over n in order, as
    here; Mamba-2's sums in AVX2 lanes (plus a sequential tail), so exact mode sums it in f64, rounded once.
    ggml asserts s, dt, A contiguous and the rows and dim 1 of x, B, C packed; any NumPy layout is fine here.
    """
    s, x, dt, A, B, C, ids = (np.asarray(v) for v in (s, x, dt, A, B, C, ids))
    ops = dict(s=s, x=x, dt=dt, A=A, B=B, C=C, ids=ids)
    need_f32("ssm_scan", s=s, x=x, dt=dt, A=A, B=B, C=C)
    if ids.dtype != np.int32:
        fail("ssm_scan", f"ids must be i32, got {ids.dtype}", **ops)
    nS, nX, nD, nA, nB, nI = (ne4(v.shape) for v in (s, x, dt, A, B, ids))
    d_state, head_dim, n_head, n_tok, n_seqs = nS[0], nX[0], nX[1], nX[2], nX[3]
    n_group = nB[1]
    if nD[:3] != [n_head, n_tok, n_seqs] or nD[3] != 1:
        fail("ssm_scan", "dt must be ne [n_head, n_seq_tokens, n_seqs] (x.ne1, x.ne2, x.ne3)", **ops)
    if nS[1] != head_dim or nS[2] != n_head:
        fail("ssm_scan", "s must be ne [d_state, head_dim, n_head, n_rs] (s.ne1 == x.ne0, s.ne2 == x.ne1)", **ops)
    if nB[0] != d_state or nB[2] != n_tok or nB[3] != n_seqs or nB != ne4(C.shape):
        fail("ssm_scan", "B and C must be ne [d_state, n_group, n_seq_tokens, n_seqs], the same shape", **ops)
    if nI[0] != n_seqs or nI[1:] != [1, 1, 1]:
        fail("ssm_scan", "ids must be a vector of n_seqs (x.ne3) entries", **ops)
    if nA[1] != n_head or nA[2:] != [1, 1] or nA[0] not in (1, d_state):
        fail("ssm_scan", "A must be ne [1, n_head] (Mamba-2) or [d_state, n_head] (Mamba-1)", **ops)
    if n_group == 0 or n_head % n_group:
        fail("ssm_scan", "n_head (x.ne1) must be a multiple of n_group (B.ne1)", **ops)
    if int(K) != K or K < 1 or (K > 1 and nA[0] != 1):
        fail("ssm_scan", f"K must be an integer >= 1, and 1 for Mamba-1's A [d_state, n_head]; got {K}", **ops)
    if ids.size and (ids.min() < 0 or ids.max() >= nS[3]):
        fail("ssm_scan", f"ids out of range [0, {nS[3]}) (ggml does not check; it would read past s)", **ops)

    s4 = s.reshape(nS[::-1])                                  # (n_rs, n_head, head_dim, d_state)
    x4 = x.reshape(nX[::-1])                                  # (n_seqs, n_tok, n_head, head_dim)
    d3 = dt.reshape(n_seqs, n_tok, n_head)
    rep = n_head // n_group
    B4 = np.repeat(B.reshape(nB[::-1]), rep, axis=2)          # (n_seqs, n_tok, n_head, d_state)
    C4 = np.repeat(C.reshape(nB[::-1]), rep, axis=2)
    A2 = A.reshape(n_head, nA[0])
    mamba1 = nA[0] != 1                                        # the kernel's test: A.ne0 != 1
    y = np.empty((n_seqs, n_tok, n_head, head_dim), np.float32)
    states = np.full((int(K), n_seqs, n_head, head_dim, d_state), np.nan, np.float32)
    for q in range(n_seqs):
        h = s4[ids.reshape(-1)[q]].astype(np.float32, copy=True)        # (n_head, head_dim, d_state)
        for t in range(n_tok):
            d = softplus_f32(d3[q, t])[:, None, None]                      # (n_head, 1, 1)
            dA = expf_f32(d * A2[:, None, :])                              # (n_head, 1, 1 or d_state)
            x_dt = x4[q, t][:, :, None] * d                             # (n_head, head_dim, 1)
            h = h * dA + B4[q, t][:, None, :] * x_dt
            Ct = C4[q, t][:, None, :]                                   # (n_head, 1, d_state)
            if mamba1:
                acc = np.zeros((n_head, head_dim), np.float32)
                for n in range(d_state):                                # sequential f32, as the kernel
                    acc += h[:, :, n] * Ct[:, :, n]
                y[q, t] = acc
            else:
                y[q, t] = np.sum(h.astype(np.float64) * Ct, axis=-1).astype(np.float32)
            if 0 < n_tok - 1 - t < K:                                   # a rollback snapshot
                states[n_tok - 1 - t, q] = h
        states[0, q] = h
    return np.concatenate([y.reshape(-1), states.reshape(-1)])


def _tokens(name: str, ref: str, state: np.ndarray, **tensors) -> tuple[int, int, int, int]:
    """(S, H, T, n_seqs) of an RWKV-style op, with ggml's checks: every token tensor ne [S, H, T] like
    `ref`, the state S*S*H*n_seqs values with n_seqs = state.ne1, and T a multiple of n_seqs."""
    ops = dict(tensors, state=state)
    need_f32(name, **ops)
    S, H, T, n3 = ne4(tensors[ref].shape)
    for k, x in tensors.items():
        if ne4(x.shape)[:3] != [S, H, T] or ne4(x.shape)[3] != 1:
            fail(name, f"{k} must be ne [S, H, T] like {ref} (numpy (T, H, S))", **ops)
    n_seqs = ne4(state.shape)[1]
    if state.size != S * S * H * n_seqs:
        fail(name, "state must hold S*S*H*n_seqs values, n_seqs = state.ne1 (numpy (n_seqs, S*S*H))", **ops)
    if T == 0 or n_seqs == 0 or T % n_seqs:
        fail(name, f"T = {T} tokens must be a positive multiple of n_seqs = {n_seqs} (ggml does not check: "
             "it divides by T // n_seqs and leaves states unwritten)", **ops)
    return S, H, T, n_seqs


def _pack(y: np.ndarray, states: np.ndarray, S: int, H: int) -> np.ndarray:
    """ggml's output of the RWKV-style ops: ne [S*H, T + S*n_seqs], the T outputs then the final states."""
    return np.concatenate([y.reshape(-1, S * H), states.reshape(-1, S * H)])


@op("rwkv_wkv6")
def rwkv_wkv6(k: np.ndarray, v: np.ndarray, r: np.ndarray, tf: np.ndarray, td: np.ndarray,
              state: np.ndarray) -> np.ndarray:
    """ggml_rwkv_wkv6: RWKV-6's time mixing (WKV) with a per-token decay, all heads and sequences at once.

    k, v, r  ne [S, H, T]          numpy (T, H, S)          key, value, receptance (S = head_size, H = n_head)
    tf       ne [S, H]             numpy (H, S)             u, "time_faaaa": the bonus of the current token
    td       ne [S, H, T]          numpy (T, H, S)          w, the decay, already exponentiated
                                                            (llama.cpp passes exp(-exp(w_raw)))
    state    ne [S*S*H, n_seqs]    numpy (n_seqs, S*S*H)    per sequence and head an S x S matrix s[i][j],
                                                            i = KEY index (row), j = value index (column)
    out      ne [S*H, T + S*n_seqs]  numpy (T + S*n_seqs, S*H)   f32: row t is token t's output (H, S);
             rows T.. hold the final states in the state's layout. T tokens = n_seqs sequences in order.

        out[t, h, j] = sum_i r[i] * (u[i] * k[i] * v[j] + s[i][j]);    s[i][j] = s[i][j] * w[i] + k[i] * v[j]

    As ggml-cpu: kv = fl(v[j]*k[i]); the bonus term, the state update and each step of the sum over i
    (in i order) are multiply-adds rounded once (the kernel's FMAs): fma(kv, u, s), fma(s, w, kv).
    ggml reads tf as S*H values; any shape holding them is accepted here.
    """
    k, v, r, tf, td, state = (np.asarray(x) for x in (k, v, r, tf, td, state))
    S, H, T, n_seqs = _tokens("rwkv_wkv6", "k", state, k=k, v=v, r=r, td=td)
    if tf.size != S * H or tf.dtype != np.float32:
        fail("rwkv_wkv6", "tf must be f32 ne [S, H] (numpy (H, S))", k=k, tf=tf)
    k3, v3, r3, w3 = (x.reshape(T, H, S) for x in (k, v, r, td))
    u = tf.reshape(H, S)[:, :, None]                                # (H, S_i, 1)
    s_in = state.reshape(n_seqs, H, S, S)
    tps = T // n_seqs
    y = np.empty((T, H, S), np.float32)
    states = np.empty((n_seqs, H, S, S), np.float32)
    for t in range(T):
        if t % tps == 0:
            s = s_in[t // tps]
        kv = k3[t][:, :, None] * v3[t][:, None, :]                  # (H, S_i, S_j), f32 products
        temp = fma32(kv, u, s)
        acc = np.zeros((H, S), np.float32)
        for i in range(S):                                          # the kernel's order: i outer
            acc = fma32(temp[:, i, :], r3[t][:, i:i + 1], acc)
        y[t] = acc
        s = fma32(s, w3[t][:, :, None], kv)
        if t % tps == tps - 1:
            states[t // tps] = s
    return _pack(y, states, S, H)


@op("rwkv_wkv4", covers=())
def rwkv_wkv4(k: np.ndarray, v: np.ndarray, w: np.ndarray, u: np.ndarray, state: np.ndarray) -> np.ndarray:
    """RWKV-4's WKV, one channel per column, in float32 (no ggml op: llama.cpp has no RWKV-4, and rwkv.cpp
    builds the step from custom map ops; BlinkDL's numerically stable form, refimpl.models.rwkv.v4).

    k, v   ne [C, T]       numpy (T, C)       keys and values of T tokens, C = n_embd channels
    w, u   ne [C]          numpy (C,)         the decay -exp(time_decay) (< 0) and the bonus time_first
    state  ne [C, 3]       numpy (3, C)       aa, bb, pp before the first token
    out    ne [C, T + 3]   numpy (T + 3, C)   f32: row t is token t's wkv; rows T.. the new aa, bb, pp

        q = max(pp, u + k);     e1 = exp(pp - q);     e2 = exp(u + k - q);     wkv = (e1*aa + e2*v) / (e1*bb + e2)
        q = max(pp + w, k);     e1 = exp(pp + w - q); e2 = exp(k - q);         aa, bb, pp = e1*aa + e2*v, e1*bb + e2, q
    """
    k, v, w, u, state = (np.asarray(x) for x in (k, v, w, u, state))
    need_f32("rwkv_wkv4", k=k, v=v, w=w, u=u, state=state)
    T, C = (k.shape[0], k.shape[-1]) if k.ndim == 2 else (0, 0)
    if k.ndim != 2 or v.shape != k.shape or w.shape != (C,) or u.shape != (C,) or state.shape != (3, C):
        fail("rwkv_wkv4", "need k, v (T, C), w, u (C,), state (3, C) in numpy order", k=k, v=v, w=w, u=u,
             state=state)
    aa, bb, pp = state
    out = np.empty((T + 3, C), np.float32)
    with np.errstate(over="ignore", under="ignore"):
        for t in range(T):
            kt, vt = k[t], v[t]
            ww = u + kt
            q = np.maximum(pp, ww)
            e1, e2 = np.exp(pp - q), np.exp(ww - q)
            out[t] = (e1 * aa + e2 * vt) / (e1 * bb + e2)
            ww = w + pp
            q = np.maximum(ww, kt)
            e1, e2 = np.exp(ww - q), np.exp(kt - q)
            aa, bb, pp = e1 * aa + e2 * vt, e1 * bb + e2, q
    out[T], out[T + 1], out[T + 2] = aa, bb, pp
    return out


@op("gated_linear_attn")
def gated_linear_attn(k: np.ndarray, v: np.ndarray, q: np.ndarray, g: np.ndarray, state: np.ndarray,
                      scale: float = 1.0) -> np.ndarray:
    """ggml_gated_linear_attn: gated linear attention (GLA; RWKV-6 "Finch"-style decay, no bonus).

    k, v, q, g  ne [S, H, T]          numpy (T, H, S)          key, value, query, gate (decay, in (0, 1))
    state       ne [S*S*H, n_seqs]    numpy (n_seqs, S*S*H)    s[i][j], i = KEY index (row), j = value index
    scale       f32 applied to q (llama.cpp: 1/sqrt(head_size))
    out         ne [S*H, T + S*n_seqs]  numpy (T + S*n_seqs, S*H)   f32: T outputs (H, S), then final states

        s[i][j] = s[i][j] * g[i] + k[i] * v[j];     out[t, h, j] = sum_i (q[i] * scale) * s[i][j]

    The output uses the UPDATED state (unlike wkv6). As ggml-cpu: qs = fl(q*scale), kv = fl(v[j]*k[i]),
    s = fma(s, g, kv), and the sum over i (in i order) is a chain of FMAs: identical bits to the AVX2 build
    for S a multiple of 8. For the other S % 8 columns ggml runs a scalar loop that GCC contracts as
    fma(v, k, fl(s*g)) instead (a last-bit difference).
    """
    k, v, q, g, state = (np.asarray(x) for x in (k, v, q, g, state))
    S, H, T, n_seqs = _tokens("gated_linear_attn", "k", state, k=k, v=v, q=q, g=g)
    k3, v3, g3 = (x.reshape(T, H, S) for x in (k, v, g))
    q3 = q.reshape(T, H, S) * np.float32(scale)
    s_in = state.reshape(n_seqs, H, S, S)
    tps = T // n_seqs
    y = np.empty((T, H, S), np.float32)
    states = np.empty((n_seqs, H, S, S), np.float32)
    for t in range(T):
        if t % tps == 0:
            s = s_in[t // tps]
        kv = k3[t][:, :, None] * v3[t][:, None, :]
        s = fma32(s, g3[t][:, :, None], kv)
        acc = np.zeros((H, S), np.float32)
        for i in range(S):
            acc = fma32(s[:, i, :], q3[t][:, i:i + 1], acc)
        y[t] = acc
        if t % tps == tps - 1:
            states[t // tps] = s
    return _pack(y, states, S, H)


def _check_wkv7(r, w, k, v, a, b, state) -> None:
    r, w, k, v, a, b, state = (np.asarray(x) for x in (r, w, k, v, a, b, state))
    _tokens("rwkv_wkv7", "k", state, r=r, w=w, k=k, v=v, a=a, b=b)


@op("rwkv_wkv7", check=_check_wkv7)
def rwkv_wkv7(r: np.ndarray, w: np.ndarray, k: np.ndarray, v: np.ndarray, a: np.ndarray, b: np.ndarray,
              state: np.ndarray) -> np.ndarray:
    """ggml_rwkv_wkv7: RWKV-7 "Goose" time mixing: a decayed state plus a rank-1 in-context update.

    r, w, k, v, a, b  ne [S, H, T]          numpy (T, H, S)     receptance, decay (in (0, 1); llama.cpp passes
                                                                exp(-0.606531*sigmoid(.))), key, value, and the
                                                                in-context learning vectors (llama.cpp: a = -kk,
                                                                b = kk*iclr)
    state             ne [S*S*H, n_seqs]    numpy (n_seqs, S*S*H)   s[i][j] with i = VALUE index (row) and
                                                                j = key index (column): transposed w.r.t. wkv6
    out               ne [S*H, T + S*n_seqs]  numpy (T + S*n_seqs, S*H)   f32: T outputs (H, S), then the states

        sa[i] = sum_j a[j] * s[i][j];   s[i][j] = s[i][j] * w[j] + v[i] * k[j] + sa[i] * b[j]
        out[t, h, i] = sum_j s[i][j] * r[j]      (the updated state)

    As ggml-cpu: the state update is fma(sa, b, fma(s, w, fl(v*k))). The kernel sums sa and out in AVX2
    lanes, so exact mode sums them in f64, rounded once.
    Head size: the AVX2 kernel steps over j 32 at a time with no remainder loop, so ggml is only defined for
    S a multiple of 32 there (64 on AVX-512, 16 on NEON; other S read past the rows). This computes the
    formula for any S; golden cases use multiples of 32.
    numerics="ggml": sa and out in the AVX2 kernel's 4 x 8 FMA lanes (refimpl.kernels.ggml.ops.rwkv_wkv7).
    """
    r, w, k, v, a, b, state = (np.asarray(x) for x in (r, w, k, v, a, b, state))
    S, H, T, _ = ne4(k.shape)                      # checked by _check_wkv7
    n_seqs = ne4(state.shape)[1]
    r3, w3, k3, v3, a3, b3 = (x.reshape(T, H, S) for x in (r, w, k, v, a, b))
    s_in = state.reshape(n_seqs, H, S, S)
    tps = T // n_seqs
    y = np.empty((T, H, S), np.float32)
    states = np.empty((n_seqs, H, S, S), np.float32)
    for t in range(T):
        if t % tps == 0:
            s = s_in[t // tps]
        sa = np.einsum("hij,hj->hi", s.astype(np.float64), a3[t]).astype(np.float32)     # (H, S_i)
        kv = v3[t][:, :, None] * k3[t][:, None, :]                                       # (H, S_i, S_j)
        s = fma32(sa[:, :, None], b3[t][:, None, :], fma32(s, w3[t][:, None, :], kv))
        y[t] = np.einsum("hij,hj->hi", s.astype(np.float64), r3[t]).astype(np.float32)
        if t % tps == tps - 1:
            states[t // tps] = s
    return _pack(y, states, S, H)


@op("gated_delta_net")
def gated_delta_net(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                    state: np.ndarray, K: int = 1) -> np.ndarray:
    """ggml_gated_delta_net: the gated delta rule (Qwen3-Next / Qwen3.5 linear attention; Kimi's KDA with a
    per-key gate), with the last K states as snapshots.

    q, k   ne [S, H_k, n_tokens, n_seqs_k]   numpy (n_seqs_k, n_tokens, H_k, S)   query, key (llama.cpp
                                                                                 l2-normalises both)
    v      ne [S, H, n_tokens, n_seqs]       numpy (n_seqs, n_tokens, H, S)       value
    g      ne [1 or S, H, n_tokens, n_seqs]  numpy (n_seqs, n_tokens, H, 1 or S)  log-gate: scalar per head,
                                                                                 or per key (KDA)
    beta   ne [1, H, n_tokens, n_seqs]       numpy (n_seqs, n_tokens, H, 1)       write strength
    state  ne [S, S, H, n_seqs]              numpy (n_seqs, H, S, S)   M[j][i], j = VALUE index (row),
                                                                       i = key index (column)
    K      number of state snapshots kept (>= 1)
    out    ne [S*H, n_tokens*n_seqs + K*S*n_seqs]   numpy (same reversed) f32, flat: the attention output
           numpy (n_seqs, n_tokens, H, S), then K snapshots numpy (K, n_seqs, H, S, S) in the state's layout,
           slot 0 = the final state, slot m = the state m tokens before it.

    Per sequence and head, for each token (q, k taken from head h % H_k -- tiled, not np.repeat -- and
    sequence n // (n_seqs / n_seqs_k)):
        M = M * exp(g)  (column i scaled by exp(g[i]) for KDA);   delta[j] = (v[j] - M[j]·k) * beta
        M[j][i] += k[i] * delta[j];                               out[j] = (M[j]·q) / sqrt(S)

    As ggml-cpu: expf, the scaling and delta in f32, the update an FMA per element; the dot products are
    ggml_vec_dot_f32 (AVX2 lanes; f64 in ggml's scalar build), so exact mode sums them in f64, rounded once;
    the 1/sqrt(S) factor is f32. With n_tokens < K, ggml writes only slots 0 .. n_tokens-1 and leaves the
    rest as it found the memory ("caller-owned"); they are zero here.
    ggml checks only v, g, beta, state and K; q and k must also be ne [S, H_k, n_tokens, n_seqs_k] with H a
    multiple of H_k and n_seqs of n_seqs_k, or its kernel reads past them. ggml asserts rows of q, k, v
    and all of g, beta, state contiguous; any NumPy layout is fine here.
    """
    q, k, v, g, beta, state = (np.asarray(x) for x in (q, k, v, g, beta, state))
    ops = dict(q=q, k=k, v=v, g=g, beta=beta, state=state)
    need_f32("gated_delta_net", **ops)
    S, H, n_tok, n_seqs = ne4(v.shape)
    ng, nb, ns = ne4(g.shape), ne4(beta.shape), ne4(state.shape)
    if ng[0] not in (1, S) or ng[1:] != [H, n_tok, n_seqs]:
        fail("gated_delta_net", "g must be ne [1 or S, H, n_tokens, n_seqs] (v.ne0 .. v.ne3)", **ops)
    if nb != [1, H, n_tok, n_seqs]:
        fail("gated_delta_net", "beta must be ne [1, H, n_tokens, n_seqs]", **ops)
    if ns != [S, S, H, n_seqs]:
        fail("gated_delta_net", "state must be ne [S, S, H, n_seqs]", **ops)
    if int(K) != K or K < 1:
        fail("gated_delta_net", f"K = {K} snapshots: must be an integer >= 1", **ops)
    K = int(K)
    qk = []
    for name, x in (("q", q), ("k", k)):
        nx = ne4(x.shape)
        if nx[0] != S or nx[2] != n_tok or nx[1] == 0 or H % nx[1] or nx[3] == 0 or n_seqs % nx[3]:
            fail("gated_delta_net", f"{name} must be ne [S, H_k, n_tokens, n_seqs_k] with H % H_k == 0 and "
                 "n_seqs % n_seqs_k == 0 (ggml does not check; its kernel would read past it)", **ops)
        x4 = x.reshape(nx[::-1])                                     # (n_seqs_k, n_tok, H_k, S)
        x4 = x4[np.arange(n_seqs) // (n_seqs // nx[3])][:, :, np.arange(H) % nx[1]]
        qk.append(x4)                                                # (n_seqs, n_tok, H, S)
    q4, k4 = qk
    v4 = v.reshape(n_seqs, n_tok, H, S)
    g4 = g.reshape(n_seqs, n_tok, H, ng[0])
    b4 = beta.reshape(n_seqs, n_tok, H, 1)
    scale = np.float32(1.0) / np.sqrt(np.float32(S))
    M = state.reshape(n_seqs, H, S, S)
    attn = np.empty((n_seqs, n_tok, H, S), np.float32)
    snaps = np.zeros((K, n_seqs, H, S, S), np.float32)
    if n_tok == 0 and K == 1:                                        # ggml's K == 1 path copies s0 out first
        snaps[0] = M
    for t in range(n_tok):
        M = M * expf_f32(g4[:, t])[:, :, None, :]                       # scalar gate, or column i by exp(g[i])
        kt, qt = k4[:, t], q4[:, t]
        mk = np.einsum("bhji,bhi->bhj", M.astype(np.float64), kt).astype(np.float32)
        delta = (v4[:, t] - mk) * b4[:, t]                           # (n_seqs, H, S_j)
        M = fma32(kt[:, :, None, :], delta[:, :, :, None], M)
        mq = np.einsum("bhji,bhi->bhj", M.astype(np.float64), qt).astype(np.float32)
        attn[:, t] = mq * scale
        if n_tok - 1 - t < K:
            snaps[n_tok - 1 - t] = M
    return np.concatenate([attn.reshape(-1), snaps.reshape(-1)]).reshape(-1, S * H)
