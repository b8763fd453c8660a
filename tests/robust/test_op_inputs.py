"""Every op with hostile tensor arguments, under every backend: wrong shapes, wrong dtypes, empty tensors,
negative-stride and non-contiguous views.

From a valid case (refimpl.testing.cases) each tensor argument in turn is replaced by a mutation:

    shape      its last axis one longer (a leading axis for a QTensor, whose rows stay block-aligned),
               or its leading axis one longer
    dtype      float64 / int32 / complex64 for a float tensor (float32 / int64 for an integer one;
               a float64 array of the same values for a QTensor)
    empty      a zero-size leading or last axis
    view       the same values as a negative-stride view (x[::-1] of a reversed copy, on the leading axis)
               and as a non-contiguous view (x[..., ::2] of a buffer twice as wide)

The op must either return a result or raise a ValueError / TypeError whose message starts with the op's
name (and, for a GGMLShapeError or a rejected shape, gives both shape orders: "ne [" and "numpy (").
A view must give the result of its contiguous copy bit for bit. Any other exception (IndexError,
KeyError, ZeroDivisionError, AttributeError, a Numba error) is a defect; so is a crash, which takes the
whole run down (faulthandler prints where).
"""
from __future__ import annotations

import importlib.util
import time
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from tests._profiles import examples

import refimpl
from refimpl.shapes import GGMLShapeError
from refimpl.qtensor import QTensor
from refimpl.testing.cases import op_cases, ops_with_cases

from ._fuzz import PROFILE, SECONDS, record

pytestmark = pytest.mark.property

EXAMPLES = 4 if PROFILE == "dev" else 25

# Ops whose result is defined on the input's memory, not its values: ggml_view takes byte strides and an
# offset into its source's buffer, so a non-contiguous source legitimately gives other elements. For these
# a view input is checked to give a result lying inside the input's own bytes (no read out of bounds).
MEMORY_OPS = {"view"}
HAS_NUMBA = importlib.util.find_spec("numba") is not None


# -- mutations ------------------------------------------------------------------------------------------

def _grow(x: np.ndarray, axis: int) -> np.ndarray:
    """x with `axis` one longer (the new slice repeats the last one, or zeros when the axis is empty)."""
    if x.shape[axis] == 0:
        pad = np.zeros(x.shape[:axis] + (1,) + x.shape[axis + 1:], x.dtype)
    else:
        pad = np.take(x, [-1], axis=axis)
    return np.concatenate([x, pad], axis=axis)


def _q(x: QTensor, data: np.ndarray, lead: int) -> QTensor:
    return QTensor(x.type, data, (lead,) + tuple(x.shape[1:]))


def shape_mutations(x):
    if isinstance(x, QTensor):
        if len(x.shape) >= 2:
            yield "shape: leading axis +1", _q(x, _grow(x.data, 0), x.shape[0] + 1)
        return
    if x.ndim == 0:
        return
    yield "shape: last axis +1", _grow(x, -1)
    if x.ndim >= 2:
        yield "shape: leading axis +1", _grow(x, 0)


def dtype_mutations(x):
    if isinstance(x, QTensor):
        yield "dtype: float64 for a QTensor", np.asarray(x).astype(np.float64)
        return
    if np.issubdtype(x.dtype, np.floating):
        yield "dtype: float64", x.astype(np.float64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            yield "dtype: int32", np.nan_to_num(x).astype(np.int32)
        yield "dtype: complex64", x.astype(np.complex64)
    elif np.issubdtype(x.dtype, np.integer):
        yield "dtype: float32", x.astype(np.float32)
        yield "dtype: int64" if x.dtype != np.int64 else "dtype: int16", \
            x.astype(np.int64 if x.dtype != np.int64 else np.int16)


def empty_mutations(x):
    if isinstance(x, QTensor):
        if len(x.shape) >= 2:
            yield "empty: leading axis 0", _q(x, x.data[:0], 0)
        return
    if x.ndim == 0:
        return
    yield "empty: leading axis 0", x[:0]
    if x.ndim >= 2:
        yield "empty: last axis 0", x[..., :0]


def view_mutations(x):
    """(name, view, contiguous copy): the same values in both."""
    if isinstance(x, QTensor):
        if len(x.shape) >= 2 and x.shape[0] >= 2:
            d = np.ascontiguousarray(x.data)
            yield "view: negative stride", QTensor(x.type, np.ascontiguousarray(d[::-1])[::-1], x.shape), \
                QTensor(x.type, d, x.shape)
        return
    if x.ndim == 0:
        return
    c = np.ascontiguousarray(x)
    if x.shape[0] >= 2:
        yield "view: negative stride", np.ascontiguousarray(c[::-1])[::-1], c
    wide = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)
    wide[..., ::2] = c
    yield "view: non-contiguous", wide[..., ::2], c


# -- checks ---------------------------------------------------------------------------------------------

ALLOWED = (ValueError, TypeError)


def _call(case, args, kwargs):
    from refimpl import ops
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            return getattr(ops, case.op)(*args, **kwargs)


def _clear(op: str, e: BaseException, shape: bool) -> str | None:
    """None if e is a clear rejection by `op`, else what is wrong with it."""
    if not isinstance(e, ALLOWED):
        return f"{type(e).__name__}: {e}"
    msg = str(e)
    if not msg.startswith(f"{op}:") and not msg.startswith(f"{op} "):
        return f"{type(e).__name__} not naming the op: {msg}"
    if (isinstance(e, GGMLShapeError) or (shape and isinstance(e, ValueError))) and \
            ("ne [" not in msg or "numpy (" not in msg):
        return f"{type(e).__name__} without both shape orders: {msg}"
    return None


def _bits(r):
    """A result as comparable bits: arrays by shape, dtype and bytes; QTensors by type, shape and data."""
    if isinstance(r, QTensor):
        return ("q", r.type, r.shape, np.ascontiguousarray(r.data).tobytes())
    if isinstance(r, np.ndarray) or np.isscalar(r) or isinstance(r, np.generic):
        a = np.asarray(r)
        return ("a", a.shape, a.dtype.str, np.ascontiguousarray(a).tobytes())
    if isinstance(r, (tuple, list)):
        return tuple(_bits(v) for v in r)
    if isinstance(r, dict):
        return tuple((k, _bits(v)) for k, v in sorted(r.items()))
    return ("o", repr(r))


def _bounds(x: np.ndarray) -> tuple[int, int]:
    """[low, high) byte addresses an ndarray's elements span."""
    lo = hi = x.__array_interface__["data"][0]
    for n, s in zip(x.shape, x.strides):
        if n > 1:
            lo, hi = (lo + (n - 1) * s, hi) if s < 0 else (lo, hi + (n - 1) * s)
    return lo, hi + x.itemsize


def _slots(case):
    """(where, tensor) for every tensor argument: ("arg", i) or ("kw", name)."""
    for i, a in enumerate(case.args):
        if isinstance(a, (np.ndarray, QTensor)):
            yield ("arg", i), a
    for k, v in case.kwargs.items():
        if isinstance(v, (np.ndarray, QTensor)):
            yield ("kw", k), v


def _with(case, where, value):
    args, kwargs = list(case.args), dict(case.kwargs)
    if where[0] == "arg":
        args[where[1]] = value
    else:
        kwargs[where[1]] = value
    return args, kwargs


def check_case(case, problems: list[str]) -> None:
    op = case.op
    for where, x in _slots(case):
        slot = f"arg {where[1]}" if where[0] == "arg" else f"{where[1]}="
        muts = [(n, v, True) for n, v in shape_mutations(x)] + \
               [(n, v, False) for n, v in dtype_mutations(x)] + \
               [(n, v, True) for n, v in empty_mutations(x)]
        for name, value, is_shape in muts:
            args, kwargs = _with(case, where, value)
            try:
                _call(case, args, kwargs)
                record("test_op_inputs", "accepted")
            except Exception as e:              # noqa: BLE001 - every exception type is judged here
                bad = _clear(op, e, is_shape)
                record("test_op_inputs", "rejected" if bad is None else "failed")
                if bad is not None:
                    problems.append(f"{op} [{case.name}] {slot} {name}: {bad}")
        for name, view, cont in view_mutations(x):
            if op in MEMORY_OPS:
                try:
                    r = _call(case, *_with(case, where, view))
                except Exception as e:              # noqa: BLE001
                    bad = _clear(op, e, False)
                    if bad is not None:
                        problems.append(f"{op} [{case.name}] {slot} {name}: {bad}")
                    continue
                if isinstance(r, np.ndarray) and isinstance(view, np.ndarray) and r.size and view.size:
                    (rl, rh), (vl, vh) = _bounds(r), _bounds(view)
                    if rl < vl or rh > vh:
                        problems.append(f"{op} [{case.name}] {slot} {name}: result spans bytes outside the input")
                continue
            try:
                want = _bits(_call(case, *_with(case, where, cont)))
            except Exception:                   # noqa: BLE001 - the contiguous copy is judged as the case
                continue
            try:
                got = _bits(_call(case, *_with(case, where, view)))
                record("test_op_inputs", "accepted")
            except Exception as e:              # noqa: BLE001
                bad = _clear(op, e, False)
                record("test_op_inputs", "rejected" if bad is None else "failed")
                if bad is not None:
                    problems.append(f"{op} [{case.name}] {slot} {name}: {bad}")
                continue
            if got != want:
                record("test_op_inputs", "failed")
                problems.append(f"{op} [{case.name}] {slot} {name}: result differs from the contiguous copy's")


BACKENDS = ["numpy", pytest.param("numba", marks=pytest.mark.skipif(not HAS_NUMBA, reason="numba not installed"))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ops_with_cases())
def test_op_rejects_or_computes_hostile_inputs(op, backend):
    problems: list[str] = []

    @settings(max_examples=examples(EXAMPLES), deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=op_cases(op))
    def check(case):
        with refimpl.backend(backend):
            check_case(case, problems)

    t0 = time.perf_counter()
    check()
    SECONDS["test_op_inputs"] += time.perf_counter() - t0
    assert not problems, f"{len(problems)} hostile inputs of {op} ({backend}) mishandled:\n" + \
        "\n".join(dict.fromkeys(problems))
