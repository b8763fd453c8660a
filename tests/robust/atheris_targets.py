"""Coverage-guided fuzz targets (atheris, libFuzzer's engine for Python), run by tests/robust/test_atheris.py:

    python tests/robust/atheris_targets.py rpc|gguf [libFuzzer flags] CORPUS_DIR

rpc:  the bytes after HELLO, as one connection's command stream, into `refimpl serve`'s connection loop on a
      fresh in-memory socket (every message decoder, the graph deserializer, the computing of small graphs).
      A crash is an internal error (an exception outside the server's checks) or memory left allocated.
gguf: the bytes as a GGUF file into `refimpl.gguf.load`, then every tensor read. A crash is any exception
      but GGUFError (a ValueError that names the file).

The seed corpora are tests/robust/corpus/<target>/ (made by `--seeds`); the test copies them, so that what
the fuzzer adds does not land in the repository.
"""
from __future__ import annotations

import io
import os
import sys
import tempfile

import atheris

with atheris.instrument_imports(include=["refimpl"]):
    import numpy as np

    from refimpl import gguf
    from refimpl.rpc import server as rpc_server

from refimpl.rpc.protocol import CONN_CAPS_SIZE, U8, U64, Cmd

HELLO = U8.pack(Cmd.HELLO) + U64.pack(CONN_CAPS_SIZE) + bytes(CONN_CAPS_SIZE)


class MemorySocket:
    """What Connection needs of a socket: its input from bytes, its output dropped."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def recv_into(self, mv, n=0):
        n = min(n or len(mv), len(mv), len(self.data) - self.pos)
        mv[:n] = self.data[self.pos:self.pos + n]
        self.pos += n
        return n

    def recv(self, n):
        out = self.data[self.pos:self.pos + n]
        self.pos += len(out)
        return out

    def makefile(self, mode="rb", buffering=-1):
        """The connection's buffered reader over the remaining input (what socket.makefile gives it)."""
        return io.BufferedReader(io.BytesIO(self.data[self.pos:]), max(buffering, 1))

    def sendall(self, b):
        pass

    def settimeout(self, t):
        pass

    def setsockopt(self, *a):
        pass

    def shutdown(self, how):
        pass

    def close(self):
        pass


SERVER = rpc_server.Server("127.0.0.1", 0, backend="numpy", numerics="exact", mem=16 << 20,
                           max_graph_work=1 << 24, max_graph_seconds=2)


def rpc(data: bytes) -> None:
    SERVER.memory = rpc_server._Memory(16 << 20)        # the same buffer ids and bases for every input
    conn = rpc_server.Connection(SERVER, MemorySocket(HELLO + data), "fuzz")
    conn.serve()
    if SERVER.internal_errors:
        raise RuntimeError("internal error: an exception outside the server's checks (see the log above)")
    if SERVER.memory.used:
        raise RuntimeError(f"{SERVER.memory.used} bytes still counted after the connection closed")


GGUF_PATH = os.path.join(tempfile.mkdtemp(prefix="refimpl-atheris-"), "case.gguf")


def gguf_target(data: bytes) -> None:
    with open(GGUF_PATH, "wb") as f:
        f.write(data)
    try:
        g = gguf.load(GGUF_PATH)
        for t in g.tensors.values():
            np.asarray(t.dequantize() if hasattr(t, "dequantize") else t).sum()
    except gguf.GGUFError:
        pass


TARGETS = {"rpc": rpc, "gguf": gguf_target}


def seeds(corpus: str) -> None:
    """Write the seed corpora: a few valid command streams, and a small valid GGUF file."""
    from refimpl.rpc import Client
    from refimpl.rpc.client import graph_message
    T = Client.tensor
    buf, base = 0x9E3779B1, 0x10000000                 # the first buffer of a fresh server
    alloc = U8.pack(Cmd.ALLOC_BUFFER) + U64.pack(12) + U8.pack(0) * 4 + U64.pack(1 << 16)

    def msg(cmd, payload):
        return U8.pack(cmd) + U64.pack(len(payload)) + payload
    a = T(1, "f32", [16, 4], buf, base)
    b = T(2, "f32", [16, 4], buf, base + 256)
    add = T(3, "f32", [16, 4], buf, base + 512, op="ADD", src=[a, b])
    q = T(4, "q4_0", [64, 2], buf, base + 1024)
    ids = T(5, "i32", [2], buf, base + 2048)
    rows = T(6, "f32", [64, 2], buf, base + 4096, op="GET_ROWS", src=[q, ids])
    mm = T(7, "f32", [4, 4], buf, base + 8192, op="MUL_MAT", src=[a, b])
    streams = {
        "alloc-set-get": alloc + msg(Cmd.SET_TENSOR, a + U8.pack(0) + U64.pack(0) + bytes(256))
        + msg(Cmd.GET_TENSOR, a + U64.pack(0) + U64.pack(256)),
        "graph-add": alloc + msg(Cmd.GRAPH_COMPUTE, graph_message([add], [a, b, add])),
        "graph-rows-mm": alloc + msg(Cmd.GRAPH_COMPUTE, graph_message([rows, mm], [q, ids, rows, a, b, mm]))
        + msg(Cmd.GRAPH_RECOMPUTE, U8.pack(0) * 4),
        "queries": msg(Cmd.DEVICE_COUNT, b"") + msg(Cmd.GET_ALIGNMENT, bytes(4)) + msg(Cmd.GET_MAX_SIZE, bytes(4))
        + msg(Cmd.GET_DEVICE_MEMORY, bytes(4)),
    }
    os.makedirs(os.path.join(corpus, "rpc"), exist_ok=True)
    for name, data in streams.items():
        with open(os.path.join(corpus, "rpc", name), "wb") as f:
            f.write(data)
    os.makedirs(os.path.join(corpus, "gguf"), exist_ok=True)
    rng = np.random.default_rng(0)
    gguf.save(os.path.join(corpus, "gguf", "small.gguf"),
              {"general.architecture": "llama", "general.alignment": 32, "a.str": ["a", "ü"], "t.f": 0.5},
              {"w": rng.standard_normal((2, 32)).astype(np.float32), "h": rng.standard_normal(8).astype(np.float16)})


if __name__ == "__main__":
    if sys.argv[1] == "--seeds":
        seeds(sys.argv[2])
        sys.exit(0)
    target = TARGETS[sys.argv.pop(1)]
    atheris.Setup(sys.argv, target)
    atheris.Fuzz()
