"""ggml's test-backend-ops against three RPC servers, op by op, interleaved: ggml's own `ggml-rpc-server` (the CPU
backend of the same llama.cpp build, 2 threads) and `refimpl serve` in exact and in ggml numerics.

    python benchmarks/tbo.py [--ops OP[:REGEX],... | --ops all]

For each op of the selection (narrowed by test-backend-ops' -p REGEX where one is given),
`test-backend-ops test -b RPC0 -o OP` runs once against each server, the order rotated from one op to the next.
Each run's wall time is measured; on refimpl's side also the seconds its server spent computing nodes (the rest
is test-backend-ops' own work, which every server shares -- drawing the inputs, computing ggml-cpu's side to
compare with -- and the protocol). The build is scripts/build_llamacpp.sh's portable one (cached).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("ggml-rpc-server", "refimpl exact", "refimpl ggml")

# the default run's slice: the families of the suite, the ops that cost refimpl most among them (TOP_K, GEGLU,
# quantized MUL_MAT and MUL_MAT_ID, CONV_2D), each narrowed to a few dozen to a few hundred cases
SLICE = ("ADD", "MUL", "SOFT_MAX", "RMS_NORM", "ROPE", "GET_ROWS", "CPY", "CONCAT", "GEGLU", "ARGSORT", "TOP_K",
         "IM2COL", "MUL_MAT:type_a=q8_0", "MUL_MAT:type_a=q4_K", "MUL_MAT_ID:type_a=q4_0",
         "FLASH_ATTN_EXT:hsk=128,hsv=128.*type_K=q8_0", r"CONV_2D:ne_kernel=\[3,3,.*stride0=1,stride1=1")
QUICK = ("ADD", "SOFT_MAX", "GET_ROWS", "GEGLU", "MUL_MAT:type_a=q8_0")


def parse_ops(text: str, bindir: Path) -> list[tuple[str, str | None]]:
    """"OP[:REGEX],..." -> [(op, regex or None)]; "all": every op of the suite, in test-backend-ops' order."""
    if text == "all":
        p = subprocess.run([str(bindir / "test-backend-ops"), "support", "-b", "CPU", "--output", "csv"],
                           capture_output=True, text=True, timeout=600)
        ops = [ln.split(",")[1].strip('"') for ln in p.stdout.splitlines()[1:] if ln.count(",") > 2]
        return [(op, None) for op in dict.fromkeys(ops)]
    # a comma starts a new selection only before an op's name (a REGEX may hold commas: "hsk=128,hsv=128")
    entries = re.split(r",(?=[A-Z][A-Z0-9_]*(?::|,|$))", text)
    return [(e.split(":", 1)[0], e.split(":", 1)[1] if ":" in e else None) for e in entries if e]


def _cases(bindir: Path, op: str, regex: str | None) -> int:
    cmd = [str(bindir / "test-backend-ops"), "support", "-b", "CPU", "-o", op, "--output", "csv"]
    p = subprocess.run(cmd + (["-p", regex] if regex else []), capture_output=True, text=True, timeout=600)
    return sum('"1","yes"' in ln for ln in p.stdout.splitlines())


def _op_seconds(srv) -> float:
    """Seconds refimpl's server has spent computing nodes, over its finished connections (REFIMPL_RPC_DEBUG)."""
    time.sleep(0.1)
    return sum(sum(c.seconds.values()) for c in srv.finished)


def run(ops: list[tuple[str, str | None]], threads: int = 2) -> list[dict]:
    """One row per op: cases, and per engine the run's seconds (and refimpl's seconds in its ops)."""
    os.environ["REFIMPL_RPC_DEBUG"] = "1"                 # before refimpl.rpc is imported: per-op seconds
    sys.path.insert(0, str(ROOT / "scripts"))
    from llama_archs import _bin, ggml_rpc_server
    from refimpl.ops import current_backend
    from refimpl.rpc import Server
    bindir = _bin()
    rows = []
    backend = current_backend()       # what `refimpl serve` runs by default: numba when installed
    with ggml_rpc_server(threads=threads) as c_endpoint, \
            Server("127.0.0.1", 0, backend=backend, numerics="exact") as exact, \
            Server("127.0.0.1", 0, backend=backend, numerics="ggml") as ggml:
        servers = {"ggml-rpc-server": (c_endpoint, None), "refimpl exact": (f"127.0.0.1:{exact.port}", exact),
                   "refimpl ggml": (f"127.0.0.1:{ggml.port}", ggml)}
        for k, (op, regex) in enumerate(ops):
            row = {"op": op, "params": regex, "cases": _cases(bindir, op, regex)}
            for name in ENGINES[k % 3:] + ENGINES[:k % 3]:         # the order rotated op by op
                endpoint, srv = servers[name]
                before = _op_seconds(srv) if srv else 0.0
                cmd = [str(bindir / "test-backend-ops"), "test", "-b", "RPC0", "-o", op] + (["-p", regex] if regex
                                                                                           else [])
                t0 = time.perf_counter()
                p = subprocess.run(cmd, env={**os.environ, "GGML_RPC_SERVERS": endpoint}, capture_output=True,
                                   text=True, timeout=7200)
                row[name] = time.perf_counter() - t0
                if srv:
                    row[f"{name} in ops"] = _op_seconds(srv) - before
                if p.returncode not in (0, 1):
                    row[f"{name} error"] = f"exit {p.returncode}: {p.stderr.strip()[-200:]}"
            print(f"  tbo: {op}{':' + regex if regex else ''} ({row['cases']} cases): "
                  + ", ".join(f"{n} {row[n]:.1f} s" for n in ENGINES), file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def child() -> None:
    job = json.loads(sys.stdin.read())
    print(json.dumps({"rows": run([tuple(x) for x in job["ops"]], job.get("threads", 2))}), flush=True)


def main() -> None:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default=",".join(SLICE), help="OP[:REGEX],... or all (default: the slice)")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT / "scripts"))
    from llama_archs import _bin
    rows = run(parse_ops(a.ops, _bin()))
    tot = {n: sum(r[n] for r in rows) for n in ENGINES}
    for r in rows:
        print(f"{r['op']:16} {r['cases']:5d}  C {r['ggml-rpc-server']:7.1f} s  exact {r['refimpl exact']:7.1f} s "
              f"({r['refimpl exact'] / r['ggml-rpc-server']:.2f}x)  ggml {r['refimpl ggml']:7.1f} s "
              f"({r['refimpl ggml'] / r['ggml-rpc-server']:.2f}x)")
    print(f"{'all':16} {sum(r['cases'] for r in rows):5d}  C {tot['ggml-rpc-server']:7.1f} s  exact "
          f"{tot['refimpl exact']:7.1f} s ({tot['refimpl exact'] / tot['ggml-rpc-server']:.2f}x)  ggml "
          f"{tot['refimpl ggml']:7.1f} s ({tot['refimpl ggml'] / tot['ggml-rpc-server']:.2f}x)")


if __name__ == "__main__":
    main()
