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
    a, b = np.asarray(actual), np.asarray(expected)
    if a.shape != b.shape:
        raise AssertionError(f"{what}: shape {a.shape} != expected {b.shape}")
    e = nmse(a, b)
    if not e <= max_nmse:
        raise AssertionError(f"{what}: NMSE {e:.3e} > {max_nmse:.1e}")


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
