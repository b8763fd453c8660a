"""flash_attn_ext: fused scaled-dot-product attention with mask, ALiBi, logit soft-capping and sinks; and
lightning_indexer (ggml 0.25.3), DeepSeek's sparse-attention scores."""
from __future__ import annotations

import numpy as np

from ..qtensor import QTensor, dequantize
from ..types import GGMLType
from ..dispatch import op
from ..shapes import fail, ne4
from .softmax import alibi_slopes

# K types ggml-cpu's flash attention takes: any with a vec_dot and a from_float for its vec_dot_type
# (every weight type but the activation-only Q8_1/Q8_K and the integer types).
NOT_KV = {GGMLType.Q8_1, GGMLType.Q8_K, GGMLType.I8, GGMLType.I16, GGMLType.I32, GGMLType.I64, GGMLType.F64}


def _kv(name, x, what, q):
    if isinstance(x, QTensor):
        if x.type in NOT_KV:
            fail(name, f"{what} cannot be {x.traits.name}", q=q, **{what: x})
        return x, x.shape
    x = np.asarray(x)
    if x.dtype not in (np.float32, np.float16):
        fail(name, f"{what} must be f32, f16 or a QTensor (bf16, quantized), got {x.dtype}", q=q, **{what: x})
    if x.size and x.shape[-1] > 1 and x.strides[-1] != x.itemsize:
        fail(name, f"rows of {what} must be contiguous (ggml asserts nb0 == type size)", q=q, **{what: x})
    return x, x.shape


def _values(x, shape4) -> np.ndarray:
    """The exact f64 values of K or V (QTensors dequantized as ggml's to_float does)."""
    if isinstance(x, QTensor):
        return dequantize(x).reshape(shape4).astype(np.float64)
    return x.reshape(shape4).astype(np.float64)


def _check_flash_attn_ext(q, k, v, mask=None, scale: float = 1.0, max_bias: float = 0.0,
                          logit_softcap: float = 0.0, sinks=None) -> None:
    name = "flash_attn_ext"
    q = np.asarray(q)
    if q.dtype != np.float32:
        fail(name, f"q must be f32, got {q.dtype}", q=q)
    if q.size and q.shape[-1] > 1 and q.strides[-1] != q.itemsize:
        fail(name, "rows of q must be contiguous (ggml asserts nb0 == type size)", q=q)
    k, kshape = _kv(name, k, "k", q)
    v, vshape = _kv(name, v, "v", q)
    nq, nk, nv = ne4(q.shape), ne4(kshape), ne4(vshape)
    N, H, S = nq[1], nq[2], nq[3]
    NKV = nk[1]
    if nk[0] != nq[0] or 0 in nk[2:] or H % nk[2] or S % nk[3]:
        fail(name, "need k.ne0 == q.ne0 (head_dim) and q.ne2, q.ne3 multiples of k's", q=q, k=k)
    if nk[3] != S or nv[3] != S:
        fail(name, "q, k and v need the same ne3 (n_seq)", q=q, k=k, v=v)
    if nv[1] != NKV or nv[2] == 0 or H % nv[2]:
        fail(name, "v needs k's n_kv (ne1) and a head count dividing q's", k=k, v=v)
    if mask is not None:
        mask = np.asarray(mask)
        nm = ne4(mask.shape)
        if mask.dtype != np.float16:
            fail(name, f"mask must be f16, got {mask.dtype}", q=q, mask=mask)
        if not mask.flags.c_contiguous:
            fail(name, "mask must be contiguous", q=q, mask=mask)
        if 0 in nm[2:] or H % nm[2] or S % nm[3]:
            fail(name, "mask ne2, ne3 must divide q's (n_head, n_seq)", q=q, mask=mask)
        if nm[0] < NKV or nm[1] < N:
            # ggml does not check these; it would read past the mask
            fail(name, "mask needs ne0 >= n_kv and ne1 >= n_tokens", q=q, k=k, mask=mask)
    elif max_bias > 0.0:
        fail(name, "max_bias > 0 (ALiBi) needs a mask", q=q)
    if sinks is not None:
        sinks = np.asarray(sinks)
        if sinks.dtype != np.float32 or sinks.size != H or ne4(sinks.shape)[0] != H:
            fail(name, "sinks must be f32 ne [n_head]", q=q, sinks=sinks)


@op("flash_attn_ext", check=_check_flash_attn_ext, layout_check=True)
def flash_attn_ext(q: np.ndarray, k, v, mask: np.ndarray | None = None, scale: float = 1.0, max_bias: float = 0.0,
                   logit_softcap: float = 0.0, sinks: np.ndarray | None = None) -> np.ndarray:
    """ggml_flash_attn_ext (+ ggml_flash_attn_ext_add_sinks): softmax(scale * q k^T + slope*mask) v per head.

    q      ne [head_dim, n_tokens, n_head, n_seq]     numpy (n_seq, n_head, n_tokens, head_dim)   f32
           (llama.cpp passes ggml_permute(q, 0, 2, 1, 3) of its (n_tokens, n_head, head_dim) Q: a view)
    k      ne [head_dim, n_kv, n_head_kv, n_seq]      numpy (n_seq, n_head_kv, n_kv, head_dim)    f32/f16 or
           QTensor (bf16, quantized); n_head % n_head_kv == 0
    v      ne [head_dim_v, n_kv, n_head_kv, n_seq]    numpy (n_seq, n_head_kv, n_kv, head_dim_v)  same kinds;
           NOT transposed (unlike the mul_mat formulation)
    mask   ne [>= n_kv, >= n_tokens, m2, m3]          numpy (m3, m2, >= n_tokens, >= n_kv)        f16, contiguous;
           query row i uses mask row i (llama.cpp pads the rows), tiled over heads and sequences
           (n_head % m2 == 0, n_seq % m3 == 0, head h uses mask h % m2)
    sinks  ne [n_head]                                numpy (n_head,)                             f32
    out    ne [head_dim_v, n_head, n_tokens, n_seq]   numpy (n_seq, n_tokens, n_head, head_dim_v) f32: ggml's
           result is PERMUTED relative to q (tokens before heads), ready to reshape to (n_tokens, n_embd_v)

        s_ij = scale * q_i.k_j               (logit_softcap c != 0: s_ij = c * tanh(q_i.k_j * (scale/c)))
        s_ij += slope_h * mask_ij            (slope: ALiBi as in soft_max_ext, heads = q's dim 2; 1 if max_bias 0)
        out_i = sum_j exp(s_ij - M) v_j / (sum_j exp(s_ij - M) + exp(sink_h - M)),  M = max(max_j s_ij, sink_h)

    Query head h reads K/V head h // (n_head / n_head_kv): grouped-query attention is a block broadcast
    (np.repeat), not a tile. Positions whose mask is -inf are skipped; a row with every position masked and no
    sink is 0 (not NaN as in soft_max_ext).
    Exact mode: f64 attention on the given K/V values (QTensors dequantized exactly), rounded once to f32.
    ggml-cpu differs by its code path (semantics §4.9): with fewer than 64 queries it rounds q to K's
    vec_dot type (f16 for F16 K, Q8_0/Q8_K blocks for quantized K) and keeps an f16 output accumulator for
    F16 V (~1e-3 abs); 64 or more queries with F16/F32 K=V use f32 tiles (~1e-6).
    ggml-cpu bug (0.15.3): on that tiled path (n_tokens >= 64, K and V both F16 or both F32, head_dim_v a
    multiple of the SIMD width) with logit_softcap != 0 and no mask, the padding of a last kv tile shorter than
    64 gets tanh(-inf)*c = -c instead of -inf and takes softmax mass: ggml's output is wrong whenever n_kv % 64
    != 0. This function gives the defined value; the golden cases avoid that combination.
    """
    q = np.asarray(q)
    k, v = (x if isinstance(x, QTensor) else np.asarray(x) for x in (k, v))
    nq, nk, nv = ne4(q.shape), ne4(k.shape), ne4(v.shape)
    DK, N, H, S = nq
    NKV, HKV = nk[1], nk[2]
    slopes = alibi_slopes(H, max_bias).astype(np.float64)
    if mask is not None:
        mask = np.asarray(mask)
        nm = ne4(mask.shape)
    if sinks is not None:
        sinks = np.asarray(sinks)

    r = H // HKV
    q4 = q.reshape(nq[::-1]).astype(np.float64)                              # (S, H, N, DK)
    k4 = np.repeat(_values(k, nk[::-1]), r, axis=1)                          # (S, H, NKV, DK)
    v4 = np.repeat(_values(v, nv[::-1]), H // nv[2], axis=1)                 # (S, H, NKV, DV)
    raw = np.einsum("shnd,shkd->shnk", q4, k4)
    if logit_softcap != 0.0:
        c = np.float32(logit_softcap)
        s = np.float64(c) * np.tanh(raw * np.float64(np.float32(scale) / c))
    else:
        s = raw * np.float64(np.float32(scale))
    if mask is not None:
        m4 = mask.reshape(nm[::-1])
        m = m4[np.arange(S)[:, None] % nm[3], np.arange(H)[None, :] % nm[2]][:, :, :N, :NKV]
        with np.errstate(invalid="ignore"):
            s = s + slopes[None, :, None, None] * m.astype(np.float64)
    M = np.max(s, axis=-1, keepdims=True)
    if sinks is not None:
        sk = sinks.reshape(1, H, 1, 1).astype(np.float64)
        M = np.maximum(M, sk)
    with np.errstate(invalid="ignore", over="ignore"):
        live = np.isfinite(M)                                                # rows with something unmasked
        Ms = np.where(live, M, 0.0)
        e = np.where(np.isneginf(s), 0.0, np.exp(s - Ms))
        total = np.sum(e, axis=-1, keepdims=True)
        if sinks is not None:
            total = total + np.exp(sk - Ms)
        o = np.einsum("shnk,shkd->shnd", e, v4)
        out = np.where(total > 0, o / np.where(total > 0, total, 1.0), 0.0)
    out = out.transpose(0, 2, 1, 3).astype(np.float32)                        # (S, N, H, DV)
    nd = max(q.ndim, 3)
    return out.reshape(out.shape[4 - nd:])


@op("lightning_indexer")
def lightning_indexer(q: np.ndarray, k, weights: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """ggml_lightning_indexer(ctx, q, k, weights, mask) (ggml 0.25.3): DeepSeek's sparse-attention indexer score.

    q        ne [n_embd, n_head, n_batch, ns]   numpy (ns, n_batch, n_head, n_embd)   f32
    k        ne [n_embd, 1, n_kv, ns]           numpy (ns, n_kv, 1, n_embd)           f32, f16 or a QTensor
    weights  ne [n_head, n_batch, 1, ns]        numpy (ns, 1, n_batch, n_head)        f32, already scaled
    mask     ne [n_kv, n_batch, 1, nm]          numpy (nm, 1, n_batch, n_kv)          f16, ns % nm == 0
    out      ne [n_kv, n_batch, 1, ns]          numpy (ns, 1, n_batch, n_kv)          f32

        out[s, t, j] = sum_h max(q[s, t, h] . k[s, j], 0) * weights[s, t, h] + mask[s % nm, t, j]

    Exact mode: each q.k in f64 rounded to f32 (ggml-cpu: ggml_vec_dot_f32), the head sum in f64 rounded once,
    then the f32 mask added. The mask of stream s is mask[s % nm] (np.tile, not np.repeat).
    """
    k, _ = _kv("lightning_indexer", k, "k", q)
    q, weights, mask = np.asarray(q), np.asarray(weights), np.asarray(mask)
    ops_ = dict(q=q, k=k, weights=weights, mask=mask)
    if q.dtype != np.float32 or weights.dtype != np.float32 or mask.dtype != np.float16:
        fail("lightning_indexer", "q and weights must be f32, mask f16", **ops_)
    nq, nk, nw, nm = ne4(q.shape), ne4(k.shape), ne4(weights.shape), ne4(mask.shape)
    n_embd, n_head, n_batch, ns = nq
    n_kv = nk[2]
    if (nk[0] != n_embd or nk[1] != 1 or nk[3] != ns or nw[:3] != [n_head, n_batch, 1] or nw[3] != ns
            or nm[:3] != [n_kv, n_batch, 1] or nm[3] == 0 or ns % nm[3]):
        fail("lightning_indexer", "need k [n_embd, 1, n_kv, ns], weights [n_head, n_batch, 1, ns] and mask "
             "[n_kv, n_batch, 1, nm] with ns % nm == 0 for q [n_embd, n_head, n_batch, ns]", **ops_)
    q4 = q.reshape(ns, n_batch, n_head, n_embd).astype(np.float64)
    k3 = _values(k, tuple(nk[::-1])).reshape(ns, n_kv, n_embd)
    w3 = weights.reshape(ns, n_batch, n_head).astype(np.float64)
    m3 = mask.reshape(nm[3], n_batch, n_kv).astype(np.float32)
    qk = np.einsum("sthe,sje->sthj", q4, k3).astype(np.float32)             # (ns, n_batch, n_head, n_kv)
    score = np.einsum("sthj,sth->stj", np.maximum(qk, np.float32(0)).astype(np.float64), w3).astype(np.float32)
    with np.errstate(all="ignore"):
        out = score + m3[np.arange(ns) % nm[3]]
    return out.reshape(ns, 1, n_batch, n_kv)
