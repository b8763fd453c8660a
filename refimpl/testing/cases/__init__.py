"""Valid inputs and parameters for every op, as hypothesis strategies, plus fixed named cases.

    from refimpl.testing import op_cases
    @given(op_cases("rms_norm"))
    def test_my_rms_norm(case):
        assert_nmse(my_rms_norm(*case.args, **case.kwargs), case.run(), 1e-7)

An `OpCase` carries the refimpl call (`op`, `args`, `kwargs`; `case.run()` calls refimpl) and the same
computation as a ggml graph (`build(ctx, *tensors)`; `case.run_ggml()` runs it through ggml-python),
the tolerance row it is judged by (`type`), and a name in test-backend-ops' printable form.
Each family module below registers its ops with `@cases(op)` (a strategy factory) and `@named(op)`
(fixed cases that broke other backends).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ...qtensor import QTensor

FAMILIES = ("elementwise", "reduce", "movement", "norm", "softmax", "rope", "attention", "loss", "matmul",
            "conv", "recurrent", "sort", "optim")


@dataclass
class OpCase:
    op: str
    args: tuple
    kwargs: dict = field(default_factory=dict)
    build: Callable | None = None        # (ctx, *ggml tensors) -> ggml tensor, via refimpl.testing.ggml.lib()
    tensors: tuple | None = None         # inputs handed to ggml; default: the array arguments, in order
    type: str = "f32"                    # tolerance row (refimpl/tolerances.py)
    name: str = ""                       # e.g. "RMS_NORM(type=f32,ne=[64,5,4,3],eps=0.000001)"
    post: Callable | None = None         # applied to ggml's result before comparing (say why where used)

    def __post_init__(self):
        if self.tensors is None:
            self.tensors = tuple(a for a in self.args if isinstance(a, (np.ndarray, QTensor)))
        if not self.name:
            self.name = f"{self.op.upper()}({', '.join(_short(a) for a in self.args)})"

    def run(self, fn: Callable | None = None):
        """refimpl's result (or fn's, called with the same arguments)."""
        if fn is None:
            from ... import ops
            fn = getattr(ops, self.op)
        return fn(*self.args, **self.kwargs)

    def run_ggml(self, n_threads: int = 1):
        from .. import ggml
        out = ggml.run(self.build, *self.tensors, n_threads=n_threads)
        return self.post(out) if self.post else out

    def __str__(self):
        return self.name


def _short(a) -> str:
    if isinstance(a, QTensor):
        return f"{a.traits.name}{a.ne}"
    if isinstance(a, np.ndarray):
        nc = "" if a.flags.c_contiguous else ",view"
        return f"{a.dtype.name}{list(a.shape[::-1])}{nc}"
    return repr(a)


def ne_str(x) -> str:
    return str(list(np.shape(x)[::-1] if not isinstance(x, QTensor) else x.ne)).replace(" ", "")


_STRATEGIES: dict[str, Callable] = {}
_NAMED: dict[str, Callable[[], list[OpCase]]] = {}
_FAMILY_OF: dict[str, str] = {}
_loaded = False


def cases(op: str):
    """Register a zero-argument factory returning a hypothesis strategy of OpCase for `op`."""
    def deco(fn):
        _STRATEGIES[op] = fn
        _FAMILY_OF[op] = fn.__module__.rsplit(".", 1)[-1]
        return fn
    return deco


def named(op: str):
    """Register a zero-argument factory returning a list of fixed OpCases for `op`."""
    def deco(fn):
        _NAMED[op] = fn
        _FAMILY_OF.setdefault(op, fn.__module__.rsplit(".", 1)[-1])
        return fn
    return deco


def _load():
    global _loaded
    if not _loaded:
        for f in FAMILIES:
            importlib.import_module(f"{__name__}.{f}")
        _loaded = True


def op_cases(op: str):
    """The hypothesis strategy of valid OpCases for `op` (refimpl op name)."""
    _load()
    if op not in _STRATEGIES:
        raise KeyError(f"no cases registered for op {op!r}")
    return _STRATEGIES[op]()


def named_cases(op: str) -> list[OpCase]:
    _load()
    return _NAMED[op]() if op in _NAMED else []


def ops_with_cases(family: str | None = None) -> list[str]:
    _load()
    return sorted(o for o in _STRATEGIES if family is None or _FAMILY_OF[o] == family)


def ops_with_named(family: str | None = None) -> list[str]:
    _load()
    return sorted(o for o in _NAMED if family is None or _FAMILY_OF[o] == family)
