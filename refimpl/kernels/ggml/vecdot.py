"""ggml-cpu's dot products on the portable AVX2 build, rounding for rounding.

Every function here computes many dot products at once: weight rows (n, k) against activation rows (m, k)
give an (m, n) f32 array (numpy order of mul_mat's output), each element the value ggml-cpu's `vec_dot`
returns for that pair. The SIMD registers become a trailing "lane" axis, moved to the front so that the
per-lane state is an array of shape (lanes, n, m):

    fma32(a, b, c)      fl32(a*b + c) with one rounding (_mm256_fmadd_ps, and the scalar a*b + c GCC contracts)
    hsum_a(v), hsum_b(v)   the two horizontal sums of 8 f32 lanes used by ggml-cpu (see below)
    dot_f32, dot_f16, dot_bf16   ggml_vec_dot_f32 / _f16 / _bf16 (src/ggml-cpu/vec.cpp)
    int_lanes(w, a)     exact integer sums of the quantized dots, per 256-bit register lane

Lanes: a 256-bit register holds 8 f32 (or int32) lanes. The quantized kernels (src/ggml-cpu/arch/x86/quants.c)
load 32 consecutive int8 activations per register and reduce byte products to int32 lanes 4 at a time
(maddubs + madd), so element e of a block lands in lane (e % 32) // 4.
"""
from __future__ import annotations

import numpy as np

from ...rounding import fma32  # noqa: F401  (re-exported: the lanes below use it)

f32, f64 = np.float32, np.float64

# Weight elements (rows x k) of one mul_mat tile, held as f64 lane-major copies: bounds memory to ~32 MB.
TILE_ELEMS = 1 << 22


# -- f32 primitives ---------------------------------------------------------------------------------

def hsum_a(v: np.ndarray) -> np.ndarray:
    """GGML_F32x8_REDUCE's last step (ggml_vec_dot_f32 / _f16): 8 lanes on axis 0, t_i = v_i + v_{i+4},
    then (t0 + t1) + (t2 + t3) (two _mm_hadd_ps)."""
    t = v[:4] + v[4:]
    return (t[0] + t[1]) + (t[2] + t[3])


def hsum_b(v: np.ndarray) -> np.ndarray:
    """hsum_float_8 (quantized dots, bf16 dot, softmax/norm chunk sums): 8 lanes on axis 0,
    t_i = v_i + v_{i+4}, then (t0 + t2) + (t1 + t3) (movehl, then movehdup)."""
    t = v[:4] + v[4:]
    return (t[0] + t[2]) + (t[1] + t[3])


def _lanes32(x: np.ndarray, lo: int) -> np.ndarray:
    """x[:, lo:lo+32] as (32, rows): lane j*8 + l of GGML_F32_ARR=4 registers of GGML_F32_EPR=8."""
    return np.ascontiguousarray(x[:, lo:lo + 32].T)


# -- float dots ---------------------------------------------------------------------------------------

def _main_loop(x: np.ndarray, y: np.ndarray, fused: bool) -> tuple[np.ndarray, int]:
    """The GGML_F32_STEP = 32 loop: 4 accumulators of 8 lanes, acc = fma(x, y, acc) per chunk.
    x (n, k) f32, y (m, k) f32 -> acc (4, 8, n, m) f32 and the number of elements it consumed."""
    n, k = x.shape
    m = y.shape[0]
    np_ = k - k % 32
    acc = np.zeros((32, n, m), f32)
    for c in range(0, np_, 32):
        xs, ys = _lanes32(x, c)[:, :, None], _lanes32(y, c)[:, None, :]
        if fused:
            acc = fma32(xs, ys, acc)
        else:                                   # exact products (f16, bf16 operands): fma == add
            acc += xs * ys
    return acc.reshape(4, 8, n, m), np_


def dot_f32(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f32 on AVX2: x (n, k) f32 weights, y (m, k) f32 activations -> (m, n) f32.

    Main loop over chunks of 32 (4 x 8 FMA lanes); sum[0] += sum[2], sum[1] += sum[3], sum[0] += sum[1];
    `hsum_a`. The leftover loop `sumf += x[i]*y[i]` (f32 sumf) is compiled by GCC as: products of the
    first 4*floor(r/4) leftovers rounded and added in index order, the last r % 4 as contracted scalar FMAs.
    """
    n, k = x.shape
    acc, np_ = _main_loop(x, y, fused=True)
    s = hsum_a((acc[0] + acc[2]) + (acc[1] + acc[3])).T                  # (m, n)
    q = np_ + 4 * ((k - np_) // 4)
    for i in range(np_, q):
        s = s + (y[:, i:i + 1] * x[:, i][None, :])
    for i in range(q, k):
        s = fma32(y[:, i:i + 1], x[:, i][None, :], s)
    return s


def _f64_tail(s: np.ndarray, x: np.ndarray, y: np.ndarray, lo: int) -> np.ndarray:
    """`ggml_float sumf = reduce; for leftovers sumf += (double)(x[i]*y[i])` (f32 products, exact here),
    one rounding to f32 at the end (*s = sumf)."""
    S = s.astype(f64)
    for i in range(lo, x.shape[1]):
        S = S + (y[:, i:i + 1] * x[:, i][None, :]).astype(f64)
    return S.astype(f32)


def dot_f16(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f16 on AVX2+F16C: x (n, k), y (m, k) f16 -> (m, n) f32.

    Operands widened to f32 (exact), the F32 main loop (f16 x f16 products are exact in f32, so each FMA
    is one rounding of acc + product) and `hsum_a`, widened to f64; leftovers added in f64; rounded once.
    """
    xf, yf = x.astype(f32), y.astype(f32)
    acc, np_ = _main_loop(xf, yf, fused=False)
    s = hsum_a((acc[0] + acc[2]) + (acc[1] + acc[3])).T
    return _f64_tail(s, xf, yf, np_)


def dot_bf16(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_bf16 on AVX2: x (n, k), y (m, k) bf16 values already widened to f32 -> (m, n) f32.

    c_j += x*y over chunks of 32 (4 x 8 lanes; bf16 products are exact in f32), c1 = (c1 + c3) + (c2 + c4),
    `hsum_b`, widened to f64; leftovers added in f64; rounded once.
    """
    acc, np_ = _main_loop(x, y, fused=False)
    s = hsum_b((acc[0] + acc[2]) + (acc[1] + acc[3])).T
    return _f64_tail(s, x, y, np_)


# -- integer lanes of the quantized dots ----------------------------------------------------------------

def lane_major(v: np.ndarray, blck: int) -> np.ndarray:
    """(rows, nblk * blck) per-element values -> (nblk, 8, rows, blck // 8) f64: for each block and register
    lane, the blck/8 elements that lane sums (elements e with (e % 32) // 4 == lane)."""
    rows = v.shape[0]
    g = v.reshape(rows, -1, blck // 32, 8, 4)                             # (rows, nblk, group, lane, 4)
    return np.ascontiguousarray(g.transpose(1, 3, 0, 2, 4), dtype=f64).reshape(g.shape[1], 8, rows, blck // 8)


def int_lanes(w: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Exact integer lane sums: w (nblk, L, n, g), a (nblk, L, m, g) (from `lane_major`) ->
    (nblk, L, n, m) f64 holding integers (|sum| < 2^53, so the f64 matmul is exact)."""
    return np.matmul(w, a.transpose(0, 1, 3, 2))


def sign_quirk(x: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The signed byte products of mul_sum_i8_pairs / mul_add_epi8 (|x| times _mm256_sign_epi8(a, x)):
    where x < 0 and a == -128, negating a wraps to -128 and the product comes out as -x*a.

    x (rows, k) signed weight levels, a (m, k) int8 activations. Returns per-element arrays (w_fix, a_fix)
    with sum_e w_fix*a_fix the correction to add to the true products (None when no activation is -128):
    w_fix = x where x < 0 (times the scale the caller applies), a_fix = 256 where a == -128.
    """
    hit = a == -128
    if not hit.any():
        return None
    return np.where(x < 0, x, 0), np.where(hit, 256, 0)
