"""IQ3_XXS, IQ3_S, IQ2_S, IQ1_M quantizers (refimpl.quants.iq_search) against ggml_quantize_chunk, byte for byte."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import refimpl.quants.iq_search as iq_search  # noqa: F401  (registers the quantizers)
from refimpl.quants import get_quantizer
from refimpl.testing import assert_bits_equal, block_rows, make_block
from refimpl.types import GGMLType

pytestmark = pytest.mark.property

TYPES = [GGMLType.IQ3_XXS, GGMLType.IQ3_S, GGMLType.IQ2_S, GGMLType.IQ1_M]
REF_TYPES = [GGMLType.IQ3_XXS, GGMLType.IQ3_S, GGMLType.IQ2_S]     # IQ1_M has no quantize_row_*_ref


def _check(ggml, x, t, method="chunk"):
    x = np.ascontiguousarray(x, np.float32)
    want = ggml.quantize(x, t, method).data
    nb = x.size // 256
    got = get_quantizer(t, method)(x.reshape(nb, 256)).reshape(want.shape)
    assert_bits_equal(got, want, f"{t.name} {method}")


@pytest.fixture(scope="module", autouse=True)
def _ggml_tables(ggml):
    """ggml builds its own neighbour tables on first use (IQ1_M ~10 s, IQ2_S ~5 s on one core): pay that
    once here, in setup, rather than inside whichever test happens to run first."""
    for t in TYPES:
        ggml.quantize(np.zeros((1, 256), np.float32), t, "chunk")


# Each example is a handful of blocks; one call costs ~10-20 ms here, so the ci profile's 150 examples
# run in a few seconds per type.
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@given(data=st.data())
def test_chunk_hypothesis(ggml, t, data):
    _check(ggml, data.draw(block_rows(t), label="x"), t)


@pytest.mark.parametrize("t", REF_TYPES, ids=lambda t: t.name)
@given(data=st.data())
def test_ref_hypothesis(ggml, t, data):
    _check(ggml, data.draw(block_rows(t, max_rows=2, max_blocks=2), label="x"), t, "ref")


def _fixed_blocks() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1234)
    b: dict[str, np.ndarray] = {}
    b["zeros"] = np.zeros(256)
    b["neg_zeros"] = np.full(256, -0.0)
    b["signed_zeros"] = np.where(rng.random(256) < 0.5, -0.0, 0.0)
    b["constant"] = np.full(256, 0.37)
    b["neg_constant"] = np.full(256, -2.5)
    b["ones_alternating"] = np.tile([1.0, -1.0], 128)
    v = rng.standard_normal(256) * 1e-3
    v[77] = 50.0
    b["outlier"] = v
    v = rng.standard_normal(256) * 1e-3
    v[3] = -1e11
    b["huge_outlier"] = v
    b["f16_overflow"] = rng.choice([-1, 1], 256) * 10.0 ** rng.uniform(4.8, 8, 256)
    b["subnormal"] = rng.standard_normal(256) * 1e-42
    b["tiny"] = rng.standard_normal(256) * 1e-20          # x² underflows to 0: no trial scale is accepted
    b["tiny_mixed"] = rng.standard_normal(256) * 10.0 ** rng.uniform(-30, -5, 256)
    b["large"] = rng.standard_normal(256) * 1e12
    b["ties"] = rng.integers(-8, 9, 256) * 0.5
    b["few_values"] = rng.choice([-1.0, 0.0, 1.0], 256)
    b["positive"] = np.abs(rng.standard_normal(256)) + 0.01
    b["negative"] = -np.abs(rng.standard_normal(256)) - 0.01
    # groups of zeros inside a block (IQ3_S then writes the following groups' bytes earlier)
    for name, size in (("zero_groups32", 32), ("zero_groups16", 16), ("zero_groups8", 8)):
        v = rng.standard_normal(256)
        v.reshape(-1, size)[rng.random(256 // size) < 0.4] = 0.0
        b[name] = v
    v = rng.standard_normal(256)
    v[:224] = 0.0
    b["only_last_group"] = v
    v = rng.standard_normal(256)
    v[32:] = 0.0
    b["only_first_group"] = v
    for s in range(6):                                      # real-looking rows: Gaussian, heavy tails
        b[f"gauss{s}"] = rng.standard_normal(256) * 10.0 ** rng.uniform(-3, 1)
        b[f"student{s}"] = rng.standard_t(3, 256) * 0.02
    return {k: np.asarray(v, np.float32) for k, v in b.items()}


FIXED = _fixed_blocks()


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("name", sorted(FIXED))
def test_chunk_fixed(ggml, t, name):
    _check(ggml, FIXED[name][None], t)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_chunk_many_rows(ggml, t):
    """A batch of real-looking rows, several blocks each (exercises the vectorised batch path)."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((24, 4 * 256)) * rng.uniform(0.001, 2.0, (24, 1))).astype(np.float32)
    _check(ggml, x, t)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_chunk_every_kind(ggml, t):
    """One block of every strategy kind at every decade, in one call."""
    rng = np.random.default_rng(11)
    from refimpl.testing import BLOCK_KINDS
    x = np.stack([make_block(k, 256, rng, e) for k in BLOCK_KINDS for e in range(-8, 9)])
    _check(ggml, x, t)


def test_neighbour_lists_match_bruteforce():
    """The lazily built neighbour lists equal a direct reading of ggml's rule for sampled points."""
    rng = np.random.default_rng(3)
    for name, (nlev, bits, size, nwant) in iq_search._SPECS.items():
        lat = iq_search._lattice(name)
        n, d = lat.levels.shape
        off = np.nonzero(lat.kmap < 0)[0]
        assert len(off) + n == size
        for u in rng.choice(off, 40, replace=False):
            l = (u >> (bits * np.arange(d))) & ((1 << bits) - 1)
            d2 = ((2 * lat.levels + 1 - (2 * l + 1)) ** 2).sum(1)
            order = sorted(range(n), key=lambda j: (d2[j], j))
            want, seen = [], []
            for j in order:
                if d2[j] not in seen:
                    if len(seen) == nwant:
                        break
                    seen.append(d2[j])
                want.append(j)
            got = lat.nbr[lat.start[u]:lat.start[u] + lat.ncount[u]]
            assert list(got) == want, (name, u)
