"""One op against ggml-python (`refimpl compare --op OP`): the op's named golden cases and a few drawn ones
(refimpl.testing.cases) run by refimpl under a numerics profile (NumPy backend) and by ggml, judged by the
tolerance table. Part of the test toolkit: it needs hypothesis (the drawn cases) and ggml-python.

    from refimpl.testing.compare_op import compare_op
    rows = compare_op("soft_max_ext", numerics="ggml")
"""
from __future__ import annotations

import contextlib
import math

import numpy as np

from .. import backend
from .. import numerics as numerics_mode
from ..report import Row
from ..dispatch import ggml_numerics
from ..qtensor import QTensor, dequantize
from ..tolerances import nmse, tol
from .golden import check_values


def _drawn_cases(op: str, n: int, seed: int) -> list:
    """n OpCases of the op's hypothesis strategy, drawn reproducibly (derandomized by seed)."""
    if n <= 0:
        return []
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed
    from .cases import op_cases
    out: list = []

    @hseed(seed)
    @settings(max_examples=n, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(case=op_cases(op))
    def collect(case):
        out.append(case)
    collect()
    return out[:n]


def compare_op(op: str, *, numerics: str = "exact", n_cases: int = 10, seed: int = 0,
               named: bool = True) -> list[Row]:
    """One op against ggml-python: the op's named golden cases (named=True) and n_cases drawn ones, each
    run by refimpl in `numerics` mode (NumPy backend) and by ggml, judged by the tolerance table's entry
    (op, case type, "ggml-faithful" under numerics="ggml" where there is one, else "ggml")."""
    from . import ggml as oracle
    from .cases import named_cases
    if not oracle.available():
        raise ImportError("compare_op needs ggml-python==0.0.45 (pip install 'refimpl[test]')")
    cases = (named_cases(op) if named else []) + _drawn_cases(op, n_cases, seed)
    if not cases:
        raise KeyError(f"no golden cases for op {op!r} (refimpl.testing.cases)")
    # ggml-python's build has no llamafile sgemm: its profile is "ggml-nollamafile"
    mode = "ggml-nollamafile" if numerics == "ggml" else numerics
    rows = []
    for case in cases:
        t = None
        if ggml_numerics(mode):
            with contextlib.suppress(KeyError):
                t = tol(case.op, case.type, "ggml-faithful")
        t = t or tol(case.op, case.type, "ggml")
        bud = 0.0 if t.exact else (t.nmse if t.nmse is not None else math.nan)
        with numerics_mode(mode), backend("numpy"), np.errstate(all="ignore"):
            ours = case.run()
        theirs = case.run_ggml()
        a, e = _values(ours), _values(theirs)
        shape = tuple(np.shape(a))
        note = ""
        try:
            if t.exact and not isinstance(ours, (tuple, list)):
                _same_bits(ours, theirs)
            else:
                check_values(ours, theirs, t, case.name, bound=t.bound(*case.args) if t.bound else None)
            over = False
        except AssertionError as err:
            over, note = True, str(err).replace(case.name + ": ", "").splitlines()[0][:160]
        if a.size == e.size:
            e = e.reshape(a.shape)
            fin = np.isfinite(a) & np.isfinite(e)
            err_n = nmse(a[fin], e[fin]) if fin.any() else 0.0
            d = float(np.max(np.abs(a[fin] - e[fin]))) if fin.any() else 0.0
        else:
            err_n = d = math.nan
        if t.max_ulp is not None and not note:
            note = f"budget {t.max_ulp} ulp"
        rows.append(Row(case.name, shape, err_n, d, bud, over, note))
    return rows


def _same_bits(actual, expected) -> None:
    """Identical bits, NaNs only in the same places (their payloads and signs may differ, as ggml's own
    NaN results do); raises AssertionError naming the first difference."""
    if isinstance(actual, QTensor) or isinstance(expected, QTensor):
        a, e = np.asarray(getattr(actual, "data", actual)), np.asarray(getattr(expected, "data", expected))
        if a.shape != e.shape or not np.array_equal(a, e):
            raise AssertionError("the blocks differ")
        return
    a, e = np.asarray(actual), np.asarray(expected)
    if a.dtype != e.dtype or a.size != e.size:
        raise AssertionError(f"{a.dtype}{a.shape} != expected {e.dtype}{e.shape}")
    a, e = np.ascontiguousarray(a).reshape(-1), np.ascontiguousarray(e).reshape(-1)
    if a.dtype.kind != "f":
        bad = a != e
    else:
        na, ne_ = np.isnan(a), np.isnan(e)
        u = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
        bad = (na != ne_) | ((a.view(u) != e.view(u)) & ~na)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise AssertionError(f"{int(bad.sum())} of {a.size} values differ, first at flat index {i}: "
                             f"{a[i]!r} != {e[i]!r}")


def _values(x) -> np.ndarray:
    if isinstance(x, QTensor):
        return dequantize(x).astype(np.float64)
    if isinstance(x, (tuple, list)):
        return np.concatenate([_values(v).reshape(-1) for v in x])
    return np.asarray(x).astype(np.float64)


def main(argv: list[str] | None = None) -> int:
    """`python -m refimpl.testing.compare_op OP [--numerics M] [--cases N] [--seed S]` (what `refimpl compare
    --op` runs): the table, exit status 1 when a case is over its budget, 2 on bad input."""
    import argparse
    import sys
    from ..report import first_over, format_table
    p = argparse.ArgumentParser(prog="refimpl compare --op", description=compare_op.__doc__)
    p.add_argument("op")
    p.add_argument("--numerics", default="exact")
    p.add_argument("--cases", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    try:
        rows = compare_op(a.op, numerics=a.numerics, n_cases=a.cases, seed=a.seed)
    except (ValueError, KeyError, ImportError) as e:
        print(f"refimpl: error: {e}", file=sys.stderr)
        return 2
    print(format_table(rows, f"{a.op}: refimpl (numerics={a.numerics}) vs ggml-python, {len(rows)} cases", "case"))
    return 1 if first_over(rows) else 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
