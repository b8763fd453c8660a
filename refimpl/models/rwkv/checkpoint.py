"""Read RWKV state dicts (BlinkDL / ChatRWKV .pth, .safetensors, .npz) into an RwkvModel, detecting the version.

    model = load("RWKV-5-World-0.4B-v2-20231113-ctx4096.pth")     # needs torch for .pth
    model = from_state_dict({"emb.weight": ..., ...})              # any mapping name -> array

Safety: a .pth is read with `torch.load(path, map_location="cpu", weights_only=True)`, torch's restricted
unpickler that only rebuilds tensors and plain containers (never arbitrary objects); without torch installed
a .pth cannot be read -- convert it to .safetensors elsewhere. .safetensors files go through the safetensors
package (BF16 through ml_dtypes when it is installed, else decoded here), .npz through np.load with
allow_pickle=False.

Every tensor becomes a float32 NumPy array (bf16 and f16 checkpoints are widened exactly) with its checkpoint
shape, under BlinkDL's .pth name. The `transformers` names of the same tensors (RwkvForCausalLM and the
RWKV-5/6 "-hf" models: `rwkv.embeddings.weight`, `rwkv.blocks.0.pre_ln.weight`, `...attention.time_mix_key`,
`...feed_forward.value.weight`) are renamed to BlinkDL's. Files converted by the rwkv package for a strategy
(a `_strategy` entry: transposed, rescaled, int8) and state-tuning files are refused.

The version is detected from tensor names and shapes as the `rwkv` package (ChatRWKV) does:
    v7    att.r_k / att.x_r present (RWKV-7 "Goose")
    v6    att.time_maa_* present (token shift by data-dependent lerp, time_decay_w1/_w2 LoRA)
    v5    att.ln_x present; 5.1 when att.gate.weight is also there; 5.2 when att.time_decay is (n_head,
          head_size) with head_size > 1 (5.0 / 5.1: one decay per head, (n_head,)). The bonus is
          att.time_faaaa (used as is) or, in early 5.0 files, att.time_first (a log: u = exp(time_first)).
    v4    otherwise: att.time_decay and att.time_first are (n_embd,) vectors
"""
from __future__ import annotations

import json
import pathlib
import re

import numpy as np

from ...errors import RWKVError, looks_like
from .model import HParams, RwkvModel

VARIANTS = ("4", "5.0", "5.1", "5.2", "6.0", "7.0")

# transformers' names -> BlinkDL's (applied to each dot-separated part of a name)
_HF_PARTS = {"embeddings": "emb", "pre_ln": "ln0", "attention": "att", "feed_forward": "ffn",
             "time_mix_key": "time_mix_k", "time_mix_value": "time_mix_v", "time_mix_receptance": "time_mix_r",
             "time_mix_gate": "time_mix_g"}


def _bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> float32: the bf16 value is the top half of the f32 (exact)."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


def _to_f32(x) -> np.ndarray:
    """A torch tensor or NumPy array (f32/f16/bf16/f64) as a float32 ndarray."""
    if hasattr(x, "detach"):                                  # torch.Tensor
        import torch
        return x.detach().to(torch.float32).cpu().numpy()
    x = np.asarray(x)
    if x.dtype.kind not in "fiu" and x.dtype.name != "bfloat16":
        raise ValueError(f"tensor of dtype {x.dtype} is not a float tensor")
    return np.ascontiguousarray(x, dtype=np.float32)


def _read_pth(path: pathlib.Path) -> dict:
    try:
        import torch
    except ImportError:
        raise ImportError(f"{path}: reading a .pth needs torch (pip install torch); or convert the checkpoint to "
                          ".safetensors") from None
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:                                     # legacy (non-zip) format: no mmap
        sd = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(sd, dict):
        raise ValueError(f"{path}: a state dict (name -> tensor) was expected, got {type(sd).__name__}")
    return sd


def _read_safetensors(path: pathlib.Path) -> dict:
    try:
        from safetensors import safe_open
    except ImportError:
        raise ImportError(f"{path}: reading .safetensors needs the safetensors package") from None
    try:
        import ml_dtypes  # noqa: F401   (registers numpy's bfloat16, which safetensors' numpy loader needs)
    except ImportError:
        pass
    out, bf16 = {}, []
    with safe_open(str(path), framework="numpy") as f:
        for k in f.keys():
            try:
                out[k] = f.get_tensor(k)
            except TypeError:                                # BF16 and no ml_dtypes: decoded below
                if f.get_slice(k).get_dtype() != "BF16":
                    raise
                bf16.append(k)
    if bf16:                                                 # the format: u64 header size, JSON header, data
        with open(path, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        data = np.memmap(path, np.uint8, "r", offset=8 + n)
        for k in bf16:
            lo, hi = header[k]["data_offsets"]
            out[k] = _bf16_to_f32(data[lo:hi].view("<u2")).reshape(header[k]["shape"])
    return out


def read_state_dict(path) -> dict[str, np.ndarray]:
    """name -> float32 ndarray from a .pth, .safetensors or .npz file (BlinkDL names; see the module doc)."""
    path = pathlib.Path(path)
    kind = looks_like(path) if path.suffix in (".pth", ".pt", ".bin") else None
    if kind is not None and not kind.startswith(("a zip archive", "a Python pickle")):
        # not a torch file: say what it is instead of asking for torch (rwkv.cpp's .bin has magic 'ggmf')
        raise RWKVError(f"{path}: not a PyTorch checkpoint: it looks like {kind}"
                        + ("; rwkv.load reads rwkv.cpp's format (refimpl.models.rwkv.rwkv_cpp)"
                           if "rwkv.cpp" in kind else ""), path)
    if path.suffix in (".pth", ".pt", ".bin"):
        sd = _read_pth(path)
    elif path.suffix == ".safetensors":
        sd = _read_safetensors(path)
    elif path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            sd = {k: z[k] for k in z.files}
    else:
        raise ValueError(f"{path}: an RWKV checkpoint is .pth, .safetensors, .npz (or .gguf through load)")
    return normalize_state_dict(sd, str(path))


def normalize_state_dict(sd: dict, where: str = "state dict") -> dict[str, np.ndarray]:
    """BlinkDL names, float32 arrays; refuses rwkv-package conversions and non-tensor entries."""
    if "_strategy" in sd or "_version" in sd:
        raise ValueError(f"{where}: converted by the rwkv package for a strategy ({sd.get('_strategy')!r}): its "
                         "tensors are transposed/rescaled/quantized; load the original checkpoint")
    out = {}
    for k, v in sd.items():
        name = k
        if k.startswith("rwkv.") or ".attention." in k or ".feed_forward." in k:
            name = ".".join(_HF_PARTS.get(p, p) for p in (k[5:] if k.startswith("rwkv.") else k).split("."))
        out[name] = _to_f32(v)
    return out


def detect_version(sd: dict) -> str:
    """The variant ("4", "5.0", "5.1", "5.2", "6.0", "7.0") of a state dict with BlinkDL names."""
    keys = list(sd)
    if any(k.endswith(("att.r_k", "att.x_r")) for k in keys):
        return "7.0"
    if any(".att.time_maa" in k for k in keys):
        return "6.0"
    if any(".att.ln_x." in k for k in keys):
        variant = "5.1" if any(k.endswith("att.gate.weight") for k in keys) else "5.0"
        decay = [sd[k] for k in keys if k.endswith("att.time_decay")]
        if decay and decay[0].ndim > 1 and decay[0].shape[1] > 1:
            variant = "5.2"
        return variant
    if any(k.endswith("att.time_first") for k in keys) and any(k.endswith("att.time_decay") for k in keys):
        return "4"
    raise ValueError("not an RWKV state dict: no att.time_decay/time_first (v4), att.ln_x (v5), "
                     "att.time_maa_* (v6) or att.r_k (v7) tensors")


def hparams_from_state_dict(sd: dict, variant: str | None = None, where: str = "state dict") -> HParams:
    """Hyper-parameters from the tensor shapes (there is no config in a .pth)."""
    variant = variant or detect_version(sd)

    def need(name):
        if name not in sd:
            raise ValueError(f"{where}: RWKV-{variant} tensor {name!r} is missing")
        return sd[name]

    vocab, n_embd = need("emb.weight").shape
    layers = {int(m.group(1)) for k in sd for m in [re.match(r"blocks\.(\d+)\.", k)] if m}
    n_layer = max(layers) + 1 if layers else 0
    if n_layer == 0 or layers != set(range(n_layer)):
        raise ValueError(f"{where}: blocks {sorted(layers)} are not 0 .. n_layer-1")
    n_att = need("blocks.0.att.key.weight").shape[0]
    n_ffn = need("blocks.0.ffn.key.weight").shape[0]
    if variant == "4":
        if n_att != n_embd:
            raise ValueError(f"{where}: RWKV-4 with dim_att {n_att} != n_embd {n_embd} is not supported")
        n_head = head_size = 0
    elif variant.startswith("5"):
        n_head = need("blocks.0.att.time_decay").shape[0]
        head_size = n_att // n_head
    elif variant == "6.0":
        faaaa = need("blocks.0.att.time_faaaa")
        n_head = faaaa.shape[0]
        head_size = faaaa.shape[1] if faaaa.ndim > 1 else n_att // n_head
    else:
        n_head, head_size = need("blocks.0.att.r_k").shape
    if variant != "4" and n_head * head_size != n_att:
        raise ValueError(f"{where}: n_head {n_head} x head_size {head_size} != dim_att {n_att}")
    return HParams(n_layer=n_layer, n_embd=int(n_embd), n_head=int(n_head), head_size=int(head_size),
                   vocab=int(vocab), n_ffn=int(n_ffn), variant=variant)


def from_state_dict(state_dict: dict, *, tokenizer=None, path: str = "") -> RwkvModel:
    """An RwkvModel from name -> tensor (BlinkDL or transformers names, torch tensors or arrays, any float type)."""
    sd = normalize_state_dict(state_dict, path or "state dict")
    if any(k.endswith("att.time_state") for k in sd):
        raise ValueError(f"{path or 'state dict'}: a state-tuning file (att.time_state); load the base model and "
                         "build the initial RwkvState from it")
    hp = hparams_from_state_dict(sd, where=path or "state dict")
    return RwkvModel(version=int(float(hp.variant)), hparams=hp, weights=sd, tokenizer=tokenizer, path=str(path))


def load(path, *, tokenizer=None) -> RwkvModel:
    """load(path) for .pth / .safetensors / .npz state dicts."""
    return from_state_dict(read_state_dict(path), tokenizer=tokenizer, path=str(path))
