"""rwkv.cpp's own model files.

Against rwkv.cpp: its tiny test models (its repository's tests/) against the expected logits stored beside
them, by rwkv.cpp's own rule (|sum of the 256 differences| within 105 % of its figure for the file) and per
element (NMSE, the tolerance table's ("rwkv.cpp", type) entries). refimpl keeps none of rwkv.cpp's files: those
tests read them from shared/rwkv_cpp/ beside the repository (or $REFIMPL_RWKV_CPP_TESTS), the folder of
rwkv.cpp's tests/ as it is, and are skipped, saying so, where it is absent.

The prompt is rwkv.cpp's: the bytes of `"in`, token by token from a fresh state and as one sequence. FP16 files
run in exact mode; quantized ones under numerics="ggml", whose mat-vec products round the activations to Q8 as
rwkv.cpp's ggml does (exact mode has no such rounding, and rwkv.cpp's figures include it). rwkv.cpp's own test
quantizes its FP16 files on the fly to Q4_0 .. Q8_0: so does this, with refimpl's quantizer (ggml's bytes)
and rwkv.cpp's rule of which tensors to quantize.

Always: random models of every version written here in rwkv.cpp's layout (tests/models/rwkv_tiny.py applies
rwkv.cpp's converter's rewrites) read back as the same model as their state dicts; the format's errors; K-quant
and FP32 tensors; `refimpl convert` of an RWKV-7 file to GGUF.
"""
from __future__ import annotations

import dataclasses
import os
import struct
from pathlib import Path

import numpy as np
import pytest

import refimpl
from refimpl.errors import RWKVError
from refimpl.models import rwkv
from refimpl.models.rwkv import rwkv_cpp
from refimpl.testing import assert_nmse, nmse
from refimpl.testing.tolerances import tol
from tests.models.rwkv_tiny import VERSIONS, rwkv_cpp_tensors, tiny_state_dict, write_rwkv_cpp

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("REFIMPL_RWKV_CPP_TESTS") or ROOT.parent / "shared" / "rwkv_cpp")
needs_rwkv_cpp_files = pytest.mark.skipif(
    not (DATA / "expected-logits-4v0-660K.bin").is_file(),
    reason=f"rwkv.cpp's tiny test models are not in {DATA}: refimpl keeps none of rwkv.cpp's files; shared/rwkv_cpp/ "
           "beside the repository (rwkv.cpp's tests/ folder) or $REFIMPL_RWKV_CPP_TESTS provides them")
PROMPT = b'"in'

# (file, rwkv.cpp's sum of differences for it): test_tiny_rwkv.c's FP16 figures; the Q5 files' from
# test_quantization_format_compatibility.c (4v0, 5v2) and, for 6v0-1m, test_tiny_rwkv.c of commit edea0c2
# ("FP32-to-Q5_x", what the stored files were made from)
FILES = [("4v0-660K", "FP16", -0.013652), ("5v1-730K", "FP16", -0.289921), ("5v2-730K", "FP16", +0.455912),
         ("7v0-834K", "FP16", +0.005766), ("4v0-660K", "Q5_1", +0.278034), ("5v2-730K", "Q5_1", +48.068733),
         ("6v0-1m", "Q5_0", -5.838017), ("6v0-1m", "Q5_1", -17.046452)]
# test_tiny_rwkv.c's "FP16-to-<type>" figures: its FP16 files quantized on the fly
REQUANT = {"4v0-660K": (+0.154614, -0.539827, -0.180142, +0.294953, +0.077226),
           "5v1-730K": (+119.471931, -28.245888, -159.870956, -39.708530, -0.962695),
           "5v2-730K": (+34.135971, +65.573822, +21.588751, +29.726818, -7.242277),
           "7v0-834K": (+0.136678, -0.005140, -0.064447, -0.063531, +0.010921)}
QTYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
VARIANT = {"4v0": "4", "5v1": "5.0", "5v2": "5.2", "6v0": "6.0", "7v0": "7.0"}


def expected(version: str) -> np.ndarray:
    return np.fromfile(DATA / f"expected-logits-{version}.bin", np.float32)


def serial_and_sequence(model) -> tuple[np.ndarray, np.ndarray]:
    state = None
    for t in PROMPT:
        logits, state = rwkv.forward(model, [t], state)
    return logits, rwkv.forward(model, list(PROMPT))[0]


def check(version: str, dtype: str, figure: float, model, numerics: str) -> None:
    want = expected(version)
    with refimpl.numerics(numerics):
        serial, seq = serial_and_sequence(model)
    for how, got in (("serial", serial), ("sequence", seq)):
        s = float(np.sum(got.astype(np.float64) - want))
        print(f"{version} {dtype} {how}: sum of differences {s:+.6f} (rwkv.cpp {figure:+.6f}), NMSE "
              f"{nmse(got, want):.2e}")
        assert abs(s) <= abs(figure) * 1.05, f"{version} {dtype} {how}: sum {s} beyond rwkv.cpp's {figure}"
        assert_nmse(got, want, tol("rwkv.cpp", dtype, "rwkv.cpp").nmse, f"{version} {dtype} {how}")


@pytest.mark.golden
@needs_rwkv_cpp_files
@pytest.mark.parametrize("version,dtype,figure", FILES, ids=[f"{v}-{d}" for v, d, _ in FILES])
def test_rwkv_cpp_file(version, dtype, figure):
    model = rwkv.load(DATA / f"tiny-rwkv-{version}-{dtype}.bin")
    assert model.hparams.variant == VARIANT[version[:3]] and model.hparams.vocab == 256
    if dtype != "FP16":
        assert any(isinstance(w, refimpl.QTensor) and w.type.name == dtype for w in model.weights.values())
    check(version, dtype, figure, model, "exact" if dtype == "FP16" else "ggml")


@pytest.mark.golden
@needs_rwkv_cpp_files
@pytest.mark.parametrize("version", sorted(REQUANT))
@pytest.mark.parametrize("qtype", QTYPES)
def test_rwkv_cpp_requantized(version, qtype):
    """rwkv.cpp's test_tiny_rwkv.c: its FP16 file quantized (2-D tensors but emb, head, v7's LoRA factors
    and r_k), then its figure for that file."""
    head, tensors = rwkv_cpp.read(DATA / f"tiny-rwkv-{version}-FP16.bin")
    q = {k: refimpl.quantize(np.asarray(v, np.float32), qtype.lower()) if rwkv_cpp.needs_quant(k, v.ndim) else v
         for k, v in tensors.items()}
    assert sum(isinstance(v, refimpl.QTensor) for v in q.values()) >= 4
    check(version, qtype, REQUANT[version][QTYPES.index(qtype)], rwkv_cpp.from_tensors(head, q), "ggml")


# -- the format, on random models written here ------------------------------------------------------------

def tiny(version: str, **kw) -> dict:
    return tiny_state_dict(version, n_embd=64, head_size=16, vocab=256, seed=3, **kw)


def same_model(sd: dict) -> rwkv.RwkvModel:
    """The state dict's model as rwkv.cpp's graph runs it (v5: its ln_x eps)."""
    m = rwkv.from_state_dict(sd)
    if m.hparams.variant.startswith("5"):
        m.hparams = dataclasses.replace(m.hparams, ln_x_eps=rwkv_cpp.V5_LN_X_EPS)
    return m


@pytest.mark.property
@pytest.mark.parametrize("version", VERSIONS)
def test_a_file_in_rwkv_cpp_layout_is_the_state_dicts_model(tmp_path, version):
    """A random RWKV-`version` state dict, rewritten as rwkv.cpp's converter does and written in its format,
    loads as the same model: the same weights where the converter only reshapes or transposes, and the
    logits within the table's "same model" bound where it stores exp / -exp of a weight (an ulp of the log)."""
    sd = tiny(version)
    m = rwkv.load(write_rwkv_cpp(tmp_path / "m.bin", rwkv_cpp_tensors(sd)))
    ref = same_model(sd)
    assert m.hparams == ref.hparams
    for k, v in sd.items():
        if not k.endswith((".time_decay", ".time_first")) or version in ("6", "7"):
            assert np.array_equal(np.asarray(m.weights[k], np.float32).reshape(np.shape(v)), v), k
    got, want = serial_and_sequence(m), serial_and_sequence(ref)
    for a, b in zip(got, want):
        assert_nmse(a, b, tol("rwkv.cpp", "FP32", "rwkv.cpp").nmse, f"RWKV-{version} from rwkv.cpp's layout")


@pytest.mark.property
def test_fp32_and_k_quant_tensors_read_back(tmp_path):
    """An RWKV-7 file written here with FP32 vectors and matrices and a Q4_K and a Q6_K matrix: every tensor
    reads back with its type and bytes, and the model's logits equal those of the same tensors in memory."""
    t = rwkv_cpp_tensors(tiny("7"))
    t["blocks.0.ffn.value.weight"] = refimpl.quantize(t["blocks.0.ffn.value.weight"], "q4_k")   # rows of 256
    t["blocks.1.ffn.value.weight"] = refimpl.quantize(t["blocks.1.ffn.value.weight"], "q6_k")
    path = write_rwkv_cpp(tmp_path / "v7.bin", t)
    head, back = rwkv_cpp.read(path)
    assert head == dict(version=101, n_vocab=256, n_embed=64, n_layer=2, data_type="FP32")
    assert list(back) == list(t)
    for k, v in t.items():
        b = back[k]
        if isinstance(v, refimpl.QTensor):
            assert b.type == v.type and np.array_equal(b.data, v.data), k
        else:
            assert b.dtype == np.float32 and np.array_equal(b, v), k
    got = serial_and_sequence(rwkv.load(path))[0]
    np.testing.assert_array_equal(got, serial_and_sequence(rwkv_cpp.from_tensors(head, t))[0])


@pytest.mark.property
def test_version_100_float_file_reads_as_version_101(tmp_path):
    """rwkv.cpp's version 100 differs from 101 only in its quantized block layouts: a float file written as
    version 100 gives the same tensors and logits as the same file written as version 101."""
    tensors = {k: v.astype(np.float16) if v.ndim == 2 else v for k, v in rwkv_cpp_tensors(tiny("5.2")).items()}
    old = write_rwkv_cpp(tmp_path / "v100.bin", tensors, version=100)
    new = write_rwkv_cpp(tmp_path / "v101.bin", tensors, version=101)
    (h100, t100), (h101, t101) = rwkv_cpp.read(old), rwkv_cpp.read(new)
    assert h100["version"] == 100 and h101["version"] == 101
    assert dict(h100, version=101) == h101 and list(t100) == list(t101)
    assert all(np.array_equal(t100[k], t101[k]) for k in t100)
    np.testing.assert_array_equal(serial_and_sequence(rwkv.load(old))[0], serial_and_sequence(rwkv.load(new))[0])


@pytest.mark.property
def test_errors_name_the_file_and_the_tensor(tmp_path):
    """An RWKV-4 file as rwkv.cpp quantizes it (Q5_1 matrices but the embedding, f32 vectors), then damaged:
    emb.weight is the first tensor, its data type at byte 32 and its first dimension at byte 36."""
    t = {k: refimpl.quantize(v, "q5_1") if rwkv_cpp.needs_quant(k, v.ndim) else v
         for k, v in rwkv_cpp_tensors(tiny("4")).items()}
    good = write_rwkv_cpp(tmp_path / "good.bin", t, data_type=8).read_bytes()
    assert rwkv.load(tmp_path / "good.bin").hparams.variant == "4"

    def bad(data: bytes, match: str, name: str = "bad.bin"):
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(RWKVError, match=match) as e:
            rwkv.load(p)
        assert str(p) in str(e.value)

    bad(good[:20], "shorter than")
    bad(good[:4] + struct.pack("<I", 102) + good[8:], "file version 102")
    bad(good[:4] + struct.pack("<I", 100) + good[8:], "version-100 file")           # quantized: old layouts
    bad(good[:32] + struct.pack("<I", 4) + good[36:], "no longer reads")              # Q4_1_O, removed
    bad(good[:32] + struct.pack("<I", 40) + good[36:], "outside rwkv.cpp")
    bad(good[:24] + struct.pack("<I", 7) + good[28:], "7 dimensions")
    bad(good[:-10], "the file ends")
    bad(good[:8] + struct.pack("<I", 999) + good[12:], "header disagrees")           # n_vocab
    (tmp_path / "logits.bin").write_bytes(np.zeros(256, np.float32).tobytes())
    with pytest.raises(RWKVError, match="not an rwkv.cpp model file"):
        rwkv_cpp.read(tmp_path / "logits.bin")


@pytest.mark.property
def test_convert_writes_gguf_from_an_rwkv_cpp_file(tmp_path):
    """`refimpl convert` of an RWKV-7 FP16 file: llama.cpp's rwkv7 GGUF, whose logits (refimpl's GGUF route)
    equal those of the .bin file within exact mode's f32 ordering; RWKV-4/5 (no llama.cpp architecture)
    are refused by name."""
    from refimpl.convert import rwkv as crwkv
    f16 = {k: v.astype(np.float16) if v.ndim == 2 else v for k, v in rwkv_cpp_tensors(tiny("7")).items()}
    src = write_rwkv_cpp(tmp_path / "v7.bin", f16, data_type=1)
    out = crwkv.convert(src, tmp_path / "v7.gguf", "f32")
    got = serial_and_sequence(rwkv.load(out))[0]
    want = serial_and_sequence(rwkv.load(src))[0]
    assert_nmse(got, want, tol("rwkv.forward", "f32", "sequence").nmse, "convert rwkv.cpp -> GGUF")
    v4 = write_rwkv_cpp(tmp_path / "v4.bin", rwkv_cpp_tensors(tiny("4")))
    with pytest.raises(ValueError, match="RWKV-6 or RWKV-7"):
        crwkv.convert(v4, tmp_path / "v4.gguf", "f32")
