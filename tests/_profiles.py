"""Hypothesis profiles, in one place: which examples a run draws, and how many.

    ci       (CI=true, or HYPOTHESIS_PROFILE=ci; what scripts/test.sh runs): derandomized. Every run of the
             same commit draws the same examples, so a red CI is the commit's fault and a green one stays
             green; no example database is read or written.
    dev      (the default): fresh random examples on every run, fewer of them, for a quick loop.
    explore  fresh random examples, EXPLORE_FACTOR times the ci profile's count (explicit per-test counts
             too): the search for examples the fixed ci draw never meets; run it before a change lands
             (docs/testing.md, "Exploring").

Every profile prints a failing example's reproducer (the @reproduce_failure blob) with the example itself.
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")
EXPLORE_FACTOR = 10
CI_EXAMPLES = 150

_common = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# The rare blocks (ties, outliers, f16 overflow, subnormals) need no long runs: every drawn tensor holds many
# blocks, each of a kind drawn from all twelve (refimpl.testing.strategies), so 150 examples meet each kind
# for every type many times; at 300 the suite no longer fitted CI's hour.
settings.register_profile("ci", max_examples=CI_EXAMPLES, derandomize=True, database=None, **_common)
settings.register_profile("dev", max_examples=40, derandomize=False, **_common)
settings.register_profile("explore", max_examples=CI_EXAMPLES * EXPLORE_FACTOR, derandomize=False, **_common)


def examples(n: int) -> int:
    """max_examples for a test that sets its own count: n, or EXPLORE_FACTOR times n under explore."""
    return n * EXPLORE_FACTOR if PROFILE == "explore" else n
