"""OpCases for the recurrent ops (see refimpl/testing/cases/__init__.py)."""
from __future__ import annotations
