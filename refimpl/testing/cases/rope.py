"""OpCases for rope_ext, rope_multi and their _back ops (see refimpl/testing/cases/__init__.py)."""
from __future__ import annotations

import ctypes

import numpy as np
from hypothesis import strategies as st

from . import OpCase, cases, named, ne_str
from ._draw import maybe_view

NORMAL, NEOX, MROPE, VISION, IMROPE = 0, 2, 8, 24, 40


def _g():
    from .. import ggml
    return ggml.lib()


_GGML_FN = {"rope_ext": "ggml_rope_ext", "rope_ext_back": "ggml_rope_ext_back",
            "rope_multi": "ggml_rope_multi", "rope_multi_back": "ggml_rope_multi_back"}


def rope_case(op, x, pos, ff=None, *, n_dims, mode, sections=None, n_ctx_orig=0, freq_base=10000.0, freq_scale=1.0,
              ext_factor=0.0, attn_factor=1.0, beta_fast=32.0, beta_slow=1.0, tag=""):
    kw = dict(n_dims=n_dims, mode=mode, n_ctx_orig=n_ctx_orig, freq_base=freq_base, freq_scale=freq_scale,
              ext_factor=ext_factor, attn_factor=attn_factor, beta_fast=beta_fast, beta_slow=beta_slow)
    params = (n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow)
    multi = op.startswith("rope_multi")
    if multi:
        kw["sections"] = tuple(sections)

    def build(ctx, a, p, f):
        fn = getattr(_g(), _GGML_FN[op])
        if multi:
            return fn(ctx, a, p, f, n_dims, (ctypes.c_int * 4)(*sections), mode, *params)
        return fn(ctx, a, p, f, n_dims, mode, *params)

    t = "f16" if x.dtype == np.float16 else "f32"
    name = (f"{'ROPE_BACK' if op.endswith('_back') else 'ROPE'}(type={t},ne_a={ne_str(x)},n_dims={n_dims},mode={mode}"
            f"{f',sections={list(sections)}' if multi else ''},n_ctx={n_ctx_orig},fb={freq_base},fs={freq_scale},"
            f"ef={ext_factor},af={attn_factor},ff={int(ff is not None)},v={int(not x.flags.c_contiguous)}"
            f",pos_max={int(np.max(pos))}{tag})")
    return OpCase(op, (x, pos, ff), kw, build=build, tensors=(x, pos, ff), type=t, name=name)


@st.composite
def _params(draw, n_dims):
    yarn = draw(st.sampled_from(["none", "none", "linear", "yarn"]))
    p = dict(freq_base=draw(st.sampled_from([10000.0, 500000.0, 1e6, 100.0])), freq_scale=1.0, ext_factor=0.0,
             attn_factor=draw(st.sampled_from([1.0, 1.0, 0.7, 1.25])), n_ctx_orig=0, beta_fast=32.0, beta_slow=1.0)
    if yarn != "none":
        p["freq_scale"] = draw(st.sampled_from([0.25, 0.5, 0.125]))
        p["n_ctx_orig"] = draw(st.sampled_from([256, 2048, 4096]))
    if yarn == "yarn":
        p["ext_factor"] = draw(st.sampled_from([1.0, 0.5]))
        p["beta_fast"], p["beta_slow"] = draw(st.sampled_from([(32.0, 1.0), (16.0, 2.0), (0.0, 0.0)]))
    return p


# f16 results round once more: where refimpl's f32 value is an ulp from ggml's, the f16 value can be one f16
# ulp off; f16 tensors get at least 16 * 2 * 2 elements so that one such flip stays far below the tolerance
DTYPES = [np.float32, np.float32, np.float16]


@st.composite
def _x(draw, D, dtype, nd=None):
    small = 1 if dtype == np.float32 else 2
    T, H, B = draw(st.integers(small, 5)), draw(st.integers(small, 4)), draw(st.integers(1, 2))
    nd = nd or draw(st.integers(2 if dtype == np.float32 else 3, 4))
    shp = (B, T, H, D)[4 - nd:] if nd > 1 else (D,)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.uniform(-1, 1, shp).astype(dtype)
    return maybe_view(draw, x), rng, (shp[-3] if len(shp) >= 3 else 1)


def _positions(draw, rng, n):
    kind = draw(st.sampled_from(["small", "long", "negative"]))
    lo, hi = {"small": (0, 16), "long": (0, 40000), "negative": (-100, 100)}[kind]
    return rng.integers(lo, hi, n).astype(np.int32)


@st.composite
def _rope_ext(draw, op):
    dtype = draw(st.sampled_from(DTYPES))
    D = draw(st.sampled_from([2, 4, 6, 8, 16, 32, 64, 80, 128] if dtype == np.float32 else [16, 32, 64, 80, 128]))
    n_dims = draw(st.sampled_from(sorted({D, max(2, 2 * (D // 4)), 2})))     # all, about half, one pair
    x, rng, T = draw(_x(D, dtype))
    mode = draw(st.sampled_from([NORMAL, NEOX]))
    ff = rng.uniform(1, 8, n_dims // 2 + draw(st.integers(0, 2))).astype(np.float32) if draw(st.booleans()) else None
    return rope_case(op, x, _positions(draw, rng, T), ff, n_dims=n_dims, mode=mode, **draw(_params(n_dims)))


@st.composite
def _rope_multi(draw, op):
    mode = draw(st.sampled_from([MROPE, IMROPE, VISION]))
    dtype = draw(st.sampled_from(DTYPES))
    D = draw(st.sampled_from([d for d in (8, 16, 32, 64, 128) if d >= (16 if dtype == np.float16 else 8)]))
    if mode == VISION:
        n_dims = D // 2
    else:
        n_dims = draw(st.sampled_from(sorted({D, D // 2 if D % 4 == 0 else D})))
    x, rng, T = draw(_x(D, dtype, draw(st.integers(3, 4))))
    half = D // 2
    s = [draw(st.integers(0, max(1, half // 2))) for _ in range(4)]
    if mode == VISION:
        s[2] = s[3] = 0
    if not any(s[:3]):
        s[0] = 1
    ff = None
    if draw(st.booleans()):
        ff = rng.uniform(1, 8, n_dims if mode == VISION else n_dims // 2).astype(np.float32)
    return rope_case(op, x, _positions(draw, rng, 4 * T), ff, n_dims=n_dims, mode=mode, sections=s,
                     **draw(_params(n_dims)))


cases("rope_ext")(lambda: _rope_ext("rope_ext"))
cases("rope_ext_back")(lambda: _rope_ext("rope_ext_back"))
cases("rope_multi")(lambda: _rope_multi("rope_multi"))
cases("rope_multi_back")(lambda: _rope_multi("rope_multi_back"))


def _u(rng, *shp, dtype=np.float32):
    return rng.uniform(-1, 1, shp).astype(dtype)


def _ext_named(op):
    """llama (NORMAL, base 10000/500000), NEOX with partial n_dims (Phi-2), llama-3 freq_factors, YaRN with
    positions far beyond n_ctx_orig, f16 data, a permuted (n_head, n_tokens) view, long positions."""
    rng = np.random.default_rng(11)
    out = []
    for D, H, T in ((64, 4, 7), (128, 2, 3), (80, 3, 33)):
        for mode in (NORMAL, NEOX):
            x, pos = _u(rng, T, H, D), rng.integers(0, 4096, T).astype(np.int32)
            out.append(rope_case(op, x, pos, n_dims=D, mode=mode))
    x, pos = _u(rng, 5, 4, 80), np.arange(5, dtype=np.int32) + 4090
    out.append(rope_case(op, x, pos, n_dims=32, mode=NEOX, tag=",partial"))
    out.append(rope_case(op, x, pos, n_dims=32, mode=NORMAL, tag=",partial"))
    x, pos = _u(rng, 6, 2, 128), np.array([0, 1, 100, 8191, 65535, 131071], np.int32)
    ff = rng.uniform(1, 40, 64).astype(np.float32)
    out.append(rope_case(op, x, pos, ff, n_dims=128, mode=NORMAL, freq_base=500000.0, tag=",llama3_ff"))
    for ef in (1.0, 0.5):                                  # YaRN: positions beyond n_ctx_orig = 4096
        x, pos = _u(rng, 6, 4, 64), np.array([0, 17, 4095, 4096, 9000, 16383], np.int32)
        out.append(rope_case(op, x, pos, n_dims=64, mode=NEOX, n_ctx_orig=4096, freq_scale=0.25, ext_factor=ef,
                             attn_factor=1.0, tag=",yarn"))
        out.append(rope_case(op, x, pos, n_dims=64, mode=NORMAL, n_ctx_orig=4096, freq_base=1e6, freq_scale=0.125,
                             ext_factor=ef, attn_factor=0.9, beta_fast=32.0, beta_slow=1.0, tag=",yarn"))
    x = _u(rng, 4, 8, 64, dtype=np.float16)
    out.append(rope_case(op, x, np.arange(4, dtype=np.int32) * 37, n_dims=64, mode=NEOX, tag=",f16"))
    x = _u(rng, 8, 5, 64)                                  # stored (n_head, n_tokens, head_dim), viewed permuted
    xv = np.ascontiguousarray(x.transpose(1, 0, 2)).transpose(1, 0, 2)
    out.append(rope_case(op, xv, np.arange(8, dtype=np.int32), n_dims=64, mode=NORMAL, tag=",permuted"))
    x = _u(rng, 2, 1, 3, 32)
    out.append(rope_case(op, x, np.array([7], np.int32), n_dims=32, mode=NEOX, attn_factor=2.0, tag=",batch"))
    return out


def _multi_named(op):
    """Qwen2-VL M-RoPE sections [16, 24, 24, 0] (head_dim 128), Qwen3-VL interleaved, vision encoder."""
    rng = np.random.default_rng(12)
    out = []
    T = 7
    pos = np.concatenate([np.arange(T), rng.integers(0, 30, T), rng.integers(0, 30, T), np.zeros(T)]).astype(np.int32)
    x = _u(rng, T, 4, 128)
    out.append(rope_case(op, x, pos, n_dims=128, mode=MROPE, sections=[16, 24, 24, 0], freq_base=1e6))
    out.append(rope_case(op, x, pos, n_dims=128, mode=IMROPE, sections=[24, 20, 20, 0], freq_base=5e6))
    out.append(rope_case(op, x, pos, n_dims=64, mode=MROPE, sections=[8, 12, 12, 0], tag=",partial"))
    pos = rng.integers(0, 64, 4 * T).astype(np.int32)
    x = _u(rng, T, 3, 80)
    out.append(rope_case(op, x, pos, n_dims=40, mode=VISION, sections=[10, 10, 0, 0]))
    ff = rng.uniform(1, 4, 40).astype(np.float32)
    out.append(rope_case(op, x, pos, ff, n_dims=40, mode=VISION, sections=[20, 20, 0, 0], tag=",ff"))
    x = _u(rng, T, 2, 32, dtype=np.float16)
    out.append(rope_case(op, x, pos, n_dims=32, mode=MROPE, sections=[3, 2, 2, 1], tag=",wrap"))
    return out


named("rope_ext")(lambda: _ext_named("rope_ext"))
named("rope_ext_back")(lambda: _ext_named("rope_ext_back"))
named("rope_multi")(lambda: _multi_named("rope_multi"))
named("rope_multi_back")(lambda: _multi_named("rope_multi_back"))
