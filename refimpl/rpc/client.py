"""A small client of ggml's RPC protocol 7.0.0, in Python: what the tests and the fuzzer speak.

    c = Client("127.0.0.1", port)              # connects and says HELLO
    buf, size = c.alloc_buffer(1024)
    base = c.buffer_get_base(buf)
    a = c.tensor(1, "f32", [4, 2], buf, base)  # an rpc_tensor (ne in ggml order, contiguous nb)
    c.set_tensor(a, np.arange(8, dtype=np.float32).tobytes())
    y = c.tensor(2, "f32", [4, 2], buf, base + 64, op="SQR", src=[a])
    c.graph_compute([y], [a, y])
    c.get_tensor(y, 0, 32)

It builds rpc_tensors from ggml-order `ne`, computes contiguous `nb` unless given, and names ops by their
ggml 0.25.3 enum name (`refimpl.rpc.OP_NAMES`).
"""
from __future__ import annotations

import socket

import numpy as np

from ..types import as_type, traits
from . import ggml_ops
from .protocol import (CONN_CAPS_SIZE, MAX_SRC, RPC_TENSOR, TENSOR_SIZE, U8, U32, U64, Cmd)


class Client:
    def __init__(self, host: str = "127.0.0.1", port: int = 50052, *, timeout: float = 60.0, hello: bool = True):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if hello:
            self.version = self.hello()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- framing -----------------------------------------------------------------------------------------
    def send(self, cmd: int, payload: bytes = b"") -> None:
        self.sock.sendall(U8.pack(int(cmd)) + U64.pack(len(payload)) + payload)

    def recv(self) -> bytes:
        size = U64.unpack(self._exact(8))[0]
        return self._exact(size)

    def _exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(min(n - len(out), 1 << 24))
            if not chunk:
                raise ConnectionError("server closed the connection")
            out += chunk
        return bytes(out)

    def call(self, cmd: int, payload: bytes = b"") -> bytes:
        self.send(cmd, payload)
        return self.recv()

    # -- commands ----------------------------------------------------------------------------------------
    def hello(self) -> tuple[int, int, int]:
        r = self.call(Cmd.HELLO, bytes(CONN_CAPS_SIZE))
        return r[0], r[1], r[2]

    def device_count(self) -> int:
        return U32.unpack(self.call(Cmd.DEVICE_COUNT))[0]

    def alloc_buffer(self, size: int, device: int = 0) -> tuple[int, int]:
        r = self.call(Cmd.ALLOC_BUFFER, U32.pack(device) + U64.pack(size))
        return U64.unpack_from(r)[0], U64.unpack_from(r, 8)[0]

    def get_alignment(self, device: int = 0) -> int:
        return U64.unpack(self.call(Cmd.GET_ALIGNMENT, U32.pack(device)))[0]

    def get_max_size(self, device: int = 0) -> int:
        return U64.unpack(self.call(Cmd.GET_MAX_SIZE, U32.pack(device)))[0]

    def buffer_get_base(self, buf: int) -> int:
        return U64.unpack(self.call(Cmd.BUFFER_GET_BASE, U64.pack(buf)))[0]

    def free_buffer(self, buf: int) -> None:
        self.send(Cmd.FREE_BUFFER, U64.pack(buf))

    def buffer_clear(self, buf: int, value: int) -> None:
        self.send(Cmd.BUFFER_CLEAR, U64.pack(buf) + U8.pack(value))

    def set_tensor(self, t: bytes, data: bytes, offset: int = 0) -> None:
        self.send(Cmd.SET_TENSOR, t + U8.pack(0) + U64.pack(offset) + bytes(data))

    def set_tensor_hash(self, t: bytes, h: int, offset: int = 0) -> int:
        return self.call(Cmd.SET_TENSOR_HASH, t + U64.pack(offset) + U64.pack(h))[0]

    def get_tensor(self, t: bytes, offset: int, size: int) -> bytes:
        return self.call(Cmd.GET_TENSOR, t + U64.pack(offset) + U64.pack(size))

    def copy_tensor(self, src: bytes, dst: bytes) -> int:
        return self.call(Cmd.COPY_TENSOR, src + dst)[0]

    def memset_tensor(self, t: bytes, offset: int, size: int, value: int) -> None:
        self.send(Cmd.MEMSET_TENSOR, t + U64.pack(offset) + U64.pack(size) + U8.pack(value))

    def init_tensor(self, t: bytes) -> None:
        self.send(Cmd.INIT_TENSOR, t)

    def get_alloc_size(self, t: bytes, srcs=(), device: int = 0) -> int:
        srcs = list(srcs) + [bytes(TENSOR_SIZE)] * (MAX_SRC - len(srcs))
        return U64.unpack(self.call(Cmd.GET_ALLOC_SIZE, U32.pack(device) + t + b"".join(srcs)))[0]

    def get_device_memory(self, device: int = 0) -> tuple[int, int]:
        r = self.call(Cmd.GET_DEVICE_MEMORY, U32.pack(device))
        return U64.unpack_from(r)[0], U64.unpack_from(r, 8)[0]

    def graph_compute(self, nodes, tensors, device: int = 0) -> None:
        self.send(Cmd.GRAPH_COMPUTE, graph_message(nodes, tensors, device))

    def graph_recompute(self, device: int = 0) -> None:
        self.send(Cmd.GRAPH_RECOMPUTE, U32.pack(device))

    # -- building tensors ----------------------------------------------------------------------------------
    @staticmethod
    def tensor(id: int, type, ne, buffer: int = 0, data: int = 0, *, nb=None, op: str | int = "NONE",
               params=None, src=(), view_src: bytes | int = 0, view_offs: int = 0, name: str = "") -> bytes:
        """One rpc_tensor (ne in ggml order, padded to 4 dims; nb contiguous unless given)."""
        tr = traits(as_type(type))
        ne = list(ne) + [1] * (4 - len(ne))
        if nb is None:
            nb = [tr.type_size, tr.type_size * (ne[0] // tr.blck_size)]
            nb += [nb[1] * ne[1], nb[1] * ne[1] * ne[2]]
        t = np.zeros((), RPC_TENSOR)
        t["id"], t["type"], t["buffer"], t["data"] = id, int(tr.type), buffer, data
        t["ne"], t["nb"] = ne, nb
        t["op"] = ggml_ops.OP_NAMES.index(op) if isinstance(op, str) else op
        if params is not None:
            words = np.zeros(16, np.int32)
            p = np.asarray(params)
            words[:p.size] = p.view(np.int32) if p.dtype.itemsize == 4 else p.astype(np.int32)
            t["op_params"] = words
        t["src"] = [tensor_id(s) for s in src] + [0] * (MAX_SRC - len(src))
        t["view_src"], t["view_offs"] = tensor_id(view_src), view_offs
        t["name"] = name.encode()[:63]
        return t.tobytes()


def tensor_id(t) -> int:
    if isinstance(t, (bytes, bytearray)):
        return U64.unpack_from(t)[0] if t else 0
    return int(t)


def graph_message(nodes, tensors, device: int = 0) -> bytes:
    """The GRAPH_COMPUTE payload: device, node ids, then every tensor the nodes reach."""
    return (U32.pack(device) + U32.pack(len(nodes)) + b"".join(U64.pack(tensor_id(n)) for n in nodes)
            + U32.pack(len(tensors)) + b"".join(tensors))
