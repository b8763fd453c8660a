"""argparse value types shared by the command line's modules: a bad value is one line naming the flag."""
from __future__ import annotations

import argparse


def number(kind, name: str, ok, want: str):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--{name} wants {want}, not {text!r}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"--{name} wants {want}, not {text!r}")
        return v
    return parse


def at_least(lo, name, kind=float):
    return number(kind, name, lambda v: v >= lo, f"a number >= {lo}")


def above(lo, name, kind=float):
    return number(kind, name, lambda v: v > lo, f"a number > {lo}")


def within(lo, hi, name, low_open=False):
    ok = (lambda v: lo < v <= hi) if low_open else (lambda v: lo <= v <= hi)
    return number(float, name, ok, f"a number in {'(' if low_open else '['}{lo}, {hi}]")


def byte_size(text: str) -> int:
    """"8G", "512M", "1048576" -> bytes (argparse type)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    try:
        n = float(t[:-1] if mult > 1 else t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a byte count: {text!r} (e.g. 8G, 512M, 1048576)") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return int(n)
