"""numerics="ggml": NumPy emulations of ggml-cpu's roundings, bit for bit on the portable AVX2 build.

The dispatch imports this package on the first call under a ggml profile; importing it registers

    mul_mat, mul_mat_id     for key "ggml": F32, F16, BF16 and the block types of matmul.py (SUPPORTED)
    mul_mat                 for key "llamafile": llamafile's tinyBLAS order where llama.cpp's build takes it
    mul_mat, mul_mat_id     for key "tiled": ggml 0.25.3's tiled K-quant/IQ kernels (>= 8 rows of activations)
    rms_norm, norm, soft_max_ext, rope_ext, silu, swiglu, tanh, exp, sigmoid, rwkv_wkv7   (ops.py), key "ggml"

The pieces: vecdot.py (ggml's horizontal sums, the float dots, integer lanes of the quantized dots), matmul.py
(activation conversion, one kernel per weight type), llamafile.py (tinyBLAS), tiled.py (ggml 0.25.3's tiled
K-quant kernels), simd.py (the AVX2 SIMD
exponential, the C library's expf/cosf/...), ops.py (the row ops). docs/numerics.md lists every emulated
rounding and its measured effect.
"""
from __future__ import annotations

from ...dispatch import register
from ...ops.matmul import ggml_type
from ...types import type_traits
from . import llamafile, matmul as _mm, tiled
from .ops import OPS  # noqa: F401  (registers the row ops)


def _supported(name: str, a) -> None:
    ta = ggml_type(a)
    if ta not in _mm.SUPPORTED:
        raise ValueError(f"{name}: numerics='ggml' is not available for {type_traits[ta].name} weights; "
                         "use 'exact'")


@register("mul_mat", numerics="ggml")
def mul_mat(a, b):
    _supported("mul_mat", a)
    return _mm.mul_mat(a, b)


@register("mul_mat_id", numerics="ggml")
def mul_mat_id(as_, b, ids):
    _supported("mul_mat_id", as_)
    return _mm.mul_mat_id(as_, b, ids)


register("mul_mat", numerics="llamafile")(llamafile.mul_mat)
register("mul_mat", numerics="tiled")(tiled.mul_mat)
register("mul_mat_id", numerics="tiled")(tiled.mul_mat_id)
