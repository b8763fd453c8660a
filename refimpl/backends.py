"""What a backend provides a model beyond its op kernels: where state the model writes in place lives
(`state_copy`), and what happens around a forward pass (`forward_scope`). A backend's kernel modules register
their own with `register_state_copy` and `register_scope` when the dispatch loads them.

A backend whose kernels return device arrays (CUDA) owns residency: its kernels upload read-only host arrays
(weights, a pass's masks) once and keep activations on the device. State that a model writes in place (a KV
cache, a recurrent state) is made with `state_copy`, as llama.cpp allocates its cache in a backend buffer;
nothing in a model names a device.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import numpy as np

from .dispatch import ggml_numerics, loaded_backend
from .residency import to_host

_STATE_COPY: dict[str, Callable] = {}
_SCOPES: dict[str, Callable] = {}


def register_state_copy(backend: str, fn: Callable) -> None:
    """fn(x) -> a writable copy of x (NumPy or the backend's own array) in the memory of a backend whose
    kernels return device arrays."""
    _STATE_COPY[backend] = fn


def state_copy(x):
    """A writable copy of x in the active backend's memory, for state that ops write in place (set_rows with
    out=): NumPy on the CPU backends and under the ggml profiles (which run NumPy emulations), a device array
    under the CUDA backend. Also how state moves between backends."""
    if not ggml_numerics():
        fn = _STATE_COPY.get(loaded_backend())
        if fn is not None:
            return fn(x)
    return np.array(to_host(x), copy=True)


def register_scope(backend: str, fn: Callable) -> None:
    """fn(n_tokens, workload) -> a context manager a backend enters around a model's forward pass."""
    _SCOPES[backend] = fn


def forward_scope(n_tokens: int, workload: str):
    """What the active backend does around a model's forward pass of n_tokens ("decoder": a causal LM whose
    decode kernels run on the backend's threads; "encoder": a batch of independent rows). The numba backend
    reads its thread count once for the pass (refimpl/kernels/blas.py); others do nothing."""
    fn = _SCOPES.get(loaded_backend())
    return fn(n_tokens, workload) if fn is not None else contextlib.nullcontext()
