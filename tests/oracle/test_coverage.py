"""Every op of the pinned ggml's enums is implemented and has golden cases, or is a listed exclusion.

Read from ggml-python's enums, so an op added to ggml shows up here as a failure.
"""
import pytest

from refimpl.ops import OPS
from refimpl.testing.cases import ops_with_cases, ops_with_named
from refimpl.testing.coverage import EXCLUDED, ggml_ops


pytestmark = pytest.mark.oracle

def test_every_in_scope_ggml_op_is_implemented_and_golden_tested(ggml):
    tested = set(ops_with_cases()) | set(ops_with_named())
    by_enum = {}
    for name, info in OPS.items():
        for c in info.covers:
            by_enum.setdefault(c, set()).add(name)
    missing = [o for o in ggml_ops() if o not in EXCLUDED and not (by_enum.get(o, set()) & tested)]
    assert not missing, f"ggml ops without a golden-tested refimpl implementation: {missing}"
