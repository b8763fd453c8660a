"""Every op against live ggml: hypothesis cases (refimpl.testing.op_cases) and the named cases.

One driver for all ops; the cases, tolerances and shapes live in refimpl/testing/cases/ and
refimpl/tolerances.py. A failing case prints its test-backend-ops style name.
"""
import os

import pytest
from hypothesis import given, settings
from tests._profiles import examples

import refimpl
from refimpl.testing.cases import named_cases, op_cases, ops_with_cases, ops_with_named
from refimpl.testing.golden import compare


# hypothesis examples per op: every example runs ggml in a forked process. Inside the whole suite's long-
# lived pytest process (a large parent to fork) 100 an op took ~26 min; in its own process beside the rest
# (scripts/test.sh, lane 2) 80 an op took 6.2 min, so CI keeps 100 (the 2,031 named cases run in lane 1).
pytestmark = pytest.mark.oracle

OP_EXAMPLES = int(os.environ.get("REFIMPL_OP_EXAMPLES", "100" if os.environ.get("CI") else "40"))

# ggml-cpu reads these from its f16 tables (GGML_GELU_FP16); refimpl's exact op is ggml's formula (what the
# GPU backends compute; tests/ops checks it against the f64 formula), its ggml profile the table: ggml-python is
# compared with the latter, bit for bit
CPU_TABLE_OPS = {"gelu", "gelu_quick", "geglu", "geglu_quick"}


def _judged(case, theirs):
    if case.op in CPU_TABLE_OPS:
        with refimpl.numerics("ggml-nollamafile"):
            compare(case, case.run(), theirs, against="ggml-faithful")
    else:
        compare(case, case.run(), theirs)


@pytest.mark.parametrize("op", ops_with_cases())
def test_op_matches_ggml(ggml, op):
    @settings(max_examples=examples(OP_EXAMPLES))
    @given(case=op_cases(op))
    def check(case):
        _judged(case, case.run_ggml())
    check()


NAMED = [c for op in ops_with_named() for c in named_cases(op)]


@pytest.mark.parametrize("case", NAMED, ids=[c.name for c in NAMED])
def test_named_case_matches_ggml(ggml, case):
    _judged(case, case.run_ggml())
