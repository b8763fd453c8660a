"""refimpl's BLAS calls run OpenBLAS's threaded jobs on a pool whose threads sleep between calls.

NumPy's OpenBLAS keeps its worker threads spinning (sched_yield in a loop) for 2^28 cycles, ~0.1 s, after every
threaded call before they sleep: its THREAD_TIMEOUT, read from OPENBLAS_THREAD_TIMEOUT once, when the library
loads. A model alternates GEMMs with multi-threaded Numba kernels a few milliseconds long, so a spinning worker
holds a core that the kernels need: on 2 cores every kernel after a GEMM ran at about half its speed (MiniLM,
long batch: soft_max_ext 9.9 ms a layer after a matmul against 4.9 with OPENBLAS_THREAD_TIMEOUT=4).

OpenBLAS >= 0.3.27 lets its caller run the jobs of a threaded call (`openblas_set_threads_callback_function`,
caller-managed threading): OpenBLAS splits the work exactly as it would for its own threads and hands the jobs
to a callback, which must run them concurrently (the jobs of a level-3 call wait for each other's packed
panels). While `shared()` is active, the callback runs job 0 on the calling thread and the others on a pool of
threads that wait on a queue, asleep, between calls. The partition, hence every result bit, is OpenBLAS's own
(tests/kernels/test_blas_threads.py).

The hand-off costs ~0.1 ms a call, which OpenBLAS's spinning workers do not: it pays where GEMMs of a few ms
alternate with multi-threaded kernels (refimpl.models.bert's layers: MiniLM's 2,016-token batch 281-310 ms
against 341-400), not for runs of small GEMMs (SmolLM2's 128-token prefill, whose attention calls sgemm per
head: 366 ms shared against 288; there shared(omp=True) runs the jobs in a Numba prange instead, ~5-10 us a
call, see below), and never mixed within one workload: a worker left spinning by an unshared
call competes with the jobs of the next shared one (MiniLM's short batch shared above 2^28 multiply-adds
only: 131-186 ms, against 75-80 all shared). So a model opts in for its whole forward.

The callback is installed only while some thread is inside `shared()` (a count under a lock) and is process
wide meanwhile: another thread's NumPy BLAS call in that window runs its jobs the same way, with the same
results. A BLAS whose library exports no such function (MKL, an older OpenBLAS, a NumPy linked to another
BLAS) leaves `shared()` a no-op; REFIMPL_BLAS_THREADS=openblas keeps OpenBLAS's own threads.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor

# void callback(int sync, dojob_t dojob, int numjobs, size_t jobdata_elsize, void *jobdata, int dojob_data);
# void dojob(int thread_num, void *jobdata, int dojob_data).  Pointers are taken as integers.
_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_size_t, ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t,
                             ctypes.c_int)
_DOJOB = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_size_t, ctypes.c_int)
_PREFIXES = (("scipy_openblas_", "64_"), ("scipy_openblas_", ""), ("openblas_", "64_"), ("openblas_", ""))

_lock = threading.Lock()
_one_call = threading.Lock()      # held while one call's jobs run
_active = 0
_setter = None          # the library's setter, once found; False when there is none
_count = None           # its openblas_get_num_threads
_servers = None         # its blas_num_threads (a ctypes int living in the library)
_max_threads = 0        # its MAX_THREADS: the size of its per-thread arrays
_lib = None             # the library (ctypes), and its symbols' (prefix, suffix)
_affix = None
_pool: ThreadPoolExecutor | None = None
_pool_size = 0          # the max_workers _pool was made with
_jobs: dict[int, ctypes._CFuncPtr] = {}


def _openblas_paths() -> list[str]:
    """Loaded shared objects named like OpenBLAS, NumPy's own (in numpy.libs or numpy's tree) first."""
    if not hasattr(os, "RTLD_NOLOAD"):
        return []
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
    except OSError:
        return []
    import numpy as np
    home = os.path.dirname(os.path.dirname(os.path.abspath(np.__file__)))
    found = sorted(p for p in paths if "openblas" in os.path.basename(p).lower() and ".so" in p)
    return sorted(found, key=lambda p: not (p.startswith(home) and "numpy" in p))


def _find_library():
    """(setter of the threads callback, get_num_threads, its blas_num_threads, MAX_THREADS, the library, its
    symbols' (prefix, suffix)) of NumPy's OpenBLAS, or (False, None, None, 0, None, None)."""
    none = (False, None, None, 0, None, None)
    if os.environ.get("REFIMPL_BLAS_THREADS", "").lower() == "openblas":
        return none
    for path in _openblas_paths():
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue
        for pre, post in _PREFIXES:
            setter = getattr(lib, f"{pre}set_threads_callback_function{post}", None)
            count = getattr(lib, f"{pre}get_num_threads{post}", None)
            config = getattr(lib, f"{pre}get_config{post}", None)
            if setter is None or count is None or config is None:
                continue
            setter.argtypes, setter.restype = [ctypes.c_void_p], None
            count.argtypes, count.restype = [], ctypes.c_int
            config.argtypes, config.restype = [], ctypes.c_char_p
            m = re.search(rb"MAX_THREADS=(\d+)", config() or b"")
            try:
                servers = ctypes.c_int.in_dll(lib, "blas_num_threads")
            except ValueError:
                servers = None
            return setter, count, servers, int(m.group(1)) if m else 0, lib, (pre, post)
    return none


def _pool_for(workers: int) -> ThreadPoolExecutor:
    """A pool of at least `workers` threads: every job of one call must be able to run at once."""
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size < workers:
            old, _pool = _pool, ThreadPoolExecutor(max_workers=workers, thread_name_prefix="refimpl-blas")
            _pool_size = workers
            if old is not None:
                old.shutdown(wait=False)
        return _pool


def _first_slot(numjobs: int) -> int:
    """The thread number of a call's first job (see _run_jobs): after OpenBLAS's own workers where MAX_THREADS
    leaves room for numjobs more, else 0."""
    slot = _servers.value if _servers is not None else 0
    return slot if 0 <= slot <= _max_threads - numjobs else 0


def _run_jobs(sync, dojob, numjobs, elsize, jobdata, dojob_data):
    """OpenBLAS's callback: job i is dojob(slot + i, jobdata + i * elsize, dojob_data); all of them, concurrently.

    The thread number picks OpenBLAS's per-thread state (thread_status[n], and blas_thread_buffer[n], where a
    job without buffers of its own works: every job of a threaded gemv), so calls from two threads at once
    run one after the other here (OpenBLAS's level-3 driver serializes its threaded calls itself; its own
    server would give concurrent gemv callers different workers, hence different buffers). The job marks its
    state busy while it runs; numbers 0 .. blas_num_threads - 2 belong to OpenBLAS's own (idle) workers,
    and a worker that sees its slot marked busy keeps spinning instead of going to sleep -- the very spin this
    module avoids (measured: every job twice as slow). So the jobs take the numbers after those when
    MAX_THREADS leaves room (it is 64 in NumPy's wheels), else 0 .. numjobs - 1."""
    job = _jobs.get(dojob)
    if job is None:
        job = _jobs.setdefault(dojob, _DOJOB(dojob))
    with _one_call:                          # slots are per thread number: two calls at once would share them
        slot = _first_slot(numjobs)
        waits = []
        for i in range(1, numjobs):
            args = (slot + i, jobdata + i * elsize, dojob_data)
            try:
                waits.append(_pool_for(numjobs - 1).submit(job, *args).result)
            except Exception:                # no pool (shut down at interpreter exit, ...): a thread of its
                t = threading.Thread(target=job, args=args)   # own, as a job not run leaves the result short
                t.start()
                waits.append(t.join)
        job(slot, jobdata, dojob_data)       # ctypes releases the GIL while the job runs
        for w in waits:
            w()


_callback = _CALLBACK(_run_jobs)


# -- the jobs on Numba's threads --------------------------------------------------------------------------
# The pool's hand-off (~0.1 ms a call) is what shared() costs a run of small GEMMs (SmolLM2's prefill). With
# shared(omp=True) a call's jobs run in a Numba `prange` instead, one job per iteration on Numba's OpenMP
# threads (~5-10 us to start them, the callback's GIL included), which then serve the decode kernels' prange
# drivers too: one team for the whole model, no OpenBLAS worker spinning beside it. Only where every job
# gets a thread of its own at once (numjobs <= Numba's threads: a level-3 call's jobs wait for each other;
# not in a forked child, whose OpenMP threads are gone, nor on a pool thread); else the pool as above.

_omp = 0                # how many shared(omp=True) are active
omp_calls = 0           # threaded calls whose jobs ran in the prange (a count for the tests)


def _run_jobs_omp(sync, dojob, numjobs, elsize, jobdata, dojob_data):
    """_run_jobs with the jobs in a prange where shared(omp=True) is active and every job gets its own thread."""
    from ._common import prange_ok
    if _omp and prange_ok() and not threading.current_thread().name.startswith("Dummy"):
        from ._blas_jobs import par_jobs          # Numba, imported on first use
        from ._common import n_threads
        if 1 < numjobs <= n_threads():
            with _one_call:
                par_jobs(dojob, _first_slot(numjobs), jobdata, elsize, dojob_data, numjobs)
                global omp_calls
                omp_calls += 1
            return
    _run_jobs(sync, dojob, numjobs, elsize, jobdata, dojob_data)


_callback = _CALLBACK(_run_jobs_omp)


def available() -> bool:
    """Whether NumPy's BLAS takes a threads callback (and REFIMPL_BLAS_THREADS does not say openblas)."""
    global _setter, _count, _servers, _max_threads, _lib, _affix
    if _setter is None:
        _setter, _count, _servers, _max_threads, _lib, _affix = _find_library()
    return _setter is not False


def openblas_threads() -> int | None:
    """The number of threads OpenBLAS splits a call into (openblas_get_num_threads), None without `available()`."""
    return int(_count()) if available() else None


@contextlib.contextmanager
def shared(omp: bool = False):
    """While active (in any thread), OpenBLAS's threaded calls run their jobs here: job 0 on the calling
    thread, the others on a pool of sleeping threads; with omp=True all of them on Numba's threads (see
    above: for workloads whose own kernels run there). A no-op without `available()`."""
    global _active, _omp
    if not available():
        yield
        return
    with _lock:
        _active += 1
        _omp += bool(omp)
        if _active == 1:
            _setter(ctypes.cast(_callback, ctypes.c_void_p))
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            _omp -= bool(omp)
            if _active == 0:
                _setter(None)


def active_omp() -> bool:
    """Whether a shared(omp=True) is active: the caller's BLAS jobs run on Numba's threads."""
    return _omp > 0


def _after_fork_in_child() -> None:
    """A forked child has neither the pool's threads nor the parent's callers: OpenBLAS's own threads again."""
    global _active, _pool, _pool_size, _omp
    _active, _pool, _pool_size, _omp = 0, None, 0, 0
    if _setter:
        _setter(None)


if hasattr(os, "register_at_fork"):           # POSIX; elsewhere there is no fork (and no /proc: not available)
    os.register_at_fork(after_in_child=_after_fork_in_child)


def forward_scope(n_tokens: int, workload: str):
    """The numba backend's scope around a model's forward pass (refimpl.dispatch.forward_scope).

    decoder  a prefill (more than 8 tokens) runs BLAS's jobs on Numba's threads, the threads of the decode
             kernels: OpenBLAS's own workers spin ~0.1 s after a call and took a core from the first decode
             steps after a prefill (SmolLM2, 2 threads: 30-110 ms a token instead of 12-19). Decode steps make
             no BLAS calls (one token: the fused kernels), so they need no scope.
    encoder  every call of the pass runs BLAS's jobs on refimpl's threads, which sleep between calls, so that
             no OpenBLAS worker spins beside the multi-threaded kernels that follow each GEMM (MiniLM's long
             batch, 2,016 tokens: 281-310 ms against 341-400 with OpenBLAS's workers)."""
    if workload == "decoder":
        return shared(omp=True) if n_tokens > 8 else contextlib.nullcontext()
    return shared()
