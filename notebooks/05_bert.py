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
# # 05 · Sentence embeddings with all-MiniLM-L6-v2
#
# A BERT encoder reads a whole sentence at once (no causal mask, no cache) and its per-token states are
# pooled into one vector per sentence. refimpl runs llama.cpp's `bert` graph (`refimpl.models.bert`) on a
# Hugging Face / sentence-transformers directory or on a GGUF. This notebook embeds sentences with
# all-MiniLM-L6-v2, looks at the pooling choices and the padding mask of a batch, compares with the
# embeddings sentence-transformers itself produced, and draws a similarity heatmap.

# %%
import os
os.environ.setdefault("REFIMPL_BACKEND", "numpy")   # run the NumPy reference itself (no compiled kernels)

import json

import matplotlib.pyplot as plt
import numpy as np

import refimpl
from refimpl.models import bert
from exercise import check

model = bert.load(refimpl.fetch.fetch("minilm"))   # the model directory: config.json, safetensors, tokenizer
print(model.hparams)

# %% [markdown]
# ## Tokens and states
#
# The WordPiece tokenizer wraps each text in `[CLS] ... [SEP]`. `forward` returns one `(n_tokens, n_embd)`
# array of final states per sequence (ggml ne `[n_embd, n_tokens]`).

# %%
tok = model.tokenizer
text = "Refimpl computes sentence embeddings."
ids = tok.encode(text)
print(ids)
print([tok.decode([i]) for i in ids])
h = bert.forward(model, ids)
print("states", h.shape)

# %% [markdown]
# ## Pooling
#
# Three ways to turn the states into one vector: `mean` (the average over the sentence's tokens: what this
# model was trained with), `cls` (the first token's state) and `last`. `embed` pools and, with
# `normalize=True`, scales each vector to unit length, so that a dot product is a cosine similarity.

# %%
print("mean pooling by hand equals embed's:",
      np.allclose(bert.normalize(h.mean(axis=0, keepdims=True)), bert.embed(model, [text]), atol=1e-6))

# %% [markdown]
# What the pooling changes: the cosine similarity of five sentences, two pairs of paraphrases and one
# unrelated sentence, under each pooling. With `mean` (what MiniLM was trained for) the pairs score about 0.6
# and unrelated sentences about 0; the `cls` token's state makes every sentence look alike (0.4 to 0.9).

# %%
pair_texts = ["A man is playing a guitar.", "Someone plays an instrument.", "The stock market fell sharply today.",
              "Shares dropped at the close of trading.", "A cat sleeps on the sofa."]
fig, axs = plt.subplots(1, 3, figsize=(10, 3.6))
for ax, pooling in zip(axs, ("mean", "cls", "last")):
    e = bert.embed(model, pair_texts, pooling=pooling, normalize=True)     # (5, 384), unit rows
    sim = e @ e.T                                                          # cosines
    ax.imshow(sim, vmin=-0.2, vmax=1, cmap="viridis")
    for i in range(5):
        for j in range(5):
            ax.text(j, i, f"{sim[i, j]:.2f}", ha="center", va="center", fontsize=7,
                    color="black" if sim[i, j] > 0.6 else "white")
    ax.set_title(f"pooling={pooling!r}", fontsize=9)
    ax.set_xticks(range(5), [f"s{i}" for i in range(5)], fontsize=8)
    ax.set_yticks(range(5), [f"s{i}" for i in range(5)], fontsize=8)
plt.tight_layout()
plt.show()
for i, t in enumerate(pair_texts):
    print(f"s{i}: {t}")

# %% [markdown]
# ## A batch and its mask
#
# Texts of different lengths are padded to the longest and run as one batch `(n_seq, n_tokens, n_embd)`.
# The attention mask gives every padded key `-inf`, so a sentence's result does not depend on what it is
# batched with:

# %%
texts = ["A cat.", "A cat sat on the warm windowsill all afternoon, watching birds."]
lengths = [len(tok.encode(t)) for t in texts]
mask = bert.key_mask(lengths, max(lengths))             # (n_seq, 1, n_tokens, n_kv)
fig, axs = plt.subplots(1, 2, figsize=(8, 3))
for s in range(2):
    axs[s].imshow(np.isfinite(mask[s, 0]), cmap="gray", vmin=0, vmax=1)
    axs[s].set_title(f"sequence {s}: {lengths[s]} tokens (white: may attend)", fontsize=9)
    axs[s].set_xlabel("key")
axs[0].set_ylabel("query")
plt.tight_layout()
plt.show()
alone = bert.embed(model, texts[:1])
batched = bert.embed(model, texts)[:1]
print("'A cat.' alone vs batched with a long sentence: max |diff|", np.abs(alone - batched).max())

# %% [markdown]
# ## Against sentence-transformers
#
# `refimpl.fetch.golden("bert_minilm")` holds embeddings that sentence-transformers (PyTorch, CPU) produced for
# 36 varied sentences. The cosine between refimpl's and its embedding, per sentence:

# %%
golden = np.load(refimpl.fetch.golden("bert_minilm"))       # shipped with refimpl
sentences = json.loads(str(golden["sentences"]))[:16]
ours = bert.embed(model, sentences)
cos = np.sum(ours * golden["st_emb"][:16], axis=1)
for s, c in zip(sentences[:6], cos):
    print(f"{c:.8f}  {s[:60]!r}")
print(f"smallest cosine over {len(sentences)} sentences: {cos.min():.8f}")

# %% [markdown]
# (The last digits differ because llama.cpp's graph, which refimpl follows, uses the tanh approximation of
# GELU where the Hugging Face model uses the exact erf; `bert.load(path, act="gelu_erf")` switches. The module
# docstring gives the measured effect of each against both references.)
#
# ## Similarity
#
# Unit vectors make the Gram matrix a table of cosines. Sentences about the same thing land close together,
# whatever their words:

# %%
corpus = ["A man is eating food.", "A man is eating a piece of bread.", "Someone is having lunch.",
          "A man is riding a horse.", "A person rides an animal through a field.",
          "The stock market fell sharply today.", "Shares dropped after the earnings report.",
          "The new phone has a better camera.", "This smartphone takes great photos.",
          "It is raining in the city."]
E = bert.embed(model, corpus)
S = E @ E.T
fig, ax = plt.subplots(figsize=(8, 6.5))
im = ax.imshow(S, cmap="viridis", vmin=-0.1, vmax=1)
ax.set_xticks(range(len(corpus)), [c[:28] for c in corpus], rotation=70, ha="right", fontsize=8)
ax.set_yticks(range(len(corpus)), [c[:28] for c in corpus], fontsize=8)
for (i, j), v in np.ndenumerate(S):
    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6, color="w" if v < 0.6 else "k")
fig.colorbar(im)
ax.set_title("cosine similarity, all-MiniLM-L6-v2 through refimpl")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Try this
#
# Add two sentences of your own to `corpus` in the similarity cell: one that means "A man is eating food." in
# other words, and one that shares its words but not its meaning. Which does MiniLM place closer? Then in the
# batch cell, lengthen the second text: `alone` and `batched` stay equal, because the mask keeps the padding
# out of the short sentence's attention.

# %% [markdown]
# ## Exercises
#
# **1. Masked mean pooling.** Write `my_mean_pool(states, lengths)`: `states` is a padded batch
# `(n_seq, n_tokens, n_embd)`, `lengths` the real length of each sequence; return `(n_seq, n_embd)`, the mean
# over each sequence's own tokens only. Checked against `bert.pool(states[s, :n], "mean")` per sequence.

# %%
def my_mean_pool(states, lengths):
    raise NotImplementedError   # your code here


# %% tags=["solution"] jupyter={"source_hidden": true}
def solution_mean_pool(states, lengths):
    keep = np.arange(states.shape[1])[None, :] < np.asarray(lengths)[:, None]          # (n_seq, n_tokens)
    total = np.einsum("st,ste->se", keep.astype(np.float64), states.astype(np.float64))
    return (total / np.asarray(lengths)[:, None]).astype(np.float32)


# %%
def ref_mean_pool(states, lengths):
    return np.stack([bert.pool(states[s, :n], "mean") for s, n in enumerate(lengths)])


cap = {}
bert.forward(model, [tok.encode(t) for t in texts], capture=cap)
rng = np.random.default_rng(0)
check(my_mean_pool, ref_mean_pool, [(cap["result_embd"], lengths),
                                    (rng.standard_normal((3, 7, 16)).astype(np.float32), [7, 1, 4])],
      solution=solution_mean_pool, exact=False, rtol=1e-6)

# %% [markdown]
# **2. Nearest neighbour.** Write `my_most_similar(query, corpus)`: the index of the corpus sentence whose
# embedding has the largest cosine with the query's. Use `bert.embed`. Checked against the answer computed
# from refimpl's embeddings above.

# %%
def my_most_similar(query, corpus):
    raise NotImplementedError   # your code here


# %% tags=["solution"] jupyter={"source_hidden": true}
def solution_most_similar(query, corpus):
    e = bert.embed(model, [query] + list(corpus))
    return int(np.argmax(e[1:] @ e[0]))


# %%
def ref_most_similar(query, corpus):
    return int(np.argmax(E @ bert.embed(model, [query])[0]))


check(my_most_similar, ref_most_similar, [("Is it going to rain?", corpus), ("He enjoys a sandwich.", corpus)],
      solution=solution_most_similar)
