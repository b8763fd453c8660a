"""numerics="fast" in NumPy, for every backend: mul_mat and mul_mat_id summed in f32 by BLAS (sgemm) on the
exactly dequantized tiles of refimpl.ops.matmul (each output within gamma_k * sum|a*b| of the exact one).
The Numba and CUDA kernels, where they cover the inputs, are tried before these."""
from __future__ import annotations

import numpy as np

from ..dispatch import register
from ..ops.matmul import tiled_mul_mat, tiled_mul_mat_id


@register("mul_mat", numerics="fast")
def mul_mat(a, b):
    return tiled_mul_mat(a, b, np.float32)


@register("mul_mat_id", numerics="fast")
def mul_mat_id(as_, b, ids):
    return tiled_mul_mat_id(as_, b, ids, np.float32)
