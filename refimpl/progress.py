"""Progress bars for the slow steps (fetch, quantize, convert, GGUF save), through tqdm, and one-line notes
for a slow step with nothing to count (compiling the Numba kernels on first use).

Bars show only when stderr is a terminal (tqdm's `disable=None`), so logs, pipes and CI stay quiet; without
tqdm installed the steps run the same, without a bar. A note is one line on stderr wherever it goes.
REFIMPL_PROGRESS=0 turns both off everywhere.
"""
from __future__ import annotations

import os
import sys


def enabled() -> bool:
    """Whether a bar would show: stderr is a terminal and REFIMPL_PROGRESS is not 0."""
    return os.environ.get("REFIMPL_PROGRESS", "1") != "0" and sys.stderr.isatty()


def note(message: str) -> None:
    """`refimpl: message` on stderr (a step that takes seconds and has nothing to count), unless
    REFIMPL_PROGRESS=0."""
    if os.environ.get("REFIMPL_PROGRESS", "1") != "0":
        print(f"refimpl: {message}", file=sys.stderr, flush=True)


def progress(iterable=None, *, total=None, desc: str = "", unit: str = "it", unit_scale: bool = False):
    """`iterable` wrapped in a tqdm bar on stderr (or a bar to .update() by hand when iterable is None);
    the iterable itself, or a no-op bar, when bars are off or tqdm is missing."""
    if enabled():
        try:
            from tqdm import tqdm
        except ImportError:
            pass
        else:
            return tqdm(iterable, total=total, desc=desc, unit=unit, unit_scale=unit_scale, file=sys.stderr,
                        leave=False, dynamic_ncols=True)
    return iterable if iterable is not None else _Quiet()


class _Quiet:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass
