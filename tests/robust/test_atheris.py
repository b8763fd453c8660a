"""Coverage-guided fuzzing (atheris) of the RPC server's message decoder and graph deserializer, and of the GGUF
reader, for a fixed time each (tests/robust/atheris_targets.py says what counts as a crash). The seed corpora
live in tests/robust/corpus/; each run starts from a copy, so what the fuzzer finds stays out of the repository.
A crash fails the test with libFuzzer's report and the input that made it (printed and left in the tmp dir)."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.property

HERE = Path(__file__).parent
SECONDS = 20


@pytest.mark.parametrize("target", ["rpc", "gguf"])
def test_coverage_guided_fuzz(target, tmp_path):
    pytest.importorskip("atheris", reason="coverage-guided fuzzing needs atheris (the test extra)")
    corpus = tmp_path / "corpus"
    shutil.copytree(HERE / "corpus" / target, corpus)
    p = subprocess.run([sys.executable, str(HERE / "atheris_targets.py"), target, f"-max_total_time={SECONDS}",
                        "-timeout=10", "-rss_limit_mb=4096", f"-artifact_prefix={tmp_path}/", str(corpus)],
                       capture_output=True, text=True, timeout=SECONDS + 240, cwd=tmp_path)
    log = "\n".join(ln for ln in (p.stdout + p.stderr).splitlines() if not ln.startswith("INFO: Instrumenting"))
    done = re.search(r"Done (\d+) runs in (\d+) second", log)
    cov = re.findall(r"cov: (\d+)", log)
    print(f"\natheris {target}: {done.group(1) if done else '?'} inputs in {done.group(2) if done else '?'} s, "
          f"coverage {cov[-1] if cov else '?'} edges, corpus {len(list(corpus.iterdir()))} inputs")
    assert p.returncode == 0 and done, log[-4000:]
