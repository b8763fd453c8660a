"""Properties of the recurrent / state-space ops (no ggml needed).

The recurrences carry an f32 state token by token, so splitting the tokens (or the sequences) and passing
the state along must give identical bits; against the textbook formulas evaluated in f64 they agree to the
property tolerances of refimpl/tolerances.py.
"""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from refimpl import GGMLShapeError
from refimpl.ops import gated_delta_net, gated_linear_attn, rwkv_wkv4, rwkv_wkv6, rwkv_wkv7, ssm_conv, ssm_scan
from refimpl.testing import assert_bits_equal, nmse, tol
from refimpl.testing.golden import check_values


pytestmark = pytest.mark.property

def _u(rng, *shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, shape).astype(np.float32)


seeds = st.integers(0, 2**32 - 1)


# -- ssm_conv ---------------------------------------------------------------------------------------------

@given(seed=seeds, d_conv=st.integers(1, 6), d_inner=st.integers(1, 9), n_t=st.integers(2, 9),
       n_s=st.integers(1, 3), data=st.data())
def test_ssm_conv_in_chunks_equals_all_at_once(seed, d_conv, d_inner, n_t, n_s, data):
    """A chunk of tokens needs only the d_conv - 1 inputs before it (llama.cpp's conv state)."""
    rng = np.random.default_rng(seed)
    sx, c = _u(rng, n_s, d_inner, d_conv - 1 + n_t), _u(rng, d_inner, d_conv)
    cut = data.draw(st.integers(1, n_t - 1))
    first = ssm_conv(sx[:, :, :d_conv - 1 + cut], c)
    rest = ssm_conv(sx[:, :, cut:], c)
    assert_bits_equal(np.concatenate([first, rest], axis=1), ssm_conv(sx, c), "ssm_conv chunks")


@given(seed=seeds, d_conv=st.integers(1, 6), d_inner=st.integers(1, 9), n_t=st.integers(1, 9),
       n_s=st.integers(1, 3))
def test_ssm_conv_is_a_causal_depthwise_convolution(seed, d_conv, d_inner, n_t, n_s):
    rng = np.random.default_rng(seed)
    sx, c = _u(rng, n_s, d_inner, d_conv - 1 + n_t), _u(rng, d_inner, d_conv)
    want = np.empty((n_s, n_t, d_inner))
    for ch in range(d_inner):                 # np.convolve flips its kernel: correlate = convolve with c[::-1]
        for s in range(n_s):
            want[s, :, ch] = np.convolve(sx[s, ch].astype(np.float64), c[ch, ::-1].astype(np.float64), "valid")
    t = tol("ssm_conv", "f32", "property")
    check_values(ssm_conv(sx, c), want, t, "ssm_conv", bound=t.bound(sx, c))


def test_ssm_conv_cancelling_terms():
    """A drawn one-output row (seed 6008931, d_conv 3) whose three terms cancel: f32 roundings of the terms
    are large beside the output (NMSE 1.1e-10), yet within gamma_3 sum|x c| of the exact sum."""
    rng = np.random.default_rng(6008931)
    sx, c = _u(rng, 1, 1, 3), _u(rng, 1, 3)
    want = np.convolve(sx[0, 0].astype(np.float64), c[0, ::-1].astype(np.float64), "valid").reshape(1, 1, 1)
    got = ssm_conv(sx, c)
    t = tol("ssm_conv", "f32", "property")
    check_values(got, want, t, "ssm_conv", bound=t.bound(sx, c))
    assert nmse(got, want) > 1e-10, "no longer the cancelling case an NMSE of 1e-10 rejected"


def test_ssm_conv_shapes():
    sx, c = np.zeros((2, 5, 7), np.float32), np.zeros((5, 4), np.float32)
    assert ssm_conv(sx, c).shape == (2, 4, 5)                          # ne [d_inner, n_t, n_s]
    assert ssm_conv(sx[:, :, :3], c).shape == (2, 0, 5)                # n_t = 0 is allowed
    with pytest.raises(GGMLShapeError, match="d_inner"):
        ssm_conv(sx, np.zeros((4, 4), np.float32))
    with pytest.raises(GGMLShapeError, match="d_conv"):
        ssm_conv(sx[:, :, :2], c)
    with pytest.raises(GGMLShapeError, match="f32"):
        ssm_conv(sx.astype(np.float16), c)


# -- ssm_scan ---------------------------------------------------------------------------------------------

def _scan_inputs(rng, d_state, head_dim, n_head, n_group, n_tok, n_seqs, mamba1, n_rs=None):
    n_rs = n_rs or n_seqs
    return (_u(rng, n_rs, n_head, head_dim, d_state), _u(rng, n_seqs, n_tok, n_head, head_dim),
            _u(rng, n_seqs, n_tok, n_head, lo=-3, hi=3), _u(rng, n_head, d_state if mamba1 else 1, lo=-2, hi=0),
            _u(rng, n_seqs, n_tok, n_group, d_state), _u(rng, n_seqs, n_tok, n_group, d_state))


def _split_scan(out, x, n_seqs, n_head, head_dim, d_state):
    return (out[:x.size].reshape(x.shape), out[x.size:].reshape(n_seqs, n_head, head_dim, d_state))


scan_dims = st.tuples(st.integers(1, 40), st.integers(1, 4), st.integers(1, 2), st.integers(1, 2),
                      st.integers(2, 5), st.integers(1, 2), st.booleans())


@given(seed=seeds, dims=scan_dims, data=st.data())
def test_ssm_scan_token_by_token_equals_all_at_once(seed, dims, data):
    d_state, head_dim, n_group, rep, n_tok, n_seqs, mamba1 = dims
    n_head = n_group * rep
    rng = np.random.default_rng(seed)
    s, x, dt, A, B, C = _scan_inputs(rng, d_state, head_dim, n_head, n_group, n_tok, n_seqs, mamba1)
    ids = np.arange(n_seqs, dtype=np.int32)
    y, final = _split_scan(ssm_scan(s, x, dt, A, B, C, ids), x, n_seqs, n_head, head_dim, d_state)
    cut = data.draw(st.integers(1, n_tok - 1))
    part = lambda v, lo, hi: np.ascontiguousarray(v[:, lo:hi])
    x1 = part(x, 0, cut)
    y1, mid = _split_scan(ssm_scan(s, x1, part(dt, 0, cut), A, part(B, 0, cut), part(C, 0, cut), ids),
                          x1, n_seqs, n_head, head_dim, d_state)
    x2 = part(x, cut, n_tok)
    y2, end = _split_scan(ssm_scan(mid, x2, part(dt, cut, n_tok), A, part(B, cut, n_tok), part(C, cut, n_tok), ids),
                          x2, n_seqs, n_head, head_dim, d_state)
    assert_bits_equal(np.concatenate([y1, y2], axis=1), y, "ssm_scan y")
    assert_bits_equal(end, final, "ssm_scan state")


@given(seed=seeds, dims=scan_dims)
def test_ssm_scan_ids_pick_the_initial_states(seed, dims):
    """Slot ids[q] of s starts sequence q; the final states come out in sequence order."""
    d_state, head_dim, n_group, rep, n_tok, n_seqs, mamba1 = dims
    n_head = n_group * rep
    rng = np.random.default_rng(seed)
    s, x, dt, A, B, C = _scan_inputs(rng, d_state, head_dim, n_head, n_group, n_tok, n_seqs, mamba1, n_seqs + 2)
    ids = rng.permutation(n_seqs + 2)[:n_seqs].astype(np.int32)
    assert_bits_equal(ssm_scan(s, x, dt, A, B, C, ids),
                      ssm_scan(np.ascontiguousarray(s[ids]), x, dt, A, B, C, np.arange(n_seqs, dtype=np.int32)),
                      "ssm_scan ids")


@given(seed=seeds, dims=scan_dims)
def test_ssm_scan_groups_serve_heads_in_blocks(seed, dims):
    """n_group < n_head equals np.repeat of B and C to one group per head (not np.tile)."""
    d_state, head_dim, n_group, rep, n_tok, n_seqs, mamba1 = dims
    n_head = n_group * rep
    rng = np.random.default_rng(seed)
    s, x, dt, A, B, C = _scan_inputs(rng, d_state, head_dim, n_head, n_group, n_tok, n_seqs, mamba1)
    ids = np.arange(n_seqs, dtype=np.int32)
    assert_bits_equal(ssm_scan(s, x, dt, A, B, C, ids),
                      ssm_scan(s, x, dt, A, np.repeat(B, rep, axis=2), np.repeat(C, rep, axis=2), ids), "groups")


@given(seed=seeds, dims=scan_dims)
def test_ssm_scan_matches_the_f64_recurrence(seed, dims):
    d_state, head_dim, n_group, rep, n_tok, n_seqs, mamba1 = dims
    n_head = n_group * rep
    rng = np.random.default_rng(seed)
    s, x, dt, A, B, C = (v.astype(np.float64) for v in
                         _scan_inputs(rng, d_state, head_dim, n_head, n_group, n_tok, n_seqs, mamba1))
    out = ssm_scan(*(v.astype(np.float32) for v in (s, x, dt, A, B, C)), np.arange(n_seqs, dtype=np.int32))

    def scan_f64(s, x, B, C):
        ys, finals = [], []
        for q in range(n_seqs):
            h = s[q].copy()                                               # (n_head, head_dim, d_state)
            for t in range(n_tok):
                d = np.where(dt[q, t] > 20, dt[q, t], np.log1p(np.exp(dt[q, t])))[:, None, None]
                g = np.arange(n_head) // rep
                h = h * np.exp(d * A[:, None, :]) + B[q, t][g][:, None, :] * (x[q, t][:, :, None] * d)
                ys.append(np.sum(h * C[q, t][g][:, None, :], axis=-1))
            finals.append(h)
        return np.concatenate([np.stack(ys).reshape(n_seqs, n_tok, -1).reshape(-1), np.stack(finals).reshape(-1)])

    d = np.where(dt > 20, dt, np.log1p(np.exp(dt)))                      # (n_seqs, n_tok, n_head)
    ulps = np.maximum(1 + np.abs(A).max(-1) * (2 + 2 * d), np.where(dt > 20, 2.0, 3 + 2 / d))
    t = tol("ssm_scan", "f32", "property")
    bound = t.bound(scan_f64(*(np.abs(v) for v in (s, x, B, C))), n_tok, d_state, 5 + float(np.ceil(ulps.max())))
    check_values(out, scan_f64(s, x, B, C), t, "ssm_scan", bound=bound)


def test_ssm_scan_softplus_branches():
    """dt > 20 is used as is; very negative dt underflows 1 + expf(dt) to 1 in f32, so the step is 0."""
    s = np.ones((1, 1, 1, 1), np.float32)
    x, A, B, C = (np.ones(sh, np.float32) for sh in ((1, 1, 1, 1), (1, 1), (1, 1, 1, 1), (1, 1, 1, 1)))
    ids = np.zeros(1, np.int32)
    big = ssm_scan(s, x, np.full((1, 1, 1), 25.0, np.float32), -A, B, C, ids)
    assert big[0] == np.float32(np.exp(np.float32(-25.0)) + np.float32(25.0))
    tiny = ssm_scan(s, x, np.full((1, 1, 1), -30.0, np.float32), -A, B, C, ids)
    assert tiny[0] == 1.0 and tiny[1] == 1.0                     # state unchanged: softplus is exactly 0


def test_ssm_scan_shape_errors():
    rng = np.random.default_rng(0)
    s, x, dt, A, B, C = _scan_inputs(rng, 4, 2, 4, 2, 3, 2, False)
    ids = np.arange(2, dtype=np.int32)
    with pytest.raises(GGMLShapeError, match="ids out of range"):
        ssm_scan(s, x, dt, A, B, C, ids + 1)
    with pytest.raises(GGMLShapeError, match="n_group"):
        ssm_scan(s, x, dt, A, B[:, :, :1].repeat(3, axis=2), C[:, :, :1].repeat(3, axis=2), ids)
    with pytest.raises(GGMLShapeError, match="Mamba-1"):
        ssm_scan(s, x, dt, np.zeros((4, 3), np.float32), B, C, ids)
    with pytest.raises(GGMLShapeError, match="i32"):
        ssm_scan(s, x, dt, A, B, C, ids.astype(np.int64))


# -- rwkv_wkv6, gated_linear_attn, rwkv_wkv7 ----------------------------------------------------------------

def _wkv6_args(rng, S, H, T, n):
    return [_u(rng, T, H, S) for _ in range(3)] + [_u(rng, H, S), _u(rng, T, H, S, lo=0, hi=1), _u(rng, n, S * S * H)]


def _gla_args(rng, S, H, T, n):
    return [_u(rng, T, H, S) for _ in range(3)] + [_u(rng, T, H, S, lo=0, hi=1), _u(rng, n, S * S * H), S ** -0.5]


def _wkv7_args(rng, S, H, T, n):
    kk = _u(rng, T, H, S)
    kk /= np.linalg.norm(kk, axis=-1, keepdims=True)
    return ([_u(rng, T, H, S), _u(rng, T, H, S, lo=0, hi=1), _u(rng, T, H, S), _u(rng, T, H, S), -kk,
             kk * _u(rng, T, H, 1, lo=0, hi=1), _u(rng, n, S * S * H)])


RWKV = {  # op, argument builder, index of the state argument, token arguments
    "rwkv_wkv6": (rwkv_wkv6, _wkv6_args, 5, (0, 1, 2, 4)),
    "gated_linear_attn": (gated_linear_attn, _gla_args, 4, (0, 1, 2, 3)),
    "rwkv_wkv7": (rwkv_wkv7, _wkv7_args, 6, (0, 1, 2, 3, 4, 5)),
}
rwkv_dims = st.tuples(st.integers(1, 8), st.integers(1, 3), st.integers(2, 5), st.integers(1, 3))


@pytest.mark.parametrize("name", list(RWKV))
@given(seed=seeds, dims=rwkv_dims, data=st.data())
def test_rwkv_tokens_in_two_calls_equal_one_call(name, seed, dims, data):
    """Run the first `cut` tokens of every sequence, then the rest from the returned states."""
    fn, make, si, tok = RWKV[name]
    S, H, tps, n = dims
    args = make(np.random.default_rng(seed), S, H, tps * n, n)
    cut = data.draw(st.integers(1, tps - 1))

    def part(lo, hi, state):
        a = list(args)
        for i in tok:
            a[i] = np.ascontiguousarray(args[i].reshape(n, tps, H, S)[:, lo:hi].reshape(-1, H, S))
        a[si] = state
        out = fn(*a)
        return out[:n * (hi - lo)].reshape(n, hi - lo, H * S), out[n * (hi - lo):].reshape(n, -1)

    y1, mid = part(0, cut, args[si])
    y2, end = part(cut, tps, mid)
    whole = fn(*args)
    assert_bits_equal(np.concatenate([y1, y2], axis=1).reshape(-1, S * H), whole[:tps * n], f"{name} outputs")
    assert_bits_equal(end.reshape(-1, S * H), whole[tps * n:], f"{name} states")


@pytest.mark.parametrize("name", list(RWKV))
@given(seed=seeds, dims=rwkv_dims)
def test_rwkv_sequences_are_independent(name, seed, dims):
    """n_seqs sequences in one call = one call per sequence."""
    fn, make, si, tok = RWKV[name]
    S, H, tps, n = dims
    args = make(np.random.default_rng(seed), S, H, tps * n, n)
    whole = fn(*args)
    for q in range(n):
        a = list(args)
        for i in tok:
            a[i] = np.ascontiguousarray(args[i][q * tps:(q + 1) * tps])
        a[si] = np.ascontiguousarray(args[si][q:q + 1])
        one = fn(*a)
        assert_bits_equal(one[:tps], whole[q * tps:(q + 1) * tps], f"{name} seq {q} outputs")
        assert_bits_equal(one[tps:], whole[tps * n + q * S:tps * n + (q + 1) * S], f"{name} seq {q} state")


def _rwkv_f64(name, args, S, H, T, n):
    """The formulas of §4.12 in f64, per head with explicit state matrices."""
    a = [np.asarray(x, np.float64) if isinstance(x, np.ndarray) else x for x in args]
    tps = T // n
    ys, finals = np.zeros((T, H, S)), []
    si = RWKV[name][2]
    for q in range(n):
        st_ = a[si][q].reshape(H, S, S).copy()
        for t in range(q * tps, (q + 1) * tps):
            for h in range(H):
                s = st_[h]
                if name == "rwkv_wkv6":          # s[i][j], i = key: out = r·(u⊙k ⊗ v + s); s = w⊙s + k ⊗ v
                    k, v, r, u, w = a[0][t, h], a[1][t, h], a[2][t, h], a[3][h], a[4][t, h]
                    kv = np.outer(k, v)
                    ys[t, h] = r @ (u[:, None] * kv + s)
                    st_[h] = w[:, None] * s + kv
                elif name == "gated_linear_attn":   # s = g⊙s + k ⊗ v; out = (scale q)·s
                    k, v, qv, g, scale = a[0][t, h], a[1][t, h], a[2][t, h], a[3][t, h], a[5]
                    st_[h] = g[:, None] * s + np.outer(k, v)
                    ys[t, h] = (qv * scale) @ st_[h]
                else:                              # s[i][j], i = value: s = s diag(w) + v ⊗ k + (s a) ⊗ b
                    r, w, k, v, aa, b = (a[i][t, h] for i in range(6))
                    st_[h] = s * w[None, :] + np.outer(v, k) + np.outer(s @ aa, b)
                    ys[t, h] = st_[h] @ r
        finals.append(st_.reshape(-1))
    return np.concatenate([ys.reshape(T, -1), np.stack(finals).reshape(-1, S * H)])


@pytest.mark.parametrize("name", list(RWKV))
@given(seed=seeds, dims=rwkv_dims)
def test_rwkv_match_their_f64_formulas(name, seed, dims):
    fn, make, _, _ = RWKV[name]
    S, H, tps, n = dims
    args = make(np.random.default_rng(seed), S, H, tps * n, n)
    t = tol(name, "f32", "property")
    y_abs = _rwkv_f64(name, [np.abs(x) for x in args], S, H, tps * n, n)     # decays are in [0, 1] already
    check_values(fn(*args), _rwkv_f64(name, args, S, H, tps * n, n), t, name, bound=t.bound(y_abs, tps, S))


def test_rwkv_shape_errors():
    rng = np.random.default_rng(0)
    k, v, r, tf, td, s = _wkv6_args(rng, 4, 2, 6, 2)
    with pytest.raises(GGMLShapeError, match="multiple of n_seqs"):
        rwkv_wkv6(k, v, r, tf, td, np.zeros((4, 32), np.float32))        # 6 tokens, 4 sequences
    with pytest.raises(GGMLShapeError, match="S\\*S\\*H"):
        rwkv_wkv6(k, v, r, tf, td, s[:, :-1])
    with pytest.raises(GGMLShapeError, match="like k"):
        rwkv_wkv6(k, v[:, :, :3], r, tf, td, s)
    with pytest.raises(GGMLShapeError, match="like k"):
        rwkv_wkv7(*_wkv7_args(rng, 4, 2, 6, 2)[:1], k[:, :1], *_wkv7_args(rng, 4, 2, 6, 2)[2:])


# -- gated_delta_net --------------------------------------------------------------------------------------

def _gdn_args(rng, S, H_k, rep, n_tok, n_seqs, kda, nq=None):
    H = H_k * rep
    q, k = _u(rng, nq or n_seqs, n_tok, H_k, S), _u(rng, nq or n_seqs, n_tok, H_k, S)
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    return (q, k, _u(rng, n_seqs, n_tok, H, S), _u(rng, n_seqs, n_tok, H, S if kda else 1, lo=-2, hi=0),
            _u(rng, n_seqs, n_tok, H, 1, lo=0, hi=1), _u(rng, n_seqs, H, S, S))


gdn_dims = st.tuples(st.integers(1, 8), st.integers(1, 2), st.integers(1, 2), st.integers(2, 5), st.integers(1, 2),
                     st.booleans())


def _gdn_split(out, S, H, n_tok, n_seqs, K):
    attn = out.reshape(-1)[:n_seqs * n_tok * H * S].reshape(n_seqs, n_tok, H, S)
    return attn, out.reshape(-1)[attn.size:].reshape(K, n_seqs, H, S, S)


@given(seed=seeds, dims=gdn_dims, data=st.data())
def test_gated_delta_net_tokens_in_two_calls_equal_one_call(seed, dims, data):
    S, H_k, rep, n_tok, n_seqs, kda = dims
    args = _gdn_args(np.random.default_rng(seed), S, H_k, rep, n_tok, n_seqs, kda)
    cut = data.draw(st.integers(1, n_tok - 1))
    part = lambda x, lo, hi: np.ascontiguousarray(x[:, lo:hi])
    H = H_k * rep
    a1, m = _gdn_split(gated_delta_net(*(part(x, 0, cut) for x in args[:5]), args[5]), S, H, cut, n_seqs, 1)
    a2, e = _gdn_split(gated_delta_net(*(part(x, cut, n_tok) for x in args[:5]), m[0]), S, H, n_tok - cut, n_seqs, 1)
    a, f = _gdn_split(gated_delta_net(*args), S, H, n_tok, n_seqs, 1)
    assert_bits_equal(np.concatenate([a1, a2], axis=1), a, "gated_delta_net attn")
    assert_bits_equal(e, f, "gated_delta_net state")


@given(seed=seeds, dims=gdn_dims, K=st.integers(1, 6))
def test_gated_delta_net_snapshot_m_is_the_state_m_tokens_back(seed, dims, K):
    S, H_k, rep, n_tok, n_seqs, kda = dims
    args = _gdn_args(np.random.default_rng(seed), S, H_k, rep, n_tok, n_seqs, kda)
    H = H_k * rep
    _, snaps = _gdn_split(gated_delta_net(*args, K=K), S, H, n_tok, n_seqs, K)
    for m in range(K):
        if m >= n_tok:                                         # never written (ggml: caller-owned memory)
            assert not snaps[m].any()
            continue
        _, f = _gdn_split(gated_delta_net(*(np.ascontiguousarray(x[:, :n_tok - m]) for x in args[:5]), args[5]),
                          S, H, n_tok - m, n_seqs, 1)
        assert_bits_equal(snaps[m], f[0], f"snapshot {m}")


@given(seed=seeds, dims=gdn_dims)
def test_gated_delta_net_q_k_heads_are_tiled_and_sequences_blocked(seed, dims):
    """q/k head h % H_k serves value head h (np.tile); q/k sequence i serves value sequences i*r .. i*r+r-1."""
    S, H_k, rep, n_tok, n_seqs, kda = dims
    q, k, v, g, beta, s = _gdn_args(np.random.default_rng(seed), S, H_k, rep, n_tok, 2 * n_seqs, kda, nq=n_seqs)
    full = lambda x: np.repeat(np.tile(x, (1, 1, rep, 1)), 2, axis=0)
    assert_bits_equal(gated_delta_net(q, k, v, g, beta, s, K=2), gated_delta_net(full(q), full(k), v, g, beta, s, K=2),
                      "broadcast")


@given(seed=seeds, dims=gdn_dims)
def test_gated_delta_net_kda_with_equal_gates_is_the_scalar_gate(seed, dims):
    S, H_k, rep, n_tok, n_seqs, _ = dims
    q, k, v, g, beta, s = _gdn_args(np.random.default_rng(seed), S, H_k, rep, n_tok, n_seqs, False)
    assert_bits_equal(gated_delta_net(q, k, v, np.repeat(g, S, axis=-1), beta, s),
                      gated_delta_net(q, k, v, g, beta, s), "kda")


@given(seed=seeds, dims=gdn_dims)
def test_gated_delta_net_matches_the_f64_delta_rule(seed, dims):
    S, H_k, rep, n_tok, n_seqs, kda = dims
    args = _gdn_args(np.random.default_rng(seed), S, H_k, rep, n_tok, n_seqs, kda)
    q, k, v, g, beta, s = (x.astype(np.float64) for x in args)
    H = H_k * rep
    attn, finals = np.zeros((n_seqs, n_tok, H, S)), np.zeros((n_seqs, H, S, S))
    m_rows = np.zeros((n_seqs, H, n_tok + 1, S))                 # |row j of M| before each token, after the last
    for b in range(n_seqs):
        for h in range(H):
            M = s[b, h].copy()                                   # M[j][i]: j value, i key
            for t in range(n_tok):
                m_rows[b, h, t] = np.linalg.norm(M, axis=1)
                kt, qt = k[b, t, h % H_k], q[b, t, h % H_k]
                M = M * np.exp(g[b, t, h])[None, :]
                delta = (v[b, t, h] - M @ kt) * beta[b, t, h, 0]
                M = M + np.outer(delta, kt)
                attn[b, t, h] = (M @ qt) / np.sqrt(S)
            m_rows[b, h, n_tok] = np.linalg.norm(M, axis=1)
            finals[b, h] = M
    want = np.concatenate([attn.reshape(-1), finals.reshape(-1)])
    t = tol("gated_delta_net", "f32", "property")
    check_values(gated_delta_net(*args).reshape(-1), want, t, "gated_delta_net",
                 bound=t.bound(m_rows, np.abs(v), S))


def test_gated_delta_net_shape_errors():
    q, k, v, g, beta, s = _gdn_args(np.random.default_rng(0), 4, 2, 2, 3, 2, False)
    with pytest.raises(GGMLShapeError, match="H % H_k"):
        gated_delta_net(q[:, :, :1].repeat(3, axis=2), k, v, g, beta, s)
    with pytest.raises(GGMLShapeError, match="state"):
        gated_delta_net(q, k, v, g, beta, s[:1])
    with pytest.raises(GGMLShapeError, match="K = 0"):
        gated_delta_net(q, k, v, g, beta, s, K=0)
    with pytest.raises(GGMLShapeError, match="g must"):
        gated_delta_net(q, k, v, np.repeat(g, 3, axis=-1), beta, s)


def test_fma_rounds_once():
    """The kernels' FMAs round a*b + c once; a plain f64 evaluation would round twice here."""
    from refimpl.rounding import fma32 as _fma
    a = np.float32(1 + 2.0 ** -23)
    b = np.float32((1 - 2.0 ** -23) * 2.0 ** -24)
    c = np.float32(1 + 2.0 ** -23)                   # a*b + c = 1 + 2^-23 + 2^-24 - 2^-70: just below a midpoint
    assert np.float32(np.float64(a) * np.float64(b) + np.float64(c)) == np.float32(1 + 2.0 ** -22)   # double rounding
    assert _fma(a, b, c) == c
    assert _fma(-a, b, -c) == -c
    assert _fma(np.float32(3.0), np.float32(0.5), np.float32(-1.5)) == 0.0


# -- rwkv_wkv4 (RWKV-4, no ggml op) -----------------------------------------------------------------------

@given(seeds, st.integers(1, 6), st.integers(1, 5))
def test_rwkv_wkv4_is_the_weighted_average(seed, T, C):
    """Each output is the decayed, exp(k)-weighted average of the values so far, the current token weighted
    by exp(u + k) (the definition in f64, no rescaling); split after any token with the state passed along,
    the same bits."""
    rng = np.random.default_rng(seed)
    k, v = _u(rng, T, C, lo=-3, hi=3), _u(rng, T, C)
    w, u = -np.exp(_u(rng, C, lo=-2, hi=1)), _u(rng, C)
    fresh = np.stack([np.zeros(C), np.zeros(C), np.full(C, -1e38)]).astype(np.float32)
    out = rwkv_wkv4(k, v, w, u, fresh)
    assert out.shape == (T + 3, C) and out.dtype == np.float32
    k64, v64, w64, u64 = (x.astype(np.float64) for x in (k, v, w, u))
    want = np.empty((T, C))
    for t in range(T):
        past = np.exp((t - 1 - np.arange(t))[:, None] * w64 + k64[:t])       # (t, C)
        now = np.exp(u64 + k64[t])
        want[t] = ((past * v64[:t]).sum(0) + now * v64[t]) / (past.sum(0) + now)
    t = tol("rwkv_wkv4", "f32", "property")
    check_values(out[:T], want, t, "rwkv_wkv4", bound=t.bound(k, v, w, u))
    cut = int(rng.integers(1, T + 1))
    first = rwkv_wkv4(k[:cut], v[:cut], w, u, fresh)
    rest = rwkv_wkv4(k[cut:], v[cut:], w, u, first[cut:])
    assert_bits_equal(np.concatenate([first[:cut], rest]), out, "rwkv_wkv4 split")


def test_rwkv_wkv4_names_bad_shapes():
    with pytest.raises(GGMLShapeError, match="rwkv_wkv4"):
        rwkv_wkv4(np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32), np.zeros(3, np.float32),
                  np.zeros(4, np.float32), np.zeros((3, 3), np.float32))
