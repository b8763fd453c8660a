"""llama2.c checkpoints (karpathy/llama2.c's `export.py`) and its `tokenizer.bin`, run by `llama.forward`.

    model = load("stories15M.bin", "tokenizer.bin")       # a llama.LlamaModel; weights memory-mapped
    cache = llama.new_cache(model, n_ctx=256)
    logits = llama.forward(model, model.tokenizer.encode("Once upon a time"), cache)

A llama2.c model is a Llama: rmsnorm (eps 1e-5, run.c's `rmsnorm`) -> wq, wk, wv -> RoPE -> causal softmax
attention with scale 1/sqrt(head_size) and grouped K/V heads (query head h reads kv head h // (n_heads /
n_kv_heads)) -> wo -> residual -> rmsnorm -> w2(silu(w1 x) * w3 x) -> residual; final rmsnorm, then wcls.
run.c rotates ADJACENT pairs (q[i], q[i+1]) by pos * 10000^(-(i % head_size) / head_size): ggml's NORMAL
rope with n_dims = head_size and base 10000. So the hyper-parameters map onto `llama.HParams` (arch "llama",
rms_eps 1e-5, rope_base 10000, rope_mode NORMAL, n_rot = head_dim) and `llama.forward` runs it unchanged.

File layouts (little-endian, as export.py writes them with `struct`; all read here from a np.memmap):

    version 0 (legacy_export): 7 int32 `dim hidden_dim n_layers n_heads n_kv_heads vocab_size seq_len`
        (vocab_size < 0: the classifier is stored, |vocab_size| is the vocabulary), then f32:
        token_embedding_table, rms_att_weight, wq, wk, wv, wo, rms_ffn_weight, w1, w2, w3, rms_final_weight,
        freq_cis_real, freq_cis_imag (seq_len * head_size/2 each; unused), then wcls when not shared.
    version 1 (version1_export): uint32 magic 0x616b3432 ("ak42"), int32 version 1, the 7 int32,
        uint8 shared_classifier, zeros up to byte 256; then f32 with the NORMS FIRST:
        rms_att_weight, rms_ffn_weight, rms_final_weight, token_embedding_table, wq, wk, wv, wo, w1, w2, w3,
        then wcls when not shared. No freq_cis.
    version 2 (version2_export, read by runq.c): as version 1's header plus int32 group_size (at byte 37,
        unaligned), zeros up to 256; f32 rms_att_weight, rms_ffn_weight, rms_final_weight; then for
        token_embedding_table, each layer's wq, ..., each layer's wk, wv, wo, w1, w2, w3 and (not shared) wcls:
        int8 values q (numel), then f32 scales s (numel / group_size), x[i] = q[i] * s[i // group_size].
        Dequantized to f32 here at load (runq.c's `dequantize`, bit for bit). It is not a ggml type
        (Q8_0 has 32-element blocks with an f16 scale), so no QTensor; and unlike runq.c the activations
        are not quantized to int8 groups before each matmul, so logits differ from runq.c's by that rounding.

Every stacked weight is (n_layers, n_out, n_in) in NumPy order: PyTorch's nn.Linear.weight, which
export.py writes as is (run.c's `matmul(xout, x, w, n, d)` reads W as (d, n) rows). numpy shapes / ggml ne:

    token_embedding_table  (vocab, dim)                ne [dim, vocab]           -> token_embd
    rms_att_weight         (n_layers, dim)             per layer ne [dim]        -> attn_norm
    wq                     (n_layers, dim, dim)        ne [dim, dim]             -> attn_q   (n_head*head_dim = dim)
    wk, wv                 (n_layers, kv_dim, dim)     ne [dim, kv_dim]          -> attn_k, attn_v
    wo                     (n_layers, dim, dim)                                  -> attn_output
    rms_ffn_weight         (n_layers, dim)                                       -> ffn_norm
    w1, w3                 (n_layers, hidden_dim, dim) ne [dim, hidden_dim]      -> ffn_gate, ffn_up
    w2                     (n_layers, dim, hidden_dim) ne [hidden_dim, dim]      -> ffn_down
    rms_final_weight       (dim,)                                                -> output_norm
    wcls                   (vocab, dim)  (token_embedding_table when shared)     -> output

with kv_dim = n_kv_heads * head_size, head_size = dim / n_heads.

Malformed files raise `Llama2cError` (a ValueError) naming the file and the header field, weight or token
at fault, before anything is allocated: every header field is checked (positive, heads dividing dim, kv heads
dividing heads, an even head size, the shared_classifier flag 0 or 1, version 2's group_size dividing dim) and
the file size must equal exactly what the header implies (computed with Python integers, so huge fields cannot
overflow into a size that matches).

Verified against karpathy/llama2.c at 350e04f: export.py (legacy_export, version1_export, version2_export),
run.c (read_checkpoint, memory_map_weights, forward, build_tokenizer, encode, decode), runq.c
(read_checkpoint, memory_map_weights, init_quantized_tensors, dequantize) and tokenizer.py (export).
Note that run.c itself reads only version 0 and runq.c only version 2.
"""
from __future__ import annotations

import codecs
import heapq
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np

from ..errors import LoadError, looks_like
from ..ops.rope import ROPE_TYPE_NORMAL
from .llama import HParams, Layer, LlamaModel

MAGIC = 0x616B3432            # "ak42" read as a little-endian uint32
HEADER_BYTES = 256            # versions 1 and 2
CONFIG_FIELDS = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")
RMS_EPS = 1e-5                # run.c's rmsnorm: ss / size + 1e-5f
ROPE_BASE = 10000.0           # run.c: powf(10000.0f, head_dim / (float)head_size)

__all__ = ["Config", "Checkpoint", "read_checkpoint", "load", "hparams", "Llama2cTokenizer", "load_tokenizer",
           "is_gguf", "MAGIC", "Llama2cError"]


class Llama2cError(LoadError):
    """A malformed llama2.c checkpoint or tokenizer.bin. `path` is the file, `field` the header field, weight
    or token at fault (None when the whole file is, e.g. its size)."""

    def __init__(self, path, message: str, field: str | None = None):
        self.field = field
        super().__init__(f"{path}: {message}", path)


@dataclass(frozen=True)
class Config:
    """run.c's `Config`, vocab_size made positive (the sign of version 0's field is `shared_classifier`)."""
    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    seq_len: int

    @property
    def head_size(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_size


@dataclass
class Checkpoint:
    """A parsed llama2.c file: `tensors` maps llama2.c's TransformerWeights names to f32 arrays in file
    order (memory-mapped views for versions 0 and 1, dequantized copies of the int8 matrices for version 2;
    version 0 also lists the unused freq_cis_real / freq_cis_imag)."""
    path: str
    version: int
    config: Config
    shared_classifier: bool
    group_size: int | None
    tensors: dict = field(repr=False)
    file_size: int = 0


def is_gguf(path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def _bad(path, what: str, field: str | None = None) -> Llama2cError:
    return Llama2cError(path, what, field)


def _validate(path, cfg: dict, where: str) -> None:
    for name in CONFIG_FIELDS:
        v = cfg[name]
        if v <= 0:
            raise _bad(path, f"{where}{name} = {v}: must be positive", name)
    if cfg["dim"] % cfg["n_heads"]:
        raise _bad(path, f"{where}n_heads = {cfg['n_heads']} does not divide dim = {cfg['dim']}", "n_heads")
    if cfg["n_heads"] % cfg["n_kv_heads"]:
        raise _bad(path, f"{where}n_kv_heads = {cfg['n_kv_heads']} does not divide n_heads = {cfg['n_heads']}",
                   "n_kv_heads")
    if (cfg["dim"] // cfg["n_heads"]) % 2:
        raise _bad(path, f"{where}head size dim / n_heads = {cfg['dim'] // cfg['n_heads']} is odd: RoPE "
                         f"rotates pairs", "n_heads")


def _layout(c: Config, version: int, shared: bool) -> list[tuple[str, tuple]]:
    """(name, numpy shape) of every array in file order (version 2: the shape of the dequantized array)."""
    L, d, h, kv, v = c.n_layers, c.dim, c.hidden_dim, c.kv_dim, c.vocab_size
    emb = [("token_embedding_table", (v, d))]
    norms = [("rms_att_weight", (L, d)), ("rms_ffn_weight", (L, d)), ("rms_final_weight", (d,))]
    attn = [("wq", (L, d, d)), ("wk", (L, kv, d)), ("wv", (L, kv, d)), ("wo", (L, d, d))]
    ffn = [("w1", (L, h, d)), ("w2", (L, d, h)), ("w3", (L, h, d))]
    cls = [] if shared else [("wcls", (v, d))]
    if version == 0:
        rope = [("freq_cis_real", (c.seq_len, c.head_size // 2)), ("freq_cis_imag", (c.seq_len, c.head_size // 2))]
        return emb + [norms[0]] + attn + [norms[1]] + ffn + [norms[2]] + rope + cls
    return norms + emb + attn + ffn + cls


def read_checkpoint(path) -> Checkpoint:
    """Parse and validate a llama2.c checkpoint of version 0, 1 or 2; weights stay memory-mapped
    (version 2's int8 matrices are dequantized). Raises Llama2cError (a ValueError) naming the file and
    the field."""
    path = str(path)
    size = Path(path).stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(HEADER_BYTES)
    if head[:4] == b"GGUF":
        raise _bad(path, "is a GGUF file, not a llama2.c checkpoint; load it with refimpl.models.llama.load",
                   "magic")
    if size < 28:
        raise _bad(path, f"file size {size} bytes is too small for a llama2.c header (28 bytes at least)")
    magic = struct.unpack_from("<I", head, 0)[0]
    group_size = None
    if magic == MAGIC:
        if size < HEADER_BYTES:
            raise _bad(path, f"file size {size} bytes is smaller than the {HEADER_BYTES}-byte version 1/2 header")
        version = struct.unpack_from("<i", head, 4)[0]
        if version not in (1, 2):
            raise _bad(path, f"version = {version}: only llama2.c versions 0, 1 and 2 are known", "version")
        vals = dict(zip(CONFIG_FIELDS, struct.unpack_from("<7i", head, 8)))
        flag = head[36]
        if flag not in (0, 1):
            raise _bad(path, f"shared_classifier flag = {flag}: must be 0 or 1", "shared_classifier")
        shared = bool(flag)
        where = f"version {version} header field "
        _validate(path, vals, where)
        if version == 2:
            group_size = struct.unpack_from("<i", head, 37)[0]
            if group_size <= 0 or vals["dim"] % group_size:
                raise _bad(path, f"{where}group_size = {group_size}: must be positive and divide dim = "
                                 f"{vals['dim']}", "group_size")
        offset = HEADER_BYTES
    else:
        version = 0
        vals = dict(zip(CONFIG_FIELDS, struct.unpack_from("<7i", head, 0)))
        shared = vals["vocab_size"] > 0
        vals["vocab_size"] = abs(vals["vocab_size"])
        kind = looks_like(path)            # another format's file read as a legacy header: say which it is
        _validate(path, vals, f"no 'ak42' magic (read as a legacy version 0 header: first bytes {head[:8].hex()}"
                              + (f"; the file looks like {kind}" if kind else "") + "): ")
        offset = 28
    cfg = Config(**vals)
    layout = _layout(cfg, version, shared)

    def numel(shape):   # Python integers: a product of huge header fields must not wrap around
        return math.prod(shape)

    if version == 2:
        # norms (the first three) are f32; every other entry is q int8 + s f32, one pair per layer
        need = sum(4 * numel(s) for _, s in layout[:3])
        need += sum(numel(s) + 4 * numel(s) // group_size for _, s in layout[3:])
    else:
        need = sum(4 * numel(s) for _, s in layout)
    if size != offset + need:
        raise _bad(path, f"file size {size} bytes does not match the header: version {version} with "
                         f"{', '.join(f'{k}={v}' for k, v in vals.items())}, shared_classifier={shared}"
                         f"{f', group_size={group_size}' if group_size else ''} needs {offset + need} bytes"
                         f"{' (truncated?)' if size < offset + need else ''}")

    raw = np.memmap(path, dtype=np.uint8, mode="r")   # only now: every view below lies inside the file
    tensors = {}
    for k, (name, shape) in enumerate(layout):
        n = numel(shape)
        if version == 2 and k >= 3:
            L = shape[0] if name not in ("token_embedding_table", "wcls") else 1
            per = n // L
            out = np.empty(shape, np.float32)
            flat = out.reshape(L, per)
            for il in range(L):
                q = raw[offset:offset + per].view(np.int8)
                s = raw[offset + per:offset + per + 4 * (per // group_size)].view("<f4")
                # runq.c's dequantize: x[i] = q[i] * s[i / GS], one f32 product; a scale the file stores as
                # inf or NaN, or one so large the product overflows, gives the inf / NaN runq.c computes, as a
                # version 0/1 file's raw floats would be taken as they are: no warning for either
                with np.errstate(over="ignore", invalid="ignore"):
                    np.multiply(q.reshape(-1, group_size).astype(np.float32), s[:, None],
                                out=flat[il].reshape(-1, group_size))
                offset += per + 4 * (per // group_size)
            tensors[name] = out
        else:
            tensors[name] = raw[offset:offset + 4 * n].view("<f4").reshape(shape)
            offset += 4 * n
    if shared:
        tensors["wcls"] = tensors["token_embedding_table"]
    return Checkpoint(path, version, cfg, shared, group_size, tensors, size)


def hparams(cfg: Config) -> HParams:
    """llama.HParams for a llama2.c Config: run.c's constants (rmsnorm eps 1e-5, RoPE base 10000 on adjacent
    pairs over the whole head) are ggml's NORMAL rope with n_rot = head_dim."""
    return HParams(arch="llama", n_vocab=cfg.vocab_size, n_ctx_train=cfg.seq_len, n_embd=cfg.dim,
                   n_layer=cfg.n_layers, n_head=cfg.n_heads, n_head_kv=cfg.n_kv_heads, head_dim=cfg.head_size,
                   n_ff=cfg.hidden_dim, n_rot=cfg.head_size, rms_eps=RMS_EPS, rope_base=ROPE_BASE,
                   rope_freq_scale=1.0, rope_mode=ROPE_TYPE_NORMAL)


def load(checkpoint_path, tokenizer_path=None) -> LlamaModel:
    """A llama2.c checkpoint as a `llama.LlamaModel` that `llama.forward` / `llama.generate` run.

    tokenizer_path: llama2.c's tokenizer.bin; None looks for `tokenizer.bin` beside the checkpoint (as
    run.c defaults to ./tokenizer.bin) and leaves `model.tokenizer` None when there is none."""
    ck = read_checkpoint(checkpoint_path)
    t = ck.tensors
    layers = [Layer(attn_norm=t["rms_att_weight"][i], attn_q=t["wq"][i], attn_k=t["wk"][i], attn_v=t["wv"][i],
                    attn_output=t["wo"][i], ffn_norm=t["rms_ffn_weight"][i], ffn_gate=t["w1"][i],
                    ffn_up=t["w3"][i], ffn_down=t["w2"][i])
              for i in range(ck.config.n_layers)]
    if tokenizer_path is None:
        beside = Path(ck.path).parent / "tokenizer.bin"
        tokenizer_path = beside if beside.is_file() and beside.resolve() != Path(ck.path).resolve() else None
    tok = load_tokenizer(tokenizer_path, ck.config.vocab_size) if tokenizer_path is not None else None
    meta = {"general.architecture": "llama", "general.file_type": f"llama2.c v{ck.version}",
            "llama2c.version": ck.version, "llama2c.shared_classifier": ck.shared_classifier,
            "llama2c.group_size": ck.group_size, "llama.context_length": ck.config.seq_len}
    return LlamaModel(hparams(ck.config), t["token_embedding_table"], t["rms_final_weight"], t["wcls"], layers,
                      tok, meta, ck.path)


# ---------------------------------------------------------------------------------------------
# tokenizer.bin

_BYTE_PIECE = re.compile(rb"<0x([0-9A-Fa-f]{2})>")
_NO_MERGE = float(np.float32(-1e10))     # run.c's initial best_score: a merge must score strictly above it


class Llama2cTokenizer:
    """llama2.c's tokenizer.bin with run.c's encode / decode, behind the GGUF tokenizer's interface.

    File: uint32 max_token_length, then per token: f32 score, int32 length, the bytes (export.py writes
    SentencePiece pieces with U+2581 replaced by a space, BOS as "\\n<s>\\n", EOS as "\\n</s>\\n"). The
    number of tokens is not stored: it is the checkpoint's vocab_size (checked when given).

    encode(text, add_special=True) is run.c's `encode(t, text, bos=add_special, eos=0)`:
      1. BOS (1) if add_special; then, unless text is empty, the token whose piece is " " (the dummy prefix);
      2. every UTF-8 character (a lead byte and at most 3 continuation bytes) whose bytes are a piece becomes
         that token, else one token per byte with id byte + 3 (the <0xXX> tokens sit at ids 3..258);
      3. repeatedly merge the adjacent pair whose concatenated pieces are a token with the highest score
         (leftmost on ties; only scores > -1e10 merge) until no pair merges. The sequence includes BOS.
      Here step 3 runs with a heap (O(n log n)) instead of run.c's full rescans; same result. Where the
      vocabulary has one piece twice, the lower id is taken (run.c's bsearch returns either).
    decode follows run.c's `decode(prev, token)`: a piece following BOS loses one leading space, and a piece
    "<0xXX>" is that byte. ids 0, 1, 2 (unk, BOS, EOS) are control tokens that render as nothing unless
    special=True (so decode(encode(s)) == s; run.c never prints BOS, generation stops before EOS's).

    eot_id is BOS: run.c's generate ends at BOS (1), the delimiter of its training sequences, and
    llama.generate stops at eos_id and eot_id. eog_ids = {BOS, EOS}.
    """

    model = "llama2c"

    def __init__(self, pieces: list[bytes], scores, max_token_length: int, path: str = ""):
        self.pieces = list(pieces)
        self.scores = np.asarray(scores, np.float32)
        self.n_vocab = len(self.pieces)
        self.max_token_length = max_token_length
        self.path = path
        self.tokens = [p.decode("utf-8", "replace") for p in self.pieces]
        self.unk_id, self.bos_id, self.eos_id = 0, 1, 2
        self.eot_id = self.bos_id
        self.eom_id = self.pad_id = None
        self.eog_ids = frozenset({self.bos_id, self.eos_id})
        self.add_bos, self.add_eos, self.add_space_prefix = True, False, True
        self.chat_template = None
        self.token_to_id: dict[bytes, int] = {}
        for i, p in enumerate(self.pieces):
            self.token_to_id.setdefault(p, i)
        self._score = [float(s) for s in self.scores]
        self._bytes: list[int | None] = [None] * self.n_vocab
        for i, p in enumerate(self.pieces):
            m = _BYTE_PIECE.fullmatch(p)
            if m:
                self._bytes[i] = int(m.group(1), 16)

    def __repr__(self):
        return f"Llama2cTokenizer(n_vocab={self.n_vocab}, max_token_length={self.max_token_length}, path={self.path!r})"

    # ---- encoding -----------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        data = text.encode("utf-8", "surrogateescape")
        ids = [self.bos_id] if add_special else []
        if data:
            sp = self.token_to_id.get(b" ")
            if sp is None:
                raise ValueError(f"{self.path or 'tokenizer'}: no ' ' token for llama2.c's dummy prefix")
            ids.append(sp)
        n, i = len(data), 0
        while i < n:
            j = i + 1            # one character: this byte and the continuation bytes after it, 4 bytes at most
            while j < n and data[j] & 0xC0 == 0x80 and j - i < 4:
                j += 1
            tid = self.token_to_id.get(data[i:j])
            if tid is not None:
                ids.append(tid)
            else:
                for b in data[i:j]:
                    if b + 3 >= self.n_vocab:
                        raise ValueError(f"{self.path or 'tokenizer'}: byte fallback token {b + 3} for byte "
                                         f"0x{b:02X} is outside the vocabulary ({self.n_vocab} tokens)")
                    ids.append(b + 3)
            i = j
        return self._merge(ids)

    def _merge(self, ids: list[int]) -> list[int]:
        """run.c's merge loop: best-scoring adjacent pair first, leftmost on ties."""
        sym, n = list(ids), len(ids)
        nxt = list(range(1, n)) + [-1]
        prv = list(range(-1, n - 1))
        heap: list = []

        def push(left: int, right: int):
            if left < 0 or right < 0:
                return
            tid = self.token_to_id.get(self.pieces[sym[left]] + self.pieces[sym[right]])
            if tid is not None and self._score[tid] > _NO_MERGE:
                heapq.heappush(heap, (-self._score[tid], left, right, sym[left], sym[right], tid))

        for k in range(n - 1):
            push(k, k + 1)
        while heap:
            _, left, right, a, b, tid = heapq.heappop(heap)
            if nxt[left] != right or sym[left] != a or sym[right] != b:
                continue                               # stale: one side has been merged since
            sym[left], sym[right] = tid, -1
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            push(prv[left], left)
            push(left, nxt[left])
        out, k = [], 0 if n else -1
        while k != -1:
            out.append(sym[k])
            k = nxt[k]
        return out

    # ---- decoding -----------------------------------------------------------------------------

    def _piece(self, token_id: int, prev: int | None, special: bool) -> bytes:
        if not 0 <= token_id < self.n_vocab:
            raise ValueError(f"token id {token_id} out of range [0, {self.n_vocab})")
        if token_id <= 2 and not special:
            return b""
        p = self.pieces[token_id]
        if prev == self.bos_id and p.startswith(b" "):
            p = p[1:]
        m = _BYTE_PIECE.fullmatch(p)
        return bytes([int(m.group(1), 16)]) if m else p

    def token_to_piece(self, token_id: int, special: bool = False) -> bytes:
        """The bytes of one token (a <0xXX> token: that byte); unk/BOS/EOS give b"" unless special=True."""
        return self._piece(int(token_id), None, special)

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        out, prev = [], None
        for t in ids:
            t = int(t)
            out.append(self._piece(t, prev, special))
            prev = t
        return b"".join(out).decode("utf-8", errors="replace")

    def stream(self, special: bool = False) -> "Llama2cStream":
        return Llama2cStream(self, special)

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids


class Llama2cStream:
    """Incremental decode for generation: `push(id)` returns the completed UTF-8 text (maybe ""),
    `flush()` the rest (U+FFFD for an incomplete tail). Tracks the previous token for run.c's BOS rule."""

    def __init__(self, tokenizer: Llama2cTokenizer, special: bool = False, prev: int | None = None):
        self.tokenizer, self.special, self.prev = tokenizer, special, prev
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        token_id = int(token_id)
        piece = self.tokenizer._piece(token_id, self.prev, self.special)
        self.prev = token_id
        return self._utf8.decode(piece)

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


def load_tokenizer(path, n_vocab: int | None = None) -> Llama2cTokenizer:
    """Read llama2.c's tokenizer.bin. n_vocab (the checkpoint's vocab_size), when given, must equal the
    number of tokens in the file (run.c reads vocab_size entries and ignores the rest; a mismatch almost
    always means the tokenizer of another model, e.g. the 32000-token tokenizer.bin with a tok512 model).
    A malformed file raises Llama2cError (a ValueError) naming the file and the token at fault."""
    path = str(path)
    data = Path(path).read_bytes()
    if data[:4] == b"GGUF":
        raise _bad(path, "is a GGUF file, not a llama2.c tokenizer.bin; use refimpl.tokenizer.from_gguf", "magic")
    if len(data) < 4:
        raise _bad(path, f"file size {len(data)} bytes is too small for tokenizer.bin's max_token_length")
    max_len = struct.unpack_from("<I", data, 0)[0]
    if max_len <= 0 or max_len > 1 << 20:
        kind = looks_like(path)
        raise _bad(path, f"max_token_length = {max_len} is not a plausible token length (1 .. 2**20)"
                   + (f"; not a tokenizer.bin, it looks like {kind}" if kind else ""), "max_token_length")
    pieces, scores, off = [], [], 4
    while off < len(data):
        i = len(pieces)
        if off + 8 > len(data):
            raise _bad(path, f"token {i}: truncated score/length at byte {off} (file size {len(data)})", f"token {i}")
        score, n = struct.unpack_from("<fi", data, off)
        if n < 0 or n > max_len:
            raise _bad(path, f"token {i}: length = {n} is outside [0, max_token_length = {max_len}]", f"token {i}")
        if off + 8 + n > len(data):
            raise _bad(path, f"token {i}: truncated piece ({n} bytes at byte {off + 8}, file size {len(data)})",
                       f"token {i}")
        pieces.append(data[off + 8:off + 8 + n])
        scores.append(score)
        off += 8 + n
    if n_vocab is not None and len(pieces) != n_vocab:
        raise _bad(path, f"has {len(pieces)} tokens but the checkpoint's vocab_size is {n_vocab}: pass the "
                         f"tokenizer the model was trained with (-k)", "vocab_size")
    if len(pieces) < 3:
        raise _bad(path, f"{len(pieces)} tokens; llama2.c needs at least unk, BOS, EOS (ids 0, 1, 2)", "vocab_size")
    return Llama2cTokenizer(pieces, scores, max_len, path)


# -- for the command line: a checkpoint's weight statistics, run.c's chat ---------------------------------------

def weight_stats(ck: Checkpoint):
    """(name, shape, stats) per weight of a checkpoint (the shared classifier once): stats a dict of min, max,
    mean, std over the finite values (f64 sums, one layer at a time), n (how many are finite) and nonfinite."""
    for name, t in ck.tensors.items():
        if name == "wcls" and ck.shared_classifier:
            continue
        lo, hi, s1, s2, n, nonfinite = np.inf, -np.inf, 0.0, 0.0, 0, 0
        for part in (t if t.ndim == 3 else [t]):
            f = np.asarray(part, dtype=np.float32).reshape(-1)
            fin = np.isfinite(f)
            if not fin.all():
                nonfinite += int((~fin).sum())
                f = f[fin]
            if f.size:
                lo, hi = min(lo, float(f.min())), max(hi, float(f.max()))
                s1 += float(np.sum(f, dtype=np.float64))
                s2 += float(np.sum(np.square(f, dtype=np.float64)))
                n += f.size
        mean = s1 / n if n else float("nan")
        std = float(np.sqrt(max(s2 / n - mean * mean, 0.0))) if n else float("nan")
        yield name, tuple(t.shape), dict(min=lo, max=hi, mean=mean, std=std, n=n, nonfinite=nonfinite)


def chat_turns(m: LlamaModel, sampler, turns, *, system: str = "", steps: int = 0):
    """run.c's chat, as text pieces to print: each user turn "[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user}
    [/INST]" (the system part on the first turn only) encoded with BOS, the reply sampled until EOS (at most
    `steps` tokens, 0: up to seq_len), which is then fed to close the turn; one KV cache for the whole
    conversation. Ends with "[context full]" when the cache is."""
    from . import llama
    tok = m.tokenizer
    steps = steps if steps > 0 else m.hparams.n_ctx_train
    cache = llama.new_cache(m, m.hparams.n_ctx_train)
    first = True
    for user in turns:
        text = (f"[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST]" if first and system
                else f"[INST] {user} [/INST]")
        first = False
        ids = tok.encode(text)
        if cache.n_past + len(ids) >= cache.n_ctx:
            yield "[context full]\n"
            return
        logits = llama.forward(m, ids, cache, last_only=True)[-1]
        history, stream = list(ids), tok.stream()
        stream.prev = ids[-1]
        for _ in range(steps):
            t = sampler.sample(logits, history)
            if t == tok.eos_id or cache.n_past >= cache.n_ctx:
                break
            history.append(t)
            yield stream.push(t)
            logits = llama.forward(m, [t], cache)[-1]
        yield stream.flush() + "\n"
        if cache.n_past >= cache.n_ctx:
            yield "[context full]\n"
            return
        llama.forward(m, [tok.eos_id], cache)
