"""Regenerate tests/golden_data/pre_tokenizers.json: llama.cpp's own ids for every pre-tokenizer name refimpl
supports, and for llama.cpp's vocabularies that ship without test vectors, on llama.cpp's tokenizer test inputs.

Most of llama.cpp's pre-tokenizer names have no vocabulary with test vectors in its tree. This gives each one
an oracle: GPT-2's vocab-only GGUF from llama.cpp's models/ (the llama-cpp-python 0.3.36 sdist that
scripts/build_llamacpp.sh downloads) with `tokenizer.ggml.pre` set to the name, tokenized by llama.cpp
(llama-cpp-python, vocab_only, add_special=False, parse_special=False) over the inputs of
ggml-vocab-qwen35.gguf.inp. The vocabularies of models/ without `.inp`/`.out` (aquila, baichuan, gpt-neox and
nomic-bert-moe, a UGM model) get llama.cpp's ids on the same inputs, plain and with special-token parsing
(add_special=True, parse_special=True) on inputs that also hold the vocabulary's own control tokens and mask
token, and llama_detokenize's text (hex) of the latter ids; and, for the vocabularies with vectors,
llama_detokenize's text of each line of ids in `.out`. Each runs in its own process: llama.cpp aborts on
a name it does not know, and its "whitespace" pre-tokenizer aborts on some inputs (those get null).

    .venv/bin/python scripts/gen_pretokenizer_golden.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.3.36"
MODELS = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/models/"
OUT = ROOT / "tests" / "golden_data" / "pre_tokenizers.json"
SEP = "\n__ggml_vocab_test__\n"


def sdist() -> Path:
    return Path(os.environ.get("REFIMPL_CACHE", Path.home() / ".cache" / "refimpl")) / "sdist" / \
        f"llama_cpp_python-{VERSION}.tar.gz"


NO_VECTORS = ("aquila", "baichuan", "gpt-neox", "nomic-bert-moe")
ABORTS = ("whitespace",)          # llama.cpp aborts on some inputs: tokenized one text per process


def detokenize(llm, ids: list[int]) -> bytes:
    """llama_detokenize(ids, remove_special=False, unparse_special=True): gen_llama_goldens.py's."""
    from gen_llama_goldens import detokenize as detok
    return detok(llm, ids)


def child(path: str, special: bool) -> None:
    import llama_cpp
    texts = json.loads(sys.stdin.read())
    llm = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    ids = [llm.tokenize(t.encode("utf-8"), add_bos=special, special=special) for t in texts]
    print(json.dumps([ids, [detokenize(llm, i).hex() for i in ids]]))


def detok_child(path: str) -> None:
    import llama_cpp
    ids = json.loads(sys.stdin.read())
    llm = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    print(json.dumps([detokenize(llm, i).hex() for i in ids]))


def run_detok(path: Path, ids: list[list[int]]) -> list[str]:
    r = subprocess.run([sys.executable, __file__, "--detok", str(path)], input=json.dumps(ids),
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"llama.cpp failed on {path.name}: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_each(path: Path, texts: list[str]) -> list:
    """One process per text: None where llama.cpp aborts (its "whitespace" pre-tokenizer hits
    GGML_ASSERT in find_bpe_rank on a run of whitespace holding a space)."""
    out = []
    for t in texts:
        r = subprocess.run([sys.executable, __file__, "--child", str(path), "0"], input=json.dumps([t]),
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0 and "GGML_ASSERT" not in r.stderr:
            raise SystemExit(f"llama.cpp failed on {path.name}: {r.stderr[-2000:]}")
        out.append(json.loads(r.stdout.strip().splitlines()[-1])[0][0] if r.returncode == 0 else None)
    return out


def run(path: Path, texts: list[str], special: bool = False, decode: bool = False) -> list:
    r = subprocess.run([sys.executable, __file__, "--child", str(path), str(int(special))], input=json.dumps(texts),
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"llama.cpp failed on {path.name}: {r.stderr[-2000:]}")
    ids, text = json.loads(r.stdout.strip().splitlines()[-1])
    return (ids, text) if decode else ids


def special_texts(meta: dict) -> list[str]:
    """Texts around the vocabulary's first control tokens, so that special-token parsing has work to do, and
    around a mask token (which takes the whitespace before it in some vocabularies)."""
    toks, types = meta["tokenizer.ggml.tokens"], meta.get("tokenizer.ggml.token_type") or []
    ctl = [t for t, ty in zip(toks, types) if ty == 3 and t][:3]
    masks = [m for m in ("<mask>", "[MASK]") if m in toks]
    return [f"{c}Hello world{c} and {c}" for c in ctl] + ["".join(ctl) + " plain text " + "".join(ctl)] + \
        [f"Paris is the  {m} of France.\t{m}\n {m}{m} end {m}" for m in masks]


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from refimpl import gguf
    from refimpl.tokenizers import PRE_TOKENIZERS
    import llama_cpp
    with tarfile.open(sdist()) as tf, tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "gpt-2.gguf"
        base.write_bytes(tf.extractfile(MODELS + "ggml-vocab-gpt-2.gguf").read())
        texts = tf.extractfile(MODELS + "ggml-vocab-qwen35.gguf.inp").read().decode("utf-8").split(SEP)
        f = gguf.load(base)
        meta = dict(f.metadata)
        ids = {}
        for name in sorted(PRE_TOKENIZERS):
            p = Path(tmp) / f"{name}.gguf"
            gguf.save(p, dict(meta, **{"tokenizer.ggml.pre": name}), {})
            ids[name] = run_each(p, texts) if name in ABORTS else run(p, texts)
            print(f"{name}: {sum(len(i) for i in ids[name] if i is not None)} ids", flush=True)
        vocabs = {}
        for name in NO_VECTORS:
            p = Path(tmp) / f"ggml-vocab-{name}.gguf"
            p.write_bytes(tf.extractfile(MODELS + p.name).read())
            st = special_texts(gguf.load(p).metadata)
            special, decoded = run(p, texts + st, True, decode=True)
            vocabs[name] = {"plain": run(p, texts), "special_texts": st, "special": special, "decode": decoded}
            print(f"vocabulary {name}: done", flush=True)
        decoded = {}
        for inp in sorted(n for n in tf.getnames() if n.startswith(MODELS) and n.endswith(".gguf.inp")):
            name = inp[len(MODELS + "ggml-vocab-"):-len(".gguf.inp")]
            p = Path(tmp) / f"ggml-vocab-{name}.gguf"
            p.write_bytes(tf.extractfile(inp[:-4]).read())
            out = tf.extractfile(inp[:-4] + ".out").read().decode("utf-8").split("\n")
            n = len(tf.extractfile(inp).read().decode("utf-8").split(SEP))
            decoded[name] = run_detok(p, [[int(x) for x in line.split()] for line in out[:n]])
            print(f"decoded {name}", flush=True)
    head = {"source": f"llama.cpp of llama-cpp-python {llama_cpp.__version__}: Llama(vocab_only=True).tokenize("
                      f"text, add_bos=False, special=False) on ggml-vocab-gpt-2.gguf with tokenizer.ggml.pre set",
            "system_info": llama_cpp.llama_print_system_info().decode(), "texts": texts}
    lines = [json.dumps(head, ensure_ascii=False)[:-1] + ', "ids": {']           # one line per name
    lines += [f"{json.dumps(n)}: {json.dumps(v, separators=(',', ':'))}," for n, v in ids.items()]
    lines[-1] = lines[-1].rstrip(",")
    lines += ['}, "vocabularies": {']
    compact = dict(ensure_ascii=False, separators=(",", ":"))
    lines += [f"{json.dumps(n)}: {json.dumps(v, **compact)}," for n, v in vocabs.items()]
    lines[-1] = lines[-1].rstrip(",")
    lines += ['}, "decoded": {']
    lines += [f"{json.dumps(n)}: {json.dumps(v, **compact)}," for n, v in decoded.items()]
    lines[-1] = lines[-1].rstrip(",")
    OUT.write_text("\n".join(lines) + "\n}}\n", encoding="utf-8")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3] == "1")
    elif sys.argv[1:2] == ["--detok"]:
        detok_child(sys.argv[2])
    else:
        main()
