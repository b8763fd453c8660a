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
# # 01 · ggml tensors as NumPy arrays
#
# A ggml tensor is a pointer, a type, four extents `ne` and four byte strides `nb`, listed
# **fastest dimension first**: `ne[0]` is the number of elements in a row, `nb[0]` the size of one
# element. NumPy lists the same things **slowest first**. refimpl keeps NumPy's order everywhere and
# writes both in every docstring, so this notebook is about one fact and its consequences:
#
# > ggml `ne` = NumPy `shape` reversed, ggml `nb` = NumPy `strides` reversed.
#
# We look at shapes and strides, views and permutes, and `mul_mat`'s convention (`b @ a.T`, with ggml's
# own broadcasting), checking each claim against refimpl and, where it is installed, against real ggml.

# %%
import os
os.environ.setdefault("REFIMPL_BACKEND", "numpy")   # run the NumPy reference itself (no compiled kernels)

import inspect

import matplotlib.pyplot as plt
import numpy as np

import refimpl
from refimpl.testing import ggml as oracle
from exercise import check

HAVE_GGML = oracle.available()
print("real ggml available:", HAVE_GGML)


# %% [markdown]
# ## Two names for one shape
#
# A batch of 2 sequences of 3 tokens with 4 features each is NumPy shape `(2, 3, 4)`. In ggml it is
# `ne = [4, 3, 2, 1]`: 4 elements per row (the contiguous dim), 3 rows, 2 matrices. Strides say how
# many bytes to step along each dim; NumPy's `strides` are exactly ggml's `nb`, reversed.

# %%
def ne_nb(x: np.ndarray):
    """ggml's four extents and byte strides of a NumPy array (missing dims are 1, with ggml's strides)."""
    ne = list(x.shape[::-1]) + [1] * (4 - x.ndim)
    nb = list(x.strides[::-1])
    while len(nb) < 4:
        nb.append(nb[-1] * ne[len(nb) - 1])
    return ne, nb


x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
print("numpy shape", x.shape, "strides", x.strides)
print("ggml  ne", ne_nb(x)[0], "nb", ne_nb(x)[1])

# %% [markdown]
# Every shape error refimpl raises names the op and gives each operand in both orders, so a message
# can be checked against either code base without converting in your head:

# %%
try:
    refimpl.mul_mat(np.zeros((8, 64), np.float32), np.zeros((3, 32), np.float32))
except refimpl.GGMLShapeError as e:
    print(e)

# %% [markdown]
# ## Views are strides
#
# ggml never copies for a view, a transpose or a permute: it writes new `ne`/`nb` over the same bytes.
# NumPy does the same. `refimpl.view` takes ggml's arguments (shape and byte strides, NumPy order) and
# returns a NumPy view aliasing the source: here every other row of `m`, as `ggml_view_2d(m, 4, 3, 2*nb1, 0)`
# would make it.

# %%
m = np.arange(24, dtype=np.float32).reshape(6, 4)              # ne [4, 6]
v = refimpl.view(m, (3, 4), strides=(2 * m.strides[0], 4), offset=0)
print(v)
print("shares memory:", np.shares_memory(v, m), "| ne, nb of the view:", ne_nb(v))

# %% [markdown]
# A picture of the same idea: each cell shows the byte offset of a logical element. A permute changes
# only which offsets the logical indices point to; the memory (right) is untouched.

# %%
a = np.arange(12, dtype=np.float32).reshape(3, 4)              # ne [4, 3]
t = refimpl.transpose(a)                                       # ggml_transpose: ne [3, 4], a view


def offsets(view, base):
    start = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    idx = np.indices(view.shape)
    return start + sum(i * s for i, s in zip(idx, view.strides))


fig, axs = plt.subplots(1, 3, figsize=(11, 2.8))
for ax, arr, title in ((axs[0], a, f"a: numpy {a.shape}, strides {a.strides}"),
                       (axs[1], t, f"transpose(a): numpy {t.shape}, strides {t.strides}")):
    off = offsets(arr, a)
    ax.imshow(off, cmap="viridis")
    for (i, j), o in np.ndenumerate(off):
        ax.text(j, i, int(o), ha="center", va="center", color="w", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.set_xticks(range(arr.shape[1]))
    ax.set_yticks(range(arr.shape[0]))
    ax.set_xlabel("last numpy axis = ggml dim 0")
    ax.set_ylabel("numpy axis 0 = ggml dim 1")
axs[2].imshow(np.arange(12).reshape(1, 12) * 4, cmap="viridis", aspect="auto")
axs[2].set_xticks(range(12), [str(4 * i) for i in range(12)], fontsize=7)
axs[2].set_title("memory: 12 floats (byte offsets)", fontsize=9)
axs[2].set_yticks([])
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Permute: where each source dim goes
#
# `ggml_permute(t, a0, a1, a2, a3)` sends source dim `i` to result dim `a_i`. `np.transpose` asks the
# opposite question (where each result axis comes from), and counts axes from the other end. llama.cpp's
# `ggml_permute(q, 0, 2, 1, 3)` turns Q from `(n_tokens, n_head, head_dim)` into `(n_head, n_tokens, head_dim)`:

# %%
n_tokens, n_head, head_dim = 5, 3, 8
q = np.random.default_rng(0).standard_normal((n_tokens, n_head, head_dim)).astype(np.float32)
qp = refimpl.permute(q, 0, 2, 1, 3)
print("q  ne", ne_nb(q)[0], "-> permuted ne", ne_nb(qp)[0], "| numpy", q.shape, "->", qp.shape)
print("a view:", np.shares_memory(q, qp), "| equals q.transpose(1, 0, 2):", np.array_equal(qp, q.transpose(1, 0, 2)))

# %% [markdown]
# The same permute in real ggml (through `refimpl.testing.ggml.run`, which hands NumPy arrays to a
# ggml graph and reads the result back) gives the same numbers; `ggml_cont` makes ggml copy the view out:

# %%
def ggml_permute_cont(t):
    g = oracle.lib()
    return oracle.run(lambda ctx, a: g.ggml_cont(ctx, g.ggml_permute(ctx, a, 0, 2, 1, 3)), t)


out = oracle.live_or_recorded("01_permute_cont", lambda: ggml_permute_cont(q), q)   # recorded if no ggml-python
print("ggml's result, numpy shape", out.shape, "ggml ne", list(out.shape[::-1]), "| equal:", np.array_equal(out, qp))
print("row 0 of head 0, ggml:   ", out[0, 0].round(3), "\nrow 0 of head 0, refimpl:", qp[0, 0].round(3))

# %% [markdown]
# ## Quantized tensors keep whole rows
#
# A block-quantized tensor cannot be strided inside a row: a row is a run of blocks (32 or 256 values
# each). `refimpl.QTensor` holds the raw bytes, NumPy shape `shape[:-1] + (row_bytes,)`, and slicing
# its leading axes is a view, just like ggml's row views.

# %%
w = refimpl.quantize(np.random.default_rng(1).standard_normal((6, 64)).astype(np.float32), "q4_0")
print(w, "| ne", w.ne, "| data", w.data.shape, w.data.dtype)
rows = w[2:4]
print(rows, "| shares the bytes:", np.shares_memory(rows.data, w.data))

# %% [markdown]
# ## mul_mat: `b @ a.T`
#
# ggml's matrix product takes the **weight first** and dots every row of `b` with every row of `a`:
#
#     a    ne [k, n]   numpy (n, k)     e.g. a weight (n_out, n_in)
#     b    ne [k, m]   numpy (m, k)     e.g. activations (n_tokens, n_in)
#     out  ne [n, m]   numpy (m, n)     out = b @ a.T
#
# Both operands have `k` along their rows, so neither is transposed in memory. In ggml's words
# `C^T = A B^T`; in NumPy's, `out = b @ a.T`.
#
# The smallest case, ggml's own (its README and `examples/simple`): `A` is 4 x 2, `B` is 3 x 2, and ggml prints
# the 4 x 3 result `[60 55 50 110; 90 54 54 126; 42 29 28 64]` row by row of `out` -- check one by hand:
# row 0 of `B` is (10, 5), row 0 of `A` is (2, 8), and 10 * 2 + 5 * 8 = 60.

# %%
A = np.array([[2, 8], [5, 1], [4, 2], [8, 6]], np.float32)         # numpy (4, 2): ggml ne [2, 4]
B = np.array([[10, 5], [9, 9], [5, 4]], np.float32)                # numpy (3, 2): ggml ne [2, 3]
out = refimpl.mul_mat(A, B)                                        # numpy (3, 4): ggml ne [4, 3]
print(out)
print("what ggml's README prints:", np.array_equal(out, [[60, 55, 50, 110], [90, 54, 54, 126], [42, 29, 28, 64]]))

# %%
rng = np.random.default_rng(2)
W = rng.standard_normal((16, 32)).astype(np.float32)            # (n_out, n_in)
X = rng.standard_normal((5, 32)).astype(np.float32)             # (n_tokens, n_in)
Y = refimpl.mul_mat(W, X)
for name, arr in (("a = W", W), ("b = X", X), ("out", Y)):
    print(f"{name:6} numpy {arr.shape!s:9} ggml ne {list(arr.shape[::-1])}")
i, j = 2, 7                                                     # token 2, output feature 7
terms = X[i].astype(np.float64) * W[j]
print(f"out[{i}, {j}] = row {i} of b . row {j} of a = " + " + ".join(f"{t:.3f}" for t in terms[:3])
      + f" + ... (32 products) = {terms.sum():.6f}; refimpl: {Y[i, j]:.6f}")
print("max |out - X @ W.T| =", np.abs(Y - X @ W.T).max())

# %% [markdown]
# refimpl sums every dot product in float64 and rounds once ("exact" numerics), so it agrees with
# `X @ W.T` to float32 rounding. Quantized weights work the same way, dequantized a tile at a time:

# %%
Xq = X[:, :16].repeat(4, axis=1)                               # 64 features, as w's rows: numpy (5, 64)
Yq = refimpl.mul_mat(w, Xq)
print(f"a = w: {w}\nb: numpy {Xq.shape} ggml ne {list(Xq.shape[::-1])} -> out numpy {Yq.shape} ggml ne "
      f"{list(Yq.shape[::-1])}")
print("out == b @ dequantize(w).T to f32 rounding:", np.allclose(Yq, Xq @ refimpl.dequantize(w).T, rtol=1e-5,
      atol=1e-5), "| max |difference|:", np.abs(Yq - Xq @ refimpl.dequantize(w).T).max())

# %% [markdown]
# ## Broadcasting: repeat, not tile
#
# Beyond two dims, `a` is broadcast over `b`'s batch dims when `b`'s count is a multiple of `a`'s. ggml
# gives `a`'s batch `i` to `b`'s batches `i*r .. i*r + r - 1` (`r = b2 / a2`): `np.repeat`, not `np.tile`.
# This is exactly grouped-query attention: 3 K heads serve 9 Q heads in SmolLM2, each K head three
# consecutive Q heads.

# %%
K = rng.standard_normal((3, 7, 8)).astype(np.float32)          # (n_head_kv, n_kv, head_dim)
Q = rng.standard_normal((9, 5, 8)).astype(np.float32)          # (n_head, n_tokens, head_dim)
KQ = refimpl.mul_mat(K, Q)                                     # (n_head, n_tokens, n_kv)
as_repeat = Q @ np.repeat(K, 3, axis=0).transpose(0, 2, 1)
as_tile = Q @ np.tile(K, (3, 1, 1)).transpose(0, 2, 1)
print("kq numpy", KQ.shape, "| matches repeat:", np.allclose(KQ, as_repeat, atol=1e-5),
      "| matches tile:", np.allclose(KQ, as_tile, atol=1e-5))

# %% [markdown]
# Element-wise binary ops broadcast differently again: ggml repeats `b` to `a`'s shape when every `ne`
# of `a` is a multiple of `b`'s (a tile). NumPy would refuse `(4, 6) + (2, 6)`; ggml accepts it:

# %%
A = np.zeros((4, 6), np.float32)
B = np.arange(12, dtype=np.float32).reshape(2, 6)
print(refimpl.add(A, B))
try:
    A + B
except ValueError as e:
    print("numpy:", e)

# %% [markdown]
# The reference is short; read it rather than trusting this page (the body of `mul_mat`, after its docstring):

# %%
print(inspect.getsource(refimpl.mul_mat.reference).split('"""')[2])

# %% [markdown]
# ## Try this
#
# Change `Q` in the broadcasting cell to 6 heads (`rng.standard_normal((6, 5, 8))`) and run it again: now two
# query heads share each K head. `KQ` still equals `as_repeat`; which query heads does `as_tile` pair with the
# wrong K head? Then give `Q` 7 heads: 3 K heads cannot be shared among 7 query heads, and `refimpl.mul_mat`
# says so, with both shapes in ggml's order and in NumPy's.

# %% [markdown]
# ## Exercises
#
# **1. Permute.** Write `my_permute(x, a0, a1, a2, a3)` for a 4-D NumPy array with ggml's meaning (source dim
# `i` goes to result dim `a_i`), using `np.transpose`. It is checked against `refimpl.permute` for all 24
# permutations.

# %%
def my_permute(x, a0, a1, a2, a3):
    raise NotImplementedError   # your code here


# %% tags=["solution"] jupyter={"source_hidden": true}
def solution_permute(x, a0, a1, a2, a3):
    # result dim a_i = source dim i; numpy axis of ggml dim d is 3 - d
    p = [0] * 4
    for i, ai in enumerate((a0, a1, a2, a3)):
        p[3 - ai] = 3 - i
    return np.transpose(x, p)


# %%
import itertools

x4 = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
perms = [(x4, *p) for p in itertools.permutations(range(4))]
check(my_permute, refimpl.permute, perms, solution=solution_permute)

# %% [markdown]
# **2. Batched mul_mat.** Write `my_mul_mat(a, b)` for 3-D float32 `a` `(a2, n, k)` and `b` `(b2, m, k)` with
# `b2` a multiple of `a2`, returning `(b2, m, n)` with ggml's broadcasting. Checked against
# `refimpl.mul_mat` to float32 rounding.

# %%
def my_mul_mat(a, b):
    raise NotImplementedError   # your code here


# %% tags=["solution"] jupyter={"source_hidden": true}
def solution_mul_mat(a, b):
    a = np.repeat(a, b.shape[0] // a.shape[0], axis=0).astype(np.float64)
    return (b.astype(np.float64) @ a.transpose(0, 2, 1)).astype(np.float32)


# %%
mm_cases = [(rng.standard_normal((a2, n, 16)).astype(np.float32), rng.standard_normal((b2, m, 16)).astype(np.float32))
            for a2, b2, n, m in ((1, 1, 4, 3), (1, 3, 5, 2), (2, 6, 3, 7), (3, 9, 8, 1))]
check(my_mul_mat, refimpl.mul_mat, mm_cases, solution=solution_mul_mat, exact=False, rtol=1e-6)
