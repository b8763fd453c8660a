"""flash_attn_ext on the GPU: one block per (query row, head, sequence), K and V streamed through shared
memory in tiles of BK kv positions, online softmax (running max and sum, the accumulator rescaled per tile).

Kernel:
    _flash_attn  grid (n_tokens, n_head, n_seq), block THREADS = 128 (4 warps).
                 The block computes one output row out[s, n, h, :]. Per tile of BK = 32 kv positions:
                 the K tile is converted to f32 into shared memory (rows padded to MAX_D + 1 floats, so the
                 32 lanes reading 32 rows hit 32 banks); warp w sums q.k over d = w, w+4, ... for kv position
                 lane (4 partial f32 dots per position, added in warp order); the V tile replaces the K tile
                 while thread j < BK finishes score j (scale or soft-cap, + slope * mask); every thread takes
                 the tile's max (the same value everywhere), thread j writes p_j = exp(s_j - m_new); thread t
                 then rescales and accumulates output dims t, t + 128 (acc in registers, f32).
                 At the end the sink joins the max and the sum, and out = acc / sum (0 when the sum is 0:
                 every position masked and no sink).
Memory traffic per block: q row DK*4 bytes, K NKV*DK*(2|4), V NKV*DV*(2|4), mask row NKV*2 bytes read once;
DV*4 bytes written. K/V are read again by every query row and every head of a GQA group (from L2 on a GPU:
the tiling does not share them across query rows). Shared memory: 34 688 bytes per block; no local memory.

Coverage: q f32 (rows contiguous, any 2-4-D view), K and V f32 or f16 with head_dim <= MAX_D = 256, GQA (n_head
a multiple of K's and of V's head counts), f16 masks broadcast over heads and sequences, ALiBi, soft-capping,
sinks. QTensor K/V (bf16, quantized), larger head dims and inputs the reference rejects run the reference
(which raises its GGMLShapeError) on host copies.
Numerics: f32 dots, exp, sums and accumulator where the reference computes in f64 and rounds once: every
element within the ("flash_attn_ext", "f32", "f32-online") bound of the tolerance table, derived from these
roundings and the tile of BK positions (it allows expf/tanhf a few ulp, as a GPU's; the simulator's are f64
rounded to f32, and NVVM's FMA contractions only shrink the dots' error).
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, types

from ...qtensor import QTensor
from ...ops import attention as ref_attn
from ...dispatch import register
from ...shapes import ne4
from ...ops.softmax import alibi_slopes
from ._device import is_device, to_device, to_host

BK = 32                      # kv positions per tile
THREADS = 128                # threads per block
PARTS = THREADS // BK        # partial dot products per kv position (one per warp)
MAX_D = 256                  # largest head_dim (K's and V's) the kernel takes
PER_THREAD = MAX_D // THREADS
TILE_W = MAX_D + 1           # shared tile rows padded by one float: no bank conflicts between rows


@cuda.jit
def _flash_attn(q, k, v, mask, slopes, sinks, out, scale, cap, cap_scale, has_mask, has_sinks):
    """q (S, H, N, DK) f32; k (S, HKV, NKV, DK), v (S, HV, NKV, DV) f32/f16; mask (M3, M2, >= N, >= NKV) f16
    (read when has_mask); slopes (H,) f32; sinks (H,) f32 (read when has_sinks); out (S, N, H, DV) f32."""
    n = cuda.blockIdx.x
    h = cuda.blockIdx.y
    sq = cuda.blockIdx.z
    tid = cuda.threadIdx.x
    H, N, DK = q.shape[1], q.shape[2], q.shape[3]
    NKV, DV = k.shape[2], v.shape[3]
    if n >= N or h >= H or sq >= q.shape[0]:
        return
    hk = h // (H // k.shape[1])
    hv = h // (H // v.shape[1])
    q_sh = cuda.shared.array(MAX_D, float32)
    tile = cuda.shared.array((BK, TILE_W), float32)
    part = cuda.shared.array((PARTS, BK), float32)
    s_sh = cuda.shared.array(BK, float32)
    p_sh = cuda.shared.array(BK, float32)
    acc = cuda.local.array(PER_THREAD, float32)
    for i in range(PER_THREAD):
        acc[i] = float32(0.0)
    for d in range(tid, DK, THREADS):
        q_sh[d] = q[sq, h, n, d]
    neg_inf = float32(-math.inf)
    m_run = neg_inf                              # running max and sum: the same values in every thread
    l_run = float32(0.0)
    slope = slopes[h]
    jj = tid % BK
    w = tid // BK
    for j0 in range(0, NKV, BK):
        cnt = NKV - j0 if NKV - j0 < BK else BK
        for idx in range(tid, cnt * DK, THREADS):        # K tile -> f32, consecutive threads on consecutive d
            j = idx // DK
            tile[j, idx - j * DK] = float32(k[sq, hk, j0 + j, idx - j * DK])
        cuda.syncthreads()
        if jj < cnt:
            dot = float32(0.0)
            for d in range(w, DK, PARTS):
                dot += q_sh[d] * tile[jj, d]
            part[w, jj] = dot
        cuda.syncthreads()
        for idx in range(tid, cnt * DV, THREADS):        # the V tile replaces it (every dot is done)
            j = idx // DV
            tile[j, idx - j * DV] = float32(v[sq, hv, j0 + j, idx - j * DV])
        if tid < cnt:
            raw = part[0, tid]
            for p in range(1, PARTS):
                raw += part[p, tid]
            mv = float32(0.0)
            if has_mask:
                mv = float32(mask[sq % mask.shape[0], h % mask.shape[1], n, j0 + tid])
            if cap != float32(0.0):
                sc = cap * float32(math.tanh(raw * cap_scale))
            else:
                sc = raw * scale
            s_sh[tid] = sc + slope * mv
        cuda.syncthreads()
        m_new = m_run
        for j in range(cnt):                     # (no builtin max: it compiles to a device function)
            if s_sh[j] > m_new:
                m_new = s_sh[j]
        if tid < cnt:
            sj = s_sh[tid]
            p_sh[tid] = float32(0.0) if sj == neg_inf else float32(math.exp(sj - m_new))
        cuda.syncthreads()
        corr = float32(0.0) if m_run == neg_inf else float32(math.exp(m_run - m_new))
        psum = float32(0.0)
        for j in range(cnt):
            psum += p_sh[j]
        l_run = l_run * corr + psum
        m_run = m_new
        for i in range(PER_THREAD):
            d = tid + i * THREADS
            if d < DV:
                a = acc[i] * corr
                for j in range(cnt):
                    a += p_sh[j] * tile[j, d]
                acc[i] = a
        cuda.syncthreads()                       # the next tile overwrites tile, s_sh, p_sh
    if has_sinks:
        sk = sinks[h]
        m_fin = sk if sk > m_run else m_run
        f = float32(0.0) if m_run == neg_inf else float32(math.exp(m_run - m_fin))
        l_run = l_run * f + float32(math.exp(sk - m_fin))
        for i in range(PER_THREAD):
            acc[i] = acc[i] * f
    for i in range(PER_THREAD):
        d = tid + i * THREADS
        if d < DV:
            out[sq, n, h, d] = acc[i] / l_run if l_run > float32(0.0) else float32(0.0)


@functools.lru_cache(maxsize=64)
def _slopes(n_head: int, max_bias: float):
    """The ALiBi slope of every head (all 1 when max_bias is 0) on the device, uploaded once per (H, bias)."""
    return cuda.to_device(alibi_slopes(n_head, max_bias).astype(np.float32))


@functools.lru_cache(maxsize=2)
def _dummy(dtype: str):
    """A 1-element 4-D stand-in for an absent mask (f16) or 1-D for absent sinks (f32), uploaded once."""
    return cuda.to_device(np.zeros((1, 1, 1, 1), np.float16)) if dtype == "f16" else \
        cuda.to_device(np.zeros(1, np.float32))


def _dev(x, shape, dtype):
    """x as a C-contiguous device array of NumPy shape `shape` (device arrays reshaped in place when they can)."""
    if is_device(x) and x.is_c_contiguous() and np.dtype(x.dtype) == np.dtype(dtype):
        return x.reshape(shape)
    return to_device(np.ascontiguousarray(to_host(x), dtype).reshape(shape))


def _dt(x):
    return None if isinstance(x, QTensor) or not hasattr(x, "dtype") else np.dtype(x.dtype)


def _plan(q, k, v, mask, sinks, max_bias):
    """(S, H, N, DK, HKV, NKV, HV, DV) when the kernel covers these operands (the reference's checks pass and
    K/V are f32/f16 with head_dim <= MAX_D), else None."""
    if _dt(q) != np.float32 or _dt(k) not in (np.float32, np.float16) or _dt(v) not in (np.float32, np.float16):
        return None
    if max(len(x.shape) for x in (q, k, v)) > 4:
        return None
    if any(not is_device(x) and x.size and x.shape[-1] > 1 and x.strides[-1] != x.itemsize for x in (q, k, v)):
        return None                              # the reference rejects rows that are not contiguous
    DK, N, H, S = ne4(q.shape)
    kd, NKV, HKV, ks = ne4(k.shape)
    DV, vn, HV, vs = ne4(v.shape)
    if min(DK, N, H, S, NKV, HKV, HV, DV) < 1 or kd != DK or ks != S or vs != S or vn != NKV:
        return None
    if H % HKV or H % HV or DK > MAX_D or DV > MAX_D:
        return None
    if mask is None:
        if max_bias > 0.0:
            return None
    else:
        if _dt(mask) != np.float16 or len(mask.shape) > 4:
            return None
        mc, mr, m2, m3 = ne4(mask.shape)
        if min(m2, m3) < 1 or H % m2 or S % m3 or mc < NKV or mr < N:
            return None
        if not (mask.is_c_contiguous() if is_device(mask) else mask.flags.c_contiguous):
            return None
    if sinks is not None and (_dt(sinks) != np.float32 or len(sinks.shape) > 4 or ne4(sinks.shape) != [H, 1, 1, 1]):
        return None
    return S, H, N, DK, HKV, NKV, HV, DV


def _host(x):
    return x if x is None or isinstance(x, QTensor) else to_host(x)


@register("flash_attn_ext", "cuda")
def flash_attn_ext(q, k, v, mask=None, scale: float = 1.0, max_bias: float = 0.0, logit_softcap: float = 0.0,
                   sinks=None):
    """ggml_flash_attn_ext (see refimpl.ops.attention.flash_attn_ext) on the GPU: a device array
    (n_seq, n_tokens, n_head, head_dim_v) f32, as many leading dims as the reference returns."""
    dims = _plan(q, k, v, mask, sinks, max_bias)
    if dims is None:
        ref = ref_attn.flash_attn_ext.reference(_host(q), _host(k), _host(v), _host(mask), scale, max_bias,
                                                logit_softcap, _host(sinks))
        return to_device(ref)
    S, H, N, DK, HKV, NKV, HV, DV = dims
    qd = _dev(q, (S, H, N, DK), np.float32)
    kd = _dev(k, (S, HKV, NKV, DK), k.dtype)
    vd = _dev(v, (S, HV, NKV, DV), v.dtype)
    md = _dummy("f16") if mask is None else _dev(mask, tuple(ne4(mask.shape)[::-1]), np.float16)
    sd = _dummy("f32") if sinks is None else _dev(sinks, (H,), np.float32)
    out = cuda.device_array((S, N, H, DV), np.float32)
    cap = np.float32(logit_softcap)
    cap_scale = np.float32(np.float32(scale) / cap) if cap != 0 else np.float32(0.0)
    _flash_attn[(N, H, S), THREADS](qd, kd, vd, md, _slopes(H, float(max_bias)), sd, out, np.float32(scale),
                                    cap, cap_scale, mask is not None, sinks is not None)
    nd = max(len(q.shape), 3)
    return out.reshape((S, N, H, DV)[4 - nd:])


def ptx_signatures() -> list[tuple]:
    """(_flash_attn, argument types) for K/V f32/f32, f16/f16 and the mixed pairs: what launches compile."""
    f32, f16 = types.float32, types.float16
    sigs = []
    for kt in (f32, f16):
        for vt in (f32, f16):
            sigs.append((_flash_attn, (f32[:, :, :, ::1], kt[:, :, :, ::1], vt[:, :, :, ::1], f16[:, :, :, ::1],
                                       f32[::1], f32[::1], f32[:, :, :, ::1], f32, f32, f32, types.boolean,
                                       types.boolean)))
    return sigs
