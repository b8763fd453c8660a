"""The models on the CUDA backend, in numba's simulator: llama.forward (prefill, then decode with the cache),
bert.embed and rwkv.forward under backend("cuda") equal the numpy backend; weights are uploaded once; the
copies between ops (movement.py) equal NumPy's; benchmarks/cuda_check.py runs.

Budget: the CUDA kernels implement exact mode like the numba ones, so the models answer to the table's entry
for that claim, tol("llama.check.numba", "*", "exact") (NMSE 1e-10: "f64 sums in another order at most").
Measured with the kernels of this commit (pytest -s prints it): llama 0 (every step), bert 0, rwkv v4 0, v5.2
<= 1.1e-14, v6 <= 1.6e-14, v7 <= 2.3e-14 (logits and every state array): 4 orders of magnitude of margin.

`device_results` makes every op that has no CUDA kernel yet return a device array (its reference on host
copies, uploaded), so the model path runs with device activations throughout, as once every kernel exists.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import refimpl
from refimpl.testing import assert_nmse, nmse
from refimpl.testing.tolerances import tol

from ..models.bert_tiny import write_tiny_bert_hf
from ..models.rwkv_tiny import tiny_state_dict
from ..models.tiny import write_tiny_llama

pytestmark = pytest.mark.equivalence

ROOT = Path(__file__).resolve().parents[2]
BUDGET = tol("llama.check.numba", "*", "exact").nmse


@pytest.fixture
def device_results(monkeypatch):
    """Ops without a CUDA kernel return device arrays (the reference on host copies, then uploaded)."""
    from numba import cuda

    from refimpl.kernels import cuda as kcuda
    from refimpl.kernels.cuda import _device
    from refimpl.dispatch import OPS
    kcuda.load()
    upload = cuda.to_device            # bound now: upload counting (below) does not count these

    def up(x):
        ok = isinstance(x, np.ndarray) and x.dtype in (np.float32, np.float16, np.int32)
        return upload(np.ascontiguousarray(x)) if ok else x

    def h(x):
        return x.copy_to_host() if _device.is_device(x) else x

    def shim(fn):
        return lambda *a, **k: up(fn(*[h(x) for x in a], **{n: h(v) for n, v in k.items()}))

    for info in OPS.values():
        if "cuda" not in info.kernels:
            for key in ("exact", "fast"):
                monkeypatch.setitem(info.impls, ("cuda", key), shim(info.fn))
        info.chains.clear()                        # resolved before the shims: stale
    yield
    monkeypatch.undo()                             # the shims out, then the chains that held them
    for info in OPS.values():
        info.chains.clear()


def on_numpy(fn):
    with refimpl.backend("numpy"):
        return fn()


def host(x):
    from refimpl.kernels.cuda._device import to_host
    return to_host(x)


# -- llama ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """n_embd 16, 2 heads of 8 over 1 KV head (GQA), n_ff 24, 1 layer, 32 tokens of vocabulary (the simulator
    takes seconds per kernel launch: one layer runs every kernel of the path)."""
    from refimpl.models import llama
    path = write_tiny_llama(tmp_path_factory.mktemp("llama") / "tiny.gguf", n_vocab=32, n_embd=16, n_layer=1,
                            n_head=2, n_head_kv=1, n_ff=24, vocab=False)
    return llama.load(path, tokenizer=False)


def test_llama_prefill_then_decode(tiny_llama, device_results):
    """3-token prefill, then 2 one-token decodes through the device KV cache (GQA: 2 query heads per KV
    head; n_kv 3, 4, 5 cells of 12), each step equal to the numpy backend's. Also: the second decode step
    adds nothing to the weight cache, which holds model weights only, and uploads nothing as large as the
    smallest weight (a norm gain, n_embd f32 = 64 bytes: only inputs and kernel parameters); capture=
    receives NumPy copies; cache.copy() of the device cache forks it."""
    from numba import cuda

    from refimpl.kernels.cuda import _device
    from refimpl.models import llama
    steps = [[1, 7, 30], [11], [20]]
    with refimpl.backend("numpy"):
        c = llama.new_cache(tiny_llama, 12)
        want = [llama.forward(tiny_llama, t, c) for t in steps]
    cache = llama.new_cache(tiny_llama, 12)
    start = set(_device._CACHE)
    got = [llama.forward(tiny_llama, t, cache) for t in steps[:2]]
    assert _device.is_device(cache.k) and _device.is_device(cache.v)
    fork = cache.copy()
    before, uploads, real = dict(_device._CACHE), [], cuda.to_device
    cuda.to_device = lambda x, *a, **k: (uploads.append(np.asarray(x).nbytes), real(x, *a, **k))[1]
    cap = {}
    try:
        got.append(llama.forward(tiny_llama, steps[2], cache, capture=cap))
    finally:
        cuda.to_device = real
    for i, (g, w) in enumerate(zip(got, want)):
        assert isinstance(g, np.ndarray) and g.shape == w.shape
        print(f"llama step {i}: NMSE {nmse(g, w):.2e}")
        assert_nmse(g, w, BUDGET, f"llama step {i}")
    assert _device._CACHE.keys() == before.keys(), "a weight was uploaded again (or a temporary cached)"
    assert max(uploads, default=0) < tiny_llama.hparams.n_embd * 4, f"bytes uploaded per call: {uploads}"
    layers = [v for w in tiny_llama.layers for v in vars(w).values() if v is not None]
    mine = {id(w.data if isinstance(w, refimpl.QTensor) else w)          # the cache's keys (_device._key_of)
            for w in layers + [tiny_llama.token_embd, tiny_llama.output, tiny_llama.output_norm]}
    new = set(before) - start
    assert new <= mine, "the weight cache holds something that is not a weight of the model"
    assert len(new & mine) >= 2 * len(tiny_llama.layers) + 1, "norm gains are device constants from the cache"
    assert isinstance(cap["kq-0"], np.ndarray) and cap["kq-0"].shape == (2, 1, 5)
    np.testing.assert_array_equal(cap["result_output"], got[2])
    np.testing.assert_array_equal(llama.forward(tiny_llama, steps[2], fork), got[2])


# -- bert ----------------------------------------------------------------------------------------------------

def test_bert_embed(tmp_path, device_results):
    """Two texts of different lengths in one padded batch (the key mask on the device), mean pooling and
    normalization; n_embd 16, 2 heads, n_ff 24, 1 layer."""
    from refimpl.models import bert
    model = bert.load(write_tiny_bert_hf(tmp_path / "bert", n_embd=16, n_layer=1, n_head=2, n_ff=24, n_ctx=12))
    texts = ["the man is eating.", "hello world"]
    want = on_numpy(lambda: bert.embed(model, texts))
    got = bert.embed(model, texts)
    assert isinstance(got, np.ndarray) and got.shape == want.shape == (2, 16)
    print(f"bert: NMSE {nmse(got, want):.2e}")
    assert_nmse(got, want, BUDGET, "bert.embed")


# -- rwkv ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["4", "6", "7"])      # (v5.2 takes v6's wkv6 kernel path)
def test_rwkv_forward(version, device_results):
    """A 2-token prompt, then one more token from the returned (device) state; n_embd 16, heads of 8 (2
    heads), n_ffn 32, LoRA rank 4 (v6, v7); 1 layer (2 for v7: layers > 0 mix in layer 0's values). v4's
    WKV recurrence runs on host copies (no ggml op)."""
    from refimpl.kernels.cuda._device import is_device
    from refimpl.models import rwkv
    model = rwkv.from_state_dict(tiny_state_dict(version, n_layer=2 if version == "7" else 1, n_embd=16,
                                                 head_size=8, vocab=24, n_ffn=32, lora=4))

    def run():
        a, s = rwkv.forward(model, [5, 17])
        b, s = rwkv.forward(model, [20], s)
        return a, b, s.to_host()

    want = on_numpy(run)
    a, s = rwkv.forward(model, [5, 17])
    assert all(is_device(x) for x in (s.shift_att, s.shift_ffn, s.wkv))
    b, s2 = rwkv.forward(model, [20], s)
    got = (a, b, s2.to_host())
    for name, g, w in [("logits", got[0], want[0]), ("logits 2", got[1], want[1])] + \
            [(f"state.{k}", getattr(got[2], k), getattr(want[2], k)) for k in ("shift_att", "shift_ffn", "wkv")]:
        print(f"rwkv {version} {name}: NMSE {nmse(g, w):.2e}")
        assert_nmse(g, w, BUDGET, f"rwkv {version} {name}")


# -- movement.py ---------------------------------------------------------------------------------------------

def test_movement_copies_equal_numpy():
    """permute (2-D .. 4-D, 181 elements: a partial block), broadcast (stride-0 axes), cast to f16 (RNE, as
    NumPy), pad_rows, assign into a cache row range, clone: identical to NumPy's copies."""
    from refimpl.kernels.cuda import _device
    from refimpl.kernels.cuda import movement as mv
    rng = np.random.default_rng(1)
    x = rng.standard_normal((181,)).astype(np.float32)
    for shape, axes in [((181, 1), (1, 0)), ((1, 181, 1), (1, 2, 0)), ((1, 1, 181, 1), (2, 0, 3, 1))]:
        np.testing.assert_array_equal(host(mv.permute(_device.to_device(x.reshape(shape)), axes)),
                                      np.ascontiguousarray(x.reshape(shape).transpose(axes)))
    y = rng.standard_normal((3, 5, 4)).astype(np.float32)
    d = _device.to_device(y)
    np.testing.assert_array_equal(host(mv.permute(d, (2, 0, 1))), np.ascontiguousarray(y.transpose(2, 0, 1)))
    b = _device.to_device(y[:, :1])
    np.testing.assert_array_equal(host(mv.broadcast(b, (2, 3, 5, 4))), np.broadcast_to(y[:, :1], (2, 3, 5, 4)))
    np.testing.assert_array_equal(host(mv.cast(d, np.float16)), y.astype(np.float16))
    np.testing.assert_array_equal(host(mv.pad_rows(d, 6)), np.pad(y, ((0, 3), (0, 0), (0, 0))))
    cache = mv.zeros((2, 7, 5, 4), np.float16)
    mv.assign(cache[1, 2:5], d)
    want = np.zeros((2, 7, 5, 4), np.float16)
    want[1, 2:5] = y
    np.testing.assert_array_equal(host(cache), want)
    c = mv.clone(d)
    mv.assign(c, np.zeros_like(y))
    np.testing.assert_array_equal(host(d), y)
    with pytest.raises(ValueError, match="movement.permute"):
        mv.permute(d, (0, 0, 1))


@pytest.mark.parametrize("sa,sb,dim", [((1, 6), (4, 6), 1), ((1, 6), (0, 6), 1), ((2, 3, 5), (2, 3, 2), 0),
                                       ((2, 3, 5), (1, 3, 5), 2), ((3,), (3,), 1)])
def test_concat_equals_reference(sa, sb, dim):
    """concat on device arrays: along rows (the token shift, also with an empty b), ne0, the outermost
    axis, and a new axis (1-D inputs, dim 1): bits and shape of the reference."""
    from refimpl.kernels.cuda import _device
    from refimpl.ops import concat
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
    out = concat(_device.to_device(a), _device.to_device(b), dim)
    assert _device.is_device(out)
    np.testing.assert_array_equal(host(out), concat.reference(a, b, dim))


def test_concat_and_cont_reject_like_the_reference():
    """Shapes that disagree off the concat dim, and a cont to another element count: the reference's errors."""
    from refimpl.kernels.cuda import _device
    from refimpl.ops import concat, cont
    from refimpl.shapes import GGMLShapeError
    a, b = _device.to_device(np.zeros((2, 3), np.float32)), _device.to_device(np.zeros((2, 4), np.float32))
    with pytest.raises(GGMLShapeError, match=r"concat: a and b must agree on every dim but 1 .*ne \[3, 2\]"):
        concat(a, b, 1)
    with pytest.raises(GGMLShapeError, match="cont: a and the destination must have the same number"):
        cont(a, (7,))
    np.testing.assert_array_equal(host(cont(a, (3, 2))), np.zeros((3, 2), np.float32))


def test_movement_kernels_compile_to_ptx():
    """Every kernel of movement.ptx_signatures() compiles for sm_90 (a real GPU's code, not the simulator's)."""
    code = ("from numba import cuda\nfrom refimpl.kernels.cuda import movement as m\n"
            "for d, sig in m.ptx_signatures():\n    cuda.compile_ptx(d.py_func, sig, cc=(9, 0))\nprint('ok')")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


# -- benchmarks/cuda_check.py --------------------------------------------------------------------------------

def test_cuda_check_script_in_the_simulator():
    """The GPU check script's logic at tiny sizes (--quick --sim): every check passes, the table prints."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    # the kernels skipped here have their own simulator tests; the script's other paths all run
    r = subprocess.run([sys.executable, "benchmarks/cuda_check.py", "--quick", "--sim", "--skip",
                        "dequantize,flash_attn_ext,rwkv_wkv6,rwkv_wkv7,mul_mat q"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert "| check |" in r.stdout and "FAIL" not in r.stdout


def test_check_cuda_pair_on_a_tiny_llama(tiny_llama):
    """`refimpl check`'s cuda pair: the CUDA backend's prefill logits equal the NumPy backend's within the
    pair's budget (here, in the simulator, identical)."""
    from refimpl.check import check
    from refimpl.compare import first_over, format_table
    rows = check(tiny_llama, tokens=[1, 2, 3], pairs=("cuda",))
    assert rows[0].name == "cuda" and rows[0].note == "exact mode", rows
    assert first_over(rows) is None and rows[0].nmse == 0.0, format_table(rows, kind="check")
