"""Tiny random RWKV state dicts (v4, v5.0, v5.1, v5.2, v6, v7) under BlinkDL's .pth tensor names, for tests.

    sd = tiny_state_dict("5.2", n_layer=2, n_embd=32, head_size=8, vocab=64, seed=0)   # name -> f32 ndarray
    path = write_tiny_rwkv(tmp / "tiny.pth", "6")        # .pth (needs torch), .safetensors or .npz

Names and shapes are those of BlinkDL's RWKV-LM training code (what ChatRWKV and the `rwkv` pip package load;
NumPy shapes, a linear layer's weight is (n_out, n_in) as in torch). C = n_embd, H = n_head, N = head_size,
F = n_ffn, V = vocab. Every version has

    emb.weight (V, C)   blocks.0.ln0.{weight,bias} (C,)   blocks.{i}.ln1/ln2.{weight,bias} (C,)
    ln_out.{weight,bias} (C,)   head.weight (V, C)

and per block, prefix `blocks.{i}.`:

    v4    att.time_mix_k/_v/_r (1, 1, C)   att.time_decay (C,)   att.time_first (C,)
          att.key/value/receptance/output.weight (C, C)
          ffn.time_mix_k/_r (1, 1, C)   ffn.key.weight (F, C)   ffn.receptance.weight (C, C)   ffn.value.weight (C, F)
    v5.x  v4's att and ffn tensors, with att.time_decay (H,) (5.0, 5.1) or (H, N) (5.2), the bonus as
          att.time_first (H,) stored as a log (5.0 here; u = exp(time_first)) or att.time_faaaa (H,) / (H, N)
          (5.1, 5.2; u as is), and att.ln_x.{weight,bias} (C,); 5.1 and 5.2 add att.time_mix_g (1, 1, C) and
          att.gate.weight (C, C)
    v6    att.time_maa_x/_w/_k/_v/_r/_g (1, 1, C)   att.time_maa_w1 (C, 5*D_MIX)   att.time_maa_w2 (5, D_MIX, C)
          att.time_decay (1, 1, C)   att.time_decay_w1 (C, D_DECAY)   att.time_decay_w2 (D_DECAY, C)
          att.time_faaaa (H, N)   att.receptance/key/value/gate/output.weight (C, C)   att.ln_x.{weight,bias} (C,)
          ffn.time_maa_k/_r (1, 1, C)   ffn.key.weight (F, C)   ffn.receptance.weight (C, C)   ffn.value.weight (C, F)
    v7    att.x_r/_w/_k/_v/_a/_g (1, 1, C)   att.w0/a0/v0 (1, 1, C)   att.w1 (C, D_W)  att.w2 (D_W, C)
          att.a1 (C, D_A)  att.a2 (D_A, C)   att.v1 (C, D_V)  att.v2 (D_V, C)   att.g1 (C, D_G)  att.g2 (D_G, C)
          att.k_k/k_a (1, 1, C)   att.r_k (H, N)   att.receptance/key/value/output.weight (C, C)
          att.ln_x.{weight,bias} (C,)   ffn.x_k (1, 1, C)   ffn.key.weight (F, C)   ffn.value.weight (C, F)
          (v0/v1/v2 exist in every block; the value residual ignores block 0's, as BlinkDL's files have them)

Values are drawn to look like trained weights rather than initialisations: decays spread over the range
trained models use (v4 time_decay in [-6, 3], so w = -exp(.) spans 0.0025 .. 20; v5 time_decay in [-7, 1],
w = exp(-exp(.)) in 0.066 .. 0.999; v6 time_decay in [-7, 1] plus its LoRA; v7 w0 in [-7, 1]), bonuses of
both signs, mixing coefficients in [0, 1], norm gains spread around 1 (0.5 .. 1.6) with non-zero biases,
matrices with 1/sqrt(fan_in) rows. The same arguments always give the same values (numpy's PCG64).
"""
from __future__ import annotations

import pathlib

import numpy as np

VERSIONS = ("4", "5.0", "5.1", "5.2", "6", "7")


def tiny_state_dict(version: str, *, n_layer: int = 2, n_embd: int = 32, head_size: int = 16, vocab: int = 64,
                    n_ffn: int | None = None, lora: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    """A random state dict of RWKV `version` ("4", "5.0", "5.1", "5.2", "6", "7"), every tensor float32.

    head_size is ignored for v4 (no heads); n_ffn defaults to 4*n_embd (v4, v5, v7) or int(3.5*n_embd)//32*32
    (v6, as RWKV-LM); lora is the rank of every v6/v7 low-rank (LoRA) projection.
    """
    version = str(version)
    if version not in VERSIONS:
        raise ValueError(f"version {version!r}: one of {VERSIONS}")
    if version != "4" and n_embd % head_size:
        raise ValueError(f"head_size {head_size} does not divide n_embd {n_embd}")
    C, V, H, N = n_embd, vocab, n_embd // head_size, head_size
    F = n_ffn or (max(32, int(3.5 * C) // 32 * 32) if version == "6" else 4 * C)
    rng = np.random.default_rng(seed)

    def f32(x):
        return np.ascontiguousarray(x, dtype=np.float32)

    def mat(n_out, n_in, gain=1.0):
        return f32(rng.standard_normal((n_out, n_in)) * (gain / np.sqrt(n_in)))

    def uni(lo, hi, *shape):
        return f32(rng.uniform(lo, hi, shape))

    def spread(lo, hi, *shape):
        """every value of [lo, hi] covered: a shuffled even grid plus jitter (a few values, still the range)"""
        n = int(np.prod(shape))
        grid = np.linspace(lo, hi, n) + rng.uniform(-0.5, 0.5, n) * (hi - lo) / max(n, 1)
        return f32(np.clip(rng.permutation(grid), lo, hi).reshape(shape))

    def ln(prefix):
        return {prefix + ".weight": uni(0.5, 1.6, C), prefix + ".bias": f32(rng.normal(0, 0.2, C))}

    def mix(*shape):
        return uni(0.0, 1.0, 1, 1, C) if not shape else uni(0.0, 1.0, *shape)

    sd = {"emb.weight": f32(rng.standard_normal((V, C)))}
    sd.update(ln("blocks.0.ln0"))
    for i in range(n_layer):
        b, a, f = f"blocks.{i}.", f"blocks.{i}.att.", f"blocks.{i}.ffn."
        sd.update(ln(b + "ln1"))
        sd.update(ln(b + "ln2"))
        if version == "4":
            sd.update({a + "time_mix_k": mix(), a + "time_mix_v": mix(), a + "time_mix_r": mix(),
                       a + "time_decay": spread(-6.0, 3.0, C), a + "time_first": uni(-2.0, 2.0, C)})
        elif version.startswith("5"):
            sd.update({a + "time_mix_k": mix(), a + "time_mix_v": mix(), a + "time_mix_r": mix()})
            if version == "5.2":
                sd[a + "time_decay"] = spread(-7.0, 1.0, H, N)
                sd[a + "time_faaaa"] = uni(-0.5, 1.0, H, N)
            else:
                sd[a + "time_decay"] = spread(-7.0, 1.0, H)
                if version == "5.0":
                    sd[a + "time_first"] = uni(-3.0, 0.5, H)         # a log: the model uses exp(time_first)
                else:
                    sd[a + "time_faaaa"] = uni(-0.5, 1.0, H)
            if version != "5.0":
                sd[a + "time_mix_g"] = mix()
                sd[a + "gate.weight"] = mat(C, C)
            sd.update(ln(a + "ln_x"))
        elif version == "6":
            sd.update({a + f"time_maa_{c}": mix() for c in "xwkvrg"})
            sd.update({a + "time_maa_w1": f32(rng.normal(0, 1 / np.sqrt(C), (C, 5 * lora))),
                       a + "time_maa_w2": f32(rng.normal(0, 0.3, (5, lora, C)) / np.sqrt(lora)),
                       a + "time_decay": spread(-7.0, 1.0, 1, 1, C),
                       a + "time_decay_w1": f32(rng.normal(0, 1 / np.sqrt(C), (C, lora))),
                       a + "time_decay_w2": f32(rng.normal(0, 1.0, (lora, C)) / np.sqrt(lora)),
                       a + "time_faaaa": uni(-0.5, 1.0, H, N), a + "gate.weight": mat(C, C)})
            sd.update(ln(a + "ln_x"))
        else:
            sd.update({a + f"x_{c}": mix() for c in "rwkvag"})
            for p, lo, hi, g in (("w", -7.0, 1.0, 1.0), ("a", -1.5, 1.5, 1.0), ("v", -1.0, 2.0, 1.0)):
                sd[a + p + "0"] = spread(lo, hi, 1, 1, C)
                sd[a + p + "1"] = f32(rng.normal(0, 1 / np.sqrt(C), (C, lora)))
                sd[a + p + "2"] = f32(rng.normal(0, g, (lora, C)) / np.sqrt(lora))
            sd.update({a + "g1": f32(rng.normal(0, 1 / np.sqrt(C), (C, lora))),
                       a + "g2": f32(rng.normal(0, 1.0, (lora, C)) / np.sqrt(lora)),
                       a + "k_k": uni(0.5, 1.2, 1, 1, C), a + "k_a": uni(0.2, 1.5, 1, 1, C),
                       a + "r_k": f32(rng.normal(0, 0.5, (H, N)))})
            sd.update(ln(a + "ln_x"))
        sd.update({a + "key.weight": mat(C, C), a + "value.weight": mat(C, C),
                   a + "receptance.weight": mat(C, C), a + "output.weight": mat(C, C)})
        if version == "7":
            sd[f + "x_k"] = mix()
        elif version == "6":
            sd.update({f + "time_maa_k": mix(), f + "time_maa_r": mix()})
        else:
            sd.update({f + "time_mix_k": mix(), f + "time_mix_r": mix()})
        sd.update({f + "key.weight": mat(F, C), f + "value.weight": mat(C, F)})
        if version != "7":
            sd[f + "receptance.weight"] = mat(C, C)
    sd.update(ln("ln_out"))
    sd["head.weight"] = mat(V, C, gain=2.0)
    return sd


def write_tiny_rwkv(path, version: str = "4", state_dict: dict | None = None, **kwargs) -> pathlib.Path:
    """Write `state_dict` (default: tiny_state_dict(version, **kwargs)) to `path`: .pth through torch.save
    (tensors only, loadable with weights_only=True), .safetensors through the safetensors package, or .npz."""
    path = pathlib.Path(path)
    sd = state_dict if state_dict is not None else tiny_state_dict(version, **kwargs)
    if path.suffix == ".pth":
        import torch
        torch.save({k: torch.from_numpy(np.array(v, np.float32)) for k, v in sd.items()}, path)
    elif path.suffix == ".safetensors":
        from safetensors.numpy import save_file
        save_file({k: np.ascontiguousarray(v) for k, v in sd.items()}, str(path))
    elif path.suffix == ".npz":
        np.savez(path, **sd)
    else:
        raise ValueError(f"{path}: write .pth, .safetensors or .npz")
    return path


# -- rwkv.cpp's own file format ------------------------------------------------------------------------------

RWKV_CPP_MAGIC = 0x67676D66
RWKV_CPP_CODES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 7, "Q5_1": 8, "Q8_0": 9, "Q8_1": 10,
                  "Q2_K": 11, "Q3_K": 12, "Q4_K": 13, "Q5_K": 14, "Q6_K": 15, "Q8_K": 16}


def rwkv_cpp_tensors(sd: dict) -> dict:
    """A BlinkDL state dict as rwkv.cpp's converter stores it (its python/convert_pytorch_to_ggml.py, as the
    module doc of refimpl.models.rwkv.rwkv_cpp tables it): every `.time_*` tensor squeezed; v4's time_decay
    as -exp(w); v5's time_decay as exp(-exp(w)) and time_first as exp(u), (H, 1, 1) or (H, N, 1), time_faaaa
    (H, N, 1) or (H, 1, 1); v6's time_maa_w1 / time_decay_w1 / time_decay_w2 transposed, time_maa_w2's last two
    axes swapped, time_decay and time_faaaa (H, N, 1); v7's x_r .. x_g stacked as att.x_rwkvag (6, 1, C) and
    its {w,a,v,g}{1,2} transposed. The exponentials in f64, rounded once to f32, as the converter does."""
    names = list(sd)
    v7 = any(k.endswith(".att.k_k") for k in names)
    v6 = any(k.endswith(".att.time_maa_x") for k in names)
    v5 = not (v6 or v7) and any(k.endswith(".att.ln_x.weight") for k in names)
    f32 = lambda x: np.ascontiguousarray(x, dtype=np.float32)            # noqa: E731
    out: dict = {}
    for k, x in sd.items():
        x = np.asarray(x, np.float32)
        a = k.rsplit(".", 1)[0] + "."
        if v7 and k.endswith(tuple(f".att.x_{c}" for c in "rwkvag")):
            if k.endswith(".att.x_r"):
                out[a + "x_rwkvag"] = f32(np.stack([np.asarray(sd[a + f"x_{c}"]).reshape(1, -1) for c in "rwkvag"]))
        elif v7 and any(k.endswith(f".att.{p}{i}") for p in "wavg" for i in "12"):
            out[k] = f32(x.T)
        elif v6 and k.endswith((".att.time_maa_w1", ".att.time_decay_w1", ".att.time_decay_w2")):
            out[k] = f32(x.T)
        elif v6 and k.endswith(".att.time_maa_w2"):
            out[k] = f32(np.swapaxes(x, 1, 2))
        elif v6 and k.endswith((".att.time_decay", ".att.time_faaaa")):
            H, N = np.asarray(sd[a + "time_faaaa"]).shape
            out[k] = f32(x.reshape(H, N, 1))
        elif v5 and k.endswith(".att.time_decay"):
            out[k] = f32(np.exp(-np.exp(x.astype(np.float64))).reshape(x.shape[0], -1, 1))
        elif v5 and k.endswith(".att.time_first"):
            out[k] = f32(np.exp(x.astype(np.float64)).reshape(x.shape[0], -1, 1))
        elif v5 and k.endswith(".att.time_faaaa"):
            out[k] = f32(x.reshape(x.shape[0], -1, 1))
        elif not (v5 or v6 or v7) and k.endswith(".att.time_decay"):
            out[k] = f32(-np.exp(x.astype(np.float64)))
        elif ".time_" in k:
            out[k] = f32(np.squeeze(x))
        else:
            out[k] = x
    return out


def write_rwkv_cpp(path, tensors: dict, *, version: int = 101, n_layer: int | None = None,
                   data_type: int = 0) -> pathlib.Path:
    """An rwkv.cpp model file as its writer lays it out: the 24-byte header (magic, version, n_vocab, n_embed,
    n_layer, data_type), then per tensor dim_count, key_length, data_type, ne (fastest first), the name and the
    data. `tensors`: rwkv.cpp's stored names and layouts (rwkv_cpp_tensors), f32 / f16 arrays or QTensors."""
    import struct

    from refimpl import QTensor
    path = pathlib.Path(path)
    V, C = np.shape(tensors["emb.weight"])
    L = n_layer if n_layer is not None else len({k.split(".")[1] for k in tensors if k.startswith("blocks.")})
    out = [struct.pack("<6I", RWKV_CPP_MAGIC, version, V, C, L, data_type)]
    for name, x in tensors.items():
        if isinstance(x, QTensor):
            code, raw = RWKV_CPP_CODES[x.type.name.upper()], np.ascontiguousarray(x.data)
        else:
            code, raw = (0 if x.dtype == np.float32 else 1), np.ascontiguousarray(x)
        ne = tuple(reversed(np.shape(x)))
        key = name.encode()
        out.append(struct.pack(f"<3I{len(ne)}I", len(ne), len(key), code, *ne) + key + raw.tobytes())
    path.write_bytes(b"".join(out))
    return path
