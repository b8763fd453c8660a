"""reduce ops (see refimpl/ops/__init__.py)."""
from __future__ import annotations

import numpy as np

from ._core import op
from ._shapes import fail, fmt
