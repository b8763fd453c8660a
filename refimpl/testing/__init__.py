"""Test toolkit: hypothesis strategies for ggml-shaped data, comparison helpers, the tolerance table.

    from refimpl.testing import block_rows, qtensors, assert_bits_equal, assert_nmse, TOLERANCES
    from refimpl.testing import ggml          # real ggml through ggml-python (optional)

`nmse` (ggml's test-backend-ops metric) and the tolerance table live in core, refimpl.tolerances.
"""
from __future__ import annotations

import numpy as np

from .strategies import (BLOCK_KINDS, block_bytes, block_rows, f32_tensor, ggml_ne, make_block, qtensors,
                         tensors)

__all__ = ["BLOCK_KINDS", "tensors", "block_rows", "block_bytes", "qtensors", "make_block", "ggml_ne", "f32_tensor",
           "op_cases", "named_cases", "OpCase", "nmse", "assert_nmse", "assert_bits_equal", "Tol", "TOLERANCES", "tol"]


def assert_nmse(actual, expected, max_nmse: float, what: str = "") -> None:
    """NMSE(actual, expected) <= max_nmse over the finite elements, once the others agree: NaN exactly where
    expected has NaN, the same infinities where it has them (a NaN or inf anywhere else fails, naming it).
    Every failure is raised from one place, so hypothesis reports one bug, not one per kind of message."""
    a, b = np.asarray(actual), np.asarray(expected)
    problem = None
    if a.shape != b.shape:
        problem = f"shape {a.shape} != expected {b.shape}"
    else:
        with np.errstate(invalid="ignore"):
            na, nb = np.isnan(a), np.isnan(b)
            fa, fb = np.isfinite(a), np.isfinite(b)
            same = (na == nb) & (fa == fb) & (fa | na | (a == b))
        if not same.all():
            ix = tuple(int(i) for i in np.argwhere(~same)[0])
            problem = (f"non-finite values differ: at {ix} {a[ix]!r} != expected {b[ix]!r} "
                       f"({int((~same).sum())} such places)")
        else:
            e = nmse(a[fa], b[fa]) if fa.any() else 0.0
            if not e <= max_nmse:
                problem = f"NMSE {e:.3e} > {max_nmse:.1e}"
    if problem is not None:
        raise AssertionError(f"{what}: {problem}")


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}.get(a.dtype.itemsize, np.uint8))


def assert_bits_equal(actual, expected, what: str = "") -> None:
    """Identical bit patterns (so +0 != -0 and NaN payloads count), with the first mismatches reported."""
    a, b = np.asarray(actual), np.asarray(expected)
    if a.shape != b.shape or a.dtype != b.dtype:
        raise AssertionError(f"{what}: {a.dtype}{a.shape} != expected {b.dtype}{b.shape}")
    ba, bb = _bits(a), _bits(b)
    bad = np.argwhere(ba != bb)
    if len(bad):
        lines = [f"  at {tuple(int(i) for i in ix)}: {a[tuple(ix)]!r} (0x{int(ba[tuple(ix)]):x}) "
                 f"!= {b[tuple(ix)]!r} (0x{int(bb[tuple(ix)]):x})" for ix in bad[:8]]
        raise AssertionError(f"{what}: {len(bad)} of {a.size} values differ in their bits\n" + "\n".join(lines))


from ..tolerances import TOLERANCES, Tol, nmse, tol  # noqa: E402,F401


def __getattr__(name):
    # the case registry imports hypothesis strategies of every op family: loaded on first use
    if name in ("op_cases", "named_cases", "OpCase"):
        from . import cases
        return getattr(cases, name)
    raise AttributeError(name)
