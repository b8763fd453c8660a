"""RWKV-6 / RWKV-7 checkpoints -> GGUF, as llama.cpp's converter writes its `rwkv6` / `rwkv7` architectures.

    convert("RWKV-x060-World-1B6.pth", "rwkv6.gguf")               # BlinkDL .pth (torch needed to read it)
    convert("v6-Finch-1B6-HF/", "rwkv6.gguf", "f16")               # a Hugging Face directory
    convert(state_dict, "tiny.gguf", quantize="q4_0")              # {BlinkDL name: ndarray}, no torch

Sources: a BlinkDL .pth / .safetensors file, a Hugging Face directory (config.json + safetensors or
pytorch_model.bin: RWKV's own v6/v7 layouts `rwkv.blocks.*` / `model.blocks.*`, and fla-hub's v7
`model.layers.*.attn.*` with `*_lora.lora.{0,2}` factors), or a dict of arrays in BlinkDL naming. Every
source is first renamed to BlinkDL's names and layouts (fla's LoRA factors transposed to BlinkDL's
(n_in, n_out), its `lora.2.bias` is the `*0` vector), then turned into llama.cpp's tensors:

  rwkv6 (conversion/rwkv.py Rwkv6Model)     numpy shapes; ggml ne is the same list reversed
    emb.weight                -> token_embd.weight            (n_vocab, n_embd)
    blocks.0.ln0.{weight,bias}-> token_embd_norm.*            (n_embd,)
    blocks.i.ln1 / ln2        -> blk.i.attn_norm / attn_norm_2
    att.time_maa_x            -> time_mix_lerp_x              squeezed (n_embd,)
    att.time_maa_{w,k,v,r,g}  -> time_mix_lerp_fused          stacked in that order (5, 1, 1, n_embd)
    att.time_maa_w1 (C, 5D)   -> time_mix_w1                  transposed (5D, C)
    att.time_maa_w2 (5, D, C) -> time_mix_w2                  last two axes swapped (5, C, D)
    att.time_decay            -> time_mix_decay               squeezed; raw (the graph takes exp(-exp(.)))
    att.time_decay_w1 / w2    -> time_mix_decay_w1 / w2       transposed (D2, C) / (C, D2)
    att.time_faaaa (H, S)     -> time_mix_first               as is (no exp: the "faaaa" is the real u)
    att.{receptance,key,value,gate,output}.weight -> time_mix_*.weight
    att.ln_x                  -> time_mix_ln
    ffn.time_maa_{k,r}        -> channel_mix_lerp_{k,r}       squeezed
    ffn.{key,receptance,value}.weight -> channel_mix_*.weight
    ln_out / head.weight      -> output_norm / output.weight
    att.output and ffn.value of layer i are divided by 2**(i // rescale_every) when rescale_every > 0
    (HF configs say 6; a .pth has no such setting: 0 unless given); llama.cpp's graph then halves x
    after every rescale_every-th layer.

  rwkv7 (conversion/rwkv.py Rwkv7Model)
    att.x_{r,w,k,v,a,g}       -> time_mix_lerp_fused          stacked unsqueezed (6, 1, 1, n_embd)
    att.{w,a,v}0, k_k, k_a    -> time_mix_{w,a,v}0, k_k, k_a  squeezed (n_embd,); w0 raw (the graph takes
                                                              exp(-0.606531*sigmoid(.)))
    att.{w,a,v,g}1 (C, D)     -> time_mix_{w,a,v,g}1          transposed (D, C)
    att.{w,a,v,g}2 (D, C)     -> time_mix_{w,a,v,g}2          transposed (C, D)
    att.r_k (H, S)            -> time_mix_r_k                 flattened (n_embd,)
    layer 0: v0/v1/v2 of the source are dropped and time_mix_v{0,1,2} written as copies of a{0,1,2}
    (llama.cpp requires them and never reads them)
    ffn.x_k / key / value     -> channel_mix_lerp_k / channel_mix_key / channel_mix_value
    (names as rwkv6 otherwise)

Types (`type`, llama.cpp's --outtype): "f32", "f16", "bf16" or "q8_0", with its rules: 1-D tensors,
`*_norm.weight`, biases, time_mix_first, time_mix_w1/w2, time_mix_decay_w1/w2 and time_mix_lerp_fused
stay F32; everything else (embedding and output included; rwkv7's a/v/g LoRA factors too) gets the type,
F16 where a row does not fill Q8_0 blocks. Conversion goes through the `gguf` package's quantizer, as there.

`quantize` ("q8_0", "q5_1", "q4_0", or another type refimpl.quantize makes without an importance matrix)
is refimpl's addition, what llama-quantize would do with RWKV's guidance: only the projection matrices
(time_mix_{receptance,key,value,gate,output}, channel_mix_{key,value,receptance}) are quantized with ggml's
reference quantizer; the embedding, the output head (rwkv.cpp leaves both unquantized: they cost
perplexity and take little space), norms, vectors and the small LoRA factors stay at `type`.

Metadata is llama.cpp's: general.{architecture,type,name,size_label} (gguf.Metadata heuristics on the
source's name), {arch}.context_length 1048576, embedding_length, block_count,
attention.layer_norm_epsilon (1e-5 for a .pth), wkv.head_size, feed_forward_length, attention.head_count
0; rwkv6: rescale_every_n_layers, time_mix_extra_dim, time_decay_extra_dim (from the tensors' shapes: the
converter's hard-wired 32/64, or 64/128 at n_embd 4096, for every released model); rwkv7: attention.
{decay,iclr,value_residual_mix,gate}_lora_rank; general.file_type, general.quantization_version 2; and the
RWKV World vocabulary (`tokenizer.ggml.model` "rwkv").

Vocabulary: tokenizer.ggml.tokens are token 0 "<s>" (CONTROL) and the lines of rwkv_vocab_v20230424.txt
(token i on line i), each token's bytes written as Python's bytes repr without the b'' (what llama.cpp
unescapes), padded with "[PAD{i}]" (UNUSED) to n_vocab; bos = eos = 0, eot = 261 ("\\n\\n"; not written for
a vocabulary of 261 tokens or fewer), chat template
from the source's tokenizer_config.json or else "rwkv-world" (llama.cpp's built-in name for it). The vocab
file is looked for next to the source (`vocab=` names it); without one, a vocabulary of at most 257 tokens is
built from the 256 single bytes, which are World's tokens 1..256, and larger ones are padded -- enough for
tiny test models, and llama.cpp loads it.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np

from .. import gguf as rgguf
from ..qtensor import QTensor, quantize as ggml_quantize
from ..types import GGMLType

__all__ = ["convert", "detect", "read_state_dict", "detect_version", "gguf_tensors", "gguf_metadata", "world_vocab",
           "ARCH", "OUTTYPES", "QUANTIZED_MATRICES", "MODEL_TYPES", "ARCHITECTURES"]

ARCH = {6: "rwkv6", 7: "rwkv7"}
VOCAB_FILE = "rwkv_vocab_v20230424.txt"
CONTEXT_LENGTH = 1048576            # "RWKV isn't context limited": what llama.cpp's converter writes
EOT_ID = 261                        # "\n\n" in the World vocabulary, llama.cpp's converter's EOT
# llama.cpp's converter keeps these F32 whatever the outtype (TIME_MIX_FIRST, W1, W2, DECAY_W1/W2, LERP_FUSED)
_F32_TENSORS = ("time_mix_first.weight", "time_mix_w1.weight", "time_mix_w2.weight",
                "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight")
# what `quantize=` touches: the projections (rwkv.cpp's and llama-quantize's choice minus emb/head)
QUANTIZED_MATRICES = ("time_mix_receptance.weight", "time_mix_key.weight", "time_mix_value.weight",
                      "time_mix_gate.weight", "time_mix_output.weight", "channel_mix_key.weight",
                      "channel_mix_value.weight", "channel_mix_receptance.weight")
_OUTTYPES = {"f32": (GGMLType.F32, 0), "f16": (GGMLType.F16, 1), "bf16": (GGMLType.BF16, 32),
             "q8_0": (GGMLType.Q8_0, 7)}
OUTTYPES = tuple(_OUTTYPES)                       # llama.cpp's --outtype values (refimpl.convert's registry)
MODEL_TYPES = ("rwkv6", "rwkv7")                  # config.json model_type / architectures of HF directories
ARCHITECTURES = ("Rwkv6ForCausalLM", "Rwkv7ForCausalLM", "RWKV7ForCausalLM")


# -- reading sources --------------------------------------------------------------------------------------

def _to_numpy(t) -> np.ndarray:
    """A torch tensor or array as NumPy: f16 stays f16, other floats (bf16, f64) become f32 (llama.cpp's
    converter does the same before choosing the output type)."""
    if hasattr(t, "detach"):
        import torch
        t = t.detach().cpu()
        if t.dtype not in (torch.float16, torch.float32):
            t = t.to(torch.float32)
        return t.numpy()
    a = np.asarray(t)
    if a.dtype != np.float16 and a.dtype != np.float32:
        a = a.astype(np.float32)
    return a


def _load_file(path: Path) -> dict:
    if path.suffix == ".safetensors":
        from safetensors import safe_open
        try:
            with safe_open(str(path), framework="numpy") as f:
                return {k: f.get_tensor(k) for k in f.keys()}
        except (TypeError, ValueError):          # bf16 has no NumPy dtype: read through torch
            with safe_open(str(path), framework="pt") as f:
                return {k: f.get_tensor(k) for k in f.keys()}
    import torch                                   # .pth / .bin: pickled torch tensors
    return dict(torch.load(str(path), map_location="cpu", weights_only=True, mmap=True))


def _fla_lora(name: str, x: np.ndarray) -> tuple[str, np.ndarray]:
    m = re.match(r"(.*)\.([wavg])_lora\.lora\.(0\.weight|2\.weight|2\.bias)$", name)
    if not m:
        return name, x
    base, c, part = m.groups()
    if part == "2.bias":
        return f"{base}.{c}0", x
    return f"{base}.{c}{'1' if part == '0.weight' else '2'}", np.ascontiguousarray(x.T)


def _hf_to_blinkdl(name: str, x: np.ndarray) -> Iterator[tuple[str, np.ndarray]]:
    """One Hugging Face tensor (RWKV's v6/v7 layouts or fla-hub's v7) as BlinkDL name(s) and layout."""
    n = name
    if n.startswith("rwkv."):                                          # RWKV's v6 HF layout
        n = n[len("rwkv."):]
    elif n.startswith("model."):
        n = n[len("model."):]
    n = n.replace("layers.", "blocks.", 1) if n.startswith("layers.") else n
    n = re.sub(r"^embeddings\.", "emb.", n)
    n = re.sub(r"^(pre_ln|blocks\.0\.pre_norm|blocks\.0\.pre_ln)\.", "blocks.0.ln0.", n)
    n = re.sub(r"^(norm|ln_out)\.", "ln_out.", n)
    n = re.sub(r"^lm_head\.", "head.", n)
    n = re.sub(r"\.(attn_norm|attention_norm)\.", ".ln1.", n)
    n = re.sub(r"\.(ffn_norm|feed_forward_norm)\.", ".ln2.", n)
    n = re.sub(r"\.(attention|attn|self_attn)\.(time_mixer\.)?", ".att.", n)
    n = re.sub(r"\.(feed_forward|ffn)\.", ".ffn.", n)
    n = re.sub(r"\.att\.g_norm\.", ".att.ln_x.", n)
    for a, b in (("r_proj", "receptance"), ("k_proj", "key"), ("v_proj", "value"), ("o_proj", "output")):
        n = n.replace(f".att.{a}.", f".att.{b}.")
    n, x = _fla_lora(n, x)
    if n.endswith(".att.x_x"):                                         # fla's fused mixes: (6|5, C)
        x = np.asarray(x).reshape(-1, x.shape[-1])
        for c, row in zip("rwkvag", x):
            yield n[:-1] + c, row.reshape(1, 1, -1)
        return
    yield n, x


def read_state_dict(src) -> tuple[dict, dict, Path | None, str]:
    """(state dict in BlinkDL names, HF config (or {}), directory to look for a vocabulary in, model name).

    src: a dict of arrays (BlinkDL names), a .pth / .safetensors file, an rwkv.cpp .bin file, or a Hugging Face
    directory."""
    if isinstance(src, Mapping):
        return {k: _to_numpy(v) for k, v in src.items()}, {}, None, "rwkv"
    p = Path(src)
    if p.is_dir():
        cfg = json.loads((p / "config.json").read_text()) if (p / "config.json").is_file() else {}
        files = sorted(p.glob("*.safetensors")) or sorted(p.glob("pytorch_model*.bin")) or sorted(p.glob("*.pth"))
        if not files:
            raise FileNotFoundError(f"{p}: no *.safetensors, pytorch_model*.bin or *.pth weights")
        raw: dict = {}
        for f in files:
            raw.update(_load_file(f))
        sd = {}
        for k in sorted(raw):                       # llama.cpp reads a safetensors file in key order
            for n, x in _hf_to_blinkdl(k, _to_numpy(raw[k])):
                sd[n] = x
        return sd, cfg, p, p.name
    from ..models.rwkv import rwkv_cpp
    if rwkv_cpp.is_rwkv_cpp(p):                     # rwkv.cpp's own file: its converter undone, f32 values
        from ..qtensor import dequantize
        sd = {k: dequantize(v) if isinstance(v, QTensor) else np.asarray(v, np.float32)
              for k, v in rwkv_cpp.state_dict(p).items()}
        return sd, {}, p.parent, p.stem
    raw = _load_file(p)
    sd = {k: _to_numpy(v) for k, v in raw.items()}
    if not any(k.startswith("blocks.") for k in sd):   # an HF layout in a single file
        sd = {n: x for k, v in sd.items() for n, x in _hf_to_blinkdl(k, v)}
    return sd, {}, p.parent, p.stem


def detect(path) -> bool:
    """True for a single .pth / .safetensors file holding an RWKV-6 or RWKV-7 state dict (BlinkDL or HF names);
    only the tensor names are read (a .pth through torch's memory map; without torch, False)."""
    p = Path(path)
    from ..models.rwkv import rwkv_cpp
    if p.is_file() and rwkv_cpp.is_rwkv_cpp(p):
        return True                                 # rwkv.cpp's .bin (v4/v5 are refused by detect_version)
    if not p.is_file() or p.suffix not in (".pth", ".safetensors"):
        return False
    try:
        if p.suffix == ".safetensors":
            from safetensors import safe_open
            with safe_open(str(p), framework="numpy") as f:
                names = list(f.keys())
        else:
            import torch
            names = list(torch.load(str(p), map_location="cpu", weights_only=True, mmap=True))
    except Exception:                               # noqa: BLE001 -- not ours to judge: no torch, not a state dict, ...
        return False
    names = [n for k in names for n, _ in _hf_to_blinkdl(k, np.zeros((1, 1)))] if not any(
        k.startswith("blocks.") for k in names) else names
    return any(n.endswith(("att.r_k", "att.time_maa_x")) for n in names)


def detect_version(sd: Mapping) -> int:
    """6 or 7 from BlinkDL names (7: att.r_k; 6: att.time_maa_x); v4/v5 have no llama.cpp architecture."""
    if "blocks.0.att.r_k" in sd:
        return 7
    if "blocks.0.att.time_maa_x" in sd:
        return 6
    raise ValueError("not an RWKV-6 or RWKV-7 state dict (no blocks.0.att.time_maa_x / blocks.0.att.r_k); "
                     "llama.cpp has no architecture for RWKV-4/5")


def _n_layer(sd: Mapping) -> int:
    ids = {int(m.group(1)) for k in sd for m in [re.match(r"blocks\.(\d+)\.", k)] if m}
    if not ids or ids != set(range(max(ids) + 1)):
        raise ValueError(f"blocks must be numbered 0..n-1, found {sorted(ids)[:8]}...")
    return max(ids) + 1


def hparams(sd: Mapping, version: int, cfg: Mapping | None = None, *, rescale_every: int | None = None) -> dict:
    """The hyper-parameters llama.cpp's converter writes, from the tensors (and an HF config where given)."""
    cfg = cfg or {}
    n_vocab, n_embd = sd["emb.weight"].shape
    a = "blocks.0.att."
    head_size = int(sd[a + ("r_k" if version == 7 else "time_faaaa")].shape[-1])
    hp = dict(n_vocab=int(cfg.get("vocab_size") or n_vocab), n_embd=int(n_embd), n_layer=_n_layer(sd),
              head_size=head_size, n_ff=int(sd["blocks.0.ffn.key.weight"].shape[0]),
              eps=float(cfg.get("layer_norm_epsilon", cfg.get("norm_eps", 1e-5))))
    if version == 6:
        hp["rescale_every"] = int(cfg.get("rescale_every", 0) if rescale_every is None else rescale_every)
        hp["time_mix_extra_dim"] = int(sd[a + "time_maa_w1"].shape[1]) // 5
        hp["time_decay_extra_dim"] = int(sd[a + "time_decay_w1"].shape[1])
    else:
        v = next((f"blocks.{i}.att." for i in range(1, hp["n_layer"]) if f"blocks.{i}.att.v1" in sd), None)
        hp["decay_lora_rank"] = int(sd[a + "w1"].shape[1])
        hp["iclr_lora_rank"] = int(sd[a + "a1"].shape[1])
        hp["value_residual_mix_lora_rank"] = int(sd[v + "v1"].shape[1]) if v else hp["iclr_lora_rank"]
        hp["gate_lora_rank"] = int(sd[a + "g1"].shape[1]) if a + "g1" in sd else 0
    return hp


# -- tensors -------------------------------------------------------------------------------------------------

_V6_NAMES = {
    "att.time_maa_x": "time_mix_lerp_x", "att.time_maa_w1": "time_mix_w1", "att.time_maa_w2": "time_mix_w2",
    "att.time_decay": "time_mix_decay", "att.time_decay_w1": "time_mix_decay_w1",
    "att.time_decay_w2": "time_mix_decay_w2", "att.time_faaaa": "time_mix_first",
    "ffn.time_maa_k": "channel_mix_lerp_k", "ffn.time_maa_r": "channel_mix_lerp_r",
}
_V7_NAMES = {f"att.{c}{i}": f"time_mix_{c}{i}" for c in "wavg" for i in "012"}
_V7_NAMES.update({"att.k_k": "time_mix_k_k", "att.k_a": "time_mix_k_a", "att.r_k": "time_mix_r_k",
                  "ffn.x_k": "channel_mix_lerp_k"})
_COMMON = {"ln1.weight": "attn_norm.weight", "ln1.bias": "attn_norm.bias", "ln2.weight": "attn_norm_2.weight",
           "ln2.bias": "attn_norm_2.bias", "att.ln_x.weight": "time_mix_ln.weight",
           "att.ln_x.bias": "time_mix_ln.bias"}
for _p in ("receptance", "key", "value", "gate", "output"):
    _COMMON[f"att.{_p}.weight"] = f"time_mix_{_p}.weight"
for _p in ("receptance", "key", "value"):
    _COMMON[f"ffn.{_p}.weight"] = f"channel_mix_{_p}.weight"
_TOP = {"emb.weight": "token_embd.weight", "blocks.0.ln0.weight": "token_embd_norm.weight",
        "blocks.0.ln0.bias": "token_embd_norm.bias", "ln_out.weight": "output_norm.weight",
        "ln_out.bias": "output_norm.bias", "head.weight": "output.weight"}
_LERP = {6: ("att.time_maa_", "wkvrg"), 7: ("att.x_", "rwkvag")}


def gguf_tensors(sd: Mapping, version: int, hp: Mapping) -> Iterator[tuple[str, np.ndarray]]:
    """llama.cpp's tensors (name, array in NumPy order) from a BlinkDL state dict, in the order its
    converter emits them (source order; a fused lerp where the last of its parts comes)."""
    names = _V6_NAMES if version == 6 else _V7_NAMES
    pre, letters = _LERP[version]
    if version == 7 and "blocks.0.att.g1" not in sd:
        letters = letters[:-1]
    lerp: dict[int, dict[str, np.ndarray]] = {}
    for key, x in sd.items():
        if key in _TOP:
            yield _TOP[key], (x.squeeze() if version == 7 else x)
            continue
        m = re.match(r"blocks\.(\d+)\.(.*)$", key)
        if not m:
            raise ValueError(f"unexpected tensor {key!r} in an RWKV-{version} state dict")
        bid, rest = int(m.group(1)), m.group(2)
        blk = f"blk.{bid}."
        if rest.startswith(pre) and rest[len(pre):] in letters:
            parts = lerp.setdefault(bid, {})
            parts[rest[len(pre):]] = x
            if len(parts) == len(letters):
                if version == 6:
                    fused = np.stack([parts[c].reshape(1, -1) for c in letters])[:, None]   # (5, 1, 1, C)
                else:
                    fused = np.stack([parts[c].reshape(1, 1, -1) for c in letters])        # (6, 1, 1, C)
                yield blk + "time_mix_lerp_fused.weight", fused
            continue
        if version == 7 and bid == 0 and rest in ("att.v0", "att.v1", "att.v2"):
            continue                                        # dummies of some checkpoints: replaced below
        if rest in _COMMON:
            name = _COMMON[rest]
        elif rest in names:
            name = names[rest] + ".weight"
        else:
            raise ValueError(f"unexpected tensor {key!r} in an RWKV-{version} state dict")
        if version == 6:
            if name in ("time_mix_w1.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight"):
                x = x.T
            elif name == "time_mix_w2.weight":
                x = np.swapaxes(x, 1, 2)
            elif name == "time_mix_decay.weight" or "lerp" in name:
                x = x.squeeze()
            r = hp.get("rescale_every", 0)
            if r > 0 and name in ("time_mix_output.weight", "channel_mix_value.weight"):
                x = x / np.asarray(2 ** (bid // r), dtype=x.dtype)
        else:
            x = x.squeeze()
            if re.fullmatch(r"time_mix_[wavg][12]\.weight", name):
                x = x.T
            if name == "time_mix_r_k.weight":
                x = x.reshape(-1)
            if bid == 0 and name.startswith("time_mix_a"):
                yield blk + name.replace("time_mix_a", "time_mix_v"), np.ascontiguousarray(x)
        yield blk + name, np.ascontiguousarray(x)


def _outtype(name: str, x: np.ndarray, qtype: GGMLType) -> GGMLType:
    """llama.cpp's converter's choice for one tensor."""
    if x.ndim <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return GGMLType.F32
    if name.endswith(_F32_TENSORS):
        return GGMLType.F32
    return qtype


def _store(name: str, x: np.ndarray, t: GGMLType, quant: GGMLType | None):
    """The array or QTensor written for one tensor of llama.cpp's choice t (refimpl's `quantize` on top)."""
    import gguf
    if quant is not None and name.endswith(QUANTIZED_MATRICES) and x.shape[-1] % _blck(quant) == 0:
        return ggml_quantize(np.asarray(x, np.float32), quant)
    if t == GGMLType.F32:
        return np.asarray(x, np.float32)
    if t == GGMLType.F16:
        return np.asarray(x, np.float16)
    try:
        raw = gguf.quants.quantize(np.asarray(x, np.float32), gguf.GGMLQuantizationType(int(t)))
    except gguf.QuantError:                                  # a row that does not fill the blocks
        return np.asarray(x, np.float16)
    return QTensor.from_bytes(raw, t, x.shape)


def _blck(t: GGMLType) -> int:
    from ..types import traits
    return traits(t).blck_size


# -- vocabulary and metadata ---------------------------------------------------------------------------------

def world_vocab(n_vocab: int, vocab_file: Path | str | None) -> tuple[list[str], list[int]]:
    """tokenizer.ggml.tokens and token_type of the RWKV World vocabulary, as llama.cpp's converter writes
    them (CONTROL = 3, NORMAL = 1, UNUSED = 5). vocab_file None: token 0 and the 256 bytes only."""
    tokens, types = ["<s>"], [3]
    if vocab_file is not None:
        for line in Path(vocab_file).read_text(encoding="utf-8").splitlines(keepends=True):
            parts = line.split(" ")
            tok, ln = ast.literal_eval(" ".join(parts[1:-1])), int(parts[-1])
            tok = tok.encode("utf-8") if isinstance(tok, str) else tok
            if len(tok) != ln:
                raise ValueError(f"{vocab_file}: token {parts[0]} has {len(tok)} bytes, the line says {ln}")
            tokens.append(repr(tok)[2:-1])
            types.append(1)
    else:
        for b in range(256):
            tokens.append(repr(bytes([b]))[2:-1])
            types.append(1)
    tokens, types = tokens[:n_vocab], types[:n_vocab]             # a tiny model: its first n_vocab tokens
    for i in range(len(tokens), n_vocab):
        tokens.append(f"[PAD{i}]")
        types.append(5)
    return tokens, types


def _find_vocab(vocab, src_dir: Path | None) -> Path | None:
    if vocab is not None:
        return Path(vocab)
    for d in ([src_dir] if src_dir else []) + [Path(__file__).resolve().parent.parent / "data"]:
        if (d / VOCAB_FILE).is_file():
            return d / VOCAB_FILE
    return None


def _chat_template(src_dir: Path | None) -> str:
    if src_dir is not None and (src_dir / "tokenizer_config.json").is_file():
        t = json.loads((src_dir / "tokenizer_config.json").read_text()).get("chat_template")
        if isinstance(t, str) and t:
            return t
    return "rwkv-world"


def _general(arch: str, name: str, src_dir: Path | None, n_params: int) -> list[tuple[str, object, object]]:
    """general.* as llama.cpp's converter writes them (gguf.Metadata's heuristics on the model's name)."""
    import gguf
    path = src_dir if src_dir is not None and src_dir.name == name else Path(name)
    meta = gguf.Metadata.load(None, path, None, n_params)
    if meta.name is None:
        meta.name = name
    if meta.size_label is None and n_params > 0:
        meta.size_label = gguf.size_label(n_params, n_params, 0, 0)
    w = gguf.GGUFWriter(path=None, arch=arch)
    w.add_type(gguf.GGUFType.MODEL)
    meta.set_gguf_meta_model(w)
    out = []
    for k, v in w.kv_data[0].items():
        vt = v.type if v.sub_type is None else (v.type, v.sub_type)
        out.append((k, v.value, vt))
    return out


def gguf_metadata(version: int, hp: Mapping, file_type: int, tokens: list[str], types: list[int],
                  chat_template: str, general: list) -> tuple[dict, dict]:
    """(metadata, value_types) in llama.cpp's converter's order."""
    T = rgguf.GGUFValueType
    arch = ARCH[version]
    md: dict = {}
    vt: dict = {}
    for k, v, t in general:
        md[k], vt[k] = v, t

    def a(key, v, t=None):
        md[f"{arch}.{key}"] = v
        if t is not None:
            vt[f"{arch}.{key}"] = t

    a("context_length", CONTEXT_LENGTH)
    a("embedding_length", hp["n_embd"])
    a("block_count", hp["n_layer"])
    a("attention.layer_norm_epsilon", hp["eps"], T.FLOAT32)
    if version == 6:
        a("rescale_every_n_layers", hp["rescale_every"])
    a("wkv.head_size", hp["head_size"])
    if version == 6:
        a("time_mix_extra_dim", hp["time_mix_extra_dim"])
        a("time_decay_extra_dim", hp["time_decay_extra_dim"])
    else:
        a("attention.decay_lora_rank", hp["decay_lora_rank"])
        a("attention.iclr_lora_rank", hp["iclr_lora_rank"])
        a("attention.value_residual_mix_lora_rank", hp["value_residual_mix_lora_rank"])
        a("attention.gate_lora_rank", hp["gate_lora_rank"])
    a("feed_forward_length", hp["n_ff"])
    md["general.file_type"] = file_type
    a("attention.head_count", 0)
    md["general.quantization_version"] = 2
    md["tokenizer.ggml.model"] = "rwkv"
    md["tokenizer.ggml.tokens"] = tokens
    vt["tokenizer.ggml.tokens"] = (T.ARRAY, T.STRING)
    md["tokenizer.ggml.token_type"] = types
    vt["tokenizer.ggml.token_type"] = (T.ARRAY, T.INT32)
    if EOT_ID < len(tokens):                    # a tiny vocabulary has no token 261
        md["tokenizer.ggml.eot_token_id"] = EOT_ID
    md["tokenizer.ggml.bos_token_id"] = 0
    md["tokenizer.ggml.eos_token_id"] = 0
    md["tokenizer.chat_template"] = chat_template
    for k in md:
        if k not in vt and isinstance(md[k], int) and not isinstance(md[k], bool):
            vt[k] = T.UINT32
    return md, vt


# -- the converter -------------------------------------------------------------------------------------------

_QUANT_FILE_TYPE = {"q4_0": 2, "q4_1": 3, "q5_0": 8, "q5_1": 9, "q8_0": 7}


def convert(src, out, type: str = "f32", *, quantize: str | None = None, vocab=None, name: str | None = None,
            rescale_every: int | None = None, chat_template: str | None = None) -> Path:
    """Write `src` (a .pth / .safetensors file, an HF directory or a BlinkDL state dict) to the GGUF `out`
    as llama.cpp's `rwkv6` / `rwkv7`. type: llama.cpp's --outtype (f32 f16 bf16 q8_0); quantize: refimpl's
    ggml-exact quantization of the projection matrices only (see the module doc); vocab: the World vocabulary
    file; name: general.name's source (default: the file or directory name); rescale_every: RWKV-6's rescaling
    (default: the HF config's, else 0); chat_template: overrides the one found (see `_chat_template`).
    Returns the path."""
    if type not in _OUTTYPES:
        raise ValueError(f"type {type!r}: expected one of {sorted(_OUTTYPES)} (llama.cpp's --outtype)")
    qtype, file_type = _OUTTYPES[type]
    quant = None
    if quantize is not None:
        quant = GGMLType[quantize.upper()]
        file_type = _QUANT_FILE_TYPE.get(quantize.lower(), file_type)
    sd, cfg, src_dir, src_name = read_state_dict(src)
    version = detect_version(sd)
    hp = hparams(sd, version, cfg, rescale_every=rescale_every)
    tensors = {}
    for n, x in gguf_tensors(sd, version, hp):
        tensors[n] = _store(n, x, _outtype(n, x, qtype), quant)
    n_params = sum(int(np.prod(t.shape)) for t in tensors.values())
    tokens, types = world_vocab(hp["n_vocab"], _find_vocab(vocab, src_dir))
    general = _general(ARCH[version], name or src_name, src_dir, n_params)
    md, vt = gguf_metadata(version, hp, file_type, tokens, types, chat_template or _chat_template(src_dir), general)
    return rgguf.save(out, md, tensors, value_types=vt)
