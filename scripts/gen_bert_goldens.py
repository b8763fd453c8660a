"""Regenerate the BERT golden files from the references (needs the `goldens` extra: sentence-transformers with torch
CPU, llama-cpp-python built with the portable AVX2 flags).

    python scripts/gen_bert_goldens.py                 # everything
    python scripts/gen_bert_goldens.py --only st       # sentence-transformers only
    python scripts/gen_bert_goldens.py --only llama    # llama.cpp on the GGUFs `refimpl convert` writes

Writes refimpl/data/goldens/bert_minilm.npz:
    sentences        the test sentences (one JSON string)
    st_ids / st_off  sentence-transformers' token ids, flattened, with offsets (st_off[i]:st_off[i+1])
    st_emb           its normalized mean-pooled embeddings, float32 (n, 384)
    lc_<type>_ids / lc_<type>_off   llama.cpp's token ids for the GGUF that `refimpl convert --type <type>`
                     wrote (f32, f16, q8_0)
    lc_<type>_emb    llama.cpp's mean-pooled embeddings of those ids (cut to 256 like sentence-transformers),
                     not normalized
    profile          versions and build flags of the references (one JSON string)
and tests/golden_data/bert_minilm_convert.json: the metadata and tensor table of the GGUF llama.cpp's own
converter writes for the model (types f32, f16, q8_0; long arrays and tensor bytes as sha256 digests), when its
convert_hf_to_gguf.py is available (--llama-cpp-src DIR; it needs torch and transformers).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "refimpl" / "data" / "goldens" / "bert_minilm.npz"       # shipped: the notebooks read it
MAX_LEN = 256                                  # sentence_bert_config.json's max_seq_length
CONVERT_OUT = ROOT / "tests" / "golden_data" / "bert_minilm_convert.json"

_LONG = ("The history of the printing press is a story of slow diffusion: movable type spread from Mainz to "
         "Venice, Paris and London over decades, and each city's printers adapted the presses, inks and "
         "typefaces to their own markets, languages and laws. ")

SENTENCES = [
    "Hello world",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A monkey is playing drums.",
    "x",
    "!!!",
    "What's the weather like in São Paulo, Zürich and Kraków today?",
    "Crème brûlée, jalapeño, naïve façade, smörgåsbord — ÀÉÎÕÜ.",
    "東京は日本の首都です。",
    "我喜欢在周末读书和散步。",
    "한국어 문장도 토큰화됩니다.",
    "Я люблю программирование на Python.",
    "مرحبا بالعالم",
    "I love pizza 🍕🍕 and cats 🐈‍⬛!",
    "Emoji only: 😀😃😄😁",
    "Punctuation: (a), [b], {c}; d: e! f? g... \"h\" 'i' `j` ~k~ @l #m $n %o ^p &q *r _s +t =u |v \\w /x <y> 0-9",
    "e-mail: someone@example.com, url: https://example.org/path?q=1&r=2#frag",
    "Numbers 3.14159, 2,718 and 1e-10 are numbers; 12:30pm on 2024-01-15.",
    "   leading and trailing spaces   ",
    "tabs\tand\nnewlines\r\nmixed",
    "UPPER CASE SENTENCE WITH MIXED Case Words",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "[SEP] in the middle of [CLS] text [MASK] too",
    "Ünïcödé ẅïth çömbïnïng marks: e\u0301 a\u0300 o\u0308",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Machine learning models turn text into vectors so that similar meanings end up close together.",
    _LONG,
    _LONG * 2,
    _LONG * 6,                           # past the 256-token limit: truncated by both
    "dogs",
    "A cat sits on the mat.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
]


def _flat(lists):
    off = np.zeros(len(lists) + 1, np.int64)
    off[1:] = np.cumsum([len(x) for x in lists])
    return np.array([t for x in lists for t in x], np.int32), off


def _load_existing() -> dict:
    if OUT.exists():
        with np.load(OUT, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    return {}


def sentence_transformers_part(model_dir: Path, out: dict, profile: dict) -> None:
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer
    torch.set_num_threads(2)
    st = SentenceTransformer(str(model_dir), device="cpu")
    enc = st.tokenize(SENTENCES)
    ids = [[int(t) for t, m in zip(row, mask) if m] for row, mask in zip(enc["input_ids"], enc["attention_mask"])]
    with torch.no_grad():
        emb = st.encode(SENTENCES, batch_size=8, convert_to_numpy=True, normalize_embeddings=True)
    out["st_ids"], out["st_off"] = _flat(ids)
    out["st_emb"] = emb.astype(np.float32)
    profile["sentence_transformers"] = {"version": sentence_transformers.__version__, "torch": torch.__version__,
                                        "max_seq_length": st.max_seq_length, "device": "cpu"}


def llama_cpp_part(model_dir: Path, out: dict, profile: dict, types=("f32", "f16", "q8_0")) -> None:
    import llama_cpp
    from llama_cpp import Llama
    from refimpl.convert import convert
    with tempfile.TemporaryDirectory() as tmp:
        for t in types:
            path = Path(tmp) / f"minilm-{t}.gguf"
            convert(model_dir, path, t)
            llm = Llama(model_path=str(path), embedding=True, pooling_type=1, n_ctx=512, n_batch=512,
                        n_ubatch=512, n_threads=2, verbose=False)
            # as llama-embedding
            ids = [llm.tokenize(s.encode("utf-8"), add_bos=True, special=True) for s in SENTENCES]
            embs = []
            for s_ids in ids:
                if len(s_ids) > MAX_LEN:                     # the model's max length, cut as sentence-transformers
                    s_ids = s_ids[:MAX_LEN - 1] + [s_ids[-1]]
                embs.append(_embed_ids(llm, s_ids))
            out[f"lc_{t}_ids"], out[f"lc_{t}_off"] = _flat(ids)
            out[f"lc_{t}_emb"] = np.stack(embs)
            del llm
    profile["llama_cpp"] = {"llama_cpp_python": llama_cpp.__version__,
                            "build": "GGML_NATIVE=OFF AVX AVX2 FMA F16C, AMX off (portable AVX2 profile)",
                            "pooling": "mean", "normalize": "euclidean (embd_normalize=2)"}


def _embed_ids(llm, ids: list[int]) -> np.ndarray:
    """llama.cpp's pooled embedding of one sequence of token ids, not normalized (what Llama.embed decodes)."""
    import llama_cpp
    llm._batch.reset()
    llm._batch.add_sequence(ids, 0, True)
    llm._ctx.kv_cache_clear()
    llm._ctx.decode(llm._batch)
    ptr = llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, 0)
    return np.array(ptr[:llm.n_embd()], np.float32)


def converter_part(model_dir: Path, src: Path) -> None:
    """The metadata and tensor table llama.cpp's own converter writes (f32 and q8_0)."""
    import subprocess
    from refimpl import gguf
    table = {}
    with tempfile.TemporaryDirectory() as tmp:
        for t in ("f32", "f16", "q8_0"):
            path = Path(tmp) / f"ref-{t}.gguf"
            env = dict(os.environ, PYTHONPATH=str(src / "gguf-py"))
            subprocess.run([sys.executable, str(src / "convert_hf_to_gguf.py"), str(model_dir), "--outfile", str(path),
                            "--outtype", t], check=True, env=env, capture_output=True)
            f = gguf.load(path)
            meta = {}
            for k, v in f.metadata.items():
                if k.startswith("general.") and k not in ("general.architecture", "general.file_type",
                                                          "general.quantization_version"):
                    continue                               # names, dates, licence text: not the format
                if isinstance(v, (list, tuple)) and len(v) > 16:     # long arrays: length, ends and a digest
                    meta[k] = {"len": len(v), "head": list(v[:8]), "tail": list(v[-8:]),
                               "sha256": hashlib.sha256(json.dumps(list(v), ensure_ascii=False).encode()).hexdigest()}
                else:
                    meta[k] = v
            tensors = {name: {"type": info.type.name, "ne": list(info.ne),
                              "sha256": hashlib.sha256(f.data[info.file_offset:info.file_offset + info.nbytes]
                                                       .tobytes()).hexdigest()}
                       for name, info in f.tensor_info.items()}
            table[t] = {"metadata": meta, "tensors": tensors}
    table["profile"] = {"converter": str(src / "convert_hf_to_gguf.py"), "note": "llama.cpp vendored in "
                        "llama-cpp-python 0.3.36"}
    CONVERT_OUT.write_text(json.dumps(table, indent=1, sort_keys=True, default=str) + "\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["st", "llama", "convert"])
    ap.add_argument("--model", type=Path, default=None, help="the all-MiniLM-L6-v2 directory (default: refimpl fetch)")
    ap.add_argument("--llama-cpp-src", type=Path, default=None, help="a llama.cpp source tree (its converter)")
    a = ap.parse_args(argv)
    from refimpl import fetch
    model_dir = a.model or fetch.fetch("minilm")
    out = _load_existing()
    profile = json.loads(str(out["profile"])) if "profile" in out else {}
    profile["machine"] = platform.machine()
    out["sentences"] = np.array(json.dumps(SENTENCES, ensure_ascii=False))
    if a.only in (None, "st"):
        sentence_transformers_part(model_dir, out, profile)
    if a.only in (None, "llama"):
        llama_cpp_part(model_dir, out, profile)
    if a.only in (None, "convert") and a.llama_cpp_src:
        converter_part(model_dir, a.llama_cpp_src)
    out["profile"] = np.array(json.dumps(profile, sort_keys=True))
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
