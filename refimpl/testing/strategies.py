"""Hypothesis strategies for ggml-shaped data.

Block-format inputs are drawn as a *recipe* (row count, block count, one kind per block, a scale and a
seed) that NumPy turns into float32 values, so thousands of 256-element blocks cost little and a
failure still shrinks to a small recipe. Each block gets one of the kinds below, the cases that break
block quantizers:

    normal     Gaussian values times 10**e, e from -8 to 8
    uniform    uniform in [-s, s] (ties of the scale search)
    zero       all +0.0
    signed_zero  a mix of +0.0 and -0.0
    constant   one value repeated (max == min; d == 0 for min/max formats)
    outlier    small values and one huge one at a random position (first-argmax rules, huge scales)
    f16_overflow  magnitudes 6e4..1e8: scales that overflow f16 to inf (ggml then produces inf/nan)
    subnormal  f32 subnormals and tiny normals (1/d overflows, f16 scales flush to 0)
    ties       multiples of 0.5 and 0.25 (every rounding primitive meets its tie)
    ints       small integers (exactly representable levels)
    positive   all > 0 (min > 0 branches), negative  all < 0
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ..types import GGMLType, as_type, traits

BLOCK_KINDS = ("normal", "uniform", "zero", "signed_zero", "constant", "outlier", "f16_overflow",
               "subnormal", "ties", "ints", "positive", "negative")


def make_block(kind: str, n: int, rng: np.random.Generator, e: int) -> np.ndarray:
    """n float32 values of one block kind (see the module docstring)."""
    s = np.float32(10.0) ** np.float32(e)
    if kind == "normal":
        v = rng.standard_normal(n) * s
    elif kind == "uniform":
        v = rng.uniform(-1, 1, n) * s
    elif kind == "zero":
        v = np.zeros(n)
    elif kind == "signed_zero":
        v = np.where(rng.random(n) < 0.5, -0.0, 0.0)
    elif kind == "constant":
        v = np.full(n, rng.standard_normal() * s)
    elif kind == "outlier":
        v = rng.standard_normal(n) * 1e-3 * s
        v[rng.integers(n)] = rng.choice([-1, 1]) * s * 1e3
    elif kind == "f16_overflow":
        v = rng.choice([-1, 1], n) * 10.0 ** rng.uniform(4.8, 8, n)
    elif kind == "subnormal":
        v = rng.standard_normal(n) * 10.0 ** rng.uniform(-45, -36, n)
    elif kind == "ties":
        v = rng.integers(-64, 65, n) * rng.choice([0.5, 0.25])
    elif kind == "ints":
        v = rng.integers(-8, 9, n).astype(np.float64)
    elif kind == "positive":
        v = np.abs(rng.standard_normal(n)) * s + s * 1e-2
    elif kind == "negative":
        v = -np.abs(rng.standard_normal(n)) * s - s * 1e-2
    else:
        raise ValueError(f"unknown block kind {kind!r}")
    return np.asarray(v, np.float32)


@st.composite
def block_rows(draw, type, *, max_rows: int = 3, max_blocks: int = 4, kinds=BLOCK_KINDS) -> np.ndarray:
    """float32 (rows, n_blocks * blck_size) data for quantizing to `type`, adversarial blocks included."""
    tr = traits(as_type(type))
    blck = max(tr.blck_size, 1)
    rows = draw(st.integers(1, max_rows))
    nb = draw(st.integers(1, max_blocks))
    ks = draw(st.lists(st.sampled_from(kinds), min_size=rows * nb, max_size=rows * nb))
    e = draw(st.integers(-8, 8))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    blocks = [make_block(k, blck, rng, e) for k in ks]
    return np.concatenate(blocks).reshape(rows, nb * blck)


@st.composite
def block_bytes(draw, type, *, max_rows: int = 3, max_blocks: int = 4):
    """Raw uint8 (rows, row_bytes) of `type`: random bytes, with the f16 scale fields often made finite.

    Any byte pattern is a valid block for ggml's dequantizers, so random bytes test every code path.
    """
    tr = traits(as_type(type))
    rows = draw(st.integers(1, max_rows))
    nb = draw(st.integers(1, max_blocks))
    seed = draw(st.integers(0, 2**32 - 1))
    raw = np.random.default_rng(seed).integers(0, 256, (rows, nb * tr.type_size), dtype=np.uint8)
    return raw


def qtensors(type, **kw):
    """QTensors of `type` built from `block_bytes` (every bit pattern, NaN/inf scales included)."""
    from ..qtensor import QTensor
    tr = traits(as_type(type))

    def build(raw):
        n = raw.shape[1] // tr.type_size * tr.blck_size
        return QTensor(tr.type, raw, (raw.shape[0], n))
    return block_bytes(type, **kw).map(build)


ggml_ne = st.tuples(st.integers(1, 64), *[st.integers(1, 4)] * 3)


def f32_tensor(ne, lo=-10.0, hi=10.0):
    """float32 array of ggml shape `ne` (NumPy shape = reversed ne)."""
    return hnp.arrays(np.float32, tuple(reversed(ne)), elements=st.floats(lo, hi, width=32))
