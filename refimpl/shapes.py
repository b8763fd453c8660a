"""Shape checks and ggml's three broadcasting disciplines, with errors that give both shape orders."""
from __future__ import annotations

import numpy as np



def fmt(x) -> str:
    """'ne [4, 3] (numpy (3, 4)) f32' for an array, QTensor or shape tuple."""
    if isinstance(x, tuple):
        return f"ne {list(x[::-1])} (numpy {x})"
    if hasattr(x, "ne") and hasattr(x, "traits"):      # a QTensor (not imported: qtensor is above)
        return f"ne {x.ne} (numpy {x.shape}) {x.traits.name}"
    x = np.asarray(x)
    return f"ne {list(x.shape[::-1])} (numpy {x.shape}) {x.dtype}"


class GGMLShapeError(ValueError):
    """A shape ggml rejects: names the op and gives each operand in ggml and NumPy order."""


def fail(op: str, why: str, **operands) -> None:
    parts = "; ".join(f"{k}: {fmt(v)}" for k, v in operands.items())
    raise GGMLShapeError(f"{op}: {why} ({parts})")


def ne4(shape) -> list[int]:
    """ggml's four extents of a NumPy shape."""
    if len(shape) > 4:
        raise GGMLShapeError(f"ggml tensors have at most 4 dims, got ne {list(shape)[::-1]} (numpy {tuple(shape)})")
    return list(shape[::-1]) + [1] * (4 - len(shape))


def as4(x: np.ndarray) -> np.ndarray:
    """View x as 4-D NumPy (n3, n2, n1, n0)."""
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def tile_to(op: str, a, b) -> np.ndarray:
    """b repeated (np.tile) to a's shape: ggml's binary-op broadcast, where every dim of a must be a
    multiple of b's -- not NumPy broadcasting, which only stretches size-1 axes."""
    na, nb = ne4(np.shape(a)), ne4(np.shape(b))
    if any(y == 0 or x % y for x, y in zip(na, nb)):
        fail(op, "src1 must repeat to src0's shape (every ne of a a multiple of b's)", a=a, b=b)
    b4 = as4(np.asarray(b))
    reps = [x // y for x, y in zip(na[::-1], nb[::-1])]
    out = np.tile(b4, reps) if any(r != 1 for r in reps) else b4
    return out.reshape(np.shape(a)) if np.ndim(a) >= np.ndim(b) else out.reshape(np.shape(a))


def nonempty(op: str, **operands) -> None:
    """Reject zero-size operands (an axis of extent 0) where the op has no defined result for them."""
    if any(np.shape(v) and 0 in np.shape(v) for v in operands.values()):
        fail(op, "empty tensors (an axis of extent 0) are not supported", **operands)


def same_f32_rows(name: str, same: str | None = None, **arrays) -> None:
    """Fail (naming op `name`) unless every array is f32 with contiguous rows (ggml asserts nb0 == 4) and all
    have the first one's ggml shape; `same` is the sentence for a shape mismatch."""
    first = None
    for k, x in arrays.items():
        if x.dtype != np.float32:
            fail(name, f"{k} must be f32, got {x.dtype}", **arrays)
        if x.size and x.shape[-1] > 1 and x.strides[-1] != x.itemsize:
            fail(name, f"rows of {k} must be contiguous (ggml asserts nb0 == 4)", **arrays)
        if first is not None and ne4(x.shape) != ne4(arrays[first].shape):
            fail(name, same or f"{k} must have {first}'s shape", **arrays)
        first = first or k


def need_f32(name: str, **operands) -> None:
    """Fail (naming op `name`) unless every operand given (None: absent, skipped) is f32."""
    given = {k: x for k, x in operands.items() if x is not None}
    for k, x in given.items():
        if np.asarray(x).dtype != np.float32:
            fail(name, f"{k} must be f32, got {np.asarray(x).dtype}", **given)
