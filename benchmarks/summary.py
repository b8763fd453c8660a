"""The one table `python -m benchmarks` prints: rows, the issue's targets, the machine, markdown and JSON.

Every row compares two engines on one measurement, both as a rate where higher is better (Melem/s,
GFLOP/s, tokens/s, sentences/s, loads/s), so that

    ratio = A / B          (the engine A value over the engine B value, both from the same run)

for every row, and a target reads "A must reach at least this many times B". A missing value (an
engine that is not installed, a model that is not fetched, a child that failed) is a string in its
place, and the ratio is then None ("—").

Targets (the "Numba hot loops" issue), each for refimpl on the Numba backend:

    dequantize   >= 1.0x ggml C, 1 thread, for Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K-Q6_K IQ4_NL IQ4_XS
                 >= 8x gguf-py, 1 thread, for every type both have
    quantize     >= 1.0x ggml_quantize_chunk, 1 thread, for Q4_0 Q8_0 Q4_K Q6_K
    SmolLM2      Q4_1, 2 threads: decode >= 0.5x llama.cpp, prefill of 128 tokens >= 1.5x llama.cpp
    MiniLM       >= 1.0x sentence-transformers sentences/s on batches of 32
    RWKV         v4 169M shape, 2 threads: decode >= 1.0x the rwkv package

`target_for(part, what_key, engine_a, engine_b, threads)` attaches them; `Row.holds` checks them.
"""
from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict, dataclass, field

COLUMNS = ("part", "what", "engine A", "engine B", "ratio A/B", "target", "holds?", "threads", "peak RSS MiB")

DEQ_VS_GGML = {"q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq4_nl", "iq4_xs"}
Q_VS_GGML = {"q4_0", "q8_0", "q4_K", "q6_K"}


@dataclass
class Row:
    """One comparison: value_a of engine_a against value_b of engine_b (rates, higher is better).

    A value is a float, or a string saying why there is none ("not installed", "error: ...").
    key names the measurement for targets (e.g. "dequantize q4_K", "llama decode", "rwkv4 decode");
    exact says whether the run used the sizes the targets assume (not --quick).
    """
    part: str
    what: str
    engine_a: str
    value_a: float | str
    engine_b: str
    value_b: float | str
    threads: str
    rss: str = ""
    key: str = ""
    target: float | None = None
    exact: bool = True

    @property
    def ratio(self) -> float | None:
        a, b = self.value_a, self.value_b
        if isinstance(a, str) or isinstance(b, str) or a is None or b is None or b == 0:
            return None
        return a / b

    @property
    def holds(self) -> bool | None:
        r = self.ratio
        return None if r is None or self.target is None else r >= self.target

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(ratio=self.ratio, holds=self.holds)
        return d


def target_for(key: str, engine_a: str, engine_b: str, threads: int) -> float | None:
    """The issue's target ratio for this measurement, or None when it sets none."""
    if engine_a not in ("refimpl numba", "refimpl numba fast"):      # the Numba backend, exact or fast numerics
        return None
    op, _, typ = key.partition(" ")
    if op == "dequantize" and threads == 1 and engine_b == "ggml C" and typ in DEQ_VS_GGML:
        return 1.0
    if op == "dequantize" and engine_b == "gguf-py":     # gguf-py's NumPy runs on one thread: at 1 and 2 threads
        return 8.0
    if op == "quantize" and threads == 1 and engine_b == "ggml C" and typ in Q_VS_GGML:
        return 1.0
    if threads == 2 and engine_b == "llama.cpp":
        return {"llama decode": 0.5, "llama prefill": 1.5}.get(key)
    if key.startswith("bert ") and engine_b == "sentence-transformers":
        return 1.0
    if key == "rwkv4 decode" and threads == 2 and engine_b == "rwkv":
        return 1.0
    return None


def fmt_value(v) -> str:
    """A rate with 3-4 significant digits, plain digits (no thousands separator, no exponent)."""
    if v is None:
        return "—"
    if isinstance(v, str):
        return v
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}" if v >= 1e-3 else f"{v:.2e}"


def fmt_ratio(r) -> str:
    return "—" if r is None else f"{r:.3g}" if r < 1 else f"{r:.2f}"


def fmt_holds(row: Row) -> str:
    h = row.holds
    if h is None:
        return "—"
    return ("yes" if h else "**no**") + ("" if row.exact else "*")


def markdown(rows: list[Row]) -> str:
    """The rows as one markdown table with COLUMNS."""
    out = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * 2 + "---:|" * 3 + "---|" * 4]
    for r in rows:
        cells = [r.part, r.what, f"{r.engine_a} {fmt_value(r.value_a)}", f"{r.engine_b} {fmt_value(r.value_b)}",
                 fmt_ratio(r.ratio), "—" if r.target is None else f">= {r.target:g}", fmt_holds(r), r.threads,
                 r.rss or "—"]
        out.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(out)


@dataclass
class Machine:
    """Where and how the run happened."""
    cpu: str
    nproc: int
    load_before: tuple
    load_after: tuple = ()
    versions: dict = field(default_factory=dict)
    command: str = ""
    started: str = ""
    wall_s: float = 0.0

    def lines(self) -> list[str]:
        la = lambda t: " ".join(f"{x:.2f}" for x in t) if t else "?"          # noqa: E731
        vs = ", ".join(f"{k} {v}" for k, v in self.versions.items())
        return [f"- command: `{self.command}` (started {self.started}, {self.wall_s:.0f} s wall)",
                f"- machine: {self.cpu}, nproc {self.nproc}, {platform.system()} {platform.release()}",
                f"- load average (1, 5, 15 min): before {la(self.load_before)}, after {la(self.load_after)}",
                f"- versions: {vs}"]


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> dict:
    """Versions of Python and every package an engine uses ("not installed" where absent); nothing imported."""
    from importlib.metadata import PackageNotFoundError, version
    out = {"Python": platform.python_version()}
    for name in ("numpy", "numba", "gguf", "ggml-python", "llama_cpp_python", "torch", "sentence-transformers",
                 "rwkv", "mkl"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    try:
        import numpy as np
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        out["NumPy's BLAS"] = f"{blas.get('name')} {blas.get('version')}"
    except Exception:                       # noqa: BLE001 -- the BLAS name is a nicety
        pass
    return out


def report(rows: list[Row], machine: Machine, notes: list[str], quick: bool) -> str:
    """The whole printed report: machine, table, notes."""
    parts = ["# refimpl benchmarks" + (" (--quick: small sizes)" if quick else ""), "", *machine.lines(), "",
             "Every row: two engines measured in the same run, rates (higher is better), ratio = A / B; "
             "1-thread kernel rows in CPU time, all others wall clock. Peak RSS is the VmHWM of each engine's "
             "own process (A / B), or of the one process that measured both.", "",
             markdown(rows) if rows else "(no rows: see the notes)", ""]
    if quick and any(r.target is not None for r in rows):
        parts += ["\\* --quick sizes are smaller than the targets assume: indicative only.", ""]
    held = [r for r in rows if r.holds is not None]
    if held:
        parts += [f"Targets: {sum(r.holds for r in held)} of {len(held)} hold.", ""]
    parts += [f"- {n}" for n in notes]
    return "\n".join(parts)


def write_json(path: str, rows: list[Row], machine: Machine, notes: list[str], quick: bool) -> None:
    doc = {"quick": quick, "machine": asdict(machine), "columns": COLUMNS, "rows": [r.as_dict() for r in rows],
           "notes": notes}
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    os.replace(tmp, path)
