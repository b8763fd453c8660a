"""kernels/vexp.exp32_into: fl32(exp(f64 x)) vectorized, the bits of the f64 exp rounded to f32.

The polynomial's result decides the rounding only where it lies well away from an f32 rounding boundary
(the module's argument); these tests hold it to NumPy's f64 exp rounded to f32 -- the reference's own
expression -- on 10^7 drawn f32 inputs over the whole range where the result is a normal f32, dense grids
around the range edges, and the special values."""
import numpy as np
import pytest

pytest.importorskip("numba", reason="numba is not installed: refimpl.kernels is Numba code")

from refimpl.kernels import vexp  # noqa: E402
from refimpl.testing import assert_bits_equal  # noqa: E402


pytestmark = pytest.mark.equivalence

def _ref(x):
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return np.exp(x.astype(np.float64)).astype(np.float32)


def _got(x):
    out = np.empty_like(x)
    vexp.exp32(x, out)
    return out


def test_drawn_inputs_give_the_f64_exp_rounded():
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.uniform(-88, 89, 4 * 10**6), rng.standard_normal(4 * 10**6) * 4,
                        -rng.exponential(3, 2 * 10**6)]).astype(np.float32)
    assert_bits_equal(_got(x), _ref(x), "exp32 on drawn inputs")


@pytest.mark.parametrize("edge", [-104.0, -87.0, 0.0, 88.0, 89.0, 88.72283935546875, -103.97208404541016])
def test_every_f32_near_the_range_edges(edge):
    """Every f32 within 2^16 representable steps of each edge of the polynomial's range, of the f32
    subnormal / zero boundary and of the overflow threshold."""
    c = np.float32(edge).view(np.int32).astype(np.int64)
    bits = np.arange(c - 2**16, c + 2**16)
    if edge == 0.0:
        bits = np.concatenate([np.arange(0, 2**17), np.arange(0x80000000, 0x80000000 + 2**17)])
    x = bits.astype(np.uint32).view(np.float32)
    assert_bits_equal(_got(x), _ref(x), f"exp32 near {edge}")


def test_special_values():
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3.4028235e38, -3.4028235e38,
                  1e30, -1e30, 1.0, -1.0, 0.5], np.float32)
    got, ref = _got(x), _ref(x)
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    fin = ~np.isnan(ref)
    assert_bits_equal(got[fin], ref[fin], "exp32 special values")


def test_in_place_and_lengths():
    """dst may be src; any length (the vector loop's remainder) including 0."""
    rng = np.random.default_rng(3)
    for n in (0, 1, 3, 7, 8, 9, 31, 33, 1000):
        x = rng.uniform(-20, 20, n).astype(np.float32)
        want = _ref(x)
        vexp.exp32(x, x)
        assert_bits_equal(x, want, f"exp32 in place, n={n}")


# -- tanh_poly: fl32(tanh(f64 y)), the formula GELU's tanh -------------------------------------------------------

def _tanh_ref(x):
    with np.errstate(all="ignore"):
        return np.tanh(x.astype(np.float64)).astype(np.float32)


def _tanh_got(x):
    out = np.empty_like(x)
    return out, vexp.tanh32(x, out)


def test_tanh_drawn_inputs_give_the_f64_tanh_rounded():
    """10^7 drawn f32 inputs: the arguments GELU gives tanh (|y| up to ~10) and beyond; some take libm's path
    (about one in 2^18), so both passes run."""
    rng = np.random.default_rng(12)
    x = np.concatenate([rng.standard_normal(4 * 10**6) * 3, rng.uniform(-25, 25, 3 * 10**6),
                        rng.standard_normal(3 * 10**6) * 0.05]).astype(np.float32)
    got, n_libm = _tanh_got(x)
    assert_bits_equal(got, _tanh_ref(x), "tanh32 on drawn inputs")
    assert 0 < n_libm < x.size / 2**14, n_libm


@pytest.mark.parametrize("edge", [0.0, 0.0625, 20.0, 9.0109, 1e-4])
def test_tanh_every_f32_near_the_branch_edges(edge):
    """Every f32 within 2^16 representable steps of the polynomial / exp boundary (2^-4), the clamp (20), where
    fl32(tanh) reaches 1 (~9.01), of zero (subnormals included), both signs."""
    c = np.float32(edge).view(np.int32).astype(np.int64)
    bits = np.arange(max(c - 2**16, 0), c + 2**16)
    bits = np.concatenate([bits, bits | 0x80000000])
    x = bits.astype(np.uint32).view(np.float32)
    assert_bits_equal(_tanh_got(x)[0], _tanh_ref(x), f"tanh32 near {edge}")


def test_tanh_special_values():
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1.1754944e-38, 3.4028235e38,
                  -3.4028235e38, 1e30, -1e30, 1.0, -1.0, 0.5, 400.0, -400.0], np.float32)
    got, ref = _tanh_got(x)[0], _tanh_ref(x)
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    fin = ~np.isnan(ref)
    assert_bits_equal(got[fin], ref[fin], "tanh32 special values")
    assert np.array_equal(np.signbit(got[fin]), np.signbit(ref[fin]))
