"""RWKV 0.1B-shape speed: refimpl's RWKV v4-v7 vs the `rwkv` package (torch CPU) vs llama.cpp, prefill and decode.

    python benchmarks/rwkv.py [--versions 4,5,6,7] [--threads 1,2] [--engines ...] [--prompt 128] [--gen 32]

The models are random (tests/models/rwkv_tiny.py `tiny_state_dict`, values drawn like trained weights) in the
shape of the smallest released ones: 12 layers, n_embd 768, head size 64, vocabulary 50277 for v4 (the shape of
RWKV-4-Pile-169M) and 65536 for v5.2 / v6 / v7 (the World 0.1B models); n_ffn 3072 (v6: 2688); every v6 / v7
low-rank projection of rank 64. Each version is written once as .pth (for the rwkv package), .safetensors (for
refimpl) and, for v6 / v7, the f32 GGUF refimpl's converter writes (for llama.cpp), all float32.

Every (version, engine, threads) runs in a fresh interpreter, one after another; after a warm-up (two 8-token
sequences, four single tokens) each repetition runs
  prefill   one forward over --prompt token ids from a new state, then the argmax of the last logits
  decode    --gen single-token forwards, each fed the previous argmax (greedy)
and the best of --repeat repetitions is kept for each phase (wall clock; CPU time of the same repetition is
reported too).

  refimpl        refimpl.models.rwkv from the .safetensors, NumPy backend, exact numerics
                 (OPENBLAS_NUM_THREADS = threads)
  refimpl-numba  the same with the Numba backend (refimpl.kernels; NUMBA_NUM_THREADS = threads); "-" when the
                 kernels do not import
  rwkv           the rwkv pip package, RWKV(model, strategy="cpu fp32") with RWKV_JIT_ON=1 (its normal mode),
                 RWKV_CUDA_ON=0, RWKV_V7_ON=1 for v7; torch.set_num_threads(threads)
  llama.cpp      llama-cpp-python on the f32 GGUF (rwkv6, rwkv7 only), n_threads = n_threads_batch = threads,
                 n_batch = n_ubatch = 512 (the prompt is one micro-batch)

"x rwkv" columns: the engine's tokens/s over the rwkv package's at the same version and thread count (higher
is better). "greedy": generated tokens equal to the rwkv package's before the first difference (random models
have near ties, so a late difference is not an error). Record results in docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# this file is benchmarks/rwkv.py: its folder must not shadow the `rwkv` package it measures
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))

ENGINES = ("refimpl", "refimpl-numba", "rwkv", "llama.cpp")
VERSIONS = ("4", "5", "6", "7")
SHAPE = dict(n_layer=12, n_embd=768, head_size=64, lora=64)
VOCAB = {"4": 50277, "5": 65536, "6": 65536, "7": 65536}
VARIANT = {"4": "4", "5": "5.2", "6": "6", "7": "7"}


def timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def _bench(forward, argmax, ids, n_gen, repeat):
    """forward(ids, state) -> (logits, state); state None = new. Warm-up, then best of `repeat` per phase."""
    _, s = forward(ids[:8], None)
    _, s = forward(ids[8:16], s)
    for t in ids[16:20]:
        _, s = forward([t], s)
    best = {}
    tokens = None
    for _ in range(repeat):
        (t0, state), pw, pc = timed(lambda: (lambda r: (argmax(r[0]), r[1]))(forward(ids, None)))

        def decode(t=t0, state=state):
            out = []
            for _ in range(n_gen):
                logits, state = forward([t], state)
                t = argmax(logits)
                out.append(t)
            return out

        rest, dw, dc = timed(decode)
        tokens = [t0] + rest
        if pw < best.get("prefill_wall", float("inf")):
            best.update(prefill_wall=pw, prefill_cpu=pc)
        if dw < best.get("decode_wall", float("inf")):
            best.update(decode_wall=dw, decode_cpu=dc)
    best["tokens"] = tokens
    return best


def run_refimpl(job):
    import numpy as np

    import refimpl
    from refimpl.models import rwkv
    backend = "numba" if job["engine"] == "refimpl-numba" else "numpy"
    if backend == "numba":
        try:
            from refimpl import kernels
            kernels.load()
            import numba
            numba.set_num_threads(job["threads"])
        except ImportError as e:
            return {"error": f"refimpl.kernels: {e}"}
    t0 = time.perf_counter()
    model = rwkv.load(job["safetensors"])
    load_s = time.perf_counter() - t0
    with refimpl.backend(backend):
        r = _bench(lambda ids, s: rwkv.forward(model, ids, s), lambda x: int(np.argmax(x)), job["ids"],
                   job["n_gen"], job["repeat"])
    r["load_s"] = load_s
    return r


def run_rwkv_package(job):
    import torch
    torch.set_num_threads(job["threads"])
    from rwkv.model import RWKV
    t0 = time.perf_counter()
    kw = {} if job["version"] == "7" else {"verbose": False}
    model = RWKV(model=job["pth"][:-4], strategy="cpu fp32", **kw)
    load_s = time.perf_counter() - t0
    with torch.no_grad():
        r = _bench(lambda ids, s: model.forward(list(ids), s), lambda x: int(torch.argmax(x)), job["ids"],
                   job["n_gen"], job["repeat"])
    r["load_s"] = load_s
    return r


def run_llama_cpp(job):
    import llama_cpp
    import llama_cpp.llama_cpp as C
    import numpy as np
    th = job["threads"]
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(job["gguf"], n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=th, n_threads_batch=th,
                          n_gpu_layers=0, use_mmap=True, logits_all=False, verbose=False)
    load_s = time.perf_counter() - t0
    n_vocab = llm.n_vocab()

    def forward(ids, state):
        if state is None:
            llm.reset()                       # n_tokens = 0: eval() clears the recurrent state of sequence 0
        llm.eval(list(ids))
        return np.ctypeslib.as_array(C.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,)), True

    r = _bench(forward, lambda x: int(np.argmax(x)), job["ids"], job["n_gen"], job["repeat"])
    r["load_s"] = load_s
    return r


def child() -> None:
    job = json.loads(sys.stdin.read())
    e = job["engine"]
    if e.startswith("refimpl"):
        r = run_refimpl(job)
    elif e == "rwkv":
        r = run_rwkv_package(job)
    else:
        r = run_llama_cpp(job)
    print(json.dumps(r))


def spawn(job: dict) -> dict:
    th = str(job["threads"])
    env = dict(os.environ, OPENBLAS_NUM_THREADS=th, OMP_NUM_THREADS=th, MKL_NUM_THREADS=th, NUMBA_NUM_THREADS=th,
               REFIMPL_BACKEND="numba" if job["engine"] == "refimpl-numba" else "numpy",
               RWKV_JIT_ON="1", RWKV_CUDA_ON="0")
    env.pop("RWKV_V7_ON", None)
    if job["version"] == "7":
        env["RWKV_V7_ON"] = "1"
    p = subprocess.run([sys.executable, __file__, "--child"], input=json.dumps(job), env=env,
                       capture_output=True, text=True)
    if p.returncode:
        return {"error": f"exit {p.returncode}: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ''}",
                "stderr": p.stderr[-3000:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def write_model(version: str, d: Path) -> dict:
    """The random 0.1B-shape model of `version` as .pth, .safetensors and (v6, v7) f32 GGUF in d."""
    import numpy as np
    from safetensors.numpy import save_file

    from tests.models.rwkv_tiny import tiny_state_dict
    sd = tiny_state_dict(VARIANT[version], vocab=VOCAB[version], seed=int(version), **SHAPE)
    out = {"safetensors": str(d / f"rwkv{version}.safetensors"), "pth": str(d / f"rwkv{version}.pth")}
    save_file({k: np.ascontiguousarray(v) for k, v in sd.items()}, out["safetensors"])
    import torch
    torch.save({k: torch.from_numpy(np.array(v, np.float32)) for k, v in sd.items()}, out["pth"])
    if version in ("6", "7"):
        from refimpl.convert import rwkv as conv
        out["gguf"] = str(conv.convert(sd, d / f"rwkv{version}-f32.gguf", "f32", name=f"rwkv{version}-0.1b-random"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", default=",".join(VERSIONS))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens (prefill)")
    ap.add_argument("--gen", type=int, default=32, help="generated tokens (decode)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="also write the raw results here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child()
        return
    import numpy as np

    from benchmarks.llama import cpu_name, versions
    engines = [e for e in args.engines.split(",") if e]
    threads = [int(t) for t in args.threads.split(",") if t]
    vers = [v for v in args.versions.split(",") if v]
    try:
        import rwkv
        import torch
        extra = f", torch {torch.__version__}, rwkv {getattr(rwkv, '__version__', None) or _dist_version('rwkv')}"
    except ImportError:
        extra = ""
    print(f"RWKV 12 x 768 random models; prefill {args.prompt} tokens, decode {args.gen}, best of {args.repeat}; "
          f"{os.cpu_count()} CPUs ({cpu_name()}); load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    print(versions() + extra)
    res = {}
    tmp = Path(tempfile.mkdtemp(prefix="rwkv_bench_"))
    try:
        for v in vers:
            d = tmp / f"v{v}"
            d.mkdir()
            t0 = time.perf_counter()
            files = write_model(v, d)
            print(f"  wrote RWKV-{VARIANT[v]} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
            ids = [int(i) for i in np.random.default_rng(0).integers(1, VOCAB[v], args.prompt)]
            for th in threads:
                for e in engines:
                    if e == "llama.cpp" and "gguf" not in files:
                        continue
                    t0 = time.perf_counter()
                    job = dict(engine=e, version=v, threads=th, ids=ids, n_gen=args.gen, repeat=args.repeat, **files)
                    res[v, e, th] = r = spawn(job)
                    la = " ".join(f"{x:.2f}" for x in os.getloadavg())
                    print(f"  RWKV-{VARIANT[v]} {e} {th} thread(s): {time.perf_counter() - t0:.0f} s, load {la}"
                          + (f"  ERROR {r['error']}" if "error" in r else ""), file=sys.stderr)
            shutil.rmtree(d)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        Path(args.json).write_text(json.dumps({"|".join(map(str, k)): r for k, r in res.items()}))
    n_p, n_d = args.prompt, args.gen
    head = ("| version | engine | threads | prefill tok/s | decode tok/s | decode ms/token | decode tok/CPU-s | "
            "prefill x rwkv | decode x rwkv | greedy |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for v in vers:
        for th in threads:
            ref = res.get((v, "rwkv", th))
            ref = ref if ref and "error" not in ref else None
            for e in engines:
                r = res.get((v, e, th))
                if r is None:
                    continue
                if "error" in r:
                    print(f"| {VARIANT[v]} | {e} | {th} | - | - | - | - | - | - | {r['error'][:60]} |")
                    continue
                pt, dt = n_p / r["prefill_wall"], n_d / r["decode_wall"]
                px = f"{pt / (n_p / ref['prefill_wall']):.2f}" if ref else "-"
                dx = f"{dt / (n_d / ref['decode_wall']):.2f}" if ref else "-"
                g = "-"
                if ref:
                    same = next((i for i, (a, b) in enumerate(zip(r["tokens"], ref["tokens"])) if a != b),
                                min(len(r["tokens"]), len(ref["tokens"])))
                    g = f"{same}/{len(ref['tokens'])}"
                print(f"| {VARIANT[v]} | {e} | {th} | {pt:.1f} | {dt:.1f} | {1e3 * r['decode_wall'] / n_d:.1f} | "
                      f"{n_d / r['decode_cpu']:.1f} | {px} | {dx} | {g} |")


def _dist_version(name: str) -> str:
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:   # noqa: BLE001 -- a nicety
        return "?"


if __name__ == "__main__":
    main()
