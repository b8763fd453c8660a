"""OpCases for the sort ops (see refimpl/testing/cases/__init__.py).

ggml sorts with std::sort / std::partial_sort: the order of equal values, and which of several values tied
at the k-th place top_k keeps, are unspecified, and top_k's order is too (its CPU kernel swaps the first two).
refimpl answers canonically (stable: equal values in index order). So that cases may hold ties, the `post`
of each case maps ggml's answer to that canonical form *only if it is a valid answer*: argsort -- runs of
equal values with their indices in increasing order; top_k / argsort_top_k -- if the indices are distinct
and select the k largest values (as a multiset: test-backend-ops' own check), the canonical selection.
An invalid answer is left as it is (top_k's sorted by value), so the comparison fails.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from . import OpCase, cases, named, ne_str
from ._draw import ne, shape

ASC, DESC = 0, 1


def _g():
    from .. import ggml
    return ggml.lib()


def _rows(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.reshape(-1, a.shape[-1] if a.ndim else 1)


def _stable(a2: np.ndarray, order: int) -> np.ndarray:
    """The canonical (stable) sorting permutation of each row, independent of refimpl's code."""
    if order == ASC:
        return np.argsort(a2, axis=-1, kind="stable")
    return np.lexsort((np.broadcast_to(np.arange(a2.shape[-1]), a2.shape), -a2), axis=-1)


def _canonical_argsort(a: np.ndarray):
    def post(idx):
        idx2 = _rows(idx).astype(np.int64)
        vals = np.take_along_axis(_rows(a), idx2, -1)
        run = np.concatenate([np.zeros((len(vals), 1), np.int64),
                              np.cumsum(vals[:, 1:] != vals[:, :-1], axis=-1)], axis=-1)
        order = np.lexsort((idx2, run), axis=-1)                   # indices increasing within each tie run
        return np.take_along_axis(idx2, order, -1).astype(np.int32).reshape(np.shape(idx))
    return post


def _canonical_top_k(a: np.ndarray, k: int):
    def post(idx):
        a2, idx2 = _rows(a), _rows(idx).astype(np.int64)
        want = _stable(a2, DESC)[:, :k]
        out = np.empty_like(idx2)
        for r in range(len(a2)):
            got = idx2[r]
            ok = (len(np.unique(got)) == k and got.min(initial=0) >= 0 and got.max(initial=0) < a2.shape[1]
                  and np.array_equal(np.sort(a2[r, got]), np.sort(a2[r, want[r]])))
            out[r] = want[r] if ok else got[np.argsort(-a2[r, np.clip(got, 0, a2.shape[1] - 1)], kind="stable")]
        return out.astype(np.int32).reshape(np.shape(idx))
    return post


def _row_values(rng: np.random.Generator, shp, kind: str) -> np.ndarray:
    """Rows of f32 values: distinct (test-backend-ops: shuffled distinct values), ties (few distinct
    values, +0 and -0 among them), uniform, or distinct with +-inf and huge/tiny magnitudes."""
    n = shp[-1] if shp else 1
    if kind == "distinct":
        v = rng.permuted(np.broadcast_to(np.arange(n, dtype=np.float64), shp), axis=-1) - n / 2
        v = v + rng.uniform(0.1, 0.9, shp)
    elif kind == "ties":
        v = rng.integers(-2, 3, shp) * 0.5
        v = np.where(v == 0, rng.choice([0.0, -0.0], shp), v)
    elif kind == "extreme":
        v = rng.choice([-1, 1], shp) * 10.0 ** rng.uniform(-40, 38, shp)
        if n >= 2:                                             # one +inf and one -inf per row
            i, j = rng.choice(n, 2, replace=False)
            v[..., i], v[..., j] = np.inf, -np.inf
    else:
        v = rng.uniform(-1, 1, shp)
    return np.ascontiguousarray(v, np.float32)     # rng.permuted keeps a broadcast's odd strides


@st.composite
def _sort_input(draw):
    n = ne(draw, max_ne0=draw(st.sampled_from([8, 64, 1100])), max_ne=4)
    kind = draw(st.sampled_from(["distinct", "ties", "extreme", "uniform"]))
    a = _row_values(np.random.default_rng(draw(st.integers(0, 2**32 - 1))), shape(n), kind)
    if a.ndim == 2 and draw(st.booleans()):
        # rows further apart than their length: the only view the kernels read right (row i at i*nb1)
        big = np.zeros((a.shape[0], a.shape[1] + draw(st.integers(1, 5))), np.float32)
        big[:, :a.shape[1]] = a
        a = big[:, :a.shape[1]]
    return a, kind


def _argsort_case(a, order, kind=""):
    return OpCase("argsort", (a, order), build=lambda ctx, x: _g().ggml_argsort(ctx, x, order),
                  name=f"ARGSORT(type=f32,ne={ne_str(a)},order={order}{',' + kind if kind else ''})",
                  post=_canonical_argsort(a))


@cases("argsort")
@st.composite
def _argsort(draw):
    a, kind = draw(_sort_input())
    return _argsort_case(a, draw(st.sampled_from([ASC, DESC])), kind)


@named("argsort")
def _argsort_named():
    """test-backend-ops' cases: rows of 2^i - 1 and 2^i (to 2^12 here, not 2^20), and the batched shapes."""
    rng = np.random.default_rng(21)
    out = []
    for order in (ASC, DESC):
        for i in range(2, 13):
            for n in ((1 << i) - 1, 1 << i):
                out.append(_argsort_case(_row_values(rng, (n,), "distinct"), order))
        for nel in ([16, 10, 10, 10], [60, 10, 10, 10], [1023, 2, 1, 3], [1024, 2, 1, 3], [1025, 2, 1, 3],
                    [1025, 256, 1, 1], [2047, 2, 1, 3], [2048, 2, 1, 3], [2049, 2, 1, 3], [2, 8, 8192, 1],
                    [2048, 512, 1, 1]):
            out.append(_argsort_case(_row_values(rng, shape(nel), "distinct"), order))
        out.append(_argsort_case(_row_values(rng, (3, 7, 33), "ties"), order, "ties"))
    return out


def _top_k_case(op, a, k, kind=""):
    gfn = "ggml_top_k" if op == "top_k" else "ggml_argsort_top_k"
    return OpCase(op, (a, k), build=lambda ctx, x: getattr(_g(), gfn)(ctx, x, k),
                  name=f"{op.upper()}(type=f32,ne={ne_str(a)},k={k}{',' + kind if kind else ''})",
                  post=_canonical_top_k(a, k))


@st.composite
def _top_k_draw(draw, op):
    a, kind = draw(_sort_input())
    k = draw(st.integers(1, a.shape[-1] if a.ndim else 1))
    return _top_k_case(op, a, k, kind)


@cases("top_k")
def _top_k():
    return _top_k_draw("top_k")


@cases("argsort_top_k")
def _argsort_top_k():
    return _top_k_draw("argsort_top_k")


def _top_k_named_for(op, seed):
    """test-backend-ops' top_k cases: n = 1..4 with ties; 2^i and 2^i + 11 (to 2^12 here) for
    k in 1, 2, 3, 7, 15, 100, 500, 1023 (with and without ties); the batched shapes for k in 1, 2, 3, 7, 15."""
    rng = np.random.default_rng(seed)

    def tied(shp, k):              # test-backend-ops: shuffled i // max(1, min(10, k/2))
        n = shp[-1]
        base = np.arange(n) // max(1, min(10, k // 2))
        return np.ascontiguousarray(rng.permuted(np.broadcast_to(base, shp), axis=-1), np.float32)

    out = []
    for n in range(1, 5):
        for k in range(1, n + 1):
            out.append(_top_k_case(op, tied((3, 1, 2, n), k), k, "ties"))
    for i in range(0, 13):
        for k in (1, 2, 3, 7, 15, 100, 500, 1023):
            if k <= 1 << i:
                out.append(_top_k_case(op, _row_values(rng, (1 << i,), "distinct"), k))
                out.append(_top_k_case(op, _row_values(rng, (2, 1, (1 << i) + 11), "distinct"), k))
                out.append(_top_k_case(op, tied((2, 1, (1 << i) + 11), k), k, "ties"))
    for k in (1, 2, 3, 7, 15):
        for nel in ([16, 10, 10, 10], [60, 10, 10, 10], [1023, 2, 1, 3], [1024, 2, 1, 3], [1025, 2, 1, 3],
                    [16384, 1, 1, 1], [2047, 2, 1, 3], [2048, 2, 1, 3], [2049, 2, 1, 3]):
            out.append(_top_k_case(op, _row_values(rng, shape(nel), "distinct"), k))
    return out


@named("top_k")
def _top_k_named():
    return _top_k_named_for("top_k", 22)


@named("argsort_top_k")
def _argsort_top_k_named():
    return _top_k_named_for("argsort_top_k", 23)[:40]
