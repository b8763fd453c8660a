"""Equivalence checks of a llama-family model in refimpl: ways of computing the same logits, pairwise.

    from refimpl.check import check, first_nonfinite
    rows = check("model.gguf")                 # one Row per pair: NMSE, max |d|, budget, over
    hit = first_nonfinite(model, tokens)       # the first intermediate holding inf / NaN, or None

The pairs (each over the same token ids; every row's shape is that of the logits compared):

    token-by-token   one forward per token vs one prefill over all of them (every position)
    chunked          the tokens in three chunks through one cache vs one prefill
    cache            the prefix prefilled, the cache forked (KVCache.copy) and the rest decoded on the
                     fork, vs the whole sequence recomputed from an empty cache (the rest's positions)
    numba            the numba backend vs the NumPy one, one prefill (skipped unless numba imports)
    cuda             the CUDA backend vs the NumPy one, one prefill (skipped unless numba.cuda finds a GPU,
                     or NUMBA_ENABLE_CUDASIM=1 selects numba's simulator)
    exact-ggml       numerics="exact" vs numerics="ggml", one prefill

The first four run in the `numerics` mode asked for (default exact: identities that hold to f64 summation
order); under numerics="ggml" the first three are llama.cpp's own differences (single-token decodes take
vec_dot where a batch takes llamafile's sgemm, and the Q8 activation rounding amplifies them), so their
budgets are looser. Budgets are the tolerance table's `("llama.check.<pair>", weight type, numerics)`.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np

from .compare import weight_type
from .report import Row, format_table, row

PAIRS = ("token-by-token", "chunked", "cache", "numba", "cuda", "exact-ggml")
DEFAULT_PROMPT = "The capital of France is"


def _budget(pair: str, wtype: str, numerics: str) -> float:
    from .tolerances import tol
    t = tol(f"llama.check.{pair}", wtype, numerics)
    return 0.0 if t.exact else float(t.nmse)


@contextlib.contextmanager
def _mode(numerics: str, backend: str | None = None):
    from . import backend as use_backend
    from . import numerics as use_numerics
    with use_numerics(numerics), use_backend(backend or ("numpy" if numerics == "ggml" else _current())):
        yield


def _current() -> str:
    from .ops import current_backend
    return current_backend()


def _prefill(model, tokens, numerics, backend=None) -> np.ndarray:
    from .models import llama
    with _mode(numerics, backend):
        return llama.forward(model, tokens, llama.new_cache(model, len(tokens)))


def _numba_available() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def _cuda_available() -> bool:
    """numba.cuda finds a GPU (or NUMBA_ENABLE_CUDASIM=1 selects the simulator)."""
    if not _numba_available():
        return False
    from numba import cuda
    return bool(cuda.is_available())


def _pair(model, tokens, pair: str, numerics: str, full: np.ndarray | None):
    """(ours, reference, note) for one pair; reference is the one-shot prefill where the pair needs it."""
    from .models import llama
    T = len(tokens)
    if pair == "token-by-token":
        with _mode(numerics):
            c = llama.new_cache(model, T)
            steps = np.concatenate([llama.forward(model, [t], c) for t in tokens])
        return steps, full, f"{T} single-token forwards"
    if pair == "chunked":
        cuts = sorted({max(1, T // 3), max(1, 2 * T // 3)} - {T})
        with _mode(numerics):
            c = llama.new_cache(model, T)
            parts = [llama.forward(model, tokens[a:b], c) for a, b in zip([0] + cuts, cuts + [T])]
        return np.concatenate(parts), full, f"chunks at {cuts}"
    if pair == "cache":
        n0 = max(1, T // 2) if T > 1 else 0
        with _mode(numerics):
            c = llama.new_cache(model, T)
            if n0:
                llama.forward(model, tokens[:n0], c)
            fork = c.copy()
            rest = llama.forward(model, tokens[n0:], fork)
        return rest, full[n0:], f"prefix {n0} tokens, forked cache, {T - n0} decoded"
    if pair == "numba":
        if not _numba_available():
            return None, None, "numba does not import: skipped"
        return _prefill(model, tokens, "exact", "numba"), _prefill(model, tokens, "exact", "numpy"), "exact mode"
    if pair == "cuda":
        if not _cuda_available():
            return None, None, "numba.cuda finds no GPU: skipped"
        return _prefill(model, tokens, "exact", "cuda"), _prefill(model, tokens, "exact", "numpy"), "exact mode"
    if pair == "exact-ggml":
        return _prefill(model, tokens, "exact"), _prefill(model, tokens, "ggml"), "exact vs ggml, one prefill"
    raise ValueError(f"unknown check {pair!r}; one of {PAIRS}")


def check(model_path, prompt: str | None = None, *, tokens=None, numerics: str = "exact",
          pairs=PAIRS) -> list[Row]:
    """Every pair of `pairs` (default all of PAIRS) on the prompt's tokens (default DEFAULT_PROMPT, or
    the ids `tokens`): one Row each, named by the pair, with NMSE and max |d| of the logits against the
    budget; `over` when the pair differs by more (a skipped pair: NaN, not over)."""
    from .models import llama
    model = model_path if isinstance(model_path, llama.LlamaModel) else llama.load(model_path)
    tokens = _tokens(model, prompt, tokens)
    wtype = weight_type(model)
    full = None
    rows = []
    for pair in pairs:
        if pair in ("token-by-token", "chunked", "cache") and full is None:
            full = _prefill(model, tokens, numerics)
        mode = "exact" if pair in ("numba", "cuda") else numerics
        bud = _budget(pair, wtype, "ggml" if pair == "exact-ggml" else mode)
        ours, ref, note = _pair(model, tokens, pair, numerics, full)
        if ours is None:
            rows.append(Row(pair, (), math.nan, math.nan, bud, False, note))
        else:
            rows.append(row(pair, ours, ref, bud, note))
    return rows


def _tokens(model, prompt, tokens) -> np.ndarray:
    if tokens is None:
        if model.tokenizer is None:
            tokens = np.arange(min(8, model.hparams.n_vocab))
        else:
            tokens = model.tokenizer.encode(prompt if prompt is not None else DEFAULT_PROMPT, add_special=True)
    tokens = np.asarray(tokens, np.int32).reshape(-1)
    if tokens.size == 0:
        raise ValueError("check: no tokens")
    return tokens


def first_nonfinite(model, tokens, numerics: str = "exact"):
    """The first intermediate of a prefill (llama.cpp's names, in graph order) holding an inf or NaN:
    (name, shape, count, index of the first one) or None when every tensor and the logits are finite."""
    from .models import llama
    hit: list = []

    def cap(name, x):
        if not hit:
            a = np.asarray(x)
            bad = ~np.isfinite(a)
            if bad.any():
                hit.append((name, a.shape, int(bad.sum()), tuple(int(i) for i in np.argwhere(bad)[0])))
    with _mode(numerics):
        logits = llama.forward(model, tokens, llama.new_cache(model, len(tokens)), capture=cap)
    if not hit and not np.all(np.isfinite(logits)):
        bad = ~np.isfinite(logits)
        hit.append(("logits", logits.shape, int(bad.sum()), tuple(int(i) for i in np.argwhere(bad)[0])))
    return hit[0] if hit else None


def add_parser(sub, add_model_options) -> None:
    """Register `refimpl check` on the command line's subparsers."""
    s = sub.add_parser("check", help="equivalence checks of a llama-family GGUF: token-by-token vs prefill vs "
                       "chunked, cache vs recompute, numpy vs numba, exact vs ggml numerics")
    s.add_argument("model", help="llama-family GGUF file")
    s.add_argument("-p", "--prompt", default=None, help=f"prompt text (default {DEFAULT_PROMPT!r})")
    s.add_argument("--tokens", help="comma-separated token ids instead of a prompt")
    s.add_argument("--only", action="append", choices=PAIRS, help="run only this check (repeatable)")
    s.add_argument("--nonfinite", action="store_true",
                   help="also report the first intermediate tensor holding an inf or NaN")
    add_model_options(s)
    s.set_defaults(fn=cli)


def cli(args) -> int:
    """`refimpl check`: print the table (and the first non-finite intermediate with --nonfinite); exit
    status 1 when a pair is over its budget or a non-finite value is found."""
    import sys
    from .models import llama
    mode = args.numerics or "exact"
    try:
        stack = contextlib.ExitStack()
        if getattr(args, "backend", None):
            from . import backend
            stack.enter_context(backend(args.backend))
        with stack:
            model = llama.load(args.model)
            toks = _tokens(model, args.prompt, [int(t) for t in args.tokens.split(",")] if args.tokens else None)
            rows = check(model, tokens=toks, numerics=mode, pairs=tuple(args.only or PAIRS))
            hit = first_nonfinite(model, toks, mode) if args.nonfinite else None
    except (ValueError, OSError) as e:
        print(f"refimpl: error: {e}", file=sys.stderr)
        return 2
    print(format_table(rows, f"{args.model}: {len(toks)} tokens, numerics={mode}", "check"))
    if args.nonfinite:
        print(f"first non-finite intermediate: {hit[0]} (numpy shape {hit[1]}, {hit[2]} values, first at "
              f"{hit[3]})" if hit else "no non-finite intermediate")
    return 1 if any(r.over for r in rows) or hit else 0
