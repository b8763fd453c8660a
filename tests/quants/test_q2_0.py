"""Q2_0 (new in ggml 0.25.3) against ggml 0.25.3 itself, bit for bit: llama-cpp-python 0.3.36's libggml-base,
through ggml.h's public ggml_quantize_chunk and ggml_get_type_traits(GGML_TYPE_Q2_0)->to_float.

ggml-python (0.15.3) has no Q2_0, and llama.cpp's libggml must stay out of a process that has loaded
ggml-python's, so ggml runs in a child process that reads the rows from a file and writes its bytes back.
"""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import refimpl
from refimpl import GGMLType as T
from refimpl.testing import BLOCK_KINDS, assert_bits_equal, make_block

from .._oracles import require_llama_cpp

pytestmark = pytest.mark.oracle

_CHILD = textwrap.dedent("""
    import ctypes, os, sys
    import numpy as np
    import importlib.util
    lib = os.path.join(os.path.dirname(importlib.util.find_spec("llama_cpp").origin), "lib", "libggml-base.so")
    g = ctypes.CDLL(lib)

    class Traits(ctypes.Structure):          # struct ggml_type_traits, ggml.h (ggml 0.25.3)
        _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                    ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                    ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                    ("from_float_ref", ctypes.c_void_p)]

    g.ggml_get_type_traits.restype = ctypes.POINTER(Traits)
    g.ggml_get_type_traits.argtypes = [ctypes.c_int]
    g.ggml_quantize_chunk.restype = ctypes.c_size_t
    g.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                      ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    Q2_0 = 42
    tr = g.ggml_get_type_traits(Q2_0).contents
    assert tr.type_name == b"q2_0" and tr.blck_size == 64 and tr.type_size == 18, (tr.type_name, tr.type_size)
    to_float = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(tr.to_float)

    d = np.load(sys.argv[1])
    x, raw = np.ascontiguousarray(d["x"], np.float32), np.ascontiguousarray(d["raw"], np.uint8)
    rows, n = x.shape
    q = np.zeros((rows, n // 64 * 18), np.uint8)
    g.ggml_quantize_chunk(Q2_0, x.ctypes.data, q.ctypes.data, 0, rows, n, None)
    deq = np.zeros((raw.shape[0], raw.shape[1] // 18 * 64), np.float32)
    for r in range(raw.shape[0]):
        to_float(raw[r].ctypes.data, deq[r].ctypes.data, deq.shape[1])
    np.savez(sys.argv[2], q=q, deq=deq)
""")


def _ggml(tmp_path, x, raw):
    require_llama_cpp()
    src, dst = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(src, x=x, raw=raw)
    p = subprocess.run([sys.executable, "-c", _CHILD, str(src), str(dst)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    out = np.load(dst)
    return out["q"], out["deq"]


def _rows() -> np.ndarray:
    """Every adversarial block kind at magnitudes from 1e-30 to 1e30, plus NaN, inf, ±0, subnormal and
    tie rows: 2 blocks of 64 per row."""
    rng = np.random.default_rng(42)
    rows = [make_block(k, 128, rng, e) for k in BLOCK_KINDS for e in (-40, -30, -6, 0, 4, 30)
            if np.isfinite(np.float32(10.0) ** e)]
    x = np.stack(rows).astype(np.float32)
    extra = np.repeat(x[:1], 8, axis=0)
    extra[0, ::3] = np.nan
    extra[1, 5] = np.inf
    extra[2, 7] = -np.inf
    extra[3] = np.float32(-0.0)
    extra[4] = np.float32(1e-45) * rng.integers(-3, 4, 128)
    extra[5] = np.float32(np.finfo(np.float32).max) * rng.choice([-1, 1], 128)
    extra[6] = np.tile(np.float32([1.0, 0.5, -0.5, 1.5, -1.5, 0.25, 2.0, -1.0]), 16)   # ties of x/d
    extra[7] = np.nan
    return np.concatenate([x, extra])


def test_q2_0_quantize_and_dequantize_match_ggml_0_25_3(tmp_path):
    x = _rows()
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, (64, 4 * 18), dtype=np.uint8)          # every bit pattern, inf/nan scales too
    raw[:4, 0:2] = np.frombuffer(np.float16([np.inf, -np.inf, np.nan, 0.0]).tobytes(), np.uint8).reshape(4, 2)
    q_ggml, deq_ggml = _ggml(tmp_path, x, raw)
    ours = refimpl.quantize(x, T.Q2_0)
    assert_bits_equal(ours.data.reshape(q_ggml.shape), q_ggml, "quantize q2_0")
    qt = refimpl.QTensor(T.Q2_0, raw, (raw.shape[0], raw.shape[1] // 18 * 64))
    assert_bits_equal(refimpl.dequantize(qt), deq_ggml, "dequantize q2_0")


def test_q2_0_roundtrip_error_is_within_half_a_step():
    """|x - deq(q(x))| <= d/2 wherever x/d is inside the code range [-1, 2] (amax = d, so always, up to the f16
    rounding of d)."""
    x = np.random.default_rng(3).standard_normal((16, 256)).astype(np.float32)
    deq = refimpl.dequantize(refimpl.quantize(x, T.Q2_0))
    d = np.repeat(np.abs(x).reshape(16, 4, 64).max(-1), 64, axis=1)
    assert np.all(np.abs(deq - x) <= d * (0.5 + 2 ** -10) + 1e-30)


_MUL_MAT_CHILD = textwrap.dedent("""
    import ctypes, os, sys
    import importlib.util
    import numpy as np
    lib = os.path.join(os.path.dirname(importlib.util.find_spec("llama_cpp").origin), "lib")
    base = ctypes.CDLL(os.path.join(lib, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(os.path.join(lib, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)

    class InitParams(ctypes.Structure):      # struct ggml_init_params, ggml.h (ggml 0.25.3)
        _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]

    P = ctypes.c_void_p
    base.ggml_init.restype, base.ggml_init.argtypes = P, [InitParams]
    base.ggml_new_tensor_2d.restype = P
    base.ggml_new_tensor_2d.argtypes = [P, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    base.ggml_mul_mat.restype, base.ggml_mul_mat.argtypes = P, [P, P, P]
    base.ggml_new_graph.restype, base.ggml_new_graph.argtypes = P, [P]
    base.ggml_build_forward_expand.argtypes = [P, P]
    base.ggml_get_data.restype, base.ggml_get_data.argtypes = P, [P]
    base.ggml_free.argtypes = [P]
    cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    cpu.ggml_graph_compute_with_ctx.argtypes = [P, P, ctypes.c_int]
    if hasattr(cpu, "ggml_cpu_init"):
        cpu.ggml_cpu_init()

    d = np.load(sys.argv[1])
    raw, b = np.ascontiguousarray(d["raw"]), np.ascontiguousarray(d["b"], np.float32)
    n, k, m = raw.shape[0], b.shape[1], b.shape[0]
    ctx = base.ggml_init(InitParams(64 << 20, None, False))
    ta = base.ggml_new_tensor_2d(ctx, 42, k, n)                  # GGML_TYPE_Q2_0
    tb = base.ggml_new_tensor_2d(ctx, 0, k, m)                   # GGML_TYPE_F32
    ctypes.memmove(base.ggml_get_data(ta), raw.ctypes.data, raw.nbytes)
    ctypes.memmove(base.ggml_get_data(tb), b.ctypes.data, b.nbytes)
    out = base.ggml_mul_mat(ctx, ta, tb)
    gf = base.ggml_new_graph(ctx)
    base.ggml_build_forward_expand(gf, out)
    assert cpu.ggml_graph_compute_with_ctx(ctx, gf, 1) == 0
    res = np.empty((m, n), np.float32)
    ctypes.memmove(res.ctypes.data, base.ggml_get_data(out), res.nbytes)
    base.ggml_free(ctx)
    np.save(sys.argv[2], res)
""")


def test_q2_0_mul_mat_in_ggml_numerics_is_ggml_0_25_3s_bits(tmp_path):
    """numerics="ggml" emulates ggml_vec_dot_q2_0_q8_0 (the activations quantized to Q8_0 by the CPU backend):
    the same bits as ggml 0.25.3's CPU backend computing ggml_mul_mat, one thread, decode and batch shapes."""
    require_llama_cpp()
    rng = np.random.default_rng(5)
    for n, m, k in ((16, 1, 256), (8, 7, 512)):
        a = refimpl.quantize(rng.uniform(-1, 1, (n, k)).astype(np.float32), T.Q2_0)
        b = rng.standard_normal((m, k)).astype(np.float32)
        np.savez(tmp_path / "in.npz", raw=a.data, b=b)
        p = subprocess.run([sys.executable, "-c", _MUL_MAT_CHILD, str(tmp_path / "in.npz"), str(tmp_path / "o.npy")],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        theirs = np.load(tmp_path / "o.npy")
        with refimpl.backend("numpy"):
            ours = refimpl.ops.mul_mat(a, b, numerics="ggml")
        assert_bits_equal(ours, theirs, f"mul_mat q2_0 {n}x{k} by {m} rows, numerics ggml")
