"""SmolLM2-135M generation speed: refimpl's Llama vs llama.cpp (llama-cpp-python), prefill and decode.

    python benchmarks/llama.py [MODEL.gguf] [--prompt 128] [--gen 32] [--threads 1,2] [--engines ...]

Every (engine, threads) pair runs in a fresh interpreter, so its peak RSS (VmHWM) is its own;
the pairs run one after another, never at the same time. The model is SmolLM2-135M-Instruct Q4_1
(`refimpl.fetch.path("smollm2")`, `refimpl fetch smollm2`) unless a path is given.

  refimpl      refimpl.models.llama, weights kept quantized and memory-mapped (each mul_mat dequantizes
               TILE_ROWS rows at a time), NumPy backend, exact numerics (f64 sums), f32 KV cache
  refimpl-dq   the same with `load(dequantize_weights=True)`: every matrix dequantized once, at load
  llama.cpp    llama-cpp-python's Llama on the CPU backend: n_threads = n_threads_batch = threads, weights
               as the goldens use them (mmap'ed, no repacking: use_extra_bufts=False), flash attention off,
               f16 KV cache, n_batch = n_ubatch = 512 (the prompt is one micro-batch), logits of the last
               position only

Threads: llama.cpp's n_threads; for refimpl OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = threads (NumPy's
BLAS does the mat-muls; everything else is single-threaded NumPy).

The prompt is the first --prompt token ids of a fixed English text (refimpl's tokenizer, the same ids for
every engine). After one untimed warm-up (16 tokens, then 1), each engine runs
  prefill   one forward over the whole prompt, then the argmax of the last position's logits
  decode    --gen single-token forwards, each fed the previous argmax (greedy), argmax after each
Time is measured two ways for each phase: wall clock (time.perf_counter) and CPU time of the process
(time.process_time: all its threads). On a machine shared with other jobs the wall clock counts their
load; CPU time nearly does not, but it counts llama.cpp's worker threads spinning while they wait, so
neither is the whole truth: the table gives both. "tok/s" is tokens over wall seconds, "tok/CPU-s"
tokens over CPU seconds; "x" columns are the engine's time divided by llama.cpp's at the same thread
count (how many times slower). Peak RSS includes the interpreter, the imports (shown: RSS before the
load) and the pages of the memory-mapped GGUF that were touched. "greedy": how many generated tokens
equal llama.cpp's before the first difference (the first is the prefill's argmax; a near tie can send
the two continuations apart).
Record results in docs/benchmarks.md ("SmolLM2-135M generation").
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ENGINES = ("refimpl", "refimpl-dq", "llama.cpp")
TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg, a goldsmith "
        "from Mainz, combined movable metal type, oil-based ink and a wooden screw press into a system that "
        "could produce books faster and more cheaply than any scribe. Within fifty years, presses were running "
        "in more than two hundred cities across Europe, and millions of volumes had been printed. The effects "
        "were profound: literacy spread, scientific results could be shared and checked, and religious and "
        "political ideas travelled further than ever before. Historians still debate how quickly these "
        "changes happened, and which of them the press caused rather than merely accelerated. ")


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def peak_rss() -> int:
    """Peak resident set of this process, bytes: VmHWM, not ru_maxrss, which a child started by vfork
    (subprocess) inherits from its parent's high-water mark."""
    try:
        return _status_kib("VmHWM") * 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024     # Linux: KiB


def rss() -> int:
    try:
        return _status_kib("VmRSS") * 1024
    except (OSError, StopIteration):
        return 0


def timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def run_refimpl(path: str, ids: list[int], n_gen: int, dequantize: bool) -> dict:
    import numpy as np

    from refimpl.models import llama
    base = rss()
    model, load_s, _ = timed(lambda: llama.load(path, dequantize_weights=dequantize))
    n_vocab = model.hparams.n_vocab
    warm = llama.new_cache(model, 24)                 # 16 tokens: the prefill path (more rows than a
    llama.forward(model, ids[:16], warm, last_only=True)   # decode product takes) is compiled here too
    llama.forward(model, ids[16:17], warm)
    cache = llama.new_cache(model, len(ids) + n_gen + 1)

    def prefill():
        return int(np.argmax(llama.forward(model, ids, cache, last_only=True)[-1]))

    def decode(t):
        out = []
        for _ in range(n_gen):
            t = int(np.argmax(llama.forward(model, [t], cache)[-1]))
            out.append(t)
        return out

    t0, pw, pc = timed(prefill)
    rest, dw, dc = timed(lambda: decode(t0))
    return dict(load_s=load_s, prefill_wall=pw, prefill_cpu=pc, decode_wall=dw, decode_cpu=dc,
                tokens=[t0] + rest, base_rss=base, peak_rss=peak_rss(), n_vocab=n_vocab)


def run_llama_cpp(path: str, ids: list[int], n_gen: int, threads: int) -> dict:
    import llama_cpp
    import llama_cpp.llama_cpp as C

    base = rss()
    default = C.llama_model_default_params

    def no_repack_params():
        p = default()
        p.use_extra_bufts = False      # as scripts/gen_llama_goldens.py: weights stay in their GGUF layout
        return p

    C.llama_model_default_params = no_repack_params
    try:
        llm, load_s, _ = timed(lambda: llama_cpp.Llama(
            path, n_ctx=512, n_batch=512, n_ubatch=512, n_threads=threads, n_threads_batch=threads,
            n_gpu_layers=0, use_mmap=True, logits_all=False, flash_attn=False, verbose=False))
    finally:
        C.llama_model_default_params = default
    n_vocab = llm.n_vocab()

    r = time_llama_cpp(llm, ids, n_gen, warm=8)
    return dict(load_s=load_s, **r, base_rss=base, peak_rss=peak_rss(), n_vocab=n_vocab,
                use_extra_bufts=bool(llm.model_params.use_extra_bufts))


def time_llama_cpp(llm, ids: list[int], n_gen: int, warm: int) -> dict:
    """A warm-up over ids[:warm] and one more token, then one timed prefill of ids and n_gen timed greedy
    single-token decodes of a llama_cpp.Llama (wall and CPU seconds, the tokens)."""
    import llama_cpp.llama_cpp as C
    import numpy as np
    n_vocab = llm.n_vocab()

    def argmax_last():
        return int(np.argmax(np.ctypeslib.as_array(C.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))))

    llm.eval(ids[:warm])
    llm.eval(ids[warm:warm + 1])
    llm.reset()

    def prefill():
        llm.eval(ids)
        return argmax_last()

    def decode(t):
        out = []
        for _ in range(n_gen):
            llm.eval([t])
            t = argmax_last()
            out.append(t)
        return out

    t0, pw, pc = timed(prefill)
    rest, dw, dc = timed(lambda: decode(t0))
    return dict(prefill_wall=pw, prefill_cpu=pc, decode_wall=dw, decode_cpu=dc, tokens=[t0] + rest)


def child(args) -> None:
    job = json.loads(sys.stdin.read())
    if job["engine"] == "llama.cpp":
        r = run_llama_cpp(job["path"], job["ids"], job["n_gen"], job["threads"])
    else:
        r = run_refimpl(job["path"], job["ids"], job["n_gen"], job["engine"] == "refimpl-dq")
    print(json.dumps(r))


def spawn(engine: str, threads: int, path: str, ids: list[int], n_gen: int) -> dict:
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads), REFIMPL_BACKEND="numpy")
    job = json.dumps(dict(engine=engine, threads=threads, path=path, ids=ids, n_gen=n_gen))
    p = subprocess.run([sys.executable, __file__, "--child"], input=job, env=env, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"{engine} ({threads} threads) failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def versions() -> str:
    import numpy as np
    out = [f"Python {platform.python_version()}", f"NumPy {np.__version__}"]
    try:
        cfg = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        out.append(f"{cfg.get('name')} {cfg.get('version')}")
    except Exception:   # noqa: BLE001 -- the BLAS name is a nicety
        pass
    try:
        import llama_cpp
        out.append(f"llama-cpp-python {llama_cpp.__version__} ({llama_cpp.llama_print_system_info().decode().strip()})")
    except ImportError:
        pass
    return ", ".join(out)


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", nargs="?")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens (prefill)")
    ap.add_argument("--gen", type=int, default=32, help="generated tokens (decode)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, from {', '.join(ENGINES)}")
    ap.add_argument("--json", help="also write the raw results here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    from refimpl.fetch import path as model_path
    path = Path(args.path) if args.path else model_path("smollm2")
    if not path.is_file():
        sys.exit(f"{path} is missing: refimpl fetch smollm2")
    from refimpl import tokenizer
    tok = tokenizer.from_gguf(str(path))
    ids = tok.encode(TEXT * 8, add_special=False)[:args.prompt]
    if len(ids) < max(args.prompt, 9):
        sys.exit(f"the text gives only {len(ids)} tokens")
    engines = [e for e in args.engines.split(",") if e]
    threads = [int(t) for t in args.threads.split(",") if t]
    print(f"{path.name} ({path.stat().st_size / 1e6:.0f} MB); prefill {len(ids)} tokens, decode {args.gen}; "
          f"{os.cpu_count()} CPUs ({cpu_name()}); load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(versions())
    res = {}
    for th in threads:
        for e in engines:
            t0 = time.perf_counter()
            res[e, th] = r = spawn(e, th, str(path), ids, args.gen)
            print(f"  ran {e} with {th} thread(s) in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
            if e == "llama.cpp":
                assert not r["use_extra_bufts"]
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    n_p, n_d = len(ids), args.gen
    head = ("| engine | threads | prefill tok/s | prefill tok/CPU-s | decode tok/s | decode tok/CPU-s | "
            "prefill x (wall / CPU) | decode x (wall / CPU) | greedy | load s | peak RSS MiB (before load) |")
    print(head)
    print("|" + "---|" * head.count(" | ") + "---|")
    def ratio(r, ref, k):   # engine time / llama.cpp time, wall and CPU
        return f"{r[k + '_wall'] / ref[k + '_wall']:.1f} / {r[k + '_cpu'] / ref[k + '_cpu']:.1f}"

    for th in threads:
        ref = res.get(("llama.cpp", th))
        for e in engines:
            r = res[e, th]
            if ref is not None:
                same = next((i for i, (a, b) in enumerate(zip(r["tokens"], ref["tokens"])) if a != b),
                            min(len(r["tokens"]), len(ref["tokens"])))
                px, dx, greedy = ratio(r, ref, "prefill"), ratio(r, ref, "decode"), f"{same}/{len(ref['tokens'])}"
            else:
                px = dx = greedy = "-"
            print(f"| {e} | {th} | {n_p / r['prefill_wall']:.1f} | {n_p / r['prefill_cpu']:.1f} | "
                  f"{n_d / r['decode_wall']:.1f} | {n_d / r['decode_cpu']:.1f} | {px} | {dx} | {greedy} | "
                  f"{r['load_s']:.2f} | {r['peak_rss'] / 2**20:.0f} ({r['base_rss'] / 2**20:.0f}) |")
    if args.json:
        Path(args.json).write_text(json.dumps({f"{e}@{th}": r for (e, th), r in res.items()}, indent=1))


if __name__ == "__main__":
    main()
