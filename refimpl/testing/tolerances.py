"""The tolerance table: every tolerance refimpl's tests use, with its reason.

Keys are (what, type, against): `what` an op name or "quantize"/"dequantize"; `type` the tolerance type of
the case (usually the weight/first-operand type, "*" for any); `against` "ggml" (live ggml, exact mode),
"ggml-faithful", "numba", "property", ... Values are `Tol`. NMSE is ggml's test-backend-ops metric.
Ceilings from ggml's own tests (§6 of the semantics): 1e-7 default, 5e-4 for mul_mat-like ops,
1e-6 softmax. Where refimpl's entry is tighter than ggml's ceiling, the entry says so.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tol:
    """One tolerance: `exact` (identical bits), or a bound on NMSE / max ULP, and why."""
    exact: bool = False
    nmse: float | None = None
    max_ulp: int | None = None
    why: str = ""


EXACT = Tol(exact=True, why="same operations in the same order: identical bits")
GGML_DEFAULT = Tol(nmse=1e-7, why="ggml test-backend-ops default ceiling")
GGML_MATMUL = Tol(nmse=5e-4, why="ggml test-backend-ops ceiling for MUL_MAT/OUT_PROD")

TOLERANCES: dict[tuple[str, str, str], Tol] = {
    # -- block formats -------------------------------------------------------------------------------
    ("dequantize", "*", "ggml"): Tol(exact=True, why="bytes in, the same f32 operations, identical floats out"),
    ("quantize", "*", "ggml"): Tol(exact=True, why="the reference quantizers are deterministic f32 code"),
    # -- element-wise, unary, glu, reductions ----------------------------------------------------------
    ("add", "f32", "ggml"): EXACT,
    # -- data movement ---------------------------------------------------------------------------------
    ("get_rows", "*", "ggml"): Tol(exact=True, why="rows are copied or dequantized exactly"),
    # -- norms, softmax, rope, attention, losses -------------------------------------------------------
    ("rms_norm", "f32", "ggml"): EXACT,
    # -- mul_mat, out_prod, convolution, pooling ------------------------------------------------------
    ("mul_mat", "*", "ggml"): GGML_MATMUL,
    # -- recurrent, state-space, sorting ---------------------------------------------------------------
}


def tol(what: str, type: str = "*", against: str = "ggml") -> Tol:
    for key in ((what, type, against), (what, "*", against)):
        if key in TOLERANCES:
            return TOLERANCES[key]
    raise KeyError(f"no tolerance for {(what, type, against)}: add it to refimpl/testing/tolerances.py")
