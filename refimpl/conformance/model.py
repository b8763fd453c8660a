"""A whole model, judged: llama.cpp on a ggml backend against refimpl's exact numerics, on one prompt.

    from refimpl.conformance.model import judge_model
    r = judge_model("model.gguf", "The capital of France is")
    r["kl"]            # per position: KL(refimpl || backend) of the next-token distributions (nats)
    r["first_over"]    # the first node whose output departs from refimpl's beyond its op's budget, or None
    r["first_undecided"]   # the first over budget where refimpl's ggml numerics differ from its exact as much

Two measures, each on llama.cpp's own graph:

- **KL divergence** per position, as llama-perplexity's --kl-divergence measures a quantized model against its
  f16 base: here the base is the same graph computed by refimpl in exact numerics (llama.cpp with every layer
  offloaded to an in-process `refimpl serve`), the other side the backend under test.
- **The first departing node**: the backend computes the graph node by node (llama.cpp's eval callback); each
  node is computed again by refimpl, alone, *from the backend's own inputs* (the bytes of its sources as the
  backend had them), so that an error is the node's own and never one carried in from earlier nodes. Its
  error is test-backend-ops' NMSE against the budget test-backend-ops gives that op (the largest over its
  cases: refimpl/data/conformance/budgets.json). Nodes that write into one of their own sources (in place:
  the KV cache's SET_ROWS, ACC) are not judged this way, since their sources are read after they ran. The
  first node over budget is exported with its sources (`DIR/first_over.npz`), and `replay` computes it again.

The backend is llama-cpp-python's build (ggml-cpu, the portable profile) unless LLAMA_CPP_LIB_PATH names
another build of libllama.
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

BUDGETS = Path(__file__).parents[1] / "data" / "conformance" / "budgets.json"
DEFAULT_BUDGET = 1e-7            # test-backend-ops' max_nmse_err() for an op that does not say otherwise
_NO_COMPUTE = {"NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}
_DTYPES = {0: np.float32, 1: np.float16, 26: np.int32, 28: np.float64}
BF16 = 30


class _Tensor(ctypes.Structure):
    """ggml.h's `struct ggml_tensor` (ggml 0.25.3)."""
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


def _desc(h: _Tensor, nbytes: int) -> dict:
    return {"name": h.name.decode("utf-8", "replace"), "type": int(h.type), "ne": [int(x) for x in h.ne],
            "nb": [int(x) for x in h.nb], "nbytes": int(nbytes)}


def _capture_child(job: dict) -> int:
    """`python -m refimpl.conformance.model JOB`: llama.cpp on its backend, every node and its sources saved."""
    from .. import compare
    from ..rpc.ggml_ops import OP_NAMES
    nodes, arrays = [], {}

    def get(lib, t, size):
        buf = np.empty(max(size, 1), np.uint8)
        if size:
            lib.ggml_backend_tensor_get(t, buf.ctypes.data, 0, size)
        return buf[:size]

    pending: dict = {}

    def hook(lib, t, before):
        h = _Tensor.from_address(t)
        op = OP_NAMES[h.op] if 0 <= h.op < len(OP_NAMES) else f"op#{h.op}"
        if op in _NO_COMPUTE:
            return
        if before:                       # its sources as the node reads them (memory may be reused after)
            srcs, blobs = [], {}
            for i in range(10):
                s = h.src[i]
                if not s:
                    srcs.append(None)
                    continue
                ssize = int(lib.ggml_nbytes(s))
                srcs.append(_desc(_Tensor.from_address(s), ssize))
                blobs[i] = get(lib, s, ssize)
            while srcs and srcs[-1] is None:
                srcs.pop()
            pending[t] = (srcs, blobs)
            return
        srcs, blobs = pending.pop(t, ([], {}))
        size = int(lib.ggml_nbytes(t))
        k = len(nodes)
        nodes.append({**_desc(h, size), "op": op, "params": [int(x) for x in h.op_params], "srcs": srcs})
        arrays[f"o{k}"] = get(lib, t, size)
        for i, b in blobs.items():
            arrays[f"s{k}_{i}"] = b

    run = compare.run_llama_cpp(job["model"], job["tokens"], isolate=False, capture=False, node_hook=hook,
                                n_threads=job.get("n_threads", 2), offload=job.get("offload", False))
    placed = [ln.strip() for ln in run.log.splitlines() if "offloaded" in ln or "using device" in ln]
    np.savez(job["out"], __meta__=np.array(json.dumps({"nodes": nodes, "system_info": run.system_info,
                                                       "placement": placed})),
             __logits__=run.logits, **arrays)
    return 0


def _values(raw: np.ndarray, d: dict) -> np.ndarray | None:
    """A tensor's elements (float64, ggml order flattened) from its bytes, through its strides."""
    t = d["type"]
    if t == BF16:
        dt = np.uint16
    elif t in _DTYPES:
        dt = _DTYPES[t]
    else:
        return None
    item = np.dtype(dt).itemsize
    if raw.size < item:
        return np.zeros(0)
    flat = raw[: raw.size - raw.size % item].view(dt)
    ne, nb = d["ne"], d["nb"]
    v = np.lib.stride_tricks.as_strided(flat, tuple(ne[::-1]), tuple(nb[::-1]))
    if t == BF16:
        v = (v.astype(np.uint32) << 16).view(np.float32)
    return np.asarray(v, np.float64).reshape(-1)


def _budget(op_label: str, budgets: dict) -> float:
    return float(budgets.get(op_label, DEFAULT_BUDGET))


def _label(node: dict) -> str:
    """test-backend-ops' name for the op: the unary or GLU sub-op itself ("SILU", "SWIGLU")."""
    from ..rpc.ggml_ops import Params, sub_op
    name = sub_op(node["op"], Params(node["params"]))
    return name.split(":", 1)[1] if ":" in name else name


def _refimpl_node(client, node: dict, srcs: list, align: int = 64) -> bytes:
    """The node computed by refimpl (the in-process server `client` talks to) from the given source bytes."""
    from ..rpc import Client
    sizes = [len(b) if b is not None else 0 for b in srcs] + [node["nbytes"]]
    offs, total = [], 0
    for n in sizes:
        offs.append(total)
        total += (n + align - 1) // align * align + align
    buf, _ = client.alloc_buffer(max(total, align))
    if not buf:
        raise MemoryError(f"node {node['name']}: {total} bytes")
    base = client.buffer_get_base(buf)
    try:
        tens, ids = [], []
        for i, (d, b) in enumerate(zip(node["srcs"], srcs)):
            if d is None:
                ids.append(0)
                continue
            t = Client.tensor(i + 1, d["type"], d["ne"], buf, base + offs[i], nb=d["nb"])
            if len(b):
                client.set_tensor(t, bytes(b))
            tens.append(t)
            ids.append(i + 1)
        out = Client.tensor(100, node["type"], node["ne"], buf, base + offs[-1], nb=node["nb"], op=node["op"],
                            params=np.asarray(node["params"], np.int32), src=ids)
        client.graph_compute([out], [*tens, out])
        return client.get_tensor(out, 0, node["nbytes"])
    finally:
        client.free_buffer(buf)


def judge_model(model_path, prompt: str | None = None, *, tokens=None, n_threads: int = 2,
                out: str | os.PathLike | None = None, progress=lambda m: None, offload: bool = False,
                backend_env: dict | None = None) -> dict:
    """KL divergence per position and the first node over its op's budget (module docstring). offload: the
    backend is a GPU-type device of the build (ggml-vulkan): llama.cpp puts every layer on it; backend_env:
    environment for the backend's run only (GGML_VK_VISIBLE_DEVICES=0 for lavapipe, which the refimpl run
    must not see, or llama.cpp would split the layers between the two)."""
    from .. import compare
    from ..rpc import Client, Server
    model_path = str(model_path)
    if tokens is None:
        from ..tokenizers import from_gguf
        tokens = from_gguf(model_path).encode(prompt or "The capital of France is", add_special=True)
    tokens = [int(t) for t in tokens]
    budgets = json.loads(BUDGETS.read_text()) if BUDGETS.exists() else {}
    with tempfile.TemporaryDirectory(prefix="refimpl-judge-model-") as tmp:
        progress(f"judge: llama.cpp on its backend, node by node ({len(tokens)} tokens)")
        z = _backend_run(model_path, tokens, f"{tmp}/nodes.npz", n_threads, offload, backend_env)
        meta = json.loads(str(z["__meta__"]))
        backend_logits = z["__logits__"]
        progress("judge: the same graph on refimpl, exact numerics (llama.cpp offloading to refimpl serve)")
        with Server("127.0.0.1", 0, numerics="exact") as srv, Server("127.0.0.1", 0, numerics="ggml") as srv2:
            ref = compare.run_llama_cpp(model_path, tokens, capture=False, rpc=f"127.0.0.1:{srv.port}")
            kl = _kl(ref.logits, backend_logits)
            progress(f"judge: {len(meta['nodes'])} nodes computed again by refimpl from the backend's inputs")
            nodes, first, first_undecided = [], None, None
            with Client("127.0.0.1", srv.port, timeout=600) as c, Client("127.0.0.1", srv2.port, timeout=600) as c2:
                for k, node in enumerate(meta["nodes"]):
                    srcs = [None if d is None else z[f"s{k}_{i}"] for i, d in enumerate(node["srcs"])]
                    rec, where = _judge_node(c, c2, k, node, srcs, z[f"o{k}"], budgets)
                    nodes.append(rec)
                    if rec.get("verdict") == "undecided":
                        first_undecided = first_undecided or {**rec, **where}
                    elif rec.get("verdict") == "backend wrong" and first is None:
                        first = {**rec, **where}
                        if out is not None:
                            Path(out).mkdir(parents=True, exist_ok=True)
                            np.savez(Path(out) / "first_over.npz", __node__=np.array(json.dumps(node)),
                                     __backend__=z[f"o{k}"], **{f"s{i}": s for i, s in enumerate(srcs)
                                                                 if s is not None})
    judged = [r for r in nodes if "nmse" in r]
    result = {"tokens": tokens, "kl": kl.tolist(), "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
              "top1_agree": float(np.mean(np.argmax(ref.logits, -1) == np.argmax(backend_logits, -1))),
              "nodes": len(nodes), "judged": len(judged), "over": sum(r["nmse"] > r["budget"] for r in judged),
              "undecided": sum(r.get("verdict") == "undecided" for r in judged),
              "first_over": first, "first_undecided": first_undecided, "system_info": meta["system_info"],
              "placement": meta.get("placement", []),
              "per_node": nodes}
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "model.json").write_text(json.dumps(result, indent=1, default=float))
    return result


def _backend_run(model_path: str, tokens: list, npz: str, n_threads: int, offload: bool, backend_env):
    """llama.cpp on the backend in a process of its own (`python -m refimpl.conformance.model`): every node's
    sources and output, and the logits, in the npz it writes (opened)."""
    job = {"model": model_path, "tokens": tokens, "out": npz, "n_threads": n_threads, "offload": bool(offload)}
    p = subprocess.run([sys.executable, "-m", "refimpl.conformance.model", json.dumps(job)], capture_output=True,
                       text=True, env={**os.environ, **(backend_env or {})})
    if p.returncode != 0:
        raise RuntimeError(f"llama.cpp's run on the backend failed:\n{p.stderr.strip()[-2000:]}")
    return np.load(npz, allow_pickle=False)


def _judge_node(c, c2, k: int, node: dict, srcs: list, output: np.ndarray, budgets: dict) -> tuple[dict, dict]:
    """(the node's record, its worst element where it is over budget): the node computed by refimpl (exact,
    through client c) from the backend's own inputs, against the backend's output; over its op's budget, again
    in ggml numerics (client c2) to tell the backend's error from ggml's own numerics (the Q8 rounding of
    activations in quantized products, f16 accumulations): `backend wrong` or `undecided`."""
    rec = {"k": k, "name": node["name"], "op": _label(node), "ne": node["ne"]}
    theirs = _values(output, node)
    if theirs is None:
        rec["skipped"] = f"output type {node['type']}"
        return rec, {}
    mine = _values(np.frombuffer(_refimpl_node(c, node, srcs), np.uint8), node)
    err = _nmse(theirs, mine)
    rec.update(nmse=err, budget=_budget(rec["op"], budgets))
    if err <= rec["budget"]:
        return rec, {}
    ggml = _values(np.frombuffer(_refimpl_node(c2, node, srcs), np.uint8), node)
    rec.update(nmse_ggml=_nmse(theirs, ggml), modes=_nmse(ggml, mine))
    rec["verdict"] = "undecided" if rec["modes"] > rec["budget"] else "backend wrong"
    i = int(np.nanargmax(np.abs(theirs - mine))) if theirs.size else 0
    return rec, {"index": i, "backend": float(theirs[i]), "refimpl": float(mine[i]), "refimpl_ggml": float(ggml[i])}


def replay(path) -> dict:
    """Compute an exported node (`first_over.npz`) again with refimpl: its error against the backend's bytes."""
    from ..rpc import Client, Server
    z = np.load(path, allow_pickle=False)
    node = json.loads(str(z["__node__"]))
    srcs = [None if d is None else z[f"s{i}"] for i, d in enumerate(node["srcs"])]
    with Server("127.0.0.1", 0, numerics="exact") as srv, Client("127.0.0.1", srv.port, timeout=600) as c:
        mine = _values(np.frombuffer(_refimpl_node(c, node, srcs), np.uint8), node)
    theirs = _values(z["__backend__"], node)
    return {"name": node["name"], "op": _label(node), "nmse": _nmse(theirs, mine)}


def _nmse(theirs: np.ndarray, mine: np.ndarray) -> float:
    """test-backend-ops' nmse(backend, reference): sum (a - b)^2 / sum a^2; a NaN anywhere is infinite."""
    if theirs.size == 0:
        return 0.0
    if np.isnan(theirs).any() or np.isnan(mine).any():
        return math.inf
    with np.errstate(all="ignore"):
        num, den = float(np.sum((theirs - mine) ** 2)), float(np.sum(theirs ** 2))
    if num == 0:
        return 0.0
    return num / den if den else math.inf


def _kl(ref_logits: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """KL(P_ref || P) per position, in nats, from two (positions, vocab) logit arrays."""
    def logp(x):
        x = np.asarray(x, np.float64)
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))
    lp, lq = logp(ref_logits), logp(logits)
    return np.sum(np.exp(lp) * (lp - lq), -1)


if __name__ == "__main__":
    sys.exit(_capture_child(json.loads(sys.argv[1])))
