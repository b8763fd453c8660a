"""Rotary position embeddings: rope_ext (NORMAL, NEOX), rope_multi (MROPE, IMROPE, VISION) and their
inverses rope_ext_back / rope_multi_back, all one function `_rope` with ggml's f32 theta iteration.
"""
from __future__ import annotations

import numpy as np

from ..dispatch import op
from ..rounding import libm_f32
from ..shapes import fail, ne4

# enum values of ggml's rope modes (include/ggml.h GGML_ROPE_TYPE_*)
ROPE_TYPE_NORMAL = 0     # pairs (2i, 2i+1): llama GGUF checkpoints (Q/K rows permuted by the converter)
ROPE_TYPE_NEOX = 2       # pairs (i, i + n_dims/2): "rotate_half" (GPT-NeoX, Qwen, Phi, ...)
ROPE_TYPE_MROPE = 8      # NEOX pairing; each section of pairs takes its own position (time, height, width, extra)
ROPE_TYPE_VISION = 24    # pairs (i, i + n_dims), n_dims = head_dim/2; every dim rotated; sections restart theta
ROPE_TYPE_IMROPE = 40    # MROPE with the sections interleaved (Qwen3-VL)
MODES = (ROPE_TYPE_NORMAL, ROPE_TYPE_NEOX, ROPE_TYPE_MROPE, ROPE_TYPE_VISION, ROPE_TYPE_IMROPE)

F32 = np.float32


def yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float, beta_slow: float):
    """ggml_rope_yarn_corr_dims: the pair indices (lo, hi) between which YaRN ramps from extrapolation to
    interpolation, in f32 as ggml computes them:

        corr(b) = n_dims * logf(n_ctx_orig / (b * 2 * pi)) / (2 * logf(freq_base))
        lo = max(0, floorf(corr(beta_fast))),  hi = min(n_dims - 1, ceilf(corr(beta_slow)))
    """
    def corr(n_rot):
        arg = F32(n_ctx_orig) / (F32(n_rot) * F32(2) * F32(np.pi))
        return F32(n_dims) * libm_f32(np.log, arg) / (F32(2) * libm_f32(np.log, F32(freq_base)))
    with np.errstate(divide="ignore", invalid="ignore"):
        start, end = np.floor(corr(beta_fast)), np.ceil(corr(beta_slow))
    lo = F32(0) if F32(0) > start else start             # C's MAX / MIN macros, NaN included
    hi = F32(n_dims - 1) if F32(n_dims - 1) < end else end
    return F32(lo), F32(hi)


def rope_cache(pos, freq_factors, n_dims: int, ne0: int, sections=(0, 0, 0, 0), mode: int = ROPE_TYPE_NORMAL,
               n_ctx_orig: int = 0, freq_base: float = 10000.0, freq_scale: float = 1.0, ext_factor: float = 0.0,
               attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0, sin_sign: float = 1.0):
    """(cos, sin), each f32 of NumPy shape (n_tokens, ne0/2): ggml-cpu's per-token rope cache, entry i for
    pair i. The definition of rope is this f32 recurrence (not p * base**(-2i/n_dims)):

        theta_scale = powf(freq_base, -2/n_dims);   theta_0 = p;   theta_{i+1} = fl(theta_i * theta_scale)
        t_e = theta_i / freq_factors[i];   t_i = freq_scale * t_e;   mscale = attn_factor
        YaRN (ext_factor != 0): mix = ramp(i) * ext_factor,  theta = t_i*(1 - mix) + fl(t_e*mix)  (one FMA),
            ramp(i) = 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1)  (lo, hi: yarn_corr_dims),
            mscale *= 1 + 0.1*logf(1/freq_scale)
        otherwise theta = t_i;   cos = cosf(theta)*mscale,  sin = sinf(theta)*mscale*sin_sign

    M-RoPE modes: pos holds 4 positions per token (pos[t], pos[t+T], pos[t+2T], pos[t+3T]); each iterates its own
    theta and sections choose per pair which one is used (see `rope_multi`).
    Every C operation is one f32 rounding; `a*b + c` (which GCC fuses into an FMA) is rounded once; libm
    functions are correctly rounded (f64 then f32).
    """
    pos = np.asarray(pos)
    mrope = bool(mode & ROPE_TYPE_MROPE)
    T = pos.shape[0] // 4 if mrope else pos.shape[0]
    half = ne0 // 2
    theta_scale = F32(libm_f32(lambda b: np.power(b, np.float64(F32(-2.0) / F32(n_dims))), F32(freq_base)))
    lo, hi = yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
    fs, ext = F32(freq_scale), F32(ext_factor)
    mscale = F32(attn_factor)
    if ext != 0:
        inner = np.float64(1.0) + np.float64(F32(0.1)) * np.float64(libm_f32(np.log, F32(1.0) / fs))
        mscale = F32(mscale * F32(inner))
    if mrope:
        bases = [pos[k * T:(k + 1) * T].astype(F32) for k in range(4)]
        s = [int(v) for v in sections]
        sect_dims = sum(s)
    else:
        bases = [pos.astype(F32)]
    thetas = [b.copy() for b in bases]
    ff = None if freq_factors is None else np.asarray(freq_factors, F32).reshape(-1)
    cos = np.empty((T, half), F32)
    sin = np.empty((T, half), F32)
    for i in range(half):
        k = 0
        if mrope:
            k, restart = _mrope_stream(i % sect_dims, mode, s)
            if restart is not None:
                thetas[restart] = bases[restart].copy()
        theta = thetas[k]
        # ggml reads freq_factors[i] for every pair of the row; pairs past n_dims/2 are never used, and
        # freq_factors need only cover n_dims/2 of them
        t_e = theta / ff[i] if ff is not None and i < ff.shape[0] else theta
        t_i = fs * t_e
        th = t_i if ext == 0 else _yarn_theta(i, t_i, t_e, lo, hi, ext)
        cos[:, i] = libm_f32(np.cos, th) * mscale
        sin[:, i] = libm_f32(np.sin, th) * mscale * F32(sin_sign)
        thetas = [t * theta_scale for t in thetas]
    return cos, sin


def _mrope_stream(sector: int, mode: int, s: list[int]) -> tuple[int, int | None]:
    """M-RoPE: which of a token's four position streams drives the pair at `sector` (its index modulo the
    sections' sum), and which stream restarts its theta at its base position there (VISION only: each
    section starts over), or None. s: the four section sizes."""
    sec_w = s[0] + s[1]
    sec_e = sec_w + s[2]
    restart = None
    if mode == ROPE_TYPE_VISION:                 # the first boundary that matches (sections may be empty)
        restart = next((k for k, at in enumerate((0, s[0], sec_w, sec_e)) if sector == at), None)
    if mode == ROPE_TYPE_IMROPE:                  # interleaved: sections take every third pair
        for k in (1, 2, 0):
            if sector % 3 == k and sector < 3 * s[k]:
                return k, restart
        return 3, restart
    if sector < s[0]:
        return 0, restart
    if sector < sec_w:
        return 1, restart
    return (2 if sector < sec_e else 3), restart


def _yarn_theta(i: int, t_i, t_e, lo, hi, ext):
    """YaRN's theta of pair i: the interpolated t_i and the extrapolated t_e mixed by ramp(i) * ext_factor,
    as ggml compiles it: fma(t_i, 1 - mix, fl(t_e * mix)), one rounding (one ulp of theta is 2.4e-4 rad at
    4k positions)."""
    d = F32(hi - lo)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = F32((F32(i) - lo) / (F32(0.001) if F32(0.001) > d else d))
    y = F32(0) if F32(0) > y else y
    ramp = F32(1) - (F32(1) if F32(1) < y else y)
    mix = F32(ramp * ext)
    return (t_i.astype(np.float64) * np.float64(F32(1) - mix) + (t_e * mix).astype(np.float64)).astype(F32)


def _check_rope(name, x, pos, freq_factors, n_dims, sections, mode) -> None:
    x = np.asarray(x)
    pos = np.asarray(pos)
    if x.dtype not in (np.float32, np.float16):
        fail(name, f"x must be f32 or f16, got {x.dtype}", x=x)
    if x.size and x.shape[-1] > 1 and x.strides[-1] != x.itemsize:
        fail(name, "rows of x (head_dim) must be contiguous (ggml asserts nb0 == type size)", x=x)
    n = ne4(x.shape)
    mode, n_dims = int(mode), int(n_dims)
    if mode & 1:
        fail(name, "mode & 1 (the old n_past flag) is no longer supported by ggml", x=x)
    if mode not in MODES:
        fail(name, f"rope mode {mode} is not one of ggml's {MODES}", x=x)
    if pos.dtype != np.int32 or pos.ndim == 0 or any(v != 1 for v in pos.shape[:-1]):
        fail(name, f"pos must be an i32 vector (ne [n]), got {pos.dtype}", x=x, pos=pos)
    pos = pos.reshape(-1)
    mrope = bool(mode & ROPE_TYPE_MROPE)
    if pos.shape[0] != (4 * n[2] if mrope else n[2]):
        fail(name, f"pos needs {'4 * ' if mrope else ''}x.ne2 (n_tokens) entries", x=x, pos=pos)
    if not (0 <= n_dims <= n[0]) or n_dims % 2:
        fail(name, f"n_dims ({n_dims}) must be even and <= head_dim (ne0)", x=x)
    if mode == ROPE_TYPE_VISION and 2 * n_dims != n[0]:
        fail(name, f"vision mode needs n_dims == head_dim/2, got n_dims {n_dims}", x=x)
    sections = tuple(int(v) for v in (sections if sections is not None else (0, 0, 0, 0)))
    if mrope:
        if len(sections) != 4 or min(sections) < 0 or not any(v > 0 for v in sections[:3]):
            fail(name, f"sections must be 4 non-negative ints, one of the first 3 > 0, got {sections}", x=x)
        if sum(sections) > n[0]:
            fail(name, f"sum(sections) = {sum(sections)} must be <= head_dim (ggml asserts it)", x=x)
    if freq_factors is not None:
        freq_factors = np.asarray(freq_factors)
        need = n_dims if mode == ROPE_TYPE_VISION else n_dims // 2     # vision reads n_dims of them
        if freq_factors.dtype != np.float32 or ne4(freq_factors.shape)[0] < need:
            fail(name, f"freq_factors must be f32 with ne0 >= {need}", x=x, freq_factors=freq_factors)


def _check_rope_ext(x, pos, freq_factors=None, *, n_dims, mode=ROPE_TYPE_NORMAL, **_) -> None:
    _check_rope("rope_ext", x, pos, freq_factors, n_dims, None, mode)


def _rope(name, x, pos, freq_factors, n_dims, sections, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
          attn_factor, beta_fast, beta_slow, sin_sign, checked=False):
    if not checked:
        _check_rope(name, x, pos, freq_factors, n_dims, sections, mode)
    x, pos = np.asarray(x), np.asarray(pos).reshape(-1)
    n = ne4(x.shape)
    mode, n_dims = int(mode), int(n_dims)
    sections = tuple(int(v) for v in (sections if sections is not None else (0, 0, 0, 0)))
    if freq_factors is not None:
        freq_factors = np.asarray(freq_factors)
    cos, sin = rope_cache(pos, freq_factors, n_dims, n[0], sections, mode, n_ctx_orig, freq_base, freq_scale,
                          ext_factor, attn_factor, beta_fast, beta_slow, sin_sign)
    x4 = x.reshape(n[::-1]).astype(np.float32)                  # (B, T, H, D)
    out = x4.copy()
    if mode == ROPE_TYPE_NORMAL:
        i0, i1, k = np.arange(0, n_dims, 2), np.arange(1, n_dims, 2), n_dims // 2
    elif mode == ROPE_TYPE_VISION:
        i0, i1, k = np.arange(n_dims), np.arange(n_dims, 2 * n_dims), n_dims
    else:
        i0, i1, k = np.arange(n_dims // 2), np.arange(n_dims // 2, n_dims), n_dims // 2
    c = cos[None, :, None, :k].astype(np.float64)
    s = sin[None, :, None, :k].astype(np.float64)
    a0, a1 = x4[..., i0].astype(np.float64), x4[..., i1].astype(np.float64)
    out[..., i0] = (a0 * c - a1 * s).astype(np.float32)
    out[..., i1] = (a0 * s + a1 * c).astype(np.float32)
    return out.astype(x.dtype).reshape(x.shape)


@op("rope_ext", covers="ROPE", check=_check_rope_ext, layout_check=True)
def rope_ext(x, pos, freq_factors=None, *, n_dims: int, mode: int = ROPE_TYPE_NORMAL, n_ctx_orig: int = 0,
             freq_base: float = 10000.0, freq_scale: float = 1.0, ext_factor: float = 0.0, attn_factor: float = 1.0,
             beta_fast: float = 32.0, beta_slow: float = 1.0):
    """ggml_rope_ext: rotate pairs of the first n_dims dims of each head by position-dependent angles.

    x             ne [head_dim, n_head, n_tokens, n]  numpy (n, n_tokens, n_head, head_dim)  f32/f16, rows contiguous
                  (llama.cpp: 3-D (n_tokens, n_head, head_dim) = ggml's [head_dim, n_head, n_tokens])
    pos           ne [n_tokens]                       numpy (n_tokens,)    i32, token t's position
    freq_factors  ne [>= n_dims/2]                    numpy (>= n_dims/2,) f32 or None (llama-3 `rope_freqs`)
    out           x's shape and type

        for pair i < n_dims/2 of token t:  (x0, x1) -> (x0*cos - x1*sin, x0*sin + x1*cos),  angles theta_i(pos[t])
        mode NORMAL (0): pair i = dims (2i, 2i+1);   NEOX (2): dims (i, i + n_dims/2);   dims >= n_dims unchanged

    theta_i is ggml's iterative f32 product pos*theta_scale**i with theta_scale = freq_base**(-2/n_dims), divided
    by freq_factors[i], scaled by freq_scale, YaRN-mixed when ext_factor != 0, and cos/sin multiplied by
    attn_factor (also without YaRN): see `rope_cache` for the exact recurrence, which is the definition (a
    pow-based theta differs by up to 5e-4 at position 4k). n_ctx_orig, beta_fast, beta_slow only matter for YaRN.
    Exact mode: the cache as ggml builds it (cosf/sinf/powf/logf correctly rounded), each rotated value from
    the f32 cos/sin in f64, rounded once to f32 (then to f16 for f16 x).
    """
    return _rope("rope_ext", x, pos, freq_factors, n_dims, None, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                 attn_factor, beta_fast, beta_slow, 1.0, checked=True)


@op("rope_multi", covers="ROPE")
def rope_multi(x, pos, freq_factors=None, *, n_dims: int, sections, mode: int = ROPE_TYPE_MROPE,
               n_ctx_orig: int = 0, freq_base: float = 10000.0, freq_scale: float = 1.0, ext_factor: float = 0.0,
               attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0):
    """ggml_rope_multi: multi-section rope (M-RoPE) of Qwen2-VL / Qwen3-VL text and vision encoders.

    x             ne [head_dim, n_head, n_tokens, n]  numpy (n, n_tokens, n_head, head_dim)  f32/f16, rows contiguous
    pos           ne [4*n_tokens]                     numpy (4*n_tokens,)  i32: positions t, h, w, e of token j
                                                      at pos[j], pos[j + T], pos[j + 2T], pos[j + 3T]  (T = n_tokens)
    freq_factors  ne [>= n_dims/2] (VISION: >= n_dims) f32 or None
    sections      4 ints (s0, s1, s2, s3), counts of pairs per position kind; sum(sections) <= head_dim
    out           x's shape and type

        pair i belongs to sector = i mod (s0+s1+s2+s3); theta_i iterates from the chosen position:
        MROPE (8):   t for sector < s0, h for < s0+s1, w for < s0+s1+s2, else e; NEOX pairs (i, i + n_dims/2)
        IMROPE (40): h if sector%3 == 1 and sector < 3*s1, w if sector%3 == 2 and sector < 3*s2,
                     t if sector%3 == 0 and sector < 3*s0, else e; NEOX pairs
        VISION (24): as MROPE, but each section restarts its theta at its own position (theta = p*scale**j,
                     j counted from the section start); n_dims must be head_dim/2 and pairs are (i, i + n_dims)
                     for all i < head_dim/2, so every dim is rotated
        NORMAL/NEOX: sections unused, pos has n_tokens entries (same as rope_ext)

    Every position kind iterates theta as in `rope_cache` (all four advance on every pair); the rest as
    rope_ext (YaRN, attn_factor, freq_factors, rounding).
    """
    return _rope("rope_multi", x, pos, freq_factors, n_dims, sections, mode, n_ctx_orig, freq_base, freq_scale,
                 ext_factor, attn_factor, beta_fast, beta_slow, 1.0)


@op("rope_ext_back", covers="ROPE_BACK")
def rope_ext_back(x, pos, freq_factors=None, *, n_dims: int, mode: int = ROPE_TYPE_NORMAL, n_ctx_orig: int = 0,
                  freq_base: float = 10000.0, freq_scale: float = 1.0, ext_factor: float = 0.0,
                  attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0):
    """ggml_rope_ext_back: the gradient of rope_ext, i.e. rope_ext with every sin negated (rotation by -theta).

    x    ne [head_dim, n_head, n_tokens, n]   numpy (n, n_tokens, n_head, head_dim)   f32/f16: dy
    pos  ne [n_tokens]                        i32;  freq_factors and the parameters as for rope_ext
    out  x's shape and type: dx

        (dy0, dy1) -> (dy0*cos + dy1*sin, -dy0*sin + dy1*cos)   with rope_ext's cos/sin (attn_factor included,
        so it inverts rope_ext only when attn_factor (and YaRN's mscale) is 1)
    """
    return _rope("rope_ext_back", x, pos, freq_factors, n_dims, None, mode, n_ctx_orig, freq_base, freq_scale,
                 ext_factor, attn_factor, beta_fast, beta_slow, -1.0)


@op("rope_multi_back", covers="ROPE_BACK")
def rope_multi_back(x, pos, freq_factors=None, *, n_dims: int, sections, mode: int = ROPE_TYPE_MROPE,
                    n_ctx_orig: int = 0, freq_base: float = 10000.0, freq_scale: float = 1.0, ext_factor: float = 0.0,
                    attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0):
    """ggml_rope_multi_back: the gradient of rope_multi, i.e. rope_multi with every sin negated.

    x    ne [head_dim, n_head, n_tokens, n]   numpy (n, n_tokens, n_head, head_dim)   f32/f16: dy
    pos  ne [4*n_tokens]                      i32;  sections, mode and the parameters as for rope_multi
    out  x's shape and type: dx
    """
    return _rope("rope_multi_back", x, pos, freq_factors, n_dims, sections, mode, n_ctx_orig, freq_base, freq_scale,
                 ext_factor, attn_factor, beta_fast, beta_slow, -1.0)
