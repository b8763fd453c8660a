"""ggml's own test-backend-ops (llama.cpp 0.3.36's tests/test-backend-ops.cpp, ggml 0.25.3) against refimpl serve,
on a named subset of ops that fits CI (docs/test-backend-ops.md has the whole run and its time).

Every case of these ops must be computed (no NaN-filled node) and pass ggml's own error budget in both exact and
ggml numerics. The subset includes what ggml 0.25.3 added to them (Q2_0 tensors, bf16 unary/GLU sources) and
0.25.3's new ops (SWIGLU_CLAMP, XIELU from op_params, SSM_SCAN rollback slots, DeepSeek V4's hyper-connections,
the optimizer steps)."""
import subprocess
import sys

import pytest

from . import _vendor

pytestmark = pytest.mark.oracle

CI_OPS = ("ADD,SUB,MUL,DIV,SCALE,SQR,SQRT,RMS_NORM,NORM,SOFT_MAX,ROPE,GET_ROWS,SET_ROWS,CPY,CONT,CONCAT,"
          "SWIGLU,GEGLU,SILU,GELU,ARGMAX,SUM_ROWS,REPEAT,PAD,CLAMP,DIAG_MASK_INF,ARGSORT,"
          "GELU_QUICK,GELU_ERF,REGLU,GEGLU_ERF,GEGLU_QUICK,SWIGLU_CLAMP,XIELU,GET_ROWS_BACK,SSM_SCAN,"
          "SSM_SCAN_ROLLBACK,OPT_STEP_ADAMW,OPT_STEP_SGD,DSV4_HC_COMB,DSV4_HC_PRE,DSV4_HC_POST")


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
    refused = kinds.get("not_computed", [])
    assert not refused, [f"{c['op_name']}({c['op_params']})" for c in refused[:10]]
