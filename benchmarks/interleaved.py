"""Two source trees measured alternately (before, after, before, after, ...), best of each: what a noisy shared
machine needs to compare one change's model rows. Each measurement runs in a fresh interpreter with PYTHONPATH
set to its tree.

    git worktree add /tmp/before <commit>
    python -m benchmarks.interleaved --before /tmp/before [--after .] [--rounds 3] [--threads 1]

Rows: SmolLM2 Q4_1 prefill ms (128 tokens) and decode ms/token (24 single-token forwards after it), numba,
fast and exact, best of 4; RWKV-4 decode ms/token (random weights of the 0.1B shape, f32, best of 3); MiniLM
sentences/s (numba fast, batches of 32 short / long sentences, best of 5), and the call time
of `refimpl.rms_norm` on (1, 576) f32 (the dispatch's per-call cost).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

CHILD = r'''
import sys, time, timeit, numpy as np, numba
numba.set_num_threads(int(sys.argv[1]))
import refimpl
from refimpl.models import bert, llama
m = llama.load(refimpl.fetch.fetch("smollm2"))
out = {}
for mode in ("fast", "exact"):
    best = pre = 1e9
    with refimpl.numerics(mode):
        for _ in range(4):
            c = llama.new_cache(m, 256)
            t0 = time.perf_counter()
            llama.forward(m, list(range(1, 129)), c, last_only=True)
            pre = min(pre, time.perf_counter() - t0)
            t0 = time.perf_counter()
            for i in range(24):
                llama.forward(m, [100 + i], c, last_only=True)
            best = min(best, (time.perf_counter() - t0) / 24)
    out[f"SmolLM2 prefill 128, numba {mode}, ms"] = pre * 1e3
    out[f"SmolLM2 decode, numba {mode}, ms/token"] = best * 1e3
from refimpl.models import rwkv
from tests.models.rwkv_tiny import tiny_state_dict
from benchmarks.rwkv import SHAPE, VARIANT, VOCAB
rm = rwkv.from_state_dict(tiny_state_dict(VARIANT["4"], vocab=VOCAB["4"], seed=4, **SHAPE))
for mode in ("fast", "exact"):
    best = 1e9
    with refimpl.numerics(mode):
        s = None
        _, s = rwkv.forward(rm, [1, 2, 3], s)
        for _ in range(3):
            t0 = time.perf_counter()
            for i in range(8):
                _, s = rwkv.forward(rm, [100 + i], s)
            best = min(best, (time.perf_counter() - t0) / 8)
    out[f"RWKV-4 0.1B decode, numba {mode}, ms/token"] = best * 1e3
b = bert.load(refimpl.fetch.fetch("minilm"))
short = ["The quick brown fox jumps over the lazy dog near the river bank today."] * 32
long_ = [" ".join(["Refimpl computes ggml ops in NumPy and checks them against the real library."] * 5)] * 32
with refimpl.numerics("fast"):
    for name, batch in (("short", short), ("long", long_)):
        bert.embed(b, batch)
        best = 1e9
        for _ in range(5):
            t0 = time.perf_counter(); bert.embed(b, batch); best = min(best, time.perf_counter() - t0)
        out[f"MiniLM {name}, numba fast, sent/s"] = -32 / best          # negative: higher is better
x = np.ones((1, 576), np.float32)
refimpl.rms_norm(x, 1e-5)
out["rms_norm call, us"] = timeit.timeit(lambda: refimpl.rms_norm(x, 1e-5), number=20000) / 20000 * 1e6
for k, v in out.items():
    print(f"{k}\t{v}")
'''


def run(tree: str, threads: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    r = subprocess.run([sys.executable, "-c", CHILD, str(threads)], capture_output=True, text=True, env=env,
                       cwd=os.path.abspath(tree), check=True)
    return {k: float(v) for k, v in (line.split("\t") for line in r.stdout.splitlines() if "\t" in line)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the tree the change starts from (a git worktree)")
    ap.add_argument("--after", default=".", help="the tree with the change (default: this one)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    best: dict[str, dict[str, float]] = {"before": {}, "after": {}}
    for _ in range(a.rounds):
        for side, tree in (("before", a.before), ("after", a.after)):
            for k, v in run(tree, a.threads).items():
                best[side][k] = min(best[side].get(k, v), v)
    print(f"| measurement ({a.threads} thread(s), best of {a.rounds} interleaved rounds) | before | after |")
    print("|---|---|---|")
    for k in best["before"]:
        b, f = best["before"][k], best["after"].get(k)
        fmt = (lambda v: f"{-v:.0f}") if b < 0 else (lambda v: f"{v:.2f}")
        print(f"| {k} | {fmt(b)} | {fmt(f) if f is not None else '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
