"""SmolLM2-135M Q4_1 under numerics="ggml" against llama.cpp: 64 greedy tokens on every golden prompt.

    python scripts/faithful_greedy64.py [--prompts N]

Reads tests/golden_data/llama_greedy64_smollm2.npz (scripts/gen_llama_goldens.py --only greedy64) and, per
prompt, runs refimpl's greedy continuation (the prompt in one forward, then one forward per token) in ggml
numerics with the f16 KV cache; prints how many tokens equal llama.cpp's and whether each step's top-16
logits are bit-identical. About 2-3 minutes per prompt on this machine (the CI test runs the shortest prompt
for 8 tokens: tests/models/test_llama_faithful.py). Exit status 1 if any prompt differs.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=None, help="only the first N prompts")
    a = ap.parse_args()
    import refimpl
    from refimpl.fetch import fetch
    from refimpl.models import llama
    z = np.load(ROOT / "tests" / "golden_data" / "llama_greedy64_smollm2.npz", allow_pickle=False)
    meta = json.loads(str(z["meta"]))
    model = llama.load(fetch("smollm2"))
    bad = 0
    for i, p in enumerate(meta["prompts"][:a.prompts]):
        ids, n = z[f"p{i}_prompt_ids"], meta["n_greedy"]
        t0 = time.perf_counter()
        with refimpl.numerics("ggml"):
            cache = llama.new_cache(model, len(ids) + n)
            o = llama.forward(model, ids, cache, last_only=True)[-1]
            toks, rows = [], []
            for k in range(n):
                rows.append(o)
                toks.append(int(o.argmax()))
                if k + 1 < n:
                    o = llama.forward(model, [toks[-1]], cache)[-1]
        ref = z[f"p{i}_greedy_ids"].tolist()
        same = next((k for k, (x, y) in enumerate(zip(toks, ref)) if x != y), n)
        top = np.take_along_axis(np.stack(rows), z[f"p{i}_greedy_top_ids"], axis=1)
        bits = np.array_equal(top.view(np.uint32), z[f"p{i}_greedy_top_logits"].view(np.uint32))
        bad += same != n or not bits
        print(f"{p['name']:>12}: {same}/{n} greedy tokens equal llama.cpp's, top-16 logits "
              f"{'bit-identical' if bits else 'DIFFER'} ({time.perf_counter() - t0:.0f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
