"""Loaders and decoders on bad input: one error of refimpl's family (refimpl.LoadError and its subclasses, or a
ValueError naming the token id), naming the file, never a third-party exception or a silently wrong answer.
Each case below is a reproducer that once ended in KeyError, TypeError, AttributeError, IndexError,
SafetensorError, MemoryError or a wrong result."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import refimpl
from refimpl import gguf
from refimpl.gguf import GGUFError
from refimpl.models import bert
from refimpl.models.llama2c import Llama2cError
from refimpl.tokenizers.rwkv import RWKVTokenizer
from refimpl.tokenizers.wordpiece import WordPieceTokenizer

from ..models.bert_tiny import write_tiny_bert_hf
from ..models.tiny import write_tiny_llama

pytestmark = pytest.mark.property


def test_the_error_family():
    for e in (GGUFError, Llama2cError, refimpl.BertError, refimpl.TokenizerError):
        assert issubclass(e, refimpl.LoadError) and issubclass(e, ValueError)


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return write_tiny_bert_hf(tmp_path_factory.mktemp("bert") / "base")


def _copy(src, tmp_path, name="m"):
    d = tmp_path / name
    shutil.copytree(src, d)
    return d


def _edit_json(path, fn):
    v = json.loads(path.read_text())
    path.write_text(json.dumps(fn(v)))


def _set(key, value):
    def fn(cfg):
        cfg[key] = value
        return cfg
    return fn


CONFIG_EDITS = {
    "hidden_size null": _set("hidden_size", None),
    "num_attention_heads 1.5": _set("num_attention_heads", 1.5),
    "num_attention_heads true": _set("num_attention_heads", True),
    "num_hidden_layers list": _set("num_hidden_layers", [2]),
    "num_hidden_layers 10**9": _set("num_hidden_layers", 10 ** 9),
    "layer_norm_eps 1e300": _set("layer_norm_eps", 1e300),
    "layer_norm_eps -1": _set("layer_norm_eps", -1.0),
    "vocab_size dict": _set("vocab_size", {"a": 1}),
    "top level a list": lambda cfg: [1, 2],
    "architectures a string": _set("architectures", "BertModel"),
}


@pytest.mark.parametrize("edit", list(CONFIG_EDITS), ids=list(CONFIG_EDITS))
def test_a_bad_config_value_is_a_bert_error_naming_the_file(bert_dir, tmp_path, edit):
    d = _copy(bert_dir, tmp_path)
    _edit_json(d / "config.json", CONFIG_EDITS[edit])
    with pytest.raises(refimpl.BertError, match="config.json"):
        bert.load(d)


def test_damaged_safetensors_is_a_bert_error_not_a_safetensor_error(bert_dir, tmp_path):
    for i, damage in enumerate((lambda b: b[:len(b) // 2], lambda b: b"\xff" * 8 + b[8:],
                                lambda b: b[:8] + b"[" + b[9:])):
        d = _copy(bert_dir, tmp_path, f"m{i}")
        p = d / "model.safetensors"
        p.write_bytes(damage(p.read_bytes()))
        with pytest.raises(refimpl.BertError, match="model.safetensors"):
            bert.load(d)


@pytest.mark.parametrize("name, content", [("modules.json", {"a": 1}), ("tokenizer.json", []),
                                           ("sentence_bert_config.json", {"max_seq_length": "long"}),
                                           ("config.json", "{not json")])
def test_a_json_file_of_the_wrong_shape_names_itself(bert_dir, tmp_path, name, content):
    d = _copy(bert_dir, tmp_path)
    (d / name).write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(refimpl.LoadError, match=name.replace(".", r"\.")):
        bert.load(d)


def _tokenizer_json(vocab, added=()):
    return {"model": {"type": "WordPiece", "vocab": vocab, "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                      "max_input_chars_per_word": 100},
            "normalizer": {"type": "BertNormalizer", "lowercase": True}, "pre_tokenizer": {"type": "BertPreTokenizer"},
            "added_tokens": list(added)}


@pytest.mark.parametrize("tj", [
    _tokenizer_json({"[UNK]": 0, "a": 1_000_000_000}),                # once a [None] * (10**9 + 1) list
    _tokenizer_json({"[UNK]": 0, "a": -5}),
    _tokenizer_json({"[UNK]": 0, "a": "one"}),
    {"model": {"type": "WordPiece"}},                                  # no vocab: once a KeyError
    _tokenizer_json({"[UNK]": 0, "a": 1}, added=[{"content": "[UNK]"}]),  # an added token without id
], ids=["huge id", "negative id", "string id", "no vocab", "added token without id"])
def test_a_bad_tokenizer_json_is_a_tokenizer_error(tmp_path, tj):
    p = tmp_path / "tokenizer.json"
    p.write_text(json.dumps(tj))
    with pytest.raises(refimpl.TokenizerError, match="tokenizer.json"):
        WordPieceTokenizer.from_tokenizer_json(p)


def test_a_file_of_another_format_says_what_it_looks_like(bert_dir, tmp_path):
    with pytest.raises(GGUFError, match="not a GGUF file.*looks like a safetensors file"):
        gguf.load(bert_dir / "model.safetensors")
    p = tmp_path / "model.bin"
    p.write_bytes((0x67676D66).to_bytes(4, "little") + bytes(60))
    with pytest.raises(GGUFError, match="rwkv.cpp"):
        gguf.load(p)


# -- decode: ids outside the vocabulary ----------------------------------------------------------------------

def _tokenizers(tmp_path, bert_dir):
    llama_tok = refimpl.tokenizer.from_gguf(gguf.load(write_tiny_llama(tmp_path / "t.gguf")))
    wp = WordPieceTokenizer.from_hf_dir(bert_dir)
    lines = [f"{i} {bytes([b])!r} 1" for i, b in enumerate(range(256), start=1)]
    (tmp_path / "world.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    rw = RWKVTokenizer.from_world_vocab(tmp_path / "world.txt", vocab_size=300)
    return {"llama": llama_tok, "wordpiece": wp, "rwkv": rw}


@pytest.mark.parametrize("kind", ["llama", "wordpiece", "rwkv"])
def test_decode_refuses_ids_outside_the_vocabulary(tmp_path, bert_dir, kind):
    """decode([n_vocab]) and decode([2**31]) were IndexErrors, decode([-1]) silently the last token."""
    tok = _tokenizers(tmp_path, bert_dir)[kind]
    n = len(tok.tokens)
    assert tok.decode([1]) == tok.decode(np.array([1]))                # NumPy ids are ids
    for bad in (n, 2 ** 31, -1):
        with pytest.raises(ValueError, match=rf"token id {bad} out of range \[0, {n}\)"):
            tok.decode([1, bad])
    with pytest.raises(ValueError, match="not an integer"):
        tok.decode([1.5])


# -- sizes checked before memory is taken ---------------------------------------------------------------------

def test_forward_checks_the_cache_before_sizing_the_mask(tmp_path):
    """forward([5] * 100001) on a 256-position cache once built a 9.3 GiB causal mask before the cache said no."""
    import resource
    from refimpl.models import llama
    m = llama.load(write_tiny_llama(tmp_path / "t.gguf"))
    cache = llama.new_cache(m, 256)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ValueError, match=r"KV cache full: 0 \+ 100001 tokens > n_ctx 256"):
        llama.forward(m, [5] * 100001, cache)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000      # KiB: nothing big taken
    assert cache.n_past == 0


def test_a_cache_beyond_the_memory_limit_says_so(tmp_path, monkeypatch):
    """A llama2.c checkpoint's seq_len 2**31-1 once asked `generate` for a 512 GiB KV cache."""
    from refimpl.models import llama
    m = llama.load(write_tiny_llama(tmp_path / "t.gguf"))
    with pytest.raises(ValueError, match=r"KV cache of 2147483647 positions .* GiB limit"):
        llama.new_cache(m, 2**31 - 1)
    monkeypatch.setenv("REFIMPL_MAX_MEMORY", "1K")
    with pytest.raises(ValueError, match=r"REFIMPL_MAX_MEMORY"):
        llama.new_cache(m, 64)
    monkeypatch.setenv("REFIMPL_MAX_MEMORY", "1G")
    assert llama.new_cache(m, 64).n_ctx == 64
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match="n_ctx must be a positive integer"):
            llama.new_cache(m, bad)


# -- ops name themselves; from_bytes, quantize and dequantize check their arguments first ---------------------

def test_argument_errors_of_the_tensor_functions():
    from refimpl import QTensor, dequantize, quantize
    with pytest.raises(ValueError, match=r"q4_0 tensor shape \(\): expected at least one dimension"):
        QTensor.from_bytes(b"\0" * 18, "q4_0", ())                     # once an IndexError
    with pytest.raises(ValueError, match="ggml type None"):
        quantize(np.ones((2, 32), np.float32), None)                    # once a TypeError from int(None)
    for bad in (None, "abc", {"a": 1}):
        with pytest.raises(ValueError, match="dequantize: expected a QTensor or an array of numbers"):
            dequantize(bad)                                             # None once returned array(nan)


def test_shape_errors_name_the_op_and_both_orders():
    from refimpl.ops import add, mul_mat, rms_norm
    x5 = np.ones((1, 1, 1, 1, 2), np.float32)
    for call, op in ((lambda: add(x5, np.ones(2, np.float32)), "add"), (lambda: rms_norm(x5, 1e-6), "rms_norm"),
                     (lambda: mul_mat(x5, x5), "mul_mat")):
        with pytest.raises(refimpl.GGMLShapeError, match=rf"^{op}: ggml tensors have at most 4 dims, got ne "
                                                          r"\[2, 1, 1, 1, 1\] \(numpy \(1, 1, 1, 1, 2\)\)"):
            call()


def test_mul_mat_of_an_empty_operand_is_what_ggml_computes():
    """A zero-size operand once got 'src0 must not be transposed': ggml multiplies it (k = 0 sums nothing)."""
    from refimpl.ops import mul_mat
    assert mul_mat(np.zeros((0, 32), np.float32), np.ones((2, 32), np.float32)).shape == (2, 0)
    assert mul_mat(np.ones((4, 32), np.float32), np.ones((0, 32), np.float32)).shape == (0, 4)
    np.testing.assert_array_equal(mul_mat(np.zeros((4, 0), np.float32), np.ones((2, 0), np.float32)),
                                  np.zeros((2, 4), np.float32))


def test_rwkv_checkpoints_of_the_wrong_kind_are_rwkv_errors(tmp_path, bert_dir):
    """A damaged .safetensors once leaked SafetensorError; a BERT checkpoint or a .npz of something else said
    'not an RWKV state dict' without naming the file."""
    from refimpl.models import rwkv
    (tmp_path / "junk.safetensors").write_bytes(b'{"a":1}')
    np.savez(tmp_path / "other.npz", a=np.ones(3, np.float32))
    llama_gguf = write_tiny_llama(tmp_path / "t.gguf")
    for p, what in ((tmp_path / "junk.safetensors", "looks like"), (tmp_path / "other.npz", "zip archive"),
                    (bert_dir / "model.safetensors", "safetensors file"), (llama_gguf, "architecture 'llama'")):
        with pytest.raises(refimpl.RWKVError, match=str(p).replace(".", r"\.") + ".*" + what):
            rwkv.load(p)


def test_a_llama2c_loader_handed_another_format_says_what_it_looks_like(bert_dir, tmp_path):
    from refimpl.models import llama2c
    (tmp_path / "notes.txt").write_text("root:x:0:0:root:/root:/bin/bash\n" * 4)
    for p, kind in ((bert_dir / "model.safetensors", "a safetensors file"), (tmp_path / "notes.txt", "a text file")):
        with pytest.raises(Llama2cError, match=f"looks like {kind}"):
            llama2c.read_checkpoint(p)
    with pytest.raises(Llama2cError, match="not a tokenizer.bin, it looks like a text file"):
        llama2c.load_tokenizer(tmp_path / "notes.txt", 32)


def test_an_rwkv_cpp_file_is_named_for_what_it_is(tmp_path):
    """rwkv.cpp's model.bin once got "reading a .pth needs torch"; rwkv.load reads the format now, and a
    damaged one says what is wrong with it; the state-dict reader still names it."""
    from refimpl.models import rwkv
    from refimpl.models.rwkv.checkpoint import read_state_dict
    p = tmp_path / "model.bin"
    p.write_bytes((0x67676D66).to_bytes(4, "little") + bytes(100))
    with pytest.raises(refimpl.RWKVError, match="model.bin: rwkv.cpp file version 0; refimpl .as rwkv.cpp. reads 100"):
        rwkv.load(p)
    with pytest.raises(refimpl.RWKVError, match="looks like an rwkv.cpp model file.*rwkv.load"):
        read_state_dict(p)
