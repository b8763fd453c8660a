"""Every benchmark in one run, one table: `python -m benchmarks [--quick] [--only PART,...] [--threads 1,2] [--json F]`.

Parts, in the order they run (each measurement in its own fresh interpreter, one after another):

    compile     the one-time Numba cost of the first SmolLM2 forward: 8 tokens in a fresh process with an
                empty Numba cache (compile), again with that cache filled (load), against a steady forward
    quants      dequantize / quantize Melem/s per type: refimpl numba, refimpl numpy, gguf-py, ggml C
                (ggml-python, one thread); benchmarks/kernels.py's measurements
    mul_mat     GFLOP/s of a weight (n, k) times m = 1 (decode) / 128 (prefill) f32 rows, F32 F16 Q4_0 Q4_1
                Q8_0 Q4_K Q6_K, SmolLM2's shapes and 4096x4096: refimpl numba (exact and fast) vs ggml
    llama       SmolLM2-135M Q4_1 prefill / decode tokens/s: refimpl (numba exact, numba fast, numpy) vs llama.cpp
                (llama-cpp-python), one process per engine; benchmarks/llama.py's child
    rpc         SmolLM2 decode tokens/s with llama.cpp offloading every layer to `refimpl serve` (numba, fast and
                exact) vs refimpl's own llama.forward in the same backend and numerics; benchmarks/rpc.py's child
    tbo         ggml's test-backend-ops cases/s, op by op, against ggml's own ggml-rpc-server (CPU, 2 threads) and
                `refimpl serve` in exact and in ggml numerics, interleaved; a slice of the suite (--tbo-ops all:
                every op); benchmarks/tbo.py's child
    bert        all-MiniLM-L6-v2 sentences/s, batches of 32: refimpl (numba exact, numba fast, numpy) vs
                sentence-transformers; benchmarks/bert.py's child
    rwkv        RWKV-4 169M-shape (random weights) prefill / decode tokens/s: refimpl (numba exact, numba fast,
                numpy) vs the rwkv package; benchmarks/rwkv.py's child
    gguf_load   loading the SmolLM2 GGUF in a fresh process: refimpl.gguf.load vs gguf-py's GGUFReader
    import_time cold `import refimpl` (a note, no row)

"numba fast" is the Numba backend with REFIMPL_NUMERICS=fast (mul_mat summed in f32, refimpl.numerics); the
issue's model targets are checked for it and for exact mode alike. The bert part also runs the fast engine in a
process started with TUNED_ENV (glibc's heap thresholds, see there): rows without a target, showing what a
process-wide allocator setting, which refimpl leaves to its host process, gains.

Each part's rows go into one markdown table (benchmarks/summary.py): part, what, engine A, engine B,
ratio = A / B, the issue's target and whether it holds, threads, peak RSS (VmHWM of each engine's process).
The machine (CPU, nproc, load average before and after, versions) and the compile cost come with it.
An engine that is not installed, or a model not fetched (`refimpl fetch smollm2`, `refimpl fetch minilm`),
gives a row saying so, never a crash. --quick shrinks every size and repeat and leaves out the refimpl numpy
rows of llama, bert and rwkv (the whole run in ~3 minutes on an idle 2-core machine); its "holds?" answers
carry a * (the targets assume the full sizes).

Numba: every child of one run shares one cache directory (NUMBA_CACHE_DIR), a fresh temporary one unless
NUMBA_CACHE_DIR is set, so that kernel sources edited meanwhile cannot drop refimpl's cache mid-run. Kernels
are compiled or loaded in warm-ups, never inside a timed call.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.summary import Machine, Row, cpu_name, report, target_for, versions, write_json

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("compile", "quants", "mul_mat", "llama", "rpc", "tbo", "bert", "rwkv", "gguf_load", "import_time")
MM_TYPES = ("f32", "f16", "q4_0", "q4_1", "q8_0", "q4_K", "q6_K")
Q_TYPES = ("q4_0", "q8_0", "q4_K", "q6_K")
Q_TYPES_FULL = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq4_nl", "iq4_xs",
                "tq1_0", "tq2_0", "mxfp4")
DEQ_QUICK = ("q4_0", "q4_1", "q8_0", "q4_K", "q6_K", "iq4_xs")
RWKV_FULL = dict(n_layer=12, n_embd=768, vocab=50277)          # RWKV-4-Pile-169M's shape
RWKV_QUICK = dict(n_layer=2, n_embd=256, vocab=4096)


@dataclass
class Config:
    quick: bool
    threads: list
    timeout: float
    numba_cache: str = ""      # NUMBA_CACHE_DIR of every child: this run's own, unless the caller set one
    tbo_ops: str = ""          # the tbo part's selection (--tbo-ops): empty for the slice

    def pick(self, full, quick):
        return quick if self.quick else full


def installed(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- children

def spawn(target: list, job: dict, env: dict, timeout: float) -> dict:
    """Run `python <target>` with the job as JSON on stdin; the last stdout line is the JSON result.
    Failure or timeout gives {"error": ...} instead."""
    full_env = dict(os.environ, TOKENIZERS_PARALLELISM="false", **{k: str(v) for k, v in env.items()})
    try:
        p = subprocess.run([sys.executable, *target], input=json.dumps(job), env=full_env, cwd=ROOT,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if p.returncode:
        last = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
        return {"error": f"exit {p.returncode}: {last[:120]}", "stderr": p.stderr[-3000:]}
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": f"no result: {p.stdout[-200:]!r}"}


def spawn_child(name: str, job: dict, env: dict, cfg: Config) -> dict:
    env = dict(NUMBA_CACHE_DIR=cfg.numba_cache, **env) if cfg.numba_cache and "NUMBA_CACHE_DIR" not in env else env
    return spawn(["-m", "benchmarks", "--child", name], job, env, cfg.timeout)


def thread_env(th: int, backend: str = "numpy", numerics: str = "exact") -> dict:
    return dict(OPENBLAS_NUM_THREADS=th, OMP_NUM_THREADS=th, MKL_NUM_THREADS=th, NUMBA_NUM_THREADS=th,
                REFIMPL_BACKEND=backend, REFIMPL_NUMERICS=numerics)


def peak_rss() -> int:
    from benchmarks.llama import peak_rss as hwm
    return hwm()


def child_kernels(job: dict) -> dict:
    """dequantize / quantize Melem/s of every engine per (type, threads): benchmarks.kernels' measurements."""
    import numba
    import numpy as np

    import refimpl
    from benchmarks import kernels as K
    ggml = K._ggml()
    compile_s = K.warm_up()
    rows = max(1, job["elems"] // 4096)
    x = np.random.default_rng(0).standard_normal((rows, 4096)).astype(np.float32)
    rates, errors = {}, {}
    for th in job["threads"]:
        numba.set_num_threads(th)
        for op, types in (("dequantize", job["deq_types"]), ("quantize", job["q_types"])):
            for t in types:
                try:
                    fns = _kernel_fns(op, refimpl.as_type(t), x, ggml, th == 1)
                    cpu, wall = K.measure(fns, job.get("deq_repeat", job["repeat"]) if op == "dequantize"
                                          else job["repeat"])
                    tm = cpu if th == 1 else wall            # as benchmarks/kernels.py
                    rates[f"{op}|{t}|{th}"] = {k: x.size / 1e6 / s for k, s in tm.items()}
                except Exception as e:                    # noqa: BLE001 -- one type's failure is a cell, not the run
                    errors[f"{op}|{t}|{th}"] = f"{type(e).__name__}: {e}"[:100]
    numba.set_num_threads(1)     # the memory ceiling: a fresh f32 output of the same size, written once
    cpu, _ = K.measure({"fill": lambda: np.empty(x.shape, np.float32).fill(1.0)}, job["repeat"])
    return dict(rates=rates, errors=errors, compile_s=compile_s, ggml=ggml is not None, peak_rss=peak_rss(),
                fill=x.size / 1e6 / cpu["fill"])


def _kernel_fns(op, t, x, ggml, all_engines: bool) -> dict:
    """The functions timed for one (op, type): numba, ggml and gguf-py always, numpy at 1 thread."""
    import refimpl
    from benchmarks import kernels as K
    try:
        import gguf.quants as gq
    except ImportError:
        gq = None
    if op == "dequantize":
        qt = K._qtensor(x, t, ggml)
        fns = {"numba": K._under("numba", lambda: refimpl.dequantize(qt))}
        if all_engines:
            fns["numpy"] = K._under("numpy", lambda: refimpl.dequantize(qt))
        gtype = getattr(gq, "_type_traits", {}).get(t) if gq else None
        if gtype and "dequantize_blocks" in gtype.__dict__:       # NumPy, one thread whatever the setting
            fns["gguf"] = lambda: gq.dequantize(qt.data, t)
        if ggml:
            fns["ggml"] = lambda: ggml.dequantize(qt)
        return fns
    fns = {"numba": K._under("numba", lambda: refimpl.quantize(x, t))}
    if all_engines:
        fns["numpy"] = K._under("numpy", lambda: refimpl.quantize(x, t))
    if ggml:
        fns["ggml"] = lambda: ggml.quantize(x, t)
    return fns


def child_mul_mat(job: dict) -> dict:
    """GFLOP/s of refimpl numba and ggml per (type, n, k, m, threads): benchmarks.kernels.bench_mul_mat's loop."""
    import numba
    import numpy as np

    import refimpl
    from benchmarks import kernels as K
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        threadpool_limits = None
    ggml = K._ggml()
    compile_s = K.warm_up()
    rng = np.random.default_rng(0)
    rates, errors = {}, {}
    for n, k in job["shapes"]:
        w = rng.uniform(-1, 1, (n, k)).astype(np.float32)
        for t in job["types"]:
            if k % refimpl.types.traits(refimpl.as_type(t)).blck_size:
                continue
            a = w if t == "f32" else w.astype(np.float16) if t == "f16" else K._under(
                "numba", lambda: refimpl.quantize(w, t))()
            for m in (1, 128):
                b = rng.uniform(-1, 1, (m, k)).astype(np.float32)
                gm = K.GGMLMatMul(ggml, a, b) if ggml else None
                r = job["repeat"] if n * k * m < 1 << 26 else max(2, job["repeat"] // 2)
                for th in job["threads"]:
                    key = f"{t}|{n}|{k}|{m}|{th}"
                    try:
                        numba.set_num_threads(th)
                        fns = {"numba": K._under("numba", lambda: refimpl.mul_mat(a, b)),
                               "numba fast": K._under("numba", lambda: refimpl.mul_mat(a, b, numerics="fast"))}
                        if gm:
                            fns["ggml"] = lambda th=th: gm(th)
                        with K._blas_threads(threadpool_limits, th):
                            cpu, wall = K.measure(fns, r)
                        tm = cpu if th == 1 else wall
                        rates[key] = {e: 2.0 * n * k * m / 1e9 / s for e, s in tm.items()}
                    except Exception as e:                # noqa: BLE001
                        errors[key] = f"{type(e).__name__}: {e}"[:100]
                if gm:
                    gm.free()
    return dict(rates=rates, errors=errors, compile_s=compile_s, ggml=ggml is not None, peak_rss=peak_rss())


def child_compile(job: dict) -> dict:
    """Seconds of the first and of a second 8-token SmolLM2 forward in this fresh process (numba backend)."""
    from refimpl.models import llama
    model = llama.load(job["path"])
    times = []
    for _ in range(2):
        cache = llama.new_cache(model, 16)
        t0 = time.perf_counter()
        llama.forward(model, job["ids"][:8], cache, last_only=True)
        times.append(time.perf_counter() - t0)
    return dict(first_s=times[0], steady_s=times[1], numba="numba" in sys.modules, peak_rss=peak_rss())


def _prewarm(name: str, job: dict) -> None:
    """Under the numba backend, run the shapes the timed phases use once, so that no kernel compiles (or
    loads from Numba's cache) inside a timed phase: the scripts' own warm-ups use shorter inputs."""
    import refimpl
    if os.environ.get("REFIMPL_BACKEND") != "numba":
        return
    if name == "llama" and job["engine"] == "refimpl":
        from refimpl.models import llama
        model = llama.load(job["path"])
        cache = llama.new_cache(model, len(job["ids"]) + 2)
        llama.forward(model, job["ids"], cache, last_only=True)
        llama.forward(model, job["ids"][:1], cache)
    elif name == "rwkv" and job["engine"] == "refimpl-numba":
        from refimpl import kernels
        from refimpl.models import rwkv
        kernels.load()
        model = rwkv.load(job["safetensors"])
        with refimpl.backend("numba"):
            _, state = rwkv.forward(model, job["ids"], None)
            rwkv.forward(model, job["ids"][:1], state)


def child_script(name: str, job: dict) -> dict:
    """benchmarks/<name>.py's own child on this job (read from a fake stdin), plus this process's peak RSS."""
    import importlib
    _prewarm(name, job)
    mod = importlib.import_module(f"benchmarks.{name}")
    out = io.StringIO()
    sys.stdin = io.StringIO(json.dumps(job))
    with contextlib.redirect_stdout(out):
        mod.child(None) if name == "llama" else mod.child()
    r = json.loads(out.getvalue().strip().splitlines()[-1])
    r.setdefault("peak_rss", peak_rss())
    return r


CHILDREN = {"kernels": child_kernels, "mul_mat": child_mul_mat, "compile": child_compile}


def run_child(name: str) -> None:
    job = json.loads(sys.stdin.read())
    r = CHILDREN[name](job) if name in CHILDREN else child_script(name, job)
    print(json.dumps(r))


# --------------------------------------------------------------------------- parts

def mib(r: dict) -> str:
    return f"{r['peak_rss'] / 2**20:.0f}" if isinstance(r, dict) and "peak_rss" in r else "—"


def smollm2_ids(n: int) -> tuple[str, list] | str:
    """SmolLM2's path and the first n token ids of benchmarks.llama's text, or why not."""
    from refimpl.fetch import path
    p = path("smollm2")
    if not p.is_file():
        return "model missing (refimpl fetch smollm2)"
    from benchmarks.llama import TEXT
    from refimpl import tokenizer
    ids = tokenizer.from_gguf(str(p)).encode(TEXT * 8, add_special=False)[:n]
    return str(p), ids


def part_compile(cfg: Config, notes: list) -> list[Row]:
    if not installed("numba"):
        notes.append("compile: numba not installed")
        return []
    got = smollm2_ids(16)
    if isinstance(got, str):
        notes.append(f"compile: {got}")
        return []
    path, ids = got
    with tempfile.TemporaryDirectory(prefix="refimpl_numba_cache_") as tmp:
        # an empty cache: the run's own while nothing has compiled into it yet (then the other parts reuse it)
        cache = cfg.numba_cache if cfg.numba_cache and not os.listdir(cfg.numba_cache) else tmp
        env = dict(thread_env(1, "numba"), NUMBA_CACHE_DIR=cache)
        cold = spawn_child("compile", dict(path=path, ids=ids), env, cfg)
        warm = spawn_child("compile", dict(path=path, ids=ids), env, cfg)
    if "error" in cold or "error" in warm:
        notes.append(f"compile: {cold.get('error') or warm.get('error')}")
        return []
    steady = min(cold["steady_s"], warm["steady_s"])
    notes.append(
        f"One-time Numba cost of the first model forward (SmolLM2, 8 tokens, fresh process, numba backend, 1 thread): "
        f"{cold['first_s']:.1f} s with an empty Numba cache (import numba + compile), {warm['first_s']:.2f} s with "
        f"the cache filled (load), against {steady * 1e3:.0f} ms for the same forward once warm: "
        f"compile {cold['first_s'] - steady:.1f} s, cache load {warm['first_s'] - steady:.2f} s.")
    return []


def part_quants(cfg: Config, notes: list) -> list[Row]:
    from refimpl.types import type_traits
    if not installed("numba"):
        notes.append("quants: numba not installed (refimpl numba has no numbers)")
        return []
    deq = cfg.pick([type_traits[t].name for t in type_traits if type_traits[t].is_quantized or t.name == "BF16"],
                   list(DEQ_QUICK))
    # a dequantize call is 0.2-10 ms: 25 interleaved rounds cost ~5 s in all and steady the best of each engine,
    # which five rounds left 5-10% apart from run to run; quantize calls take up to seconds, five rounds
    job = dict(elems=cfg.pick(1 << 20, 1 << 16), repeat=cfg.pick(5, 2), deq_repeat=cfg.pick(25, 2),
               threads=cfg.threads, deq_types=deq, q_types=list(cfg.pick(Q_TYPES_FULL, Q_TYPES)))
    r = spawn_child("kernels", job, thread_env(max(cfg.threads), "numba"), cfg)
    if "error" in r:
        notes.append(f"quants: {r['error']}")
        return []
    notes.append(f"quants: kernels compiled or loaded from Numba's cache in {r['compile_s']:.1f} s (before timing); "
                 f"{job['elems']} elements per call, best of {job['deq_repeat']} (dequantize) and {job['repeat']} "
                 f"(quantize) interleaved rounds")
    missed = []                  # types whose 8x-gguf-py target misses, with the rate it asks for
    for t in deq:
        v = r["rates"].get(f"dequantize|{t}|1", {})
        if isinstance(v.get("gguf"), float) and isinstance(v.get("numba"), float) and v["numba"] < 8 * v["gguf"]:
            missed.append(f"{t} {8 * v['gguf']:.0f}")
    missed = ", ".join(missed)
    notes.append(f"quants: the memory ceiling, a fresh f32 output of the same size written once (np.empty + fill, "
                 f"1 thread, CPU time), runs at {r['fill']:.0f} Melem/s, the bound for any dequantizer that returns "
                 "a new array" +
                 (f". 8x gguf-py would need (Melem/s): {missed}" if missed else ""))
    ggml_na = "not installed" if not installed("ggml") else "unavailable"
    gguf_na = "not installed" if not installed("gguf") else "—"
    rows = []
    for op, types in (("dequantize", deq), ("quantize", job["q_types"])):
        for t in types:
            for th in cfg.threads:
                key = f"{op}|{t}|{th}"
                v = r["rates"].get(key)
                if v is None:
                    v = {e: f"error: {r['errors'].get(key, '?')}" for e in ("numba", "numpy")}
                for a, b in _kernel_pairs(op, th):
                    na = ggml_na if b == "ggml" else gguf_na
                    rows.append(_kernel_row(op, t, th, a, v.get(a, "—"), b, v.get(b, na), mib(r), not cfg.quick))
    return rows


def _kernel_pairs(op: str, th: int) -> list:
    """(A, B) engines of the rows of one (op, type, threads): refimpl numpy is timed at 1 thread only."""
    if th != 1:
        return [("numba", "ggml"), ("numba", "gguf")] if op == "dequantize" else [("numba", "ggml")]
    if op == "dequantize":
        return [("numba", "ggml"), ("numba", "gguf"), ("numpy", "gguf")]
    return [("numba", "ggml"), ("numpy", "ggml")]


ENGINE = {"numba": "refimpl numba", "numpy": "refimpl numpy", "ggml": "ggml C", "gguf": "gguf-py"}


def _kernel_row(op, t, th, a, va, b, vb, rss, exact) -> Row:
    a, b = ENGINE[a], ENGINE[b]
    threads = str(th) if th == 1 or b not in ("ggml C", "gguf-py") else f"{th} ({b}: 1)"
    return Row("quants", f"{op} {t}, Melem/s", a, va, b, vb, threads, f"{rss} (one process)",
               key=f"{op} {t}", target=target_for(f"{op} {t}", a, b, th), exact=exact)


def part_mul_mat(cfg: Config, notes: list) -> list[Row]:
    if not installed("numba"):
        notes.append("mul_mat: numba not installed")
        return []
    shapes = cfg.pick([(576, 576), (192, 576), (1536, 576), (576, 1536), (4096, 4096)], [(576, 1536)])
    job = dict(shapes=shapes, types=list(MM_TYPES), repeat=cfg.pick(5, 2), threads=cfg.threads)
    r = spawn_child("mul_mat", job, thread_env(max(cfg.threads), "numba"), cfg)
    if "error" in r:
        notes.append(f"mul_mat: {r['error']}")
        return []
    notes.append("mul_mat: shapes (n, k) = " + ", ".join(f"{n}x{k}" for n, k in shapes) + " (SmolLM2-135M: q/o "
                 "576x576, k/v 192x576, gate/up 1536x576, down 576x1536; K-quants need k % 256 == 0); "
                 f"best of {job['repeat']}")
    na = "not installed" if not installed("ggml") else "unavailable"
    rows = []
    for key, v in r["rates"].items():
        t, n, k, m, th = key.split("|")
        phase = "decode" if m == "1" else "prefill"
        for eng in ("numba", "numba fast"):
            rows.append(Row("mul_mat", f"{t} weight {n}x{k}, m={m} ({phase}), GFLOP/s", f"refimpl {eng}",
                            v.get(eng, "—"), "ggml C", v.get("ggml", na), th, f"{mib(r)} (one process)",
                            key=f"mul_mat {t}", exact=not cfg.quick))
    for key, err in r["errors"].items():
        t, n, k, m, th = key.split("|")
        rows.append(Row("mul_mat", f"{t} weight {n}x{k}, m={m}", "refimpl numba", f"error: {err}", "ggml C", "—", th))
    return rows


def _numpy_engine(cfg: Config, job_engine: str) -> list:
    """refimpl on the NumPy backend, an engine of full runs only (no target concerns it)."""
    return [] if cfg.quick else [("refimpl numpy", True, job_engine, "numpy")]


REFIMPL_ENGINES = ("refimpl numba", "refimpl numba fast", "refimpl numba fast, tuned env", "refimpl numpy")

# A process setting that a model run with many large temporaries gains from (measured on MiniLM, docs/benchmarks.md):
# glibc returns the top of the heap to the system whenever the free space there exceeds its (dynamic) trim
# threshold, so a batch whose working set swings by tens of MB a layer touches fresh pages again (~10,000 minor
# faults a long MiniLM batch with the model's fused kernels, ~45,000 without). It is the host process's choice
# (environment or mallopt), not a library's. So are OpenBLAS's spinning workers, the other such cost: after a
# threaded call they spin ~0.1 s before they sleep, beside the kernels that follow; OPENBLAS_THREAD_TIMEOUT=4, its
# documented setting, makes them sleep at once (refimpl/kernels/blas.py).
TUNED_ENV = dict(MALLOC_MMAP_THRESHOLD_="1073741824", MALLOC_TRIM_THRESHOLD_="1073741824",
                 OPENBLAS_THREAD_TIMEOUT="4")


def _fast_engine(job_engine: str) -> tuple:
    """refimpl on the Numba backend with numerics="fast" (mul_mat summed in f32: BLAS tiles, fused decode)."""
    return ("refimpl numba fast", installed("numba"), job_engine, "numba", "fast")


def _engine_runs(name, cfg, engines, job_of) -> dict:
    """{(engine, threads): result} for each engine (label, installed?, job engine, backend[, numerics][, extra
    environment]) and thread count."""
    res = {}
    for th in cfg.threads:
        for label, ok, eng, backend, *rest in engines:
            if not ok:
                res[label, th] = {"error": "not installed"}
                continue
            extra = rest.pop() if rest and isinstance(rest[-1], dict) else {}
            t0 = time.perf_counter()
            res[label, th] = spawn_child(name, job_of(eng, th), dict(thread_env(th, backend, *rest), **extra), cfg)
            log(f"  {name}: {label} with {th} thread(s) in {time.perf_counter() - t0:.0f} s"
                + (f"  ERROR {res[label, th]['error']}" if "error" in res[label, th] else ""))
    return res


def _model_rows(part, res, cfg, refs, metrics) -> list[Row]:
    """Rows of every refimpl engine against the reference engine `refs` for each (what, key, value fn) metric."""
    rows = []
    for th in cfg.threads:
        ref = res[refs, th]
        for label in REFIMPL_ENGINES:
            r = res.get((label, th))
            if r is None:
                continue
            for what, key, value in metrics:
                va = r["error"] if "error" in r else value(r)
                vb = ("not installed" if ref["error"] == "not installed" else f"error: {ref['error']}") \
                    if "error" in ref else value(ref)
                if isinstance(va, str) and not va.startswith(("error", "not installed")):
                    va = f"error: {va}"
                rows.append(Row(part, what, label, va, refs, vb, str(th), f"{mib(r)} / {mib(ref)}", key=key,
                                target=target_for(key, label, refs, th), exact=not cfg.quick))
    return rows


def part_llama(cfg: Config, notes: list) -> list[Row]:
    n_p, n_g = cfg.pick(128, 16), cfg.pick(32, 4)
    got = smollm2_ids(n_p)
    if isinstance(got, str):
        threads = ",".join(map(str, cfg.threads))
        return [Row("llama", "SmolLM2-135M Q4_1", "refimpl numba", got, "llama.cpp", got, threads)]
    path, ids = got
    engines = [("refimpl numba", installed("numba"), "refimpl", "numba"), _fast_engine("refimpl"),
               *_numpy_engine(cfg, "refimpl"), ("llama.cpp", installed("llama_cpp"), "llama.cpp", "numpy")]
    res = _engine_runs("llama", cfg, engines,
                       lambda e, th: dict(engine=e, threads=th, path=path, ids=ids, n_gen=n_g))
    notes.append(f"llama: SmolLM2-135M-Instruct Q4_1; prefill = one forward over {len(ids)} prompt tokens, decode = "
                 f"{n_g} greedy single-token forwards after it; llama.cpp as benchmarks/llama.py runs it "
                 f"(no repacking, f16 KV cache); tokens/s wall clock")
    return _model_rows("llama", res, cfg, "llama.cpp", [
        (f"SmolLM2 Q4_1 prefill {len(ids)} tokens, tok/s", "llama prefill", lambda r: len(ids) / r["prefill_wall"]),
        (f"SmolLM2 Q4_1 decode {n_g} tokens, tok/s", "llama decode", lambda r: n_g / r["decode_wall"])])


def part_rpc(cfg: Config, notes: list) -> list[Row]:
    n_p, n_g = cfg.pick(32, 16), cfg.pick(32, 4)
    got = smollm2_ids(n_p)
    threads = ",".join(map(str, cfg.threads))
    if isinstance(got, str):
        return [Row("rpc", "SmolLM2 decode via refimpl serve", "llama.cpp on refimpl serve", got, "refimpl numba", got,
                    threads)]
    if not (installed("numba") and installed("llama_cpp")):
        why = "not installed (numba, llama-cpp-python)"
        return [Row("rpc", "SmolLM2 decode via refimpl serve", "llama.cpp on refimpl serve", why, "refimpl numba", why,
                    threads)]
    path, ids = got
    rows = []
    for th in cfg.threads:
        for numerics, label in (("fast", "refimpl numba fast"), ("exact", "refimpl numba")):
            env = thread_env(th, "numba", numerics)
            # interleaved rounds, the best decode of each engine: one round swings +-20 % on a shared machine
            runs = [(spawn_child("rpc", dict(path=path, ids=ids, n_gen=n_g), env, cfg),
                     spawn_child("llama", dict(engine="refimpl", threads=th, path=path, ids=ids, n_gen=n_g), env,
                                 cfg)) for _ in range(cfg.pick(3, 1))]
            served = min((r[0] for r in runs), key=lambda r: r.get("decode_wall", float("inf")))
            own = min((r[1] for r in runs), key=lambda r: r.get("decode_wall", float("inf")))
            log(f"  rpc: {numerics} with {th} thread(s)" + "".join(f"  ERROR {r['error']}" for r in (served, own)
                                                                   if "error" in r))
            va = served["error"] if "error" in served else n_g / served["decode_wall"]
            vb = own["error"] if "error" in own else n_g / own["decode_wall"]
            rows.append(Row("rpc", f"SmolLM2 Q4_1 decode {n_g} tokens through refimpl serve, tok/s",
                            f"llama.cpp on refimpl serve ({numerics})", va, label, vb, str(th),
                            f"{mib(served)} / {mib(own)}", key="rpc decode", target=0.5, exact=not cfg.quick))
    notes.append(f"rpc: llama.cpp (llama-cpp-python, -ngl 99) offloads SmolLM2 to `refimpl serve --backend numba` in "
                 f"its own process; prefill {len(ids)} tokens then {n_g} greedy decodes, against refimpl's own "
                 f"llama.forward (benchmarks/llama.py's child) in the same backend and numerics, the best of "
                 f"{cfg.pick(3, 1)} interleaved runs of each; "
                 f"the server's threads "
                 f"are NUMBA_NUM_THREADS")
    return rows


def part_tbo(cfg: Config, notes: list) -> list[Row]:
    from benchmarks import tbo
    what = "test-backend-ops, cases/s"
    cached = subprocess.run(["bash", str(ROOT / "scripts" / "build_llamacpp.sh"), "--cached"], capture_output=True)
    if cached.returncode:
        why = "test-backend-ops not built (bash scripts/build_llamacpp.sh)"
        return [Row("tbo", what, "refimpl serve exact", why, "ggml-rpc-server", why, "2")]
    ops = cfg.tbo_ops or ",".join(tbo.QUICK if cfg.quick else tbo.SLICE)
    sys.path.insert(0, str(ROOT / "scripts"))
    from llama_archs import _bin
    import dataclasses
    long = dataclasses.replace(cfg, timeout=max(cfg.timeout, 6 * 3600.0)) if ops == "all" else cfg
    r = spawn_child("tbo", dict(ops=tbo.parse_ops(ops, _bin()), threads=2), {}, long)
    if "error" in r:
        return [Row("tbo", what, "refimpl serve exact", r["error"], "ggml-rpc-server", r["error"], "2")]
    rows, res = [], r["rows"]
    for x in res + [{"op": "all", "params": None, "cases": sum(x["cases"] for x in res),
                     **{k: sum(x[k] for x in res) for k in ("ggml-rpc-server", "refimpl exact", "refimpl ggml",
                                                            "refimpl exact in ops", "refimpl ggml in ops")}}]:
        label = f"{x['op']}{' -p ' + x['params'] if x['params'] else ''} ({x['cases']} cases)"
        for eng, target in (("refimpl exact", 0.909 if x["op"] == "all" else 0.667),     # within 1.1x / 1.5x of C
                            ("refimpl ggml", 0.769 if x["op"] == "all" else None)):       # within 1.3x
            rows.append(Row("tbo", f"{label}, cases/s; {x[eng + ' in ops']:.1f} of refimpl's {x[eng]:.1f} s in ops",
                            f"{eng.replace('refimpl', 'refimpl serve')}", x["cases"] / x[eng], "ggml-rpc-server",
                            x["cases"] / x["ggml-rpc-server"], "2", key="tbo", target=target, exact=not cfg.quick))
    notes.append("tbo: test-backend-ops (scripts/build_llamacpp.sh's portable build) `test -b RPC0 -o OP [-p REGEX]` "
                 "once per op against each server, the order rotated op by op; ggml-rpc-server is the same build's "
                 "CPU backend at 2 threads, refimpl serve the Numba backend; the floor every server shares is "
                 "test-backend-ops' own work (inputs, ggml-cpu's side); targets: 1/1.1 overall and 1/1.5 per op "
                 "in exact numerics, 1/1.3 overall in ggml numerics")
    return rows


def part_bert(cfg: Config, notes: list) -> list[Row]:
    from refimpl.fetch import path
    d = path("minilm")
    if not d.is_dir():
        why = "model missing (refimpl fetch minilm)"
        return [Row("bert", "MiniLM sent/s", "refimpl numba", why, "sentence-transformers", why, "—")]
    tuned = [] if cfg.quick else [("refimpl numba fast, tuned env", installed("numba"), "refimpl", "numba", "fast",
                                   TUNED_ENV)]
    engines = [("refimpl numba", installed("numba"), "refimpl", "numba"), _fast_engine("refimpl"), *tuned,
               *_numpy_engine(cfg, "refimpl"),
               ("sentence-transformers", installed("torch", "sentence_transformers"), "st", "numpy")]
    rep = cfg.pick(3, 1)
    res = _engine_runs("bert", cfg, engines, lambda e, th: dict(engine=e, threads=th, repeat=rep, dir=str(d), gguf=""))
    notes.append(f"bert: all-MiniLM-L6-v2, one batch of 32 sentences per call (short ~12 words, long ~60), mean "
                 f"pooling, normalized; one warm-up, best of {rep}; sentence-transformers on torch CPU" +
                 ("" if cfg.quick else "; \"tuned env\": the fast engine in a process started with "
                  + " ".join(f"{k}={v}" for k, v in TUNED_ENV.items()) + " (no target: a setting of the process, "
                  "not of refimpl)"))
    return _model_rows("bert", res, cfg, "sentence-transformers", [
        ("MiniLM batch of 32 short sentences, sent/s", "bert short", lambda r: 32 / r["short"]),
        ("MiniLM batch of 32 long sentences, sent/s", "bert long", lambda r: 32 / r["long"])])


def write_rwkv4(d: Path, n_layer: int, n_embd: int, vocab: int) -> dict:
    """A random RWKV-4 model (tests/models/rwkv_tiny.py) as .safetensors (refimpl) and, with torch, .pth (rwkv)."""
    import numpy as np
    from safetensors.numpy import save_file

    from tests.models.rwkv_tiny import tiny_state_dict
    sd = tiny_state_dict("4", n_layer=n_layer, n_embd=n_embd, vocab=vocab, seed=4)
    out = {"safetensors": str(d / "rwkv4.safetensors"), "pth": str(d / "rwkv4.pth")}
    save_file({k: np.ascontiguousarray(v) for k, v in sd.items()}, out["safetensors"])
    if installed("torch"):
        import torch
        torch.save({k: torch.from_numpy(np.array(v, np.float32)) for k, v in sd.items()}, out["pth"])
    return out


def part_rwkv(cfg: Config, notes: list) -> list[Row]:
    import numpy as np
    shape = cfg.pick(RWKV_FULL, RWKV_QUICK)
    n_p, n_g, rep = cfg.pick(128, 16), cfg.pick(32, 4), cfg.pick(3, 1)
    engines = [("refimpl numba", installed("numba"), "refimpl-numba", "numba"), _fast_engine("refimpl-numba"),
               *_numpy_engine(cfg, "refimpl"), ("rwkv", installed("torch", "rwkv"), "rwkv", "numpy")]
    ids = [int(i) for i in np.random.default_rng(0).integers(1, shape["vocab"], n_p)]
    with tempfile.TemporaryDirectory(prefix="rwkv_bench_") as tmp:
        files = write_rwkv4(Path(tmp), **shape)
        res = _engine_runs("rwkv", cfg, engines, lambda e, th: dict(engine=e, version="4", threads=th, ids=ids,
                                                                    n_gen=n_g, repeat=rep, **files))
    name = f"RWKV-4 {shape['n_layer']}x{shape['n_embd']} vocab {shape['vocab']}"
    notes.append(f"rwkv: {name} (random weights, f32{'' if cfg.quick else '; RWKV-4-Pile-169M shape'}); prefill "
                 f"{n_p} tokens, decode {n_g}, best of {rep}; the rwkv package with RWKV_JIT_ON=1, strategy cpu fp32")
    for th in cfg.threads:
        per_token = {lb: f"{1e3 * r['decode_wall'] / n_g:.1f} ms" for (lb, t), r in res.items()
                     if t == th and "decode_wall" in r}
        if per_token:
            notes.append(f"rwkv: decode time per token, {th} thread(s): "
                         + ", ".join(f"{k} {v}" for k, v in per_token.items()))
    for r in res.values():           # rwkv.py's child reports an engine's failure as a result
        if "error" in r and r["error"] != "not installed":
            r["error"] = r["error"][:120]
    return _model_rows("rwkv", res, cfg, "rwkv", [
        (f"{name} prefill {n_p} tokens, tok/s", "rwkv4 prefill", lambda r: n_p / r["prefill_wall"]),
        (f"{name} decode {n_g} tokens, tok/s", "rwkv4 decode", lambda r: n_g / r["decode_wall"])])


def part_gguf_load(cfg: Config, notes: list) -> list[Row]:
    from refimpl.fetch import path
    p = path("smollm2")
    if not p.is_file() or not installed("gguf"):
        why = "model missing (refimpl fetch smollm2)" if not p.is_file() else "not installed"
        return [Row("gguf_load", "load SmolLM2 GGUF", "refimpl", why, "gguf-py", why, "1")]
    runs = {}
    for kind in ("refimpl", "gguf"):
        out = [spawn([str(ROOT / "benchmarks" / "gguf_load.py"), str(p), "--one", kind], {}, {}, cfg.timeout)
               for _ in range(cfg.pick(3, 1))]
        runs[kind] = out
    bad = next((r["error"] for rs in runs.values() for r in rs if "error" in r), None)
    if bad:
        return [Row("gguf_load", "load SmolLM2 GGUF", "refimpl", f"error: {bad}", "gguf-py", "—", "1")]
    rss = {k: sorted(r["rss_delta"] for r in rs)[len(rs) // 2] / 2**20 for k, rs in runs.items()}
    best = {k: min(r["seconds"] for r in rs) for k, rs in runs.items()}
    notes.append(f"gguf_load: best of {len(runs['refimpl'])} fresh processes: refimpl {best['refimpl'] * 1e3:.1f} ms, "
                 f"gguf-py GGUFReader {best['gguf'] * 1e3:.0f} ms; RSS column = growth across the load")
    return [Row("gguf_load", f"load {p.name} (fresh process), loads/s", "refimpl", 1 / best["refimpl"],
                "gguf-py", 1 / best["gguf"], "1", f"+{rss['refimpl']:.0f} / +{rss['gguf']:.0f}", key="gguf_load")]


def part_import_time(cfg: Config, notes: list) -> list[Row]:
    p = subprocess.run([sys.executable, "-m", "benchmarks.import_time", "--runs", str(cfg.pick(5, 2))], cwd=ROOT,
                       capture_output=True, text=True, timeout=cfg.timeout)
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in p.stdout.splitlines() if line.startswith("|")]
    notes.append("import_time: " + ("; ".join(f"{a} {b}" for a, b in cells) if p.returncode == 0 and cells
                                    else f"failed: {p.stderr.strip()[-200:]}") + " (cold, median)")
    return []


PART_FNS = {"compile": part_compile, "quants": part_quants, "mul_mat": part_mul_mat, "llama": part_llama,
            "rpc": part_rpc, "tbo": part_tbo,
            "bert": part_bert, "rwkv": part_rwkv, "gguf_load": part_gguf_load, "import_time": part_import_time}


# --------------------------------------------------------------------------- main

def parse(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes and repeats (about 3 minutes in all)")
    ap.add_argument("--only", default="", help=f"comma-separated parts, from {','.join(PARTS)}")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--json", help="also write the rows, machine and notes here")
    ap.add_argument("--tbo-ops", default="", metavar="OPS", help="the tbo part's ops, OP[:REGEX],... or all "
                    "(the whole test-backend-ops suite, hours); default: a slice of the suite")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    want = [p for p in a.only.split(",") if p] or list(PARTS)
    bad = [p for p in want if p not in PARTS]
    if bad:
        ap.error(f"unknown part(s) {','.join(bad)}: choose from {','.join(PARTS)}")
    a.parts = [p for p in PARTS if p in want]        # PARTS' order: compile first fills the run's Numba cache
    a.thread_list = [int(t) for t in a.threads.split(",") if t]
    if not a.thread_list or min(a.thread_list) < 1:
        ap.error(f"--threads {a.threads!r}: positive integers")
    return a


def main(argv=None) -> None:
    a = parse(argv)
    if a.child:
        run_child(a.child)
        return
    with tempfile.TemporaryDirectory(prefix="refimpl_bench_numba_") as cache:
        # one Numba cache for the run's children: kernel sources edited meanwhile cannot drop it mid-run
        cfg = Config(a.quick, a.thread_list, 600 if a.quick else 7200, os.environ.get("NUMBA_CACHE_DIR") or cache,
                     a.tbo_ops)
        run(a, cfg, argv)


def run(a, cfg: Config, argv) -> None:
    """Every part of a.parts in turn; print the report (and write the JSON)."""
    machine = Machine(cpu_name(), os.cpu_count() or 0, os.getloadavg(), versions=versions(),
                      command="python -m benchmarks " + " ".join(argv if argv is not None else sys.argv[1:]),
                      started=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    t0 = time.perf_counter()
    rows, notes = [], []
    for part in a.parts:
        t1 = time.perf_counter()
        log(f"[{part}] ...")
        try:
            rows += PART_FNS[part](cfg, notes)
        except Exception as e:                      # noqa: BLE001 -- one part's failure must not lose the others
            notes.append(f"{part}: failed: {type(e).__name__}: {e}")
        log(f"[{part}] {time.perf_counter() - t1:.0f} s")
    machine.load_after, machine.wall_s = os.getloadavg(), time.perf_counter() - t0
    print(report(rows, machine, notes, a.quick))
    if a.json:
        write_json(a.json, rows, machine, notes, a.quick)


if __name__ == "__main__":
    main()
