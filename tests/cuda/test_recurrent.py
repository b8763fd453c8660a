"""CUDA rwkv_wkv6 / rwkv_wkv7 (refimpl/kernels/cuda/recurrent.py) against the NumPy reference, in numba's CUDA
simulator (tests/cuda/conftest.py), and their PTX for a real GPU (cc 9.0).

Both kernels repeat the reference's f32 operations in its order, with cuda.fma where it fuses: identical bits.
The simulator's cuda.fma computes a*b + c with two roundings, a GPU's fma.rn.f32 with one; `hardware_fma`
gives the simulated kernels the correctly rounded FMA (the reference's exact emulation), so a difference in
bits here is a difference in the kernels' operations or their order. wkv7's f64 sums run in j order where the
reference uses einsum: identical f32 results unless a last-bit f64 difference straddles an f32 rounding
boundary (not hit by these seeds; on a GPU NVVM also contracts them into f64 FMAs).
"""
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from tests._profiles import examples

from refimpl import GGMLShapeError
from refimpl.kernels.cuda import _device
from refimpl.ops.recurrent import rwkv_wkv6, rwkv_wkv7
from refimpl.rounding import fma32 as _fma
from refimpl.testing import assert_bits_equal


pytestmark = pytest.mark.equivalence

@pytest.fixture(autouse=True)
def hardware_fma(monkeypatch):
    """In the simulator, cuda.fma rounded once (as fma.rn.f32 on a GPU), not twice."""
    if _device.SIMULATOR:
        from numba.cuda.simulator import kernelapi
        monkeypatch.setattr(kernelapi.FakeCUDAModule, "fma", lambda self, a, b, c: np.float32(_fma(a, b, c)))


def _inputs(seed, S, H, T, n_seqs):
    """(k, v, r, tf, td, state, a, b) in the ranges llama.cpp produces: decays w in (0, 1)."""
    rng = np.random.default_rng(seed)
    f = lambda *shape: rng.uniform(-1, 1, shape).astype(np.float32)          # noqa: E731
    k, v, r, a, b = (f(T, H, S) for _ in range(5))
    tf = f(H, S)
    td = rng.uniform(0.3, 1.0, (T, H, S)).astype(np.float32)
    state = f(n_seqs, S * S * H)
    return k, v, r, tf, td, state, a, b


def _wkv6(x):
    k, v, r, tf, td, state, _, _ = x
    return k, v, r, tf, td, state


def _wkv7(x):
    k, v, r, tf, td, state, a, b = x
    return r, td, k, v, a, b, state


CASES = [  # (S, H, T, n_seqs)
    (8, 2, 4, 2),      # a quarter warp per block; 2 sequences of 2 tokens: the state switches mid-batch
    (33, 1, 3, 1),     # a full warp plus one thread; 3 tokens through one state
    (64, 1, 2, 2),     # MAX_S: the whole 64 x 64 shared state, one token per sequence
    (1, 3, 2, 1),      # head size 1: one thread per block, 3 heads
]


@pytest.mark.parametrize("S,H,T,n_seqs", CASES)
@pytest.mark.parametrize("op,args", [(rwkv_wkv6, _wkv6), (rwkv_wkv7, _wkv7)], ids=["wkv6", "wkv7"])
def test_identical_bits(op, args, S, H, T, n_seqs):
    """Head sizes 1, 8 (< a warp), 33 (a warp + 1) and 64 (the largest), 1-3 heads, 1-2 sequences of 1-3 tokens:
    outputs and final states bit for bit the reference's."""
    a = args(_inputs(S * 100 + T, S, H, T, n_seqs))
    got = op(*a)
    assert _device.is_device(got)
    assert_bits_equal(_device.to_host(got), op.reference(*a), f"{op.__name__} S={S} H={H} T={T} n_seqs={n_seqs}")


@settings(max_examples=examples(6), deadline=None)
@given(S=st.integers(1, 40), H=st.integers(1, 2), tps=st.integers(1, 3), n_seqs=st.integers(1, 2),
       seed=st.integers(0, 2**31), wkv7=st.booleans())
def test_identical_bits_drawn(S, H, tps, n_seqs, seed, wkv7):
    """Drawn head sizes 1-40 (below, at and past a warp), heads, tokens per sequence and sequence counts."""
    op, args = (rwkv_wkv7, _wkv7) if wkv7 else (rwkv_wkv6, _wkv6)
    a = args(_inputs(seed, S, H, tps * n_seqs, n_seqs))
    assert_bits_equal(_device.to_host(op(*a)), op.reference(*a), f"{op.__name__} S={S} H={H} tps={tps}")


@pytest.mark.parametrize("op,args", [(rwkv_wkv6, _wkv6), (rwkv_wkv7, _wkv7)], ids=["wkv6", "wkv7"])
def test_state_carries_over_on_device(op, args):
    """5 tokens in one call == 3 tokens, then 2 from the returned state (a device array sliced and reshaped on
    the device, as a model keeps it): the state is the recurrence's whole memory. S = 16, H = 2."""
    S, H, T = 16, 2, 5
    x = _inputs(7, S, H, T, 1)
    whole = _device.to_host(op(*args(x)))
    first = op(*args(tuple(t[:3] if t.shape[0] == T else t for t in x)))
    state = first[3:].reshape(1, S * S * H)
    assert _device.is_device(state)
    x2 = tuple(t[3:] if t.shape[0] == T else t for t in x[:5]) + (state,) + tuple(t[3:] for t in x[6:])
    second = _device.to_host(op(*args(x2)))
    split = np.concatenate([_device.to_host(first)[:3], second])
    assert_bits_equal(split, whole, f"{op.__name__}: 3 + 2 tokens vs 5")


def test_device_inputs():
    """Every operand already on the device (S = 4, H = 2, T = 2): same bits as from host arrays."""
    a = _wkv6(_inputs(3, 4, 2, 2, 1))
    got = rwkv_wkv6(*(_device.to_device(x) for x in a))
    assert_bits_equal(_device.to_host(got), rwkv_wkv6.reference(*a), "wkv6 device inputs")


def test_head_size_past_max_runs_reference():
    """S = 65 > MAX_S: the reference runs on host copies, the result still comes back on the device."""
    a = _wkv7(_inputs(5, 65, 1, 1, 1))
    got = rwkv_wkv7(*a)
    assert _device.is_device(got)
    assert_bits_equal(_device.to_host(got), rwkv_wkv7.reference(*a), "wkv7 S=65")


def _message(fn, *a):
    with pytest.raises(GGMLShapeError) as e:
        fn(*a)
    return str(e.value)


@pytest.mark.parametrize("bad", ["tokens_not_multiple", "v_shape", "state_size", "f64"])
def test_bad_input_raises_like_reference(bad):
    """Shapes the reference rejects raise its GGMLShapeError (naming the op, ne and NumPy shapes), unchanged."""
    k, v, r, tf, td, state, a, b = _inputs(1, 4, 2, 3, 1)
    if bad == "tokens_not_multiple":
        state = np.zeros((2, 4 * 4 * 2), np.float32)          # 3 tokens over 2 sequences
    elif bad == "v_shape":
        v = v[:2]
    elif bad == "state_size":
        state = state[:, :-1]
    else:
        k = k.astype(np.float64)
    for op, args in ((rwkv_wkv6, (k, v, r, tf, td, state)), (rwkv_wkv7, (r, td, k, v, a, b, state))):
        msg = _message(op, *args)
        assert msg == _message(op.reference, *args)
        assert msg.startswith(op.__name__) and "numpy" in msg and "ne [" in msg


def test_ptx_sm90():
    """Every kernel compiles to PTX for compute capability 9.0 (a real GPU's compiler, not the simulator)."""
    script = ("from numba import cuda\n"
              "from refimpl.kernels.cuda import recurrent as m\n"
              "for f, sig in m.ptx_signatures():\n"
              "    ptx, _ = cuda.compile_ptx(f.py_func, sig, cc=(9, 0))\n"
              "    assert '.target sm_90' in ptx and '.entry' in ptx, f.py_func.__name__\n"
              "    print(f.py_func.__name__, len(ptx))\n")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    if "NvvmSupportError" in res.stderr:
        pytest.skip("numba finds no libNVVM (the CUDA toolkit's compiler) to compile PTX")
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split()[::2] == ["_wkv6", "_wkv7"]
