"""The CUDA backend on a real GPU: every registered kernel checked against the NumPy reference at real sizes,
timed, and SmolLM2-135M prefill / decode speed on the GPU against the numba CPU backend.

    python benchmarks/cuda_check.py [--quick] [--skip NAME,...] [--reps N] [--model SmolLM2.gguf]
    NUMBA_ENABLE_CUDASIM=1 python benchmarks/cuda_check.py --quick --sim     # the logic, in the simulator

1. Peaks of the card: device-to-device copy bandwidth (a 256 MiB memcpy, read + write counted) and, when
   cupy or torch (with CUDA) is importable, an f32 4096 x 4096 x 4096 matmul in cuBLAS.
2. Kernels: for each op with a registered CUDA kernel (and each dequantizer), one or more cases at SmolLM2
   and 4096 sizes: the kernel's result (device inputs; weights as the models pass them, uploaded once in the
   warm-up) against the op's NumPy body on the same inputs, within its tolerance (the table's (op, type,
   "cuda") entry, else "property", else "ggml"; exact entries compare bits). Timing: cuda.event around each
   call (the Python launch cost included), 3 warm-up calls, the median of --reps. GB/s counts the bytes the
   op must read and write once; GFLOP/s the arithmetic of mul_mat-like ops; "% peak" is against the copy
   bandwidth (memory-bound ops) or cuBLAS (mul_mat with many tokens).
3. SmolLM2-135M-Instruct Q4_1 (~/.cache/refimpl, `refimpl fetch smollm2`): a 128-token prefill and 32
   greedy decode steps under backend("cuda") and backend("numba") (CPU), tokens/s, and the NMSE of the
   prefill logits against the CPU's (tol("llama.check.numba")).

--quick: small sizes and few repetitions. --sim: allow numba's CUDA simulator (tiny sizes, implies --quick; a
tiny random Llama replaces SmolLM2 and the NumPy backend the numba one, timings mean nothing). --skip takes
check names or prefixes (e.g. "mul_mat,dequantize,smollm2"). One markdown table is printed; the exit status is
1 if any check failed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@dataclass
class Case:
    """One kernel check: op(*args, **kwargs); `host` args are left on the host (weights: the kernel uploads
    them once); nbytes / flops: the data the op must move and the arithmetic it does (for GB/s, GFLOP/s)."""
    name: str
    op: str
    ttype: str
    args: tuple
    kwargs: dict
    nbytes: int
    flops: int = 0
    host: tuple = ()


@dataclass
class Row:
    check: str
    shape: str
    ok: bool | None          # None: not run (skipped, not available)
    error: str = ""
    ms: float | None = None
    gbs: float | None = None
    gflops: float | None = None
    peak: str = ""


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, few repetitions")
    p.add_argument("--sim", action="store_true", help="run in numba's CUDA simulator (tiny sizes; implies --quick)")
    p.add_argument("--skip", default="", help="comma-separated check names or prefixes to skip")
    p.add_argument("--reps", type=int, default=None, help="timed repetitions per kernel (default 20, quick 3)")
    p.add_argument("--model", default=None, help="the SmolLM2 GGUF (default: refimpl's cache)")
    a = p.parse_args(argv)
    a.quick = a.quick or a.sim
    a.reps = a.reps or (1 if a.sim else 3 if a.quick else 20)
    a.skip = [s.strip() for s in a.skip.split(",") if s.strip()]
    return a


# -- measurement -------------------------------------------------------------------------------------------

WARMUP = 3            # calls before timing (1 under --sim)


def timed(fn, reps: int, warmup: int | None = None) -> float:
    """Median milliseconds of fn() between two CUDA events (synchronized), after `warmup` calls."""
    from numba import cuda
    for _ in range(WARMUP if warmup is None else warmup):
        fn()
    cuda.synchronize()
    out = []
    for _ in range(reps):
        start, end = cuda.event(), cuda.event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    return max(statistics.median(out), 1e-6)          # the simulator's events read 0


def copy_bandwidth(quick: bool, reps: int) -> float:
    """GB/s of a device-to-device copy (bytes read + bytes written per second)."""
    from numba import cuda
    n = (1 << 20) if quick else (256 << 20)
    src, dst = cuda.device_array(n // 4, np.float32), cuda.device_array(n // 4, np.float32)
    ms = timed(lambda: dst.copy_to_device(src), reps)
    return 2 * n / (ms * 1e-3) / 1e9


def blas_gflops(quick: bool, reps: int) -> tuple[str, float | None]:
    """(library, GFLOP/s) of an f32 n x n x n matmul in cuBLAS through cupy or torch, if importable."""
    n = 512 if quick else 4096
    try:
        import cupy
        a = cupy.random.standard_normal((n, n), dtype=cupy.float32)
        fn, sync, lib = (lambda: a @ a), cupy.cuda.Device().synchronize, "cupy"
    except Exception:  # noqa: BLE001 -- no cupy, or no GPU: try torch
        try:
            import torch
            if not torch.cuda.is_available():
                return "none (torch without CUDA, no cupy)", None
            a = torch.randn(n, n, device="cuda")
            fn, sync, lib = (lambda: a @ a), torch.cuda.synchronize, "torch"
        except Exception:  # noqa: BLE001 -- no torch, or no GPU: no BLAS row
            return "none (neither cupy nor torch)", None
    for _ in range(3):
        fn()
    sync()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t)
    return lib, 2 * n ** 3 / statistics.median(ts) / 1e9


# -- cases -------------------------------------------------------------------------------------------------

def cases(quick: bool, sim: bool = False) -> list[Case]:
    """SmolLM2-135M shapes (n_embd 576, 9 heads over 3 KV heads of 64, n_ff 1536) and 4096-wide ones; small
    with quick, tiny in the simulator."""
    import refimpl
    rng = np.random.default_rng(0)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)            # noqa: E731
    E, F, H, HKV, D, T, W = ((32, 32, 2, 1, 16, 2, 32) if sim else (64, 96, 2, 1, 32, 4, 64) if quick
                             else (576, 1536, 9, 3, 64, 128, 4096))
    V = 8192 if not quick else 32
    out = []
    for wt, (m, k) in [("q4_1", (F, E)), ("f32", (W, W)), ("f16", (W, W))]:
        w = f32(m, k) * np.float32(k ** -0.5)
        w = refimpl.quantize(w, wt) if wt == "q4_1" else w.astype(np.float16) if wt == "f16" else w
        wb = w.data.nbytes if hasattr(w, "data") and not isinstance(w, np.ndarray) else w.nbytes
        for n in (1, T):
            b = f32(n, k)
            out.append(Case(f"mul_mat {wt}", "mul_mat", wt, (w, b), {}, wb + b.nbytes + 4 * m * n, 2 * m * n * k,
                            host=(0,)))
    x, g = f32(T, W), f32(W)
    out += [Case("rms_norm", "rms_norm", "f32", (x, 1e-5), {}, 2 * x.nbytes),
            Case("norm", "norm", "f32", (x, 1e-5), {}, 2 * x.nbytes)]
    for o in ("add", "sub", "mul", "div"):
        out.append(Case(o, o, "f32", (x, g), {}, 2 * x.nbytes + g.nbytes, host=(1,)))
    out += [Case("scale", "scale", "f32", (x, 0.5), {}, 2 * x.nbytes),
            Case("silu", "silu", "f32", (x,), {}, 2 * x.nbytes)]
    u, v = f32(T, F), f32(T, F)
    for o in ("swiglu", "geglu", "reglu"):
        out.append(Case(o, o, "f32", (u, v), {}, 3 * u.nbytes))
    kq = f32(H, T, T)
    mask = np.triu(np.full((T, T), -np.inf, np.float32), 1)
    out.append(Case("soft_max_ext", "soft_max_ext", "f32", (kq, mask, D ** -0.5, 0.0), {},
                    2 * kq.nbytes + mask.nbytes))
    q = f32(T, H, D)
    out.append(Case("rope_ext", "rope_ext", "f32", (q, np.arange(T, dtype=np.int32), None),
                    {"n_dims": D, "mode": 0, "freq_base": 100000.0}, 2 * q.nbytes))
    tab = f32(V, E)
    rows = rng.integers(0, V, T).astype(np.int32)
    qtab = refimpl.quantize(tab, "q4_1")
    out += [Case("get_rows f32", "get_rows", "f32", (tab, rows), {}, 2 * 4 * T * E, host=(0,)),
            Case("get_rows q4_1", "get_rows", "q4_1", (qtab, rows), {}, qtab.data.nbytes // V * T + 4 * T * E,
                 host=(0,))]
    qa = f32(1, H, T, D)
    ka, va = f32(1, HKV, T, D).astype(np.float16), f32(1, HKV, T, D).astype(np.float16)
    out.append(Case("flash_attn_ext f16", "flash_attn_ext", "f16", (qa, ka, va, None, D ** -0.5), {},
                    qa.nbytes * 2 + ka.nbytes + va.nbytes, 4 * H * T * T * D))
    Hr, Nr, Tr = (32, 64, 16) if not quick else (2, 8, 3)
    k6, v6, r6 = (f32(Tr, Hr, Nr) * np.float32(0.3) for _ in range(3))
    td = rng.uniform(0.5, 1.0, (Tr, Hr, Nr)).astype(np.float32)
    st = f32(1, Hr * Nr * Nr) * np.float32(0.1)
    out.append(Case("rwkv_wkv6", "rwkv_wkv6", "f32", (k6, v6, r6, f32(Hr, Nr), td, st), {},
                    4 * k6.nbytes + 2 * st.nbytes, 4 * Tr * Hr * Nr * Nr))
    kk = f32(Tr, Hr, Nr)
    kk /= np.linalg.norm(kk, axis=-1, keepdims=True)
    out.append(Case("rwkv_wkv7", "rwkv_wkv7", "f32", (r6, td, k6, v6, -kk, kk * np.float32(0.5), st), {},
                    6 * k6.nbytes + 2 * st.nbytes, 6 * Tr * Hr * Nr * Nr))
    out += [Case("concat", "concat", "f32", (x[:1], x[1:], 1), {}, 2 * x.nbytes),
            Case("cont", "cont", "f32", (x, (x.size,)), {}, 2 * x.nbytes),
            Case("permute", "permute", "f32", (q, 0, 2, 1, 3), {}, 2 * q.nbytes),
            Case("cast f16", "cast", "f32", (x, "f16"), {}, 3 * x.nbytes // 2),
            Case("repeat", "repeat", "f32", (g.reshape(1, -1), x.shape), {}, g.nbytes + x.nbytes)]
    cache, new = f32(W, E), f32(T, E)
    slots = rng.permutation(W)[:T].astype(np.int32)
    out.append(Case("set_rows", "set_rows", "f32", (cache, new, slots), {}, 2 * cache.nbytes + new.nbytes))
    # the fused ops: their op sequences on the device (refimpl/kernels/cuda/fused.py)
    wf, bf = f32(F, E) * np.float32(E ** -0.5), f32(F)
    xe = f32(T, E)
    out += [Case("mul_mat_add", "mul_mat_add", "f32", (wf, xe, bf), {}, wf.nbytes + xe.nbytes, host=(0,)),
            Case("mul_mat_add_gelu", "mul_mat_add_gelu", "f32", (wf, xe, bf), {}, wf.nbytes + xe.nbytes,
                 host=(0,)),
            Case("add_norm_affine", "add_norm_affine", "f32", (xe, f32(E), xe, f32(E), f32(E), 1e-5), {},
                 3 * xe.nbytes)]
    q4, k4, v4 = (f32(1, T, H, D) for _ in range(3))
    m4 = mask.reshape(1, 1, T, T)
    out.append(Case("attn_mha", "attn_mha", "f32", (q4, k4, v4, m4, D ** -0.5), {}, 4 * q4.nbytes,
                    4 * H * T * T * D))
    n = H * D
    wqkv, bqkv = f32(3 * n, E) * np.float32(E ** -0.5), f32(3 * n)
    out.append(Case("attn_qkv", "attn_qkv", "f32", (xe.reshape(1, T, E), wqkv, bqkv, m4, D ** -0.5, H), {},
                    wqkv.nbytes + 2 * xe.nbytes, 2 * 3 * n * E * T + 4 * H * T * T * D, host=(1,)))
    return out


def unary_case(name: str, quick: bool) -> Case | None:
    """A case for an element-wise op of one f32 tensor (exp, tanh, gelu, ...), if the op takes one: x of
    (128, 4096) (quick: (2, 32)) drawn in [-3, 3], or in [0.1, 3] for ops defined on positive numbers."""
    from refimpl.dispatch import OPS
    rng = np.random.default_rng(3)
    x = rng.uniform(-3, 3, (2, 32) if quick else (128, 4096)).astype(np.float32)
    for xs in (x, np.abs(x) + np.float32(0.1)):
        try:
            with np.errstate(all="raise"):
                OPS[name].fn(xs[:1, :8])
        except (TypeError, FloatingPointError, ValueError):
            continue
        return Case(name, name, "f32", (xs,), {}, 2 * xs.nbytes)
    return None


def tolerance(op: str, ttype: str):
    from refimpl.testing.tolerances import TOLERANCES, tol
    for against in ("cuda", "property", "ggml"):
        for key in ((op, ttype, against), (op, "*", against)):
            if key in TOLERANCES:
                return tol(op, ttype, against)
    return None


def compare(got: np.ndarray, want: np.ndarray, t) -> tuple[bool, str]:
    from refimpl.testing import nmse
    if got.shape != want.shape:
        return False, f"shape {got.shape} != {want.shape}"
    if t.exact:
        same = np.array_equal(got.view(np.uint32) if got.dtype == np.float32 else got,
                              want.view(np.uint32) if want.dtype == np.float32 else want)
        return same, "bits equal" if same else f"bits differ (NMSE {nmse(got, want):.1e})"
    e = nmse(got, want)
    return e <= t.nmse, f"NMSE {e:.1e} <= {t.nmse:.0e}" if e <= t.nmse else f"NMSE {e:.1e} > {t.nmse:.0e}"


def check_case(c: Case, reps: int, peak_bw: float) -> Row:
    import refimpl
    from refimpl.kernels.cuda import _device
    from refimpl.dispatch import OPS
    info = OPS[c.op]
    shape = " x ".join(str(tuple(np.shape(a))) for a in c.args if hasattr(a, "shape"))
    t = tolerance(c.op, c.ttype)
    if t is None:
        return Row(c.name, shape, False, f"no tolerance for ({c.op}, {c.ttype}) in the table")
    try:
        want = np.asarray(info.fn(*c.args, **c.kwargs))
        dev = tuple(a if i in c.host or not isinstance(a, np.ndarray) else _device.to_device(a)
                    for i, a in enumerate(c.args))
        fn = info.kernels["cuda"]
        with refimpl.backend("cuda"):
            got = _device.to_host(fn(*dev, **c.kwargs))
            ok, msg = compare(got, want, t)
            ms = timed(lambda: fn(*dev, **c.kwargs), reps)
    except Exception as e:          # noqa: BLE001 -- a crashing kernel is a failed check, reported in the table
        return Row(c.name, shape, False, f"{type(e).__name__}: {e}"[:200])
    gbs = c.nbytes / (ms * 1e-3) / 1e9
    gfl = c.flops / (ms * 1e-3) / 1e9 if c.flops else None
    return Row(c.name, shape, ok, msg, ms, gbs, gfl, f"{100 * gbs / peak_bw:.0f}% copy" if peak_bw else "")


def dequant_rows(quick: bool, reps: int, peak_bw: float) -> list[Row]:
    """Every dequantizer with a CUDA kernel, on random bytes (every bit pattern a block can hold): bits equal."""
    from refimpl.kernels.cuda import _device
    from refimpl.kernels.cuda import quants as kq
    from refimpl.dispatch import KERNELS
    from refimpl.quants import DEQUANTIZERS
    from refimpl.types import traits
    rng = np.random.default_rng(1)
    by_ref = {ref: t for t, ref in DEQUANTIZERS.items()}
    rows = []
    n = 4096 * 256 if not quick else 256
    for (ref, backend), k in KERNELS.items():
        t = by_ref.get(ref)
        if backend != "cuda" or t is None:
            continue
        tr = traits(t)
        nb = max(1, n // tr.blck_size)
        blocks = rng.integers(0, 256, (nb, tr.type_size), dtype=np.uint8)
        name = f"dequantize {tr.name}"
        try:
            with np.errstate(all="ignore"):
                want = ref(blocks)
            got = k(blocks)
            bits = lambda v: np.asarray(v, np.float32).view(np.uint32)     # noqa: E731  (NaNs compare too)
            ok = np.array_equal(bits(got), bits(want))
            dblocks = _device.to_device(blocks)
            ms = timed(lambda: kq.dequantize_blocks(t, dblocks), reps)
        except Exception as e:  # noqa: BLE001 -- a crashing kernel is a failed check, reported in the table
            rows.append(Row(name, f"({nb}, {tr.type_size})", False, f"{type(e).__name__}: {e}"[:200]))
            continue
        gbs = (blocks.nbytes + 4 * nb * tr.blck_size) / (ms * 1e-3) / 1e9
        rows.append(Row(name, f"({nb}, {tr.type_size})", ok, "bits equal" if ok else "bits differ", ms, gbs, None,
                        f"{100 * gbs / peak_bw:.0f}% copy" if peak_bw else ""))
    return rows


# -- SmolLM2 -----------------------------------------------------------------------------------------------

def llama_rows(args) -> list[Row]:
    """Prefill and decode tokens/s on the GPU and on the CPU backend; the prefill logits compared."""
    import refimpl
    from refimpl.models import llama
    from refimpl.testing import nmse
    from refimpl.testing.tolerances import tol
    if args.sim:
        from tests.models.tiny import write_tiny_llama
        path = write_tiny_llama(Path(tempfile.mkdtemp()) / "tiny.gguf", n_vocab=32, n_embd=16, n_layer=1,
                                n_head=2, n_head_kv=1, n_ff=16, vocab=False)
        model, name, cpu = llama.load(path, tokenizer=False), "tiny llama", "numpy"
    else:
        from refimpl import fetch
        path = Path(args.model) if args.model else fetch.path("smollm2")
        if not path.exists():
            return [Row("smollm2", str(path), False, "model missing: run `refimpl fetch smollm2` or pass --model")]
        model, name, cpu = llama.load(path, tokenizer=False), "smollm2", "numba"
    n_prompt, n_gen = (3, 1) if args.sim else (8, 2) if args.quick else (128, 32)
    prompt = [int(i) for i in np.random.default_rng(2).integers(0, model.hparams.n_vocab, n_prompt)]
    rows, logits = [], {}
    for backend in ("cuda", cpu):
        with refimpl.backend(backend):
            if not args.sim:
                llama.forward(model, prompt[:4], llama.new_cache(model, 8))      # warm-up: uploads, compiles
            cache = llama.new_cache(model, n_prompt + n_gen + 1)
            t0 = time.perf_counter()
            first = llama.forward(model, prompt, cache)
            t1 = time.perf_counter()
            tok = int(np.argmax(first[-1]))
            for _ in range(n_gen):
                tok = int(np.argmax(llama.forward(model, [tok], cache)[-1]))
            t2 = time.perf_counter()
        logits[backend] = first
        rows.append(Row(f"{name} prefill {backend}", f"{n_prompt} tokens", None, "", 1e3 * (t1 - t0),
                        peak=f"{n_prompt / (t1 - t0):.1f} tok/s"))
        rows.append(Row(f"{name} decode {backend}", f"{n_gen} tokens", None, "", 1e3 * (t2 - t1) / n_gen,
                        peak=f"{n_gen / (t2 - t1):.1f} tok/s"))
    bound = tol("llama.check.numba", "*", "exact").nmse
    e = nmse(logits["cuda"], logits[cpu])
    rows.append(Row(f"{name} logits cuda vs {cpu}", f"({n_prompt}, {model.hparams.n_vocab})", e <= bound,
                    f"NMSE {e:.1e} {'<=' if e <= bound else '>'} {bound:.0e}"))
    return rows


# -- main --------------------------------------------------------------------------------------------------

def skipped(name: str, skip: list[str]) -> bool:
    return any(name == s or name.startswith(s) for s in skip)


def table(rows: list[Row]) -> str:
    f = lambda v, p: "" if v is None else f"{v:.{p}f}"                   # noqa: E731
    out = ["| check | shape | result | detail | median ms | GB/s | GFLOP/s | peak |",
           "|---|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        res = "ok" if r.ok else "FAIL" if r.ok is False else "-"
        out.append(f"| {r.check} | {r.shape} | {res} | {r.error} | {f(r.ms, 3)} | {f(r.gbs, 1)} | {f(r.gflops, 1)} "
                   f"| {r.peak} |")
    return "\n".join(out)


def main(argv=None) -> int:
    global WARMUP
    args = parse(argv)
    if args.sim:
        WARMUP = 1
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
        warnings.filterwarnings("ignore", "Simulator timings are bogus")
    from numba import cuda

    import refimpl.kernels.cuda as kcuda
    from refimpl.kernels.cuda import _device
    from refimpl.dispatch import OPS
    if _device.SIMULATOR and not args.sim:
        print("numba.cuda is the simulator (NUMBA_ENABLE_CUDASIM=1): pass --sim to run there", file=sys.stderr)
        return 2
    if not cuda.is_available():
        print("numba.cuda finds no GPU", file=sys.stderr)
        return 2
    kcuda.load()
    dev = "simulator" if _device.SIMULATOR else cuda.get_current_device().name
    dev = dev.decode() if isinstance(dev, bytes) else dev
    rows = []
    bw = copy_bandwidth(args.quick, args.reps)
    rows.append(Row("device copy", f"{'1 MiB' if args.quick else '256 MiB'} d2d", None, str(dev), None, bw))
    lib, gfl = blas_gflops(args.quick, args.reps) if not args.sim else ("skipped in the simulator", None)
    rows.append(Row("f32 matmul (cuBLAS)", "512^3" if args.quick else "4096^3", None, lib, None, None, gfl))
    registered = {name for name, info in OPS.items() if "cuda" in info.kernels}
    covered = set()
    for c in cases(args.quick, args.sim):
        covered.add(c.op)
        if c.op not in registered or skipped(c.name, args.skip):
            rows.append(Row(c.name, "", None, "skipped" if c.op in registered else "no CUDA kernel registered"))
            continue
        r = check_case(c, args.reps, bw)
        if c.op == "mul_mat" and gfl and r.gflops:
            r.peak += f", {100 * r.gflops / gfl:.0f}% {lib}"
        rows.append(r)
    for name in sorted(registered - covered):
        c = unary_case(name, args.quick)
        if c is None:
            rows.append(Row(name, "", False, "registered CUDA kernel without a case in cuda_check.py"))
        elif not skipped(name, args.skip):
            rows.append(check_case(c, args.reps, bw))
    if not skipped("dequantize", args.skip):
        rows += dequant_rows(args.quick, args.reps, bw)
    if not skipped("smollm2", args.skip):
        rows += llama_rows(args)
    print(table(rows))
    failed = [r.check for r in rows if r.ok is False]
    if failed:
        print(f"\nFAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
