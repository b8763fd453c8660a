"""Llama forward on tiny random GGUFs: cache, chunking and forking identities, loader checks."""
import numpy as np
import pytest

from refimpl.models import llama
from refimpl.testing import assert_nmse, tol

from .tiny import write_tiny_llama


pytestmark = pytest.mark.property

@pytest.fixture(scope="module", params=[dict(), dict(tied=True, n_head_kv=4), dict(wtype="q8_0", n_embd=64)],
            ids=["gqa-untied-f32", "mha-tied", "q8_0"])
def model(request, tmp_path_factory):
    path = write_tiny_llama(tmp_path_factory.mktemp("m") / "tiny.gguf", **request.param)
    return llama.load(path)


TOKENS = [5, 17, 3, 90, 42, 42, 7, 0, 64, 11]


def test_decode_token_by_token_equals_prefill(model):
    full = llama.forward(model, TOKENS, llama.new_cache(model, 32))
    c = llama.new_cache(model, 32)
    steps = np.concatenate([llama.forward(model, [t], c) for t in TOKENS])
    assert_nmse(steps, full, tol("llama.forward", "f32", "prefill").nmse, "token-by-token vs prefill")


def test_chunked_prefill_equals_one_shot(model):
    full = llama.forward(model, TOKENS, llama.new_cache(model, 32))
    c = llama.new_cache(model, 32)
    parts = [llama.forward(model, TOKENS[:3], c), llama.forward(model, TOKENS[3:8], c),
             llama.forward(model, TOKENS[8:], c)]
    assert_nmse(np.concatenate(parts), full, tol("llama.forward", "f32", "prefill").nmse, "chunked vs one shot")


def test_cache_copy_forks_a_conversation(model):
    c = llama.new_cache(model, 32)
    llama.forward(model, TOKENS[:5], c)
    fork = c.copy()
    a = llama.forward(model, [1, 2], c)
    b = llama.forward(model, [1, 2], fork)
    np.testing.assert_array_equal(a, b)
    assert c.n_past == fork.n_past == 7
    llama.forward(model, [3], fork)
    assert c.n_past == 7                               # the original is untouched


def test_first_position_is_independent_of_later_tokens(model):
    """Causality: logits of position 0 depend only on token 0."""
    a = llama.forward(model, [5, 1, 2], llama.new_cache(model, 8))
    b = llama.forward(model, [5, 9, 9, 9], llama.new_cache(model, 8))
    np.testing.assert_array_equal(a[0], b[0])


def test_capture_names_follow_llama_cpp(model):
    got = {}
    llama.forward(model, TOKENS[:4], llama.new_cache(model, 8), capture=got)
    for name in ("attn_norm-0", "Qcur-0", "Kcur-0", "Vcur-0", "kq-0", "kq_soft_max-0", "ffn_inp-0", "ffn_out-0",
                 "l_out-1", "result_norm", "result_output"):
        assert name in got, name
    hp = model.hparams
    assert got["kq-0"].shape == (hp.n_head, 4, 4)          # ne [n_kv, n_tokens, n_head]
    assert got["result_output"].shape == (4, hp.n_vocab)


def test_cache_overflow_and_bad_tokens_are_clear_errors(model):
    c = llama.new_cache(model, 4)
    with pytest.raises(ValueError, match="KV cache full"):
        llama.forward(model, TOKENS[:5], c)
    with pytest.raises(ValueError, match="out of range"):
        llama.forward(model, [model.hparams.n_vocab], llama.new_cache(model, 4))


def test_loader_rejects_inconsistent_hyper_parameters(tmp_path):
    from refimpl import gguf
    path = write_tiny_llama(tmp_path / "ok.gguf")
    f = gguf.load(path)
    md = dict(f.metadata)
    md["llama.attention.head_count"] = 5                  # does not divide n_embd 64
    gguf.save(tmp_path / "bad.gguf", md,
              {k: np.array(v) if not hasattr(v, "type") else v for k, v in f.tensors.items()})
    with pytest.raises(ValueError, match="head_count 5 does not divide embedding_length 64"):
        llama.load(tmp_path / "bad.gguf")


def test_generate_stops_before_a_stop_string(tmp_path):
    """With stop=(s,), the streamed text is the unstopped text cut just before the first s."""
    m = llama.load(write_tiny_llama(tmp_path / "t.gguf"))       # with its byte-level vocabulary
    prompt = [40, 41, 42]                                        # continues for 12 tokens without EOS
    full = "".join(llama.generate(m, prompt, 12))
    assert len(full) >= 6, full
    stop = full[3:5]
    cut = "".join(llama.generate(m, prompt, 12, stop=(stop,)))
    assert cut == full[: full.index(stop)]
