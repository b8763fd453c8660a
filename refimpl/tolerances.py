"""The tolerance table: every tolerance refimpl's tests use, with its reason.

Keys are (what, type, against): `what` an op name or "quantize"/"dequantize"; `type` the tolerance type of
the case (usually the weight/first-operand type, "*" for any); `against` "ggml" (live ggml, exact mode),
"ggml-faithful", "numba", "property", ... Values are `Tol`. NMSE is ggml's test-backend-ops metric.
Ceilings from ggml's own tests (§6 of the semantics): 1e-7 default, 5e-4 for mul_mat-like ops,
1e-6 softmax. Where refimpl's entry is tighter than ggml's ceiling, the entry says so.

`nmse` is the normalised mean squared error exactly as ggml's test-backend-ops computes it:
sum((a-b)**2) / sum(b**2) over all elements, in double precision. Both live in core so that `refimpl check`
and `refimpl compare` judge with them without the test toolkit (refimpl.testing re-exports them).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def nmse(actual, expected) -> float:
    a = np.asarray(actual, np.float64)
    b = np.asarray(expected, np.float64)
    den = np.sum(b * b)
    num = np.sum((a - b) ** 2)
    return float(num / den) if den else float(num)


@dataclass(frozen=True)
class Tol:
    """One tolerance: `exact` (identical bits), or a bound on NMSE / max ULP, and why."""
    exact: bool = False
    nmse: float | None = None
    max_ulp: int | None = None
    atol: float | None = None      # element-wise bounds, for property tests against a formula
    rtol: float | None = None
    why: str = ""
    bound: object = None           # bound(*case.args) -> an element-wise bound on |actual - expected|, derived
                                   # from the op's roundings (used instead of NMSE where cancellation can make
                                   # NMSE as large as any ceiling)

    def allclose(self) -> dict:
        """keyword arguments for np.allclose / np.testing.assert_allclose"""
        return {"atol": self.atol or 0.0, "rtol": self.rtol or 0.0}


EXACT = Tol(exact=True, why="same operations in the same order: identical bits")
GGML_DEFAULT = Tol(nmse=1e-7, why="ggml test-backend-ops default ceiling")
GGML_MATMUL = Tol(nmse=5e-4, why="ggml test-backend-ops ceiling for MUL_MAT/OUT_PROD")

TOLERANCES: dict[tuple[str, str, str], Tol] = {
    # -- block formats -------------------------------------------------------------------------------
    ("dequantize", "*", "ggml"): Tol(exact=True, why="bytes in, the same f32 operations, identical floats out"),
    ("quantize", "*", "ggml"): Tol(exact=True, why="the reference quantizers are deterministic f32 code"),
    # -- element-wise, unary, glu, reductions ----------------------------------------------------------
    ("add", "f32", "ggml"): EXACT,
    ("add", "*", "ggml"): EXACT,            # f16/bf16: one f32 operation, one rounding to the storage type
    ("sub", "*", "ggml"): EXACT,
    ("mul", "*", "ggml"): EXACT,
    ("div", "*", "ggml"): EXACT,
    ("add1", "*", "ggml"): EXACT,
    ("add_id", "*", "ggml"): EXACT,
    **{(o, "*", "ggml"): EXACT for o in (      # f32 arithmetic (IEEE ops, fmin/fmax, floor..., f16 tables)
        "sqr", "sqrt", "abs", "sgn", "neg", "step", "relu", "hardsigmoid", "hardswish", "floor", "ceil",
        "round", "trunc", "reglu", "leaky_relu", "scale",
        "clamp", "fill", "tri", "arange")},
    **{(o, "*", "ggml"): Tol(exact=True, why="ggml-cpu's accumulation order and precision (sequential f64 row "
                                             "sums, f32 for f16/bf16 sum and cumsum); integer results")
       for o in ("sum", "sum_rows", "mean", "cumsum", "argmax", "count_equal")},
    ("swiglu", "f32", "ggml"): Tol(nmse=1e-12, why="silu's SIMD exp: measured per-element worst 1.3e-13"),
    **{(o, "*", "ggml"): Tol(nmse=1e-6, why="ggml-cpu reads the formula from an f16 table: the input and the "
                                             "output each rounded to f16 (2^-11 relative), so at most ~(2^-10)^2 "
                                             "against the formula's f32 steps; NMSE 8.8e-8 on uniform [-1, 1]")
       for o in ("gelu", "gelu_quick", "geglu", "geglu_quick")},
    ("swiglu_oai", "f32", "ggml"): Tol(nmse=1e-12, why="expf ulps: measured per-element worst 5.6e-14"),
    ("geglu_erf", "f32", "ggml"): Tol(nmse=1e-9, why="as gelu_erf: measured per-element worst 4.8e-10 on [-3, 6]"),
    ("silu_back", "f32", "ggml"): Tol(nmse=1e-10, why="expf ulps, 1 + x(1-s) cancels near x=-1.28: measured "
                                                      "per-element worst 8.4e-12"),
    ("xielu", "f32", "ggml"): Tol(nmse=1e-9, why="expm1f/libm params: measured tensor worst 1.9e-15; a lone "
                                                 "element at the output's zero crossing reaches 3.4e-6 (never drawn)"),
    **{(o, "f16", "ggml"): Tol(max_ulp=8192, why="at most one f16 ulp (2^13 f32 ulps) where the f32 value flips "
                                                "the rounding: 1 in ~2.5e4 geglu_erf values")
       for o in ("swiglu", "geglu_erf", "silu_back", "xielu")},
    ("xielu", "bf16", "ggml"): Tol(max_ulp=65536, why="at most one bf16 ulp (2^16 f32 ulps); 0 seen in 1e4"),
    # glibc's single-precision libm (expf, logf, sinf, cosf, tanhf, expm1f; silu: AVX2 SIMD exp) vs refimpl's
    # f64-then-round: 0.03% (sigmoid) .. 26% (silu) of f32 results differ, by <= 2-3 ulp. Bound = the worst
    # per-element relative error squared over 10^6 draws of the case range (which bounds any tensor's NMSE).
    **{(o, "f32", "ggml"): Tol(nmse=1e-12, why="libm ulps: measured per-element worst 8.8e-14 (silu), tensor "
                                               "NMSE <= 3.2e-16; 1e5x tighter than ggml's 1e-7")
       for o in ("log", "sin", "cos", "tanh", "elu", "sigmoid", "exp", "silu")},
    ("softplus", "f32", "ggml"): Tol(nmse=1e-11, why="logf(1+expf): measured per-element worst 6.5e-13"),
    ("expm1", "f32", "ggml"): Tol(nmse=1e-9, why="expf(x)-1 cancels near 0: an expf ulp is 2e-5 relative at "
                                                 "x=0.007; measured per-element worst 2.8e-10 on [-5, 5]"),
    ("gelu_erf", "f32", "ggml"): Tol(nmse=1e-9, why="1+erff cancels for x<0: measured per-element worst 4.9e-10 "
                                                    "on the case range [-3, 6] (1.4e-6 at x=-4: kept out)"),
    # f16/bf16 results: the f32 value above rounded once; an ulp of difference in f32 flips the rounding
    # about once in 2^13 (f16) / 2^16 (bf16) differing elements. max_ulp counts f32 ulps of the values.
    **{(o, "f16", "ggml"): Tol(max_ulp=8192, why="at most one f16 ulp (2^13 f32 ulps); 0 seen in ~1.5e5 values")
       for o in ("log", "sin", "cos", "tanh", "elu", "sigmoid", "exp", "silu", "softplus", "expm1", "gelu_erf")},
    **{(o, "bf16", "ggml"): Tol(max_ulp=65536, why="at most one bf16 ulp (2^16 f32 ulps); 0 seen in ~1.5e5 values")
       for o in ("log", "sin", "cos", "tanh", "elu", "sigmoid", "exp", "softplus", "expm1")},
    # -- data movement ---------------------------------------------------------------------------------
    ("get_rows", "*", "ggml"): Tol(exact=True, why="rows are copied or dequantized exactly"),
    ("get_rows_back", "*", "ggml"): Tol(exact=True, why="f32 row additions in index order, as ggml-cpu"),
    ("set_rows", "*", "ggml"): Tol(exact=True,
                                   why="ggml-cpu's from_float, bit-exact in refimpl.quantize(method='cpu')"),
    ("cpy", "*", "ggml"): Tol(exact=True, why="raw copies; conversions with ggml-cpu's own rounding/from_float"),
    ("cast", "*", "ggml"): Tol(exact=True, why="cpy's conversions"),
    ("dup", "*", "ggml"): Tol(exact=True, why="raw copy"),
    ("cont", "*", "ggml"): Tol(exact=True, why="raw copy"),
    **{(f, "*", "cuda"): Tol(nmse=1e-10, why="the fused op's sequence on the CUDA kernels (exact mode: f64 "
                             "mat-mul sums in another order at most, as llama.check.cuda)")
       for f in ("mul_mat_add", "mul_mat_add_gelu", "add_norm_affine", "attn_mha", "attn_qkv")},
    ("reshape", "*", "ggml"): Tol(exact=True, why="a view: the same bytes"),
    ("view", "*", "ggml"): Tol(exact=True, why="a view: the same bytes"),
    ("permute", "*", "ggml"): Tol(exact=True, why="a view: the same bytes"),
    ("transpose", "*", "ggml"): Tol(exact=True, why="a view: the same bytes"),
    ("repeat", "*", "ggml"): Tol(exact=True, why="tiling copies"),
    ("repeat_back", "*", "ggml"): Tol(exact=True, why="tiles summed in f32 in ggml-cpu's loop order"),
    ("concat", "*", "ggml"): Tol(exact=True, why="copies"),
    ("acc", "*", "ggml"): EXACT,
    ("set", "*", "ggml"): Tol(exact=True, why="copies"),
    ("set_1d", "*", "ggml"): Tol(exact=True, why="copies"),
    ("set_2d", "*", "ggml"): Tol(exact=True, why="copies"),
    ("pad", "*", "ggml"): Tol(exact=True, why="copies and zeros"),
    ("pad_ext", "*", "ggml"): Tol(exact=True, why="copies and zeros"),
    ("pad_reflect_1d", "*", "ggml"): Tol(exact=True, why="copies"),
    ("roll", "*", "ggml"): Tol(exact=True, why="copies"),
    ("diag", "*", "ggml"): Tol(exact=True, why="copies and zeros"),
    ("diag_mask_inf", "*", "ggml"): Tol(exact=True, why="copies and -inf"),
    ("diag_mask_zero", "*", "ggml"): Tol(exact=True, why="copies and zeros"),
    ("win_part", "*", "ggml"): Tol(exact=True, why="copies and zeros"),
    ("win_unpart", "*", "ggml"): Tol(exact=True, why="copies"),
    ("get_rel_pos", "*", "ggml"): Tol(exact=True, why="copies"),
    ("add_rel_pos", "*", "ggml"): Tol(exact=True, why="two f32 additions per element in ggml-cpu's order"),
    # -- norms, softmax, rope, attention, losses -------------------------------------------------------
    ("rms_norm", "f32", "ggml"): EXACT,
    ("norm", "f32", "ggml"): Tol(nmse=1e-11, why="ggml's AVX2 kernel pre-adds the squares 8 at a time in f32; "
                                 "measured max NMSE 2.0e-14 (3 ulp) over 314 cases; tighter than ggml's 1e-7"),
    ("norm", "f32_strided_rows", "ggml"): Tol(nmse=1e-8, why="strided rows: ggml-cpu's scalar path sums in f32; "
                                              "measured 1.1e-9 for 300-element rows of mean 100; ggml's 1e-7"),
    ("l2_norm", "f32", "ggml"): EXACT,
    ("group_norm", "f32", "ggml"): EXACT,
    ("rms_norm_back", "f32", "ggml"): EXACT,
    ("soft_max_ext", "f32", "ggml"): Tol(nmse=1e-12, why="ggml-cpu's SIMD exp is within 1.5 ulp of expf; measured "
                                         "max NMSE 1.6e-14 (5 ulp) over 311 cases; tighter than ggml's 1e-6"),
    ("soft_max_ext_back", "f32", "ggml"): Tol(bound=lambda dy, y, scale, max_bias: _soft_max_back_bound(dy, y, scale),
                                              why="ggml-cpu sums the dot y.dy in f32 (8 lanes), exact mode in f64, "
                                              "then dy - dot cancels where y is nearly one-hot and dy_i near the "
                                              "dot: the dots' difference (<= (gamma_n + u) sum|y dy|) over the "
                                              "difference, unbounded in NMSE (a drawn row y ~ [0.99924, 0.00076] "
                                              "gave 1.4e-7 > ggml's ceiling 1e-7); element-wise: "
                                              "|scale y_i| ((gamma_n + u) S + 4u (|dy_i| + S)), doubled"),
    ("soft_max_ext", "f32", "property"): Tol(nmse=1e-11, why="vs f64 softmax: f32 roundings of w, of w - M (an ulp "
                                             "of |w| in the exponent), of e and of 1/sum"),
    ("soft_max_ext_back", "f32", "property"): Tol(nmse=1e-11, why="vs f64 J^T dy, relative to the terms' size"),
    **{(o, "f32", "ggml"): Tol(nmse=1e-12, why="same f32 theta recurrence; ggml fuses one product of each rotation "
                                "into an FMA and uses libm cosf/sinf: measured max NMSE 9.7e-15 over 2700 cases of "
                                "the four rope ops; tighter than ggml's 1e-7")
       for o in ("rope_ext", "rope_multi", "rope_ext_back", "rope_multi_back")},
    **{(o, "f16", "ggml"): Tol(nmse=1e-7, why="f16 outputs: where the f32 results are an ulp apart one f16 ulp can "
                                "flip: measured max NMSE 1.0e-9 over 1300 cases (one flip in >= 64 elements stays "
                                "< 2e-8); ggml's ceiling")
       for o in ("rope_ext", "rope_multi", "rope_ext_back", "rope_multi_back")},
    ("rope_ext", "f32", "property"): Tol(nmse=1e-12, why="pair norms / inverse: f32 cos, sin and rotations"),
    ("rope_ext_relative", "f32", "property"): Tol(nmse=1e-8, why="q.k after rope depends on p - p' only up to "
                                                  "the f32 theta (an ulp is p * 6e-8 rad, p < 1037); per |q||k|"),
    # flash_attn_ext against its f64 reference: an element-wise bound (_flash_attn_bound), since NMSE is a
    # ratio that cancellation in sum_j p_j v_j makes as large as it likes (CI drew a 34-key, head_dim-1 row of
    # the f32 CUDA kernel at NMSE 1.8e-12 > the 1e-12 an earlier entry allowed); one entry per summation order
    ("flash_attn_ext", "f32", "property"): Tol(
        bound=lambda *a, **kw: _flash_attn_bound(*a, u=2.0 ** -24, dot="rounded", **kw),
        why="mul_mat (an f64 dot rounded once), soft_max_ext in f32 steps, mul_mat of p and v rounded once: "
            "an ulp of each score, f32 roundings of w - M, exp, 1/sum and the output"),
    ("flash_attn_ext", "f32", "f32-online"): Tol(
        bound=lambda *a, **kw: _flash_attn_bound(*a, u=2.0 ** -24, dot="f32", **kw),
        why="an f32 online softmax (refimpl/kernels/cuda): q.k summed in f32 over head_dim in any order, "
            "exp(s - m_tile), the running sum and accumulator rescaled once per tile of kv positions"),
    ("flash_attn_ext", "f32", "f64-kernel"): Tol(
        bound=lambda *a, **kw: _flash_attn_bound(*a, u=2.0 ** -53, dot="f32", **kw),
        why="the reference's f64 formula in another summation order (refimpl/kernels/attention.py): f64 "
            "roundings in any order, one f32 rounding of each output on either side"),
    # ggml 0.25.3's additions, against their older forms or the math in f64 (tests/ops/test_ggml_0_25.py)
    ("glu", "bf16", "vs-f32"): Tol(rtol=2.0 ** -7, atol=0.05, why="bf16 rows (8 significant bits) in and out: "
                                   "half an ulp of each input moves act(x)*g by about 2**-8 relative; near-zero "
                                   "outputs by up to |g| times GELU's slope at 0.5 ulp of x"),
    ("swiglu_clamp", "f32", "vs-oai"): Tol(rtol=1e-6, why="the same f32 steps as swiglu_oai with alpha 1, whose "
                                            "up half (u - 1) + 1 is u up to the rounding of u - 1"),
    ("xielu", "f32", "stored"): Tol(rtol=1e-6, atol=1e-6, why="op_params' f32 an, ap against softplus in f32 "
                                     "steps: an ulp of an or ap"),
    ("dsv4_hc_comb", "f32", "sinkhorn"): Tol(atol=1e-5, why="after the last per-dst normalization the columns sum "
                                              "to sum/(eps + sum) = 1 - 4e-6 at eps 1e-6, plus f32 rounding"),
    ("dsv4_hc_comb", "f32", "sinkhorn-rows"): Tol(atol=1e-3, why="20 Sinkhorn rounds leave the per-src sums within "
                                                   "1e-4 of 1 on these logits; 1e-3 keeps a margin"),
    ("lightning_indexer", "f32", "property"): Tol(rtol=1e-5, atol=1e-5, why="f32 q.k per head (rounded once from "
                                                  "f64), then a 4-head f64 sum rounded once: an ulp or two of "
                                                  "each term"),
    ("dsv4_hc_pre", "f32", "property"): Tol(rtol=1e-5, atol=1e-5, why="4-term f32 sums (and f32 sigmoids) vs "
                                             "f64: a few ulps of values of order 1"),
    ("opt_step_adamw", "f32", "ggml"): Tol(exact=True, why="f32 steps with ggml-cpu's FMAs: 153 of 153 cases "
                                           "bit-identical (a', m' and v')"),
    ("opt_step_sgd", "f32", "ggml"): Tol(exact=True, why="one FMA per element, as ggml-cpu: 152 of 152 cases "
                                         "bit-identical"),
    ("cross_entropy_loss", "f32", "ggml"): Tol(nmse=1e-10, why="ggml-cpu adds the row sums in f32: measured max "
                                               "NMSE 8.6e-14 (3 ulp) over 307 cases (<= 64 rows); ggml's 1e-7"),
    ("cross_entropy_loss_back", "f32", "ggml"): Tol(nmse=1e-12, why="ggml-cpu's SIMD exp: measured max NMSE "
                                                    "1.6e-14 over 305 cases; tighter than ggml's 1e-7"),
    ("cross_entropy_loss", "f32", "property"): Tol(nmse=1e-12, why="vs the f64 formula: f32 log-softmax terms"),
    ("cross_entropy_loss_back", "f32", "property"): Tol(nmse=1e-12, why="vs f64 (softmax - labels)*g/nr"),
    ("flash_attn_ext", "f16", "ggml"): Tol(nmse=2e-4, why="ggml-cpu rounds q to f16 and accumulates F16 V in f16 "
                                           "(< 64 queries): measured max NMSE 3.8e-5 over 505 cases; ggml's 5e-4"),
    ("flash_attn_ext", "bf16", "ggml"): Tol(nmse=2e-4, why="ggml-cpu rounds q to bf16 (and F16 V accumulates in "
                                            "f16): measured max NMSE 4.0e-5 over 246 cases; ggml's 5e-4"),
    ("flash_attn_ext", "f32", "ggml"): Tol(nmse=1e-4, why="F32 K: q stays f32, an F16 V still accumulates in f16: "
                                           "measured max NMSE 1.6e-5 over 494 cases; ggml's 5e-4"),
    ("flash_attn_ext", "q8_0", "ggml"): Tol(nmse=5e-4, why="ggml-cpu quantizes q to Q8_0 blocks: measured max NMSE "
                                            "1.4e-4 over 570 cases (scale 1 at head_dim 128); ggml's ceiling"),
    ("flash_attn_ext", "q4_0", "ggml"): Tol(nmse=5e-4, why="ggml-cpu quantizes q to Q8_0 blocks: measured max NMSE "
                                            "5.0e-5 over 490 cases; ggml's ceiling"),
    ("rms_norm", "f32", "property"): Tol(nmse=1e-12, why="mean(out^2) = ms/(ms+eps): f32 rounding of out only"),
    ("norm", "f32", "property"): Tol(nmse=1e-10, why="var(out) = var/(var+eps): f32 mean and centring"),
    ("l2_norm", "f32", "property"): Tol(nmse=1e-12, why="unit row norms: f32 rounding of out only"),
    ("group_norm", "f32", "property"): Tol(nmse=1e-10, why="= norm over the flattened group: f32 mean and "
                                            "centring in another summation order (as norm's bound; measured "
                                            "up to 4.1e-12 on groups of a few close values)"),
    ("rms_norm_back", "f32", "property"): Tol(nmse=1e-11, why="vs the f64 analytic gradient: f32 roundings"),
    # -- mul_mat, out_prod, convolution, pooling ------------------------------------------------------
    ("mul_mat", "*", "ggml"): GGML_MATMUL,
    # mul_mat / mul_mat_id, exact mode vs ggml-cpu, which first converts f32 b to the weight's vec_dot_type
    # (f16, bf16, Q8_0/Q8_1/Q8_K blocks): the tests draw >= 64 outputs for those cases (a handful of outputs
    # makes NMSE a ratio of two small sums with an unbounded tail). type: (max NMSE, measured max over 100
    # mul_mat / 60 mul_mat_id cases); quantized types sit at 1-4e-5, ~4x under the entry, 2.5x under ggml's 5e-4
    **{(op, t, "ggml"): Tol(nmse=v, why=f"measured max {m1:.1e} (mul_mat), {m2:.1e} (mul_mat_id): f64 dots "
                                        f"of b as given vs ggml-cpu's f32 dots of b in {t}'s vec_dot_type")
       for t, (v, m1, m2) in {
        "f32": (1e-10, 4.0e-14, 1.3e-12),
        "f16": (5e-7, 5.1e-08, 7.9e-08),
        "q4_0": (2e-4, 2.5e-05, 2.3e-05),
        "q4_1": (2e-4, 3.2e-05, 2.8e-05),
        "q5_0": (2e-4, 2.4e-05, 2.4e-05),
        "q5_1": (2e-4, 2.4e-05, 3.5e-05),
        "q8_0": (2e-4, 2.3e-05, 2.7e-05),
        "q2_K": (2e-4, 2.4e-05, 3.4e-05),
        "q3_K": (2e-4, 2.4e-05, 2.4e-05),
        "q4_K": (2e-4, 2.1e-05, 2.9e-05),
        "q5_K": (2e-4, 2.4e-05, 2.8e-05),
        "q6_K": (2e-4, 2.6e-05, 2.5e-05),
        "iq2_xxs": (2e-4, 2.8e-05, 5.9e-05),
        "iq2_xs": (2e-4, 3.1e-05, 3.9e-05),
        "iq3_xxs": (2e-4, 2.8e-05, 3.1e-05),
        "iq1_s": (2e-4, 3.0e-05, 3.2e-05),
        "iq4_nl": (2e-4, 2.4e-05, 2.4e-05),
        "iq3_s": (2e-4, 3.1e-05, 3.2e-05),
        "iq2_s": (2e-4, 3.2e-05, 3.2e-05),
        "iq4_xs": (2e-4, 2.3e-05, 2.5e-05),
        "iq1_m": (2e-4, 3.1e-05, 3.0e-05),
        "bf16": (3e-5, 4.0e-06, 5.0e-06),
        "tq1_0": (2e-4, 2.5e-05, 2.8e-05),
        "tq2_0": (2e-4, 2.8e-05, 3.0e-05),
        "mxfp4": (2e-4, 3.6e-05, 2.9e-05),
        "nvfp4": (2e-4, 2.3e-05, 1.8e-05),
        "q1_0": (2e-4, 2.1e-05, 2.5e-05),
       }.items() for op in ("mul_mat", "mul_mat_id")},
    ("out_prod", "*", "ggml"): Tol(nmse=1e-10, why="tighter than ggml's 5e-4: measured max 1.0e-13 over 360 "
                                   "cases (k up to 1025); ggml sums over k in f32, refimpl in f64"),
    ("solve_tri", "f32", "ggml"): Tol(bound=lambda a, b: _solve_tri_bound(a, b),
                                      why="ggml substitutes forward in f32, exact mode in f64 rounded once: "
                                      "measured NMSE <= 6.3e-14 for normal values, but where x is subnormal "
                                      "ggml's f32 steps keep few bits (a drawn case with x ~ 1e-43: NMSE "
                                      "2.4e-5), so element-wise: f32 substitution's error |L^-1| (gamma_{n+1} "
                                      "|L| |x| + (2n+1) 2^-150 |diag L|) plus one rounding of x, doubled"),
    ("im2col", "*", "ggml"): Tol(exact=True, why="a gather: values copied (f32) or rounded once to f16, as ggml"),
    ("im2col_3d", "*", "ggml"): Tol(exact=True, why="a gather: values copied (f32) or rounded once to f16"),
    ("im2col_back", "*", "ggml"): Tol(exact=True, why="f32 sums over (kh, kw) in ggml-cpu's order"),
    ("col2im_1d", "*", "ggml"): Tol(exact=True, why="f32 sums over t_in in ggml-cpu's order, one rounding to "
                                    "f16/bf16"),
    ("pool_1d", "*", "ggml"): Tol(exact=True, why="f32 max / sum / divide in ggml-cpu's order"),
    ("pool_2d", "*", "ggml"): Tol(exact=True, why="f32 max / sum / divide in ggml-cpu's order"),
    ("pool_2d_back", "*", "ggml"): Tol(exact=True, why="f32 scatter-adds in ggml-cpu's order"),
    ("interpolate", "nearest", "ggml"): Tol(exact=True, why="nearest: a gather with ggml's f32 index math"),
    ("upscale", "nearest", "ggml"): Tol(exact=True, why="nearest: a gather with ggml's f32 index math"),
    ("interpolate", "f32", "ggml"): Tol(nmse=1e-10, why="tighter than ggml's 1e-7: measured max 1.1e-12 "
                                        "(bicubic); f32 taps as ggml, weighted sums in f64 (ggml: f32 with FMAs)"),
    ("upscale", "f32", "ggml"): Tol(nmse=1e-10, why="as interpolate: measured max 4.0e-13"),
    ("timestep_embedding", "f32", "ggml"): Tol(nmse=1e-13, why="tighter than ggml's 1e-7: measured max 4.4e-16, "
                                               "f64 libm rounded to f32 vs glibc's f32 cosf/sinf/expf (<= 1 ulp)"),
    # convolutions: dot products in f64 vs ggml's f32 SIMD dots (data already rounded to f16 for f16 kernels
    # in both); f16 x f16 products are exact, so those cases often match bit for bit
    ("conv_1d", "f16", "ggml"): Tol(nmse=1e-10, why="tighter than ggml's 5e-4: measured 0 (bit-identical) "
                                    "over 100 cases"),
    ("conv_1d_dw", "f16", "ggml"): Tol(nmse=1e-10, why="tighter than ggml's 5e-4: measured 0 over 100 cases"),
    ("conv_2d_dw", "f16", "ggml"): Tol(nmse=1e-10, why="tighter than ggml's 5e-4: measured 0 over 100 cases"),
    ("conv_2d", "*", "ggml"): Tol(nmse=1e-10, why="tighter than ggml's 5e-4: measured max 1.6e-14 (f32), "
                                  "6.5e-15 (f16)"),
    ("conv_2d_direct", "*", "ggml"): Tol(nmse=1e-10, why="tighter than ggml's 5e-4: as conv_2d, 1e-14"),
    ("conv_2d_dw_direct", "f32", "ggml"): Tol(nmse=1e-10, why="tighter than ggml's 1e-7: measured max 1.2e-14"),
    ("conv_3d", "*", "ggml"): Tol(nmse=1e-10, why="tighter than ggml's 5e-4: measured max 1.3e-14"),
    ("conv_3d_direct", "*", "ggml"): Tol(nmse=1e-10, why="tighter than ggml's 5e-4: measured max 1.2e-14"),
    ("conv_transpose_1d", "*", "ggml"): Tol(nmse=1e-10, why="tighter than ggml's 1e-7: measured max 1.1e-14"),
    ("conv_transpose_2d_p0", "*", "ggml"): Tol(nmse=1e-10, why="tighter than ggml's 5e-4: measured max 1.2e-14"),
    ("conv_1d_ph", "f16", "ggml"): Tol(nmse=1e-10, why="conv_1d with p0 = K/2: as conv_1d"),
    ("conv_1d_dw_ph", "f16", "ggml"): Tol(nmse=1e-10, why="conv_1d_dw with p0 = K/2: as conv_1d_dw"),
    ("conv_2d_sk_p0", "*", "ggml"): Tol(nmse=1e-10, why="conv_2d with fixed parameters: as conv_2d"),
    ("conv_2d_s1_ph", "*", "ggml"): Tol(nmse=1e-10, why="conv_2d with fixed parameters: as conv_2d"),
    ("upscale_ext", "nearest", "ggml"): Tol(exact=True, why="interpolate under its older name: as interpolate"),
    ("upscale_ext", "f32", "ggml"): Tol(nmse=1e-10, why="interpolate under its older name: as interpolate"),
    # properties (tests/ops/test_matmul.py, test_conv.py): two f64 computations of one value, each rounded once
    ("mul_mat", "*", "property"): Tol(nmse=1e-12, why="f64 sums in different orders, one f32 rounding each"),
    # numerics="fast" vs exact mode (tests/test_numerics_fast.py): a bound per element, not a metric. fast sums the
    # f32 products of the exactly dequantized weights w and the f32 activations b in f32, in any order (BLAS
    # sgemm, 32-lane decode kernels); exact is the f64 sum rounded once. With S = sum_i |w_i b_i| (in f64, from
    # refimpl.dequantize) over the k terms of one dot and gamma_k(u) = k u / (1 - k u):
    #     |fast - exact| <= gamma_k(2^-24) S                       f32 sum in any order (Higham, Thm 3.1)
    #                     + gamma_k(2^-53) S + spacing(|exact|)    exact's f64 sum and its one f32 rounding
    #                     + k 2^-149                               gradual underflow of the f32 products
    **{(o, "*", "fast"): Tol(why="element-wise formula, no Tol field: |fast - exact| <= (gamma_k(2^-24) + "
                                 "gamma_k(2^-53)) * sum_i |w_i b_i| + spacing(|exact|) + k * 2^-149, gamma_k(u) "
                                 "= k u / (1 - k u), k the dot length: f32 sums in any order vs the f64 sum "
                                 "rounded once; measured worst |fast - exact| / bound 0.50 over 2,900 drawn cases "
                                 "(1.3e6 outputs, both backends), typically < 0.07")
       for o in ("mul_mat", "mul_mat_id")},
    ("solve_tri", "*", "property"): Tol(nmse=1e-10, why="residual of A x = b with x rounded to f32"),
    ("conv_2d", "*", "property"): Tol(nmse=1e-12, why="f64 sums in different orders, one f32 rounding each"),
    # -- element-wise bounds of property tests (formula identities, not golden values) -----------------
    ("soft_max_ext", "f32", "alibi-slopes"): Tol(rtol=1e-7, why="slopes m0^(h+1) are powf in f32: one "
                                                 "rounding from the f64 powers of two and four"),
    ("sigmoid", "f32", "symmetry"): Tol(atol=2.0 ** -23, why="sigmoid(x) + sigmoid(-x) = 1 with each term "
                                        "rounded once to f32: within one ulp of 1"),
    ("interpolate", "f32", "corners"): Tol(atol=1e-6, why="align-corners bilinear returns the corner inputs "
                                           "up to the f32 rounding of its weights (inputs in [-1, 1])"),
    ("timestep_embedding", "f32", "unit-circle"): Tol(atol=1e-6, why="cos^2 + sin^2 = 1 and cos(t) with f32 "
                                                      "cosf/sinf of arguments up to 1000 (ulp 6e-5 rad)"),
    ("cross_entropy_loss", "f32", "gibbs"): Tol(atol=1e-4, rtol=1e-4, why="log of labels as f32 logits and "
                                                "f32 log-softmax: the loss reaches the label entropy to ~1e-5"),
    ("cross_entropy_loss_back", "f32", "finite-differences"): Tol(atol=1e-6, why="central differences with "
                                                                 "h = 1e-6 in f64 vs the f32 gradient"),
    ("l2_norm", "f32", "eps"): Tol(rtol=1e-6, why="x * fl(1/eps): one f32 rounding of the reciprocal and one "
                                   "of the product"),
    # -- models ---------------------------------------------------------------------------------------
    ("llama.forward", "f32", "prefill"): Tol(nmse=1e-10, why="token-by-token, chunked and one-shot prefill "
                                              "differ only in f64-summed dot products over different lengths"),
    ("llama.fast", "*", "exact"): Tol(nmse=1e-11, why="numerics='fast' vs exact logits, tiny random Llamas "
                                      "(tests/models/tiny.py), 16 tokens, prefill and token by token, both "
                                      "backends: measured max 9.8e-14 (max |d| 1.7e-6, logits rms ~1) over f32, "
                                      "f16, q8_0, q4_0, q4_1, q5_1 x 3 seeds; ~100x margin. Argmax equal: the "
                                      "smallest top-2 gap seen, 7.2e-5, is 40x the largest |d|; 24 greedy "
                                      "tokens identical, smallest gap on the path 2.6e-3"),
    ("llama.forward", "q4_1", "llama.cpp"): Tol(nmse=4e-3, why="exact mode vs llama.cpp on SmolLM2 Q4_1, last "
                                                "prompt position: measured 4.2e-5 .. 2.7e-3 "
                                                "(max |d| 0.55 .. 1.15 logits) "
                                                "over the 5 golden prompts, dominated by llama.cpp's Q8_1 activation "
                                                "quantization (an f16 KV cache changes it by <1%). Looser than ggml's "
                                                "2e-3 model-test ceiling, which compares backends with identical "
                                                "numerics; the faithful mode is the one to meet it"),
    ("gemma3.forward", "q4_k_m", "llama.cpp"): Tol(nmse=4e-3, why="exact mode vs llama.cpp on Gemma 3 270M Q4_K_M "
                                                   "(tests/models/test_gemma3.py): llama.cpp's top-16 logits at every "
                                                   "teacher-forced position of 8 prompts, measured 1.1e-4 .. 1.4e-3 "
                                                   "(max |d| 0.56 .. 3.2 on logits up to ~40), llama.cpp's Q8_K / Q8_0 "
                                                   "activation rounding over 18 layers; numerics='ggml' is the "
                                                   "bit-identical mode"),
    # tiny random Llamas (tests/models/test_llama_tiny_golden.py), all positions x whole vocab, exact mode vs
    # llama.cpp; emulating ggml-cpu's activation conversions takes every model below 1e-7 (Q8_0/Q4_0: 4e-15)
    ("llama.forward", "f32", "llama.cpp"): Tol(nmse=2e-7, why="measured 3.9e-8, 4.8e-8 (max |d| 0.012): "
                                               "llama.cpp's f16 KV cache and the f16 conversion of Q and KQ "
                                               "in the attention products"),
    ("llama.forward", "f16", "llama.cpp"): Tol(nmse=1e-6, why="measured 2.0e-7 (max |d| 0.020): F16 weights "
                                               "multiply f16-rounded activations, plus the f16 attention"),
    ("llama.forward", "q8_0", "llama.cpp"): Tol(nmse=1e-3, why="measured 2.2e-4 (max |d| 0.058): Q8_0 "
                                                "activation quantization before every weight mat-mul"),
    ("llama.forward", "q4_0", "llama.cpp"): Tol(nmse=1e-3, why="measured 1.3e-4 (max |d| 0.44 of logits with "
                                                "rms 9): Q8_0 activation quantization, as q8_0"),
    # tiny random gpt-oss models (tests/models/test_gpt_oss.py), 32 positions x whole vocab, exact mode vs
    # llama.cpp; numerics="ggml" gives llama.cpp's bits on all of them
    ("gpt_oss.forward", "mxfp4", "llama.cpp"): Tol(nmse=1e-3, why="measured 1.6e-4, 1.5e-4, 1.5e-4 (YaRN) "
                                                   "(max |d| 0.07): MXFP4 experts multiply Q8_0-quantized "
                                                   "activations in llama.cpp (as q4_0 Llamas: 1.3e-4)"),
    ("gpt_oss.forward", "f32", "llama.cpp"): Tol(nmse=2e-7, why="measured 6.1e-8 (max |d| 0.001): as "
                                                 "llama.forward f32, the f16 KV cache and the f16 Q and KQ of "
                                                 "the attention products"),
    # -- llama2.c -------------------------------------------------------------------------------------
    ("llama2c.forward", "f32", "f64"): Tol(nmse=1e-11, why="vs run.c forward in f64: measured max 4.3e-14, 30 models"),
    # -- recurrent, state-space, sorting ---------------------------------------------------------------
    ("ssm_conv", "f32", "ggml"): Tol(
        bound=lambda sx, c: _ssm_conv_bound(sx, c, sides=2),
        why="bits match when d_conv % 4 == 0, else GCC fuses the last d_conv % 4 terms (FMA): two f32 sums of "
            "d_conv products, each within gamma_d_conv sum|x c| of the exact one (measured NMSE max 1.1e-14 "
            "over 330 cases; an NMSE ceiling is no bound where the terms cancel)"),
    ("ssm_scan", "f32", "ggml"): Tol(nmse=1e-7, why="ggml's default ceiling; measured max 8.6e-14 over 155 "
                                     "cases (FMA-fused state updates, Mamba-2's AVX2 lane sums vs f64 here)"),
    ("rwkv_wkv6", "f32", "ggml"): Tol(exact=True, why="the kernel's f32 products and FMAs in its order (FMA "
                                      "emulated exactly): identical bits in all 154 measured cases, head sizes 1-64"),
    ("gated_linear_attn", "f32", "ggml"): Tol(nmse=1e-7, why="ggml's default ceiling; measured max 7.9e-15 "
                                              "over 154 cases: bits match for head sizes % 8 == 0; the scalar "
                                              "remainder is GCC-contracted differently (fma(v, k, s*g))"),
    ("rwkv_wkv7", "f32", "ggml"): Tol(nmse=1e-7, why="ggml's default ceiling, tighter than its 5e-3 for WKV7; "
                                      "measured max 6.1e-15 over 154 cases (AVX2 lane sums vs f64 here)"),
    ("gated_delta_net", "f32", "ggml"): Tol(nmse=1e-7, why="ggml's default ceiling; measured max 1.2e-14 over "
                                            "177 cases (ggml_vec_dot_f32's AVX2 lane sums vs f64 here)"),
    ("argsort", "f32", "ggml"): Tol(exact=True, why="the same permutation once the case's post puts ggml's "
                                    "(unspecified) order of equal values in index order"),
    ("top_k", "f32", "ggml"): Tol(exact=True, why="the same indices once the case's post checks ggml's answer "
                                  "is a valid top k and puts it in canonical order (ggml's is unspecified)"),
    ("argsort_top_k", "f32", "ggml"): Tol(exact=True, why="as top_k: valid answers put in canonical order"),
    ("ssm_conv", "f32", "property"): Tol(
        bound=lambda sx, c: _ssm_conv_bound(sx, c, sides=1),
        why="vs f64 np.convolve: d_conv products rounded to f32 and summed in f32, within gamma_d_conv sum|x c| "
            "(an NMSE of 1e-10 failed a drawn one-output row whose 3 terms cancel: 1.1e-10)"),
    ("ssm_scan", "f32", "property"): Tol(
        bound=lambda y_abs, steps, depth, per_step: _linear_recurrence_bound(y_abs, steps, depth, per_step),
        why="vs the f64 recurrence on |s|, |x|, |B|, |C| (dt and A as they are): as rwkv's, with per_step "
            "roundings a token = 5 + the decay's and the step's relative errors in ulps: ggml's softplus "
            "log(fl(1 + expf(dt))) is off by <= 2u + u d absolute, so exp(d A) by 1 + |A|(2 + 2d) ulps and "
            "x d B by 3 + 2/d (measured NMSE max 6.2e-12 on dt in [-3, 3]; no bound where states cancel)"),
    **{(o, "f32", "property"): Tol(
        bound=lambda y_abs, steps, depth: _linear_recurrence_bound(y_abs, steps, depth),
        why="vs the f64 formula: an f32 state updated with at most depth + 5 roundings a token, decays in [0, 1], "
            "so every output and state is within gamma_((steps + 1)(depth + 5)) of the same formula on |inputs| "
            "(NMSE, measured ~1e-14, is no bound where a state's terms cancel)")
       for o in ("rwkv_wkv6", "gated_linear_attn", "rwkv_wkv7")},
    ("rwkv_wkv4", "f32", "property"): Tol(
        bound=lambda k, v, w, u: _wkv4_bound(k, v, w, u),
        why="vs the f64 weighted average: BlinkDL's rescaled form in f32 keeps each weight within a relative "
            "expm1 of the exponents' roundings per token (|exponent| <= T|w| + max|k| + |u|, NumPy's f32 exp "
            "<= 4 ulp), so each output within 2 eta max|v| (measured NMSE max 8.6e-15; no bound where the "
            "values cancel)"),
    ("gated_delta_net", "f32", "property"): Tol(
        bound=lambda m_rows, v_abs, S: _delta_rule_bound(m_rows, v_abs, S),
        why="vs the f64 delta rule: with |k| = 1, beta in [0, 1] and gates <= 1 each token's transition "
            "M -> M g (I - beta k k^T) is a contraction, so a row's error grows by at most its own roundings, "
            "gamma_(S+8) of the row's norm and |v| a token (measured NMSE max 1.2e-14; no bound where a row "
            "cancels)"),
    # -- numerics="ggml" (refimpl/ops/faithful, docs/numerics.md) vs live ggml on the portable AVX2 build -----
    **{("mul_mat", t, "ggml-faithful"): Tol(exact=True, why="ggml-cpu's activation conversion and AVX2 vec_dot "
                                           "order (8-lane FMAs, its horizontal sums), FMA rounded once")
       for t in ("f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K",
                 "q6_K", "iq4_nl", "iq4_xs", "mxfp4", "nvfp4", "q1_0", "tq1_0", "tq2_0", "iq2_xxs", "iq2_xs",
                 "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m")},
    ("rms_norm", "*", "ggml-faithful"): Tol(exact=True, why="sequential f64 sum of squares, as ggml-cpu"),
    **{(o, "*", "ggml-faithful"): Tol(exact=True, why="ggml-cpu's 65536-entry f16 table (GGML_GELU_FP16), which "
                                                       "the ggml profile reads as ggml-cpu does")
       for o in ("gelu", "gelu_quick", "geglu", "geglu_quick")},
    ("norm", "*", "ggml-faithful"): Tol(exact=True, why="sequential f64 row sum; squares pre-added 8 at a time "
                                        "(hsum_float_8), the scalar f32 path for strided rows"),
    ("soft_max_ext", "*", "ggml-faithful"): Tol(exact=True, why="AVX2 SIMD exp on 8-lane chunks, libm expf on the "
                                                "tail, chunk sums in f32, libm powf ALiBi slopes"),
    ("rope_ext", "*", "ggml-faithful"): Tol(exact=True, why="libm powf/logf/cosf/sinf, GCC's FMA contractions "
                                            "of the rotation (NORMAL's odd last pair unfused)"),
    **{(o, "*", "ggml-faithful"): Tol(exact=True, why="AVX2 SIMD silu on 8-lane chunks of each row, libm "
                                      "expf on the tail (f16: libm throughout)") for o in ("silu", "swiglu")},
    # -- rwkv (tests/models/test_rwkv_*.py): logits and every state array, NMSE per array ----------------------
    ("rwkv.forward", "f32", "rwkv"): Tol(nmse=1e-11, why="vs the rwkv pip package (ChatRWKV, cpu fp32), tiny "
                                         "v4/v5.0/5.1/5.2 models, one call, token by token and split: measured "
                                         "max 1.7e-13 for logits (max |d| 4.3e-6, 5.1e-7 of max |logit|), 1.1e-13 "
                                         "for states (max |d| 6.0e-6): torch's f32 sums vs f64-summed mul_mat"),
    ("rwkv.forward", "f32", "transformers"): Tol(nmse=1e-11, why="vs transformers' RwkvForCausalLM f32 CPU (v4): "
                                                 "measured 7.7e-14 for logits (max |d| 1.8e-6), 2.3e-14 for the "
                                                 "state (max |d| 1.7e-6)"),
    ("rwkv.forward", "f32", "sequence"): Tol(nmse=1e-12, why="one call vs token by token vs chunks: every op is "
                                             "row-wise and the recurrences run token by token either way; "
                                             "measured identical bits for v4 and v5"),
    ("rwkv.forward", "f32", "rescaled"): Tol(nmse=1e-6, why="rescale_every (weights / 2**(i // R), x halved) "
                                             "vs unscaled: LayerNorm's eps grows 4x per halving; measured max "
                                             "3.7e-7 over 4-layer tiny v4/v5 models with R = 1"),
    # -- rwkv6 / rwkv7 vs llama.cpp (tests/models/test_rwkv_v6v7.py): tiny GGUFs written by refimpl's converter,
    # logits of every position x whole vocabulary, one llama_decode (rwkv{6,7}_llamacpp.npz); NMSE
    ("rwkv.forward", "f32", "llama.cpp"): Tol(nmse=1e-11, why="exact mode, F32 GGUFs: measured 9.9e-14 (rwkv6, "
                                              "max |d| 3.6e-6), 9.1e-14 (rwkv6 rescale_every=1), 1.5e-13 (rwkv7, "
                                              "3.7e-6): ggml's f32 sums and AVX2 lanes vs f64 here"),
    ("rwkv.forward", "f16", "llama.cpp"): Tol(nmse=2e-6, why="exact mode, F16 GGUFs: measured 2.0e-7 (rwkv6, max "
                                              "|d| 4.8e-3), 4.9e-7 (rwkv7, 6.7e-3): ggml-cpu rounds activations to "
                                              "f16 before each F16 mat-mul"),
    **{("rwkv.forward", t, "llama.cpp"): Tol(nmse=2e-3, why=f"exact mode, projections {t}: measured {m}; "
                                             "ggml-cpu quantizes activations to Q8_0/Q8_1 before each mat-mul")
       for t, m in (("q8_0", "2.1e-4 (rwkv6), 3.3e-4 (rwkv7)"), ("q5_1", "1.9e-4, 3.9e-4"),
                    ("q4_0", "1.8e-4, 3.0e-4"))},
    **{("rwkv.forward", t, "llama.cpp-ggml"): Tol(exact=True, why="numerics='ggml': every position's logits "
                                                  "measured bit-identical to llama.cpp's (rwkv6 and rwkv7; F32 incl. "
                                                  "rescale_every, F16, Q8_0, Q5_1, Q4_0): glibc's tanhf/expf, wkv7's "
                                                  "8-lane FMA sums, tinyBLAS for the head and the Q8 activations "
                                                  "emulated")
       for t in ("f32", "f16", "q8_0", "q5_1", "q4_0")},
    # mean KL(softmax(F32 logits) || softmax(quantized)) in nats (atol = the bound), tiny_state_dict models with
    # n_layer 2, n_embd 256, head_size 64, vocab 512, LoRA rank 32, 48 tokens; projections quantized, the rest F32.
    # Random weights are less robust than trained ones: expect smaller KLs on released models
    ("rwkv.forward", "q8_0", "kl-f32"): Tol(atol=1e-3, why="measured 3.2e-4 (rwkv6), 4.5e-4 (rwkv7); top-1 "
                                            "agreement 98%, 96%"),
    ("rwkv.forward", "q5_1", "kl-f32"): Tol(atol=5e-2, why="measured 1.8e-2 (rwkv6), 1.9e-2 (rwkv7); top-1 "
                                            "88%, 90%"),
    ("rwkv.forward", "q4_0", "kl-f32"): Tol(atol=0.25, why="measured 7.3e-2 (rwkv6), 1.0e-1 (rwkv7); top-1 "
                                            "65%, 77%"),
}


def _gamma(n, u: float = 2.0 ** -24):
    """gamma_n = n u / (1 - n u): the relative error of n roundings at unit roundoff u (Higham, sec. 3.1)."""
    return n * u / (1 - n * u)


def _solve_tri_bound(a, b):
    """|x_refimpl - x_ggml| per element for solve_tri(a, b) (A = tril(a), A x = b). ggml's f32 forward
    substitution x_i = fl(fl(b_i - sum_t A_it x_t) / A_ii) has a residual r = b - A x_hat with
    |r_i| <= gamma_{i+1} (|A| |x_hat|)_i + (2i + 1) 2^-150 |A_ii| (each of its 2i + 1 operations rounds
    relatively, or, in the subnormal range, by at most half of 2^-149), so |x_hat - x| <= |A^-1| |r|;
    exact mode rounds the f64 solution once (u |x| + 2^-150). Doubled for the second-order terms."""
    import numpy as np
    u = 2.0 ** -24
    A = np.tril(np.asarray(a, np.float64))
    B = np.asarray(b, np.float64)
    n = A.shape[-1]
    gamma = _gamma(n + 1, u)
    with np.errstate(all="ignore"):
        X = np.linalg.solve(A, B)
        Ainv = np.abs(np.linalg.inv(A))
        d = np.abs(np.diagonal(A, axis1=-2, axis2=-1))[..., None]
        r = gamma * (np.abs(A) @ np.abs(X)) + (2 * n + 1) * 2.0 ** -150 * d
        return 2.0 * (Ainv @ r + u * np.abs(X) + 2.0 ** -150)


def _soft_max_back_bound(dy, y, scale):
    """|dx_refimpl - dx_ggml| per element for soft_max_ext_back(dy, y, scale): the two dots y.dy differ by at
    most (gamma_n + u) S (ggml's f32 sum of n products in any order, exact mode's one rounding of an f64 sum;
    S = sum_j |y_j dy_j| per row, u = 2^-24, gamma_n = n u / (1 - n u)); fl(dy_i - dot), fl(* y_i) and
    fl(* scale) add a rounding each of values below |dy_i| + S. Doubled for the second-order terms."""
    import numpy as np
    u = 2.0 ** -24
    dy64, y64 = np.asarray(dy, np.float64), np.asarray(y, np.float64)
    n = dy64.shape[-1]
    gamma = _gamma(n, u)
    S = np.sum(np.abs(dy64 * y64), axis=-1, keepdims=True)
    return 2.0 * abs(scale) * np.abs(y64) * ((gamma + u) * S + 4 * u * (np.abs(dy64) + S))


def _linear_recurrence_bound(y_abs, steps: int, depth: int, per_step: float = 5):
    """|y - exact| per element of a linear recurrence run in f32 (RWKV 6 and 7, gated linear attention):
    `y_abs` is the f64 formula evaluated on the inputs' absolute values (decays, already in [0, 1], as they
    are), which bounds every intermediate sum, so each token's at most depth + per_step roundings (products,
    the state's sums, the output's dot over `depth`) add u y_abs each and decays <= 1 carry them undamped:
    gamma_n y_abs with n = (steps + 1)(depth + per_step), plus 2^-149 per rounding for subnormals; doubled."""
    n = (steps + 1) * (depth + per_step)
    return 2.0 * (_gamma(n) * np.asarray(y_abs, np.float64) + n * 2.0 ** -149)


def _wkv4_bound(k, v, w, u):
    """|wkv - exact| per output (T, C) of rwkv_wkv4 from a fresh state: every exponent is within
    R = T|w| + max|k| + |u| of 0 and picks up <= (T + 3) roundings of u R (pp carried over the tokens, u + k,
    the subtraction), each exp 4 ulp, each carried weight 3 more roundings a token: every weight relatively
    within H = expm1(T (log1p(eta) + 3u)); a weighted mean of values |v| <= V moves by <= 2 H V / (1 - H),
    its division and rounding by 2u V, underflowed weights by 2^-149 each (the denominator is >= 1). Doubled."""
    k, v, w, uu = (np.asarray(x, np.float64) for x in (k, v, w, u))
    T = k.shape[0]
    r = 2.0 ** -24
    R = T * np.abs(w) + np.abs(k).max(axis=0, initial=0.0) + np.abs(uu)                  # (C,)
    eta = np.expm1(2 * (T + 3) * r * R) + 4 * r
    H = np.expm1(T * (np.log1p(eta) + 3 * r))
    V = np.maximum.accumulate(np.abs(v), axis=0)                                          # (T, C)
    return 2.0 * ((2 * H / (1 - H) + 2 * r) * V + 2 * T * 2.0 ** -149)


def _delta_rule_bound(m_rows, v_abs, S: int):
    """|out - exact| of gated_delta_net, flattened as its output: attention (n_seqs, n_tok, H, S) then the
    final states (n_seqs, H, S, S). `m_rows` (n_seqs, H, n_tok + 1, S) are the exact 2-norms of the state's
    rows (one per value index) before each token and after the last, `v_abs` (n_seqs, n_tok, H, S) |v|.
    A token's transition M -> M g (I - beta k k^T) (gates <= 1, |k| = 1, beta in [0, 1]) does not grow a row's
    error; its roundings (the decay, the dot M k over S, v - M k, beta, the outer product, the sum) add at
    most 4 gamma_(S+8) P, P = |row| + |v_j| + the error so far. The output (M q)/sqrt(S) adds gamma_(S+2) of
    |row|; |q| <= 1 + sqrt(S) u. Doubled."""
    m_rows, v_abs = np.asarray(m_rows, np.float64), np.asarray(v_abs, np.float64)
    n_seqs, H, n_tok1, _ = m_rows.shape
    r = 2.0 ** -24
    g = _gamma
    E = np.zeros((n_seqs, H, S))
    attn = np.empty((n_seqs, n_tok1 - 1, H, S))
    for t in range(n_tok1 - 1):
        E = E + 4 * g(S + 8) * (m_rows[:, :, t] + v_abs[:, t] + E)
        attn[:, t] = (E + g(S + 2) * (m_rows[:, :, t + 1] + E)) * (1 + np.sqrt(S) * r) / np.sqrt(S)
    finals = np.broadcast_to(E[..., None], (n_seqs, H, S, S))
    return 2.0 * (np.concatenate([attn.reshape(-1), finals.reshape(-1)]) + 2.0 ** -149)


def _ssm_conv_bound(sx, c, *, sides: int):
    """|out - exact| per element of ssm_conv summed in f32 (products rounded, then d_conv - 1 additions in
    any order): gamma_d_conv(2^-24) sum_k |x_k c_k|, plus 2^-149 per product for subnormal roundings; `sides`
    = 2 for two such sums against each other. Shaped as ssm_conv's output (n_s, n_t, d_inner)."""
    from .shapes import ne4
    sx, c = np.asarray(sx, np.float64), np.asarray(c, np.float64)
    ns, nc = ne4(sx.shape), ne4(c.shape)
    d_conv, n_t = nc[0], ns[0] - nc[0] + 1
    x, w = np.abs(sx.reshape(ns[2], nc[1], ns[0])), np.abs(c.reshape(nc[1], nc[0]))
    total = sum(x[:, :, k:k + n_t] * w[None, :, k:k + 1] for k in range(d_conv))   # (n_s, d_inner, n_t)
    b = sides * (_gamma(d_conv) * total + d_conv * 2.0 ** -149)
    return np.ascontiguousarray(np.transpose(b, (0, 2, 1)))


def _flash_attn_bound(q, k, v, mask=None, scale=1.0, max_bias=0.0, logit_softcap=0.0, sinks=None, *,
                      u: float, dot: str, tile: int = 1):
    """|out_impl - out_ref| per element of flash_attn_ext, for an implementation working at unit roundoff
    `u` (2^-24 f32, 2^-53 f64) against the f64 reference rounded once to f32; `dot` "f32" when q.k is summed
    at u over head_dim in any order, "rounded" when it is exact then rounded once; `tile` the kv positions
    per rescale of an online softmax (1, the default, holds for any tiling; the whole n_kv for none).

    Per row (sequence, head, query): A = max_j sum_d |q_d k_jd|, R = |scale| A (at most |c| with soft-capping)
    + max |mask| (ALiBi slopes are <= 1) + |sink|, which bounds every |s_j| and |s_j - m|. Each score is off by
    E <= |scale| gamma_{DK+1} A + 8u R (dot, scale or c*tanh, slope*mask); a weight exp(s_j - m_t), rescaled
    by exp(m_t - m_t+1) once per later tile, is off relatively by eta <= expm1(E + 4uR + 4u(T + 1)) once the
    factor common to every weight (the max's own error) cancels in the ratio. Weights off by eta move
    o = sum_j w_j v_j / sum_j w_j by <= 2 eta V (V = max_j |v_jd|), the two sums' roundings (NKV terms, 2T
    rescales) by <= 2 gamma_n V, the division and the reference's rounding by u|o| + u32|o|, subnormal weights
    by 2^-149 V each. Doubled for the second-order terms."""
    from .qtensor import QTensor
    from .shapes import ne4
    f64 = lambda x: np.asarray(np.asarray(x) if isinstance(x, QTensor) else x, np.float64)   # noqa: E731
    q4 = f64(q).reshape(ne4(q.shape)[::-1])                              # (S, H, N, DK)
    k4 = f64(k).reshape(ne4(k.shape)[::-1])                              # (S, HKV, NKV, DK)
    v4 = f64(v).reshape(ne4(v.shape)[::-1])                              # (S, HV, NKV, DV)
    S, H, N, DK = q4.shape
    NKV = k4.shape[2]
    g = lambda n: _gamma(n, u)                                           # noqa: E731
    with np.errstate(all="ignore"):
        kk = np.repeat(np.abs(k4), H // k4.shape[1], axis=1)
        A = np.einsum("shnd,shkd->shnk", np.abs(q4), kk).max(axis=-1, initial=0.0)[..., None]   # (S, H, N, 1)
        R = abs(scale) * A if logit_softcap == 0.0 else np.minimum(abs(scale) * A, abs(logit_softcap))
        if mask is not None:
            m = np.abs(np.asarray(mask, np.float64))
            R = R + (m[np.isfinite(m)].max() if np.isfinite(m).any() else 0.0)
        if sinks is not None:
            R = R + np.abs(np.asarray(sinks, np.float64)).reshape(1, H, 1, 1)
        T = -(-NKV // max(1, min(tile, NKV)))
        n_acc = NKV + 2 * T + 2
        E = abs(scale) * (g(DK + 1) if dot == "f32" else g(1)) * A + 8 * u * R
        eta = np.expm1(E + 4 * u * R + 4 * u * (T + 1))
        V = np.repeat(np.abs(v4), H // v4.shape[1], axis=1).max(axis=2, initial=0.0)[:, :, None, :]   # (S, H, 1, DV)
        tiny = 2.0 ** -149 if u >= 2.0 ** -24 else 2.0 ** -1074
        b = 2.0 * V * (2 * eta + 2 * g(n_acc) + u + 2.0 ** -24 + n_acc * tiny)   # (S, H, N, DV)
        b = np.where(np.isnan(b), np.inf, b)                             # non-finite inputs: no bound to give
    out = np.ascontiguousarray(np.broadcast_to(b, (S, H, N, v4.shape[3])).transpose(0, 2, 1, 3))
    nd = max(np.ndim(q), 3)
    return out.reshape(out.shape[4 - nd:])


def tol(what: str, type: str = "*", against: str = "ggml") -> Tol:
    for key in ((what, type, against), (what, "*", against)):
        if key in TOLERANCES:
            return TOLERANCES[key]
    raise KeyError(f"no tolerance for {(what, type, against)}: add it to TOLERANCES in refimpl/tolerances.py")


# -- llama.cpp tensor by tensor (refimpl.compare) and refimpl's own equivalences (refimpl.check) -----------
# compare: NMSE per intermediate tensor (and the logits) of refimpl's forward against llama.cpp's graph on
# the same tokens (llama-cpp-python 0.3.36, CPU, no repacking, f16 KV cache); the weight type is that of
# blk.0.ffn_down. Measured on the tiny random Llamas of llama_tiny.npz (32 tokens) and SmolLM2-135M Q4_1
# ("The capital of France is", 5 tokens). Exact mode runs refimpl's f32 KV cache.
TOLERANCES.update({
    ("compare", "f32", "exact"): Tol(nmse=1e-6, why="measured worst 1.5e-7 (kq-1; logits 3.9e-8, 4.8e-8): "
                                     "llama.cpp's f16 cache and f16 Q, KQ in the attention products"),
    ("compare", "f16", "exact"): Tol(nmse=2e-6, why="measured worst 4.6e-7 (kqv-1; logits 2.0e-7): f16 "
                                     "activations before every F16 mat-mul, plus the f16 attention"),
    **{("compare", t, "exact"): Tol(nmse=2e-3, why="measured worst 3.5e-4 (q8_0 ffn_out-2), 3.0e-4 (q4_0 "
                                    "ffn_out-1): Q8_0 activation blocks before every weight mat-mul")
       for t in ("q8_0", "q4_0")},
    ("compare", "*", "exact"): Tol(nmse=3e-2, why="SmolLM2 Q4_1 over 30 layers: measured worst 8.1e-3 (kqv-5), "
                                   "logits 2.5e-3, first difference at Qcur-0 (7e-6): Q8_1 activation rounding "
                                   "amplified layer by layer"),
    ("compare", "f32", "ggml"): Tol(nmse=5e-9, why="measured worst 6.4e-10 (logits 1.4e-11, 1.1e-10): llama.cpp "
                                    "multiplies F32 weights by llamafile's tinyBLAS for >= 2 tokens; the op "
                                    "emulation is vec_dot's (ggml-python's build), only the attention follows "
                                    "tinyBLAS. With the weights through llama._sgemm too: identical bits"),
    ("compare", "f16", "ggml"): Tol(nmse=1e-6, why="measured worst 1.9e-7 (ffn_out-1; logits 7.0e-8): F16 "
                                    "weights through llamafile's tinyBLAS in llama.cpp, as for f32"),
    ("compare", "*", "ggml"): Tol(exact=True, why="block-quantized weights (q8_0, q4_0 tiny models; SmolLM2 "
                                  "Q4_1 with its Q8_0 output): every intermediate and the logits measured "
                                  "bit-identical"),
    # check: one Row per pair, NMSE of the logits (tiny models: 12 tokens; SmolLM2: 6 tokens)
    **{(f"llama.check.{p}", "*", "exact"): Tol(nmse=1e-10, why="one forward per token, chunks, a forked cache "
                                               "and one prefill differ only in f64-summed dot products over "
                                               "different lengths: measured identical bits")
       for p in ("token-by-token", "chunked", "cache")},
    **{(f"llama.check.{p}", "*", "ggml"): Tol(nmse=1e-2, why="llama.cpp's own paths differ: single-token "
                                              "decodes use vec_dot, batches llamafile's sgemm, then every Q8 "
                                              "activation rounding amplifies that: SmolLM2, 68 tokens, "
                                              "token-by-token 9.8e-4 (max |d| 1.6), chunked and cache "
                                              "identical; f32 tiny 9.3e-12 (llama.cpp's own greedy vs batched "
                                              "SmolLM2 logits differ by up to 0.65)")
       for p in ("token-by-token", "chunked", "cache")},
    ("llama.check.numba", "*", "exact"): Tol(nmse=1e-10, why="the numba kernels implement exact mode: f64 sums "
                                             "in another order at most"),
    # rwkv.cpp's tiny test models against the expected logits stored beside them (the FP32 model's, as
    # rwkv.cpp computes them), quantized files under numerics="ggml" (rwkv.cpp's own roundings): measured
    # tests/models/test_rwkv_cpp.py, 2026-12-04; v5's tiny models amplify quantization most (rwkv.cpp's own
    # sum-of-differences figures reach 160 there, its test comment explains why)
    ("rwkv.cpp", "FP32", "rwkv.cpp"): Tol(nmse=1e-12, why="the same model: measured max 6.1e-14 (5v1)"),
    ("rwkv.cpp", "FP16", "rwkv.cpp"): Tol(nmse=1e-6, why="f16 matrices vs the FP32 model: measured max 1.9e-7 (5v1)"),
    ("rwkv.cpp", "Q4_0", "rwkv.cpp"): Tol(nmse=5e-2, why="measured max 2.0e-2 (5v1 from FP16)"),
    ("rwkv.cpp", "Q4_1", "rwkv.cpp"): Tol(nmse=2e-2, why="measured max 9.7e-3 (5v2 from FP16)"),
    ("rwkv.cpp", "Q5_0", "rwkv.cpp"): Tol(nmse=8e-2, why="measured max 3.8e-2 (5v1 from FP16), 1.1e-5 (6v0-1m file)"),
    ("rwkv.cpp", "Q5_1", "rwkv.cpp"): Tol(nmse=1e-2, why="measured max 2.9e-3 (5v2 file), 1.8e-3 (from FP16)"),
    ("rwkv.cpp", "Q8_0", "rwkv.cpp"): Tol(nmse=2e-4, why="measured max 9.0e-5 (5v2 from FP16)"),
    ("llama.check.cuda", "*", "exact"): Tol(nmse=1e-10, why="the CUDA kernels implement exact mode (f64 mat-mul "
                                            "sums, f32 online softmax in flash attention); tiny models in the "
                                            "simulator measured 0"),
    ("llama.check.exact-ggml", "f32", "ggml"): Tol(nmse=1e-6, why="measured 4.7e-8, 5.7e-8: f16 cache and "
                                                   "attention roundings"),
    ("llama.check.exact-ggml", "f16", "ggml"): Tol(nmse=2e-6, why="measured 2.1e-7: f16 activations"),
    ("llama.check.exact-ggml", "*", "ggml"): Tol(nmse=1e-2, why="measured 2.4e-4 (q8_0), 1.4e-4 (q4_0), SmolLM2 "
                                                 "Q4_1 ~1e-3 (the exact-mode NMSE against llama.cpp): Q8 "
                                                 "activation blocks"),
})

# llama.forward under numerics="ggml" against llama.cpp's stored logits (tests/models/test_llama_faithful.py)
TOLERANCES.update({
    ("llama.forward", "*", "llama.cpp-ggml"): Tol(exact=True, why="tiny F32 (GQA, MHA), F16, Q8_0 and Q4_0 "
                                                  "models (every position; F32/F16 weight products over >= 2 "
                                                  "tokens in llamafile's tinyBLAS order, as llama.cpp's build) "
                                                  "and SmolLM2 Q4_1 (prompt logits and 64 greedy decodes per "
                                                  "golden prompt) measured bit-identical"),
})
