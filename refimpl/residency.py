"""Host and device arrays: which is which, and NumPy copies of device arrays (duck-typed on numba.cuda's device
arrays, so nothing is imported). The dispatch hands host implementations host arguments with `host_args`; a
model returns NumPy with `to_host`."""
from __future__ import annotations


def on_device(x) -> bool:
    """x is a device array of a backend (numba.cuda's; duck-typed, so nothing is imported)."""
    return hasattr(x, "copy_to_host") and hasattr(x, "shape")


def to_host(x):
    """A device array copied to NumPy; anything else unchanged (what a model returns is NumPy)."""
    return x.copy_to_host() if on_device(x) else x


def _on_host(x):
    if on_device(x):
        return x.copy_to_host()
    if isinstance(x, (list, tuple)) and any(on_device(y) for y in x):
        return type(x)(_on_host(y) for y in x)
    return x


def host_args(args) -> tuple:
    """The arguments with every device array (also inside a list or tuple) copied to NumPy."""
    return tuple(_on_host(a) for a in args)
