"""What the command line's modules share: argparse value types (a bad value is one line naming the flag), the
options every model command takes, and the context they set."""
from __future__ import annotations

import argparse


def number(kind, name: str, ok, want: str):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--{name} wants {want}, not {text!r}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"--{name} wants {want}, not {text!r}")
        return v
    return parse


def at_least(lo, name, kind=float):
    return number(kind, name, lambda v: v >= lo, f"a number >= {lo}")


def above(lo, name, kind=float):
    return number(kind, name, lambda v: v > lo, f"a number > {lo}")


def within(lo, hi, name, low_open=False):
    ok = (lambda v: lo < v <= hi) if low_open else (lambda v: lo <= v <= hi)
    return number(float, name, ok, f"a number in {'(' if low_open else '['}{lo}, {hi}]")


def byte_size(text: str) -> int:
    """"8G", "512M", "1048576" -> bytes (argparse type)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    try:
        n = float(t[:-1] if mult > 1 else t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a byte count: {text!r} (e.g. 8G, 512M, 1048576)") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return int(n)


def add_model_options(s):
    """--backend, --threads, --numerics, --seed: the options every model command takes."""
    s.add_argument("-b", "--backend", choices=["numpy", "numba", "cuda"], default=None,
                   help="op implementations (default: numba when installed, else numpy; or $REFIMPL_BACKEND)")
    s.add_argument("-j", "--threads", type=above(0, "threads", int), default=None,
                   help="threads for the numba kernels and for BLAS (default: Numba's and BLAS's own settings)")
    s.add_argument("--numerics", choices=["exact", "ggml", "ggml-nollamafile", "fast"], default=None,
                   help="exact (f32/f64), ggml (llama.cpp's CPU roundings, where implemented), "
                        "ggml-nollamafile (the same without llamafile's sgemm, as ggml-python builds it) or "
                        "fast (exact, but mul_mat sums in f32 in the fastest order). Default: fast for generate "
                        "and chat on the numba backend, else exact")
    s.add_argument("-r", "--seed", type=int, default=None,
                   help="random seed of the sampler in generate / chat (default: the current time, printed so "
                   "that a run can be repeated; unused by deterministic commands)")


def model_context(args, default_numerics: str | None = None):
    """A context manager applying --backend / --numerics / --threads. default_numerics: the numerics on the
    numba backend when --numerics is not given (generate and chat: "fast", the fastest verified path)."""
    import contextlib
    from . import backend, numerics
    from .dispatch import current_backend
    stack = contextlib.ExitStack()
    if getattr(args, "backend", None):
        stack.enter_context(backend(args.backend))
    if getattr(args, "numerics", None) is None and default_numerics and current_backend() == "numba":
        args.numerics = default_numerics
    if getattr(args, "numerics", None):
        stack.enter_context(numerics(args.numerics))
    if getattr(args, "threads", None):
        try:
            import numba
            numba.set_num_threads(max(1, min(args.threads, numba.config.NUMBA_NUM_THREADS)))
        except ImportError:
            pass
        from threadpoolctl import threadpool_limits
        stack.enter_context(threadpool_limits(limits=args.threads, user_api="blas"))
    return stack


def run_label(args) -> str:
    from .dispatch import current_backend, current_numerics
    return f"backend {current_backend()}, numerics {current_numerics()}"
