"""mul_mat with Numba: any weight type, never materialising a dequantized weight matrix.

Versions (exact and fast numerics; numerics="ggml" and every case below not covered run the NumPy reference):
    decode   (<= DECODE_ROWS rows of b per weight matrix)  `_gemv_<type>`: a thread per range of weight
             rows; rows decoded eight at a time into an L1-sized f32 buffer (`quants._dq_<type>`, the
             bits of refimpl.dequantize), each dotted with every row of b in f64 -- LANES f64 partial
             sums, rounded once to f32 (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0: the same lanes and sums through
             `simd.vdot64_<type>`, the block decoded in registers, `_vrows`). The reference sums the
             same exact f64 products with BLAS, in BLAS's order: results agree to the f64 rounding of the
             sum, i.e. identical f32 but where that rounding straddles an f32 rounding boundary (NMSE
             ~1e-30; tolerance ("mul_mat", "*", "property")).
    prefill  (more rows)  the reference's own computation -- TILE_ROWS weight rows at a time as f64, one
             BLAS `b @ w.T` per tile (`blas.matmul_t`: split over refimpl's threads, BLAS on one) -- with
             the tile decoded by the Numba decoders in threads (`quants.dequantize_into`). Identical bits to
             the reference.

Fast numerics (section at the end): f32 sums -- fused `_fast_<type>` decode kernels for Q4_0 Q4_1 Q5_0
Q5_1 Q8_0 (vector IR from kernels/simd.py: 16-29 GFLOP/s per core against 3.5-5.4 for the f64 decode),
BLAS sgemv for f32 weights of at least FAST_BLAS_MIN elements (RWKV's 768x768: 37 GFLOP/s against 9 for
the f64 kernel), f32 BLAS tiles for prefill (MKL's sgemm where the `mkl` wheel is installed, kernels/mkl.py,
with the tiles decoded by every thread; else NumPy's OpenBLAS); other decode products run the exact kernels.
Small f32 products (attention over the KV cache) stay off BLAS: OpenBLAS's threads spin after a call and the
decode kernels' OpenMP threads after a prange, and the two fight over the cores when interleaved (a prefill
whose tile decoding used the prange drivers beside OpenBLAS ran 10x slower, measured).

Weights: a QTensor of any type with a CPU vec_dot (`GEMV`), or an f32 / f16 ndarray; b: f32
with packed rows (anything else, e.g. b already in the weight's vec_dot type, goes to the reference).
"""
from __future__ import annotations

import numpy as np
import threading

from numba import njit, prange

from ..ops import matmul as ref_mm
from ..dispatch import current_numerics, register
from ..shapes import is_transposed, ne4, rows_packed
from ..qtensor import QTensor
from ..types import GGMLType, traits
from . import blas, mkl, quants, simd
from ._common import n_threads, parallel_ranges, per_type, prange_ok

DECODE_ROWS = 8          # rows of b up to which the fused decode-dot path runs
GEMV_MIN_MACS = 1 << 18  # multiply-adds per thread at least (Python thread pool)
PAR_MIN_MACS = 1 << 15   # the same for the prange drivers (a launch is cheaper than the pool's hand-off)
ATTN_PAR_MIN_MACS = 1 << 17  # attention decode products: multiply-adds per thread at least (a short cache's
                         # products run faster on one thread than split)
FAST_BLAS_MIN = 1 << 18  # fast decode: f32 weights of at least this many elements go to BLAS sgemv (see below)
FAST_TILE = 1 << 20      # fast prefill: weight elements per f32 tile (4 MB; SmolLM2's matrices in one tile,
                         # one decode and one sgemm each: a 64-row remainder tile ran sgemm at half speed)
LANES = 32               # f64 partial sums of the decode dot products


@njit(inline="always")
def _dot_f64(x, y, k, acc):
    """Σ f64(x[i]) * y[i] over i < k (x f32, y f64): LANES partial sums (acc, scratch), lane l taking
    i = l, l + LANES, ... in order, then added in lane order -- every product exact, the sum one of the
    f64 orders BLAS might use."""
    L = acc.size
    for l in range(L):
        acc[l] = 0.0
    nfull = k // L
    for c in range(nfull):
        base = c * L
        for l in range(L):
            acc[l] = acc[l] + np.float64(x[base + l]) * y[base + l]
    s = 0.0
    for l in range(L):
        s += acc[l]
    for i in range(nfull * L, k):
        s += np.float64(x[i]) * y[i]
    return s


@njit(inline="always")
def _gemv(dq, W2, nb, B, out, lo, hi, T):
    """out[j, r] = f32(Σ_k w_r[k] * B[j, k]) for weight rows r in lo..hi-1: W2 (n*nb, type_size) uint8
    blocks (row r = blocks r*nb .. r*nb+nb-1), B (M, k) f64, out (M, n) f32. Rows are decoded eight at
    a time by dq (a `quants._dq_<type>`) into an L1-sized f32 buffer, each then dotted with every row
    of B. Inlined into one small function per type (`GEMV`), so that each compiles on its own."""
    k = B.shape[1]
    G = 8
    buf = np.empty((G * nb, k // nb), np.float32)
    flat = buf.reshape(G * k)
    acc = np.empty(LANES, np.float64)
    for r0 in range(lo, hi, G):
        g = min(G, hi - r0)
        dq(W2[r0 * nb:(r0 + g) * nb], buf, 0, g * nb, T)
        for q in range(g):
            row = flat[q * k:(q + 1) * k]
            for j in range(B.shape[0]):
                out[j, r0 + q] = np.float32(_dot_f64(row, B[j], k, acc))


@njit(inline="always")
def _vrows(vdot, ts, W, nb, B, out, lo, hi):
    """out[j, r] = f32(vdot(weight row r, B[j])) for r in lo..hi-1, every j: a `simd.vdot_<type>` (fast
    numerics, B f32) or `simd.vdot64_<type>` (exact, B f64). The bounds the IR relies on are checked here,
    once a call (W (rows * nb, ts) blocks, B (M, >= 32 * nb), out (M, >= hi)).

    Exact mode's vdot64 gives the bits of `_gemv` with the type's decoder -- the same decoded values, the
    same 32 f64 lanes (element i of the row in lane i % 32), the same final sum in lane order (tested) -- at
    2x its speed; a Q4_1/Q5_1 block whose min is NaN gives NaN outputs either way, though perhaps another
    NaN payload."""
    k = B.shape[1]
    if hi > lo and (lo < 0 or hi > out.shape[1] or hi * nb > W.shape[0] or W.shape[1] != ts or 32 * nb > k
                    or out.shape[0] != B.shape[0]):
        raise ValueError("mul_mat decode kernel: weight blocks, activation rows and output do not match")
    for r in range(lo, hi):
        for j in range(B.shape[0]):
            out[j, r] = np.float32(vdot(W, r * nb, nb, B, j * k))


# One small function per weight type (GEMV), made from the type table: the types with a Numba decoder
# (`quants.DECODERS`, but f32 below and the activation types Q8_1 / Q8_K), through `simd.vdot64_<type>` where
# kernels/simd.py has one. Each compiles on its own, on first use of its type.
GEMV_TYPES = tuple(traits(t).name for t in quants.DECODERS
                   if t not in (int(GGMLType.F32), int(GGMLType.Q8_1), int(GGMLType.Q8_K)))
VECTOR_TYPES = tuple(n for n in GEMV_TYPES if hasattr(simd, f"vdot64_{n}"))     # Q4_0 Q4_1 Q5_0 Q5_1 Q8_0

_GEMV_DECODED = """
@njit(cache=True, nogil=True)
def _gemv_{t}(W2, nb, B, out, lo, hi, T):
    _gemv(quants._dq_{t}, W2, nb, B, out, lo, hi, T)
"""
_GEMV_VECTOR = """
@njit(cache=True, nogil=True)
def _gemv_{t}(W2, nb, B, out, lo, hi, T):
    _vrows(simd.vdot64_{t}, {ts}, W2, nb, B, out, lo, hi)
"""
# defines _gemv_f16 _gemv_bf16 _gemv_q1_0 _gemv_q2_K _gemv_q3_K _gemv_q4_K _gemv_q5_K _gemv_q6_K _gemv_iq2_xxs
# _gemv_iq2_xs _gemv_iq2_s _gemv_iq3_xxs _gemv_iq3_s _gemv_iq1_s _gemv_iq1_m _gemv_iq4_nl _gemv_iq4_xs _gemv_tq1_0
# _gemv_tq2_0 _gemv_mxfp4 _gemv_nvfp4 (_GEMV_DECODED) and _gemv_q4_0 _gemv_q4_1 _gemv_q5_0 _gemv_q5_1 _gemv_q8_0
# (_GEMV_VECTOR): one per type of quants.DECODERS, tests/kernels check the list against the table
GEMV = {int(traits(n).type): f for n, f in (
    *per_type(globals(), _GEMV_DECODED, [n for n in GEMV_TYPES if n not in VECTOR_TYPES]).items(),
    *per_type(globals(), _GEMV_VECTOR, VECTOR_TYPES, ts=lambda n: traits(n).type_size).items())}


@njit(cache=True, nogil=True)
def _gemv_f32(W, B, out, lo, hi):
    """_gemv for f32 weight rows W (n, k) C-contiguous, B (M, k) f64 C-contiguous: `simd.vdot64_f32` (the
    lanes and order of `_dot_f64`, vectorized) per output."""
    k, M = B.shape[1], B.shape[0]
    if hi > lo and (lo < 0 or hi > W.shape[0] or W.shape[1] != k or out.shape[0] != M or hi > out.shape[1]):
        raise ValueError("mul_mat f32 decode kernel: operand shapes do not match")
    for r in range(lo, hi):
        for j in range(M):
            out[j, r] = np.float32(simd.vdot64_f32(W, r * k, B, j * k, k))


@njit(inline="always")
def _attn_shapes(A, sG, sN, G, n, k, B, out, h0, h1):
    """(m, r) of an attention product -- A's rows (G, n, k) at flat offsets g * sG + i * sN of A (1-D), B
    (H, m, k), out (H, m, n), heads h0..h1-1 -- after checking them (the vector dots read flat addresses)."""
    H, m = B.shape[0], B.shape[1]
    if (G <= 0 or n <= 0 or k <= 0 or H % G != 0 or B.shape[2] != k or out.shape[0] != H or out.shape[1] != m
            or out.shape[2] != n or h0 < 0 or h1 > H or sG < 0 or sN < 0
            or (G - 1) * sG + (n - 1) * sN + k > A.shape[0]):
        raise ValueError("mul_mat attention kernel: operand shapes do not match")
    return m, H // G


@njit(cache=True, nogil=True)
def _attn_exact(A, sG, sN, G, n, k, B, out, h0, h1):
    """Attention's decode products for heads h0..h1-1: out[h, j, i] = f32(Σ f64 A[h // r, i] * B[h, j]),
    A's (G, n, k) rows at flat offsets g * sG + i * sN of A (f32, or uint16 f16 bits widened exactly: the
    cache side, read where it is), B (H, m, k) f64, out (H, m, n), r = H // G (ggml's broadcast of the
    weight batch); `simd.vdot64_f32`, `_dot_f64`'s lanes and order, so the bits of the per-batch path."""
    m, r = _attn_shapes(A, sG, sN, G, n, k, B, out, h0, h1)
    for h in range(h0, h1):
        g = h // r
        for j in range(m):
            for i in range(n):
                out[h, j, i] = np.float32(simd.vdot64_f32(A, g * sG + i * sN, B, (h * m + j) * k, k))


@njit(cache=True, nogil=True)
def _attn_fast(A, sG, sN, G, n, k, B, out, h0, h1):
    """`_attn_exact` in f32 (numerics="fast"): each output `simd.vdot_f32` of the two rows, B (H, m, k) f32."""
    m, r = _attn_shapes(A, sG, sN, G, n, k, B, out, h0, h1)
    for h in range(h0, h1):
        g = h // r
        for j in range(m):
            for i in range(n):
                out[h, j, i] = simd.vdot_f32(A, g * sG + i * sN, B, (h * m + j) * k, k)


def _weights(a):
    """(tid, blocks (rows..., nb, type_size) uint8) of a weight, or (None, the f32 array) for f32 weights.
    A QTensor whose rows are not adjacent in memory (a strided view) has its bytes copied, still encoded."""
    if isinstance(a, QTensor):
        tr = traits(a.type)
        data = np.ascontiguousarray(a.data)
        return int(a.type), data.reshape(a.shape[:-1] + (a.shape[-1] // tr.blck_size, tr.type_size))
    if a.dtype == np.float16:
        return int(GGMLType.F16), np.ascontiguousarray(a).view(np.uint8).reshape(a.shape + (2,))
    return None, np.ascontiguousarray(a)


def _batched_f32(W, b4, na, nb, r2, r3) -> np.ndarray:
    """Fast numerics, f32 weights with batch dims (attention's K and V), many rows: one batched sgemm.
    ggml's broadcast (weight batch i serves b batches i*r .. i*r+r-1) as a NumPy broadcast of views:
    b (a3, r3, a2, r2, m, k) against the weights (a3, 1, a2, 1, k, n), no copies."""
    bv = b4.reshape(na[3], r3, na[2], r2, nb[1], nb[0])
    wv = np.swapaxes(W, -1, -2).reshape(na[3], 1, na[2], 1, na[0], na[1])
    return np.matmul(bv, wv).reshape(nb[3], nb[2], nb[1], na[1])


def _batched_split(W, b4, na, nb, r2, r3) -> np.ndarray:
    """_batched_f32 as one `blas.gemm_nt` per weight batch (MKL's, split over refimpl's threads; W
    C-contiguous, from _weights): b's r3 x r2 batches that share weight batch (i3, i2) as one (r3 * r2 * m, k)
    matrix where they are adjacent in memory, else one call each."""
    out = np.empty((nb[3], nb[2], nb[1], na[1]), np.float32)
    k, n = nb[0], na[1]
    for i3 in range(na[3]):
        for i2 in range(na[2]):
            w = W[i3, i2]
            bs = b4[i3 * r3:(i3 + 1) * r3, i2 * r2:(i2 + 1) * r2]
            o = out[i3 * r3:(i3 + 1) * r3, i2 * r2:(i2 + 1) * r2]
            if bs.flags.c_contiguous and o.flags.c_contiguous:
                parts = [(bs.reshape(-1, k), o.reshape(-1, n))]
            else:
                parts = [(bs[j3, j2], o[j3, j2]) for j3 in range(r3) for j2 in range(r2)]
            for x, y in parts:
                blas.gemm_nt(x, w, y, omp=True)
    return out


_F32, _F16 = np.dtype(np.float32), np.dtype(np.float16)


def _decode_2d(a, b, fast: bool):
    """The models' decode product -- a 2-D block weight with a prange driver (or in fast mode a large f32
    one), b (M <= DECODE_ROWS, k) f32 packed -- without the general path's 4-D bookkeeping (~15 us a call,
    hundreds of calls a token); the same kernels, so the same bits. None for anything else."""
    if (fast and type(a) is np.ndarray and a.ndim == 2 and a.dtype == _F32 and a.shape[1] == b.shape[1]
            and a.size >= FAST_BLAS_MIN and a.flags.c_contiguous):
        return b @ a.T                               # BLAS sgemv, as the general path below
    if not isinstance(a, QTensor) or len(a.shape) != 2 or a.shape[1] != b.shape[1] or a.shape[0] == 0:
        return None
    tid = int(a.type)
    if tid not in GEMV or not a.data.flags.c_contiguous:
        return None
    n, k = a.shape
    nbk = k // traits(a.type).blck_size
    W2 = a.data.reshape(n * nbk, -1)
    return _decode_blocks(tid, W2, nbk, b, np.empty((b.shape[0], n), np.float32), fast)


def _cache_rows(a: np.ndarray):
    """a (G, n, k) f32 or f16, its rows contiguous at any non-negative strides (the KV cache as the models
    and llama.cpp view it: heads interleaved, the first n_kv of a longer run of cells, V transposed), as
    (A, sG, sN): A 1-D over the elements from a's first to its last (f16 as uint16 bits), row (g, i) at
    A[g * sG + i * sN:][:k]. Anything else comes packed in f32 first."""
    G, n, k = a.shape
    bits = (lambda x: x.view(np.uint16)) if a.dtype == _F16 else (lambda x: x)
    if a.flags.c_contiguous:                          # packed (G, n, k): a plain reshape, no stride tricks
        return bits(a.reshape(-1)), n * k, k
    t = a.transpose(1, 0, 2)
    if t.flags.c_contiguous:                          # the models' cache (n, G, k), transposed
        return bits(t.reshape(-1)), k, G * k
    it = a.itemsize
    s0, s1, s2 = a.strides
    if not (s2 == it and s0 >= 0 and s1 >= 0 and s0 % it == 0 and s1 % it == 0):
        a = np.ascontiguousarray(a, np.float32)
        return a.reshape(-1), n * k, k
    sG, sN = s0 // it, s1 // it                       # rows apart (the first n_kv cells of a longer cache)
    flat = np.lib.stride_tricks.as_strided(bits(a), ((G - 1) * sG + (n - 1) * sN + k,), (it,), writeable=False)
    return flat, sG, sN


def _attn_decode(a, b, fast: bool):
    """Attention's decode products as the models call them -- a (G, n, k) f32 or f16 cache side, b (H, m, k)
    f32 with m <= DECODE_ROWS, H a multiple of G, b C-contiguous -- in one kernel call over all heads (split
    by heads over threads) instead of one product per weight batch; None for anything else. The cache side
    is read where it is (`_cache_rows`: the models' (n, G, k) cache transposed, llama.cpp's f16 cache as the
    RPC server views it, its values widened exactly as loaded): the bits of `_gemv_f16` / the f32 decode
    per batch in exact mode (the same f64 lanes and order), and in fast mode the f32 sums of an f32 cache."""
    G, n, k = a.shape
    H, m = b.shape[0], b.shape[1]
    if not (G > 0 and n > 0 and k > 0 and b.shape[2] == k and H % G == 0 and H > 0 and b.flags.c_contiguous):
        return None
    A, sG, sN = _cache_rows(a)
    out = np.empty((H, m, n), np.float32)
    split = _split(H, max(1, ATTN_PAR_MIN_MACS // (n * k * m)))
    if fast:
        kern, par, B = _attn_fast, _par_attn_fast, b
    else:
        kern, par, B = _attn_exact, _par_attn_exact, b.astype(np.float64)
    if split > 1:
        par(A, sG, sN, G, n, k, B, out, split)
    else:
        kern(A, sG, sN, G, n, k, B, out, 0, H)
    return out


def _decode_blocks(tid: int, W2, nbk: int, B, out, fast: bool):
    """out (M, n) = block weight rows W2 (n * nbk, type_size) times B (M, k) f32: the fused f32 kernel in
    fast mode where the type has one, else the exact f64 kernel; rows split by a prange driver where the
    type has one (see the thread drivers below), else over the thread pool."""
    M, n, k = out.shape[0], out.shape[1], B.shape[1]
    split = _split(n, max(1, PAR_MIN_MACS // (k * M)))
    if fast and tid in FAST:
        if split > 1:
            PAR_FAST[tid](W2, nbk, B, out, split)
        else:
            FAST[tid](W2, nbk, B, out, 0, n)
        return out
    B, T = B.astype(np.float64, copy=False), quants.tables()
    if split > 1 and tid in PAR_GEMV:
        PAR_GEMV[tid](W2, nbk, B, out, T, split)
    else:
        gemv = GEMV[tid]
        parallel_ranges(lambda lo, hi: gemv(W2, nbk, B, out, lo, hi, T), n, max(1, GEMV_MIN_MACS // (k * M)))
    return out


_TLS = threading.local()


def _tile(nblocks: int, blck: int) -> np.ndarray:
    """This thread's f32 buffer for one decoded weight tile, (nblocks, blck), reused from call to call: a fresh
    4 MB array per weight matrix cost a prefill its page faults again (SmolLM2's first 128-token prefill after a
    16-token warm-up ran ~60 ms longer in mul_mat than the next one). Only the caller's sgemm reads it."""
    need = nblocks * blck
    buf = getattr(_TLS, "tile", None)
    if buf is None or buf.size < need:
        buf = _TLS.tile = np.empty(need, np.float32)
    return buf[:need].reshape(nblocks, blck)


def _covered(a, b) -> bool:
    """The inputs this kernel computes: the reference's checks all pass (so it would not raise), b f32."""
    if isinstance(b, QTensor) or b.dtype != np.float32 or b.ndim > 4 or not rows_packed(b):
        return False
    if isinstance(a, QTensor):
        if a.type not in ref_mm.VEC_DOT_TYPE or int(a.type) not in GEMV:
            return False
    elif not isinstance(a, np.ndarray) or a.dtype not in (np.float32, np.float16):
        return False
    if a.ndim > 4 or is_transposed(a) or not rows_packed(a):
        return False
    na, nb = ne4(a.shape), ne4(b.shape)
    return (na[0] == nb[0] and na[0] > 0 and min(na) > 0 and min(nb) > 0
            and nb[2] % na[2] == 0 and nb[3] % na[3] == 0)


@register("mul_mat", backend="numba")
def mul_mat(a, b) -> np.ndarray:
    """ggml_mul_mat(ctx, a, b) (see refimpl.ops.matmul.mul_mat). Which path computes it, in order:

        b 2-D, 1..DECODE_ROWS rows, f32 packed          _decode_2d      fused decode-dot per weight row
        a, b 3-D, b 1..DECODE_ROWS rows (attention)      _attn_decode    the KV cache's rows, f32/f16
        inputs the kernel does not cover (`_covered`)    NotImplemented  the next implementation runs
        fast, f32 a with batches, many rows              _batched_f32 / _batched_split (MKL)
        anything else, per weight matrix of a            _per_matrix: _small_m (<= DECODE_ROWS rows of b)
                                                         or _prefill_tiles (TILE_ROWS weight rows at a time)
    """
    if not isinstance(b, QTensor):
        b = np.asarray(b)
    if not isinstance(a, QTensor):
        a = np.asarray(a)
    fast = current_numerics() == "fast"         # "exact" or "fast": what this kernel is registered for
    if (type(b) is np.ndarray and b.ndim == 2 and 0 < b.shape[0] <= DECODE_ROWS
            and b.shape[1] > 0 and b.dtype == _F32 and b.flags.c_contiguous):
        out = _decode_2d(a, b, fast)
        if out is not None:
            return out
    if (type(b) is np.ndarray and type(a) is np.ndarray and b.ndim == 3 and a.ndim == 3
            and 0 < b.shape[1] <= DECODE_ROWS and b.dtype == _F32 and a.dtype in (_F32, _F16)):
        out = _attn_decode(a, b, fast)
        if out is not None:
            return out
    if not _covered(a, b):
        return NotImplemented                   # the next implementation (NumPy fast, or the reference)
    na, nb = ne4(a.shape), ne4(b.shape)
    tid, W = _weights(a)
    W = W.reshape((na[3], na[2], na[1]) + W.shape[-2:] if tid is not None else (na[3], na[2], na[1], na[0]))
    b4 = b.reshape(nb[::-1])
    r2, r3 = nb[2] // na[2], nb[3] // na[3]
    if fast and tid is None and na[2] * na[3] > 1 and r3 * r2 * nb[1] > DECODE_ROWS:
        if not b4.flags.c_contiguous:           # a permuted Q (llama.cpp's view): packed once, as the split
            b4 = np.ascontiguousarray(b4)       # sgemm and the batched products read whole rows
        batched = _batched_split if mkl.available() else _batched_f32
        return batched(W, b4, na, nb, r2, r3).reshape(b.shape[:-1] + (na[1],))
    out = _per_matrix(W, tid, b4, na, nb, r2, r3, fast)
    nd = max(len(b.shape), 2)
    return out.reshape(out.shape[4 - nd:])


def _per_matrix(W, tid, b4, na, nb, r2, r3, fast: bool) -> np.ndarray:
    """out (b3, b2, m, n) f32: each weight matrix of a against the rows of b it serves (ggml's broadcast)."""
    out = np.empty((nb[3], nb[2], nb[1], na[1]), np.float32)
    for i3 in range(na[3]):
        for i2 in range(na[2]):
            bs = b4[i3 * r3:(i3 + 1) * r3, i2 * r2:(i2 + 1) * r2]                # (r3, r2, m, k)
            o = out[i3 * r3:(i3 + 1) * r3, i2 * r2:(i2 + 1) * r2]
            if r3 * r2 * nb[1] <= DECODE_ROWS:
                _small_m(W[i3, i2], tid, bs, o, na[1], na[0], fast)
            else:
                _prefill_tiles(W[i3, i2], tid, bs, o, na[1], na[0], fast)
    return out


def _small_m(w, tid, bs, o, n: int, k: int, fast: bool) -> None:
    """o = bs @ w^T for a few rows of b (<= DECODE_ROWS): BLAS sgemv for large f32 weights in fast numerics,
    the fused decode kernels for a block type, the f64 f32-weight kernels otherwise."""
    M = bs.shape[0] * bs.shape[1] * bs.shape[2]
    B = np.ascontiguousarray(bs.reshape(M, k), np.float32 if fast else np.float64)
    if fast and tid is None and n * k >= FAST_BLAS_MIN:
        o[...] = (B @ w.T).reshape(o.shape)     # BLAS sgemv: 2-4x the Numba kernels
        return
    res = np.empty((M, n), np.float32)
    if tid is not None:
        _decode_blocks(tid, w.reshape(-1, w.shape[-1]), w.shape[1], B, res, fast)
    else:
        B = B.astype(np.float64, copy=False)
        split = _split(n, max(1, PAR_MIN_MACS // (k * M)))
        if split > 1:
            _par_gemv_f32(w, B, res, split)
        else:
            _gemv_f32(w, B, res, 0, n)
    o[...] = res.reshape(o.shape)


def _prefill_tiles(w, tid, bs, o, n: int, k: int, fast: bool) -> None:
    """o = bs @ w^T, TILE_ROWS weight rows at a time (FAST_TILE elements in fast numerics), each tile decoded
    once: f64 BLAS on one thread, split over refimpl's (exact); f32 sgemm, MKL's where installed (fast)."""
    dt = np.float32 if fast else np.float64
    use_mkl = fast and mkl.available()
    bsx = bs.astype(dt, copy=False)
    if fast and not bsx.flags.c_contiguous:
        # a permuted b (the RPC server's Q, a view of Qcur) is packed once for the split sgemm below:
        # np.matmul would run it on OpenBLAS's threads, which then spin against refimpl's own
        bsx = np.ascontiguousarray(bsx)
    w2 = w.reshape(-1, w.shape[-1]) if tid is not None else None
    rows = max(ref_mm.TILE_ROWS, FAST_TILE // k) if fast else ref_mm.TILE_ROWS
    for lo in range(0, n, rows):
        hi = min(lo + rows, n)
        if tid is None:
            t32 = w[lo:hi]
        else:                                   # the tile's blocks, decoded
            nbk = w.shape[1]                    # blocks per row
            blocks = w2[lo * nbk:hi * nbk]
            t32 = _tile(blocks.shape[0], k // nbk)
            if use_mkl:                         # MKL's split runs on Numba's threads: the prange decoders
                quants.decode_tensor(tid, blocks, t32)
            elif fast and tid in FAST:          # vector decode, this thread (see the section notes)
                quants.DECODERS[tid](blocks, t32, 0, blocks.shape[0], ())
            else:
                quants.dequantize_into(tid, blocks, t32)
        flat = bsx.flags.c_contiguous and o.flags.c_contiguous
        if fast and flat:                       # sgemm straight into the output (kernels/blas.py)
            blas.gemm_nt(bsx.reshape(-1, k), t32.reshape(hi - lo, k), o.reshape(-1, n)[:, lo:hi],
                         omp=tid is not None)
        elif fast:
            np.matmul(bsx, t32.reshape(hi - lo, k).T, out=o[..., lo:hi])
        else:                                   # f64 (blas.matmul_t: BLAS on one thread, split)
            blas.matmul_t(bsx, t32.reshape(hi - lo, k).astype(dt, copy=False), o[..., lo:hi])


# -- numerics="fast" -----------------------------------------------------------------------------------------
# f32 sums in a vectorizable order. Decode: `_fast_<type>` runs the type's vector dot of kernels/simd.py
# (LLVM IR: each 32-element block decoded as a vector -- the exact dequantized f32 values -- and multiplied
# into 32 f32 lane sums with one rounding, the lanes added pairwise at the end of the row; 16-29 GFLOP/s a
# core against 3.5-8 for the same loop written in Numba, which LLVM left mostly scalar). Other weight types
# run the exact kernels (f64 sums: within fast's bound too). Attention's decode products (`_attn_fast`):
# one `simd.vdot_f32` per output, all heads in one call. Prefill: f32 tiles, one BLAS sgemm per tile. With
# MKL (kernels/mkl.py) every prefill product -- weight tiles and attention's batched products -- runs on
# refimpl's threads: a block weight's tile decoded by the prange decoders and MKL's sgemm split by rows in a
# prange too (one thread team for the decoder-style models), f32 weights (BERT, whose other kernels run on
# the thread pool) on the pool. Without
# it, OpenBLAS: the vector-decoded types decode their tile on the calling thread (a second thread only
# competes with OpenBLAS's spinning workers), the others in threads. OpenBLAS's workers spin a while after its
# last call and take a core from the first decode steps after a prefill; with every prefill product on MKL
# those steps take their steady time from the first (docs/benchmarks.md, "Thresholds"). Every output is within
# gamma_k * sum_k |w_k * b_k| of the exact result (gamma_k = k u / (1 - k u), u = 2^-24): the f32 products
# and sums of one dot, in any order.

_FAST = """
@njit(cache=True, nogil=True)
def _fast_{t}(W, nb, B, out, lo, hi):
    _vrows(simd.vdot_{t}, {ts}, W, nb, B, out, lo, hi)
"""
# defines _fast_q4_0 _fast_q4_1 _fast_q5_0 _fast_q5_1 _fast_q8_0
FAST = {int(traits(n).type): f
        for n, f in per_type(globals(), _FAST, VECTOR_TYPES, ts=lambda n: traits(n).type_size).items()}


# -- thread drivers ------------------------------------------------------------------------------------------
# A model's mat-vec takes about as long as handing half of it to a Python thread pool, so the decode kernels
# split their rows in a `prange` instead (Numba's OpenMP layer starts a range far sooner). One small driver per
# kernel, from a template (`per_type`: a driver taking the kernel as an argument is not cached by Numba); the
# kernel itself is a call, compiled once, not re-optimised. Types without a driver split their rows with
# `parallel_ranges`.

_PAR_FAST = """
@njit(cache=True, parallel=True, nogil=True)
def _par_fast_{t}(W, nb, B, out, nchunk):
    n = out.shape[1]
    for c in prange(nchunk):
        _fast_{t}(W, nb, B, out, n * c // nchunk, n * (c + 1) // nchunk)
"""
_PAR_GEMV = """
@njit(cache=True, parallel=True, nogil=True)
def _par_gemv_{t}(W, nb, B, out, T, nchunk):
    n = out.shape[1]
    for c in prange(nchunk):
        _gemv_{t}(W, nb, B, out, n * c // nchunk, n * (c + 1) // nchunk, T)
"""
# defines _par_fast_q4_0 _par_fast_q4_1 _par_fast_q5_0 _par_fast_q5_1 _par_fast_q8_0 (_PAR_FAST) and _par_gemv_f16
# _par_gemv_q4_0 _par_gemv_q4_1 _par_gemv_q5_0 _par_gemv_q5_1 _par_gemv_q8_0 _par_gemv_q4_K _par_gemv_q5_K
# _par_gemv_q6_K (_PAR_GEMV)
PAR_FAST = {int(traits(n).type): f for n, f in per_type(globals(), _PAR_FAST, VECTOR_TYPES).items()}
PAR_GEMV = {int(traits(n).type): f for n, f in per_type(globals(), _PAR_GEMV,
                                                       ("f16",) + VECTOR_TYPES + ("q4_K", "q5_K", "q6_K")).items()}


@njit(cache=True, parallel=True, nogil=True)
def _par_gemv_f32(W, B, out, nchunk):
    n = out.shape[1]
    for c in prange(nchunk):
        _gemv_f32(W, B, out, n * c // nchunk, n * (c + 1) // nchunk)


@njit(cache=True, parallel=True, nogil=True)
def _par_attn_exact(A, sG, sN, G, n, k, B, out, nchunk):
    H = out.shape[0]
    for c in prange(nchunk):
        _attn_exact(A, sG, sN, G, n, k, B, out, H * c // nchunk, H * (c + 1) // nchunk)

@njit(cache=True, parallel=True, nogil=True)
def _par_attn_fast(A, sG, sN, G, n, k, B, out, nchunk):
    H = out.shape[0]
    for c in prange(nchunk):
        _attn_fast(A, sG, sN, G, n, k, B, out, H * c // nchunk, H * (c + 1) // nchunk)


def _split(n: int, per: int) -> int:
    """How many row ranges a decode product of n rows takes (>= per rows each, at most one per thread);
    1 in a forked child (GNU OpenMP's threads do not survive a fork) or on a pool thread."""
    k = min(n_threads(), max(1, n // max(1, per)))
    if k > 1 and not prange_ok():
        return 1
    return k

