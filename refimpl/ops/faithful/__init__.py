"""numerics="ggml": emulations of ggml-cpu's roundings, bit for bit on the portable AVX2 build.

Importing this package registers them (refimpl/ops/__init__.py does):

    refimpl.ops.matmul.FAITHFUL[type name]   mul_mat for F32, F16, BF16 and the block types of matmul.py
    OPS[op name]                             rms_norm, norm, soft_max_ext, rope_ext, silu, swiglu (ops.py);
                                             each op calls OPS[name] when numerics="ggml" is active

The pieces: vecdot.py (FMA with one rounding, ggml's horizontal sums, the float dots, integer lanes of the
quantized dots), matmul.py (activation conversion, one kernel per weight type), simd.py (the AVX2 SIMD
exponential, the C library's expf/cosf/...), ops.py (the row ops). docs/numerics.md lists every emulated
rounding and its measured effect.
"""
from __future__ import annotations

from ..matmul import FAITHFUL
from ..matmul import _tname as _type_name
from . import matmul as _mm
from .ops import OPS  # noqa: F401

for _t in _mm.SUPPORTED:
    FAITHFUL[_type_name(_t)] = _mm.mul_mat
