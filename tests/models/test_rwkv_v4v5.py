"""RWKV-4 and RWKV-5 (5.0, 5.1, 5.2) against transformers and the rwkv package; state, loader and API checks.

tests/golden_data/rwkv_v4.npz and rwkv_v5.npz come from scripts/gen_rwkv_goldens.py: tiny random state dicts
(tests/models/rwkv_tiny.py) run by transformers' RwkvForCausalLM (v4) and by the `rwkv` pip package (ChatRWKV,
"cpu fp32"), every one in one call, token by token and split in two calls. The model is rebuilt here from the
weights stored in the file (so the goldens stay valid if the writer changes); no torch is needed.
"""
import functools
import json
import pathlib

import numpy as np
import pytest

from refimpl.models import rwkv
from refimpl.models.rwkv import checkpoint
from refimpl.testing import nmse, tol

from .rwkv_tiny import VERSIONS, tiny_state_dict, write_tiny_rwkv

pytestmark = pytest.mark.golden

GOLDEN = pathlib.Path(__file__).parent.parent / "golden_data"
STATE_KEYS = ("shift_att", "shift_ffn", "wkv")


def _golden(key):
    z = np.load(GOLDEN / f"rwkv_{key}.npz", allow_pickle=False)
    meta = json.loads(str(z["meta"]))
    return z, meta


GOLDENS = {key: _golden(key) for key in ("v4", "v5")}
CASES = [(key, m["name"], ref) for key, (z, meta) in GOLDENS.items() for m in meta["models"]
         for ref in m["references"]]
# the references that also ran token by token and in two calls (transformers ran one call)
MULTI = [c for c in CASES if f"{c[1]}.{c[2]}.logits_tok" in GOLDENS[c[0]][0].files]


@functools.lru_cache(maxsize=None)
def _model(key, name):
    """the refimpl model rebuilt from the npz's weights"""
    z = GOLDENS[key][0]
    p = f"{name}.w."
    return rwkv.from_state_dict({k[len(p):]: z[k] for k in z.files if k.startswith(p)})


def _case(c):
    """(name, reference, npz, model, tokens, split) of a (file key, model name, reference) triple"""
    key, name, ref = c
    z, meta = GOLDENS[key]
    return name, ref, z, _model(key, name), z[f"{name}.tokens"], meta["split"]


@pytest.fixture(params=CASES, ids=[f"{n}-{r}" for _, n, r in CASES])
def case(request):
    return _case(request.param)


@pytest.fixture(params=MULTI, ids=[f"{n}-{r}" for _, n, r in MULTI])
def multi_case(request):
    return _case(request.param)


def _close(ours, theirs, what, against):
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape} != {theirs.shape}"
    e = nmse(ours, theirs)
    t = tol("rwkv.forward", "f32", against)
    assert e <= t.nmse, f"{what}: NMSE {e:.2e} > {t.nmse:.0e} (max |d| {np.max(np.abs(ours - theirs)):.2e})"


def _state_close(state, z, prefix, against):
    for k in STATE_KEYS:
        _close(getattr(state, k), z[f"{prefix}.{k}"], f"{prefix}.{k}", against)


def test_version_detected(case):
    name, _, _, model, _, _ = case
    assert model.hparams.variant == {"v4": "4", "v5_0": "5.0", "v5_1": "5.1", "v5_2": "5.2"}[name]


def test_one_call_matches_reference(case):
    """All tokens in one forward: the reference's logits (every token for transformers, the last for rwkv)
    and the final state."""
    name, ref, z, model, tokens, _ = case
    logits, state = rwkv.forward(model, tokens, all_logits=True)
    if ref == "transformers":
        _close(logits, z[f"{name}.{ref}.logits_all"], f"{name} logits_all", ref)
    else:
        _close(logits[-1], z[f"{name}.{ref}.logits_seq"], f"{name} logits_seq", ref)
    _state_close(state, z, f"{name}.{ref}.state", ref)


def test_token_by_token_matches_reference(multi_case):
    name, ref, z, model, tokens, _ = multi_case
    state, rows = None, []
    for t in tokens:
        logits, state = rwkv.forward(model, [t], state)
        rows.append(logits)
    _close(np.stack(rows), z[f"{name}.{ref}.logits_tok"], f"{name} logits_tok", ref)
    _state_close(state, z, f"{name}.{ref}.state_tok", ref)


def test_split_calls_match_reference(multi_case):
    """A second call that starts from the first one's state (the reference's sequence path with a state)."""
    name, ref, z, model, tokens, split = multi_case
    _, s = rwkv.forward(model, tokens[:split])
    logits, s = rwkv.forward(model, tokens[split:], s)
    _close(logits, z[f"{name}.{ref}.logits_split"], f"{name} logits_split", ref)
    _state_close(s, z, f"{name}.{ref}.state_split", ref)


# -- sequence mode = token by token, state handling ------------------------------------------------------------

TOKENS = [0, 5, 17, 3, 63, 42, 42, 7, 1, 30]


@pytest.fixture(scope="module", params=["4", "5.0", "5.1", "5.2"])
def tiny(request):
    return rwkv.from_state_dict(tiny_state_dict(request.param, head_size=8, seed=7))


def test_sequence_equals_token_by_token(tiny):
    full, s_full = rwkv.forward(tiny, TOKENS, all_logits=True)
    state, rows = None, []
    for t in TOKENS:
        logits, state = rwkv.forward(tiny, t, state)
        rows.append(logits)
    t = tol("rwkv.forward", "f32", "sequence").nmse
    assert nmse(np.stack(rows), full) <= t
    for k in STATE_KEYS:
        assert nmse(getattr(state, k), getattr(s_full, k)) <= t, k


def test_chunks_equal_one_call(tiny):
    full, s_full = rwkv.forward(tiny, TOKENS)
    _, s = rwkv.forward(tiny, TOKENS[:3])
    _, s = rwkv.forward(tiny, TOKENS[3:7], s)
    last, s = rwkv.forward(tiny, TOKENS[7:], s)
    t = tol("rwkv.forward", "f32", "sequence").nmse
    assert nmse(last, full) <= t
    for k in STATE_KEYS:
        assert nmse(getattr(s, k), getattr(s_full, k)) <= t, k


def test_state_is_not_modified_and_forks(tiny):
    _, s = rwkv.forward(tiny, TOKENS[:4])
    before = s.copy()
    a, sa = rwkv.forward(tiny, [9, 9], s)
    assert s == before
    b, sb = rwkv.forward(tiny, [9, 9], s.copy())
    np.testing.assert_array_equal(a, b)
    assert sa == sb and sa is not s


def test_state_roundtrips_through_npz(tiny, tmp_path):
    _, s = rwkv.forward(tiny, TOKENS)
    s.save(tmp_path / "s.npz")
    assert rwkv.RwkvState.load(tmp_path / "s.npz") == s


def test_new_state_shapes(tiny):
    hp, s = tiny.hparams, rwkv.new_state(tiny)
    assert s.shift_att.shape == s.shift_ffn.shape == (hp.n_layer, hp.n_embd)
    if tiny.version == 4:
        assert s.wkv.shape == (hp.n_layer, 3, hp.n_embd) and np.all(s.wkv[:, 2] == np.float32(-1e38))
    else:
        assert s.wkv.shape == (hp.n_layer, hp.n_head, hp.head_size, hp.head_size) and not s.wkv.any()


def test_bad_inputs_are_refused(tiny):
    with pytest.raises(ValueError, match="out of range"):
        rwkv.forward(tiny, [tiny.hparams.vocab])
    with pytest.raises(ValueError, match="no tokens"):
        rwkv.forward(tiny, [])
    other = rwkv.RwkvState.zeros(6 if tiny.version != 6 else 5, 1, 4, 1, 4)
    with pytest.raises(ValueError, match="RwkvState"):
        rwkv.forward(tiny, [1], other)


def test_capture_names(tiny):
    got = {}
    rwkv.forward(tiny, TOKENS[:3], capture=got)
    names = ["inp_embd", "inp_norm", "result_norm", "result_output"]
    for il in range(tiny.hparams.n_layer):
        names += [f"{n}-{il}" for n in ("attn_norm", "r", "k", "v", "wkv", "attn_out", "ffn_inp", "ffn_norm",
                                        "ffn_out", "l_out")]
        if tiny.version == 5:
            names.append(f"ln_x-{il}")
    assert not set(names) - set(got)
    assert got["result_output"].shape == (1, tiny.hparams.vocab)
    assert got["attn_norm-0"].shape == (3, tiny.hparams.n_embd)


def test_rescale_every_matches_unscaled(tiny):
    """The f16 trick of the rwkv package and llama.cpp: att.output and ffn.value of block i divided by
    2**(i // R), x halved after every R-th block. LayerNorm undoes the scale up to its eps."""
    import dataclasses
    R = 1
    w = dict(tiny.weights)
    for i in range(tiny.hparams.n_layer):
        for n in (f"blocks.{i}.att.output.weight", f"blocks.{i}.ffn.value.weight"):
            w[n] = w[n] / np.float32(2 ** (i // R))
    scaled = rwkv.RwkvModel(tiny.version, dataclasses.replace(tiny.hparams, rescale_every=R), w)
    a, _ = rwkv.forward(tiny, TOKENS)
    b, _ = rwkv.forward(scaled, TOKENS)
    assert nmse(b, a) <= tol("rwkv.forward", "f32", "rescaled").nmse


def test_generate_greedy_ids_without_tokenizer(tiny):
    from refimpl import Sampler
    gen = rwkv.generate(tiny, [3, 4, 5], 6, Sampler(temperature=0.0))
    out = []
    try:
        while True:
            out.append(next(gen))
    except StopIteration as stop:
        final = stop.value
    logits, s = rwkv.forward(tiny, [3, 4, 5])
    want = []
    for _ in range(6):
        want.append(int(np.argmax(logits)))
        logits, s = rwkv.forward(tiny, [want[-1]], s)
    assert out == want
    assert final == s


# -- checkpoints ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", VERSIONS)
def test_detect_version_and_hparams(version):
    sd = tiny_state_dict(version, n_layer=3, n_embd=32, head_size=8, vocab=50)
    hp = checkpoint.hparams_from_state_dict(sd)
    assert hp.variant == {"6": "6.0", "7": "7.0"}.get(version, version)
    assert (hp.n_layer, hp.n_embd, hp.vocab) == (3, 32, 50)
    assert (hp.n_head, hp.head_size) == ((0, 0) if version == "4" else (4, 8))


@pytest.mark.parametrize("suffix", [".safetensors", ".npz", ".pth"])
def test_load_files(tmp_path, suffix):
    pytest.importorskip({".pth": "torch", ".safetensors": "safetensors"}.get(suffix, "numpy"))
    sd = tiny_state_dict("5.2", head_size=8)
    model = rwkv.load(write_tiny_rwkv(tmp_path / f"m{suffix}", state_dict=sd))
    assert model.version == 5 and model.hparams.variant == "5.2"
    assert set(model.weights) == set(sd)
    for k, v in sd.items():
        assert model.weights[k].dtype == np.float32
        np.testing.assert_array_equal(model.weights[k], v, err_msg=k)


def test_bf16_safetensors_are_widened_exactly(tmp_path):
    """BF16 tensors (through ml_dtypes, or decoded from the file without it) become the same f32 values."""
    save_file = pytest.importorskip("safetensors.numpy").save_file
    sd = tiny_state_dict("4")
    bits = {k: (v.view(np.uint32) >> 16).astype(np.uint16) for k, v in sd.items()}      # truncated to bf16
    raw = tmp_path / "raw.safetensors"
    save_file(bits, str(raw))
    # rewrite the dtype in the header: U16 -> BF16 (same size, same bytes)
    data = bytearray(raw.read_bytes())
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    for k in bits:
        header[k]["dtype"] = "BF16"
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path = tmp_path / "bf16.safetensors"
    path.write_bytes(len(h).to_bytes(8, "little") + h + bytes(data[8 + n:]))
    model = rwkv.load(path)
    for k, b in bits.items():
        np.testing.assert_array_equal(model.weights[k], (b.astype(np.uint32) << 16).view(np.float32), err_msg=k)
    np.testing.assert_array_equal(checkpoint._bf16_to_f32(bits["emb.weight"]), model.weights["emb.weight"])


def test_transformers_names_are_renamed():
    sd = tiny_state_dict("4")
    parts = {"att": "attention", "ffn": "feed_forward", "ln0": "pre_ln", "time_mix_k": "time_mix_key",
             "time_mix_v": "time_mix_value", "time_mix_r": "time_mix_receptance"}
    hf = {("rwkv.embeddings.weight" if k == "emb.weight" else k if k == "head.weight" else
           "rwkv." + ".".join(parts.get(p, p) for p in k.split("."))): v for k, v in sd.items()}
    model = rwkv.from_state_dict(hf)
    assert set(model.weights) == set(sd)
    a, _ = rwkv.forward(model, TOKENS)
    b, _ = rwkv.forward(rwkv.from_state_dict(sd), TOKENS)
    np.testing.assert_array_equal(a, b)


def test_converted_and_state_tuning_files_are_refused():
    sd = tiny_state_dict("5.2")
    with pytest.raises(ValueError, match="strategy"):
        rwkv.from_state_dict({**sd, "_strategy": np.zeros(1, np.float32)})
    with pytest.raises(ValueError, match="state-tuning"):
        rwkv.from_state_dict({**sd, "blocks.0.att.time_state": np.zeros((4, 8, 8), np.float32)})
    with pytest.raises(ValueError, match="not an RWKV"):
        rwkv.from_state_dict({"emb.weight": sd["emb.weight"]})
