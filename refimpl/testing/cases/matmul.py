"""OpCases for mul_mat, mul_mat_id, out_prod (see refimpl/testing/cases/__init__.py)."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ...qtensor import QTensor, quantize
from ...quants import QUANTIZERS
from ...types import GGMLType, type_traits
from . import OpCase, cases, named, ne_str
from ._draw import maybe_view, values


def _g():
    from .. import ggml
    return ggml.lib()


# weight types with a CPU vec_dot in ggml (every type a model can store, minus activation-only Q8_1/Q8_K)
WEIGHT_TYPES = [t for t, tr in type_traits.items()
                if t not in (GGMLType.Q8_1, GGMLType.Q8_K, GGMLType.I8, GGMLType.I16, GGMLType.I32,
                             GGMLType.I64, GGMLType.F64)]


def weight(t, x: np.ndarray):
    """x (float32, NumPy shape) stored as type t the way a model file would hold it."""
    if t == GGMLType.F32:
        return x
    if t == GGMLType.F16:
        return x.astype(np.float16)
    if (t, "ref") in QUANTIZERS or (t, "chunk") in QUANTIZERS:
        return quantize(x, t)
    tr = type_traits[t]          # ggml quantizes these only with an importance matrix: random blocks
    rng = np.random.default_rng(int(abs(x).sum() * 1000) % 2**32)
    raw = rng.integers(0, 256, x.shape[:-1] + (x.shape[-1] // tr.blck_size * tr.type_size,), dtype=np.uint8)
    if tr.blck_size > 1:   # keep the f16 super-scale finite and small so values stay sane
        raw = raw.reshape(-1, tr.type_size)
    return QTensor(t, raw.reshape(x.shape[:-1] + (-1,)), x.shape)


def tname(t) -> str:
    return type_traits[t].name.lower()


@cases("mul_mat")
@st.composite
def _mul_mat(draw):
    t = draw(st.sampled_from(WEIGHT_TYPES))
    blck = type_traits[t].blck_size
    k = blck * draw(st.integers(1, 3)) if blck > 1 else draw(st.integers(1, 96))
    n = draw(st.integers(1, 9))
    m = draw(st.integers(1, 5))
    a2, a3 = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    r2, r3 = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    a = weight(t, values(draw, (a3, a2, n, k)))
    b = maybe_view(draw, values(draw, (a3 * r3, a2 * r2, m, k)))
    return OpCase("mul_mat", (a, b), build=lambda ctx, x, y: _g().ggml_mul_mat(ctx, x, y), type=tname(t),
                  name=f"MUL_MAT(type_a={tname(t)},type_b=f32,m={n},n={m},k={k},bs=[{a2},{a3}],nr=[{r2},{r3}])")


@named("mul_mat")
def _mul_mat_named():
    """Shapes that broke other backends: rows of 1/33/1025, k not a multiple of 256 where allowed, GQA."""
    rng = np.random.default_rng(2)
    out = []
    for t in (GGMLType.F32, GGMLType.F16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q8_0, GGMLType.Q4_K,
              GGMLType.Q6_K, GGMLType.IQ4_NL, GGMLType.BF16):
        blck = type_traits[t].blck_size
        for n, m, k in ((16, 1, 256), (33, 3, 256), (1025, 1, 256), (7, 2, max(blck, 32) * 3)):
            if k % blck:
                continue
            a = weight(t, rng.uniform(-1, 1, (n, k)).astype(np.float32))
            b = rng.uniform(-1, 1, (m, k)).astype(np.float32)
            out.append(OpCase("mul_mat", (a, b), build=lambda ctx, x, y: _g().ggml_mul_mat(ctx, x, y),
                              type=tname(t), name=f"MUL_MAT(type_a={tname(t)},type_b=f32,m={n},n={m},k={k})"))
    # GQA: 4 query heads share each of 2 kv heads (block broadcast over ne2)
    kv = rng.uniform(-1, 1, (1, 2, 10, 64)).astype(np.float32)
    q = rng.uniform(-1, 1, (1, 8, 3, 64)).astype(np.float32)
    out.append(OpCase("mul_mat", (kv, q), build=lambda ctx, x, y: _g().ggml_mul_mat(ctx, x, y),
                      name="MUL_MAT(type_a=f32,type_b=f32,m=10,n=3,k=64,bs=[2,1],nr=[4,1])"))
    return out
