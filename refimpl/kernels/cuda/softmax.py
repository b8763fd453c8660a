"""soft_max_ext on the GPU: one block per row, the reference's operations in its order.

Kernel:
    _soft_max  grid = one block per row of a (n_seq * n_head * n_tokens rows), block THREADS = 128.
               Row r = (s, h, t) reads mask row t of head h % m2, sequence s % m3 (ggml's tiling).
               1. thread k, elements k, k+128, ...: w = fl32(a*scale), with a mask fl32(f64(w) + f64(slope_h)
                  * f64(mask)) (the product of two f32 is exact in f64: one rounding to f64, one to f32, as
                  NumPy), written to out; its NaN-propagating max into shared memory;
               2. thread 0 reduces the 128 maxima (and the sink, np.maximum) to M;
               3. e = fl32(exp(f64(fl32(w - M)))) over out;
               4. Σe in f64 in NumPy's order (`norm.block_sum`, pairwise per 8192-element buffer), plus
                  fl32(exp(f64(sink - M))) when there are sinks; inv = fl32(1 / Σ);
               5. out = e * inv.
               Memory traffic per row: reads a once and the mask row once (4 bytes per element each), reads
               and writes out three times (mostly in L1/L2 for rows of a few thousand floats): 8 bytes from
               DRAM and 4 bytes written per element. Shared memory: 13.5 KiB per block.
Numerics: identical bits to the reference, but for exp: the reference rounds NumPy's f64 exp to f32, the GPU
libdevice's f64 exp (<= 1 f64 ulp), so an e differs by one f32 ulp only where that f64 error straddles an f32
rounding boundary (about 2^-28 of values); measured against the reference in the simulator (NumPy's exp):
identical. Where a row is all NaN / all -inf the NaN payloads are the GPU's. ALiBi slopes are the
reference's `alibi_slopes` (host, f32), uploaded with the launch.
Inputs not covered (a not a C-contiguous f32 tensor, masks other than contiguous f16/f32, sinks not f32 of
n_head, shapes ggml rejects) run the reference on host copies (which raises its errors).
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32, float64, int64

from ...ops import softmax as ref_sm
from ...dispatch import register
from ...shapes import ne4
from . import _device
from .norm import ACC, MAX_LEAVES, block_sum
from .unary import dexp, fallback, f32_operand, fmul, fsub

THREADS = 128


@cuda.jit(device=True)
def _nan_max(m, v):
    """np.maximum's rule: NaN if either is NaN, else the larger."""
    if m != m:
        return m
    if v != v or v > m:
        return v
    return m


@cuda.jit
def _soft_max(a, na1, na2, mask, has_mask, slopes, sinks, has_sinks, scale, out):
    """Row blockIdx.x of a (rows, n) f32 into out; mask (m3, m2, >= na1, n) f32; slopes, sinks (na2,) f32."""
    leaf_lo = cuda.shared.array(MAX_LEAVES, int64)
    leaf_n = cuda.shared.array(MAX_LEAVES, int64)
    acc = cuda.shared.array(ACC, float64)
    leaf_sum = cuda.shared.array(MAX_LEAVES, float64)
    total = cuda.shared.array(2, float64)
    part = cuda.shared.array(THREADS, float32)
    r = cuda.blockIdx.x
    if r >= a.shape[0]:
        return
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    n = a.shape[1]
    t = r % na1
    h = (r // na1) % na2
    s = r // (na1 * na2)
    x = a[r]
    o = out[r]
    sl = np.float64(slopes[h])
    mrow = mask[s % mask.shape[0], h % mask.shape[1], t % mask.shape[2]]     # (t: the dummy mask has 1 row)
    mx = x[0]                                    # a placeholder of the type: replaced by the first w
    first = True
    for i in range(tid, n, nt):
        w = fmul(x[i], scale)
        if has_mask:
            w = np.float32(np.float64(w) + sl * np.float64(mrow[i]))
        o[i] = w
        mx = w if first else _nan_max(mx, w)
        first = False
    if not first:                                # threads past the row's end have no maximum
        part[tid] = mx
    cuda.syncthreads()
    if tid == 0:
        M = part[0]
        k = nt if nt < n else n
        for j in range(1, k):
            M = _nan_max(M, part[j])
        if has_sinks:
            M = _nan_max(M, sinks[h])
        total[0] = M
    cuda.syncthreads()
    M = np.float32(total[0])
    for i in range(tid, n, nt):
        o[i] = np.float32(dexp(fsub(o[i], M)))
    cuda.syncthreads()
    sm = block_sum(o, n, False, leaf_lo, leaf_n, acc, leaf_sum, total)
    if has_sinks:
        sm = sm + np.float64(np.float32(dexp(fsub(sinks[h], M))))
    inv = np.float32(1.0 / sm)
    for i in range(tid, n, nt):
        o[i] = fmul(o[i], inv)


def _mask_operand(mask, na):
    """The mask as a 4-D C-contiguous f32 device array (m3, m2, m1, n), or None when not covered."""
    if _device.is_device(mask):
        ok = np.dtype(mask.dtype) in (np.float16, np.float32) and mask.is_c_contiguous()
    else:
        ok = isinstance(mask, np.ndarray) and mask.dtype in (np.float16, np.float32) and mask.flags.c_contiguous
    if not ok or mask.ndim > 4 or mask.size == 0:
        return None
    nm = ne4(tuple(mask.shape))
    if nm[0] != na[0] or nm[1] < na[1] or na[2] % nm[2] or na[3] % nm[3]:
        return None
    return _device.to_device(mask, np.float32).reshape(*nm[::-1])


def _sinks_operand(sinks, na):
    if sinks is None:
        return _device.to_device(np.zeros(max(na[2], 1), np.float32))
    s = sinks if _device.is_device(sinks) else np.asarray(sinks)
    if np.dtype(s.dtype) != np.float32 or s.ndim > 4 or s.size != na[2] or ne4(tuple(s.shape))[0] != na[2]:
        return None
    return _device.to_device(s).reshape(na[2])


@register("soft_max_ext", "cuda")
def soft_max_ext(a, mask=None, scale: float = 1.0, max_bias: float = 0.0, sinks=None, *,
                 numerics: str | None = None):
    """ggml_soft_max_ext (see refimpl.ops.softmax.soft_max_ext): one block per row on the GPU."""
    da = f32_operand(a)
    if da is None:
        return fallback(ref_sm.soft_max_ext.reference, a, mask, scale, max_bias, sinks)
    na = ne4(tuple(da.shape))
    dm = None if mask is None else _mask_operand(mask, na)
    dsk = _sinks_operand(sinks, na)
    if (mask is not None and dm is None) or (mask is None and max_bias > 0.0) or dsk is None:
        return fallback(ref_sm.soft_max_ext.reference, a, mask, scale, max_bias, sinks)
    if dm is None:
        dm = _device.to_device(np.zeros((1, 1, 1, 1), np.float32))
    slopes = _device.to_device(ref_sm.alibi_slopes(na[2], max_bias))
    rows = da.size // na[0]
    out = cuda.device_array(tuple(da.shape), np.float32)
    _soft_max[rows, THREADS](da.reshape(rows, na[0]), na[1], na[2], dm, mask is not None, slopes, dsk,
                             sinks is not None, np.float32(scale), out.reshape(rows, na[0]))
    return out


def ptx_signatures() -> list[tuple]:
    """(dispatcher, argument types) of every kernel here, as a real launch types them."""
    from numba import types
    f1, f2, f4, i8, b = types.float32[::1], types.float32[:, ::1], types.float32[:, :, :, ::1], types.int64, \
        types.boolean
    return [(_soft_max, (f2, i8, i8, f4, b, f1, f1, b, types.float32, f2))]
