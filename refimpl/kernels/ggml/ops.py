"""numerics="ggml" for the ops around mul_mat: rms_norm, norm, soft_max_ext, rope_ext, silu, swiglu, swiglu_oai,
rwkv_wkv7, tanh, exp, sigmoid.

Each function takes the op's arguments (its refimpl signature without `numerics`) and returns ggml-cpu's
result on the portable AVX2 build bit for bit. Exact mode already matches ggml in everything but:

    rms_norm      the f64 sum of squares is sequential in ggml (NumPy's np.sum is pairwise)
    norm          the row sum is a sequential f64 sum; the squares are pre-added 8 at a time in f32 (hsum_b)
                  before the f64 sum, the tail one by one; strided rows take a scalar f32 path
    soft_max_ext  vexp on 8-lane chunks, libm expf on the tail, chunk sums in f32 (hsum_b), sequential f64
                  sum; ALiBi slopes by libm powf; w += slope*mask as one FMA
    rope_ext      libm powf/logf/cosf/sinf; YaRN's mix and mscale FMAs; each rotation
                  x0*cos - x1*sin as fma(x0, cos, -fl(x1*sin)), x0*sin + x1*cos as fma(x0, sin, fl(x1*cos)),
                  except NORMAL's odd last pair (unfused)
    silu, swiglu  vexp / vsilu on 8-lane chunks of each row, libm expf on the tail (f16: libm throughout)
    swiglu_oai    the C library's expf on every element (a scalar loop)
    rwkv_wkv7     sa = Σ a·s and out = Σ s·r in the AVX2 kernel's 4 x 8 FMA lanes, reduced as ggml_vec_dot_f32
    tanh, exp,    the C library's tanhf / expf on every element (ggml-cpu's scalar loops: no SIMD form),
    sigmoid       sigmoid as 1.f/(1.f + expf(-x)); exact mode rounds the correctly rounded f64 function,
                  which glibc's tanhf misses on ~1/3 of RWKV's LoRA activations

Each is registered for numerics key "ggml" (every backend): the op has checked the arguments by then, and a
function returns NotImplemented for inputs it does not emulate (the reference body then runs).
"""
from __future__ import annotations

import numpy as np

from ...dispatch import register
from ...ops import elementwise as ew
from ...ops.elementwise import cap_clamp, map_glu, map_unary
from ...types import type_name
from ...ops.rope import ROPE_TYPE_NEOX, ROPE_TYPE_NORMAL
from ...shapes import ne4, check_tiles, tile_to
from .simd import c_libm, chunk_split, vexp, vsilu
from .vecdot import fma32, hsum_a, hsum_b

f32, f64 = np.float32, np.float64


def _seq_sum_f64(terms: np.ndarray) -> np.ndarray:
    """sum += (double)t over the last axis, in index order (np.cumsum accumulates sequentially; np.sum is
    pairwise): (..., n) -> (..., 1) f64."""
    if terms.shape[-1] == 0:
        return np.zeros(terms.shape[:-1] + (1,), f64)
    return np.cumsum(terms.astype(f64), axis=-1)[..., -1:] + f64(0.0)     # from +0.0: a row of -0.0 sums to +0.0


def _seq_sum_f32(terms: np.ndarray) -> np.ndarray:
    """`float sum = 0; sum += t` in index order: (..., n) f32 -> (..., 1) f32."""
    if terms.shape[-1] == 0:
        return np.zeros(terms.shape[:-1] + (1,), f32)
    return np.cumsum(terms.astype(f32), axis=-1, dtype=f32)[..., -1:] + f32(0.0)


def _chunked_sum(v: np.ndarray) -> np.ndarray:
    """The AVX2 reduction of ggml_vec_soft_max_f32 / ggml_vec_cvar_f32 over the last axis: each full chunk of
    8 summed in f32 by hsum_b, widened and added to an f64 sum in order, then the tail elements one by one:
    (..., n) f32 -> (..., 1) f64."""
    n = v.shape[-1]
    nf = chunk_split(n)
    lanes = np.moveaxis(v[..., :nf].reshape(v.shape[:-1] + (nf // 8, 8)), -1, 0)
    terms = np.concatenate([hsum_b(lanes), v[..., nf:]], axis=-1)
    return _seq_sum_f64(terms)


# -- norms --------------------------------------------------------------------------------------------------

def rms_norm(a, eps):
    """ggml_compute_forward_rms_norm_f32: sum += (double)fl(x*x) in order; mean = fl(sum/n);
    scale = 1/sqrtf(mean + eps); y = x*scale."""
    a, eps = np.asarray(a), f32(eps)                 # the op checked them
    n = a.shape[-1]
    mean = (_seq_sum_f64(np.square(a)) / n).astype(f32)
    with np.errstate(divide="ignore", invalid="ignore"):
        return a * (f32(1) / np.sqrt(mean + eps))


def norm(a, eps):
    """ggml_compute_forward_norm_f32. Packed rows: mean = fl((float)Σ_f64 x / n); y = x - mean;
    var = (float)(Σ chunks of hsum_b(fl(y²)) and tail fl(y²), in f64, / n); y *= 1/sqrtf(var + eps).
    Strided rows (a transposed view): sum and variance in sequential f32, variance += y*y fused (FMA),
    var = fl(var/n)."""
    a, eps = np.asarray(a), f32(eps)                 # the op checked them
    n = a.shape[-1]
    packed = a.ndim == 0 or n <= 1 or a.strides[-1] == a.itemsize
    with np.errstate(all="ignore"):
        if packed:
            mean = _seq_sum_f64(a).astype(f32) / f32(n)
            y = a - mean
            var = (_chunked_sum(y * y) / n).astype(f32)
        else:
            mean = _seq_sum_f32(a) / f32(n)
            y = a - mean
            var = np.zeros(a.shape[:-1] + (1,), f32)
            for i in range(n):
                var = fma32(y[..., i:i + 1], y[..., i:i + 1], var)
            var = var / f32(n)
        return y * (f32(1) / np.sqrt(var + eps))


# -- softmax ---------------------------------------------------------------------------------------------

def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """The ALiBi slopes as ggml-cpu computes them, with the C library's powf:
    m0 = powf(2, -max_bias/n_log2), m1 = powf(2, -(max_bias/2)/n_log2), slope = powf(m0, h+1) for h < n_log2,
    else powf(m1, 2(h - n_log2) + 1); 1 when max_bias <= 0."""
    if not max_bias > 0.0:
        return np.ones(n_head, f32)
    n_log2 = f32(1 << int(np.floor(np.log2(n_head))))
    mb = f32(max_bias)
    m0 = c_libm("powf", f32(2), -mb / n_log2)
    m1 = c_libm("powf", f32(2), -(mb / f32(2)) / n_log2)
    h = np.arange(n_head)
    base = np.where(h < n_log2, m0, m1).astype(f32)
    expo = np.where(h < n_log2, h + 1, 2 * (h - int(n_log2)) + 1).astype(f32)
    return c_libm("powf", base, expo)


def soft_max_ext(a, mask=None, scale=1.0, max_bias=0.0, sinks=None):
    """ggml_compute_forward_soft_max_f32, per row: w = fl(x*scale); with a mask w = fma(slope, m, w);
    M = max(w) (and the sink); e = vexp(fl(w - M)) on 8-lane chunks, libm expf on the tail; sum = the chunked
    f64 sum (+ expf(sink - M)); y = e * (float)(1.0/sum)."""
    a = np.asarray(a)
    if a.dtype != np.float32 or not a.flags.c_contiguous or (mask is None and max_bias > 0.0):
        return NotImplemented                                       # the reference body raises the op's error
    na = ne4(a.shape)
    a4 = a.reshape(na[::-1])
    with np.errstate(all="ignore"):
        w = a4 * f32(scale)
        if mask is not None:
            mask = np.asarray(mask)
            nm = ne4(mask.shape)
            if (mask.dtype not in (np.float16, np.float32) or not mask.flags.c_contiguous or nm[0] != na[0]
                    or nm[1] < na[1] or na[2] % nm[2] or na[3] % nm[3]):
                return NotImplemented
            m4 = mask.reshape(nm[::-1])[:, :, :na[1], :].astype(f32)
            check_tiles("soft_max_ext", a4, m4)
            m = tile_to(a4, m4)
            slope = alibi_slopes(na[2], max_bias)[None, :, None, None]
            w = fma32(slope, m, w)
        M = np.max(w, axis=-1, keepdims=True)
        if sinks is not None:
            sinks = np.asarray(sinks)
            if sinks.dtype != np.float32 or sinks.size != na[2]:
                return NotImplemented
            sk = sinks.reshape(1, na[2], 1, 1)
            M = np.where(M > sk, M, sk)                                      # MAX(max, sk)
        d = w - M
        nf = chunk_split(na[0])
        e = np.concatenate([vexp(d[..., :nf]), c_libm("expf", d[..., nf:])], axis=-1)
        total = _chunked_sum(e)
        if sinks is not None:
            total = total + c_libm("expf", sk - M).astype(f64)
        with np.errstate(divide="ignore"):
            inv = (1.0 / total).astype(f32)
        return (e * inv).reshape(a.shape)


# -- silu, swiglu -----------------------------------------------------------------------------------------

def _silu_scalar(x):
    """ggml_silu_f32: x/(1.0f + expf(-x)) with the C library's expf."""
    return x / (f32(1) + c_libm("expf", -x))


def _silu_rows(x: np.ndarray) -> np.ndarray:
    nf = chunk_split(x.shape[-1])
    return np.concatenate([vsilu(x[..., :nf]), _silu_scalar(x[..., nf:])], axis=-1)


def silu(a):
    """ggml_vec_silu_f32 per row (vsilu on 8-lane chunks, the scalar formula on the tail); f16/bf16: the
    scalar formula on every element (ggml_vec_silu_f16/_bf16), rounded to a's type."""
    t = type_name(a)
    return map_unary("silu", a, _silu_rows if t == "f32" else _silu_scalar)


def swiglu(a, b=None, *, swapped: bool = False):
    """ggml_vec_swiglu_f32 per row: fl(vsilu(x)*g) on 8-lane chunks, fl(silu(x)*g) on the tail (libm expf);
    f16/bf16: the scalar form on every element, rounded to a's type."""
    def act(x, g, t):
        return (_silu_rows(x) if t == "f32" else _silu_scalar(x)) * g
    return map_glu("swiglu", a, b, swapped, act)


def swiglu_oai(a, b=None, alpha: float = 1.702, limit: float = 7.0, *, swapped: bool = False):
    """ggml_compute_forward_swiglu_oai_f32: x / (1.f + expf(alpha * (-x))) * (g + 1.f) on the capped and
    clamped halves, f32 steps, expf the C library's (a scalar loop: no SIMD form)."""
    def act(x, g, t):
        xc, gc = cap_clamp(x, g, limit)
        return xc / (f32(1) + c_libm("expf", f32(alpha) * -xc)) * (gc + f32(1))
    return map_glu("swiglu_oai", a, b, swapped, act, ("f32",))


# -- GELU through ggml-cpu's f16 tables (GGML_GELU_FP16) -----------------------------------------------------

def _gelu_cpu(x, t):
    """ggml_vec_gelu_f32 / _f16: f32: 0 if x <= -10, x if x >= 10, else T[fl16(x)]; f16: T[x]; bf16: the formula
    in f32 steps (ggml_vec_gelu_bf16 has no table)."""
    if t == "bf16":
        return ew.gelu_tanh_f32(x)
    if t == "f16":
        return ew.f16_table_lookup(ew.gelu_table(), x)
    return np.where(x <= f32(-10), f32(0), np.where(x >= f32(10), x, ew.f16_table_lookup(ew.gelu_table(), x)))


def _gelu_quick_cpu(x, t):
    """ggml_vec_gelu_quick_f32 / _f16: T[fl16(x)] always (inputs past f16's range become +-inf first); bf16: the
    formula."""
    return ew.gelu_quick_f32(x) if t == "bf16" else ew.f16_table_lookup(ew.gelu_quick_table(), x)


def gelu(a):
    """ggml-cpu's gelu: through its f16 table (refimpl.ops.elementwise.gelu has the formula)."""
    t = type_name(a)
    return map_unary("gelu", a, lambda x: _gelu_cpu(x, t))


def gelu_quick(a):
    """ggml-cpu's gelu_quick: through its f16 table."""
    t = type_name(a)
    return map_unary("gelu_quick", a, lambda x: _gelu_quick_cpu(x, t))


def geglu(a, b=None, *, swapped: bool = False):
    """ggml-cpu's geglu: gelu from its table (f32: the +-10 rule, then T[fl16(x)]), times g in f32."""
    def act(x, g, t):
        if t == "f32":
            return np.where(x <= f32(-10), f32(0), np.where(x >= f32(10), x * g,
                                                            ew.f16_table_lookup(ew.gelu_table(), x) * g))
        return _gelu_cpu(x, t) * g
    return map_glu("geglu", a, b, swapped, act)


def geglu_quick(a, b=None, *, swapped: bool = False):
    """ggml-cpu's geglu_quick: T[fl16(x)] * g (bf16: the formula)."""
    return map_glu("geglu_quick", a, b, swapped, lambda x, g, t: _gelu_quick_cpu(x, t) * g)


# -- unary ops on the C library ----------------------------------------------------------------------------

def tanh(a):
    """ggml_tanh (op_tanh in unary-ops.cpp): the C library's tanhf per element; f16/bf16 through f32."""
    return map_unary("tanh", a, lambda x: c_libm("tanhf", x))


def exp(a):
    """ggml_exp (op_exp): the C library's expf per element; f16/bf16 through f32."""
    return map_unary("exp", a, lambda x: c_libm("expf", x))


def sigmoid(a):
    """ggml_sigmoid (op_sigmoid): 1.f / (1.f + expf(-x)) in f32 steps, expf the C library's."""
    return map_unary("sigmoid", a, lambda x: f32(1) / (f32(1) + c_libm("expf", -x)))


# -- rwkv_wkv7 -------------------------------------------------------------------------------------------

WKV7_STEP = 32        # GGML_F32_STEP on AVX2: the kernel steps over the key index 32 at a time (4 x 8 lanes)


def _lanes_dot(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Σ_j x[..., j]*y[..., j] as the AVX2 GGML_F32 loop sums it: chunks of 32 held in 4 registers of 8 lanes,
    acc[c] = fma(x, y, acc[c]); GGML_F32_VEC_REDUCE = (acc0 + acc2) + (acc1 + acc3), then hsum_a.
    x, y broadcast over (..., S), S a multiple of 32 -> (...) f32."""
    x, y = np.broadcast_arrays(x, y)
    S = x.shape[-1]
    xs = x.reshape(x.shape[:-1] + (S // WKV7_STEP, 4, 8))
    ys = y.reshape(xs.shape)
    acc = np.zeros(xs.shape[:-3] + (4, 8), f32)
    for c in range(xs.shape[-3]):
        acc = fma32(xs[..., c, :, :], ys[..., c, :, :], acc)
    v = (acc[..., 0, :] + acc[..., 2, :]) + (acc[..., 1, :] + acc[..., 3, :])
    return hsum_a(np.moveaxis(v, -1, 0))


def rwkv_wkv7(r, w, k, v, a, b, state):
    """ggml_compute_forward_rwkv_wkv7_f32, SIMD path (AVX2), per token, head and value index i:
    sa = _lanes_dot(a, s[i]); s[i][j] = fma(sa, b[j], fma(s[i][j], w[j], fl(v[i]*k[j]))) (as exact mode);
    out[i] = _lanes_dot(s[i], r) over the updated row. The kernel has no remainder loop: for a head size
    that is not a multiple of 32 ggml reads past the rows, and this returns exact mode's formula."""
    r, w, k, v, a, b, state = (np.asarray(x) for x in (r, w, k, v, a, b, state))
    S, H, T, _ = ne4(k.shape)                      # the op checked the shapes
    n_seqs = ne4(state.shape)[1]
    if S % WKV7_STEP:
        return NotImplemented
    r3, w3, k3, v3, a3, b3 = (x.reshape(T, H, S).astype(f32) for x in (r, w, k, v, a, b))
    s_in = state.reshape(n_seqs, H, S, S).astype(f32)
    tps = T // n_seqs
    y = np.empty((T, H, S), f32)
    states = np.empty((n_seqs, H, S, S), f32)
    with np.errstate(all="ignore"):
        for t in range(T):
            if t % tps == 0:
                s = s_in[t // tps]
            sa = _lanes_dot(a3[t][:, None, :], s)                                     # (H, S_i)
            kv = v3[t][:, :, None] * k3[t][:, None, :]
            s = fma32(sa[:, :, None], b3[t][:, None, :], fma32(s, w3[t][:, None, :], kv))
            y[t] = _lanes_dot(s, r3[t][:, None, :])
            if t % tps == tps - 1:
                states[t // tps] = s
    return np.concatenate([y.reshape(-1, S * H), states.reshape(-1, S * H)])   # outputs, then the states


# -- rope -------------------------------------------------------------------------------------------------

def _yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow):
    """ggml_rope_yarn_corr_dims with the C library's logf (floorf/ceilf/fmaxf/fminf are exact)."""
    def corr(n_rot):
        arg = f32(n_ctx_orig) / (f32(n_rot) * f32(2) * f32(np.pi))
        return f32(n_dims) * c_libm("logf", arg) / (f32(2) * c_libm("logf", f32(freq_base)))
    with np.errstate(divide="ignore", invalid="ignore"):
        start, end = np.floor(corr(beta_fast)), np.ceil(corr(beta_slow))
    lo = f32(0) if f32(0) > start else start
    hi = f32(n_dims - 1) if f32(n_dims - 1) < end else end
    return f32(lo), f32(hi)


def rope_cache(pos, freq_factors, n_dims, ne0, freq_base, freq_scale, ext_factor, attn_factor, n_ctx_orig,
               beta_fast, beta_slow):
    """ggml_rope_cache_init for every token: (cos, sin) f32 (n_tokens, ne0/2), as refimpl.ops.rope.rope_cache
    but with the C library's powf, logf, cosf, sinf and ggml's contracted FMAs (YaRN's theta mix, mscale)."""
    half = ne0 // 2
    theta_scale = c_libm("powf", f32(freq_base), f32(-2.0) / f32(n_dims))
    lo, hi = _yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
    fs, ext = f32(freq_scale), f32(ext_factor)
    mscale = f32(attn_factor)
    if ext != 0:
        mscale = f32(mscale * fma32(f32(0.1), c_libm("logf", f32(1) / fs), f32(1)))
    ff = None if freq_factors is None else np.asarray(freq_factors, f32).reshape(-1)
    theta = np.asarray(pos).astype(f32)
    thetas = np.empty((theta.shape[0], half), f32)
    for i in range(half):
        thetas[:, i] = theta
        theta = theta * theta_scale
    with np.errstate(all="ignore"):
        if ff is not None:
            n_ff = min(half, ff.shape[0])
            thetas[:, :n_ff] = thetas[:, :n_ff] / ff[:n_ff]
        t_i = fs * thetas
        th = t_i
        if ext != 0:
            i = np.arange(half)
            d = f32(hi - lo)
            y = (i.astype(f32) - lo) / (f32(0.001) if f32(0.001) > d else d)
            y = np.where(f32(0) > y, f32(0), y)
            ramp = f32(1) - np.where(f32(1) < y, f32(1), y)
            mix = (ramp * ext).astype(f32)
            th = fma32(t_i, f32(1) - mix, thetas * mix)
    return c_libm("cosf", th) * mscale, c_libm("sinf", th) * mscale


def rope_ext(x, pos, freq_factors=None, *, n_dims, mode=0, n_ctx_orig=0, freq_base=10000.0, freq_scale=1.0,
             ext_factor=0.0, attn_factor=1.0, beta_fast=32.0, beta_slow=1.0):
    """ggml_compute_forward_rope_flt for modes NORMAL and NEOX: the cache above, then per pair
    x0' = fma(x0, cos, -fl(x1*sin)), x1' = fma(x0, sin, fl(x1*cos)) (GCC's contraction of rotate_pairs; for
    NORMAL with an odd number of pairs the last one is fl(fl(x0*cos) - fl(x1*sin)), fl(fl(x0*sin) + fl(x1*cos))),
    rounded to x's type; dims >= n_dims copied. F32 measured; the F16 kernel is assumed to contract alike
    (its f16 rounding hides nearly every difference)."""
    if int(mode) not in (ROPE_TYPE_NORMAL, ROPE_TYPE_NEOX):
        raise ValueError(f"rope_ext: numerics='ggml' covers modes NORMAL and NEOX, not {mode}")
    x = np.asarray(x)                              # the op checked the arguments
    n = ne4(x.shape)
    n_dims = int(n_dims)
    cos, sin = rope_cache(np.asarray(pos).reshape(-1), freq_factors, n_dims, n[0], freq_base, freq_scale,
                          ext_factor, attn_factor, n_ctx_orig, beta_fast, beta_slow)
    x4 = x.reshape(n[::-1]).astype(f32)
    out = x4.copy()
    k = n_dims // 2
    if int(mode) == ROPE_TYPE_NORMAL:
        i0, i1 = np.arange(0, n_dims, 2), np.arange(1, n_dims, 2)
    else:
        i0, i1 = np.arange(k), np.arange(k, n_dims)
    c, s = cos[None, :, None, :k], sin[None, :, None, :k]
    a0, a1 = x4[..., i0], x4[..., i1]
    with np.errstate(all="ignore"):
        out[..., i0] = fma32(a0, c, -(a1 * s))
        out[..., i1] = fma32(a0, s, a1 * c)
        if int(mode) == ROPE_TYPE_NORMAL and k % 2:
            # GCC vectorises NORMAL's interleaved loop 4 and 2 pairs at a time (fused as above); an odd last
            # pair runs as scalar code without contraction
            j0, j1, cl, sl = a0[..., -1], a1[..., -1], c[..., -1], s[..., -1]
            out[..., i0[-1]] = j0 * cl - j1 * sl
            out[..., i1[-1]] = j0 * sl + j1 * cl
    return out.astype(x.dtype).reshape(x.shape)


OPS = {"rms_norm": rms_norm, "norm": norm, "soft_max_ext": soft_max_ext, "rope_ext": rope_ext, "silu": silu,
       "swiglu": swiglu, "swiglu_oai": swiglu_oai, "tanh": tanh, "exp": exp, "gelu": gelu,
       "gelu_quick": gelu_quick, "geglu": geglu, "geglu_quick": geglu_quick,
       "sigmoid": sigmoid, "rwkv_wkv7": rwkv_wkv7}
for _name, _fn in OPS.items():
    register(_name, numerics="ggml")(_fn)
