# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · SmolLM2 from the GGUF up
#
# SmolLM2-135M-Instruct is a small Llama: 30 layers, 576-wide, 9 query heads sharing 3 key/value heads.
# refimpl runs it as plain functions over its ops (`refimpl.models.llama`), reading the same GGUF file
# llama.cpp reads. This notebook follows one prompt through it: the file, the tokenizer, one layer
# recomputed by hand from captured intermediates, attention maps, the KV cache, and sampling.

# %%
import os
os.environ.setdefault("REFIMPL_BACKEND", "numpy")   # run the NumPy reference itself (no compiled kernels)

import matplotlib.pyplot as plt
import numpy as np

import refimpl
from refimpl.models import llama
from refimpl.sampling import Sampler
from refimpl.testing import nmse, tol
from exercise import check

path = refimpl.fetch.fetch("smollm2")              # SmolLM2-135M-Instruct.Q4_1.gguf in ~/.cache/refimpl
f = refimpl.gguf.load(path)                        # memory-mapped: nothing is read or dequantized yet
print(f.metadata["general.architecture"], "|", len(f.tensors), "tensors |", path.stat().st_size / 2**20, "MiB")

# %% [markdown]
# ## The file
#
# Hyper-parameters come from the GGUF metadata (keys `llama.*`), never from a checkpoint's defaults. Tensors
# keep their type; every shape is shown in NumPy order with ggml's `ne` beside it.

# %%
model = llama.load(f, dequantize_weights=True)     # dequantize once (~0.6 GB) for faster mat-muls; same values
hp = model.hparams
print(hp)
for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.ffn_down.weight",
             "blk.0.attn_norm.weight"):
    t = f.tensors[name]
    kind = t.traits.name if isinstance(t, refimpl.QTensor) else t.dtype
    print(f"{name:24} {kind!s:8} numpy {tuple(t.shape)!s:14} ggml ne {list(t.shape[::-1])}")

# %% [markdown]
# ## The file, byte by byte
#
# A GGUF file is four sections: a 24-byte **header** (magic `GGUF`, version, tensor count, key-value count),
# the **key-values** (each a length-prefixed key, a value type, a value), the **tensor infos** (name,
# dimensions, `ne`, type, offset into the data), then **padding** to `general.alignment` (32 unless the file
# says otherwise) and the **data**, every tensor at an aligned offset. Everything is little-endian; strings are
# a `uint64` length and the bytes, no terminator. `refimpl.gguf.load` parses this; here a few lines walk
# it by hand, note where each field lies, and check the walk against the loader.

# %%
import struct

SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
TYPE_NAMES = {0: "UINT8", 1: "INT8", 2: "UINT16", 3: "INT16", 4: "UINT32", 5: "INT32", 6: "FLOAT32",
              7: "BOOL", 8: "STRING", 9: "ARRAY", 10: "UINT64", 11: "INT64", 12: "FLOAT64"}


class Cursor:
    """Reads GGUF fields from `buf` in order; `notes` gets (offset, size, field, value) for named fields."""

    def __init__(self, buf):
        self.buf, self.pos, self.notes = buf, 0, []

    def read(self, fmt, field=None):
        (v,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        return self._advance(struct.calcsize("<" + fmt), field, v)

    def string(self, field=None):
        n = self.read("Q", field and field + " length")
        return self._advance(n, field, bytes(self.buf[self.pos:self.pos + n]).decode("utf-8"))

    def value(self, vt, field=None):
        if vt == 8:
            return self.string(field)
        if vt == 9:                                       # array: element type, count, elements
            et, count = self.read("I", field and field + " elem type"), self.read("Q", field and field + " count")
            return [self.value(et) for _ in range(count)]
        return self.read(SCALAR[vt], field)

    def _advance(self, n, field, v):
        if field:
            self.notes.append((self.pos, n, field, v))
        self.pos += n
        return v


c = Cursor(f.data)                                        # f.data: the whole file, memory-mapped
magic, version = c.read("4s", "magic"), c.read("I", "version")
n_tensors, n_kv = c.read("Q", "n_tensors"), c.read("Q", "n_kv")
kv_start, kv_size = c.pos, {}
for i in range(n_kv):                                     # label the first key-value's fields only
    at = c.pos
    key = c.string("key" if i == 0 else None)
    vt = c.read("I", "value type" if i == 0 else None)
    c.value(vt, "value" if i == 0 else None)
    kv_size[key] = c.pos - at
infos_start = c.pos
for i in range(n_tensors):                                # and the first tensor info's
    first = i == 0
    c.string("tensor name" if first else None)
    n_dims = c.read("I", "n_dims" if first else None)
    ne = [c.read("Q", f"ne[{k}]" if first else None) for k in range(n_dims)]
    c.read("I", "ggml type" if first else None)
    c.read("Q", "data offset" if first else None)
infos_end = c.pos
data_start = -(-infos_end // f.alignment) * f.alignment  # rounded up to the alignment
print("magic", magic, "| version", version, "|", n_tensors, "tensors |", n_kv, "key-values")
print(f"walked by hand: data at {data_start:,}; refimpl.gguf.load: data at {f.data_offset:,}; same counts:",
      (n_kv, n_tensors) == (len(f.metadata), len(f.tensors)))
for off, n, field, v in c.notes:
    shown = bytes(f.data[off:off + min(n, 10)]).hex(" ") + (" .." if n > 10 else "")
    if field in ("value type", "value elem type"):
        v = f"{v} ({TYPE_NAMES[v]})"
    elif field == "ggml type":
        v = f"{v} ({refimpl.GGMLType(v).name})"
    else:
        v = repr(v)
    print(f"{off:#08x}  {shown:<33} {field:<19} {v}")

# %% [markdown]
# The whole file to scale is almost all data; the metadata is mostly the tokenizer (its 49,152 tokens and
# 48,900 merges are key-values too). Below it, the first sections drawn one box each, not to scale, with their
# real offsets and sizes:

# %%
size = f.path.stat().st_size
sections = [("header", 0, kv_start), ("key-values", kv_start, infos_start),
            ("tensor infos", infos_start, infos_end), ("padding", infos_end, data_start), ("data", data_start, size)]
colors = ["tab:red", "tab:orange", "tab:purple", "0.7", "tab:blue"]
fig, axs = plt.subplots(2, 1, figsize=(9, 3.4), gridspec_kw={"height_ratios": [1, 1.6]})
for (name, a, b), col in zip(sections, colors):
    axs[0].barh(0, b - a, left=a, color=col)
axs[0].set_xlim(0, size)
axs[0].set_yticks([])
axs[0].set_title(f"{f.path.name}: {size:,} bytes to scale (the data is {(size - data_start) / size:.1%})",
                 fontsize=9)
axs[0].xaxis.set_major_formatter(lambda v, _: f"{v / 2**20:.0f} MiB")
for i, ((name, a, b), col) in enumerate(zip(sections, colors)):
    axs[1].barh(0, 0.96, left=i, color=col)
    axs[1].text(i + 0.48, 0.12, name, ha="center", va="center", color="white", fontsize=9, weight="bold")
    axs[1].text(i + 0.48, -0.2, f"at {a:,}\n{b - a:,} B", ha="center", va="center", color="white", fontsize=8)
axs[1].set_xlim(0, len(sections))
axs[1].axis("off")
plt.tight_layout()
plt.show()
top = sorted(kv_size.items(), key=lambda kv: -kv[1])[:3]
print("largest key-values:", ", ".join(f"{k} {n:,} B" for k, n in top), f"of {infos_start - kv_start:,}")
print(f"padding: {data_start - infos_end} bytes (the tensor infos end at {infos_end:,}, "
      f"{'already' if infos_end % f.alignment == 0 else 'not'} a multiple of {f.alignment})")

# %% [markdown]
# ## Tokens
#
# The tokenizer is built from the GGUF's own vocabulary and merges (a byte-level BPE here), and encodes as
# llama.cpp does (the test suite checks it against llama.cpp's token ids). The chat template stored in the
# file turns a conversation into the prompt text:

# %%
tok = model.tokenizer
prompt = llama.format_chat(model, [{"role": "system", "content": "You are a concise assistant."},
                                   {"role": "user", "content": "What is the capital of France?"}])
print(repr(prompt))
ids = tok.encode(prompt)
print(len(ids), "tokens:", ids)
print([tok.token_to_piece(i).decode("utf-8", "replace") for i in ids])

# %% [markdown]
# ## One forward pass, every intermediate captured
#
# `forward(model, tokens, cache, capture=d)` fills `d` with the intermediates under llama.cpp's tensor names
# (`attn_norm-0`, `Qcur-0`, `kq_soft_max-0`, `ffn_out-0`, `l_out-0`, ..., `result_output`), so each one
# can be compared with a llama.cpp graph dump, or recomputed.

# %%
cache = llama.new_cache(model, 256)
cap = {}
logits = llama.forward(model, ids, cache, capture=cap)
print("logits", logits.shape, "| cache holds", cache.n_past, "positions |", len(cap), "captured tensors")
print([k for k in cap if k.endswith("-0")])
print("next token:", repr(tok.decode([int(logits[-1].argmax())])))

# %% [markdown]
# ## Layer 0 by hand
#
# Starting from the captured embeddings, the ops of one layer in order, each compared with what
# `forward` captured. The same refimpl ops in the same order give the same bits.

# %%
w = model.layers[0]
T, D = len(ids), hp.head_dim
x = cap["inp_embd"]                                                    # (n_tokens, n_embd)
pos = np.arange(T, dtype=np.int32)
mine = {}
mine["attn_norm-0"] = cur = refimpl.mul(refimpl.rms_norm(x, hp.rms_eps), w.attn_norm)


def rope(t):
    return refimpl.rope_ext(t, pos, None, n_dims=hp.n_rot, mode=hp.rope_mode, n_ctx_orig=hp.n_ctx_train,
                            freq_base=hp.rope_base, freq_scale=hp.rope_freq_scale)


mine["Qcur-0"] = q = rope(refimpl.mul_mat(w.attn_q, cur).reshape(T, hp.n_head, D))       # (T, 9, 64)
mine["Kcur-0"] = k = rope(refimpl.mul_mat(w.attn_k, cur).reshape(T, hp.n_head_kv, D))    # (T, 3, 64)
mine["Vcur-0"] = v = refimpl.mul_mat(w.attn_v, cur).reshape(T, hp.n_head_kv, D)
qh = np.ascontiguousarray(refimpl.permute(q, 0, 2, 1, 3))                # (n_head, T, D)    ggml ne [D, T, n_head]
kh = np.ascontiguousarray(refimpl.permute(k, 0, 2, 1, 3))                # (n_head_kv, T, D)
mine["kq-0"] = kq = refimpl.mul_mat(kh, qh)                              # (n_head, T, T): GQA by broadcasting
mine["kq_soft_max-0"] = p = refimpl.soft_max_ext(kq, llama.causal_mask(T, T, 0), D ** -0.5)
vt = np.ascontiguousarray(v.transpose(1, 2, 0))                          # (n_head_kv, D, T)
kqv = refimpl.mul_mat(vt, p)                                             # (n_head, T, D)
mine["kqv_out-0"] = attn = np.ascontiguousarray(kqv.transpose(1, 0, 2)).reshape(T, hp.n_head * D)
mine["ffn_inp-0"] = ffn_inp = refimpl.add(refimpl.mul_mat(w.attn_output, attn), x)
mine["ffn_norm-0"] = cur = refimpl.mul(refimpl.rms_norm(ffn_inp, hp.rms_eps), w.ffn_norm)
mine["ffn_out-0"] = ffn = refimpl.mul_mat(w.ffn_down, refimpl.swiglu(refimpl.mul_mat(w.ffn_gate, cur),
                                                                     refimpl.mul_mat(w.ffn_up, cur)))
mine["l_out-0"] = refimpl.add(ffn, ffn_inp)
for name, val in mine.items():
    print(f"{name:14} numpy {val.shape!s:14} identical to forward's: {np.array_equal(val, cap[name])}")

# %% [markdown]
# ## Attention maps
#
# `kq_soft_max-{il}` holds each head's attention weights, `(n_head, n_tokens, n_kv)`. Early layers attend
# locally; later ones concentrate on a few tokens, often the first one (an "attention sink").

# %%
labels = [tok.token_to_piece(i).decode("utf-8", "replace").replace("\n", "\\n") for i in ids]
fig, axs = plt.subplots(2, 4, figsize=(15, 7.5))
for ax, (il, h) in zip(axs.flat, [(0, 0), (0, 4), (3, 2), (8, 1), (15, 0), (15, 6), (29, 3), (29, 8)]):
    ax.imshow(cap[f"kq_soft_max-{il}"][h] ** 0.5, cmap="viridis")       # sqrt: small weights stay visible
    ax.set_title(f"layer {il}, head {h} (kv head {h // (hp.n_head // hp.n_head_kv)})", fontsize=9)
    ax.set_xticks(range(T), labels, rotation=90, fontsize=5)
    ax.set_yticks(range(T), labels, fontsize=5)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## The KV cache
#
# The cache is preallocated, `k[il]` of shape `(n_ctx, n_head_kv, head_dim)` per layer, and `forward`
# writes each new position in place, so decoding one token costs one row of work per layer instead of the
# whole prefix again. Feeding the first tokens of the prompt one at a time gives the same logits as the
# corresponding rows of the one-call prefill (row `t` only sees tokens `0..t`), up to the f64-summed dot
# products over different lengths:

# %%
print(f"cache: {cache.k.nbytes * 2 / 2**20:.1f} MiB for {cache.n_ctx} positions "
      f"({hp.n_layer} layers x 2 x {hp.n_head_kv} kv heads x {hp.head_dim}, f32)")
c2 = llama.new_cache(model, 16)
one_by_one = np.concatenate([llama.forward(model, [t], c2) for t in ids[:4]])
print(f"4 tokens one by one vs the first 4 rows of the prefill: NMSE {nmse(one_by_one, logits[:4]):.1e} "
      f"(bound {tol('llama.forward', 'f32', 'prefill').nmse:g})")

# %% [markdown]
# What the cache buys, timed: the `n`-th token decoded from a cache that holds the `n - 1` before it,
# against recomputing the whole prefix of `n` tokens without one (what a model without a cache would do
# at every step), and what forking a conversation with `cache.copy()` costs against processing its prompt
# again:

# %%
import time

seq = (ids * 4)[:65]
lengths, with_cache, without = [1, 16, 32, 64], [], []
for n in lengths:
    c3 = llama.new_cache(model, n + 1)
    llama.forward(model, seq[:n], c3)                           # n tokens in the cache
    t = []
    for _ in range(2):                                          # the best of two: a shared machine is noisy
        c4, t0 = c3.copy(), time.perf_counter()
        llama.forward(model, seq[n:n + 1], c4, last_only=True)   # the next token, the n before it cached
        t.append(time.perf_counter() - t0)
    with_cache.append(min(t))
    t = []
    for _ in range(2):
        t0 = time.perf_counter()
        llama.forward(model, seq[:n + 1], llama.new_cache(model, n + 1), last_only=True)   # all n + 1 again
        t.append(time.perf_counter() - t0)
    without.append(min(t))
t0 = time.perf_counter()
fork = cache.copy()
t_copy = time.perf_counter() - t0
t0 = time.perf_counter()
llama.forward(model, ids, llama.new_cache(model, cache.n_ctx), last_only=True)
t_prompt = time.perf_counter() - t0

fig, ax = plt.subplots(figsize=(7, 3.2))
ax.plot(lengths, 1e3 * np.array(with_cache), "o-", label="decode one token, cache of n tokens")
ax.plot(lengths, 1e3 * np.array(without), "s-", label="recompute all n + 1 tokens, no cache")
ax.set_xlabel("tokens already in the context (n)")
ax.set_ylabel("ms for the next token")
ax.legend(fontsize=8)
ax.set_title("SmolLM2, NumPy backend: the next token's cost with and without the KV cache", fontsize=9)
plt.tight_layout()
plt.show()
print(f"cache.copy(): {1e3 * t_copy:.1f} ms for {2 * cache.k.nbytes / 2**20:.1f} MiB; processing the "
      f"{len(ids)}-token prompt again: {1e3 * t_prompt:.0f} ms")

# %% [markdown]
# With the cache the next token costs about the same at every length here (at these lengths the weights'
# products dominate, and they see one row); without it the cost grows with the prefix. `cache.copy()`
# forks a conversation: the prompt is processed once, and every continuation below starts from a copy of
# its cache, a memory copy instead of a forward pass.
#
# ## Sampling
#
# `Sampler(temperature, top_k, top_p, min_p, repeat_penalty, seed)` applies llama.cpp's default chain
# (penalty, top-k, top-p, min-p, temperature, draw); temperature 0 is greedy. First the distributions they
# draw from, estimated from 150 seeded draws each on the logits after the prompt:

# %%
last = logits[-1]
samplers = {"greedy": Sampler(),
            "T=1.0": Sampler(temperature=1.0, seed=0),
            "T=0.7, top_k=40": Sampler(temperature=0.7, top_k=40, seed=0),
            "T=1.0, top_p=0.9": Sampler(temperature=1.0, top_p=0.9, seed=0),
            "T=1.0, min_p=0.1": Sampler(temperature=1.0, min_p=0.1, seed=0)}
top = np.argsort(-last)[:8]
fig, ax = plt.subplots(figsize=(10, 3.5))
width = 0.8 / len(samplers)
for n, (name, smp) in enumerate(samplers.items()):
    draws = np.array([smp.sample(last) for _ in range(150 if name != "greedy" else 1)])
    freq = [np.mean(draws == t) for t in top]
    ax.bar(np.arange(len(top)) + n * width, freq, width, label=name)
ax.set_xticks(np.arange(len(top)) + 0.4, [repr(tok.decode([int(t)])) for t in top], fontsize=8)
ax.set_ylabel("share of draws")
ax.set_title("next-token choices after the prompt")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# And continuations, each from a fork of the prompt's cache:

# %%
def continue_from(cache, first_logits, sampler, n=8):
    c, lg, out = cache.copy(), first_logits, []
    for _ in range(n):
        t = sampler.sample(lg, ids + out)
        if tok.is_eog(t):
            break
        out.append(t)
        lg = llama.forward(model, [t], c)[-1]
    return tok.decode(out)


for name, smp in (("greedy", Sampler()), ("T=1.5, seed 3", Sampler(temperature=1.5, seed=3))):
    print(f"{name:14}", repr(continue_from(cache, last, smp)))

# %% [markdown]
# Greedy decoding answers the question. At temperature 1.5 the distribution is flattened so much that
# unlikely tokens win within a few steps, and every one of them conditions the next.

# %% [markdown]
# ## Try this
#
# Change the user's message in the prompt cell to a question of your own and run the notebook down to the
# attention maps: which earlier tokens do layer 0's heads look at from the last position? Then add
# `"T=1.5": Sampler(temperature=1.5, seed=0)` to `samplers`: how much of the share moves to tokens further
# down the ranking?

# %% [markdown]
# ## Exercises
#
# **1. A causal mask.** Write `my_causal_mask(n_tokens, n_kv, pos)`: float32 `(n_tokens, n_kv)`, 0 where token `t`
# (at position `pos + t`) may see kv position `j` (`j <= pos + t`), `-inf` elsewhere. Checked against
# `llama.causal_mask`.

# %%
def my_causal_mask(n_tokens, n_kv, pos):
    raise NotImplementedError   # your code here


# %% tags=["solution"] jupyter={"source_hidden": true}
def solution_causal_mask(n_tokens, n_kv, pos):
    t = pos + np.arange(n_tokens)[:, None]
    return np.where(np.arange(n_kv)[None, :] <= t, 0.0, -np.inf).astype(np.float32)


# %%
check(my_causal_mask, llama.causal_mask, [(1, 1, 0), (5, 5, 0), (1, 9, 8), (3, 12, 9)], solution=solution_causal_mask)

# %% [markdown]
# **2. Grouped-query attention.** Write `my_attention(q, k, v)` for one layer's `Qcur` `(n_tokens, n_head, head_dim)` and
# `Kcur`, `Vcur` `(n_tokens, n_head_kv, head_dim)`: causal softmax attention with scale `1/sqrt(head_dim)`, query head
# `h` reading kv head `h // (n_head / n_head_kv)`, returning `(n_tokens, n_head * head_dim)`. Checked against
# `llama.attention` on layer 0's captured tensors.

# %%
def my_attention(q, k, v):
    raise NotImplementedError   # your code here


# %% tags=["solution"] jupyter={"source_hidden": true}
def solution_attention(q, k, v):
    T, H, D = q.shape
    r = H // k.shape[1]
    qh = q.transpose(1, 0, 2).astype(np.float64)                       # (H, T, D)
    kh = np.repeat(k.transpose(1, 0, 2), r, axis=0).astype(np.float64)  # (H, T, D)
    vh = np.repeat(v.transpose(1, 0, 2), r, axis=0).astype(np.float64)
    s = qh @ kh.transpose(0, 2, 1) / np.sqrt(D) + np.triu(np.full((T, T), -np.inf), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ vh).transpose(1, 0, 2).reshape(T, H * D).astype(np.float32)


# %%
def ref_attention(q, k, v):
    T, D = q.shape[0], q.shape[2]
    return llama.attention(q, k, v, llama.causal_mask(T, T, 0), D ** -0.5, lambda name, x: x, 0)


check(my_attention, ref_attention, [(cap["Qcur-0"], cap["Kcur-0"], cap["Vcur-0"]),
                                    (cap["Qcur-20"][:7], cap["Kcur-20"][:7], cap["Vcur-20"][:7])],
      solution=solution_attention, exact=False, rtol=1e-5)
