"""Truncated, oversized and mutated messages of every command: the server never crashes or hangs, and a
client that keeps talking to it all along (its own buffer, its own bytes) sees nothing change.

Outcomes per case: "answered" (a reply came), "silent" (a command without a reply), "closed" (the
server closed the connection: a bad message). Defects, asserted zero: "internal error" (an exception
outside the server's checks, logged as such), "hang" (the connection is not released within 5 s of the
client closing it, or the server stops answering others), "bystander hurt" (the other client's bytes
changed or its connection broke)."""
import collections
import socket
import time

import numpy as np
import pytest

from refimpl.rpc import Client, Server
from refimpl.rpc.client import graph_message
from refimpl.rpc.protocol import MAX_SRC, TENSOR_SIZE, U8, U32, U64, Cmd

from ..robust._fuzz import examples

pytestmark = pytest.mark.property

T = Client.tensor
COUNTS: dict = collections.Counter()


def valid_payloads(buf: int, base: int):
    """One well-formed request per command, naming the case client's own buffer (64 KiB at base)."""
    a = T(1, "f32", [16, 4], buf, base)
    b = T(2, "f32", [16, 4], buf, base + 256)
    q = T(3, "q4_0", [64, 2], buf, base + 1024)
    add = T(4, "f32", [16, 4], buf, base + 2048, op="ADD", src=[a, b])
    rope = T(5, "f32", [16, 4], buf, base + 4096, op="SOFT_MAX", src=[add], params=np.float32([0.5, 0]))
    mm = T(6, "f32", [2, 4], buf, base + 8192, op="MUL_MAT", src=[T(7, "f32", [64, 2], buf, base + 12288),
                                                                  T(8, "f32", [64, 4], buf, base + 16384)])
    ids = T(9, "i32", [2], buf, base + 20480)
    rows = T(10, "f32", [64, 2], buf, base + 24576, op="GET_ROWS", src=[q, ids])
    graph = graph_message([add, rope, mm, rows], [a, b, add, rope, q, ids, rows, mm,
                                                  T(7, "f32", [64, 2], buf, base + 12288),
                                                  T(8, "f32", [64, 4], buf, base + 16384)])
    return {
        Cmd.HELLO: bytes(24),
        Cmd.DEVICE_COUNT: b"",
        Cmd.ALLOC_BUFFER: U32.pack(0) + U64.pack(4096),
        Cmd.GET_ALIGNMENT: U32.pack(0),
        Cmd.GET_MAX_SIZE: U32.pack(0),
        Cmd.BUFFER_GET_BASE: U64.pack(buf),
        Cmd.FREE_BUFFER: U64.pack(buf),
        Cmd.BUFFER_CLEAR: U64.pack(buf) + U8.pack(3),
        Cmd.SET_TENSOR: a + U8.pack(0) + U64.pack(0) + np.arange(64, dtype=np.float32).tobytes(),
        Cmd.SET_TENSOR_HASH: a + U64.pack(0) + U64.pack(12345),
        Cmd.GET_TENSOR: a + U64.pack(0) + U64.pack(256),
        Cmd.COPY_TENSOR: a + b,
        Cmd.GRAPH_COMPUTE: graph,
        Cmd.GET_DEVICE_MEMORY: U32.pack(0),
        Cmd.INIT_TENSOR: q,
        Cmd.GET_ALLOC_SIZE: U32.pack(0) + q + bytes(TENSOR_SIZE * MAX_SRC),
        Cmd.GRAPH_RECOMPUTE: U32.pack(0),
        Cmd.MEMSET_TENSOR: a + U64.pack(4) + U64.pack(16) + U8.pack(9),
    }


def pick(rng, values: list) -> int:
    return values[int(rng.integers(0, len(values)))]


def mutate(rng, cmd: int, payload: bytes, kind: str) -> tuple[bytes, bool]:
    """The framed message for one case, and whether to close right after sending it."""
    size = len(payload)
    if kind == "truncate":
        frame = U8.pack(cmd) + U64.pack(size) + payload
        return frame[:int(rng.integers(0, len(frame)))], True
    if kind == "oversize":
        size = pick(rng, [size + 1, size + int(rng.integers(1, 1 << 20)), 1 << 40, (1 << 64) - 1])
        return U8.pack(cmd) + U64.pack(size) + payload, True
    if kind == "undersize":
        size = int(rng.integers(0, max(1, size)))
        return U8.pack(cmd) + U64.pack(size) + payload[:size], False
    if kind == "command":
        return U8.pack(int(rng.integers(0, 256))) + U64.pack(size) + payload, False
    p = bytearray(payload)
    for _ in range(int(rng.integers(1, 9))):
        if p:
            i = int(rng.integers(0, len(p)))
            p[i] = int(rng.integers(0, 256)) if rng.random() < 0.7 else p[i] ^ (1 << int(rng.integers(0, 8)))
    if rng.random() < 0.3 and len(p) >= 8:          # a whole 8-byte field (size, offset, id, address)
        i = int(rng.integers(0, len(p) - 7))
        p[i:i + 8] = U64.pack(pick(rng, [0, 1, 1 << 63, (1 << 64) - 1, int(rng.integers(0, 1 << 62))]))
    return U8.pack(cmd) + U64.pack(len(p)) + bytes(p), False


def read_outcome(sock: socket.socket) -> str:
    sock.settimeout(0.25)
    try:
        data = sock.recv(1 << 16)
    except socket.timeout:
        return "silent"
    except OSError:
        return "closed"
    return "answered" if data else "closed"


@pytest.fixture(scope="module")
def fuzz_server():
    import logging
    records = []

    class H(logging.Handler):
        def emit(self, r):
            records.append(r)
    h = H(logging.ERROR)
    lg = logging.getLogger("refimpl.rpc")
    lg.addHandler(h)
    srv = Server("127.0.0.1", 0, mem=64 << 20).start()
    srv.errors = records
    yield srv
    srv.stop()
    lg.removeHandler(h)


def test_fuzz_every_command(fuzz_server):
    srv = fuzz_server
    rng = np.random.default_rng(20261202)
    by = Client("127.0.0.1", srv.port, timeout=10)             # the bystander
    bbuf, _ = by.alloc_buffer(4096)
    bbase = by.buffer_get_base(bbuf)
    bt = T(1, "f32", [256], bbuf, bbase)
    mine = rng.standard_normal(256).astype(np.float32).tobytes()
    by.set_tensor(bt, mine)
    kinds = ("truncate", "oversize", "undersize", "mutate", "mutate", "command")
    n_cases = examples(1800)
    cmds = [c for c in Cmd if c not in (Cmd.NONE, Cmd.COUNT)]
    outcomes = collections.Counter()
    for case in range(n_cases):
        cmd, kind = cmds[case % len(cmds)], kinds[(case // len(cmds)) % len(kinds)]
        c = Client("127.0.0.1", srv.port, timeout=10)
        buf, _ = c.alloc_buffer(1 << 16)
        base = c.buffer_get_base(buf)
        c.set_tensor(T(99, "f32", [1 << 14], buf, base), rng.standard_normal(1 << 14).astype(np.float32).tobytes())
        done_before = srv.n_finished
        frame, close = mutate(rng, int(cmd), valid_payloads(buf, base)[cmd], kind)
        try:
            c.sock.sendall(frame)
            outcome = "closed" if close else read_outcome(c.sock)
        except OSError:
            outcome = "closed"
        c.close()
        t0 = time.monotonic()
        while srv.n_finished <= done_before and time.monotonic() - t0 < 5.0:
            time.sleep(0.002)
        if srv.n_finished <= done_before:
            outcome = "hang"
        outcomes[(cmd.name, kind, outcome)] += 1
        COUNTS[outcome] += 1
        if case % 50 == 0 or case == n_cases - 1:
            try:
                ok = by.device_count() == 1 and by.get_tensor(bt, 0, 1024) == mine
            except OSError:
                ok = False
            if not ok:
                COUNTS["bystander hurt"] += 1
                break
    internal = [r.getMessage() for r in srv.errors if "internal error" in r.getMessage()]
    COUNTS["internal error"] = len(internal)
    print(f"\nRPC fuzz: {n_cases} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(COUNTS.items())))
    by_kind = collections.Counter()
    for (cmd, kind, outcome), v in outcomes.items():
        by_kind[(kind, outcome)] += v
    print("  by kind: " + "; ".join(f"{k}/{o} {v}" for (k, o), v in sorted(by_kind.items())))
    assert not internal and srv.internal_errors == 0, internal[:3]
    assert COUNTS["hang"] == 0 and COUNTS["bystander hurt"] == 0, dict(COUNTS)
    assert by.device_count() == 1 and by.get_tensor(bt, 0, 1024) == mine
    by.close()
    assert sum(COUNTS.values()) >= n_cases
