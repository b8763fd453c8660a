"""refimpl as a ggml backend: ggml's RPC protocol (7.0.0, ggml 0.25.3) served by refimpl's ops.

`refimpl serve` (or `Server(...).start()` in-process) listens for ggml's RPC client: llama.cpp with
`--rpc HOST:PORT`, ggml's test-backend-ops with the RPC device, or any program that calls
`ggml_backend_rpc_add_server`. See docs/rpc.md.
"""
from .client import Client
from .ggml_ops import GLU_NAMES, OP_NAMES, UNARY_NAMES
from .server import Server

__all__ = ["Server", "Client", "OP_NAMES", "UNARY_NAMES", "GLU_NAMES"]
