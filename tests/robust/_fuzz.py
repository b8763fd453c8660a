"""Shared pieces of the hostile-input tests: example counts per Hypothesis profile, the per-case guard
(allowed exceptions, memory and time bounds) and the case counters that conftest.py prints.

Every case runs in the pytest process, where the caller gets the result or the error to check, its memory
is measured with tracemalloc (NumPy reports its buffers to it) and its time with a clock; a crash of the
interpreter there fails the whole run loudly (pytest's faulthandler prints where). The first of every
CHILD_EVERY cases of each test runs before that in a forked child under an address-space limit (the
parent's address space plus CHILD_AS_BYTES) and a time limit (the case's `seconds` plus a grace), so that a
crash (SIGSEGV, SIGBUS from a read past the end of a memory map), a hang or an allocation past the limit
is reported as that case's failure, with the signal or the error. Not every case: a fork of the pytest
process costs ~18 ms here (its page tables), and the CI profile draws ~16,000 file cases; one in
CHILD_EVERY keeps well over 3,000 of them in children.
"""
from __future__ import annotations

import faulthandler
import os
import resource
import signal
import time
import tracemalloc
from collections import Counter, defaultdict

from tests._profiles import EXPLORE_FACTOR, PROFILE

# test name -> Counter(outcome -> cases), and seconds spent in the cases
COUNTS: dict[str, Counter] = defaultdict(Counter)
SECONDS: dict[str, float] = defaultdict(float)
CHILDREN: Counter = Counter()   # test name -> cases also run in a forked child


def examples(ci: int) -> int:
    """max_examples for a fuzz test: `ci` under the ci profile, EXPLORE_FACTOR times it under explore, a
    tenth of it (at least 20) under dev."""
    return ci if PROFILE == "ci" else ci * EXPLORE_FACTOR if PROFILE == "explore" else max(20, ci // 10)


CHILD_EVERY = 4               # the first of every CHILD_EVERY cases of a test also runs in a child
CHILD_AS_BYTES = 4 << 30      # address space a case's child may add to what the parent had mapped
CHILD_GRACE_S = 5.0           # on top of the case's own time bound, before the child counts as hung


def _address_space() -> int:
    with open("/proc/self/statm") as f:            # pages mapped (this process's own, a test-side measure)
        return int(f.read().split()[0]) * resource.getpagesize()


def in_child(fn, seconds: float) -> str:
    """fn() in a forked child with an address-space and a time limit: "ok", "raised <Type>: <message>",
    "out of address space (...)", "hung (...)" or "killed by <signal>"."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                    # the child: never returns into pytest
        code = 0
        try:
            os.close(r)
            faulthandler.disable()                  # the parent reports the signal; no traceback dump here
            limit = _address_space() + CHILD_AS_BYTES
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            try:
                fn()
                msg = "ok"
            except MemoryError as e:
                msg = f"out of address space ({CHILD_AS_BYTES >> 30} GiB over the parent's): {e}"
            except BaseException as e:              # noqa: BLE001 -- reported to the parent, which judges it
                msg = f"raised {type(e).__name__}: {e}"
            os.write(w, msg.encode("utf-8", "replace")[:4000])
        except BaseException:                       # noqa: BLE001 -- nothing may escape a forked child
            code = 3
        finally:
            os._exit(code)
    os.close(w)
    deadline = time.monotonic() + seconds + CHILD_GRACE_S
    status = None
    while status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
        elif time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            return f"hung (killed after {seconds + CHILD_GRACE_S:.0f} s)"
        else:
            time.sleep(0.002)
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return b"".join(chunks).decode("utf-8", "replace") or f"exited {os.waitstatus_to_exitcode(status)} silently"


def run_case(test: str, fn, allowed: tuple, *, input_bytes: int, mem_factor: int = 64,
             mem_slack: int = 1 << 20, seconds: float = 5.0):
    """Run fn() as a fuzz case: it may return or raise one of `allowed`; anything else propagates.

    One case in CHILD_EVERY first in a child (`in_child`): a crash, a hang or running out of its address
    space fails the case. Then here: checks that the case allocated at most mem_factor * input_bytes +
    mem_slack bytes at its peak and ran under `seconds`. Returns fn's result, or the allowed exception it
    raised.
    """
    if sum(COUNTS[test].values()) % CHILD_EVERY == 0:
        child = in_child(fn, seconds)
        CHILDREN[test] += 1
        if child.startswith(("killed by", "hung", "out of address space", "exited")):
            COUNTS[test][f"failed ({child.split(' (')[0]})"] += 1
            raise AssertionError(f"{test}: the case's child {child}")
    tracemalloc.start()
    t0 = time.perf_counter()
    result, outcome = None, "failed (unexpected exception)"
    try:
        result = fn()
        outcome = "accepted"
    except allowed as e:
        result = e
        outcome = f"rejected ({type(e).__name__})"
    finally:
        dt = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        COUNTS[test][outcome] += 1
        SECONDS[test] += dt
    limit = mem_factor * input_bytes + mem_slack
    assert peak <= limit, f"{test}: peak allocation {peak} bytes for a {input_bytes}-byte input (limit {limit})"
    assert dt < seconds, f"{test}: one case took {dt:.2f} s (limit {seconds} s)"
    return result


def record(test: str, outcome: str, seconds: float = 0.0) -> None:
    COUNTS[test][outcome] += 1
    SECONDS[test] += seconds
