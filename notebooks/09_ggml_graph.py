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
# # 09 · A ggml graph by hand
#
# refimpl's models run eagerly: each op returns its array at once. ggml does not. A ggml program
# first **builds a graph** (it allocates tensor headers in a *context*, and each op call only records a
# node with its sources), then hands the whole graph to a **backend** (CPU, CUDA, Vulkan, ...) that
# computes it into **buffers** of its own memory. The **allocator** decides where in a buffer each
# tensor lives; the **scheduler** splits a graph over several backends.
#
# ggml's RPC backend makes all of this visible: it sends the graph over a socket, tensor by tensor, to
# a server that computes it. `refimpl serve` is such a server, in readable Python. In this notebook we
# play the client's part by hand: allocate a buffer, describe tensors by their `ne` and `nb`, build a
# `MUL_MAT` node, send the graph, read the answer -- then watch a real Llama layer arrive from
# llama.cpp.

# %%
import os
os.environ.setdefault("REFIMPL_BACKEND", "numpy")   # run the NumPy reference itself (no compiled kernels)

import importlib.util
import json
import tempfile

import matplotlib.pyplot as plt
import numpy as np

import refimpl
from refimpl.rpc import Client, Server
from refimpl.rpc.client import graph_message
from refimpl.rpc.protocol import RPC_TENSOR, Cmd
from exercise import check

server = Server("127.0.0.1", 0, backend="numpy")      # in this process, on a free loopback port
server.start()
client = Client("127.0.0.1", server.port)             # connects and says HELLO
print("protocol version", client.version, "| devices:", client.device_count(),
      "| alignment", client.get_alignment(), "bytes")

# %% [markdown]
# ## The smallest graph: ggml's `examples/simple`
#
# ggml's README and its `examples/simple` multiply a 4 x 2 matrix `A` by a 3 x 2 matrix `B` and print
# the "transposed result". In ggml a row is `ne[0]` long, so `A` is `ne [2, 4]` and `B` is `ne [2, 3]`;
# `ggml_mul_mat(A, B)` dots every row of `B` with every row of `A` and has `ne [4, 3]`: NumPy's
# `B @ A.T`. By hand, over the protocol:
#
# 1. `ALLOC_BUFFER`: the server reserves memory and answers with a handle; `BUFFER_GET_BASE` gives the
#    address the tensors' `data` pointers are counted from.
# 2. Tensors are 296-byte `rpc_tensor` records: id, type, `ne`, `nb`, op, sources, buffer, data address.
#    We place them ourselves, 64 bytes apart -- the allocator's job in ggml.
# 3. `SET_TENSOR` copies the inputs' bytes in; `GRAPH_COMPUTE` sends the node list and every tensor it
#    reaches; `GET_TENSOR` reads the result back.

# %%
A = np.array([[2, 8], [5, 1], [4, 2], [8, 6]], np.float32)      # numpy (4, 2): ggml ne [2, 4]
B = np.array([[10, 5], [9, 9], [5, 4]], np.float32)             # numpy (3, 2): ggml ne [2, 3]

buf, size = client.alloc_buffer(1024)
base = client.buffer_get_base(buf)
T = Client.tensor
a = T(1, "f32", [2, 4], buf, base, name="a")
b = T(2, "f32", [2, 3], buf, base + 64, name="b")
result = T(3, "f32", [4, 3], buf, base + 128, op="MUL_MAT", src=[a, b], name="result")

client.set_tensor(a, A.tobytes())
client.set_tensor(b, B.tobytes())
client.graph_compute([result], [a, b, result])
out = np.frombuffer(client.get_tensor(result, 0, 4 * 12), np.float32).reshape(3, 4)

text = "mul mat (4 x 3) (transposed result):\n["        # printed as ggml's examples/simple prints it
for j, row in enumerate(out):
    text += ("\n" if j else "") + "".join(f" {v:.2f}" for v in row)
print(text + " ]")
ggml_prints = np.array([[60, 55, 50, 110], [90, 54, 54, 126], [42, 29, 28, 64]], np.float32)
print("\nthe answer ggml's README prints:", np.array_equal(out, ggml_prints),
      "| NumPy's B @ A.T:", np.array_equal(out, B @ A.T))

# %% [markdown]
# The first row is `B[0]` = (10, 5) dotted with each row of `A`: 10·2 + 5·8 = 60, 10·5 + 5·1 = 55, ...
# Nothing was computed when we described `result`: only when `GRAPH_COMPUTE` arrived did the server
# walk the node list and call refimpl's `mul_mat` on views of its buffer.
#
# ## One message, byte by byte
#
# Every message is a command byte, a 64-bit little-endian payload size, then the payload.
# `GRAPH_COMPUTE`'s payload is the device, the number of nodes, their ids, the number of tensors and
# the tensors themselves. Here is the start of the one we just sent, and the whole `rpc_tensor` of
# `result` drawn field by field:

# %%
payload = graph_message([result], [a, b, result])
message = bytes([int(Cmd.GRAPH_COMPUTE)]) + len(payload).to_bytes(8, "little") + payload
fields = [(0, 1, "command (10: GRAPH_COMPUTE)"), (1, 8, "payload size, u64"),
          (9, 4, "device, u32"), (13, 4, "number of nodes, u32"), (17, 8, "node id (3: result), u64"),
          (25, 4, "number of tensors, u32"), (29, 8, "tensor 1's id, u64 ... (296 bytes each)")]
for off, n, what in fields:
    print(f"{off:4d}  {message[off:off + n].hex(' '):<24}  {what}")
print(f"... {len(message)} bytes in all = 1 + 8 + 4 + 4 + 8 + 4 + 3 x {RPC_TENSOR.itemsize}")

rec = np.frombuffer(result, RPC_TENSOR)[0]
fig, ax = plt.subplots(figsize=(9, 2.6))
colors = plt.cm.tab20(np.linspace(0, 1, len(RPC_TENSOR.names)))
for (name, c) in zip(RPC_TENSOR.names, colors):
    off, n = RPC_TENSOR.fields[name][1], RPC_TENSOR.fields[name][0].itemsize
    ax.barh(0, n, left=off, color=c, edgecolor="white")
    if n >= 8:
        ax.text(off + n / 2, 0, name, ha="center", va="center", fontsize=8, rotation=90 if n < 24 else 0)
ax.set_yticks([])
ax.set_xlim(0, RPC_TENSOR.itemsize)
ax.set_xlabel("byte offset in one rpc_tensor")
ax.set_title(f"result's {RPC_TENSOR.itemsize} bytes: ne {rec['ne'].tolist()}, nb {rec['nb'].tolist()},\n"
             f"op {rec['op']} (MUL_MAT), src {rec['src'][:2].tolist()} (ids of a and b)", fontsize=9)
plt.tight_layout()

# %% [markdown]
# `nb` is `[4, 16, 48, 48]`: 4 bytes an element, 16 a row of 4, 48 the whole 4 x 3 -- NumPy's strides
# of `out`, reversed. `src` holds the ids 1 and 2: a graph is tensors that name their sources, and the
# message carries every tensor a node reaches so the server can rebuild the edges.
#
# ## What ggml would have done for us
#
# | ggml | what it does | what we did by hand |
# |---|---|---|
# | context (`ggml_init`) | an arena of tensor headers, no data | `Client.tensor(...)` records |
# | graph (`ggml_build_forward_expand`) | the nodes in compute order | `[result]` and the tensors it reaches |
# | backend (`ggml_backend_cpu_init`, the RPC backend) | a device that computes graphs | the server |
# | buffer (`ggml_backend_alloc_buffer`) | device memory | `ALLOC_BUFFER`, `BUFFER_GET_BASE` |
# | allocator (`ggml_gallocr`) | places every tensor, reusing memory of dead ones | `base`, `base + 64`, ... |
# | scheduler (`ggml_backend_sched`) | splits a graph over backends, copies between them | -- (one device) |
#
# With `llama-cli --rpc HOST:PORT -ngl 99` llama.cpp's scheduler puts every layer on the RPC device,
# and each token's whole graph travels in one `GRAPH_COMPUTE`; the weights were sent once, with
# `SET_TENSOR`, when the model loaded.
#
# ## A Llama layer, as llama.cpp sends it
#
# Now the real thing: llama.cpp (llama-cpp-python) loads SmolLM2 with every layer offloaded to a
# refimpl server that writes each node it computes, with its sources, to a dump directory
# (`refimpl serve --dump DIR`). Layer 0's nodes, in the order they arrive:

# %%
HAVE_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
nodes = []
if HAVE_LLAMA_CPP:
    from refimpl.compare import run_llama_cpp
    path = refimpl.fetch.fetch("smollm2")
    ids = refimpl.tokenizer.from_gguf(str(path)).encode("The capital of France is")
    dump = tempfile.mkdtemp(prefix="refimpl-dump-")
    with Server("127.0.0.1", 0, backend="numpy", dump=dump) as llama_server:
        run = run_llama_cpp(path, ids, capture=False, rpc=f"127.0.0.1:{llama_server.port}")
    nodes = [json.loads(line) for line in open(os.path.join(dump, "index.jsonl"))]
    layer0 = [n for n in nodes if n["name"].split(" (")[0].endswith(("-0", "_l0"))]    # cache_k_l0
    print(f"{len(ids)} tokens; one GRAPH_COMPUTE of {len(nodes)} computed nodes "
          f"({len(layer0)} in layer 0); llama.cpp's top token: "
          f"{refimpl.tokenizer.from_gguf(str(path)).decode([int(run.logits[-1].argmax())])!r}")
    for n in layer0:
        print(f"{n['name']:<30} {n['op']:<11} ne {n['ne']}")
else:
    print("llama-cpp-python is not installed: this cell would list layer 0's 22 computed nodes as "
          "llama.cpp sends them (norm-0 RMS_NORM, attn_norm-0 MUL, Qcur-0 MUL_MAT, ..., l_out-0 ADD)")

# %% [markdown]
# The same layer drawn: each node a row, each arc an edge from a source computed earlier in the layer;
# on the left, what comes from outside it (weights `blk.0.*`, the graph's inputs such as `inp_pos` and
# the KV cache). Names with `(view)`, `(permuted)`, `(reshaped)` are views: ggml nodes that compute
# nothing, so the server never lists them -- the arcs go through them to the node they view.

# %%
if nodes:
    fig, ax = plt.subplots(figsize=(9.5, 0.36 * len(layer0) + 0.8))
    row = {}
    for y, n in enumerate(layer0):
        base_srcs = [s.split(" (")[0] for s in n["srcs"]]
        outside = [s.split("#")[1] if "#" in s else s for s, b in zip(n["srcs"], base_srcs) if b not in row]
        for s, b in zip(n["srcs"], base_srcs):
            if b in row:
                y0 = row[b]
                ax.annotate("", xy=(0, -y), xytext=(0, -y0),
                            arrowprops=dict(arrowstyle="->", color="tab:blue", lw=0.8,
                                            connectionstyle=f"arc3,rad={0.3 + 0.02 * (y - y0)}"))
        ax.text(0.15, -y, f"{n['name']}  {n['op']}  ne {n['ne'][:3]}", va="center", fontsize=8)
        ax.text(-1.1, -y, ", ".join(outside), va="center", ha="right", fontsize=7, color="gray")
        row[n["name"].split(" (")[0]] = y
    ax.set_xlim(-3.6, 3)
    ax.set_ylim(-len(layer0), 1)
    ax.axis("off")
    ax.set_title("layer 0 of SmolLM2, as llama.cpp sends it (one token's graph has 30 such layers)",
                 fontsize=9)
    plt.tight_layout()

# %% [markdown]
# Read it from the top: `RMS_NORM` then `MUL` by `blk.0.attn_norm.weight` is llama.cpp's
# `build_norm`; three `MUL_MAT`s make Q, K, V; `ROPE` turns Q and K; two `SET_ROWS` write K and V into
# the cache at the token positions; `MUL_MAT`, `SOFT_MAX` (with the causal mask), `MUL_MAT` are the
# attention; then the output projection, the residual `ADD`, and the SwiGLU feed-forward. Every node's
# value is in the dump directory as an `.npy`, so any of them can be checked against refimpl's own
# model (`llama.forward(..., capture=...)` names them the same way).

# %% [markdown]
# ## Try this
#
# In the first graph, give `result` the op `"ADD"` and the sources `[b, b]` with `ne [2, 3]`: what
# does the server compute? Then ask for `MUL_MAT` with `ne [3, 4]` instead of `[4, 3]`: the server checks
# the shape ggml's formula implies and refuses the node (its value comes back as NaN, and the server's
# log says why).

# %% [markdown]
# ## Exercises
#
# **1. A graph of your own.** Write `my_add(x, y)` that computes `x + y` for two float32 NumPy arrays of
# the same 2-D shape **on the server**: allocate a buffer, describe three tensors (remember: `ne` is
# the NumPy shape reversed), send `x` and `y`, compute an `ADD` node, and read the result back.
# Checked against `refimpl.add`.

# %%
def my_add(x, y):
    raise NotImplementedError   # your code here


# %% tags=["solution"] jupyter={"source_hidden": true}
def solution_add(x, y):
    n = x.nbytes
    buf, _ = client.alloc_buffer(3 * n + 256)
    base = client.buffer_get_base(buf)
    ne = list(x.shape[::-1])
    tx = T(1, "f32", ne, buf, base)
    ty = T(2, "f32", ne, buf, base + n + 64)
    tz = T(3, "f32", ne, buf, base + 2 * n + 128, op="ADD", src=[tx, ty])
    client.set_tensor(tx, x.tobytes())
    client.set_tensor(ty, y.tobytes())
    client.graph_compute([tz], [tx, ty, tz])
    z = np.frombuffer(client.get_tensor(tz, 0, n), np.float32).reshape(x.shape)
    client.free_buffer(buf)
    return z


# %%
rng = np.random.default_rng(0)
add_cases = [(rng.standard_normal(s).astype(np.float32), rng.standard_normal(s).astype(np.float32))
             for s in ((1, 4), (3, 5), (8, 16))]
check(my_add, refimpl.add, add_cases, solution=solution_add)

# %%
client.close()
server.stop()
