"""llama.cpp (llama-cpp-python 0.3.36, built with -DGGML_RPC=ON) offloading every layer of the real
SmolLM2-135M Q4_1 to refimpl's RPC server: no Python model code on refimpl's side, only the graph
llama.cpp sends.

- exact numerics: teacher-forced top-1 agreement with llama.cpp on its CPU backend over 32 greedy tokens
  on each of 8 prompts, pooled >= 97 %;
- ggml numerics: the logits are the same bits as the same graph on ggml's own RPC server (ggml-rpc-server
  of the same llama.cpp, CPU backend, one thread: ggml-cpu at 2 threads is not run-to-run deterministic on
  every architecture)."""
import socket
import subprocess
import time

import numpy as np
import pytest

from refimpl.compare import run_llama_cpp
from refimpl.rpc import Server

from .._models import smollm2_path
from . import _vendor

PROMPTS = [
    "Once upon a time",
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "<|im_start|>user\nWhat is the boiling point of water?<|im_end|>\n<|im_start|>assistant\n",
    "In 1969, the first humans",
    "Photosynthesis is the process by which",
    "1, 2, 3, 4, 5,",
    "The quick brown fox",
]
N_GREEDY = 32


@pytest.fixture(scope="module")
def smollm2():
    p = smollm2_path()
    if p is None:
        pytest.fail("SmolLM2 GGUF not in the cache: refimpl fetch smollm2 (scripts/test.sh does)")
    from refimpl import gguf
    from refimpl.tokenizer import from_gguf
    tok = from_gguf(gguf.load(p))
    return p, [tok.encode(t, add_special=True) for t in PROMPTS]


@pytest.fixture(scope="module")
def references(smollm2):
    """llama.cpp's own greedy continuation of each prompt on its CPU backend."""
    path, prompts = smollm2
    return [run_llama_cpp(path, ids, capture=False, greedy=N_GREEDY, n_threads=2) for ids in prompts]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_exact_numerics_agree_with_llama_cpp(smollm2, references):
    path, prompts = smollm2
    rows, hits, total = [], 0, 0
    with Server("127.0.0.1", 0, backend="numpy", numerics="exact") as srv:
        for text, ids, ref in zip(PROMPTS, prompts, references):
            tf = ids + ref.generated[:-1]
            got = run_llama_cpp(path, tf, capture=False, rpc=f"127.0.0.1:{srv.port}")
            pred = got.logits[len(ids) - 1:].argmax(-1)
            agree = int((pred == np.array(ref.generated)).sum())
            hits, total = hits + agree, total + N_GREEDY
            d = float(np.abs(got.logits[len(ids) - 1] - ref.logits[0]).max())
            rows.append(f"  {text[:40]!r:44} {agree:2d}/{N_GREEDY}  last-position logits max|d| {d:.4f}")
        time.sleep(0.2)
        refused = sum(sum(c.refused.values()) for c in srv.finished)
    print(f"\nSmolLM2 Q4_1 offloaded to refimpl (exact): {hits}/{total} = {hits / total:.1%} teacher-forced top-1")
    print("\n".join(rows))
    assert refused == 0
    assert hits / total >= 0.97


def test_ggml_numerics_bit_identical_to_ggml_rpc_server(smollm2, references):
    path, prompts = smollm2
    port = _free_port()
    ref_srv = subprocess.Popen([str(_vendor.bin_dir() / "ggml-rpc-server"), "-H", "127.0.0.1", "-p", str(port),
                                "-t", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        with Server("127.0.0.1", 0, backend="numpy", numerics="ggml") as srv:
            for ids, ref in list(zip(prompts, references))[:3]:
                tf = ids + ref.generated[:-1]
                theirs = run_llama_cpp(path, tf, capture=False, rpc=f"127.0.0.1:{port}")
                ours = run_llama_cpp(path, tf, capture=False, rpc=f"127.0.0.1:{srv.port}")
                diff = np.flatnonzero(ours.logits.view(np.uint32) != theirs.logits.view(np.uint32))
                assert diff.size == 0, (f"{diff.size} logits differ, first at {np.unravel_index(diff[0], ours.logits.shape)}"
                                        f": ours {ours.logits.flat[diff[0]]!r} ggml {theirs.logits.flat[diff[0]]!r}")
    finally:
        ref_srv.terminate()
        ref_srv.wait(10)
