"""`refimpl convert`: the registry, and the GGUF the bert converter writes -- its keys, token spelling, tensor
names, types and bytes -- held to llama.cpp's converter (the table tests/golden_data/bert_minilm_convert.json
made from convert_hf_to_gguf.py on all-MiniLM-L6-v2, when that model is in the cache) and to gguf-py's own
quantizer (the one llama.cpp's converter calls)."""
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

import refimpl
from refimpl import gguf
from refimpl.convert import Converter, REGISTRY, convert, find_converter, register
from refimpl.convert import bert as cb

from .models.bert_tiny import VOCAB, write_tiny_bert_hf

pytest.importorskip("safetensors", reason="the safetensors package reads Hugging Face weights")

pytestmark = pytest.mark.golden

GOLDEN = Path(__file__).parent / "golden_data" / "bert_minilm_convert.json"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_bert_hf(tmp_path_factory.mktemp("bert") / "tiny")


@pytest.fixture(scope="module")
def tiny_weights(tiny):
    from safetensors.numpy import load_file
    return load_file(str(tiny / "model.safetensors"))


# -- registry ---------------------------------------------------------------------------------------------

def test_registry_dispatches_on_config(tiny, tmp_path):
    assert find_converter(tiny).name == "bert"
    d = tmp_path / "other"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"]}))
    with pytest.raises(ValueError, match=r"config\.json: architectures \['GPTNeoXForCausalLM'\] / model_type "
                                         r"'gpt_neox' have no converter; known: .*BertModel"):
        find_converter(d)
    with pytest.raises(ValueError, match="not a Hugging Face model directory"):
        find_converter(tmp_path / "other" / "config.json")
    with pytest.raises(FileNotFoundError):
        find_converter(tmp_path / "nope")


def test_register_adds_a_converter_with_detect(tmp_path):
    f = tmp_path / "model.xyz"
    f.write_bytes(b"xyz")
    conv = register(Converter("xyz", "bert", detect=lambda p: p.suffix == ".xyz"))
    try:
        assert find_converter(f) is conv
    finally:
        REGISTRY.remove(conv)
    with pytest.raises(ValueError, match="no registered converter"):
        find_converter(f)


def test_unknown_outtype(tiny, tmp_path):
    with pytest.raises(ValueError, match="outtype 'q4_0' is not one of f32, f16, bf16, q8_0"):
        convert(tiny, tmp_path / "x.gguf", "q4_0")


# -- metadata ---------------------------------------------------------------------------------------------

def test_metadata_keys_and_values(tiny, tmp_path):
    f = gguf.load(convert(tiny, tmp_path / "t.gguf", "f32"))
    md, vt = f.metadata, f.value_types
    T = gguf.GGUFValueType
    want = {"general.architecture": ("bert", T.STRING), "general.type": ("model", T.STRING),
            "general.file_type": (0, T.UINT32), "general.quantization_version": (2, T.UINT32),
            "bert.block_count": (2, T.UINT32), "bert.context_length": (24, T.UINT32),
            "bert.embedding_length": (64, T.UINT32), "bert.feed_forward_length": (128, T.UINT32),
            "bert.attention.head_count": (4, T.UINT32), "bert.attention.causal": (False, T.BOOL),
            "bert.pooling_type": (1, T.UINT32), "tokenizer.ggml.model": ("bert", T.STRING),
            "tokenizer.ggml.token_type_count": (2, T.UINT32), "tokenizer.ggml.pre": ("jina-v2-en", T.STRING),
            "tokenizer.ggml.bos_token_id": (VOCAB.index("[CLS]"), T.UINT32),
            "tokenizer.ggml.eos_token_id": (VOCAB.index("[SEP]"), T.UINT32),
            "tokenizer.ggml.seperator_token_id": (VOCAB.index("[SEP]"), T.UINT32),
            "tokenizer.ggml.unknown_token_id": (VOCAB.index("[UNK]"), T.UINT32),
            "tokenizer.ggml.padding_token_id": (VOCAB.index("[PAD]"), T.UINT32),
            "tokenizer.ggml.mask_token_id": (VOCAB.index("[MASK]"), T.UINT32),
            "tokenizer.ggml.add_bos_token": (True, T.BOOL), "tokenizer.ggml.add_eos_token": (True, T.BOOL),
            "tokenizer.ggml.add_sep_token": (False, T.BOOL),
            "tokenizer.ggml.normalizer.lowercase": (True, T.BOOL)}
    for k, (v, t) in want.items():
        assert md.get(k) == v and vt[k] == t, (k, md.get(k), vt.get(k))
    eps = "bert.attention.layer_norm_epsilon"
    assert md[eps] == np.float32(1e-12) and vt[eps] == T.FLOAT32
    assert vt["tokenizer.ggml.tokens"] == (T.ARRAY, T.STRING) and vt["tokenizer.ggml.token_type"] == (T.ARRAY, T.INT32)
    # phantom space: "##ing" -> "ing", "the" -> "\u2581the", special tokens as they are (CONTROL = 3)
    toks, types = md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"]
    for i, v in enumerate(VOCAB):
        special = v in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
        assert toks[i] == (v if special else v[2:] if v.startswith("##") else "\u2581" + v)
        assert types[i] == (3 if special else 1)


def test_no_sentence_transformers_files_no_pooling_type(tmp_path):
    d = write_tiny_bert_hf(tmp_path / "plain", pooling=None)
    f = gguf.load(convert(d, tmp_path / "p.gguf"))
    assert "bert.pooling_type" not in f.metadata
    d = write_tiny_bert_hf(tmp_path / "last", pooling="lasttoken")
    assert gguf.load(convert(d, tmp_path / "l.gguf")).metadata["bert.pooling_type"] == 3


# -- tensors --------------------------------------------------------------------------------------------------

def test_tensor_names_types_and_bytes(tiny, tiny_weights, tmp_path):
    from gguf.quants import quantize as gguf_py_quantize        # the quantizer llama.cpp's converter runs
    GT = refimpl.GGMLType
    for outtype, wtype in (("f32", GT.F32), ("f16", GT.F16), ("bf16", GT.BF16), ("q8_0", GT.Q8_0)):
        f = gguf.load(convert(tiny, tmp_path / f"{outtype}.gguf", outtype))
        assert f.metadata["general.file_type"] == cb.FILE_TYPE[outtype]
        names = [cb.gguf_name(n) for n in tiny_weights]
        assert list(f.tensor_info) == [n for n in names if n is not None]      # file order, dropped ones gone
        for hf_name, x in tiny_weights.items():
            name = cb.gguf_name(hf_name)
            if name is None:
                assert hf_name.startswith(("pooler.", "embeddings.position_ids"))
                continue
            info = f.tensor_info[name]
            assert info.ne == tuple(reversed(x.shape))
            keep = x.ndim == 1 or name in ("position_embd.weight", "token_types.weight") or "_norm" in name
            t = GT.F32 if keep else wtype
            assert info.type == t, (outtype, name, info.type)
            raw = f.data[info.file_offset:info.file_offset + info.nbytes].tobytes()
            assert raw == np.ascontiguousarray(gguf_py_quantize(x, t)).tobytes(), (outtype, name)


def test_q8_0_rows_that_are_not_whole_blocks_fall_back_to_f16(tmp_path, capsys):
    d = write_tiny_bert_hf(tmp_path / "n48", n_embd=48, n_head=4, n_ff=64)
    f = gguf.load(convert(d, tmp_path / "q.gguf", "q8_0"))
    assert f.tensor_info["blk.0.attn_q.weight"].type.name == "F16"       # ne0 = 48
    assert f.tensor_info["token_embd.weight"].type.name == "F16"
    assert f.tensor_info["blk.0.ffn_down.weight"].type.name == "Q8_0"    # ne0 = n_ff = 64
    assert "not whole Q8_0 blocks" in capsys.readouterr().err


def test_masked_lm_checkpoint_converts_to_the_same_tensors(tiny, tmp_path):
    d = write_tiny_bert_hf(tmp_path / "mlm", masked_lm=True)
    a, b = gguf.load(convert(tiny, tmp_path / "a.gguf")), gguf.load(convert(d, tmp_path / "b.gguf"))
    assert list(a.tensors) == list(b.tensors)
    for n in a.tensors:
        np.testing.assert_array_equal(a.tensors[n], b.tensors[n])


def _write_bf16_safetensors(path: Path, tensors: dict) -> dict:
    """A safetensors file of BF16 tensors (the f32 values with their low 16 bits cleared); returns the values."""
    header, blobs, off, exact = {}, [], 0, {}
    for name, x in tensors.items():
        u = np.ascontiguousarray(x, np.float32).view(np.uint32) >> 16
        b = u.astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(x.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
        exact[name] = (u.astype(np.uint32) << 16).view(np.float32)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(len(h).to_bytes(8, "little") + h + b"".join(blobs))
    return exact


def test_bf16_checkpoint_is_widened_exactly(tiny_weights, tmp_path):
    d = write_tiny_bert_hf(tmp_path / "bf")
    w = {k: v for k, v in tiny_weights.items() if v.dtype == np.float32}
    exact = _write_bf16_safetensors(d / "model.safetensors", w)
    f = gguf.load(convert(d, tmp_path / "bf.gguf", "f32"))
    for hf_name, x in exact.items():
        name = cb.gguf_name(hf_name)
        if name is not None:
            np.testing.assert_array_equal(f.tensors[name], x)


# -- llama.cpp's own converter, on the real model ---------------------------------------------------------------

def _digest_list(v):
    return hashlib.sha256(json.dumps(list(v), ensure_ascii=False).encode()).hexdigest()


@pytest.mark.parametrize("outtype", ["f32", "f16", "q8_0"])
def test_minilm_matches_llama_cpp_converter(outtype, tmp_path):
    from refimpl import fetch
    src = fetch.path("minilm")
    if not src.exists():
        pytest.fail("all-MiniLM-L6-v2 is not in the cache: refimpl fetch minilm (scripts/test.sh does)")
    table = json.loads(GOLDEN.read_text())[outtype]
    f = gguf.load(convert(src, tmp_path / f"minilm-{outtype}.gguf", outtype))
    ours = {k: v for k, v in f.metadata.items()
            if not k.startswith("general.") or k in ("general.architecture", "general.file_type",
                                                     "general.quantization_version")}
    assert set(ours) == set(table["metadata"])
    for k, want in table["metadata"].items():
        got = ours[k]
        if isinstance(want, dict):                                   # a long array: length, ends, digest
            assert (len(got), got[:8], got[-8:], _digest_list(got)) == (want["len"], want["head"], want["tail"],
                                                                         want["sha256"]), k
        elif isinstance(want, float):
            assert got == np.float32(want), k
        else:
            assert got == want, k
    assert set(f.tensor_info) == set(table["tensors"])
    for name, info in f.tensor_info.items():
        want = table["tensors"][name]
        assert (info.type.name, list(info.ne)) == (want["type"], want["ne"]), name
        digest = hashlib.sha256(f.data[info.file_offset:info.file_offset + info.nbytes].tobytes()).hexdigest()
        assert digest == want["sha256"], name
