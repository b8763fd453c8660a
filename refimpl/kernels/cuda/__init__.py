"""numba.cuda kernels: refimpl's "cuda" backend. Imported only when `refimpl.backend("cuda")` runs an op.

One module per op family, each saying in its header its launch geometry and memory traffic:

    _device.py     host <-> device helpers, the upload-once weight cache, launch geometry
    quants.py      dequantize every block format (one thread per block)
    matmul.py      mul_mat with F32/F16/BF16/quantized weights (dequantized in registers)
    norm.py        rms_norm, norm
    softmax.py     soft_max_ext
    rope.py        rope_ext
    rows.py        get_rows
    unary.py       element-wise, unary and glu ops of the model hot paths
    attention.py   flash_attn_ext (online softmax)
    recurrent.py   rwkv_wkv6, rwkv_wkv7
    movement.py    cont/dup/permute/cast copies, concat, repeat, set_rows (the KV-cache and state writes)
    fused.py       the fused ops (refimpl.ops.fused) as their op sequences on the device

Conventions every kernel module follows:
- A kernel registers itself for the op it replaces (`register(name, "cuda")`) with the op's signature. Its
  inputs may be NumPy arrays, QTensors or device arrays (`_device.is_device`); its result is a device array
  (numba DeviceNDArray, or the simulator's), so a model's activations stay on the GPU between ops. Weights and
  other read-only inputs are uploaded once (`_device.weight`, `_device.to_device`), keyed by their host
  buffer: the backend owns residency, and a model calls ops only.
- Inputs a kernel does not cover (dtypes, strides, modes) run the NumPy reference on host copies and the result
  is uploaded: never a wrong answer, only a slow one.
- Results equal the NumPy reference within the tolerance table (`refimpl.testing.tolerance`); where the
  operation order is the same (dequantize, data movement), bit for bit.
- Tests run every kernel in numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1, set by tests/cuda/conftest.py
  before Numba is imported), so they run on machines without a GPU; `benchmarks/cuda_check.py` runs the same
  checks at real sizes on a GPU and times them.
"""
from __future__ import annotations

_FAMILIES = ("quants", "matmul", "norm", "softmax", "rope", "rows", "unary", "attention", "recurrent",
             "movement", "fused")


def load() -> None:
    """Import every CUDA kernel module (they register themselves). Raises ImportError when numba.cuda has
    neither a GPU nor the simulator, naming what failed."""
    import importlib
    from numba import cuda
    if not cuda.is_available():
        raise ImportError("numba.cuda finds no GPU (set NUMBA_ENABLE_CUDASIM=1 to use the simulator)")
    failed = []
    for name in _FAMILIES:
        try:
            importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":      # a family not written yet is skipped; a broken one is not
                failed.append(f"{name}: {e}")
        except ImportError as e:
            failed.append(f"{name}: {e}")
    if failed:
        raise ImportError("; ".join(failed))
    from ...backends import register_state_copy
    from .movement import state_copy
    register_state_copy("cuda", state_copy)
