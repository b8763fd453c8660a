"""rms_norm and norm on the GPU, one block per row, and the block-wide f64 row sum they (and softmax) use.

Kernels (grid = one block per row, n_rows = the product of the leading dims; block THREADS = 128):
    _rms_norm  the f32 squares' f64 sum (`block_sum`), mean = fl32(sum / n), scale = 1/sqrtf(mean + eps),
               out = x * scale. Reads the row twice (4 bytes per element each: the sum, then the scaling,
               the second read mostly from L2/L1), writes 4 bytes per element.
    _norm      mean = fl32(f64 row sum) / n in f32; y = x - mean written to out; var = fl32(f64 sum of the f32
               squares of y / n); out = y * 1/sqrtf(var + eps). Reads x twice and out twice, writes out
               twice: 16 + 8 bytes per element (all but the first read of x hit the caches for rows of a few
               thousand floats).
    block_sum  (device) the f64 sum of a row of n f32 values (or of their f32 squares) in the exact order
               of `np.sum(row, dtype=np.float64)`: NumPy casts in buffers of CHUNK = 8192 elements, sums each
               buffer pairwise (blocks of <= 128 elements split at multiples of 8, each block summed in 8
               strided accumulators combined as ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)), then its tail) and adds
               the buffers' sums in order. Per chunk: thread 0 lists the leaf blocks (<= MAX_LEAVES) in
               shared memory; thread t then sums accumulator t % 8 of leaf t // 8 (8 adjacent threads read
               8 adjacent floats: coalesced); one thread per leaf combines its 8 accumulators and its tail;
               thread 0 adds the leaf sums along the pairwise tree. Shared memory: 12.5 KiB per block.
Numerics: the reference's operations in its order, so the results are the reference's bits (identical,
not merely within tolerance) -- as long as NumPy keeps its 8192-element cast buffer (NumPy 2.x), rows of
any length. Inputs other than a C-contiguous f32 tensor (numpy or device) with eps >= 0 run the reference
on host copies (which also raises its errors).
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float64, int32, int64

from ...ops.norm import norm as _norm_op
from ...ops.norm import rms_norm as _rms_norm_op
from ...dispatch import register
from .unary import fadd, fallback, f32_operand, fmul, fsqrt, fsub

THREADS = 128
CHUNK = 8192             # NumPy's cast buffer: a row is summed pairwise per 8192 elements
LEAF = 128               # NumPy's PW_BLOCKSIZE
MAX_LEAVES = 160         # a chunk of <= 8192 elements splits into <= 141 leaves of >= 58 elements
ACC = 8 * MAX_LEAVES       # 8 accumulators per leaf
STACK = 64
ONE = np.float32(1.0)


@cuda.jit(device=True)
def _list_leaves(m, leaf_lo, leaf_n):
    """The leaf blocks (offset, length) of NumPy's pairwise sum of m elements, left to right; their count."""
    st_lo = cuda.local.array(STACK, int64)
    st_n = cuda.local.array(STACK, int64)
    top = 0
    st_lo[0] = 0
    st_n[0] = m
    count = 0
    while top >= 0:
        lo = st_lo[top]
        k = st_n[top]
        top -= 1
        if k <= LEAF:
            leaf_lo[count] = lo
            leaf_n[count] = k
            count += 1
        else:
            n2 = k // 2
            n2 -= n2 % 8
            st_lo[top + 1] = lo + n2            # right half below the left: the left is taken first
            st_n[top + 1] = k - n2
            st_lo[top + 2] = lo
            st_n[top + 2] = n2
            top += 2
    return count


@cuda.jit(device=True)
def _combine_leaves(m, leaf_sum):
    """The pairwise tree of m elements evaluated over its leaves' sums (post-order, left first)."""
    st_n = cuda.local.array(STACK, int64)
    done = cuda.local.array(STACK, int32)
    vals = cuda.local.array(STACK, float64)
    top = 0
    st_n[0] = m
    done[0] = 0
    nv = 0
    li = 0
    while top >= 0:
        k = st_n[top]
        if k <= LEAF:
            vals[nv] = leaf_sum[li]
            li += 1
            nv += 1
            top -= 1
        elif done[top] == 0:
            done[top] = 1
            n2 = k // 2
            n2 -= n2 % 8
            st_n[top + 1] = k - n2
            done[top + 1] = 0
            st_n[top + 2] = n2
            done[top + 2] = 0
            top += 2
        else:
            vals[nv - 2] = vals[nv - 2] + vals[nv - 1]
            nv -= 1
            top -= 1
    return vals[0]


@cuda.jit(device=True)
def _val(row, i, square):
    v = row[i]
    return np.float64(fmul(v, v)) if square else np.float64(v)


@cuda.jit(device=True)
def block_sum(row, n, square, leaf_lo, leaf_n, acc, leaf_sum, total):
    """Σ row[0:n] (square: Σ fl32(row[i]**2)) in f64, NumPy's order; every thread of the block must call
    it and gets the sum. Shared scratch: leaf_lo, leaf_n (MAX_LEAVES,) i64, acc (8*MAX_LEAVES,) f64,
    leaf_sum (MAX_LEAVES,) f64, total (2,) f64 (total[1] holds the leaf count)."""
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    s = 0.0
    for c0 in range(0, n, CHUNK):
        m = n - c0 if n - c0 < CHUNK else CHUNK
        if tid == 0:
            total[1] = _list_leaves(m, leaf_lo, leaf_n)
        cuda.syncthreads()
        nl = int(total[1])
        for j in range(tid, 8 * nl, nt):       # accumulator j % 8 of leaf j // 8
            lo = c0 + leaf_lo[j // 8]
            k = leaf_n[j // 8]
            r = j % 8
            if k < 8:
                a = 0.0
                if r == 0:
                    for i in range(k):
                        a += _val(row, lo + i, square)
            else:
                end = k - k % 8
                a = _val(row, lo + r, square)
                for i in range(r + 8, end, 8):
                    a += _val(row, lo + i, square)
            acc[j] = a
        cuda.syncthreads()
        for li in range(tid, nl, nt):
            k = leaf_n[li]
            if k < 8:
                res = acc[8 * li]
            else:
                b = 8 * li
                res = ((acc[b] + acc[b + 1]) + (acc[b + 2] + acc[b + 3])) + \
                      ((acc[b + 4] + acc[b + 5]) + (acc[b + 6] + acc[b + 7]))
                lo = c0 + leaf_lo[li]
                for i in range(k - k % 8, k):
                    res += _val(row, lo + i, square)
            leaf_sum[li] = res
        cuda.syncthreads()
        if tid == 0:
            part = _combine_leaves(m, leaf_sum)
            total[0] = part if c0 == 0 else total[0] + part
        cuda.syncthreads()
        s = total[0]
    return s


@cuda.jit
def _rms_norm(a, eps, out):
    """Row cuda.blockIdx.x of a (rows, n) f32 into out."""
    leaf_lo = cuda.shared.array(MAX_LEAVES, int64)
    leaf_n = cuda.shared.array(MAX_LEAVES, int64)
    acc = cuda.shared.array(ACC, float64)
    leaf_sum = cuda.shared.array(MAX_LEAVES, float64)
    total = cuda.shared.array(2, float64)
    r = cuda.blockIdx.x
    if r >= a.shape[0]:
        return
    n = a.shape[1]
    x = a[r]
    ss = block_sum(x, n, True, leaf_lo, leaf_n, acc, leaf_sum, total)
    mean = np.float32(ss / n)
    scale = ONE / fsqrt(fadd(mean, eps))
    o = out[r]
    for i in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        o[i] = fmul(x[i], scale)


@cuda.jit
def _norm(a, eps, out):
    """Row cuda.blockIdx.x of a (rows, n) f32 into out (which holds the centred row in between)."""
    leaf_lo = cuda.shared.array(MAX_LEAVES, int64)
    leaf_n = cuda.shared.array(MAX_LEAVES, int64)
    acc = cuda.shared.array(ACC, float64)
    leaf_sum = cuda.shared.array(MAX_LEAVES, float64)
    total = cuda.shared.array(2, float64)
    r = cuda.blockIdx.x
    if r >= a.shape[0]:
        return
    n = a.shape[1]
    x = a[r]
    o = out[r]
    # + 0.0: ggml's sum starts at +0.0, so a row of -0.0 has the mean +0.0 (no fast-math: LLVM keeps the add)
    mean = np.float32(block_sum(x, n, False, leaf_lo, leaf_n, acc, leaf_sum, total) + 0.0) / np.float32(n)
    for i in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        o[i] = fsub(x[i], mean)
    cuda.syncthreads()
    var = np.float32(block_sum(o, n, True, leaf_lo, leaf_n, acc, leaf_sum, total) / n)
    scale = ONE / fsqrt(fadd(var, eps))
    for i in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        o[i] = fmul(o[i], scale)


def _rows(kernel, ref, a, eps):
    da = f32_operand(a)
    if da is None or not eps >= 0.0:
        return fallback(ref, a, eps)
    shape = tuple(da.shape)
    n = shape[-1]
    a2 = da.reshape(da.size // n, n)
    out = cuda.device_array(shape, np.float32)
    kernel[a2.shape[0], THREADS](a2, np.float32(eps), out.reshape(da.size // n, n))
    return out


@register("rms_norm", "cuda")
def rms_norm(a, eps: float, *, numerics: str | None = None):
    """ggml_rms_norm (see refimpl.ops.norm.rms_norm): one block per row on the GPU, the reference's bits."""
    return _rows(_rms_norm, _rms_norm_op.reference, a, eps)


@register("norm", "cuda")
def norm(a, eps: float, *, numerics: str | None = None):
    """ggml_norm (see refimpl.ops.norm.norm): one block per row on the GPU, the reference's bits."""
    return _rows(_norm, _norm_op.reference, a, eps)


def ptx_signatures() -> list[tuple]:
    """(dispatcher, argument types) of every kernel here, as a real launch types them."""
    from numba import types
    f2 = types.float32[:, ::1]
    return [(_rms_norm, (f2, types.float32, f2)), (_norm, (f2, types.float32, f2))]
