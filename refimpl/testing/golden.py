"""Comparing refimpl with ggml: one function for every golden test, which also records coverage.

    compare(case, actual, expected)   -- by the tolerance table entry of (case.op, case.type, "ggml")

What was compared (op, input types, whether an input was a non-contiguous view) is appended to
`LOG`; the test suite writes it to the file named by $REFIMPL_COVERAGE_LOG (tests/conftest.py) and
`python -m refimpl.testing.coverage` reads it.
"""
from __future__ import annotations

import numpy as np

from ..qtensor import QTensor
from ..tolerances import Tol, tol

LOG: list[dict] = []


def _tname(x) -> str:
    if isinstance(x, QTensor):
        return x.traits.name
    return {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(np.int32): "i32",
            np.dtype(np.int64): "i64", np.dtype(np.float64): "f64", np.dtype(np.int8): "i8",
            np.dtype(np.int16): "i16"}.get(np.asarray(x).dtype, str(np.asarray(x).dtype))


def _noncontig(x) -> bool:
    if isinstance(x, QTensor):
        return not x.data.flags.c_contiguous
    return isinstance(x, np.ndarray) and not x.flags.c_contiguous


def record(case, ok: bool) -> None:
    from ..ops import OPS
    info = OPS.get(case.op)
    arrays = [a for a in case.tensors if isinstance(a, (np.ndarray, QTensor))]
    LOG.append({"op": case.op, "covers": list(info.covers) if info else [case.op.upper()],
                "types": [_tname(a) for a in arrays], "noncontig": any(_noncontig(a) for a in arrays),
                "weight_type": _tname(arrays[0]) if arrays else None, "ok": ok, "case": case.name})


def _ne4(shape) -> list[int]:
    return list(shape[::-1]) + [1] * (4 - len(shape))


def check_values(actual, expected, t: Tol, what: str, bound=None) -> None:
    """ggml's test-backend-ops rules: shapes equal, NaN fails unless both NaN, infinities match in
    position and sign, then NMSE (or bit equality / max ULP as the entry says); with `bound` (an array
    broadcasting to the result: the entry's element-wise bound for this case) |actual - expected| <= bound
    instead of NMSE."""
    from . import assert_bits_equal, nmse
    if t.bound is not None and bound is None:
        raise ValueError(f"{what}: the tolerance entry is an element-wise bound; pass bound=t.bound(*case.args)")
    if isinstance(actual, QTensor) or isinstance(expected, QTensor):
        if not (isinstance(actual, QTensor) and isinstance(expected, QTensor)):
            raise AssertionError(f"{what}: one result is a QTensor and the other is not")
        if actual.type != expected.type or _ne4(actual.shape) != _ne4(expected.shape):
            raise AssertionError(f"{what}: {actual!r} != expected {expected!r}")
        if actual.shape != expected.shape:           # same ggml ne, NumPy shapes differ in leading 1s
            expected = expected.reshape(actual.shape)
        if t.exact:
            assert_bits_equal(actual.data, expected.data, what)
            return
        actual, expected = np.asarray(actual), np.asarray(expected)
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape and _ne4(a.shape) == _ne4(e.shape):
        e = e.reshape(a.shape)          # same ggml ne; NumPy shapes differ only in leading 1s
    if a.shape != e.shape:
        raise AssertionError(f"{what}: shape ne {list(a.shape[::-1])} (numpy {a.shape}) != expected "
                             f"ne {list(e.shape[::-1])} (numpy {e.shape})")
    if t.exact:
        if a.dtype != e.dtype:
            raise AssertionError(f"{what}: dtype {a.dtype} != expected {e.dtype}")
        assert_bits_equal(a, e, what)
        return
    if a.dtype.kind in "iub" or e.dtype.kind in "iub":
        if not np.array_equal(a, e):
            bad = np.argwhere(a != e)[:5]
            raise AssertionError(f"{what}: integers differ at {bad.tolist()}")
        return
    a64, e64 = a.astype(np.float64), e.astype(np.float64)
    na, ne_ = np.isnan(a64), np.isnan(e64)
    if not np.array_equal(na, ne_):
        raise AssertionError(f"{what}: NaN at {np.argwhere(na != ne_)[:5].tolist()} in one result only")
    ia, ie = np.isinf(a64), np.isinf(e64)
    if not (np.array_equal(ia, ie) and np.array_equal(a64[ia], e64[ie])):
        raise AssertionError(f"{what}: infinities differ in position or sign")
    fin = ~(na | ia)
    if t.max_ulp is not None:
        ulp = np.abs(a[fin].astype(np.float32).view(np.int32).astype(np.int64) -
                     e[fin].astype(np.float32).view(np.int32).astype(np.int64))
        if ulp.size and ulp.max() > t.max_ulp:
            raise AssertionError(f"{what}: {ulp.max()} ulp > {t.max_ulp}")
    if bound is not None:
        b = np.broadcast_to(np.asarray(bound, np.float64), a64.shape)
        over = fin & ~(np.abs(a64 - e64) <= b)
        if over.any():
            i = tuple(np.argwhere(over)[0])
            raise AssertionError(f"{what}: |{a64[i]!r} - {e64[i]!r}| > {b[i]:.3e} at numpy index {list(i)}, "
                                 f"{int(over.sum())} element(s) over the bound ({t.why})")
        return
    if t.nmse is not None:
        err = nmse(a64[fin], e64[fin])
        if not err <= t.nmse:
            raise AssertionError(f"{what}: NMSE {err:.3e} > {t.nmse:.1e} ({t.why})")


def compare(case, actual, expected, against: str = "ggml") -> None:
    t = tol(case.op, case.type, against)
    try:
        check_values(actual, expected, t, case.name, bound=t.bound(*case.args) if t.bound else None)
    except AssertionError:
        record(case, False)
        raise
    record(case, True)
