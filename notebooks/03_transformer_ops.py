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
# # 03 · The ops of a transformer block
#
# Four ops carry most of a Llama layer besides the matrix products: `rms_norm`, `rope_ext`,
# `soft_max_ext` and, fused, `flash_attn_ext`. Each is a short NumPy function in refimpl whose docstring
# gives both shapes, the math, and the precision choices that make it agree with ggml. Here we look at
# what each computes, with pictures, and check the identities that define them.

# %%
import os
os.environ.setdefault("REFIMPL_BACKEND", "numpy")   # run the NumPy reference itself (no compiled kernels)

import matplotlib.pyplot as plt
import numpy as np

import refimpl
from refimpl.ops.rope import ROPE_TYPE_NEOX, ROPE_TYPE_NORMAL, rope_cache, yarn_corr_dims
from refimpl.ops.softmax import alibi_slopes
from refimpl.testing import nmse, tol
from exercise import check

rng = np.random.default_rng(0)

# %% [markdown]
# ## rms_norm
#
# Each row (ggml dim 0, NumPy's last axis) is divided by its root-mean-square. There is no gain: llama.cpp
# multiplies by the norm weight with a separate `mul`.

# %%
print(refimpl.rms_norm.__doc__)

# %% [markdown]
# The smallest case, by hand: the row `(3, 4)` has mean square `(9 + 16) / 2 = 12.5`, RMS `3.5355`, so
# `rms_norm` (eps 0) gives `(3, 4) / 3.5355 = (0.8485, 1.1314)`:

# %%
print(refimpl.rms_norm(np.array([[3, 4]], np.float32), 0.0), "| by hand:", np.array([3, 4]) / np.sqrt(12.5))

# %% [markdown]
# The defining identity is `mean(out²) = ms / (ms + eps)` with `ms = mean(x²)`: rows far above `eps` come
# out with unit RMS, rows near or below it are only partly scaled up. With rows of very different sizes:

# %%
scales = np.logspace(-5, 2, 200).astype(np.float32)
rows = (rng.standard_normal((200, 576)) * scales[:, None]).astype(np.float32)     # (n_tokens, n_embd)
fig, ax = plt.subplots(figsize=(6, 3.5))
for eps in (0.0, 1e-6, 1e-5, 1e-3):
    out = refimpl.rms_norm(rows, eps)
    ax.plot(np.sqrt(np.mean(rows.astype(np.float64) ** 2, -1)), np.sqrt(np.mean(out.astype(np.float64) ** 2, -1)),
            label=f"eps={eps:g}")
ax.set_xscale("log")
ax.set_xlabel("RMS of the input row")
ax.set_ylabel("RMS of rms_norm(row)")
ax.legend()
plt.show()

ms = np.mean(rows.astype(np.float64) ** 2, axis=-1)
out = refimpl.rms_norm(rows, 1e-5)
print("NMSE of mean(out²) against ms/(ms+eps):", nmse(np.mean(out.astype(np.float64) ** 2, -1), ms / (ms + 1e-5)),
      "| bound used by refimpl's property tests:", tol("rms_norm", "f32", "property").nmse)

# %% [markdown]
# ## rope_ext: rotating pairs by position
#
# RoPE rotates each pair of dims of a head by an angle `theta_i(p) = p * base^(-2i/n_dims)` that grows with
# the position `p` and shrinks with the pair index `i`. SmolLM2 uses `n_dims = head_dim = 64` and
# `freq_base = 100000`. refimpl computes the angles exactly as ggml does (an f32 recurrence, the definition);
# `rope_cache` returns the cos/sin table for a list of positions:

# %%
n_dims, base = 64, 100000.0
pos = np.arange(0, 512, dtype=np.int32)
cos, sin = rope_cache(pos, None, n_dims, n_dims, freq_base=base)
fig, axs = plt.subplots(1, 2, figsize=(12, 3.6))
im = axs[0].imshow(cos.T, aspect="auto", cmap="RdBu", origin="lower")
axs[0].set_xlabel("position p")
axs[0].set_ylabel("pair i")
axs[0].set_title("cos(theta_i(p)): fast pairs (bottom) to slow pairs (top)")
fig.colorbar(im, ax=axs[0])
theta = np.arctan2(sin, cos)
for i in (0, 4, 8, 16, 31):
    axs[1].plot(pos[:128], np.unwrap(theta[:128, i]), label=f"pair {i}")
axs[1].set_xlabel("position p")
axs[1].set_ylabel("angle (rad)")
axs[1].set_title("angle per position, unwrapped")
axs[1].legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# Two modes pair the dims differently. `NORMAL` (mode 0, Llama GGUFs) rotates adjacent dims `(2i, 2i+1)`;
# `NEOX` (mode 2, GPT-NeoX, Qwen, ...) rotates `(i, i + n_dims/2)`. A vector with a single 1 shows which
# dim each pair moves into:

# %%
x = np.zeros((1, 1, 8), np.float32)                              # (n_tokens, n_head, head_dim)
x[0, 0, 1] = 1.0
p1 = np.array([1], np.int32)
for mode, name in ((ROPE_TYPE_NORMAL, "NORMAL"), (ROPE_TYPE_NEOX, "NEOX")):
    print(f"{name:6}", np.round(refimpl.rope_ext(x, p1, n_dims=8, mode=mode, freq_base=1.0)[0, 0], 3))

# %% [markdown]
# Rotations keep lengths, and the score between a rotated query and key depends only on the distance
# between their positions. The last claim holds up to the f32 rounding of the angles, which refimpl's
# property tests bound:

# %%
q = rng.standard_normal((1, 1, 64)).astype(np.float32)
k = rng.standard_normal((1, 1, 64)).astype(np.float32)


def rope_at(t, p):
    return refimpl.rope_ext(t, np.array([p], np.int32), n_dims=64, freq_base=base)


print("norm kept:", np.linalg.norm(q), np.linalg.norm(rope_at(q, 300)))
scores = [float(np.sum(rope_at(q, p + 7).astype(np.float64) * rope_at(k, p))) for p in (0, 100, 1000)]
print("q at p+7 against k at p, for p = 0, 100, 1000:", scores)

# %% [markdown]
# ### YaRN: stretching the context
#
# To run a model beyond its training context, YaRN interpolates the slow pairs (divides their angles by
# the stretch factor, `freq_scale = 1/s`) while leaving the fast pairs alone (they already turn many times
# within the trained context), and ramps between the two over the pairs `yarn_corr_dims` picks from
# `beta_fast` and `beta_slow`. It also scales cos and sin by `1 + 0.1 ln s`. The ratio of YaRN's angle to the
# plain one, per pair, for SmolLM2's settings stretched 4x:

# %%
n_ctx_orig, s = 8192, 4.0
one = np.array([1], np.int32)                    # at position 1 no angle has wrapped around yet
plain_angle = np.arctan2(*rope_cache(one, None, n_dims, n_dims, freq_base=base)[::-1])[0]
fig, ax = plt.subplots(figsize=(7, 3.5))
for ext in (0.0, 1.0):
    cy, sy = rope_cache(one, None, n_dims, n_dims, n_ctx_orig=n_ctx_orig, freq_base=base, freq_scale=1 / s,
                        ext_factor=ext)
    mscale = np.hypot(cy, sy)[0, 0]
    ax.plot(np.arctan2(sy, cy)[0] / plain_angle, marker=".",
            label=f"ext_factor={ext:g} ({'YaRN' if ext else 'linear interpolation'}), |cos, sin| = {mscale:.3f}")
lo, hi = yarn_corr_dims(n_dims, n_ctx_orig, base, 32.0, 1.0)
ax.axvspan(lo, hi, color="gray", alpha=0.2, label=f"ramp: pairs {lo:g}..{hi:g}")
ax.set_xlabel("pair i")
ax.set_ylabel("angle / unscaled angle")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## soft_max_ext: scale, mask, ALiBi
#
# `soft_max_ext(a, mask, scale, max_bias)` is the attention softmax in one op: `softmax(scale*a + slope*mask)`
# per row, where `mask` is added (0 or `-inf` for a causal mask) and `slope` is ALiBi's per-head slope when
# `max_bias > 0`, else 1. With ALiBi the mask holds `-distance` instead of 0, so each head penalises distance
# linearly at its own rate. With all scores equal, the causal mask alone spreads each query's attention
# evenly over the past; ALiBi makes steep heads look at the last few tokens and flat heads far back.

# %%
n_tok, n_head = 32, 4
kq = np.zeros((n_head, n_tok, n_tok), np.float32)      # (n_head, n_tokens, n_kv): equal scores, so only the mask speaks
causal = np.triu(np.full((n_tok, n_tok), -np.inf, np.float32), 1)           # (n_tokens, n_kv)
alibi_mask = np.where(np.isinf(causal), causal, -(np.arange(n_tok)[:, None] - np.arange(n_tok)[None, :])).astype(np.float32)
plain = refimpl.soft_max_ext(kq, causal, scale=0.5)
alibi = refimpl.soft_max_ext(kq, alibi_mask, scale=0.5, max_bias=8.0)
print("ALiBi slopes for 4 heads, max_bias 8:", alibi_slopes(n_head, 8.0))
fig, axs = plt.subplots(1, 5, figsize=(15, 3))
axs[0].imshow(plain[0], cmap="magma", vmax=0.25)
axs[0].set_title("causal mask only")
for h in range(n_head):
    axs[h + 1].imshow(alibi[h], cmap="magma", vmax=0.25)
    axs[h + 1].set_title(f"ALiBi head {h}, slope {alibi_slopes(n_head, 8.0)[h]:g}")
for a in axs:
    a.set_xlabel("kv position")
axs[0].set_ylabel("query position")
plt.tight_layout()
plt.show()
print("rows sum to 1:", np.allclose(alibi.sum(-1), 1), "| masked entries are exactly 0:", np.all(alibi[:, causal == -np.inf] == 0))

# %% [markdown]
# ## flash_attn_ext: attention as an online softmax
#
# Softmax attention materialises the whole score matrix `K Q^T` before the softmax. Flash attention never
# does: it walks over the keys in tiles, keeping per query a running maximum `M`, a running normaliser `S`
# and an unnormalised output `O`. When a tile raises the maximum, what was accumulated is rescaled by
# `exp(M_old - M_new)`. At the end `O / S` is exactly the softmax-weighted sum, because every term has been
# multiplied by the same `exp(-M_final)`. Here is that loop, next to refimpl's two formulations:

# %%
def online_softmax_attention(q, k, v, mask, scale, tile=16):
    """q (n_tokens, head_dim), k, v (n_kv, head_dim), mask (n_tokens, n_kv): one head, f64."""
    M = np.full((q.shape[0], 1), -np.inf)
    S = np.zeros((q.shape[0], 1))
    O = np.zeros((q.shape[0], v.shape[1]))
    for j in range(0, k.shape[0], tile):
        s = scale * (q @ k[j:j + tile].T) + mask[:, j:j + tile]          # this tile's scores
        M_new = np.maximum(M, s.max(axis=1, keepdims=True))
        alpha = np.exp(M - M_new)                                        # rescales what came before
        p = np.exp(s - M_new)
        S = alpha * S + p.sum(axis=1, keepdims=True)
        O = alpha * O + p @ v[j:j + tile]
        M = M_new
    return O / S


n_tokens, n_kv, head_dim = 10, 70, 32
Q = rng.standard_normal((1, n_tokens, head_dim)).astype(np.float32)        # (n_head, n_tokens, head_dim)
K = rng.standard_normal((1, n_kv, head_dim)).astype(np.float32)            # (n_head_kv, n_kv, head_dim)
V = rng.standard_normal((1, n_kv, head_dim)).astype(np.float32)
mask = np.where(np.arange(n_kv)[None, :] <= np.arange(n_tokens)[:, None] + (n_kv - n_tokens), 0, -np.inf)
mask = mask.astype(np.float16)                                             # flash attention takes an f16 mask
scale = head_dim ** -0.5

online = online_softmax_attention(Q[0].astype(np.float64), K[0].astype(np.float64), V[0].astype(np.float64),
                                  mask.astype(np.float64), scale)
fused = refimpl.flash_attn_ext(Q, K, V, mask, scale)                       # (n_tokens, n_head, head_dim): permuted!
kq = refimpl.mul_mat(K, Q)                                                 # (n_head, n_tokens, n_kv)
probs = refimpl.soft_max_ext(kq, mask.astype(np.float32), scale)
unfused = refimpl.mul_mat(np.ascontiguousarray(V.transpose(0, 2, 1)), probs)   # (n_head, n_tokens, head_dim)

print("flash_attn_ext out numpy", fused.shape, "(tokens before heads, as ggml's result)")
print("NMSE online loop vs flash_attn_ext:       ", nmse(online, fused[:, 0]))
print("NMSE mul_mat/soft_max_ext/mul_mat vs flash:", nmse(unfused[0], fused[:, 0]))
bound = tol("flash_attn_ext", "f32", "property").bound(Q, K, V, mask, scale)   # per element, from the roundings
print("largest |unfused - flash| / its derived bound:", np.max(np.abs(unfused[0] - fused[:, 0]) / bound[:, 0]))

# %% [markdown]
# The running maximum of one query as the tiles go by, and how much of the final normaliser each tile
# contributes:

# %%
qi = 3
Ms, contrib = [], []
M_run = -np.inf
for j in range(0, n_kv, 16):
    s = scale * (Q[0, qi].astype(np.float64) @ K[0, j:j + 16].T.astype(np.float64)) + mask[qi, j:j + 16].astype(np.float64)
    M_run = max(M_run, s.max())
    Ms.append(M_run)
    contrib.append(s)
M_final = Ms[-1]
fig, axs = plt.subplots(1, 2, figsize=(10, 3))
axs[0].step(range(len(Ms)), Ms, where="mid")
axs[0].set_xlabel("tile")
axs[0].set_ylabel("running max M")
axs[1].bar(range(len(contrib)), [np.exp(c - M_final).sum() for c in contrib])
axs[1].set_xlabel("tile")
axs[1].set_ylabel("share of S (x exp(-M))")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Try this
#
# In the soft_max_ext cell, set `max_bias=1.0` instead of `8.0` and run it again: ALiBi's slopes shrink and
# every head's attention spreads further back over the past tokens. Which head changes most? Then in the rope
# cell, score `rope_at(q, p + 70)` against `rope_at(k, p)`: the score still depends only on the distance 70,
# never on `p`.

# %% [markdown]
# ## Exercises
#
# **1. rms_norm.** Write `my_rms_norm(x, eps)` for float32 `x` of any shape, normalising the last axis.
# Checked against `refimpl.rms_norm` to float32 rounding.

# %%
def my_rms_norm(x, eps):
    raise NotImplementedError   # your code here


# %% tags=["solution"] jupyter={"source_hidden": true}
def solution_rms_norm(x, eps):
    ms = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
    return (x / np.sqrt(ms + eps)).astype(np.float32)


# %%
norm_cases = [(rng.standard_normal(s).astype(np.float32) * 3, eps)
              for s, eps in (((4, 64), 1e-5), ((2, 3, 33), 1e-6), ((1025,), 0.1))]
check(my_rms_norm, refimpl.rms_norm, norm_cases, solution=solution_rms_norm, exact=False, rtol=1e-6)

# %% [markdown]
# **2. Masked softmax.** Write `my_soft_max(a, mask, scale)` for `a` `(n_head, n_tokens, n_kv)` and a mask
# `(n_tokens, n_kv)` of 0 and `-inf` shared by all heads. Checked against `refimpl.soft_max_ext`.

# %%
def my_soft_max(a, mask, scale):
    raise NotImplementedError   # your code here


# %% tags=["solution"] jupyter={"source_hidden": true}
def solution_soft_max(a, mask, scale):
    w = scale * a.astype(np.float64) + mask
    e = np.exp(w - w.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


# %%
sm_cases = [(rng.standard_normal((h, t, t)).astype(np.float32) * 4, np.triu(np.full((t, t), -np.inf, np.float32), 1), sc)
            for h, t, sc in ((1, 5, 1.0), (4, 12, 0.25), (9, 33, 0.125))]
check(my_soft_max, refimpl.soft_max_ext, sm_cases, solution=solution_soft_max, exact=False, rtol=1e-6)

# %% [markdown]
# **3. NEOX rope from the table.** Given `cos, sin = rope_cache(pos, None, n_dims, head_dim)`, each
# `(n_tokens, head_dim/2)`, write `my_rope_neox(x, pos, n_dims)` for `x` `(n_tokens, n_head, head_dim)`, rotating the
# pairs `(i, i + n_dims/2)` and leaving dims from `n_dims` on unchanged. Checked against
# `refimpl.rope_ext(..., mode=ROPE_TYPE_NEOX)`.

# %%
def my_rope_neox(x, pos, n_dims):
    raise NotImplementedError   # your code here


# %% tags=["solution"] jupyter={"source_hidden": true}
def solution_rope_neox(x, pos, n_dims):
    cos, sin = rope_cache(pos, None, n_dims, x.shape[-1])
    h = n_dims // 2
    c, s = cos[:, None, :h].astype(np.float64), sin[:, None, :h].astype(np.float64)
    x0, x1 = x[..., :h].astype(np.float64), x[..., h:n_dims].astype(np.float64)
    out = x.copy()
    out[..., :h] = x0 * c - x1 * s
    out[..., h:n_dims] = x0 * s + x1 * c
    return out


# %%
def ref_rope_neox(x, pos, n_dims):
    return refimpl.rope_ext(x, pos, n_dims=n_dims, mode=ROPE_TYPE_NEOX)


rope_cases = [(rng.standard_normal((t, h, d)).astype(np.float32), np.arange(p0, p0 + t, dtype=np.int32), nd)
              for t, h, d, nd, p0 in ((3, 2, 8, 8, 0), (5, 3, 64, 64, 100), (4, 2, 16, 8, 7))]
check(my_rope_neox, ref_rope_neox, rope_cases, solution=solution_rope_neox, exact=False, rtol=1e-6)
