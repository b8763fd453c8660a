"""ggml's own test-backend-ops (llama.cpp 0.3.36's tests/test-backend-ops.cpp, ggml 0.25.3) against refimpl serve,
on a named subset of ops that fits CI (docs/test-backend-ops.md has the whole run and its time).

Every case of these ops must pass ggml's own error budget in both exact and ggml numerics, except the cases
refimpl does not compute yet, which must be exactly the documented ones: the type Q2_0 (new in ggml 0.25.3;
refimpl's type enum, gguf-py's, has no Q2_0) and bf16 sources of the unary and GLU ops (new in 0.25.3)."""
import subprocess
import sys

import pytest

from . import _vendor

pytestmark = pytest.mark.oracle

CI_OPS = ("ADD,SUB,MUL,DIV,SCALE,SQR,SQRT,RMS_NORM,NORM,SOFT_MAX,ROPE,GET_ROWS,SET_ROWS,CPY,CONT,CONCAT,"
          "SWIGLU,GEGLU,SILU,GELU,ARGMAX,SUM_ROWS,REPEAT,PAD,CLAMP,DIAG_MASK_INF,ARGSORT")
UNARY_GLU = {"SILU", "GELU", "GELU_QUICK", "GELU_ERF", "SWIGLU", "GEGLU", "REGLU", "GEGLU_ERF", "GEGLU_QUICK"}


def known(c) -> bool:
    return "q2_0" in c["op_params"] or (c["op_name"] in UNARY_GLU and "type=bf16" in c["op_params"])


@pytest.mark.parametrize("mode", ["exact", "ggml"])
def test_backend_ops_subset(mode, tmp_path):
    _vendor.bin_dir()                            # builds test-backend-ops once (cached outside the repo)
    out = tmp_path / "run"
    p = subprocess.run(["bash", str(_vendor.REPO / "scripts" / "test_backend_ops.sh"), "--ops", CI_OPS,
                        "--modes", mode, "--out", str(out)], capture_output=True, text=True, timeout=3000)
    assert p.returncode == 0, p.stderr[-3000:]
    sys.path.insert(0, str(_vendor.REPO / "scripts"))
    import test_backend_ops_report as report
    cases = report.cases(out / f"tbo-{mode}.sql")
    kinds = {}
    for c in cases:
        kinds.setdefault(report.classify(c), []).append(c)
    ran = [c for c in cases if report.classify(c) != "cpu_unsupported"]
    print(f"\ntest-backend-ops ({mode}): {len(ran)} cases of {len(set(c['op_name'] for c in ran))} ops: "
          + ", ".join(f"{k} {len(v)}" for k, v in sorted(kinds.items())))
    assert len(ran) > 1000
    failed = kinds.get("failed", [])
    assert not failed, [f"{c['op_name']}({c['op_params']}): {c['detail'][:160]}" for c in failed[:10]]
    unknown = [c for c in kinds.get("not_computed", []) if not known(c)]
    assert not unknown, [f"{c['op_name']}({c['op_params']})" for c in unknown[:10]]
