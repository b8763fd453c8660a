"""Op coverage against the pinned ggml: `python -m refimpl.testing.coverage [--run] [--log FILE] [--strict]`.

Lists every op of ggml's enums (read from ggml-python, so an op added to ggml shows up as missing) with:
implemented in refimpl, golden-tested against live ggml, tested on a non-contiguous input, and the
source/weight types the golden tests used. The golden facts come from the log that the test suite writes
when REFIMPL_COVERAGE_LOG is set; `--run` runs tests/oracle to produce it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

# ggml ops refimpl leaves out on purpose, with the reason.
EXCLUDED = {
    "NONE": "a leaf, not an op",
    "MAP_CUSTOM1": "user callback", "MAP_CUSTOM2": "user callback", "MAP_CUSTOM3": "user callback",
    "CUSTOM": "user callback",
    "FLASH_ATTN_BACK": "backward of the legacy flash attention; not among the backward ops refimpl covers "
                       "(soft_max_ext_back, rope_back, silu_back, rms_norm_back, get_rows_back, "
                       "cross_entropy_loss_back)",
    "UNARY": "covered per unary op (UNARY:*)", "GLU": "covered per GLU op (GLU:*)",
    # pure views: no computation; refimpl returns NumPy views, tested through the ops that consume them
    "RESHAPE": "view (no data movement)", "VIEW": "view (no data movement)",
    "PERMUTE": "view (no data movement)", "TRANSPOSE": "view (no data movement)",
}


def ggml_ops() -> list[str]:
    from . import ggml
    g = ggml.lib()
    # GGML_OP_POOL_* are the constants of enum ggml_op_pool, not ops
    ops = [(getattr(g, n), n[len("GGML_OP_"):]) for n in dir(g)
           if n.startswith("GGML_OP_") and n != "GGML_OP_COUNT" and not n.startswith("GGML_OP_POOL_")]
    un = [(getattr(g, n), "UNARY:" + n[len("GGML_UNARY_OP_"):]) for n in dir(g)
          if n.startswith("GGML_UNARY_OP_") and n != "GGML_UNARY_OP_COUNT"]
    glu = [(getattr(g, n), "GLU:" + n[len("GGML_GLU_OP_"):]) for n in dir(g)
           if n.startswith("GGML_GLU_OP_") and n != "GGML_GLU_OP_COUNT"]
    return [n for _, n in sorted(ops)] + [n for _, n in sorted(un)] + [n for _, n in sorted(glu)]


def report(log: list[dict] | None) -> tuple[list[tuple], dict]:
    from ..ops import OPS
    impl = {}
    for name, info in OPS.items():
        for c in info.covers:
            impl.setdefault(c, []).append(name)
    rows = []
    for o in ggml_ops():
        if o in EXCLUDED:
            rows.append((o, "excluded", EXCLUDED[o], "", "", ""))
            continue
        entries = [e for e in (log or []) if o in e["covers"]]
        golden = any(e["ok"] for e in entries)
        failed = any(not e["ok"] for e in entries)
        nonc = any(e["noncontig"] and e["ok"] for e in entries)
        types = sorted({e["weight_type"] for e in entries if e["ok"] and e["weight_type"]})
        rows.append((o, "yes" if o in impl else "NO", ",".join(impl.get(o, [])),
                     ("FAILED" if failed else "yes") if golden or failed else ("?" if log is None else "NO"),
                     "yes" if nonc else ("?" if log is None else "no"), " ".join(types)))
    scope = [r for r in rows if r[1] != "excluded"]
    summary = {"in_scope": len(scope), "implemented": sum(r[1] == "yes" for r in scope),
               "golden": sum(r[3] == "yes" for r in scope), "noncontig": sum(r[4] == "yes" for r in scope)}
    return rows, summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", help="coverage log written by the test suite (REFIMPL_COVERAGE_LOG)")
    ap.add_argument("--run", action="store_true", help="run tests/golden now to produce the log")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 unless every in-scope op is implemented and golden-tested")
    a = ap.parse_args(argv)
    log = None
    path = a.log
    if a.run:
        path = path or os.path.join(tempfile.mkdtemp(), "ops-coverage.json")
        env = dict(os.environ, REFIMPL_COVERAGE_LOG=path)
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/oracle"], env=env)
    if path and os.path.exists(path):
        with open(path) as f:
            log = json.load(f)
    rows, s = report(log)
    w = max(len(r[0]) for r in rows)
    print(f"{'ggml op':{w}s}  impl  refimpl name(s)              golden  non-contig  types tested")
    for o, impl, names, golden, nonc, types in rows:
        if impl == "excluded":
            print(f"{o:{w}s}  --    excluded: {names}")
        else:
            print(f"{o:{w}s}  {impl:4s}  {names[:28]:28s} {golden:7s} {nonc:11s} {types}")
    print(f"\n{s['implemented']}/{s['in_scope']} in-scope ops implemented, {s['golden']} golden-tested against "
          f"ggml, {s['noncontig']} tested on non-contiguous inputs" + ("" if log else " (no test log: use --run)"))
    if a.strict and (s["implemented"] < s["in_scope"] or s["golden"] < s["in_scope"]):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
