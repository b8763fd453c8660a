"""OpCases for the conv ops: im2col family, convolutions, pooling, resampling, timestep embedding
(see refimpl/testing/cases/__init__.py)."""
from __future__ import annotations

import ctypes

import numpy as np
from hypothesis import strategies as st

from ...ops.conv import (POOL_AVG, POOL_MAX, SCALE_FLAG_ALIGN_CORNERS, SCALE_FLAG_ANTIALIAS,
                         SCALE_MODE_BICUBIC, SCALE_MODE_BILINEAR, SCALE_MODE_NEAREST, conv_size, pool_size)
from ...qtensor import quantize
from ...types import GGMLType
from . import OpCase, cases, named, ne_str
from ._draw import maybe_view, values


def _g():
    from .. import ggml
    return ggml.lib()


F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
_GT = {F32: 0, F16: 1}                  # GGML_TYPE_F32, GGML_TYPE_F16


def _t(x) -> str:
    return {F32: "f32", F16: "f16"}.get(np.asarray(x).dtype, "bf16") if not hasattr(x, "traits") else x.traits.name


def _u(rng, *shape, dtype=np.float32):
    return rng.uniform(-1, 1, shape).astype(dtype)


@st.composite
def _conv_dim(draw, max_k=4, max_s=3, max_p=2, max_d=3, max_extra=9):
    """(input size, kernel, stride, pad, dilation) with a positive ggml output size (C division included:
    a window that only starts inside the input still counts)."""
    k, s, p, d = (draw(st.integers(1, max_k)), draw(st.integers(1, max_s)), draw(st.integers(0, max_p)),
                  draw(st.integers(1, max_d)))
    lo = max(1, d * (k - 1) + 1 - 2 * p - (s - 1))
    n = draw(st.integers(lo, lo + max_extra))
    assert conv_size(n, k, s, p, d) > 0
    return n, k, s, p, d


def _plane_view(draw, x: np.ndarray) -> np.ndarray:
    """x or a view that keeps each row and each (H, W) plane packed -- what ggml's 2-D im2col can read
    (it steps planes by nb2/nb3 but rows by IW): a row-step view over the batch, or batch and channel
    swapped in memory."""
    kind = draw(st.sampled_from(["contiguous", "batch_step", "swap_nc"]))
    if kind == "batch_step":
        big = np.zeros((x.shape[0] * 2,) + x.shape[1:], x.dtype)
        big[::2] = x
        return big[::2]
    if kind == "swap_nc":
        return np.ascontiguousarray(x.swapaxes(0, 1)).swapaxes(0, 1)
    return x


def _col_view(draw, x: np.ndarray) -> np.ndarray:
    """x or the same values with padded rows (a ggml_view with a larger nb1, higher dims dense relative to
    it): the only non-contiguous layout ggml-cpu's pooling kernels read correctly. The oracle does not keep
    a size-1 dim's stride, so callers use it only where the dims the kernel steps over are > 1."""
    if draw(st.booleans()):
        big = np.zeros(x.shape[:-1] + (x.shape[-1] + draw(st.integers(1, 3)),), x.dtype)
        big[..., :x.shape[-1]] = x
        return big[..., :x.shape[-1]]
    return x


# -- im2col ------------------------------------------------------------------------------------------

def _im2col_build(s0, s1, p0, p1, d0, d1, is_2D, dt):
    return lambda ctx, a, b: _g().ggml_im2col(ctx, a, b, s0, s1, p0, p1, d0, d1, is_2D, _GT[dt])


def _im2col_case(a, b, s0, s1, p0, p1, d0, d1, is_2D, dt):
    dt = np.dtype(dt)
    return OpCase("im2col", (a, b, s0, s1, p0, p1, d0, d1, is_2D, dt), type=_t(np.zeros(0, dt)),
                  build=_im2col_build(s0, s1, p0, p1, d0, d1, is_2D, dt),
                  name=f"IM2COL(type_input={_t(b)},type_kernel={_t(a)},dst_type={_t(np.zeros(0, dt))},"
                       f"ne_input={ne_str(b)},ne_kernel={ne_str(a)},s0={s0},s1={s1},p0={p0},p1={p1},d0={d0},"
                       f"d1={d1},is_2D={int(is_2D)})")


@cases("im2col")
@st.composite
def _im2col(draw):
    dt = draw(st.sampled_from([F32, F16]))
    tk = F16 if dt == F16 else draw(st.sampled_from([F32, F16]))
    ti = draw(st.sampled_from([F32, F16])) if dt == F16 else F32
    is_2D = draw(st.booleans())
    IW, KW, s0, p0, d0 = draw(_conv_dim())
    IC, N, OC = draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 2))
    if is_2D:
        IH, KH, s1, p1, d1 = draw(_conv_dim())
        a = values(draw, (OC, IC, KH, KW), dtype=tk)
        b = _plane_view(draw, values(draw, (N, IC, IH, IW), dtype=ti))
    else:
        s1, p1, d1 = 0, 0, 0
        a = values(draw, (OC, IC, KW), dtype=tk)
        b = maybe_view(draw, values(draw, (N, IC, IW), dtype=ti))
    return _im2col_case(a, b, s0, s1, p0, p1, d0, d1, is_2D, dt)


@named("im2col")
def _im2col_named():
    """test-backend-ops' defaults and the shapes of its list: f16/f32 dst, 1-D and 2-D, a 1025-long signal,
    padding wider than the kernel, a window that starts inside and ends outside."""
    rng = np.random.default_rng(10)
    out = []
    for dt, tk, ti in ((F32, F16, F32), (F32, F32, F32), (F16, F16, F32), (F16, F16, F16)):
        out.append(_im2col_case(_u(rng, 1, 3, 3, 3, dtype=tk), _u(rng, 1, 3, 10, 10, dtype=ti),
                                1, 1, 1, 1, 1, 1, True, dt))
        out.append(_im2col_case(_u(rng, 1, 3, 3, dtype=tk), _u(rng, 1, 3, 1025, dtype=ti),
                                1, 0, 1, 0, 1, 0, False, dt))
    out.append(_im2col_case(_u(rng, 2, 2, 3, 3), _u(rng, 3, 2, 5, 7), 2, 3, 4, 3, 2, 1, True, F32))
    out.append(_im2col_case(_u(rng, 1, 1, 3), _u(rng, 2, 1, 2), 2, 0, 0, 0, 1, 0, False, F32))   # OL = 1
    out.append(_im2col_case(_u(rng, 1, 4, 3, 3, dtype=F16), _u(rng, 2, 4, 33, 33), 2, 2, 1, 1, 1, 1, True, F16))
    return out


@cases("im2col_back")
@st.composite
def _im2col_back(draw):
    is_2D = draw(st.booleans())
    IW, KW, s0, p0, d0 = draw(_conv_dim())
    IH, KH, s1, p1, d1 = draw(_conv_dim()) if is_2D else (1, 1, 1, 0, 1)
    IC, N = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    OW, OH = conv_size(IW, KW, s0, p0, d0), conv_size(IH, KH, s1, p1, d1)
    if is_2D:
        ne = [IW, IH, IC, N]
        g, k = values(draw, (N, OH, OW, IC * KH * KW)), values(draw, (1, IC, KH, KW))
    else:
        ne = [IW, IC, N, 1]
        g, k = values(draw, (N, OW, IC * KW)), values(draw, (1, IC, KW))
    return _im2col_back_case(g, k, ne, s0, s1 if is_2D else 1, p0, p1 if is_2D else 0, d0,
                             d1 if is_2D else 1, is_2D)


def _im2col_back_case(g, k, ne, s0, s1, p0, p1, d0, d1, is_2D):
    def build(ctx, x, y):
        arr = (ctypes.c_int64 * 4)(*ne)
        return _g().ggml_im2col_back(ctx, x, y, arr, s0, s1, p0, p1, d0, d1, is_2D)
    return OpCase("im2col_back", (g, k, list(ne), s0, s1, p0, p1, d0, d1, is_2D), build=build,
                  name=f"IM2COL_BACK(ne_grad={ne_str(g)},ne_kernel={ne_str(k)},ne={list(ne)},s0={s0},s1={s1},"
                       f"p0={p0},p1={p1},d0={d0},d1={d1},is_2D={int(is_2D)})".replace(" ", ""))


@named("im2col_back")
def _im2col_back_named():
    rng = np.random.default_rng(11)
    # the gradient of test-backend-ops' default IM2COL (3x3 kernel, 10x10x3 input, pad 1) and a strided one
    return [_im2col_back_case(_u(rng, 1, 10, 10, 27), _u(rng, 1, 3, 3, 3), [10, 10, 3, 1], 1, 1, 1, 1, 1, 1, True),
            _im2col_back_case(_u(rng, 2, 4, 3 * 3), _u(rng, 1, 3, 3), [9, 3, 2, 1], 2, 1, 0, 0, 1, 1, False),
            _im2col_back_case(_u(rng, 1, 3, 4, 2 * 3 * 2), _u(rng, 1, 2, 3, 2), [9, 8, 2, 1], 3, 2, 2, 1, 2, 1, True)]


# -- im2col_3d and the 3-D convolutions ---------------------------------------------------------------

def _im2col_3d_case(a, b, IC, st_, pd, dl, dt):
    dt = np.dtype(dt)
    (s0, s1, s2), (p0, p1, p2), (d0, d1, d2) = st_, pd, dl
    return OpCase("im2col_3d", (a, b, IC, s0, s1, s2, p0, p1, p2, d0, d1, d2, dt), type=_t(np.zeros(0, dt)),
                  build=lambda ctx, x, y: _g().ggml_im2col_3d(ctx, x, y, IC, s0, s1, s2, p0, p1, p2, d0, d1, d2,
                                                              _GT[dt]),
                  name=f"IM2COL_3D(type_input={_t(b)},type_kernel={_t(a)},dst_type={_t(np.zeros(0, dt))},"
                       f"ne_input={ne_str(b)},ne_kernel={ne_str(a)},IC={IC},s0={s0},s1={s1},s2={s2},p0={p0},"
                       f"p1={p1},p2={p2},d0={d0},d1={d1},d2={d2})")


@st.composite
def _dims3(draw):
    return [draw(_conv_dim(max_k=3, max_s=2, max_p=1, max_d=2, max_extra=5)) for _ in range(3)]


@cases("im2col_3d")
@st.composite
def _im2col_3d(draw):
    dt = draw(st.sampled_from([F32, F16]))
    tk = F16 if dt == F16 else draw(st.sampled_from([F32, F16]))
    (IW, KW, s0, p0, d0), (IH, KH, s1, p1, d1), (ID, KD, s2, p2, d2) = draw(_dims3())
    IC, N, OC = draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    a = values(draw, (OC * IC, KD, KH, KW), dtype=tk)
    b = maybe_view(draw, values(draw, (N * IC, ID, IH, IW)))
    return _im2col_3d_case(a, b, IC, (s0, s1, s2), (p0, p1, p2), (d0, d1, d2), dt)


@named("im2col_3d")
def _im2col_3d_named():
    rng = np.random.default_rng(12)
    return [_im2col_3d_case(_u(rng, 2 * 3, 3, 3, 3, dtype=tk), _u(rng, 2 * 3, 5, 6, 7), 3, (1, 1, 1), (1, 1, 1),
                            (1, 1, 1), dt) for dt, tk in ((F32, F32), (F16, F16))] + [
        _im2col_3d_case(_u(rng, 4, 2, 3, 2), _u(rng, 2 * 2, 4, 9, 10), 2, (2, 1, 3), (0, 2, 1), (1, 2, 1), F32)]


def _conv_3d_name(op, a, b, IC, OC, N, st_, pd, dl):
    return (f"{op}(N={N},IC={IC},ID={b.shape[1]},IH={b.shape[2]},IW={b.shape[3]},OC={OC},KD={a.shape[1]},"
            f"KH={a.shape[2]},KW={a.shape[3]},s0={st_[0]},s1={st_[1]},s2={st_[2]},p0={pd[0]},p1={pd[1]},"
            f"p2={pd[2]},d0={dl[0]},d1={dl[1]},d2={dl[2]},type_kernel={_t(a)})")


def _conv_3d_direct_case(a, b, IC, OC, N, st_, pd, dl):
    args = (*st_, *pd, *dl)
    return OpCase("conv_3d_direct", (a, b, *args, IC, N, OC), type=_t(a),
                  build=lambda ctx, x, y: _g().ggml_conv_3d_direct(ctx, x, y, *args, IC, N, OC),
                  name=_conv_3d_name("CONV_3D", a, b, IC, OC, N, st_, pd, dl))


def _conv_3d_case(a, b, IC, OC, N, st_, pd, dl):
    args = (*st_, *pd, *dl)
    return OpCase("conv_3d", (a, b, IC, *args), type=_t(a),
                  build=lambda ctx, x, y: _g().ggml_conv_3d(ctx, x, y, IC, *args),
                  name=_conv_3d_name("CONV_3D_IM2COL", a, b, IC, OC, N, st_, pd, dl))


@st.composite
def _conv_3d_args(draw, data_view):
    tk = draw(st.sampled_from([F32, F16]))
    (IW, KW, s0, p0, d0), (IH, KH, s1, p1, d1), (ID, KD, s2, p2, d2) = draw(_dims3())
    IC, N, OC = draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(1, 3))
    a = values(draw, (OC * IC, KD, KH, KW), dtype=tk)
    b = values(draw, (N * IC, ID, IH, IW))
    b = maybe_view(draw, b, transposed=True) if data_view else b
    return a, b, IC, OC, N, (s0, s1, s2), (p0, p1, p2), (d0, d1, d2)


@cases("conv_3d_direct")
def _conv_3d_direct():
    return _conv_3d_args(data_view=True).map(lambda t: _conv_3d_direct_case(*t))


@cases("conv_3d")
def _conv_3d():
    return _conv_3d_args(data_view=False).map(lambda t: _conv_3d_case(*t))


def _conv_3d_fixed():
    rng = np.random.default_rng(13)
    out = []
    for tk in (F32, F16):     # test-backend-ops-like: N=1, IC=4, 8^3 volume, OC=3, 3^3 kernel, pad 1
        out.append((_u(rng, 3 * 4, 3, 3, 3, dtype=tk), _u(rng, 1 * 4, 8, 8, 8), 4, 3, 1, (1, 1, 1), (1, 1, 1),
                    (1, 1, 1)))
    out.append((_u(rng, 2 * 2, 2, 3, 1), _u(rng, 2 * 2, 5, 9, 4), 2, 2, 2, (2, 1, 3), (1, 0, 2), (2, 1, 1)))
    return out


@named("conv_3d_direct")
def _conv_3d_direct_named():
    return [_conv_3d_direct_case(*t) for t in _conv_3d_fixed()]


@named("conv_3d")
def _conv_3d_named():
    return [_conv_3d_case(*t) for t in _conv_3d_fixed()]


# -- col2im_1d -----------------------------------------------------------------------------------------

def _col2im_case(a, s0, oc, p0):
    K = (a.shape[-1]) // oc
    shape = (oc, (a.shape[0] - 1) * s0 + K - 2 * p0)
    # post: ggml hands back a bf16 result with ggml_n_dims dims ((T_out,) when oc == 1); golden.compare
    # reshapes arrays but not QTensors, so give it refimpl's (oc, T_out)
    return OpCase("col2im_1d", (a, s0, oc, p0), type=_t(a), post=lambda r: r.reshape(shape),
                  build=lambda ctx, x: _g().ggml_col2im_1d(ctx, x, s0, oc, p0),
                  name=f"COL2IM_1D(type={_t(a)},K={K},OC={oc},T_in={a.shape[0]},s0={s0},p0={p0})")


def _as(t, x):
    if t == "bf16":
        return quantize(x, GGMLType.BF16, method="ref")
    return x.astype(np.float16 if t == "f16" else np.float32)


@cases("col2im_1d")
@st.composite
def _col2im_1d(draw):
    t = draw(st.sampled_from(["f32", "f32", "f16", "bf16"]))
    K, oc = draw(st.integers(1, 8)), draw(st.integers(1, 4))
    T_in, s0 = draw(st.integers(1, 12)), draw(st.integers(1, 4))
    full = (T_in - 1) * s0 + K
    p0 = draw(st.integers(0, max(0, (full - 1) // 2)))
    return _col2im_case(_as(t, values(draw, (T_in, K * oc))), s0, oc, p0)


@named("col2im_1d")
def _col2im_1d_named():
    """test-backend-ops' audio shapes in small (K=16 s=8 p=4 as in a vocoder's upsampler), mono, s > K."""
    rng = np.random.default_rng(14)
    out = []
    for t in ("f32", "f16", "bf16"):
        out.append(_col2im_case(_as(t, _u(rng, 33, 16 * 3)), 8, 3, 4))
    out.append(_col2im_case(_u(rng, 1025, 4 * 1), 2, 1, 1))
    out.append(_col2im_case(_u(rng, 5, 3 * 2), 4, 2, 0))          # s0 > K: gaps of zeros
    return out


# -- conv_1d, conv_1d_dw, conv_2d, conv_2d_dw (im2col + mul_mat composites) -----------------------------

def _conv_1d_case(a, b, s0, p0, d0, post=None, tag=""):
    return OpCase("conv_1d", (a, b, s0, p0, d0), type=_t(a), post=post,
                  build=lambda ctx, x, y: _g().ggml_conv_1d(ctx, x, y, s0, p0, d0),
                  name=f"CONV_1D(type_input={_t(b)},ne_input={ne_str(b)},ne_kernel={ne_str(a)},s0={s0},p0={p0},"
                       f"d0={d0}{tag})")


@cases("conv_1d")
@st.composite
def _conv_1d(draw):
    IL, K, s0, p0, d0 = draw(_conv_dim())
    IC, OC = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    a = values(draw, (OC, IC, K), dtype=np.float16)
    b = maybe_view(draw, values(draw, (1, IC, IL), dtype=draw(st.sampled_from([F32, F16]))))
    return _conv_1d_case(a, b, s0, p0, d0)


@named("conv_1d")
def _conv_1d_named():
    """N == 1 shapes, and N == 3 with `post` undoing ggml's layout quirk (the [N*OL, OC] product reshaped
    straight to [OL, OC, N]: memory [OC][N][OL], see refimpl.ops.conv.conv_1d)."""
    rng = np.random.default_rng(15)
    out = [_conv_1d_case(_u(rng, 8, 4, 3, dtype=F16), _u(rng, 1, 4, 1025), 1, 1, 1),
           _conv_1d_case(_u(rng, 2, 3, 5, dtype=F16), _u(rng, 1, 3, 33), 2, 4, 2),
           _conv_1d_case(_u(rng, 1, 1, 1, dtype=F16), _u(rng, 1, 1, 1), 1, 0, 1)]
    N, OC, IC, IL, K = 3, 4, 2, 20, 3
    OL = conv_size(IL, K, 1, 1, 1)
    out.append(_conv_1d_case(_u(rng, OC, IC, K, dtype=F16), _u(rng, N, IC, IL), 1, 1, 1, tag=",layout=ggml",
                             post=lambda g: np.asarray(g).reshape(OC, N, OL).transpose(1, 0, 2)))
    return out


def _conv_1d_dw_case(a, b, s0, p0, d0):
    return OpCase("conv_1d_dw", (a, b, s0, p0, d0), type=_t(a),
                  build=lambda ctx, x, y: _g().ggml_conv_1d_dw(ctx, x, y, s0, p0, d0),
                  name=f"CONV_1D_DW(type_input={_t(b)},ne_input={ne_str(b)},ne_kernel={ne_str(a)},s0={s0},"
                       f"p0={p0},d0={d0})")


@cases("conv_1d_dw")
@st.composite
def _conv_1d_dw(draw):
    IL, K, s0, p0, d0 = draw(_conv_dim())
    C = draw(st.integers(1, 5))
    a = values(draw, (C, 1, K), dtype=np.float16)
    b = values(draw, (1, C, IL), dtype=draw(st.sampled_from([F32, F16])))
    return _conv_1d_dw_case(a, b, s0, p0, d0)


@named("conv_1d_dw")
def _conv_1d_dw_named():
    rng = np.random.default_rng(16)
    return [_conv_1d_dw_case(_u(rng, 16, 1, 4, dtype=F16), _u(rng, 16, 1025), 1, 3, 1),
            _conv_1d_dw_case(_u(rng, 3, 1, 3, dtype=F16), _u(rng, 1, 3, 33), 2, 1, 2),
            _conv_1d_dw_case(_u(rng, 6, 1, 3, dtype=F16), _u(rng, 3, 10), 1, 1, 1)]   # kernel channels 2x data's


@named("conv_1d_ph")
def _conv_1d_ph_named():
    rng = np.random.default_rng(28)
    out = []
    for K, s, d in ((3, 1, 1), (4, 2, 2), (1, 1, 1)):
        a, b = _u(rng, 3, 2, K, dtype=F16), _u(rng, 1, 2, 17)
        out.append(OpCase("conv_1d_ph", (a, b, s, d), type="f16",
                          build=lambda ctx, x, y, s=s, d=d: _g().ggml_conv_1d_ph(ctx, x, y, s, d),
                          name=f"CONV_1D_PH(ne_input={ne_str(b)},ne_kernel={ne_str(a)},s={s},d={d})"))
    return out


@named("conv_1d_dw_ph")
def _conv_1d_dw_ph_named():
    rng = np.random.default_rng(29)
    out = []
    for K, s, d in ((3, 1, 1), (4, 2, 2)):
        a, b = _u(rng, 5, 1, K, dtype=F16), _u(rng, 5, 17)
        out.append(OpCase("conv_1d_dw_ph", (a, b, s, d), type="f16",
                          build=lambda ctx, x, y, s=s, d=d: _g().ggml_conv_1d_dw_ph(ctx, x, y, s, d),
                          name=f"CONV_1D_DW_PH(ne_input={ne_str(b)},ne_kernel={ne_str(a)},s0={s},d0={d})"))
    return out


@named("conv_2d_sk_p0")
def _conv_2d_sk_p0_named():
    rng = np.random.default_rng(30)
    out = []
    for tk, (KH, KW), (H, W) in ((F32, (4, 4), (16, 16)), (F16, (2, 3), (7, 10))):
        a, b = _u(rng, 5, 3, KH, KW, dtype=tk), _u(rng, 2, 3, H, W)
        out.append(OpCase("conv_2d_sk_p0", (a, b), type=_t(a),
                          build=lambda ctx, x, y: _g().ggml_conv_2d_sk_p0(ctx, x, y),
                          name=f"CONV_2D_SK_P0(ne_input={ne_str(b)},ne_kernel={ne_str(a)},type_kernel={_t(a)})"))
    return out


@named("conv_2d_s1_ph")
def _conv_2d_s1_ph_named():
    rng = np.random.default_rng(31)
    out = []
    for tk, (KH, KW) in ((F32, (3, 3)), (F16, (5, 2))):
        a, b = _u(rng, 4, 2, KH, KW, dtype=tk), _u(rng, 1, 2, 9, 11)
        out.append(OpCase("conv_2d_s1_ph", (a, b), type=_t(a),
                          build=lambda ctx, x, y: _g().ggml_conv_2d_s1_ph(ctx, x, y),
                          name=f"CONV_2D_S1_PH(ne_input={ne_str(b)},ne_kernel={ne_str(a)},type_kernel={_t(a)})"))
    return out


def _conv_2d_name(op, a, b, s0, s1, p0, p1, d0, d1, tag=""):
    return (f"{op}(ne_input={ne_str(b)},ne_kernel={ne_str(a)},type_kernel={_t(a)},stride0={s0},stride1={s1},"
            f"padding0={p0},padding1={p1},dilation0={d0},dilation1={d1}{tag})")


def _conv_2d_case(a, b, s0, s1, p0, p1, d0, d1):
    return OpCase("conv_2d", (a, b, s0, s1, p0, p1, d0, d1), type=_t(a),
                  build=lambda ctx, x, y: _g().ggml_conv_2d(ctx, x, y, s0, s1, p0, p1, d0, d1),
                  name=_conv_2d_name("CONV_2D_IM2COL", a, b, s0, s1, p0, p1, d0, d1))


def _conv_2d_direct_case(a, b, s0, s1, p0, p1, d0, d1):
    return OpCase("conv_2d_direct", (a, b, s0, s1, p0, p1, d0, d1), type=_t(a),
                  build=lambda ctx, x, y: _g().ggml_conv_2d_direct(ctx, x, y, s0, s1, p0, p1, d0, d1),
                  name=_conv_2d_name("CONV_2D", a, b, s0, s1, p0, p1, d0, d1))


@st.composite
def _conv_2d_args(draw, direct: bool):
    tk = draw(st.sampled_from([F32, F16]))
    IW, KW, s0, p0, d0 = draw(_conv_dim())
    IH, KH, s1, p1, d1 = draw(_conv_dim())
    IC, OC, N = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 2))
    a = values(draw, (OC, IC, KH, KW), dtype=tk)
    ti = F32 if direct or tk == F32 else draw(st.sampled_from([F32, F16]))
    b = values(draw, (N, IC, IH, IW), dtype=ti)
    b = maybe_view(draw, b, transposed=True) if direct else _plane_view(draw, b)
    return a, b, s0, s1, p0, p1, d0, d1


@cases("conv_2d")
def _conv_2d():
    return _conv_2d_args(direct=False).map(lambda t: _conv_2d_case(*t))


@cases("conv_2d_direct")
def _conv_2d_direct():
    return _conv_2d_args(direct=True).map(lambda t: _conv_2d_direct_case(*t))


def _conv_2d_fixed():
    """From test-backend-ops' CONV_2D list, scaled down: 3x3 and 1x1 kernels, stride 2, dilation 2,
    a kernel larger than the padded input, an odd 33-wide input."""
    rng = np.random.default_rng(17)
    out = []
    for tk in (F32, F16):
        out.append((_u(rng, 8, 3, 3, 3, dtype=tk), _u(rng, 1, 3, 16, 16), 1, 1, 1, 1, 1, 1))
        out.append((_u(rng, 4, 2, 1, 1, dtype=tk), _u(rng, 2, 2, 9, 7), 2, 2, 0, 0, 1, 1))
        out.append((_u(rng, 2, 3, 3, 3, dtype=tk), _u(rng, 1, 3, 33, 17), 2, 1, 2, 0, 2, 2))
    out.append((_u(rng, 2, 1, 5, 5), _u(rng, 1, 1, 3, 3), 1, 1, 1, 1, 1, 1))
    return out


@named("conv_2d")
def _conv_2d_named():
    return [_conv_2d_case(*t) for t in _conv_2d_fixed()]


@named("conv_2d_direct")
def _conv_2d_direct_named():
    out = [_conv_2d_direct_case(*t) for t in _conv_2d_fixed()]
    a, b, *p = _conv_2d_fixed()[0]       # data as a permuted view (WHCN read through strides)
    out.append(_conv_2d_direct_case(a, np.ascontiguousarray(b.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2), *p))
    out[-1].name = out[-1].name[:-1] + ",cwhn=1)"
    return out


def _conv_2d_dw_case(a, b, s0, s1, p0, p1, d0, d1):
    return OpCase("conv_2d_dw", (a, b, s0, s1, p0, p1, d0, d1), type=_t(a),
                  build=lambda ctx, x, y: _g().ggml_conv_2d_dw(ctx, x, y, s0, s1, p0, p1, d0, d1),
                  name=_conv_2d_name("CONV_2D_DW_IM2COL", a, b, s0, s1, p0, p1, d0, d1))


@cases("conv_2d_dw")
@st.composite
def _conv_2d_dw(draw):
    IW, KW, s0, p0, d0 = draw(_conv_dim())
    IH, KH, s1, p1, d1 = draw(_conv_dim())
    C, N = draw(st.integers(1, 4)), draw(st.integers(1, 2))
    a = values(draw, (C, 1, KH, KW), dtype=np.float16)
    b = values(draw, (N, C, IH, IW), dtype=draw(st.sampled_from([F32, F16])))
    return _conv_2d_dw_case(a, b, s0, s1, p0, p1, d0, d1)


@named("conv_2d_dw")
def _conv_2d_dw_named():
    rng = np.random.default_rng(18)
    return [_conv_2d_dw_case(_u(rng, 9, 1, 3, 3, dtype=F16), _u(rng, 1, 9, 34, 17), 1, 1, 0, 0, 1, 1),
            _conv_2d_dw_case(_u(rng, 16, 1, 3, 3, dtype=F16), _u(rng, 2, 16, 8, 32), 2, 2, 1, 1, 1, 1),
            _conv_2d_dw_case(_u(rng, 2, 1, 3, 3, dtype=F16), _u(rng, 1, 4, 7, 7), 1, 1, 1, 1, 2, 2)]  # C % C_a


# -- conv_2d_dw_direct (CONV_2D_DW): WHCN and channels-innermost CWHN ----------------------------------

def _conv_2d_dw_direct_case(a, b, s, p, d, cwhn):
    """cwhn: hand ggml the channels-innermost memory and permute it in the graph, as test-backend-ops does
    (the kernel's size-1 dim keeps its permuted stride, which ggml-cpu's layout check reads)."""
    g = _g()
    if cwhn:
        tensors = (np.ascontiguousarray(a.transpose(2, 3, 1, 0)), np.ascontiguousarray(b.transpose(0, 2, 3, 1)))

        def build(ctx, k, x):
            return g.ggml_conv_2d_dw_direct(ctx, g.ggml_permute(ctx, k, 3, 2, 0, 1),
                                            g.ggml_permute(ctx, x, 2, 0, 1, 3), s, s, p, p, d, d)
    else:
        tensors = (a, b)

        def build(ctx, k, x):
            return g.ggml_conv_2d_dw_direct(ctx, k, x, s, s, p, p, d, d)
    return OpCase("conv_2d_dw_direct", (a, b, s, s, p, p, d, d), build=build, tensors=tensors,
                  name=f"CONV_2D_DW(ne_input={ne_str(b)},ne_kernel={ne_str(a)},stride={s},padding={p},"
                       f"dilation={d},cwhn={int(cwhn)})")


@cases("conv_2d_dw_direct")
@st.composite
def _conv_2d_dw_direct(draw):
    k, s, p, d = draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(0, 2)), draw(st.integers(1, 2))
    lo = max(1, d * (k - 1) + 1 - 2 * p - (s - 1))
    IW, IH = draw(st.integers(lo, lo + 9)), draw(st.integers(lo, lo + 9))
    C, N = draw(st.integers(1, 12)), draw(st.integers(1, 2))
    cwhn = C > 1 and IW > 1 and draw(st.booleans())   # else ggml-cpu sees neither layout it supports
    return _conv_2d_dw_direct_case(values(draw, (C, 1, k, k)), values(draw, (N, C, IH, IW)), s, p, d, cwhn)


@named("conv_2d_dw_direct")
def _conv_2d_dw_direct_named():
    """test-backend-ops' list (channels 9 and 64: the CWHN kernel's 8-lane SIMD body plus a scalar tail)."""
    rng = np.random.default_rng(19)
    out = []
    for cwhn in (False, True):
        out.append(_conv_2d_dw_direct_case(_u(rng, 9, 1, 3, 3), _u(rng, 1, 9, 34, 17), 1, 0, 1, cwhn))
        out.append(_conv_2d_dw_direct_case(_u(rng, 64, 1, 3, 3), _u(rng, 1, 64, 8, 32), 2, 1, 1, cwhn))
    return out


# -- transposed convolutions -----------------------------------------------------------------------

def _ct1_case(a, b, s0):
    return OpCase("conv_transpose_1d", (a, b, s0, 0, 1), type=_t(a),
                  build=lambda ctx, x, y: _g().ggml_conv_transpose_1d(ctx, x, y, s0, 0, 1),
                  name=f"CONV_TRANSPOSE_1D(ne_input={ne_str(b)},ne_kernel={ne_str(a)},type_kernel={_t(a)},"
                       f"s0={s0},p0=0,d0=1)")


@cases("conv_transpose_1d")
@st.composite
def _conv_transpose_1d(draw):
    K, OC, IC, L, s0 = (draw(st.integers(1, 5)), draw(st.integers(1, 4)), draw(st.integers(1, 4)),
                        draw(st.integers(1, 16)), draw(st.integers(1, 4)))
    a = maybe_view(draw, values(draw, (IC, OC, K), dtype=draw(st.sampled_from([F32, F16]))))
    return _ct1_case(a, maybe_view(draw, values(draw, (IC, L))), s0)


@named("conv_transpose_1d")
def _conv_transpose_1d_named():
    """test-backend-ops' CONV_TRANSPOSE_1D list: strides 1..3 around kernels of 2 and 3, 1 channel."""
    rng = np.random.default_rng(20)
    out = []
    for (L, IC), (K, OC, ICk), s0 in (((3, 2), (2, 3, 2), 3), ((3, 2), (2, 3, 2), 2), ((3, 2), (2, 3, 2), 1),
                                      ((3, 2), (2, 3, 2), 3), ((2, 1), (3, 2, 1), 2), ((197, 32), (16, 32, 32), 1)):
        out.append(_ct1_case(_u(rng, ICk, OC, K), _u(rng, IC, L), s0))
    out.append(_ct1_case(_u(rng, 2, 3, 4, dtype=F16), _u(rng, 2, 33), 2))
    return out


def _ct2_case(a, b, stride):
    return OpCase("conv_transpose_2d_p0", (a, b, stride), type=_t(a),
                  build=lambda ctx, x, y: _g().ggml_conv_transpose_2d_p0(ctx, x, y, stride),
                  name=f"CONV_TRANSPOSE_2D(kernel_type={_t(a)},ne_input={ne_str(b)},ne_kernel={ne_str(a)},"
                       f"stride={stride})")


@cases("conv_transpose_2d_p0")
@st.composite
def _conv_transpose_2d(draw):
    """N == 1 only: ggml-cpu computes batch 0 and leaves the others zero (see the op's docstring)."""
    KW, KH, OC, IC = (draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 3)),
                      draw(st.integers(1, 4)))
    W, H, stride = draw(st.integers(1, 9)), draw(st.integers(1, 9)), draw(st.integers(1, 3))
    a = values(draw, (IC, OC, KH, KW), dtype=draw(st.sampled_from([F32, F16])))
    return _ct2_case(a, maybe_view(draw, values(draw, (1, IC, H, W))), stride)


@named("conv_transpose_2d_p0")
def _conv_transpose_2d_named():
    rng = np.random.default_rng(21)
    out = []
    for tk in (F32, F16):     # test-backend-ops: input [3,2,3,1] kernel [2,3,2,3]; input [10,10,9,1] kernel [3,3,1,9]
        out.append(_ct2_case(_u(rng, 3, 2, 3, 2, dtype=tk), _u(rng, 1, 3, 2, 3), 1))
        out.append(_ct2_case(_u(rng, 9, 1, 3, 3, dtype=tk), _u(rng, 1, 9, 10, 10), 2))
    return out


# -- pooling -------------------------------------------------------------------------------------------

_POOL = {POOL_MAX: "max", POOL_AVG: "avg"}


def _pool1_case(a, op, k0, s0, p0):
    return OpCase("pool_1d", (a, op, k0, s0, p0), build=lambda ctx, x: _g().ggml_pool_1d(ctx, x, op, k0, s0, p0),
                  name=f"POOL_1D(pool_type={_POOL[op]},type_input={_t(a)},ne_input={ne_str(a)},k0={k0},s0={s0},"
                       f"p0={p0})")


@st.composite
def _pool_dim(draw):
    k, s = draw(st.integers(1, 5)), draw(st.integers(1, 3))
    p = draw(st.integers(0, k))
    n = draw(st.integers(max(1, k - 2 * p), 16))
    return n, k, s, p


@cases("pool_1d")
@st.composite
def _pool_1d(draw):
    IW, k, s, p = draw(_pool_dim())
    ne = [IW] + [draw(st.integers(1, 3)) for _ in range(draw(st.integers(0, 3)))]
    a = values(draw, tuple(ne[::-1]), dtype=draw(st.sampled_from([F32, F16])))
    a = _col_view(draw, a) if len(ne) < 2 or ne[1] > 1 else a      # rows are stepped by nb1
    return _pool1_case(a, draw(st.sampled_from([POOL_MAX, POOL_AVG])), k, s, p)


@named("pool_1d")
def _pool_1d_named():
    """test-backend-ops' POOL_1D list: k in 1..4, s in 1..3, p in 0..2 on a [10, 3] input; and padding as
    wide as the kernel (windows wholly outside: MAX gives -FLT_MAX, AVG 0)."""
    rng = np.random.default_rng(22)
    out = []
    for op in (POOL_MAX, POOL_AVG):
        for t in (F32, F16):
            for k, s, p in ((1, 1, 0), (3, 2, 1), (4, 3, 2), (2, 1, 2)):
                out.append(_pool1_case(_u(rng, 3, 10, dtype=t), op, k, s, p))
        out.append(_pool1_case(_u(rng, 2, 1025), op, 5, 3, 2))
    return out


def _pool2_case(a, op, k0, k1, s0, s1, p0, p1):
    return OpCase("pool_2d", (a, op, k0, k1, s0, s1, p0, p1),
                  build=lambda ctx, x: _g().ggml_pool_2d(ctx, x, op, k0, k1, s0, s1, float(p0), float(p1)),
                  name=f"POOL_2D(pool_type={_POOL[op]},type_input={_t(a)},ne_input={ne_str(a)},k0={k0},k1={k1},"
                       f"s0={s0},s1={s1},p0={p0},p1={p1})")


@st.composite
def _pool2_args(draw):
    (IW, k0, s0, p0), (IH, k1, s1, p1) = draw(_pool_dim()), draw(_pool_dim())
    if draw(st.integers(0, 4)) == 0:          # fractional padding: output size from it, windows from int(p)
        p0, p1 = p0 + 0.5, p1 + 0.5
    return IW, IH, k0, k1, s0, s1, p0, p1


@cases("pool_2d")
@st.composite
def _pool_2d(draw):
    IW, IH, k0, k1, s0, s1, p0, p1 = draw(_pool2_args())
    n3, n2 = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    a = values(draw, (n3, n2, IH, IW), dtype=draw(st.sampled_from([F32, F16])))
    a = _col_view(draw, a) if n2 > 1 else a     # ggml walks planes by nb2 up to nbytes: nb2 must be kept
    return _pool2_case(a, draw(st.sampled_from([POOL_MAX, POOL_AVG])), k0, k1, s0, s1, p0, p1)


@named("pool_2d")
def _pool_2d_named():
    """test-backend-ops' POOL_2D grid in small ([10, 10, 3, 1], k 1..3, s 1..2, p 0..1), padding >= kernel,
    fractional padding, 33 x 1025."""
    rng = np.random.default_rng(23)
    out = []
    for op in (POOL_MAX, POOL_AVG):
        for t in (F32, F16):
            for k0, k1, s0, s1, p0, p1 in ((1, 1, 1, 1, 0, 0), (3, 3, 2, 2, 1, 1), (3, 1, 1, 2, 1, 0),
                                           (2, 3, 2, 1, 0, 1), (2, 2, 1, 1, 2, 2), (3, 2, 2, 1, 0.5, 1.5)):
                out.append(_pool2_case(_u(rng, 1, 3, 10, 10, dtype=t), op, k0, k1, s0, s1, p0, p1))
        out.append(_pool2_case(_u(rng, 33, 1025), op, 3, 3, 2, 2, 1, 1))
    return out


def _pool2b_case(g, af, op, k0, k1, s0, s1, p0, p1):
    return OpCase("pool_2d_back", (g, af, op, k0, k1, s0, s1, p0, p1),
                  build=lambda ctx, x, y: _g().ggml_pool_2d_back(ctx, x, y, op, k0, k1, s0, s1, float(p0), float(p1)),
                  name=f"POOL_2D_BACK(pool_type={_POOL[op]},ne_grad={ne_str(g)},ne_input={ne_str(af)},k0={k0},"
                       f"k1={k1},s0={s0},s1={s1},p0={p0},p1={p1})")


@cases("pool_2d_back")
@st.composite
def _pool_2d_back(draw):
    IW, IH, k0, k1, s0, s1, p0, p1 = draw(_pool2_args())
    n3, n2 = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    af = values(draw, (n3, n2, IH, IW))
    if draw(st.booleans()):                  # ties: the first maximum of a window takes the gradient
        af = np.round(af * 2) / 2
    g = values(draw, (n3, n2, pool_size(IH, k1, s1, p1), pool_size(IW, k0, s0, p0)))
    return _pool2b_case(g, af, draw(st.sampled_from([POOL_MAX, POOL_AVG])), k0, k1, s0, s1, p0, p1)


@named("pool_2d_back")
def _pool_2d_back_named():
    rng = np.random.default_rng(24)
    out = []
    for op in (POOL_MAX, POOL_AVG):
        for k0, k1, s0, s1, p0, p1 in ((2, 2, 2, 2, 0, 0), (3, 3, 1, 1, 1, 1), (3, 2, 2, 1, 0, 1)):
            af = _u(rng, 1, 3, 10, 10)
            g = _u(rng, 1, 3, pool_size(10, k1, s1, p1), pool_size(10, k0, s0, p0))
            out.append(_pool2b_case(g, af, op, k0, k1, s0, s1, p0, p1))
    af = np.zeros((1, 1, 4, 4), np.float32)            # all equal: the window's first element wins
    out.append(_pool2b_case(_u(rng, 1, 1, 3, 3), af, POOL_MAX, 2, 2, 1, 1, 0, 0))
    return out


# -- upscale / interpolate -------------------------------------------------------------------------

_MODES = [SCALE_MODE_NEAREST, SCALE_MODE_BILINEAR, SCALE_MODE_BICUBIC,
          SCALE_MODE_NEAREST | SCALE_FLAG_ALIGN_CORNERS, SCALE_MODE_BILINEAR | SCALE_FLAG_ALIGN_CORNERS,
          SCALE_MODE_BICUBIC | SCALE_FLAG_ALIGN_CORNERS, SCALE_MODE_BILINEAR | SCALE_FLAG_ANTIALIAS,
          SCALE_MODE_BILINEAR | SCALE_FLAG_ANTIALIAS | SCALE_FLAG_ALIGN_CORNERS]


def _mode_type(mode: int) -> str:
    """Tolerance row: NEAREST copies values (exact), the others interpolate in f32."""
    return "nearest" if mode & 0xFF == SCALE_MODE_NEAREST else "f32"


def _interp_case(a, ne_t, mode):
    return OpCase("interpolate", (a, *ne_t, mode), type=_mode_type(mode),
                  build=lambda ctx, x: _g().ggml_interpolate(ctx, x, *ne_t, mode),
                  name=f"INTERPOLATE(type=f32,ne={ne_str(a)},ne_tgt={list(ne_t)},mode={mode})".replace(" ", ""))


@cases("interpolate")
@st.composite
def _interpolate(draw):
    ne = [draw(st.integers(1, 8)) for _ in range(4)]
    ne_t = [draw(st.integers(1, 12)), draw(st.integers(1, 12)), draw(st.integers(1, 4)), draw(st.integers(1, 3))]
    a = maybe_view(draw, values(draw, tuple(ne[::-1])), transposed=True)
    return _interp_case(a, ne_t, draw(st.sampled_from(_MODES)))


@named("interpolate")
def _interpolate_named():
    """test-backend-ops' INTERPOLATE list: up and down in each dim, every mode and flag, 1-pixel sides."""
    rng = np.random.default_rng(25)
    out = []
    for ne, ne_t in (([2, 5, 7, 11], [5, 7, 11, 13]), ([5, 7, 11, 13], [2, 5, 7, 11]), ([1, 4, 3, 2], [2, 8, 3, 2]),
                     ([4, 1, 3, 2], [1, 1, 3, 2]), ([6, 9, 2, 1], [4, 3, 2, 1]), ([3, 3, 1, 1], [33, 17, 1, 1])):
        for mode in _MODES:
            out.append(_interp_case(_u(rng, *ne[::-1]), ne_t, mode))
    return out


def _upscale_case(a, sf, mode, transpose=False):
    x = np.ascontiguousarray(a.swapaxes(-1, -2)).swapaxes(-1, -2) if transpose else a
    return OpCase("upscale", (x, sf, mode), type=_mode_type(mode),
                  build=lambda ctx, t: _g().ggml_upscale(ctx, t, sf, mode),
                  name=f"UPSCALE(type=f32,ne={ne_str(a)},scale_factor={sf},mode={mode},transpose={int(transpose)})")


@cases("upscale")
@st.composite
def _upscale(draw):
    ne = [draw(st.integers(1, 6)) for _ in range(draw(st.integers(1, 4)))]
    mode = draw(st.sampled_from(_MODES))
    return _upscale_case(values(draw, tuple(ne[::-1])), draw(st.integers(2, 4)), mode,
                         transpose=len(ne) >= 2 and draw(st.booleans()))


@named("upscale")
def _upscale_named():
    """test-backend-ops' UPSCALE defaults ([512, 512, 3, 1] x2, in small) and its transposed source."""
    rng = np.random.default_rng(26)
    return [_upscale_case(_u(rng, 1, 3, 16, 16), 2, mode, tr)
            for mode in (SCALE_MODE_NEAREST, SCALE_MODE_BILINEAR, SCALE_MODE_BICUBIC) for tr in (False, True)]


@named("upscale_ext")
def _upscale_ext_named():
    rng = np.random.default_rng(32)
    out = []
    for mode in (SCALE_MODE_NEAREST, SCALE_MODE_BILINEAR | SCALE_FLAG_ALIGN_CORNERS):
        a = _u(rng, 2, 3, 4, 5)
        out.append(OpCase("upscale_ext", (a, 9, 7, 3, 2, mode), type=_mode_type(mode),
                          build=lambda ctx, x, mode=mode: _g().ggml_upscale_ext(ctx, x, 9, 7, 3, 2, mode),
                          name=f"UPSCALE_EXT(type=f32,ne={ne_str(a)},ne_tgt=[9,7,3,2],mode={mode})"))
    return out


# -- timestep_embedding ---------------------------------------------------------------------------------

def _ts_case(t, dim, max_period):
    return OpCase("timestep_embedding", (t, dim, max_period),
                  build=lambda ctx, x: _g().ggml_timestep_embedding(ctx, x, dim, max_period),
                  name=f"TIMESTEP_EMBEDDING(type=f32,ne_a={ne_str(t)},dim={dim},max_period={max_period})")


@cases("timestep_embedding")
@st.composite
def _timestep_embedding(draw):
    n = draw(st.integers(1, 8))
    t = values(draw, (n,), 0.0, draw(st.sampled_from([1.0, 1000.0])))
    return _ts_case(t, draw(st.integers(1, 64)), draw(st.sampled_from([10000, 100, 2, 1])))


@named("timestep_embedding")
def _timestep_embedding_named():
    """test-backend-ops' default (ne_a [2], dim 320, max_period 10000), odd dims (a trailing zero column),
    diffusion-sized timesteps up to 1000."""
    rng = np.random.default_rng(27)
    return [_ts_case(rng.uniform(0, 1000, n).astype(np.float32), dim, 10000)
            for n, dim in ((2, 320), (3, 321), (1, 1), (33, 256))]
