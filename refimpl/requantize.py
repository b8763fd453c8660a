"""GGUF -> GGUF requantization: `refimpl quantize IN.gguf OUT.gguf TYPE [--all]`.

    from refimpl.requantize import requantize
    report = requantize("minilm-f32.gguf", "minilm-q8_0.gguf", "q8_0")   # one Entry per tensor

Every weight matrix (a tensor of 2 or more dims) is converted to TYPE with `refimpl.quantize`, ggml's
`ggml_quantize_chunk` without importance matrix (bit-exact with ggml; F16 is NumPy's round-to-nearest-even
cast, as ggml's). What stays as it is, bytes copied:

  - 1-D tensors (norm gains, biases): ggml's add/mul read their second operand as f32, so a quantized 1-D
    tensor could not be used; this holds with --all too;
  - what the architecture's keep policy names (`KEEP_POLICIES`, by `general.architecture`); the default
    policy keeps the embeddings (token_embd, position_embd, token_types) and any `*_norm*` tensor. --all
    sets the policy aside: the embeddings are quantized as well;
  - a matrix whose rows (ne0) are not a whole number of TYPE's blocks, with a note;
  - a tensor already of TYPE.

A source tensor in a block format is dequantized (exactly, ggml's to_float) before it is quantized again, with a
warning: the result carries both roundings. F16/BF16 sources widen to f32 exactly, silently. The metadata is
copied with its types; `general.file_type` becomes TYPE's llama_ftype (the "mostly TYPE" value; for the K types
the _M variant, e.g. q4_K -> MOSTLY_Q4_K_M 15, as every matrix gets the one type here).

A keep policy is `policy(name, shape) -> str | None`: a reason to keep the tensor (shown in the report) or None to
quantize it. Register one for another architecture with

    @register_keep_policy("rwkv6")
    def rwkv_keep(name, shape): ...
"""
from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import gguf
from .qtensor import QTensor, dequantize, quantize
from .types import GGMLType, as_type, traits
from .progress import progress

__all__ = ["Entry", "KEEP_POLICIES", "register_keep_policy", "keep_policy", "default_keep", "file_type",
           "requantize"]

KeepPolicy = Callable[[str, tuple], "str | None"]
KEEP_POLICIES: dict[str, KeepPolicy] = {}

EMBEDDINGS = ("token_embd.weight", "position_embd.weight", "token_types.weight")


def register_keep_policy(arch: str, policy: KeepPolicy | None = None):
    """Register `policy` for `general.architecture == arch` (usable as a decorator)."""
    def put(fn: KeepPolicy) -> KeepPolicy:
        KEEP_POLICIES[arch] = fn
        return fn
    return put(policy) if policy is not None else put


def default_keep(name: str, shape: tuple) -> str | None:
    """Keep the embeddings (token_embd, position_embd, token_types) and norms; quantize other matrices."""
    if name in EMBEDDINGS:
        return "embedding"
    if "_norm" in name:
        return "norm"
    return None


def keep_policy(arch: str | None) -> KeepPolicy:
    return KEEP_POLICIES.get(arch or "", default_keep)


register_keep_policy("bert", default_keep)
register_keep_policy("llama", default_keep)

_RWKV_PROJECTIONS = ("time_mix_key.weight", "time_mix_value.weight", "time_mix_receptance.weight",
                     "time_mix_gate.weight", "time_mix_output.weight")


def rwkv_keep(name: str, shape: tuple) -> str | None:
    """RWKV 6/7: as the RWKV authors ask (and llama.cpp's quantizer does), only the projection matrices
    (time-mix key/value/receptance/gate/output, channel-mix key/value/receptance) and the head are quantized;
    the embedding, norms, decays, bonuses, token-shift mixes and the small LoRA factors stay as they are."""
    if name in EMBEDDINGS or "_norm" in name:
        return default_keep(name, shape)
    if "time_mix_" in name and not name.endswith(_RWKV_PROJECTIONS):
        return "RWKV mixing/decay parameter"
    return None


register_keep_policy("rwkv6", rwkv_keep)
register_keep_policy("rwkv7", rwkv_keep)


# llama_ftype of a file whose matrices are all of one type (gguf.LlamaFileType values)
_FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q2_K": 10, "q3_K": 12,
               "q4_K": 15, "q5_K": 17, "q6_K": 18, "iq2_xxs": 19, "iq2_xs": 20, "iq3_xxs": 23, "iq1_s": 24,
               "iq4_nl": 25, "iq3_s": 26, "iq2_s": 28, "iq4_xs": 30, "iq1_m": 31, "bf16": 32, "tq1_0": 36,
               "tq2_0": 37}


def file_type(t) -> int:
    """general.file_type (llama_ftype) for a file whose matrices are of ggml type `t`."""
    name = traits(t).name
    if name not in _FILE_TYPES:
        raise ValueError(f"no llama_ftype for {name}")
    return _FILE_TYPES[name]


@dataclass(frozen=True)
class Entry:
    """What happened to one tensor: from_type -> to_type, and why when it was kept."""
    name: str
    from_type: str
    to_type: str
    note: str = ""


def _convert(x, t: GGMLType):
    x = dequantize(x) if isinstance(x, QTensor) else np.asarray(x, dtype=np.float32)
    if t == GGMLType.F32:
        return np.ascontiguousarray(x, dtype=np.float32)
    if t == GGMLType.F16:
        return np.ascontiguousarray(x.astype(np.float16))
    return quantize(x, t)


def requantize(src, dst, type, *, all: bool = False, log=None) -> list[Entry]:  # noqa: A002 (CLI's --all)
    """Write `src` (a GGUF file) to `dst` with its weight matrices of ggml type `type`; returns the report.

    all: quantize the embeddings too (the keep policy is not consulted; 1-D tensors still stay).
    log: callable(str) for the notes (default: print to stderr).
    """
    everything = all
    log = log or (lambda s: print(s, file=sys.stderr))
    t = as_type(type)
    tr = traits(t)
    from .quants import QUANTIZERS
    if t not in (GGMLType.F32, GGMLType.F16) and not any(q == t for q, _ in QUANTIZERS):
        raise ValueError(f"refimpl cannot quantize to {tr.name} (no reference quantizer)")
    f = gguf.load(src)
    policy = keep_policy(f.arch)
    tensors: dict = {}
    report: list[Entry] = []
    for name, x in progress(f.tensors.items(), total=len(f.tensors), desc=f"quantizing to {tr.name}",
                            unit="tensor"):
        info = f.tensor_info[name]
        st = traits(info.type)
        reason = None
        if len(info.ne) < 2 or int(np.prod(info.ne[1:])) == 1:
            reason = "1-D"
        elif not everything:
            reason = policy(name, tuple(x.shape))
        if reason is None and info.type == t:
            reason = f"already {tr.name}"
        if reason is None and info.ne[0] % tr.blck_size:
            reason = f"rows of {info.ne[0]} are not whole {tr.name} blocks of {tr.blck_size}"
            log(f"refimpl quantize: {name}: {reason}; kept as {st.name}")
        if reason is not None:
            tensors[name] = x
            report.append(Entry(name, st.name, st.name, reason))
            continue
        if st.is_quantized:
            warnings.warn(f"{src}: {name} is {st.name}; dequantized before quantizing to {tr.name} (both roundings "
                          f"remain)", stacklevel=2)
        tensors[name] = _convert(x, t)
        report.append(Entry(name, st.name, tr.name))
    md = dict(f.metadata)
    vt = dict(f.value_types)
    md["general.file_type"] = file_type(t)
    vt["general.file_type"] = gguf.GGUFValueType.UINT32
    gguf.save(dst, md, tensors, value_types=vt, alignment=f.alignment)
    return report
