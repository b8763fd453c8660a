"""`check`: the exercises of the notebooks, run against refimpl.

    check(my_fn, reference, cases, solution=solution_fn)

Every case (a tuple of arguments) is run through `reference` (a refimpl call) and through the hidden
`solution` first -- so the exercise is known to be solvable -- then through the learner's `my_fn`. A stub
that still raises NotImplementedError is reported as not attempted; a wrong answer raises AssertionError
showing the first mismatching case and element.
"""
from __future__ import annotations

import numpy as np


def _compare(got, want, exact: bool, rtol: float, where: str) -> None:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        raise AssertionError(f"{where}: shape {got.shape} (ggml ne {list(got.shape[::-1])}), expected "
                             f"{want.shape} (ggml ne {list(want.shape[::-1])})")
    if exact:
        same = np.array_equal(got, want, equal_nan=want.dtype.kind == "f")
    else:
        same = np.allclose(got, want, rtol=rtol, atol=rtol * float(np.max(np.abs(want), initial=0.0)),
                           equal_nan=True)
    if not same:
        bad = np.argwhere(~np.isclose(got, want, rtol=0 if exact else rtol, atol=0, equal_nan=True)
                          if got.dtype.kind == "f" else got != want)
        ix = tuple(int(i) for i in bad[0]) if len(bad) else ()
        raise AssertionError(f"{where}: {len(bad)} of {want.size} values differ; first at numpy index {ix}: "
                             f"got {got[ix]!r}, expected {want[ix]!r}")


def check(fn, reference, cases, *, solution=None, exact: bool = True, rtol: float = 1e-6) -> None:
    """Run fn(*case) against reference(*case) for every case and say whether fn is correct.

    exact=True compares values exactly (NaN equal to NaN); otherwise np.allclose with rtol (and an
    absolute tolerance of rtol times the largest expected magnitude).
    """
    cases = [c if isinstance(c, tuple) else (c,) for c in cases]
    wants = [reference(*c) for c in cases]
    if solution is not None:
        for i, (c, want) in enumerate(zip(cases, wants)):
            _compare(solution(*c), want, exact, rtol, f"reference solution, case {i}")
    for i, (c, want) in enumerate(zip(cases, wants)):
        try:
            got = fn(*c)
        except NotImplementedError:
            print(f"{fn.__name__}: not attempted yet -- write it, then run this cell again "
                  f"(a solution is in the collapsed cell above)")
            return
        _compare(got, want, exact, rtol, f"{fn.__name__}, case {i}")
    print(f"{fn.__name__}: correct on all {len(cases)} cases")
