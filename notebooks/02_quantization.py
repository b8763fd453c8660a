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
# # 02 · Quantization, byte by byte
#
# A quantized ggml tensor is a run of fixed-size **blocks**: 32 or 256 values stored as small integers
# plus one or a few scales. refimpl holds the raw blocks (`refimpl.QTensor`) and decodes them bit for bit
# as ggml does. This notebook takes three formats apart by hand (Q4_0, Q8_0, Q4_K), checks every decoded
# value against `refimpl.dequantize`, then measures what each type costs in accuracy on real weights of
# SmolLM2-135M, and why the token embedding is kept at higher precision than the layers.

# %%
import os
os.environ.setdefault("REFIMPL_BACKEND", "numpy")   # run the NumPy reference itself (no compiled kernels)

import matplotlib.pyplot as plt
import numpy as np

import refimpl
from refimpl.models import bert, llama
from refimpl.quants import kquants, legacy
from refimpl.testing import nmse
from exercise import check

gguf = refimpl.gguf.load(refimpl.fetch.fetch("smollm2"))
emb = gguf.tensors["token_embd.weight"]
print(emb)

# %% [markdown]
# ## Q4_0: 32 values in 18 bytes
#
# `block_q4_0` is an f16 scale `d` and 16 bytes of 4-bit values. Byte `j` holds element `j` in its low
# nibble and element `j + 16` in its high nibble ("split nibbles"); each value is `(nibble - 8) * d`.
# The docstring of refimpl's decoder restates the struct:

# %%
print(legacy.dequantize_q4_0.__doc__)
print(legacy.quantize_q4_0.__doc__)

# %%
x = np.asarray(emb[1000])[:32]                        # 32 real values: part of token 1000's embedding
q = refimpl.quantize(x, "q4_0")
raw = q.data
print(q, "\nbytes:", " ".join(f"{b:02x}" for b in raw))

d = raw[0:2].view(np.float16)[0]                      # little-endian f16
qs = raw[2:18]
nibbles = np.concatenate([qs & 0x0F, qs >> 4])         # elements 0..15, then 16..31
by_hand = (nibbles.astype(np.float32) - 8) * np.float32(d)
print("d =", d, "| nibbles:", nibbles)
print("decoded by hand == refimpl.dequantize:", np.array_equal(by_hand, refimpl.dequantize(q)))
print("max |error| =", np.abs(by_hand - x).max(), "| d/2 =", float(d) / 2,
      "(values above 7d are clamped to nibble 15 and may err by more)")

# %% [markdown]
# ### Why `d = max / -8`: the 16 levels on a line
#
# Four bits give 16 levels, `(nibble - 8) * d` for nibble 0 to 15: eight on one side of zero, seven on the
# other. ggml's quantizer gives the extra level to the side that needs it: `max` is the value of largest
# magnitude *with its sign*, and `d = max / -8` puts nibble 0 exactly on it, `(0 - 8) * d = max`. When that
# value is negative `d` is positive and the levels climb from it; when it is positive `d` is negative and
# they run the other way (the "Try this" cell at the end flips it). Either way the extreme value is exact
# and the opposite side ends one step short, at `-7/8 * max`. Each of the 32 values goes to its nearest level:

# %%
levels = (np.arange(16) - 8) * np.float32(d)               # nibble n decodes to (n - 8) * d
imax = int(np.argmax(np.abs(x)))
fig, ax = plt.subplots(figsize=(9, 2.6))
ax.axhline(0, color="0.7", lw=1)
ax.scatter(levels, np.zeros(16), marker="|", s=500, color="tab:blue", zorder=3, label="the 16 levels")
for n, v in enumerate(levels):
    ax.text(v, -0.42, str(n), ha="center", fontsize=8, color="tab:blue")
ax.scatter(x, np.full(32, 0.6), marker="v", s=22, color="tab:red", zorder=3, label="the 32 values x")
for xi, qi in zip(x, by_hand):                             # each value to the level it is stored as
    ax.plot([xi, qi], [0.55, 0.05], color="tab:red", lw=0.6, alpha=0.6)
ax.annotate(f"max = x[{imax}] = {x[imax]:.4f}: nibble 0, exact", (x[imax], 0.65), (x[imax], 1.0),
            ha="left" if x[imax] < 0 else "right", fontsize=8, arrowprops={"arrowstyle": "->"})
ax.text(0, -0.75, f"d = max / -8 = {float(d):.5f}  (nibbles below the ticks)", ha="center", fontsize=8)
ax.set_ylim(-0.9, 1.15)
ax.set_yticks([])
ax.legend(loc="lower left", fontsize=8, frameon=False)
plt.tight_layout()
plt.show()

# %% [markdown]
# The same block as bits: 18 bytes left to right, bit 7 at the top. The f16 `d` is sign, exponent and
# mantissa; then byte `2 + j` holds element `j` in its low nibble and element `j + 16` in its high nibble,
# so the first 16 elements are the low halves and the next 16 the high halves of the same bytes.

# %%
bits = (raw[None, :] >> np.arange(7, -1, -1)[:, None]) & 1         # (8, 18): row 0 is bit 7
fig, ax = plt.subplots(figsize=(9, 3.4))
colour = np.zeros((8, 18, 3))
colour[:, :2] = (0.95, 0.65, 0.6)                                   # d
colour[4:, 2:] = (0.65, 0.8, 0.95)                                  # low nibbles: elements 0..15
colour[:4, 2:] = (0.35, 0.55, 0.85)                                 # high nibbles: elements 16..31
ax.imshow(colour, aspect="auto")
for r in range(8):
    for c in range(18):
        ax.text(c, r, bits[r, c], ha="center", va="center", fontsize=8)
for j in range(16):                                                 # name the element of each nibble
    ax.text(2 + j, -0.75, f"x{j + 16}", ha="center", fontsize=7)
    ax.text(2 + j, 7.95, f"x{j}", ha="center", va="top", fontsize=7)
ax.text(0.5, -0.75, "d (f16)", ha="center", fontsize=7)
ax.text(0.5, 7.95, "s|exp|mant", ha="center", va="top", fontsize=6)
ax.set_xticks(range(18), [f"{b:02x}" for b in raw], fontsize=7)
ax.set_yticks(range(8), [f"bit {b}" for b in range(7, -1, -1)], fontsize=7)
ax.set_xlabel("the 18 bytes of block_q4_0 (hex); top row: the element in the high nibble, "
              "bottom row: the one in the low nibble", fontsize=8)
ax.set_ylim(8.6, -1.4)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Q8_0: 32 values in 34 bytes
#
# An f16 scale and 32 signed bytes: `x = q * d`, `d = max|x| / 127`.

# %%
q8 = refimpl.quantize(x, "q8_0")
d8 = q8.data[0:2].view(np.float16)[0]
by_hand8 = q8.data[2:34].view(np.int8).astype(np.float32) * np.float32(d8)
print("d =", d8, "| q =", q8.data[2:34].view(np.int8)[:12], "...")
print("decoded by hand == refimpl.dequantize:", np.array_equal(by_hand8, refimpl.dequantize(q8)))

# %% [markdown]
# SmolLM2's embedding is stored as Q8_0. Quantizing its decoded values to Q8_0 again gives back the very
# same bytes: the format is a fixed point of its own quantizer (which also means the Q8_0 row of the error
# table below is exactly zero for this tensor).

# %%
rows = emb[:2048]
print("requantized == stored bytes:", refimpl.quantize(np.asarray(rows), "q8_0") == rows)

# %% [markdown]
# ## Q4_K: 256 values in 144 bytes
#
# The K-quants nest two levels of scales. A 256-value super-block has f16 `d` and `dmin`; each of its 8
# sub-blocks of 32 has a 6-bit scale `sc_j` and a 6-bit minimum `m_j`, packed into 12 bytes; then 128 bytes
# of nibbles. A value is `(d * sc_j) * q - (dmin * m_j)`.

# %%
print(kquants.dequantize_q4_K.__doc__)

# %%
xk = np.asarray(emb[1000:1004]).reshape(-1)[:256]    # 256 real values
qk = refimpl.quantize(xk, "q4_K")
b = qk.data
dk, dmin = b[0:2].view(np.float16)[0], b[2:4].view(np.float16)[0]
s = b[4:16].astype(np.uint8)
sc, mn = np.empty(8, np.uint8), np.empty(8, np.uint8)
for j in range(8):                                   # ggml's get_scale_min_k4
    if j < 4:
        sc[j], mn[j] = s[j] & 63, s[j + 4] & 63
    else:
        sc[j] = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4)
        mn[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4)
qsk = b[16:144].reshape(4, 32)                       # chunk c: sub-blocks 2c (low nibbles), 2c+1 (high)
qk_vals = np.stack([qsk & 0x0F, qsk >> 4], axis=1).reshape(8, 32)
D = np.float32(dk) * sc.astype(np.float32)           # f32 products, as ggml computes them
M = np.float32(dmin) * mn.astype(np.float32)
by_hand_k = (D[:, None] * qk_vals.astype(np.float32) - M[:, None]).reshape(-1)
print("d =", dk, "dmin =", dmin, "\nsub-block scales", sc, "\nsub-block mins  ", mn)
print("decoded by hand == refimpl.dequantize:", np.array_equal(by_hand_k, refimpl.dequantize(qk)))

# %% [markdown]
# Q4_K's 12 scale bytes pack sixteen 6-bit numbers (a scale `sc_j` and a min `m_j` for each of the 8
# sub-blocks) into 96 bits. Sub-blocks 0-3 are simple: the low 6 bits of bytes 0-3 (scales) and 4-7
# (mins). Sub-blocks 4-7 are split: their low 4 bits are the nibbles of bytes 8-11, and their top 2 bits are
# the 2 bits left over at the top of bytes 0-7. Each bit below is coloured by the sub-block it belongs to
# (hatched: a min) and labelled with the number and bit it is; reassembling the 16 numbers from this map
# gives back the scales and mins the code above unpacked.

# %%
owner = {}                                   # (byte, bit) -> ("sc" or "m", sub-block j, bit of that number)
for j in range(4):
    for k in range(6):
        owner[j, k], owner[j + 4, k] = ("sc", j, k), ("m", j, k)
for j in range(4, 8):
    for k in range(4):
        owner[j + 4, k], owner[j + 4, k + 4] = ("sc", j, k), ("m", j, k)
    for k in range(2):
        owner[j - 4, 6 + k], owner[j, 6 + k] = ("sc", j, 4 + k), ("m", j, 4 + k)
sc_map, mn_map = np.zeros(8, np.uint8), np.zeros(8, np.uint8)
for (byte, bit), (kind, j, k) in owner.items():
    target = sc_map if kind == "sc" else mn_map
    target[j] |= ((s[byte] >> bit) & 1) << k
print(len(owner), "bits mapped | reassembled == unpacked:",
      np.array_equal(sc_map, sc) and np.array_equal(mn_map, mn))

fig, ax = plt.subplots(figsize=(9, 3.6))
cmap = plt.get_cmap("tab10")
for (byte, bit), (kind, j, k) in owner.items():
    r = 7 - bit
    ax.add_patch(plt.Rectangle((byte - 0.5, r - 0.5), 1, 1, facecolor=cmap(j), alpha=0.55,
                               hatch="///" if kind == "m" else None, edgecolor="white"))
    ax.text(byte, r, f"{kind}{j}.{k}", ha="center", va="center", fontsize=6.5)
ax.set_xlim(-0.5, 11.5)
ax.set_ylim(7.5, -0.5)
ax.set_xticks(range(12), [f"{i}\n{b:02x}" for i, b in enumerate(s)], fontsize=7)
ax.set_yticks(range(8), [f"bit {b}" for b in range(7, -1, -1)], fontsize=7)
ax.set_xlabel("scales[0..11] (byte, hex); 'sc5.4' is bit 4 of sub-block 5's scale, 'm2.0' bit 0 of "
              "sub-block 2's min", fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# The three layouts side by side, one cell per byte:

# %%
layouts = {
    "q4_0 (32 values)": [("d f16", 2), ("qs: 32 nibbles", 16)],
    "q8_0 (32 values)": [("d f16", 2), ("qs: 32 int8", 32)],
    "q4_K (256 values)": [("d f16", 2), ("dmin f16", 2), ("scales: 8 x (6+6 bits)", 12), ("qs: 256 nibbles", 128)],
}
colors = {"d": "tab:red", "dmin": "tab:orange", "scales": "tab:purple", "qs": "tab:blue"}
fig, ax = plt.subplots(figsize=(11, 2.2))
for row, (name, fields) in enumerate(layouts.items()):
    at = 0
    for label, n in fields:
        ax.barh(row, n, left=at, color=colors[label.split(":")[0].split(" ")[0]], edgecolor="white")
        if n >= 16:
            ax.text(at + n / 2, row, label, ha="center", va="center", color="white", fontsize=8)
        at += n
    ax.text(at + 1, row, f"{at} bytes = {8 * at / int(name.split('(')[1].split()[0]):.3g} bits/weight",
            va="center", fontsize=8)
ax.set_yticks(range(len(layouts)), list(layouts))
ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()], labels=list(colors),
          loc="lower right", fontsize=8, ncol=4)
ax.set_xlim(0, 175)
ax.set_xlabel("byte")
ax.invert_yaxis()
plt.tight_layout()
plt.show()

# %% [markdown]
# ## What each type costs on real weights
#
# Two sets of real weights: SmolLM2's token embedding (stored as Q8_0, so its values are already on a Q8_0
# grid) and MiniLM's float32 FFN matrices (never quantized). The K-quants need rows of 256, so we take the
# first 512 of each 576-value embedding row. The error measure is ggml's NMSE, `Σ(x̂ - x)² / Σx²`.
# (The IQ types with grid searches, IQ3_S, IQ2_S and friends, also quantize bit-exactly in refimpl, but
# their searches take seconds per megabyte in NumPy, so they are left out here.)
#
# The types below, one line each (bits per weight in brackets; `q` the stored integer, `d`, `m` f16 scales):
#
# | type | block | value |
# |---|---|---|
# | Q8_0 (8.5) | 32 values: `d`, 32 int8 | `d * q` |
# | Q6_K (6.56) | 256: 16 groups of 16 with int8 scales, 6-bit `q`, one f16 `d` | `d * scale * (q - 32)` |
# | Q5_1 (6.0) | 32: `d`, `m`, 5-bit `q` | `d * q + m` |
# | Q5_K (5.5) | 256: 8 groups of 32 with 6-bit scales and mins, 5-bit `q` | `d * sc * q - dmin * mn` |
# | Q5_0 (5.5) | 32: `d`, 5-bit `q` | `d * (q - 16)` |
# | Q4_1 (5.0) | 32: `d`, `m`, 4-bit `q` | `d * q + m` |
# | Q4_K (4.5) | 256: 8 groups of 32 with 6-bit scales and mins, 4-bit `q` (taken apart above) | `d * sc * q - dmin * mn` |
# | IQ4_NL (4.5) | 32: `d`, 4-bit indices into a fixed table of 16 non-uniform levels | `d * table[q]` |
# | Q4_0 (4.5) | 32: `d`, 4-bit `q` (taken apart above) | `d * (q - 8)` |
# | IQ4_XS (4.25) | 256: IQ4_NL's table, 8 groups of 32 with 6-bit scales | `d * (scale - 32) * table[q]` |
# | MXFP4 (4.25) | 32: one power-of-two scale byte `e` (E8M0), 4-bit floats (E2M1: 0, ±0.5, ±1, ... ±6) | `fp4[q] * 2^(e - 127)` |
# | Q3_K (3.44) | 256: 16 groups of 16 with 6-bit scales, 3-bit `q` | `d * (scale - 32) * (q - 4)` |
# | Q2_K (2.63) | 256: 16 groups of 16 with 4-bit scales and mins, 2-bit `q` | `d * sc * q - dmin * mn` |
# | TQ2_0 (2.06) | 256: `d`, 2-bit ternary `q` | `d * (q - 1)`, so -d, 0 or d |
# | Q1_0 (1.13) | 128: `d`, one bit each | `+d` or `-d` |
#
# Q*_K are the "K-quants": a super-block of 256 shares one f16 scale, and each group of 16 or 32 gets a small
# integer scale (and min) of its own, so the group's range is followed closely for a few bits. A *mix* such as
# Q4_K_M or Q4_K_S is not a type but a recipe: llama.cpp's quantizer (src/llama-quant.cpp) gives most tensors
# Q4_K and some a higher type -- for `_M` the attention's V and the FFN's down projection in about half of
# the layers at Q6_K, for `_S` only the first four layers' V and the first eighth's down projections, at Q5_K. The
# *importance matrix* (llama-imatrix) weighs each column's rounding error by how large that input is on real
# text, so the quantizer spends its precision where the activations are.

# %%
W_smol = np.asarray(emb[:2048])[:, :512]
minilm = bert.load(refimpl.fetch.fetch("minilm"), tokenizer=False)
W_mini = np.asarray(minilm.layers[0].ffn_down)      # (384, 1536) f32
print("SmolLM2 sample", W_smol.shape, "| MiniLM sample", W_mini.shape, W_mini.dtype)

TYPES = ["q8_0", "q6_K", "q5_1", "q5_K", "q5_0", "q4_1", "q4_K", "iq4_nl", "q4_0", "iq4_xs", "mxfp4", "q3_K",
         "q2_K", "tq2_0", "q1_0"]
results = {}
for t in TYPES:
    bpw = refimpl.traits(t).bits_per_weight
    e_smol = nmse(refimpl.dequantize(refimpl.quantize(W_smol, t)), W_smol)
    e_mini = nmse(refimpl.dequantize(refimpl.quantize(W_mini, t)), W_mini)
    results[t] = (bpw, e_smol, e_mini)
print(f"{'type':8} {'bits/w':>7} {'NMSE SmolLM2':>13} {'NMSE MiniLM':>12}")
for t, (bpw, a, m) in results.items():
    print(f"{t:8} {bpw:7.4g} {a:13.2e} {m:12.2e}")

# %%
fig, ax = plt.subplots(figsize=(8, 4.5))
for col, (label, marker) in ((1, ("SmolLM2 token_embd (Q8_0 values)", "o")), (2, ("MiniLM ffn_down (f32)", "s"))):
    bpw = np.array([r[0] for r in results.values()])
    err = np.array([r[col] for r in results.values()])
    ax.scatter(bpw[err > 0], err[err > 0], marker=marker, label=label)      # (Q8_0 of Q8_0 values: 0)
    if col == 2:
        for t, xx, yy in zip(results, bpw, err):
            ax.annotate(t, (xx, yy), textcoords="offset points", xytext=(4, 4), fontsize=7)
ax.set_yscale("log")
ax.set_xlabel("bits per weight")
ax.set_ylabel("NMSE (log)")
ax.set_title("accuracy vs size of every ggml type quantizable without an importance matrix")
ax.legend()
ax.grid(alpha=0.3)
plt.show()

# %% [markdown]
# Roughly each extra bit divides the error by four (6 dB per bit), with the K-quants and IQ4 types
# getting more out of each bit than the 32-block formats. The distributions show why: Q4_0 has one scale
# per 32 values, set by the largest of them, and real weights have outliers (MiniLM's reach 8 where most
# are within ±0.3), which leave the rest of their block with few levels. Q4_K adapts a scale and an
# offset per 32-value sub-block, with 6-bit sub-scales costing far less than f16 ones.

# %%
fig, axs = plt.subplots(1, 2, figsize=(11, 3.5))
axs[0].hist(W_mini.reshape(-1), bins=200, color="gray")
axs[0].set_yscale("log")
axs[0].set_title("MiniLM ffn_down values")
for t in ("q8_0", "q4_K", "q4_0", "q2_K"):
    err = (refimpl.dequantize(refimpl.quantize(W_mini, t)) - W_mini).reshape(-1)
    axs[1].hist(err, bins=200, histtype="step", label=t, range=(-0.1, 0.1))
axs[1].set_yscale("log")
axs[1].set_title("quantization error x̂ - x")
axs[1].legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Why the embedding keeps more bits
#
# In this file every layer matrix is Q4_1 but `token_embd` is Q8_0. Two reasons:
#
# * **It costs no compute.** `get_rows` reads one row per token; a smaller type saves memory but no time.
# * **SmolLM2 ties its output to it.** `output.weight` is absent, so the logits are
#   `mul_mat(token_embd, result_norm)`: every error in the matrix lands directly on the ranking of the
#   49,152 candidate tokens, with no later layer to average it out.
#
# We can measure the second point cheaply: run the model once, keep the last layer's output `l_out-29` for
# every position with `capture=`, apply the final norm as `forward` does (`result_norm`), and compute the
# logits from the stored embedding and from re-quantized copies of it.

# %%
model = llama.load(gguf, dequantize_weights=True)     # f32 copies of the weights: faster mat-muls, same values
ids = model.tokenizer.encode("The old lighthouse keeper climbed the spiral stairs every evening, lit the lamp, "
                             "and watched the ships pass by until the sun rose over the quiet harbour.")
cap = {}
llama.forward(model, ids, llama.new_cache(model, len(ids)), capture=cap, last_only=True)
hp = model.hparams
h = refimpl.mul(refimpl.rms_norm(cap[f"l_out-{hp.n_layer - 1}"], hp.rms_eps), model.output_norm)   # result_norm
logits = refimpl.mul_mat(emb, h)                      # the model's logits: its output is token_embd (Q8_0)
print("tokens", len(ids), "| result_norm", h.shape, "| logits", logits.shape)


def softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


p_ref = softmax(logits.astype(np.float64))
print(f"{'embedding as':13} {'bits/w':>6} {'KL (nats)':>10} {'top-1 same':>10} {'max |Δlogit|':>12}")
for t in ("q8_0", "q5_0", "q4_0"):
    e_t = emb if t == "q8_0" else refimpl.quantize(np.asarray(emb), t)      # re-quantize the stored values
    lg = refimpl.mul_mat(e_t, h)
    p = softmax(lg.astype(np.float64))
    kl = float(np.mean(np.sum(p_ref * (np.log(p_ref + 1e-30) - np.log(p + 1e-30)), axis=-1)))
    same = float(np.mean(lg.argmax(-1) == logits.argmax(-1)))
    print(f"{t:13} {refimpl.traits(t).bits_per_weight:6.3g} {kl:10.2e} {same:10.0%} {np.abs(lg - logits).max():12.3f}")

# %% [markdown]
# Storing the embedding as Q5_0 or Q4_0 instead of Q8_0 moves single logits by several units and changes
# the most likely next token at a fifth of these 30 positions: at 4-5 bits the tied output matrix is the
# weakest link of the model. llama.cpp's quantizer makes the same choice by default and keeps
# `token_embd` / `output` at a higher type than the layers.

# %% [markdown]
# ## What a type costs the model: KL divergence against the unquantized model
#
# NMSE is per matrix; what a user feels is the model's next-token distribution. llama.cpp's quantization
# tables measure it as the **KL divergence** of each position's distribution from the f16 model's
# (`llama-perplexity --kl-divergence`), with the share of positions whose most likely token stays the same.
# We do the same on SmolLM2 with its own decoded weights as the base: every layer matrix (the seven of
# each of the 30 layers) quantized to one type, decoded back, and the same prompt run through the model.
# SmolLM2's matrices are 576 values wide, which 256-value K-quant blocks cannot tile; llama.cpp's quantizer
# then falls back (src/llama-quant.cpp: Q6_K to Q8_0, Q4_K to Q5_0, Q2_K to Q4_0), so a "Q4_K" SmolLM2 has
# only `ffn_down` (1,536 wide) in Q4_K. Those mixes are drawn hollow; bits per weight count the bytes
# actually stored. The embedding stays Q8_0 throughout. This cell quantizes all 210 matrices 11 times and runs
# the model 12 times, so it uses refimpl's compiled kernels when numba is installed (same results, faster).

# %%
import dataclasses
import importlib.util

MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
FALLBACK = {"q6_K": "q8_0", "q4_K": "q5_0", "q2_K": "q4_0"}          # llama.cpp's, for rows not a multiple of 256


def requantized(model, t):
    """`model` with every layer matrix quantized to t (or t's fallback where rows are too short), decoded."""
    nbytes, n = 0, 0
    layers = []
    for L in model.layers:
        new = {}
        for name in MATRICES:
            w = getattr(L, name)
            tt = t if w.shape[-1] % refimpl.traits(t).blck_size == 0 else FALLBACK[t]
            q = refimpl.quantize(w, tt)
            new[name], nbytes, n = refimpl.dequantize(q), nbytes + q.data.nbytes, n + w.size
        layers.append(dataclasses.replace(L, **new))
    return dataclasses.replace(model, layers=layers), 8 * nbytes / n


def log_softmax(z):
    z = z.astype(np.float64) - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


fast = "numba" if importlib.util.find_spec("numba") else "numpy"
kl_rows = {}
with refimpl.backend(fast):
    base = log_softmax(llama.forward(model, ids, llama.new_cache(model, len(ids))))      # (T, n_vocab)
    for t in ("q8_0", "q6_K", "q5_1", "q5_0", "q4_1", "q4_K", "iq4_nl", "q4_0", "mxfp4", "q2_K", "q2_0"):
        m_t, bpw = requantized(model, t)
        lp = log_softmax(llama.forward(m_t, ids, llama.new_cache(m_t, len(ids))))
        kl = np.sum(np.exp(base) * (base - lp), axis=-1)                              # one per position
        kl_rows[t] = (bpw, kl, np.mean(lp.argmax(-1) == base.argmax(-1)))
        del m_t
print(f"{'layers as':10} {'bits/w':>6} {'mean KL':>9} {'max KL':>9} {'same top-1':>10}")
for t, (bpw, kl, same) in kl_rows.items():
    print(f"{t:10} {bpw:6.3g} {kl.mean():9.2e} {kl.max():9.2e} {same:10.0%}")

# %%
fig, ax = plt.subplots(figsize=(9, 4.4))
below = {"q4_K", "iq4_nl", "q5_1"}                   # labels under their point, where points crowd
for t, (bpw, kl, same) in kl_rows.items():
    if kl.mean() == 0:                              # q4_1: nothing to draw on a log scale (see the table)
        continue
    mix = t in FALLBACK
    ax.scatter(bpw, kl.mean(), s=40, facecolors="none" if mix else "tab:blue", edgecolors="tab:blue")
    label = f"{t} (+{FALLBACK[t]})" if mix else t
    ax.annotate(label, (bpw, kl.mean()), textcoords="offset points", xytext=(5, -11 if t in below else 3),
                fontsize=8)
ax.text(0.99, 0.97, "q4_1: KL = 0 (the file's own type: its decoded values re-quantize to the same bytes)",
        transform=ax.transAxes, ha="right", va="top", fontsize=8)
ax.set_yscale("log")
ax.set_xlabel("bits per weight of the layer matrices")
ax.set_ylabel("mean KL divergence (nats, log)")
ax.set_title("SmolLM2-135M: next-token KL against its own decoded weights", fontsize=10)
ax.grid(alpha=0.3)
plt.tight_layout()
plt.show()

# %% [markdown]
# Three things to read in the plot and the table:
#
# * **Q4_1 costs nothing** here: the layers already are Q4_1, and their decoded values quantize to Q4_1 again
#   as the very same bytes (checked below on one matrix; the KL of exactly 0 says the same of all 210).
# * **Q5_1 does worse than Q5_0** with more bits and a matrix error (NMSE) about as small. Re-quantizing a
#   Q4_1 block to Q5_1 lays its 16 levels onto 32 new ones spaced exactly 15/31 of the old step, starting at
#   the same minimum, so in *every* block a given stored nibble errs the same way: a systematic distortion
#   that adds up through 30 layers. Q5_0's grid is centred on zero, so it sits at a different offset in
#   every block and its errors average out. This is an artefact of quantizing what was quantized already,
#   and the reason llama.cpp quantizes from the f16 or bf16 model, never from another quantized file.
# * **Below about 4.5 bits** without an importance matrix the model comes apart: Q2_K (with Q4_0 for the
#   576-wide matrices) keeps the most likely token at a fifth of the positions, Q2_0 at almost none.

# %%
w41 = gguf.tensors["blk.0.attn_q.weight"]
W = refimpl.dequantize(w41)
print("blk.0.attn_q decoded, quantized to q4_1 again == the stored bytes:", refimpl.quantize(W, "q4_1") == w41)
raw41 = w41.data.reshape(-1, 20)                     # block_q4_1: d f16 | m f16 | 16 bytes of nibbles
nib = np.concatenate([raw41[:, 4:] & 0x0F, raw41[:, 4:] >> 4], axis=1).reshape(W.shape)
step = np.repeat(raw41[:, 0:2].copy().view(np.float16).astype(np.float32), 32).reshape(W.shape)
fig, ax = plt.subplots(figsize=(8, 3.2))
for t in ("q5_1", "q5_0"):
    W_t = refimpl.dequantize(refimpl.quantize(W, t))
    rel = (W_t - W) / np.where(step == 0, 1, step)   # error in units of the block's Q4_1 step
    ax.plot(range(16), [rel[nib == k].mean() for k in range(16)], marker="o",
            label=f"{t}: NMSE {nmse(W_t, W):.2e}")
ax.axhline(0, color="0.6", lw=1)
ax.set_xticks(range(16))
ax.set_xlabel("the nibble a value was stored with in the Q4_1 file")
ax.set_ylabel("mean error / Q4_1 step")
ax.set_title("blk.0.attn_q re-quantized: Q5_1's error is the same in every block", fontsize=10)
ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Try this
#
# In the Q4_0 cell, negate `x` (`x = -np.asarray(emb[1000])[:32]`) and run it again: the element of largest
# magnitude now has the other sign, so `d` flips sign too, and that element still gets nibble 0 (the value -8 d).
# Then quantize the same `x` as `"q4_1"`: 20 bytes instead of 18 (a scale `d` and a minimum `m`), levels from
# `m` to `m + 15 d`. Which of the two errs less on these 32 values?

# %% [markdown]
# ## Exercises
#
# **1. Decode Q8_0.** Write `my_dequantize_q8_0(raw)` for raw bytes of NumPy shape `(n_blocks, 34)`, returning
# `(n_blocks, 32)` float32. It is checked bit for bit against `refimpl.dequantize`.

# %%
def my_dequantize_q8_0(raw):
    raise NotImplementedError   # your code here


# %% tags=["solution"] jupyter={"source_hidden": true}
def solution_dequantize_q8_0(raw):
    d = np.ascontiguousarray(raw[:, 0:2]).view(np.float16).astype(np.float32)      # (n, 1)
    return raw[:, 2:34].view(np.int8).astype(np.float32) * d


# %%
def ref_q8_0(raw):
    return refimpl.dequantize(refimpl.QTensor(refimpl.GGMLType.Q8_0, raw, (raw.shape[0], 32)))


rng = np.random.default_rng(0)
q8_cases = [refimpl.quantize(np.asarray(emb[:64]), "q8_0").data.reshape(-1, 34),
            rng.integers(0, 256, (100, 34), dtype=np.uint8)]          # any bytes are a valid block
check(my_dequantize_q8_0, ref_q8_0, q8_cases, solution=solution_dequantize_q8_0)

# %% [markdown]
# **2. Decode Q4_1.** `block_q4_1` (20 bytes) is `d` f16, `m` f16, then 16 bytes of split nibbles;
# `x = nibble * d + m` (in float32, the product rounded before the sum). Write `my_dequantize_q4_1(raw)` for
# `(n_blocks, 20)` bytes; it is checked bit for bit against `refimpl.dequantize` on SmolLM2's own Q4_1 weights.

# %%
def my_dequantize_q4_1(raw):
    raise NotImplementedError   # your code here


# %% tags=["solution"] jupyter={"source_hidden": true}
def solution_dequantize_q4_1(raw):
    d = np.ascontiguousarray(raw[:, 0:2]).view(np.float16).astype(np.float32)
    m = np.ascontiguousarray(raw[:, 2:4]).view(np.float16).astype(np.float32)
    qs = raw[:, 4:20]
    nib = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
    return nib * d + m


# %%
def ref_q4_1(raw):
    return refimpl.dequantize(refimpl.QTensor(refimpl.GGMLType.Q4_1, raw, (raw.shape[0], 32)))


w_q41 = gguf.tensors["blk.0.attn_q.weight"]
check(my_dequantize_q4_1, ref_q4_1, [w_q41.data[:32].reshape(-1, 20)], solution=solution_dequantize_q4_1)
