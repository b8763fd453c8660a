"""mul_mat on the GPU: F32/F16/BF16/quantized weights dequantized in registers or shared memory, f64 sums.

Versions (exact numerics; numerics="ggml" and inputs not covered run the NumPy reference on host copies):
    decode   (b has <= DECODE_ROWS rows per batch)  `_make_gemv(load)`: grid (ceil(n / WARPS), batches),
             block WARPS warps; one warp per output column i (weight row i). Lane L takes the 32-element
             sub-blocks L, L+32, ... of the row, decodes each into a local (register) array with
             quants' `_dq_<type>` -- the bits of refimpl.dequantize -- and adds its f64 products with
             every b row to per-row f64 sums; a warp-shuffle tree reduces them, lane 0 writes f32 (the
             simulator, which has no shuffles, runs the same tree through shared memory: `_warp_sum`).
             Traffic: the weight's bytes once per batch of b, plus 4*k bytes of b per weight row (from L1/L2).
    prefill  (more rows)  `_make_gemm(load)`: grid (ceil(n / TILE), ceil(m / TILE), batches), block 16x16;
             each block computes a TILE x TILE tile of out (2x2 values a thread) in f64. Per step of TK
             along k, TILE * TK / 32 threads each decode one weight sub-block into shared memory (zeros past
             the tile's edges), all threads load the TILE x TK activation tile, then a classic shared-memory
             product. Traffic: the weight's bytes ceil(m / TILE) times, b's 4 bytes per element
             ceil(n / TILE) times; shared memory 2 * TILE * (TK + 1) * 4 = 33 KiB a block.
    f32/f16 weights and activation-by-activation products (a an f32 device array, e.g. attention's kq and
             kqv) run the same two kernels with `_load_float` (element loads, zeros past k); BF16 weights
             are dequantized to f32 on the device first (`quants.dequantize_device`).

Numerics: every product of two f32 values is exact in f64 and the sums are f64 (an FMA of an exact product
rounds as the separate add), rounded once to f32: the reference's computation up to the order of the f64
sum, i.e. within ("mul_mat", "*", "property") of the tolerance table (measured NMSE ~1e-32 in the tests).
Batching: a (a3, a2, n, k) is repeated over b (b3, b2, m, k) as in the reference (np.repeat): b batch
(i3, i2) uses a batch (i3 // r3, i2 // r2). Weights (NumPy or QTensor) are uploaded once (`_device.weight`).
`mul_mat_device(dw, b)` is the entry for other kernels: a DeviceWeight or f32 device array times a device b.
"""
from __future__ import annotations

import functools

import numba
import numpy as np
from numba import cuda

from ...ops import matmul as ref_mm
from ...dispatch import current_numerics, register
from ...shapes import fail, is_contiguous, ne4, rows_packed
from ...qtensor import QTensor
from ...types import GGMLType, traits
from . import _device, quants
from ._device import SIMULATOR, DeviceWeight

DECODE_ROWS = 8     # rows of b (per batch) up to which the decode kernel runs
WARPS = 4           # decode: weight rows (one per warp) per block
TILE = 32           # prefill: out tile TILE (weight rows) x TILE (b rows)
HALF = TILE // 2    # prefill: block HALF x HALF threads, 2 x 2 outputs each
TK = 128            # prefill: k per shared-memory step
SUBS = TK // 32     # weight sub-blocks per row and step
LDS = TK + 1        # shared row stride: threads reading one column hit distinct banks
THREADS_GEMV = WARPS * 32
SHARED_TILE = TILE * LDS        # (array shapes must be plain global constants for Numba)


# -- warp reduction -----------------------------------------------------------------------------------------

if SIMULATOR:
    @cuda.jit(device=True)
    def _warp_sum(v, red, tid):
        """The shuffle tree below through shared memory (the simulator has no shuffles); lane 0 gets the
        same sum, in the same order. Every thread of the block must call it."""
        lane = tid & 31
        red[tid] = v
        cuda.syncthreads()
        off = 16
        while off > 0:
            if lane < off:
                red[tid] = red[tid] + red[tid + off]
            cuda.syncthreads()
            off //= 2
        v = red[tid]
        cuda.syncthreads()
        return v
else:                                              # pragma: no cover - needs a GPU
    @cuda.jit(device=True)
    def _warp_sum(v, red, tid):
        """Σ v over the warp, in lane 0: v[L] += v[L + off] for off = 16, 8, 4, 2, 1."""
        off = 16
        while off > 0:
            v += cuda.shfl_down_sync(0xFFFFFFFF, v, off)
            off //= 2
        return v


@cuda.jit(device=True)
def _a_batch(z, a2, b2, r2, r3):
    """The batch of a (flattened a3 * a2) that b batch z = i3 * b2 + i2 uses: (i3 // r3, i2 // r2)."""
    i3 = z // b2
    return (i3 // r3) * a2 + (z - i3 * b2) // r2


# -- weight loaders: 32 values of sub-block s of row `row` of a-batch za into out[p:p+32] -----------------

@cuda.jit(device=True)
def _load_float(a, za, n, row, s, k, out, p, T2, T1, T1b, KS):
    """a (batches, n, k) f32 or f16; zeros past k."""
    c0 = 32 * s
    for e in range(32):
        out[p + e] = np.float32(a[za, row, c0 + e]) if c0 + e < k else np.float32(0.0)


def _make_quant_loader(dq, spb):
    @cuda.jit(device=True)
    def load(a, za, n, row, s, k, out, p, T2, T1, T1b, KS):
        """a (blocks, type_size) uint8: row r of batch za is blocks (za*n + r) * nbr .. + nbr - 1."""
        nbr = k // (32 * spb)
        q = s // spb
        dq(a, (za * n + row) * nbr + q, s - q * spb, out, p, T2, T1, T1b, KS)
    return load


# -- kernels ---------------------------------------------------------------------------------------------------

def _make_gemv(load):
    def gemv(a, b, out, n, k, a2, b2, r2, r3, T2, T1, T1b, KS):
        """out[z, j, i] = Σ_c a[za, i, c] * b[z, j, c] for the <= DECODE_ROWS rows j of b; warp = column i."""
        red = cuda.shared.array(THREADS_GEMV, numba.float64)
        vals = cuda.local.array(32, numba.float32)
        acc = cuda.local.array(DECODE_ROWS, numba.float64)
        tid = cuda.threadIdx.x
        lane = tid & 31
        row = cuda.blockIdx.x * WARPS + (tid >> 5)
        z = cuda.blockIdx.y
        za = _a_batch(z, a2, b2, r2, r3)
        m = b.shape[1]
        for j in range(DECODE_ROWS):
            acc[j] = 0.0
        if row < n:
            for s in range(lane, (k + 31) // 32, 32):
                load(a, za, n, row, s, k, vals, 0, T2, T1, T1b, KS)
                c0 = 32 * s
                for j in range(m):
                    t = 0.0
                    for e in range(32):
                        if c0 + e < k:
                            t += np.float64(vals[e]) * np.float64(b[z, j, c0 + e])
                    acc[j] += t
        for j in range(m):                         # every thread: the simulator's reduction has barriers
            v = _warp_sum(acc[j], red, tid)
            if lane == 0 and row < n:
                out[z, j, row] = np.float32(v)
    return cuda.jit(gemv)


def _make_gemm(load):
    def gemm(a, b, out, n, k, a2, b2, r2, r3, T2, T1, T1b, KS):
        """out[z, j, i] for a TILE x TILE tile (j from m0, i from n0) through shared memory, f64 sums."""
        Ws = cuda.shared.array(SHARED_TILE, numba.float32)
        Bs = cuda.shared.array(SHARED_TILE, numba.float32)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        t = ty * HALF + tx
        n0 = cuda.blockIdx.x * TILE
        m0 = cuda.blockIdx.y * TILE
        z = cuda.blockIdx.z
        za = _a_batch(z, a2, b2, r2, r3)
        m = b.shape[1]
        c00 = 0.0
        c01 = 0.0
        c10 = 0.0
        c11 = 0.0
        for k0 in range(0, k, TK):
            if t < TILE * SUBS:                    # one weight sub-block per thread
                r = t // SUBS
                sub = t - r * SUBS
                p = r * LDS + 32 * sub
                if n0 + r < n and k0 + 32 * sub < k:
                    load(a, za, n, n0 + r, k0 // 32 + sub, k, Ws, p, T2, T1, T1b, KS)
                else:
                    for e in range(32):
                        Ws[p + e] = np.float32(0.0)
            for q in range(t, TILE * TK, HALF * HALF):
                r = q // TK
                c = q - r * TK
                inside = m0 + r < m and k0 + c < k
                Bs[r * LDS + c] = b[z, m0 + r, k0 + c] if inside else np.float32(0.0)
            cuda.syncthreads()
            kend = k - k0 if k - k0 < TK else TK
            for kk in range(kend):
                w0 = np.float64(Ws[tx * LDS + kk])
                w1 = np.float64(Ws[(tx + HALF) * LDS + kk])
                x0 = np.float64(Bs[ty * LDS + kk])
                x1 = np.float64(Bs[(ty + HALF) * LDS + kk])
                c00 += x0 * w0
                c01 += x0 * w1
                c10 += x1 * w0
                c11 += x1 * w1
            cuda.syncthreads()
        i0 = n0 + tx
        j0 = m0 + ty
        if j0 < m:
            if i0 < n:
                out[z, j0, i0] = np.float32(c00)
            if i0 + HALF < n:
                out[z, j0, i0 + HALF] = np.float32(c01)
        if j0 + HALF < m:
            if i0 < n:
                out[z, j0 + HALF, i0] = np.float32(c10)
            if i0 + HALF < n:
                out[z, j0 + HALF, i0 + HALF] = np.float32(c11)
    return cuda.jit(gemm)


@functools.lru_cache(maxsize=None)
def kernels(kind) -> tuple:
    """(gemv, gemm) for weights of kind "float" (f32/f16 values) or a block GGMLType (compiled on first
    launch, once per argument types)."""
    if kind == "float":
        load = _load_float
    else:
        t = GGMLType(kind)
        load = _make_quant_loader(quants.DECODERS[t], quants.sub_blocks(t))
    return _make_gemv(load), _make_gemm(load)


# -- host side --------------------------------------------------------------------------------------------------

def _desc(x):
    """x as refimpl.ops._shapes.fmt describes it: device arrays by a host stand-in of their shape and dtype."""
    if isinstance(x, DeviceWeight):
        return tuple(x.shape)
    if _device.is_device(x):
        return np.broadcast_to(np.zeros((), x.dtype), x.shape)
    return x


def _check_shapes(a, b) -> None:
    """The reference's shape rule, with its message: same k, b's batch dims multiples of a's."""
    na, nb = ne4(tuple(a.shape)), ne4(tuple(b.shape))
    if na[0] != nb[0] or 0 in na[2:] or nb[2] % na[2] or nb[3] % na[3]:
        fail("mul_mat", "need a.ne0 == b.ne0 and b.ne2, b.ne3 multiples of a's", a=_desc(a), b=_desc(b))


def mul_mat_device(dw, b):
    """ggml_mul_mat(a, b) on the device: dw a DeviceWeight (`_device.weight`) or an f32 C-contiguous device
    array (activations), b an f32 C-contiguous device array; shapes as refimpl.ops.matmul.mul_mat. Returns
    an f32 device array of NumPy shape (b3, b2, m, n), as many leading dims as b has (at least 2)."""
    _check_shapes(dw, b)
    na, nb = ne4(tuple(dw.shape)), ne4(tuple(b.shape))
    k, n, m, nbatch = na[0], na[1], nb[1], nb[2] * nb[3]
    nd = max(len(b.shape), 2)
    shape = (nb[3], nb[2], m, n)[4 - nd:]
    if 0 in (k, n, m, nbatch):
        return cuda.to_device(np.zeros(shape, np.float32))
    if isinstance(dw, DeviceWeight) and dw.type not in (GGMLType.F32, GGMLType.F16) \
            and dw.type not in quants.DECODERS:
        dw = quants.dequantize_device(dw)           # BF16: f32 values first
    if isinstance(dw, DeviceWeight) and dw.type in quants.DECODERS:
        kind, T = dw.type, quants.tables(dw.type)
        A = dw.data.reshape(dw.data.size // traits(dw.type).type_size, traits(dw.type).type_size)
    else:
        kind, T = "float", quants.tables(GGMLType.F32)
        A = (dw.data if isinstance(dw, DeviceWeight) else dw).reshape(na[2] * na[3], n, k)
    B = b.reshape(nbatch, m, k)
    out = cuda.device_array((nbatch, m, n), np.float32)
    gemv, gemm = kernels(kind)
    args = (A, B, out, n, k, na[2], nb[2], nb[2] // na[2], nb[3] // na[3]) + tuple(T)
    if m <= DECODE_ROWS:
        gemv[(-(-n // WARPS), nbatch), THREADS_GEMV](*args)
    else:
        gemm[(-(-n // TILE), -(-m // TILE), nbatch), (HALF, HALF)](*args)
    return out.reshape(shape)


def _operands(a, b):
    """(a for mul_mat_device, b on the device) where the kernels cover the inputs, else None. Raises the
    reference's errors for weights ggml rejects and for mismatched shapes."""
    if isinstance(b, QTensor):
        return None                                 # b in the weight's vec_dot type: the reference
    if _device.is_device(a):
        if np.dtype(a.dtype) != np.float32 or not is_contiguous(a) or not 1 <= len(a.shape) <= 4:
            return None
    else:
        a = a if isinstance(a, QTensor) else np.asarray(a)
        if not 1 <= len(a.shape) <= 4:
            return None
        ref_mm.check_weights("mul_mat", a)
    if _device.is_device(b):
        if np.dtype(b.dtype) != np.float32 or not is_contiguous(b) or not 1 <= len(b.shape) <= 4:
            return None
    else:
        b = np.asarray(b)
        if b.dtype != np.float32 or not 1 <= b.ndim <= 4 or not rows_packed(b):
            return None
    _check_shapes(a, b)
    return (a if _device.is_device(a) else _device.weight(a)), _device.to_device(b)


@register("mul_mat", backend="cuda")
def mul_mat(a, b):
    """ggml_mul_mat(ctx, a, b) (see refimpl.ops.matmul.mul_mat) on the GPU: weights uploaded once, f64 sums
    (fast numerics too: the f64 sums are within its bound). Other inputs: the NumPy product on host copies,
    the result back on the device."""
    ops = _operands(a, b)
    if ops is not None:
        return mul_mat_device(*ops)
    host = [x if isinstance(x, QTensor) else _device.to_host(x) for x in (a, b)]
    dt = np.float32 if current_numerics() == "fast" else np.float64
    return _device.to_device(ref_mm.tiled_mul_mat(*host, dt))


def ptx_signatures() -> list[tuple]:
    """(kernel, argument types) of every mul_mat kernel, as a real launch types them."""
    ty = numba.types
    f32, i64 = ty.float32, ty.int64
    rest = (f32[:, :, ::1], f32[:, :, ::1]) + (i64,) * 6 + (f32[:, ::1], f32[::1], f32[::1], ty.uint8[::1])
    sigs = []
    for kind, a in [("float", f32[:, :, ::1]), ("float", ty.float16[:, :, ::1])] + \
            [(t, ty.uint8[:, ::1]) for t in sorted(ref_mm.VEC_DOT_TYPE) if t in quants.DECODERS]:
        sigs += [(k, (a,) + rest) for k in kernels(kind)]
    return sigs
