"""Load time and resident-memory cost of refimpl.gguf.load vs gguf.GGUFReader on the SmolLM2 file.

    python benchmarks/gguf_load.py [FILE.gguf] [--repeat N]

Each measurement runs in a fresh interpreter (imports done first, so only the load itself is counted):
RSS delta is the growth of the resident set (/proc/self/statm) across the load, which includes the
pages of the file the parse touches and every Python object built. Reported: best time, median RSS.
  refimpl          refimpl.gguf.load(path): metadata fully decoded, tensors wrapped (views, no copy)
  gguf             gguf.GGUFReader(path): fields and tensors indexed, values not yet converted
  gguf+contents    GGUFReader plus field.contents() for every key: the same Python metadata refimpl gives
Goal (tests/test_gguf.py's companion): refimpl under 1 s (aim < 0.5 s) and under 50 MB.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(kind: str, path: str) -> dict:
    import gc
    import gguf
    import refimpl.gguf as rg
    gc.collect()
    r0 = rss_bytes()
    t0 = time.perf_counter()
    if kind == "refimpl":
        f = rg.load(path)
        n_kv = len(f.metadata)
    else:
        f = gguf.GGUFReader(path)
        n_kv = sum(not k.startswith("GGUF.") for k in f.fields)   # GGUF.version etc. are header fields
        if kind == "gguf+contents":
            meta = {k: fld.contents() for k, fld in f.fields.items() if not k.startswith("GGUF.")}
            n_kv = len(meta)
    dt = time.perf_counter() - t0
    return {"kind": kind, "seconds": dt, "rss_delta": rss_bytes() - r0, "n_kv": n_kv}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", nargs="?")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.path)))
        return
    path = args.path
    if path is None:
        from tests._models import SMOLLM2_FILE, missing_reason, smollm2_path
        path = smollm2_path()
        if path is None:
            sys.exit(missing_reason(SMOLLM2_FILE))
    path = str(path)
    print(f"{path} ({os.path.getsize(path) / 1e6:.1f} MB), {args.repeat} runs each, fresh process per run")
    for kind in ("refimpl", "gguf", "gguf+contents"):
        runs = [json.loads(subprocess.run([sys.executable, __file__, path, "--one", kind], check=True,
                                          capture_output=True, text=True).stdout) for _ in range(args.repeat)]
        best = min(r["seconds"] for r in runs)
        rss = statistics.median(r["rss_delta"] for r in runs)
        print(f"  {kind:14s} {best * 1e3:8.1f} ms   RSS +{rss / 2**20:7.1f} MiB   ({runs[0]['n_kv']} keys)")


if __name__ == "__main__":
    main()
