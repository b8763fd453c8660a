"""Run a function in a forked child and get its result back: the fork tests of the kernels (GNU OpenMP's
threads, and a thread pool's, do not survive a fork, so a kernel that reached for them in a child would hang)."""
import os
import pickle
import select

import pytest


def in_forked_child(fn, what: str, timeout: float = 120.0):
    """fn() run in a child of this process, its result pickled back through a pipe; the test fails when the
    child does not answer within `timeout` seconds (it is killed) or dies without a result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                                  # child
        try:
            os.close(r)
            got = fn()
            with os.fdopen(w, "wb") as f:
                f.write(pickle.dumps(got))
        finally:
            os._exit(0)
    os.close(w)
    ready, _, _ = select.select([r], [], [], timeout)
    if not ready:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(r)
        pytest.fail(f"the forked child's {what} did not finish in {timeout:.0f} s (threads after fork)")
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    assert data, f"the forked child died without a result ({what})"
    return pickle.loads(data)
