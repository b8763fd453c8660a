"""Regenerate tests/golden_data/pre_tokenizers.json: llama.cpp's own ids for every pre-tokenizer name refimpl
supports, on llama.cpp's tokenizer test inputs.

Most of llama.cpp's pre-tokenizer names have no vocabulary with test vectors in its tree. This gives each one
an oracle: GPT-2's vocab-only GGUF from llama.cpp's models/ (the llama-cpp-python 0.3.36 sdist that
scripts/build_llamacpp.sh downloads) with `tokenizer.ggml.pre` set to the name, tokenized by llama.cpp
(llama-cpp-python, vocab_only, add_special=False, parse_special=False) over the inputs of
ggml-vocab-qwen35.gguf.inp. Each name runs in its own process: llama.cpp aborts on a name it does not know.

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


def child(path: str) -> None:
    import llama_cpp
    texts = json.loads(sys.stdin.read())
    llm = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    print(json.dumps([llm.tokenize(t.encode("utf-8"), add_bos=False, special=False) for t in texts]))


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
            r = subprocess.run([sys.executable, __file__, "--child", str(p)], input=json.dumps(texts),
                               capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                raise SystemExit(f"llama.cpp failed on pre-tokenizer {name!r}: {r.stderr[-2000:]}")
            ids[name] = json.loads(r.stdout.strip().splitlines()[-1])
            print(f"{name}: {sum(map(len, ids[name]))} ids", flush=True)
    head = {"source": f"llama.cpp of llama-cpp-python {llama_cpp.__version__}: Llama(vocab_only=True).tokenize("
                      f"text, add_bos=False, special=False) on ggml-vocab-gpt-2.gguf with tokenizer.ggml.pre set",
            "system_info": llama_cpp.llama_print_system_info().decode(), "texts": texts}
    lines = [json.dumps(head, ensure_ascii=False)[:-1] + ', "ids": {']           # one line per name
    lines += [f"{json.dumps(n)}: {json.dumps(v, separators=(',', ':'))}," for n, v in ids.items()]
    lines[-1] = lines[-1].rstrip(",")
    OUT.write_text("\n".join(lines) + "\n}}\n", encoding="utf-8")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2])
    else:
        main()
