"""The llama-cpp-python 0.3.36 sdist (ggml 0.25.3): the specification the RPC server speaks.

scripts/build_llamacpp.sh downloads it into $REFIMPL_CACHE/sdist (scripts/test.sh runs it first); a test
that needs it fails, never skips, when it is missing."""
from __future__ import annotations

import functools
import os
import re
import subprocess
import tarfile
from pathlib import Path

VERSION = "0.3.36"
REPO = Path(__file__).resolve().parents[2]


def cache() -> Path:
    return Path(os.environ.get("REFIMPL_CACHE", Path.home() / ".cache" / "refimpl"))


def sdist() -> Path:
    p = cache() / "sdist" / f"llama_cpp_python-{VERSION}.tar.gz"
    assert p.exists(), f"{p} is missing: run scripts/build_llamacpp.sh (scripts/test.sh does)"
    return p


@functools.lru_cache(maxsize=None)
def read(member: str) -> str:
    """A file of the vendored llama.cpp tree, e.g. "ggml/include/ggml.h"."""
    with tarfile.open(sdist()) as tf:
        f = tf.extractfile(f"llama_cpp_python-{VERSION}/vendor/llama.cpp/{member}")
        return f.read().decode()


def enum(header: str, name: str) -> list[str]:
    """The members of `enum NAME { ... }` in a header, in order (comments and `= N` dropped)."""
    m = re.search(r"enum\s+" + name + r"\s*\{(.*?)\};", header, re.S)
    assert m, f"enum {name} not found"
    body = re.sub(r"//[^\n]*|/\*.*?\*/", "", m.group(1), flags=re.S)
    return [x.split("=")[0].strip() for x in body.split(",") if x.strip()]


@functools.lru_cache(maxsize=None)
def bin_dir() -> Path:
    """test-backend-ops, test-llama-archs and ggml-rpc-server, built (once, cached) by scripts/build_llamacpp.sh."""
    out = subprocess.run(["bash", str(REPO / "scripts" / "build_llamacpp.sh")], capture_output=True, text=True,
                         check=False, timeout=3600)
    assert out.returncode == 0, f"scripts/build_llamacpp.sh failed:\n{out.stderr[-3000:]}"
    return Path(out.stdout.strip().splitlines()[-1])
