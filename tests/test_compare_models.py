"""refimpl.compare on BERT and RWKV GGUFs against llama.cpp (llama-cpp-python), and the ggml-mode emulations that
comparison located.

Models: a tiny random BERT (tests/models/bert_tiny.py, converted to GGUF by refimpl's converter) and the tiny
RWKV-6 of tests/golden_data/rwkv6_llamacpp.npz (its F32 GGUF written again from the stored weights). llama.cpp
runs in a child interpreter through its cb_eval callback; BERT with embeddings on and mean pooling (the last
row compares the pooled embedding), RWKV with the logits of every position. Budgets are the tolerance table's
("compare", weight type, numerics) rows. The llama.cpp tests need llama-cpp-python built as the goldens were
(portable AVX2, llamafile on); the op tests need ggml-python, the golden oracle.
"""
import json
import pathlib

import numpy as np
import pytest

import refimpl
from refimpl.compare import (compare, family, first_over, format_table, llama_cpp_system_info,
                             model_arch, profile_problems)
from refimpl.testing.compare_op import _drawn_cases, _same_bits
from refimpl.convert import convert
from refimpl.convert import rwkv as rwkv_convert
from refimpl.kernels.ggml.ops import OPS
from refimpl.kernels.ggml.llamafile import takes_sgemm
from refimpl.requantize import requantize
from refimpl.testing.cases import named_cases
from refimpl.testing.tolerances import tol
from tests._oracles import require_llama_cpp

from .models.bert_tiny import write_tiny_bert_hf

pytestmark = pytest.mark.oracle

GOLDEN = pathlib.Path(__file__).parent / "golden_data" / "rwkv6_llamacpp.npz"
BERT_TEXT = "a big red dog"            # [CLS] a big red dog [SEP]: 6 tokens, not a multiple of 4 (see below)


@pytest.fixture(autouse=True)
def _numpy_backend():
    with refimpl.backend("numpy"):
        yield


@pytest.fixture(scope="module")
def build_ok():
    require_llama_cpp()
    bad = profile_problems(llama_cpp_system_info())
    assert not bad, (f"llama-cpp-python is not the build refimpl's ggml mode follows ({bad}); reinstall it as "
                     f"scripts/gen_llama_goldens.py says")


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """type -> a tiny random BERT GGUF (4 heads of 16, 2 layers, mean pooling)."""
    d = tmp_path_factory.mktemp("bert")
    hf = write_tiny_bert_hf(d / "hf")
    out = {t: convert(hf, d / f"tiny-{t}.gguf", t) for t in ("f32", "f16", "q8_0")}
    requantize(out["f32"], d / "tiny-q4_0.gguf", "q4_0")        # (the converter, like llama.cpp's, has no q4_0)
    out["q4_0"] = d / "tiny-q4_0.gguf"
    return out


@pytest.fixture(scope="module")
def tiny_rwkv6(tmp_path_factory):
    """(path of the golden RWKV-6's F32 GGUF, its 32 token ids)."""
    z = np.load(GOLDEN, allow_pickle=False)
    m = json.loads(str(z["meta"]))["models"][0]
    p = f"{m['name']}.w."
    sd = {k[len(p):]: z[k].astype(np.float32) for k in z.files if k.startswith(p)}
    path = rwkv_convert.convert(sd, tmp_path_factory.mktemp("rwkv") / "rwkv6-f32.gguf", name=m["gguf_name"],
                                **m["variants"]["f32"]["convert"])
    return path, z[f"{m['name']}.tokens"]


def _row(rows, name):
    return next(r for r in rows if r.name == name)


# -- the model kind ------------------------------------------------------------------------------------

def test_model_arch_picks_the_family(tiny_bert, tiny_rwkv6):
    assert model_arch(tiny_bert["f32"]) == "bert" and family("bert").output[0] == "embeddings"
    assert model_arch(tiny_rwkv6[0]) == "rwkv6" and family("rwkv6").output[0] == "logits"
    assert family("llama").name == family("qwen2").name == "llama"


def test_model_arch_names_a_file_that_is_not_gguf(tmp_path):
    bad = tmp_path / "not.gguf"
    bad.write_bytes(b"not a gguf file")
    with pytest.raises(ValueError, match="not.gguf"):
        model_arch(bad)


# -- BERT ----------------------------------------------------------------------------------------------

def test_compare_bert_ggml_mode_identical(tiny_bert, build_ok):
    """numerics="ggml", F32 weights, 6 tokens: every tensor llama.cpp's bert graph names, the pooled embedding
    and llama_get_embeddings_seq are identical bits. With 6 tokens llama.cpp's kq (6 rows of K) is no
    multiple of tinyBLAS's 4-row tile, so it takes vec_dot (before refimpl knew that rule: NMSE 9e-15)."""
    rows = compare(tiny_bert["f32"], BERT_TEXT, numerics="ggml")
    assert first_over(rows) is None, format_table(rows)
    names = [r.name for r in rows]
    assert names[0] == "inp_embd" and names[-1] == "embeddings"
    for n in ("Qcur-0", "kq-0", "kq_soft_max-0", "kqv-1", "ffn_gelu-1", "result_embd", "result_embd_pooled"):
        assert n in names, n
    assert _row(rows, "kq-0").shape == (1, 4, 6, 6) and _row(rows, "kq-0").ne == [6, 6, 4, 1]
    assert _row(rows, "embeddings").shape == (1, 64)
    assert max(r.nmse for r in rows) == 0.0, format_table(rows)


def test_compare_bert_exact_mode_within_budget(tiny_bert, build_ok):
    """Exact mode: within the F32 budget but not identical (f64 sums, correctly rounded exp): ggml mode's
    zero (the test above) is the issue's ">= 100x closer"."""
    rows = compare(tiny_bert["f32"], BERT_TEXT, numerics="exact")
    assert first_over(rows) is None, format_table(rows)
    assert rows[-1].budget == tol("compare", "f32", "exact").nmse
    assert rows[-1].nmse > 0


@pytest.mark.parametrize("t", ["f16", "q8_0", "q4_0"])
def test_compare_bert_other_types_ggml_mode_identical(tiny_bert, build_ok, t):
    """F16 weights (f16 activations, tinyBLAS where llama.cpp takes it) and Q8_0 / Q4_0 weights (activations
    rounded to Q8_0 as ggml-cpu does, integer dots): every row identical bits; exact mode is not."""
    rows = compare(tiny_bert[t], BERT_TEXT, numerics="ggml")
    assert first_over(rows) is None, format_table(rows)
    assert max(r.nmse for r in rows) == 0.0, format_table(rows)
    assert compare(tiny_bert[t], BERT_TEXT, numerics="exact")[-1].nmse > 0


# -- RWKV-6 --------------------------------------------------------------------------------------------

def test_compare_rwkv6_ggml_mode_within_budget(tiny_rwkv6, build_ok):
    """numerics="ggml", F32: every tensor llama.cpp's rwkv6 graph names is identical bits (glibc's tanhf/expf,
    the tinyBLAS head and the layer norms all emulated)."""
    path, tokens = tiny_rwkv6
    rows = compare(path, tokens=tokens, numerics="ggml")
    assert first_over(rows) is None, format_table(rows)
    names = [r.name for r in rows]
    assert names[0] == "inp_embd" and names[-1] == "logits"
    for n in ("attn_norm-0", "ffn_inp-0", "ffn_norm-1", "l_out-1", "result_norm", "result_output"):
        assert n in names, n
    assert _row(rows, "logits").shape == (32, 128)
    assert max(r.nmse for r in rows) == 0.0 and max(r.max_abs for r in rows) == 0.0, format_table(rows)


def test_compare_rwkv6_exact_mode_within_budget(tiny_rwkv6, build_ok):
    path, tokens = tiny_rwkv6
    rows = compare(path, tokens=tokens[:12], numerics="exact")
    assert first_over(rows) is None, format_table(rows)
    assert rows[-1].nmse > 0 and rows[-1].shape == (12, 128)


# -- where llama.cpp's build takes llamafile's tinyBLAS --------------------------------------------------

def test_takes_sgemm_follows_ggml_cpu_conditions():
    """tinyBLAS needs >= 2 columns, k % 8 == 0, a's rows a multiple of 4, and src1 packed unless it is
    converted first (F16 source); only the "ggml" profile (llama.cpp's build) tries it."""
    from refimpl.dispatch import NUMERICS
    from refimpl.kernels.ggml import llamafile
    f32 = np.float32
    a8, a6 = np.ones((8, 16), f32), np.ones((6, 16), f32)
    b = np.ones((3, 16), f32)
    strided = np.ones((3, 24), f32)[:, :16]
    assert takes_sgemm(a8, b) and takes_sgemm(a8.astype(np.float16), strided)
    assert not takes_sgemm(a6, b)                            # 6 rows: no 4-row tile
    assert not takes_sgemm(a8, strided)                      # strided f32 src1, F32 source: vec_dot
    assert not takes_sgemm(a8, b[:1])                        # one column: vec_dot
    assert not takes_sgemm(np.ones((8, 12), f32), np.ones((3, 12), f32))    # k % 8 != 0
    refimpl.mul_mat(a8, b, numerics="ggml")                  # loads the emulations
    assert refimpl.ops.OPS["mul_mat"].impls[(None, "llamafile")] is llamafile.mul_mat
    assert [p for p, chain in NUMERICS.items() if "llamafile" in chain] == ["ggml"]


# -- the op emulations the comparison located, against ggml-python -------------------------------------

@pytest.mark.parametrize("op, n_drawn", [("tanh", 20), ("exp", 20), ("sigmoid", 20), ("rwkv_wkv7", 6),
                                         ("swiglu_oai", 20)])
def test_new_emulations_match_ggml(ggml, op, n_drawn):
    """ggml mode's tanh / exp / sigmoid / swiglu_oai (the C library's tanhf, expf) and rwkv_wkv7 (the AVX2
    kernel's FMA lanes) against live ggml: identical bits for f32 and f16 (bf16: the table's one-bf16-ulp
    bound, as exact mode); exact mode misses ggml on some of these cases (tanhf, swiglu_oai's expf and the
    wkv7 lane sums)."""
    from refimpl.testing.golden import check_values
    cases = named_cases(op) + _drawn_cases(op, n_drawn, 0)
    exact_misses = 0
    for case in cases:
        with refimpl.numerics("ggml"), np.errstate(all="ignore"):
            ours = case.run(OPS[op])
        with np.errstate(all="ignore"):
            exact = case.run()
        theirs = case.run_ggml()
        if case.type == "bf16":
            check_values(ours, theirs, tol(op, case.type, "ggml"), case.name)
            continue
        _same_bits(ours, theirs)
        try:
            _same_bits(exact, theirs)
        except AssertionError:
            exact_misses += 1
    if op in ("tanh", "rwkv_wkv7", "swiglu_oai"):
        assert exact_misses > 0


def test_libm_keeps_the_sign_of_zero():
    """tanhf(-0) = -0 and tanhf(+0) = +0: the per-distinct-argument cache keys on bits, not values."""
    from refimpl.kernels.ggml.simd import c_libm as libm
    out = libm("tanhf", np.array([0.0, -0.0, -0.0, 0.0], np.float32))
    assert list(np.signbit(out)) == [False, True, True, False]


def test_compare_knows_gemma3():
    """`refimpl compare` runs a gemma3 GGUF through refimpl.models.gemma3 (tests/models/test_gemma3.py holds
    the node-by-node and bit-level results on the real model)."""
    from refimpl import compare
    fam = compare.family("gemma3")
    assert fam.name == "gemma3" and fam.load.__module__ == "refimpl.models.gemma3"


def test_compare_gpt_oss_ggml_mode_identical(tmp_path, build_ok):
    """A tiny random gpt-oss (MXFP4 experts, sinks, a sliding window shorter than the 20 tokens): every tensor
    llama.cpp's graph names that refimpl.models.gpt_oss captures, and the logits, identical bits in ggml mode,
    the experts' products included."""
    from .models.tiny import write_tiny_gpt_oss
    path = write_tiny_gpt_oss(tmp_path / "oss.gguf", n_swa=8, seed=5)
    tokens = [int(t) for t in np.random.default_rng(5).integers(0, 96, 20)]
    assert family(model_arch(path)).name == "gpt-oss"
    rows = compare(path, tokens=tokens, numerics="ggml")
    assert first_over(rows) is None, format_table(rows)
    names = [r.name for r in rows]
    for n in ("kq_soft_max-0", "ffn_moe_topk-1", "ffn_moe_swiglu_oai-1", "ffn_moe_down_biased-1", "l_out-1"):
        assert n in names, n
    assert max(r.nmse for r in rows) == 0.0, format_table(rows)
