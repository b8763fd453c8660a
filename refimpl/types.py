"""ggml tensor types and their traits.

`GGMLType` is ggml's `enum ggml_type` (ggml 0.25.3's `ggml.h`: the 0.15.3 types plus Q2_0), an IntEnum with
the same names and numbers as the `gguf` package's `GGMLQuantizationType`, which it equals member for member
(`GGMLType.Q4_0 == GGMLQuantizationType.Q4_0`), so either works as a dict key or a type argument. refimpl
keeps its own because gguf-py lags ggml (gguf 0.19.0 has no Q2_0); a test checks both against `ggml.h`.
The traits (elements per block, bytes per block) are ggml's own, from its type-traits table in
`src/ggml.c`; the `gguf` package's size table disagrees with ggml for Q8_1 (it says 40 bytes, ggml's
`block_q8_1` is 36: d and s as two f16, then 32 int8), so refimpl keeps its own table and tests it
against `ggml_blck_size` / `ggml_type_size` of the pinned ggml for every type.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np


class GGMLType(IntEnum):
    """ggml's enum ggml_type (ggml 0.25.3; gaps are types ggml removed)."""
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41
    Q2_0 = 42        # ggml 0.25.3

__all__ = ["GGMLType", "TypeTraits", "traits", "type_traits", "as_type", "row_bytes", "NUMPY_DTYPES"]


@dataclass(frozen=True)
class TypeTraits:
    type: GGMLType
    name: str            # ggml's type name (`ggml_type_name`), e.g. "q4_0"
    blck_size: int       # elements per block
    type_size: int       # bytes per block
    is_quantized: bool

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.type_size / self.blck_size


# type: (ggml name, blck_size, type_size, is_quantized) -- ggml 0.15.3's src/ggml.c type_traits, plus Q2_0 (0.25.3)
_TABLE = {
    GGMLType.F32: ("f32", 1, 4, False),
    GGMLType.F16: ("f16", 1, 2, False),
    GGMLType.Q4_0: ("q4_0", 32, 18, True),
    GGMLType.Q4_1: ("q4_1", 32, 20, True),
    GGMLType.Q5_0: ("q5_0", 32, 22, True),
    GGMLType.Q5_1: ("q5_1", 32, 24, True),
    GGMLType.Q8_0: ("q8_0", 32, 34, True),
    GGMLType.Q8_1: ("q8_1", 32, 36, True),
    GGMLType.Q2_K: ("q2_K", 256, 84, True),
    GGMLType.Q3_K: ("q3_K", 256, 110, True),
    GGMLType.Q4_K: ("q4_K", 256, 144, True),
    GGMLType.Q5_K: ("q5_K", 256, 176, True),
    GGMLType.Q6_K: ("q6_K", 256, 210, True),
    GGMLType.Q8_K: ("q8_K", 256, 292, True),
    GGMLType.IQ2_XXS: ("iq2_xxs", 256, 66, True),
    GGMLType.IQ2_XS: ("iq2_xs", 256, 74, True),
    GGMLType.IQ3_XXS: ("iq3_xxs", 256, 98, True),
    GGMLType.IQ1_S: ("iq1_s", 256, 50, True),
    GGMLType.IQ4_NL: ("iq4_nl", 32, 18, True),
    GGMLType.IQ3_S: ("iq3_s", 256, 110, True),
    GGMLType.IQ2_S: ("iq2_s", 256, 82, True),
    GGMLType.IQ4_XS: ("iq4_xs", 256, 136, True),
    GGMLType.I8: ("i8", 1, 1, False),
    GGMLType.I16: ("i16", 1, 2, False),
    GGMLType.I32: ("i32", 1, 4, False),
    GGMLType.I64: ("i64", 1, 8, False),
    GGMLType.F64: ("f64", 1, 8, False),
    GGMLType.IQ1_M: ("iq1_m", 256, 56, True),
    GGMLType.BF16: ("bf16", 1, 2, False),
    GGMLType.TQ1_0: ("tq1_0", 256, 54, True),
    GGMLType.TQ2_0: ("tq2_0", 256, 66, True),
    GGMLType.MXFP4: ("mxfp4", 32, 17, True),
    GGMLType.NVFP4: ("nvfp4", 64, 36, True),
    GGMLType.Q1_0: ("q1_0", 128, 18, True),
    GGMLType.Q2_0: ("q2_0", 64, 18, True),        # ggml 0.25.3
}

type_traits: dict[GGMLType, TypeTraits] = {
    t: TypeTraits(t, name, blck, size, q) for t, (name, blck, size, q) in _TABLE.items()
}
_BY_NAME = {tr.name.lower(): tr.type for tr in type_traits.values()}

# Types held as plain ndarrays (everything else, BF16 included, is a QTensor).
NUMPY_DTYPES: dict[GGMLType, np.dtype] = {
    GGMLType.F32: np.dtype(np.float32), GGMLType.F16: np.dtype(np.float16),
    GGMLType.F64: np.dtype(np.float64), GGMLType.I8: np.dtype(np.int8),
    GGMLType.I16: np.dtype(np.int16), GGMLType.I32: np.dtype(np.int32),
    GGMLType.I64: np.dtype(np.int64),
}


_BY_DTYPE = {d: t for t, d in NUMPY_DTYPES.items()}


def type_name(x) -> str:
    """ggml's type name ("f32", "q4_0", "bf16", ...) of a GGMLType (or its number or name), a QTensor, or an array
    (its dtype's ggml type; the NumPy name for a dtype ggml has none for)."""
    tr = getattr(x, "traits", None)
    if isinstance(tr, TypeTraits):                     # a QTensor (not imported: qtensor is above)
        return tr.name
    if isinstance(x, (GGMLType, int, str)) and not isinstance(x, (bool, np.generic)):
        return traits(x).name
    dt = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
    t = _BY_DTYPE.get(np.dtype(dt))
    return type_traits[t].name if t is not None else np.dtype(dt).name


def as_type(t) -> GGMLType:
    """GGMLType from a GGMLType, its number, or its name in any case ("q4_0", "Q4_K", "bf16")."""
    if isinstance(t, GGMLType):
        return t
    if isinstance(t, str):
        try:
            return _BY_NAME[t.lower()]
        except KeyError:
            raise ValueError(f"unknown ggml type name {t!r}; known: {sorted(_BY_NAME)}") from None
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
        raise ValueError(f"ggml type {t!r} ({type(t).__name__}): expected a GGMLType, its number or its name")
    try:
        return GGMLType(int(t))
    except ValueError:
        raise ValueError(f"unknown ggml type id {t!r}") from None


def traits(t) -> TypeTraits:
    t = as_type(t)
    try:
        return type_traits[t]
    except KeyError:
        raise ValueError(f"ggml type {t.name} ({int(t)}) has no traits in ggml 0.25.3") from None


def row_bytes(t, n: int) -> int:
    """Bytes of one row of `n` elements (`ggml_row_size`); `n` must be a multiple of the block size."""
    tr = traits(t)
    if n % tr.blck_size:
        raise ValueError(f"row of {n} elements is not a multiple of {tr.name}'s block size {tr.blck_size}")
    return n // tr.blck_size * tr.type_size
