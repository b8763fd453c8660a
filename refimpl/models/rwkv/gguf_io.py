"""llama.cpp GGUF files of the `rwkv6` and `rwkv7` architectures as an RwkvModel.

    model = load("rwkv7-world-0.4b-q8_0.gguf")        # weights stay quantized (QTensors) and memory-mapped

The model is the one the .pth route gives (BlinkDL names and layouts, `refimpl.models.rwkv.RwkvModel`), so
v6.py / v7.py run it unchanged. What llama.cpp's converter changed is undone here (NumPy shapes; ggml's ne
is the same list reversed; C = n_embd, H = n_head, S = head_size):

  rwkv6                                                  BlinkDL
    token_embd / token_embd_norm                          emb.weight / blocks.0.ln0
    blk.i.attn_norm / attn_norm_2                         blocks.i.ln1 / ln2
    time_mix_lerp_x (C,)                                  att.time_maa_x (1, 1, C)
    time_mix_lerp_fused (5, 1, 1, C): w k v r g           att.time_maa_{w,k,v,r,g} (1, 1, C) each
      (older files: time_mix_lerp_{w,k,v,r,g} (C,))
    time_mix_w1 (5D, C)                                   att.time_maa_w1 (C, 5D)          transposed
    time_mix_w2 (5, C, D)                                 att.time_maa_w2 (5, D, C)        last axes swapped
    time_mix_decay (C,)                                   att.time_decay (1, 1, C)         raw, as stored
    time_mix_decay_w1 (D2, C) / _w2 (C, D2)               att.time_decay_w1 (C, D2) / _w2 (D2, C)
    time_mix_first (H, S)                                 att.time_faaaa (H, S)
    time_mix_{receptance,key,value,gate,output}           att.{...}.weight (C, C)          as stored
    time_mix_ln                                           att.ln_x
    channel_mix_lerp_{k,r} (C,)                           ffn.time_maa_{k,r} (1, 1, C)
    channel_mix_{key,receptance,value}                    ffn.{...}.weight                 as stored
    output_norm / output                                  ln_out / head.weight
  rwkv7
    time_mix_lerp_fused (6, 1, 1, C): r w k v a g         att.x_{r,w,k,v,a,g} (1, 1, C)  (5 without a gate)
    time_mix_{w,a,v}0 (C,), k_k, k_a (C,)                 att.{w,a,v}0, k_k, k_a (1, 1, C)
    time_mix_{w,a,v,g}1 (D, C) / 2 (C, D)                 att.{w,a,v,g}1 (C, D) / 2 (D, C)  transposed
    time_mix_r_k (C,)                                     att.r_k (H, S)
    channel_mix_lerp_k / key / value                      ffn.x_k (1, 1, C) / ffn.key.weight / ffn.value.weight
    (block 0's time_mix_v{0,1,2} are the converter's copies of a{0,1,2}, unused: kept under att.v{0,1,2})

No exp/log is undone: llama.cpp's converter writes time_decay, time_faaaa and w0 raw, and its graph applies
exp(-exp(.)) (v6) and exp(-0.606531*sigmoid(.)) (v7), as v6.py / v7.py do. What differs is rwkv6's
`rescale_every_n_layers`: the converter divided att.output and ffn.value of layer i by 2**(i // n); the
weights stay as stored and hparams.rescale_every = n makes the forward halve x after every n-th layer
(llama.cpp's graph). Projections, the embedding and the head keep their GGUF type (ndarray F32/F16, or a
QTensor, memory-mapped); vectors are F32 in every llama.cpp file; the LoRA factors are transposed, so they
become ndarrays (F16 stays F16, a quantized one is dequantized: llama-quantize never quantizes them).

Hyper-parameters come from the metadata: {arch}.embedding_length, block_count, wkv.head_size,
feed_forward_length, attention.layer_norm_epsilon (1e-5 if absent), rescale_every_n_layers (rwkv6);
the per-head norm's eps is llama.cpp's fixed 64e-5. rwkv6qwen2 / arwkv7 (other graphs) are refused.
"""
from __future__ import annotations

import numpy as np

from ... import gguf as _gguf
from ...qtensor import QTensor, dequantize
from ..common import getter
from .model import HParams, RwkvModel

ARCHS = {"rwkv6": 6, "rwkv7": 7}
LN_X_EPS = 64e-5             # llama.cpp's ggml_norm eps of the head-wise group norm (both graphs)


def _lora_back(x) -> np.ndarray:
    """A llama.cpp LoRA factor (n_out, n_in) back to BlinkDL's (n_in, n_out): transposed, contiguous."""
    if isinstance(x, QTensor):
        x = dequantize(x)
    return np.ascontiguousarray(np.swapaxes(np.asarray(x), -1, -2))


def _vec3(x) -> np.ndarray:
    """A stored vector as BlinkDL's (1, 1, C) f32."""
    if isinstance(x, QTensor):
        x = dequantize(x)
    return np.asarray(x, np.float32).reshape(1, 1, -1)


class _Tensors:
    """The GGUF's tensors by name, with errors naming the file, the tensor and the shape expected."""

    def __init__(self, f):
        self.f, self.t = f, f.tensors

    def __contains__(self, name):
        return name in self.t

    def __call__(self, name: str, shape: tuple | None = None):
        t = self.t.get(name)
        if t is None:
            raise ValueError(f"{self.f.path}: tensor {name!r} is missing")
        if shape is not None:
            got = tuple(d for d in t.shape if d != 1) if len(shape) < len(t.shape) else tuple(t.shape)
            if got != tuple(shape):
                raise ValueError(f"{self.f.path}: tensor {name!r} has ne {list(t.shape[::-1])} (numpy "
                                 f"{tuple(t.shape)}), expected numpy {tuple(shape)}")
        return t


def _hparams(f, version: int, t: _Tensors) -> HParams:
    arch, kv = f.arch, f.metadata

    g = getter(kv, f"{arch}.", f.path)

    n_embd, n_layer, head_size = int(g("embedding_length")), int(g("block_count")), int(g("wkv.head_size"))
    if head_size <= 0 or n_embd % head_size:
        raise ValueError(f"{f.path}: {arch}.wkv.head_size {head_size} does not divide embedding_length {n_embd}")
    if int(g("token_shift_count", 2)) != 2:
        raise ValueError(f"{f.path}: token_shift_count {g('token_shift_count')} (llama.cpp's rwkv graphs need 2)")
    emb = t("token_embd.weight")
    n_ff = g("feed_forward_length")
    n_ff = int(max(n_ff) if isinstance(n_ff, list) else n_ff)
    return HParams(n_layer=n_layer, n_embd=n_embd, n_head=n_embd // head_size, head_size=head_size,
                   vocab=int(emb.shape[0]), n_ffn=n_ff, variant=f"{version}.0",
                   norm_eps=float(g("attention.layer_norm_epsilon", 1e-5)), ln_x_eps=LN_X_EPS,
                   rescale_every=int(g("rescale_every_n_layers", 0)) if version == 6 else 0)


def _weights_v6(t: _Tensors, hp: HParams) -> dict:
    C, H, S, F = hp.n_embd, hp.n_head, hp.head_size, hp.n_ffn
    w = {}
    for i in range(hp.n_layer):
        g, a, m = f"blk.{i}.", f"blocks.{i}.att.", f"blocks.{i}.ffn."
        if g + "time_mix_lerp_fused.weight" in t:
            fused = np.asarray(t(g + "time_mix_lerp_fused.weight", (5, C)), np.float32).reshape(5, C)
            for c, row in zip("wkvrg", fused):
                w[a + f"time_maa_{c}"] = row.reshape(1, 1, C)
        else:
            for c in "wkvrg":
                w[a + f"time_maa_{c}"] = _vec3(t(g + f"time_mix_lerp_{c}.weight", (C,)))
        w[a + "time_maa_x"] = _vec3(t(g + "time_mix_lerp_x.weight", (C,)))
        w1 = t(g + "time_mix_w1.weight")
        if w1.shape[-1] != C or w1.shape[0] % 5:
            raise ValueError(f"time_mix_w1 of layer {i}: numpy {tuple(w1.shape)}, expected (5*D, {C})")
        w[a + "time_maa_w1"] = _lora_back(w1)
        w[a + "time_maa_w2"] = _lora_back(t(g + "time_mix_w2.weight", (5, C, w1.shape[0] // 5)))
        w[a + "time_decay"] = _vec3(t(g + "time_mix_decay.weight", (C,)))
        dw1 = t(g + "time_mix_decay_w1.weight")
        w[a + "time_decay_w1"] = _lora_back(dw1)
        w[a + "time_decay_w2"] = _lora_back(t(g + "time_mix_decay_w2.weight", (C, dw1.shape[0])))
        w[a + "time_faaaa"] = np.asarray(t(g + "time_mix_first.weight", (H, S)), np.float32)
        for n in ("receptance", "key", "value", "gate", "output"):
            w[a + f"{n}.weight"] = t(g + f"time_mix_{n}.weight", (C, C))
        w[a + "ln_x.weight"] = t(g + "time_mix_ln.weight", (C,))
        w[a + "ln_x.bias"] = t(g + "time_mix_ln.bias", (C,))
        w[m + "time_maa_k"] = _vec3(t(g + "channel_mix_lerp_k.weight", (C,)))
        w[m + "time_maa_r"] = _vec3(t(g + "channel_mix_lerp_r.weight", (C,)))
        w[m + "key.weight"] = t(g + "channel_mix_key.weight", (F, C))
        w[m + "receptance.weight"] = t(g + "channel_mix_receptance.weight", (C, C))
        w[m + "value.weight"] = t(g + "channel_mix_value.weight", (C, F))
    return w


def _weights_v7(t: _Tensors, hp: HParams) -> dict:
    C, H, S, F = hp.n_embd, hp.n_head, hp.head_size, hp.n_ffn
    w = {}
    for i in range(hp.n_layer):
        g, a, m = f"blk.{i}.", f"blocks.{i}.att.", f"blocks.{i}.ffn."
        gated = g + "time_mix_g1.weight" in t and g + "time_mix_g2.weight" in t
        names = "rwkvag" if gated else "rwkva"
        fused = np.asarray(t(g + "time_mix_lerp_fused.weight", (len(names), C)), np.float32).reshape(-1, C)
        for c, row in zip(names, fused):
            w[a + f"x_{c}"] = row.reshape(1, 1, C)
        for c in "wav" + ("g" if gated else ""):
            if c != "g":
                w[a + f"{c}0"] = _vec3(t(g + f"time_mix_{c}0.weight", (C,)))
            f1 = t(g + f"time_mix_{c}1.weight")
            if f1.shape[-1] != C:
                raise ValueError(f"time_mix_{c}1 of layer {i}: numpy {tuple(f1.shape)}, expected (D, {C})")
            w[a + f"{c}1"] = _lora_back(f1)
            w[a + f"{c}2"] = _lora_back(t(g + f"time_mix_{c}2.weight", (C, f1.shape[0])))
        w[a + "k_k"] = _vec3(t(g + "time_mix_k_k.weight", (C,)))
        w[a + "k_a"] = _vec3(t(g + "time_mix_k_a.weight", (C,)))
        w[a + "r_k"] = np.asarray(t(g + "time_mix_r_k.weight", (C,)), np.float32).reshape(H, S)
        for n in ("receptance", "key", "value", "output"):
            w[a + f"{n}.weight"] = t(g + f"time_mix_{n}.weight", (C, C))
        if g + "time_mix_ln.weight" not in t:
            raise ValueError(f"blk.{i}.time_mix_ln is missing: rwkv7 without the group norm is not supported")
        w[a + "ln_x.weight"] = t(g + "time_mix_ln.weight", (C,))
        w[a + "ln_x.bias"] = t(g + "time_mix_ln.bias", (C,))
        w[m + "x_k"] = _vec3(t(g + "channel_mix_lerp_k.weight", (C,)))
        w[m + "key.weight"] = t(g + "channel_mix_key.weight", (F, C))
        w[m + "value.weight"] = t(g + "channel_mix_value.weight", (C, F))
    return w


def load(path, *, tokenizer: bool = True) -> RwkvModel:
    """An RwkvModel (version 6 or 7) from a llama.cpp `rwkv6` / `rwkv7` GGUF (a path or a loaded GGUFFile)."""
    f = path if isinstance(path, _gguf.GGUFFile) else _gguf.load(path)
    if f.arch not in ARCHS:
        raise ValueError(f"{f.path}: architecture {f.arch!r} is not one refimpl's RWKV runs "
                         f"({', '.join(sorted(ARCHS))}; rwkv6qwen2 and arwkv7 are other graphs)")
    version = ARCHS[f.arch]
    t = _Tensors(f)
    hp = _hparams(f, version, t)
    C, V = hp.n_embd, hp.vocab
    w = {"emb.weight": t("token_embd.weight", (V, C)),
         "blocks.0.ln0.weight": t("token_embd_norm.weight", (C,)),
         "blocks.0.ln0.bias": t("token_embd_norm.bias", (C,))}
    for i in range(hp.n_layer):
        for src, dst in (("attn_norm", "ln1"), ("attn_norm_2", "ln2")):
            for k in ("weight", "bias"):
                w[f"blocks.{i}.{dst}.{k}"] = t(f"blk.{i}.{src}.{k}", (C,))
    w.update(_weights_v6(t, hp) if version == 6 else _weights_v7(t, hp))
    w["ln_out.weight"] = t("output_norm.weight", (C,))
    w["ln_out.bias"] = t("output_norm.bias", (C,))
    w["head.weight"] = t("output.weight", (V, C))
    tok = None
    if tokenizer and "tokenizer.ggml.tokens" in f.metadata:
        from ...tokenizers import from_gguf
        try:
            tok = from_gguf(f)
        except ImportError:          # a tokenizer module not available in this install: the model runs without
            tok = None
    return RwkvModel(version=version, hparams=hp, weights=w, tokenizer=tok, path=str(f.path))
