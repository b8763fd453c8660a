"""llama.cpp's own tokenizer test vectors, and llama.cpp's ids for every pre-tokenizer name refimpl supports.

1. The vocab-only GGUFs that llama.cpp ships with test vectors (`models/ggml-vocab-*.gguf` with `.inp` and
   `.out` in the llama-cpp-python 0.3.36 sdist, which scripts/build_llamacpp.sh downloads): every input (split
   on "\\n__ggml_vocab_test__\\n") gives the ids of its line of `.out`, encoded as test-tokenizer-0 does
   (add_special=False, parse_special=False): all fifteen, gemma-4's SPM-style BPE (tokenizer model
   `gemma4`) included.
2. Most pre-tokenizer names have no such vocabulary: tests/golden_data/pre_tokenizers.json holds llama.cpp's
   ids for each (GPT-2's vocabulary with `tokenizer.ggml.pre` set to the name, llama.cpp tokenizing
   qwen35's test inputs; scripts/gen_pretokenizer_golden.py regenerates it); refimpl must give the same, and
   a clear error where llama.cpp aborts (its "whitespace" pre-tokenizer on runs of whitespace with a space).
3. The vocabularies without vectors (aquila, baichuan, gpt-neox, and nomic-bert-moe, a T5-style unigram model
   read by refimpl.tokenizers.ugm): llama.cpp's ids from the same golden file, plain and with special-token
   parsing, and llama_detokenize's text of the latter ids.
"""
from __future__ import annotations

import functools
import json
import tarfile
from pathlib import Path

import pytest

from refimpl import gguf, tokenizer
from refimpl.tokenizers import PRE_TOKENIZERS
from refimpl.tokenizers.llama import Tokenizer

from .rpc._vendor import VERSION, sdist

pytestmark = pytest.mark.golden

MODELS = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/models/"
SEP = "\n__ggml_vocab_test__\n"
GOLDEN = Path(__file__).parent / "golden_data" / "pre_tokenizers.json"
WITH_VECTORS = ["bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2", "llama-bpe",
                "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder"]


@functools.lru_cache(maxsize=None)
def _vocab_dir(tmp: str) -> Path:
    d = Path(tmp)
    with tarfile.open(sdist()) as tf:
        for m in tf.getmembers():
            if m.name.startswith(MODELS + "ggml-vocab-"):
                (d / Path(m.name).name).write_bytes(tf.extractfile(m).read())
    return d


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory):
    return _vocab_dir(str(tmp_path_factory.mktemp("vocabs")))


def test_the_vocabularies_with_vectors_are_the_ones_listed(vocabs):
    have = sorted(p.name[len("ggml-vocab-"):-len(".gguf.inp")] for p in vocabs.glob("ggml-vocab-*.gguf.inp"))
    assert have == WITH_VECTORS


@pytest.mark.parametrize("name", WITH_VECTORS)
def test_llama_cpp_test_vectors(vocabs, name):
    path = vocabs / f"ggml-vocab-{name}.gguf"
    texts = (vocabs / f"{path.name}.inp").read_text(encoding="utf-8").split(SEP)
    lines = (vocabs / f"{path.name}.out").read_text(encoding="utf-8").split("\n")
    assert len(lines) >= len(texts) >= 40
    tok = tokenizer.from_gguf(path)
    bad = []
    for text, line in zip(texts, lines):
        want = [int(x) for x in line.split()]
        got = tok.encode(text, add_special=False, parse_special=False)
        if got != want:
            bad.append(f"{text[:40]!r}: refimpl {got[:16]}, llama.cpp {want[:16]}")
    assert not bad, f"{name}: {len(bad)} of {len(texts)} inputs differ:\n" + "\n".join(bad[:5])


@pytest.mark.parametrize("name", WITH_VECTORS)
def test_llama_cpp_test_vectors_decode_as_llama_cpp_does(vocabs, golden, name):
    """Each line of ids in `.out`, decoded: the text llama_detokenize gives (remove_special=False,
    unparse_special=True; the golden file), byte for byte. WordPiece's `decode` is Hugging Face's; its
    `detokenize` is llama.cpp's."""
    path = vocabs / f"ggml-vocab-{name}.gguf"
    lines = (vocabs / f"{path.name}.out").read_text(encoding="utf-8").split("\n")
    want = golden["decoded"][name]
    assert len(want) >= 40
    tok = tokenizer.from_gguf(path)
    bad = []
    for line, text in zip(lines, want):
        ids = [int(x) for x in line.split()]
        got = (tok.detokenize if name == "bert-bge" else tok.decode)(ids, special=True).encode("utf-8")
        if got != bytes.fromhex(text):
            bad.append(f"{ids[:8]}: refimpl {got[:40]!r}, llama.cpp {bytes.fromhex(text)[:40]!r}")
    assert not bad, f"{name}: {len(bad)} of {len(want)} decodings differ:\n" + "\n".join(bad[:5])


@pytest.fixture(scope="module")
def golden():
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


def test_the_golden_file_covers_every_supported_name(golden):
    assert sorted(golden["ids"]) == sorted(PRE_TOKENIZERS)


@pytest.fixture(scope="module")
def gpt2_metadata(vocabs):
    return dict(gguf.load(vocabs / "ggml-vocab-gpt-2.gguf").metadata)


@pytest.mark.parametrize("name", sorted(PRE_TOKENIZERS))
def test_every_pre_tokenizer_gives_llama_cpps_ids(golden, gpt2_metadata, name):
    tok = Tokenizer(dict(gpt2_metadata, **{"tokenizer.ggml.pre": name}))
    bad = []
    for text, want in zip(golden["texts"], golden["ids"][name]):
        if want is None:          # llama.cpp aborts on this text ("whitespace" on a run of spaces): a clear error
            with pytest.raises(ValueError, match="llama.cpp aborts"):
                tok.encode(text, add_special=False, parse_special=False)
            continue
        got = tok.encode(text, add_special=False, parse_special=False)
        if got != want:
            bad.append(f"{text[:40]!r}: refimpl {got[:16]}, llama.cpp {want[:16]}")
    assert not bad, f"{name}: {len(bad)} of {len(golden['texts'])} inputs differ:\n" + "\n".join(bad[:5])
    assert sum(w is not None for w in golden["ids"][name]) >= 20


@pytest.mark.parametrize("name", ["aquila", "baichuan", "gpt-neox", "nomic-bert-moe"])
def test_vocabularies_without_vectors_give_llama_cpps_ids(golden, vocabs, name):
    """llama.cpp's vocabularies that ship without test vectors: llama.cpp's own ids (the golden file) on the
    same inputs, plain and with special-token parsing (BOS added, control-token texts parsed), and the text
    llama_detokenize gives back for the latter ids (control tokens rendered)."""
    g = golden["vocabularies"][name]
    tok = tokenizer.from_gguf(vocabs / f"ggml-vocab-{name}.gguf")
    bad = []
    for text, want in zip(golden["texts"], g["plain"]):
        got = tok.encode(text, add_special=False, parse_special=False)
        if got != want:
            bad.append(f"plain {text[:40]!r}: refimpl {got[:16]}, llama.cpp {want[:16]}")
    texts = golden["texts"] + g["special_texts"]
    assert len(g["special"]) == len(texts) and g["special_texts"]
    for text, want in zip(texts, g["special"]):
        got = tok.encode(text, add_special=True, parse_special=True)
        if got != want:
            bad.append(f"special {text[:40]!r}: refimpl {got[:16]}, llama.cpp {want[:16]}")
    assert len(g["decode"]) == len(texts)
    for ids, want in zip(g["special"], g["decode"]):
        got = tok.decode(ids, special=True).encode("utf-8")
        if got != bytes.fromhex(want):
            bad.append(f"decode {ids[:8]}: refimpl {got[:40]!r}, llama.cpp {bytes.fromhex(want)[:40]!r}")
    assert not bad, f"{name}: {len(bad)} inputs differ:\n" + "\n".join(bad[:5])


def test_the_docs_table_lists_what_these_tests_check(vocabs, golden):
    """docs/tokenizers.md's table (docs/gen_ops_reference.py) names every vocabulary with its case counts."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gen_ops_reference", Path(__file__).parents[1] / "docs" /
                                                  "gen_ops_reference.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    cases = {n: len((vocabs / f"ggml-vocab-{n}.gguf.inp").read_text(encoding="utf-8").split(SEP))
             for n in WITH_VECTORS}
    assert {v: n for v, _, n in gen.VOCABULARIES} == cases
    g = golden["vocabularies"]
    assert {v: (p, s) for v, _, p, s in gen.NO_VECTORS} == {
        n: (len(golden["texts"]), len(golden["texts"]) + len(g[n]["special_texts"])) for n in g}
