"""Dequantize and quantize throughput per ggml type: refimpl (NumPy), gguf-py (NumPy), ggml (C).

    python -m benchmarks.quants [--elems N] [--repeat 7] [--types q4_0,q4_K] [--wall]

All three run in this one process on the same data (Gaussian rows, 4096 per row); the table gives
million elements per second and refimpl's ratio to each. ggml is called single-threaded through
ggml-python (dequantize_row_* / ggml_quantize_chunk).

Timing is *CPU time* of this process (`time.process_time()`) per call, best of --repeat: on a shared
machine wall-clock time counts the other processes' load, CPU time (nearly) does not. The measurements
of one type are interleaved -- round r runs refimpl, gguf-py and ggml once each (dequantize and
quantize in separate rounds, alternating the order) before round r+1 -- so whatever load remains falls
on all three alike. --wall adds the wall-clock numbers (best of --repeat too) as a second table.
Record results in docs/benchmarks.md.
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


def measure(fns: dict, repeat: int) -> tuple[dict, dict]:
    """Best CPU and wall time of each function in fns over `repeat` rounds (after one warm-up call).

    Each round calls every function once, in turn -- in reverse order on odd rounds, so that none
    always runs right after the same neighbour -- so that load from outside falls on all alike.
    A function that raises ValueError on the warm-up (ggml has no such entry point) is left out.
    """
    for k, fn in list(fns.items()):
        try:
            fn()
        except ValueError:
            del fns[k]
    cpu = {k: float("inf") for k in fns}
    wall = dict(cpu)
    for r in range(repeat):
        for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            w0, c0 = time.perf_counter(), time.process_time()
            fns[k]()
            c1, w1 = time.process_time(), time.perf_counter()
            cpu[k], wall[k] = min(cpu[k], c1 - c0), min(wall[k], w1 - w0)
    return cpu, wall


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--elems", type=int, default=1 << 20, help="elements per measurement (default 1Mi)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--types", default="")
    ap.add_argument("--wall", action="store_true", help="also print the wall-clock table")
    a = ap.parse_args(argv)
    try:
        import gguf.quants as gq
    except ImportError:
        gq = None
    try:
        from refimpl.testing import ggml
        ggml.check_profile()
    except Exception:  # noqa: BLE001 -- no oracle build: ggml's columns are left out
        ggml = None
    want = {refimpl.as_type(t) for t in a.types.split(",") if t}
    types = [t for t in type_traits if type_traits[t].is_quantized or t.name == "BF16"]
    types = [t for t in types if not want or t in want]
    n_row = 4096
    rows = max(1, a.elems // n_row)
    x = np.random.default_rng(0).standard_normal((rows, n_row)).astype(np.float32)
    me = x.size / 1e6
    head = ("| type | deq refimpl | deq gguf-py | deq ggml C | refimpl/gguf-py | refimpl/ggml | "
            "q refimpl | q gguf-py | q ggml C | refimpl/gguf-py | refimpl/ggml |\n|---|" + "---:|" * 10)
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, numpy {np.__version__}, "
          f"{x.size} elements, best of {a.repeat}; Melem/s of CPU time (process_time)")
    print(head)
    wall_rows = []
    for t in types:
        tr = type_traits[t]
        can_q = (t, "ref") in QUANTIZERS or (t, "chunk") in QUANTIZERS
        try:
            by_ggml = ggml and not ggml.requires_imatrix(t)
            qt = refimpl.quantize(x, t) if can_q else (ggml.quantize(x, t) if by_ggml else None)
        except ValueError:
            qt = None
        if qt is None:  # types ggml only quantizes with an imatrix: time dequantize on random bytes
            raw = np.random.default_rng(1).integers(0, 256, (rows, n_row // tr.blck_size * tr.type_size),
                                                    dtype=np.uint8)
            qt = refimpl.QTensor(t, raw, x.shape)
        gtype = getattr(gq, "_type_traits", {}).get(t) if gq else None
        fns = {}
        if t in DEQUANTIZERS:
            fns["d_r"] = lambda: refimpl.dequantize(qt)
        if gtype and "dequantize_blocks" in gtype.__dict__:
            fns["d_g"] = lambda: gq.dequantize(qt.data, t)
        if ggml:
            fns["d_c"] = lambda: ggml.dequantize(qt)
        if can_q:
            fns["q_r"] = lambda: refimpl.quantize(x, t)
        if gtype and "quantize_blocks" in gtype.__dict__:
            fns["q_g"] = lambda: gq.quantize(x, t)
        if ggml and tr.is_quantized:
            fns["q_c"] = lambda: ggml.quantize(x, t)
        # dequantizers and quantizers in separate rounds: a quantizer's large temporaries must not
        # change the heap state one dequantizer meets and the other does not
        cpu, wall = measure({k: f for k, f in fns.items() if k[0] == "d"}, a.repeat)
        cq, wq = measure({k: f for k, f in fns.items() if k[0] == "q"}, a.repeat)
        cpu.update(cq)
        wall.update(wq)
        f = lambda v: f"{v:,.0f}" if v is not None else "—"
        r = lambda u, v: f"{u / v:.2f}×" if u is not None and v is not None else "—"

        def row(tm):
            v = {k: me / s for k, s in tm.items()}
            g = v.get
            return ("| " + " | ".join([tr.name, f(g("d_r")), f(g("d_g")), f(g("d_c")), r(g("d_r"), g("d_g")),
                                       r(g("d_r"), g("d_c")), f(g("q_r")), f(g("q_g")), f(g("q_c")),
                                       r(g("q_r"), g("q_g")), r(g("q_r"), g("q_c"))]) + " |")
        print(row(cpu), flush=True)
        wall_rows.append(row(wall))
    if a.wall:
        print(f"\n# the same runs, wall-clock time (perf_counter)\n{head}")
        print("\n".join(wall_rows))


if __name__ == "__main__":
    main()
