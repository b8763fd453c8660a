"""The codebooks of ggml's IQ formats, read back from ggml itself and stored as data.

    TABLES['iq2xxs']         uint8 (256, 8)   iq2xxs_grid: 8 magnitudes per entry (IQ2_XXS)
    TABLES['iq2xs']          uint8 (512, 8)   iq2xs_grid (IQ2_XS)
    TABLES['iq2s']           uint8 (1024, 8)  iq2s_grid (IQ2_S)
    TABLES['iq3xxs']         uint8 (256, 4)   iq3xxs_grid: 4 magnitudes per entry (IQ3_XXS)
    TABLES['iq3s']           uint8 (512, 4)   iq3s_grid (IQ3_S)
    TABLES['iq1s']           int8  (2048, 8)  iq1s_grid: 8 values in {-1, 0, +1} (IQ1_S, IQ1_M)
    TABLES['ksigns']         uint8 (128,)     ksigns_iq2xs: 7 sign bits -> 8-bit mask of even parity
    TABLES['kvalues_iq4nl']  int8  (16,)      the IQ4_NL / IQ4_XS non-linear levels

In ggml these are the `u64`/`u32` arrays of `src/ggml-common.h`; "entry g, byte j" there is
`TABLES[name][g, j]` here (byte j of the little-endian integer). Bit j of a sign mask negates element j.

Nothing here is typed in or parsed from C source: `scripts/gen_iq_tables.py` runs `probe` against the
live ggml (its dequantizers, fed crafted blocks whose scale is exactly 1) and writes
`refimpl/data/iq_tables.npz`; `tests/quants/test_iq.py` probes again and compares. The arrays are
loaded on first use and are read-only.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Callable

import numpy as np

__all__ = ["TABLES", "TABLE_SPECS", "DATA_PATH", "probe"]

DATA_PATH = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "iq_tables.npz")

# name: (dtype, shape)
TABLE_SPECS: dict[str, tuple[np.dtype, tuple[int, ...]]] = {
    "iq2xxs": (np.dtype(np.uint8), (256, 8)),
    "iq2xs": (np.dtype(np.uint8), (512, 8)),
    "iq2s": (np.dtype(np.uint8), (1024, 8)),
    "iq3xxs": (np.dtype(np.uint8), (256, 4)),
    "iq3s": (np.dtype(np.uint8), (512, 4)),
    "iq1s": (np.dtype(np.int8), (2048, 8)),
    "ksigns": (np.dtype(np.uint8), (128,)),
    "kvalues_iq4nl": (np.dtype(np.int8), (16,)),
}


class _Tables(Mapping):
    """A read-only dict of the tables, loaded from DATA_PATH on first access."""

    def __init__(self, path: str):
        self._path, self._data = path, None

    def _load(self) -> dict[str, np.ndarray]:
        if self._data is None:
            with np.load(self._path) as f:
                data = {}
                for name, (dtype, shape) in TABLE_SPECS.items():
                    a = np.array(f[name])
                    if a.dtype != dtype or a.shape != shape:
                        raise ValueError(f"{self._path}: table {name} is {a.dtype}{a.shape}, expected "
                                         f"{dtype}{shape}; rerun scripts/gen_iq_tables.py")
                    a.setflags(write=False)
                    data[name] = a
            self._data = data
        return self._data

    def __getitem__(self, name: str) -> np.ndarray:
        return self._load()[name]

    def __iter__(self):
        return iter(TABLE_SPECS)

    def __len__(self) -> int:
        return len(TABLE_SPECS)

    def __repr__(self) -> str:
        return f"TABLES({', '.join(TABLE_SPECS)}; from {self._path})"


TABLES: Mapping[str, np.ndarray] = _Tables(DATA_PATH)


# -- probing ggml ---------------------------------------------------------------------------------
# Each probe builds blocks whose effective scale is exactly 1 (so every output is a table entry, or a
# table entry + 1/8 for IQ1_S), with all sign masks 0, and puts a different grid index in every
# sub-group. Block layouts, byte offsets within a block:
#   IQ4_NL   d 0:2 | qs 2:18
#   IQ2_XXS  d 0:2 | qs 2:66, eight u32 pairs (a0 = four index bytes, a1 = 4 x 7 sign bits | scale << 28)
#   IQ2_XS   d 0:2 | qs 2:66, 32 u16 (index & 511 | sign index << 9) | scales 66:74
#   IQ2_S    d 0:2 | qs 2:34 low index bytes | signs 34:66 | qh 66:74 (2 high bits per sub-group) | scales 74:82
#   IQ3_XXS  d 0:2 | index bytes 2:66 | eight u32 (4 x 7 sign bits | scale << 28) 66:98
#   IQ3_S    d 0:2 | qs 2:66 | qh 66:74 (bit 8 of each index) | signs 74:106 | scales 106:110
#   IQ1_S    d 0:2 | qs 2:34 | qh 34:50, eight u16 (3 high bits per sub-group, scale << 12, delta sign << 15)

def _half(v: float) -> np.ndarray:
    return np.frombuffer(np.float16(v).astype("<f2").tobytes(), np.uint8)


def _blocks(n: int, size: int, d: float | None) -> np.ndarray:
    b = np.zeros((n, size), np.uint8)
    if d is not None:
        b[:, 0:2] = _half(d)
    return b


def _as_int(y: np.ndarray, what: str) -> np.ndarray:
    r = np.rint(y)
    if not np.array_equal(r, y):
        raise AssertionError(f"probing {what}: ggml returned non-integer values {y[r != y][:4]}")
    return r.astype(np.int64)


def probe(dequantize: Callable[[str, np.ndarray], np.ndarray]) -> dict[str, np.ndarray]:
    """Read every table out of a live ggml.

    dequantize(type_name, blocks)  blocks (n, type_size) uint8 -> (n, blck_size) float32, i.e. ggml's
                                   `dequantize_row_<type>`; refimpl.testing.ggml provides it (see
                                   scripts/gen_iq_tables.py).
    """
    out: dict[str, np.ndarray] = {}
    sub = np.arange(32)          # sub-group s = 4*g + l of a 256-block: group g = s // 4, l = s % 4
    l = sub % 4

    # kvalues_iq4nl: one IQ4_NL block, d = 1, low nibble of byte j = j.
    b = _blocks(1, 18, 1.0)
    b[0, 2:18] = np.arange(16)
    out["kvalues_iq4nl"] = _as_int(dequantize("iq4_nl", b)[0, :16], "kvalues_iq4nl").astype(np.int8)

    # ksigns: IQ2_XXS, grid index 0 everywhere, scale nibble 0 and d = 8 (db = 8 * 0.5 * 0.25 = 1);
    # sub-group s of block k uses sign index 32k + s. Read the mask from the sign bits of the output.
    b = _blocks(4, 66, 8.0)
    w = b[:, 2:66].copy().view("<u4").reshape(4, 8, 2)
    k = (np.arange(4)[:, None] * 32 + sub[None, :]).reshape(4, 8, 4).astype(np.uint32)
    w[:, :, 1] = (k[:, :, 0] | (k[:, :, 1] << 7) | (k[:, :, 2] << 14) | (k[:, :, 3] << 21))
    b[:, 2:66] = w.reshape(4, 16).view(np.uint8).reshape(4, 64)
    neg = np.signbit(dequantize("iq2_xxs", b)).reshape(128, 8)
    out["ksigns"] = (neg.astype(np.uint32) << np.arange(8)).sum(axis=1).astype(np.uint8)
    if out["ksigns"][0] != 0:
        raise AssertionError("ksigns_iq2xs[0] is not 0: the grid probes below assume sign index 0 is all +")

    def mags(y: np.ndarray, n: int, width: int, what: str) -> np.ndarray:
        y = y.reshape(n, width)
        if np.signbit(y).any():
            raise AssertionError(f"probing {what}: negative output with every sign bit clear")
        return _as_int(y, what).astype(np.uint8)

    # iq2xxs_grid: 8 IQ2_XXS blocks, d = 8, index 32k + s in byte l of a0, a1 = 0.
    b = _blocks(8, 66, 8.0)
    qs = np.zeros((8, 8, 8), np.uint8)
    qs[:, :, 0:4] = (np.arange(8)[:, None] * 32 + sub).reshape(8, 8, 4)
    b[:, 2:66] = qs.reshape(8, 64)
    out["iq2xxs"] = mags(dequantize("iq2_xxs", b), 256, 8, "iq2xxs_grid")

    # iq2xs_grid: 16 IQ2_XS blocks, d = 8, scales 0 (db = 1), u16 s = index 32k + s.
    b = _blocks(16, 74, 8.0)
    b[:, 2:66] = (np.arange(16)[:, None] * 32 + sub).astype("<u2").view(np.uint8).reshape(16, 64)
    out["iq2xs"] = mags(dequantize("iq2_xs", b), 512, 8, "iq2xs_grid")

    # iq2s_grid: 32 IQ2_S blocks, d = 8, scales 0; index 32k + s: low byte in qs[s], bits 8-9 in bits
    # 2l, 2l+1 of qh[g]; explicit sign bytes 0.
    b = _blocks(32, 82, 8.0)
    idx = np.arange(32)[:, None] * 32 + sub
    b[:, 2:34] = idx & 255
    b[:, 66:74] = ((idx >> 8) << (2 * l)).reshape(32, 8, 4).sum(axis=2)
    out["iq2s"] = mags(dequantize("iq2_s", b), 1024, 8, "iq2s_grid")

    # iq3xxs_grid: 4 IQ3_XXS blocks, d = 4 (db = 4 * 0.5 * 0.5 = 1), index bytes 64k + 0..63, words 0.
    b = _blocks(4, 98, 4.0)
    b[:, 2:66] = np.arange(256).reshape(4, 64)
    out["iq3xxs"] = mags(dequantize("iq3_xxs", b), 256, 4, "iq3xxs_grid")

    # iq3s_grid: 8 IQ3_S blocks, d = 1, scale nibbles 0 (db = 1); the 64 indices of block k are
    # 64k + i: low byte in qs[i], bit 8 in bit i % 8 of qh[i // 8]; signs 0.
    b = _blocks(8, 110, 1.0)
    idx = np.arange(8)[:, None] * 64 + np.arange(64)
    b[:, 2:66] = idx & 255
    b[:, 66:74] = ((idx >> 8) << (np.arange(64) % 8)).reshape(8, 8, 8).sum(axis=2)
    out["iq3s"] = mags(dequantize("iq3_s", b), 512, 4, "iq3s_grid")

    # iq1s_grid: 64 IQ1_S blocks, d = 1, scale 0 (dl = 1), delta +1/8; index 32k + s: low byte in
    # qs[s], bits 8-10 in bits 3l..3l+2 of qh[g]. Output = grid value + 0.125, exactly.
    b = _blocks(64, 50, 1.0)
    idx = np.arange(64)[:, None] * 32 + sub
    b[:, 2:34] = idx & 255
    qh = ((idx >> 8) << (3 * l)).reshape(64, 8, 4).sum(axis=2).astype("<u2")
    b[:, 34:50] = qh.view(np.uint8).reshape(64, 16)
    y = dequantize("iq1_s", b).reshape(2048, 8).astype(np.float64) - 0.125
    v = _as_int(y, "iq1s_grid")
    if not np.isin(v, (-1, 0, 1)).all():
        raise AssertionError("probing iq1s_grid: a value outside {-1, 0, 1}")
    out["iq1s"] = v.astype(np.int8)

    for name, (dtype, shape) in TABLE_SPECS.items():
        assert out[name].dtype == dtype and out[name].shape == shape, name
    return out
