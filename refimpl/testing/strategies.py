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

from ..types import as_type, traits

def _given(draw, value):
    """value, or a value drawn from it where it is a strategy (as hypothesis.extra.numpy takes dtypes and shapes)."""
    return draw(value) if isinstance(value, st.SearchStrategy) else value


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
def block_rows(draw, type, *, min_rows: int = 1, max_rows: int = 3, min_blocks: int = 1, max_blocks: int = 4,
               kinds=BLOCK_KINDS) -> np.ndarray:
    """float32 (rows, n_blocks * blck_size) data for quantizing to `type` (a type, its name, or a strategy of
    them), adversarial blocks included: one kind of `kinds` per block, one seed for their values."""
    tr = traits(as_type(_given(draw, type)))
    blck = max(tr.blck_size, 1)
    rows = draw(st.integers(min_rows, max_rows))
    nb = draw(st.integers(min_blocks, max_blocks))
    ks = draw(st.lists(st.sampled_from(kinds), min_size=rows * nb, max_size=rows * nb))
    e = draw(st.integers(-8, 8))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    blocks = [make_block(k, blck, rng, e) for k in ks]
    return np.concatenate(blocks).reshape(rows, nb * blck)


@st.composite
def block_bytes(draw, type, *, min_rows: int = 1, max_rows: int = 3, min_blocks: int = 1, max_blocks: int = 4):
    """Raw uint8 (rows, row_bytes) of `type` (a type, its name, or a strategy of them): random bytes.

    Any byte pattern is a valid block for ggml's dequantizers, so random bytes test every code path.
    """
    tr = traits(as_type(_given(draw, type)))
    rows = draw(st.integers(min_rows, max_rows))
    nb = draw(st.integers(min_blocks, max_blocks))
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


# The simplest values of a small array, position by position: distinct binary fractions of [-1, 1] mapped onto
# the range (and small integers for integer tensors). Each element draws one of these or any value of the
# range, the first preferred, so a failure shrinks to these simple values wherever it does not need a
# particular one -- and a case whose shape shrinks keeps distinct, non-zero values (all-zero arrays would
# hide most bugs, and hypothesis could not reach the smaller shape through them).
SIMPLE = (1.0, -0.5, 0.25, -1.0, 0.75, -0.25, 0.5, -0.75, 0.125, -0.875, 0.375, -0.375, 0.625, -0.625, 0.875, -0.125)
SIMPLE_INTS = (1, -2, 3, -1, 2, -3, 4, -4, 5, -5, 6, -6, 7, -7, 8, -8)


def small_values(n: int, lo: float, hi: float, elements=None, integer: bool = False):
    """A strategy of n values for a small array (see SIMPLE): `elements`' draws where given (its own order of
    simplicity), else per position one of the simple values or any float32 (integer) of [lo, hi]. Up to
    len(SIMPLE) values it always makes the same number of draws."""
    if elements is not None:
        return st.tuples(*[elements] * max(n, SMALL)).map(lambda v: list(v[:n]))
    if integer:
        lo_i, hi_i = int(lo), int(hi)
        table = [min(max(v, lo_i), hi_i) for v in SIMPLE_INTS]
        any_value = st.integers(lo_i, hi_i)
    else:
        table = [float(np.float32(lo + (t + 1.0) / 2.0 * (hi - lo))) for t in SIMPLE]
        any_value = st.floats(float(np.float32(lo)), float(np.float32(hi)), width=32)
    L = len(table)
    # max(n, L) draws, the first n used: the same number for every n <= L (see tensors)
    return st.tuples(*[st.one_of(st.integers(0, L - 1).map(lambda k, i=i: table[(i + k) % L]), any_value)
                       for i in range(max(n, L))]).map(lambda v: list(v[:n]))


_VIEWS = ("contiguous", "row_step", "permuted", "offset")
# where a larger tensor's values come from: the seeded block kinds three times as often as element-wise
# hypothesis draws, the kinds first -- what a shrinking case falls back to: generic values at any shape (an
# element-wise array at its simplest is all zeros, which hides most failures)
_VALUE_SOURCES = ("kinds", "kinds", "kinds", "elements")
SMALL = 16          # tensors of at most this many elements always draw element-wise


@st.composite
def tensors(draw, types=("f32",), *, min_dims: int = 1, max_dims: int = 4, min_ne0: int = 1, max_ne0: int = 64,
            min_ne: int = 1, max_ne: int = 4, min_blocks: int = 1, max_blocks: int = 3, views: bool = True,
            min_value: float | None = None, max_value: float | None = None, elements=None, lo: float = -10.0,
            hi: float = 10.0):
    """A ggml tensor as refimpl holds it: an ndarray (F32, F16, F64, I8/I16/I32) or a QTensor (BF16 and
    block types), with `ne` drawn fastest-first and NumPy shape = reversed(ne).

    types       GGMLType values or names to choose from, or a strategy of them
    min_dims, max_dims   how many dims (1..4), as hypothesis.extra.numpy.array_shapes
    min_ne0, max_ne0     ne0 of element types; block types draw min_blocks..max_blocks blocks per row
    min_ne, max_ne       ne1..ne3
    views       also draw non-contiguous views as ggml makes them: every other row/matrix (`row_step`,
                ggml's view with a larger nb1..nb3), permuted axes (`ggml_permute`/`transpose`), and a
                view at a byte offset into a larger buffer. QTensor views keep whole rows.
    min_value, max_value  the range of float values (hnp style; `lo`, `hi` are the older names)
    elements    a strategy of element values, as hypothesis.extra.numpy.arrays takes (default: floats in
                [min_value, max_value])

    Tensors of up to 16 elements draw their values element by element (`small_values`: the simple values of
    SIMPLE first, or `elements`), a quarter of the larger ones through hypothesis.extra.numpy.arrays; the rest
    come from the `make_block` kinds (zeros, outliers, ties, huge and tiny values) scaled into the range, from
    a drawn seed. A failure shrinks to a small shape whose values are simple (1.0, -0.5, 0.25, ... of the
    range) except where the failure needs a particular one.
    """
    lo = lo if min_value is None else min_value
    hi = hi if max_value is None else max_value
    from ..qtensor import QTensor
    from ..quants import QUANTIZERS
    from ..types import NUMPY_DTYPES
    t = as_type(draw(types) if isinstance(types, st.SearchStrategy) else draw(st.sampled_from(list(types))))
    tr = traits(t)
    nd = draw(st.integers(max(1, min_dims), max(1, min(max_dims, 4))))
    if tr.blck_size > 1:
        ne0 = tr.blck_size * draw(st.integers(min_blocks, max_blocks))
    else:
        ne0 = draw(st.integers(min_ne0, max_ne0))
    ne = [ne0] + [draw(st.integers(min_ne, max_ne)) for _ in range(nd - 1)]
    shape = tuple(reversed(ne))
    view = draw(st.sampled_from(_VIEWS)) if views else "contiguous"
    if view == "offset" and nd == 1 and t not in NUMPY_DTYPES:
        view = "contiguous"        # a QTensor row is taken whole: no offset view inside it
    if view in ("row_step", "permuted") and nd == 1:
        view = "contiguous"
    # the full buffer: twice as many leading items for row_step views, one extra row for offset views
    big = list(shape)
    if view == "row_step" and nd > 1:
        ax = draw(st.integers(0, nd - 2))
        big[ax] *= 2
    if view == "offset":
        big[0] += 1
    n = int(np.prod(big))
    dt = NUMPY_DTYPES.get(t)
    integer = dt is not None and dt.kind in "iu"
    if integer:
        info = np.iinfo(dt)
        ilo, ihi = max(int(info.min), -1000), min(int(info.max), 1000)
        el = st.integers(ilo, ihi)
    else:
        el = elements if elements is not None else st.floats(float(np.float32(lo)), float(np.float32(hi)),
                                                             width=32)
    # the same draws at every size (source, SMALL elements, seed, kind, scale), so a shrinking shape keeps the
    # draws after them in place: hypothesis reduces shapes and values together
    source = draw(st.sampled_from(_VALUE_SOURCES))
    m = n if n <= SMALL else 0
    small = draw(small_values(m, ilo, ihi, integer=True) if integer else small_values(m, lo, hi, elements))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind, e = draw(st.sampled_from(BLOCK_KINDS)), draw(st.integers(-3, 1))
    if n <= SMALL:                   # element by element, the simplest first (SIMPLE)
        vals = np.array(small, np.int64 if integer else np.float64).reshape(big)
    elif source == "elements":
        vals = draw(hnp.arrays(np.int64 if integer else np.float32, tuple(big), elements=el)).astype(
            np.int64 if integer else np.float64)
    elif integer:
        vals = rng.integers(ilo, ihi + 1, big)
    else:
        vals = make_block(kind, n, rng, e).reshape(big)
    if dt is not None:
        if integer:
            base = vals.astype(dt)
        else:
            with np.errstate(over="ignore", invalid="ignore"):
                base = np.clip(np.nan_to_num(vals, nan=0.0), lo, hi).astype(dt)
    else:
        if (t, "ref") in QUANTIZERS or (t, "chunk") in QUANTIZERS:
            from ..qtensor import quantize
            base = quantize(vals, t)
        else:   # types ggml quantizes only with an importance matrix: random bytes are valid blocks
            raw = rng.integers(0, 256, tuple(big[:-1]) + (big[-1] // tr.blck_size * tr.type_size,), dtype=np.uint8)
            base = QTensor(t, raw, big)
    if view == "row_step" and nd > 1:
        key = tuple(slice(None, None, 2) if i == ax else slice(None) for i in range(nd - 1))
        return base[key]
    if view == "offset":
        return base[1:]
    if view == "permuted" and nd > 1 and not isinstance(base, QTensor):
        perm = draw(st.permutations(range(nd)))
        # a contiguous tensor of the permuted shape, viewed back as `shape` (what ggml_permute makes)
        inv = np.argsort(perm)
        return np.ascontiguousarray(np.transpose(base, perm)).transpose(inv)
    return base
