"""rope_ext on the GPU (modes NORMAL and NEOX; freq_factors, attn_factor, YaRN): the rope cache, then the
rotations.

Kernels:
    _rope_cache  one thread per token (grid_1d(n_tokens, 128)): ggml's f32 theta recurrence over the n_dims/2
                 rotated pairs, step for step as refimpl.ops.rope.rope_cache: theta_0 = p, theta_{i+1} =
                 fl(theta_i * theta_scale); t_e = theta / ff[i], t_i = freq_scale * t_e; YaRN's mix
                 fl32(f64(t_i)*f64(1 - mix) + f64(fl(t_e*mix))); cos/sin = fl32(cos/sin(f64 theta)) * mscale.
                 Writes 8 bytes per (token, pair) into cos, sin (n_tokens, n_dims/2) f32.
    _rotate      one thread per output element (grid_1d(x.size, 256)): element d of a head row is the first
                 (x0*c - x1*s) or second (x0*s + x1*c) member of its pair, each product and the sum in f64
                 (exact products of f32), rounded once to f32; d >= n_dims is copied. Reads 8 bytes of x and
                 8 of the cache (from L1/L2: one cache row serves all heads of a token), writes 4 per element.
The scalars (theta_scale, YaRN's corr dims and mscale) are the reference's own NumPy expressions on the host.
Numerics: the reference's operations in its order; cos/sin are libdevice's f64 functions rounded to f32 where
the reference rounds NumPy's: identical except where an f64 ulp straddles an f32 rounding boundary (about 2^-28
of the values); in the simulator (NumPy's functions) identical bits.
Not covered (run the reference on host copies, which raises its errors): f16 x, x not C-contiguous, M-RoPE
and vision modes, n_dims 0 or odd or > ne0, pos not an i32 vector of n_tokens, freq_factors not f32.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from ...ops import rope as ref_rope
from ...dispatch import register
from ...rounding import libm_f32
from ...shapes import ne4
from . import _device
from .unary import dcos, dsin, fallback, f32_operand, fmul, fsub

F32 = np.float32
ONE = F32(1.0)
ZERO = F32(0.0)
MIN_SPAN = F32(0.001)


@cuda.jit
def _rope_cache(pos, ff, has_ff, theta_scale, fs, ext, lo_c, hi_c, mscale, sin_sign, cos_out, sin_out):
    """cos_out, sin_out (n_tokens, half) f32: the rope cache of token cuda.grid(1)."""
    t = cuda.grid(1)
    if t >= cos_out.shape[0]:
        return
    half = cos_out.shape[1]
    theta = np.float32(pos[t])
    for i in range(half):
        t_e = theta / ff[i] if has_ff and i < ff.shape[0] else theta
        t_i = fmul(fs, t_e)
        th = t_i
        if ext != ZERO:
            d = fsub(hi_c, lo_c)
            y = fsub(np.float32(i), lo_c) / (MIN_SPAN if MIN_SPAN > d else d)
            y = ZERO if ZERO > y else y
            ramp = fsub(ONE, ONE if ONE < y else y)
            mix = fmul(ramp, ext)
            th = np.float32(np.float64(t_i) * np.float64(fsub(ONE, mix)) + np.float64(fmul(t_e, mix)))
        cos_out[t, i] = fmul(np.float32(dcos(th)), mscale)
        sin_out[t, i] = fmul(fmul(np.float32(dsin(th)), mscale), sin_sign)
        theta = fmul(theta, theta_scale)


@cuda.jit
def _rotate(x, cos_c, sin_c, n_head, n_tokens, n_dims, neox, out):
    """x, out (rows, D) f32, row = (b, t, h); element cuda.grid(1) of the flattened out."""
    j = cuda.grid(1)
    D = x.shape[1]
    if j >= x.shape[0] * D:
        return
    r = j // D
    d = j % D
    if d >= n_dims:
        out[r, d] = x[r, d]
        return
    t = (r // n_head) % n_tokens
    k = n_dims // 2
    if neox:
        second = d >= k
        p = d - k if second else d
        i0 = p
        i1 = p + k
    else:
        second = d % 2 == 1
        p = d // 2
        i0 = 2 * p
        i1 = i0 + 1
    c = np.float64(cos_c[t, p])
    s = np.float64(sin_c[t, p])
    a0 = np.float64(x[r, i0])
    a1 = np.float64(x[r, i1])
    out[r, d] = np.float32(a0 * s + a1 * c) if second else np.float32(a0 * c - a1 * s)


def _covered(x, pos, freq_factors, n_dims, mode) -> bool:
    if int(mode) not in (ref_rope.ROPE_TYPE_NORMAL, ref_rope.ROPE_TYPE_NEOX):
        return False
    p = pos if _device.is_device(pos) else np.asarray(pos)
    if np.dtype(p.dtype) != np.int32 or p.ndim < 1 or any(v != 1 for v in tuple(p.shape)[:-1]):
        return False
    n = ne4(tuple(x.shape))
    if p.size != n[2] or not (0 < int(n_dims) <= n[0]) or int(n_dims) % 2 or int(n_dims) != n_dims:
        return False
    if freq_factors is not None:
        f = freq_factors if _device.is_device(freq_factors) else np.asarray(freq_factors)
        if np.dtype(f.dtype) != np.float32 or f.ndim > 4 or ne4(tuple(f.shape))[0] < int(n_dims) // 2:
            return False
    return True


def _scalars(n_dims, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow):
    """theta_scale, YaRN's corr dims (lo, hi) and mscale, by the reference's own expressions (f32)."""
    theta_scale = F32(libm_f32(lambda b: np.power(b, np.float64(F32(-2.0) / F32(n_dims))), F32(freq_base)))
    lo, hi = ref_rope.yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
    mscale = F32(attn_factor)
    if F32(ext_factor) != 0:
        log_inv = libm_f32(np.log, F32(1.0) / F32(freq_scale))
        inner = np.float64(1.0) + np.float64(F32(0.1)) * np.float64(log_inv)
        mscale = F32(mscale * F32(inner))
    return theta_scale, F32(lo), F32(hi), mscale


@register("rope_ext", "cuda")
def rope_ext(x, pos, freq_factors=None, *, n_dims: int, mode: int = ref_rope.ROPE_TYPE_NORMAL, n_ctx_orig: int = 0,
             freq_base: float = 10000.0, freq_scale: float = 1.0, ext_factor: float = 0.0, attn_factor: float = 1.0,
             beta_fast: float = 32.0, beta_slow: float = 1.0, numerics: str | None = None):
    """ggml_rope_ext (see refimpl.ops.rope.rope_ext), NORMAL and NEOX modes on the GPU."""
    kw = dict(n_dims=n_dims, mode=mode, n_ctx_orig=n_ctx_orig, freq_base=freq_base, freq_scale=freq_scale,
              ext_factor=ext_factor, attn_factor=attn_factor, beta_fast=beta_fast, beta_slow=beta_slow)
    dx = f32_operand(x)
    if dx is None or not _covered(dx, pos, freq_factors, n_dims, mode):
        return fallback(ref_rope.rope_ext.reference, x, pos, freq_factors, **kw)
    n = ne4(tuple(dx.shape))
    n_dims = int(n_dims)
    ts, lo, hi, mscale = _scalars(n_dims, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast,
                                  beta_slow)
    dpos = _device.to_device(pos if _device.is_device(pos) else np.asarray(pos)).reshape(n[2])
    has_ff = freq_factors is not None
    ff = _device.to_device(np.zeros(1, np.float32) if not has_ff else freq_factors)
    ff = ff.reshape(ff.size)
    k = n_dims // 2
    cos_c = cuda.device_array((n[2], k), np.float32)
    sin_c = cuda.device_array((n[2], k), np.float32)
    blocks, threads = _device.grid_1d(n[2], 128)
    _rope_cache[blocks, threads](dpos, ff, has_ff, ts, F32(freq_scale), F32(ext_factor), lo, hi, mscale, ONE,
                                 cos_c, sin_c)
    rows = dx.size // n[0]
    out = cuda.device_array(tuple(dx.shape), np.float32)
    blocks, threads = _device.grid_1d(dx.size, 256)
    _rotate[blocks, threads](dx.reshape(rows, n[0]), cos_c, sin_c, n[1], n[2], n_dims,
                             int(mode) == ref_rope.ROPE_TYPE_NEOX, out.reshape(rows, n[0]))
    return out


def ptx_signatures() -> list[tuple]:
    """(dispatcher, argument types) of every kernel here, as a real launch types them."""
    from numba import types
    f1, f2, f, i8, b = types.float32[::1], types.float32[:, ::1], types.float32, types.int64, types.boolean
    return [(_rope_cache, (types.int32[::1], f1, b, f, f, f, f, f, f, f, f2, f2)),
            (_rotate, (f2, f2, f2, i8, i8, i8, b, f2))]
