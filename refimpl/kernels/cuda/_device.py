"""Host <-> device helpers of the CUDA backend, the upload-once weight cache and launch geometry.

    is_device(x)          a numba device array (real or simulated)
    frozen(x)             a NumPy array that can never change (read-only, and so is everything it views)
    to_device(x, dtype)   NumPy -> device (C-contiguous copy, cast first when dtype is given; a frozen array of
                          f32/f16/i32 from the upload-once cache); device -> itself
    to_host(x)            device -> NumPy; anything else -> np.asarray(x)
    weight(w)             a weight (NumPy array or QTensor) on the device, uploaded once: a DeviceWeight
    grid_1d(n, threads)   (blocks, threads) covering n work items
    SIMULATOR             True when numba.cuda is the simulator (NUMBA_ENABLE_CUDASIM=1)

Memory traffic: `weight` copies a matrix to the device once per host buffer (keyed by the id of the host
array, dropped when that array is freed); so does `to_device` for a frozen array (a model's weights, read-only
from the GGUF mmap or made so at load, and a pass's masks and positions, `models.common.constant`): the
backend owns residency, a model never asks for it. Writable host arrays are uploaded on every call (they may
change between calls); activations stay on the device between ops.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
from numba import cuda

from ...qtensor import QTensor
from ...types import GGMLType, traits

SIMULATOR = bool(getattr(cuda, "simulator", None)) and cuda.is_available() and \
    type(cuda.device_array(1)).__module__.startswith("numba.cuda.simulator")


def is_device(x) -> bool:
    return hasattr(x, "copy_to_host") and hasattr(x, "shape")


def frozen(x) -> bool:
    """x is an ndarray that can never change: it, every array it views and the buffer at the bottom are
    read-only (a GGUF tensor on its read-only mmap, a weight or input made read-only)."""
    if not isinstance(x, np.ndarray):
        return False
    while isinstance(x, np.ndarray):
        if x.flags.writeable:
            return False
        x = x.base
    if x is None:
        return True
    try:
        return memoryview(x).readonly
    except TypeError:
        return False


_CONSTANT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int32))


def to_device(x, dtype=None):
    if is_device(x):
        if dtype is not None and np.dtype(x.dtype) != np.dtype(dtype):
            return cuda.to_device(np.ascontiguousarray(x.copy_to_host(), dtype))
        return x
    a = np.asarray(x)
    if a.dtype in _CONSTANT_DTYPES and (dtype is None or np.dtype(dtype) == a.dtype) and frozen(a):
        return weight(a).data
    return cuda.to_device(np.ascontiguousarray(a, dtype))


def to_host(x) -> np.ndarray:
    return x.copy_to_host() if is_device(x) else np.asarray(x)


def grid_1d(n: int, threads: int = 256) -> tuple[int, int]:
    return max(1, -(-int(n) // threads)), threads


@dataclass(frozen=True)
class DeviceWeight:
    """A weight on the device. type: GGMLType; shape: logical NumPy shape (ne reversed); data: device array,
    f32/f16 values for F32/F16 weights, else the raw ggml bytes of NumPy shape shape[:-1] + (row_bytes,)."""
    type: GGMLType
    shape: tuple
    data: object

    @property
    def row_bytes(self) -> int:
        tr = traits(self.type)
        return self.shape[-1] // tr.blck_size * tr.type_size


_CACHE: dict[int, DeviceWeight] = {}


def _key_of(w) -> np.ndarray:
    return w.data if isinstance(w, QTensor) else w


def weight(w) -> DeviceWeight:
    """w (a 2-D or batched NumPy array of f32/f16, or a QTensor) on the device, uploaded on first use."""
    if isinstance(w, DeviceWeight):
        return w
    host = _key_of(w)
    key = id(host)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    if isinstance(w, QTensor):
        if w.type in (GGMLType.F32, GGMLType.F16):
            vals = np.ascontiguousarray(w.data).view(np.float32 if w.type == GGMLType.F32 else np.float16)
            dw = DeviceWeight(w.type, w.shape, cuda.to_device(vals.reshape(w.shape)))
        else:
            dw = DeviceWeight(w.type, w.shape, cuda.to_device(np.ascontiguousarray(w.data)))
    else:
        a = np.asarray(w)
        if a.dtype == np.float16:
            dw = DeviceWeight(GGMLType.F16, a.shape, cuda.to_device(np.ascontiguousarray(a)))
        elif a.dtype == np.int32:                       # a pass's positions (frozen inputs, `to_device`)
            dw = DeviceWeight(GGMLType.I32, a.shape, cuda.to_device(np.ascontiguousarray(a)))
        else:
            dw = DeviceWeight(GGMLType.F32, a.shape, cuda.to_device(np.ascontiguousarray(a, np.float32)))
    _CACHE[key] = dw
    try:
        weakref.finalize(host, _CACHE.pop, key, None)
    except TypeError:                 # a host object without weak references: kept until clear_weights()
        pass
    return dw


def clear_weights() -> None:
    """Forget every uploaded weight (their device memory is freed when no op holds them)."""
    _CACHE.clear()
