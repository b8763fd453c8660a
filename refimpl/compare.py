"""refimpl against llama.cpp (a whole model, tensor by tensor); `--op` against ggml (one op).

    from refimpl.compare import compare, format_table
    rows = compare("model.gguf", "The capital of France is", numerics="ggml")
    print(format_table(rows))                  # name, shape, NMSE, max |d|, budget, first tensor over it

`compare` runs the prompt's tokens through llama.cpp (llama-cpp-python's low-level API: CPU backend, no
weight repacking, flash attention off, f16 KV cache, one micro-batch, logits for every position) with a
graph-evaluation callback (`llama_context_params.cb_eval`) that copies every named tensor as it is
computed, and through refimpl's forward with `capture=` on the same token ids. The model kind is the GGUF's
general.architecture (`Family`): "bert" runs `refimpl.models.bert` (llama.cpp with embeddings on and the
model's pooling; the last row is the pooled embedding against llama_get_embeddings_seq), "rwkv6" / "rwkv7"
`refimpl.models.rwkv` from a fresh state, anything else `refimpl.models.llama`. Rows line up by llama.cpp's
tensor names (`attn_norm-0`, `Qcur-0`, `kq-0`, `kqv_out-0`, `ffn_out-0`, `l_out-0`, `result_norm`,
`result_output`, ...), in llama.cpp's evaluation order; where a name occurs several times in its graph
(`Qcur-0` before and after rope) the last one counts, as in refimpl's capture. llama.cpp's RWKV graphs name
only attn_norm, ffn_inp, ffn_norm and l_out per layer (refimpl captures more; those rows are absent).

Shapes: NumPy order, ggml's `ne` reversed. llama.cpp's attention spans a multiple of 256 KV cells (the
unused ones masked); in exact mode refimpl spans only the filled cells, and those rows compare the first
cells of llama.cpp's `kq-*` / `kq_soft_max-*` (the note says so). Under numerics="ggml" refimpl spans the
same cells as llama.cpp.

Budgets are NMSE bounds per tensor from the tolerance table (`("compare", weight type, numerics)`), the
weight type being that of `blk.0.ffn_down.weight` (RWKV: `blocks.0.ffn.value.weight`); `over` marks a
tensor beyond its budget.
`refimpl compare --op OP` runs an op's named golden cases and a few drawn ones through refimpl and ggml-python
(`python -m refimpl.testing.compare_op`: part of the test toolkit, run as a program of its own).

Needs llama-cpp-python (`compare`); it is not imported before use, and llama.cpp
runs in a child interpreter: its libllama binds to whatever libggml the process already has loaded (ggml-python's
would do), and then it would run that build's kernels.
"""
from __future__ import annotations

import contextlib
import ctypes
import math
import os
import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .report import Row, first_over, format_table, row  # noqa: F401  (Row, format_table: public here too)

# llama.cpp tensor types whose values are read (ggml_type: numpy dtype)
_GGML_DTYPES = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32, 27: np.int64,
                28: np.float64}
_LOG_LINES: list[str] = []          # llama.cpp's log while refimpl.compare drives it
_KEEP: list = []                    # ctypes callbacks that llama.cpp may still call


@dataclass
class LlamaCppRun:
    """What one llama.cpp decode produced: logits (n_tokens, n_vocab) f32, the named tensors (NumPy
    order, the last of each name), their evaluation order, the build's system info and its log."""
    logits: np.ndarray
    tensors: dict = field(default_factory=dict)
    order: list = field(default_factory=list)
    system_info: str = ""
    log: str = ""
    generated: list = field(default_factory=list)    # greedy=N: the N tokens llama.cpp chose


def llama_cpp_available() -> bool:
    """Whether llama-cpp-python is installed (found, not imported: importing it loads its libggml)."""
    import importlib.util
    return importlib.util.find_spec("llama_cpp") is not None


def _foreign_ggml() -> list[str]:
    """The Python packages imported in this process that load a libggml of their own (ggml-python's `ggml`).
    llama.cpp's libllama binds to an already loaded libggml-cpu.so by its soname, so in such a process it
    would run another build's kernels (another ggml version, no llamafile)."""
    import sys
    mod = sys.modules.get("ggml")
    return [f"ggml-python ({getattr(mod, '__file__', None) or 'ggml'})"] if mod is not None else []


def llama_cpp_system_info() -> str:
    """llama-cpp-python's `llama_print_system_info()`, read in a fresh interpreter (see `run_llama_cpp`)."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "import llama_cpp; print(llama_cpp.llama_print_system_info()"
                          ".decode())"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"llama-cpp-python did not start: {out.stderr.strip()[-2000:]}")
    return out.stdout.strip()


def profile_problems(system_info: str) -> list[str]:
    """How a llama.cpp build differs from the one refimpl's numerics="ggml" follows (x86-64 AVX2/FMA/F16C,
    llamafile sgemm compiled in, no AVX-512, AVX-VNNI or AMX), from `llama_print_system_info()`; empty
    when it is that build."""
    flags = {}
    for part in system_info.replace("|", "\n").splitlines():
        if "=" in part:
            k, _, v = part.partition("=")
            flags[k.strip()] = v.strip()
    want = {"AVX": "1", "AVX2": "1", "FMA": "1", "F16C": "1", "LLAMAFILE": "1"}
    bad = [f"{k} = {flags.get(k, 'absent')} (want {v})" for k, v in want.items() if flags.get(k) != v]
    bad += [f"{k} = 1" for k, v in flags.items()
            if v == "1" and (k.startswith(("AVX512", "AMX")) or k == "AVX_VNNI")]
    return bad


class _TensorHead(ctypes.Structure):
    """The leading fields of ggml.h's `struct ggml_tensor` (type, buffer, ne[4], nb[4]), a stable prefix
    of the struct; the name and data are read through ggml's own functions."""
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4)]


def _llama_lib(name: str):
    """One of the shared libraries of the libllama llama-cpp-python runs (LLAMA_CPP_LIB_PATH's directory, else
    the package's own lib/), opened by ctypes by its soname, the name libllama was linked against: dlopen of
    another name (the unversioned symlink) maps a second copy of the library, with a device registry of its own
    that llama.cpp never reads. Opening an already loaded library returns the same handle."""
    import importlib.util
    libdir = os.environ.get("LLAMA_CPP_LIB_PATH")
    if not libdir:
        spec = importlib.util.find_spec("llama_cpp")
        libdir = os.path.join(spec.submodule_search_locations[0], "lib") if spec else ""
    for n in (f"{name}.so.0", f"{name}.so"):
        if os.path.exists(os.path.join(libdir, n)):
            return ctypes.CDLL(os.path.join(libdir, n))
    raise RuntimeError(f"no {name}.so in {libdir or 'llama-cpp-python'}: rebuild llama-cpp-python with "
                       "CMAKE_ARGS=-DGGML_RPC=ON (scripts/setup.sh does), or point LLAMA_CPP_LIB_PATH at a build "
                       "that has it (scripts/build_llamacpp.sh --libllama)")


def _ggml_lib():
    """libggml-base of the running libllama (`_llama_lib`) with the few tensor accessors used here declared."""
    lib = _llama_lib("libggml-base")
    for name, args, res in (("ggml_get_name", [ctypes.c_void_p], ctypes.c_char_p),
                            ("ggml_nbytes", [ctypes.c_void_p], ctypes.c_size_t),
                            ("ggml_backend_tensor_get", [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                                         ctypes.c_size_t], None)):
        f = getattr(lib, name)
        f.argtypes, f.restype = args, res
    return lib


def _read_tensor(lib, t) -> np.ndarray | None:
    """A computed ggml tensor's values as a NumPy array (ggml_n_dims dims, views followed through their
    strides), or None for a type without a NumPy dtype."""
    h = _TensorHead.from_address(t)
    dt = _GGML_DTYPES.get(h.type)
    if dt is None:
        return None
    ne, nb = [int(x) for x in h.ne], [int(x) for x in h.nb]
    n_dims = max([i + 1 for i in range(4) if ne[i] > 1] + [1])
    size = int(lib.ggml_nbytes(t))
    buf = np.empty(max(size, 1), np.uint8)
    if size:
        lib.ggml_backend_tensor_get(t, buf.ctypes.data, 0, size)
    item = np.dtype(dt).itemsize
    flat = buf[: size - size % item].view(dt) if size >= item else np.zeros(1, dt)
    arr = np.lib.stride_tricks.as_strided(flat, tuple(ne[:n_dims][::-1]), tuple(nb[:n_dims][::-1]))
    return np.array(arr, copy=True)


def _wanted(name: str) -> bool:
    """llama.cpp's callback names (cb(cur, "name", il) -> "name-il", or "name"); not ggml's derived names
    ("Qcur-0 (reshaped)", "node_12", "leaf_3")."""
    return bool(name) and " " not in name and not name.startswith(("node_", "leaf_"))


def run_llama_cpp(model_path, tokens, *, n_ctx: int = 512, n_threads: int = 2, capture: bool = True,
                  type_kv: int = 1, pooling: int | None = None, isolate: bool = True,
                  rpc: str | None = None, greedy: int = 0, node_hook=None, offload: bool = False) -> LlamaCppRun:
    """One llama_decode of `tokens` (logits for every position) on llama.cpp's CPU backend, as the goldens
    were made: no weight repacking (use_extra_bufts=False), flash attention off, K/V cache of ggml type
    `type_kv` (1: f16, llama.cpp's default; 0: f32), n_batch = n_ubatch >= len(tokens). With `capture`
    every named tensor of the graph is copied as it is computed (cb_eval).

    pooling (an embedding model such as BERT): run with embeddings on and this llama_pooling_type (0 none,
    1 mean, 2 cls, 3 last); `logits` then holds the embeddings instead: (1, n_embd) for the pooled sequence
    (llama_get_embeddings_seq), or (n_tokens, n_embd) with pooling 0 (llama_get_embeddings_ith).

    isolate (default): run it in a fresh interpreter. A process that has loaded another libggml (ggml-python,
    the op oracle, does) would make llama.cpp run that build's kernels; isolate=False runs here and refuses
    such a process.

    greedy (N > 0): after the prompt, decode N more tokens one at a time, each the argmax of the last
    logits (`generated`); `logits` is then (N, n_vocab), the logits each of those tokens was chosen from.

    rpc ("HOST:PORT", or several comma-separated): offload every layer, the output and the KV cache to the ggml
    RPC server there (`refimpl serve`, or ggml's own rpc-server), as `llama-cli --rpc HOST:PORT -ngl 99` does;
    with several servers each is a device and llama.cpp splits the layers over them by their free memory.
    llama-cpp-python must be built with -DGGML_RPC=ON (scripts/setup.sh does).

    offload: every layer, the output and the KV cache on the build's GPU devices (llama.cpp's -ngl 99), e.g. a
    libllama built with ggml-vulkan (LLAMA_CPP_LIB_PATH); without it the model runs on the CPU.

    node_hook (isolate=False only): called as node_hook(libggml, tensor address, before) for every node of the
    graph, with before=True just before it is computed (its sources hold their inputs) and before=False
    right after (llama.cpp's scheduler then computes the graph node by node)."""
    tokens = [int(t) for t in np.asarray(tokens).reshape(-1)]
    if not tokens:
        raise ValueError("run_llama_cpp: no tokens")
    if isolate:
        if node_hook is not None:
            raise ValueError("run_llama_cpp: node_hook needs isolate=False (a function cannot cross processes)")
        return _run_isolated(model_path, tokens, n_ctx=n_ctx, n_threads=n_threads, capture=capture,
                             type_kv=type_kv, pooling=pooling, rpc=rpc, greedy=greedy, offload=offload)
    foreign = _foreign_ggml()
    if foreign:
        raise RuntimeError("run_llama_cpp(isolate=False): this process has another libggml loaded "
                           f"({', '.join(foreign)}); llama.cpp would run its kernels. Use isolate=True.")
    return _run_here(model_path, tokens, n_ctx=n_ctx, n_threads=n_threads, capture=capture, type_kv=type_kv,
                     pooling=pooling, rpc=rpc, greedy=greedy, node_hook=node_hook, offload=offload)


def _run_isolated(model_path, tokens, **kw) -> LlamaCppRun:
    """`_run_here` in a child interpreter; the result comes back as an .npz (no pickles)."""
    import json
    import subprocess
    import sys
    import tempfile
    with tempfile.TemporaryDirectory(prefix="refimpl-llama-cpp-") as d:
        out = f"{d}/run.npz"
        job = json.dumps({"model": str(model_path), "tokens": tokens, "out": out, **kw})
        p = subprocess.run([sys.executable, "-m", "refimpl.compare", job], capture_output=True, text=True,
                           check=False)
        if p.returncode != 0:
            try:
                with open(f"{out}.error") as f:
                    err = json.load(f)
            except (OSError, ValueError):
                err = {"kind": "RuntimeError", "message": f"llama.cpp's child process ended with status "
                       f"{p.returncode}:\n{p.stderr.strip()[-3000:]}"}
            raise (ValueError if err["kind"] == "ValueError" else RuntimeError)(err["message"])
        z = np.load(out, allow_pickle=False)
        meta = json.loads(str(z["__meta__"]))
        return LlamaCppRun(logits=z["__logits__"], tensors={n: z[f"t{i}"] for i, n in enumerate(meta["names"])},
                           order=meta["order"], system_info=meta["system_info"], log=meta["log"],
                           generated=meta.get("generated", []))


def _child(argv) -> int:
    """`python -m refimpl.compare JOB`: run one `_run_here` and write it to JOB's "out"."""
    import json
    job = json.loads(argv[0])
    model, tokens, out = job.pop("model"), job.pop("tokens"), job.pop("out")
    try:
        run = _run_here(model, tokens, **job)
    except Exception as e:           # noqa: BLE001 -- the parent raises it again, same kind for ValueError
        with open(f"{out}.error", "w") as f:
            json.dump({"kind": type(e).__name__, "message": str(e)}, f)
        return 1
    names = list(run.tensors)
    meta = {"names": names, "order": run.order, "system_info": run.system_info, "log": run.log,
            "generated": run.generated}
    np.savez(out, __meta__=np.array(json.dumps(meta)), __logits__=run.logits,
             **{f"t{i}": run.tensors[n] for i, n in enumerate(names)})
    return 0


def register_rpc_server(endpoints: str) -> None:
    """Add the ggml RPC server at each of the comma-separated `endpoints` to llama-cpp-python's ggml device
    registry (ggml-rpc.h's `ggml_backend_rpc_add_server`, then ggml-backend.h's `ggml_backend_register`), as
    llama.cpp's --rpc A,B does: each server is a device of its own."""
    rpc, ggml = _llama_lib("libggml-rpc"), _llama_lib("libggml")
    rpc.ggml_backend_rpc_add_server.argtypes, rpc.ggml_backend_rpc_add_server.restype = [ctypes.c_char_p], \
        ctypes.c_void_p
    ggml.ggml_backend_register.argtypes, ggml.ggml_backend_register.restype = [ctypes.c_void_p], None
    listed = [e.strip() for e in endpoints.split(",")]
    if not all(listed):
        raise ValueError(f"rpc={endpoints!r}: an empty server in the list (HOST:PORT[,HOST:PORT...])")
    for endpoint in listed:
        reg = rpc.ggml_backend_rpc_add_server(endpoint.encode())
        if not reg:
            raise RuntimeError(f"the RPC server at {endpoint} reports no devices")
        ggml.ggml_backend_register(reg)


def _run_here(model_path, tokens, *, n_ctx: int = 512, n_threads: int = 2, capture: bool = True,
              type_kv: int = 1, pooling: int | None = None, rpc: str | None = None,
              greedy: int = 0, node_hook=None, offload: bool = False) -> LlamaCppRun:
    import llama_cpp
    import llama_cpp.llama_cpp as C
    lib = _ggml_lib()

    @C.llama_log_callback
    def log_cb(level, text, user_data):
        _LOG_LINES.append(text.decode("utf-8", "replace"))
    _KEEP.append(log_cb)
    del _LOG_LINES[:]
    C.llama_log_set(log_cb, ctypes.c_void_p(0))
    C.llama_backend_init()
    if rpc:
        register_rpc_server(rpc)
    run = LlamaCppRun(logits=np.zeros((0, 0), np.float32),
                      system_info=llama_cpp.llama_print_system_info().decode())
    errors: list[BaseException] = []
    eval_cb = _eval_callback(C, lib, run, node_hook, errors)

    mp = C.llama_model_default_params()
    mp.n_gpu_layers = 999 if rpc or offload else 0
    mp.use_extra_bufts = False                # weights stay in their GGUF layout (no CPU_REPACK buffer)
    model = C.llama_model_load_from_file(str(model_path).encode(), mp)
    if not model:
        raise ValueError(f"{model_path}: llama.cpp could not load the model:\n" + "".join(_LOG_LINES[-20:]))
    ctx = batch = None
    try:
        cp = C.llama_context_default_params()
        cp.n_ctx = max(int(n_ctx), len(tokens) + int(greedy))
        cp.n_batch = cp.n_ubatch = max(512, len(tokens))
        cp.n_seq_max = 1
        cp.n_threads = cp.n_threads_batch = int(n_threads)
        cp.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.type_k = cp.type_v = int(type_kv)
        cp.offload_kqv = bool(rpc or offload)
        if pooling is not None:
            cp.embeddings = True
            cp.pooling_type = int(pooling)
        if capture or node_hook is not None:
            cp.cb_eval = eval_cb
            cp.cb_eval_user_data = None
        ctx = C.llama_init_from_model(model, cp)
        if not ctx:
            raise RuntimeError("llama.cpp could not create a context:\n" + "".join(_LOG_LINES[-20:]))
        n = len(tokens)
        batch = C.llama_batch_init(n, 0, 1)
        _decode(C, ctx, batch, list(enumerate(tokens)))
        if errors:
            raise errors[0]
        run.logits = _outputs(C, model, ctx, n, pooling)
        if greedy:
            run.logits = _greedy(C, model, ctx, batch, run, n, int(greedy))
    finally:
        if batch is not None:
            C.llama_batch_free(batch)
        if ctx:
            C.llama_free(ctx)
        C.llama_model_free(model)
        run.log = "".join(_LOG_LINES)
    return run


def _eval_callback(C, lib, run: LlamaCppRun, node_hook, errors: list):
    """The scheduler's eval callback: node_hook(lib, tensor, ask) when given, else it asks for the nodes
    `_wanted` names and records their values into run.tensors in compute order. An exception never crosses
    into C: it is recorded in errors (raised after the decode)."""
    @C.ggml_backend_sched_eval_callback
    def eval_cb(t, ask, user_data):
        try:
            if node_hook is not None:
                node_hook(lib, t, bool(ask))
                return True
            name = lib.ggml_get_name(t).decode("utf-8", "replace")
            if ask:
                return _wanted(name)
            arr = _read_tensor(lib, t)
            if arr is not None:
                run.tensors[name] = arr
                if name in run.order:
                    run.order.remove(name)
                run.order.append(name)
        except BaseException as e:           # noqa: BLE001 -- an exception must not cross into C: record, go on
            errors.append(e)
        return True
    _KEEP.append(eval_cb)
    return eval_cb


def _decode(C, ctx, batch, positioned: list[tuple[int, int]]) -> None:
    """llama_decode of the (position, token) pairs as one sequence, every position's output kept."""
    batch.n_tokens = len(positioned)
    for i, (pos, tok) in enumerate(positioned):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = True
    rc = C.llama_decode(ctx, batch)
    if rc != 0:
        raise RuntimeError(f"llama_decode returned {rc}:\n" + "".join(_LOG_LINES[-20:]))


def _greedy(C, model, ctx, batch, run: LlamaCppRun, n: int, steps: int) -> np.ndarray:
    """`steps` greedy tokens after the prompt's n (appended to run.generated): the logits that chose each,
    (steps, n_vocab); the last token is chosen but not decoded."""
    rows = [run.logits[-1]]
    for k in range(steps):
        tok = int(np.argmax(rows[-1]))
        run.generated.append(tok)
        if k == steps - 1:
            break
        _decode(C, ctx, batch, [(n + k, tok)])
        rows.append(_outputs(C, model, ctx, 1, None)[0])
    return np.stack(rows)


def _outputs(C, model, ctx, n: int, pooling: int | None) -> np.ndarray:
    """What the decode returns: logits (n, n_vocab), or the embeddings (module docstring of run_llama_cpp)."""
    def row(ptr, size):
        if not ptr:
            raise RuntimeError("llama.cpp returned no output for the decode:\n" + "".join(_LOG_LINES[-20:]))
        return np.ctypeslib.as_array(ptr, (size,)).copy()
    if pooling is None:
        n_vocab = C.llama_vocab_n_tokens(C.llama_model_get_vocab(model))
        return np.stack([row(C.llama_get_logits_ith(ctx, i), n_vocab) for i in range(n)])
    n_embd = C.llama_model_n_embd(model)
    if int(pooling) == 0:
        return np.stack([row(C.llama_get_embeddings_ith(ctx, i), n_embd) for i in range(n)])
    return row(C.llama_get_embeddings_seq(ctx, 0), n_embd)[None]


# -- the model comparison ------------------------------------------------------------------------------
# One Family per model kind refimpl runs: how to load it, run it with every intermediate captured, and
# what llama.cpp returns for it. The kind is the GGUF's general.architecture: "bert" and "rwkv6" / "rwkv7"
# have their own; every other architecture goes to refimpl.models.llama (which refuses what it cannot run).

ALIASES = {"inp_embd": "embd"}      # llama / rwkv: refimpl's capture name -> llama.cpp's, where they differ
POOLING_TYPES = {"none": 0, "mean": 1, "cls": 2, "last": 3}      # refimpl.models.bert pooling -> llama.cpp's


@dataclass(frozen=True)
class Family:
    """How `compare` drives one model kind.

    load(path) -> model;  ffn_weight(model) -> the weight whose type picks the budget row;
    run(model, tokens, capture) -> the final output (logits (n_tokens, n_vocab), or BERT's embeddings);
    pooling(model) -> the llama_pooling_type llama.cpp runs with (None: logits);
    aliases: refimpl capture name -> llama.cpp's; output: the last row's name and note."""
    name: str
    load: Callable
    ffn_weight: Callable
    run: Callable
    pooling: Callable = lambda model: None
    aliases: dict = field(default_factory=dict)
    output: tuple = ("logits", "llama_get_logits_ith, every position")


def _llama_family() -> Family:
    from .models import llama

    def run(model, tokens, capture, cache_dtype=None):
        cache = llama.new_cache(model, max(len(tokens), 1), dtype=cache_dtype)
        return llama.forward(model, tokens, cache, capture=capture)
    return Family("llama", llama.load, lambda m: m.layers[0].ffn_down, run, aliases=ALIASES)


def _gemma3_family() -> Family:
    from .models import gemma3

    def run(model, tokens, capture, cache_dtype=None):
        cache = gemma3.new_cache(model, max(len(tokens), 1), dtype=cache_dtype)
        return gemma3.forward(model, tokens, cache, capture=capture)
    return Family("gemma3", gemma3.load, lambda m: m.layers[0].ffn_down, run, aliases=ALIASES)


def _gpt_oss_family() -> Family:
    from .models import gpt_oss

    def run(model, tokens, capture, cache_dtype=None):
        cache = gpt_oss.new_cache(model, max(len(tokens), 1), dtype=cache_dtype)
        return gpt_oss.forward(model, tokens, cache, capture=capture)
    return Family("gpt-oss", gpt_oss.load, lambda m: m.layers[0].ffn_down_exps, run, aliases=ALIASES)


def _bert_family() -> Family:
    """BERT: llama.cpp runs it with embeddings on and the model's pooling (mean when the GGUF names none);
    the last row compares refimpl's pooled embedding (`bert.pool`, not normalized) with
    llama_get_embeddings_seq. refimpl's captured activations carry a batch axis of one sequence."""
    from .models import bert

    def pooling(model):
        return model.pooling or "mean"

    def run(model, tokens, capture, cache_dtype=None):
        h = bert.forward(model, tokens, capture=capture)
        out = bert.pool(h, pooling(model))
        if out.ndim == 1:
            capture["result_embd_pooled"] = np.array(out, copy=True)
        return out.reshape(-1, model.hparams.n_embd)
    return Family("bert", bert.load, lambda m: m.layers[0].ffn_down, run,
                  pooling=lambda m: POOLING_TYPES[pooling(m)],
                  output=("embeddings", "llama_get_embeddings_seq (pooled, not normalized)"))


def _rwkv_family(name: str) -> Family:
    """RWKV-6 / RWKV-7: one forward from a fresh state with the logits of every position (llama.cpp names
    far fewer tensors than refimpl captures: attn_norm, ffn_inp, ffn_norm, l_out per layer)."""
    from .models import rwkv

    def run(model, tokens, capture, cache_dtype=None):
        logits, _ = rwkv.forward(model, tokens, capture=capture, all_logits=True)
        return logits
    return Family(name, rwkv.load, lambda m: m.weights["blocks.0.ffn.value.weight"], run, aliases=ALIASES)


def model_arch(model_path) -> str:
    """general.architecture of a GGUF file (ValueError naming the file when it is not one)."""
    from . import gguf
    try:
        f = gguf.load(model_path)
    except (OSError, ValueError) as e:
        raise ValueError(f"{model_path}: not a readable GGUF file ({e})") from None
    arch = f.metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ValueError(f"{model_path}: GGUF metadata has no general.architecture")
    return arch


def family(arch: str) -> Family:
    """The Family that runs GGUF architecture `arch`."""
    if arch == "bert":
        return _bert_family()
    if arch in ("rwkv6", "rwkv7"):
        return _rwkv_family(arch)
    if arch == "gemma3":
        return _gemma3_family()
    if arch == "gpt-oss":
        return _gpt_oss_family()
    return _llama_family()


def weight_type(model) -> str:
    """The ggml type name (lowercase) of a model's first FFN output weight (llama, BERT: blk.0.ffn_down;
    RWKV: blocks.0.ffn.value): the budget's row."""
    from .ops.matmul import ggml_type
    from .types import traits
    return traits(ggml_type(_family_of(model).ffn_weight(model))).name.lower()


def budget(wtype: str, numerics: str) -> float:
    """The NMSE budget per tensor for a model of weight type `wtype` compared in `numerics` mode."""
    from .tolerances import tol
    t = tol("compare", wtype, numerics)
    return 0.0 if t.exact else float(t.nmse)


def _align(ours: np.ndarray, theirs: np.ndarray):
    """(theirs cut to ours' shape, note) when they line up: equal shapes, equal ggml ne, or theirs
    spanning more KV cells on the last axis (llama.cpp's padded attention); else (None, why)."""
    if ours.shape == theirs.shape:
        return theirs, ""
    if ours.size == theirs.size and [d for d in ours.shape if d != 1] == [d for d in theirs.shape if d != 1]:
        return theirs.reshape(ours.shape), ""
    if (ours.ndim == theirs.ndim and ours.shape[:-1] == theirs.shape[:-1]
            and ours.shape[-1] < theirs.shape[-1]):
        return theirs[..., :ours.shape[-1]], f"first {ours.shape[-1]} of llama.cpp's {theirs.shape[-1]} KV cells"
    return None, f"llama.cpp has ne {list(theirs.shape[::-1])}"


def run_refimpl(model, tokens, *, numerics: str = "exact", cache_dtype=None, fam: Family | None = None):
    """refimpl's forward over `tokens` in `numerics` mode with every intermediate captured:
    (output, {name: array}); output is the logits (n_tokens, n_vocab), or a BERT model's embeddings.
    numerics="ggml" runs the NumPy backend (the emulations are NumPy code). cache_dtype: a Llama's KV cache."""
    from . import backend
    from . import numerics as numerics_mode
    fam = fam or _family_of(model)
    got: dict = {}
    tokens = np.asarray(tokens, np.int32).reshape(-1)
    with contextlib.ExitStack() as stack:
        stack.enter_context(numerics_mode(numerics))
        if numerics == "ggml":
            stack.enter_context(backend("numpy"))
        out = fam.run(model, tokens, got, cache_dtype=cache_dtype)
    return out, got


def _family_of(model) -> Family:
    from .models import family_of
    name = family_of(model).__name__.rsplit(".", 1)[-1]
    if name == "rwkv":
        return _rwkv_family(f"rwkv{model.version}")
    return {"bert": _bert_family, "gemma3": _gemma3_family, "gpt_oss": _gpt_oss_family}.get(name, _llama_family)()


def _tokens(model, model_path, prompt, tokens) -> np.ndarray:
    if tokens is None:
        if prompt is None:
            raise ValueError("compare: give a prompt or tokens")
        if model.tokenizer is None:
            raise ValueError(f"{model_path}: no tokenizer in the GGUF; pass tokens=")
        tokens = model.tokenizer.encode(prompt, add_special=True)
    tokens = np.asarray(tokens, np.int32).reshape(-1)
    if tokens.size == 0:
        raise ValueError("compare: the prompt has no tokens")
    return tokens


def compare(model_path, prompt=None, *, numerics: str = "exact", tokens=None, n_ctx: int = 512,
            n_threads: int = 2, cache_dtype=None, max_budget: float | None = None) -> list[Row]:
    """refimpl's forward against llama.cpp's, tensor by tensor, on one prompt (or the token ids `tokens`):
    one Row per tensor name both produce, in llama.cpp's evaluation order, then the logits (a BERT model:
    the pooled embeddings).

    The model kind is the GGUF's general.architecture: bert (refimpl.models.bert; llama.cpp with embeddings
    on and the model's pooling), rwkv6 / rwkv7 (refimpl.models.rwkv, from a fresh state), anything else
    refimpl.models.llama (gemma3 and gpt-oss: their own modules). The prompt is tokenized by refimpl (with
    the model's special tokens, as llama.cpp's tokenizer does); both sides then run the same ids.
    cache_dtype: a Llama's KV cache type (default: f32 in exact mode, f16 under numerics="ggml"; llama.cpp's
    cache is f16). max_budget overrides the table's budget."""
    fam = family(model_arch(model_path))
    model = fam.load(model_path)
    tokens = _tokens(model, model_path, prompt, tokens)
    ref = run_llama_cpp(model_path, tokens, n_ctx=max(n_ctx, len(tokens)), n_threads=n_threads,
                        pooling=fam.pooling(model))
    out, ours = run_refimpl(model, tokens, numerics=numerics, cache_dtype=cache_dtype, fam=fam)
    bud = budget(weight_type(model), numerics) if max_budget is None else float(max_budget)
    by_cpp = {fam.aliases.get(n, n): n for n in ours}
    rows = []
    for cname in ref.order:
        if cname not in by_cpp:
            continue
        name = by_cpp[cname]
        theirs, note = _align(np.asarray(ours[name]), ref.tensors[cname])
        if theirs is None:
            rows.append(Row(name, tuple(np.shape(ours[name])), math.nan, math.nan, bud, True, note))
            continue
        rows.append(row(name, ours[name], theirs, bud, note))
    rows.append(row(fam.output[0], out, ref.logits, bud, fam.output[1]))
    return rows


def read_dump(directory) -> dict:
    """A `refimpl serve --dump DIR` directory as {node name: the last value computed under that name}."""
    import json
    from pathlib import Path
    d = Path(directory)
    out: dict = {}
    index = d / "index.jsonl"
    if not index.exists():
        raise ValueError(f"{d}: no index.jsonl (not a refimpl serve --dump directory)")
    for line in index.read_text().splitlines():
        rec = json.loads(line)
        if _wanted(rec["name"]):
            out[rec["name"]] = d / rec["file"]
    return {k: np.load(v, allow_pickle=False) for k, v in out.items()}


def gguf_weight_type(model_path) -> str:
    """The ggml type name of a GGUF's first FFN output weight (blk.0.ffn_down.weight), else its commonest type:
    the budget's row, as `weight_type` picks it for refimpl's own models."""
    import collections
    from . import gguf
    from .ops.matmul import ggml_type
    from .types import traits
    f = gguf.load(model_path)
    w = f.tensors.get("blk.0.ffn_down.weight")
    t = ggml_type(w) if w is not None else collections.Counter(map(ggml_type, f.tensors.values())).most_common(1)[0][0]
    return traits(t).name.lower()


def compare_served(model_path, tokens, *, numerics: str = "exact", backend: str = "numpy", n_ctx: int = 512,
                   n_threads: int = 2, max_budget: float | None = None, dump=None) -> list[Row]:
    """llama.cpp with every layer offloaded to refimpl's RPC server (`refimpl serve --dump`) against the same
    llama.cpp on its CPU backend, node by node: one Row per tensor name both graphs compute, in llama.cpp's
    order, then the logits. No refimpl model code runs: the served side computes the graph llama.cpp sends,
    so any architecture llama.cpp knows can be lined up. Under numerics="ggml" the budget is 0 (the same
    bits) and llama.cpp's CPU side runs one thread (ggml-cpu is not run-to-run deterministic at two on some
    architectures). dump: keep the served nodes in this directory (default: a temporary one)."""
    import tempfile
    from .rpc import Server
    tokens = [int(t) for t in tokens]
    with tempfile.TemporaryDirectory(prefix="refimpl-served-") as tmp:
        d = str(dump or tmp)
        with Server("127.0.0.1", 0, backend=backend, numerics=numerics, dump=d) as srv:
            served = run_llama_cpp(model_path, tokens, n_ctx=max(n_ctx, len(tokens)), capture=False,
                                   rpc=f"127.0.0.1:{srv.port}")
        ours = read_dump(d)
    ref = run_llama_cpp(model_path, tokens, n_ctx=max(n_ctx, len(tokens)),
                        n_threads=1 if numerics == "ggml" else n_threads)
    if max_budget is not None:
        bud = float(max_budget)
    else:
        bud = 0.0 if numerics == "ggml" else budget(gguf_weight_type(model_path), numerics)
    rows = []
    for name in ref.order:
        if name not in ours:
            continue
        mine, cpp = np.asarray(ours[name]), ref.tensors[name]
        if mine.size == cpp.size and mine.shape != cpp.shape:
            # one ggml tensor under two shapes (llama.cpp's cb names a product and the reshaped view of it
            # alike; the server computes the product, cb_eval sees the view): the same bytes, in ne order
            cpp = cpp.reshape(mine.shape)
        theirs, note = _align(mine, cpp)
        if theirs is None:
            rows.append(Row(name, tuple(np.shape(ours[name])), math.nan, math.nan, bud, True, note))
            continue
        rows.append(row(name, ours[name], theirs, bud, note))
    rows.append(row("result_output", served.logits, ref.logits, bud, "logits"))
    return rows


# -- printing and the command line ---------------------------------------------------------------------

def add_parser(sub, add_model_options) -> None:
    """Register `refimpl compare` on the command line's subparsers."""
    s = sub.add_parser("compare", help="refimpl vs llama.cpp tensor by tensor on a prompt (-m MODEL -p PROMPT), "
                       "or one op vs ggml-python (--op OP)")
    s.add_argument("-m", "--model", help="GGUF file of a llama-family, bert, rwkv6 or rwkv7 model (compared with "
                   "llama.cpp through llama-cpp-python)")
    s.add_argument("-p", "--prompt", help="prompt text (tokenized by refimpl, with the model's special tokens)")
    s.add_argument("--tokens", help="comma-separated token ids instead of a prompt")
    s.add_argument("--op", help="compare one op with ggml-python over its golden cases instead of a model")
    s.add_argument("--cases", type=int, default=10, help="--op: drawn cases besides the named ones (default 10)")
    s.add_argument("--n-ctx", type=int, default=512, help="llama.cpp's context size (default 512)")
    s.add_argument("--cpp-threads", type=int, default=2, help="llama.cpp's threads (default 2)")
    s.add_argument("--budget", type=float, default=None, help="NMSE budget per tensor instead of the table's")
    s.add_argument("--served", action="store_true", help="run llama.cpp offloaded to refimpl's RPC server "
                   "(refimpl serve) instead of refimpl's own model code, and line its nodes up against llama.cpp "
                   "on the CPU: works for every architecture llama.cpp knows")
    s.add_argument("--dump", metavar="DIR", help="--served: keep the served nodes in DIR (refimpl serve --dump)")
    add_model_options(s)
    s.set_defaults(fn=cli)


def cli(args) -> int:
    """`refimpl compare`: print the table; exit status 1 when a tensor (or case) is over its budget."""
    import sys
    mode = args.numerics or "exact"
    try:
        if args.op:
            return _compare_op_tool(args.op, mode, args.cases, args.seed or 0)
        else:
            if not args.model or (args.prompt is None and not args.tokens):
                print("refimpl compare: give -m MODEL with -p PROMPT (or --tokens), or --op OP", file=sys.stderr)
                return 2
            if not llama_cpp_available():
                print("refimpl compare: needs llama-cpp-python (pip install llama-cpp-python)", file=sys.stderr)
                return 2
            toks = [int(t) for t in args.tokens.split(",")] if args.tokens else None
            ctx = contextlib.ExitStack()
            if getattr(args, "backend", None) and mode != "ggml":
                from . import backend
                ctx.enter_context(backend(args.backend))
            if args.served:
                if toks is None:
                    from . import gguf
                    from .tokenizers import from_gguf
                    toks = from_gguf(gguf.load(args.model)).encode(args.prompt, add_special=True)
                be = getattr(args, "backend", None) or "numpy"
                rows = compare_served(args.model, toks, numerics=mode, backend="numpy" if mode == "ggml" else be,
                                      n_ctx=args.n_ctx, n_threads=args.cpp_threads, max_budget=args.budget,
                                      dump=args.dump)
                title = f"{args.model}: llama.cpp on refimpl serve (numerics={mode}) vs llama.cpp on its CPU"
            else:
                with ctx:
                    rows = compare(args.model, args.prompt, numerics=mode, tokens=toks, n_ctx=args.n_ctx,
                                   n_threads=args.cpp_threads, max_budget=args.budget)
                title = f"{args.model}: refimpl (numerics={mode}) vs llama.cpp"
    except (ValueError, KeyError, ImportError) as e:
        print(f"refimpl: error: {e}", file=sys.stderr)
        return 2
    print(format_table(rows, title, "tensor"))
    return 1 if first_over(rows) else 0


def _compare_op_tool(op: str, numerics: str, n_cases: int, seed: int) -> int:
    """`compare --op`: the per-op comparison belongs to the test toolkit (its op cases need hypothesis and
    the ggml-python oracle), run as a program of its own so that the library never imports refimpl.testing."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "refimpl.testing.compare_op", op, "--numerics", numerics,
                          "--cases", str(n_cases), "--seed", str(seed)], capture_output=True, text=True, check=False)
    missing = re.search(r"^ModuleNotFoundError: No module named '([\w.]+)'", out.stderr, re.M)
    if out.returncode != 0 and missing:          # the toolkit could not start: one line, as main() words it
        print(f"refimpl: error: compare --op needs the optional package {missing.group(1)} (hypothesis and the "
              "ggml-python oracle): pip install 'refimpl[test]'", file=sys.stderr)
        return 1
    print(out.stdout, end="")
    print(out.stderr, end="", file=sys.stderr)
    return out.returncode


if __name__ == "__main__":
    import sys
    sys.exit(_child(sys.argv[1:]))
