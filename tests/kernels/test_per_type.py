"""The per-type kernels made from templates (kernels._common.per_type): one for each type of the table, and
they load from Numba's cache in a new process, which closures and kernels passed as arguments do not."""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("numba", reason="numba is an optional dependency (refimpl[numba])")

from refimpl.kernels import matmul, quants  # noqa: E402
from refimpl.types import GGMLType, traits  # noqa: E402

pytestmark = pytest.mark.property


def test_every_decoder_has_its_driver_and_every_weight_type_its_mat_vec():
    assert set(quants.PAR_DECODERS) == set(quants.DECODERS)
    activations = {int(GGMLType.F32), int(GGMLType.Q8_1), int(GGMLType.Q8_K)}
    assert set(matmul.GEMV) == set(quants.DECODERS) - activations
    for tid, f in quants.PAR_DECODERS.items():
        assert f.py_func.__name__ == f"_par_dq_{traits(tid).name}"
        assert f.py_func.__module__ == "refimpl.kernels.quants"
    for tid, f in matmul.GEMV.items():
        assert f.py_func.__name__ == f"_gemv_{traits(tid).name}"
    assert set(matmul.PAR_FAST) == set(matmul.FAST) <= set(matmul.PAR_GEMV) <= set(matmul.GEMV)


CHILD = textwrap.dedent('''
    import numpy as np, refimpl
    from refimpl.kernels import matmul, quants
    from refimpl.types import GGMLType
    t = int(GGMLType.Q4_K)
    q = refimpl.quantize(np.linspace(-1, 1, 4 * 256, dtype=np.float32).reshape(4, 256), "q4_K")
    out = np.empty((4, 256), np.float32)
    quants.PAR_DECODERS[t](np.ascontiguousarray(q.data), out, (), 2)
    B = np.ones((1, 256)); res = np.empty((1, 4), np.float32)
    matmul.GEMV[t](np.ascontiguousarray(q.data), 1, B, res, 0, 4, ())
    assert np.array_equal(res[0], out.astype(np.float64).sum(axis=1).astype(np.float32))
    print(sum(sum(f.stats.cache_hits.values()) for f in (quants.PAR_DECODERS[t], matmul.GEMV[t])),
          sum(sum(f.stats.cache_misses.values()) for f in (quants.PAR_DECODERS[t], matmul.GEMV[t])))
''')


def test_template_kernels_load_from_numbas_cache_in_a_new_process(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    runs = [subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    (hits1, misses1), (hits2, misses2) = (tuple(map(int, r.stdout.split())) for r in runs)
    assert (hits1, misses1) == (0, 2)               # compiled in the first process ...
    assert (hits2, misses2) == (2, 0)               # ... and loaded from the cache in the second
