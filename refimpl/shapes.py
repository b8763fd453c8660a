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


# -- ggml's layout predicates, ggml's way (ne and nb), for an ndarray, a QTensor or a device array ---------

def ne_nb(x) -> tuple[list[int], list[int], int]:
    """ggml's ne, nb and type size of an ndarray, a QTensor or a device array; size-1 dims get the packed
    stride (ggml ignores their stride, and NumPy's is arbitrary)."""
    tr = getattr(x, "traits", None)
    if tr is not None and hasattr(x, "data"):            # a QTensor (not imported: qtensor is above)
        ts, blck, nb0, lead = tr.type_size, tr.blck_size, tr.type_size, x.data.strides[:-1]
    else:
        if not hasattr(x, "strides"):
            x = np.asarray(x)
        ts, blck = x.dtype.itemsize, 1
        nb0, lead = (x.strides[-1] if len(x.shape) else ts), tuple(x.strides[:-1])
    ne = ne4(tuple(x.shape))
    nb = [nb0] + list(lead[::-1]) + [0] * (3 - len(lead))
    nb[0] = ts if ne[0] == 1 else nb[0]
    for i in range(1, 4):
        if ne[i] == 1:
            nb[i] = nb[i - 1] * (ne[0] // blck if i == 1 else ne[i - 1])
    return ne, nb, ts


def rows_packed(x) -> bool:
    """ggml_is_contiguous_rows: nb0 == type size, a row's elements adjacent (a QTensor's always are; an empty
    tensor's rows are taken as packed)."""
    if type(x) is np.ndarray:       # the same answer from NumPy's own attributes, ~30x cheaper (ops call it per call)
        return x.ndim == 0 or x.size == 0 or x.shape[-1] <= 1 or x.strides[-1] == x.itemsize
    ne, nb, ts = ne_nb(x)
    return nb[0] == ts or 0 in ne


def is_contiguous(x) -> bool:
    """ggml_is_contiguous: every dim packed over the one below it (size-1 dims' strides ignored; an empty
    tensor is taken as contiguous, as NumPy does)."""
    if type(x) is np.ndarray:       # NumPy's flag ignores size-1 dims' strides, as ggml does: the same answer
        return bool(x.flags.c_contiguous)
    ne, nb, ts = ne_nb(x)
    if 0 in ne:
        return True
    blck = x.traits.blck_size if hasattr(x, "traits") and hasattr(x, "data") else 1
    return nb[0] == ts and nb[1] == ts * (ne[0] // blck) and nb[2] == nb[1] * ne[1] and nb[3] == nb[2] * ne[2]


def is_contiguous_1(x) -> bool:
    """ggml_is_contiguous_1 (= ggml_is_padded_1d): rows packed, dims 2 and 3 packed over dim 1, whose stride
    is free (rows may be padded)."""
    if type(x) is np.ndarray and x.ndim <= 2:   # dims 2, 3 are 1, packed by definition: only nb0 counts
        return x.ndim == 0 or x.shape[-1] == 1 or x.strides[-1] == x.itemsize
    ne, nb, ts = ne_nb(x)
    return nb[0] == ts and nb[2] == nb[1] * ne[1] and nb[3] == nb[2] * ne[2]


def is_transposed(x) -> bool:
    """ggml_is_transposed: nb0 > nb1 (for a tensor with more than one element along both)."""
    if hasattr(x, "traits") or len(getattr(x, "shape", ())) < 2:
        return False
    if type(x) is np.ndarray:       # the same answer from NumPy's strides
        return x.size > 0 and x.shape[-1] > 1 and x.shape[-2] > 1 and x.strides[-1] > x.strides[-2]
    ne, nb, _ = ne_nb(x)
    return ne[0] > 1 and ne[1] > 1 and 0 not in ne and nb[0] > nb[1]


def check_layout(name: str, layout: str, **operands) -> None:
    """Fail naming op `name` and the operand unless each has the layout ggml asserts: "rows" (rows packed),
    "contiguous_1" or "contiguous"."""
    check, why = {"rows": (rows_packed, "rows must be contiguous (ggml asserts nb0 == type size)"),
                  "contiguous_1": (is_contiguous_1, "must have contiguous rows and dims 2, 3 packed over dim 1 "
                                                  "(ggml_is_contiguous_1)"),
                  "contiguous": (is_contiguous, "must be contiguous (ggml_is_contiguous)")}[layout]
    for k, x in operands.items():
        if not check(x):
            fail(name, f"{k} {why}", **{k: x})


def as4(x: np.ndarray) -> np.ndarray:
    """View x as 4-D NumPy (n3, n2, n1, n0)."""
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def check_tiles(op: str, a, b) -> None:
    """Fail (naming op `op`) unless b repeats to a's shape: every ne of a a multiple of b's."""
    na, nb = ne4(np.shape(a)), ne4(np.shape(b))
    if any(y == 0 or x % y for x, y in zip(na, nb)):
        fail(op, "src1 must repeat to src0's shape (every ne of a a multiple of b's)", a=a, b=b)


def tile_to(a, b) -> np.ndarray:
    """b tiled to a's shape (checked by `check_tiles`): ggml's binary-op broadcast, where every dim of a is a
    multiple of b's -- np.tile, not NumPy broadcasting, which only stretches size-1 axes. Where b repeats only
    along its size-1 dims the two are the same: b is returned as it is, and broadcasts to a's shape."""
    b = np.asarray(b)
    sa, sb = np.shape(a), b.shape
    if len(sb) <= len(sa):
        for m, n in zip(sb, sa[len(sa) - len(sb):]):
            if m != n and m != 1:
                break
        else:
            return b
    if 0 in sa:                           # nothing to tile into (np.tile would still walk the repeats)
        return np.empty(sa, b.dtype)
    na, nb = ne4(sa), ne4(sb)
    reps = [x // y for x, y in zip(na[::-1], nb[::-1])]
    return np.tile(as4(b), reps).reshape(sa)


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
