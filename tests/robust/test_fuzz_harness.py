"""The fuzz tests' child guard (tests/robust/_fuzz.py `in_child`) reports what it exists to catch: a crash of
the interpreter, a hang, an allocation past its address-space limit, and an exception, by name."""
import ctypes
import os
import time

import numpy as np
import pytest

from ._fuzz import CHILD_AS_BYTES, in_child

pytestmark = pytest.mark.property


def test_a_crash_is_reported_with_its_signal():
    assert in_child(lambda: ctypes.string_at(0), 5.0) == "killed by SIGSEGV"
    assert in_child(os.abort, 5.0) == "killed by SIGABRT"


def test_a_hang_is_killed_and_reported():
    t0 = time.monotonic()
    assert in_child(lambda: time.sleep(600), 0.5).startswith("hung")
    assert time.monotonic() - t0 < 30


def test_an_allocation_past_the_limit_is_reported():
    r = in_child(lambda: np.ones(2 * CHILD_AS_BYTES, np.uint8), 5.0)
    assert r.startswith("out of address space"), r


def test_an_exception_is_named_and_a_clean_case_is_ok():
    assert in_child(lambda: int("x"), 5.0).startswith("raised ValueError: invalid literal")
    assert in_child(lambda: sum(range(10)), 5.0) == "ok"
