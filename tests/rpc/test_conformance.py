"""refimpl judges ggml-cpu (the portable build llama.cpp's goldens use) on the named CI subset of test-backend-ops
(refimpl/data/conformance/ci.txt: one to three cases of every op, and the cases ggml-cpu cannot run).

Each case is computed on the same inputs by ggml-cpu's optimized path, by ggml-cpu's reference mode and by refimpl
served in exact numerics; the verdicts must be those recorded in tests/golden_data/conformance/cpu-ci.json (a
changed verdict is a change in ggml or in refimpl, and fails here until it is understood and re-recorded with
REFIMPL_RECORD_CONFORMANCE=1). The SUM of a permuted tensor is ggml-cpu's known bug: over budget in both of its
paths, whatever else changes. ggml-vulkan on Mesa's lavapipe is judged the same way where its build is cached."""
import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from refimpl.conformance import SUBSETS, read_cases

from . import _vendor

pytestmark = pytest.mark.oracle

GOLDEN = _vendor.REPO / "tests" / "golden_data" / "conformance"
SUM_CASE = "SUM(type=f32,ne=[33,256,1,1],permute=[1,0,2,3])"


def _judge(backend: str, tmp_path, jobs: int = 1, servers: str | None = None):
    out = tmp_path / "judge"
    how = ["--servers", servers] if servers else ["--jobs", str(jobs)]
    p = subprocess.run([sys.executable, "-m", "refimpl", "conformance", "-b", backend, "--subset", "ci",
                        "--out", str(out), *how], capture_output=True, text=True, timeout=3000)
    assert p.returncode == 0, p.stderr[-3000:]
    print("\n" + p.stdout.strip())
    recs = read_cases(out / "cases.jsonl")
    wanted = {ln for ln in SUBSETS["ci"].read_text().splitlines() if ln and not ln.startswith("#")}
    unsupported = set((out / "unsupported.txt").read_text().split("\n")) - {""}
    judged = {r["case"] for r in recs}
    # (a case string test-backend-ops lists twice can be judged once and refused once)
    assert judged | unsupported == wanted, \
        "every case of the subset is judged or named as one the backend cannot run, and only those"
    assert (out / "report.md").exists() and (out / "errors.png").exists()

    assert all("worst" in r for r in recs if r["verdict"] != "agree" and "crash" not in r)
    s = [r for r in recs if r["case"] == SUM_CASE]
    assert all(r["err_cpu"] > r["budget"] for r in s), "ggml-cpu's SUM bug is over budget wherever it is judged"
    return recs


def _same_verdicts(recs, recorded):
    got = sorted([r["case"], r["verdict"]] for r in recs if "crash" not in r)
    if os.environ.get("REFIMPL_RECORD_CONFORMANCE"):
        recorded.parent.mkdir(parents=True, exist_ok=True)
        recorded.write_text("[\n" + ",\n".join(json.dumps(x) for x in got) + "\n]\n")
    want = json.loads(recorded.read_text())
    changed = [(c, v, w) for (c, v), (_, w) in zip(got, want) if v != w]
    assert len(got) == len(want) and not changed, (
        f"verdicts changed (case, now, recorded): {changed[:10]}; now {Counter(v for _, v in got)}")


def test_ci_subset_judged_for_portable_cpu(tmp_path):
    """Split over two test-backend-ops processes, each with refimpl servers of its own (--jobs 2): the verdicts
    are those one process recorded."""
    _vendor.bin_dir()                            # the portable build, with the judge patch (cached)
    recs = _judge("cpu", tmp_path, jobs=2)
    s = [r for r in recs if r["case"] == SUM_CASE]
    assert s and all(r["verdict"] == "both wrong" and r["err_backend"] > r["budget"] for r in s), \
        "ggml-cpu's optimized path shares the bug of its reference mode"
    assert all(r["cpu_supported"] for r in recs), "under test, ggml-cpu runs only what ggml-cpu can run"
    _same_verdicts(recs, GOLDEN / "cpu-ci.json")


def test_ci_subset_judged_against_servers_already_running(tmp_path):
    """--servers: refimpl servers started beforehand (as on other hosts: here four `refimpl serve` processes on
    loopback ports, two exact and two in ggml numerics) are the references, one test-backend-ops process per
    EXACT+GGML pair; the verdicts are those one process with its own servers recorded, and the servers are
    left running (they are not the run's to stop)."""
    _vendor.bin_dir()
    procs = []
    try:
        ends = []
        for numerics in ("exact", "ggml", "exact", "ggml"):
            procs.append(subprocess.Popen([sys.executable, "-m", "refimpl", "serve", "--port", "0", "--numerics",
                                           numerics], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
            line = procs[-1].stdout.readline()
            assert line.startswith("listening on "), line
            ends.append(line.split()[-1])
        recs = _judge("cpu", tmp_path, servers=f"{ends[0]}+{ends[1]},{ends[2]}+{ends[3]}")
        _same_verdicts(recs, GOLDEN / "cpu-ci.json")
        assert all(p.poll() is None for p in procs), "a server the run did not start was stopped"
        assert sorted(q.name for q in (tmp_path / "judge").glob("raw*.jsonl")) == ["raw-1.jsonl", "raw-2.jsonl"]
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)


def test_ci_subset_judged_for_vulkan_on_lavapipe(tmp_path):
    """Where ggml-vulkan's build is cached on this machine (its shaders take tens of minutes on 2 cores:
    `bash scripts/build_llamacpp.sh --profile vulkan` builds it) and Mesa's lavapipe is installed."""
    p = subprocess.run(["bash", str(_vendor.REPO / "scripts" / "build_llamacpp.sh"), "--profile", "vulkan",
                        "--cached"], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip("ggml-vulkan's build is not cached on this machine: bash scripts/build_llamacpp.sh "
                    "--profile vulkan builds it (tens of minutes)")
    recs = _judge("vulkan", tmp_path)
    assert any(not r["cpu_supported"] for r in recs), "Vulkan runs cases ggml-cpu cannot: judged for the first time"
    # ggml-vulkan on Mesa 22.3's lavapipe corrupts its heap somewhere in this subset: the process dies (SIGSEGV
    # in lavapipe's worker, or glibc's "double free"), on a case that varies from run to run; the judge records
    # the case it died on as `backend wrong` (a crash) and goes on after it. Those records are printed, and the
    # verdicts of every other case must be the recorded ones.
    s = [r for r in recs if r["case"] == SUM_CASE]
    assert s and all(r["verdict"] == "ggml-cpu wrong" and r.get("backend_supported") is False for r in s), \
        "ggml-vulkan cannot run the permuted SUM: ggml-cpu is judged alone there, and its bug is seen"
    crashes = [r for r in recs if "crash" in r]
    print(f"vulkan: {len(crashes)} crash(es): " + "; ".join(f"{r['case']} ({r['crash']})" for r in crashes))
    if os.environ.get("REFIMPL_RECORD_CONFORMANCE"):
        _same_verdicts(recs, GOLDEN / "vulkan-ci.json")
    now = {r["case"]: r["verdict"] for r in recs if "crash" not in r}
    want = dict(map(tuple, json.loads((GOLDEN / "vulkan-ci.json").read_text())))
    crashed = {r["case"] for r in crashes}
    changed = [(c, now[c], v) for c, v in want.items() if c in now and now[c] != v]
    lost = [c for c in want if c not in now and c not in crashed]
    assert not changed and not lost, f"verdicts changed (case, now, recorded): {changed[:10]}; not judged: {lost[:5]}"


@pytest.mark.parametrize("argv, message", [
    (["-b", "metal"], "unknown backend 'metal'; refimpl judges: cpu, cpu-native, blas, vulkan"),
    (["-b", "cpu", "-o", "ADD,NO_SUCH_OP"], "unknown op NO_SUCH_OP: test-backend-ops has no case of it"),
    (["-b", "cpu", "-p", "(["], "is not a regular expression"),
    (["-b", "cpu", "--subset", "ci", "-o", "ADD"], "select cases: give one"),
    (["-b", "cpu", "-o", "ADD", "--servers", "localhost"], "--servers: 'localhost' is not HOST:PORT"),
    (["-b", "cpu", "-o", "ADD", "--servers", "127.0.0.1:1"], "--servers: no ggml RPC server answers at 127.0.0.1:1"),
    (["-b", "cpu", "-o", "ADD", "--servers", "127.0.0.1:1+a:2+b:3"], "each entry is HOST:PORT or HOST:PORT+HOST:PORT"),
])
def test_bad_input_is_one_line(argv, message, tmp_path):
    _vendor.bin_dir()
    p = subprocess.run([sys.executable, "-m", "refimpl", "conformance", *argv, "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 1 and last.startswith("refimpl: error: ") and message in last, p.stderr
    assert "Traceback" not in p.stderr


def _libllama(profile: str) -> str:
    """The directory of a profile's shared libllama (scripts/build_llamacpp.sh --libllama), or a skip saying how to
    build it: an optional build (minutes; CI builds only the portable one, which llama-cpp-python ships)."""
    p = subprocess.run(["bash", str(_vendor.REPO / "scripts" / "build_llamacpp.sh"), "--profile", profile,
                        "--libllama", "--cached"], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"the {profile} build's libllama is not cached on this machine: bash scripts/build_llamacpp.sh "
                    f"--profile {profile} --libllama builds it")
    return p.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_model_judged_on_the_native_build(name, tmp_path, monkeypatch):
    """The same on ggml-cpu built for this machine's ISA (its own libllama, LLAMA_CPP_LIB_PATH): the backend run
    and the offloaded refimpl run both use that build, and every node over budget is still ggml's rounding."""
    from refimpl.conformance.model import judge_model
    from refimpl.fetch import path
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", _libllama("native"))
    r = judge_model(path(name), "The capital of France is", out=tmp_path)
    assert "AVX512 = 1" in r["system_info"] or "AVX512" not in open("/proc/cpuinfo").read().upper(), \
        "the native build runs (its system info names AVX-512 on a CPU that has it)"
    assert r["judged"] == r["nodes"] > 300 and r["first_over"] is None, r["first_over"]
    assert 0 < min(r["kl"]) and max(r["kl"]) < 0.05, "refimpl's run offloaded (KL 0 would mean it was not)"
    over = [n for n in r["per_node"] if n.get("nmse", 0) > n.get("budget", 1)]
    assert all(n["verdict"] == "undecided" and n["nmse_ggml"] == 0.0 for n in over), over[:3]


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_model_judged_on_vulkan(name, tmp_path, monkeypatch):
    """The same on ggml-vulkan (lavapipe), every layer offloaded to Vulkan0: closer to refimpl than ggml-cpu (it
    keeps the activations in f32 where ggml-cpu rounds them to Q8, and computes GELU by its formula where
    ggml-cpu reads an f16 table): no node over its op's budget."""
    from refimpl.conformance.model import judge_model
    from refimpl.fetch import path
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", _libllama("vulkan"))
    r = judge_model(path(name), "The capital of France is", out=tmp_path, offload=True,
                    backend_env={"GGML_VK_VISIBLE_DEVICES": "0"})
    assert any("Vulkan0" in ln for ln in r["placement"]) and any("offloaded" in ln for ln in r["placement"])
    assert r["judged"] == r["nodes"] > 300
    assert 0 < max(r["kl"]) < 0.005, "nearer refimpl than ggml-cpu's 0.01"
    over = [n for n in r["per_node"] if n.get("nmse", 0) > n.get("budget", 1)]
    assert not over, over[:3]


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_model_judged_node_by_node_on_portable_cpu(name, tmp_path):
    """Every node of llama.cpp's graph on ggml-cpu, computed again by refimpl from ggml-cpu's own inputs: no node
    is wrong, and where one is over its op's budget, refimpl's ggml numerics reproduce ggml-cpu's bits there
    (the departure is ggml's own rounding, e.g. the Q8 activations of a quantized product)."""
    from refimpl.conformance.model import judge_model
    from refimpl.fetch import path
    p = path(name)
    if not p.exists():
        pytest.fail(f"{p} is not in the cache: refimpl fetch {name} (scripts/test.sh does)")
    r = judge_model(p, "The capital of France is", out=tmp_path)
    print(f"\n{name}: KL mean {r['kl_mean']:.3g} max {r['kl_max']:.3g} nats over {len(r['tokens'])} positions, "
          f"top-1 {r['top1_agree']:.0%}; {r['judged']} nodes judged, {r['over']} over budget, "
          f"{r['undecided']} undecided; first undecided: {r['first_undecided'] and r['first_undecided']['name']}")
    assert r["judged"] == r["nodes"] > 300
    assert all(k >= -1e-12 and np.isfinite(k) for k in r["kl"]), "KL divergence is finite and >= 0"
    assert r["first_over"] is None, r["first_over"]
    over = [n for n in r["per_node"] if n.get("nmse", 0) > n.get("budget", 1)]
    assert all(n["verdict"] == "undecided" and n["nmse_ggml"] == 0.0 for n in over), over[:3]
    assert (tmp_path / "model.json").exists()
