"""The verdict on one judged case, and the record format of `cases.jsonl` (refimpl.conformance's docstring
defines both)."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path


class ConformanceError(ValueError):
    """A conformance run that cannot go on: one line for the user (`refimpl: error: ...`)."""


VERDICTS = ("agree", "backend wrong", "ggml-cpu wrong", "both wrong", "undecided")

# ops whose result ggml leaves implementation-defined where inputs tie: a disagreement there decides nothing
IMPLEMENTATION_DEFINED = {"ARGSORT", "TOP_K"}


def _num(v) -> float | None:
    """A number from the patch's JSON: "inf", "-inf" and "nan" are written as strings (JSON has no such numbers)."""
    if v is None:
        return None
    return float(v)


def verdict(rec: dict) -> tuple[str, str]:
    """The verdict on one case's record (the patch's JSON line) and its reason, in words."""
    if rec.get("error"):
        return "undecided", rec["error"]
    budget, budget_cpu = _num(rec["budget"]), _num(rec.get("budget_cpu", rec["budget"]))
    e_b, e_c, e_bc = _num(rec["err_backend"]), _num(rec.get("err_cpu")), _num(rec.get("err_backend_cpu"))
    cpu, bk = bool(rec["cpu_supported"]), bool(rec.get("backend_supported", True))
    over_b = bk and e_b > budget
    over_c = cpu and e_c > budget_cpu
    apart = cpu and bk and e_bc > budget
    if not (over_b or over_c or apart):
        return "agree", ""
    if rec.get("ref_nan", 0):
        return "undecided", f"refimpl did not compute {rec['ref_nan']} element(s) the backend did (NaN)"
    if rec["op"] in IMPLEMENTATION_DEFINED:
        return "undecided", f"{rec['op']}'s order is implementation-defined where values tie"
    e_r2 = _num(rec.get("err_ref2"))
    if e_r2 is not None and e_r2 > budget:
        return "undecided", (f"refimpl's ggml numerics differ from its exact ones by {e_r2:.3g} > budget "
                             f"{budget:.3g} here")
    if over_b and over_c:
        return "both wrong", f"backend {e_b:.3g}, ggml-cpu {e_c:.3g} > budget {budget:.3g}"
    if over_b:
        return "backend wrong", f"backend {e_b:.3g} > budget {budget:.3g}" + (
            f"; ggml-cpu {e_c:.3g}" if cpu else " (ggml-cpu cannot run this case)")
    if over_c:
        return "ggml-cpu wrong", f"ggml-cpu {e_c:.3g} > budget {budget_cpu:.3g}; " + (
            f"backend {e_b:.3g}" if bk else "the backend cannot run this case")
    return "undecided", (f"each within budget of refimpl (backend {e_b:.3g}, ggml-cpu {e_c:.3g}) but {e_bc:.3g} "
                         f"apart, over the budget {budget:.3g}")


def judge(raw: dict) -> dict:
    """One record of `cases.jsonl` from one line of the patch: the fields of the format, in their order."""
    v, why = verdict(raw)
    rec = {"op": raw["op"], "case": raw["case"], "backend": raw["backend"], "budget": _num(raw["budget"]),
           "err_backend": _num(raw.get("err_backend")), "err_cpu": _num(raw.get("err_cpu")),
           "cpu_supported": bool(raw["cpu_supported"]), "verdict": v}
    if not raw.get("backend_supported", True):
        rec["backend_supported"] = False             # ggml-cpu judged alone
    if why:
        rec["reason"] = why
    for k in ("err_backend_cpu", "err_ref2", "ref_nan", "error", "crash_in_sequence"):
        if raw.get(k) is not None:
            rec[k] = _num(raw[k]) if k.startswith("err_") else raw[k]
    if v != "agree" and "worst" in raw:
        w = raw["worst"]
        rec["worst"] = {"index": w["index"], "node": w.get("name"), "node_op": w.get("node_op"),
                        "ne": w.get("ne"), "backend": _num(w["backend"]), "cpu": _num(w.get("cpu")),
                        "refimpl": _num(w["refimpl"])}
    return rec


def to_json(rec: dict) -> str:
    """One JSON line; inf and NaN (which JSON lacks) as the strings "inf", "-inf", "nan"."""
    def fix(v):
        if isinstance(v, float) and not math.isfinite(v):
            return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fix(x) for x in v]
        return v
    return json.dumps(fix(rec), allow_nan=False)


def read_cases(path: str | os.PathLike) -> list[dict]:
    """The records of a `cases.jsonl` (errors as floats again, inf and NaN included)."""
    out = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            for k in ("budget", "err_backend", "err_cpu", "err_backend_cpu", "err_ref2"):
                if isinstance(rec.get(k), str):
                    rec[k] = float(rec[k])
            out.append(rec)
    return out


def summarize(records: list[dict]) -> dict:
    """Counts per verdict, of the cases ggml-cpu cannot run (checked for the first time), and of those the backend
    cannot run that ggml-cpu was judged on alone."""
    counts = {v: 0 for v in VERDICTS}
    for r in records:
        counts[r["verdict"]] += 1
    first = [r for r in records if not r["cpu_supported"]]
    alone = [r for r in records if not r.get("backend_supported", True)]
    return {"cases": len(records), "verdicts": counts, "first_time": len(first),
            "first_time_wrong": sum(r["verdict"] != "agree" for r in first), "cpu_alone": len(alone),
            "cpu_alone_wrong": sum(r["verdict"] != "agree" for r in alone)}


def ops_known(name: str) -> bool:
    """Whether `name` could be a test-backend-ops op name: a ggml op, unary or GLU op, or a name made of them
    (fused and composite tests: ADD_RMS_NORM, TOPK_QSA, MUL_MAT_ID_FUSION)."""
    from ..rpc.ggml_ops import GLU_NAMES, OP_NAMES, UNARY_NAMES
    known = set(OP_NAMES) | set(UNARY_NAMES) | set(GLU_NAMES) | {"TOPK"}
    return name in known or any(name.startswith(k + "_") or name.endswith("_" + k) for k in known if len(k) > 2)
