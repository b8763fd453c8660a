"""Write refimpl/data/iq_tables.npz: ggml's IQ codebooks, read out of the live ggml binary.

    python scripts/gen_iq_tables.py [--check]

Needs ggml-python==0.0.45 (the pinned oracle, `refimpl.testing.ggml`). Every table is recovered by
feeding ggml's own dequantizers crafted blocks (scale exactly 1, all signs +, one grid index per
sub-group; see `refimpl.quants.iq_tables.probe`), never parsed from C source. With --check the stored
file is compared with a fresh probe instead of being written (exit status 1 on a difference).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from refimpl.qtensor import QTensor  # noqa: E402
from refimpl.quants.iq_tables import DATA_PATH, TABLE_SPECS, probe  # noqa: E402
from refimpl.testing import ggml  # noqa: E402
from refimpl.types import traits  # noqa: E402


def ggml_dequantize(type_name: str, blocks: np.ndarray) -> np.ndarray:
    """(n, type_size) uint8 -> (n, blck_size) f32 through ggml's dequantize_row_<type>."""
    tr = traits(type_name)
    qt = QTensor(tr.type, np.ascontiguousarray(blocks).reshape(1, -1), (1, blocks.shape[0] * tr.blck_size))
    return ggml.dequantize(qt).reshape(blocks.shape[0], tr.blck_size)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare the stored tables with ggml, write nothing")
    ap.add_argument("--out", default=DATA_PATH)
    args = ap.parse_args()

    tables = probe(ggml_dequantize)
    if args.check:
        with np.load(args.out) as f:
            bad = [n for n in TABLE_SPECS if n not in f or not np.array_equal(f[n], tables[n])
                   or f[n].dtype != tables[n].dtype]
        for n in bad:
            print(f"{n}: stored table differs from ggml's")
        print("ok" if not bad else f"{len(bad)} table(s) differ")
        return 1 if bad else 0

    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    np.savez_compressed(args.out, **tables)
    for n, a in tables.items():
        print(f"{n:14s} {a.dtype}{a.shape}")
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes) from {ggml.PROFILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
