"""What the model graphs share: captures of named intermediates, llama.cpp's LLM_NORM, the graph's constant
inputs and the state rows a model writes. A model calls ops only: it never imports a kernel or names a backend
or a device (the CUDA backend keeps activations and state on its device by itself, refimpl.dispatch)."""
from __future__ import annotations

import os
from typing import Callable

import numpy as np

from .. import gguf as _gguf
from ..backends import state_copy  # noqa: F401  (for the models)
from ..residency import to_host  # noqa: F401  (for the models)
from ..errors import LoadError
from ..ops import add, mul, norm, set_rows


def no_capture(name: str, x):
    """The capture callback when nothing is captured: returns x. (`records = False`: a `dispatch.tapping` of it
    changes nothing, so fusions keep their one-pass kernels.)"""
    return x


no_capture.records = False


def recorded_as(cap, shape: tuple) -> Callable[[str, np.ndarray], np.ndarray]:
    """cap recording each tensor reshaped to `shape` (a layer's rows of all sequences, (n_seq * n_tokens, n),
    as llama.cpp's (n_seq, n_tokens, n): shape (n_seq, n_tokens, -1)), returning the tensor as it came; cap
    itself when it records nothing."""
    if getattr(cap, "records", True) is False:
        return cap

    def rec(name, x):
        cap(name, x.reshape(shape))
        return x
    return rec


def capture_fn(capture) -> Callable[[str, np.ndarray], np.ndarray]:
    """A `cap(name, array) -> array` callback from `capture` (None, a dict, or a callable): it records the array
    (device arrays reach `capture` as NumPy copies) and returns it unchanged, so that a model names a tensor
    where it makes it: `q = cap(f"Qcur-{il}", rope(q))`."""
    if capture is None:
        return no_capture

    def cap(name, x):
        if callable(capture):
            capture(name, to_host(x))
        else:
            capture[name] = np.array(to_host(x), copy=True)
        return x
    return cap


def getter(kv: dict, prefix: str, where: str, error: Callable[[str], Exception] = ValueError,
           source: str = "GGUF metadata"):
    """g(key, *default): kv[prefix + key]; else the default when one is given; else `error(message)` naming
    `where` (the file), the full key and what it is missing from -- each model family's hyper-parameter
    reader (GGUF metadata under `{arch}.`, a Hugging Face config.json with no prefix)."""
    def g(key: str, *default):
        full = prefix + key
        if full in kv:
            return kv[full]
        if default:
            return default[0]
        raise error(f"{where}: {source} is missing {full!r}")
    return g


def layer_norm(x, w, b, eps: float):
    """llama.cpp's build_norm(LLM_NORM): ggml_norm over the rows, then mul by the weight and add the bias."""
    return add(mul(norm(x, eps), w), b)


# -- inputs and state --------------------------------------------------------------------------------------

def constant(a: np.ndarray) -> np.ndarray:
    """a, made read-only: an input of the graph (a mask, the positions) that no op may change during the
    pass. A backend may then keep one copy of it for the pass, as it does for weights."""
    a.flags.writeable = False
    return a


def write_rows(dst, rows, first: int) -> None:
    """dst[first:first + n] = rows, in place, as llama.cpp writes its KV cache: ggml_set_rows into dst (a
    contiguous state buffer from `state_copy`, rows of dst.shape[1:]) at indices first .. first+n-1."""
    n = rows.shape[0] if rows.ndim == dst.ndim else 1
    d = dst.reshape(dst.shape[0], -1)
    set_rows(d, rows.reshape(n, d.shape[1]), np.arange(first, first + n, dtype=np.int32), out=d)


def memory_limit() -> int:
    """Bytes one allocation sized from a request may take: REFIMPL_MAX_MEMORY (bytes, or with a K/M/G/T suffix),
    else the machine's physical memory (a request beyond it can only fail, slowly, or swap)."""
    v = os.environ.get("REFIMPL_MAX_MEMORY", "").strip()
    if v:
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(v[-1].upper(), 1)
        try:
            return int(float(v[:-1] if mult > 1 else v) * mult)
        except ValueError:
            raise ValueError(f"REFIMPL_MAX_MEMORY={v!r}: expected bytes, e.g. 8G") from None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def check_alloc(nbytes: int, what: str) -> None:
    """ValueError saying what needs how much, when nbytes exceeds memory_limit()."""
    limit = memory_limit()
    if nbytes > limit:
        raise ValueError(f"{what} needs {nbytes / 2**30:.1f} GiB, more than the {limit / 2**30:.1f} GiB limit "
                         f"(the machine's memory, or REFIMPL_MAX_MEMORY)")


def load_checked(path, build: Callable, *args):
    """build(f, *args) on the GGUFFile of `path` (a path or a loaded GGUFFile): every ValueError its checks
    raise becomes a refimpl.LoadError naming the file (the checks name the key or tensor and the shapes)."""
    f = path if isinstance(path, _gguf.GGUFFile) else _gguf.load(path)
    try:
        return build(f, *args)
    except LoadError:
        raise
    except ValueError as e:
        msg = str(e) if str(f.path) in str(e) else f"{f.path}: {e}"
        raise LoadError(msg, f.path) from e
