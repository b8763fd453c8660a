"""llama.cpp's architectures that refimpl has no model code for, offloaded to refimpl serve: tiny random GGUFs from
llama.cpp's own test-llama-archs (scripts/llama_archs.py runs all 128; docs/llama-archs.md has the table), a
sample of them here in ggml numerics, against ggml's own ggml-rpc-server (CPU backend, one thread)."""
import pytest
import sys

from . import _vendor

pytestmark = pytest.mark.oracle

IDENTICAL = ["qwen3-dense", "gemma3-dense", "gemma2-dense", "phi3-dense", "deepseek2-moe", "gpt2-dense",
             "falcon-dense", "qwen3moe-moe", "llama4-moe", "olmo2-dense", "starcoder2-dense", "chatglm-dense"]
# every node computed; recurrent and scan ops (Mamba, gpt-oss's experts) sum in another order than ggml-cpu:
# the last bits of some logits differ, by less than this
CLOSE = {"mamba-dense": 1e-6, "gpt-oss-moe": 1e-6, "granitehybrid-dense": 1e-6}


def test_sample_of_architectures():
    sys.path.insert(0, str(_vendor.REPO / "scripts"))
    import llama_archs
    paths = {p.stem: p for p in llama_archs.models(_vendor.bin_dir())}
    names = IDENTICAL + list(CLOSE)
    missing = [n for n in names if n not in paths]
    assert not missing, f"test-llama-archs wrote no {missing}"
    rows = {r["model"]: r for r in llama_archs.run([paths[n] for n in names], "ggml", [1, 2, 3, 4, 5, 6, 7, 8])}
    print("\n" + "\n".join(f"  {n}: {r}" for n, r in rows.items()))
    for n in names:
        r = rows[n]
        assert "error" not in r, (n, r)
        assert not r["refused"] and r["nan"] == 0, (n, r)
    assert [n for n in IDENTICAL if not rows[n]["same"]] == []
    for n, bound in CLOSE.items():
        assert rows[n]["max_abs"] <= bound, (n, rows[n])
