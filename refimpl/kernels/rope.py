"""rope_ext with Numba (modes NORMAL and NEOX): ggml's f32 theta recurrence and the rotations.

Versions:
    _rope_tables per token: theta_0 = p, theta_{i+1} = fl(theta_i * theta_scale); t_e = theta / ff[i],
                 t_i = freq_scale * t_e, YaRN's one-rounding mix; cos/sin = fl(cos/sin(f64 theta)) *
                 mscale (* sin_sign) -- refimpl.ops.rope.rope_cache step for step
    _rotate      (x0, x1) -> fl(f64(x0)*c - f64(x1)*s), fl(f64(x0)*s + f64(x1)*c), other dims copied
The tables of the last few position sets are kept (`_tables`; Q and K of every layer share them). Tokens
are split over threads. The scalars (theta_scale, YaRN's corr dims and mscale) come from the same
NumPy expressions as the reference; cos and sin are libm's f64 functions rounded to f32 where the
reference uses NumPy's f64 functions: within an f64 ulp, so the f32 values agree except where that ulp
straddles an f32 rounding boundary. M-RoPE modes, f16/f32 x other than C-contiguous, and anything the
reference would reject run the NumPy reference.
"""
from __future__ import annotations


import struct

import numpy as np
from numba import njit

from ..ops import rope as ref_rope
from ..dispatch import register
from ..rounding import libm_f32
from ..shapes import ne4
from ._common import parallel_ranges

F32 = np.float32
PAR_MIN = 1 << 17       # elements per thread at least: below, a hand-off to the pool costs more than it saves


@njit(cache=True, nogil=True, error_model="numpy")
def _rope_tables(pos, ff, has_ff, half, theta_scale, fs, ext, lo_c, hi_c, mscale, sin_sign, cs, sn):
    """The rope cache of every token: cs, sn (T, half) f32 for the positions pos (T,)."""
    for t in range(pos.shape[0]):
        theta = np.float32(pos[t])
        for i in range(half):
            t_e = theta / ff[i] if has_ff and i < ff.shape[0] else theta
            t_i = fs * t_e
            th = t_i
            if ext != 0:
                d = np.float32(hi_c - lo_c)
                y = np.float32((np.float32(i) - lo_c) / (np.float32(0.001) if np.float32(0.001) > d else d))
                y = np.float32(0.0) if np.float32(0.0) > y else y
                ramp = np.float32(1.0) - (np.float32(1.0) if np.float32(1.0) < y else y)
                mix = ramp * ext
                th = np.float32(np.float64(t_i) * np.float64(np.float32(1.0) - mix) + np.float64(t_e * mix))
            cs[t, i] = np.float32(np.cos(np.float64(th))) * mscale
            sn[t, i] = np.float32(np.sin(np.float64(th))) * mscale * sin_sign
            theta = theta * theta_scale


@njit(cache=True, nogil=True, error_model="numpy")
def _rotate(x, cs, sn, n_dims, neox, out, t0, t1):
    """Tokens t0..t1-1 of x (B, T, H, D) f32 into out, token t rotated by cs[t], sn[t]."""
    B, T, H, D = x.shape
    k = n_dims // 2
    for t in range(t0, t1):
        for b in range(B):
            for h in range(H):
                xr = x[b, t, h]
                o = out[b, t, h]
                for i in range(n_dims, D):
                    o[i] = xr[i]
                for i in range(k):
                    i0 = i if neox else 2 * i
                    i1 = i + k if neox else 2 * i + 1
                    c = np.float64(cs[t, i])
                    s = np.float64(sn[t, i])
                    a0 = np.float64(xr[i0])
                    a1 = np.float64(xr[i1])
                    o[i0] = np.float32(a0 * c - a1 * s)
                    o[i1] = np.float32(a0 * s + a1 * c)


def _covered(x, pos, freq_factors, n_dims, mode) -> bool:
    if not (isinstance(x, np.ndarray) and x.dtype in (np.float32, np.float16) and 1 <= x.ndim <= 4 and x.size
            and x.flags.c_contiguous):
        return False
    if not (isinstance(pos, np.ndarray) and pos.dtype == np.int32 and pos.ndim >= 1
            and all(v == 1 for v in pos.shape[:-1])):
        return False
    n = ne4(x.shape)
    if int(mode) not in (ref_rope.ROPE_TYPE_NORMAL, ref_rope.ROPE_TYPE_NEOX) or pos.size != n[2]:
        return False
    if not (0 < int(n_dims) <= n[0]) or int(n_dims) % 2 or int(n_dims) != n_dims:
        return False
    if freq_factors is not None:
        if not (isinstance(freq_factors, np.ndarray) and freq_factors.dtype == np.float32
                and freq_factors.ndim <= 4 and ne4(freq_factors.shape)[0] >= int(n_dims) // 2):
            return False
    return True


_CONSTANTS: dict = {}


def _constants(*args):
    """_compute_constants(*args), remembered by the arguments' f64 bytes (so -0.0 and 0.0, or NaNs, are
    never confused): the same for every call of a model (~40 us of NumPy scalar work each)."""
    key = struct.pack(f"{len(args)}d", *args)
    c = _CONSTANTS.get(key)
    if c is None:
        if len(_CONSTANTS) >= 256:
            _CONSTANTS.clear()
        c = _CONSTANTS[key] = _compute_constants(*args)
    return c


def _compute_constants(n_dims, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow):
    """The per-call scalars of rope (theta_scale, YaRN's corr dims, mscale), as the reference computes them."""
    theta_scale = F32(libm_f32(lambda b: np.power(b, np.float64(F32(-2.0) / F32(n_dims))), F32(freq_base)))
    lo, hi = ref_rope.yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
    fs, ext = F32(freq_scale), F32(ext_factor)
    mscale = F32(attn_factor)
    if ext != 0:
        inner = np.float64(1.0) + np.float64(F32(0.1)) * np.float64(libm_f32(np.log, F32(1.0) / fs))
        mscale = F32(mscale * F32(inner))
    return theta_scale, lo, hi, fs, ext, mscale


_TABLES: dict = {}


def _tables(p, freq_factors, half, theta_scale, fs, ext, lo, hi, mscale, sin_sign):
    """(cs, sn) of `_rope_tables` for positions p, remembered for the last few calls: a model ropes Q and K
    of every layer at the same positions (60 calls a token for SmolLM2), the tables depend only on the
    positions, the freq factors and the per-model scalars (the key holds their bytes), so one computes them."""
    ff = (np.zeros(1, np.float32) if freq_factors is None
          else np.ascontiguousarray(freq_factors, np.float32).reshape(-1))
    key = (p.tobytes(), p.dtype.str, half, None if freq_factors is None else ff.tobytes(),
           struct.pack("7d", theta_scale, fs, ext, lo, hi, mscale, sin_sign))
    got = _TABLES.get(key)
    if got is None:
        if len(_TABLES) >= 8:
            _TABLES.clear()
        cs, sn = np.empty((p.size, half), np.float32), np.empty((p.size, half), np.float32)
        _rope_tables(p, ff, freq_factors is not None, half, F32(theta_scale), fs, ext, F32(lo), F32(hi), mscale,
                     F32(sin_sign), cs, sn)
        got = _TABLES[key] = (cs, sn)
    return got


def rope(x, pos, freq_factors, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor,
         beta_fast, beta_slow, sin_sign):
    """rope_ext (sin_sign 1) / rope_ext_back (sin_sign -1) of a covered input (see `_covered`)."""
    n = ne4(x.shape)
    n_dims = int(n_dims)
    theta_scale, lo, hi, fs, ext, mscale = _constants(n_dims, n_ctx_orig, freq_base, freq_scale, ext_factor,
                                                      attn_factor, beta_fast, beta_slow)
    x4 = np.ascontiguousarray(x.reshape(n[::-1]), np.float32)
    p = np.ascontiguousarray(pos.reshape(-1))
    cs, sn = _tables(p, freq_factors, x4.shape[3] // 2, theta_scale, fs, ext, lo, hi, mscale, sin_sign)
    out = np.empty_like(x4)
    neox = int(mode) == ref_rope.ROPE_TYPE_NEOX
    per = max(1, PAR_MIN // max(1, x4.size // n[2]))
    if n[2] < 2 * per:                         # one token (decode): no thread hand-off
        _rotate(x4, cs, sn, n_dims, neox, out, 0, n[2])
    else:
        parallel_ranges(lambda t0, t1: _rotate(x4, cs, sn, n_dims, neox, out, t0, t1), n[2], per)
    return out.astype(x.dtype, copy=False).reshape(x.shape)


@register("rope_ext", backend="numba")
def rope_ext(x, pos, freq_factors=None, *, n_dims: int, mode: int = ref_rope.ROPE_TYPE_NORMAL, n_ctx_orig: int = 0,
             freq_base: float = 10000.0, freq_scale: float = 1.0, ext_factor: float = 0.0, attn_factor: float = 1.0,
             beta_fast: float = 32.0, beta_slow: float = 1.0):
    """ggml_rope_ext (see refimpl.ops.rope.rope_ext), tokens in parallel in Numba."""
    args = (n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow)
    if not _covered(x, pos, freq_factors, n_dims, mode):
        return ref_rope.rope_ext.reference(x, pos, freq_factors, n_dims=n_dims, mode=mode, n_ctx_orig=n_ctx_orig,
                                           freq_base=freq_base, freq_scale=freq_scale, ext_factor=ext_factor,
                                           attn_factor=attn_factor, beta_fast=beta_fast, beta_slow=beta_slow)
    return rope(x, pos, freq_factors, n_dims, mode, *args, 1.0)


@register("rope_ext_back", backend="numba")
def rope_ext_back(x, pos, freq_factors=None, *, n_dims: int, mode: int = ref_rope.ROPE_TYPE_NORMAL,
                  n_ctx_orig: int = 0, freq_base: float = 10000.0, freq_scale: float = 1.0, ext_factor: float = 0.0,
                  attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0):
    """ggml_rope_ext_back (see refimpl.ops.rope.rope_ext_back): rope_ext with every sin negated."""
    args = (n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow)
    if not _covered(x, pos, freq_factors, n_dims, mode):
        return ref_rope.rope_ext_back.reference(x, pos, freq_factors, n_dims=n_dims, mode=mode,
                                                n_ctx_orig=n_ctx_orig, freq_base=freq_base, freq_scale=freq_scale,
                                                ext_factor=ext_factor, attn_factor=attn_factor, beta_fast=beta_fast,
                                                beta_slow=beta_slow)
    return rope(x, pos, freq_factors, n_dims, mode, *args, -1.0)
