"""llama2.c checkpoints and tokenizer.bin: a writer for export.py's formats, the loader, llama.forward against
an f64 transcription of run.c's forward, run.c's BPE merge loop, malformed files, and the CLI."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, strategies as st

from refimpl.__main__ import main
from refimpl.models import llama, llama2c
from refimpl.testing import assert_nmse, nmse, tol

# ---------------------------------------------------------------------------------------------
# Writers: the byte layouts of karpathy/llama2.c export.py (legacy_export, version1_export, version2_export)
# and tokenizer.py (export), written out here from the format description.

pytestmark = pytest.mark.golden

NAMES_V0 = ["token_embedding_table", "rms_att_weight", "wq", "wk", "wv", "wo", "rms_ffn_weight", "w1", "w2",
            "w3", "rms_final_weight"]
NORMS = ["rms_att_weight", "rms_ffn_weight", "rms_final_weight"]
MATRICES = ["token_embedding_table", "wq", "wk", "wv", "wo", "w1", "w2", "w3"]


def random_weights(cfg: dict, seed: int = 0, shared: bool = False) -> dict:
    """llama2.c's TransformerWeights as f32 arrays, stacked over layers, NumPy order (n_out, n_in)."""
    rng = np.random.default_rng(seed)
    d, h, L, V = cfg["dim"], cfg["hidden_dim"], cfg["n_layers"], cfg["vocab_size"]
    kv = cfg["n_kv_heads"] * (d // cfg["n_heads"])

    def m(*shape):
        return (rng.standard_normal(shape) * shape[-1] ** -0.5).astype(np.float32)

    def gain(*shape):
        return (1.0 + 0.3 * rng.standard_normal(shape)).astype(np.float32)

    w = {"token_embedding_table": rng.standard_normal((V, d)).astype(np.float32),
         "rms_att_weight": gain(L, d), "wq": m(L, d, d), "wk": m(L, kv, d), "wv": m(L, kv, d), "wo": m(L, d, d),
         "rms_ffn_weight": gain(L, d), "w1": m(L, h, d), "w2": m(L, d, h), "w3": m(L, h, d),
         "rms_final_weight": gain(d)}
    w["wcls"] = w["token_embedding_table"] if shared else m(V, d)
    return w


def _q80(x: np.ndarray, gs: int):
    """export.py's quantize_q80 on one tensor: symmetric int8 per group of gs, scale = max|x| / 127."""
    g = x.reshape(-1, gs).astype(np.float32)
    scale = (np.abs(g).max(axis=1) / np.float32(127.0)).astype(np.float32)
    q = np.round(g / scale[:, None]).astype(np.int8)
    return q, scale


def write_checkpoint(path, cfg: dict, w: dict, version: int, shared: bool, group_size: int = 8) -> dict:
    """Write a llama2.c checkpoint; returns the weights the file holds (version 2: the dequantized ones)."""
    c = dict(cfg)
    hs = c["dim"] // c["n_heads"]
    out = dict(w)
    with open(path, "wb") as f:
        if version == 0:
            c["vocab_size"] = c["vocab_size"] if shared else -c["vocab_size"]
            f.write(struct.pack("<7i", *(c[k] for k in llama2c.CONFIG_FIELDS)))
            for k in NAMES_V0:
                f.write(w[k].astype("<f4").tobytes())
            freqs = 1.0 / 10000.0 ** (np.arange(0, hs, 2)[: hs // 2] / hs)
            ang = np.outer(np.arange(c["seq_len"]), freqs).astype(np.float32)
            f.write(np.cos(ang).astype("<f4").tobytes())
            f.write(np.sin(ang).astype("<f4").tobytes())
        else:
            f.write(struct.pack("<Ii", llama2c.MAGIC, version))
            f.write(struct.pack("<7i", *(c[k] for k in llama2c.CONFIG_FIELDS)))
            f.write(struct.pack("<B", int(shared)))
            if version == 2:
                f.write(struct.pack("<i", group_size))
            f.write(b"\0" * (256 - f.tell()))
            if version == 1:
                for k in NORMS + MATRICES:
                    f.write(w[k].astype("<f4").tobytes())
            else:
                for k in NORMS:
                    f.write(w[k].astype("<f4").tobytes())
                for k in MATRICES:
                    per_layer = [w[k]] if k == "token_embedding_table" else list(w[k])
                    deq = []
                    for x in per_layer:
                        q, s = _q80(x, group_size)
                        f.write(q.tobytes())
                        f.write(s.astype("<f4").tobytes())
                        deq.append((q.astype(np.float32) * s[:, None]).reshape(x.shape))
                    out[k] = deq[0] if k == "token_embedding_table" else np.stack(deq)
            if shared:
                out["wcls"] = out["token_embedding_table"]
        if not shared:
            if version == 2:
                q, s = _q80(w["wcls"], group_size)
                f.write(q.tobytes())
                f.write(s.astype("<f4").tobytes())
                out["wcls"] = (q.astype(np.float32) * s[:, None]).reshape(w["wcls"].shape)
            else:
                f.write(w["wcls"].astype("<f4").tobytes())
    return out


def write_tokenizer(path, pieces: list[bytes], scores, max_token_length: int | None = None):
    with open(path, "wb") as f:
        f.write(struct.pack("<I", max_token_length or max(len(p) for p in pieces)))
        for p, s in zip(pieces, scores):
            f.write(struct.pack("<fi", s, len(p)))
            f.write(p)


# A hand-built vocabulary in llama2.c's layout: unk, BOS, EOS, the 256 byte tokens, then pieces with scores.
EXTRA = [(b" ", -1.0), (b"a", -1.0), (b"b", -1.0), (b"c", -1.0), (b"d", -1.0), (b"e", -1.0), (b"\n", -1.0),
         (b"ab", -1.0), (b"bc", -0.5), (b" a", -3.0), (b" ab", -0.2), (b"aa", -1.5), (b"dd", -1e10),
         ("\u00fc".encode(), -1.0), (b" e", -2.0), (b"ee", -2.5), (b" ee", -0.1)]
PIECES = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [f"<0x{b:02X}>".encode() for b in range(256)] + [p for p, _ in EXTRA]
SCORES = [0.0, 0.0, 0.0] + [0.0] * 256 + [s for _, s in EXTRA]
ID = {p: i for i, p in enumerate(PIECES)}
V = len(PIECES)


def config(**kw) -> dict:
    """A run.c Config with the hand-built vocabulary's size."""
    return dict(kw, vocab_size=V)


CONFIGS = {   # name: (Config, version, shared, group_size)
    "v0-separate-gqa": (config(dim=32, hidden_dim=48, n_layers=2, n_heads=4, n_kv_heads=2, seq_len=32), 0, False, 0),
    "v0-shared-mha": (config(dim=32, hidden_dim=40, n_layers=2, n_heads=4, n_kv_heads=4, seq_len=24), 0, True, 0),
    "v1-shared-gqa": (config(dim=32, hidden_dim=48, n_layers=3, n_heads=4, n_kv_heads=2, seq_len=32), 1, True, 0),
    "v1-separate-mqa": (config(dim=48, hidden_dim=64, n_layers=2, n_heads=6, n_kv_heads=1, seq_len=32), 1, False, 0),
    "v2-shared-gqa": (config(dim=32, hidden_dim=48, n_layers=2, n_heads=4, n_kv_heads=2, seq_len=32), 2, True, 8),
    "v2-separate-gs16": (config(dim=32, hidden_dim=48, n_layers=2, n_heads=4, n_kv_heads=1, seq_len=32), 2, False, 16),
}


@pytest.fixture(scope="module")
def tokenizer_bin(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.bin"
    write_tokenizer(path, PIECES, SCORES)
    return path


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def case(request, tmp_path_factory, tokenizer_bin):
    cfg, version, shared, gs = CONFIGS[request.param]
    path = tmp_path_factory.mktemp("ck") / f"{request.param}.bin"
    held = write_checkpoint(path, cfg, random_weights(cfg, seed=len(request.param), shared=shared), version, shared,
                            gs or 8)
    return dict(path=path, cfg=cfg, version=version, shared=shared, weights=held,
                model=llama2c.load(path, tokenizer_bin))


# ---------------------------------------------------------------------------------------------
# run.c's forward, transcribed in f64: one token at a time, explicit loops over heads and positions.

def run_c_forward(w: dict, cfg: dict, tokens) -> np.ndarray:
    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    dim = cfg["dim"]
    n_heads, n_kv = cfg["n_heads"], cfg["n_kv_heads"]
    hs = dim // n_heads
    kv_dim = n_kv * hs
    kv_mul = n_heads // n_kv
    L = cfg["n_layers"]
    key_cache = np.zeros((L, len(tokens), kv_dim))
    value_cache = np.zeros((L, len(tokens), kv_dim))

    def rmsnorm(x, g):
        return g * (x / np.sqrt(np.mean(x * x) + 1e-5))

    logits = []
    for pos, token in enumerate(tokens):
        x = w["token_embedding_table"][token].copy()
        for l in range(L):
            xb = rmsnorm(x, w["rms_att_weight"][l])
            q, k, v = w["wq"][l] @ xb, w["wk"][l] @ xb, w["wv"][l] @ xb
            for i in range(0, dim, 2):             # rotate adjacent pairs; k only below kv_dim
                val = pos * (1.0 / 10000.0 ** ((i % hs) / hs))
                fcr, fci = np.cos(val), np.sin(val)
                for vec in ((q, k) if i < kv_dim else (q,)):
                    v0, v1 = vec[i], vec[i + 1]
                    vec[i], vec[i + 1] = v0 * fcr - v1 * fci, v0 * fci + v1 * fcr
            key_cache[l, pos], value_cache[l, pos] = k, v
            xb = np.zeros(dim)
            for h in range(n_heads):
                qh = q[h * hs:(h + 1) * hs]
                kh = (h // kv_mul) * hs
                att = np.array([qh @ key_cache[l, t, kh:kh + hs] / np.sqrt(hs) for t in range(pos + 1)])
                att = np.exp(att - att.max())
                att /= att.sum()
                for t in range(pos + 1):
                    xb[h * hs:(h + 1) * hs] += att[t] * value_cache[l, t, kh:kh + hs]
            x = x + w["wo"][l] @ xb
            xb = rmsnorm(x, w["rms_ffn_weight"][l])
            hb, hb2 = w["w1"][l] @ xb, w["w3"][l] @ xb
            hb = hb * (1.0 / (1.0 + np.exp(-hb))) * hb2
            x = x + w["w2"][l] @ hb
        x = rmsnorm(x, w["rms_final_weight"])
        logits.append(w["wcls"] @ x)
    return np.array(logits)


TOKENS = [1, 259, 275, 5, 42, 42, 7, 0, 270, 11, 2, 100]


# ---------------------------------------------------------------------------------------------
# loader

def test_loader_maps_every_weight_as_written(case):
    m, w, cfg = case["model"], case["weights"], case["cfg"]
    hp = m.hparams
    assert (hp.n_embd, hp.n_ff, hp.n_layer, hp.n_head, hp.n_head_kv, hp.n_vocab, hp.n_ctx_train) == tuple(
        cfg[k] for k in llama2c.CONFIG_FIELDS)
    assert (hp.head_dim, hp.n_rot, hp.rms_eps, hp.rope_base, hp.rope_mode) == (
        cfg["dim"] // cfg["n_heads"], cfg["dim"] // cfg["n_heads"], 1e-5, 10000.0, llama.ROPE_TYPE_NORMAL)
    eq = np.testing.assert_array_equal
    eq(m.token_embd, w["token_embedding_table"])
    eq(m.output_norm, w["rms_final_weight"])
    eq(m.output, w["wcls"])
    assert (m.output is m.token_embd) == case["shared"]
    for i, ly in enumerate(m.layers):
        for field, name in [("attn_norm", "rms_att_weight"), ("attn_q", "wq"), ("attn_k", "wk"), ("attn_v", "wv"),
                            ("attn_output", "wo"), ("ffn_norm", "rms_ffn_weight"), ("ffn_gate", "w1"),
                            ("ffn_down", "w2"), ("ffn_up", "w3")]:
            eq(getattr(ly, field), w[name][i], err_msg=f"layer {i} {field}")
    if case["version"] < 2:           # f32 files: views into the read-only memory map, no copies
        assert isinstance(m.layers[0].attn_q.base, np.ndarray) and not m.layers[0].attn_q.flags.writeable
        assert not m.token_embd.flags.owndata


def test_forward_equals_run_c_in_f64(case):
    m = case["model"]
    got = llama.forward(m, TOKENS, llama.new_cache(m, 16))
    want = run_c_forward(case["weights"], case["cfg"], TOKENS)
    assert_nmse(got, want, tol("llama2c.forward", "f32", "f64").nmse, "llama.forward vs run.c in f64")


def test_decode_token_by_token_equals_prefill(case):
    m = case["model"]
    full = llama.forward(m, TOKENS, llama.new_cache(m, 16))
    c = llama.new_cache(m, 16)
    steps = np.concatenate([llama.forward(m, [t], c) for t in TOKENS])
    assert_nmse(steps, full, tol("llama.forward", "f32", "prefill").nmse, "token-by-token vs prefill")


def test_version2_is_dequantized_as_runq(tmp_path):
    cfg, _, _, gs = CONFIGS["v2-separate-gs16"]
    w = random_weights(cfg, seed=3)
    held = write_checkpoint(tmp_path / "q.bin", cfg, w, 2, False, gs)
    ck = llama2c.read_checkpoint(tmp_path / "q.bin")
    assert ck.group_size == gs and ck.version == 2
    for name in MATRICES + ["wcls"]:
        np.testing.assert_array_equal(ck.tensors[name], held[name], err_msg=name)   # q * s, one f32 product
        assert 0 < nmse(ck.tensors[name], w[name]) < 1e-3                           # and it is a quantization


def test_generate_with_the_tokenizer(case):
    m = case["model"]
    text = "".join(llama.generate(m, "abc", max_tokens=6))
    ids = m.tokenizer.encode("abc")
    c = llama.new_cache(m, 32)
    logits, out = llama.forward(m, ids, c)[-1], []
    for _ in range(6):                                # greedy, stopping at BOS or EOS as generate does
        t = int(np.argmax(logits))
        if t in (1, 2):
            break
        out.append(t)
        logits = llama.forward(m, [t], c)[-1]
    assert text == m.tokenizer.decode(out)


# ---------------------------------------------------------------------------------------------
# malformed checkpoints

BASE = dict(dim=32, hidden_dim=48, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=V, seq_len=16)


def _write(path, version=1, shared=True, **changes):
    cfg = {**BASE, **changes}
    w = random_weights(BASE, shared=shared)
    write_checkpoint(path, cfg, w, version, shared)
    return path


@pytest.mark.parametrize("version", [0, 1, 2])
def test_truncated_file_names_the_size(tmp_path, version):
    p = _write(tmp_path / "t.bin", version)
    data = p.read_bytes()
    p.write_bytes(data[:-4])
    with pytest.raises(ValueError, match=rf"t\.bin: file size {len(data) - 4} bytes does not match .* needs "
                                         rf"{len(data)} bytes \(truncated\?\)"):
        llama2c.read_checkpoint(p)
    p.write_bytes(data + b"\0" * 4)
    with pytest.raises(ValueError, match="does not match the header"):
        llama2c.read_checkpoint(p)
    p.write_bytes(data[:20])
    with pytest.raises(ValueError, match="too small"):
        llama2c.read_checkpoint(p)


def test_bad_magic_and_unknown_version(tmp_path):
    p = _write(tmp_path / "m.bin")
    data = bytearray(p.read_bytes())
    data[:4] = b"ak43"
    p.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"m\.bin: no 'ak42' magic \(read as a legacy version 0 header"):
        llama2c.read_checkpoint(p)
    data[:4] = struct.pack("<I", llama2c.MAGIC)
    data[4:8] = struct.pack("<i", 3)
    p.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"m\.bin: version = 3"):
        llama2c.read_checkpoint(p)
    data[4:8] = struct.pack("<i", 1)
    data[36] = 7
    p.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="shared_classifier flag = 7"):
        llama2c.read_checkpoint(p)


@pytest.mark.parametrize("version", [0, 1])
@pytest.mark.parametrize("changes, message", [
    (dict(n_heads=5), "n_heads = 5 does not divide dim = 32"),
    (dict(n_kv_heads=3), "n_kv_heads = 3 does not divide n_heads = 4"),
    (dict(n_layers=0), "n_layers = 0: must be positive"),
    (dict(hidden_dim=-4), "hidden_dim = -4: must be positive"),
    (config(dim=20, n_heads=4), "head size dim / n_heads = 5 is odd"),
    (dict(hidden_dim=40), "does not match the header"),          # the header disagrees with the weights written
    (dict(vocab_size=V + 1), "does not match the header"),
])
def test_inconsistent_header_is_a_clear_error(tmp_path, version, changes, message):
    p = tmp_path / "bad.bin"
    _write(p, version, **changes)
    with pytest.raises(ValueError, match=message) as e:
        llama2c.read_checkpoint(p)
    assert str(p) in str(e.value)


def test_version2_group_size_is_checked(tmp_path):
    p = _write(tmp_path / "g.bin", 2)
    data = bytearray(p.read_bytes())
    data[37:41] = struct.pack("<i", 12)
    p.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="group_size = 12: must be positive and divide dim = 32"):
        llama2c.read_checkpoint(p)


def test_tokenizer_files_are_checked(tmp_path, tokenizer_bin):
    ck = _write(tmp_path / "ck.bin")
    data = tokenizer_bin.read_bytes()
    bad = tmp_path / "tok.bin"
    bad.write_bytes(data[:-1])
    with pytest.raises(ValueError, match=r"tok\.bin: token \d+: truncated piece"):
        llama2c.load_tokenizer(bad)
    bad.write_bytes(data[:-len(EXTRA[-1][0]) - 5])
    with pytest.raises(ValueError, match="truncated score/length"):
        llama2c.load_tokenizer(bad)
    write_tokenizer(bad, PIECES[:-1], SCORES[:-1])
    with pytest.raises(ValueError, match=f"has {V - 1} tokens but the checkpoint's vocab_size is {V}"):
        llama2c.load(ck, bad)
    write_tokenizer(bad, PIECES, SCORES, max_token_length=3)
    with pytest.raises(ValueError, match=r"token 0: length = 5 is outside \[0, max_token_length = 3\]"):
        llama2c.load_tokenizer(bad)


# ---------------------------------------------------------------------------------------------
# tokenizer: run.c's encode, written out naively (full rescans) as the specification

def run_c_encode(pieces: list[bytes], scores, text: str, bos: bool = True) -> list[int]:
    lookup = {}
    for i, p in enumerate(pieces):
        lookup.setdefault(p, i)
    data = text.encode("utf-8")
    tokens = [1] if bos else []
    if data:
        tokens.append(lookup[b" "])
    buf = b""
    for k, c in enumerate(data):
        if c & 0xC0 != 0x80:
            buf = b""
        buf += bytes([c])
        if k + 1 < len(data) and data[k + 1] & 0xC0 == 0x80 and len(buf) < 4:
            continue
        if buf in lookup:
            tokens.append(lookup[buf])
        else:
            tokens.extend(b + 3 for b in buf)
        buf = b""
    while True:
        best, best_id, best_idx = np.float32(-1e10), -1, -1
        for i in range(len(tokens) - 1):
            tid = lookup.get(pieces[tokens[i]] + pieces[tokens[i + 1]], -1)
            if tid != -1 and np.float32(scores[tid]) > best:
                best, best_id, best_idx = np.float32(scores[tid]), tid, i
        if best_idx == -1:
            return tokens
        tokens[best_idx:best_idx + 2] = [best_id]


@pytest.fixture(scope="module")
def tok(tokenizer_bin):
    return llama2c.load_tokenizer(tokenizer_bin, V)


def test_tokenizer_reads_the_file(tok):
    assert tok.n_vocab == V and tok.pieces == PIECES and tok.max_token_length == max(len(p) for p in PIECES)
    assert (tok.bos_id, tok.eos_id, tok.eot_id, tok.unk_id) == (1, 2, 1, 0)
    assert tok.eog_ids == {1, 2}
    np.testing.assert_array_equal(tok.scores, np.float32(SCORES))


@pytest.mark.parametrize("text, want", [
    ("abc", [1, ID[b" a"], ID[b"bc"]]),             # "bc" (-0.5) before "ab" (-1): not left to right
    ("aaa", [1, ID[b" "], ID[b"aa"], ID[b"a"]]),    # "aa" twice at the same score: the leftmost pair
    ("dd", [1, ID[b" "], ID[b"d"], ID[b"d"]]),      # a score of -1e10 never merges (run.c's initial best)
    ("eee", [1, ID[b" ee"], ID[b"e"]]),             # " e" (-2) first, then " ee" from a merged token
    ("\u00fc\u00e9", [1, ID[b" "], ID["\u00fc".encode()], 0xC3 + 3, 0xA9 + 3]),   # byte fallback at id byte+3
    ("", [1]),
])
def test_encode_follows_run_c(tok, text, want):
    assert tok.encode(text) == want
    assert tok.encode(text, add_special=False) == want[1:]
    assert run_c_encode(PIECES, SCORES, text) == want


# lone surrogates are not text (str.encode refuses them), so they are not drawn
@given(st.text(alphabet=st.sampled_from(list("abcde \n\u00fc\u00e9\u4e2d"))
               | st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_encode_equals_run_c_and_round_trips(text):
    tok = llama2c.Llama2cTokenizer(PIECES, SCORES, 6)
    ids = tok.encode(text)
    assert ids == run_c_encode(PIECES, SCORES, text)
    assert tok.decode(ids) == text
    s = tok.stream()
    assert "".join(s.push(i) for i in ids) + s.flush() == text


def test_decode_pieces_and_bos_rule(tok):
    assert tok.token_to_piece(ID[b" ab"]) == b" ab"
    assert tok.token_to_piece(0xC3 + 3) == b"\xc3"
    assert tok.token_to_piece(1) == b"" and tok.token_to_piece(1, special=True) == b"\n<s>\n"
    assert tok.decode([1, ID[b" a"], ID[b" a"]]) == "a a"          # only the piece after BOS loses its space
    assert tok.decode([ID[b" a"]]) == " a"
    assert tok.decode([1, 0x20 + 3, ID[b"a"]]) == " a"               # <0x20> is not a piece starting with " "
    assert tok.decode([1, ID[b" a"], 2], special=True) == "\n<s>\na\n</s>\n"
    s = tok.stream()
    assert [s.push(i) for i in [1, ID[b" e"], 0xE4 + 3, 0xB8 + 3, 0xAD + 3]] == ["", "e", "", "", "\u4e2d"]


# ---------------------------------------------------------------------------------------------
# command line

def test_inspect_verify_finds_a_planted_nan(tmp_path, capsys):
    p = _write(tmp_path / "n.bin", 1, shared=False)
    assert main(["inspect", str(p), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "llama2.c checkpoint version 1" in out and "every weight is finite" in out
    assert "wq" in out and "(2, 32, 32)" in out and "std" in out
    off = 256 + 4 * (2 * 2 * 32 + 32 + V * 32) + 4 * 37        # an element of wq (layer 0), after the norms
    with open(p, "r+b") as f:                                    # and the token embeddings
        f.seek(off)
        f.write(struct.pack("<f", float("nan")))
    assert main(["inspect", str(p), "--verify"]) == 1
    out = capsys.readouterr().out
    assert "NON-FINITE weights in: wq" in out


def test_cli_generate_runs_a_checkpoint(tmp_path, tokenizer_bin, capsys):
    p = _write(tmp_path / "g.bin", 0, shared=False)
    m = llama2c.load(p, tokenizer_bin)
    want = "".join(llama.generate(m, "abc", 5))
    assert main(["generate", "-c", str(p), "-k", str(tokenizer_bin), "-p", "abc", "-n", "5"]) == 0
    assert capsys.readouterr().out == "abc" + want          # the stats line goes to stderr
    assert main(["generate", "-m", str(p), "-k", str(tokenizer_bin), "-p", "abc", "-s", "5", "-t", "0"]) == 0
    assert capsys.readouterr().out == "abc" + want          # the stats line goes to stderr


def test_cli_chat_runs_a_checkpoint(tmp_path, tokenizer_bin, capsys, monkeypatch):
    p = _write(tmp_path / "c.bin", 1)
    lines = iter(["abc", "dd"])

    def fake_input(prompt=""):
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", fake_input)
    assert main(["chat", "-c", str(p), "-k", str(tokenizer_bin), "-n", "4", "--system", "be brief"]) == 0
