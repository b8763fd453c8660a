"""OpCases for the softmax ops (see refimpl/testing/cases/__init__.py)."""
from __future__ import annotations
