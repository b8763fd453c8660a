"""Reports how many hostile inputs each robustness test tried (printed at the end of every run)."""
from __future__ import annotations

from ._fuzz import CHILDREN, COUNTS, PROFILE, SECONDS


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not COUNTS:
        return
    tr = terminalreporter
    tr.section(f"hostile-input cases tried (HYPOTHESIS_PROFILE={PROFILE})")
    total = 0
    for name in sorted(COUNTS):
        c = COUNTS[name]
        n = sum(c.values())
        total += n
        parts = ", ".join(f"{v} {k}" for k, v in sorted(c.items()))
        child = f"; {CHILDREN[name]} also in a child" if CHILDREN[name] else ""
        tr.write_line(f"{name}: {n} cases in {SECONDS[name]:.1f} s ({parts}{child})")
    tr.write_line(f"total: {total} cases, {sum(CHILDREN.values())} of them also in a forked child "
                  f"(address-space and time limits)")
