"""Normalizations over rows (ggml dim 0 = the last NumPy axis), group norm over channels, rms_norm_back.

All take and return f32 (ggml's CPU kernels abort on other types). Sums are f64 where ggml's are, everything
else is f32 with one rounding per C operation; where ggml's compiled code fuses `a*b + c` into one FMA the
expression is evaluated in f64 and rounded once.
"""
from __future__ import annotations

import numpy as np

from ..dispatch import op
from ..rounding import fma32
from ..shapes import as4, check_layout, fail



def _f32_input(name: str, **arrays) -> list[np.ndarray]:
    out = []
    for k, x in arrays.items():
        x = np.asarray(x)
        if x.dtype != np.float32:
            fail(name, f"{k} must be f32, got {x.dtype}", **{k: x})
        out.append(x)
    return out


def _eps_nonneg(name: str, eps: float, a) -> np.float32:
    if not eps >= 0.0:
        fail(name, f"eps must be >= 0, got {eps}", a=a)
    return np.float32(eps)


def _check_rms_norm(a, eps) -> None:
    (a,) = _f32_input("rms_norm", a=a)
    check_layout("rms_norm", "rows", a=a)
    _eps_nonneg("rms_norm", eps, a)


def _check_norm(a, eps) -> None:
    (a,) = _f32_input("norm", a=a)
    _eps_nonneg("norm", eps, a)


@op("rms_norm", check=_check_rms_norm, layout_check=True)
def rms_norm(a: np.ndarray, eps: float) -> np.ndarray:
    """ggml_rms_norm: scale each row (along ne0) to unit root-mean-square.

    a    ne [n, r1, r2, r3]   numpy (r3, r2, r1, n)   f32, e.g. (n_tokens, n_embd)
    out  same ne, f32

        out = a / sqrt(mean(a**2 over ne0) + eps)

    No gain: llama.cpp multiplies by the norm weight with a separate mul.
    As in ggml-cpu, squares are rounded to f32 and summed in f64, mean and scale are f32.
    """
    a, eps = np.asarray(a), np.float32(eps)           # checked by _check_rms_norm
    n = a.shape[-1]
    ss = np.sum(np.square(a), axis=-1, keepdims=True, dtype=np.float64)
    mean = (ss / n).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):    # a zero row with eps 0 gives NaN, as in ggml
        scale = np.float32(1.0) / np.sqrt(mean + eps)
        return a * scale


@op("l2_norm")
def l2_norm(a: np.ndarray, eps: float) -> np.ndarray:
    """ggml_l2_norm: scale each row (along ne0) to unit Euclidean norm.

    a    ne [n, r1, r2, r3]   numpy (r3, r2, r1, n)   f32, e.g. RWKV-7 keys (n_tokens, n_head, head_dim)
    out  same ne, f32

        out = a / max(||a||_2 over ne0, eps)        eps bounds the norm, not the squared norm

    As in ggml-cpu: f32 squares summed in f64, the sum rounded to f32, sqrtf, fmaxf with eps, 1/x in f32.
    Rows may be strided (ggml's kernel accepts any layout).
    """
    (a,) = _f32_input("l2_norm", a=a)
    eps = _eps_nonneg("l2_norm", eps, a)
    ss = np.sum(np.square(a), axis=-1, keepdims=True, dtype=np.float64).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):    # a zero row with eps 0 gives NaN, as in ggml
        scale = np.float32(1.0) / np.maximum(np.sqrt(ss), eps)
        return a * scale


@op("group_norm")
def group_norm(a: np.ndarray, n_groups: int, eps: float) -> np.ndarray:
    """ggml_group_norm: normalize groups of consecutive channels (ggml dim 2), without gain or bias.

    a    ne [W, H, C, N]   numpy (N, C, H, W)   f32 (e.g. an image batch; C = channels)
    out  same ne, f32

        group g = channels [g*cpg, min((g+1)*cpg, C)),  cpg = ceil(C / n_groups)  (the last group may be
        smaller, groups past C are empty); per g and per N:
        out = (a - mean) / sqrt(var + eps)   over all W*H*channels-in-group elements, var biased

    As in ggml-cpu: mean = f64 sum / count, rounded to f32; centred values f32; var = f64 sum of their f32
    squares / count, rounded to f32; scale = 1/sqrtf(var + eps).
    """
    (a,) = _f32_input("group_norm", a=a)
    check_layout("group_norm", "rows", a=a)
    if int(n_groups) < 1:
        fail("group_norm", f"n_groups must be >= 1, got {n_groups}", a=a)
    eps = np.float32(eps)
    a4 = as4(a)
    C = a4.shape[1]
    if C == 0:
        fail("group_norm", "no channels (ne2 = 0) to group", a=a)
    cpg = -(-C // int(n_groups))
    out = np.empty(a4.shape, np.float32)
    for start in range(0, C, cpg):
        blk = a4[:, start:start + cpg]
        count = blk.shape[1] * blk.shape[2] * blk.shape[3]
        s = np.sum(blk, axis=(1, 2, 3), keepdims=True, dtype=np.float64) + 0.0     # ggml's sum starts at +0.0
        mean = (s / count).astype(np.float32)
        y = blk - mean
        var = (np.sum(np.square(y), axis=(1, 2, 3), keepdims=True, dtype=np.float64) / count).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):   # constant group with eps 0: NaN, as in ggml
            out[:, start:start + cpg] = y * (np.float32(1.0) / np.sqrt(var + eps))
    return out.reshape(a.shape)


@op("rms_norm_back")
def rms_norm_back(a: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """ggml_rms_norm_back: gradient of rms_norm(x, eps) with respect to x.

    a    ne [n, r1, r2, r3]   numpy (r3, r2, r1, n)   f32   dy, the gradient of rms_norm's output
    b    same ne                                      f32   x, rms_norm's input
    out  same ne, f32                                       dx

        dx = (dy - x * sum(x*dy) / (sum(x*x) + n*eps)) / sqrt(mean(x*x) + eps)      sums over ne0

    (ggml's backward pass calls it as rms_norm_back(grad, x, eps).) As in ggml-cpu: f32 products summed in
    f64 and rounded to f32; mean_eps = fl(sum_xx)/n + eps and sum_eps = fl(sum_xx) + fl(eps*n) in f32
    (not fused), rrms = 1/sqrtf(mean_eps), c = -fl(sum_xdy)/sum_eps; dx = fl(dy + x*c) * rrms with the
    inner `dy + x*c` one FMA, rounded once (exactly: f64 then f32 could round twice).
    """
    a, b = _f32_input("rms_norm_back", a=a, b=b)
    if a.shape != b.shape:
        fail("rms_norm_back", "a (dy) and b (x) must have the same shape", a=a, b=b)
    check_layout("rms_norm_back", "rows", a=a, b=b)
    n = a.shape[-1]
    eps = np.float32(eps)
    sum_xx = np.sum(np.square(b), axis=-1, keepdims=True, dtype=np.float64).astype(np.float32)
    sum_xdz = (np.sum(b * a, axis=-1, keepdims=True, dtype=np.float64) + 0.0).astype(np.float32)   # from +0.0
    mean_eps = sum_xx / np.float32(n) + eps
    sum_eps = sum_xx + eps * np.float32(n)       # not fused in ggml-cpu's build (a golden case tells them apart)
    rrms = np.float32(1.0) / np.sqrt(mean_eps)
    scale_x = -sum_xdz / sum_eps
    inner = fma32(b, scale_x, a)
    return inner * rrms


# Defined last on purpose: refimpl/ops/__init__.py `_export` rebinds the module-level name `norm` (this
# module) to this function once it is exported, so ops of this module registered after it would be missed.
@op("norm", check=_check_norm, layout_check=True)
def norm(a: np.ndarray, eps: float) -> np.ndarray:
    """ggml_norm: layer norm of each row (along ne0), without gain or bias.

    a    ne [n, r1, r2, r3]   numpy (r3, r2, r1, n)   f32, e.g. (n_tokens, n_embd)
    out  same ne, f32

        out = (a - mean(a)) / sqrt(var(a) + eps)      var biased (divides by n), both over ne0

    llama.cpp (BERT, ...) multiplies by the weight and adds the bias with separate mul/add.
    As in ggml-cpu: the row sum is f64 rounded to f32 and divided by n in f32 (the mean); the centred values
    are f32; their f32 squares are summed in f64 and divided by n in f64, then rounded (the variance);
    scale = 1/sqrtf(var + eps) in f32. ggml's AVX2 kernel adds the squares 8 at a time in f32 before the f64
    sum (semantics §4.7); exact mode sums them all in f64 (a few ulp apart, see the tolerance table).
    Rows that are not contiguous (a transposed view) take ggml-cpu's scalar path, which sums the row and the
    squares in f32: up to ~1e-9 NMSE from this for data whose mean is large against its spread.
    """
    a, eps = np.asarray(a), np.float32(eps)           # checked by _check_norm
    n = a.shape[-1]
    # ggml sums from +0.0: a row of -0.0 has the mean +0.0 (NumPy's sum keeps the -0.0), so its output is -0.0
    mean = (np.sum(a, axis=-1, keepdims=True, dtype=np.float64) + 0.0).astype(np.float32) / np.float32(n)
    y = a - mean
    var = (np.sum(np.square(y), axis=-1, keepdims=True, dtype=np.float64) / n).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):    # a constant row with eps 0 gives NaN, as in ggml
        scale = np.float32(1.0) / np.sqrt(var + eps)
        return y * scale
