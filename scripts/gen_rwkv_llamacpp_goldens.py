"""Write llama.cpp's logits of tiny random RWKV-6 / RWKV-7 GGUFs into tests/golden_data/rwkv{6,7}_llamacpp.npz.

    python scripts/gen_rwkv_llamacpp_goldens.py [--out tests/golden_data] [--llama-cpp DIR]

Each model is a state dict from tests/models/rwkv_tiny.py's `tiny_state_dict` (seeded), its values rounded to
float16 (so the file can store them exactly in half the bytes; the model itself is float32), converted to GGUF
by refimpl's converter (refimpl/convert/rwkv.py) in several variants, each run by llama-cpp-python:

    f32       convert(sd, type="f32")                      every tensor F32
    f16       convert(sd, type="f16")                      llama.cpp's --outtype f16 rules
    q8_0      convert(sd, type="f32", quantize="q8_0")     projections Q8_0 (ggml's reference quantizer),
    q5_1      ... quantize="q5_1"                          the rest F32: embedding, head, norms, vectors,
    q4_0      ... quantize="q4_0"                          LoRA factors
    (rwkv6 only) f32_rescale1: type="f32", rescale_every=1 -- llama.cpp's RWKV-6 rescaling (att.output and
              ffn.value of layer i divided by 2**i, x halved after every layer)

The oracle is llama-cpp-python==0.3.36 (vendored llama.cpp / ggml 0c1e570), built portably (AVX2/FMA/F16C, no
AVX-512, no AMX), loaded with weight repacking off (use_extra_bufts=False), n_threads=2, one llama_decode over
the whole sequence with logits for every position (n_batch = n_ubatch = 512: one micro-batch). For f32 the
tokens are also fed one llama_decode at a time (`tok`), which checks that llama.cpp's own sequence and
token-by-token paths agree. The loader and build info are scripts/gen_llama_goldens.py's.

With --llama-cpp DIR (a llama.cpp source tree with convert_hf_to_gguf.py, as vendored in llama-cpp-python's
sdist), each model is also written as a Hugging Face directory (RWKV's v6 "rwkv.*" / v7 "model.*" layouts,
config.json, the World vocabulary file shipped with the `rwkv` package) and converted by
llama.cpp's own converter for every --outtype (f32 f16 bf16 q8_0); meta records whether refimpl's converter
writes the same bytes (it is given llama.cpp's chat template file, the only input it does not have itself), and
else which metadata keys and tensors differ. Expected: identical for rwkv7; for rwkv6 only time_mix_extra_dim and
time_decay_extra_dim, which llama.cpp's converter hard-wires (32 and 64 below n_embd 4096) while refimpl reads
them from the tensors (the tiny models' LoRA rank is 8: llama.cpp could not load its own converter's file).

Files (tests/golden_data/rwkv6_llamacpp.npz, rwkv7_llamacpp.npz; each well under 1 MB):
    meta                   JSON: the build, settings, the models (tiny_state_dict arguments, converter arguments
                           and SHA-256 of every GGUF written), and the llama.cpp converter cross-check
    {m}.w.<name>           f16  the state dict (BlinkDL names, .pth shapes): the tests rebuild every GGUF
                                from these with refimpl's converter and check its SHA-256
    {m}.tokens             i32  (n_tokens,)
    {m}.{variant}.logits   f32  (n_tokens, n_vocab)  llama.cpp's logits of every position, one llama_decode
    {m}.f32.logits_tok     f32  (n_tokens, n_vocab)  the same, one llama_decode per token
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OUT = str(ROOT / "tests" / "golden_data")

N_TOKENS = 32
TOKEN_SEED = 2024
MODELS = {
    6: {"rwkv6": dict(version="6", n_layer=2, n_embd=64, head_size=32, vocab=128, n_ffn=128, lora=8, seed=61)},
    7: {"rwkv7": dict(version="7", n_layer=3, n_embd=64, head_size=32, vocab=128, n_ffn=128, lora=8, seed=71)},
}
# variant -> refimpl.convert.rwkv.convert keyword arguments
VARIANTS = {
    "f32": dict(type="f32"),
    "f16": dict(type="f16"),
    "q8_0": dict(type="f32", quantize="q8_0"),
    "q5_1": dict(type="f32", quantize="q5_1"),
    "q4_0": dict(type="f32", quantize="q4_0"),
}
EXTRA = {6: {"f32_rescale1": dict(type="f32", rescale_every=1)}, 7: {}}
GGUF_NAME = "tiny"            # general.name: fixed, so the bytes do not depend on file names


def golden_state_dict(args: dict) -> dict:
    """tiny_state_dict(**args) with every value rounded to float16 (then held as float32)."""
    from tests.models.rwkv_tiny import tiny_state_dict
    return {k: v.astype(np.float16).astype(np.float32) for k, v in tiny_state_dict(**args).items()}


def golden_tokens(vocab: int) -> np.ndarray:
    """N_TOKENS ids from default_rng(TOKEN_SEED), token 0 first, a repeat of token 3 in the middle."""
    t = np.random.default_rng(TOKEN_SEED).integers(0, vocab, N_TOKENS).astype(np.int32)
    t[0], t[N_TOKENS // 2] = 0, t[3]
    return t


def sha256_file(path) -> str:
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def run_llama(path: str, tokens: np.ndarray, n_vocab: int, *, per_token: bool = False):
    """llama.cpp's logits (n_tokens, n_vocab) of one llama_decode over `tokens` (per_token: one per token)."""
    from scripts.gen_llama_goldens import load_llama
    llm, settings = load_llama(path, vocab_only=False, logits_all=True)
    assert not settings["use_extra_bufts"]
    llm.reset()
    if per_token:
        for t in tokens.tolist():
            llm.eval([t])
    else:
        llm.eval(tokens.tolist())
    logits = np.array(llm.scores[:len(tokens)], dtype=np.float32)
    del llm
    assert logits.shape == (len(tokens), n_vocab) and np.isfinite(logits).all(), path
    return logits, settings


def hf_dir(sd: dict, version: int, d: pathlib.Path) -> None:
    """The state dict as a Hugging Face directory of RWKV's own layouts (what llama.cpp's converter reads), with
    the whole World vocabulary and config vocab_size 65536 (llama.cpp's converter assumes it: the tensors keep
    the tiny model's rows, so the file is for comparing converters, not for running)."""
    import torch
    from safetensors.torch import save_file
    import rwkv as rwkv_pkg
    d.mkdir(parents=True, exist_ok=True)
    top = "rwkv." if version == 6 else "model."
    out = {}
    for k, v in sd.items():
        if k == "emb.weight":
            n = top + "embeddings.weight"
        elif k.startswith("blocks.0.ln0."):
            n = k.replace("blocks.0.ln0.", "rwkv.blocks.0.pre_ln." if version == 6 else "model.pre_ln.")
        elif k.startswith("blocks."):
            n = top + k.replace(".att.", ".attention.").replace(".ffn.", ".feed_forward.")
        elif k.startswith("ln_out."):
            n = top + k
        else:
            n = k
        out[n] = torch.from_numpy(np.array(v, np.float32))
    save_file(out, str(d / "model.safetensors"))
    C = sd["emb.weight"].shape[1]
    n_layer = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    cfg = dict(hidden_size=C, num_hidden_layers=n_layer, vocab_size=65536, layer_norm_epsilon=1e-5,
               intermediate_size=int(sd["blocks.0.ffn.key.weight"].shape[0]))
    if version == 6:
        cfg.update(architectures=["Rwkv6ForCausalLM"], model_type="rwkv6", rescale_every=0,
                   head_size=int(sd["blocks.0.att.time_faaaa"].shape[1]))
    else:
        cfg.update(architectures=["Rwkv7ForCausalLM"], model_type="rwkv7",
                   head_size=int(sd["blocks.0.att.r_k"].shape[1]),
                   lora_rank_decay=int(sd["blocks.0.att.w1"].shape[1]),
                   lora_rank_iclr=int(sd["blocks.0.att.a1"].shape[1]),
                   lora_rank_value_residual_mix=int(sd["blocks.1.att.v1"].shape[1]),
                   lora_rank_gate=int(sd["blocks.0.att.g1"].shape[1]))
    (d / "config.json").write_text(json.dumps(cfg))
    vocab = pathlib.Path(rwkv_pkg.__file__).parent / "rwkv_vocab_v20230424.txt"
    (d / "rwkv_vocab_v20230424.txt").write_bytes(vocab.read_bytes())


def cross_check_converter(sd: dict, version: int, llama_dir: pathlib.Path, tmp: pathlib.Path) -> dict:
    """llama.cpp's convert_hf_to_gguf.py vs refimpl's converter on the same HF directory, per --outtype."""
    from refimpl.convert.rwkv import convert
    d = tmp / f"hf{version}"
    hf_dir(sd, version, d)
    template = (llama_dir / "models" / "templates" / "llama-cpp-rwkv-world.jinja").read_text()
    res = {}
    for t in ("f32", "f16", "bf16", "q8_0"):
        ref, ours = tmp / f"lc{version}_{t}.gguf", tmp / f"ri{version}_{t}.gguf"
        subprocess.run([sys.executable, str(llama_dir / "convert_hf_to_gguf.py"), str(d), "--outfile", str(ref),
                        "--outtype", t], check=True, capture_output=True, cwd=str(llama_dir))
        convert(d, ours, t, chat_template=template)
        res[t] = {"identical_bytes": ref.read_bytes() == ours.read_bytes(), "llama_cpp_sha256": sha256_file(ref),
                  **gguf_diff(ours, ref)}
    return res


def gguf_diff(a, b) -> dict:
    """Metadata keys (value or type) and tensors (name, type, shape or bytes) that differ between two GGUFs."""
    from refimpl import gguf
    fa, fb = gguf.load(a), gguf.load(b)
    keys = [k for k in dict.fromkeys([*fa.metadata, *fb.metadata])
            if fa.metadata.get(k) != fb.metadata.get(k) or fa.value_types.get(k) != fb.value_types.get(k)]
    tensors = []
    for n in dict.fromkeys([*fa.tensor_info, *fb.tensor_info]):
        ta, tb = fa.tensor_info.get(n), fb.tensor_info.get(n)
        if ta is None or tb is None or ta.type != tb.type or ta.ne != tb.ne or not np.array_equal(
                fa.data[ta.file_offset:ta.file_offset + ta.nbytes], fb.data[tb.file_offset:tb.file_offset + tb.nbytes]):
            tensors.append(n)
    return {"metadata_differs": {k: [repr(fa.metadata.get(k)), repr(fb.metadata.get(k))] for k in keys},
            "tensors_differ": tensors, "same_order": list(fa.tensor_info) == list(fb.tensor_info)}


def gen(version: int, out: str, llama_dir: pathlib.Path | None) -> str:
    import llama_cpp
    from scripts.gen_llama_goldens import LogCapture, build_info
    from refimpl.convert.rwkv import convert
    log = LogCapture(llama_cpp)                # llama.cpp's log off stderr (kept alive: a ctypes callback)
    arrays, models, settings = {}, [], None
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        for name, args in MODELS[version].items():
            sd = golden_state_dict(args)
            tokens = golden_tokens(args["vocab"])
            arrays.update({f"{name}.w.{k}": v.astype(np.float16) for k, v in sd.items()})
            arrays[f"{name}.tokens"] = tokens
            variants = {}
            for var, kw in {**VARIANTS, **EXTRA[version]}.items():
                p = convert(sd, tmp / f"{name}_{var}.gguf", name=GGUF_NAME, **kw)
                logits, settings = run_llama(str(p), tokens, args["vocab"])
                arrays[f"{name}.{var}.logits"] = logits
                if var == "f32":
                    arrays[f"{name}.f32.logits_tok"], _ = run_llama(str(p), tokens, args["vocab"], per_token=True)
                variants[var] = {"convert": kw, "gguf_sha256": sha256_file(p), "gguf_bytes": os.path.getsize(p)}
            entry = {"name": name, "writer_args": args, "gguf_name": GGUF_NAME, "n_tokens": int(len(tokens)),
                     "variants": variants}
            if llama_dir is not None:
                entry["llama_cpp_converter"] = cross_check_converter(sd, version, llama_dir, tmp)
            models.append(entry)
    meta = {"about": f"llama.cpp logits of tiny random RWKV-{version} GGUFs written by refimpl's converter; "
                     "scripts/gen_rwkv_llamacpp_goldens.py",
            "build": build_info(llama_cpp), "settings": settings,
            "weights": "tests.models.rwkv_tiny.tiny_state_dict(**writer_args), rounded to float16",
            "tokens": f"numpy default_rng({TOKEN_SEED}).integers(0, vocab, {N_TOKENS}), token 0 first, "
                      f"token {N_TOKENS // 2} set to token 3",
            "path": "llama.cpp CPU backend (ggml-cpu AVX2/FMA/F16C), no weight repacking (use_extra_bufts=False), "
                    "one llama_decode over all tokens with logits for every position (one micro-batch); "
                    "f32.logits_tok: one llama_decode per token",
            "models": models}
    del log
    path = os.path.join(out, f"rwkv{version}_llamacpp.npz")
    np.savez_compressed(path, meta=np.array(json.dumps(meta)), **arrays)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--llama-cpp", type=pathlib.Path, default=None,
                    help="a llama.cpp source tree: also cross-check refimpl's converter against convert_hf_to_gguf.py")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for v in MODELS:
        gen(v, args.out, args.llama_cpp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
