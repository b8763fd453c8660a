import os
import sys

# the CUDA kernels' tests run in numba's CUDA simulator (read when Numba is first imported, so set here);
# REFIMPL_CUDA_REAL=1 runs them on a real GPU instead
if os.environ.get("REFIMPL_CUDA_REAL") != "1":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

from hypothesis import settings

from tests._profiles import PROFILE

settings.load_profile(PROFILE)

import pytest

from tests._oracles import require_oracle


KINDS = ("oracle", "golden", "property", "equivalence")
ORACLE_FIXTURES = ("ggml",)


def pytest_collection_modifyitems(config, items):
    """Tests that use an oracle's fixture or live in tests/oracle/ are `oracle`; every test must say what it
    compares against (one of KINDS, usually a module's `pytestmark`)."""
    unmarked = []
    for item in items:
        if set(ORACLE_FIXTURES) & set(getattr(item, "fixturenames", ())) or "/tests/oracle/" in str(item.fspath):
            item.add_marker(pytest.mark.oracle)
        if not any(item.get_closest_marker(k) for k in KINDS):
            unmarked.append(item.nodeid)
    if unmarked:
        raise pytest.UsageError(f"tests without one of the markers {KINDS}: " + ", ".join(unmarked[:20]))


@pytest.fixture(scope="session")
def ggml():
    """The live ggml oracle (refimpl.testing.ggml); a test that asks for it fails when ggml-python is missing."""
    require_oracle("ggml", "ggml-python, the golden oracle,")
    from refimpl.testing import ggml as oracle
    oracle.check_profile()       # a native (AVX-512) build would change the numbers: fail, don't compare
    # llama.cpp's libggml (another ggml version) must never share this process with the oracle's: a library
    # loaded later binds to the one already loaded by its soname (refimpl.compare runs llama.cpp in a child)
    assert "llama_cpp" not in sys.modules, "llama-cpp-python (and its libggml) is loaded in this process"
    return oracle


def pytest_sessionfinish(session, exitstatus):
    """Write what the golden tests compared to $REFIMPL_COVERAGE_LOG (read by refimpl.testing.coverage)."""
    path = os.environ.get("REFIMPL_COVERAGE_LOG")
    if path:
        import json
        from refimpl.testing.golden import LOG
        with open(path, "w") as f:
            json.dump(LOG, f)
