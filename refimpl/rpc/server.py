"""refimpl as a ggml backend: a server of ggml's RPC protocol 7.0.0 that computes graphs with refimpl's ops.

    refimpl serve [--host 127.0.0.1] [--port 50052] [--backend numpy|numba] [--numerics exact|ggml|fast]
                  [--mem BYTES] [--dump DIR] [--strict]

    srv = Server(port=0).start()          # in-process, on a free port: srv.port
    ...                                    # ggml clients (llama.cpp --rpc, test-backend-ops) connect
    srv.stop()

Each connection has its own buffers (ggml's rpc_server is per connection too); `--mem` bounds what all of
them allocate together. A buffer is a NumPy byte array at a made-up base address; a tensor is a view of it
built from ggml's `ne`/`nb` (QTensor for block types and BF16). GRAPH_COMPUTE runs each node with the
refimpl op of the same name (`ggml_ops.OPS`) and writes its value into the node's own bytes, so views,
views of views and in-place ops read and write the same memory as on ggml's CPU backend. Graphs are computed
on one thread of the server, one at a time, whichever connection sent them: the kernels split their work
over all cores themselves, and one computing thread means one set of Numba/OpenMP worker threads, never two
sets spinning against each other.

Limits (a client is not trusted; docs/rpc.md "Threat model"): `--mem` bounds every buffer, every stored graph
and the temporaries a node implies, checked before they are made; at most `--max-clients` connections at once; a
connection that has not said HELLO within HELLO_TIMEOUT_S, or is idle past `--idle-timeout`, is closed; a graph
whose estimated work is over `--max-graph-work` element-operations is refused whole, and one that computes
past `--max-graph-seconds` has its remaining nodes refused. The computing thread runs the graphs of all
connections in turn, a time slice each, so that no client's graph holds the others back.

The protocol has no error reply, and the client offloads every op. A node refimpl cannot compute is logged
(op, sub-op, params, shapes in both orders) and filled with NaN, or with `strict=True` the connection is
closed. A message that names memory outside its buffers, an unknown buffer or tensor, a size that does not
match, or a count that cannot fit closes that connection only, before anything is read or written.
"""
from __future__ import annotations

import collections
import dataclasses
import ipaddress
import json
import logging
import math
import os
import socket
import struct
import threading
import time
from pathlib import Path

import numpy as np

from .. import ops
from ..backends import forward_scope
from ..dispatch import NUMERICS
from ..qtensor import QTensor, quantize
from ..types import NUMPY_DTYPES, GGMLType, type_traits
from . import ggml_ops
from .protocol import (CONN_CAPS_SIZE, PROTO_VERSION, REQUEST_SIZE, RPC_TENSOR, SET_TENSOR_HEADER, TENSOR_SIZE, U8,
                       U32, U64, Cmd, unpack_tensors)

log = logging.getLogger("refimpl.rpc")

ALIGNMENT = 32                # ggml-cpu's TENSOR_ALIGNMENT: what the client pads tensor offsets to
MAX_GRAPH_NODES = 1 << 20     # more than any graph llama.cpp builds (its default cap is 8192 + 64 per layer)
MAX_GRAPH_TENSORS = 1 << 21
DEBUG = bool(os.environ.get("REFIMPL_RPC_DEBUG"))   # log every command with its size and time (level DEBUG)
BODY_TIMEOUT_S = 60.0         # a message begun must arrive within this
HELLO_TIMEOUT_S = 10.0        # a connection must say HELLO within this
IDLE_TIMEOUT_S = 3600.0       # default --idle-timeout: llama.cpp keeps its connection open while a user reads
MAX_CLIENTS = 16              # default --max-clients
MAX_GRAPH_WORK = 1 << 50      # default --max-graph-work, element-operations (a 70B prefill is ~2^46)
MAX_GRAPH_SECONDS = 3600.0    # default --max-graph-seconds
FINISHED_KEPT = 256           # closed connections kept for their counts (Server.finished)
NODE_WORK = 1 << 12           # a node's fixed cost in element-operations (Python per node), so that a graph of
                              # a million cheap nodes counts as the minutes it takes
NODE_COST = 3 << 10           # bytes a stored graph keeps per tensor (Node, its views), charged to --mem
SLICE_S = 0.05                # the computing thread's time slice per graph

# Wire types of ggml 0.25.3: refimpl's table; removed type ids have block size 0 in ggml and are refused as
# ggml's own server refuses them.
WIRE_TYPES: dict[int, tuple[str, int, int]] = {int(t): (tr.name, tr.blck_size, tr.type_size)
                                                for t, tr in type_traits.items()}
TYPE_COUNT = 43
FLOAT_NAN = {"f32", "f16", "f64", "bf16"}
_NUMPY_IDS = {int(t) for t in NUMPY_DTYPES}


class ProtocolError(Exception):
    """A malformed or out-of-bounds message: the connection is closed."""


class Refused(Exception):
    """--strict: a node refimpl does not compute closes the connection."""


def default_mem_limit() -> int:
    """Three quarters of the memory available now (os.sysconf), at least 1 GiB."""
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        avail = 8 << 30
    return max(1 << 30, int(avail * 0.75))


@dataclasses.dataclass(eq=False)
class Buffer:
    id: int
    base: int
    size: int
    mem: np.ndarray          # uint8, size bytes


class Node:
    """One deserialized rpc_tensor: ggml's fields plus its NumPy shape."""
    __slots__ = ("id", "type", "tname", "blck", "tsize", "buffer", "ne", "nb", "op", "params", "flags", "src",
                 "view_src", "view_offs", "data", "name", "shape", "nbytes", "rview", "wview", "srcs", "sname",
                 "handler", "skip", "inplace")

    @property
    def op_name(self) -> str:
        return ggml_ops.OP_NAMES[self.op] if self.op < len(ggml_ops.OP_NAMES) else f"op#{self.op}"

    def describe(self) -> str:
        return (f"{self.name or '?'} ({self.tname}, ne {self.ne} = numpy {self.shape}, nb {self.nb})")


_CONTROL = {c: f"\\x{c:02x}" for c in list(range(0x20)) + [0x7f]} | {0x5c: "\\\\"}


def escaped(text: str) -> str:
    """Client-supplied text as it may go into a log: control characters (newlines, terminal escapes) and
    backslashes written as escapes, so that no client can forge or colour a log line."""
    return str(text).translate(_CONTROL)


class _EscapeFilter(logging.Filter):
    """Escapes every message of the server's logger (tensor names and anything else a client sent)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = escaped(record.getMessage()), None
        return True


log.addFilter(_EscapeFilter())


_TENSOR_HEAD = struct.Struct("<QIQ4I4I")                  # rpc_tensor's id, type, buffer, ne, nb
_DATA_AT = RPC_TENSOR.fields["data"][1]


def _span(b: "Buffer", start: int, size: int) -> np.ndarray | None:
    """b's bytes [start, start + size), or None where that leaves the buffer (ggml-rpc's region check)."""
    return b.mem[start:start + size] if 0 <= start < b.size and size <= b.size - start else None


def nbytes(ne, nb, blck: int, tsize: int) -> int:
    """ggml_nbytes: the bytes from a tensor's first element to the end of its last one."""
    if any(n <= 0 for n in ne):
        return 0
    if blck == 1:
        return tsize + sum((ne[i] - 1) * nb[i] for i in range(4))
    return ne[0] * nb[0] // blck + sum((ne[i] - 1) * nb[i] for i in range(1, 4))


def _elements(n: Node) -> int:
    e = 1
    for x in n.ne:
        e *= max(int(x), 0)
    return e


def _extent(n: Node) -> int:
    """n's elements with every empty dimension counted as 1: what a loop over its dimensions may cost even when
    it holds no element (a source of ne [16, 0, 1, 2^25] is empty, but an op that walks its batches walks 2^25)."""
    e = 1
    for x in n.ne:
        e *= max(int(x), 1)
    return e


def _aliasing(n: Node) -> bool:
    """Whether n's elements cannot all have bytes of their own: more elements than its byte extent holds."""
    return _elements(n) // n.blck * n.tsize > n.nbytes


def _work(n: Node, tensors: dict[int, Node]) -> int:
    """A node's estimated work in element-operations: its output and sources, times the reduced dimension for
    the products, plus a fixed cost per node."""
    out = _elements(n)
    srcs = [tensors[s] for s in n.src if s]
    w = out + sum(_extent(t) for t in srcs)
    reduced = {"MUL_MAT": (0, 0), "MUL_MAT_ID": (0, 0), "OUT_PROD": (0, 1), "FLASH_ATTN_EXT": (1, 1)}
    if n.op_name in reduced and len(srcs) > reduced[n.op_name][0]:
        src, dim = reduced[n.op_name]
        w += out * max(int(srcs[src].ne[dim]), 1)          # K of a product, the keys of attention
    elif n.op_name.startswith("CONV") and len(srcs) > 1:
        w += out * _extent(srcs[0])               # an upper bound: every output reads the whole kernel
    elif n.op_name in ("POOL_1D", "POOL_2D", "POOL_2D_BACK") and srcs:
        # the kernel is op_params, not a source: refimpl's pools walk its taps in Python, each over the output
        taps = max(n.params.i(1), 1) * (max(n.params.i(2), 1) if n.op_name != "POOL_1D" else 1)
        w += taps * (max(out, _extent(srcs[0])) + NODE_WORK)
    return w + NODE_WORK


class _Memory:
    """Address space and byte budget shared by every connection of a server."""

    def __init__(self, limit: int):
        self.limit, self.used = int(limit), 0
        self.lock = threading.Lock()
        self.next_base = 0x10000000
        self.next_id = 1

    def alloc(self, size: int) -> Buffer | None:
        with self.lock:
            if size > self.limit - self.used:
                return None
            try:
                mem = np.zeros(size, np.uint8)
            except MemoryError:
                return None
            self.used += size
            base = self.next_base
            self.next_base += (size + 2 * 4096 - 1) // 4096 * 4096       # a guard page between buffers
            bid, self.next_id = self.next_id * 0x9E3779B1 % (1 << 63) | 1, self.next_id + 1
            return Buffer(bid, base, size, mem)

    def free(self, buf: Buffer) -> None:
        self.release(buf.size)

    def reserve(self, size: int) -> bool:
        """Count `size` bytes the server keeps outside buffers (a stored graph) against the limit."""
        with self.lock:
            if size > self.limit - self.used:
                return False
            self.used += size
            return True

    def release(self, size: int) -> None:
        with self.lock:
            self.used -= size

    def free_now(self) -> int:
        with self.lock:
            return self.limit - self.used


class _Job:
    __slots__ = ("gen", "done", "error", "spent")

    def __init__(self, gen):
        self.gen, self.done, self.error, self.spent = gen, threading.Event(), None, 0.0


class _Scheduler:
    """The one thread that computes every graph (module docstring): the graphs of all connections in turn, a
    time slice (SLICE_S) each, inside the server's backend and numerics."""

    def __init__(self, server: "Server"):
        self.server = server
        self.cond = threading.Condition()
        self.jobs: collections.deque[_Job] = collections.deque()
        self.stopped = False
        self.thread = threading.Thread(target=self._loop, name="refimpl-rpc-compute", daemon=True)
        self.thread.start()

    def run(self, gen) -> None:
        """Run the generator `gen` (one graph, a step per node) to its end on the computing thread; block."""
        job = _Job(gen)
        with self.cond:
            self.jobs.append(job)
            self.cond.notify()
        job.done.wait()
        if job.error is not None:
            raise job.error

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify()

    def _loop(self) -> None:
        srv = self.server
        while True:
            with self.cond:
                while not self.jobs and not self.stopped:
                    self.cond.wait()
                if self.stopped:
                    for job in self.jobs:
                        job.error = EOFError("server stopping")
                        job.done.set()
                    return
                job = self.jobs.popleft()
            t0 = time.monotonic()
            finished = False
            # forward_scope: what the backend does around a model's pass (numba: its thread count read once,
            # not once per kernel call); a graph's batch size is not known here
            with ops.backend(srv.backend), ops.numerics(srv.numerics), np.errstate(all="ignore"), \
                    forward_scope(1, "decoder"):
                try:
                    while time.monotonic() - t0 < SLICE_S:
                        next(job.gen)
                except StopIteration:
                    finished = True
                except BaseException as e:          # noqa: BLE001 -- handed to the connection's thread
                    job.error, finished = e, True
            job.spent += time.monotonic() - t0
            if finished:
                job.done.set()
                continue
            if job.spent > srv.max_graph_seconds:
                try:
                    job.gen.throw(_GraphTimeout(job.spent))
                except StopIteration:
                    pass
                except BaseException as e:          # noqa: BLE001
                    job.error = e
                job.done.set()
                continue
            with self.cond:
                self.jobs.append(job)


class _GraphTimeout(Exception):
    """Thrown into a graph that computed past --max-graph-seconds."""


class Connection:
    """One client: its buffers, its last graph, its counts. Runs in its own thread."""

    def __init__(self, server: "Server", sock: socket.socket, peer):
        self.server, self.sock, self.peer = server, sock, peer
        # buffered: a SET_TENSOR of a few bytes comes in one read with the commands around it, not four
        # recv calls of its own (each command head, size and header read from the buffer)
        self.rfile = sock.makefile("rb", buffering=1 << 16)
        self.buffers: dict[int, Buffer] = {}
        self.graph = None                      # (nodes, tensors) of the last GRAPH_COMPUTE, for RECOMPUTE
        self.graph_bytes = 0                   # what the stored graph is charged against --mem
        self.computed: collections.Counter = collections.Counter()
        self.refused: collections.Counter = collections.Counter()
        self.logged: collections.Counter = collections.Counter()
        self.seconds: collections.Counter = collections.Counter()      # per op, with REFIMPL_RPC_DEBUG
        self.dump_seq = 0

    # -- socket --------------------------------------------------------------------------------------------
    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray(n)
        self._recv_into(memoryview(buf))
        return bytes(buf)

    def _recv_into(self, mv: memoryview) -> None:
        got = 0
        while got < len(mv):
            k = self.rfile.readinto(mv[got:got + min(len(mv) - got, 1 << 24)])
            if k == 0:
                raise EOFError("peer closed the connection")
            got += k

    def _send(self, payload: bytes | memoryview) -> None:
        self.sock.sendall(U64.pack(len(payload)))
        if len(payload):
            self.sock.sendall(payload)

    # -- tensors ---------------------------------------------------------------------------------------------
    def _node(self, row) -> Node:
        t = int(row["type"])
        if t >= TYPE_COUNT or t not in WIRE_TYPES:
            raise ProtocolError(f"invalid tensor type {t}")
        n = Node()
        n.id, n.type = int(row["id"]), t
        n.tname, n.blck, n.tsize = WIRE_TYPES[t]
        n.ne = [int(x) for x in row["ne"]]
        n.nb = [int(x) for x in row["nb"]]
        n.op, n.flags = int(row["op"]), int(row["flags"])
        n.params = ggml_ops.Params(row["op_params"])
        n.src = [int(x) for x in row["src"]]
        n.view_src, n.view_offs, n.data = int(row["view_src"]), int(row["view_offs"]), int(row["data"])
        n.name = bytes(row["name"]).split(b"\0", 1)[0].decode("utf-8", "replace")
        n.shape = tuple(n.ne[::-1])
        if n.ne[0] % n.blck:
            raise ProtocolError(f"tensor {n.name!r}: ne0 {n.ne[0]} is not a multiple of {n.tname}'s block "
                                f"size {n.blck}")
        n.nbytes = nbytes(n.ne, n.nb, n.blck, n.tsize)
        if n.nbytes >= 1 << 63:
            raise ProtocolError(f"tensor {n.describe()} spans {n.nbytes} bytes, more than any buffer can hold")
        n.rview = n.wview = n.srcs = None      # views of the buffer, made once per graph (GRAPH_RECOMPUTE reuses)
        opn = n.op_name
        n.sname = ggml_ops.sub_op(opn, n.params)
        n.handler = ggml_ops.OPS.get(opn)
        n.skip = opn in ggml_ops.NO_COMPUTE or n.nbytes == 0
        n.inplace = False                   # the node is its src2's bytes (set in _graph_compute)
        b = self.buffers.get(int(row["buffer"]))
        n.buffer = b
        if b is not None:
            if n.data < b.base or n.data + n.nbytes > b.base + b.size:
                raise ProtocolError(f"tensor {n.describe()}: data 0x{n.data:x} + {n.nbytes} bytes is outside its "
                                    f"buffer [0x{b.base:x}, 0x{b.base + b.size:x})")
        return n

    def _region(self, n: Node, offset: int, size: int) -> np.ndarray:
        """The bytes [data + offset, data + offset + size) of n's buffer, checked as ggml-rpc checks them."""
        b = n.buffer
        if b is None:
            raise ProtocolError(f"tensor {n.describe()} names no buffer of this connection")
        region = _span(b, n.data + offset - b.base, size)
        if region is None:
            raise ProtocolError(f"region offset {offset} size {size} of tensor {n.describe()} is outside its "
                                f"buffer ({b.size} bytes)")
        return region

    def _view(self, n: Node, write: bool = False):
        """n's elements as a NumPy view of its buffer (QTensor for block types and BF16; a permuted BF16
        source comes as a packed copy, so `write` views must be packed). Views are kept on the node: they
        stay views of the same bytes for as long as the graph is stored."""
        v = n.wview if write else n.rview
        if v is None:
            v, is_view = self._make_view(n, write)
            if is_view:
                if write:
                    n.wview = v
                else:
                    n.rview = v
        return v

    def _make_view(self, n: Node, write: bool):
        b = n.buffer
        if b is None:
            raise ggml_ops.Unsupported(f"tensor {n.describe()} has no buffer on this server")
        off = n.data - b.base
        t = GGMLType(n.type) if n.type in GGMLType._value2member_map_ else None
        if t is not None and t in NUMPY_DTYPES:
            dt = NUMPY_DTYPES[t]
            if n.nbytes == 0:
                return np.zeros(n.shape, dt), False
            return np.ndarray(n.shape, dt, buffer=b.mem, offset=off, strides=tuple(n.nb[::-1])), True
        if t is None:
            raise ggml_ops.Unsupported(f"type {n.tname} has no refimpl tensor")
        if n.nb[0] != n.tsize and n.blck == 1 and not write:
            # an element type refimpl holds as QTensor (bf16) in a permuted view: its values, packed
            el = np.ndarray(n.shape, np.dtype(f"<u{n.tsize}"), buffer=b.mem, offset=off, strides=tuple(n.nb[::-1]))
            packed = np.ascontiguousarray(el).view(np.uint8).reshape(n.shape[:-1] + (n.shape[-1] * n.tsize,))
            return QTensor(t, packed, n.shape), False
        if n.nb[0] != n.tsize:
            raise ggml_ops.Unsupported(f"{n.tname} tensor with nb0 {n.nb[0]} (blocks not packed in a row)")
        rb = n.ne[0] // n.blck * n.tsize
        shape = n.shape[:-1] + (rb,)
        if n.nbytes == 0:
            return QTensor(t, np.zeros(shape, np.uint8), n.shape), False
        data = np.ndarray(shape, np.uint8, buffer=b.mem, offset=off, strides=tuple(n.nb[:0:-1]) + (1,))
        return QTensor(t, data, n.shape), True

    def _store(self, n: Node, value) -> None:
        if n.blck == 1 and n.nb[0] != n.tsize and n.type not in _NUMPY_IDS:
            # a permuted bf16 destination: convert to packed bytes, then write element by element
            b = n.buffer
            el = np.ndarray(n.shape, np.dtype(f"<u{n.tsize}"), buffer=b.mem, offset=n.data - b.base,
                            strides=tuple(n.nb[::-1]))
            v = value if isinstance(value, QTensor) and value.type == n.type else quantize(
                np.asarray(value, np.float32).reshape(n.shape), GGMLType(n.type), method="cpu")
            el[...] = np.ascontiguousarray(v.data).view(el.dtype).reshape(n.shape)
            return
        dst = self._view(n, write=True)
        if isinstance(dst, QTensor):
            if not (isinstance(value, QTensor) and value.type == dst.type):
                v = np.asarray(value, np.float32)
                if v.size != int(np.prod(n.shape)):
                    raise ggml_ops.Unsupported(f"result has {v.size} elements, the node {int(np.prod(n.shape))}")
                value = quantize(v.reshape(n.shape), dst.type, method="cpu")
            src = value.data
            if src.size != dst.data.size:
                raise ggml_ops.Unsupported(f"result has {src.size} bytes, the node {dst.data.size}")
            dst.data[...] = src.reshape(dst.data.shape)
            return
        v = value.dequantize() if isinstance(value, QTensor) else np.asarray(value)
        if v.size != dst.size:
            raise ggml_ops.Unsupported(f"result has {v.size} elements (numpy {v.shape}), the node {dst.size}")
        dst[...] = v.reshape(dst.shape)         # under _run_graph's np.errstate(all="ignore")

    def _fill_nan(self, n: Node) -> None:
        """n's own elements (never the gaps of a strided view) set to NaN: f32/f16/f64 NaN, bf16 0x7FC0, block
        types 0xFF bytes (their f16 scales read NaN), ints -1."""
        if n.buffer is None or n.nbytes == 0:
            return
        if _aliasing(n):
            return                  # elements that share bytes: writing them one by one could take forever
        if n.tname in FLOAT_NAN and n.tname != "bf16":
            self._view(n, write=True)[...] = np.nan
            return
        if n.blck == 1:                   # bf16 and the int types, element by element through their strides
            el = np.ndarray(n.shape, np.dtype(f"<u{n.tsize}"), buffer=n.buffer.mem, offset=n.data - n.buffer.base,
                            strides=tuple(n.nb[::-1]))
            el[...] = 0x7FC0 if n.tname == "bf16" else np.iinfo(el.dtype).max
            return
        rows = np.ndarray(n.shape[:-1] + (n.ne[0] // n.blck * n.tsize,), np.uint8, buffer=n.buffer.mem,
                          offset=n.data - n.buffer.base, strides=tuple(n.nb[:0:-1]) + (1,))
        rows[...] = 0xFF

    # -- graphs ----------------------------------------------------------------------------------------------
    def _compute(self, nodes: list[Node], tensors: dict[int, Node]) -> None:
        """Compute a graph on the server's computing thread (module docstring) and wait for it."""
        self.server.scheduler().run(self._run_graph(nodes, tensors))

    def _run_graph(self, nodes: list[Node], tensors: dict[int, Node]):
        """The graph, one node per step (the scheduler interleaves the steps of several connections)."""
        srv = self.server
        for k, n in enumerate(nodes):
            if k:
                try:
                    yield
                except _GraphTimeout as e:
                    rest = {id(m): m for m in nodes[k:] if m is not None and not m.skip}
                    log.warning("connection %s: graph stopped after %.0f s of computing (--max-graph-seconds %g): "
                                "its %d remaining nodes are refused", self.peer, e.args[0],
                                srv.max_graph_seconds, len(rest))
                    for m in rest.values():
                        self.refused[m.sname] += 1
                        self._fill_nan(m)
                    return
            if n is None or n.skip:
                continue
            name = n.sname
            t0 = time.perf_counter() if DEBUG else 0.0
            try:
                handler = n.handler
                if handler is None:
                    raise ggml_ops.Unsupported(ggml_ops.NOT_COMPUTED.get(n.op_name, "unknown op"))
                self._check_temporaries(n, tensors)
                srcs = n.srcs
                if srcs is None:
                    srcs = [None if s == 0 else ggml_ops.squeeze(self._view(tensors[s])) for s in n.src]
                    if all(s == 0 or tensors[s].rview is not None for s in n.src):
                        n.srcs = srcs
                value = handler(n, srcs, n.params)
                if value is not ggml_ops.STORED:
                    self._store(n, value)
            except Refused:
                raise
            except Exception as e:                      # noqa: BLE001 -- any failure refuses this node only
                self._refuse(n, name, e, tensors)
                continue
            self.computed[name] += 1
            if DEBUG:
                self.seconds[name] += time.perf_counter() - t0
            if srv.dump:
                self._dump(n, name, tensors)

    def _check_temporaries(self, n: Node, tensors: dict[int, Node]) -> None:
        """Refuse a node whose elements alias (strides that make its elements share bytes: ggml never computes
        into such a tensor), or whose output and sources, as the float64 arrays refimpl may make of them,
        need more memory than --mem has free."""
        if _aliasing(n):
            raise ggml_ops.Unsupported(f"its {_elements(n)} elements share {n.nbytes} bytes (aliasing strides)")
        want = ggml_ops.implied_ne(n.op_name, n.ne, [tensors[s].ne for s in n.src if s], n.params)
        if want != n.ne:
            raise ggml_ops.Unsupported(f"its op_params and sources imply ne {want}, the node has ne {n.ne}")
        need = 8 * (_elements(n) + sum(_extent(tensors[s]) for s in n.src if s))
        if n.op_name == "FLASH_ATTN_EXT" and n.src[0] and n.src[1]:
            q, k = tensors[n.src[0]], tensors[n.src[1]]
            need += 32 * _extent(q) // max(q.ne[0], 1) * max(k.ne[1], 1)    # the scores and their softmax, f64
        free = self.server.memory.free_now()
        if need > free:
            raise ggml_ops.Unsupported(f"it needs up to {need} bytes of temporaries; --mem has {free} free")

    def _refuse(self, n: Node, name: str, e: Exception, tensors: dict[int, Node]) -> None:
        self.refused[name] += 1
        srcs = "; ".join(f"src{i} {tensors[s].describe()}" for i, s in enumerate(n.src) if s and s in tensors)
        msg = (f"not computed: {name} {n.describe()} op_params {n.params.w.tolist()} <- {srcs}: "
               f"{type(e).__name__}: {e}")
        if self.logged[name] < self.server.log_per_op:
            log.warning("%s", msg)
        self.logged[name] += 1
        if self.server.strict:
            raise Refused(msg)
        try:
            self._fill_nan(n)
        except Exception:                                   # noqa: BLE001 -- nothing writable: leave the bytes
            pass

    def _dump(self, n: Node, name: str, tensors) -> None:
        d = Path(self.server.dump)
        self.dump_seq += 1
        try:
            v = self._view(n)
            arr = v.dequantize() if isinstance(v, QTensor) else np.array(v)
        except ggml_ops.Unsupported:
            return
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in (n.name or name))
        fname = f"{self.dump_seq:06d}-{safe}.npy"
        np.save(d / fname, arr)
        with open(d / "index.jsonl", "a") as f:
            srcs = [tensors[s].name if s in tensors else None for s in n.src if s]   # the graph's edges
            f.write(json.dumps({"seq": self.dump_seq, "name": n.name, "op": name, "type": n.tname, "ne": n.ne,
                                "shape": list(n.shape), "srcs": srcs, "file": fname}) + "\n")

    def _graph_compute(self, size: int) -> None:
        if size < 8:
            raise ProtocolError(f"GRAPH_COMPUTE of {size} bytes")
        device, n_nodes = U32.unpack(self._recv_exact(4))[0], U32.unpack(self._recv_exact(4))[0]
        if device != 0:
            raise ProtocolError(f"GRAPH_COMPUTE for device {device}; this server has one device")
        if n_nodes > MAX_GRAPH_NODES or size < 8 + 8 * n_nodes + 4:
            raise ProtocolError(f"GRAPH_COMPUTE of {size} bytes cannot hold {n_nodes} nodes")
        ids = np.frombuffer(self._recv_exact(8 * n_nodes), "<u8")
        n_tensors = U32.unpack(self._recv_exact(4))[0]
        need = 8 + 8 * n_nodes + 4 + TENSOR_SIZE * n_tensors
        if n_tensors > MAX_GRAPH_TENSORS or size < need or size - need > (1 << 20):
            raise ProtocolError(f"GRAPH_COMPUTE of {size} bytes for {n_nodes} nodes and {n_tensors} tensors "
                                f"(needs {need})")
        raw = self._recv_exact(TENSOR_SIZE * n_tensors)
        if size > need:
            self._recv_exact(size - need)
        rows = unpack_tensors(raw, n_tensors)
        tensors: dict[int, Node] = {}
        for r in rows:
            nd = self._node(r)
            if nd.buffer is None and nd.data != 0:
                raise ProtocolError(f"tensor {nd.describe()}: data pointer without a buffer of this connection")
            tensors[nd.id] = nd
        for nd in tensors.values():                     # ggml's create_node: every reference must resolve
            for s in nd.src + [nd.view_src]:
                if s and s not in tensors:
                    raise ProtocolError(f"tensor {nd.describe()} names source id 0x{s:x} that the graph lacks")
            d = tensors.get(nd.src[2]) if nd.src[2] else None
            nd.inplace = bool(d is not None and d.buffer is nd.buffer and d.data == nd.data and d.type == nd.type
                              and d.ne == nd.ne and d.nb == nd.nb)
        nodes = []
        for i in ids.tolist():
            if i == 0:
                nodes.append(None)
                continue
            if i not in tensors:
                raise ProtocolError(f"graph node id 0x{i:x} is not among the graph's tensors")
            nodes.append(tensors[i])
        work = sum(_work(nd, tensors) for nd in nodes if nd is not None and not nd.skip)
        if work > self.server.max_graph_work:
            distinct = {id(nd): nd for nd in nodes if nd is not None and not nd.skip}
            log.warning("connection %s: graph of %d nodes refused: about %.3g element-operations of work, over "
                        "--max-graph-work %.3g", self.peer, len(nodes), work, self.server.max_graph_work)
            for nd in distinct.values():
                self.refused[nd.sname] += 1
                self._fill_nan(nd)
            self._store_graph(None, 0)
            return
        cost = NODE_COST * len(tensors)
        if not self.server.memory.reserve(cost):
            raise ProtocolError(f"a graph of {len(tensors)} tensors needs {cost} bytes of server memory, more "
                                f"than --mem has free")
        self._store_graph((nodes, tensors), cost)
        self._compute(nodes, tensors)

    def _store_graph(self, graph, cost: int) -> None:
        """Keep `graph` for GRAPH_RECOMPUTE (its `cost` already reserved), releasing the one before."""
        self.server.memory.release(self.graph_bytes)
        self.graph, self.graph_bytes = graph, cost

    # -- the command loop ----------------------------------------------------------------------------------
    def serve(self) -> None:
        srv = self.server
        try:
            self.sock.settimeout(srv.hello_timeout)
            try:
                cmd = self._recv_exact(1)[0]
            except socket.timeout:
                raise EOFError(f"no HELLO within {srv.hello_timeout:g} s") from None
            if cmd != Cmd.HELLO:
                raise ProtocolError(f"expected HELLO, got command {cmd}")
            self.sock.settimeout(BODY_TIMEOUT_S)
            size = U64.unpack(self._recv_exact(8))[0]
            if size != CONN_CAPS_SIZE:
                raise ProtocolError(f"HELLO of {size} bytes (protocol 7 sends {CONN_CAPS_SIZE}); client too old?")
            self._recv_exact(size)
            self._send(bytes(PROTO_VERSION) + b"\0" + bytes(CONN_CAPS_SIZE))
            while not srv._stopping.is_set():
                self.sock.settimeout(srv.idle_timeout or None)
                try:
                    head = self.rfile.read(1)
                except socket.timeout:
                    raise EOFError(f"idle for {srv.idle_timeout:g} s (--idle-timeout)") from None
                except OSError:
                    break
                if not head:
                    break
                self.sock.settimeout(BODY_TIMEOUT_S)
                self._command(head[0])
        except (EOFError, ConnectionError, socket.timeout) as e:
            log.info("connection %s ended: %s", self.peer, e)
        except ProtocolError as e:
            log.error("connection %s: bad message, closing: %s", self.peer, e)
        except Refused as e:
            log.error("connection %s: --strict, closing: %s", self.peer, e)
        except Exception as e:                                      # noqa: BLE001 -- never take the server down
            srv.internal_errors += 1
            log.exception("connection %s: internal error, closing: %s", self.peer, e)
        finally:
            self._close()

    def _command(self, cmd: int) -> None:
        if cmd >= Cmd.COUNT or cmd in (Cmd.NONE, Cmd.HELLO):
            raise ProtocolError(f"unknown or out-of-place command {cmd}")
        cmd = Cmd(cmd)
        size = U64.unpack(self._recv_exact(8))[0]
        if DEBUG:
            t0 = time.perf_counter()
            try:
                return self._dispatch(cmd, size)
            finally:
                log.debug("connection %s: %s of %d bytes in %.1f ms", self.peer, cmd.name, size,
                          1e3 * (time.perf_counter() - t0))
        return self._dispatch(cmd, size)

    def _dispatch(self, cmd: Cmd, size: int) -> None:
        if cmd == Cmd.SET_TENSOR:
            return self._set_tensor(size)
        if cmd == Cmd.GRAPH_COMPUTE:
            return self._graph_compute(size)
        want = REQUEST_SIZE[cmd]
        if size != want:
            raise ProtocolError(f"{cmd.name} of {size} bytes, expected {want}")
        req = self._recv_exact(size)
        getattr(self, "_" + cmd.name.lower())(req)

    def _device(self, req: bytes) -> None:
        d = U32.unpack_from(req)[0]
        if d != 0:
            raise ProtocolError(f"device {d}; this server has one device")

    def _device_count(self, req):
        self._send(U32.pack(1))

    def _alloc_buffer(self, req):
        self._device(req)
        size = U64.unpack_from(req, 4)[0]
        buf = self.server.memory.alloc(size)
        if buf is None:
            log.warning("connection %s: ALLOC_BUFFER of %d bytes refused (--mem %d, %d in use)", self.peer, size,
                        self.server.memory.limit, self.server.memory.used)
            self._send(U64.pack(0) + U64.pack(0))
            return
        self.buffers[buf.id] = buf
        self._send(U64.pack(buf.id) + U64.pack(buf.size))

    def _get_alignment(self, req):
        self._device(req)
        self._send(U64.pack(ALIGNMENT))

    def _get_max_size(self, req):
        self._device(req)
        self._send(U64.pack(self.server.memory.limit))

    def _buffer(self, bid: int) -> Buffer:
        b = self.buffers.get(bid)
        if b is None:
            raise ProtocolError(f"buffer 0x{bid:x} is not one of this connection's")
        return b

    def _buffer_get_base(self, req):
        self._send(U64.pack(self._buffer(U64.unpack(req)[0]).base))

    def _free_buffer(self, req):
        b = self._buffer(U64.unpack(req)[0])
        del self.buffers[b.id]
        self.server.memory.free(b)
        self._store_graph(None, 0)

    def _buffer_clear(self, req):
        self._buffer(U64.unpack_from(req)[0]).mem[...] = req[8]

    def _tensor(self, req: bytes, offset: int = 0) -> Node:
        return self._node(unpack_tensors(req, 1, offset)[0])

    def _memset_tensor(self, req):
        n = self._tensor(req)
        offset, size = U64.unpack_from(req, TENSOR_SIZE)[0], U64.unpack_from(req, TENSOR_SIZE + 8)[0]
        if offset > n.nbytes or size > n.nbytes - offset:
            raise ProtocolError(f"MEMSET_TENSOR offset {offset} size {size} outside tensor {n.describe()} "
                                f"({n.nbytes} bytes)")
        self._region(n, offset, size)[...] = req[TENSOR_SIZE + 16]

    def _tensor_region(self, raw: bytes, offset: int, size: int) -> np.ndarray:
        """_region(_tensor(raw), offset, size) with _node's checks on the fields it reads, without building a
        Node (20 us each; test-backend-ops sends ARGSORT's inputs a row at a time: 137,000 SET_TENSORs).
        Anything the checks do not pass goes the long way, which raises the error that names it."""
        _, t, bid, ne0, ne1, ne2, ne3, nb0, nb1, nb2, nb3 = _TENSOR_HEAD.unpack_from(raw)
        data = U64.unpack_from(raw, _DATA_AT)[0]
        w, b = WIRE_TYPES.get(t), self.buffers.get(bid)
        if w is not None and t < TYPE_COUNT and b is not None and ne0 % w[1] == 0:
            size_t = nbytes((ne0, ne1, ne2, ne3), (nb0, nb1, nb2, nb3), w[1], w[2])
            if data >= b.base and data + size_t <= b.base + b.size:       # _node's check of the tensor
                region = _span(b, data + offset - b.base, size)
                if region is not None:
                    return region
        return self._region(self._tensor(raw), offset, size)

    def _set_tensor(self, size: int) -> None:
        if size < SET_TENSOR_HEADER:
            raise ProtocolError(f"SET_TENSOR of {size} bytes (header {SET_TENSOR_HEADER})")
        head = self._recv_exact(SET_TENSOR_HEADER)
        offset = U64.unpack_from(head, TENSOR_SIZE + 1)[0]
        region = self._tensor_region(head, offset, size - SET_TENSOR_HEADER)     # checked before a byte is read
        self._recv_into(memoryview(region))

    def _set_tensor_hash(self, req):
        self._tensor(req)
        self._send(U8.pack(0))                       # no blob cache: the client sends the bytes

    def _init_tensor(self, req):
        self._tensor(req)

    def _get_tensor(self, req):
        offset, size = U64.unpack_from(req, TENSOR_SIZE)[0], U64.unpack_from(req, TENSOR_SIZE + 8)[0]
        self._send(memoryview(self._tensor_region(req, offset, size)))

    def _copy_tensor(self, req):
        src, dst = self._tensor(req), self._tensor(req, TENSOR_SIZE)
        if src.buffer is None or dst.buffer is None:
            raise ProtocolError("COPY_TENSOR between tensors without buffers of this connection")
        data = self._region(src, 0, src.nbytes).copy()
        self._region(dst, 0, src.nbytes)[...] = data
        self._send(U8.pack(1))

    def _graph_recompute(self, req):
        self._device(req)
        if self.graph is None:
            raise ProtocolError("GRAPH_RECOMPUTE without a stored graph")
        self._compute(*self.graph)

    def _get_device_memory(self, req):
        self._device(req)
        m = self.server.memory
        self._send(U64.pack(max(0, m.limit - m.used)) + U64.pack(m.limit))

    def _get_alloc_size(self, req):
        self._device(req)
        n = self._tensor(req, 4)
        self._send(U64.pack(n.nbytes))

    def _close(self) -> None:
        for b in self.buffers.values():
            self.server.memory.free(b)
        self.buffers.clear()
        self._store_graph(None, 0)
        try:
            self.rfile.close()
            self.sock.close()
        except OSError:
            pass
        total_c, total_r = sum(self.computed.values()), sum(self.refused.values())
        per_op = ", ".join(f"{k} {v}" for k, v in sorted(self.computed.items()))
        refused = ", ".join(f"{k} {v}" for k, v in sorted(self.refused.items()))
        log.log(logging.WARNING if total_r else logging.INFO,
                "connection %s closed: %d nodes computed (%s); %d refused (%s)", self.peer, total_c,
                per_op or "-", total_r, refused or "-")
        if self.seconds:
            log.debug("connection %s: seconds per op: %s", self.peer,
                      ", ".join(f"{k} {v:.3f}" for k, v in self.seconds.most_common()))
        self.server._connection_done(self)


class Server:
    """The RPC server. `start()` listens and serves in background threads; `serve_forever()` blocks."""

    def __init__(self, host: str = "127.0.0.1", port: int = 50052, *, backend: str = "numpy",
                 numerics: str = "exact", mem: int | None = None, dump: str | os.PathLike | None = None,
                 strict: bool = False, log_per_op: int = 5, max_clients: int = MAX_CLIENTS,
                 idle_timeout: float = IDLE_TIMEOUT_S, max_graph_work: float = MAX_GRAPH_WORK,
                 max_graph_seconds: float = MAX_GRAPH_SECONDS):
        if backend not in ("numpy", "numba"):
            raise ValueError(f"--backend must be numpy or numba, got {backend!r}")
        if numerics not in NUMERICS:
            raise ValueError(f"--numerics must be one of {', '.join(NUMERICS)}, got {numerics!r}")
        self.host, self.port, self.backend, self.numerics = host, int(port), backend, numerics
        self.memory = _Memory(default_mem_limit() if mem is None else int(mem))
        self.dump = None if dump is None else str(dump)
        if self.dump:
            Path(self.dump).mkdir(parents=True, exist_ok=True)
        self.strict, self.log_per_op = strict, log_per_op
        for flag, v in (("--max-clients", max_clients), ("--idle-timeout", idle_timeout),
                        ("--max-graph-work", max_graph_work), ("--max-graph-seconds", max_graph_seconds)):
            if not v >= 0:
                raise ValueError(f"{flag} must be >= 0, got {v!r}")
        self.max_clients, self.idle_timeout = int(max_clients), float(idle_timeout)      # idle 0: never
        self.max_graph_work = float(max_graph_work) or math.inf                          # 0: no limit
        self.max_graph_seconds = float(max_graph_seconds) or math.inf
        self.hello_timeout = HELLO_TIMEOUT_S
        self.internal_errors = 0              # exceptions outside the server's checks (each one a defect)
        self.turned_away = 0                  # connections closed at once: --max-clients reached
        self._stopping = threading.Event()
        self._sock: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self.connections: set[Connection] = set()
        # the last FINISHED_KEPT closed connections, with their counts (for tests and stats), and how many closed in
        # all: keeping every one grew the server by ~1 KiB a connection for as long as it ran
        self.finished: collections.deque = collections.deque(maxlen=FINISHED_KEPT)
        self.n_finished = 0
        self._lock = threading.Lock()
        self._computer: tuple[int, _Scheduler] | None = None

    def scheduler(self) -> _Scheduler:
        """The one thread that computes every graph (made on first use, and again in a forked child, where
        the parent's thread does not exist)."""
        with self._lock:
            if self._computer is None or self._computer[0] != os.getpid():
                self._computer = (os.getpid(), _Scheduler(self))
            return self._computer[1]

    @staticmethod
    def is_loopback(host: str) -> bool:
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    def start(self) -> "Server":
        if not self.is_loopback(self.host):
            log.warning("listening on %s, which is not a loopback address: ggml's RPC protocol has no "
                        "authentication, anyone who reaches this port can read and write its memory", self.host)
        fam = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.host, self.port))
        s.listen(16)
        s.settimeout(0.2)
        self._sock = s
        self.port = s.getsockname()[1]
        t = threading.Thread(target=self._accept_loop, name="refimpl-rpc-accept", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def _accept_loop(self) -> None:
        """Accepts until stop(): a failure to accept (descriptors exhausted) or to start a connection's thread
        is logged and survived, never the end of the loop."""
        failing = 0
        while not self._stopping.is_set():
            try:
                sock, peer = self._sock.accept()
            except socket.timeout:
                continue
            except OSError as e:
                if self._stopping.is_set():
                    break
                failing += 1
                if failing == 1 or failing % 100 == 0:
                    log.error("accept failed (%d time(s) in a row), still listening: %s", failing, e)
                time.sleep(min(0.01 * failing, 1.0))
                continue
            failing = 0
            try:
                self._admit(sock, f"{peer[0]}:{peer[1]}")
            except Exception as e:                  # noqa: BLE001 -- e.g. no thread to be had: this client only
                log.error("could not serve %s:%s, closing it: %s", peer[0], peer[1], e)
                try:
                    sock.close()
                except OSError:
                    pass

    def _admit(self, sock: socket.socket, peer: str) -> None:
        with self._lock:
            full = len(self.connections) >= self.max_clients
        if full:
            self.turned_away += 1
            log.warning("connection %s turned away: %d clients connected (--max-clients)", peer, self.max_clients)
            sock.close()
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Connection(self, sock, peer)
        with self._lock:
            self.connections.add(conn)
        log.info("accepted connection %s", conn.peer)
        t = threading.Thread(target=conn.serve, name=f"refimpl-rpc-{conn.peer}", daemon=True)
        try:
            t.start()
        except BaseException:
            with self._lock:
                self.connections.discard(conn)
            raise

    def _connection_done(self, conn: Connection) -> None:
        with self._lock:
            self.connections.discard(conn)
            self.finished.append(conn)
            self.n_finished += 1

    def finished_since(self, n_before: int) -> list[Connection]:
        """The connections that closed after `n_finished` was `n_before` (those still kept: the last FINISHED_KEPT)."""
        with self._lock:
            n = min(self.n_finished - n_before, len(self.finished))
            return list(self.finished)[len(self.finished) - n:] if n > 0 else []

    def serve_forever(self) -> None:
        if self._sock is None:
            self.start()
        print(f"listening on {self.host}:{self.port}", flush=True)
        try:
            while not self._stopping.wait(0.5):
                pass
        finally:
            self.stop()

    def stop(self) -> None:
        self._stopping.set()
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        with self._lock:
            conns = list(self.connections)
        for c in conns:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + 5
        while self.connections and time.monotonic() < deadline:
            time.sleep(0.01)
        with self._lock:
            computer, self._computer = self._computer, None
        if computer is not None and computer[0] == os.getpid():
            computer[1].stop()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
