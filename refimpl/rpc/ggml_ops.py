"""One table from ggml 0.25.3's graph nodes to refimpl's ops.

A node arrives with its op (`enum ggml_op` of ggml 0.25.3), its `op_params` (16 int32 words; floats are
stored bit for bit) and up to ten sources. `OPS` maps each op name to a handler that reads the params the
way ggml 0.25.3's constructor in `ggml.c` wrote them and calls the refimpl op of the same name; `UNARY` and
`GLU` do the same for the sub-op in `op_params[0]`. The enum lists below are ggml 0.25.3's, in order (a test
checks them against the vendored `ggml.h`), so a client of another version fails loudly instead of
computing the wrong op.

Sources come as NumPy views of the server's buffers (NumPy order: ne reversed, leading size-1 axes dropped
down to two, so a decode's activation row is (1, n_embd) as in refimpl's models and the kernels' decode paths
apply) or as QTensor views for block types and BF16; a handler returns the node's value (any layout with the node's
element count)
and the server converts it to the node's type and writes it into the node's bytes.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from .. import ops
from ..ops.rope import ROPE_TYPE_MROPE, ROPE_TYPE_VISION

# enum ggml_op, ggml 0.25.3 (GGML_OP_COUNT == 101)
OP_NAMES = (
    "NONE", "DUP", "ADD", "ADD_ID", "ADD1", "ACC", "SUB", "MUL", "DIV", "SQR", "SQRT", "LOG", "SIN", "COS", "SUM",
    "SUM_ROWS", "CUMSUM", "MEAN", "ARGMAX", "COUNT_EQUAL", "REPEAT", "REPEAT_BACK", "CONCAT", "SILU_BACK", "NORM",
    "RMS_NORM", "RMS_NORM_BACK", "GROUP_NORM", "L2_NORM", "MUL_MAT", "MUL_MAT_ID", "OUT_PROD", "SCALE", "SET",
    "CPY", "CONT", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "GET_ROWS", "GET_ROWS_BACK", "SET_ROWS", "DIAG",
    "DIAG_MASK_INF", "DIAG_MASK_ZERO", "SOFT_MAX", "SOFT_MAX_BACK", "ROPE", "ROPE_BACK", "CLAMP",
    "CONV_TRANSPOSE_1D", "IM2COL", "IM2COL_BACK", "IM2COL_3D", "COL2IM_1D", "CONV_2D", "CONV_3D", "CONV_2D_DW",
    "CONV_TRANSPOSE_2D", "POOL_1D", "POOL_2D", "POOL_2D_BACK", "UPSCALE", "PAD", "PAD_REFLECT_1D", "ROLL",
    "ARANGE", "TIMESTEP_EMBEDDING", "ARGSORT", "TOP_K", "LEAKY_RELU", "TRI", "FILL", "FLASH_ATTN_EXT",
    "FLASH_ATTN_BACK", "SSM_CONV", "SSM_SCAN", "WIN_PART", "WIN_UNPART", "GET_REL_POS", "ADD_REL_POS",
    "RWKV_WKV6", "GATED_LINEAR_ATTN", "RWKV_WKV7", "SOLVE_TRI", "GATED_DELTA_NET", "LIGHTNING_INDEXER",
    "DSV4_HC_COMB", "DSV4_HC_PRE", "DSV4_HC_POST", "UNARY", "MAP_CUSTOM1", "MAP_CUSTOM2", "MAP_CUSTOM3",
    "CUSTOM", "CROSS_ENTROPY_LOSS", "CROSS_ENTROPY_LOSS_BACK", "OPT_STEP_ADAMW", "OPT_STEP_SGD", "GLU",
)
UNARY_NAMES = (
    "ABS", "SGN", "NEG", "STEP", "TANH", "ELU", "RELU", "SIGMOID", "GELU", "GELU_QUICK", "SILU", "HARDSWISH",
    "HARDSIGMOID", "EXP", "EXPM1", "SOFTPLUS", "GELU_ERF", "XIELU", "FLOOR", "CEIL", "ROUND", "TRUNC",
)
GLU_NAMES = ("REGLU", "GEGLU", "SWIGLU", "SWIGLU_OAI", "GEGLU_ERF", "GEGLU_QUICK", "SWIGLU_CLAMP")

# ops that compute nothing: their bytes are another tensor's (views) or were set by the client (leaves)
NO_COMPUTE = frozenset({"NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE"})

# ggml 0.25.3 ops refimpl does not compute, with the reason the server logs and docs/test-backend-ops.md lists
NOT_COMPUTED = {
    "FLASH_ATTN_BACK": "legacy attention backward, unused by inference; refimpl has no op for it",
    "MAP_CUSTOM1": "a client-side C callback: its code never crosses the wire",
    "MAP_CUSTOM2": "a client-side C callback: its code never crosses the wire",
    "MAP_CUSTOM3": "a client-side C callback: its code never crosses the wire",
    "CUSTOM": "a client-side C callback: its code never crosses the wire",
}
UNARY_NOT_COMPUTED: dict[str, str] = {}
GLU_NOT_COMPUTED: dict[str, str] = {}


STORED = object()     # a handler's result: it wrote the node's bytes itself (an in-place op)


class Unsupported(Exception):
    """The node cannot be computed by refimpl (the server fills it with NaN and logs why)."""


class Params:
    """A node's op_params: 16 int32 words, read as ints or as the floats stored in them (both decoded once:
    a stored graph's nodes read them at every step)."""
    __slots__ = ("w", "_ints", "_floats")

    def __init__(self, words):
        self.w = np.asarray(words, np.int32)
        self._ints = tuple(self.w.tolist())
        self._floats = tuple(self.w.view(np.float32).tolist())

    def i(self, k: int) -> int:
        return self._ints[k]

    def f(self, k: int) -> float:
        return self._floats[k]


def _rank(x, n: int):
    """x as n NumPy axes: leading size-1 axes dropped, or added, to reach n (ggml's tensor as the op's rank)."""
    shape = x.shape
    while len(shape) > n and shape[0] == 1:
        shape = shape[1:]
    if len(shape) < n:
        shape = (1,) * (n - len(shape)) + tuple(shape)
    return x.reshape(shape) if tuple(shape) != tuple(x.shape) else x


def squeeze(x, least: int = 2):
    """x without its leading (NumPy) size-1 axes, keeping at least `least` axes: the same ggml tensor."""
    k = 0
    while x.ndim - k > least and x.shape[k] == 1:
        k += 1
    return x.reshape(x.shape[k:]) if k else x


Handler = Callable  # (node, srcs: list, p: Params) -> value
OPS: dict[str, Handler] = {}
UNARY: dict[str, Callable] = {}
GLU: dict[str, Callable] = {}


def _reg(*names):
    def deco(fn):
        for n in names:
            OPS[n] = fn
        return fn
    return deco


# -- output shapes that op_params and sources imply -----------------------------------------------------------
# For the ops whose result's size comes from op_params or from a product of their sources' sizes (ggml.c
# computes `ne` from them when the graph is built), ggml's formula: the server compares it with the node's own
# ne before the op allocates anything, so that a hostile node cannot make an op allocate past what it holds.
# (node ne, sources' ne, params) -> the ne ggml would give the node, or None when the params are impossible
SHAPES: dict[str, Callable] = {}


def _shape(name):
    def deco(fn):
        SHAPES[name] = fn
        return fn
    return deco


def _conv_out(ins, ks, s, p, d):              # ggml_calc_conv_output_size (C's division, toward zero)
    if s <= 0:
        return None
    num = ins + 2 * p - d * (ks - 1) - 1
    return (num // s if num >= 0 else -(-num // s)) + 1


def _pool_out(ins, ks, s, p):                 # ggml_calc_pool_output_size (float p, truncated)
    return int((ins + 2 * p - ks) / s + 1) if s > 0 else None


@_shape("ARANGE")
def _arange_ne(ne, src, p):
    start, stop, step = p.f(0), p.f(1), p.f(2)
    if not (math.isfinite(start) and math.isfinite(stop) and math.isfinite(step)) or step == 0 or stop <= start:
        return None
    return [math.ceil(np.float32(stop - start) / np.float32(step)), 1, 1, 1]


@_shape("TIMESTEP_EMBEDDING")
def _timestep_ne(ne, src, p):
    return [p.i(0), src[0][0], 1, 1]


@_shape("PAD")
def _pad_ne(ne, src, p):
    return [src[0][k] + p.i(2 * k) + p.i(2 * k + 1) for k in range(4)]


@_shape("POOL_1D")
def _pool_1d_ne(ne, src, p):
    o = _pool_out(src[0][0], p.i(1), p.i(2), p.i(3))
    return None if o is None else [o, *src[0][1:]]


@_shape("POOL_2D")
def _pool_2d_ne(ne, src, p):
    o0, o1 = _pool_out(src[0][0], p.i(1), p.i(3), p.i(5)), _pool_out(src[0][1], p.i(2), p.i(4), p.i(6))
    return None if o0 is None or o1 is None else [o0, o1, src[0][2], src[0][3]]


@_shape("CONV_TRANSPOSE_1D")
def _conv_t1d_ne(ne, src, p):
    s0 = p.i(0)
    return [(src[1][0] - 1) * s0 + src[0][0], src[0][1], src[1][2], 1] if s0 > 0 else None


@_shape("CONV_TRANSPOSE_2D")
def _conv_t2d_ne(ne, src, p):
    s = p.i(0)
    return [(src[1][0] - 1) * s + src[0][0], (src[1][1] - 1) * s + src[0][1], src[0][2], src[1][3]] if s > 0 \
        else None


@_shape("IM2COL")
def _im2col_ne(ne, src, p):
    s0, s1, p0, p1, d0, d1, is_2d = (p.i(k) for k in range(7))
    a, b = src
    ow = _conv_out(b[0], a[0], s0, p0, d0)
    oh = _conv_out(b[1], a[1], s1, p1, d1) if is_2d else 0
    if ow is None or oh is None:
        return None
    return [a[2] * a[1] * a[0], ow, oh, b[3]] if is_2d else [a[1] * a[0], ow, b[2], 1]


@_shape("IM2COL_3D")
def _im2col_3d_ne(ne, src, p):
    s0, s1, s2, p0, p1, p2, d0, d1, d2, ic = (p.i(k) for k in range(10))
    a, b = src
    outs = [_conv_out(b[k], a[k], s, q, d) for k, s, q, d in ((0, s0, p0, d0), (1, s1, p1, d1), (2, s2, p2, d2))]
    if ic <= 0 or None in outs:
        return None
    return [a[0] * a[1] * a[2] * ic, outs[0], outs[1], outs[2] * (b[3] // ic)]


@_shape("CONV_2D")
def _conv_2d_ne(ne, src, p):
    s0, s1, p0, p1, d0, d1 = (p.i(k) for k in range(6))
    a, b = src
    o0, o1 = _conv_out(b[0], a[0], s0, p0, d0), _conv_out(b[1], a[1], s1, p1, d1)
    return None if o0 is None or o1 is None else [o0, o1, a[3], b[3]]


@_shape("CONV_2D_DW")
def _conv_2d_dw_ne(ne, src, p):
    s0, s1, p0, p1, d0, d1 = (p.i(k) for k in range(6))
    a, b = src
    o0, o1 = _conv_out(b[0], a[0], s0, p0, d0), _conv_out(b[1], a[1], s1, p1, d1)
    return None if o0 is None or o1 is None else [o0, o1, b[2], b[3]]


@_shape("CONV_3D")
def _conv_3d_ne(ne, src, p):
    s0, s1, s2, p0, p1, p2, d0, d1, d2, c, n, oc = (p.i(k) for k in range(12))
    a, b = src
    outs = [_conv_out(b[k], a[k], s, q, d) for k, s, q, d in ((0, s0, p0, d0), (1, s1, p1, d1), (2, s2, p2, d2))]
    return None if None in outs else [*outs, oc * n]


@_shape("COL2IM_1D")
def _col2im_1d_ne(ne, src, p):
    s0, oc, p0 = p.i(0), p.i(1), p.i(2)
    if s0 <= 0 or oc <= 0 or p0 < 0:
        return None
    return [(src[0][1] - 1) * s0 + src[0][0] // oc - 2 * p0, oc, 1, 1]


@_shape("PAD_REFLECT_1D")
def _pad_reflect_1d_ne(ne, src, p):
    return [src[0][0] + p.i(0) + p.i(1), *src[0][1:]]


@_shape("WIN_PART")
def _win_part_ne(ne, src, p):
    w = p.i(2)
    if w <= 0:
        return None
    npx, npy = -(-src[0][1] // w), -(-src[0][2] // w)
    return [src[0][0], w, w, npx * npy]


@_shape("SSM_SCAN")                             # K: the state snapshots kept after the outputs
def _ssm_scan_ne(ne, src, p):
    if len(src) < 7:
        return None
    s, x, ids = src[0], src[1], src[6]
    return [math.prod(x) + p.i(0) * s[0] * s[1] * s[2] * ids[0], 1, 1, 1]


@_shape("GATED_DELTA_NET")
def _gated_delta_net_ne(ne, src, p):
    if len(src) < 6:
        return None
    v = src[2]
    return [v[0] * v[1], v[2] * v[3] + p.i(0) * v[0] * v[3], 1, 1]


# The ops whose result is a product of their sources' sizes (rows x ids, M x N): a node that names a smaller ne
# would let the op compute the bigger result before the store refuses it.
@_shape("GET_ROWS")
def _get_rows_ne(ne, src, p):
    return [src[0][0], src[1][0], src[1][1], src[1][2]] if len(src) >= 2 else None


@_shape("MUL_MAT")
def _mul_mat_ne(ne, src, p):
    return [src[0][1], src[1][1], src[1][2], src[1][3]] if len(src) >= 2 else None


@_shape("OUT_PROD")
def _out_prod_ne(ne, src, p):
    return [src[0][0], src[1][0], src[1][2], src[1][3]] if len(src) >= 2 else None


@_shape("MUL_MAT_ID")
def _mul_mat_id_ne(ne, src, p):
    return [src[0][1], src[2][0], src[1][2], 1] if len(src) >= 3 else None


@_shape("FLASH_ATTN_EXT")
def _flash_attn_ext_ne(ne, src, p):
    return [src[2][0], src[0][2], src[0][1], src[0][3]] if len(src) >= 3 else None


def implied_ne(op: str, ne: list[int], srcs: list[list[int]], p: Params) -> list[int] | None:
    """The ne that `op`'s op_params and sources imply for its result, where they decide it (SHAPES); the
    node's own ne for every other op. None: the params are impossible (a zero stride, an empty range)."""
    f = SHAPES.get(op)
    return list(ne) if f is None else f(ne, srcs, p)


# -- element-wise and reductions --------------------------------------------------------------------------
for _name, _fn in (("ADD", ops.add), ("SUB", ops.sub), ("MUL", ops.mul), ("DIV", ops.div), ("ADD1", ops.add1),
                   ("SILU_BACK", ops.silu_back), ("COUNT_EQUAL", ops.count_equal),
                   ("OUT_PROD", ops.out_prod)):
    OPS[_name] = (lambda f: lambda node, s, p: f(s[0], s[1]))(_fn)
for _name, _fn in (("SQR", ops.sqr), ("SQRT", ops.sqrt), ("LOG", ops.log), ("SIN", ops.sin), ("COS", ops.cos),
                   ("SUM", ops.sum), ("SUM_ROWS", ops.sum_rows), ("MEAN", ops.mean), ("CUMSUM", ops.cumsum),
                   ("DUP", ops.dup), ("DIAG", ops.diag)):
    OPS[_name] = (lambda f: lambda node, s, p: f(s[0]))(_fn)


@_reg("ARGMAX")
def _argmax(node, s, p):
    return ops.argmax(_rank(s[0], 2))


@_reg("ADD_ID")
def _add_id(node, s, p):
    return ops.add_id(_rank(s[0], 3), _rank(s[1], 2), _rank(s[2], 2))


@_reg("ACC")
def _acc(node, s, p):
    return ops.acc(s[0], s[1], p.i(0), p.i(1), p.i(2), p.i(3))


@_reg("SET")
def _set(node, s, p):
    return ops.set(s[0], s[1], p.i(0), p.i(1), p.i(2), p.i(3))


@_reg("REPEAT")
def _repeat(node, s, p):
    return ops.repeat(s[0], np.empty(node.shape, np.float32))


@_reg("REPEAT_BACK")
def _repeat_back(node, s, p):
    return ops.repeat_back(s[0], np.empty(node.shape, np.float32))


@_reg("CONCAT")
def _concat(node, s, p):
    return ops.concat(s[0], s[1], p.i(0))


# ops whose op_params are their scalar arguments, in order: (op, refimpl op, how to read each word)
for _name, _fn, _kinds in (("SCALE", ops.scale, "ff"), ("CLAMP", ops.clamp, "ff"), ("LEAKY_RELU", ops.leaky_relu, "f"),
                           ("FILL", ops.fill, "f"), ("TRI", ops.tri, "i"), ("NORM", ops.norm, "f"),
                           ("RMS_NORM", ops.rms_norm, "f"), ("L2_NORM", ops.l2_norm, "f"),
                           ("GROUP_NORM", ops.group_norm, "if"), ("DIAG_MASK_INF", ops.diag_mask_inf, "i"),
                           ("DIAG_MASK_ZERO", ops.diag_mask_zero, "i")):
    OPS[_name] = (lambda f, kinds: lambda node, s, p: f(s[0], *(p.f(k) if c == "f" else p.i(k)
                                                                  for k, c in enumerate(kinds))))(_fn, _kinds)


@_reg("ARANGE")
def _arange(node, s, p):
    return ops.arange(p.f(0), p.f(1), p.f(2))


# -- normalization ------------------------------------------------------------------------------------------
@_reg("RMS_NORM_BACK")
def _rms_norm_back(node, s, p):
    return ops.rms_norm_back(s[0], s[1], p.f(0))


# -- products -----------------------------------------------------------------------------------------------
@_reg("MUL_MAT")
def _mul_mat(node, s, p):
    # llama.cpp's builds (and test-backend-ops') compile llamafile's sgemm: numerics="ggml" (that build's
    # profile) takes tinyBLAS's order where they would, in the dispatch
    return ops.mul_mat(s[0], s[1])


@_reg("MUL_MAT_ID")
def _mul_mat_id(node, s, p):
    return ops.mul_mat_id(_rank(s[0], 3), _rank(s[1], 3), _rank(s[2], 2))


@_reg("SOLVE_TRI")
def _solve_tri(node, s, p):
    return ops.solve_tri(s[0], s[1])


# -- data movement ------------------------------------------------------------------------------------------
@_reg("CPY")
def _cpy(node, s, p):
    if s[1] is None:
        # ggml_cast makes src1 the node itself, which ggml_backend_graph_copy drops (it sets a copy's sources
        # before the copy exists): the destination is the node, whose type the store converts to
        return ops.cont(s[0], node.shape)
    return ops.cpy(s[0], s[1])


@_reg("CONT")
def _cont(node, s, p):
    return ops.cont(s[0], node.shape)


@_reg("GET_ROWS")
def _get_rows(node, s, p):
    return ops.get_rows(s[0], _rank(s[1], 3))


@_reg("GET_ROWS_BACK")
def _get_rows_back(node, s, p):
    # ggml_get_rows_back(a, b, c): c only gives the result's shape and is not a source
    return ops.get_rows_back(_rank(s[0], 2), _rank(s[1], 1), _rank(np.empty(node.shape, np.float32), 2).shape)


@_reg("SET_ROWS")
def _set_rows(node, s, p):
    # ggml 0.25.3 wires set_rows(a, b, c) as src0 = b (the rows), src1 = c (indices), src2 = a (destination).
    # The node is normally src2's own bytes (a KV cache): then the rows are written there, as ggml does, and
    # nothing else of the cache is copied (STORED: the server has nothing left to write)
    if getattr(node, "inplace", False) and isinstance(s[2], np.ndarray) and s[2].flags.writeable:
        ops.set_rows(s[2], s[0], _rank(s[1], 3), out=s[2])
        return STORED
    return ops.set_rows(s[2], s[0], _rank(s[1], 3))


@_reg("PAD")
def _pad(node, s, p):
    return ops.pad_ext(s[0], *(p.i(k) for k in range(8)), circular=bool(p.i(8)))


@_reg("PAD_REFLECT_1D")
def _pad_reflect_1d(node, s, p):
    return ops.pad_reflect_1d(s[0], p.i(0), p.i(1))


@_reg("ROLL")
def _roll(node, s, p):
    return ops.roll(s[0], p.i(0), p.i(1), p.i(2), p.i(3))


@_reg("WIN_PART")
def _win_part(node, s, p):
    return ops.win_part(s[0], p.i(2))


@_reg("WIN_UNPART")
def _win_unpart(node, s, p):
    ne = node.ne
    return ops.win_unpart(s[0], ne[1], ne[2], p.i(0))


@_reg("GET_REL_POS")
def _get_rel_pos(node, s, p):
    ne = node.ne
    return ops.get_rel_pos(s[0], ne[1], ne[2])


@_reg("ADD_REL_POS")
def _add_rel_pos(node, s, p):
    return ops.add_rel_pos(s[0], s[1], s[2])


# -- attention, softmax, rope ---------------------------------------------------------------------------------
@_reg("SOFT_MAX")
def _soft_max(node, s, p):
    return ops.soft_max_ext(s[0], s[1], p.f(0), p.f(1), None if s[2] is None else _rank(s[2], 1))


@_reg("SOFT_MAX_BACK")
def _soft_max_back(node, s, p):
    return ops.soft_max_ext_back(s[0], s[1], p.f(0), p.f(1))




def _rope_args(p):
    return dict(n_dims=p.i(1), mode=p.i(2), n_ctx_orig=p.i(4), freq_base=p.f(5), freq_scale=p.f(6),
                ext_factor=p.f(7), attn_factor=p.f(8), beta_fast=p.f(9), beta_slow=p.f(10))


def _rope(node, s, p, back: bool):
    kw = _rope_args(p)
    x, pos, ff = s[0], _rank(s[1], 1), None if s[2] is None else _rank(s[2], 1)
    n_offs = p.i(15)
    if kw["mode"] & ROPE_TYPE_MROPE:
        sections = [p.i(11 + k) for k in range(4)]
        multi = ops.rope_multi_back if back else ops.rope_multi

        def f(x, pos, ff, **kw):
            return multi(x, pos, ff, sections=sections, **kw)
    else:
        f = ops.rope_ext_back if back else ops.rope_ext
    if not n_offs:
        return f(x, pos, ff, **kw)
    if kw["mode"] == ROPE_TYPE_VISION:
        raise Unsupported(f"rope n_offs {n_offs} with the vision mode (ggml asserts it never is)")
    # ggml_rope_set_offset (new in 0.25.3): the rotated dims start at n_offs; the dims before stay
    out = np.array(x, copy=True)
    out[..., n_offs:] = f(np.ascontiguousarray(x[..., n_offs:]), pos, ff, **kw)
    return out


OPS["ROPE"] = lambda node, s, p: _rope(node, s, p, back=False)
OPS["ROPE_BACK"] = lambda node, s, p: _rope(node, s, p, back=True)


@_reg("FLASH_ATTN_EXT")
def _flash_attn_ext(node, s, p):
    sinks = None if s[4] is None else _rank(s[4], 1)
    return ops.flash_attn_ext(s[0], s[1], s[2], s[3], p.f(0), p.f(1), p.f(2), sinks)


# -- convolution, pooling, resampling ------------------------------------------------------------------------
@_reg("IM2COL")
def _im2col(node, s, p):
    return ops.im2col(s[0], s[1], p.i(0), p.i(1), p.i(2), p.i(3), p.i(4), p.i(5), bool(p.i(6)), node.type)


@_reg("IM2COL_BACK")
def _im2col_back(node, s, p):
    return ops.im2col_back(s[0], s[1], node.ne, p.i(0), p.i(1), p.i(2), p.i(3), p.i(4), p.i(5), bool(p.i(6)))


@_reg("IM2COL_3D")
def _im2col_3d(node, s, p):
    return ops.im2col_3d(s[0], s[1], p.i(9), *(p.i(k) for k in range(9)), dst_type=node.type)


@_reg("COL2IM_1D")
def _col2im_1d(node, s, p):
    return ops.col2im_1d(s[0], p.i(0), p.i(1), p.i(2))


@_reg("CONV_TRANSPOSE_1D")
def _conv_transpose_1d(node, s, p):
    return ops.conv_transpose_1d(s[0], s[1], p.i(0), p.i(1), p.i(2))


@_reg("CONV_2D")
def _conv_2d(node, s, p):
    return ops.conv_2d_direct(s[0], s[1], *(p.i(k) for k in range(6)))


@_reg("CONV_3D")
def _conv_3d(node, s, p):
    return ops.conv_3d_direct(s[0], s[1], *(p.i(k) for k in range(12)))


@_reg("CONV_2D_DW")
def _conv_2d_dw(node, s, p):
    return ops.conv_2d_dw_direct(s[0], s[1], *(p.i(k) for k in range(6)))


@_reg("CONV_TRANSPOSE_2D")
def _conv_transpose_2d(node, s, p):
    return ops.conv_transpose_2d_p0(s[0], s[1], p.i(0))


@_reg("POOL_1D")
def _pool_1d(node, s, p):
    return ops.pool_1d(s[0], p.i(0), p.i(1), p.i(2), p.i(3))


@_reg("POOL_2D")
def _pool_2d(node, s, p):
    return ops.pool_2d(s[0], *(p.i(k) for k in range(7)))


@_reg("POOL_2D_BACK")
def _pool_2d_back(node, s, p):
    return ops.pool_2d_back(s[0], s[1], *(p.i(k) for k in range(7)))


@_reg("UPSCALE")
def _upscale(node, s, p):
    ne = node.ne
    return ops.interpolate(s[0], ne[0], ne[1], ne[2], ne[3], p.i(0))


@_reg("TIMESTEP_EMBEDDING")
def _timestep_embedding(node, s, p):
    return ops.timestep_embedding(_rank(s[0], 1), p.i(0), p.i(1))


# -- sorting --------------------------------------------------------------------------------------------------
@_reg("ARGSORT")
def _argsort(node, s, p):
    return ops.argsort(s[0], p.i(0))


@_reg("TOP_K")
def _top_k(node, s, p):
    return ops.top_k(s[0], node.ne[0])


# -- recurrent and state-space ---------------------------------------------------------------------------------
@_reg("SSM_CONV")
def _ssm_conv(node, s, p):
    return ops.ssm_conv(_rank(s[0], 3), _rank(s[1], 2))


@_reg("SSM_SCAN")
def _ssm_scan(node, s, p):
    return ops.ssm_scan(*s[:7], K=p.i(0))


@_reg("RWKV_WKV6")
def _rwkv_wkv6(node, s, p):
    return ops.rwkv_wkv6(*s[:6])


@_reg("GATED_LINEAR_ATTN")
def _gated_linear_attn(node, s, p):
    return ops.gated_linear_attn(*s[:5], scale=p.f(0))


@_reg("RWKV_WKV7")
def _rwkv_wkv7(node, s, p):
    return ops.rwkv_wkv7(*s[:7])


@_reg("GATED_DELTA_NET")
def _gated_delta_net(node, s, p):
    return ops.gated_delta_net(*s[:6], K=p.i(0))


@_reg("DSV4_HC_COMB")
def _dsv4_hc_comb(node, s, p):
    return ops.dsv4_hc_comb(s[0], s[1], s[2], p.f(0), p.i(1))


@_reg("DSV4_HC_PRE")
def _dsv4_hc_pre(node, s, p):                       # op_params: [scale, gated]
    if p.i(1):
        return ops.dsv4_hc_pre_gated(s[0], s[1], p.f(0))
    return ops.dsv4_hc_pre(s[0], s[1])


@_reg("DSV4_HC_POST")
def _dsv4_hc_post(node, s, p):
    return ops.dsv4_hc_post(s[0], s[1], s[2], s[3])


@_reg("LIGHTNING_INDEXER")
def _lightning_indexer(node, s, p):
    return ops.lightning_indexer(*s[:4])


@_reg("OPT_STEP_ADAMW")
def _opt_step_adamw(node, s, p):
    # ggml updates the moments in place too: m and v are written back into their own bytes
    w, m, v = ops.opt_step_adamw(*s[:5])
    s[2][...] = m.reshape(s[2].shape)
    s[3][...] = v.reshape(s[3].shape)
    return w


@_reg("OPT_STEP_SGD")
def _opt_step_sgd(node, s, p):
    return ops.opt_step_sgd(*s[:3])


@_reg("CROSS_ENTROPY_LOSS")
def _cross_entropy_loss(node, s, p):
    return ops.cross_entropy_loss(s[0], s[1])


@_reg("CROSS_ENTROPY_LOSS_BACK")
def _cross_entropy_loss_back(node, s, p):
    return ops.cross_entropy_loss_back(s[0], s[1], s[2])


# -- UNARY and GLU sub-ops ----------------------------------------------------------------------------------
for _name in UNARY_NAMES:
    if _name not in UNARY_NOT_COMPUTED:
        UNARY[_name] = getattr(ops, _name.lower())
for _name in GLU_NAMES:
    if _name not in GLU_NOT_COMPUTED:
        GLU[_name] = getattr(ops, _name.lower())


def _sub(op: str, names: tuple, table: dict, not_computed: dict, p: Params):
    """The refimpl op of a node's sub-op (op_params[0]), or Unsupported saying why not."""
    k = p.i(0)
    if not 0 <= k < len(names):
        raise Unsupported(f"unknown {op} sub-op {k}")
    name = names[k]
    if name not in table:
        raise Unsupported(f"{op}:{name}: {not_computed[name]}")
    return name, table[name]


@_reg("UNARY")
def _unary(node, s, p):
    name, f = _sub("UNARY", UNARY_NAMES, UNARY, UNARY_NOT_COMPUTED, p)
    if name == "XIELU":                  # op_params: [op, beta + softplus(alpha_n), softplus(alpha_p), beta, eps]
        return f(s[0], p.f(1), p.f(2), p.f(3), p.f(4), stored=True)
    return f(s[0])


@_reg("GLU")
def _glu(node, s, p):
    name, f = _sub("GLU", GLU_NAMES, GLU, GLU_NOT_COMPUTED, p)
    swapped = bool(p.i(1))
    if name == "SWIGLU_OAI":
        return f(s[0], s[1], p.f(2), p.f(3), swapped=swapped)
    if name == "SWIGLU_CLAMP":           # op_params: [op, swapped, -, limit]
        return f(s[0], s[1], p.f(3), swapped=swapped)
    return f(s[0], s[1], swapped=swapped)


def sub_op(op_name: str, p: Params) -> str:
    """The node's full name for logs and counts: "UNARY:SILU", "GLU:SWIGLU", else the op's."""
    names = {"UNARY": UNARY_NAMES, "GLU": GLU_NAMES}.get(op_name)
    if names is None:
        return op_name
    k = p.i(0)
    return f"{op_name}:{names[k] if 0 <= k < len(names) else k}"


assert set(OPS) | NO_COMPUTE | set(NOT_COMPUTED) == set(OP_NAMES), \
    set(OP_NAMES) - set(OPS) - NO_COMPUTE - set(NOT_COMPUTED)
