"""The CUDA backend's device residency, as refimpl.dispatch.residency() hands it to a model: host <-> device
moves, the upload-once cache of model constants, and the copies a model makes between ops (permuted heads,
KV-cache and state writes), each a CUDA kernel of movement.py."""
from __future__ import annotations

from . import _device
from .movement import assign, broadcast, cast, clone, pad_rows, permute  # noqa: F401


def upload(x):
    """A host array on the device (per call: masks, positions, a fresh state; never a weight)."""
    return _device.to_device(x)


def constant(w):
    """A weight used as an element-wise operand (a norm gain, a bias) from the upload-once cache, keyed by the
    host array (so `w` must be the model's own array, not a fresh view)."""
    return _device.weight(w).data
