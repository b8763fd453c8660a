"""kernels.attention.mha_fast: llama.cpp's attention without flash attention (kq = mul_mat(K, Q), soft_max_ext,
kqv = mul_mat(V^T, kq)) in one pass, as numerics="fast" runs those three ops; what refimpl.models.bert runs on
the Numba backend in fast numerics.

Its contract (the function's docstring) is exact: both products are f32 sums of f32-rounded products in index
order -- an order numerics="fast" allows mul_mat (tests/test_numerics_fast.py) -- and the softmax has the
kernel's (hence the reference's) bits for those scores. `restated` computes that contract with NumPy f32
array operations, one rounding each, and the op reference of soft_max_ext: identical bits on drawn shapes,
masks (per sequence and broadcast, f16 and f32, rows with -inf everywhere) and non-finite inputs (NaNs at
the same places; their sign and payload are not part of the contract, see `_nan_as_one`). The model
test holds fast MiniLM-shaped embeddings to exact mode's within the fast bound's consequence for a cosine.
"""
import numpy as np
import pytest

pytest.importorskip("numba", reason="numba is not installed: refimpl.kernels is Numba code")

from hypothesis import assume, given, settings, strategies as st  # noqa: E402
from tests._profiles import examples  # noqa: E402

import refimpl  # noqa: E402
import refimpl.kernels  # noqa: E402
from refimpl.ops import soft_max_ext  # noqa: E402
from refimpl.testing import assert_bits_equal  # noqa: E402

refimpl.kernels.load()
from refimpl.kernels.attention import mha_fast, mha_fast_qkv  # noqa: E402

pytestmark = pytest.mark.equivalence


def restated(q, k, v, mask, scale):
    """The contract of mha_fast in NumPy: (S, T, H, D), (S, N, H, D) x2 -> (S, T, H*D)."""
    S, T, H, D = q.shape
    N = k.shape[1]
    qh, kh, vh = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    kq = np.zeros((S, H, T, N), np.float32)
    with np.errstate(all="ignore"):
        for d in range(D):                               # f32 products, f32 sums, d in index order
            kq = kq + qh[..., :, d:d + 1] * kh[..., None, :, d]
    with refimpl.backend("numpy"), np.errstate(all="ignore"):
        p = soft_max_ext(np.ascontiguousarray(kq), mask, scale, 0.0)
    o = np.zeros((S, H, T, D), np.float32)
    with np.errstate(all="ignore"):
        for j in range(N):                               # j in index order
            o = o + p[..., :, j:j + 1] * vh[..., None, j, :]
    return o.transpose(0, 2, 1, 3).reshape(S, T, H * D)


@st.composite
def attention_cases(draw):
    S, T, H = draw(st.integers(1, 3)), draw(st.integers(1, 20)), draw(st.integers(1, 3))
    D = draw(st.sampled_from([1, 3, 8, 16, 32, 40]))
    N = draw(st.sampled_from([T, max(1, T - 3), T + 5, 16, 33]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    sd = draw(st.sampled_from([0.1, 1.0, 8.0]))
    q, k, v = (rng.normal(0, sd, shape).astype(np.float32) for shape in ((S, T, H, D), (S, N, H, D), (S, N, H, D)))
    if draw(st.booleans()):                              # a few non-finite inputs
        for x in (q, k, v):
            x.reshape(-1)[rng.integers(0, x.size, 2)] = rng.choice(np.array([np.inf, -np.inf, np.nan], np.float32), 2)
    kind = draw(st.sampled_from(["none", "keys", "broadcast", "random"]))
    mask = None
    rows = T + draw(st.integers(0, 3))                   # llama.cpp pads the mask's rows
    if kind == "keys":                                   # bert.key_mask: each sequence's own length
        n = rng.integers(1, N + 1, S)
        mask = np.where(np.arange(N)[None, None, None, :] < n[:, None, None, None], 0, -np.inf)
        mask = np.broadcast_to(mask, (S, 1, rows, N))
    elif kind in ("broadcast", "random"):
        m3, m2 = draw(st.sampled_from([1, S])), draw(st.sampled_from([1, H]))
        mask = rng.normal(0, 2, (m3, m2, rows, N))
        mask[rng.random(mask.shape) < 0.3] = -np.inf
        if kind == "random" and rows:
            mask[..., 0, :] = -np.inf                    # a row with every key masked: soft_max_ext's NaN
    if mask is not None:
        mask = np.ascontiguousarray(mask, draw(st.sampled_from([np.float32, np.float16])))
    scale = draw(st.sampled_from([1.0, 0.125, 1 / np.sqrt(np.float32(D))]))
    return q, k, v, mask, float(scale)


@settings(max_examples=examples(60), deadline=None)
@given(case=attention_cases())
def test_mha_fast_is_its_contract_bit_for_bit(case):
    q, k, v, mask, scale = case
    got = mha_fast(q, k, v, mask, scale)
    assert got is not None
    want = restated(q, k, v, mask, scale)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert_bits_equal(_nan_as_one(got), _nan_as_one(want), f"mha_fast q{q.shape} k{k.shape} "
                      f"mask {None if mask is None else (mask.shape, mask.dtype)}")


@settings(max_examples=examples(40), deadline=None)
@given(case=attention_cases())
def test_mha_fast_qkv_reads_the_planes_of_one_product(case):
    """A fused Q/K/V product's output (S, T, 3, H, D): mha_fast_qkv on it gives mha_fast's bits on the
    three planes copied out (same sums in the same order, only the addresses differ)."""
    q, k, v, mask, scale = case
    assume(k.shape[1] == q.shape[1])
    qkv = np.ascontiguousarray(np.stack([q, k, v], axis=2))
    got = mha_fast_qkv(qkv, mask, scale)
    want = mha_fast(q, k, v, mask, scale)
    assert got is not None and want is not None
    assert_bits_equal(_nan_as_one(got), _nan_as_one(want), f"mha_fast_qkv {qkv.shape}")


def _nan_as_one(x):
    """NaNs as one pattern: the sign and payload of a NaN from inf - inf or 0 * inf depend on which operand
    of an add comes first in the machine code (x86 keeps the first NaN operand's), which LLVM may swap."""
    return np.where(np.isnan(x), np.float32(np.nan), x)


def test_mha_fast_declines_what_it_does_not_cover():
    """None (the caller runs the ops) for operands outside its contract, never a wrong answer."""
    rng = np.random.default_rng(1)
    q = rng.normal(size=(2, 5, 3, 8)).astype(np.float32)
    k = rng.normal(size=(2, 5, 3, 8)).astype(np.float32)
    m = np.zeros((2, 1, 5, 5), np.float32)
    assert mha_fast(q.astype(np.float16), k, k, m, 1.0) is None                 # f16 q
    assert mha_fast(q, k[:, :, :1], k[:, :, :1], m, 1.0) is None                # grouped heads
    assert mha_fast(q[:, :, :, ::2], k[:, :, :, ::2], k[:, :, :, ::2], m, 1.0) is None   # strided rows
    assert mha_fast(q, k, k, m[:, :, :4], 1.0) is None                          # fewer mask rows than queries
    assert mha_fast(q, k, k, np.zeros((2, 2, 5, 5), np.float32), 1.0) is None   # mask heads not dividing 3
    assert mha_fast(q, k, k, m.astype(np.float64), 1.0) is None
    assert mha_fast(q[:, :0], k, k, m, 1.0) is None                             # empty
    qkv = np.stack([q, k, k], axis=2)
    assert mha_fast_qkv(qkv[:, :, :2], m, 1.0) is None                          # two planes
    assert mha_fast_qkv(qkv[..., ::2], m, 1.0) is None                          # strided
    assert mha_fast_qkv(qkv.astype(np.float16), m, 1.0) is None


def test_bert_fast_runs_the_fused_attention_within_fast_bounds(tmp_path):
    """On a tiny random BERT (tests/models/bert_tiny.py), numerics="fast" on the Numba backend runs the fused
    attention once a layer (f32 weights: one Q/K/V product, mha_fast_qkv on its planes) and a capture runs the
    three ops instead. The fused states are as close to exact mode's as
    the ops' are (both are fast mode: f32 sums in the linear layers too, which the layer norms amplify to
    ~4e-5 relative here), and the two fast results differ by the attention sums' order only (~1e-6)."""
    pytest.importorskip("safetensors", reason="the safetensors package reads Hugging Face weights")
    import refimpl.kernels.attention as ka
    from refimpl.models import bert
    from tests.models.bert_tiny import write_tiny_bert_hf
    model = bert.load(write_tiny_bert_hf(tmp_path / "tiny"))
    ids = [[4] + list(range(7, 7 + n)) + [5] for n in (3, 17, 9)]
    calls = []
    orig, orig_qkv = ka.mha_fast, ka.mha_fast_qkv
    with refimpl.backend("numba"):
        with refimpl.numerics("exact"):
            exact = bert.forward(model, ids)
        with refimpl.numerics("fast"):
            ka.mha_fast = lambda *a: calls.append("mha_fast") or orig(*a)
            ka.mha_fast_qkv = lambda *a: calls.append("qkv") or orig_qkv(*a)
            try:
                fused = bert.forward(model, ids)
                n_fused = len(calls)
                ops_path = bert.forward(model, ids, capture={})
            finally:
                ka.mha_fast, ka.mha_fast_qkv = orig, orig_qkv
    assert calls == ["qkv"] * model.hparams.n_layer                         # the capture took the ops
    assert n_fused == model.hparams.n_layer
    for a, b, c in zip(fused, ops_path, exact):
        scale = float(np.abs(c).max())
        d_fused, d_ops = float(np.abs(a - c).max()), float(np.abs(b - c).max())
        assert d_fused <= 2 * d_ops + 1e-6 * scale, (d_fused, d_ops, scale)
        assert float(np.abs(a - b).max()) <= 1e-5 * scale, (float(np.abs(a - b).max()), scale)
