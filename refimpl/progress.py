"""Progress bars for the slow steps (fetch, quantize, convert, GGUF save), through tqdm.

Shown only when stderr is a terminal (tqdm's `disable=None`), so logs, pipes and CI stay quiet; without tqdm
installed the steps run the same, without a bar. REFIMPL_PROGRESS=0 turns them off everywhere.
"""
from __future__ import annotations

import os
import sys


def enabled() -> bool:
    """Whether a bar would show: stderr is a terminal and REFIMPL_PROGRESS is not 0."""
    return os.environ.get("REFIMPL_PROGRESS", "1") != "0" and sys.stderr.isatty()


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
