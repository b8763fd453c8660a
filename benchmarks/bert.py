"""all-MiniLM-L6-v2 embedding speed: refimpl's BERT vs sentence-transformers (torch CPU) vs llama.cpp.

    python benchmarks/bert.py [--threads 1,2] [--engines ...] [--repeat 3]

Two workloads, each a batch of 32 sentences embedded with mean pooling and normalization:
  short   ~12 words per sentence
  long    ~60 words per sentence
Every (engine, threads) pair runs in a fresh interpreter, one after another; each workload is run once
untimed (warm-up), then --repeat times, and the best time is kept.

  refimpl       refimpl.models.bert from the sentence-transformers directory (f32 safetensors), one padded
                batch of 32, NumPy backend (OPENBLAS_NUM_THREADS = threads)
  refimpl-gguf  the same model from the f32 GGUF that `refimpl convert` writes
  st            sentence-transformers' SentenceTransformer.encode(batch_size=32) on torch CPU
                (torch.set_num_threads(threads))
  llama.cpp     llama-cpp-python's Llama(embedding=True, pooling mean) on that f32 GGUF, n_threads = threads,
                the 32 sentences in one call to embed() (one batch of up to 4096 tokens, 32 sequences)

"x st" is the engine's sentences/s over sentence-transformers' at the same thread count (higher is better).
The model is `refimpl.fetch.path("minilm")` (`refimpl fetch minilm`). Record results in docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ENGINES = ("refimpl", "refimpl-gguf", "st", "llama.cpp")

_WORDS = ("the river carried small boats past old mills while children watched from a stone bridge and "
          "merchants argued about the price of wool grain salt timber and copper in the busy market square "
          "near the cathedral where bells rang every hour through the long summer afternoon").split()


def sentences(n: int, words: int) -> list[str]:
    out = []
    for i in range(n):
        w = [_WORDS[(i * 7 + j * 3) % len(_WORDS)] for j in range(words)]
        out.append(" ".join(w).capitalize() + ".")
    return out


WORKLOADS = {"short": sentences(32, 12), "long": sentences(32, 60)}


def best_time(fn, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def child() -> None:
    job = json.loads(sys.stdin.read())
    engine, threads, repeat = job["engine"], job["threads"], job["repeat"]
    if engine in ("refimpl", "refimpl-gguf"):
        from refimpl.models import bert
        model = bert.load(job["gguf"] if engine == "refimpl-gguf" else job["dir"])
        run = lambda texts: bert.embed(model, texts, batch_size=32)              # noqa: E731
    elif engine == "st":
        import torch
        from sentence_transformers import SentenceTransformer
        torch.set_num_threads(threads)
        st = SentenceTransformer(job["dir"], device="cpu")
        run = lambda texts: st.encode(texts, batch_size=32, normalize_embeddings=True)   # noqa: E731
    else:
        from llama_cpp import Llama
        llm = Llama(model_path=job["gguf"], embedding=True, pooling_type=1, n_ctx=4096, n_batch=4096,
                    n_ubatch=4096, n_seq_max=32, n_threads=threads, n_threads_batch=threads, verbose=False)
        run = lambda texts: llm.embed(texts, normalize=True)                     # noqa: E731
    res = {name: best_time(lambda: run(texts), repeat) for name, texts in WORKLOADS.items()}
    print(json.dumps(res))


def spawn(job: dict) -> dict:
    th = str(job["threads"])
    env = dict(os.environ, OPENBLAS_NUM_THREADS=th, OMP_NUM_THREADS=th, MKL_NUM_THREADS=th,
               REFIMPL_BACKEND=os.environ.get("REFIMPL_BACKEND", "numpy"), TOKENIZERS_PARALLELISM="false")
    p = subprocess.run([sys.executable, __file__, "--child"], input=json.dumps(job), env=env,
                       capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"{job['engine']} ({th} threads) failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child()
        return
    from refimpl import fetch
    from refimpl.convert import convert
    model_dir = fetch.fetch("minilm")
    engines = [e for e in args.engines.split(",") if e]
    threads = [int(t) for t in args.threads.split(",") if t]
    from benchmarks.llama import cpu_name, versions
    print(f"all-MiniLM-L6-v2; batches of 32 sentences (short ~12 words, long ~60); {os.cpu_count()} CPUs "
          f"({cpu_name()}); load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(versions())
    with tempfile.TemporaryDirectory() as tmp:
        gguf = str(Path(tmp) / "minilm-f32.gguf")
        convert(model_dir, gguf, "f32")
        res = {}
        for th in threads:
            for e in engines:
                res[e, th] = spawn(dict(engine=e, threads=th, repeat=args.repeat, dir=str(model_dir), gguf=gguf))
                print(f"  ran {e} with {th} thread(s)", file=sys.stderr)
    print("| engine | threads | short sent/s | long sent/s | short x st | long x st |")
    print("|---|---|---|---|---|---|")
    for th in threads:
        ref = res.get(("st", th))
        for e in engines:
            r = res[e, th]
            sx = f"{ref['short'] / r['short']:.2f}" if ref else "-"
            lx = f"{ref['long'] / r['long']:.2f}" if ref else "-"
            print(f"| {e} | {th} | {32 / r['short']:.0f} | {32 / r['long']:.0f} | {sx} | {lx} |")


if __name__ == "__main__":
    main()
