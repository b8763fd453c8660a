"""What the model graphs share: captures of named intermediates, llama.cpp's LLM_NORM, and the moves of
activations that live on a device (asked of the backend's residency, refimpl.dispatch.residency: a model never
imports a kernel or names a backend)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..dispatch import device_of, on_device, residency, to_host  # noqa: F401  (on_device, to_host: for the models)
from ..ops import add, mul, norm


def no_capture(name: str, x) -> None:
    """The capture callback when nothing is captured (a model may test `cap is no_capture` to run fused ops)."""
    return None


def capture_fn(capture) -> Callable[[str, np.ndarray], None]:
    """A `(name, array)` callback from `capture` (None, a dict, or a callable); device arrays reach it as
    NumPy copies."""
    if capture is None:
        return no_capture
    if callable(capture):
        return lambda name, x: capture(name, to_host(x))
    return lambda name, x: capture.__setitem__(name, np.array(to_host(x), copy=True))


def layer_norm(x, w, b, eps: float):
    """llama.cpp's build_norm(LLM_NORM): ggml_norm over the rows, then mul by the weight and add the bias."""
    return add(mul(norm(x, eps), w), b)


# -- where activations live ---------------------------------------------------------------------------------

def gpu_mode() -> bool:
    """The active backend keeps activations on a device between ops (dispatch.residency)."""
    return residency() is not None


def movement():
    """The residency helpers that move device arrays (copies into the KV cache, casts, clones)."""
    return device_of()


def to_device(x):
    """A host array uploaded (per call: for inputs such as masks and positions, never for weights)."""
    return residency().upload(x)


def device_constant(w):
    """A weight used as an element-wise operand (a norm gain, a bias): its device copy from the backend's
    upload-once cache (keyed by the host array, so `w` must be the model's own array, not a fresh view)
    when the backend keeps activations on a device; `w` itself otherwise."""
    r = residency()
    return w if w is None or r is None else r.constant(w)


def permuted(x, axes):
    """np.ascontiguousarray(x.transpose(axes)); a device array is permuted on the device."""
    if on_device(x):
        return device_of().permute(x, axes)
    return np.ascontiguousarray(x.transpose(axes))
