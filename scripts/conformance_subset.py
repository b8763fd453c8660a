"""Writes refimpl/data/conformance/ci.txt: the named subset `refimpl conformance --subset ci` judges (and CI runs).

    python scripts/conformance_subset.py BINDIR [--per-op 3] [--unsupported 2]

From test-backend-ops' own case list (its `support` mode, ggml-cpu's answer per case): per op, `--per-op` cases
spread evenly over the op's list (its first, its last and between), plus up to `--unsupported` cases ggml-cpu
cannot run (judged against refimpl alone), plus the cases named in MUST (the SUM of a permuted tensor, where
ggml-cpu sums the wrong elements). Deterministic: the same build gives the same file.
"""
import argparse
import csv
import io
import subprocess
from pathlib import Path

MUST = ["SUM(type=f32,ne=[33,256,1,1],permute=[1,0,2,3])"]
OUT = Path(__file__).resolve().parents[1] / "refimpl" / "data" / "conformance" / "ci.txt"


def spread(items, k):
    if len(items) <= k:
        return list(items)
    return [items[round(i * (len(items) - 1) / (k - 1))] for i in range(k)] if k > 1 else [items[0]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bindir")
    ap.add_argument("--per-op", type=int, default=3)
    ap.add_argument("--unsupported", type=int, default=2)
    a = ap.parse_args()
    p = subprocess.run([f"{a.bindir}/test-backend-ops", "support", "-b", "CPU", "--output", "csv"],
                       capture_output=True, text=True, check=True)
    rows = list(csv.DictReader(io.StringIO(p.stdout)))
    by_op, unsup = {}, {}
    for r in rows:
        case = f"{r['op_name']}({r['op_params']})"
        (by_op if r["supported"] == "1" else unsup).setdefault(r["op_name"], []).append(case)
    picked = []
    for op in sorted(set(by_op) | set(unsup)):
        picked += spread(by_op.get(op, []), a.per_op) + spread(unsup.get(op, []), a.unsupported)
    for c in MUST:
        if c not in picked:
            picked.append(c)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("# test-backend-ops cases judged in CI (scripts/conformance_subset.py "
                   f"--per-op {a.per_op} --unsupported {a.unsupported})\n" + "\n".join(picked) + "\n")
    print(f"{len(picked)} cases of {len(by_op | unsup)} ops -> {OUT}")


if __name__ == "__main__":
    main()
