"""RWKV-6 and RWKV-7 against llama.cpp (rwkv6 / rwkv7 GGUFs) and the rwkv package; the converter, the GGUF
loader, quantized models.

tests/golden_data/rwkv{6,7}_llamacpp.npz come from scripts/gen_rwkv_llamacpp_goldens.py: tiny random state
dicts (tests/models/rwkv_tiny.py, values rounded to f16), converted by refimpl's converter into F32, F16 and
projection-quantized Q8_0 / Q5_1 / Q4_0 GGUFs (and an RWKV-6 one with rescale_every = 1) and run by
llama-cpp-python 0.3.36 (CPU, AVX2 build, one llama_decode, logits of every position). Here each GGUF is
written again from the stored weights, checked byte for byte (SHA-256), loaded through gguf_io and run by
refimpl. tests/golden_data/rwkv_v6.npz / rwkv_v7.npz (scripts/gen_rwkv_goldens.py) hold the rwkv package's
logits and states. Neither torch nor llama.cpp is needed here.
"""
import functools
import hashlib
import json
import pathlib

import numpy as np
import pytest

import refimpl
from refimpl import gguf
from refimpl.convert import rwkv as conv
from refimpl.models import rwkv
from refimpl.models.rwkv import gguf_io
from refimpl.testing import nmse, tol

from .rwkv_tiny import tiny_state_dict

pytestmark = pytest.mark.golden

GOLDEN = pathlib.Path(__file__).parent.parent / "golden_data"
STATE_KEYS = ("shift_att", "shift_ffn", "wkv")


def _golden(version):
    z = np.load(GOLDEN / f"rwkv{version}_llamacpp.npz", allow_pickle=False)
    return z, json.loads(str(z["meta"]))


LLAMA = {v: _golden(v) for v in (6, 7)}
LLAMA_CASES = [(v, m["name"], var) for v, (_, meta) in LLAMA.items() for m in meta["models"] for var in m["variants"]]


def _entry(version, name):
    return next(m for m in LLAMA[version][1]["models"] if m["name"] == name)


@functools.lru_cache(maxsize=None)
def _state_dict(version, name):
    z = LLAMA[version][0]
    p = f"{name}.w."
    return {k[len(p):]: z[k].astype(np.float32) for k in z.files if k.startswith(p)}


@functools.lru_cache(maxsize=None)
def _gguf_model(version, name, variant, tmp):
    """The golden's GGUF written again by refimpl's converter (bytes checked), loaded through gguf_io."""
    m = _entry(version, name)
    info = m["variants"][variant]
    path = conv.convert(_state_dict(version, name), pathlib.Path(tmp) / f"{name}_{variant}.gguf",
                        name=m["gguf_name"], **info["convert"])
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest == info["gguf_sha256"], (
        f"{name} {variant}: refimpl's converter no longer writes the bytes llama.cpp ran (SHA-256 {digest}); "
        "regenerate: python scripts/gen_rwkv_llamacpp_goldens.py")
    return rwkv.load(path)


@pytest.fixture(scope="module")
def tmpdir_module(tmp_path_factory):
    return str(tmp_path_factory.mktemp("rwkv_gguf"))


def _wtype(variant):
    return variant.split("_rescale")[0]


@pytest.mark.parametrize("case", LLAMA_CASES, ids=[f"{n}-{v}" for _, n, v in LLAMA_CASES])
def test_logits_match_llama_cpp(case, tmpdir_module, record_property):
    """Every position, the whole vocabulary, exact mode: within the measured bound for the weight type."""
    version, name, variant = case
    z = LLAMA[version][0]
    model = _gguf_model(version, name, variant, tmpdir_module)
    ours, _ = rwkv.forward(model, z[f"{name}.tokens"], all_logits=True)
    ref = z[f"{name}.{variant}.logits"]
    assert ours.shape == ref.shape
    e, d = nmse(ours, ref), float(np.max(np.abs(ours - ref)))
    record_property("nmse", e)
    record_property("max_abs_diff", d)
    t = tol("rwkv.forward", _wtype(variant), "llama.cpp")
    assert e <= t.nmse, f"{name} {variant}: NMSE {e:.2e} > {t.nmse:.0e} (max |d| {d:.3g})"


@pytest.mark.parametrize("case", LLAMA_CASES, ids=[f"{n}-{v}" for _, n, v in LLAMA_CASES])
def test_logits_match_llama_cpp_ggml_numerics(case, tmpdir_module, record_property):
    """numerics="ggml": every model and weight type gives llama.cpp's logits bit for bit (activations converted to
    the weights' vec_dot type, glibc's tanhf/expf, wkv7's FMA lanes and tinyBLAS for the head, as ggml-cpu)."""
    version, name, variant = case
    z = LLAMA[version][0]
    model = _gguf_model(version, name, variant, tmpdir_module)
    with refimpl.numerics("ggml"):
        ours, _ = rwkv.forward(model, z[f"{name}.tokens"], all_logits=True)
    ref = z[f"{name}.{variant}.logits"]
    e = nmse(ours, ref)
    record_property("nmse", e)
    t = tol("rwkv.forward", _wtype(variant), "llama.cpp-ggml")
    if t.exact:
        assert np.array_equal(ours.view(np.uint32), np.asarray(ref, np.float32).view(np.uint32)), \
            f"{name} {variant}: not llama.cpp's bits (NMSE {e:.2e}, max |d| {np.max(np.abs(ours - ref)):.3g})"
    else:
        assert e <= t.nmse, f"{name} {variant}: NMSE {e:.2e} > {t.nmse:.0e} (max |d| {np.max(np.abs(ours - ref)):.3g})"


@pytest.mark.parametrize("version", [6, 7])
def test_llama_cpp_token_by_token_is_its_sequence(version):
    """The golden's own consistency: llama.cpp one token per decode = one decode over all (f32)."""
    z, meta = LLAMA[version]
    for m in meta["models"]:
        a, b = z[f"{m['name']}.f32.logits_tok"], z[f"{m['name']}.f32.logits"]
        assert nmse(a, b) <= tol("rwkv.forward", "f32", "llama.cpp").nmse


@pytest.mark.parametrize("version", [6, 7])
def test_converter_matched_llama_cpp_converter(version):
    """What the generator recorded: llama.cpp's convert_hf_to_gguf.py and refimpl's converter wrote the same
    file for every outtype (rwkv6: but for the two LoRA ranks llama.cpp's converter hard-wires)."""
    _, meta = LLAMA[version]
    for m in meta["models"]:
        cc = m.get("llama_cpp_converter")
        assert cc is not None, "the committed golden must record the converter comparison (regenerate with --llama-cpp)"
        for t, r in cc.items():
            assert r["tensors_differ"] == [] and r["same_order"], (t, r)
            allowed = {f"rwkv{version}.time_mix_extra_dim", f"rwkv{version}.time_decay_extra_dim"}
            assert set(r["metadata_differs"]) <= (allowed if version == 6 else set()), (t, r["metadata_differs"])


# -- the GGUF route = the state-dict route --------------------------------------------------------------------

TOKENS = [0, 5, 17, 3, 120, 42, 42, 7, 1, 30, 64, 9]


@functools.lru_cache(maxsize=None)
def _tiny_sd(version, **kw):
    args = dict(n_layer=3, n_embd=64, head_size=32, vocab=128, lora=8, seed=13 + version)
    args.update(kw)
    return tiny_state_dict(str(version), **args)


@pytest.mark.parametrize("version", [6, 7])
def test_gguf_route_equals_state_dict_route(version, tmp_path):
    """convert (F32) + gguf_io.load gives the model from_state_dict gives: identical logits and state."""
    sd = _tiny_sd(version)
    a, sa = rwkv.forward(rwkv.from_state_dict(sd), TOKENS, all_logits=True)
    model = rwkv.load(conv.convert(sd, tmp_path / "m.gguf"))
    assert model.version == version and model.hparams.variant == f"{version}.0"
    b, sb = rwkv.forward(model, TOKENS, all_logits=True)
    np.testing.assert_array_equal(a, b)
    assert sa == sb


@pytest.mark.parametrize("version", [6, 7])
def test_gguf_weights_keep_their_types(version, tmp_path):
    """Projections stay QTensors (memory-mapped), the embedding/head/vectors/LoRA stay f32 ndarrays."""
    model = rwkv.load(conv.convert(_tiny_sd(version), tmp_path / "m.gguf", quantize="q4_0"))
    w = model.weights
    assert isinstance(w["blocks.1.att.key.weight"], refimpl.QTensor)
    assert w["blocks.1.att.key.weight"].type == refimpl.GGMLType.Q4_0
    assert isinstance(w["blocks.1.ffn.value.weight"], refimpl.QTensor)
    for k in ("emb.weight", "head.weight", "blocks.1.ln1.weight"):
        assert isinstance(w[k], np.ndarray) and w[k].dtype == np.float32, k
    sd = _tiny_sd(version)
    lora = "blocks.1.att.time_maa_w2" if version == 6 else "blocks.1.att.a1"
    np.testing.assert_array_equal(w[lora], sd[lora])                  # transposed back to the .pth layout
    vec = "blocks.1.att.time_decay" if version == 6 else "blocks.1.att.w0"
    np.testing.assert_array_equal(w[vec], sd[vec])                    # (1, 1, C), raw


def test_rwkv6_unfused_lerps_load(tmp_path):
    """Older rwkv6 GGUFs store time_mix_lerp_{w,k,v,r,g} separately instead of time_mix_lerp_fused."""
    sd = _tiny_sd(6)
    p = conv.convert(sd, tmp_path / "fused.gguf")
    f = gguf.load(p)
    tensors = {}
    for n, t in f.tensors.items():
        if n.endswith("time_mix_lerp_fused.weight"):
            blk = n[:-len("time_mix_lerp_fused.weight")]
            for i, c in enumerate("wkvrg"):
                tensors[blk + f"time_mix_lerp_{c}.weight"] = np.array(t[i].reshape(-1))
        else:
            tensors[n] = t
    q = gguf.save(tmp_path / "unfused.gguf", f.metadata, tensors, value_types=f.value_types)
    a, _ = rwkv.forward(rwkv.load(p), TOKENS)
    b, _ = rwkv.forward(rwkv.load(q), TOKENS)
    np.testing.assert_array_equal(a, b)


def test_rescale_every_in_gguf(tmp_path):
    """rescale_every: the converter divides att.output / ffn.value of layer i by 2**(i // R) and records R;
    the loaded model halves x after every R-th layer (llama.cpp's graph). Same model up to LayerNorm's eps."""
    sd = _tiny_sd(6)
    plain, _ = rwkv.forward(rwkv.load(conv.convert(sd, tmp_path / "a.gguf")), TOKENS, all_logits=True)
    model = rwkv.load(conv.convert(sd, tmp_path / "b.gguf", rescale_every=1))
    assert model.hparams.rescale_every == 1
    np.testing.assert_array_equal(model.weights["blocks.2.att.output.weight"],
                                  sd["blocks.2.att.output.weight"] / np.float32(4))
    scaled, _ = rwkv.forward(model, TOKENS, all_logits=True)
    assert nmse(scaled, plain) <= tol("rwkv.forward", "f32", "rescaled").nmse


# -- sequence mode, state, capture --------------------------------------------------------------------------

@pytest.fixture(scope="module", params=[6, 7])
def tiny(request):
    return rwkv.from_state_dict(_tiny_sd(request.param))


def test_sequence_equals_token_by_token(tiny):
    full, s_full = rwkv.forward(tiny, TOKENS, all_logits=True)
    state, rows = None, []
    for t in TOKENS:
        logits, state = rwkv.forward(tiny, [t], state)
        rows.append(logits)
    t = tol("rwkv.forward", "f32", "sequence").nmse
    assert nmse(np.stack(rows), full) <= t
    for k in STATE_KEYS:
        assert nmse(getattr(state, k), getattr(s_full, k)) <= t, k


def test_chunks_equal_one_call(tiny):
    full, s_full = rwkv.forward(tiny, TOKENS)
    _, s = rwkv.forward(tiny, TOKENS[:5])
    last, s = rwkv.forward(tiny, TOKENS[5:], s)
    t = tol("rwkv.forward", "f32", "sequence").nmse
    assert nmse(last, full) <= t
    for k in STATE_KEYS:
        assert nmse(getattr(s, k), getattr(s_full, k)) <= t, k


def test_state_is_not_modified(tiny):
    _, s = rwkv.forward(tiny, TOKENS[:4])
    before = s.copy()
    rwkv.forward(tiny, [9, 9], s)
    assert s == before


def test_capture_names(tiny):
    got = {}
    logits, _ = rwkv.forward(tiny, TOKENS[:3], capture=got, all_logits=True)
    hp = tiny.hparams
    names = ["inp_embd", "inp_norm", "result_norm", "result_output"]
    per_layer = ["attn_norm", "r", "k", "v", "w", "g", "wkv", "ln_x", "attn_out", "ffn_inp", "ffn_norm",
                 "ffn_out", "l_out"] + (["a", "kk"] if tiny.version == 7 else [])
    names += [f"{n}-{il}" for il in range(hp.n_layer) for n in per_layer]
    assert not set(names) - set(got), sorted(set(names) - set(got))
    np.testing.assert_array_equal(got["result_output"], logits)
    assert got["wkv-0"].shape == (3, hp.n_head, hp.head_size)
    w = got["w-1"]
    assert np.all((w > 0) & (w < 1))                                   # decays
    if tiny.version == 7:
        assert np.all(w >= np.exp(np.float32(-0.606531)) * (1 - 1e-6))
        np.testing.assert_allclose(np.linalg.norm(got["kk-0"], axis=-1), 1.0, rtol=1e-5)


# -- against the rwkv package (scripts/gen_rwkv_goldens.py's rwkv_v6.npz / rwkv_v7.npz) -----------------------

def _pkg(version):
    p = GOLDEN / f"rwkv_v{version}.npz"
    if not p.exists():
        return None
    z = np.load(p, allow_pickle=False)
    return z, json.loads(str(z["meta"]))


PKG = {v: _pkg(v) for v in (6, 7)}
PKG_CASES = [(v, m["name"]) for v, g in PKG.items() if g for m in g[1]["models"] if "rwkv" in m["references"]]


def _close(ours, theirs, what):
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape} != {theirs.shape}"
    e = nmse(ours, theirs)
    t = tol("rwkv.forward", "f32", "rwkv")
    assert e <= t.nmse, f"{what}: NMSE {e:.2e} > {t.nmse:.0e} (max |d| {np.max(np.abs(ours - theirs)):.2e})"


@pytest.mark.parametrize("case", PKG_CASES, ids=[n for _, n in PKG_CASES])
def test_rwkv_package(case):
    """One call, token by token and split in two calls: logits and every state array."""
    version, name = case
    z, meta = PKG[version]
    p = f"{name}.w."
    model = rwkv.from_state_dict({k[len(p):]: z[k] for k in z.files if k.startswith(p)})
    tokens, split, r = z[f"{name}.tokens"], meta["split"], f"{name}.rwkv"

    def state_close(s, prefix):
        for k in STATE_KEYS:
            _close(getattr(s, k), z[f"{prefix}.{k}"], f"{prefix}.{k}")

    logits, s = rwkv.forward(model, tokens)
    _close(logits, z[f"{r}.logits_seq"], f"{name} logits_seq")
    state_close(s, f"{r}.state")
    s, rows = None, []
    for t in tokens:
        logits, s = rwkv.forward(model, [t], s)
        rows.append(logits)
    _close(np.stack(rows), z[f"{r}.logits_tok"], f"{name} logits_tok")
    state_close(s, f"{r}.state_tok")
    _, s = rwkv.forward(model, tokens[:split])
    logits, s = rwkv.forward(model, tokens[split:], s)
    _close(logits, z[f"{r}.logits_split"], f"{name} logits_split")
    state_close(s, f"{r}.state_split")


# -- quantized models: KL divergence of the next-token distribution from F32's --------------------------------

KL_MODEL = dict(n_layer=2, n_embd=256, head_size=64, vocab=512, lora=32, seed=5)
KL_TOKENS = np.random.default_rng(0).integers(0, KL_MODEL["vocab"], 48)


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def mean_kl(ref_logits, logits) -> float:
    """mean over positions of KL(softmax(ref) || softmax(logits)), nats"""
    lp, lq = _log_softmax(ref_logits), _log_softmax(logits)
    return float(np.mean(np.sum(np.exp(lp) * (lp - lq), axis=-1)))


@pytest.fixture(scope="module", params=[6, 7])
def kl_models(request, tmp_path_factory):
    version = request.param
    sd = tiny_state_dict(str(version), **KL_MODEL)
    d = tmp_path_factory.mktemp(f"kl{version}")
    ref, _ = rwkv.forward(rwkv.load(conv.convert(sd, d / "f32.gguf")), KL_TOKENS, all_logits=True)
    return version, sd, d, ref


@pytest.mark.parametrize("qtype", ["q8_0", "q5_1", "q4_0"])
def test_quantized_kl_from_f32(kl_models, qtype, record_property):
    """Projections quantized (embedding, head, norms, vectors, LoRA factors F32), n_embd 256: the mean KL of
    the next-token distributions from F32's stays under the measured bound of the format."""
    version, sd, d, ref = kl_models
    model = rwkv.load(conv.convert(sd, d / f"{qtype}.gguf", quantize=qtype))
    assert model.weights["blocks.0.att.key.weight"].type == refimpl.GGMLType[qtype.upper()]
    logits, _ = rwkv.forward(model, KL_TOKENS, all_logits=True)
    kl = mean_kl(ref, logits)
    record_property("mean_kl", kl)
    bound = tol("rwkv.forward", qtype, "kl-f32").atol
    assert 0 < kl <= bound, f"RWKV-{version} {qtype}: mean KL {kl:.3e} > {bound:.0e}"


# -- converter pieces ---------------------------------------------------------------------------------------

def test_world_vocab_format(tmp_path):
    """Token 0 "<s>", then each line's token as Python's bytes repr without b'' (what llama.cpp unescapes)."""
    f = tmp_path / "v.txt"
    f.write_text("1 '\\x00' 1\n2 '\\n' 1\n3 'a b' 3\n4 b'\\xe4\\xbd' 2\n5 '\\'' 1\n6 '中' 3\n", encoding="utf-8")
    tokens, types = conv.world_vocab(9, f)
    assert tokens == ["<s>", "\\x00", "\\n", "a b", "\\xe4\\xbd", "'", "\\xe4\\xb8\\xad", "[PAD7]", "[PAD8]"]
    assert types == [3, 1, 1, 1, 1, 1, 1, 5, 5]
    tokens, _ = conv.world_vocab(300, None)                           # the 256 bytes are tokens 1..256
    assert tokens[11] == "\\n" and tokens[98] == "a" and tokens[256] == "\\xff" and tokens[257] == "[PAD257]"


@pytest.mark.parametrize("version", [6, 7])
def test_hf_directory_converts_like_the_state_dict(version, tmp_path):
    """A Hugging Face directory (RWKV's v6 `rwkv.*`, v7 `model.*` names, safetensors) gives the same GGUF."""
    from safetensors.numpy import save_file
    sd = _tiny_sd(version)
    top = "rwkv." if version == 6 else "model."
    hf = {}
    for k, v in sd.items():
        if k == "emb.weight":
            k = top + "embeddings.weight"
        elif k.startswith("blocks.0.ln0."):
            k = ("rwkv.blocks.0.pre_ln." if version == 6 else "model.pre_ln.") + k.split(".")[-1]
        elif k.startswith(("blocks.", "ln_out.")):
            k = top + k.replace(".att.", ".attention.").replace(".ffn.", ".feed_forward.")
        hf[k] = np.ascontiguousarray(v)
    d = tmp_path / "hf"
    d.mkdir()
    save_file(hf, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"architectures": [f"Rwkv{version}ForCausalLM"]}))
    fa = gguf.load(conv.convert(d, tmp_path / "a.gguf", name="x"))
    fb = gguf.load(conv.convert(sd, tmp_path / "b.gguf", name="x"))
    assert fa.metadata == fb.metadata and set(fa.tensors) == set(fb.tensors)     # (the tensor order differs)
    for n in fb.tensors:
        np.testing.assert_array_equal(np.asarray(fa.tensors[n]), np.asarray(fb.tensors[n]), err_msg=n)


def test_fla_names_and_lora_layout():
    """fla-hub's RWKV-7 names: attn/ffn, *_proj, *_lora.lora.{0,2} (torch Linear layout: transposed), g_norm."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)              # Linear(4 -> 3).weight: (out, in)
    got = dict(conv._hf_to_blinkdl("model.layers.2.attn.w_lora.lora.0.weight", x))
    np.testing.assert_array_equal(got["blocks.2.att.w1"], x.T)
    got = dict(conv._hf_to_blinkdl("model.layers.2.attn.w_lora.lora.2.bias", x[0]))
    np.testing.assert_array_equal(got["blocks.2.att.w0"], x[0])
    assert list(dict(conv._hf_to_blinkdl("model.layers.0.attn.r_proj.weight", x))) == ["blocks.0.att.receptance.weight"]
    assert list(dict(conv._hf_to_blinkdl("model.layers.0.attn.g_norm.bias", x[0]))) == ["blocks.0.att.ln_x.bias"]
    assert list(dict(conv._hf_to_blinkdl("model.layers.1.ffn_norm.weight", x[0]))) == ["blocks.1.ln2.weight"]
    assert list(dict(conv._hf_to_blinkdl("lm_head.weight", x))) == ["head.weight"]


def test_refusals(tmp_path):
    with pytest.raises(ValueError, match="RWKV-4/5"):
        conv.convert(tiny_state_dict("5.2", head_size=8), tmp_path / "x.gguf")
    f = gguf.load(conv.convert(_tiny_sd(7), tmp_path / "m.gguf"))
    md = {k.replace("rwkv7.", "arwkv7."): v for k, v in f.metadata.items()}
    md["general.architecture"] = "arwkv7"
    q = gguf.save(tmp_path / "a.gguf", md, f.tensors,
                  value_types={k.replace("rwkv7.", "arwkv7."): v for k, v in f.value_types.items()})
    with pytest.raises(ValueError, match="arwkv7"):
        gguf_io.load(q)


@pytest.mark.parametrize("version", [6, 7])
def test_refimpl_quantize_keeps_rwkv_parameters(version, tmp_path):
    """`refimpl quantize` on an RWKV GGUF quantizes the projection matrices and the head only: the embedding,
    norms, decays, token-shift mixes and LoRA factors keep their bytes; the model still runs, close to F32."""
    from refimpl.requantize import requantize
    src = conv.convert(_tiny_sd(version), tmp_path / "f32.gguf", "f32")
    dst = tmp_path / "q8_0.gguf"
    requantize(src, dst, "q8_0")
    a, b = gguf.load(src), gguf.load(dst)
    projections = ("time_mix_key.weight", "time_mix_value.weight", "time_mix_receptance.weight",
                   "time_mix_gate.weight", "time_mix_output.weight", "channel_mix_key.weight",
                   "channel_mix_value.weight", "channel_mix_receptance.weight", "output.weight")
    n_quantized = 0
    for name, info in a.tensor_info.items():
        q = b.tensor_info[name]
        if name.endswith(projections) and info.ne[0] % 32 == 0:
            assert q.type.name == "Q8_0", name
            n_quantized += 1
        else:
            assert q.type == info.type, name
            assert np.array_equal(np.asarray(a.tensors[name]), np.asarray(b.tensors[name])), name
    assert n_quantized > 0
    tokens = np.arange(1, 9, dtype=np.int32)
    ref, _ = rwkv.forward(rwkv.load(src), tokens)
    out, _ = rwkv.forward(rwkv.load(dst), tokens)
    assert mean_kl(ref[None], out[None]) < tol("rwkv.forward", "q8_0", "kl-f32").atol
