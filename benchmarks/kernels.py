"""Numba kernels against refimpl's NumPy code, gguf-py and ggml's C: dequantize, quantize, mul_mat.

    python -m benchmarks.kernels [--elems N] [--repeat 5] [--types q4_0,q4_K] [--threads 1]
                                 [--skip dequantize,quantize,mul_mat] [--shapes 576x576,4096x4096]

Three tables (markdown), every number the best of --repeat interleaved rounds (`benchmarks.quants.measure`):

1. dequantize, Melem/s per type: refimpl under the "numba" backend (with --threads Numba threads), the
   same under "numpy", gguf-py's `gguf.quants.dequantize`, and ggml's `dequantize_row_*` / `to_float`
   (single thread), with the ratios numba/ggml and numba/gguf-py.
2. quantize, Melem/s for Q4_0, Q8_0, Q4_K, Q6_K (or --types): numba, numpy, ggml_quantize_chunk
   (single thread).
3. mul_mat, GFLOP/s (2*n*k*m flops) of weight (n, k) times m rows of f32 activations, m = 1 (decode)
   and 128 (prefill), for F32/F16/Q4_0/Q4_1/Q8_0/Q4_K/Q6_K weights: refimpl numba with 1 and 2 threads
   (Numba's and, through threadpoolctl, BLAS's), ggml (a ggml-python graph computed repeatedly,
   activations converted to the weight's vec_dot type inside) with 1 and 2 threads.

Single-thread columns are CPU time (`time.process_time`, robust to other load on a shared machine), the
2-thread columns wall-clock time. Record results in docs/benchmarks.md. The first run compiles the
kernels (cached afterwards in refimpl/kernels/__pycache__); the one-time cost is printed.
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

import refimpl
from benchmarks.quants import measure
from refimpl.types import as_type, traits, type_traits

MM_TYPES = ("f32", "f16", "q4_0", "q4_1", "q8_0", "q4_K", "q6_K")
Q_TYPES = ("q4_0", "q8_0", "q4_K", "q6_K")


def _fmt(v):
    return "—" if v is None else f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def _ratio(u, v):
    return "—" if u is None or v is None else f"{u / v:.2f}×"


def warm_up() -> float:
    """Compile (or load from the cache) every kernel the benchmark runs; seconds taken."""
    import numba  # noqa: F401
    t0 = time.perf_counter()
    import refimpl.kernels
    refimpl.kernels.load()
    x = np.random.default_rng(0).standard_normal((2, 256)).astype(np.float32)
    with refimpl.backend("numba"):
        for t in Q_TYPES:
            qt = refimpl.quantize(x, t)
            refimpl.dequantize(qt)
            refimpl.mul_mat(qt, x)
            refimpl.mul_mat(qt, np.repeat(x, 9, axis=0))
        refimpl.mul_mat(x, x)
        refimpl.mul_mat(x.astype(np.float16), x)
    return time.perf_counter() - t0


def _ggml():
    try:
        from refimpl.testing import ggml
        ggml.check_profile()
        return ggml
    except Exception:  # noqa: BLE001 -- no oracle build: ggml's columns are left out
        return None


def bench_dequantize(x, types, repeat, ggml):
    try:
        import gguf.quants as gq
    except ImportError:
        gq = None
    me = x.size / 1e6
    print("\n## dequantize, Melem/s (numba: %d thread(s); numpy, gguf-py, ggml C: 1)\n" % numba_threads())
    print("| type | refimpl numba | refimpl numpy | gguf-py | ggml C | numba/ggml | numba/gguf-py |\n|---|"
          + "---:|" * 6)
    for t in types:
        tr = type_traits[t]
        qt = _qtensor(x, t, ggml)
        fns = {}
        fns["numba"] = _under("numba", lambda: refimpl.dequantize(qt))
        fns["numpy"] = _under("numpy", lambda: refimpl.dequantize(qt))
        gtype = getattr(gq, "_type_traits", {}).get(t) if gq else None
        if gtype and "dequantize_blocks" in gtype.__dict__:
            fns["gguf"] = lambda: gq.dequantize(qt.data, t)
        if ggml:
            fns["ggml"] = lambda: ggml.dequantize(qt)
        cpu, wall = measure(fns, repeat)
        tm = wall if numba_threads() > 1 else cpu
        v = {k: me / tm[k] for k in tm}
        g = v.get
        print(f"| {tr.name} | {_fmt(g('numba'))} | {_fmt(g('numpy'))} | {_fmt(g('gguf'))} | {_fmt(g('ggml'))} | "
              f"{_ratio(g('numba'), g('ggml'))} | {_ratio(g('numba'), g('gguf'))} |", flush=True)


def bench_quantize(x, types, repeat, ggml):
    me = x.size / 1e6
    print("\n## quantize (method \"chunk\"), Melem/s (numba: %d thread(s); numpy, ggml C: 1)\n" % numba_threads())
    print("| type | refimpl numba | refimpl numpy | ggml_quantize_chunk | numba/ggml | numba/numpy |\n|---|"
          + "---:|" * 5)
    for t in types:
        fns = {"numba": _under("numba", lambda: refimpl.quantize(x, t)),
               "numpy": _under("numpy", lambda: refimpl.quantize(x, t))}
        if ggml:
            fns["ggml"] = lambda: ggml.quantize(x, t)
        cpu, wall = measure(fns, repeat)
        tm = wall if numba_threads() > 1 else cpu
        v = {k: me / tm[k] for k in tm}
        g = v.get
        print(f"| {traits(t).name} | {_fmt(g('numba'))} | {_fmt(g('numpy'))} | {_fmt(g('ggml'))} | "
              f"{_ratio(g('numba'), g('ggml'))} | {_ratio(g('numba'), g('numpy'))} |", flush=True)


class GGMLMatMul:
    """One ggml mul_mat graph over copies of (a, b), computed on demand with n threads."""

    def __init__(self, ggml, a, b):
        from refimpl.testing.ggml import _Ctx
        self.g = ggml.lib()
        size = (a.data.nbytes if isinstance(a, refimpl.QTensor) else a.nbytes) + b.nbytes
        self.c = _Ctx((64 << 20) + 4 * size + 8 * b.shape[0] * a.shape[0])
        ta, tb = self.c.tensor(a), self.c.tensor(b)
        self.out = self.g.ggml_mul_mat(self.c.ctx, ta, tb)
        self.gf = self.g.ggml_new_graph(self.c.ctx)
        self.g.ggml_build_forward_expand(self.gf, self.out)

    def __call__(self, n_threads):
        if self.g.ggml_graph_compute_with_ctx(self.c.ctx, self.gf, n_threads) != 0:
            raise RuntimeError("ggml_graph_compute failed")

    def free(self):
        self.c.free()


def bench_mul_mat(shapes, types, repeat, ggml):
    import numba
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:                                     # BLAS then keeps its own thread count
        threadpool_limits = None
    print("\n## mul_mat, GFLOP/s: weight (n, k) x m rows of f32 activations (refimpl numba with 1 / 2 threads "
          "for its kernels and BLAS; ggml with 1 / 2 threads)\n")
    print("| weight | n×k | m | numba 1t | numba 2t | ggml 1t | ggml 2t | numba/ggml 1t | numba/ggml 2t |\n|---|---|"
          + "---:|" * 7)
    rng = np.random.default_rng(0)
    old = numba.get_num_threads()
    for n, k in shapes:
        w = rng.uniform(-1, 1, (n, k)).astype(np.float32)
        for t in types:
            if k % traits(as_type(t)).blck_size:
                print(f"| {t} | {n}×{k} | — | k is not a multiple of the {traits(as_type(t)).blck_size}-element block |"
                      + " |" * 6)
                continue
            a = (w if t == "f32" else w.astype(np.float16) if t == "f16"
                 else _under("numba", lambda: refimpl.quantize(w, t))())
            for m in (1, 128):
                b = rng.uniform(-1, 1, (m, k)).astype(np.float32)
                flop = 2.0 * n * k * m / 1e9
                gm = GGMLMatMul(ggml, a, b) if ggml else None
                r = max(2, repeat if n * k * m < 1 << 26 else 2)
                cpu, wall = {}, {}
                for th in (1, 2):                  # 1 thread, then 2: Numba's and BLAS's, ggml's
                    numba.set_num_threads(th)
                    fns = {f"n{th}": _under("numba", lambda: refimpl.mul_mat(a, b))}
                    if gm:
                        fns[f"g{th}"] = lambda th=th: gm(th)
                    with _blas_threads(threadpool_limits, th):
                        c, w_ = measure(fns, r)
                    cpu.update(c)
                    wall.update(w_)
                if gm:
                    gm.free()
                v = {key: flop / (cpu[key] if key[1] == "1" else wall[key]) for key in cpu}
                g = v.get
                print(f"| {t} | {n}×{k} | {m} | {_fmt2(g('n1'))} | {_fmt2(g('n2'))} | {_fmt2(g('g1'))} | "
                      f"{_fmt2(g('g2'))} | {_ratio(g('n1'), g('g1'))} | {_ratio(g('n2'), g('g2'))} |", flush=True)
    numba.set_num_threads(old)


class _blas_threads:
    """threadpoolctl's limit on BLAS threads, if threadpoolctl is installed."""

    def __init__(self, limits_fn, n):
        self.ctx = limits_fn(limits=n, user_api="blas") if limits_fn else None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.ctx is not None:
            self.ctx.restore_original_limits()


def _fmt2(v):
    return "—" if v is None else f"{v:.2f}"


def _under(backend, fn):
    def run():
        with refimpl.backend(backend):
            return fn()
    return run


def _qtensor(x, t, ggml):
    from refimpl.quants import QUANTIZERS
    tr = type_traits[t]
    if (t, "ref") in QUANTIZERS or (t, "chunk") in QUANTIZERS:
        try:
            return _under("numba", lambda: refimpl.quantize(x, t))()
        except ValueError:
            pass
    # types quantized only with an importance matrix: random blocks
    raw = np.random.default_rng(1).integers(0, 256, (x.shape[0], x.shape[1] // tr.blck_size * tr.type_size), np.uint8)
    return refimpl.QTensor(t, raw, x.shape)


def numba_threads() -> int:
    import numba
    return numba.get_num_threads()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--elems", type=int, default=1 << 20, help="elements per dequantize/quantize (default 1Mi)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--types", default="", help="dequantize/quantize types (default: every type / Q4_0,Q8_0,Q4_K,Q6_K)")
    ap.add_argument("--threads", type=int, default=1, help="Numba threads for the dequantize/quantize tables")
    ap.add_argument("--skip", default="", help="comma list of dequantize,quantize,mul_mat")
    ap.add_argument("--shapes", default="576x576,1536x576,4096x4096", help="mul_mat weight shapes n x k")
    a = ap.parse_args(argv)
    import numba
    ggml = _ggml()
    compile_s = warm_up()
    numba.set_num_threads(a.threads)
    skip = set(a.skip.split(","))
    want = [as_type(t) for t in a.types.split(",") if t]
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, numpy {np.__version__}, "
          f"numba {numba.__version__}; kernels compiled or loaded in {compile_s:.1f} s; best of {a.repeat}")
    x = np.random.default_rng(0).standard_normal((max(1, a.elems // 4096), 4096)).astype(np.float32)
    if "dequantize" not in skip:
        types = want or [t for t in type_traits if (type_traits[t].is_quantized or t.name == "BF16")]
        bench_dequantize(x, types, a.repeat, ggml)
    if "quantize" not in skip:
        bench_quantize(x, want or [as_type(t) for t in Q_TYPES], a.repeat, ggml)
    if "mul_mat" not in skip:
        shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",") if s]
        bench_mul_mat(shapes, MM_TYPES, a.repeat, ggml)


if __name__ == "__main__":
    main()
