"""The one dispatch: implementations of an op registered by (op, backend, numerics), chosen once per call.

    @op("rms_norm", covers="RMS_NORM")
    def rms_norm(a, eps): ...                  # the NumPy body: the reference, also `rms_norm.reference`

    @register("rms_norm", backend="numba")                 # a kernel (exact and fast numerics)
    @register("rms_norm", numerics="ggml")                 # ggml-cpu's roundings, under any backend
    @register("mul_mat", numerics="llamafile")             # one profile's overlay (see NUMERICS)

`covers` lists the ggml enum entries the function implements: "RMS_NORM" (enum ggml_op), "UNARY:GELU"
(enum ggml_unary_op), "GLU:SWIGLU" (enum ggml_glu_op); the coverage report reads them. `check`, when given,
validates the arguments once before any implementation runs. A check that reads only the arguments' layouts
(types, dtypes, shapes, strides) and scalar parameters, never array values, is declared `layout_check=True`:
the dispatch then remembers the layouts it accepted (`_layout_key`) and skips the check for the next call with
the same ones -- a model calls each op with a handful of layouts, thousands of times.

Taps: a fusion (refimpl.ops.fused) names the intermediate tensors of its body with `tap(role, x)`; a model that
wants them (a capture, to compare with llama.cpp's graph node by node) calls the fusion inside
`tapping(cap, role=name, ...)`, and while that is active the dispatch runs such an op's body (`op(...,
taps=True)`) instead of a one-pass kernel, so that every tapped tensor exists. Fusion stays the dispatch's
business: the model writes its layer once.

Backends: "numpy" (the reference bodies only), "numba" (refimpl.kernels), "cuda" (refimpl.kernels.cuda);
`with backend("numba"):` or REFIMPL_BACKEND. The default is "numba" when the numba package is installed
(found without importing it), else "numpy". A backend's kernel modules are imported on the first op call
under it, so `import refimpl` never imports Numba.

Numerics profiles (`with numerics("ggml"):`, REFIMPL_NUMERICS, or `numerics=` on any op call); each is a
chain of registration keys tried in order, then the reference body:

    exact             exact                  the math ggml defines, f32 with f64 where ggml accumulates in f64
    fast              fast, exact            dot products summed in f32 in whatever order is fastest
    ggml              tiled, llamafile,      ggml-cpu's roundings as llama.cpp (ggml 0.25.3) builds it: its
                      ggml                   tiled K-quant/IQ kernels and llamafile's tinyBLAS for the products
                                             that build gives them
    ggml-nollamafile  ggml                   ggml-cpu's roundings built without llamafile (ggml-python's build,
                                             refimpl's op-level oracle)

An implementation registered without a backend serves every backend; one registered for a backend is tried
first. An implementation returns NotImplemented for inputs it does not cover, and the next one in the chain
runs. The ggml-numerics emulations live in refimpl.kernels.ggml and load on the first call under a ggml
profile.

Functions that are not ops (block dequantizers and quantizers, ggml's dot-product kernels) get kernels through
the same `register`, with the reference function in place of the op's name, and the same chain:

    @register(quants.dequantize_q4_0, backend="numba", numerics=KEYS)   # compiled, the same bits in every profile

their caller asks `kernel_for(reference_fn)` (the first one registered for the active backend and profile,
or None: run the reference function).
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
from types import MappingProxyType
from typing import Callable

import numpy as np


from .residency import host_args
from .shapes import GGMLShapeError, ne4

BACKENDS = ("numpy", "numba", "cuda")
# profile -> the registration keys it tries, in order, before the reference body
NUMERICS: dict[str, tuple[str, ...]] = {
    "exact": ("exact",),
    "fast": ("fast", "exact"),
    "ggml": ("tiled", "llamafile", "ggml"),
    "ggml-nollamafile": ("ggml",),
}
KEYS = ("exact", "fast", "ggml", "llamafile", "tiled")
GGML_PROFILES = frozenset(p for p, chain in NUMERICS.items() if "ggml" in chain)
# profile -> how a KV cache made under it stores and spans its cells (`kv_layout`): llama.cpp's build (f16 cells;
# without flash attention the graph attends over a multiple of 256 cells, the unused ones masked) under the
# ggml profiles, f32 rows over the filled cells only otherwise
KV_LAYOUTS: dict[str, tuple[type, int]] = {p: (np.float16, 256) if p in GGML_PROFILES else (np.float32, 1)
                                           for p in NUMERICS}


def _default_backend() -> str:
    """REFIMPL_BACKEND if set, else "numba" when the package is installed (not imported here), else "numpy"."""
    env = os.environ.get("REFIMPL_BACKEND")
    if env:
        return env
    return "numba" if importlib.util.find_spec("numba") is not None else "numpy"


_backend = contextvars.ContextVar("refimpl_backend", default=_default_backend())
_taps = contextvars.ContextVar("refimpl_taps", default=None)      # (cap, {role: name}) while tapping
_numerics = contextvars.ContextVar("refimpl_numerics", default=os.environ.get("REFIMPL_NUMERICS", "exact"))


ACCEPTED_KEPT = 1024        # layouts an op remembers as accepted (then it forgets them all and starts again)
_SCALARS = (int, float, bool, str, type(None))


def _layout_key(args: tuple, kwargs: dict):
    """What a layout check reads of a call, as one flat tuple: each ndarray's dtype, shape and strides, each
    scalar's type and value, what a class with a `layout_key()` method says of its objects (QTensor: type, shape,
    strides) after the class; kwargs after their names. None when an argument is anything else (a list, a
    device array): that call is checked in full. (Flat, because building nested tuples costs a third more; the
    groups cannot run into each other: a shape or a layout_key is a tuple, a scalar never is.)"""
    key = ()
    for a in args:
        t = type(a)
        if t is np.ndarray:
            key += (a.dtype, a.shape, a.strides)
        elif t in _SCALARS:
            key += (t, a)
        else:
            lk = getattr(t, "layout_key", None)
            if lk is None:
                return None
            key += (t, lk(a))
    for k, a in kwargs.items():
        t = type(a)
        if t is np.ndarray:
            key += (k, a.dtype, a.shape, a.strides)
        elif t in _SCALARS:
            key += (k, t, a)
        else:
            lk = getattr(t, "layout_key", None)
            if lk is None:
                return None
            key += (k, t, lk(a))
    return key


@dataclass
class OpInfo:
    name: str
    fn: Callable
    covers: tuple[str, ...]
    check: Callable | None = None
    layout_check: bool = False             # the check reads layouts and scalars only: accepted ones are remembered
    impls: dict[tuple[str | None, str], Callable] = field(default_factory=dict)   # (backend|None, key) -> fn
    chains: dict[tuple[str, str], tuple] = field(default_factory=dict)             # (backend, profile) -> chain

    @property
    def kernels(self) -> MappingProxyType:
        """backend -> its exact-numerics kernel (what the coverage report and the tests ask about); read-only:
        `register` adds implementations."""
        return MappingProxyType({b: f for (b, k), f in self.impls.items() if b is not None and k == "exact"})


# the registry: what `op` and `register` record, read by the dispatch and the coverage report
OPS: dict[str, OpInfo] = {}                # op name -> its reference body and implementations
FUNCTIONS: dict[Callable, OpInfo] = {}     # a non-op reference function (a dequantizer) -> its implementations
# what to import before the first call that needs it: kernels for a backend, emulations for a key
_MODULES = {"numba": "refimpl.kernels", "cuda": "refimpl.kernels.cuda", "fast": "refimpl.kernels.fast",
            "ggml": "refimpl.kernels.ggml", "llamafile": "refimpl.kernels.ggml",
            "tiled": "refimpl.kernels.ggml"}
_loaded: set[str] = set()


def _load(what: str) -> None:
    """Import the modules for a backend or numerics key once (they register themselves); on failure warn
    and run what remains (the NumPy reference at the end of every chain)."""
    _loaded.add(what)
    if what not in _MODULES:
        return
    try:
        mod = importlib.import_module(_MODULES[what])
        getattr(mod, "load", lambda: None)()
    except ImportError as e:
        warnings.warn(f"refimpl: {what} kernels unavailable ({e}); running the NumPy reference", RuntimeWarning,
                      stacklevel=3)


def _chain(info: OpInfo, b: str, profile: str) -> tuple:
    """(backend or None, implementation) pairs registered for backend b and a numerics profile, best first."""
    out = []
    for key in NUMERICS[profile]:
        if key not in _loaded:
            _load(key)
        for bk in ((b, None) if b != "numpy" else (None,)):
            f = info.impls.get((bk, key))
            if f is not None:
                out.append((bk, f))
    return tuple(out)


def tap(role: str, x):
    """Inside a fusion's body: hand x to the active `tapping` under the name it gives `role` (none: nothing);
    returns x."""
    t = _taps.get()
    if t is not None:
        name = t[1].get(role)
        if name is not None:
            t[0](name, x)
    return x


@contextlib.contextmanager
def tapping(cap: Callable, **names: str):
    """Within: the fusions called (ops registered with taps=True) run their bodies and hand their tapped
    intermediates to cap(name, x), named by role (`tapping(cap, product="ffn_up-0", act="ffn_gelu-0")`).
    A cap that records nothing (refimpl.models.common.no_capture) is no tapping at all."""
    if getattr(cap, "records", True) is False:
        yield
        return
    tok = _taps.set((cap, names))
    try:
        yield
    finally:
        _taps.reset(tok)


def op(name: str, covers: str | tuple[str, ...] | None = None, check: Callable | None = None,
       layout_check: bool = False, taps: bool = False):
    """Register the NumPy reference of a ggml op; the returned wrapper validates (check) and dispatches.
    Every op accepts `numerics=` (a profile name): the call then runs under that profile. layout_check: the
    check reads layouts and scalars only (see the module), so accepted layouts are remembered. taps: the body
    names intermediates with `tap`, and runs itself while a `tapping` is active."""
    # covers=None: the enum named like the op; covers=(): a composite with no enum of its own
    cov = (name.upper(),) if covers is None else (covers,) if isinstance(covers, str) else tuple(covers)
    if layout_check and check is None:
        raise ValueError(f"{name}: layout_check=True needs a check")

    def deco(fn):
        info = OpInfo(name, fn, cov, check, layout_check)
        OPS[name] = info
        chains = info.chains
        bget, nget = _backend.get, _numerics.get
        accepted: set = set()

        @functools.wraps(fn)
        def wrapper(*args, numerics: str | None = None, **kwargs):
            try:
                if numerics is not None and numerics != nget():
                    if numerics not in NUMERICS:
                        raise ValueError(f"{name}: unknown numerics {numerics!r}; one of {tuple(NUMERICS)}")
                    tok = _numerics.set(numerics)
                    try:
                        return wrapper(*args, **kwargs)
                    finally:
                        _numerics.reset(tok)
                for a in args:                 # ggml's GGML_MAX_DIMS, for every op (ne4 says it for the others)
                    nd = getattr(a, "ndim", 0)     # (a class such as np.float32 has a descriptor there)
                    if type(nd) is int and nd > 4:
                        ne4(a.shape)
                if layout_check:
                    lk = _layout_key(args, kwargs)
                    if lk is None or lk not in accepted:
                        check(*args, **kwargs)
                        if lk is not None:
                            if len(accepted) >= ACCEPTED_KEPT:
                                accepted.clear()
                            accepted.add(lk)
                elif check is not None:
                    check(*args, **kwargs)
                if taps and _taps.get() is not None:
                    return fn(*args, **kwargs)
                key = (bget(), nget())
                chain = chains.get(key)
                if chain is None:
                    chain = _resolve(info, *key)
                for host, impl in chain:       # the hot path: one dict lookup, then the implementations
                    out = impl(*host_args(args), **_host_kwargs(kwargs)) if host else impl(*args, **kwargs)
                    if out is not NotImplemented:
                        return out
                raise AssertionError("unreachable: every chain ends with the reference")
            except GGMLShapeError as e:
                # an op built on others (conv_1d on im2col and mul_mat) names itself before the inner op
                if str(e).startswith(f"{name}:"):
                    raise
                raise GGMLShapeError(f"{name}: {e}") from e

        if check is None:
            reference = fn
        else:                              # `op.reference`: the NumPy body with the op's validation
            @functools.wraps(fn)
            def reference(*args, **kwargs):
                check(*args, **kwargs)
                return fn(*args, **kwargs)
        wrapper.reference = reference
        wrapper.op_info = info
        wrapper.accepted_layouts = accepted        # for tests: what the layout check has accepted
        return wrapper
    return deco


def _resolve(info: OpInfo, b: str, profile: str) -> tuple:
    """The implementations a call tries under backend b and a numerics profile, best first, ending with the
    reference body, each as (run on host copies of device arrays?, function); kept in info.chains until an
    implementation is registered."""
    if profile not in NUMERICS:
        raise ValueError(f"unknown numerics {profile!r} (REFIMPL_NUMERICS?); one of {tuple(NUMERICS)}")
    if b != "numpy" and b not in _loaded:
        _load(b)
    # NumPy code under the CUDA backend runs on host copies of device arrays
    chain = tuple((bk is None and b == "cuda", f) for bk, f in _chain(info, b, profile)) + ((b == "cuda", info.fn),)
    info.chains[(b, profile)] = chain
    return chain


def _host_kwargs(kwargs: dict) -> dict:
    return dict(zip(kwargs, host_args(kwargs.values())))


def register(target: str | Callable, backend: str | None = None,
             numerics: str | tuple[str, ...] = ("exact", "fast")):
    """Register an implementation of op `target` (its name; same signature as the op, without `numerics`),
    or of a non-op reference function (the function itself; same signature), under a backend (None: every
    backend) for one or more numerics keys (KEYS). A kernel that serves exact and fast reads which with
    current_numerics()."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; one of {BACKENDS}")
    keys = (numerics,) if isinstance(numerics, str) else tuple(numerics)
    for k in keys:
        if k not in KEYS:
            raise ValueError(f"unknown numerics key {k!r}; one of {KEYS}")
    if isinstance(target, str):
        info = OPS[target]
    else:
        if backend is None:
            raise ValueError(f"register({target.__qualname__}): a kernel of a non-op function names its backend")
        info = FUNCTIONS.setdefault(target, OpInfo(target.__qualname__, target, ()))

    def deco(fn):
        for k in keys:
            info.impls[(backend, k)] = fn
        for i in (*OPS.values(), *FUNCTIONS.values()):      # resolved chains are stale now
            i.chains.clear()
        return fn
    return deco


def kernel_for(ref: Callable) -> Callable | None:
    """The implementation registered for the non-op function `ref` under the active backend and numerics
    profile, best first as for an op (`register(ref, backend, numerics)`), or None: run ref itself."""
    b = _backend.get()
    if b == "numpy":
        return None
    if b not in _loaded:
        _load(b)
    info = FUNCTIONS.get(ref)
    if info is None:
        return None
    key = (b, _numerics.get())
    if key[1] not in NUMERICS:
        raise ValueError(f"unknown numerics {key[1]!r} (REFIMPL_NUMERICS?); one of {tuple(NUMERICS)}")
    chain = info.chains.get(key)
    if chain is None:
        chain = info.chains[key] = tuple(f for bk, f in _chain(info, *key) if bk == b)
    return chain[0] if chain else None


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
    """Run ops under a numerics profile (NUMERICS): "exact" (default), "fast", "ggml", "ggml-nollamafile"."""
    if mode not in NUMERICS:
        raise ValueError(f"unknown numerics mode {mode!r}; one of {tuple(NUMERICS)}")
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
            raise ValueError(f"unknown numerics mode {override!r}; one of {tuple(NUMERICS)}")
        return override
    return _numerics.get()


def ggml_numerics(override: str | None = None) -> bool:
    """Whether the active (or given) profile reproduces ggml-cpu's roundings ("ggml", "ggml-nollamafile")."""
    return current_numerics(override) in GGML_PROFILES


def kv_layout(override: str | None = None) -> tuple[type, int]:
    """(the cells' storage type, the multiple of cells the attention spans) of a KV cache made under the active
    (or given) profile: KV_LAYOUTS. The cache asks once, when it is made (refimpl.models.llama.KVCache)."""
    return KV_LAYOUTS[current_numerics(override)]


def loaded_backend() -> str:
    """The active backend, its kernel modules imported (they register what refimpl.backends asks them for)."""
    b = _backend.get()
    if b != "numpy" and b not in _loaded:
        _load(b)
    return b
