"""numerics="ggml" products on the weight types ggml 0.25.3 multiplies in its tiled kernels (ggml-cpu/tiled/),
bit for bit against ggml 0.25.3 itself: llama-cpp-python 0.3.36's libggml-base and libggml-cpu, a graph of one
ggml_mul_mat / ggml_mul_mat_id computed by ggml_graph_compute_with_ctx.

The tiled kernels take a product from 8 rows of activations on; below that ggml keeps vec_dot, so the cases
straddle the threshold (7 and 8 rows, ragged tiles, a batch whose matrices have fewer than 8 rows each) and
ggml's own switch GGML_CPU_TILED_MM=0 shows that the two paths differ where the test says they do.
llama.cpp's libggml must stay out of a process that has loaded ggml-python's, so ggml runs in a child.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import refimpl
from refimpl import GGMLType as T
from refimpl.kernels.ggml import tiled
from refimpl.qtensor import QTensor
from refimpl.types import type_traits

from .._oracles import require_llama_cpp

pytestmark = pytest.mark.oracle

_CHILD = textwrap.dedent("""
    import ctypes, os, sys
    import importlib.util
    import numpy as np
    libdir = os.path.join(os.path.dirname(importlib.util.find_spec("llama_cpp").origin), "lib")
    base = ctypes.CDLL(os.path.join(libdir, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(os.path.join(libdir, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)

    class InitParams(ctypes.Structure):      # struct ggml_init_params, ggml.h
        _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]

    P, I64 = ctypes.c_void_p, ctypes.c_int64
    base.ggml_init.restype, base.ggml_init.argtypes = P, [InitParams]
    base.ggml_free.argtypes = [P]
    base.ggml_new_tensor_4d.restype, base.ggml_new_tensor_4d.argtypes = P, [P, ctypes.c_int, I64, I64, I64, I64]
    base.ggml_mul_mat.restype, base.ggml_mul_mat.argtypes = P, [P, P, P]
    base.ggml_mul_mat_id.restype, base.ggml_mul_mat_id.argtypes = P, [P, P, P, P]
    base.ggml_new_graph.restype, base.ggml_new_graph.argtypes = P, [P]
    base.ggml_build_forward_expand.argtypes = [P, P]
    base.ggml_get_data.restype, base.ggml_get_data.argtypes = P, [P]
    base.ggml_nbytes.restype, base.ggml_nbytes.argtypes = ctypes.c_size_t, [P]
    cpu.ggml_cpu_init.argtypes = []
    cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    cpu.ggml_graph_compute_with_ctx.argtypes = [P, P, ctypes.c_int]
    cpu.ggml_cpu_init()

    def tensor(ctx, ttype, shape):           # numpy shape (slowest first) -> ne
        ne = list(shape[::-1]) + [1] * (4 - len(shape))
        return base.ggml_new_tensor_4d(ctx, ttype, *ne)

    def fill(t, arr):
        arr = np.ascontiguousarray(arr)
        assert base.ggml_nbytes(t) == arr.nbytes, (base.ggml_nbytes(t), arr.nbytes)
        ctypes.memmove(base.ggml_get_data(t), arr.ctypes.data, arr.nbytes)

    d = np.load(sys.argv[1])
    out = {}
    for i in range(int(d["n"])):
        ctx = base.ggml_init(InitParams(1 << 28, None, False))
        ttype, shape = int(d[f"type{i}"]), tuple(int(v) for v in d[f"shape{i}"])
        a = tensor(ctx, ttype, shape)
        fill(a, d[f"a{i}"])
        x = d[f"b{i}"]
        b = tensor(ctx, 0, x.shape)
        fill(b, x)
        if f"ids{i}" in d:
            ids = d[f"ids{i}"]
            it = tensor(ctx, 26, ids.shape)                 # GGML_TYPE_I32
            fill(it, ids.astype(np.int32))
            r = base.ggml_mul_mat_id(ctx, a, b, it)
            rshape = (x.shape[0], ids.shape[1], shape[-2])
        else:
            r = base.ggml_mul_mat(ctx, a, b)
            rshape = x.shape[:-1] + (shape[-2],)
        g = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(g, r)
        assert cpu.ggml_graph_compute_with_ctx(ctx, g, int(sys.argv[3])) == 0
        res = np.empty(rshape, np.float32)
        ctypes.memmove(res.ctypes.data, base.ggml_get_data(r), res.nbytes)
        out[f"r{i}"] = res
        base.ggml_free(ctx)
    np.savez(sys.argv[2], **out)
""")

# d (and dmin) f16 fields of each type's block, byte offsets (IQ1_M spreads its d over the scales' top nibbles)
D_FIELDS = {T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,), T.IQ4_XS: (0,),
            T.IQ2_XXS: (0,), T.IQ2_XS: (0,), T.IQ2_S: (0,), T.IQ3_XXS: (0,), T.IQ3_S: (0,), T.IQ1_S: (0,),
            T.IQ1_M: ()}


def _weights(t, n: int, k: int, rng) -> QTensor:
    """Random blocks of type t with finite f16 scales: every bit pattern of the quants, scales and grids."""
    ts = type_traits[t].type_size
    raw = rng.integers(0, 256, (n, k // 256, ts), dtype=np.uint8)
    for off in D_FIELDS[t]:
        raw[..., off:off + 2] = (rng.uniform(-0.05, 0.05, (n, k // 256)).astype("<f2")
                                 .view(np.uint8).reshape(n, k // 256, 2))
    if t == T.IQ1_M:
        bits = rng.uniform(0.001, 0.05, (n, k // 256)).astype("<f2").view("<u2").astype(np.int32)
        sc = np.ascontiguousarray(raw[..., 48:56]).view("<u2").astype(np.int32)
        for j in range(4):
            sc[..., j] = (sc[..., j] & 0x0FFF) | (((bits >> (4 * j)) & 15) << 12)
        raw[..., 48:56] = sc.astype("<u2").view(np.uint8).reshape(n, k // 256, 8)
    return QTensor(t, raw.reshape(n, -1), (n, k))


def _ggml(tmp_path, cases, threads=2, env=None):
    require_llama_cpp()
    src, dst = tmp_path / "in.npz", tmp_path / "out.npz"
    arrays = {"n": len(cases)}
    for i, c in enumerate(cases):
        arrays |= {f"type{i}": int(c["a"].type), f"shape{i}": np.array(c["a"].shape), f"a{i}": c["a"].data,
                   f"b{i}": c["b"]}
        if "ids" in c:
            arrays[f"ids{i}"] = c["ids"]
    np.savez(src, **arrays)
    p = subprocess.run([sys.executable, "-c", _CHILD, str(src), str(dst), str(threads)], capture_output=True,
                       text=True, timeout=600, env={**os.environ, **(env or {})})
    assert p.returncode == 0, p.stderr[-3000:]
    out = np.load(dst)
    return [out[f"r{i}"] for i in range(len(cases))]


def _ours(c):
    if "ids" in c:
        return refimpl.ops.mul_mat_id(c["a"], c["b"], c["ids"], numerics="ggml")
    return refimpl.ops.mul_mat(c["a"], c["b"], numerics="ggml")


# (weight rows n, k, activation shape before k): 7 rows (vec_dot), 8 (the threshold), ragged 16x16 tiles past the
# narrow path (> 16 rows), a batch with broadcast (2 x 9 rows over one weight), a batch of 3-row matrices (vec_dot)
SHAPES = [(40, 512, (7,)), (40, 512, (8,)), (37, 768, (33,)), (24, 256, (2, 9)), (16, 512, (4, 3))]


@pytest.mark.parametrize("t", sorted(tiled.TILED, key=int), ids=lambda t: t.name)
def test_mul_mat_bit_identical_to_ggml_0_25_3(t, tmp_path):
    rng = np.random.default_rng(int(t))
    cases = []
    for n, k, lead in SHAPES:
        b = rng.standard_normal(lead + (k,)).astype(np.float32)
        b[..., 5] *= 30                                    # one outlier per row: the Q8_K scale, -128 codes
        cases.append({"a": _weights(t, n, k, rng), "b": b})
    theirs = _ggml(tmp_path, cases)
    for c, r in zip(cases, theirs):
        ours = np.asarray(_ours(c), np.float32)
        assert ours.shape == r.shape
        bad = np.flatnonzero(ours.view(np.uint32) != r.view(np.uint32))
        assert bad.size == 0, (f"{t.name} a {c['a'].shape} b {c['b'].shape}: {bad.size} of {r.size} differ, "
                               f"first ours {ours.flat[bad[0]]!r} ggml {r.flat[bad[0]]!r}")


def test_mul_mat_id_bit_identical_to_ggml_0_25_3(tmp_path):
    """Experts with >= 8 routed rows take the tiled kernels, the others vec_dot, in one op."""
    rng = np.random.default_rng(7)
    cases = []
    for t in (T.Q4_K, T.Q6_K, T.IQ4_XS, T.Q2_K):
        a = _weights(t, 4 * 24, 512, rng)
        a = QTensor(t, a.data.reshape(4, 24, -1), (4, 24, 512))
        ids = np.stack([np.where(np.arange(12) < 10, 0, 1), np.where(np.arange(12) % 3 == 0, 2, 3)], 1).astype(np.int32)
        cases.append({"a": a, "b": rng.standard_normal((12, 1, 512)).astype(np.float32), "ids": ids})
    for c, r in zip(cases, _ggml(tmp_path, cases)):
        ours = np.asarray(_ours(c), np.float32)
        bad = np.flatnonzero(ours.view(np.uint32) != r.view(np.uint32))
        assert bad.size == 0, f"{c['a'].type.name}: {bad.size} of {r.size} differ"


def test_the_tiled_path_is_what_ggml_takes(tmp_path):
    """With GGML_CPU_TILED_MM=0, ggml 0.25.3 keeps vec_dot at every row count: its result is then the
    vec_dot emulation's (profile ggml-nollamafile), and differs from the tiled one -- so the test above
    checks the tiled order itself, not a path that happens to agree."""
    rng = np.random.default_rng(3)
    c = {"a": _weights(T.Q4_K, 64, 1024, rng), "b": rng.standard_normal((20, 1024)).astype(np.float32)}
    off, = _ggml(tmp_path, [c], env={"GGML_CPU_TILED_MM": "0"})
    on, = _ggml(tmp_path, [c])
    vec = np.asarray(refimpl.ops.mul_mat(c["a"], c["b"], numerics="ggml-nollamafile"))
    assert np.array_equal(vec.view(np.uint32), off.view(np.uint32))
    assert not np.array_equal(on.view(np.uint32), off.view(np.uint32))
    assert np.array_equal(np.asarray(_ours(c)).view(np.uint32), on.view(np.uint32))
