"""rwkv.cpp's own model files (`.bin`, magic 'ggmf') as an RwkvModel.

    model = rwkv.load("tiny-rwkv-5v2-730K-Q5_1.bin")     # quantized matrices stay QTensors, memory-mapped

The format (rwkv.cpp's rwkv_file_format.inc; all fields little-endian uint32):

    header   magic 0x67676d66, version (100 or 101), n_vocab, n_embed, n_layer, data_type
    tensors  until the end of the file, each: dim_count (1..3), key_length, data_type, ne0 [, ne1 [, ne2]],
             the name (key_length bytes of UTF-8), then the data (ggml's row size of ne0 x ne1 x ne2)

data_type numbers rwkv.cpp's types: 0 FP32, 1 FP16, 2 Q4_0, 3 Q4_1, 4 Q4_1_O, 5 Q4_2, 6 Q4_3 (those three
removed from rwkv.cpp: refused), 7 Q5_0, 8 Q5_1, 9 Q8_0, 10 Q8_1, 11 Q2_K .. 16 Q8_K. ggml's ne is the NumPy
shape reversed, as everywhere in refimpl. Version 100 files hold quantized data in ggml's old block layouts,
which rwkv.cpp refuses to read: so does this. rwkv.cpp's quantizer quantizes 2-D tensors other than the
embedding, the head and RWKV-7's LoRA factors and r_k; any tensor of any listed type is read here.

rwkv.cpp's converter (python/convert_pytorch_to_ggml.py) rewrites a BlinkDL checkpoint; this undoes it, so
the model is the one the .pth route gives and v4.py .. v7.py run it unchanged (C = n_embd, H = n_head,
N = head_size, NumPy shapes):

    every `.time_*` tensor        squeezed                                  (1, 1, C) -> (C,)
    v4    att.time_decay          -exp(w)                                   w = log(-x)
    v5    att.time_decay          exp(-exp(w)), (H, 1, 1) / 5.2: (H, N, 1)  w = log(-log(x)), (H,) / (H, N)
          att.time_first          exp(u) (H, 1, 1)                          u = log(x), (H,)
          att.time_faaaa          (H, N, 1)                                 (H, N)
    v6    att.time_maa_w1, time_decay_w1, time_decay_w2   transposed        transposed back
          att.time_maa_w2         (5, C, D): the last two axes swapped      swapped back (5, D, C)
          att.time_decay          (H, N, 1), raw                            (C,)
          att.time_faaaa          (H, N, 1)                                 (H, N)
    v7    att.x_rwkvag            att.x_r, x_w, x_k, x_v, x_a (, x_g) stacked (n, 1, C)   split: (1, 1, C) each
          att.{w,a,v,g}{1,2}      transposed                                transposed back

One thing is rwkv.cpp's graph rather than its file: v5's ln_x eps is 1e-5 (`V5_LN_X_EPS`), set in the
hyper-parameters. The logs are f64 rounded once to f32: refimpl's exp then gives back rwkv.cpp's stored values
to within an ulp or two (the tolerance table's "rwkv.cpp" entries hold the measured logits). A transposed factor that
rwkv.cpp's quantizer quantized (v6's time_maa_w1 and time_decay_w*) is dequantized first. Every size is
checked against the file before anything is read: a damaged file is an RWKVError naming it and the tensor.
"""
from __future__ import annotations

import dataclasses
import mmap
import pathlib
import struct

import numpy as np

from ...errors import RWKVError
from ...qtensor import QTensor, dequantize
from ...types import GGMLType, traits
from .model import RwkvModel

MAGIC = 0x67676D66
FILE_VERSIONS = (100, 101)
# rwkv.cpp's enum rwkv_type -> ggml type; None: a format rwkv.cpp removed
TYPES: dict[int, GGMLType | None] = {
    0: GGMLType.F32, 1: GGMLType.F16, 2: GGMLType.Q4_0, 3: GGMLType.Q4_1, 4: None, 5: None, 6: None,
    7: GGMLType.Q5_0, 8: GGMLType.Q5_1, 9: GGMLType.Q8_0, 10: GGMLType.Q8_1, 11: GGMLType.Q2_K,
    12: GGMLType.Q3_K, 13: GGMLType.Q4_K, 14: GGMLType.Q5_K, 15: GGMLType.Q6_K, 16: GGMLType.Q8_K}
TYPE_NAMES = ("FP32", "FP16", "Q4_0", "Q4_1", "Q4_1_O", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
              "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K")
MAX_NAME = 1024                       # longer than any tensor name rwkv.cpp writes
# rwkv.cpp's v5 graph (rwkv_att_v5) normalizes each head with eps 1e-5 on the WKV output itself, where
# RWKV-LM's GroupNorm sees it divided by head_size_divisor 8 (64e-5 without the division, refimpl's default);
# its expected logits are that graph's, so a v5 model read from its file runs with rwkv.cpp's eps
V5_LN_X_EPS = 1e-5


def is_rwkv_cpp(path) -> bool:
    """The file starts with rwkv.cpp's magic."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return len(head) == 4 and struct.unpack("<I", head)[0] == MAGIC


def read(path) -> tuple[dict, dict]:
    """(header dict, {name: ndarray or QTensor}) of an rwkv.cpp file, as stored (rwkv.cpp's names and
    layouts); the arrays are read-only views of the memory-mapped file."""
    path = pathlib.Path(path)
    with open(path, "rb") as f:
        size = path.stat().st_size
        if size < 24:
            raise RWKVError(f"{path}: {size} bytes, shorter than rwkv.cpp's 24-byte header", path)
        buf = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), np.uint8)
    magic, version, n_vocab, n_embed, n_layer, dtype = struct.unpack_from("<6I", buf, 0)
    if magic != MAGIC:
        raise RWKVError(f"{path}: not an rwkv.cpp model file (magic {magic:#010x}, expected 0x67676d66 'ggmf')",
                        path)
    if version not in FILE_VERSIONS:
        raise RWKVError(f"{path}: rwkv.cpp file version {version}; refimpl (as rwkv.cpp) reads 100 and 101", path)
    head = dict(version=version, n_vocab=n_vocab, n_embed=n_embed, n_layer=n_layer,
                data_type=_rwkv_type_name(dtype, path, "the header"))
    tensors: dict = {}
    off = 24
    while off < size:
        if size - off < 12:
            raise RWKVError(f"{path}: {size - off} stray bytes at the end (offset {off}), not a tensor header", path)
        n_dims, key_len, ttype = struct.unpack_from("<3I", buf, off)
        if n_dims not in (1, 2, 3):
            raise RWKVError(f"{path}: tensor at offset {off} has {n_dims} dimensions (rwkv.cpp writes 1 to 3)", path)
        if off + 12 + 4 * n_dims > size:
            raise RWKVError(f"{path}: the tensor header at offset {off} runs past the end of the file", path)
        ne = struct.unpack_from(f"<{n_dims}I", buf, off + 12)
        off += 12 + 4 * n_dims
        if not 0 < key_len <= MAX_NAME or off + key_len > size:
            raise RWKVError(f"{path}: tensor name of {key_len} bytes at offset {off} (at most {MAX_NAME}, inside "
                            "the file)", path)
        try:
            name = bytes(buf[off:off + key_len]).decode("utf-8")
        except UnicodeDecodeError:
            raise RWKVError(f"{path}: the tensor name at offset {off} is not UTF-8", path) from None
        off += key_len
        t = TYPES.get(ttype)
        if t is None:
            tn = _rwkv_type_name(ttype, path, name)
            raise RWKVError(f"{path}: tensor {name!r} has data type {tn}, which rwkv.cpp no longer reads "
                            "(requantize the model)", path)
        tr = traits(t)
        shape = tuple(int(n) for n in reversed(ne))           # NumPy order
        if ne[0] == 0 or ne[0] % tr.blck_size:
            raise RWKVError(f"{path}: tensor {name!r} ne {list(ne)} (numpy {shape}): ne0 must be a positive "
                            f"multiple of {tr.name}'s block of {tr.blck_size}", path)
        if tr.is_quantized and version == 100:
            raise RWKVError(f"{path}: tensor {name!r} is {tr.name} in a version-100 file: the old block layout, "
                            "which rwkv.cpp no longer reads (requantize the model)", path)
        row = ne[0] // tr.blck_size * tr.type_size
        nbytes = row * int(np.prod(ne[1:], dtype=np.int64))
        if off + nbytes > size:
            raise RWKVError(f"{path}: tensor {name!r} ({tr.name}, ne {list(ne)}, numpy {shape}) needs {nbytes} "
                            f"bytes at offset {off}; the file ends {size - off} bytes later", path)
        if name in tensors:
            raise RWKVError(f"{path}: tensor {name!r} appears twice", path)
        raw = buf[off:off + nbytes]
        if t == GGMLType.F32:
            tensors[name] = raw.view(np.float32).reshape(shape)
        elif t == GGMLType.F16:
            tensors[name] = raw.view(np.float16).reshape(shape)
        else:
            tensors[name] = QTensor(t, raw.reshape(shape[:-1] + (row,)), shape)
        off += nbytes
    return head, tensors


def _rwkv_type_name(code: int, path, what: str) -> str:
    if code >= len(TYPE_NAMES):
        raise RWKVError(f"{path}: {what} has data type {code}, outside rwkv.cpp's 0..{len(TYPE_NAMES) - 1}", path)
    return TYPE_NAMES[code]


def _f32(x) -> np.ndarray:
    return dequantize(x) if isinstance(x, QTensor) else np.asarray(x, np.float32)


def _log(x, where: str, path) -> np.ndarray:
    x = np.asarray(x, np.float64)
    if not np.all(x > 0):
        raise RWKVError(f"{path}: {where} must be positive as rwkv.cpp's converter writes it", path)
    return np.log(x)


def state_dict(path, tensors: dict | None = None) -> dict:
    """The BlinkDL state dict of an rwkv.cpp file (see the module doc): {name: ndarray or QTensor}."""
    if tensors is None:
        _, tensors = read(path)
    names = list(tensors)
    v7 = any(k.endswith(".att.k_k") for k in names)
    v6 = any(k.endswith(".att.time_maa_x") for k in names)
    v5 = any(k.endswith(".att.ln_x.weight") for k in names)
    sd: dict = {}
    for k, x in tensors.items():
        if v7 and k.endswith(".att.x_rwkvag"):
            a = _f32(x)
            base = k[: -len("x_rwkvag")]
            if a.shape[0] not in (5, 6):
                raise RWKVError(f"{path}: {k} stacks {a.shape[0]} mixes (numpy {a.shape}); rwkv.cpp writes 5 or 6",
                                path)
            for i, c in enumerate("rwkvag"[:a.shape[0]]):
                sd[base + f"x_{c}"] = a[i].reshape(1, 1, -1)
        elif v7 and any(k.endswith(f".att.{p}{i}") for p in "wavg" for i in "12"):
            f16 = isinstance(x, np.ndarray) and x.dtype == np.float16       # a transpose is exact: f16 stays
            sd[k] = np.ascontiguousarray(x.T if f16 else _f32(x).T)
        elif v6 and (k.endswith((".att.time_maa_w1", ".att.time_decay_w1", ".att.time_decay_w2"))):
            sd[k] = np.ascontiguousarray(_f32(x).T)
        elif v6 and k.endswith(".att.time_maa_w2"):
            sd[k] = np.ascontiguousarray(np.swapaxes(_f32(x), 1, 2))
        elif v6 and k.endswith(".att.time_decay"):
            sd[k] = _f32(x).reshape(-1)
        elif (v6 or v5) and k.endswith(".att.time_faaaa"):
            a = _f32(x)
            sd[k] = a.reshape(a.shape[0], -1)
        elif v5 and k.endswith(".att.time_decay"):
            a = _f32(x)
            w = np.log(-_log(a, k, path)).astype(np.float32) if np.all(a < 1) else None
            if w is None:
                raise RWKVError(f"{path}: {k} must lie in (0, 1) as rwkv.cpp's converter writes exp(-exp(w))", path)
            sd[k] = w.reshape(a.shape[0]) if a.size == a.shape[0] else w.reshape(a.shape[0], -1)
        elif v5 and k.endswith(".att.time_first"):
            sd[k] = _log(_f32(x), k, path).astype(np.float32).reshape(-1)
        elif not (v5 or v6 or v7) and k.endswith(".att.time_decay"):
            sd[k] = _log(-_f32(x), k + " (negated)", path).astype(np.float32).reshape(-1)
        else:
            sd[k] = x
    for a in sd.values():
        if isinstance(a, np.ndarray) and a.flags.owndata:
            a.flags.writeable = False               # a weight: read-only, as the mmap views are
    return sd


def load(path, *, tokenizer=None) -> RwkvModel:
    """An rwkv.cpp .bin file as an RwkvModel (the .pth route's names and layouts, quantized matrices as
    QTensors); the header's n_vocab, n_embed and n_layer must match the tensors."""
    head, tensors = read(path)
    return from_tensors(head, tensors, path, tokenizer=tokenizer)


def needs_quant(name: str, ndim: int) -> bool:
    """Whether rwkv.cpp's quantizer (rwkv_quantize_model_file) quantizes a stored tensor: the 2-D ones but the
    embedding, the head, RWKV-7's LoRA factors and r_k."""
    return ndim == 2 and name not in ("emb.weight", "head.weight") and not any(
        f"att.{p}" in name for p in ("v1", "v2", "g1", "g2", "a1", "a2", "w1", "w2", "r_k"))


def from_tensors(head: dict, tensors: dict, path="rwkv.cpp tensors", *, tokenizer=None) -> RwkvModel:
    """`load` on what `read` returns (a header dict and the stored tensors, e.g. requantized)."""
    from .checkpoint import hparams_from_state_dict
    sd = state_dict(path, tensors)
    try:
        hp = hparams_from_state_dict(sd, where=str(path))
    except ValueError as e:
        raise RWKVError(str(e), path) from e
    got = dict(n_vocab=hp.vocab, n_embed=hp.n_embd, n_layer=hp.n_layer)
    bad = {k: (head[k], v) for k, v in got.items() if head[k] != v}
    if bad:
        raise RWKVError(f"{path}: the header disagrees with the tensors: "
                        + ", ".join(f"{k} {h} in the header, {v} in the tensors" for k, (h, v) in bad.items()), path)
    if hp.variant.startswith("5"):
        hp = dataclasses.replace(hp, ln_x_eps=V5_LN_X_EPS)
    return RwkvModel(version=int(float(hp.variant)), hparams=hp, weights=sd, tokenizer=tokenizer, path=str(path))
