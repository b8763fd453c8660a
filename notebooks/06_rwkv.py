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
# # 06 · RWKV as an RNN
#
# RWKV replaces attention's growing KV cache with a **fixed-size state**: per layer, the previous token's
# activations (the "token shift") and, per head, a `head_size x head_size` matrix that every token decays
# and adds to. refimpl runs RWKV v4 to v7 (`refimpl.models.rwkv`) with the state as a plain object,
# `forward(model, tokens, state) -> (logits, state)`, as rwkv.cpp does.
#
# **No trained RWKV weights are shipped with this project**, so this notebook builds a small RWKV-5.2 model
# with random weights, drawn in the value ranges trained models use (decays spread over the range trained
# models have, norm gains around 1, `1/sqrt(fan_in)` matrices). Its outputs are meaningless as text, but every
# mechanism below (the state, the WKV recurrence, sequence vs token mode) is exactly the one a real
# checkpoint runs through; `rwkv.load(path)` reads real `.pth`, `.safetensors` and GGUF files. The last
# section runs a tiny *trained* model from rwkv.cpp's tests, when its files are present, to show what the
# state remembers.

# %%
import os
os.environ.setdefault("REFIMPL_BACKEND", "numpy")   # run the NumPy reference itself (no compiled kernels)

import matplotlib.pyplot as plt
import numpy as np

import refimpl
from refimpl.models import rwkv
from refimpl.models.rwkv.v5 import decay_and_bonus
from refimpl.testing import nmse, tol
from exercise import check

rng = np.random.default_rng(0)

# %% [markdown]
# ## A small random RWKV-5.2
#
# A state dict under BlinkDL's tensor names (what the `.pth` checkpoints use), turned into a model by
# `rwkv.from_state_dict`, which detects the version from the names and shapes: 4 layers, 128 wide,
# 4 heads of 32, a 256-token vocabulary.

# %%
def random_rwkv5_state_dict(n_layer=4, C=128, head_size=32, vocab=256, seed=0):
    r = np.random.default_rng(seed)
    H, N, F = C // head_size, head_size, 4 * C
    f32 = lambda a: np.asarray(a, np.float32)                              # noqa: E731
    mat = lambda o, i: f32(r.standard_normal((o, i)) / np.sqrt(i))         # noqa: E731
    mix = lambda: f32(r.uniform(0, 1, (1, 1, C)))                           # noqa: E731
    ln = lambda p: {p + ".weight": f32(r.uniform(0.5, 1.6, C)), p + ".bias": f32(r.normal(0, 0.2, C))}  # noqa: E731
    sd = {"emb.weight": f32(r.standard_normal((vocab, C))), **ln("blocks.0.ln0"), **ln("ln_out"),
          "head.weight": mat(vocab, C)}
    for i in range(n_layer):
        a, f = f"blocks.{i}.att.", f"blocks.{i}.ffn."
        sd.update({**ln(f"blocks.{i}.ln1"), **ln(f"blocks.{i}.ln2"), **ln(a + "ln_x")})
        sd.update({a + "time_mix_k": mix(), a + "time_mix_v": mix(), a + "time_mix_r": mix(), a + "time_mix_g": mix(),
                   a + "time_decay": f32(r.uniform(-7, 1, (H, N))),        # w = exp(-exp(.)) in 0.07 .. 0.999
                   a + "time_faaaa": f32(r.uniform(-0.5, 1, (H, N))),     # u, the bonus of the current token
                   a + "key.weight": mat(C, C), a + "value.weight": mat(C, C), a + "receptance.weight": mat(C, C),
                   a + "gate.weight": mat(C, C), a + "output.weight": mat(C, C),
                   f + "time_mix_k": mix(), f + "time_mix_r": mix(),
                   f + "key.weight": mat(F, C), f + "value.weight": mat(C, F), f + "receptance.weight": mat(C, C)})
    return sd


model = rwkv.from_state_dict(random_rwkv5_state_dict())
print("RWKV", model.hparams.variant, "|", model.hparams)

# %% [markdown]
# ## The state
#
# `rwkv.new_state(model)` is the state before any token. All of it is NumPy arrays: it copies, pickles and
# saves like any array bundle (`state.save(path)`, `RwkvState.load(path)`).

# %%
state = rwkv.new_state(model)
for name in ("shift_att", "shift_ffn", "wkv"):
    a = getattr(state, name)
    print(f"{name:9} numpy {a.shape!s:18} ggml ne {list(a.shape[::-1])!s:18} {a.nbytes / 1024:6.1f} KiB")

# %% [markdown]
# Its size does not depend on how many tokens have been read. A Llama's KV cache grows by
# `2 x n_layer x n_embd_kv` numbers per token. For a model of this width (and a Llama of the same width with
# full multi-head attention):

# %%
n_layer, C = model.hparams.n_layer, model.hparams.n_embd
ctx = np.arange(1, 4097)
rwkv_bytes = sum(getattr(state, k).nbytes for k in ("shift_att", "shift_ffn", "wkv"))
fig, ax = plt.subplots(figsize=(6, 3.2))
ax.plot(ctx, np.full(ctx.shape, rwkv_bytes / 1024), label="RWKV state")
ax.plot(ctx, 2 * n_layer * C * 4 * ctx / 1024, label="Llama KV cache (f32)")
ax.set_xlabel("tokens read")
ax.set_ylabel("KiB")
ax.set_yscale("log")
ax.legend()
plt.show()

# %% [markdown]
# ## WKV: a linear recurrence
#
# The heart of a block is `rwkv_wkv6` (ggml's op for RWKV-6, which v5 also runs, with a decay that does not
# depend on the token). Per head, with receptance `r`, key `k`, value `v` (vectors of `head_size`), decay `w`
# and bonus `u`:
#
#     out_t[j] = Σ_i r_t[i] * (u[i] k_t[i] v_t[j] + S[i][j])
#     S[i][j] ← w[i] S[i][j] + k_t[i] v_t[j]
#
# The state `S` is a matrix per head, decayed channel by channel and updated by an outer product. Here is
# the recurrence as a loop, against the op (which takes all heads and tokens at once and returns the final
# state below the outputs):

# %%
print(refimpl.rwkv_wkv6.__doc__.split("\n\n")[1])

# %%
T, H, N = 24, 2, 8
k, v, r = (rng.standard_normal((T, H, N)).astype(np.float32) for _ in range(3))
w = np.exp(-np.exp(rng.uniform(-4, 0.5, (H, N)))).astype(np.float32)      # decays in (0, 1)
u = rng.uniform(-0.5, 1, (H, N)).astype(np.float32)
S0 = np.zeros((1, H * N * N), np.float32)

out = refimpl.rwkv_wkv6(k, v, r, u, np.broadcast_to(w, (T, H, N)).copy(), S0)   # (T + N, H * N)
y_op, S_op = out[:T].reshape(T, H, N), out[T:].reshape(H, N, N)

y_loop = np.zeros((T, H, N))
S = np.zeros((H, N, N))                                                    # S[h, i, j]: key i, value j
for t in range(T):
    kv = k[t][:, :, None].astype(np.float64) * v[t][:, None, :]             # outer products, (H, N, N)
    y_loop[t] = np.einsum("hi,hij->hj", r[t], u[:, :, None] * kv + S)
    S = w[:, :, None] * S + kv
print("outputs: NMSE loop vs op", nmse(y_loop, y_op), "| final state: NMSE", nmse(S, S_op),
      "| bound", tol("rwkv_wkv6", "f32", "property").nmse)

# %% [markdown]
# (The op returns the final state below the outputs, as `head_size` more rows of `n_head * head_size`:
# the `n_head x head_size x head_size` block in the state's own layout, hence the reshape.)
#
# Unrolled, the recurrence is attention without a softmax: token `t` reads token `s < t` with weight
# `Σ_i r_t[i] w[i]^(t-1-s) k_s[i]` and itself with `Σ_i r_t[i] u[i] k_t[i]`. That matrix, for one head, shows
# the exponential forgetting; each channel forgets at its own rate, with a half-life of `ln 2 / -ln w`
# tokens:

# %%
h = 0
A = np.zeros((T, T))
for t in range(T):
    for s in range(t):
        A[t, s] = np.sum(r[t, h] * w[h] ** (t - 1 - s) * k[s, h])
    A[t, t] = np.sum(r[t, h] * u[h] * k[t, h])
print("the unrolled form gives the same outputs:", np.allclose(A @ v[:, h].astype(np.float64), y_op[:, h], atol=1e-5))
fig, axs = plt.subplots(1, 2, figsize=(11, 3.8))
im = axs[0].imshow(A, cmap="RdBu", vmin=-np.abs(A).max(), vmax=np.abs(A).max())
axs[0].set_title("token-to-token weights of head 0")
axs[0].set_xlabel("source token s")
axs[0].set_ylabel("reading token t")
fig.colorbar(im, ax=axs[0])
half_life = np.log(2) / -np.log(decay_and_bonus(model, 0)[0].reshape(-1))      # w of every channel
axs[1].hist(half_life, bins=np.logspace(-1, 4, 40))
axs[1].set_xscale("log")
axs[1].set_xlabel("half-life (tokens)")
axs[1].set_title("memory of each channel, layer 0 of the model")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Sequence mode and token mode
#
# Because the state carries everything, feeding a prompt in one call, in chunks, or one token at a time
# gives the same logits and the same final state. The one-call form is what makes prompt processing fast
# (matrix products over all tokens); the token form is generation.

# %%
tokens = rng.integers(0, model.hparams.vocab, 40)
logits_seq, state_seq = rwkv.forward(model, tokens)                       # logits of the last token

st = None
for t in tokens:
    logits_tok, st = rwkv.forward(model, [t], st)

logits_a, st2 = rwkv.forward(model, tokens[:25])
logits_chunks, st2 = rwkv.forward(model, tokens[25:], st2)

bound = tol("rwkv.forward", "f32", "sequence").nmse
print(f"token by token vs one call: logits NMSE {nmse(logits_tok, logits_seq):.1e}, wkv state NMSE "
      f"{nmse(st.wkv, state_seq.wkv):.1e}  (bound {bound:g})")
print(f"two chunks     vs one call: logits NMSE {nmse(logits_chunks, logits_seq):.1e}")

# %% [markdown]
# The state passed in is never modified, so a state is also a checkpoint of a conversation: continue
# from it twice and the two continuations start from the same place.

# %%
before = state_seq.copy()
a1, _ = rwkv.forward(model, [1, 2, 3], state_seq)
a2, _ = rwkv.forward(model, [1, 2, 3], state_seq)
print("state unchanged:", state_seq == before, "| same continuation twice:", np.array_equal(a1, a2))

# %% [markdown]
# `capture=` shows what flows through a block, e.g. each layer's WKV output and residual stream:

# %%
cap = {}
rwkv.forward(model, tokens, capture=cap)
print([n for n in cap if n.endswith("-0")])
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot([np.sqrt(np.mean(cap[f"l_out-{il}"] ** 2)) for il in range(n_layer)], marker="o")
ax.set_xlabel("layer")
ax.set_ylabel("RMS of the residual stream")
plt.show()

# %% [markdown]
# ## A model that has learned something
#
# Random weights show the mechanism, not what it is for. rwkv.cpp's tests carry tiny *trained* models:
# `tiny-rwkv-5v2-730K` is an RWKV-5.2 of 12 layers, 64 wide, 8 heads of 8, over bytes (a 256-token
# vocabulary), trained on instruction data in JSON. refimpl keeps none of rwkv.cpp's files; these cells read
# it from `../../shared/rwkv_cpp/` beside the repository or `$REFIMPL_RWKV_CPP_TESTS` (rwkv.cpp's `tests/`
# folder), and say so when it is absent. With it, the model writes JSON-shaped English: its state carries
# what it has read.

# %%
from pathlib import Path

from refimpl.sampling import Sampler

TINY = Path(os.environ.get("REFIMPL_RWKV_CPP_TESTS") or "../../shared/rwkv_cpp") / "tiny-rwkv-5v2-730K-FP16.bin"
tiny = rwkv.load(TINY) if TINY.is_file() else None
if tiny is None:
    print(f"{TINY} is absent: copy rwkv.cpp's tests/ folder there (or set REFIMPL_RWKV_CPP_TESTS) to run "
          "this section. With it, the model continues '{\"instruction\": \"' with a JSON record of English words.")
else:
    print(tiny.hparams)
    ids = rwkv.generate(tiny, list(b'{"instruction": "'), max_tokens=240, sampler=Sampler(temperature=0.7, seed=1))
    print('{"instruction": "' + bytes(ids).decode("utf-8", "replace"))

# %% [markdown]
# **How far back does the state remember?** Feed the model a record and count the bits it needs for each next
# byte, `-log2 p(byte)`: with the state of everything before it, and with a fresh state given only the last
# `L` bytes. A model that knew nothing would need 8 bits a byte. If the state kept nothing from further back
# than `L` bytes, the two would agree. (What it shows, for readers without the model files: 4.4 bits a byte
# with one byte of context, 2.6 with 4, 2.2 with 8, and with 16 the whole state's 2.1: this tiny model's
# decays are short, and its memory is about a dozen bytes.)

# %%
def log_softmax(z):
    z = z.astype(np.float64) - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


if tiny is not None:
    text = (b'{"instruction": "Give three tips for staying healthy.", "input": "", '
            b'"output": "1. Eat a balanced diet and make sure to include plenty of fruits."}')
    nxt = np.frombuffer(text, np.uint8)[1:]                   # the byte each position predicts
    full = -log_softmax(rwkv.forward(tiny, list(text), all_logits=True)[0])[np.arange(len(nxt)), nxt] / np.log(2)
    start, reach = 16, {}                                    # positions with at least 16 bytes before them
    for L in (1, 2, 4, 8, 16):
        reach[L] = np.array([-log_softmax(rwkv.forward(tiny, list(text[i - L + 1:i + 1]))[0])[nxt[i]]
                             for i in range(start, len(nxt))]) / np.log(2)
    print(f"bits per byte, positions {start}..{len(nxt) - 1}: whole state {full[start:].mean():.2f}; "
          + ", ".join(f"last {L}: {b.mean():.2f}" for L, b in reach.items()))
    fig, axs = plt.subplots(2, 1, figsize=(9, 5.6), gridspec_kw={"height_ratios": [1.3, 1]})
    pos = np.arange(start, len(nxt))
    axs[0].plot(pos, full[start:], label="whole state", lw=1.2)
    axs[0].plot(pos, reach[1], label="last byte only", lw=0.8, alpha=0.7)
    axs[0].set_xticks(pos, [chr(b) for b in nxt[start:]], fontsize=6, family="monospace")
    axs[0].set_ylabel("bits for this byte")
    axs[0].legend(fontsize=8, loc="upper right")
    axs[1].plot(list(reach), [b.mean() for b in reach.values()], marker="o", label="a fresh state, last L bytes")
    axs[1].axhline(full[start:].mean(), color="tab:green", ls="--", label="the whole state")
    axs[1].axhline(8, color="0.6", ls=":", label="knowing nothing (8 bits)")
    axs[1].set_xscale("log", base=2)
    axs[1].set_xticks(list(reach), [str(L) for L in reach])
    axs[1].set_xlabel("L, bytes of context")
    axs[1].set_ylabel("mean bits per byte")
    axs[1].legend(fontsize=8)
    plt.tight_layout()
    plt.show()

# %% [markdown]
# Where that memory lives: the trained decays. Every channel of every layer forgets with a half-life of
# `ln 2 / -ln w` tokens (the histogram earlier showed the random model's, spread over decades by construction).
# This model learned half-lives under one byte in all 12 layers; what reaches a dozen bytes back is the
# stack of 12 layers, each also mixing in the previous byte through its token shift.

# %%
if tiny is not None:
    n_tiny = tiny.hparams.n_layer
    hl_tiny = [np.log(2) / -np.log(decay_and_bonus(tiny, il)[0].reshape(-1).astype(np.float64))
               for il in range(n_tiny)]
    fig, ax = plt.subplots(figsize=(8, 3.2))
    for il, h in enumerate(hl_tiny):
        ax.scatter(np.full(h.size, il), h, s=8, alpha=0.5, color="tab:blue")
    ax.set_yscale("log")
    ax.set_xticks(range(n_tiny))
    ax.set_xlabel("layer of the trained tiny-rwkv-5v2-730K")
    ax.set_ylabel("half-life (tokens, log)")
    ax.set_title(f"every channel's half-life: {min(h.min() for h in hl_tiny):.2f} to "
                 f"{max(h.max() for h in hl_tiny):.2f} tokens", fontsize=10)
    plt.tight_layout()
    plt.show()

# %% [markdown]
# ## Try this
#
# In the WKV cell, make every decay close to 1 (`w = np.full((H, N), 0.999, np.float32)`) and run it and the
# attention-matrix cell again: a token's key now reaches every later token almost undiminished, where decays
# near 0 forget it at once. The state keeps its size either way: that is what makes RWKV an RNN.

# %% [markdown]
# ## Exercises
#
# **1. One head's WKV.** Write `my_wkv(k, v, r, u, w, S)` for one head: `k, v, r` `(T, N)`, `u, w` `(N,)`, the state
# `S` `(N, N)` (key index first). Return the outputs `(T, N)` and the final state, stacked as the op does:
# `np.concatenate([y, S_final])`, shape `(T + N, N)`. Checked against `refimpl.rwkv_wkv6`.

# %%
def my_wkv(k, v, r, u, w, S):
    raise NotImplementedError   # your code here


# %% tags=["solution"] jupyter={"source_hidden": true}
def solution_wkv(k, v, r, u, w, S):
    S = S.astype(np.float64)
    y = np.zeros(k.shape)
    for t in range(k.shape[0]):
        kv = np.outer(k[t], v[t])
        y[t] = r[t] @ (u[:, None] * kv + S)
        S = w[:, None] * S + kv
    return np.concatenate([y, S]).astype(np.float32)


# %%
def ref_wkv(k, v, r, u, w, S):
    T, N = k.shape
    return refimpl.rwkv_wkv6(k[:, None], v[:, None], r[:, None], u[None], np.broadcast_to(w, (T, 1, N)).copy(),
                             S.reshape(1, N * N))


wkv_cases = []
for T_, N_ in ((1, 4), (7, 8), (30, 16)):
    wkv_cases.append(tuple(rng.standard_normal((T_, N_)).astype(np.float32) for _ in range(3))
                     + (rng.uniform(-0.5, 1, N_).astype(np.float32), rng.uniform(0.05, 0.999, N_).astype(np.float32),
                        rng.standard_normal((N_, N_)).astype(np.float32)))
check(my_wkv, ref_wkv, wkv_cases, solution=solution_wkv, exact=False, rtol=1e-5)

# %% [markdown]
# **2. Generation from a state.** Write `my_last_logits(tokens)`, which feeds `tokens` to `model` one at a time,
# passing the state along, and returns the logits after the last one. Checked against one `rwkv.forward` call
# over all of them.

# %%
def my_last_logits(tokens):
    raise NotImplementedError   # your code here


# %% tags=["solution"] jupyter={"source_hidden": true}
def solution_last_logits(tokens):
    state = None
    for t in tokens:
        logits, state = rwkv.forward(model, [t], state)
    return logits


# %%
check(my_last_logits, lambda toks: rwkv.forward(model, toks)[0], [tokens[:5], tokens[:17]],
      solution=solution_last_logits, exact=False, rtol=1e-5)
