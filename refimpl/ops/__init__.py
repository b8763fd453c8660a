"""Every forward op of ggml as a NumPy function with ggml's name and argument order.

Shapes are NumPy order (ggml `ne` reversed); each op's docstring gives both. Ops are grouped by family,
one module each; all are re-exported here and as `refimpl.<name>`.
"""
from ..dispatch import (OPS, backend, current_backend, current_numerics, ggml_numerics, numerics, op,  # noqa: F401
                        register)
from ..shapes import GGMLShapeError  # noqa: F401

from . import elementwise, reduce, movement, norm, softmax, rope, attention, loss  # noqa: E402,F401
from . import matmul, conv, recurrent, sort, fused, optim, hyperconn  # noqa: E402,F401


_MODULES = (elementwise, reduce, movement, norm, softmax, rope, attention, loss, matmul, conv, recurrent, sort,
            fused, optim, hyperconn)


def _export():
    # module names like `norm` are rebound to the op of the same name: read them from _MODULES only
    g = globals()
    for name, info in OPS.items():
        for mod in _MODULES:
            if hasattr(mod, name):
                g[name] = getattr(mod, name)
                break
    return sorted(OPS)


__all__ = _export() + ["OPS", "backend", "numerics", "op", "register", "GGMLShapeError"]
