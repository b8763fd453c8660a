"""The op registry: `@op` names a function after its ggml op, and dispatches to a kernel backend.

    @op("rms_norm", covers="RMS_NORM")
    def rms_norm(a, eps): ...            # the NumPy body: the reference, also `rms_norm.reference`

`covers` lists the ggml enum entries the function implements: "RMS_NORM" (enum ggml_op),
"UNARY:GELU" (enum ggml_unary_op), "GLU:SWIGLU" (enum ggml_glu_op). The coverage report reads them.

Backends: kernels register with `@register("rms_norm", backend="numba")`; `with refimpl.backend("numba"):`
(or REFIMPL_BACKEND) makes `@op` call them. The default is "numba" when the numba package is installed
(found without importing it), else "numpy"; REFIMPL_BACKEND=numpy|numba overrides. A backend's kernel
modules are imported on the first op call under it (`refimpl.kernels.load`), so `import refimpl` never
imports Numba. Functions that are not ops (the block dequantizers and quantizers) get kernels with
`@implements(reference_fn, backend="numba")`; their caller asks `kernel_for(reference_fn)`.
Numerics: `with refimpl.numerics("ggml"):` or `numerics=` on ops that accept it; `current_numerics()`
tells an op which mode is active. Kernels serve "exact" and "fast" (an op given `numerics=` runs its kernel
with that mode current); "ggml" runs the NumPy emulation.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import importlib.util
import os
import warnings
from dataclasses import dataclass, field
from typing import Callable

from ._shapes import GGMLShapeError

BACKENDS = ("numpy", "numba", "cuda")
NUMERICS = ("exact", "ggml", "fast")


def _default_backend() -> str:
    """REFIMPL_BACKEND if set, else "numba" when the package is installed (not imported here), else "numpy"."""
    env = os.environ.get("REFIMPL_BACKEND")
    if env:
        return env
    return "numba" if importlib.util.find_spec("numba") is not None else "numpy"


_backend = contextvars.ContextVar("refimpl_backend", default=_default_backend())
_numerics = contextvars.ContextVar("refimpl_numerics", default=os.environ.get("REFIMPL_NUMERICS", "exact"))


@dataclass
class OpInfo:
    name: str
    fn: Callable
    covers: tuple[str, ...]
    kernels: dict[str, Callable] = field(default_factory=dict)


OPS: dict[str, OpInfo] = {}
KERNELS: dict[tuple[Callable, str], Callable] = {}     # (reference function, backend) -> kernel, for non-ops
_KERNEL_MODULES = {"numba": "refimpl.kernels", "cuda": "refimpl.kernels.cuda"}
_loaded: set[str] = set()


def _load(b: str) -> None:
    """Import backend b's kernel modules once (they register themselves); on failure warn and run NumPy."""
    _loaded.add(b)
    if b not in _KERNEL_MODULES:
        return
    try:
        mod = importlib.import_module(_KERNEL_MODULES[b])
        getattr(mod, "load", lambda: None)()
    except ImportError as e:
        warnings.warn(f"refimpl: {b} kernels unavailable ({e}); running the NumPy reference", RuntimeWarning,
                      stacklevel=3)


def op(name: str, covers: str | tuple[str, ...] | None = None):
    """Register the NumPy reference of a ggml op; the returned wrapper dispatches by backend."""
    # covers=None: the enum named like the op; covers=(): a composite with no enum of its own
    cov = (name.upper(),) if covers is None else (covers,) if isinstance(covers, str) else tuple(covers)

    def deco(fn):
        info = OpInfo(name, fn, cov)
        OPS[name] = info

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                b = _backend.get()
                # numerics="ggml" is the NumPy emulation of ggml-cpu's roundings: kernels compute exact mode only
                if b != "numpy" and current_numerics(kwargs.get("numerics")) != "ggml":
                    if b not in _loaded:
                        _load(b)
                    k = info.kernels.get(b)
                    if k is not None:
                        if "numerics" in kwargs:        # the kernel reads the mode from the context
                            mode = kwargs["numerics"]
                            kwargs = {n: v for n, v in kwargs.items() if n != "numerics"}
                            if mode is not None and mode != _numerics.get():
                                tok = _numerics.set(mode)
                                try:
                                    return k(*args, **kwargs)
                                finally:
                                    _numerics.reset(tok)
                        return k(*args, **kwargs)
                    if b == "cuda":      # no CUDA kernel: the reference on host copies of device arrays
                        args, kwargs = _host_args(args), dict(zip(kwargs, _host_args(kwargs.values())))
                return fn(*args, **kwargs)
            except GGMLShapeError as e:
                # an op built on others (conv_1d on im2col and mul_mat) names itself before the inner op
                if str(e).startswith(f"{name}:"):
                    raise
                raise GGMLShapeError(f"{name}: {e}") from e

        wrapper.reference = fn
        wrapper.op_info = info
        return wrapper
    return deco


def _on_host(x):
    if hasattr(x, "copy_to_host") and hasattr(x, "shape"):      # a numba.cuda device array
        return x.copy_to_host()
    if isinstance(x, (list, tuple)) and any(hasattr(y, "copy_to_host") for y in x):
        return type(x)(_on_host(y) for y in x)
    return x


def _host_args(args) -> tuple:
    return tuple(_on_host(a) for a in args)


def register(name: str, backend: str):
    """Register a kernel for op `name` under `backend` (same signature as the op)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; one of {BACKENDS}")

    def deco(fn):
        OPS[name].kernels[backend] = fn
        return fn
    return deco


def implements(ref: Callable, backend: str):
    """Register a kernel for a function that is not an op (a block dequantizer or quantizer of
    refimpl.quants), keyed by the reference function itself; `kernel_for(ref)` finds it."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; one of {BACKENDS}")

    def deco(fn):
        KERNELS[(ref, backend)] = fn
        return fn
    return deco


def kernel_for(ref: Callable) -> Callable | None:
    """The kernel registered with `implements(ref, ...)` for the active backend, or None (run ref)."""
    b = _backend.get()
    if b == "numpy":
        return None
    if b not in _loaded:
        _load(b)
    return KERNELS.get((ref, b))


@contextlib.contextmanager
def backend(name: str):
    """Run ops with the kernels of `name` ("numpy", "numba", "cuda") where one is registered."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; one of {BACKENDS}")
    tok = _backend.set(name)
    try:
        yield name
    finally:
        _backend.reset(tok)


@contextlib.contextmanager
def numerics(mode: str):
    """"exact" (default): the math ggml defines, f32 with f64 where ggml accumulates in f64.
    "ggml": reproduce the CPU backend's roundings (where an op implements them).
    "fast": as "exact", except that dot products (mul_mat, mul_mat_id) sum in f32 in whatever order is
    fastest (BLAS sgemm on f32 tiles of the exactly dequantized weights; fused f32 decode-dot kernels):
    each output within the f32 summation bound gamma_k * sum|a*b| of the exact value."""
    if mode not in NUMERICS:
        raise ValueError(f"unknown numerics mode {mode!r}; one of {NUMERICS}")
    tok = _numerics.set(mode)
    try:
        yield mode
    finally:
        _numerics.reset(tok)


def current_backend() -> str:
    return _backend.get()


def current_numerics(override: str | None = None) -> str:
    if override is not None:
        if override not in NUMERICS:
            raise ValueError(f"unknown numerics mode {override!r}; one of {NUMERICS}")
        return override
    return _numerics.get()
