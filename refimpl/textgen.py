"""`refimpl generate` and `refimpl chat`: load the model the flags name (a GGUF of a family in
refimpl.models.FAMILIES, an RWKV model, a llama2.c checkpoint), run its family's generate or chat turns, print
the pieces and the speed line."""
from __future__ import annotations

import sys
import time

import numpy as np

from .cliargs import above, add_model_options, at_least, model_context, run_label, within


def _llama2c_path(args):
    """The llama2.c checkpoint named by -c, or by -m when that file is not a GGUF; else None."""
    from .models.llama2c import is_gguf
    if getattr(args, "checkpoint", None):
        return args.checkpoint
    if args.model and not is_gguf(args.model):
        return args.model
    return None


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


def _run(args, rwkv, llama) -> int:
    """rwkv(args, path) for the RWKV model -m names, else llama(args), under the model options (numerics "fast"
    by default on the numba backend)."""
    rwkv_path = _rwkv_path(args)
    with model_context(args, "fast"):
        return rwkv(args, rwkv_path) if rwkv_path else llama(args)


def cmd_generate(args) -> int:
    return _run(args, _generate_rwkv, _generate_llama)


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
    _warmup(args, llama, m, ids)
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
    print(f"\n[{_speed_line(len(ids), n[0], first[0] - t0, end - first[0])}; {run_label(args)}]", file=sys.stderr)
    return 0


def _warmup(args, family, m, ids) -> None:
    """llama.cpp's warmup (an empty run before the first request; --no-warmup skips it): a prefill of two of
    the prompt's tokens and one decode step on a scratch cache, so that the kernels a generation runs are
    compiled (a fresh install: seconds, said in one line) or loaded from Numba's cache before the prompt's
    clock starts. Its tokens leave no trace: the generation has its own cache."""
    if getattr(args, "no_warmup", False):
        return
    first = list(ids[:2]) * (2 if len(ids) < 2 else 1)
    for _ in family.generate(m, first, 2, cache=family.new_cache(m, 8), add_special=False):
        pass


# SmolLM2-135M-Instruct's shapes and types (the main job's model, `bash scripts/main.sh`) in one layer, with a byte
# vocabulary and its output tied to the embedding: what `precompile` runs (refimpl.models.tiny.write_tiny_llama)
_MINIATURE = {"n_vocab": 256, "n_embd": 576, "n_layer": 1, "n_head": 9, "n_head_kv": 3, "n_ff": 1536,
              "rope_base": 100000.0, "tied": True, "wtype": "q4_1", "embd_type": "q8_0"}


def precompile() -> float:
    """Compile into Numba's cache the kernels that generating with the main job's model runs (SmolLM2 Q4_1), which
    its first run would otherwise compile after the model has loaded (seconds, before the first token):
    `refimpl generate`, as the main job calls it, on a one-layer miniature with SmolLM2's shapes and types and
    random weights (a temporary GGUF), with prompts of several lengths. scripts/setup.sh runs it once per install
    of the numba extra, as installing a compiled library compiles it. Returns the seconds it took."""
    import argparse
    import contextlib
    import io
    import tempfile

    from .models.tiny import write_tiny_llama
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="refimpl-precompile-") as d:
        path = str(write_tiny_llama(f"{d}/miniature.gguf", **_MINIATURE))
        cli = argparse.ArgumentParser(prog="refimpl")
        add_parser(cli.add_subparsers())             # `refimpl generate` exactly as the command line parses it
        for prompt in ("Hi", "Once upon a time", "Once upon a time, in a small town by the sea, there lived"):
            out = io.StringIO()
            args = cli.parse_args(["generate", "-m", path, "-p", prompt, "-n", "3"])
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                rc = args.fn(args)
            if rc:
                raise RuntimeError(f"precompile: refimpl generate on {path} failed: {out.getvalue()[-2000:]}")
    return time.perf_counter() - t0


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


def cmd_chat(args) -> int:
    return _run(args, _chat_rwkv, _chat_llama)


def _chat_llama(args) -> int:
    from .models import family_of
    m = _load_llama(args)
    llama = family_of(m)
    if _llama2c_path(args):
        return _chat_llama2c(args, m)
    sampler = _sampler(args)
    _warmup(args, llama, m, [m.tokenizer.bos_id if m.tokenizer.bos_id is not None else 0])
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


def add_sampling_args(s):
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
    s.add_argument("--no-warmup", action="store_true",
                   help="skip the warmup (as llama.cpp's flag): a two-token run before the first request, so that "
                   "the kernels are compiled or loaded before the prompt's clock starts")
    s.add_argument("--weights", choices=["auto", "f32", "quantized"], default="auto",
                   help="dequantize weights once at load (f32) or keep them quantized (default: quantized on the "
                   "numba backend, whose kernels read the blocks; elsewhere f32 if small)")


def add_parser(sub) -> None:
    """The generate and chat commands' flags."""
    s = sub.add_parser("generate", help="generate text with a llama-family GGUF model, an RWKV model (rwkv6 / "
                       "rwkv7 GGUF, or a v4-v7 .pth / .safetensors checkpoint) or a llama2.c checkpoint "
                       "(-c CKPT -k tokenizer.bin)")
    s.add_argument("-p", "--prompt", default="", help="the text to continue (default empty: start from BOS)")
    s.add_argument("--chat-format", action="store_true", help="wrap the prompt in the model's chat template "
                   "(RWKV without one: \"User: PROMPT\\n\\nAssistant:\")")
    add_sampling_args(s)
    add_model_options(s)
    s.set_defaults(fn=cmd_generate)
    s = sub.add_parser("chat", help="an interactive conversation with a llama-family GGUF model, an RWKV model "
                       "(its chat template, else \"User: ...\\n\\nAssistant:\" turns; the recurrent state is "
                       "kept from turn to turn) or a llama2.c checkpoint (Llama 2 [INST] turns, as run.c)")
    s.add_argument("--system", default="", help="system message")
    add_sampling_args(s)
    add_model_options(s)
    s.set_defaults(fn=cmd_chat)
