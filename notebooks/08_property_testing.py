# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 08 · Property-based testing of your own kernel
#
# Suppose you wrote a kernel, a faster `mul_mat` or a new quantizer, and want to know whether it computes
# what ggml computes. refimpl gives you the two halves of a test: **the expected value** (refimpl's op, which is
# golden-tested against ggml) and **the inputs**, as [hypothesis](https://hypothesis.readthedocs.io) strategies
# that draw valid ggml-shaped tensors, views and parameters, including the nasty ones. Hypothesis runs your
# kernel on hundreds of them and, when one fails, shrinks it to the smallest failing input.
#
# We test a small `mul_mat` of our own, plant a bug in it that only some shapes reveal, and watch hypothesis
# find and shrink it.

# %%
import os
os.environ.setdefault("REFIMPL_BACKEND", "numpy")   # run the NumPy reference itself (no compiled kernels)

import matplotlib.pyplot as plt
import numpy as np
from hypothesis import HealthCheck, Verbosity, given, settings

import refimpl
from refimpl.testing import (BLOCK_KINDS, assert_bits_equal, assert_nmse, block_rows, make_block, op_cases,
                             tensors, tol)
from refimpl.testing import ggml as oracle
from exercise import check

# deterministic runs that leave no example database behind, quiet on failure (we print what we need)
SETTINGS = dict(deadline=None, derandomize=True, database=None, verbosity=Verbosity.quiet,
                suppress_health_check=list(HealthCheck))


def examples(strategy, n=6):
    """n draws of a strategy (for looking at; tests use @given)."""
    out = []

    @settings(max_examples=n, phases=["generate"], **SETTINGS)
    @given(strategy)
    def collect(x):
        out.append(x)
    collect()
    return out[:n]


# %% [markdown]
# ## What the strategies draw
#
# `tensors(types=...)` draws a ggml tensor as refimpl holds it: an ndarray or a QTensor, NumPy shape =
# reversed `ne`, and often a **view** (every other row, permuted axes, an offset into a larger buffer), the way
# ggml hands non-contiguous sources to an op:

# %%
for t in examples(tensors(types=("f32", "f16", "q4_0")), 8):
    if isinstance(t, refimpl.QTensor):
        print(f"{t!r:48} rows contiguous bytes: {t.data.flags.c_contiguous}")
    else:
        print(f"{t.dtype!s:8} ne {list(t.shape[::-1])!s:16} numpy {t.shape!s:14} strides {t.strides!s:18} "
              f"contiguous: {t.flags.c_contiguous}")

# %% [markdown]
# Values are not just Gaussian noise. Each block is one of the kinds that break block quantizers and
# reductions: all zeros, signed zeros, constants, one huge outlier, scales that overflow f16, subnormals, exact
# ties, small integers, all-positive, all-negative:

# %%
rng = np.random.default_rng(0)
fig, axs = plt.subplots(2, 6, figsize=(15, 4.2))
for ax, kind in zip(axs.flat, BLOCK_KINDS):
    ax.plot(make_block(kind, 32, rng, 0), ".", ms=4)
    ax.set_title(kind, fontsize=9)
    ax.tick_params(labelsize=6)
plt.tight_layout()
plt.show()

# %% [markdown]
# `op_cases(op)` goes one step further: it draws a complete valid call of an op (operands sharing their
# dims, parameters in the ranges ggml allows), as an `OpCase` with the refimpl call (`case.run()`), the same
# computation as a ggml graph (`case.run_ggml()`) and a name in ggml's test-backend-ops format:

# %%
for case in examples(op_cases("mul_mat"), 5):
    print(case.name)

# %% [markdown]
# ## Testing our own mul_mat
#
# Our kernel: float64 products of the dequantized operands (`np.asarray` dequantizes a QTensor), broadcasting
# `a` over `b`'s batch dims with `np.repeat`, as ggml does. It should agree with refimpl's exact mode to the
# tolerance refimpl's own property tests use for two f64 computations of one value.

# %%
def my_mul_mat(a, b, *, broadcast=np.repeat):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    a4 = a.reshape((1,) * (4 - a.ndim) + a.shape)                  # (a3, a2, n, k)
    b4 = b.reshape((1,) * (4 - b.ndim) + b.shape)                  # (b3, b2, m, k)
    r3, r2 = b4.shape[0] // a4.shape[0], b4.shape[1] // a4.shape[1]
    if broadcast is np.repeat:
        a4 = np.repeat(np.repeat(a4, r3, axis=0), r2, axis=1)      # a's batch i serves b's i*r .. i*r+r-1
    else:
        a4 = np.tile(a4, (r3, r2, 1, 1))                           # the planted bug: a's batches cycle
    out = b4 @ a4.swapaxes(-1, -2)                                 # (b3, b2, m, n)
    return out.astype(np.float32).reshape(b.shape[:-1] + (a.shape[-2],))


BOUND = tol("mul_mat", "*", "property").nmse
failures = []


def make_test(kernel, n_examples=150):
    @settings(max_examples=n_examples, **SETTINGS)
    @given(op_cases("mul_mat"))
    def test_my_mul_mat(case):
        try:
            assert_nmse(kernel(*case.args), case.run(), BOUND, case.name)
        except AssertionError:
            failures.append(case)           # hypothesis replays the shrunk example last
            raise
    return test_my_mul_mat


make_test(my_mul_mat)()
print("150 drawn cases (every weight type, views, broadcasting): all pass")

# %% [markdown]
# ## A planted bug
#
# Now the same kernel with `np.tile` in place of `np.repeat`. For 2-D operands, or when only one of `a` and
# `b` has batches, the two agree, so a hand-written test with the usual shapes would pass. Hypothesis draws
# broadcasting shapes, finds a failure, and shrinks it to the smallest input that still fails:

# %%
def buggy_mul_mat(a, b):
    return my_mul_mat(a, b, broadcast=np.tile)


failures.clear()
try:
    make_test(buggy_mul_mat)()
except AssertionError as e:
    print("hypothesis found a failure:", e)
    shrunk = failures[-1]
    a, b = shrunk.args
    print(f"shrunk to: a numpy {a.shape} (ggml ne {list(a.shape[::-1])}), b numpy {b.shape} (ggml ne {list(b.shape[::-1])})")
    print("a =", a.reshape(-1), "\nb =", b.reshape(-1))
    print("refimpl:", shrunk.run().reshape(-1), "\nbuggy:  ", buggy_mul_mat(a, b).reshape(-1))

# %% [markdown]
# The shrunk case is the essence of the bug: `k = 1`, one row each, two `a` batches and four `b` batches
# (`bs` and `nr` in the name: `a`'s batch counts and how many times `b` repeats them). With `repeat`, `b`'s
# batches 0, 1 use `a`'s batch 0 and 2, 3 use batch 1; with `tile` they alternate, so the middle two results
# are wrong. The values shrink too, to refimpl's table of simple values (1, -0.5, 0.25, -1, ...), so the
# four products can be checked by hand. And it is not refimpl's opinion: real ggml computes the same as refimpl.

# %%
if oracle.available():
    print("ggml:   ", shrunk.run_ggml().reshape(-1))
else:
    print("ggml-python is not installed: skipping the comparison with real ggml")

# %% [markdown]
# ## A block format
#
# For block formats, `block_rows(type)` draws float rows made of the adversarial block kinds above, and
# `assert_bits_equal` compares bytes (so `+0` vs `-0` or a NaN payload counts). A Q8_0 quantizer written
# from ggml's reference (`d = amax/127`, `q = roundf(x/d)`, `d` stored as f16):

# %%
def my_quantize_q8_0(x):
    b = x.reshape(-1, 32).astype(np.float32)
    amax = np.max(np.abs(b), axis=1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
        v = b * inv
        q = np.trunc(v + np.copysign(np.float32(0.5), v)).astype(np.int8)     # roundf: half away from zero
        out = np.empty((b.shape[0], 34), np.uint8)
        out[:, 0:2] = d.astype(np.float16).view(np.uint8)
    out[:, 2:] = q.view(np.uint8)
    return out.reshape(x.shape[0], -1)


drawn_kinds = []


@settings(max_examples=300, **SETTINGS)
@given(block_rows("q8_0"))
def test_my_quantize_q8_0(x):
    assert_bits_equal(my_quantize_q8_0(x), refimpl.quantize(x, "q8_0").data, "q8_0 bytes")


test_my_quantize_q8_0()
print("300 drawn tensors of adversarial Q8_0 blocks: identical bytes")

# %% [markdown]
# (Rounding ties are the classic trap here: `np.rint` rounds half to even where C's `roundf` rounds away
# from zero. Exact ties of `x/d` are rare in drawn data, though; `block_rows(..., kinds=("ties",))` and named
# cases with hand-made ties are how refimpl's own tests make sure they are reached.)
#
# To put such a test in your own suite, the README's recipe is all it takes:
#
# ```python
# from hypothesis import given
# from refimpl.testing import op_cases, assert_nmse
#
# @given(op_cases("rms_norm"))
# def test_my_rms_norm(case):
#     assert_nmse(my_rms_norm(*case.args), case.run(), 1e-7)
# ```

# %% [markdown]
# ## Try this
#
# Plant a bug of your own: make `buggy_mul_mat` drop the last product of every dot
# (`my_mul_mat(a[..., :-1], b[..., :-1])`) and run the property test again. How small is the example
# hypothesis shrinks it to, and why can no smaller one fail?

# %% [markdown]
# ## Exercises
#
# **1. Fix the bug.** Write `fixed_mul_mat(a, b)` for 4-D float32 operands `a` `(a3, a2, n, k)`, `b` `(b3, b2, m, k)`
# with ggml's broadcasting. Checked against `refimpl.mul_mat` on the shrunk failure and on grouped-query shapes.

# %%
def fixed_mul_mat(a, b):
    raise NotImplementedError   # your code here


# %% tags=["solution"] jupyter={"source_hidden": true}
def solution_fixed_mul_mat(a, b):
    r3, r2 = b.shape[0] // a.shape[0], b.shape[1] // a.shape[1]
    a = np.repeat(np.repeat(a.astype(np.float64), r3, axis=0), r2, axis=1)
    return (b.astype(np.float64) @ a.swapaxes(-1, -2)).astype(np.float32)


# %%
mm_cases = [tuple(np.asarray(x, np.float32).reshape((1,) * (4 - x.ndim) + x.shape) for x in shrunk.args),
            (rng.standard_normal((1, 3, 10, 64)).astype(np.float32), rng.standard_normal((1, 9, 4, 64)).astype(np.float32)),
            (rng.standard_normal((2, 2, 5, 8)).astype(np.float32), rng.standard_normal((4, 6, 3, 8)).astype(np.float32))]
check(fixed_mul_mat, refimpl.mul_mat, mm_cases, solution=solution_fixed_mul_mat, exact=False, rtol=1e-6)

# %% [markdown]
# **2. Decode Q4_0 on any bytes.** Write `my_dequantize_q4_0(raw)` for `(n_blocks, 18)` uint8: `d` f16, then 16
# bytes whose low nibbles are elements 0..15 and high nibbles 16..31, `x = (nibble - 8) * d`. Any bytes are a
# valid block (NaN and infinite scales included), so the cases are random bytes drawn by
# `refimpl.testing.block_bytes`, compared bit for bit (NaN equal to NaN) with `refimpl.dequantize`.

# %%
def my_dequantize_q4_0(raw):
    raise NotImplementedError   # your code here


# %% tags=["solution"] jupyter={"source_hidden": true}
def solution_dequantize_q4_0(raw):
    d = np.ascontiguousarray(raw[:, 0:2]).view(np.float16).astype(np.float32)
    qs = raw[:, 2:18]
    nib = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
    with np.errstate(invalid="ignore"):
        return (nib - 8) * d


# %%
from refimpl.testing import block_bytes  # noqa: E402


def ref_q4_0(raw):
    return refimpl.dequantize(refimpl.QTensor(refimpl.GGMLType.Q4_0, raw, (raw.shape[0], 32)))


q4_cases = [r.reshape(-1, 18) for r in examples(block_bytes("q4_0", max_rows=3, max_blocks=4), 20)]
check(my_dequantize_q4_0, ref_q4_0, q4_cases, solution=solution_dequantize_q4_0)
