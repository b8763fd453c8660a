"""refimpl.compare against llama.cpp for real (llama-cpp-python), and refimpl.check, on tiny random Llamas.

The tiny models are those of tests/golden_data/llama_tiny.npz (rewritten from the recorded writer arguments).
llama.cpp runs through its cb_eval callback; the llama.cpp side needs llama-cpp-python, built as the goldens
were (portable AVX2, llamafile on, no AVX-512/AMX: scripts/gen_llama_goldens.py). `compare --op` needs
ggml-python. Each part skips, saying why, when its package is missing.
"""
import dataclasses
import json
import pathlib

import numpy as np
import pytest

from refimpl import backend
from refimpl.testing.compare_op import compare_op
from refimpl.compare import (Row, compare, first_over, format_table, llama_cpp_system_info, profile_problems,
                             run_llama_cpp)
from refimpl.models import llama
from tests._oracles import require_llama_cpp

from .models.tiny import write_tiny_llama

pytestmark = pytest.mark.oracle

GOLDEN = pathlib.Path(__file__).parent / "golden_data" / "llama_tiny.npz"
_Z = np.load(GOLDEN, allow_pickle=False)
MODELS = {m["name"]: m for m in json.loads(str(_Z["meta"]))["models"]}
Q8 = "q8_0_gqa4x2_untied_rope5e5"
F32 = "f32_gqa4x2_untied_rope5e4"

needs_llama_cpp = pytest.mark.usefixtures("llama_cpp_oracle")


@pytest.fixture
def llama_cpp_oracle():
    require_llama_cpp()


@pytest.fixture(autouse=True)
def _numpy_backend():
    with backend("numpy"):
        yield


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """name -> path of the tiny GGUF written from llama_tiny.npz's recorded arguments."""
    d = tmp_path_factory.mktemp("tiny")
    return {n: write_tiny_llama(d / f"{n}.gguf", **m["writer_args"]) for n, m in MODELS.items()}


@pytest.fixture(scope="module")
def build_ok():
    require_llama_cpp()
    bad = profile_problems(llama_cpp_system_info())
    assert not bad, (f"llama-cpp-python is not the build refimpl's ggml mode follows ({bad}); reinstall it as "
                     f"scripts/gen_llama_goldens.py says")


@needs_llama_cpp
def test_run_llama_cpp_reproduces_the_stored_logits(tiny, build_ok):
    """The callback-driven decode is the goldens' llama.cpp run: the same logits, bit for bit."""
    tokens = _Z[f"{Q8}_tokens"]
    run = run_llama_cpp(tiny[Q8], tokens)
    np.testing.assert_array_equal(run.logits, _Z[f"{Q8}_logits"])
    for name in ("attn_norm-0", "Qcur-0", "kq-0", "kq_soft_max-0", "kqv_out-0", "ffn_out-2", "l_out-2",
                 "result_norm", "result_output"):
        assert name in run.tensors, name
    assert run.tensors["kq-0"].shape == (4, len(tokens), 256)        # llama.cpp's 256-cell attention span
    assert "LLAMAFILE = 1" in run.system_info


@needs_llama_cpp
def test_run_llama_cpp_in_process_refuses_a_foreign_libggml(tiny, ggml):
    """ggml-python's libggml is loaded here (the op oracle); llama.cpp in this process would bind to it, so
    isolate=False refuses, naming the library."""
    with pytest.raises(RuntimeError, match="another libggml loaded"):
        run_llama_cpp(tiny[Q8], [1, 2, 3], isolate=False)


def test_run_llama_cpp_names_a_missing_model(tmp_path, build_ok):
    with pytest.raises(ValueError, match="could not load the model"):
        run_llama_cpp(tmp_path / "missing.gguf", [1, 2])


@needs_llama_cpp
def test_compare_ggml_mode_q8_0_names_no_tensor_over_budget(tiny, build_ok):
    """numerics="ggml" on the tiny Q8_0 model: every intermediate tensor llama.cpp names and the logits
    are identical bits (the budget for block-quantized weights)."""
    rows = compare(tiny[Q8], tokens=_Z[f"{Q8}_tokens"], numerics="ggml")
    assert first_over(rows) is None, format_table(rows)
    names = [r.name for r in rows]
    assert names[0] == "inp_embd" and names[-1] == "logits" and len(rows) >= 40
    for r in rows:
        assert r.budget == 0.0 and r.nmse == 0.0 and r.max_abs == 0.0, r
    kq = next(r for r in rows if r.name == "kq-0")
    assert kq.shape == (4, 32, 256) and kq.ne == [256, 32, 4]
    assert "no tensor over budget" in format_table(rows)


@needs_llama_cpp
def test_compare_exact_mode_is_within_budget_and_worse_than_ggml(tiny, build_ok):
    """Exact mode: within the table's budget, the first difference at Qcur-0 (the first Q8_0 mat-mul's
    activation rounding), the attention rows cut to the filled KV cells; ggml mode's logits are >= 100x
    closer (here: identical)."""
    rows = compare(tiny[Q8], tokens=_Z[f"{Q8}_tokens"], numerics="exact")
    assert first_over(rows) is None, format_table(rows)
    first = next(r for r in rows if r.nmse > 0)
    assert first.name == "Qcur-0"
    kq = next(r for r in rows if r.name == "kq-0")
    assert kq.shape == (4, 32, 32) and "KV cells" in kq.note
    assert 1e-6 < rows[-1].nmse < rows[-1].budget


@needs_llama_cpp
def test_compare_f32_ggml_mode_identical(tiny, build_ok):
    """F32 weights: with the weight and attention products over several tokens in llamafile's tinyBLAS order
    (as llama.cpp's build), every tensor of ggml mode equals llama.cpp's; exact mode does not."""
    rows = compare(tiny[F32], tokens=_Z[f"{F32}_tokens"], numerics="ggml")
    assert first_over(rows) is None, format_table(rows)
    assert max(r.nmse for r in rows) == 0, format_table(rows)
    exact = compare(tiny[F32], tokens=_Z[f"{F32}_tokens"], numerics="exact")
    assert exact[-1].nmse > 0


@needs_llama_cpp
def test_compare_flags_the_first_tensor_over_budget(tiny, build_ok):
    """A budget of identical bits in exact mode: the table names Qcur-0 as the first tensor over it."""
    rows = compare(tiny[Q8], tokens=[1, 2, 3, 4], numerics="exact", max_budget=0.0)
    f = first_over(rows)
    assert f is not None and f.name == "Qcur-0"
    assert "first tensor over budget: Qcur-0" in format_table(rows)


@needs_llama_cpp
def test_cli_compare(tiny, build_ok, capsys):
    from refimpl.__main__ import main
    toks = ",".join(str(t) for t in _Z[f"{Q8}_tokens"][:8])
    assert main(["compare", "-m", str(tiny[Q8]), "--tokens", toks, "--numerics", "ggml"]) == 0
    out = capsys.readouterr().out
    assert "kq_soft_max-2" in out and "[256,8,4]" in out and "(4,8,256)" in out
    assert "no tensor over budget" in out
    assert main(["compare", "-m", str(tiny[Q8]), "--tokens", toks, "--budget", "0"]) == 1
    assert "first tensor over budget: Qcur-0" in capsys.readouterr().out


def test_cli_compare_needs_a_model_or_an_op(capsys):
    from refimpl.__main__ import main
    assert main(["compare"]) == 2
    assert "give -m MODEL" in capsys.readouterr().err


# -- one op against ggml-python ------------------------------------------------------------------------

def test_compare_op_faithful_row_ops(ggml):
    for op in ("rms_norm", "soft_max_ext"):
        rows = compare_op(op, numerics="ggml", n_cases=3)
        assert rows and first_over(rows) is None, format_table(rows)
        assert all(r.budget == 0.0 for r in rows)


def test_compare_op_mul_mat_exact_mode(ggml):
    rows = compare_op("mul_mat", numerics="exact", n_cases=4, named=False)
    assert len(rows) == 4 and first_over(rows) is None, format_table(rows)


def test_cli_compare_op(ggml, capsys):
    from refimpl.__main__ import main
    assert main(["compare", "--op", "rms_norm", "--numerics", "ggml", "--cases", "2"]) == 0
    assert "no case over budget" in capsys.readouterr().out


# -- refimpl.check -------------------------------------------------------------------------------------

def test_check_pairs_hold_on_tiny_models(tiny):
    from refimpl.check import check
    for name in (Q8, F32):
        toks = _Z[f"{name}_tokens"][:10]
        rows = check(tiny[name], tokens=toks, pairs=("token-by-token", "chunked", "cache", "exact-ggml"))
        assert [r.name for r in rows] == ["token-by-token", "chunked", "cache", "exact-ggml"]
        assert first_over(rows) is None, format_table(rows, kind="check")
        assert rows[0].nmse == rows[1].nmse == rows[2].nmse == 0.0      # exact mode: identical bits
        assert rows[3].nmse > 0
        ggml_rows = check(tiny[name], tokens=toks, numerics="ggml", pairs=("token-by-token", "cache"))
        assert first_over(ggml_rows) is None, format_table(ggml_rows, kind="check")


def test_first_nonfinite_names_the_first_tensor(tiny):
    from refimpl.check import first_nonfinite
    model = llama.load(tiny[F32])
    assert first_nonfinite(model, [1, 2, 3]) is None
    w = np.array(model.layers[1].ffn_down, copy=True)
    w[5, 7] = np.inf
    model.layers[1] = dataclasses.replace(model.layers[1], ffn_down=w)
    name, shape, count, where = first_nonfinite(model, [1, 2, 3])
    assert name == "ffn_out-1" and shape == (3, 64) and where[1] == 5 and count >= 1


def test_cli_check(tiny, capsys):
    from refimpl.__main__ import main
    rc = main(["check", str(tiny[Q8]), "--tokens", "1,2,3,4,5,6", "--only", "token-by-token", "--only",
               "cache", "--only", "exact-ggml", "--nonfinite"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "token-by-token" in out and "exact-ggml" in out and "no check over budget" in out
    assert "no non-finite intermediate" in out


def test_row_is_a_tuple_with_both_shape_orders():
    r = Row("kq-0", (4, 32, 256), 0.0, 0.0, 0.0, False)
    assert r.ne == [256, 32, 4] and tuple(r)[:6] == ("kq-0", (4, 32, 256), 0.0, 0.0, 0.0, False)
