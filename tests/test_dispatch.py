"""The dispatch's memo of accepted layouts (`op(..., layout_check=True)`): a check that reads only layouts and
scalars runs once per layout; what it rejects stays rejected, whatever was accepted before."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import refimpl
from refimpl import GGMLShapeError
from refimpl.dispatch import ACCEPTED_KEPT, OPS, op
from refimpl.testing import op_cases
from tests._profiles import examples

pytestmark = pytest.mark.property

LAYOUT_CHECKED = ["mul_mat", "rms_norm", "norm", "rope_ext", "add", "sub", "mul", "div", "flash_attn_ext"]


def _outcome(case):
    with refimpl.backend("numpy"), np.errstate(all="ignore"):
        try:
            out = case.run()
        except (GGMLShapeError, ValueError, TypeError) as e:
            return type(e), str(e)
    return "ok", np.asarray(getattr(out, "data", out)).tobytes()


def test_the_layout_checked_ops_are_these():
    """The ops whose checks were read and found to read layouts and scalars only (no index values)."""
    assert sorted(n for n, info in OPS.items() if info.layout_check) == sorted(LAYOUT_CHECKED)


@pytest.mark.parametrize("name", LAYOUT_CHECKED)
@settings(max_examples=examples(40), deadline=None)
@given(data=st.data())
def test_a_case_gives_the_same_outcome_twice(name, data):
    """Drawn cases (valid and invalid layouts) run twice: the second call, whose layout may now be remembered,
    ends as the first did (the same error, or the same bytes)."""
    case = data.draw(op_cases(name))
    assert _outcome(case) == _outcome(case)


def test_a_rejected_layout_stays_rejected():
    """Rows packed, then the transposed view of the same array: accepted once does not mean accepted for a view
    with other strides, nor for another dtype or eps."""
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    for _ in range(3):
        refimpl.rms_norm(x, 1e-6)
        with pytest.raises(GGMLShapeError, match="rms_norm"):
            refimpl.rms_norm(x.T, 1e-6)
        with pytest.raises(GGMLShapeError, match="must be f32"):
            refimpl.rms_norm(x.astype(np.float16), 1e-6)
        with pytest.raises(GGMLShapeError, match="eps"):
            refimpl.rms_norm(x, -1.0)
    w = refimpl.quantize(np.ones((6, 32), np.float32), "q4_0")
    b = np.ones((3, 32), np.float32)
    for _ in range(3):
        assert refimpl.mul_mat(w, b).shape == (3, 6)
        with pytest.raises(GGMLShapeError, match="mul_mat"):
            refimpl.mul_mat(w, np.ones((32, 3), np.float32).T)          # b's rows not contiguous
        with pytest.raises(GGMLShapeError, match="mul_mat"):
            refimpl.mul_mat(w, np.ones((3, 64), np.float32))


def test_the_memo_is_bounded_and_remembers_what_it_accepted():
    calls = []

    def check(a, eps):
        calls.append(a.shape)
        if a.dtype != np.float32:
            raise GGMLShapeError("probe: a must be f32")

    @op("layout_probe", covers=(), check=check, layout_check=True)
    def probe(a, eps):
        return a

    try:
        x = np.ones((2, 3), np.float32)
        probe(x, 0.5)
        probe(x.copy(), 0.5)                         # the same layout: not checked again
        probe(x, 0.25)                               # another scalar: checked
        assert calls == [(2, 3), (2, 3)]
        for _ in range(2):                           # rejected every time
            with pytest.raises(GGMLShapeError):
                probe(x.astype(np.float64), 0.5)
        assert len(calls) == 4
        for n in range(ACCEPTED_KEPT + 10):
            probe(np.ones(n + 1, np.float32), 0.5)
        assert len(probe.accepted_layouts) <= ACCEPTED_KEPT
        n = len(calls)
        probe(np.float32(1.0), 0.5)                  # not an ndarray, QTensor or scalar: checked every time
        probe(np.float32(1.0), 0.5)
        assert len(calls) == n + 2
    finally:
        del OPS["layout_probe"]


def test_layout_check_needs_a_check():
    with pytest.raises(ValueError, match="needs a check"):
        op("layout_probe2", covers=(), layout_check=True)


def test_a_fusion_under_tapping_runs_its_sequence_and_names_its_intermediates():
    """dispatch.tapping: the fusion's body runs (its tapped tensors are the op sequence's, bit for bit) and each
    role mapped to a name reaches the capture; a cap that records nothing (no_capture) taps nothing."""
    from refimpl.dispatch import tapping
    from refimpl.models.common import no_capture
    from refimpl.ops import add, gelu, mul_mat
    from refimpl.ops.fused import mul_mat_add_gelu
    rng = np.random.default_rng(5)
    w, x, bias = (rng.standard_normal(s).astype(np.float32) for s in ((6, 32), (3, 32), (6,)))
    got = {}
    with tapping(lambda name, t: got.setdefault(name, np.array(t)), product="up", act="up_act"):
        out = mul_mat_add_gelu(w, x, bias)
    assert sorted(got) == ["up", "up_act"]
    want_up = mul_mat(w, x)
    assert np.array_equal(got["up"], want_up)
    assert np.array_equal(got["up_act"], gelu(add(want_up, bias))) and np.array_equal(out, got["up_act"])
    with tapping(no_capture, product="up"):
        assert np.array_equal(mul_mat_add_gelu(w, x, bias), out)


def test_a_non_op_function_has_its_kernels_in_the_one_registry():
    """register(fn, backend, numerics) for a function that is not an op: kernel_for(fn) finds it under that
    backend and a profile whose chain holds one of its keys, never under the NumPy backend, and the first
    key of the chain wins (as for an op)."""
    from refimpl import dispatch

    def ref(x):                                 # a stand-in reference function
        return x

    def exact_kernel(x):
        return x

    def ggml_kernel(x):
        return x

    try:
        dispatch.register(ref, "numba", ("exact", "fast"))(exact_kernel)
        dispatch.register(ref, "numba", "ggml")(ggml_kernel)
        with refimpl.backend("numba"):
            assert dispatch.kernel_for(ref) is exact_kernel
            with refimpl.numerics("fast"):
                assert dispatch.kernel_for(ref) is exact_kernel
            with refimpl.numerics("ggml"):
                assert dispatch.kernel_for(ref) is ggml_kernel
            assert dispatch.kernel_for(lambda x: x) is None            # nothing registered: run the function
        with refimpl.backend("numpy"):
            assert dispatch.kernel_for(ref) is None
        with pytest.raises(ValueError, match="names its backend"):
            dispatch.register(ref)(exact_kernel)
    finally:
        dispatch.FUNCTIONS.pop(ref, None)


def test_every_dequantizer_kernel_is_registered_for_every_numerics_key():
    """The Numba dequantizers compute the reference's bits, so each serves every profile: a dequantize under
    the ggml profile runs the same kernel as under exact."""
    pytest.importorskip("numba", reason="the Numba kernels need numba")
    from refimpl import dispatch
    from refimpl.quants import DEQUANTIZERS
    with refimpl.backend("numba"):
        dispatch.kernel_for(DEQUANTIZERS[refimpl.GGMLType.Q4_0])        # loads the backend's kernels
        for t, fn in DEQUANTIZERS.items():
            info = dispatch.FUNCTIONS.get(fn)
            if info is None:
                continue
            assert {k for (b, k) in info.impls if b == "numba"} == set(dispatch.KEYS), t
        assert sum(fn in dispatch.FUNCTIONS for fn in DEQUANTIZERS.values()) >= 20
