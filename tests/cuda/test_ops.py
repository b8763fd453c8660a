"""CUDA kernels of the row ops and element-wise ops (refimpl/kernels/cuda/{norm,softmax,rope,rows,unary}.py)
against the NumPy reference (`op.reference`), in numba's CUDA simulator (tests/cuda/conftest.py runs every
test under refimpl.backend("cuda")).

Every kernel here repeats the reference's f32/f64 operations in its order, so results are compared bit for
bit (`assert_bits_equal`, which also tells +0 from -0 and NaN payloads apart). Shapes are tiny (the simulator
runs each CUDA thread as a Python thread) but cover the edges: rows shorter than, and not a multiple of, the
block (128) and warp (32) sizes, rows longer than NumPy's pairwise leaf (128) and cast buffer (8192), tiled
broadcasts, batch dims, inputs the kernels do not cover (falling back to the reference, with its errors), and
device arrays passed from one op to the next. `test_kernels_compile_to_ptx_for_sm90` compiles every kernel for
a real GPU (cc 9.0) in a process without the simulator.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import refimpl
from refimpl import GGMLShapeError
from refimpl.ops import elementwise as ew
from refimpl.ops import movement as mv
from refimpl.ops.norm import norm, rms_norm
from refimpl.ops.rope import ROPE_TYPE_NEOX, ROPE_TYPE_NORMAL, ROPE_TYPE_VISION, rope_ext
from refimpl.ops.softmax import soft_max_ext
from refimpl.testing import assert_bits_equal

from numba import cuda  # noqa: E402  (after refimpl: tests/conftest.py has chosen the simulator)

from refimpl.kernels.cuda import _device  # noqa: E402
from refimpl.kernels.cuda import norm as knorm, rope as krope, rows as krows, softmax as ksm, unary as kun  # noqa: E402

pytestmark = [pytest.mark.equivalence,      # NumPy scalar inf/nan in the simulator:
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]

MODULES = ("norm", "softmax", "rope", "rows", "unary")
SPECIALS = [np.nan, -np.inf, np.inf, -0.0, 0.0, -10.0, 10.0, -9.99, 9.99, 1e-40, -3e38, 65519.0, 70000.0]


def _rng(seed=0):
    return np.random.default_rng(seed)


def _data(shape, seed=0, scale=4.0, specials=True):
    """f32 normal(0, scale) values with, where it fits, the special values (nan, +-inf, +-0, +-10, ...) first."""
    x = (_rng(seed).standard_normal(shape) * scale).astype(np.float32)
    if specials:
        flat = x.reshape(-1)
        k = min(flat.size, len(SPECIALS))
        flat[:k] = np.array(SPECIALS[:k], np.float32)
    return x


def _check(op, *args, fell_back=False, **kwargs):
    """op under the cuda backend returns a device array with the bits of op.reference on the same inputs;
    computed by the kernels (fell_back=False) or by the reference on the host (True)."""
    calls = kun.fallback.calls                   # the `fallbacks` fixture's record
    before = len(calls)
    got = op(*args, **kwargs)
    assert _device.is_device(got), f"{op.__name__} returned {type(got)}, not a device array"
    assert (len(calls) > before) == fell_back, f"{op.__name__}: fallback runs {calls[before:]}"
    host = tuple(_device.to_host(a) if _device.is_device(a) else a for a in args)
    with np.errstate(all="ignore"):
        ref = op.reference(*host, **kwargs)
    assert_bits_equal(_device.to_host(got), ref, f"{op.__name__}{tuple(np.shape(a) for a in host)} {kwargs}")
    return got


def _same_error(op, *args, **kwargs):
    """The cuda op raises the reference's GGMLShapeError, message included."""
    with pytest.raises(GGMLShapeError) as ref:
        op.reference(*args, **kwargs)
    with pytest.raises(GGMLShapeError) as got:
        op(*args, **kwargs)
    assert str(got.value) == str(ref.value)


@pytest.fixture(autouse=True)
def fallbacks(monkeypatch):
    """Records the references the CUDA modules run on the host (`fallback`), by op name."""
    calls = []
    real = kun.fallback

    def spy(ref, *args, **kwargs):
        calls.append(ref.__name__)
        return real(ref, *args, **kwargs)
    spy.calls = calls
    for mod in (knorm, ksm, krope, krows, kun):
        monkeypatch.setattr(mod, "fallback", spy)
    return calls


# -- element-wise ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("b_shape", [(37,), (3, 1), (1, 3, 37), (2, 3, 37), (2, 1, 1)])
def test_binary_tiles_b_over_a(name, b_shape):
    """a (2, 3, 37) = ne [37, 3, 2]: 222 elements, one partial block of 256 threads; b tiled along every dim
    (a row, a column, a plane, the same shape, one value per batch), specials in both operands (0/0, inf-inf)."""
    _check(getattr(ew, name), _data((2, 3, 37)), _data(b_shape, seed=1, scale=2.0))


def test_binary_4d_and_bad_tiling():
    """4 dims, a past one block (2*3*2*37 = 444 elements), b tiled over dims 1 and 3; b that does not tile a
    raises the reference's error."""
    _check(ew.mul, _data((2, 3, 2, 37)), _data((1, 3, 1, 37), seed=2))
    _same_error(ew.add, _data((3, 37)), _data((2, 37), seed=2))


@pytest.mark.parametrize("b", [0.0, 0.75])
def test_scale(b):
    """a*s, and fma(a, s, b) rounded once (a value where a*s + b rounds twice otherwise is included)."""
    a = _data((3, 45))
    a.reshape(-1)[-1] = np.float32(1.0000001)
    _check(ew.scale, a, 1.0000001, b)


@pytest.mark.parametrize("name", ["silu", "gelu", "gelu_erf", "relu", "sigmoid", "tanh", "exp", "sqr", "sqrt",
                                  "neg"])
def test_unary(name):
    """(2, 3, 50): 300 elements, two blocks, the second partial; the specials (nan, +-inf, +-0, the gelu table's
    +-10 edges, an f32 subnormal, values past f16's range) in the first row."""
    _check(getattr(ew, name), _data((2, 3, 50), scale=6.0))


def test_gelu_table_index_matches_f16_rounding():
    """gelu's table index is fl16(x): values at and around f16 rounding ties and the subnormal range."""
    h = np.arange(0, 0x7C00, 97, dtype=np.uint16).view(np.float16).astype(np.float32)
    ties = (h[:-1] + h[1:]) / np.float32(2)                    # exact halfway points (ties to even)
    x = np.concatenate([h, ties, -ties, np.nextafter(ties, np.float32(0))]).astype(np.float32)
    x = x[np.abs(x) < 10]
    _check(ew.gelu, x)


@pytest.mark.parametrize("name", ["swiglu", "geglu", "reglu"])
@pytest.mark.parametrize("form", ["fused", "swapped", "split"])
def test_glu(name, form):
    """a (2, 3, 41): odd rows (the last column ignored by the fused forms, n = 20); split: a and b (2, 3, 20)."""
    op = getattr(ew, name)
    if form == "split":
        _check(op, _data((2, 3, 20)), _data((2, 3, 20), seed=3, scale=2.0))
    else:
        _check(op, _data((2, 3, 41), scale=6.0), swapped=form == "swapped")


def test_elementwise_fallbacks(fallbacks):
    """f16 operands, non-contiguous a (a column slice: rows not packed -> the reference's error; a row slice:
    rows packed -> the reference's answer) and a mis-shaped split glu run the reference."""
    a = _data((4, 40))
    _check(ew.silu, a.astype(np.float16), fell_back=True)
    _check(ew.add, a[::2], a[0], fell_back=True)
    _same_error(ew.relu, a[:, ::2])
    _same_error(ew.swiglu, a, a[:, :20])
    assert fallbacks == ["silu", "add", "relu", "swiglu"]


# -- norms -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", [rms_norm, norm])
@pytest.mark.parametrize("shape", [(2, 7), (2, 2, 37), (1, 200), (1, 1000)])
def test_norms(op, shape):
    """Rows of 7 (< 8: NumPy's leaf sums without accumulators), 37 (not a multiple of the warp), 200 and 1000
    (split into pairwise leaves, 1000 > the block's 128 threads); batch dims; wide dynamic range."""
    rng = _rng(5)
    a = (rng.standard_normal(shape) * np.exp(rng.uniform(-6, 6, shape))).astype(np.float32)
    _check(op, a, 1e-6)


def test_norms_eps_zero_row_and_errors(fallbacks):
    """A zero row with eps 0 gives NaN (0 * inf) as the reference; strided rows and eps < 0 raise the
    reference's errors; a row-sliced view (rows packed) is computed on the host."""
    a = _data((3, 16), specials=False)
    a[1] = 0
    _check(rms_norm, a, 0.0)
    _check(norm, a, 0.0)
    _same_error(rms_norm, a[:, ::2], 1e-6)
    _same_error(norm, a, -1.0)
    _check(norm, a[::2], 1e-5, fell_back=True)
    assert fallbacks == ["norm"]          # the bad inputs are refused by the op's check, before any kernel


@cuda.jit
def _sum_rows(x, square, out):
    leaf_lo = cuda.shared.array(knorm.MAX_LEAVES, np.int64)
    leaf_n = cuda.shared.array(knorm.MAX_LEAVES, np.int64)
    acc = cuda.shared.array(knorm.ACC, np.float64)
    leaf_sum = cuda.shared.array(knorm.MAX_LEAVES, np.float64)
    total = cuda.shared.array(2, np.float64)
    r = cuda.blockIdx.x
    s = knorm.block_sum(x[r], x.shape[1], square, leaf_lo, leaf_n, acc, leaf_sum, total)
    if cuda.threadIdx.x == 0:
        out[r] = s


@pytest.mark.parametrize("n", [300, 9000])
def test_block_sum_is_numpys_order(n):
    """block_sum's f64 sum is np.sum(row, dtype=f64) bit for bit: pairwise leaves (300) and two 8192-element
    cast buffers (9000), on data where a sequential sum (and a single pairwise tree) gives other bits."""
    rng = _rng(n)
    x = (rng.standard_normal((2, n)) * np.exp(rng.uniform(-20, 20, (2, n)))).astype(np.float32)
    for square in (False, True):
        v = np.square(x) if square else x
        ref = np.sum(v, axis=-1, dtype=np.float64)
        out = cuda.device_array(2, np.float64)
        _sum_rows[2, knorm.THREADS](cuda.to_device(x), square, out)
        assert_bits_equal(out.copy_to_host(), ref, f"block_sum n={n} square={square}")
        seq = np.array([sum(float(t) for t in row) for row in v])
        assert (seq != ref).any(), "the data must tell summation orders apart"


# -- softmax -------------------------------------------------------------------------------------------------

def test_soft_max_plain_and_scaled():
    """a (1, 2, 2, 37): 4 rows of 37 (< one block of 128 threads, not a multiple of 32), no mask, with scale."""
    a = _data((1, 2, 2, 37), specials=False)
    _check(soft_max_ext, a)
    _check(soft_max_ext, a, None, 0.3)


def test_soft_max_mask_alibi_sinks():
    """f16 mask (1, 1, 5, 37) with -inf entries and more rows than a (llama.cpp's padding), tiled over 2 heads
    and 2 sequences; ALiBi slopes (max_bias 8) on an f32 mask (1, 2, 2, 37) tiled over sequences; sinks; a
    fully masked row without sinks (NaN) and with sinks (all 0)."""
    rng = _rng(7)
    a = (rng.standard_normal((2, 2, 2, 37)) * 3).astype(np.float32)
    m = rng.standard_normal((1, 1, 5, 37)).astype(np.float16)
    m[..., 0, :9] = -np.inf
    m[..., 1, :] = -np.inf
    _check(soft_max_ext, a, m, 0.5)
    alibi_mask = np.ascontiguousarray(np.concatenate([m, m[..., ::-1, :]], 1)[:, :, :2], np.float32)
    _check(soft_max_ext, a, alibi_mask, 0.5, 8.0)
    _check(soft_max_ext, a, m, 0.5, 0.0, (rng.standard_normal(2) * 2).astype(np.float32))


def test_soft_max_long_row():
    """One row of 9000: two 8192-element buffers in the f64 sum, 71 elements per thread."""
    _check(soft_max_ext, (_rng(8).standard_normal((1, 9000)) * 30).astype(np.float32))


def test_soft_max_fallbacks(fallbacks):
    """A mask that does not tile a, ALiBi without a mask and a non-contiguous a raise the reference's errors."""
    a = _data((2, 3, 8), specials=False)
    _same_error(soft_max_ext, a, np.zeros((3, 3, 8), np.float32))
    _same_error(soft_max_ext, a, None, 1.0, 8.0)
    _same_error(soft_max_ext, a[:, :, ::2])
    assert fallbacks == ["soft_max_ext"] * 3


# -- rope --------------------------------------------------------------------------------------------------

POS = np.array([0, 7, 100, 1000, 4097], np.int32)


@pytest.mark.parametrize("mode", [ROPE_TYPE_NORMAL, ROPE_TYPE_NEOX])
@pytest.mark.parametrize("params", [dict(n_dims=12), dict(n_dims=8, freq_base=500000.0),
                                    dict(n_dims=10, ext_factor=1.0, freq_scale=0.25, n_ctx_orig=512,
                                         attn_factor=0.9, beta_fast=16.0)])
@pytest.mark.parametrize("with_ff", [False, True])
def test_rope(mode, params, with_ff):
    """x (5, 3, 12) = (n_tokens, n_head, head_dim), positions up to 4097; all dims rotated or the last 4 / 2
    copied (n_dims < head_dim); freq_factors; YaRN (ext_factor, freq_scale, attn_factor)."""
    ff = _rng(9).uniform(1, 4, 6).astype(np.float32) if with_ff else None
    _check(rope_ext, _data((5, 3, 12), specials=False), POS, ff, mode=mode, **params)


def test_rope_batch_dim_and_fallbacks(fallbacks):
    """A 4-D x (2, 5, 3, 12) (a batch of sequences); f16 x and the vision mode run the reference (which
    computes f16, and rejects vision for rope_ext's n_dims)."""
    _check(rope_ext, _data((2, 5, 3, 12), specials=False), POS, n_dims=12, mode=ROPE_TYPE_NEOX)
    _check(rope_ext, _data((5, 3, 12), specials=False).astype(np.float16), POS, n_dims=12, fell_back=True)
    _same_error(rope_ext, _data((5, 3, 12)), POS, n_dims=12, mode=ROPE_TYPE_VISION)
    assert fallbacks == ["rope_ext"]      # vision mode is refused by the op's check, before the kernel


# -- get_rows ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_get_rows_values(dtype):
    """a (2, 3, 7, 33) gathered by rows (2, 3, 5) (batch dims, repeats): f32 and i32 copied, f16 widened;
    f16 specials (signalling NaN payloads, subnormals, -0) as NumPy's cast."""
    rng = _rng(10)
    a = (rng.standard_normal((2, 3, 7, 33)) * 100).astype(dtype)
    if dtype == np.float16:
        a.reshape(-1).view(np.uint16)[:6] = [0x7C01, 0xFE01, 0x0001, 0x03FF, 0x8200, 0x8000]
    _check(mv.get_rows, a, rng.integers(0, 7, (2, 3, 5)).astype(np.int32))


@pytest.mark.parametrize("qtype", ["q4_K", "q8_0", "q5_1"])
def test_get_rows_quantized(qtype):
    """Rows 3, 0, 9, 3 of a (10, 256) quantized table: only the selected rows decoded, bit-exact."""
    w = _rng(11).standard_normal((10, 256)).astype(np.float32)
    _check(mv.get_rows, refimpl.quantize(w, qtype), np.array([3, 0, 9, 3], np.int32))


def test_get_rows_errors(fallbacks):
    """An index out of range, i64 indices and strided source rows raise the reference's errors."""
    a = _data((6, 8))
    _same_error(mv.get_rows, a, np.array([0, 6], np.int32))
    _same_error(mv.get_rows, a, np.array([0, 1], np.int64))
    _same_error(mv.get_rows, a[:, ::2], np.array([0, 1], np.int32))
    assert fallbacks == ["get_rows"] * 3


# -- device arrays between ops --------------------------------------------------------------------------------

def test_chain_stays_on_device():
    """The llama block's hot path: get_rows -> rms_norm -> mul (norm weight) -> rope, and a swiglu FFN gate, each
    op fed the previous op's device array; equal bits to the reference chain on the host."""
    rng = _rng(12)
    emb = rng.standard_normal((16, 24)).astype(np.float32)
    ids = np.array([3, 1, 15], np.int32)
    w = rng.uniform(0.5, 1.5, 24).astype(np.float32)
    x = _check(mv.get_rows, emb, ids)
    h = _check(rms_norm, x, 1e-5)
    h = _check(ew.mul, h, w)
    q = _check(rope_ext, h.reshape(3, 2, 12), POS[:3], n_dims=12, mode=ROPE_TYPE_NEOX)
    g = _check(ew.swiglu, h)
    with np.errstate(all="ignore"):
        ref = ew.mul.reference(rms_norm.reference(mv.get_rows.reference(emb, ids), 1e-5), w)
        assert_bits_equal(_device.to_host(q), rope_ext.reference(ref.reshape(3, 2, 12), POS[:3], n_dims=12,
                                                                 mode=ROPE_TYPE_NEOX), "chain: rope")
        assert_bits_equal(_device.to_host(g), ew.swiglu.reference(ref), "chain: swiglu")


# -- real GPU code -------------------------------------------------------------------------------------------

_PTX_SCRIPT = """
import sys, types
import numba.cuda.dispatcher as disp
# compile_ptx compiles the kernel for the cc given, but device functions it calls ask the current device for
# theirs: answer cc 9.0 (there is no GPU here)
disp.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
from numba import cuda
import importlib
for name in sys.argv[1:]:
    mod = importlib.import_module("refimpl.kernels.cuda." + name)
    for kernel, sig in mod.ptx_signatures():
        ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
        assert ".target sm_90" in ptx and ".entry" in ptx, (name, kernel.py_func.__name__)
        print(name, kernel.py_func.__name__, ptx.count("fma.rn.f32"))
"""


@pytest.fixture(scope="module", autouse=True)
def _ptx_compile():
    """The PTX compilation (tens of seconds of NVVM) runs in a child process while the simulator tests run."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.Popen([sys.executable, "-c", _PTX_SCRIPT, *MODULES], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def test_kernels_compile_to_ptx_for_sm90(_ptx_compile):
    """Every kernel of the five modules compiles to PTX for sm_90 (NVVM, without the simulator), and only the
    intended FMAs are there: scale's fma(a, s, b) and GELU's fma(0.044715*x, x, 1) (the reference's fma32, in
    _unary and _glu): no other a*b + c of the reference was contracted."""
    out, err = _ptx_compile.communicate(timeout=300)
    assert _ptx_compile.returncode == 0, err[-3000:]
    lines = [line.split() for line in out.splitlines()]
    n_kernels = sum(len(__import__(f"refimpl.kernels.cuda.{m}", fromlist=["x"]).ptx_signatures()) for m in MODULES)
    assert len(lines) == n_kernels
    assert {(m, k) for m, k, f in lines if f != "0"} == {("unary", "_scale"), ("unary", "_unary"), ("unary", "_glu")}
