"""OpCases for flash_attn_ext (see refimpl/testing/cases/__init__.py).

The tolerance row (`type`) is K's type: ggml-cpu's one-row path rounds q to K's vec_dot type (f16, bf16, Q8_0
blocks ...) and, for F16 V, accumulates the output in f16 -- exact mode does neither.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ...qtensor import QTensor, quantize
from . import OpCase, cases, named, ne_str
from ._draw import maybe_view


def _g():
    from .. import ggml
    return ggml.lib()


KV_TYPES = ["f16", "f16", "f32", "bf16", "q8_0", "q4_0"]


def _store(x: np.ndarray, t: str):
    """x (f32 values) stored as a K/V cache of type t."""
    if t == "f32":
        return x
    if t == "f16":
        return x.astype(np.float16)
    return quantize(x, t)


def _tname(x) -> str:
    if isinstance(x, QTensor):
        return x.traits.name.lower()
    return "f16" if x.dtype == np.float16 else "f32"


def tiled_path(q, k, v) -> bool:
    """Whether ggml-cpu (AVX2 build) runs flash_attn_ext's tiled path: >= 64 queries, K and V both F16 or
    both F32, head_dim_v a multiple of the 8 f32 lanes."""
    kt, vt = _tname(k), _tname(v)
    return q.shape[-2] >= 64 and kt == vt and kt in ("f16", "f32") and v.shape[-1] % 8 == 0


def fa_case(q, k, v, mask=None, scale=1.0, max_bias=0.0, logit_softcap=0.0, sinks=None, tag=""):
    def build(ctx, qt, kt, vt, mt, st_):
        t = _g().ggml_flash_attn_ext(ctx, qt, kt, vt, mt, scale, max_bias, logit_softcap)
        if st_ is not None:
            _g().ggml_flash_attn_ext_add_sinks(t, st_)
        return t
    views = any(isinstance(a, np.ndarray) and not a.flags.c_contiguous for a in (q, k, v))
    name = (f"FLASH_ATTN_EXT(q={ne_str(q)},k={ne_str(k)},v={ne_str(v)},type_KV={_tname(k)}/{_tname(v)},"
            f"mask={ne_str(mask) if mask is not None else 0},sinks={int(sinks is not None)},scale={scale:g},"
            f"max_bias={max_bias},logit_softcap={logit_softcap}{',view' if views else ''}{tag})")
    return OpCase("flash_attn_ext", (q, k, v, mask, scale, max_bias, logit_softcap, sinks), build=build,
                  tensors=(q, k, v, mask, sinks), type=_tname(k), name=name)


def _mask(rng, S_m, H_m, rows, cols, p_inf):
    m = rng.uniform(-1, 1, (S_m, H_m, rows, cols))
    m[rng.random(m.shape) < p_inf] = -np.inf
    return m.astype(np.float16)


def _q(rng, S, H, N, D):
    """Q as llama.cpp hands it over: stored (S, N, H, D), viewed (S, H, N, D) (ggml_permute(q, 0, 2, 1, 3))."""
    return np.ascontiguousarray(rng.uniform(-1, 1, (S, N, H, D)).astype(np.float32)).transpose(0, 2, 1, 3)


@cases("flash_attn_ext")
@st.composite
def _flash_attn_ext(draw):
    kt = draw(st.sampled_from(KV_TYPES))
    vt = kt if draw(st.booleans()) else draw(st.sampled_from(KV_TYPES))
    quant = kt in ("q8_0", "q4_0") or vt in ("q8_0", "q4_0")
    DK = draw(st.sampled_from([32, 64, 128] if kt in ("q8_0", "q4_0") else [8, 32, 40, 64, 128]))
    dv = [32, 64] if vt in ("q8_0", "q4_0") else [8, 16, 32, 64]           # quantized rows: blocks of 32
    DV = draw(st.sampled_from(sorted(set(dv) | ({DK} if DK % 32 == 0 or vt not in ("q8_0", "q4_0") else set()))))
    HKV = draw(st.sampled_from([1, 2]))
    H = HKV * draw(st.sampled_from([1, 2, 3, 4]))
    S = draw(st.sampled_from([1, 1, 2]))
    path = draw(st.sampled_from(["one_row", "one_row", "tiled", "split"] if not quant else ["one_row"]))
    N = {"one_row": draw(st.integers(1, 9)), "tiled": draw(st.integers(64, 70)), "split": 1}[path]
    NKV = {"one_row": draw(st.integers(1, 100)), "tiled": draw(st.integers(1, 150)),
           "split": draw(st.integers(512, 700))}[path]
    if path == "split":
        S = 1
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = _q(rng, S, H, N, DK) if draw(st.booleans()) else rng.uniform(-1, 1, (S, H, N, DK)).astype(np.float32)
    k = _store(rng.uniform(-1, 1, (S, HKV, NKV, DK)).astype(np.float32), kt)
    v = _store(rng.uniform(-1, 1, (S, HKV, NKV, DV)).astype(np.float32), vt)
    if isinstance(k, np.ndarray):
        k = maybe_view(draw, k)
    if isinstance(v, np.ndarray):
        v = maybe_view(draw, v)
    if S == 1 and draw(st.booleans()):           # 3-D operands, as llama.cpp's single sequence
        q, k, v = q[0], (k[0] if isinstance(k, np.ndarray) else k[0]), (v[0] if isinstance(v, np.ndarray) else v[0])
    mask, max_bias = None, 0.0
    if draw(st.booleans()):
        m3 = draw(st.sampled_from(sorted({1, S})))
        m2 = draw(st.sampled_from(sorted({1, H, HKV})))
        mask = _mask(rng, m3, m2, N + draw(st.sampled_from([0, 0, 3])), NKV + draw(st.sampled_from([0, 0, 5])),
                     draw(st.sampled_from([0.0, 0.2, 0.7])))
        if m3 == 1 and m2 == 1 and draw(st.booleans()):
            mask = mask[0, 0]
        max_bias = draw(st.sampled_from([0.0, 0.0, 3.0, 8.0]))
    # quantized K: ggml rounds q to Q8 blocks, an error that grows with the scores; keep llama.cpp's scale
    scale = draw(st.sampled_from([1.0 / np.sqrt(DK)] if kt in ("q8_0", "q4_0") else [1.0 / np.sqrt(DK), 1.0, 0.37]))
    softcap = draw(st.sampled_from([0.0, 0.0, 0.0, 1.0, 50.0]))
    if softcap and mask is None and tiled_path(q, k, v) and NKV % 64:
        softcap = 0.0                            # ggml-cpu bug, see refimpl.ops.flash_attn_ext

    sinks = rng.uniform(-2, 2, H).astype(np.float32) if draw(st.booleans()) else None
    return fa_case(q, k, v, mask, float(scale), max_bias, softcap, sinks)


@named("flash_attn_ext")
def _flash_attn_ext_named():
    """GQA, each CPU path (one-row, tiled >= 64 queries, split-KV decode with >= 512 positions), quantized and
    f32/bf16 caches, DK != DV, padded and broadcast masks, fully masked rows with and without sinks, ALiBi,
    soft-capping, two sequences."""
    rng = np.random.default_rng(21)
    u = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)   # noqa: E731
    out = []
    # llama-style decode and prefill with GQA (8 query heads on 2 kv heads), F16 cache, causal padded mask
    for N, NKV in ((1, 80), (7, 96), (64, 80), (70, 150)):
        causal = np.where(np.arange(NKV)[None, :] <= np.arange(N)[:, None] + NKV - N, 0.0, -np.inf)
        mask = np.full((N + (32 - N % 32) % 32, NKV), -np.inf)
        mask[:N] = causal
        out.append(fa_case(_q(rng, 1, 8, N, 64)[0], u(2, NKV, 64).astype(np.float16), u(2, NKV, 64).astype(np.float16),
                           mask.astype(np.float16), 0.125, tag=",gqa_causal"))
    # split-KV decode path (n_tokens = 1, n_kv >= 512), f16 and f32 caches
    for t in ("f16", "f32"):
        out.append(fa_case(u(4, 1, 64), _store(u(4, 600, 64), t), _store(u(4, 600, 64), t), scale=0.125,
                           tag=",split_kv"))
    # tiled path with f32 K/V, ALiBi on 6 heads (not a power of 2) and a per-head mask
    out.append(fa_case(u(6, 64, 32), u(6, 130, 32), u(6, 130, 32), _mask(rng, 1, 6, 64, 130, 0.2)[0], 0.2, 3.0))
    # quantized and bf16 K with f16 V, and DK != DV (DeepSeek-like 192/128 is too big: 96/64)
    for kt in ("q8_0", "q4_0", "bf16"):
        out.append(fa_case(u(4, 5, 64), _store(u(2, 40, 64), kt), u(2, 40, 64).astype(np.float16),
                           _mask(rng, 1, 1, 5, 40, 0.1)[0, 0], 0.125))
    out.append(fa_case(u(2, 3, 96), u(2, 50, 96).astype(np.float16), u(2, 50, 64).astype(np.float16), scale=0.1))
    # every position of some rows masked: zeros, with and without sinks
    m = _mask(rng, 1, 1, 4, 30, 0.0)[0, 0]
    m[1] = -np.inf
    for sinks in (None, u(4)):
        out.append(fa_case(u(4, 4, 32), u(4, 30, 32).astype(np.float16), u(4, 30, 32).astype(np.float16), m, 0.2,
                           sinks=sinks, tag=",masked_row"))
    # soft-capping (Gemma-2: 50), with and without mask
    out.append(fa_case(u(2, 3, 64) * 4, u(2, 20, 64).astype(np.float16), u(2, 20, 64).astype(np.float16),
                       scale=0.125, logit_softcap=50.0))
    out.append(fa_case(u(2, 3, 64) * 4, u(1, 20, 64), u(1, 20, 64), _mask(rng, 1, 1, 3, 20, 0.3)[0, 0],
                       1.0, logit_softcap=1.0))
    # two sequences, mask per sequence broadcast over heads, sinks
    out.append(fa_case(u(2, 4, 3, 32), u(2, 2, 25, 32).astype(np.float16), u(2, 2, 25, 32).astype(np.float16),
                       _mask(rng, 2, 1, 3, 25, 0.3), 0.18, sinks=u(4)))
    return out
