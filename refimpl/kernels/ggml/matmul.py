"""mul_mat with numerics="ggml": ggml-cpu's result, bit for bit, on the portable AVX2 build.

What ggml_compute_forward_mul_mat (src/ggml-cpu/ggml-cpu.c) does on that build (no llamafile sgemm, no
repacked weights, one vec_dot per output element, so the thread count does not matter):

1. b (activations) not already in the weight's vec_dot_type is converted row by row with the CPU
   `from_float` of that type: f16 (F16C, round to nearest even), bf16 (round to nearest even), Q8_0 / Q8_1
   (x86 rule: id = 127/amax, half to even; `refimpl.quantize(method="cpu")`) or Q8_K (the reference).
   F32 weights take b as it is.
2. Every output is the type's `vec_dot` of one weight row with one converted activation row; the kernels
   for each type are below (float dots in vecdot.py), each restating the AVX2 order it reproduces.

Block layouts are those of src/ggml-common.h (docs/types.md). Per type, a field reader (`_q4_K`, `_iq2_xs`,
...) returns the integer level of every element in element order and the block scales as f32, exactly as
the kernel reads them; a dot function (`_q4_K_dot`, ...) forms the kernel's integer lanes and replays its
float accumulation. QUANT_DOTS maps every weight type to its dot function.
"""
from __future__ import annotations

import numpy as np

from ...qtensor import QTensor, quantize
from ...rounding import f16_to_f32
from ...quants.fp4 import KVALUES_MXFP4, e8m0_half, ue4m3_half
from ...quants.iq_tables import TABLES
from ...types import GGMLType, type_traits
from ...dispatch import kernel_for
from ...ops.matmul import VEC_DOT_TYPE
from .vecdot import (TILE_ELEMS, dot_bf16, dot_f16, dot_f32, fma32, hsum_b, int_lanes, lane_major,
                     sign_quirk)

f32 = np.float32
K_IQ4NL = np.asarray(TABLES["kvalues_iq4nl"], np.int32)
K_MXFP4 = KVALUES_MXFP4.astype(np.int32)          # E2M1 values doubled (the scales are halved to match)
POW3 = np.array([1, 3, 9, 27, 81], np.int32)

# Output pairs (weight rows x activation rows) per step of the block loop: arrays of 8 lanes x PAIRS f32.
PAIRS = 1 << 15
# Blocks whose integer lane sums are formed at once (f64: 8 lanes x PAIRS x 8 bytes each).
BLOCK_GROUP = 4


# -- block fields --------------------------------------------------------------------------------------

def _blocks(raw: np.ndarray, type_size: int) -> np.ndarray:
    """(rows, row_bytes) uint8 -> (rows, nblk, type_size) contiguous."""
    raw = np.ascontiguousarray(raw)
    return raw.reshape(raw.shape[0], -1, type_size)


def _f16(blk: np.ndarray, off: int) -> np.ndarray:
    """The f16 at byte `off` of every block, as f32 (GGML_CPU_FP16_TO_FP32: exact): (rows, nblk)."""
    return f16_to_f32(np.ascontiguousarray(blk[..., off:off + 2]).view("<f2")[..., 0])


def _f32(blk: np.ndarray, off: int) -> np.ndarray:
    return np.ascontiguousarray(blk[..., off:off + 4]).view("<f4")[..., 0].astype(f32)


def _split_nibbles(qs: np.ndarray) -> np.ndarray:
    """16 bytes -> 32 levels: element j = low nibble of qs[j], element j + 16 = high nibble."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.int32)


def _qh_bits(qh_bytes: np.ndarray) -> np.ndarray:
    """4 bytes of a Q5_0/Q5_1 qh -> bit j of the little-endian u32 for j = 0..31, (rows, nblk, 32)."""
    return np.unpackbits(np.ascontiguousarray(qh_bytes), axis=-1, bitorder="little").astype(np.int32)


def _flat(v: np.ndarray) -> np.ndarray:
    """(rows, nblk, blck) -> (rows, nblk * blck)."""
    return v.reshape(v.shape[0], -1)


def _q8_0(blk):
    """block_q8_0: d f16 | qs[32] int8."""
    return _f16(blk, 0), _flat(blk[..., 2:34].view(np.int8).astype(np.int32))


def _q8_1(blk):
    """block_q8_1: d f16 | s f16 | qs[32] int8 (s = d * sum(qs), rounded to f16)."""
    return _f16(blk, 0), _f16(blk, 2), _flat(blk[..., 4:36].view(np.int8).astype(np.int32))


def _q8_K(blk):
    """block_q8_K: d f32 | qs[256] int8 | bsums[16] int16 (sum of qs per 16)."""
    bs = np.ascontiguousarray(blk[..., 260:292]).view("<i2").astype(np.int32)
    return _f32(blk, 0), _flat(blk[..., 4:260].view(np.int8).astype(np.int32)), bs


def _kscales(sc12: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K 12 scale bytes -> 6-bit scales and mins of the 8 sub-blocks, (rows, nblk, 8) each."""
    s = sc12.astype(np.int32)
    lo, hi = s[..., 0:4], s[..., 4:8]
    sc = np.concatenate([lo & 63, (s[..., 8:12] & 15) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([hi & 63, (s[..., 8:12] >> 4) | ((hi >> 6) << 4)], axis=-1)
    return sc, mn


def _q2_K(blk):
    """block_q2_K: scales[16] (low nibble scale, high nibble min per 16) | qs[64] | d f16 | dmin f16.
    Element 128h + 32s + l = (qs[32h + l] >> 2s) & 3."""
    qs = blk[..., 16:80].reshape(blk.shape[:2] + (2, 1, 32)).astype(np.int32)
    q = (qs >> (2 * np.arange(4)).reshape(1, 1, 1, 4, 1)) & 3                  # (rows, nblk, h, s, l)
    sc = blk[..., 0:16].astype(np.int32)
    return q.reshape(blk.shape[:2] + (256,)), sc & 15, sc >> 4, _f16(blk, 80), _f16(blk, 82)


def _q3_K(blk):
    """block_q3_K: hmask[32] | qs[64] | scales[12] | d f16. Element 128h + 32s + l: low 2 bits
    (qs[32h + l] >> 2s) & 3, minus 4 unless bit 4h + s of hmask[l] is set; 16 signed 6-bit scales."""
    sh = (2 * np.arange(4)).reshape(1, 1, 1, 4, 1)
    low = (blk[..., 32:96].reshape(blk.shape[:2] + (2, 1, 32)).astype(np.int32) >> sh) & 3
    bit = (4 * np.arange(2)).reshape(1, 1, 2, 1, 1) + np.arange(4).reshape(1, 1, 1, 4, 1)
    hb = (blk[..., 0:32].reshape(blk.shape[:2] + (1, 1, 32)).astype(np.int32) >> bit) & 1
    q = (low - 4 * (1 - hb)).reshape(blk.shape[:2] + (256,))
    s = blk[..., 96:108].astype(np.int32)
    j = np.arange(16)
    lo4 = np.where(j < 8, s[..., j % 8] & 15, s[..., j % 8] >> 4)
    hi2 = (s[..., 8 + j % 4] >> (2 * (j // 4))) & 3
    return q, (lo4 | (hi2 << 4)) - 32, _f16(blk, 108)


def _q45_K_levels(qs: np.ndarray) -> np.ndarray:
    """128 bytes -> 256 nibbles: chunk c: low nibbles of qs[32c..] = elements 64c + l, high = 64c + 32 + l."""
    q = qs.reshape(qs.shape[:2] + (4, 1, 32)).astype(np.int32)
    return np.concatenate([q & 15, q >> 4], axis=3).reshape(qs.shape[:2] + (256,))


def _q4_K(blk):
    """block_q4_K: d f16 | dmin f16 | scales[12] | qs[128]."""
    sc, mn = _kscales(blk[..., 4:16])
    return _q45_K_levels(blk[..., 16:144]), sc, mn, _f16(blk, 0), _f16(blk, 2)


def _q5_K(blk):
    """block_q5_K: d f16 | dmin f16 | scales[12] | qh[32] | qs[128]; element 64c + l takes bit 2c of qh[l],
    64c + 32 + l bit 2c + 1 (worth 16)."""
    sc, mn = _kscales(blk[..., 4:16])
    qh = blk[..., 16:48].reshape(blk.shape[:2] + (1, 32)).astype(np.int32)
    hb = (qh >> np.arange(8).reshape(1, 1, 8, 1)) & 1                       # (rows, nblk, bit, l)
    q = _q45_K_levels(blk[..., 48:176]) + 16 * hb.reshape(blk.shape[:2] + (256,))
    return q, sc, mn, _f16(blk, 0), _f16(blk, 2)


def _q6_K(blk):
    """block_q6_K: ql[128] | qh[64] | scales[16] int8 | d f16. Unsigned 6-bit u (the level is u - 32):
    half h, l < 32: elements 128h + l + 32i, i = 0..3, take nibble (i >= 2) of ql[64h + l + 32(i % 2)] and
    bits 2i, 2i+1 of qh[32h + l]."""
    ql = blk[..., 0:128].reshape(blk.shape[:2] + (2, 2, 32)).astype(np.int32)    # (h, i%2, l)
    qh = blk[..., 128:192].reshape(blk.shape[:2] + (2, 1, 32)).astype(np.int32)
    nib = np.concatenate([ql & 15, ql >> 4], axis=3)                             # (h, i, l)
    u = nib | (((qh >> (2 * np.arange(4)).reshape(1, 1, 1, 4, 1)) & 3) << 4)
    sc = blk[..., 192:208].view(np.int8).astype(np.int32)
    return u.reshape(blk.shape[:2] + (256,)), sc, _f16(blk, 208)


def _iq4_xs(blk):
    """block_iq4_xs: d f16 | scales_h u16 | scales_l[4] | qs[128]; sub-block ib: 6-bit scale
    (scales_l[ib/2] >> 4(ib%2)) & 15 | ((scales_h >> 2ib) & 3) << 4, minus 32; levels K[nibble]."""
    sh = np.ascontiguousarray(blk[..., 2:4]).view("<u2").astype(np.int32)       # (rows, nblk, 1)
    sl = blk[..., 4:8].astype(np.int32)
    ib = np.arange(8)
    ls = ((sl[..., ib // 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4)
    x = K_IQ4NL[_split_nibbles(blk[..., 8:136].reshape(blk.shape[:2] + (8, 16)))]
    return x.reshape(blk.shape[:2] + (256,)), ls - 32, _f16(blk, 0)


# -- the dot kernels --------------------------------------------------------------------------------------
# Each takes the weight blocks (n, nblk, type_size) and the activation blocks (m, nblk, act size) and returns
# (m, n) f32. `acc` arrays are 8 lanes x n x m.

def _outer(dx: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """fl(dx * dy) for every block, weight row and activation row: (nblk, n, m) f32."""
    return dx.T[:, :, None] * dy.T[:, None, :]


def _lane_steps(w: np.ndarray, a: np.ndarray, blck: int, quirk=None):
    """Yield (block index, (8, n, m) f32 lane sums) in block order: the exact integer sums of w*a per
    register lane (vecdot.int_lanes), plus the sign-quirk correction, converted to f32 (_mm256_cvtepi32_ps
    rounds to nearest even beyond 2^24)."""
    W, A = lane_major(w, blck), lane_major(a, blck)
    Q = (lane_major(quirk[0], blck), lane_major(quirk[1], blck)) if quirk is not None else None
    for b0 in range(0, W.shape[0], BLOCK_GROUP):
        sl = slice(b0, b0 + BLOCK_GROUP)
        L = int_lanes(W[sl], A[sl])
        if Q is not None:
            L += int_lanes(Q[0][sl], Q[1][sl])
        L = L.astype(f32)
        for i in range(L.shape[0]):
            yield b0 + i, L[i]


def _signed_x_q8_0(x, dx, blk_a):
    """Q4_0 / Q5_0 / Q8_0 x Q8_0: per block acc = fma(fl(d_x*d_y), lanes(mul_sum_i8_pairs_float), acc);
    hsum_float_8. x: signed levels (n, k); dx: (n, nblk)."""
    dy, a = _q8_0(blk_a)
    D = _outer(dx, dy)
    acc = np.zeros((8,) + D.shape[1:], f32)
    for b, L in _lane_steps(x, a, 32, sign_quirk(x, a)):
        acc = fma32(D[b], L, acc)
    return hsum_b(acc).T


def _unsigned_x_q8_1(x, dx, mx, blk_a):
    """Q4_1 / Q5_1 x Q8_1: acc = fma(fl(d_x*d_y), lanes, acc) per block and, in f32, summs += m_x*s_y
    (the product of two f16 values is exact); result hsum_float_8(acc) + summs."""
    dy, sy, a = _q8_1(blk_a)
    D = _outer(dx, dy)
    acc = np.zeros((8,) + D.shape[1:], f32)
    summs = np.zeros(D.shape[1:], f32)
    for b, L in _lane_steps(x, a, 32):
        acc = fma32(D[b], L, acc)
        summs = summs + mx[:, b:b + 1] * sy[:, b][None, :]
    return (hsum_b(acc) + summs).T


def _q4_0_dot(blk, blk_a):
    """ggml_vec_dot_q4_0_q8_0: levels nibble - 8."""
    return _signed_x_q8_0(_flat(_split_nibbles(blk[..., 2:18])) - 8, _f16(blk, 0), blk_a)


def _q5_0_dot(blk, blk_a):
    """ggml_vec_dot_q5_0_q8_0: levels (nibble | qh bit << 4) - 16."""
    x = _split_nibbles(blk[..., 6:22]) + 16 * _qh_bits(blk[..., 2:6]) - 16
    return _signed_x_q8_0(_flat(x), _f16(blk, 0), blk_a)


def _q8_0_dot(blk, blk_a):
    """ggml_vec_dot_q8_0_q8_0: int8 levels."""
    d, x = _q8_0(blk)
    return _signed_x_q8_0(x, d, blk_a)


def _q4_1_dot(blk, blk_a):
    """ggml_vec_dot_q4_1_q8_1: unsigned nibbles, d0d1 = _mm256_mul_ps(d_x, d_y)."""
    return _unsigned_x_q8_1(_flat(_split_nibbles(blk[..., 4:20])), _f16(blk, 0), _f16(blk, 2), blk_a)


def _q5_1_dot(blk, blk_a):
    """ggml_vec_dot_q5_1_q8_1: unsigned 5-bit levels, fma(q, fl(d_x*d_y), acc)."""
    x = _split_nibbles(blk[..., 8:24]) + 16 * _qh_bits(blk[..., 4:8])
    return _unsigned_x_q8_1(_flat(x), _f16(blk, 0), _f16(blk, 2), blk_a)


def _paired_q8_0(x, dx, blk_a):
    """The IQ4_NL / MXFP4 x Q8_0 pattern: signed byte products (mul_add_epi8) per block, blocks in pairs,
    even blocks into accum1 and odd into accum2 (fma with fl(d_y*d_x)), hsum_float_8(accum1 + accum2); an odd
    last block is added after the reduction by the scalar loop, sumf = fma(fl(d_y*d_x), sumi, sumf), whose
    plain C products have no sign quirk. x (n, k) levels, dx (n, nblk) f32 block scales."""
    dy, a = _q8_0(blk_a)
    D = _outer(dx, dy)
    nb = D.shape[0]
    acc = np.zeros((2, 8) + D.shape[1:], f32)
    tail = None
    for b, L in _lane_steps(x, a, 32, sign_quirk(x, a)):
        if b == nb - 1 and nb % 2:
            tail = b
            break
        acc[b % 2] = fma32(D[b], L, acc[b % 2])
    s = hsum_b(acc[0] + acc[1])
    if tail is not None:
        sl = slice(32 * tail, 32 * tail + 32)
        sumi = (x[:, sl].astype(np.float64) @ a[:, sl].T.astype(np.float64)).astype(f32)
        s = fma32(D[tail], sumi, s)
    return s.T


def _iq4_nl_dot(blk, blk_a):
    """ggml_vec_dot_iq4_nl_q8_0: block_iq4_nl d f16 | qs[16], levels K_IQ4NL[nibble] (split nibbles)."""
    return _paired_q8_0(_flat(K_IQ4NL[_split_nibbles(blk[..., 2:18])]), _f16(blk, 0), blk_a)


def _mxfp4_dot(blk, blk_a):
    """ggml_vec_dot_mxfp4_q8_0: block_mxfp4 e u8 (E8M0) | qs[16], levels K_MXFP4[nibble], block scale
    E8M0half(e) (GGML_CPU_E8M0_TO_FP32_HALF); the IQ4_NL pattern otherwise."""
    return _paired_q8_0(_flat(K_MXFP4[_split_nibbles(blk[..., 1:17])]), e8m0_half(blk[..., 0]), blk_a)


def _nvfp4_dot(blk, blk_a):
    """ggml_vec_dot_nvfp4_q8_0 (x86 runs the generic C loop): block_nvfp4 d[4] UE4M3 | qs[32]; for every
    16-element sub-block s in order, sumf = fma(fl(d_y*UE4M3half(d[s])), sumi, sumf) with sumi the exact
    integer dot of K_MXFP4[nibble] (low nibbles then high within the 16) with the Q8_0 values."""
    n, nblk = blk.shape[:2]
    x = K_MXFP4[_split_nibbles(blk[..., 4:36].reshape(n, nblk, 4, 8))].reshape(n, -1)       # (n, k)
    dx = ue4m3_half(blk[..., 0:4]).reshape(n, -1)                                           # (n, nsub)
    dy, a = _q8_0(blk_a)
    dy = np.repeat(dy, 2, axis=1)                                                           # per sub-block
    D = _outer(dx, dy)
    s = np.zeros(D.shape[1:], f32)
    for j in range(D.shape[0]):
        sl = slice(16 * j, 16 * j + 16)
        sumi = (x[:, sl].astype(np.float64) @ a[:, sl].T.astype(np.float64)).astype(f32)
        s = fma32(D[j], sumi, s)
    return s.T


def _q1_0_dot(blk, blk_a):
    """ggml_vec_dot_q1_0_q8_0: block_q1_0 d f16 | qs[16], element j = +1 if bit j (little-endian) else -1;
    one Q1_0 block spans 4 Q8_0 blocks. Per Q8_0 block K the lanes of sign-flipped activations
    (-a wraps for a = -128); acc_block = fl(d_y0*L_0), then fma(d_yK, L_K, acc_block) for K = 1..3;
    acc = fma(d_x, acc_block, acc); hsum_float_8."""
    n, nblk = blk.shape[:2]
    x = (2 * np.unpackbits(np.ascontiguousarray(blk[..., 2:18]), axis=-1, bitorder="little").astype(np.int32)
         - 1).reshape(n, -1)
    dx = _f16(blk, 0)
    dy, a = _q8_0(blk_a)
    m = dy.shape[0]
    Dy = dy.T[:, None, :] * np.ones((1, n, 1), f32)                                         # (nsub, n, m)
    acc = np.zeros((8, n, m), f32)
    block = None
    for j, L in _lane_steps(x, a, 32, sign_quirk(x, a)):
        K = j % 4
        block = Dy[j] * L if K == 0 else fma32(Dy[j], L, block)
        if K == 3:
            acc = fma32(dx[:, j // 4][:, None], block, acc)
    return hsum_b(acc).T
def _q2_0_dot(blk, blk_a):
    """ggml_vec_dot_q2_0_q8_0 (ggml 0.25.3; x86 takes the generic C loop): block_q2_0 d f16 | qs[16], element
    4b + k = ((qs[b] >> 2k) & 3) - 1; one Q2_0 block spans 2 Q8_0 blocks. Per Q2_0 block: exact integer
    sums s_0, s_1 with the two Q8_0 blocks, sumi = fma(d_y1, s_1, fma(d_y0, s_0, 0)), then
    sumf = fma(d_x, sumi, sumf) in block order (GCC fuses both `+=` of the C loop)."""
    n, nblk = blk.shape[:2]
    shifts = np.array([0, 2, 4, 6], np.uint8)
    x = (((blk[..., 2:18, None] >> shifts) & 3).astype(np.int32) - 1).reshape(n, nblk * 64).astype(np.float64)
    dx = _f16(blk, 0)                                                    # (n, nblk)
    dy, a = _q8_0(blk_a)                                                 # (m, 2 nblk), (m, 64 nblk)
    a = a.astype(np.float64)
    sumf = np.zeros((n, a.shape[0]), f32)
    for i in range(nblk):
        sumi = np.zeros_like(sumf)
        for k in range(2):
            sl = slice(64 * i + 32 * k, 64 * i + 32 * k + 32)
            si = (x[:, sl] @ a[:, sl].T).astype(f32)                     # exact: |s| <= 2*127*32
            sumi = fma32(dy[:, 2 * i + k][None, :], si, sumi)
        sumf = fma32(dx[:, i][:, None], sumi, sumf)
    return sumf.T


def _q2_K_dot(blk, blk_a):
    """ggml_vec_dot_q2_K_q8_K, per block: d = fl(d_y*d_x), dmin = fl(-d_y*dmin_x);
    acc = fma(dmin, lanes(m_{2l} bsum_{2l} + m_{2l+1} bsum_{2l+1}), acc); acc = fma(d, lanes(sc*q*a), acc);
    hsum_float_8."""
    q, sc, mn, dx, dmx = _q2_K(blk)
    dy, a, bsums = _q8_K(blk_a)
    x = _flat(q.reshape(q.shape[:2] + (16, 16)) * sc[..., None])
    D, Dm = _outer(dx, dy), _outer(dmx, -dy)
    acc = np.zeros((8,) + D.shape[1:], f32)
    # min products: lane l pairs sub-blocks 2l, 2l+1 (madd_epi16 of 16 mins with 16 bsums)
    P = np.einsum("nblt,mblt->blnm", mn.reshape(mn.shape[:2] + (8, 2)).astype(np.float64),
                  bsums.reshape(bsums.shape[:2] + (8, 2)).astype(np.float64)).astype(f32)
    for b, L in _lane_steps(x, a, 256):
        acc = fma32(Dm[b], P[b], acc)
        acc = fma32(D[b], L, acc)
    return hsum_b(acc).T


def _q3_K_dot(blk, blk_a):
    """ggml_vec_dot_q3_K_q8_K: levels (low 2 bits) - 4*(high bit clear) times signed 6-bit scales,
    acc = fma(fl(d_y*d_x), lanes, acc); hsum_float_8."""
    q, sc, dx = _q3_K(blk)
    dy, a, _ = _q8_K(blk_a)
    x = _flat(q.reshape(q.shape[:2] + (16, 16)) * sc[..., None])
    D = _outer(dx, dy)
    acc = np.zeros((8,) + D.shape[1:], f32)
    for b, L in _lane_steps(x, a, 256):
        acc = fma32(D[b], L, acc)
    return hsum_b(acc).T


def _kmins(mn: np.ndarray, bsums: np.ndarray, pairs: int) -> np.ndarray:
    """Q4_K/Q5_K min terms: B_j = bsum_2j + bsum_2j+1 (int16), lane k of `pairs` lanes sums m_j * B_j over
    its 8 / pairs consecutive sub-blocks j: (nblk, pairs, n, m) f64 integers. pairs = 4: the lanes of
    _mm_madd_epi16 (Q4_K); pairs = 1: their integer total (Q5_K)."""
    B = bsums.reshape(bsums.shape[:2] + (8, 2)).sum(-1)                      # _mm_hadd_epi16: (m, nblk, 8),
    B = (B + 32768) % 65536 - 32768                                          # wrapping like int16
    g = 8 // pairs
    return np.einsum("nbkt,mbkt->bknm", mn.reshape(mn.shape[:2] + (pairs, g)).astype(np.float64),
                     B.reshape(B.shape[:2] + (pairs, g)).astype(np.float64))


def _q4_K_dot(blk, blk_a):
    """ggml_vec_dot_q4_K_q8_K: acc = fma(fl(d_y*d_x), lanes(sc*q*a), acc) (8 lanes) and
    acc_m = fma(fl(-d_y*dmin_x), P_k, acc_m) (4 lanes, P_k = m_2k B_2k + m_2k+1 B_2k+1 with B_j the bsum
    pairs); result hsum_float_8(acc) + ((acc_m0 + acc_m2) + (acc_m1 + acc_m3))."""
    q, sc, mn, dx, dmx = _q4_K(blk)
    dy, a, bsums = _q8_K(blk_a)
    x = _flat(q.reshape(q.shape[:2] + (8, 32)) * sc[..., None])
    D, Dm = _outer(dx, dy), _outer(dmx, -dy)
    P = _kmins(mn, bsums, 4).astype(f32)
    acc = np.zeros((8,) + D.shape[1:], f32)
    acc_m = np.zeros((4,) + D.shape[1:], f32)
    for b, L in _lane_steps(x, a, 256):
        acc_m = fma32(Dm[b], P[b], acc_m)
        acc = fma32(D[b], L, acc)
    return (hsum_b(acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]))).T


def _q5_K_dot(blk, blk_a):
    """ggml_vec_dot_q5_K_q8_K: as Q4_K for the 5-bit levels, but the min term is one integer per block,
    sum_j m_j B_j, and summs = fma(fl(-d_y*dmin_x), that, summs) in scalar f32 (GCC contracts the
    `summs += dmin * sum`); result hsum_float_8(acc) + summs."""
    q, sc, mn, dx, dmx = _q5_K(blk)
    dy, a, bsums = _q8_K(blk_a)
    x = _flat(q.reshape(q.shape[:2] + (8, 32)) * sc[..., None])
    D, Dm = _outer(dx, dy), _outer(dmx, -dy)
    P = _kmins(mn, bsums, 1)[:, 0].astype(f32)
    acc = np.zeros((8,) + D.shape[1:], f32)
    summs = np.zeros(D.shape[1:], f32)
    for b, L in _lane_steps(x, a, 256):
        summs = fma32(Dm[b], P[b], summs)
        acc = fma32(D[b], L, acc)
    return (hsum_b(acc) + summs).T


def _q6_K_dot(blk, blk_a):
    """ggml_vec_dot_q6_K_q8_K: lanes of sc*u*a (u the unsigned 6-bit value) minus
    32*(bsum_2l*sc_2l + bsum_2l+1*sc_2l+1) -- the offset term pairs lane l with sub-blocks 2l, 2l+1, not
    with the elements of the lane; acc = fma(fl(d_y*d_x), lanes, acc); hsum_float_8."""
    u, sc, dx = _q6_K(blk)
    dy, a, bsums = _q8_K(blk_a)
    x = _flat(u.reshape(u.shape[:2] + (16, 16)) * sc[..., None])
    off = 32 * np.einsum("nblt,mblt->blnm", sc.reshape(sc.shape[:2] + (8, 2)).astype(np.float64),
                         bsums.reshape(bsums.shape[:2] + (8, 2)).astype(np.float64))
    D = _outer(dx, dy)
    acc = np.zeros((8,) + D.shape[1:], f32)
    W, A = lane_major(x, 256), lane_major(a, 256)
    for b0 in range(0, W.shape[0], BLOCK_GROUP):
        sl = slice(b0, b0 + BLOCK_GROUP)
        L = (int_lanes(W[sl], A[sl]) - off[sl]).astype(f32)
        for i in range(L.shape[0]):
            acc = fma32(D[b0 + i], L[i], acc)
    return hsum_b(acc).T


def _iq4_xs_dot(blk, blk_a):
    """ggml_vec_dot_iq4_xs_q8_K: levels K[nibble] times the signed 6-bit sub-block scale, signed byte
    products (mul_add_epi8), acc = fma(fl(d_x*d_y), lanes, acc); hsum_float_8."""
    xk, ls, dx = _iq4_xs(blk)
    dy, a, _ = _q8_K(blk_a)
    scale = np.repeat(ls, 32, axis=-1).reshape(xk.shape[0], -1)
    x = _flat(xk) * scale
    quirk = sign_quirk(_flat(xk), a)
    if quirk is not None:
        quirk = (quirk[0] * scale, quirk[1])
    D = _outer(dx, dy)
    acc = np.zeros((8,) + D.shape[1:], f32)
    for b, L in _lane_steps(x, a, 256, quirk):
        acc = fma32(D[b], L, acc)
    return hsum_b(acc).T


def _ternary_dot(q, d, blk_a):
    """TQ1_0 / TQ2_0 x Q8_K: lanes of the unsigned digits q (0..2) times the activations, minus the bsum pair
    of each lane (bsum_2l + bsum_2l+1, i.e. the -1 offset of the ternary value); then
    sumf = add(mul(f32(lanes), fl(d_y*d_x)), sumf), which GCC contracts into one FMA; hsum_float_8.
    (The kernel sums in int16 lanes: exact for bsums as the quantizer writes them.)"""
    dy, a, bsums = _q8_K(blk_a)
    off = np.einsum("mblt->blm", bsums.reshape(bsums.shape[:2] + (8, 2)).astype(np.float64))[:, :, None, :]
    D = _outer(d, dy)
    acc = np.zeros((8,) + D.shape[1:], f32)
    W, A = lane_major(q, 256), lane_major(a, 256)
    for b0 in range(0, W.shape[0], BLOCK_GROUP):
        sl = slice(b0, b0 + BLOCK_GROUP)
        L = (int_lanes(W[sl], A[sl]) - off[sl]).astype(f32)
        for i in range(L.shape[0]):
            acc = fma32(L[i], D[b0 + i], acc)
    return hsum_b(acc).T


def _tq2_0_dot(blk, blk_a):
    """ggml_vec_dot_tq2_0_q8_K: block_tq2_0 qs[64] | d f16; element 128g + 32k + m is
    (qs[32g + m] >> 2k) & 3 (the ternary value plus 1)."""
    qs = blk[..., 0:64].reshape(blk.shape[:2] + (2, 1, 32)).astype(np.int32)
    q = (qs >> (2 * np.arange(4)).reshape(1, 1, 1, 4, 1)) & 3
    return _ternary_dot(_flat(q.reshape(blk.shape[:2] + (256,))), _f16(blk, 64), blk_a)


def _tq1_digits(b: np.ndarray, count: int) -> np.ndarray:
    """Base-3 digits 0..count-1 of bytes b, as the kernel extracts them: ((uint8)(b*3^n) * 3) >> 8
    (its avg_epu8 sequence computes exactly this): (..., count, nbytes)."""
    v = (b[..., None, :].astype(np.int32) * POW3[:count, None]) & 0xFF
    return (v * 3) >> 8


def _tq1_0_dot(blk, blk_a):
    """ggml_vec_dot_tq1_0_q8_K: block_tq1_0 qs[48] | qh[4] | d f16; byte m of qs[0..32] holds elements
    m + 32n (n = 0..4), byte m of qs[32..48] elements 160 + m + 16n, qh[j] elements 240 + j + 4n (n = 0..3)."""
    n, nblk = blk.shape[:2]
    q = np.concatenate([_tq1_digits(blk[..., 0:32], 5).reshape(n, nblk, 160),
                        _tq1_digits(blk[..., 32:48], 5).reshape(n, nblk, 80),
                        _tq1_digits(blk[..., 48:52], 4).reshape(n, nblk, 16)], axis=-1)
    return _ternary_dot(_flat(q), _f16(blk, 52), blk_a)


# -- IQ1/IQ2/IQ3 grid formats ----------------------------------------------------------------------------
# Element 32g + 8l + j of a 256-block: group g (0..7), sub-group l (0..3). The kernels multiply the unsigned
# grid magnitudes with sign-flipped activations (_mm256_sign_epi8 or xor/sub: the -128 wrap of sign_quirk),
# scale each 16 or 32 elements by an odd integer in madd_epi16, and FMA the block's lanes with
# fl(d_x*d_y); the f32 result is multiplied by a power of two at the end.

_BITS8 = (1 << np.arange(8)).astype(np.int32)
_L4 = np.arange(4)


def _signs(masks: np.ndarray) -> np.ndarray:
    """Sign bytes (..., ) -> (..., 8) of +1 / -1 (bit j set: element j negated)."""
    return 1 - 2 * ((masks.astype(np.int32)[..., None] & _BITS8) != 0)


def _grid_levels(name: str, idx: np.ndarray) -> np.ndarray:
    return np.asarray(TABLES[name], np.int32)[idx]


def _iq2_xxs(blk):
    """block_iq2_xxs: d f16 | qs 32 x u16. Group g: u32 pair (a0, a1) at qs[4g]; byte l of a0 indexes
    iq2xxs_grid, signs ksigns[(a1 >> 7l) & 127], scale 2*(a1 >> 28) + 1."""
    n, nb = blk.shape[:2]
    a = np.ascontiguousarray(blk[..., 2:66]).view("<u4").reshape(n, nb, 8, 2).astype(np.int64)
    idx = blk[..., 2:66].reshape(n, nb, 8, 8)[..., 0:4]
    mag = _grid_levels("iq2xxs", idx)                                             # (n, nb, 8, 4, 8)
    sg = _signs(np.asarray(TABLES["ksigns"])[(a[..., 1:2] >> (7 * _L4)) & 127])
    sc = 2 * (a[..., 1] >> 28) + 1                                                # (n, nb, 8)
    return mag * sg, np.broadcast_to(sc[..., None, None], mag.shape), _f16(blk, 0), f32(0.125)


def _iq2_xs(blk):
    """block_iq2_xs: d f16 | qs 32 x u16 | scales[8]. Sub-group (g, l): w = qs[4g + l], iq2xs_grid[w & 511],
    signs ksigns[w >> 9] (the kernel's parity trick gives the same bits); scale 2*nibble + 1, the low nibble
    of scales[g] for l = 0, 1, the high one for l = 2, 3."""
    n, nb = blk.shape[:2]
    w = np.ascontiguousarray(blk[..., 2:66]).view("<u2").reshape(n, nb, 8, 4).astype(np.int32)
    mag = _grid_levels("iq2xs", w & 511)
    sg = _signs(np.asarray(TABLES["ksigns"])[w >> 9])
    scb = blk[..., 66:74].astype(np.int32)
    nib = np.stack([scb & 15, scb & 15, scb >> 4, scb >> 4], axis=-1)             # (n, nb, 8, 4)
    return mag * sg, np.broadcast_to((2 * nib + 1)[..., None], mag.shape), _f16(blk, 0), f32(0.125)


def _iq2_s(blk):
    """block_iq2_s: d f16 | qs[64] (grid index low bytes, then sign masks) | qh[8] | scales[8]. Sub-group
    (g, l): iq2s_grid[qs[4g + l] | ((qh[g] << (8 - 2l)) & 0x300)], signs qs[32 + 4g + l]; scales as IQ2_XS."""
    n, nb = blk.shape[:2]
    qh = blk[..., 66:74].astype(np.int32)[..., None]
    idx = blk[..., 2:34].reshape(n, nb, 8, 4).astype(np.int32) | ((qh << (8 - 2 * _L4)) & 0x300)
    mag = _grid_levels("iq2s", idx)
    sg = _signs(blk[..., 34:66].reshape(n, nb, 8, 4))
    scb = blk[..., 74:82].astype(np.int32)
    nib = np.stack([scb & 15, scb & 15, scb >> 4, scb >> 4], axis=-1)
    return mag * sg, np.broadcast_to((2 * nib + 1)[..., None], mag.shape), _f16(blk, 0), f32(0.125)


def _iq3_xxs(blk):
    """block_iq3_xxs: d f16 | qs[64] grid indices | 8 x u32 w_g. Sub-group (g, l): elements 0..3 from
    iq3xxs_grid[qs[8g + 2l]], 4..7 from qs[8g + 2l + 1]; signs ksigns[(w_g >> 7l) & 127]; scale 2*(w_g >> 28)+1."""
    n, nb = blk.shape[:2]
    w = np.ascontiguousarray(blk[..., 66:98]).view("<u4").reshape(n, nb, 8).astype(np.int64)
    mag = _grid_levels("iq3xxs", blk[..., 2:66].reshape(n, nb, 8, 4, 2)).reshape(n, nb, 8, 4, 8)
    sg = _signs(np.asarray(TABLES["ksigns"])[(w[..., None] >> (7 * _L4)) & 127])
    sc = 2 * (w >> 28) + 1
    return mag * sg, np.broadcast_to(sc[..., None, None], mag.shape), _f16(blk, 0), f32(0.25)


def _iq3_s(blk):
    """block_iq3_s: d f16 | qs[64] | qh[8] | signs[32] | scales[4]. Sub-group (g, l): elements 0..3 from
    iq3s_grid[qs[8g + 2l] | ((qh[g] << (8 - 2l)) & 256)], 4..7 from qs[8g + 2l + 1] | ((qh[g] << (7 - 2l)) & 256);
    signs[4g + l] raw bits; scale 2*nibble + 1 (low nibble of scales[g/2] for even g)."""
    n, nb = blk.shape[:2]
    qs = blk[..., 2:66].reshape(n, nb, 8, 4, 2).astype(np.int32)
    qh = blk[..., 66:74].astype(np.int32)[..., None]
    idx = np.stack([qs[..., 0] | ((qh << (8 - 2 * _L4)) & 256), qs[..., 1] | ((qh << (7 - 2 * _L4)) & 256)], -1)
    mag = _grid_levels("iq3s", idx).reshape(n, nb, 8, 4, 8)
    sg = _signs(blk[..., 74:106].reshape(n, nb, 8, 4))
    scb = blk[..., 106:110].astype(np.int32)
    nib = np.stack([scb & 15, scb >> 4], axis=-1).reshape(n, nb, 8)
    return mag * sg, np.broadcast_to((2 * nib + 1)[..., None, None], mag.shape), _f16(blk, 0), f32(1)


def _iq_grid_dot(fields, blk, blk_a):
    """IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S x Q8_K: acc = fma(fl(d_x*d_y), lanes(scale*level*a), acc) per
    block; result factor * hsum_float_8(acc)."""
    x, sc, dx, factor = fields(blk)
    n = x.shape[0]
    x, sc = x.reshape(n, -1), sc.reshape(n, -1)
    dy, a, _ = _q8_K(blk_a)
    quirk = sign_quirk(x, a)
    if quirk is not None:
        quirk = (quirk[0] * sc, quirk[1])
    D = _outer(dx, dy)
    acc = np.zeros((8,) + D.shape[1:], f32)
    for b, L in _lane_steps(x * sc, a, 256, quirk):
        acc = fma32(D[b], L, acc)
    return (factor * hsum_b(acc)).T


def _iq1_s(blk):
    """block_iq1_s: d f16 | qs[32] | qh 8 x u16. Grid levels (-1, 0, 1) of
    iq1s_grid[qs[4g + l] | (((qh[g] >> 3l) & 7) << 8)] (n, nb, 8, 4, 8); the delta sign (qh[g] bit 15 ? -1 : 1)
    and the scale ls = 2*((qh[g] >> 12) & 7) + 1 per group g (n, nb, 8); d (n, nb)."""
    n, nb = blk.shape[:2]
    qh = np.ascontiguousarray(blk[..., 34:50]).view("<u2").reshape(n, nb, 8).astype(np.int32)
    idx = blk[..., 2:34].reshape(n, nb, 8, 4).astype(np.int32) | (((qh[..., None] >> (3 * _L4)) & 7) << 8)
    grid = np.asarray(TABLES["iq1s"], np.int32)[idx]
    return grid, np.where(qh & 0x8000, -1, 1), 2 * ((qh >> 12) & 7) + 1, _f16(blk, 0)


def _iq1_m(blk):
    """block_iq1_m: qs[32] | qh[16] | scales 4 x u16 (d f16 spread over their top nibbles). Grid levels of
    iq1s_grid[qs[4g + l] | ((qh[2g + l/2] << (8, 4)[l%2]) & 0x700)] (n, nb, 8, 4, 8); deltas -1 where bit 3
    (even l) / 7 (odd l) of qh[2g + l/2] is set, else +1, and the 3-bit scale
    2*((s[g/2] >> (6(g%2) + 3(l >= 2))) & 7) + 1, both per 8 elements (n, nb, 8, 4); d (n, nb)."""
    n, nb = blk.shape[:2]
    s = np.ascontiguousarray(blk[..., 48:56]).view("<u2").reshape(n, nb, 4).astype(np.int32)
    dbits = ((s[..., 0] >> 12) | ((s[..., 1] >> 8) & 0xF0) | ((s[..., 2] >> 4) & 0xF00) | (s[..., 3] & 0xF000))
    d = f16_to_f32(dbits.astype("<u2").view("<f2"))
    qs = blk[..., 0:32].reshape(n, nb, 8, 4).astype(np.int32)
    qh = blk[..., 32:48].reshape(n, nb, 8, 2).astype(np.int32)[..., [0, 0, 1, 1]]
    idx = qs | ((qh << np.array([8, 4, 8, 4])) & 0x700)
    grid = np.asarray(TABLES["iq1s"], np.int32)[idx]
    delta = np.where(qh & np.array([0x08, 0x80, 0x08, 0x80]), -1, 1)
    sg = s[..., np.arange(8) // 2]                                                 # (n, nb, 8)
    sh = (6 * (np.arange(8) % 2))[:, None] + 3 * (_L4 >= 2)[None, :]               # (8, 4)
    return grid, delta, 2 * ((sg[..., None] >> sh) & 7) + 1, d


def _iq1_s_dot(blk, blk_a):
    """ggml_vec_dot_iq1_s_q8_K: block_iq1_s d f16 | qs[32] | qh 8 x u16. Grid levels (-1, 0, 1) of
    iq1s_grid[qs[4g + l] | (((qh[g] >> 3l) & 7) << 8)] times ls = 2*((qh[g] >> 12) & 7) + 1, signed byte
    products; acc = fma(d, lanes, acc) with d = fl(d_y*d_x); the delta term is scalar:
    accum1 = fma(d, sumi1, accum1), sumi1 = sum_g (bsum_2g + bsum_2g+1) * (qh[g] bit 15 ? -1 : 1) * ls;
    result hsum_float_8(acc) + 0.125*accum1."""
    n, nb = blk.shape[:2]
    grid, sign, ls, dx = _iq1_s(blk)
    x = grid.reshape(n, -1)
    sc = np.repeat(ls.reshape(n, -1), 32, axis=1)
    dy, a, bsums = _q8_K(blk_a)
    quirk = sign_quirk(x, a)
    if quirk is not None:
        quirk = (quirk[0] * sc, quirk[1])
    wdelta = (sign * ls).astype(np.float64)                                        # (n, nb, 8)
    B = bsums.reshape(bsums.shape[:2] + (8, 2)).sum(-1).astype(np.float64)        # (m, nb, 8)
    S1 = np.einsum("nbg,mbg->bnm", wdelta, B).astype(f32)
    D = _outer(dx, dy)
    acc = np.zeros((8,) + D.shape[1:], f32)
    acc1 = np.zeros(D.shape[1:], f32)
    for b, L in _lane_steps(x * sc, a, 256, quirk):
        acc = fma32(D[b], L, acc)
        acc1 = fma32(D[b], S1[b], acc1)
    return (hsum_b(acc) + f32(0.125) * acc1).T


def _iq1_m_dot(blk, blk_a):
    """ggml_vec_dot_iq1_m_q8_K: block_iq1_m qs[32] | qh[16] | scales 4 x u16 (d f16 spread over their top
    nibbles). Levels of iq1s_grid[qs[4g + l] | ((qh[2g + l/2] << (8, 4)[l%2]) & 0x700)] and deltas -1 where
    bit 3 (even l) / 7 (odd l) of qh[2g + l/2] is set, else +1, both times the 3-bit scale
    2*((s[g/2] >> (6(g%2) + 3(l >= 2))) & 7) + 1; two 8-lane accumulators acc1 (levels), acc2 (deltas), both
    fma(fl(d_y*d), lanes, .); result hsum_float_8(acc1) + 0.125*hsum_float_8(acc2)."""
    n, nb = blk.shape[:2]
    x, delta, sc, d = _iq1_m(blk)                                                # (n, nb, 8, 4, 8), (n, nb, 8, 4)
    sc8 = np.broadcast_to(sc[..., None], x.shape).reshape(n, -1)
    x = x.reshape(n, -1)
    dl = np.broadcast_to(delta[..., None], (n, nb, 8, 4, 8)).reshape(n, -1)
    dy, a, _ = _q8_K(blk_a)
    q1, q2 = sign_quirk(x, a), sign_quirk(dl, a)
    q1 = None if q1 is None else (q1[0] * sc8, q1[1])
    q2 = None if q2 is None else (q2[0] * sc8, q2[1])
    D = _outer(d, dy)
    acc1 = np.zeros((8,) + D.shape[1:], f32)
    acc2 = np.zeros((8,) + D.shape[1:], f32)
    for (b, L1), (_, L2) in zip(_lane_steps(x * sc8, a, 256, q1), _lane_steps(dl * sc8, a, 256, q2)):
        acc1 = fma32(D[b], L1, acc1)
        acc2 = fma32(D[b], L2, acc2)
    return (hsum_b(acc1) + f32(0.125) * hsum_b(acc2)).T


def _grid(fields):
    return lambda blk, blk_a: _iq_grid_dot(fields, blk, blk_a)


QUANT_DOTS = {
    GGMLType.Q4_0: _q4_0_dot, GGMLType.Q4_1: _q4_1_dot, GGMLType.Q5_0: _q5_0_dot, GGMLType.Q5_1: _q5_1_dot,
    GGMLType.Q8_0: _q8_0_dot, GGMLType.Q2_K: _q2_K_dot, GGMLType.Q3_K: _q3_K_dot, GGMLType.Q4_K: _q4_K_dot,
    GGMLType.Q5_K: _q5_K_dot, GGMLType.Q6_K: _q6_K_dot, GGMLType.IQ4_NL: _iq4_nl_dot,
    GGMLType.IQ4_XS: _iq4_xs_dot, GGMLType.MXFP4: _mxfp4_dot, GGMLType.NVFP4: _nvfp4_dot,
    GGMLType.Q1_0: _q1_0_dot, GGMLType.Q2_0: _q2_0_dot, GGMLType.TQ1_0: _tq1_0_dot, GGMLType.TQ2_0: _tq2_0_dot,
    GGMLType.IQ2_XXS: _grid(_iq2_xxs), GGMLType.IQ2_XS: _grid(_iq2_xs), GGMLType.IQ2_S: _grid(_iq2_s),
    GGMLType.IQ3_XXS: _grid(_iq3_xxs), GGMLType.IQ3_S: _grid(_iq3_s), GGMLType.IQ1_S: _iq1_s_dot,
    GGMLType.IQ1_M: _iq1_m_dot,
}


# -- mul_mat ----------------------------------------------------------------------------------------------

def _rows(x) -> np.ndarray:
    """(rows, k) values or (rows, row_bytes) bytes of a 2-D weight slice / activation stack."""
    if isinstance(x, QTensor):
        return x.data.reshape(-1, x.data.shape[-1])
    return np.asarray(x).reshape(-1, x.shape[-1])


def _convert(b, t: GGMLType):
    """b (..., k) converted to the vec_dot_type t as ggml-cpu's from_float does (b already of type t: as is)."""
    if t == GGMLType.F32:              # f16/bf16 rows (ggml 0.25.3): widened exactly into the f32 work buffer
        return b.dequantize() if isinstance(b, QTensor) else np.asarray(b).astype(f32, copy=False)
    if t == GGMLType.F16:
        return b if isinstance(b, np.ndarray) and b.dtype == np.float16 else np.asarray(b).astype(np.float16)
    if isinstance(b, QTensor):
        return b
    return quantize(np.asarray(b, np.float32), t, method="cpu")


def _bf16_values(x: QTensor) -> np.ndarray:
    """bf16 bytes -> exact f32 values (rows, k)."""
    raw = np.ascontiguousarray(x.data).reshape(-1, x.shape[-1] * 2)
    return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)


def _dots(ta: GGMLType, w, y) -> np.ndarray:
    """vec_dot of every row of w (a 2-D weight slice) with every row of y (activation rows, already the
    vec_dot_type): (rows of y, rows of w) f32, tiled so that temporaries stay bounded."""
    if ta == GGMLType.F32:
        W, Y, fn = np.asarray(w, f32).reshape(-1, w.shape[-1]), _rows(y), dot_f32
    elif ta == GGMLType.F16:
        W, Y, fn = np.asarray(w).reshape(-1, w.shape[-1]), _rows(y), dot_f16
    elif ta == GGMLType.BF16:
        W, Y, fn = _bf16_values(w), _bf16_values(y), dot_bf16
    else:
        ts, tsa = type_traits[ta].type_size, type_traits[VEC_DOT_TYPE[ta]].type_size
        W, Y = _blocks(_rows(w), ts), _blocks(_rows(y), tsa)
        fn = QUANT_DOTS[ta]
        kernel = kernel_for(fn)            # the same bits compiled (refimpl/kernels/faithful.py), if any
        if kernel is not None:
            return kernel(W, Y)
    n, m = W.shape[0], Y.shape[0]
    k = int(w.shape[-1])
    out = np.empty((m, n), f32)
    if n == 0 or m == 0:
        return out
    mt = min(m, max(1, int(np.sqrt(PAIRS))))
    nt = min(n, max(1, min(PAIRS // mt, TILE_ELEMS // max(1, k))))
    for j in range(0, m, mt):
        for i in range(0, n, nt):
            out[j:j + mt, i:i + nt] = fn(W[i:i + nt], Y[j:j + mt])
    return out


def mul_mat(a, b, dots=None) -> np.ndarray:
    """ggml-cpu's mul_mat for any weight type in QUANT_DOTS or F32/F16/BF16 (shapes checked by the caller,
    refimpl.ops.matmul.mul_mat): same shapes and broadcast as exact mode, every element bit-exact. `dots`
    (default `_dots`) multiplies one 2-D weight slice by its activation rows (tiled.py passes its kernels')."""
    from ...ops.matmul import ggml_type
    from ...shapes import ne4
    ta = ggml_type(a)
    dots = _dots if dots is None else dots
    na, nb = ne4(a.shape), ne4(b.shape)
    b = _convert(b, VEC_DOT_TYPE[ta])
    a4 = a.reshape(na[::-1])
    b4 = b.reshape(nb[::-1])
    r2, r3 = nb[2] // na[2], nb[3] // na[3]
    out = np.empty((nb[3], nb[2], nb[1], na[1]), f32)
    for i3 in range(na[3]):
        for i2 in range(na[2]):
            ys = b4[i3 * r3:(i3 + 1) * r3, i2 * r2:(i2 + 1) * r2]                  # (r3, r2, m, k)
            res = dots(ta, a4[i3, i2], ys.reshape((-1, nb[0])))
            out[i3 * r3:(i3 + 1) * r3, i2 * r2:(i2 + 1) * r2] = res.reshape(r3, r2, nb[1], na[1])
    nd = max(len(b.shape), 2)
    return out.reshape(out.shape[4 - nd:])


def mul_mat_id(as_, b, ids, dots=None) -> np.ndarray:
    """ggml-cpu's mul_mat_id (shapes and ids checked by the caller, refimpl.ops.matmul.mul_mat_id): b's rows
    converted to the vec_dot_type as in mul_mat, then every (token, slot) row dotted with the rows of its
    expert by the same vec_dot; bit-exact like mul_mat.

    as_ (n_expert, n, k), b (n_tokens, n_b, k), ids (n_tokens, n_used) i32 -> (n_tokens, n_used, n) f32.
    `dots` (default `_dots`) multiplies one expert's weights by its routed rows (tiled.py passes its own)."""
    from ...ops.matmul import ggml_type
    ta = ggml_type(as_)
    dots = _dots if dots is None else dots
    n_expert, n, k = as_.shape[-3:]
    n_tok, n_used = ids.shape[-2], ids.shape[-1]
    b3 = _convert(b, VEC_DOT_TYPE[ta]).reshape((n_tok, -1, k))
    ids2 = np.asarray(ids).reshape(n_tok, n_used)
    slot = np.arange(n_used) % b3.shape[1]
    w3 = as_.reshape((n_expert, n, k))
    out = np.empty((n_tok, n_used, n), f32)
    for x in np.unique(ids2):
        t, e = np.nonzero(ids2 == x)
        rows = b3[t, slot[e]] if not isinstance(b3, QTensor) else _take_rows(b3, t, slot[e])
        out[t, e] = dots(ta, w3[int(x)], rows)
    return out


def _take_rows(q: QTensor, i: np.ndarray, j: np.ndarray) -> QTensor:
    """Rows q[i[r], j[r]] of a 3-D QTensor, as a 2-D QTensor."""
    return QTensor(q.type, np.ascontiguousarray(q.data[i, j]), (len(i), q.shape[-1]))


SUPPORTED = (GGMLType.F32, GGMLType.F16, GGMLType.BF16) + tuple(QUANT_DOTS)
