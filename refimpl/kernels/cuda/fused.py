"""The fused ops (refimpl.ops.fused) on the GPU: each runs its definition, the op sequence, on device arrays,
so every step takes its CUDA kernel and nothing returns to the host between them.

    mul_mat_add, mul_mat_add_gelu, add_norm_affine, attn_mha   the op's NumPy body (ops only) as it stands
    attn_qkv       one mul_mat_add of the stacked weight (uploaded once, as every weight), its output split
                   into Q, K, V by one gather on the device, then attn_mha; each output is the dot product
                   of its own weight row (the CUDA mul_mat computes every output alone), so this equals the
                   three projections of the reference

Same results as the reference within the CUDA kernels' own tolerance (the models' tests, tests/cuda).
"""
from __future__ import annotations

from ...dispatch import register
from ...ops import fused as ref
from ...ops.fused import attn_mha, mul_mat_add
from . import _device
from .movement import permute

for _op in (ref.mul_mat_add, ref.mul_mat_add_gelu, ref.add_norm_affine, ref.attn_mha):
    register(_op.op_info.name, "cuda")(_op.op_info.fn)


@register("attn_qkv", "cuda")
def attn_qkv(x, wqkv, bqkv, mask, scale: float, n_head: int):
    """refimpl.ops.fused.attn_qkv with one product of the stacked weight."""
    S, T, E = x.shape
    n = wqkv.shape[0] // 3
    y = mul_mat_add(wqkv, x.reshape(S * T, E), bqkv)                  # (S*T, 3n)
    if not _device.is_device(y):
        return NotImplemented
    qkv = permute(y.reshape(S * T, 3, n), (1, 0, 2))                  # (3, S*T, n), contiguous
    q, k, v = (qkv[i].reshape(S, T, n_head, n // n_head) for i in range(3))
    return attn_mha(q, k, v, mask, scale)


def ptx_signatures() -> list[tuple]:
    """None: the fused ops launch the other modules' kernels and compile none of their own."""
    return []
