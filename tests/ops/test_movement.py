"""Properties of the data-movement ops (identities and round trips, no ggml needed).

Every identity here is exact: data movement copies bits, and the few additions (repeat_back,
get_rows_back, acc) are checked on integer-valued floats, where f32 sums are exact.
"""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from refimpl import GGMLShapeError, GGMLType, QTensor, dequantize, quantize
from refimpl.ops import (acc, cast, concat, cont, cpy, diag, diag_mask_inf, diag_mask_zero, dup, get_rel_pos,
                         get_rows, get_rows_back, pad, pad_ext, pad_reflect_1d, permute, repeat, repeat_back,
                         reshape, roll, set, set_rows, transpose, view, win_part, win_unpart)
from refimpl.testing import assert_bits_equal

pytestmark = pytest.mark.property

shape4 = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple)      # NumPy order


def _arr(draw, shp, ints=False):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if ints:
        return rng.integers(-50, 50, shp).astype(np.float32)
    return rng.uniform(-1, 1, shp).astype(np.float32)


@st.composite
def arrays(draw, ints=False, min_dims=1):
    shp = draw(st.lists(st.integers(1, 5), min_size=min_dims, max_size=4).map(tuple))
    return _arr(draw, shp, ints)


# -- views -------------------------------------------------------------------------------------------

@given(arrays(), st.permutations(range(4)))
def test_permute_follows_ggml_and_round_trips(a, axes):
    p = permute(a, *axes)
    ne_a = list(a.shape[::-1]) + [1] * (4 - a.ndim)
    ne_p = list(p.shape[::-1]) + [1] * (4 - p.ndim)
    for i, ax in enumerate(axes):                      # ggml: source dim i goes to result dim axes[i]
        assert ne_p[ax] == ne_a[i]
    inv = [0] * 4
    for i, ax in enumerate(axes):
        inv[ax] = i
    back = permute(p, *inv)
    assert_bits_equal(back.reshape(a.shape), a)
    assert np.shares_memory(p, a)                      # a view, as in ggml


def test_permute_llama_heads():
    q = np.arange(7 * 4 * 8, dtype=np.float32).reshape(7, 4, 8)        # (n_tokens, n_head, head_dim)
    assert_bits_equal(permute(q, 0, 2, 1, 3), q.transpose(1, 0, 2))     # -> (n_head, n_tokens, head_dim)


@given(arrays())
def test_transpose_twice_is_identity(a):
    t = transpose(a)
    ne, ne_t = list(a.shape[::-1]) + [1] * (4 - a.ndim), list(t.shape[::-1]) + [1] * (4 - t.ndim)
    assert ne_t == [ne[1], ne[0]] + ne[2:]
    assert_bits_equal(transpose(t).reshape(a.shape), a)


@given(arrays(), st.data())
def test_reshape_and_cont(a, data):
    n = a.size
    k = data.draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
    r = reshape(a, (n // k, k))
    assert np.shares_memory(r, a)
    c = cont(a.T, (k, n // k))
    assert_bits_equal(c, np.ascontiguousarray(a.T).reshape(k, n // k))
    assert c.flags.c_contiguous and cont(a.T).flags.c_contiguous
    if not a.T.flags.c_contiguous:
        with pytest.raises(GGMLShapeError):
            reshape(a.T, (n,))


@given(arrays(min_dims=2))
def test_view_with_own_strides_is_the_array(a):
    v = view(a, a.shape, a.strides, 0)
    assert_bits_equal(v, a)
    rows = view(a, (a.shape[-2] - 1, a.shape[-1]), (a.strides[-2], a.itemsize), a.strides[-2]) \
        if a.shape[-2] > 1 and a.ndim == 2 else None
    if rows is not None:
        assert_bits_equal(rows, a[1:])


def test_view_rejects_out_of_bounds():
    a = np.zeros((3, 4), np.float32)
    with pytest.raises(GGMLShapeError):
        view(a, (3, 4), None, 4)
    with pytest.raises(GGMLShapeError):
        view(a, (2, 4), (40, 4), 0)


# -- copies and conversions ---------------------------------------------------------------------------

@given(arrays())
def test_cpy_and_cast_round_trip(a):
    assert_bits_equal(cpy(cpy(a, np.float16), GGMLType.F32), a.astype(np.float16).astype(np.float32))
    assert_bits_equal(cast(a, "f16"), a.astype(np.float16))
    b = cast(a, GGMLType.BF16)
    assert isinstance(b, QTensor) and b.shape == a.shape
    assert_bits_equal(cast(b, np.float32), dequantize(b))
    assert_bits_equal(cast(a * 100, GGMLType.I32), np.trunc(a * 100).astype(np.int32))
    assert_bits_equal(dup(a.T), np.ascontiguousarray(a.T))


@given(arrays(), st.data())
def test_cpy_into_another_shape_is_a_reshape(a, data):
    n = a.size
    k = data.draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
    dst = np.zeros((k, n // k), np.float16)
    assert_bits_equal(cpy(a.T, dst), np.ascontiguousarray(a.T).reshape(k, n // k).astype(np.float16))


@pytest.mark.parametrize("t", ["q4_0", "q8_0", "q4_K", "iq4_nl", "mxfp4"])
def test_cpy_to_block_type_is_the_cpu_quantizer(t):
    x = np.random.default_rng(0).uniform(-1, 1, (3, 256)).astype(np.float32)
    q = cpy(x, t)
    assert q == quantize(x, t, method="cpu")
    assert_bits_equal(cpy(q, np.float32), dequantize(q))
    assert cpy(q, q) == q                                   # same type: the bytes


def test_cpy_rejects_what_ggml_cpu_rejects():
    q = quantize(np.zeros((2, 32), np.float32), "q4_0")
    with pytest.raises(GGMLShapeError):
        cpy(q, np.float16)                                  # block types convert only to f32
    with pytest.raises(GGMLShapeError):
        cpy(np.zeros((2, 16), np.float32), "q4_0")          # rows not whole blocks
    with pytest.raises(GGMLShapeError):
        cpy(np.zeros(4, np.int32), np.float16)
    with pytest.raises(GGMLShapeError):
        cpy(np.zeros(4, np.float32), np.zeros(5, np.float32))


# -- gathers and scatters ------------------------------------------------------------------------------

@given(st.data())
def test_set_rows_then_get_rows(data):
    R, n, E = data.draw(st.integers(1, 8)), data.draw(st.integers(1, 8)), data.draw(st.integers(1, 9))
    n = min(n, R)
    a = _arr(data.draw, (R, E))
    b = _arr(data.draw, (n, E))
    idx = np.random.default_rng(data.draw(st.integers(0, 99))).permutation(R)[:n]
    out = set_rows(a, b, idx.astype(np.int64))
    assert_bits_equal(get_rows(out, idx.astype(np.int32)), b)
    untouched = np.setdiff1d(np.arange(R), idx)
    assert_bits_equal(out[untouched], a[untouched])
    assert_bits_equal(a, a.copy())                          # a itself is not written


def test_set_rows_tiles_indices_and_last_write_wins():
    a = np.zeros((2, 3, 4, 2), np.float32)
    b = np.arange(2 * 3 * 2 * 2, dtype=np.float32).reshape(2, 3, 2, 2)
    c = np.array([[[1, 3]]], np.int32)                      # (1, 1, 2): tiled over ne2 = 3 and ne3 = 2
    out = set_rows(a, b, c)
    assert_bits_equal(out[:, :, [1, 3]], b)
    dup_idx = set_rows(np.zeros((2, 1), np.float32), np.float32([[5.0], [7.0]]), np.array([0, 0], np.int64))
    assert dup_idx[0, 0] == 7.0


@given(st.data())
def test_set_rows_into_a_itself_is_the_returned_copy(data):
    """out=a (ggml's in-place write, the RPC server's KV cache, a strided f16 view included): the same values
    as the copy set_rows returns, written into a, a returned; out=another array gets a's values first."""
    R, n, E = data.draw(st.integers(1, 8)), data.draw(st.integers(1, 8)), data.draw(st.integers(1, 9))
    n = min(n, R)
    big = _arr(data.draw, (2 * R, E + 3)).astype(data.draw(st.sampled_from([np.float32, np.float16])))
    a = big[::2, 1:E + 1]                                   # rows apart, as a view of a longer cache
    b = _arr(data.draw, (n, E))
    idx = np.random.default_rng(data.draw(st.integers(0, 99))).integers(0, R, n).astype(np.int64)
    want = set_rows(a, b, idx)
    other = np.full(a.shape, 9, a.dtype)
    assert set_rows(a, b, idx, out=other) is other
    assert_bits_equal(other, want)
    before = big.copy()
    assert set_rows(a, b, idx, out=a) is a
    assert_bits_equal(a, want)
    outside = np.ones(big.shape, bool)
    outside[::2, 1:E + 1] = False
    assert_bits_equal(big[outside], before[outside])       # nothing else of the cache is written
    with pytest.raises(GGMLShapeError):                    # not a's shape
        set_rows(a, b, idx, out=np.zeros((R + 1, E), a.dtype))
    if E > 1:
        with pytest.raises(GGMLShapeError):                # overlapping a without being a
            set_rows(a, b, idx, out=big[::2, 0:E])


@given(st.data())
def test_get_rows_back_is_the_adjoint_of_get_rows(data):
    R, n, E = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 8)), data.draw(st.integers(1, 9))
    x = _arr(data.draw, (R, E), ints=True)
    y = _arr(data.draw, (n, E), ints=True)
    idx = np.random.default_rng(data.draw(st.integers(0, 99))).integers(0, R, n).astype(np.int32)
    lhs = np.sum(get_rows(x, idx).astype(np.float64) * y)
    rhs = np.sum(x.astype(np.float64) * get_rows_back(y, idx, x))
    assert lhs == rhs


def test_gathers_check_ranges():
    with pytest.raises(GGMLShapeError):
        get_rows(np.zeros((3, 4), np.float32), np.array([3], np.int32))
    with pytest.raises(GGMLShapeError):
        set_rows(np.zeros((3, 4), np.float32), np.zeros((1, 4), np.float32), np.array([-1], np.int64))
    with pytest.raises(GGMLShapeError):
        get_rows_back(np.zeros((1, 4), np.float32), np.array([5], np.int32), np.zeros((3, 4), np.float32))


# -- tiling and concatenation ---------------------------------------------------------------------------

@given(arrays(ints=True), st.lists(st.integers(1, 3), min_size=4, max_size=4))
def test_repeat_back_of_repeat_multiplies_by_the_tile_count(a, reps):
    ne = list(a.shape[::-1]) + [1] * (4 - a.ndim)
    big = tuple(n * r for n, r in zip(ne, reps))[::-1]
    t = repeat(a, big)
    assert_bits_equal(t, np.tile(a.reshape(ne[::-1]), reps[::-1]))
    assert_bits_equal(repeat_back(t, a.shape), a * np.float32(np.prod(reps)))
    if a.shape[-1] > 1:
        with pytest.raises(GGMLShapeError):
            repeat(a, a.shape[:-1] + (a.shape[-1] + 1,))


@given(arrays(), st.integers(0, 3), st.integers(1, 3))
def test_concat_then_views(a, dim, nb):
    ne = list(a.shape[::-1]) + [1] * (4 - a.ndim)
    ne_b = list(ne)
    ne_b[dim] = nb
    b = np.full(ne_b[::-1], 7.0, np.float32)
    c = concat(a, b, dim)
    c4 = c.reshape((1,) * (4 - c.ndim) + c.shape)
    ax = 3 - dim                                            # ggml dim d is NumPy axis -1-d
    assert_bits_equal(np.take(c4, range(ne[dim]), axis=ax), a.reshape(ne[::-1]))
    assert_bits_equal(np.take(c4, range(ne[dim], ne[dim] + nb), axis=ax), b)
    with pytest.raises(GGMLShapeError):
        concat(a, b.astype(np.float16), dim)


# -- writes into a view of a copy -----------------------------------------------------------------------

@given(arrays(min_dims=2), st.data())
def test_set_and_acc_at_an_element_offset(a, data):
    a = a.reshape(-1, a.shape[-1])
    i1 = data.draw(st.integers(0, a.shape[0] - 1))
    i0 = data.draw(st.integers(0, a.shape[1] - 1))
    b = np.full((a.shape[0] - i1, a.shape[1] - i0), 3.0, np.float32)
    nb1 = a.strides[0]
    off = i1 * nb1 + i0 * 4
    ref = a.copy()
    ref[i1:, i0:] = 3.0
    assert_bits_equal(set(a, b, nb1, None, None, off), ref)
    ref[i1:, i0:] = a[i1:, i0:] + np.float32(3.0)
    assert_bits_equal(acc(a, b, nb1, None, None, off), ref)
    assert_bits_equal(acc(a, np.zeros_like(b), nb1, None, None, off), a)


def test_set_rejects_misaligned_or_out_of_bounds_views():
    a = np.zeros((2, 4), np.float32)
    with pytest.raises(GGMLShapeError):
        set(a, np.zeros(2, np.float32), offset=2)
    with pytest.raises(GGMLShapeError):
        set(a, np.zeros(2, np.float32), offset=28)          # ggml's check lets the last element start at 32


# -- padding, rolling -----------------------------------------------------------------------------------

@given(arrays(), st.lists(st.integers(0, 3), min_size=8, max_size=8))
def test_pad_then_view_gives_a_back(a, p):
    lp, rp = p[:4], p[4:]
    out = pad_ext(a, lp[0], rp[0], lp[1], rp[1], lp[2], rp[2], lp[3], rp[3])
    assert_bits_equal(out, pad(a, *rp, lp0=lp[0], lp1=lp[1], lp2=lp[2], lp3=lp[3]))
    o4 = out.reshape((1,) * (4 - out.ndim) + out.shape)
    ne = list(a.shape[::-1]) + [1] * (4 - a.ndim)
    inner = o4[lp[3]:lp[3] + ne[3], lp[2]:lp[2] + ne[2], lp[1]:lp[1] + ne[1], lp[0]:lp[0] + ne[0]]
    assert_bits_equal(inner, a.reshape(ne[::-1]))
    assert np.count_nonzero(o4) == np.count_nonzero(a)                # the rest is zeros


@given(arrays())
def test_circular_pad_wraps(a):
    n0 = a.shape[-1]
    out = pad(a, n0, circular=True, lp0=n0)
    assert_bits_equal(out, np.concatenate([a, a, a], axis=-1))


def test_pad_reflect_1d_example():
    assert_bits_equal(pad_reflect_1d(np.float32([1, 2, 3, 4]), 1, 1), np.float32([2, 1, 2, 3, 4, 3]))


@given(arrays(), st.data())
def test_roll_by_n_and_back_is_identity(a, data):
    ne = list(a.shape[::-1]) + [1] * (4 - a.ndim)
    s = [data.draw(st.integers(-(n - 1), n - 1)) for n in ne]
    r = roll(a, *s)
    assert_bits_equal(roll(r, *[-x for x in s]), a)
    assert_bits_equal(r, np.roll(a.reshape(ne[::-1]), s[::-1], axis=(0, 1, 2, 3)).reshape(a.shape))
    with pytest.raises(GGMLShapeError):
        roll(a, ne[0])


# -- diagonals, masks, windows ----------------------------------------------------------------------------

@given(arrays(min_dims=2), st.integers(0, 4))
def test_diag_masks_agree(a, n_past):
    inf, zero = diag_mask_inf(a, n_past), diag_mask_zero(a, n_past)
    masked = np.isneginf(inf)
    assert_bits_equal(np.where(masked, np.float32(0), inf), np.where(masked, np.float32(0), a))
    assert np.all(zero[masked] == 0)
    i1, i0 = np.indices(a.shape[-2:])
    assert np.array_equal(masked[(0,) * (a.ndim - 2)], i0 > n_past + i1)


def test_diag():
    v = np.float32([1, 2, 3])
    assert_bits_equal(diag(v), np.diag(v))


@given(st.integers(1, 9), st.integers(1, 9), st.integers(1, 4), st.integers(1, 5), st.data())
def test_win_unpart_inverts_win_part(H, W, C, w, data):
    a = _arr(data.draw, (H, W, C))
    parts = win_part(a, w)
    assert parts.shape == (-(-H // w) * -(-W // w), w, w, C)
    assert_bits_equal(win_unpart(parts, W, H, w), a)


def test_get_rel_pos_table():
    k = 3
    a = np.arange(2 * k - 1, dtype=np.float16)[:, None] * np.ones((1, 2), np.float16)
    out = get_rel_pos(a, k, k)
    for i2 in range(k):
        for i1 in range(k):
            assert out[i2, i1, 0] == (k - 1 - i1) + i2
