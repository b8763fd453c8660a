"""mul_mat's Numba paths against the NumPy reference on shapes the op cases keep small: both paths
(decode: few rows of b, fused per weight row; prefill: BLAS tiles), several threads' worth of rows,
weight tiles, broadcast batches, every weight type."""
import numpy as np
import pytest

pytest.importorskip("numba", reason="numba is not installed: refimpl.kernels is Numba code")

import refimpl  # noqa: E402
from refimpl.kernels import matmul as km  # noqa: E402
from refimpl.kernels import quants as kd  # noqa: E402
from refimpl.ops.matmul import TILE_ROWS, VEC_DOT_TYPE  # noqa: E402
from refimpl.testing import assert_bits_equal, assert_nmse, tol  # noqa: E402
from refimpl.types import traits  # noqa: E402

pytestmark = pytest.mark.equivalence

TYPES = ["f32", "f16"] + sorted(traits(t).name for t in VEC_DOT_TYPE if t in kd.DECODABLE)


# grid formats without a fast reference quantizer: random blocks with d = 2^-8 (f16 0x1C00)
_D_AT_0 = ("iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s")


def _weight(t, w):
    """w (n, k) as a weight of type t: an f32/f16 array, or a QTensor."""
    if t == "f32":
        return w
    if t == "f16":
        return w.astype(np.float16)
    tr = traits(refimpl.as_type(t))
    if t not in _D_AT_0 and t != "iq1_m":
        with refimpl.backend("numpy"):
            return refimpl.quantize(w, t)
    blocks = np.random.default_rng(w.shape[0]).integers(0, 256, (w.size // tr.blck_size, tr.type_size),
                                                        dtype=np.uint8)
    if t == "iq1_m":                  # d's 16 bits are the top nibbles of the four u16 scales
        blocks[:, [49, 51, 53, 55]] = (blocks[:, [49, 51, 53, 55]] & 0x0F) | np.array([0x00, 0x00, 0xC0, 0x10],
                                                                                      np.uint8)
    else:
        blocks[:, 0:2] = np.frombuffer(np.float16(2.0 ** -8).tobytes(), np.uint8)
    return refimpl.QTensor.from_bytes(blocks, t, w.shape)


@pytest.mark.parametrize("t", TYPES)
@pytest.mark.parametrize("m", [1, 5, km.DECODE_ROWS + 1])
def test_mul_mat_paths(t, m):
    """Decode (m <= DECODE_ROWS) within two f64 sums rounded once, prefill identical bits; n spans
    several threads and (for prefill) two weight tiles."""
    rng = np.random.default_rng(m)
    n, k = TILE_ROWS + 40, 512
    a = _weight(t, rng.uniform(-1, 1, (n, k)).astype(np.float32))
    b = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    with refimpl.backend("numpy"):
        ref = refimpl.mul_mat(a, b)
    with refimpl.backend("numba"):
        got = refimpl.mul_mat(a, b)
    if m > km.DECODE_ROWS:
        assert_bits_equal(got, ref, f"mul_mat {t} prefill")
    else:
        assert_nmse(got, ref, tol("mul_mat", "*", "property").nmse, f"mul_mat {t} decode")


@pytest.mark.parametrize("m", [2, 12])
def test_mul_mat_broadcast_batches(m):
    """a (2, 3, n, k) repeated over b (2*2, 3*4, m, k): the block broadcast of grouped-query attention."""
    rng = np.random.default_rng(m)
    a = rng.uniform(-1, 1, (2, 3, 24, 64)).astype(np.float32)
    b = rng.uniform(-1, 1, (4, 12, m, 64)).astype(np.float32)
    with refimpl.backend("numpy"):
        ref = refimpl.mul_mat(a, b)
    with refimpl.backend("numba"):
        got = refimpl.mul_mat(a, b)
    assert_nmse(got, ref, tol("mul_mat", "*", "property").nmse, "batched mul_mat")


# -- thread splits and forks --------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["exact", "fast"])
@pytest.mark.parametrize("t", ["f32", "f16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_K", "q6_K"])
def test_decode_bits_do_not_depend_on_threads(t, mode):
    """A decode product splits weight rows over threads (prange drivers, or the thread pool); every output
    row is one kernel's whole dot product, so 1, 2 or 3 threads give identical bits, both modes."""
    import numba
    rng = np.random.default_rng(3)
    a = _weight(t, rng.standard_normal((1000, 512)).astype(np.float32))
    b = rng.standard_normal((3, 512)).astype(np.float32)
    before = numba.get_num_threads()
    outs = []
    try:
        for th in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS), min(3, numba.config.NUMBA_NUM_THREADS)}):
            numba.set_num_threads(th)
            with refimpl.backend("numba"):
                outs.append(refimpl.ops.mul_mat(a, b, numerics=mode))
    finally:
        numba.set_num_threads(before)
    for o in outs[1:]:
        assert_bits_equal(o, outs[0], f"mul_mat {t} {mode}: threads change the bits")


def test_decode_in_a_forked_child_runs_on_one_thread():
    """GNU OpenMP's threads do not survive a fork: a child that used a prange region its parent had started
    would hang. The decode drivers take one range in a child (ggml's test harness forks), so a child's
    decode product finishes and equals the parent's."""
    from tests.kernels._fork import in_forked_child
    rng = np.random.default_rng(4)
    a = _weight("q4_1", rng.standard_normal((4096, 576)).astype(np.float32))
    b = rng.standard_normal((1, 576)).astype(np.float32)
    with refimpl.backend("numba"):
        parent = refimpl.ops.mul_mat(a, b, numerics="fast")       # starts the OpenMP threads here

    def child():
        with refimpl.backend("numba"):
            return refimpl.ops.mul_mat(a, b, numerics="fast")
    assert_bits_equal(in_forked_child(child, "decode product"), parent, "decode in a forked child")


# -- attention's decode products: all heads in one call ----------------------------------------------------

@pytest.mark.parametrize("G,H,n,k,m", [(3, 9, 97, 64, 1), (1, 4, 5, 33, 2), (2, 2, 1, 1, 3), (3, 6, 40, 100, 8),
                                       (4, 8, 300, 32, 1)])
def test_attention_decode_is_the_per_batch_path(G, H, n, k, m):
    """a (G, n, k) f32 times b (H, m, k), m <= DECODE_ROWS (attention over the KV cache): exact mode runs
    every head in one kernel call with `_gemv_f32`'s dot, so the bits equal the per-batch path (the same
    data as 4-D arrays, which takes it); fast mode is within the f32 summation bound of exact (k not a
    multiple of 32 exercises the vector dot's scalar tail)."""
    rng = np.random.default_rng(n + k)
    a = rng.standard_normal((G, n, k)).astype(np.float32)
    b = rng.standard_normal((H, m, k)).astype(np.float32)
    with refimpl.backend("numba"):
        got = refimpl.ops.mul_mat(a, b, numerics="exact")
        per_batch = refimpl.ops.mul_mat(a[None], b[None], numerics="exact")[0]
        fast = refimpl.ops.mul_mat(a, b, numerics="fast")
    assert got.shape == (H, m, n)
    assert_bits_equal(got, per_batch, "attention decode product, exact")
    with refimpl.backend("numpy"):
        ref = refimpl.mul_mat(a, b)
    assert_nmse(got, ref, tol("mul_mat", "*", "property").nmse, "attention decode product vs reference")
    g = np.arange(H) // (H // G)
    s = np.einsum("hmk,hnk->hmn", np.abs(b.astype(np.float64)), np.abs(a.astype(np.float64))[g])
    gamma = lambda u: k * u / (1 - k * u)                                         # noqa: E731
    bound = (gamma(2.0 ** -24) + gamma(2.0 ** -53)) * s + np.spacing(np.abs(got)).astype(np.float64)
    assert (np.abs(fast.astype(np.float64) - got.astype(np.float64)) <= bound).all(), "fast attention product"


@pytest.mark.parametrize("k", [1, 31, 32, 33, 64, 100, 576])
def test_exact_f32_row_dot_is_dot_f64(k):
    """Exact numerics' f32-row dots (f32 weights' decode, attention's products) run `simd.vdot64_f32`: the
    lanes, products and order of `_dot_f64`, so the same f64 bits -- checked against `_dot_f64` itself on
    rows of mixed magnitudes, where the order of the f64 additions shows."""
    from numba import njit
    from refimpl.kernels import simd

    @njit
    def both(W, B, acc):
        n, M = W.shape[0], B.shape[0]
        got, want = np.empty((M, n)), np.empty((M, n))
        for r in range(n):
            for j in range(M):
                got[j, r] = simd.vdot64_f32(W, r * W.shape[1], B, j * B.shape[1], B.shape[1])
                want[j, r] = km._dot_f64(W[r], B[j], B.shape[1], acc)
        return got, want
    rng = np.random.default_rng(k)
    W = (rng.standard_normal((23, k)) * 10.0 ** rng.integers(-20, 20, (23, k))).astype(np.float32)
    B = rng.standard_normal((3, k)).astype(np.float32).astype(np.float64) * 10.0 ** rng.integers(-9, 9, (3, 1))
    got, want = both(W, B, np.empty(km.LANES))
    assert_bits_equal(got, want, f"vdot64_f32, k={k}")
    out = np.empty((3, 23), np.float32)
    km._gemv_f32(W, B, out, 0, 23)
    assert_bits_equal(out, want.astype(np.float32), "exact f32-weight decode")
    with pytest.raises(ValueError, match="do not match"):
        km._gemv_f32(W, B, out, 0, 24)                                         # past the last weight row


@pytest.mark.parametrize("numerics", ["exact", "fast"])
@pytest.mark.parametrize("G,H,n,k,m", [(3, 9, 97, 64, 1), (1, 4, 5, 33, 2), (2, 6, 40, 100, 8)])
def test_attention_decode_reads_the_cache_layout_in_place(numerics, G, H, n, k, m):
    """The models pass K as the cache stores it, (n, G, k), transposed to (G, n, k) as a view: the decode
    kernel reads the rows where they are, with the bits of the same product on a packed copy (same rows,
    same dot), in exact and fast mode; a view that is neither layout takes the general path."""
    rng = np.random.default_rng(G * n + k)
    cache = rng.standard_normal((n, G, k)).astype(np.float32)
    b = rng.standard_normal((H, m, k)).astype(np.float32)
    view = cache.transpose(1, 0, 2)
    assert G == 1 or not view.flags.c_contiguous          # one group: the transpose is contiguous
    with refimpl.backend("numba"):
        got = refimpl.ops.mul_mat(view, b, numerics=numerics)
        packed = refimpl.ops.mul_mat(np.ascontiguousarray(view), b, numerics=numerics)
        wide = np.zeros((n, G, k + 3), np.float32)
        wide[..., :k] = cache
        odd = wide[..., :k].transpose(1, 0, 2)           # rows padded apart: neither layout, the general path
        got_odd = refimpl.ops.mul_mat(odd, b, numerics=numerics)
    assert_bits_equal(got, packed, f"attention decode product on the cache layout, {numerics}")
    assert_bits_equal(got_odd, got, "attention product on a padded view (packed first: the same rows)")


@pytest.mark.parametrize("numerics", ["exact", "fast"])
@pytest.mark.parametrize("G,H,n,k,m", [(3, 9, 97, 64, 1), (1, 4, 5, 33, 2), (2, 6, 40, 100, 8)])
def test_attention_decode_on_an_f16_cache(numerics, G, H, n, k, m):
    """llama.cpp's f16 KV cache as the RPC server views it (the first n of 2n rows): all heads in one call,
    with the bits of one product per head (the f16 decode kernel, `_gemv_f16`) in exact mode, of the f32
    copy of the cache in both modes, and within fast's bound of the NumPy reference."""
    rng = np.random.default_rng(G * n + k + 1)
    cache = rng.standard_normal((2 * n, G, k)).astype(np.float16)
    b = rng.standard_normal((H, m, k)).astype(np.float32)
    view = cache[:n].transpose(1, 0, 2)                  # (G, n, k), rows 2n apart: neither packed layout
    r = H // G
    with refimpl.backend("numba"):
        got = refimpl.ops.mul_mat(view, b, numerics=numerics)
        per_head = np.stack([refimpl.ops.mul_mat(np.ascontiguousarray(view[h // r]), b[h], numerics=numerics)
                             for h in range(H)])
        widened = refimpl.ops.mul_mat(view.astype(np.float32), b, numerics=numerics)
    assert got.shape == (H, m, n)
    if numerics == "exact":
        assert_bits_equal(got, per_head, "f16 cache, all heads at once vs one product per head")
    # the f16 rows are read in place and widened as loaded: the sums of the same cache in f32
    assert_bits_equal(got, widened, f"f16 cache read in place vs its f32 copy, {numerics}")
    with refimpl.backend("numpy"):
        want = refimpl.ops.mul_mat(view, b, numerics="exact")
    assert_nmse(got, want, tol("mul_mat", "*", "property").nmse, f"f16 cache vs the reference, {numerics}")


def test_fast_kernels_refuse_mismatched_operands():
    """The vector kernels read raw addresses (kernels/simd.py); their drivers check the operands first, so a
    wrong call raises instead of reading past an array."""
    rng = np.random.default_rng(5)
    with refimpl.backend("numpy"):
        q = refimpl.quantize(rng.standard_normal((4, 64)).astype(np.float32), "q4_1")
    W2 = q.data.reshape(-1, 20)
    out = np.empty((1, 4), np.float32)
    with pytest.raises(ValueError, match="do not match"):
        km._fast_q4_1(W2, 2, np.zeros((1, 32), np.float32), out, 0, 4)        # activation row too short
    with pytest.raises(ValueError, match="do not match"):
        km._fast_q4_1(W2, 2, np.zeros((1, 64), np.float32), out, 0, 5)        # past the last weight row
    with pytest.raises(ValueError, match="do not match"):
        km._fast_q8_0(W2, 2, np.zeros((1, 64), np.float32), out, 0, 4)        # Q4_1 blocks read as Q8_0
    A = np.zeros(2 * 3 * 8, np.float32)                  # (G, n, k) = (2, 3, 8) rows, packed: sG 24, sN 8
    with pytest.raises(ValueError, match="do not match"):
        km._attn_fast(A, 24, 8, 2, 3, 8, np.zeros((3, 1, 8), np.float32),
                      np.empty((3, 1, 3), np.float32), 0, 3)                  # 3 heads over 2 groups
    with pytest.raises(ValueError, match="do not match"):
        km._attn_fast(A, 24, 8, 1, 3, 8, np.zeros((2, 1, 9), np.float32),
                      np.empty((2, 1, 3), np.float32), 0, 2)                  # k differs
    with pytest.raises(ValueError, match="do not match"):
        km._attn_fast(A, 24, 8, 3, 3, 8, np.zeros((3, 1, 8), np.float32),
                      np.empty((3, 1, 3), np.float32), 0, 3)                  # a third group past A's end
    with pytest.raises(ValueError, match="do not match"):
        km._attn_exact(A.view(np.uint16)[:40], 0, 8, 1, 6, 8, np.zeros((1, 1, 8)),
                       np.empty((1, 1, 6), np.float32), 0, 1)                 # f16 rows past the end


@pytest.mark.parametrize("t", ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0"])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_exact_vector_decode_is_the_buffered_decode(t, m):
    """Exact decode for the 32-element types runs `simd.vdot64_<type>` (the block decoded as a vector, 32 f64
    lanes, lanes added in order); the generic `_gemv` decodes rows into a buffer with the type's dequantizer
    and sums the same exact products in the same lanes and order: identical bits, also with blocks of
    extreme scales."""
    from refimpl.types import GGMLType
    rng = np.random.default_rng(m)
    n, k = 70, 320
    w = rng.standard_normal((n, k)).astype(np.float32) * np.float32(10.0) ** rng.integers(-6, 6, (n, 1))
    a = _weight(t, w.astype(np.float32))
    nb = k // 32
    W2 = a.data.reshape(n * nb, -1)
    B = rng.standard_normal((m, k)) * 10.0 ** rng.integers(-8, 8, (m, 1))
    want, got = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
    T = kd.tables()
    km._gemv(getattr(kd, f"_dq_{t}"), W2, nb, B, want, 0, n, T)
    km.GEMV[int(GGMLType[t.upper()])](W2, nb, B, got, 0, n, T)
    assert_bits_equal(got, want, f"exact vector decode {t}")
    with pytest.raises(ValueError, match="do not match"):
        km.GEMV[int(GGMLType[t.upper()])](W2, nb, np.ascontiguousarray(B[:, :32]), got, 0, n, T)  # row too short


def test_every_generated_kernel_is_named_in_the_source():
    """A reader greps for `_gemv_q4_K` and finds it: each kernel the templates make is listed by name in a
    `# defines` comment under its template, and nothing listed is missing."""
    import inspect
    import re
    src = inspect.getsource(km)
    listed = set(re.findall(r"\b(_(?:par_)?(?:gemv|fast)_\w+)", " ".join(
        line for line in src.splitlines() if line.lstrip().startswith("#"))))
    made = {n for n in dir(km) if re.fullmatch(r"_(?:par_)?(?:gemv|fast)_\w+", n) and n != "_gemv_f32"
            and n != "_par_gemv_f32"}
    assert made == listed - {"_gemv_f32", "_par_gemv_f32"}, (sorted(made - listed), sorted(listed - made))
