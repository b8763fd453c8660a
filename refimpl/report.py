"""The comparison report that `refimpl compare`, `refimpl check` and the test toolkit's op comparison print:
one Row per tensor (or op case or check), and the text table."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .tolerances import nmse


class Row(NamedTuple):
    """One compared tensor (or op case): NMSE and max |d| of refimpl's values against the oracle's."""
    name: str
    shape: tuple                     # NumPy order (refimpl's); ggml ne is shape[::-1]
    nmse: float
    max_abs: float
    budget: float                    # the NMSE bound (0.0: identical bits required)
    over: bool
    note: str = ""

    @property
    def ne(self) -> list[int]:
        return list(self.shape)[::-1]


def row(name, ours, theirs, bud, note="") -> Row:
    """The Row of one tensor: NMSE and max |d| over the finite values (non-finite ones must agree in place
    and value), `over` its budget (bud 0.0: identical f32 bits required)."""
    a, b = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    fa, fb = np.isfinite(a), np.isfinite(b)
    if not np.array_equal(fa, fb) or not np.array_equal(a[~fa], b[~fb]):
        bad = int(np.sum(fa != fb))
        return Row(name, tuple(np.shape(ours)), math.inf, math.inf, bud, True,
                   (note + "; " if note else "") + f"non-finite values differ ({bad} places)")
    e = nmse(a[fa], b[fb]) if fa.any() else 0.0
    d = float(np.max(np.abs(a[fa] - b[fb]))) if fa.any() else 0.0
    if bud == 0.0:
        over = not np.array_equal(np.asarray(ours).astype(np.float32).view(np.uint32),
                                  np.asarray(theirs).astype(np.float32).view(np.uint32))
    else:
        over = not e <= bud
    return Row(name, tuple(np.shape(ours)), e, d, bud, over, note)


def first_over(rows: list[Row]) -> Row | None:
    return next((r for r in rows if r.over), None)


def format_table(rows: list[Row], title: str = "", kind: str = "tensor") -> str:
    """The rows as a text table: name, ggml ne, NumPy shape, NMSE, max |d|, budget, and a last line naming
    the first `kind` (tensor, case, check) over its budget (or saying there is none)."""
    def num(x):
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}" if x else "0"
    head = ("name", "ne", "numpy shape", "NMSE", "max|d|", "budget", "")
    body = [(r.name, str(r.ne).replace(" ", ""), str(tuple(r.shape)).replace(" ", ""), num(r.nmse),
             num(r.max_abs), num(r.budget) if r.budget else "identical", ("OVER " if r.over else "") + r.note)
            for r in rows]
    w = [max(len(x[i]) for x in [head] + body) for i in range(6)]
    lines = [title] if title else []
    lines.append("  ".join(h.ljust(w[i]) if i < 3 else h.rjust(w[i]) for i, h in enumerate(head[:6])).rstrip())
    for x in body:
        lines.append("  ".join(v.ljust(w[i]) if i < 3 else v.rjust(w[i]) for i, v in enumerate(x[:6]))
                     + ("  " + x[6] if x[6] else ""))
    f = first_over(rows)
    lines.append(f"first {kind} over budget: {f.name} (NMSE {num(f.nmse)} > {num(f.budget)})" if f
                 else f"no {kind} over budget ({len(rows)} compared)")
    return "\n".join(lines)
