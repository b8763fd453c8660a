"""SmolLM2 decode through `refimpl serve`: llama.cpp (llama-cpp-python) offloads every layer to refimpl's RPC
server, against refimpl's own `llama.forward` in the same backend and numerics (benchmarks/llama.py's child).

    python benchmarks/rpc.py [--backend numba] [--numerics fast] [--prompt 32] [--gen 32]

The child starts `refimpl serve` (REFIMPL_BACKEND, REFIMPL_NUMERICS) in its own process on a free port, loads
the model into llama.cpp with -ngl 99 on it, runs a warm-up (the server compiles its kernels there), then
times one prefill and `n_gen` greedy single-token decodes, as benchmarks/llama.py does for llama.cpp itself.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_served(path: str, ids: list[int], n_gen: int, backend: str, numerics: str) -> dict:
    from benchmarks.llama import peak_rss, time_llama_cpp, timed
    port = _free_port()
    log = open(os.environ.get("REFIMPL_SERVE_LOG", os.devnull), "w")
    srv = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "refimpl", "serve", "--port", str(port),
                            "--backend", backend,
                            "--numerics", numerics, "-v"], stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT)
    try:
        line = srv.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError(f"refimpl serve did not start: {line!r}")
        import llama_cpp
        import llama_cpp.llama_cpp as C

        from refimpl.compare import register_rpc_server
        C.llama_backend_init()
        register_rpc_server(f"127.0.0.1:{port}")
        default = C.llama_model_default_params

        def params():
            p = default()
            p.use_extra_bufts = False
            return p
        C.llama_model_default_params = params
        try:
            llm, load_s, _ = timed(lambda: llama_cpp.Llama(path, n_ctx=512, n_batch=512, n_ubatch=512, n_gpu_layers=999,
                                                          use_mmap=True, logits_all=False, flash_attn=False,
                                                          offload_kqv=True, verbose=False))
        finally:
            C.llama_model_default_params = default
        r = time_llama_cpp(llm, ids, n_gen, warm=16)     # the server compiles (or loads) its kernels there
        llm.close()                  # free the server's buffers while it still runs (ggml aborts otherwise)
        return dict(load_s=load_s, **r, peak_rss=peak_rss(), backend=backend, numerics=numerics)
    finally:
        srv.terminate()
        srv.wait(10)


def child() -> None:
    job = json.loads(sys.stdin.read())
    print(json.dumps(run_served(job["path"], job["ids"], job["n_gen"], os.environ.get("REFIMPL_BACKEND", "numba"),
                                os.environ.get("REFIMPL_NUMERICS", "exact"))), flush=True)


def main() -> None:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="numba")
    ap.add_argument("--numerics", default="fast")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--gen", type=int, default=32)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from benchmarks.llama import TEXT
    from refimpl import tokenizer
    from refimpl.fetch import path as model_path
    p = model_path("smollm2")
    ids = tokenizer.from_gguf(str(p)).encode(TEXT * 8, add_special=False)[:a.prompt]
    r = run_served(str(p), ids, a.gen, a.backend, a.numerics)
    print(f"served ({a.backend}, {a.numerics}): prefill {len(ids) / r['prefill_wall']:.1f} tok/s, "
          f"decode {a.gen / r['decode_wall']:.1f} tok/s", flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
