"""The report of a conformance run (`refimpl conformance`): DIR/report.md, a per-op table and one plot.

    from refimpl.conformance import read_cases
    from refimpl.conformance.report import write_report
    write_report(read_cases("DIR/cases.jsonl"), meta, "DIR")

The plot (DIR/errors.png) puts each case's error against refimpl on a log axis, one column per op: the backend
under test and ggml-cpu side by side, ggml's budget for the op drawn across its column. An error of exactly 0
(bit-equal to refimpl) is drawn on the axis' floor.
"""
from __future__ import annotations

import math
from pathlib import Path

from .verdicts import VERDICTS, summarize

FLOOR = 1e-18          # where a zero error is drawn on the log axis


def per_op(records: list[dict], unsupported: list[str] = ()) -> dict[str, dict]:
    """Per op: case count, verdict counts, first-time cases, cases the backend cannot run (`unsupported`: their
    case strings), largest errors (as multiples of the budget)."""
    ops: dict[str, dict] = {}

    def entry(op):
        return ops.setdefault(op, {"cases": 0, **{v: 0 for v in VERDICTS}, "first_time": 0, "unsupported": 0,
                                   "worst_backend": 0.0, "worst_cpu": None})
    for case in unsupported:
        entry(case.split("(", 1)[0])["unsupported"] += 1
    for r in records:
        o = entry(r["op"])
        o["cases"] += 1
        o[r["verdict"]] += 1
        o["first_time"] += not r["cpu_supported"]
        o["unsupported"] += not r.get("backend_supported", True)        # judged on ggml-cpu alone
        b = r["budget"] or 0.0
        if r["err_backend"] is not None:
            o["worst_backend"] = max(o["worst_backend"], _ratio(r["err_backend"], b))
        if r["err_cpu"] is not None:
            o["worst_cpu"] = max(o["worst_cpu"] or 0.0, _ratio(r["err_cpu"], b))
    return dict(sorted(ops.items()))


def _ratio(err: float, budget: float) -> float:
    if err == 0:
        return 0.0
    return math.inf if budget == 0 or math.isinf(err) else err / budget


def _fmt(x) -> str:
    if x is None:
        return "—"
    if x == 0:
        return "0"
    if math.isinf(x):
        return "inf"
    return f"{x:.2g}"


def _val(x) -> str:
    """A value at the worst element, to f32's precision (what a bug report quotes)."""
    return "—" if x is None else f"{x:.9g}"


def write_report(records: list[dict], meta: dict, out, unsupported: list[str] = ()) -> Path:
    """Write DIR/report.md (and DIR/errors.png when matplotlib is installed); return the report's path.
    `unsupported`: the case strings the backend under test cannot run."""
    out = Path(out)
    s = summarize(records)
    lines = [f"# refimpl judges {meta['backend']} ({meta['device']})", "",
             f"- backend under test: {meta['about']}",
             "- reference: refimpl, exact numerics (served over ggml's RPC); ggml-cpu in test-backend-ops' "
             "reference mode beside it",
             f"- CPU: {meta['cpu']}; {meta['date']}; {meta['seconds']:.0f} s",
             f"- selection: {meta.get('ops') or 'every case'}" + (f", -p {meta['params']}" if meta.get("params")
                                                                   else ""),
             "", f"{s['cases']} cases: " + ", ".join(f"{s['verdicts'][v]} {v}" for v in VERDICTS)
             + f"; {s['first_time']} checked for the first time (ggml-cpu cannot run them), "
             f"{s['first_time_wrong']} of them not agreeing; {len(unsupported) + s['cpu_alone']} the backend cannot "
             "run" + (f", {s['cpu_alone']} of which judged on ggml-cpu alone ({s['cpu_alone_wrong']} not agreeing)"
                      if s["cpu_alone"] else "") + ".", ""]
    plot = _plot(records, out / "errors.png")
    if plot:
        lines += [f"![each side's error against refimpl, per op]({plot.name})", ""]
    else:
        lines += ["(the plot needs matplotlib: pip install 'refimpl[notebooks]')", ""]
    lines += ["Errors are ggml's own error function of each case (NMSE for most ops) against refimpl, as "
              "multiples of the case's budget: the largest per op.", "",
              "| op | cases | agree | backend wrong | ggml-cpu wrong | both wrong | undecided | first time | "
              "backend cannot run | backend / budget | ggml-cpu / budget |", "|---|" + "---:|" * 10]
    for op, o in per_op(records, unsupported).items():
        lines.append(f"| {op} | {o['cases']} | {o['agree']} | {o['backend wrong']} | {o['ggml-cpu wrong']} | "
                     f"{o['both wrong']} | {o['undecided']} | {o['first_time']} | {o['unsupported']} | "
                     f"{_fmt(o['worst_backend'])} | {_fmt(o['worst_cpu'])} |")
    bad = [r for r in records if r["verdict"] != "agree"]
    if bad:
        lines += ["", "## Cases that do not agree", "",
                  "| verdict | case | err backend | err ggml-cpu | budget | worst element: index, backend, "
                  "ggml-cpu, refimpl | reason |", "|---|---|---:|---:|---:|---|---|"]
        for r in bad:
            w = r.get("worst") or {}
            where = (f"{w.get('node', '')}[{w.get('index')}]: {_val(w.get('backend'))}, {_val(w.get('cpu'))}, "
                     f"{_val(w.get('refimpl'))}") if w else ""
            lines.append(f"| {r['verdict']} | `{r['case']}` | {_fmt(r['err_backend'])} | {_fmt(r['err_cpu'])} | "
                         f"{_fmt(r['budget'])} | {where} | {r.get('reason', '')} |")
    died = [r for r in records if r.get("crash_in_sequence")]
    if died:
        lines += ["", "## Where test-backend-ops died after earlier cases", "",
                  "The process died on these cases in the middle of its run, and each ran through when run again "
                  "alone (its verdict is that run's): a crash that follows earlier cases, such as a heap corrupted "
                  "before it, is the backend's defect but not this case's.", "",
                  "| case | how it died | verdict alone |", "|---|---|---|"]
        lines += [f"| `{r['case']}` | {r['crash_in_sequence']} | {r['verdict']} |" for r in died]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _plot(records: list[dict], path: Path, per_row: int = 30) -> Path | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    ops = sorted({r["op"] for r in records})
    rows = [ops[i:i + per_row] for i in range(0, len(ops), per_row)] or [[]]
    fig, axes = plt.subplots(len(rows), 1, figsize=(12, 2.6 * len(rows) + 0.6), squeeze=False)
    backend = records[0]["backend"] if records else ""
    for ax, names in zip(axes[:, 0], rows):
        x = {op: i for i, op in enumerate(names)}
        for side, dx, color, label in (("err_backend", -0.17, "tab:blue", f"{backend} (under test)"),
                                       ("err_cpu", 0.17, "tab:orange", "ggml-cpu (reference mode)")):
            xs, ys = [], []
            for r in records:
                e = r[side]
                if e is None or r["op"] not in x:
                    continue
                xs.append(x[r["op"]] + dx)
                ys.append(min(max(e, FLOOR), 1e3) if math.isfinite(e) else 1e3)
            ax.scatter(xs, ys, s=10, color=color, alpha=0.6, label=label, linewidths=0)
        for op in names:
            b = max(r["budget"] or 0.0 for r in records if r["op"] == op)
            ax.hlines(max(b, FLOOR), x[op] - 0.42, x[op] + 0.42, color="black", linewidth=1.2)
        ax.set_yscale("log")
        ax.set_ylim(FLOOR / 3, 3e3)
        ax.set_xlim(-0.6, per_row - 0.4)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(axis="y", alpha=0.2)
    axes[0, 0].set_title("error against refimpl per case (0 drawn at 1e-18); black: ggml's budget for the op",
                         fontsize=9)
    axes[0, 0].legend(fontsize=7, loc="upper right", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
