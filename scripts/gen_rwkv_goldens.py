"""Write reference logits and states of tiny random RWKV models into tests/golden_data/rwkv_{v4,v5,v6,v7}.npz.

    python scripts/gen_rwkv_goldens.py [--out tests/golden_data] [--only v4] [--only v5 ...]

Each model is a state dict from tests/models/rwkv_tiny.py's `tiny_state_dict` (seeded, float32, BlinkDL's
.pth names), run over a fixed short token sequence by the references of its version:

    "rwkv"          the `rwkv` pip package (ChatRWKV's inference code, 0.8.x): the state dict saved as a .pth,
                    RWKV(model=path_without_ext, strategy="cpu fp32") with RWKV_JIT_ON=0, RWKV_CUDA_ON=0
                    (RWKV_V7_ON=1 for v7, which the package only reads at import: rwkv.model is reloaded),
                    model.forward(ids, state) called directly (no tokenizer involved)
    "transformers"  (v4 only) transformers' RwkvForCausalLM on CPU in float32, the same tensors renamed to its
                    names, config.rescale_every = 0, one call with use_cache=True

Needs torch (CPU), transformers and rwkv (`pip install rwkv` -- with `--no-deps` or a pinned torch, so that
pip does not replace the installed torch). The tests read only the files written here and need none of them.

Per file: `meta` (JSON: the models, the references, package versions, settings) and, per model `m`,
    m.w.<name>                 f32   the state dict (the tests rebuild the model from these, not from the writer)
    m.tokens                   int32 (n_tokens,)
    m.<ref>.logits_seq         f32   (n_vocab,)            last-token logits of one call over all tokens ("rwkv")
    m.<ref>.logits_all         f32   (n_tokens, n_vocab)   logits of every token of one call ("transformers")
    m.<ref>.logits_tok         f32   (n_tokens, n_vocab)   one call per token, the state carried ("rwkv")
    m.<ref>.logits_split       f32   (n_vocab,)            one call over tokens[:SPLIT], one over the rest ("rwkv")
    m.<ref>.state.<k>          f32   the state after all tokens in RwkvState's layout (k = shift_att, shift_ffn,
                                     wkv); m.<ref>.state_split.<k> after the split calls

Versions and references are the table REFERENCES (version -> the functions that run its references); a new
version's golden needs only an entry in MODELS and REFERENCES (v6 and v7 run the rwkv package like v5).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import pathlib
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OUT = str(ROOT / "tests" / "golden_data")

TOKEN_SEED = 4321
N_TOKENS = 8
SPLIT = 5          # logits_split: tokens[:SPLIT] in one call, tokens[SPLIT:] in a second one from its state

# version -> models: name -> tiny_state_dict arguments (tests/models/rwkv_tiny.py)
MODELS = {
    "v4": {"v4": dict(version="4", n_layer=2, n_embd=32, vocab=64, seed=40)},
    "v5": {"v5_0": dict(version="5.0", n_layer=2, n_embd=32, head_size=8, vocab=64, seed=50),
           "v5_1": dict(version="5.1", n_layer=2, n_embd=32, head_size=8, vocab=64, seed=51),
           "v5_2": dict(version="5.2", n_layer=2, n_embd=32, head_size=8, vocab=64, seed=52)},
    "v6": {"v6": dict(version="6", n_layer=2, n_embd=32, head_size=16, vocab=64, seed=60)},
    "v7": {"v7": dict(version="7", n_layer=3, n_embd=32, head_size=16, vocab=64, seed=70)},
}


def tokens_for(vocab: int) -> np.ndarray:
    """N_TOKENS ids from default_rng(TOKEN_SEED), with id 0 first and a repeat of token 2 at the end."""
    t = np.random.default_rng(TOKEN_SEED).integers(0, vocab, N_TOKENS).astype(np.int32)
    t[0], t[-1] = 0, t[2]
    return t


# -- state layouts: the references' lists -> RwkvState's arrays ---------------------------------------------

def _np(t) -> np.ndarray:
    return t.detach().to("cpu").float().numpy().copy()


def state_from_rwkv_package(state: list, version: int, n_layer: int) -> dict:
    """The rwkv package's state list -> RwkvState's shift_att, shift_ffn, wkv.

    v4: 5 per layer (att_xx, aa, bb, pp, ffn_xx); v5-v7: 3 per layer (att_xx, kv state (H, N, N), ffn_xx),
    the kv state already in RwkvState's layout (v5/v6 s[key][value], v7 s[value][key])."""
    k = 5 if version == 4 else 3
    shift_att = np.stack([_np(state[i * k]) for i in range(n_layer)])
    shift_ffn = np.stack([_np(state[i * k + k - 1]) for i in range(n_layer)])
    if version == 4:
        wkv = np.stack([np.stack([_np(state[i * 5 + j]) for j in (1, 2, 3)]) for i in range(n_layer)])
    else:
        wkv = np.stack([_np(state[i * 3 + 1]) for i in range(n_layer)])
    return {"shift_att": shift_att, "shift_ffn": shift_ffn, "wkv": wkv}


# -- references --------------------------------------------------------------------------------------------

def rwkv_package(v7: bool):
    """rwkv.model, (re)imported with this script's settings: CPU, no JIT, no CUDA kernels; RWKV-7 on or off
    (the package reads RWKV_V7_ON at import and then defines RWKV as its RWKV-7 class)."""
    os.environ["RWKV_JIT_ON"] = "0"
    os.environ["RWKV_CUDA_ON"] = "0"
    if v7:
        os.environ["RWKV_V7_ON"] = "1"
    else:
        os.environ.pop("RWKV_V7_ON", None)
    import rwkv.model
    return importlib.reload(rwkv.model)


def ref_rwkv(sd: dict, tokens: np.ndarray, version: int, tmp: str) -> dict:
    """The rwkv package on the state dict saved as .pth: one call, token by token, and split in two."""
    import torch
    from tests.models.rwkv_tiny import write_tiny_rwkv
    rm = rwkv_package(v7=version == 7)
    path = write_tiny_rwkv(pathlib.Path(tmp) / f"rwkv_v{version}.pth", state_dict=sd)
    model = rm.RWKV(model=str(path)[:-4], strategy="cpu fp32", **({} if version == 7 else {"verbose": False}))
    n_layer = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    ids = [int(t) for t in tokens]
    out = {}
    with torch.no_grad():
        logits, state = model.forward(ids, None)
        out["logits_seq"] = _np(logits)
        out["state"] = state_from_rwkv_package(state, version, n_layer)
        rows, state = [], None
        for t in ids:
            logits, state = model.forward([t], state)
            rows.append(_np(logits))
        out["logits_tok"] = np.stack(rows)
        out["state_tok"] = state_from_rwkv_package(state, version, n_layer)
        _, state = model.forward(ids[:SPLIT], None)
        logits, state = model.forward(ids[SPLIT:], state)
        out["logits_split"] = _np(logits)
        out["state_split"] = state_from_rwkv_package(state, version, n_layer)
    return out


HF_NAMES = {"att": "attention", "ffn": "feed_forward", "ln0": "pre_ln", "time_mix_k": "time_mix_key",
            "time_mix_v": "time_mix_value", "time_mix_r": "time_mix_receptance"}


def ref_transformers_v4(sd: dict, tokens: np.ndarray, version: int, tmp: str) -> dict:
    """transformers' RwkvForCausalLM (float32, CPU path), one call over all tokens with use_cache=True."""
    import torch
    from transformers import RwkvConfig, RwkvForCausalLM
    assert version == 4
    V, C = sd["emb.weight"].shape
    n_layer = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    cfg = RwkvConfig(vocab_size=V, context_length=64, hidden_size=C, num_hidden_layers=n_layer,
                     attention_hidden_size=C, intermediate_size=sd["blocks.0.ffn.key.weight"].shape[0],
                     layer_norm_epsilon=1e-5, rescale_every=0, tie_word_embeddings=False, use_cache=True)
    model = RwkvForCausalLM(cfg).float().eval()
    hf = {}
    for k, v in sd.items():
        if k == "head.weight":
            hf[k] = v
        elif k == "emb.weight":
            hf["rwkv.embeddings.weight"] = v
        else:
            hf["rwkv." + ".".join(HF_NAMES.get(p, p) for p in k.split("."))] = v
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in hf.items()}, strict=True)
    with torch.no_grad():
        res = model(torch.from_numpy(tokens.astype(np.int64))[None], use_cache=True)
    st = [_np(s)[0].T for s in res.state]                    # each (1, C, n_layer) -> (n_layer, C)
    return {"logits_all": _np(res.logits)[0],
            "state": {"shift_att": st[1], "shift_ffn": st[0], "wkv": np.stack(st[2:], axis=1)}}


# version -> (reference name, function); v6/v7 entries may be replaced or extended per version
REFERENCES = {
    "v4": (("transformers", ref_transformers_v4), ("rwkv", ref_rwkv)),
    "v5": (("rwkv", ref_rwkv),),
    "v6": (("rwkv", ref_rwkv),),
    "v7": (("rwkv", ref_rwkv),),
}


def package_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for p in ("torch", "transformers", "rwkv", "numpy"):
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            out[p] = None
    return out


def gen(key: str, out: str) -> str:
    import torch
    from tests.models.rwkv_tiny import tiny_state_dict
    torch.set_num_threads(1)
    arrays, models = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in MODELS[key].items():
            sd = tiny_state_dict(**args)
            tokens = tokens_for(args["vocab"])
            version = int(float(args["version"]))
            arrays.update({f"{name}.w.{k}": v for k, v in sd.items()})
            arrays[f"{name}.tokens"] = tokens
            refs = []
            for ref, fn in REFERENCES[key]:
                res = fn(sd, tokens, version, tmp)
                for k, v in res.items():
                    if isinstance(v, dict):
                        arrays.update({f"{name}.{ref}.{k}.{s}": np.asarray(a, np.float32) for s, a in v.items()})
                    else:
                        arrays[f"{name}.{ref}.{k}"] = np.asarray(v, np.float32)
                refs.append(ref)
            models.append({"name": name, "writer_args": args, "references": refs, "n_tokens": len(tokens)})
    bad = [k for k, v in arrays.items() if v.dtype.kind == "f" and not np.isfinite(v).all()]
    assert not bad, f"non-finite reference values: {bad}"
    meta = {"about": f"reference logits and states of tiny random RWKV {key} models; scripts/gen_rwkv_goldens.py",
            "packages": package_versions(), "token_seed": TOKEN_SEED, "split": SPLIT,
            "settings": {"rwkv": "RWKV(strategy='cpu fp32'), RWKV_JIT_ON=0, RWKV_CUDA_ON=0 (RWKV_V7_ON=1 for v7), "
                                 "model.forward(ids, state)",
                         "transformers": "RwkvForCausalLM float32 CPU, rescale_every=0, use_cache=True",
                         "torch_threads": 1},
            "models": models}
    path = os.path.join(out, f"rwkv_{key}.npz")
    np.savez_compressed(path, meta=np.array(json.dumps(meta)), **arrays)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--only", action="append", choices=tuple(MODELS),
                    help="generate this version's file only (repeatable); default: all")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for key in args.only or MODELS:
        gen(key, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
