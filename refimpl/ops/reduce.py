"""Reductions: sum, sum_rows, mean, cumsum, argmax, count_equal.

Sums run in ggml-cpu's order and precision: f32 rows are summed in f64, sequentially (np.cumsum is
sequential, np.sum is pairwise), and rounded once; f16/bf16 `sum` accumulates in f32; cumsum is a
sequential f32 prefix sum. That makes every reduction bit-exact with ggml-cpu.
"""
from __future__ import annotations

import numpy as np

from ..dispatch import op
from ..shapes import check_layout, fail, ne4, nonempty
from ..types import type_name
from .elementwise import load_f32, store_as


def _seq_sum(x: np.ndarray, dtype) -> np.ndarray:
    """Σ along the last axis, sequentially in index order, accumulating in dtype: ggml's `sum = 0.0; for:
    sum += x[i]`. Starting from +0.0 matters for one case only: a row of -0.0 sums to +0.0 (np.cumsum starts
    from the first element and keeps -0.0; adding +0.0 at the end gives ggml's result for every row)."""
    if x.shape[-1] == 0:
        return np.zeros(x.shape[:-1], dtype)
    with np.errstate(all="ignore"):
        return np.cumsum(x.astype(dtype), axis=-1, dtype=dtype)[..., -1] + dtype(0.0)


@op("sum")
def sum(a):  # noqa: A001  (ggml's name; shadows the builtin in this module only)
    """ggml_sum: the sum of all elements, as a one-element tensor of a's type.

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32/f16/bf16
    out  ne [1]                numpy (1,)               a's type

        f32:      each row summed in f64, row sums added in f64 (both sequential), rounded once to f32
        f16/bf16: each row summed in f32, row sums added in f32, rounded once to a's type

    ggml-cpu reads each row as ne0 packed values (it does not check nb0): refimpl takes any layout.
    """
    nonempty("sum", a=a)
    x, t = load_f32("sum", a)
    acc = np.float64 if t == "f32" else np.float32
    rows = _seq_sum(x.reshape(-1, x.shape[-1] if x.ndim else 1), acc)
    return store_as(_seq_sum(rows[None], acc).astype(np.float32).reshape(1), t)


@op("sum_rows")
def sum_rows(a: np.ndarray) -> np.ndarray:
    """ggml_sum_rows: the sum of each row (along ne0).

    a    ne [n, r1, r2, r3]    numpy (r3, r2, r1, n)    f32, rows contiguous
    out  ne [1, r1, r2, r3]    numpy (r3, r2, r1, 1)    f32

        out[..., 0] = fl32(Σ_f64 a[..., i])   (sequential f64 sum, one rounding)
    """
    x, _ = load_f32("sum_rows", a, ("f32",))
    check_layout("sum_rows", "rows", a=a)
    return _seq_sum(x, np.float64).astype(np.float32)[..., None]


@op("mean")
def mean(a: np.ndarray) -> np.ndarray:
    """ggml_mean: the mean of each row (along ne0).

    a    ne [n, r1, r2, r3]    numpy (r3, r2, r1, n)    f32
    out  ne [1, r1, r2, r3]    numpy (r3, r2, r1, 1)    f32

        out[..., 0] = fl32(Σ_f64 a[..., i]) / fl32(n)    (sequential f64 sum rounded once, f32 division)

    ggml-cpu reads each row as n packed values without checking nb0; refimpl takes any layout.
    """
    x, _ = load_f32("mean", a, ("f32",))
    n = np.float32(x.shape[-1])
    with np.errstate(all="ignore"):
        return (_seq_sum(x, np.float64).astype(np.float32) / n)[..., None]


@op("cumsum")
def cumsum(a: np.ndarray) -> np.ndarray:
    """ggml_cumsum: inclusive prefix sum along each row (ne0).

    a    ne [n, r1, r2, r3]    numpy (r3, r2, r1, n)    f32, rows contiguous
    out  same ne, f32

        out[..., i] = out[..., i-1] + a[..., i]   (sequential f32, out[..., 0] = a[..., 0])
    """
    x, _ = load_f32("cumsum", a, ("f32",))
    check_layout("cumsum", "rows", a=a)
    with np.errstate(all="ignore"):
        return np.cumsum(x, axis=-1, dtype=np.float32)


@op("argmax")
def argmax(a: np.ndarray) -> np.ndarray:
    """ggml_argmax: the index of the largest element of each row, e.g. greedy sampling over logits.

    a    ne [n, r]     numpy (r, n)   f32, a matrix (ne2 = ne3 = 1), e.g. logits (n_tokens, n_vocab)
    out  ne [r]        numpy (r,)     i32

        ggml-cpu's scan: m = -inf; for i: m = m > a[i] ? m : a[i]; if m == a[i]: idx = i

    So ties resolve to the LAST maximum (np.argmax gives the first), and a nan resets the scan: the running
    max becomes nan (never == anything), then the next element. ggml-cpu reads each row as n packed values
    without checking nb0; refimpl takes any layout.
    """
    nonempty("argmax", a=a)
    x, _ = load_f32("argmax", a, ("f32",))
    ne = ne4(x.shape)
    if ne[2] != 1 or ne[3] != 1:
        fail("argmax", "a must be a matrix (ne2 = ne3 = 1)", a=a)
    rows = x.reshape(ne[1], ne[0])
    return np.array([_last_argmax_scan(r) for r in rows] if np.isnan(rows).any() else
                    ne[0] - 1 - np.argmax(rows[:, ::-1], axis=-1), np.int32).reshape(ne[1])


def _last_argmax_scan(r: np.ndarray) -> int:
    """ggml's argmax scan on one row that may hold nan: trailing nans leave the index of the row before
    them; otherwise the scan restarts after the last nan, and the last maximum after it wins."""
    while r.size and np.isnan(r[-1]):
        r = r[:-1]
    if not r.size:
        return 0
    p = int(np.flatnonzero(np.isnan(r))[-1]) + 1 if np.isnan(r).any() else 0
    return r.size - 1 - int(np.argmax(r[p:][::-1]))      # the last maximum of r[p:]


@op("count_equal")
def count_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_count_equal: how many elements of a and b are equal (e.g. correct predictions).

    a    ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   i32, any layout
    b    same ne               i32
    out  ne [1]                numpy (1,)               i64

        out[0] = Σ (a == b)

    ggml-cpu's row decomposition is wrong when ne2 > 1 or ne3 > 1 (it mixes up i02/i03 with ne03/ne02:
    some rows are counted twice, others skipped, and indices can leave the tensor), so ggml's result for
    3-D and 4-D inputs is not the count; refimpl returns the count, and its golden cases stay 1-D/2-D.
    """
    if type_name(a) != "i32" or type_name(b) != "i32":
        fail("count_equal", "a and b must be i32", a=a, b=b)
    a, b = np.asarray(a), np.asarray(b)
    if ne4(a.shape) != ne4(b.shape):
        fail("count_equal", "a and b must have the same shape", a=a, b=b)
    return np.array([np.count_nonzero(a == b.reshape(a.shape))], np.int64)
