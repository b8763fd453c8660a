"""The tolerance table lives in core (refimpl.tolerances); re-exported here for the test toolkit."""
from ..tolerances import TOLERANCES, Tol, nmse, tol  # noqa: F401
