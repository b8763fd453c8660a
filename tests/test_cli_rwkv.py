"""`refimpl generate` / `refimpl chat` on tiny random RWKV models: rwkv6 / rwkv7 GGUFs written by refimpl's
converter with a byte vocabulary (token 0 "<s>", the 256 bytes as tokens 1..256), and v4 / v5.2 checkpoints
with a World vocabulary file (--vocab). The command's tokens must be those of refimpl.models.rwkv called
directly; chat must carry the recurrent state from turn to turn and give what re-running the whole history
from a new state gives."""
import io

import numpy as np
import pytest

import refimpl
from refimpl.__main__ import main
from refimpl.models.rwkv.chat import chat_turns as _rwkv_chat_turns
from refimpl.convert import rwkv as conv
from refimpl.models import rwkv
from refimpl.sampling import Sampler
from refimpl.testing import nmse, tol

from .models.rwkv_tiny import tiny_state_dict, write_tiny_rwkv

pytestmark = pytest.mark.property

VOCAB = 257                              # "<s>" + the 256 bytes
STATE_KEYS = ("shift_att", "shift_ffn", "wkv")
OPTS = ["--backend", "numpy"]            # the reference computations below run on the NumPy backend too
TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def _sd(version, seed=3):
    return tiny_state_dict(version, n_layer=2, n_embd=64, head_size=32, vocab=VOCAB, lora=8, seed=seed)


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    d = tmp_path_factory.mktemp("rwkv_cli")
    out = {v: str(conv.convert(_sd(str(v)), d / f"tiny{v}.gguf")) for v in (6, 7)}
    out["template"] = str(conv.convert(_sd("7"), d / "tmpl.gguf", chat_template=TEMPLATE))
    out["last_only"] = str(conv.convert(_sd("7"), d / "last.gguf",
                                        chat_template="{{ messages[-1].content }}{{ '>' }}"))
    return out


@pytest.fixture(scope="module")
def world_vocab(tmp_path_factory):
    """A World vocabulary file (the rwkv_vocab_v20230424.txt format) of the 256 single bytes."""
    p = tmp_path_factory.mktemp("vocab") / "bytes_vocab.txt"
    p.write_text("".join(f"{b + 1} {bytes([b])!r} 1\n" for b in range(256)), encoding="utf-8")
    return str(p)


def _greedy(model, ids, n):
    """Greedy continuation by rwkv.forward, stopping at the tokenizer's end-of-generation ids."""
    stop = set(model.tokenizer.eog_ids) | {model.tokenizer.eos_id}
    logits, state = rwkv.forward(model, ids)
    out = []
    for _ in range(n):
        t = int(np.argmax(logits))
        if t in stop:
            break
        out.append(t)
        logits, state = rwkv.forward(model, [t], state)
    return out


def _stdout(capsys, argv, stdin=None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    assert main(argv) == 0
    return capsys.readouterr()


# -- generate -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", [6, 7])
def test_generate_greedy_is_the_models_tokens(version, ggufs, capsys):
    r = _stdout(capsys, ["generate", "-m", ggufs[version], "-p", "Hello", "-n", "8", "--seed", "0", *OPTS])
    m = rwkv.load(ggufs[version])
    with refimpl.backend("numpy"):
        want = _greedy(m, m.tokenizer.encode("Hello"), 8)
    assert want, "the tiny model stopped at once: pick another seed"
    assert r.out == "Hello" + m.tokenizer.decode(want)
    assert f"{len(want)} tokens" in r.err or f"{len(want) + 1} tokens" in r.err     # +1: a stop token drawn


def test_generate_sampling_is_the_samplers(ggufs, capsys):
    """-t/--top-k/--top-p/--seed build the same Sampler rwkv.generate takes: same seed, same text."""
    argv = ["generate", "-m", ggufs[7], "-p", "abc", "-n", "12", "-t", "0.9", "--top-k", "40", "--top-p", "0.95",
            "--seed", "7", *OPTS]
    a = _stdout(capsys, argv).out
    assert _stdout(capsys, argv).out == a
    m = rwkv.load(ggufs[7])
    with refimpl.backend("numpy"):
        pieces = rwkv.generate(m, "abc", 12, Sampler(temperature=0.9, top_k=40, top_p=0.95, seed=7))
        assert a == "abc" + "".join(pieces)


def test_generate_chat_format_uses_rwkv_turns(ggufs, capsys):
    r = _stdout(capsys, ["generate", "-m", ggufs[6], "-p", " hi ", "--chat-format", "-n", "4", *OPTS])
    m = rwkv.load(ggufs[6])
    with refimpl.backend("numpy"):
        want = _greedy(m, m.tokenizer.encode("User: hi\n\nAssistant:"), 4)
    assert r.out == m.tokenizer.decode(want)


@pytest.mark.parametrize("version,suffix", [("4", ".pth"), ("5.2", ".safetensors")])
def test_generate_checkpoint_with_vocab(version, suffix, world_vocab, tmp_path, capsys):
    if suffix == ".pth":
        pytest.importorskip("torch")
    p = write_tiny_rwkv(tmp_path / f"tiny{suffix}", version, state_dict=_sd(version))
    assert main(["generate", "-m", str(p), "-p", "x", "-n", "2", *OPTS]) == 1     # one line, no traceback
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("refimpl: error: ") and "--vocab" in err[-1]
    r = _stdout(capsys, ["generate", "-m", str(p), "--vocab", world_vocab, "-p", "Hi!", "-n", "6", *OPTS])
    m = rwkv.load(p)
    m.tokenizer = refimpl.tokenizers.rwkv.RWKVTokenizer.from_world_vocab(world_vocab, vocab_size=VOCAB)
    with refimpl.backend("numpy"):
        want = _greedy(m, m.tokenizer.encode("Hi!"), 6)
    assert want and r.out == "Hi!" + m.tokenizer.decode(want)
    # the vocabulary file next to the checkpoint is found without --vocab
    (tmp_path / "rwkv_vocab_v20230424.txt").write_text(open(world_vocab, encoding="utf-8").read(), encoding="utf-8")
    assert _stdout(capsys, ["generate", "-m", str(p), "-p", "Hi!", "-n", "6", *OPTS]).out == r.out


def test_common_model_options(ggufs, capsys):
    """--threads / --numerics / --seed are accepted (demo takes them too); ggml numerics change little."""
    a = _stdout(capsys, ["generate", "-m", ggufs[7], "-p", "Hello", "-n", "8", "--threads", "1",
                         "--numerics", "ggml", "--seed", "1", *OPTS]).out
    assert a.startswith("Hello") and len(a) > len("Hello")
    for cmd in ("demo", "chat", "generate"):
        with pytest.raises(SystemExit) as e:
            main([cmd, "--help"])
        assert e.value.code == 0
        out = capsys.readouterr().out
        assert all(o in out for o in ("--backend", "--threads", "--numerics", "--seed")), cmd


def test_llama_gguf_is_not_taken_for_rwkv(tmp_path):
    from refimpl.models.rwkv.chat import model_path
    p = tmp_path / "x.gguf"
    refimpl.gguf.save(p, {"general.architecture": "llama"}, {"w": np.zeros((2, 32), np.float32)})
    assert model_path(str(p)) is None
    q = tmp_path / "stories.bin"
    q.write_bytes(b"\x20\x01\x00\x00" + bytes(64))          # a llama2.c header, not a torch zip
    assert model_path(str(q)) is None


# -- chat ---------------------------------------------------------------------------------------------------

TURNS = ["hello", "and again", "third"]


def _rerun_history(m, turns, n, system=""):
    """The replies RWKV's "User: ...\\n\\nAssistant:" chat should give, each from the WHOLE history so far, run
    from a new state (no state carried), and the history's token ids."""
    tok = m.tokenizer
    stop = set(tok.eog_ids) | {tok.eos_id}
    hist, replies = [], []
    for k, u in enumerate(turns):
        hist += tok.encode((f"System: {system}\n\n" if system and k == 0 else "") + f"User: {u}\n\nAssistant:")
        reply = []
        for _ in range(n):
            logits, _ = rwkv.forward(m, hist + reply)
            t = int(np.argmax(logits))
            if t in stop:
                break
            reply.append(t)
            if "\n\n" in tok.decode(reply):
                break
        hist += reply
        if not tok.decode(reply).endswith("\n\n"):
            hist += tok.encode("\n\n")
        replies.append(reply)
    return replies, hist


@pytest.mark.parametrize("version", [6, 7])
def test_chat_state_carry_over_equals_rerunning_the_history(version, ggufs):
    m = rwkv.load(ggufs[version])
    with refimpl.backend("numpy"):
        got = list(_rwkv_chat_turns(m, Sampler(), TURNS, system="be brief", n_predict=8))
        want, hist = _rerun_history(m, TURNS, 8, system="be brief")
        _, full = rwkv.forward(m, hist)
    assert all(want) and [g["reply"] for g in got] == [m.tokenizer.decode(r) for r in want]
    assert sum((g["ids"] for g in got), []) == hist              # each turn ran only its own new tokens
    assert not any(g["restarted"] for g in got)
    t = tol("rwkv.forward", "f32", "sequence").nmse
    for k in STATE_KEYS:
        assert nmse(getattr(got[-1]["state"], k), getattr(full, k)) <= t, k


def test_chat_command_prints_the_replies(ggufs, capsys, monkeypatch):
    r = _stdout(capsys, ["chat", "-m", ggufs[7], "-n", "8", *OPTS], stdin="\n".join(TURNS) + "\n",
                monkeypatch=monkeypatch)
    m = rwkv.load(ggufs[7])
    with refimpl.backend("numpy"):
        want, _ = _rerun_history(m, TURNS, 8)
    shown = [m.tokenizer.decode(w).lstrip(" ").rstrip("\n") for w in want]
    assert r.out == "".join(f"> {s}\n" for s in shown) + "> \n"


def test_chat_with_a_jinja_template(ggufs):
    """A Jinja template: each turn runs only what the rendered conversation adds (the closing tag of the
    reply, then the next user turn); the state equals one run over everything."""
    m = rwkv.load(ggufs["template"])
    tok = m.tokenizer
    with refimpl.backend("numpy"):
        got = list(_rwkv_chat_turns(m, Sampler(), TURNS[:2], n_predict=6))
        _, full = rwkv.forward(m, sum((g["ids"] for g in got), []))
    assert got[0]["ids"][:len(tok.encode("<user>hello</user>\n<assistant>"))] == tok.encode(
        "<user>hello</user>\n<assistant>")
    assert tok.decode(got[0]["ids"]).endswith("</assistant>\n")
    assert tok.decode(got[1]["ids"]).startswith("<user>and again</user>\n<assistant>")
    assert not any(g["restarted"] for g in got)
    t = tol("rwkv.forward", "f32", "sequence").nmse
    for k in STATE_KEYS:
        assert nmse(getattr(got[-1]["state"], k), getattr(full, k)) <= t, k


def test_chat_template_that_rewrites_the_history_restarts(ggufs):
    """A template whose text for the next turn does not extend what was run: run it all from a new state."""
    m = rwkv.load(ggufs["last_only"])
    with refimpl.backend("numpy"):
        got = list(_rwkv_chat_turns(m, Sampler(), TURNS[:2], n_predict=4))
        _, alone = rwkv.forward(m, got[1]["ids"])
    assert got[1]["restarted"]
    assert m.tokenizer.decode(got[1]["ids"]).startswith("and again>")
    for k in STATE_KEYS:
        assert nmse(getattr(got[1]["state"], k), getattr(alone, k)) <= tol("rwkv.forward", "f32", "sequence").nmse


def test_inspect_still_reads_the_rwkv_gguf(ggufs, capsys):
    assert main(["inspect", ggufs[7]]) == 0
    assert "arch 'rwkv7'" in capsys.readouterr().out
