"""Shared pieces of the hostile-input tests: example counts per Hypothesis profile, the per-case guard
(allowed exceptions, memory and time bounds) and the case counters that conftest.py prints.

Every case runs in the pytest process itself, so a crash of the interpreter (SIGSEGV, SIGBUS from a
read past the end of a memory map) fails the whole run loudly (pytest's faulthandler prints where);
memory is measured with tracemalloc (NumPy reports its buffers to it) and time with a clock.
"""
from __future__ import annotations

import os
import time
import tracemalloc
from collections import Counter, defaultdict

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")

# test name -> Counter(outcome -> cases), and seconds spent in the cases
COUNTS: dict[str, Counter] = defaultdict(Counter)
SECONDS: dict[str, float] = defaultdict(float)


def examples(ci: int) -> int:
    """max_examples for a fuzz test: `ci` under the ci profile, a tenth of it (at least 20) otherwise."""
    return ci if PROFILE == "ci" else max(20, ci // 10)


def run_case(test: str, fn, allowed: tuple, *, input_bytes: int, mem_factor: int = 64,
             mem_slack: int = 1 << 20, seconds: float = 5.0):
    """Run fn() once as a fuzz case: it may return or raise one of `allowed`; anything else propagates.

    Checks that the case allocated at most mem_factor * input_bytes + mem_slack bytes at its peak and
    ran under `seconds`. Returns fn's result, or the allowed exception it raised.
    """
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
