"""CUDA kernel tests: numba's CUDA simulator unless REFIMPL_CUDA_REAL=1 (tests/conftest.py sets
NUMBA_ENABLE_CUDASIM before Numba is imported). Skipped, saying so, only where numba is not installed."""
import pytest

numba = pytest.importorskip("numba", reason="numba is not installed (the CUDA backend needs numba.cuda)")


@pytest.fixture(autouse=True)
def _cuda_backend():
    """Every test here runs its ops under refimpl.backend("cuda")."""
    from numba import cuda
    if not cuda.is_available():
        pytest.fail("numba.cuda has neither a GPU nor the simulator "
                    "(NUMBA_ENABLE_CUDASIM=1 is set by tests/conftest.py)")
    from refimpl import backend
    with backend("cuda"):
        yield
