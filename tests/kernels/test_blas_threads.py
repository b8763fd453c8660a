"""kernels.blas_threads: OpenBLAS's threaded calls run their jobs on refimpl's threads inside `shared()`.

What must hold: OpenBLAS really hands the jobs over (the callback runs), the results are OpenBLAS's own bits
(it partitions the work as for its own threads), concurrent callers neither deadlock nor mix results, and the
callback is gone when the last `shared()` exits. Needs NumPy linked to an OpenBLAS with the threads callback
(>= 0.3.27, as NumPy's wheels); skipped otherwise. OpenBLAS is set to 2 threads for the module where it runs
on one (OPENBLAS_NUM_THREADS=1, one CPU), so that its calls are threaded, and set back after.
"""
import ctypes
import threading

import numpy as np
import pytest

from refimpl.kernels import blas_threads as bt

pytestmark = pytest.mark.equivalence

if not bt.available():
    pytest.skip("NumPy's BLAS has no openblas_set_threads_callback_function (not NumPy's OpenBLAS >= 0.3.27, "
                "or REFIMPL_BLAS_THREADS=openblas)", allow_module_level=True)


@pytest.fixture(autouse=True, scope="module")
def _threaded_openblas():
    """At least 2 OpenBLAS threads while these tests run (openblas_set_num_threads), the setting restored."""
    pre, post = bt._affix
    set_threads = getattr(bt._lib, f"{pre}set_num_threads{post}")
    set_threads.argtypes, set_threads.restype = [ctypes.c_int], None
    before = bt.openblas_threads()
    if before < 2:
        set_threads(2)
    yield
    if before < 2:
        set_threads(before)


def _operands(seed, n=384, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, n)).astype(dtype), rng.standard_normal((n, 2 * n)).astype(dtype)


def _numba():
    return pytest.importorskip("numba", reason="numba is not installed: shared(omp=True) runs in its prange")


def _prange_takes_them(numba) -> bool:
    """Whether shared(omp=True) can give every job of a call a Numba thread (else the jobs take the pool)."""
    return 1 < bt.openblas_threads() <= numba.get_num_threads()


@pytest.mark.parametrize("omp", [False, True], ids=["pool", "omp"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_jobs_run_here_with_openblas_bits(dtype, omp):
    if omp:
        numba = _numba()
        before = numba.get_num_threads()
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        prange = _prange_takes_them(numba)
    a, b = _operands(0, dtype=dtype)
    ref = a @ b                                         # OpenBLAS's own threads
    bt._jobs.clear()
    calls = bt.omp_calls
    try:
        with bt.shared(omp=omp):
            got = a @ b
            got_t = np.matmul(b.T, a.T)
    finally:
        if omp:
            numba.set_num_threads(before)
    if omp and prange:
        assert bt.omp_calls == calls + 2 and not bt._jobs, "the jobs did not run in the prange"
    else:                          # the pool: without omp, or with fewer Numba threads than jobs (one CPU)
        assert bt._jobs and bt.omp_calls == calls, "OpenBLAS did not hand the jobs to the pool"
    assert np.array_equal(got, ref)
    assert np.array_equal(got_t, b.T @ a.T)
    assert not bt.active_omp()


def test_callback_is_removed_when_the_last_scope_exits():
    a, b = _operands(1)
    with bt.shared():
        with bt.shared():
            pass
        bt._jobs.clear()
        a @ b
        assert bt._jobs                                 # still installed: the outer scope is open
    bt._jobs.clear()
    a @ b
    assert not bt._jobs and bt._active == 0


@pytest.mark.parametrize("omp", [False, True], ids=["pool", "omp"])
def test_concurrent_callers_get_their_own_results(omp):
    """Four threads in shared() at once, GEMMs and threaded GEMVs: each call's jobs must all run concurrently (a
    level-3 call's jobs wait for each other) and must not share OpenBLAS's per-thread buffers with another
    call's jobs, so a pool too small would hang and calls run side by side could mix their work (the pool is
    grown first, so that they could)."""
    if omp:
        _numba()
    bt._pool_for(4)
    cases = [_operands(10 + i) for i in range(4)]
    refs = [a @ b for a, b in cases]
    vecs = [np.random.default_rng(20 + i).standard_normal((4096, 4096)).astype(np.float32) for i in range(2)]
    xs = [np.random.default_rng(30 + i).standard_normal(4096).astype(np.float32) for i in range(2)]
    vrefs = [m @ x for m, x in zip(vecs, xs)]
    results, errors = {}, []

    def work(i):
        try:
            with bt.shared(omp=omp and i % 2 == 0):      # omp: half the callers, pool scopes beside them
                for _ in range(5):
                    a, b = cases[i]
                    results[i] = a @ b
                    results[i, "gemv"] = vecs[i % 2] @ xs[i % 2]
        except Exception as e:                          # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a BLAS call under shared() did not finish in 120 s"
    assert not errors, errors
    for i, ref in enumerate(refs):
        assert np.array_equal(results[i], ref), i
        assert np.array_equal(results[i, "gemv"], vrefs[i % 2]), (i, "gemv")
    assert bt._active == 0


def test_bert_layers_run_in_a_shared_scope(tmp_path):
    """refimpl.models.bert opts in for its layers on the Numba backend (every BLAS call of them, none left to
    OpenBLAS's spinning workers), and leaves the scope when the forward returns; the NumPy backend does not."""
    pytest.importorskip("safetensors", reason="the safetensors package reads Hugging Face weights")
    pytest.importorskip("numba", reason="numba is not installed: the Numba backend")
    import refimpl
    from refimpl.models import bert
    from tests.models.bert_tiny import write_tiny_bert_hf
    model = bert.load(write_tiny_bert_hf(tmp_path / "tiny"))
    for backend, inside in (("numba", 1), ("numpy", 0)):
        active = {}
        with refimpl.backend(backend):
            bert.forward(model, [[4, 9, 10, 5]], capture=lambda name, x: active.setdefault(name, bt._active))
        layers = {n: a for n, a in active.items() if n.startswith(("Qcur-", "ffn_out-", "l_out-"))}
        assert len(layers) == 3 * model.hparams.n_layer and set(layers.values()) == {inside}, (backend, layers)
        assert active["inp_embd"] == 0 and active["result_embd"] == 0, backend
    assert bt._active == 0


def test_llama_prefill_runs_its_blas_jobs_on_numba_threads(tmp_path, monkeypatch):
    """refimpl.models.llama opts a prefill (more than 8 tokens) into shared(omp=True) on the Numba backend --
    its BLAS jobs on the threads of the decode kernels, so that no OpenBLAS worker spins beside the decode
    steps after it -- and not a decode step, nor the NumPy backend; the logits are the same bits either way
    (OpenBLAS's own partition)."""
    pytest.importorskip("numba", reason="numba is not installed: the Numba backend")
    import refimpl
    from refimpl.models import llama
    from tests.models.tiny import write_tiny_llama
    model = llama.load(write_tiny_llama(tmp_path / "tiny.gguf", n_embd=256, n_ff=512))
    ids = list(range(3, 40))
    seen = {}
    for backend in ("numba", "numpy"):
        with refimpl.backend(backend):
            cache = llama.new_cache(model, 64)
            seen[backend] = []
            llama.forward(model, ids, cache, capture=lambda n, x: seen[backend].append(bt.active_omp()))
            seen[backend, "decode"] = []
            llama.forward(model, [5], cache, capture=lambda n, x: seen[backend, "decode"].append(bt.active_omp()))
    assert any(seen["numba"]) and not any(seen["numba", "decode"]), "prefill in the scope, decode outside it"
    assert not any(seen["numpy"]) and not bt.active_omp()
    with refimpl.backend("numba"):
        calls = bt.omp_calls
        logits = llama.forward(model, ids, llama.new_cache(model, 64))
        if bt.openblas_threads() > 1 and bt.openblas_threads() <= refimpl.kernels._common.n_threads():
            assert bt.omp_calls > calls, "no threaded BLAS call of the prefill ran in the prange"
        import contextlib
        monkeypatch.setattr(llama, "forward_scope", lambda n, workload: contextlib.nullcontext())
        own = llama.forward(model, ids, llama.new_cache(model, 64))     # OpenBLAS's own workers
    assert np.array_equal(logits, own)
