"""Summarize test-backend-ops runs against `refimpl serve` into docs/test-backend-ops.md.

    python scripts/test_backend_ops_report.py RUN_DIR [--out docs/test-backend-ops.md] [--check]

RUN_DIR (written by scripts/test_backend_ops.sh) holds, per numerics mode N: tbo-N.sql (test-backend-ops
`--output sql`: one INSERT per case with its op, params, supported, passed and error message), serve-N.log
(the server's log: the nodes it did not compute and why, and its per-op counts), and meta.json (the
command, the build, the times). --check exits 1 when a case of an op refimpl computes failed.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

FIELDS = ["test_time", "build_commit", "backend_name", "op_name", "op_params", "test_mode", "supported", "passed",
          "error_message", "time_us", "flops", "bandwidth_gb_s", "memory_kb", "n_runs", "device_description",
          "backend_reg_name"]


# Why the cases that do not pass do not, with the evidence (ggml 0.25.3's sources in the llama-cpp-python 0.3.36
# sdist). Kept by hand: each line names what a later round should change.
SHORTFALLS = """
## Shortfalls, and why

- **`SUM` of a permuted f32 tensor** (`SUM(type=f32,ne=[33,256,1,1],permute=[1,0,2,3])`, the one numeric
  failure): ggml-cpu's `ggml_compute_forward_sum_f32` (ggml-cpu/ops.cpp) asserts `src0->nb[0] == sizeof(float)`
  with `assert` (compiled out in release builds) and then sums each row as contiguous floats, so for a
  permuted source it adds other elements than the tensor's. refimpl sums the tensor's own elements; the
  comparison is against ggml-cpu's out-of-spec answer, and refimpl keeps the defined result. `refimpl conformance`,
  which measures ggml-cpu against refimpl, judges it ggml-cpu's bug ([refimpl judges ggml](conformance.md)).
- **Not computed by design**: `MAP_CUSTOM1..3` and `CUSTOM` (a client-side C callback: its code never crosses
  the wire) and the legacy `FLASH_ATTN_BACK`; test-backend-ops sends none of them.

What ggml 0.25.3 added and refimpl's ops now compute (each case above passes ggml's budget): the type Q2_0
(quantizer and dequantizer bit-identical to ggml 0.25.3's libggml-base, tests/quants/test_q2_0.py), bf16
sources of the unary and GLU ops (the f32 function of the widened value, rounded once; GELU and GELU_QUICK take
the formula there, not the f16 table), f32 weights times f16/bf16 activations (widened exactly), f16
`OUT_PROD`, `IM2COL` into f16 from any kernel, f16 `CONV_2D_DW` kernels, empty `CONV_3D` kernel axes,
`GET_ROWS_BACK` over a view of its rows, `SWIGLU_CLAMP`, `XIELU` from its stored op_params, `SSM_SCAN`'s K
rollback slots, `LIGHTNING_INDEXER`, `DSV4_HC_COMB` / `DSV4_HC_PRE` / `DSV4_HC_POST`, and the optimizer steps
`OPT_STEP_ADAMW` / `OPT_STEP_SGD` (also golden-tested against ggml 0.15.3, bit-identical).
"""


def cases(sql: Path) -> list[dict]:
    out = []
    for line in sql.read_text(errors="replace").splitlines():
        at = line.find("INSERT INTO test_backend_ops")
        if at < 0:
            continue
        vals = line[line.index("VALUES (") + 8:].rstrip(");")
        parts = re.findall(r"'((?:[^']|'')*)'", vals)
        if len(parts) != len(FIELDS):
            continue
        case = dict(zip(FIELDS, parts))
        case["detail"] = line[:at].strip()        # test-backend-ops prints why a case failed before its row
        out.append(case)
    return out


def console_cases(log: Path) -> list[dict]:
    """The same records from test-backend-ops' console output (`test -b RPC0` without --output)."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = re.search(r"  ([A-Z0-9_]+)\((.*)\): (?:\x1b\[1;3\dm)?(OK|FAIL|not supported)", line)
        if not m:
            continue
        op, params, st = m.groups()
        out.append({"op_name": op, "op_params": params, "supported": "0" if st == "not supported" else "1",
                    "passed": "1" if st == "OK" else "0", "error_message": "", "detail": line[:m.start()].strip()})
    return out


def load(run: Path, mode: str) -> list[dict] | None:
    if (run / f"tbo-{mode}.sql").exists():
        return cases(run / f"tbo-{mode}.sql")
    if (run / f"tbo-{mode}.log").exists():
        return console_cases(run / f"tbo-{mode}.log")
    return None


def classify(c: dict) -> str:
    if c["supported"] not in ("1", "true", "yes"):
        return "cpu_unsupported"
    if c["passed"] in ("1", "true", "yes"):
        return "passed"
    if re.search(r"RPC\d+\[[^\]]*\]=-?nan", c["detail"]):
        return "not_computed"
    return "failed"


def server_reasons(log: Path) -> dict[str, str]:
    """The first logged reason per op the server refused (op, sub-op)."""
    reasons: dict[str, str] = {}
    if not log.exists():
        return reasons
    for line in log.read_text(errors="replace").splitlines():
        m = re.search(r"not computed: (\S+) .*?: (\w+: .*)$", line)
        if m and m.group(1) not in reasons:
            reasons[m.group(1)] = m.group(2)[:240]
    return reasons


def table(cs: list[dict]) -> dict[str, collections.Counter]:
    per: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for c in cs:
        per[c["op_name"]][classify(c)] += 1
    return per


def render(run: Path, modes: list[str]) -> tuple[str, int]:
    meta = json.loads((run / "meta.json").read_text()) if (run / "meta.json").exists() else {}
    lines = ["# ggml's test-backend-ops on refimpl", "",
             "ggml's own op tests (llama.cpp's `tests/test-backend-ops.cpp`, llama-cpp-python 0.3.36 = ggml 0.25.3)",
             "run against `refimpl serve` as an RPC device: every case builds its graph, sends it to refimpl, and",
             "compares the result with ggml's CPU backend under ggml's own error budget (NMSE per op). Generated by",
             "`scripts/test_backend_ops.sh` (which writes this file through `scripts/test_backend_ops_report.py`).", ""]
    if meta:
        lines += [f"- command: `{meta.get('command', '')}`",
                  f"- run: {meta.get('date', '?')} on {meta.get('cpu', '?')}; backend {meta.get('backend', '?')}",
                  f"- build: {meta.get('build', '?')}", ""]
        for m in modes:
            if f"seconds_{m}" in meta:
                lines.append(f"- {m} numerics: {meta[f'seconds_{m}']:.0f} s for the run"
                             + (f" (op filter `{meta['ops']}`)" if meta.get("ops") else " (every op)"))
        if meta.get("note"):
            lines.append(f"- {meta['note']}")
        lines.append("")
    lines += ["Columns: cases passed, failed (over ggml's budget), not computed (refimpl returned NaN: the node is",
              "not in refimpl's op table, see the reason), and cases ggml-cpu itself does not support (skipped by",
              "test-backend-ops, so nothing is compared).", ""]
    bad = 0
    loaded = {m: load(run, m) for m in modes}
    per_mode = {m: table(cs) for m, cs in loaded.items() if cs is not None}
    reasons = {}
    for m in modes:
        reasons.update(server_reasons(run / f"serve-{m}.log"))
    ops = sorted(set().union(*[set(t) for t in per_mode.values()]) if per_mode else [])
    head = ("| op | " + " | ".join(f"{m}: passed / failed / not computed" for m in per_mode)
            + " | ggml-cpu unsupported |")
    lines += [head, "|---|" + "---|" * len(per_mode) + "---|"]
    totals = {m: collections.Counter() for m in per_mode}
    for op in ops:
        cells = []
        unsup = 0
        for m, t in per_mode.items():
            c = t.get(op, collections.Counter())
            totals[m].update(c)
            unsup = max(unsup, c["cpu_unsupported"])
            cells.append(f"{c['passed']} / {c['failed']} / {c['not_computed']}")
            bad += c["failed"]
        lines.append(f"| {op} | " + " | ".join(cells) + f" | {unsup} |")
    lines.append("| **all** | " + " | ".join(f"**{t['passed']} / {t['failed']} / {t['not_computed']}**"
                                          for t in totals.values()) + " | |")
    lines += ["", "## Nodes refimpl does not compute, and why", "",
              "The server's log names each (first occurrence per op; `refimpl serve` logs the op, sub-op,",
              "op_params and the shapes in both orders):", ""]
    for op, why in sorted(reasons.items()):
        lines.append(f"- `{op}`: {why}")
    if not reasons:
        lines.append("- none: the server computed every node these runs sent.")
    lines += ["", SHORTFALLS.strip()]
    failed = [(m, c) for m in per_mode for c in loaded[m] if classify(c) == "failed"]
    if failed:
        lines += ["", "## Failed cases", ""]
        for m, c in failed[:200]:
            lines.append(f"- {m}: `{c['op_name']}({c['op_params']})`: {(c['detail'] or c['error_message'])[:200]}")
    return "\n".join(lines) + "\n", bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--modes", default="exact,ggml")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    text, bad = render(a.run, a.modes.split(","))
    if a.out:
        a.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 1 if (a.check and bad) else 0


if __name__ == "__main__":
    sys.exit(main())
