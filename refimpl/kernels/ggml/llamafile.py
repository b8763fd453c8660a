"""llamafile's tinyBLAS order, as llama.cpp's CPU build multiplies F32/F16 matrices under numerics="ggml".

llama.cpp compiles llamafile's sgemm (GGML_USE_LLAMAFILE); ggml-python's build, the op-level oracle, does not.
For a product on an F32 or F16 source a (ggml's src0) with f32 activations b (src1), names as in `mul_mat`
below, tinyBLAS replaces ggml's vec_dot when (`takes_sgemm`)

    m >= 2       b has at least two rows (tokens): a one-token product (a decode) takes vec_dot
    k % 8 == 0   the 8-lane loads cover k exactly (tinyBLAS::matmul returns false otherwise)
    n % 4 == 0   a's rows tile by RM = 4 (tinyBLAS::matmul has no tile for other row counts and returns
                 false: BERT's kq over 6 tokens, say, takes vec_dot)
    b reaches tinyBLAS packed: ggml_compute_forward_mul_mat calls it on src1 itself only when src1 is
                 contiguous; otherwise only after converting src1 into its work buffer, which an F16 source
                 needs (f32 -> f16) and an F32 source does not, so a strided f32 src1 with an F32 source
                 (BERT's permuted Q against its f32 K, no KV cache) takes vec_dot.

The f32 activations are first rounded to the source's type (as ggml-cpu's from_float), then each output is ONE
8-lane accumulator, acc = fma(a[l:l+8], b[l:l+8], acc) for l = 0, 8, ..., reduced by hsum_b. This is the
"llamafile" key of the numerics="ggml" profile (llama.cpp's build); numerics="ggml-nollamafile" (ggml-python's
build) leaves every product to vec_dot's emulation (matmul.py). A model passes b with the strides llama.cpp's
graph gives src1 (a permuted view stays a NumPy view) so the contiguity rule can apply.

    mul_mat(a, b)   a ne [k, n, a2, a3]  numpy (a3, a2, n, k)   F32/F16 ndarray (anything else: NotImplemented)
                    b ne [k, m, b2, b3]  numpy (b3, b2, m, k)   f32, b2 = r2*a2, b3 = r3*a3 (ggml's broadcast)
                    out ne [n, m, b2, b3] numpy (b3, b2, m, n)  f32
"""
from __future__ import annotations

import numpy as np

from ...qtensor import QTensor
from ...rounding import fma32
from .vecdot import hsum_b

LANES = 8              # tinyBLAS's vector width for F32/F16 on AVX2 (k must be a multiple of it)
ROW_TILE = 4           # tinyBLAS's RM on AVX2: a's row count n must be a multiple of it
_TILE = 1 << 21        # outputs x lanes per step of sgemm (bounds its temporaries to ~50 MB)


def sgemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """tinyBLAS for F32/F16 a on AVX2: a (G, n, k) f16/f32, b (G, r, m, k) f32 (r heads of b per head of a,
    ggml's broadcast) -> (G, r, m, n) f32. b is first rounded to a's type, as ggml-cpu's from_float does;
    each output is one 8-lane FMA accumulator over k, reduced by hsum_b."""
    L = LANES
    A = np.asarray(a).astype(np.float32)
    B = np.asarray(b).astype(a.dtype).astype(np.float32)
    G, n, k = A.shape
    r, m = B.shape[1], B.shape[2]
    out = np.empty((G, r, m, n), np.float32)
    step = max(1, _TILE // max(1, G * r * n * L))
    for j in range(0, m, step):
        Bj = B[:, :, j:j + step]                                               # (G, r, mt, k)
        acc = np.zeros((L, G, r, Bj.shape[2], n), np.float32)
        for l in range(0, k, L):
            al = np.moveaxis(A[:, :, l:l + L], -1, 0)[:, :, None, None, :]      # (L, G, 1, 1, n)
            bl = np.moveaxis(Bj[..., l:l + L], -1, 0)[..., None]              # (L, G, r, mt, 1)
            acc = fma32(bl, al, acc)
        out[:, :, j:j + step] = hsum_b(acc)
    return out


def takes_sgemm(a, b) -> bool:
    """Whether llama.cpp's build multiplies a by b with tinyBLAS: the conditions of the module docstring."""
    return (isinstance(a, np.ndarray) and a.dtype in (np.float32, np.float16) and 2 <= a.ndim <= 4
            and isinstance(b, np.ndarray) and b.dtype == np.float32 and 2 <= b.ndim <= 4
            and b.shape[-1] == a.shape[-1] and b.shape[-2] >= 2 and a.shape[-1] % LANES == 0
            and a.shape[-2] % ROW_TILE == 0 and (b.flags.c_contiguous or a.dtype != np.float32))


def mul_mat(a, b):
    """tinyBLAS's order where llama.cpp's build takes it (module docstring), registered for the "llamafile"
    key of the "ggml" profile; NotImplemented elsewhere (ggml's vec_dot emulation then runs)."""
    if isinstance(a, np.ndarray) and a.dtype == np.float32 and (
            isinstance(b, QTensor) or (isinstance(b, np.ndarray) and b.dtype == np.float16)):
        # ggml 0.25.3: tinyBLAS refuses f32 x f16/bf16; ggml-cpu widens b exactly to f32 and asks again
        b = b.dequantize() if isinstance(b, QTensor) else b.astype(np.float32)
    if not takes_sgemm(a, b):
        return NotImplemented
    a4 = a.reshape((1,) * (4 - a.ndim) + a.shape)
    b4 = b.reshape((1,) * (4 - b.ndim) + b.shape)
    (a3, a2, n, k), (b3, b2, m, _) = a4.shape, b4.shape
    if b2 % a2 or b3 % a3:                                 # not ggml's broadcast (the op has checked it)
        return NotImplemented
    r2, r3 = b2 // a2, b3 // a3
    out = np.empty((b3, b2, m, n), np.float32)
    for i3 in range(b3):
        out[i3] = sgemm(a4[i3 // r3], b4[i3].reshape(a2, r2, m, k)).reshape(b2, m, n)
    return out.reshape(b.shape[:-2] + (m, n)) if b.ndim >= a.ndim else out.reshape(a.shape[:-2] + (m, n))
