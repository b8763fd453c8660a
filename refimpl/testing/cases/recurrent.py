"""OpCases for the recurrent ops (see refimpl/testing/cases/__init__.py)."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from . import OpCase, cases, named, ne_str
from ._draw import values


def _g():
    from .. import ggml
    return ggml.lib()


def _view(draw, x: np.ndarray, packed: int) -> np.ndarray:
    """x, or the same values as a non-contiguous view that keeps the innermost `packed` NumPy axes (ggml dims
    0 .. packed-1) packed, as the recurrent kernels assert: the outer axes either permuted in memory or
    stepping over a larger buffer (an ggml_view with larger strides)."""
    outer = x.ndim - packed
    kind = draw(st.sampled_from(["contiguous", "permuted", "step"] if outer >= 1 else ["contiguous"]))
    if kind == "permuted" and outer >= 2:
        perm = list(draw(st.permutations(range(outer)))) + list(range(outer, x.ndim))
        return np.ascontiguousarray(np.transpose(x, perm)).transpose(np.argsort(perm))
    if kind == "step":
        big = np.zeros((x.shape[0] * 2,) + x.shape[1:], x.dtype)
        big[::2] = x
        return big[::2]
    return x


# -- ssm_conv ----------------------------------------------------------------------------------------------

def _ssm_conv_case(sx, c):
    return OpCase("ssm_conv", (sx, c), build=lambda ctx, a, b: _g().ggml_ssm_conv(ctx, a, b),
                  name=f"SSM_CONV(type=f32,ne_a={ne_str(sx)},ne_b={ne_str(c)})")


@cases("ssm_conv")
@st.composite
def _ssm_conv(draw):
    d_conv = draw(st.integers(1, 10))
    d_inner = draw(st.integers(1, 48))
    n_t = draw(st.integers(1, 12))
    n_s = draw(st.integers(1, 3))
    # sx stays 3-D even for one sequence: ggml asserts sx.nb1 == row size, so only dim 2 may be strided
    sx = _view(draw, values(draw, (n_s, d_inner, d_conv - 1 + n_t)), packed=2)
    c = values(draw, (d_inner, d_conv))
    return _ssm_conv_case(sx, c)


@named("ssm_conv")
def _ssm_conv_named():
    """test-backend-ops' cases: d_conv 3, 4, 9 (4 gives identical bits, 3 and 9 exercise GCC's FMA tail);
    one token, d_conv + 1 tokens, 4 sequences of one token, 64 tokens; d_inner 1024 and 1536 (not 2048)."""
    rng = np.random.default_rng(11)
    u = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)
    out = []
    for d_conv in (3, 4, 9):
        for d_inner in (1024, 1536):
            c = u(d_inner, d_conv)
            for ne_a in ([d_conv, d_inner, 1], [2 * d_conv, d_inner, 1], [d_conv, d_inner, 4],
                         [d_conv - 1 + 64, d_inner, 1], [d_conv - 1 + 64, d_inner, 4]):
                out.append(_ssm_conv_case(u(*ne_a[::-1]), c))
    return out


# -- ssm_scan ----------------------------------------------------------------------------------------------

def _ssm_scan_case(s, x, dt, A, B, C, ids, extra=""):
    n_seqs, n_tok, n_head, head_dim = x.shape
    name = (f"SSM_SCAN(type=f32,d_state={s.shape[-1]},head_dim={head_dim},n_head={n_head},n_group={B.shape[2]},"
            f"n_seq_tokens={n_tok},n_seqs={n_seqs},n_rs={s.shape[0]},mamba={1 if A.shape[-1] > 1 else 2}{extra})")
    return OpCase("ssm_scan", (s, x, dt, A, B, C, ids),
                  build=lambda ctx, *t: _g().ggml_ssm_scan(ctx, *t), name=name)


@cases("ssm_scan")
@st.composite
def _ssm_scan(draw):
    d_state = draw(st.one_of(st.integers(1, 40), st.sampled_from([64, 128])))   # >= 32: Mamba-2 SIMD path
    head_dim = draw(st.integers(1, 8))
    n_group = draw(st.integers(1, 3))
    n_head = n_group * draw(st.integers(1, 3))
    n_tok, n_seqs = draw(st.integers(1, 6)), draw(st.integers(1, 3))
    n_rs = n_seqs + draw(st.integers(0, 2))
    mamba1 = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    ids = np.random.default_rng(seed).permutation(n_rs)[:n_seqs].astype(np.int32)
    if draw(st.booleans()):                                    # sequences may share an initial state
        ids = np.random.default_rng(seed).integers(0, n_rs, n_seqs).astype(np.int32)
    dt_range = draw(st.sampled_from([1.0, 25.0]))             # 25: softplus' x > 20 and underflow branches
    s = values(draw, (n_rs, n_head, head_dim, d_state))
    x = _view(draw, values(draw, (n_seqs, n_tok, n_head, head_dim)), packed=2)
    dt = values(draw, (n_seqs, n_tok, n_head), -dt_range, dt_range)
    A = values(draw, (n_head, d_state if mamba1 else 1), *draw(st.sampled_from([(-1.0, 1.0), (-4.0, 0.0)])))
    B = _view(draw, values(draw, (n_seqs, n_tok, n_group, d_state)), packed=2)
    C = _view(draw, values(draw, (n_seqs, n_tok, n_group, d_state)), packed=2)
    return _ssm_scan_case(s, x, dt, A, B, C, ids)


@named("ssm_scan")
def _ssm_scan_named():
    """test-backend-ops' cases (Mamba-1, Mamba-2, Falcon-H1, x/B/C sharing one buffer), fewer sequences."""
    rng = np.random.default_rng(12)
    u = lambda *sh: rng.uniform(-1, 1, sh).astype(np.float32)
    out = []
    for d_state, head_dim, n_head, n_group, n_tok, n_seqs in ((16, 1, 1024, 1, 32, 4), (128, 64, 16, 2, 32, 4),
                                                              (256, 64, 8, 2, 32, 4), (128, 64, 48, 1, 1, 1)):
        mamba1 = head_dim == 1
        ids = rng.permutation(n_seqs).astype(np.int32)
        out.append(_ssm_scan_case(u(n_seqs, n_head, head_dim, d_state), u(n_seqs, n_tok, n_head, head_dim),
                                  u(n_seqs, n_tok, n_head), u(n_head, d_state if mamba1 else 1),
                                  u(n_seqs, n_tok, n_group, d_state), u(n_seqs, n_tok, n_group, d_state), ids))
    # x/B/C overlap: three windows of one buffer [d_state, n_head, n_tok, 2*n_seqs] (head_dim == d_state)
    d_state, n_head, n_tok, n_seqs = 128, 4, 16, 2
    xbc = u(2 * n_seqs, n_tok, n_head, d_state)
    x, B, C = xbc[1:1 + n_seqs], xbc[0:n_seqs], xbc[2:2 + n_seqs]
    out.append(_ssm_scan_case(u(n_seqs, n_head, d_state, d_state), x, u(n_seqs, n_tok, n_head), u(n_head, 1),
                              B, C, rng.permutation(n_seqs).astype(np.int32), extra=",xbc_overlap=1"))
    return out


# -- rwkv_wkv6, gated_linear_attn, rwkv_wkv7: tokens ne [S, H, T], state ne [S*S*H, n_seqs] ------------------

def _rwkv_dims(draw, sizes):
    S = draw(st.sampled_from(sizes))
    return S, draw(st.integers(1, 4)), draw(st.integers(1, 6)), draw(st.integers(1, 3))


def _decay(draw, shp):
    """A decay in (0, 1) as llama.cpp feeds it (exp(-exp(w))), or test-backend-ops' plain uniform [-1, 1]."""
    if draw(st.booleans()):
        return values(draw, shp)
    return np.exp(-np.exp(values(draw, shp, -3.0, 1.0))).astype(np.float32)


def _rwkv_name(op, S, H, n_seq_tokens, n_seqs):
    return f"{op}(type=f32,head_count={H},head_size={S},n_seq_tokens={n_seq_tokens},n_seqs={n_seqs})"


def _wkv6_case(k, v, r, tf, td, s, tps, n_seqs):
    return OpCase("rwkv_wkv6", (k, v, r, tf, td, s), build=lambda ctx, *t: _g().ggml_rwkv_wkv6(ctx, *t),
                  name=_rwkv_name("RWKV_WKV6", k.shape[2], k.shape[1], tps, n_seqs))


@cases("rwkv_wkv6")
@st.composite
def _rwkv_wkv6(draw):
    S, H, tps, n_seqs = _rwkv_dims(draw, list(range(1, 17)) + [32, 64])
    T = tps * n_seqs
    k, v, r = (values(draw, (T, H, S)) for _ in range(3))
    return _wkv6_case(k, v, r, values(draw, (H, S)), _decay(draw, (T, H, S)),
                      values(draw, (n_seqs, S * S * H)), tps, n_seqs)


def _backend_ops_rwkv(seed):
    """test-backend-ops' shapes for wkv6/wkv7/gla: 32 heads of 64, (1, 1), (32, 1), (32, 4), (128, 4) tokens per
    sequence and sequences; the last with 8 heads here to keep the NumPy recurrence quick."""
    rng = np.random.default_rng(seed)
    for H, tps, n_seqs in ((32, 1, 1), (32, 32, 1), (32, 32, 4), (8, 128, 4)):
        yield rng, 64, H, tps, n_seqs, tps * n_seqs


@named("rwkv_wkv6")
def _rwkv_wkv6_named():
    out = []
    for rng, S, H, tps, n_seqs, T in _backend_ops_rwkv(13):
        u = lambda *sh: rng.uniform(-1, 1, sh).astype(np.float32)
        out.append(_wkv6_case(u(T, H, S), u(T, H, S), u(T, H, S), u(H, S), u(T, H, S), u(n_seqs, S * S * H),
                              tps, n_seqs))
    return out


def _gla_case(k, v, q, g, s, scale, tps, n_seqs):
    name = _rwkv_name("GLA", k.shape[2], k.shape[1], tps, n_seqs)[:-1] + f",scale={scale:g})"
    return OpCase("gated_linear_attn", (k, v, q, g, s, scale),
                  build=lambda ctx, *t: _g().ggml_gated_linear_attn(ctx, *t, scale), name=name)


@cases("gated_linear_attn")
@st.composite
def _gated_linear_attn(draw):
    S, H, tps, n_seqs = _rwkv_dims(draw, list(range(1, 17)) + [32, 64])
    T = tps * n_seqs
    k, v, q = (values(draw, (T, H, S)) for _ in range(3))
    scale = draw(st.sampled_from([1.0, S ** -0.5, 0.3]))
    return _gla_case(k, v, q, _decay(draw, (T, H, S)), values(draw, (n_seqs, S * S * H)), scale, tps, n_seqs)


@named("gated_linear_attn")
def _gated_linear_attn_named():
    out = []
    for rng, S, H, tps, n_seqs, T in _backend_ops_rwkv(14):
        u = lambda *sh: rng.uniform(-1, 1, sh).astype(np.float32)
        out.append(_gla_case(u(T, H, S), u(T, H, S), u(T, H, S), u(T, H, S), u(n_seqs, S * S * H), S ** -0.5,
                             tps, n_seqs))
    return out


def _l2rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (test-backend-ops l2-normalises wkv7's a and b, else long runs blow up)."""
    n = np.sqrt(np.sum(x.astype(np.float64) ** 2, axis=-1, keepdims=True))
    return (x / np.maximum(n, 1e-7)).astype(np.float32)


def _wkv7_case(r, w, k, v, a, b, s, tps, n_seqs):
    return OpCase("rwkv_wkv7", (r, w, k, v, a, b, s), build=lambda ctx, *t: _g().ggml_rwkv_wkv7(ctx, *t),
                  name=_rwkv_name("RWKV_WKV7", k.shape[2], k.shape[1], tps, n_seqs))


@cases("rwkv_wkv7")
@st.composite
def _rwkv_wkv7(draw):
    # head sizes: multiples of 32 only -- ggml's AVX2 kernel has no remainder loop (see rwkv_wkv7's docstring)
    S, H, tps, n_seqs = _rwkv_dims(draw, [32, 64, 96, 128])
    H = min(H, 2)
    T = tps * n_seqs
    r, k, v = (values(draw, (T, H, S)) for _ in range(3))
    kk = _l2rows(values(draw, (T, H, S)))
    if draw(st.booleans()):                                    # llama.cpp's form: a = -kk, b = kk * iclr
        a, b = -kk, (kk * values(draw, (T, H, 1), 0.0, 1.0)).astype(np.float32)
    else:                                                      # test-backend-ops': independent unit rows
        a, b = kk, _l2rows(values(draw, (T, H, S)))
    return _wkv7_case(r, _decay(draw, (T, H, S)), k, v, a, b, values(draw, (n_seqs, S * S * H)), tps, n_seqs)


@named("rwkv_wkv7")
def _rwkv_wkv7_named():
    out = []
    for rng, S, H, tps, n_seqs, T in _backend_ops_rwkv(15):
        u = lambda *sh: rng.uniform(-1, 1, sh).astype(np.float32)
        out.append(_wkv7_case(u(T, H, S), u(T, H, S), u(T, H, S), u(T, H, S), _l2rows(u(T, H, S)),
                              _l2rows(u(T, H, S)), u(n_seqs, S * S * H), tps, n_seqs))
    return out


# -- gated_delta_net ---------------------------------------------------------------------------------------

def _gdn_case(q, k, v, g, beta, s, K, permuted=False):
    n_seqs, n_tok, H, S = v.shape
    name = (f"GATED_DELTA_NET(type=f32,head_count={q.shape[2]},head_size={S},n_seq_tokens={n_tok},"
            f"n_seqs={n_seqs},v_repeat={H // q.shape[2]},permuted={int(permuted)},kda={int(g.shape[-1] > 1)},K={K}"
            f"{f',ne_q={ne_str(q)},ne_k={ne_str(k)}' if q.shape != k.shape or q.shape[0] != n_seqs else ''})")
    post = None
    if n_tok < K:
        # ggml writes snapshot slots 0 .. n_tok-1 only; the others keep whatever the output memory held
        # ("caller-owned", see gated_delta_net's docstring), and refimpl returns zeros there
        first = n_tok * n_seqs + n_tok * S * n_seqs
        def post(out, first=first):
            out = np.array(out).reshape(-1, S * H)
            out[first:] = 0
            return out
    return OpCase("gated_delta_net", (q, k, v, g, beta, s, K),
                  build=lambda ctx, *t: _g().ggml_gated_delta_net(ctx, *t, K), name=name, post=post)


def _gdn_inputs(u, n_seqs, n_tok, H_k, rep, S, kda, nq=None, nk=None, l2=True):
    """Arrays shaped like test-backend-ops' gated_delta_net inputs (g in [-20, 0), beta in [0, 1],
    v in [-0.3, 5], q and k l2-normalised as llama.cpp and test-backend-ops do)."""
    H = H_k * rep
    q = u((nq or n_seqs, n_tok, H_k, S))
    k = u((nk or n_seqs, n_tok, H_k, S))
    if l2:
        q, k = _l2rows(q), _l2rows(k)
    v = u((n_seqs, n_tok, H, S), -0.3, 5.0)
    g = u((n_seqs, n_tok, H, S if kda else 1), -20.0, -1e-4)
    beta = u((n_seqs, n_tok, H, 1), 0.0, 1.0)
    return q, k, v, g, beta, u((n_seqs, H, S, S))


@cases("gated_delta_net")
@st.composite
def _gated_delta_net(draw):
    S = draw(st.one_of(st.integers(1, 20), st.sampled_from([32, 64, 128])))
    H_k, rep = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    n_tok, n_seqs = draw(st.integers(1, 6)), draw(st.integers(1, 3))
    nq = draw(st.sampled_from([d for d in range(1, n_seqs + 1) if n_seqs % d == 0]))
    nk = draw(st.sampled_from([d for d in range(1, n_seqs + 1) if n_seqs % d == 0]))
    kda, K = draw(st.booleans()), draw(st.integers(1, 4))
    g_range = draw(st.sampled_from([(-20.0, -1e-4), (-1.0, 0.0)]))
    u = lambda shp, lo=-1.0, hi=1.0: values(draw, shp, lo, hi)
    q, k, v, g, beta, s = _gdn_inputs(u, n_seqs, n_tok, H_k, rep, S, kda, nq, nk, l2=draw(st.booleans()))
    g = values(draw, g.shape, *g_range)
    q, k, v = (_view(draw, x, packed=1) for x in (q, k, v))     # ggml asserts only rows contiguous
    return _gdn_case(q, k, v, g, beta, s, K)


@named("gated_delta_net")
def _gated_delta_net_named():
    """test-backend-ops' cases (head_count, head_size, n_seq_tokens, n_seqs, v_repeat, permuted, kda, K);
    the 127..256-token ones trimmed to 4 heads of 64 as there."""
    rng = np.random.default_rng(16)
    u = lambda shp, lo=-1.0, hi=1.0: rng.uniform(lo, hi, shp).astype(np.float32)
    out = []
    for H, S, n_tok, n_seqs, rep, perm, kda, K in (
            (32, 128, 1, 1, 1, False, False, 1), (32, 16, 1, 1, 1, False, False, 1),
            (32, 16, 1, 1, 1, True, True, 1), (32, 16, 1, 1, 1, False, True, 1), (16, 64, 1, 2, 1, False, False, 1),
            (4, 64, 4, 1, 1, False, False, 1), (4, 64, 4, 2, 1, False, False, 1), (8, 32, 4, 2, 2, False, False, 1),
            (4, 64, 4, 2, 1, True, False, 1), (4, 64, 4, 1, 1, True, False, 1), (4, 64, 1, 2, 1, False, True, 1),
            (4, 16, 1, 2, 1, False, True, 1), (4, 32, 4, 1, 1, False, True, 1), (8, 32, 4, 2, 2, False, True, 1),
            (4, 16, 4, 2, 1, True, True, 1), (4, 64, 127, 1, 1, False, False, 1), (4, 64, 65, 1, 1, False, True, 1),
            (4, 64, 127, 2, 1, False, False, 1), (4, 16, 2, 1, 1, False, False, 2), (4, 32, 4, 1, 1, False, False, 4),
            (4, 64, 4, 2, 1, False, False, 4), (8, 128, 4, 1, 1, False, False, 4), (4, 64, 4, 2, 1, False, True, 4),
            (8, 32, 4, 2, 2, False, True, 4), (4, 32, 8, 1, 1, False, False, 3), (4, 64, 16, 2, 1, False, False, 4),
            (4, 32, 2, 2, 1, False, False, 4)):                    # the last: n_tokens < K
        q, k, v, g, beta, s = _gdn_inputs(u, n_seqs, n_tok, H, rep, S, kda)
        if perm:   # test-backend-ops' permuted: created as [S, n_tok, H, n_seqs], then permute(0, 2, 1, 3)
            q, k, v = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3) for x in (q, k, v))
        out.append(_gdn_case(q, k, v, g, beta, s, K, permuted=perm))
    return out
