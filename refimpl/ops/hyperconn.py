"""DeepSeek V4's hyper-connections (ggml 0.25.3): dsv4_hc_comb, dsv4_hc_pre (and _gated), dsv4_hc_post.

They replace the residual connection x = f(x) + x by hc streams of the residual: hc_pre mixes the streams into
the layer's input, hc_post spreads the layer's output back over them, and hc_comb builds the stream-mixing
matrices (a Sinkhorn-normalized softmax). All f32, computed in ggml-cpu's f32 steps and order; GCC may fuse a
product into a following sum there, so results can be an ulp apart.
"""
from __future__ import annotations

import numpy as np

from ..dispatch import op
from ..shapes import fail, ne4, need_f32
from ..rounding import expf_f32

f32 = np.float32
HC = 4                                           # ggml_dsv4_hc_comb asserts hc == 4


@op("dsv4_hc_comb", covers="DSV4_HC_COMB")
def dsv4_hc_comb(mixes: np.ndarray, scale: np.ndarray, base: np.ndarray, eps: float, n_iter: int) -> np.ndarray:
    """ggml_dsv4_hc_comb(ctx, mixes, scale, base, eps, n_iter): the hc x hc stream-mixing matrix of each token.

    mixes  ne [(2+hc)*hc, n_tokens]   numpy (n_tokens, 24)         f32 (hc = 4)
    scale  ne [>= 3]                  numpy (>= 3,)               f32; scale[2] scales the comb logits
    base   ne [(2+hc)*hc]             numpy (24,)                 f32
    out    ne [hc, hc, n_tokens]      numpy (n_tokens, hc, hc)    f32: out[t, src, dst]

        v[t, src, dst] = mixes[t, 2hc + dst + hc*src] * scale[2] + base[2hc + dst + hc*src]
        c = softmax over dst of v, + eps;  then per dst: c /= (eps + sum over src of c)
        n_iter - 1 times more: per src c /= (eps + sum over dst), then per dst c /= (eps + sum over src)

    exp is the true exponential rounded to f32 (ggml-cpu: expf); sums run in f32 in index order, and each
    division is a multiplication by the f32 reciprocal, as in ggml-cpu.
    """
    mixes, scale, base = np.asarray(mixes), np.asarray(scale), np.asarray(base)
    need_f32("dsv4_hc_comb", mixes=mixes, scale=scale, base=base)
    nm, ns, nb = ne4(mixes.shape), ne4(scale.shape), ne4(base.shape)
    ops_ = dict(mixes=mixes, scale=scale, base=base)
    if nm[0] != (2 + HC) * HC or nm[2:] != [1, 1] or ns[0] < 3 or ns[1:] != [1, 1, 1] or nb != [nm[0], 1, 1, 1]:
        fail("dsv4_hc_comb", "need mixes [24, n_tokens] (hc = 4), scale [>= 3] and base [24]", **ops_)
    if int(n_iter) != n_iter or n_iter < 1:
        fail("dsv4_hc_comb", f"n_iter must be an integer >= 1, got {n_iter}", **ops_)
    n_tok = nm[1]
    s2, e = f32(scale.reshape(-1)[2]), f32(eps)
    m = mixes.reshape(n_tok, nm[0])[:, 2 * HC:].reshape(n_tok, HC, HC)           # (t, src, dst)
    b = base.reshape(-1)[2 * HC:].reshape(HC, HC)
    with np.errstate(all="ignore"):
        v = m * s2 + b
        ex = expf_f32(v - v.max(axis=2, keepdims=True))
        total = ex[:, :, 0].copy()
        for d in range(1, HC):
            total += ex[:, :, d]
        c = ex * (f32(1) / total)[:, :, None] + e
        c = _norm_over_src(c, e)
        for _ in range(1, int(n_iter)):
            c = _norm_over_src(_norm_over_dst(c, e), e)
    return c.astype(f32)


def _norm_over_src(c, e):
    """ggml's norm_cols: per (t, dst), c /= eps + sum over src (f32, in order)."""
    total = np.full((c.shape[0], HC), e, f32)
    for s in range(HC):
        total += c[:, s, :]
    return c * (f32(1) / total)[:, None, :]


def _norm_over_dst(c, e):
    """ggml's norm_rows: per (t, src), c /= eps + sum over dst (f32, in order)."""
    total = np.full((c.shape[0], HC), e, f32)
    for d in range(HC):
        total += c[:, :, d]
    return c * (f32(1) / total)[:, :, None]


@op("dsv4_hc_pre", covers="DSV4_HC_PRE")
def dsv4_hc_pre(x: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """ggml_dsv4_hc_pre(ctx, x, weights): the streams of x mixed into one row per token.

    x        ne [n_embd, hc, n_tokens]   numpy (n_tokens, hc, n_embd)   f32
    weights  ne [hc, n_tokens]           numpy (n_tokens, hc)           f32
    out      ne [n_embd, n_tokens]       numpy (n_tokens, n_embd)       f32

        out[t, i] = sum over h of x[t, h, i] * weights[t, h]        (f32, h in order)
    """
    return _hc_pre("dsv4_hc_pre", x, weights, 1.0, False)


@op("dsv4_hc_pre_gated", covers="DSV4_HC_PRE")
def dsv4_hc_pre_gated(x: np.ndarray, gate: np.ndarray, scale: float) -> np.ndarray:
    """ggml_dsv4_hc_pre_gated(ctx, x, gate, scale): hc_pre with a per-element sigmoid gate.

    x     ne [n_embd, hc, n_tokens]   numpy (n_tokens, hc, n_embd)   f32
    gate  same ne as x                                              f32
    out   ne [n_embd, n_tokens]       numpy (n_tokens, n_embd)       f32

        out[t, i] = scale * sum over h of x[t, h, i] * (1 / (1 + expf(-gate[t, h, i])))    (f32, h in order)
    """
    return _hc_pre("dsv4_hc_pre_gated", x, gate, scale, True)


def _hc_pre(name, x, w, scale, gated):
    x, w = np.asarray(x), np.asarray(w)
    need_f32(name, x=x, weights=w)
    nx, nw = ne4(x.shape), ne4(w.shape)
    n_embd, hc, n_tok = nx[:3]
    want = [n_embd, hc, n_tok, 1] if gated else [hc, n_tok, 1, 1]
    if nx[3] != 1 or hc == 0 or nw != want:
        fail(name, f"need x [n_embd, hc, n_tokens] and {'gate like x' if gated else 'weights [hc, n_tokens]'}",
             x=x, weights=w)
    x3 = x.reshape(n_tok, hc, n_embd)
    with np.errstate(all="ignore"):
        wv = (f32(1) / (f32(1) + expf_f32(-w.reshape(n_tok, hc, n_embd))) if gated
              else np.broadcast_to(w.reshape(n_tok, hc, 1), (n_tok, hc, n_embd)))
        total = np.zeros((n_tok, n_embd), f32)
        for h in range(hc):
            total += x3[:, h] * wv[:, h]
        return f32(scale) * total


@op("dsv4_hc_post", covers="DSV4_HC_POST")
def dsv4_hc_post(x: np.ndarray, residual: np.ndarray, post: np.ndarray, comb: np.ndarray | None = None) -> np.ndarray:
    """ggml_dsv4_hc_post(ctx, x, residual, post, comb): the layer output spread back over the hc streams.

    x         ne [n_embd, n_tokens]        numpy (n_tokens, n_embd)        f32
    residual  ne [n_embd, hc, n_tokens]    numpy (n_tokens, hc, n_embd)    f32
    post      ne [hc, n_tokens]            numpy (n_tokens, hc)            f32
    comb      ne [hc, hc, n_tokens]        numpy (n_tokens, src, dst)      f32, or None (the identity)
    out       ne [n_embd, hc, n_tokens]    numpy (n_tokens, hc, n_embd)    f32

        out[t, dst, i] = x[t, i] * post[t, dst] + sum over src of residual[t, src, i] * comb[t, src, dst]
        comb None:       x[t, i] * post[t, dst] + residual[t, dst, i]            (f32, src in order)
    """
    x, r, p = np.asarray(x), np.asarray(residual), np.asarray(post)
    c = None if comb is None else np.asarray(comb)
    need_f32("dsv4_hc_post", x=x, residual=r, post=p, comb=c)
    nx, nr, npost = ne4(x.shape), ne4(r.shape), ne4(p.shape)
    n_embd, n_tok, hc = nx[0], nx[1], nr[1]
    ops_ = {k: v for k, v in dict(x=x, residual=r, post=p, comb=c).items() if v is not None}
    if (nx[2:] != [1, 1] or hc == 0 or nr != [n_embd, hc, n_tok, 1] or npost != [hc, n_tok, 1, 1]
            or (c is not None and ne4(c.shape) != [hc, hc, n_tok, 1])):
        fail("dsv4_hc_post", "need x [n_embd, n_tokens], residual [n_embd, hc, n_tokens], post [hc, n_tokens] and "
             "comb [hc, hc, n_tokens] or None", **ops_)
    x2, r3, p2 = x.reshape(n_tok, 1, n_embd), r.reshape(n_tok, hc, n_embd), p.reshape(n_tok, hc, 1)
    with np.errstate(all="ignore"):
        out = x2 * p2
        if c is None:
            return out + r3
        c3 = c.reshape(n_tok, hc, hc)
        for s in range(hc):
            out = out + r3[:, s:s + 1, :] * c3[:, s, :, None]
        return out
