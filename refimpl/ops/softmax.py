"""soft_max_ext (scale, mask, ALiBi, attention sinks) and its gradient soft_max_ext_back."""
from __future__ import annotations

import numpy as np

from ..dispatch import op
from ..shapes import fail, ne4, check_tiles, tile_to


def _exp_f32(x: np.ndarray) -> np.ndarray:
    """expf as a correctly rounded f32 function: exp in f64, rounded once."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.exp(np.asarray(x, np.float64)).astype(np.float32)


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """ALiBi slope of every head h (ggml dim 2 of the scores), f32, as ggml-cpu computes them:

        n_log2 = 2**floor(log2(n_head)),  m0 = 2**(-max_bias/n_log2),  m1 = 2**(-(max_bias/2)/n_log2)
        slope(h) = m0**(h+1) if h < n_log2 else m1**(2*(h - n_log2) + 1);   all 1 when max_bias <= 0

    Every step is an f32 operation (powf, correctly rounded) as in the C code.
    """
    if not max_bias > 0.0 or n_head < 1:
        return np.ones(max(n_head, 0), np.float32)
    n_log2 = 1 << int(np.floor(np.log2(n_head)))
    mb = np.float32(max_bias)
    m0 = np.float32(2.0 ** float(-mb / np.float32(n_log2)))
    m1 = np.float32(2.0 ** float(-(mb / np.float32(2.0)) / np.float32(n_log2)))
    h = np.arange(n_head)
    expo = np.where(h < n_log2, h + 1, 2 * (h - n_log2) + 1).astype(np.float64)
    base = np.where(h < n_log2, np.float64(m0), np.float64(m1))
    return (base ** expo).astype(np.float32)


@op("soft_max_ext", covers="SOFT_MAX")
def soft_max_ext(a: np.ndarray, mask: np.ndarray | None = None, scale: float = 1.0, max_bias: float = 0.0,
                 sinks: np.ndarray | None = None) -> np.ndarray:
    """ggml_soft_max_ext (+ ggml_soft_max_add_sinks): softmax of each row (along ne0) of scale*a + slope*mask.

    a      ne [n_kv, n_tokens, n_head, n_seq]   numpy (n_seq, n_head, n_tokens, n_kv)   f32, contiguous
    mask   ne [n_kv, >= n_tokens, m2, m3]       numpy (m3, m2, >= n_tokens, n_kv)       f16/f32, contiguous;
           row i of a uses mask row i (extra rows, e.g. llama.cpp's padding, are ignored); tiled over
           heads and sequences (a.ne2 % m2 == 0, a.ne3 % m3 == 0: head h uses mask h % m2, np.tile)
    sinks  ne [n_head]                          numpy (n_head,)                         f32, one logit per head
    out    a's shape, f32

        w = scale*a + slope_h*mask;   out = exp(w - M) / (sum(exp(w - M)) + exp(sink_h - M)),
        M = max(max(w), sink_h)       (no sink: the sink terms are absent)

    slope_h is ALiBi's (`alibi_slopes`, heads = ne2) when max_bias > 0 (which needs a mask), else 1.
    A sink is an extra logit that takes probability mass without a value: rows then sum to less than 1.
    Masked entries (-inf) give exactly 0; a row that is all -inf without a sink gives NaN, as in ggml.
    As in ggml-cpu: w = fl(a*scale) then one FMA with slope*mask; exponentials of fl(w - M) rounded to f32;
    their sum (and the sink's) in f64; out = e * fl(1/sum). Exact mode takes each exp correctly rounded
    where ggml-cpu uses a SIMD polynomial (<= 1.5 ulp, semantics §5.3).
    """
    a = np.asarray(a)
    if a.dtype != np.float32:
        fail("soft_max_ext", f"a must be f32, got {a.dtype}", a=a)
    if not a.flags.c_contiguous:
        fail("soft_max_ext", "a must be contiguous (ggml asserts ggml_is_contiguous(a))", a=a)
    na = ne4(a.shape)
    if na[0] == 0:
        fail("soft_max_ext", "rows of length 0 (ne0 = 0) have no softmax", a=a)
    w = a * np.float32(scale)
    slopes = alibi_slopes(na[2], max_bias)
    if mask is not None:
        mask = np.asarray(mask)
        nm = ne4(mask.shape)
        if mask.dtype not in (np.float16, np.float32):
            fail("soft_max_ext", f"mask must be f16 or f32, got {mask.dtype}", a=a, mask=mask)
        if not mask.flags.c_contiguous:
            fail("soft_max_ext", "mask must be contiguous", a=a, mask=mask)
        if nm[0] != na[0] or nm[1] < na[1] or 0 in nm[2:] or na[2] % nm[2] or na[3] % nm[3]:
            fail("soft_max_ext", "mask needs ne0 == a.ne0, ne1 >= a.ne1, a.ne2 % ne2 == 0, a.ne3 % ne3 == 0",
                 a=a, mask=mask)
        m4 = mask.reshape(nm[::-1])[:, :, :na[1], :].astype(np.float64)
        a4 = a.reshape(na[::-1])
        check_tiles("soft_max_ext", a4, m4)
        m = tile_to(a4, m4)
        s4 = slopes.astype(np.float64)[None, :, None, None]
        with np.errstate(invalid="ignore"):
            w = (w.reshape(na[::-1]).astype(np.float64) + s4 * m).astype(np.float32).reshape(a.shape)
    elif max_bias > 0.0:
        fail("soft_max_ext", "max_bias > 0 (ALiBi) needs a mask", a=a)
    w4 = w.reshape(na[::-1])
    M = np.max(w4, axis=-1, keepdims=True)
    if sinks is not None:
        sinks = np.asarray(sinks)
        if sinks.dtype != np.float32:
            fail("soft_max_ext", f"sinks must be f32, got {sinks.dtype}", a=a, sinks=sinks)
        if ne4(sinks.shape)[0] != na[2] or sinks.size != na[2]:
            fail("soft_max_ext", "sinks must be ne [a.ne2] (one per head)", a=a, sinks=sinks)
        sk = sinks.reshape(1, na[2], 1, 1)
        M = np.maximum(M, sk)
    with np.errstate(invalid="ignore"):
        e = _exp_f32(w4 - M)
        total = np.sum(e, axis=-1, keepdims=True, dtype=np.float64)
        if sinks is not None:
            total = total + _exp_f32(sk - M).astype(np.float64)
        with np.errstate(divide="ignore"):
            inv = (1.0 / total).astype(np.float32)
        return (e * inv).reshape(a.shape)


@op("soft_max_ext_back", covers="SOFT_MAX_BACK")
def soft_max_ext_back(a: np.ndarray, b: np.ndarray, scale: float = 1.0, max_bias: float = 0.0) -> np.ndarray:
    """ggml_soft_max_ext_back: gradient of soft_max_ext (without mask) with respect to its input.

    a    ne [n, r1, r2, r3]   numpy (r3, r2, r1, n)   f32, contiguous   dy, the gradient of the softmax output
    b    same ne                                      f32, contiguous   y, the softmax output
    out  same ne, f32                                                   dx

        dx = scale * y * (dy - sum(y*dy))       sum over ne0, per row

    (ggml's backward pass calls it as soft_max_ext_back(grad, y, scale, max_bias).) max_bias does not enter:
    ALiBi adds slope * mask, a constant of the input, so the gradient is the same for every slope (ggml-vulkan
    ignores it; ggml-cpu asserts max_bias == 0, a restriction of that backend, not of the op). As in
    ggml-cpu: the dot y.dy rounded to f32 (exact mode sums it in f64; ggml-cpu in 8-lane f32), then
    fl(dy - dot), fl(* y), fl(* scale).
    """
    a, b = np.asarray(a), np.asarray(b)
    for k, x in (("a", a), ("b", b)):
        if x.dtype != np.float32:
            fail("soft_max_ext_back", f"{k} must be f32, got {x.dtype}", a=a, b=b)
        if not x.flags.c_contiguous:
            fail("soft_max_ext_back", f"{k} must be contiguous (ggml-cpu asserts it)", a=a, b=b)
    if a.shape != b.shape:
        fail("soft_max_ext_back", "a (dy) and b (y) must have the same shape", a=a, b=b)
    dot = np.sum(a.astype(np.float64) * b.astype(np.float64), axis=-1, keepdims=True).astype(np.float32)
    return ((a - dot) * b) * np.float32(scale)
