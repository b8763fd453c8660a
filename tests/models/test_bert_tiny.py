"""BERT on tiny random models (tests/models/bert_tiny.py): route identities, batching, pooling and normalization
definitions, requantization, errors and the `refimpl embed` command. No download, no llama.cpp, no torch
(the comparison with transformers.BertModel runs only where torch and transformers are installed).

The identities are properties of the NumPy reference, so this module pins the "numpy" backend; kernels are
held to the reference op by op elsewhere.
"""
import io
import json
import math
import subprocess
import sys
import warnings

import numpy as np
import pytest

import refimpl
from refimpl import gguf
from refimpl.convert import convert
from refimpl.models import bert
from refimpl.requantize import requantize
from tests._oracles import require_llama_cpp

from .bert_tiny import TEXTS, write_tiny_bert_hf

pytest.importorskip("safetensors", reason="the safetensors package reads Hugging Face weights")

pytestmark = pytest.mark.golden

EPS32 = 2.0 ** -24          # f32 unit roundoff
# Q8_0 stores each weight to within half a step of amax/127 of its block: relative error per matrix below
# ~ 1/(2*127) * amax/rms ~ 1.2% for Gaussian weights (amax/rms ~ 3 in a block of 32); two layers with layer
# norms keep errors relative, so the embedding moves by a few percent at most: cosine above 1 - 0.05**2/2.
Q8_0_COS_VS_F32 = 0.998
COS_VS_TRANSFORMERS = 0.99999   # erf GELU, f32 weights: only summation order differs from PyTorch


@pytest.fixture(autouse=True)
def _numpy_backend():
    with refimpl.backend("numpy"):
        yield


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return write_tiny_bert_hf(tmp_path_factory.mktemp("bert") / "tiny")


@pytest.fixture(scope="module")
def gguf_f32(hf_dir, tmp_path_factory):
    return convert(hf_dir, tmp_path_factory.mktemp("gguf") / "tiny-f32.gguf", "f32")


@pytest.fixture(scope="module")
def model(gguf_f32):
    return bert.load(gguf_f32)


@pytest.fixture(scope="module")
def hf_model(hf_dir):
    return bert.load(hf_dir)


def _ids(m, texts=TEXTS):
    return m.tokenizer.encode_batch(texts)


# -- the two routes --------------------------------------------------------------------------------------------

def test_hf_dir_equals_converted_f32_gguf(hf_model, model):
    assert hf_model.hparams == model.hparams
    assert hf_model.pooling == model.pooling == "mean"
    ids = _ids(hf_model)
    assert ids == _ids(model)                          # vocab.txt and the GGUF vocabulary tokenize alike
    for a, b in zip(bert.forward(hf_model, ids), bert.forward(model, ids)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(bert.embed(hf_model, TEXTS), bert.embed(model, TEXTS))


def test_gguf_weights_stay_memory_mapped(model, gguf_f32):
    f = gguf.load(gguf_f32)
    w = model.weights["blk.0.ffn_up.weight"]
    assert not w.flags.writeable and w.base is not None            # a view of the file's map
    np.testing.assert_array_equal(w, f.tensors["blk.0.ffn_up.weight"])


# -- batching ------------------------------------------------------------------------------------------------

def test_batched_with_padding_equals_one_at_a_time(model):
    ids = _ids(model)
    assert len({len(i) for i in ids}) > 3                           # lengths differ: real padding
    batched = bert.forward(model, ids)
    for i, seq in enumerate(ids):
        alone = bert.forward(model, seq)
        np.testing.assert_array_equal(batched[i], alone)
    e1 = bert.embed(model, TEXTS, batch_size=len(TEXTS))
    e2 = bert.embed(model, TEXTS, batch_size=3)
    np.testing.assert_array_equal(e1, e2)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_a_batch_size_that_is_not_a_positive_integer_is_refused(model, bad):
    """batch_size=0 returned no rows and -1 dropped the last text; now both say why."""
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        bert.embed(model, TEXTS[:3], batch_size=bad)


def test_batch_order_permutes_output(model):
    perm = np.random.default_rng(1).permutation(len(TEXTS))
    e = bert.embed(model, TEXTS)
    ep = bert.embed(model, [TEXTS[i] for i in perm])
    np.testing.assert_array_equal(ep, e[perm])


def test_padding_tokens_do_not_leak(model):
    """The padded keys are masked: a sequence's states do not depend on what fills the padding."""
    ids = _ids(model)
    long = max(ids, key=len)
    short = min(ids, key=len)
    a = bert.forward(model, [short, long])[0]
    b = bert.forward(model, [short, long[::-1]])[0]
    np.testing.assert_array_equal(a, b)


def test_token_types_default_to_zero(model):
    ids = _ids(model)[:2]
    zeros = [[0] * len(s) for s in ids]
    for a, b in zip(bert.forward(model, ids), bert.forward(model, ids, token_types=zeros)):
        np.testing.assert_array_equal(a, b)
    ones = [[1] * len(s) for s in ids]
    assert not np.array_equal(bert.forward(model, ids, token_types=ones)[0], bert.forward(model, ids)[0])


# -- pooling and normalization ---------------------------------------------------------------------------

def test_pooling_definitions_over_per_token_states(model):
    tokens = bert.embed(model, TEXTS, pooling="none", normalize=False)
    assert isinstance(tokens, list) and [t.shape[0] for t in tokens] == [len(i) for i in _ids(model)]
    for p in ("mean", "cls", "last"):
        pooled = bert.embed(model, TEXTS, pooling=p, normalize=False)
        assert pooled.shape == (len(TEXTS), model.hparams.n_embd) and pooled.dtype == np.float32
        for h, v in zip(tokens, pooled):
            if p == "cls":
                np.testing.assert_array_equal(v, h[0])
            elif p == "last":
                np.testing.assert_array_equal(v, h[-1])
            else:
                # llama.cpp: sum_t h[t] * fl(1/n), summed exactly enough (f64) and rounded once. fl(1/n) is
                # within EPS32 of 1/n relatively, so |v - mean| <= EPS32*mean|h| + half an ulp of v.
                m = np.mean(h.astype(np.float64), axis=0)
                bound = EPS32 * np.mean(np.abs(h.astype(np.float64)), axis=0) + np.spacing(np.abs(v)) / 2
                assert np.all(np.abs(v - m) <= bound * (1 + 1e-9))


def test_normalize_gives_unit_norm(model):
    e = bert.embed(model, TEXTS)
    # each element is x*fl(1/|x|): two f32 roundings per element, so the norm is within 2*EPS32 (plus the
    # f64 sum's own error, far smaller) of 1
    n = np.linalg.norm(e.astype(np.float64), axis=1)
    assert np.all(np.abs(n - 1) <= 2 * EPS32 + 1e-12)
    raw = bert.embed(model, TEXTS, normalize=False)
    cos = np.sum(raw.astype(np.float64) * e, axis=1) / np.linalg.norm(raw.astype(np.float64), axis=1) / n
    assert np.all(np.abs(cos - 1) <= 4 * EPS32)
    np.testing.assert_array_equal(bert.normalize(np.zeros((2, 5), np.float32)), np.zeros((2, 5), np.float32))


def test_model_pooling_is_the_default_for_none(hf_dir, tmp_path):
    d = write_tiny_bert_hf(tmp_path / "cls", pooling="cls")
    m = bert.load(d)
    assert m.pooling == "cls"
    np.testing.assert_array_equal(bert.embed(m, TEXTS[:2], pooling=None), bert.embed(m, TEXTS[:2], pooling="cls"))
    f = gguf.load(convert(d, tmp_path / "cls.gguf"))
    assert f.metadata["bert.pooling_type"] == 2


def test_capture_names_follow_llama_cpp(model):
    got = {}
    ids = _ids(model)[:3]
    bert.embed_ids(model, ids, "mean", capture=got)
    hp, T = model.hparams, max(len(i) for i in ids)
    for name in ("inp_embd", "inp_norm-0", "Qcur-0", "Kcur-0", "Vcur-0", "kq-0", "kq_soft_max-0", "kqv-0",
                 "kqv_out-0", "ffn_inp-0", "ffn_up-0", "ffn_up_b-0", "ffn_gelu-0", "ffn_down-0", "ffn_out-0",
                 "l_out-1", "result_embd", "result_embd_pooled"):
        assert name in got, name
    assert got["kq-0"].shape == (3, hp.n_head, T, T)                 # ne [n_kv, n_tokens, n_head, n_seq]
    assert got["result_embd"].shape == (3, T, hp.n_embd)
    np.testing.assert_allclose(got["kq_soft_max-1"].sum(-1), 1.0, rtol=1e-6)


# -- quantized models --------------------------------------------------------------------------------------

def _cos(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return np.sum(a * b, -1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def test_q8_0_converted_model_is_close_to_f32(hf_dir, model, tmp_path):
    q = bert.load(convert(hf_dir, tmp_path / "q8_0.gguf", "q8_0"))
    assert isinstance(q.weights["blk.0.attn_q.weight"], refimpl.QTensor)
    assert isinstance(q.weights["token_embd.weight"], refimpl.QTensor)
    assert q.weights["position_embd.weight"].dtype == np.float32
    c = _cos(bert.embed(q, TEXTS), bert.embed(model, TEXTS))
    assert c.min() >= Q8_0_COS_VS_F32, c


def test_quantize_keeps_embeddings_and_norms(gguf_f32, model, tmp_path):
    out = tmp_path / "rq.gguf"
    report = requantize(gguf_f32, out, "q8_0")
    f = gguf.load(out)
    assert f.metadata["general.file_type"] == 7
    src = gguf.load(gguf_f32)
    for name, info in f.tensor_info.items():
        kept = len(info.ne) == 1 or "_norm" in name or name in ("token_embd.weight", "position_embd.weight",
                                                                 "token_types.weight")
        assert info.type.name == ("F32" if kept else "Q8_0"), name
        if kept:
            np.testing.assert_array_equal(f.tensors[name], src.tensors[name])
    assert {e.note for e in report if e.note} == {"1-D", "embedding"}
    q = bert.load(out)
    assert _cos(bert.embed(q, TEXTS), bert.embed(model, TEXTS)).min() >= Q8_0_COS_VS_F32
    # --all quantizes the embeddings too (1-D tensors stay)
    requantize(gguf_f32, tmp_path / "all.gguf", "q8_0", all=True)
    g = gguf.load(tmp_path / "all.gguf")
    assert g.tensor_info["token_embd.weight"].type.name == "Q8_0"
    assert g.tensor_info["blk.0.ffn_up.bias"].type.name == "F32"
    assert bert.embed(bert.load(tmp_path / "all.gguf"), TEXTS[:2]).shape == (2, model.hparams.n_embd)


def test_quantize_notes_rows_that_are_not_whole_blocks_and_warns_on_quantized_sources(gguf_f32, tmp_path):
    notes = []
    report = requantize(gguf_f32, tmp_path / "k.gguf", "q4_K", log=notes.append)     # rows of 64, 128 < 256
    assert all(e.to_type == e.from_type for e in report) and notes
    assert "not whole q4_K blocks" in notes[0]
    requantize(gguf_f32, tmp_path / "q8.gguf", "q8_0")
    with pytest.warns(UserWarning, match="dequantized before quantizing"):
        requantize(tmp_path / "q8.gguf", tmp_path / "q4.gguf", "q4_0")
    f = gguf.load(tmp_path / "q4.gguf")
    assert f.tensor_info["blk.1.ffn_down.weight"].type.name == "Q4_0"
    assert f.metadata["general.file_type"] == 2


@pytest.mark.oracle
def test_quantize_matches_llama_quantize(gguf_f32, tmp_path):
    """The quantized matrices are byte for byte what llama.cpp's own llama_model_quantize writes (which also
    quantizes token_embd: llama-quantize's policy, not refimpl's)."""
    require_llama_cpp()
    for name, ftype in (("q8_0", 7), ("q4_0", 2)):
        theirs, ours = tmp_path / f"lq-{name}.gguf", tmp_path / f"rq-{name}.gguf"
        code = ("import ctypes, sys, llama_cpp\n"
                "p = llama_cpp.llama_model_quantize_default_params(); p.ftype = int(sys.argv[3]); p.nthread = 1\n"
                "sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))")
        r = subprocess.run([sys.executable, "-c", code, str(gguf_f32), str(theirs), str(ftype)], capture_output=True)
        assert r.returncode == 0, r.stderr[-2000:]
        requantize(gguf_f32, ours, name)
        a, b = gguf.load(theirs), gguf.load(ours)
        assert a.metadata["general.file_type"] == b.metadata["general.file_type"] == ftype
        n = 0
        for t, ia in a.tensor_info.items():
            ib = b.tensor_info[t]
            if ib.type.name == name.upper():
                assert ia.type == ib.type, t
                assert a.data[ia.file_offset:ia.file_offset + ia.nbytes].tobytes() == \
                    b.data[ib.file_offset:ib.file_offset + ib.nbytes].tobytes(), t
                n += 1
        assert n == 6 * b.metadata["bert.block_count"]                # q, k, v, output, up, down per layer


# -- errors -----------------------------------------------------------------------------------------------

def test_missing_tensor_names_file_and_tensor(tmp_path):
    d = write_tiny_bert_hf(tmp_path / "m", drop=("encoder.layer.1.intermediate.dense.weight",))
    with pytest.raises(ValueError, match=r"blk\.1\.ffn_up\.weight.*encoder\.layer\.1\.intermediate\.dense\.weight"
                                         r".*missing.*ne \[64, 128\] \(numpy \(128, 64\)\)") as e:
        bert.load(d)
    assert str(d) in str(e.value)
    with pytest.raises(ValueError, match="is missing"):
        convert(d, tmp_path / "m.gguf")


def test_wrong_shape_and_bad_config_name_the_file(tmp_path):
    d = write_tiny_bert_hf(tmp_path / "s", config={"intermediate_size": 96})
    with pytest.raises(ValueError, match=r"ffn_up\.weight.*has ne \[64, 128\] \(numpy \(128, 64\)\), "
                                         r"expected ne \[64, 96\]"):
        bert.load(d)
    d = write_tiny_bert_hf(tmp_path / "h", config={"num_attention_heads": 5})
    with pytest.raises(ValueError, match=r"config\.json: num_attention_heads 5 does not divide hidden_size 64"):
        bert.load(d)
    d = write_tiny_bert_hf(tmp_path / "a", config={"hidden_act": "relu"})
    with pytest.raises(ValueError, match=r"config\.json: hidden_act 'relu'"):
        convert(d, tmp_path / "a.gguf")
    d = write_tiny_bert_hf(tmp_path / "x", extra={"classifier.weight": np.zeros((2, 64), np.float32)})
    with pytest.raises(refimpl.BertError, match=r"model\.safetensors: tensor 'classifier\.weight' has no counterpart"):
        bert.load(d)


def test_gguf_errors_name_the_file(gguf_f32, tmp_path):
    f = gguf.load(gguf_f32)
    t = {k: v for k, v in f.tensors.items() if k != "blk.0.attn_k.weight"}
    gguf.save(tmp_path / "bad.gguf", f.metadata, t, value_types=f.value_types)
    with pytest.raises(ValueError, match=r"bad\.gguf: tensor 'blk\.0\.attn_k\.weight' is missing"):
        bert.load(tmp_path / "bad.gguf", tokenizer=False)
    md = dict(f.metadata, **{"general.architecture": "llama"})
    gguf.save(tmp_path / "arch.gguf", md, f.tensors, value_types=f.value_types)
    with pytest.raises(ValueError, match=r"arch\.gguf: general\.architecture 'llama'"):
        bert.load(tmp_path / "arch.gguf", tokenizer=False)


def test_forward_input_errors(model):
    with pytest.raises(ValueError, match="longer than the model's 24 positions"):
        bert.forward(model, [[4] * 25])
    with pytest.raises(ValueError, match="token id out of range"):
        bert.forward(model, [[4, model.hparams.n_vocab]])
    with pytest.raises(ValueError, match="empty sequence"):
        bert.forward(model, [[4, 5], []])


# -- the command line --------------------------------------------------------------------------------------

def _main(argv, stdin=None, monkeypatch=None, capsys=None):
    from refimpl.__main__ import main
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    rc = main(argv)
    return rc, capsys.readouterr().out


def test_cli_embed_similarity_and_json(hf_dir, model, monkeypatch, capsys):
    rc, out = _main(["embed", "-m", str(hf_dir), "--backend", "numpy", "--similarity", *TEXTS[:3]],
                    capsys=capsys)
    assert rc == 0
    sim = np.array([[float(x) for x in line.split()] for line in out.strip().splitlines()])
    e = bert.embed(model, TEXTS[:3]).astype(np.float64)
    np.testing.assert_allclose(sim, e @ e.T, atol=1e-5)              # 5 decimals printed
    np.testing.assert_allclose(np.diag(sim), 1.0, atol=1e-5)
    rc, out = _main(["embed", "-m", str(hf_dir), "--json", "--numerics", "exact", "--threads", "1"],
                    stdin="\n".join(TEXTS[:2]) + "\n", monkeypatch=monkeypatch, capsys=capsys)
    got = json.loads(out)
    assert rc == 0 and got["texts"] == TEXTS[:2] and got["pooling"] == "mean"
    np.testing.assert_array_equal(np.array(got["embeddings"], np.float32), bert.embed(model, TEXTS[:2]))


def test_cli_embed_default_output_and_pooling_none(gguf_f32, model, monkeypatch, capsys):
    rc, out = _main(["embed", "-m", str(gguf_f32), "--no-normalize"], stdin="hello world\n",
                    monkeypatch=monkeypatch, capsys=capsys)
    row = np.array([float(x) for x in out.split()])
    np.testing.assert_allclose(row, bert.embed(model, ["hello world"], normalize=False)[0], atol=5e-7)
    rc, out = _main(["embed", "-m", str(gguf_f32), "--pooling", "none", "hello world"], capsys=capsys)
    lines = out.strip("\n").split("\n")
    assert rc == 0 and len(lines) == len(model.tokenizer.encode("hello world"))


def test_cli_convert_and_quantize_subprocess(hf_dir, tmp_path):
    import os
    env = dict(os.environ, REFIMPL_BACKEND="numpy")                 # the reference (no kernel compilation)
    out = tmp_path / "c.gguf"
    r = subprocess.run([sys.executable, "-m", "refimpl", "convert", str(hf_dir), str(out), "--type", "f16"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    f = gguf.load(out)
    assert f.metadata["general.file_type"] == 1 and f.tensor_info["blk.0.attn_q.weight"].type.name == "F16"
    r = subprocess.run([sys.executable, "-m", "refimpl", "quantize", str(out), str(tmp_path / "q.gguf"), "q8_0"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "to q8_0" in r.stdout and "embedding: 3" in r.stdout
    r = subprocess.run([sys.executable, "-m", "refimpl", "embed", "-m", str(tmp_path / "q.gguf"), "--similarity"],
                       input="the man is eating food.\nthe man is eating\n", capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    sim = np.array([[float(x) for x in line.split()] for line in r.stdout.split("\n") if line.strip()])
    assert sim.shape == (2, 2) and np.allclose(np.diag(sim), 1.0, atol=1e-5)


# -- transformers (optional) -------------------------------------------------------------------------------

def test_hidden_states_match_transformers(hf_dir):
    torch = pytest.importorskip("torch", reason="torch is not installed (optional comparison)")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (optional comparison)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = transformers.BertModel.from_pretrained(str(hf_dir), add_pooling_layer=False).eval()
    m = bert.load(hf_dir, act="gelu_erf")                          # Hugging Face's "gelu" is the erf GELU
    ids = _ids(m)
    T = max(len(i) for i in ids)
    inp = torch.tensor([i + [0] * (T - len(i)) for i in ids])
    mask = torch.tensor([[1] * len(i) + [0] * (T - len(i)) for i in ids])
    with torch.no_grad():
        ref = hf(input_ids=inp, attention_mask=mask).last_hidden_state.numpy()
    for i, h in enumerate(bert.forward(m, ids)):
        c = _cos(h, ref[i, :len(ids[i])])
        assert c.min() >= COS_VS_TRANSFORMERS, (i, c.min())
    assert not math.isnan(float(ref.sum()))
