"""Small helpers the case modules share: drawing ggml shapes and values."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ..strategies import small_values


def ne(draw, max_ne0: int = 64, max_ne: int = 4, min_dims: int = 1, max_dims: int = 4, ne0_multiple: int = 1):
    """A ggml `ne` list (fastest first), padded to its drawn number of dims."""
    nd = draw(st.integers(min_dims, max_dims))
    n0 = ne0_multiple * draw(st.integers(1, max(1, max_ne0 // ne0_multiple)))
    return [n0] + [draw(st.integers(1, max_ne)) for _ in range(nd - 1)]


def shape(ne_list) -> tuple:
    return tuple(reversed(ne_list))


SMALL = 16                 # arrays of at most this many elements draw their values element by element
ELEMENTWISE_MAX = 512      # larger arrays draw element-wise a quarter of the time, up to this many elements
_SOURCES = ("seeded", "seeded", "seeded", "elements")   # seeded first: what a shrinking case falls back to


def values(draw, shp, lo=-1.0, hi=1.0, dtype=np.float32) -> np.ndarray:
    """Values in [lo, hi] of shape shp: for arrays of up to SMALL elements, element by element with the simple
    values first (refimpl.testing.strategies.small_values: a shrunk case has distinct simple values except
    where its failure needs a particular one); a quarter of those up to ELEMENTWISE_MAX through
    hypothesis.extra.numpy.arrays; else uniform from a drawn seed (ggml test-backend-ops' default input).
    Every call makes the same draws first (source, SMALL elements, seed) whatever the size, so a case whose
    shape shrinks keeps its later draws in place: hypothesis can reduce shapes and values together."""
    n = int(np.prod(shp, dtype=np.int64))
    src = draw(st.sampled_from(_SOURCES))
    small = draw(small_values(n if n <= SMALL else 0, lo, hi))
    seed = draw(st.integers(0, 2**32 - 1))
    if n <= SMALL:
        return np.array(small, np.float32).reshape(shp).astype(dtype)
    if src == "elements" and n <= ELEMENTWISE_MAX:
        el = st.floats(float(np.float32(lo)), float(np.float32(hi)), width=32)
        return draw(hnp.arrays(np.float32, tuple(shp), elements=el)).astype(dtype)
    return np.random.default_rng(seed).uniform(lo, hi, shp).astype(dtype)


def maybe_view(draw, x: np.ndarray, transposed: bool = False) -> np.ndarray:
    """x itself, or the same values as a non-contiguous view that ggml can also build: permuted memory
    (ggml_permute of a contiguous tensor) or a row-step view into a larger buffer (ggml_view with larger
    nb1..nb3). Rows stay contiguous (nb0 = element size, which most ggml kernels assert) unless
    `transposed`, which also allows the row axis itself to be strided (for ops that accept any layout)."""
    kind = draw(st.sampled_from(["contiguous", "permuted", "row_step"]))
    if kind == "permuted" and x.ndim >= 2:
        k = x.ndim if transposed else x.ndim - 1
        if k >= 2:
            perm = list(draw(st.permutations(range(k)))) + list(range(k, x.ndim))
            return np.ascontiguousarray(np.transpose(x, perm)).transpose(np.argsort(perm))
    if kind == "row_step" and x.ndim >= 2:
        big = np.zeros((x.shape[0] * 2,) + x.shape[1:], x.dtype)
        big[::2] = x
        return big[::2]
    return x


# ggml-python (ggml 0.15.3), the op oracle these cases run against, knows every refimpl type but those new in
# ggml 0.25.3; those are checked by test-backend-ops (tests/rpc) and, for the block formats, against
# ggml 0.25.3's own library (tests/quants/test_q2_0.py). The case modules draw from these tables.
from ...types import GGMLType, type_traits as _all_traits          # noqa: E402

NEW_IN_0_25 = frozenset({GGMLType.Q2_0})
type_traits = {t: tr for t, tr in _all_traits.items() if t not in NEW_IN_0_25}


def oracle_types(types):
    """The members of `types` (GGMLTypes or names) that ggml 0.15.3 has."""
    names = {tr.name for t, tr in _all_traits.items() if t in NEW_IN_0_25}
    return type(types)(t for t in types if t not in NEW_IN_0_25 and str(t).lower() not in names)
