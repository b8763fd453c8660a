"""Dequantize and quantize throughput per ggml type: refimpl (NumPy), gguf-py (NumPy), ggml (C).

    python -m benchmarks.quants [--mib 4] [--repeat 5] [--types q4_0,q4_K]

All three run in this one process on the same data (Gaussian rows, 4096 per row); the table gives
million elements per second (best of --repeat) and refimpl's ratio to each. ggml is called single-threaded
through ggml-python (dequantize_row_* / ggml_quantize_chunk). Record results in docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

import refimpl
from refimpl.quants import DEQUANTIZERS, QUANTIZERS
from refimpl.types import type_traits


def best(fn, repeat):
    t = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return min(t)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--elems", type=int, default=1 << 20, help="elements per measurement (default 1Mi)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--types", default="")
    a = ap.parse_args(argv)
    try:
        import gguf.quants as gq
    except ImportError:
        gq = None
    try:
        from refimpl.testing import ggml
        ggml.check_profile()
    except Exception:
        ggml = None
    want = {refimpl.as_type(t) for t in a.types.split(",") if t}
    types = [t for t in type_traits if type_traits[t].is_quantized or t.name == "BF16"]
    types = [t for t in types if not want or t in want]
    n_row = 4096
    rows = max(1, a.elems // n_row)
    x = np.random.default_rng(0).standard_normal((rows, n_row)).astype(np.float32)
    me = x.size / 1e6
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, numpy {np.__version__}, "
          f"{x.size} elements, best of {a.repeat}; Melem/s")
    print(f"| type | deq refimpl | deq gguf-py | deq ggml C | refimpl/gguf-py | refimpl/ggml | "
          f"q refimpl | q gguf-py | q ggml C | refimpl/gguf-py | refimpl/ggml |")
    print("|---|" + "---:|" * 10)
    for t in types:
        tr = type_traits[t]
        row = [tr.name]
        can_q = (t, "ref") in QUANTIZERS or (t, "chunk") in QUANTIZERS
        try:
            qt = refimpl.quantize(x, t) if can_q else (ggml.quantize(x, t) if ggml and not ggml.requires_imatrix(t) else None)
        except ValueError:
            qt = None
        if qt is None:  # types ggml only quantizes with an imatrix: time dequantize on random bytes
            raw = np.random.default_rng(1).integers(0, 256, (rows, n_row // tr.blck_size * tr.type_size), dtype=np.uint8)
            qt = refimpl.QTensor(t, raw, x.shape)
        gtype = getattr(gq, "_type_traits", {}).get(t) if gq else None
        d_r = me / best(lambda: refimpl.dequantize(qt), a.repeat) if t in DEQUANTIZERS else None
        d_g = me / best(lambda: gq.dequantize(qt.data, t), a.repeat) if gtype and "dequantize_blocks" in gtype.__dict__ else None
        d_c = me / best(lambda: ggml.dequantize(qt), a.repeat) if ggml else None
        q_r = me / best(lambda: refimpl.quantize(x, t), a.repeat) if can_q else None
        q_g = me / best(lambda: gq.quantize(x, t), a.repeat) if gtype and "quantize_blocks" in gtype.__dict__ else None
        try:
            q_c = me / best(lambda: ggml.quantize(x, t), a.repeat) if ggml and tr.is_quantized else None
        except ValueError:
            q_c = None
        f = lambda v: f"{v:,.0f}" if v is not None else "—"
        r = lambda u, v: f"{u / v:.2f}×" if u is not None and v is not None else "—"
        row += [f(d_r), f(d_g), f(d_c), r(d_r, d_g), r(d_r, d_c), f(q_r), f(q_g), f(q_c), r(q_r, q_g), r(q_r, q_c)]
        print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
