"""Hostile peers: well-formed messages with hostile content, idle and half-open connections, too many clients,
descriptors exhausted. After each, a bystander's buffer is intact and a fresh client is served within a second;
no case may end in an internal error (an exception outside the server's checks), a hang, or an allocation
beyond --mem (docs/rpc.md, "Threat model")."""
import logging
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from refimpl.rpc import Client, Server
from refimpl.rpc.protocol import CONN_CAPS_SIZE, U8, U64, Cmd

pytestmark = pytest.mark.property

T = Client.tensor


@pytest.fixture
def hostile(rpc_log):
    """A server with small limits, a bystander holding its own bytes, and the check run after every attack."""
    srv = Server("127.0.0.1", 0, backend="numpy", numerics="exact", mem=64 << 20, max_clients=8,
                 idle_timeout=30, max_graph_work=1e9, max_graph_seconds=2.0).start()
    srv.hello_timeout = 0.5
    by = Client("127.0.0.1", srv.port, timeout=10)
    buf, _ = by.alloc_buffer(4096)
    t = T(1, "f32", [256], buf, by.buffer_get_base(buf))
    mine = np.random.default_rng(7).standard_normal(256).astype(np.float32).tobytes()
    by.set_tensor(t, mine)

    def check():
        assert by.get_tensor(t, 0, 1024) == mine, "the bystander's bytes changed"
        t0 = time.monotonic()
        with Client("127.0.0.1", srv.port, timeout=5) as fresh:
            assert fresh.device_count() == 1
        assert time.monotonic() - t0 < 1.0, "a fresh client waited"
        assert srv.internal_errors == 0, rpc_log.messages(logging.ERROR)
        assert srv.memory.used <= srv.memory.limit
    srv.check, srv.bystander = check, by
    yield srv
    by.close()
    srv.stop()


def graph(c: Client, nodes, tensors):
    c.graph_compute(nodes, tensors)
    c.device_count()                          # a round trip: the graph has been computed


def test_aliasing_node_over_a_huge_ne_is_refused_at_once(hostile, rpc_log):
    hostile.max_graph_work = float("inf")          # past the work limit, which would refuse it first
    with Client("127.0.0.1", hostile.port) as c:
        buf, _ = c.alloc_buffer(1 << 16)
        base = c.buffer_get_base(buf)
        zero = [0, 0, 0, 0]                    # every element on the same 4 bytes: ~2^40 elements
        a = T(1, "f32", [1 << 20, 1 << 20], buf, base, nb=zero)
        out = T(2, "f32", [1 << 20, 1 << 20], buf, base + 64, nb=zero, op="ADD", src=[a, a], name="alias")
        t0 = time.monotonic()
        graph(c, [out], [a, out])
        assert time.monotonic() - t0 < 2.0
    assert any("aliasing strides" in m for m in rpc_log.messages())
    hostile.check()


def test_temporaries_beyond_mem_are_refused_before_they_are_made(hostile, rpc_log):
    hostile.max_graph_work = float("inf")
    with Client("127.0.0.1", hostile.port) as c:
        buf, _ = c.alloc_buffer(5 << 20)
        base = c.buffer_get_base(buf)
        # SUM_ROWS over a broadcast source (rows that share their bytes): 2^34 elements, 128 GiB as float64,
        # into an honest output of 2^20 floats
        src = T(1, "f32", [1 << 14, 1 << 20], buf, base, nb=[4, 0, 0, 0])
        out = T(2, "f32", [1, 1 << 20], buf, base + (1 << 16), op="SUM_ROWS", src=[src])
        t0 = time.monotonic()
        graph(c, [out], [src, out])
        assert time.monotonic() - t0 < 2.0
    assert any("bytes of temporaries" in m for m in rpc_log.messages())
    hostile.check()


def test_an_empty_source_with_huge_dimensions_is_charged_for_its_batches(hostile, rpc_log):
    # found by the coverage-guided fuzzer: a source with no element (ne1 = 0) but 2^25 batches made MUL_MAT
    # walk 2^25 empty batches in Python (20 s) inside a graph that counted as no work at all
    hostile.max_graph_work = 1 << 24
    with Client("127.0.0.1", hostile.port) as c:
        buf, _ = c.alloc_buffer(1 << 16)
        base = c.buffer_get_base(buf)
        a = T(1, "f32", [16, 0, 1, 1 << 25], buf, base, nb=[4, 64, 256, 256])
        b = T(2, "f32", [16, 41, 1 << 24, 0], buf, base + 1024, nb=[4, 64, 256, 256])
        out = T(3, "f32", [4, 4], buf, base + 2048, op="MUL_MAT", src=[a, b])
        t0 = time.monotonic()
        graph(c, [out], [a, b, out])
        assert time.monotonic() - t0 < 2.0
        assert np.isnan(np.frombuffer(c.get_tensor(out, 0, 64), np.float32)).all()
    assert any("--max-graph-work" in m for m in rpc_log.messages()), rpc_log.messages()
    hostile.check()


@pytest.mark.parametrize("op, params, srcs", [
    ("ARANGE", np.float32([0, 1e12, 1]).view(np.int32), 0),              # 10^12 steps for a node of 16
    ("TIMESTEP_EMBEDDING", np.int32([1 << 30, 10000]), 1),                 # dim 2^30
    ("PAD", np.int32([0, 1 << 30, 0, 0, 0, 0, 0, 0, 0]), 1),               # 2^30 columns of padding
    ("POOL_2D", np.int32([0, 1, 1, 1, 1, -(1 << 30), -(1 << 30)]), 1),     # a huge negative padding
    ("CONV_TRANSPOSE_1D", np.int32([1 << 30, 0, 1]), 2),                   # stride 2^30
    ("IM2COL", np.int32([0, 0, 0, 0, 1, 1, 1]), 2),                        # stride 0
    # results that are a product of the sources' sizes (found by fuzzing: GET_ROWS of 1,026 rows of 65,600
    # into a node of 128 made 290 MB before the store refused it)
    ("GET_ROWS", None, 2), ("MUL_MAT", None, 2), ("OUT_PROD", None, 2),
    ("COL2IM_1D", np.int32([150994944, 1, 0]), 1),                       # stride 9 * 2^24: 3.4 GB (fuzzer)
    ("CONV_2D", np.int32([1, 1, 1 << 20, 1 << 20, 1, 1]), 2),              # 2^20 of padding on each side
    ("PAD_REFLECT_1D", np.int32([1 << 30, 0]), 1),
    ("WIN_PART", np.int32([0, 0, 1 << 20]), 1),                            # 2^20 x 2^20 windows
])
def test_op_params_that_imply_a_bigger_result_are_refused_first(hostile, rpc_log, op, params, srcs):
    hostile.max_graph_work = float("inf")
    with Client("127.0.0.1", hostile.port) as c:
        buf, _ = c.alloc_buffer(1 << 16)
        base = c.buffer_get_base(buf)
        src = [T(1, "f32", [4, 4], buf, base), T(2, "f32", [8, 4], buf, base + 256)][:srcs]
        out = T(3, "f32", [16], buf, base + 1024, op=op, src=src, params=params)
        t0 = time.monotonic()
        graph(c, [out], [*src, out])
        assert time.monotonic() - t0 < 2.0
    assert any("imply ne" in m for m in rpc_log.messages()), rpc_log.messages()
    hostile.check()


def test_a_pools_kernel_taps_count_as_work(hostile, rpc_log):
    # POOL_2D's kernel is op_params: 2^15 x 2^15 taps over a 4 x 4 input padded to fit, into one output
    # (refimpl walks the taps in Python: 2^30 steps)
    with Client("127.0.0.1", hostile.port) as c:
        buf, _ = c.alloc_buffer(1 << 16)
        base = c.buffer_get_base(buf)
        a = T(1, "f32", [4, 4], buf, base)
        k, pad = 1 << 15, ((1 << 15) - 4) // 2
        out = T(2, "f32", [1, 1], buf, base + 1024, op="POOL_2D", src=[a], params=np.int32([0, k, k, 1, 1, pad, pad]))
        t0 = time.monotonic()
        graph(c, [out], [a, out])
        assert time.monotonic() - t0 < 2.0
    assert any("--max-graph-work" in m for m in rpc_log.messages()), rpc_log.messages()
    hostile.check()


def test_a_graph_over_the_work_limit_is_refused_with_a_log_line(hostile, rpc_log):
    with Client("127.0.0.1", hostile.port) as c:
        buf, _ = c.alloc_buffer(1 << 20)
        base = c.buffer_get_base(buf)
        a = T(1, "f32", [64, 64], buf, base)
        out = T(2, "f32", [64, 64], buf, base + (1 << 16), op="MUL_MAT", src=[a, a])
        # one expensive node named a million times (the client sends its id over and over)
        t0 = time.monotonic()
        graph(c, [out] * 300_000, [a, out])
        assert time.monotonic() - t0 < 10.0
        assert np.isnan(np.frombuffer(c.get_tensor(out, 0, 64 * 64 * 4), np.float32)).all()
    assert any("--max-graph-work" in m for m in rpc_log.messages())
    hostile.check()


def test_a_long_graph_does_not_hold_back_another_client_and_stops_at_its_time_limit(hostile, rpc_log):
    hostile.max_graph_work = float("inf")
    with Client("127.0.0.1", hostile.port, timeout=60) as slow, Client("127.0.0.1", hostile.port) as quick:
        buf, _ = slow.alloc_buffer(1 << 20)
        base = slow.buffer_get_base(buf)
        a = T(1, "f32", [32, 32], buf, base)
        out = T(2, "f32", [32, 32], buf, base + 8192, op="MUL_MAT", src=[a, a])
        done = threading.Event()
        th = threading.Thread(target=lambda: (graph(slow, [out] * 400_000, [a, out]), done.set()))
        t0 = time.monotonic()
        th.start()
        time.sleep(0.3)
        qbuf, _ = quick.alloc_buffer(4096)
        qa = T(1, "f32", [16], qbuf, quick.buffer_get_base(qbuf))
        qo = T(2, "f32", [16], qbuf, quick.buffer_get_base(qbuf) + 256, op="ADD", src=[qa, qa])
        quick.set_tensor(qa, np.ones(16, np.float32).tobytes())
        tq = time.monotonic()
        graph(quick, [qo], [qa, qo])
        waited = time.monotonic() - tq
        assert not done.is_set() and waited < 1.0, f"the quick client waited {waited:.2f} s behind the slow graph"
        assert np.frombuffer(quick.get_tensor(qo, 0, 64), np.float32).tolist() == [2.0] * 16
        th.join(60)
        assert done.is_set() and time.monotonic() - t0 < 30
    assert any("--max-graph-seconds" in m for m in rpc_log.messages())
    hostile.check()


def test_client_strings_are_escaped_in_the_log(hostile, rpc_log):
    hostile.max_graph_work = float("inf")
    with Client("127.0.0.1", hostile.port) as c:
        buf, _ = c.alloc_buffer(4096)
        base = c.buffer_get_base(buf)
        evil = "x\nrefimpl serve: forged line\x1b[31m"
        a = T(1, "f32", [16], buf, base, name=evil)
        out = T(2, "f32", [1 << 30], buf, base + 256, op="ADD", src=[a, a], nb=[0, 64, 64, 64], name=evil)
        graph(c, [out], [a, out])
    logged = [r.getMessage() for r in rpc_log.records]
    assert any("forged line" in m for m in logged)
    assert not any("\n" in m or "\x1b" in m for m in logged)
    hostile.check()


def test_get_alloc_size_past_2_64_bytes_is_a_refusal(hostile):
    with Client("127.0.0.1", hostile.port) as c:
        top = (1 << 32) - 1                   # rpc_tensor's ne and nb are uint32: 4 + 4 * top^2 > 2^64 bytes
        big = T(1, "f32", [top] * 4, 0, 0, nb=[top] * 4)
        with pytest.raises(OSError):
            c.get_alloc_size(big)
    hostile.check()


def test_a_stored_graph_is_charged_to_mem(rpc_log):
    srv = Server("127.0.0.1", 0, backend="numpy", mem=1 << 20).start()
    try:
        with Client("127.0.0.1", srv.port) as c:
            buf, _ = c.alloc_buffer(4096)
            base = c.buffer_get_base(buf)
            a = T(1, "f32", [4], buf, base)
            nodes = [T(i, "f32", [4], buf, base + 64, op="ADD", src=[a, a]) for i in range(2, 2000)]
            used = srv.memory.used
            with pytest.raises(OSError):
                graph(c, nodes, [a, *nodes])          # ~6 MB of graph: more than the 1 MB --mem
        deadline = time.monotonic() + 5
        while srv.connections and time.monotonic() < deadline:
            time.sleep(0.01)
        assert srv.memory.used == 0 and used == 4096
        assert any("server memory" in m for m in rpc_log.messages())
        assert srv.internal_errors == 0
    finally:
        srv.stop()


def test_idle_and_silent_connections_are_closed(hostile):
    hostile.idle_timeout = 0.5
    silent = socket.create_connection(("127.0.0.1", hostile.port))       # never says HELLO
    idle = Client("127.0.0.1", hostile.port)                             # says HELLO, then nothing
    for _ in range(15):
        hostile.bystander.device_count()                                 # the bystander keeps talking
        time.sleep(0.1)
    silent.settimeout(2)
    assert silent.recv(1) == b"", "a connection without HELLO is closed"
    idle.sock.settimeout(2)
    assert idle.sock.recv(1) == b"", "an idle connection is closed"
    silent.close()
    idle.close()
    hostile.idle_timeout = 30
    hostile.check()


def test_max_clients_turns_the_next_away_and_frees_its_place(hostile):
    held = [Client("127.0.0.1", hostile.port) for _ in range(hostile.max_clients - 1)]   # + the bystander
    extra = socket.create_connection(("127.0.0.1", hostile.port))
    extra.settimeout(2)
    assert extra.recv(1) == b"", "the client past --max-clients is closed at once"
    extra.close()
    assert hostile.turned_away >= 1
    held.pop().close()
    deadline = time.monotonic() + 2
    while len(hostile.connections) >= hostile.max_clients and time.monotonic() < deadline:
        time.sleep(0.01)
    for h in held:
        h.close()
    hostile.check()


def test_mid_compute_disconnect_leaves_the_server_serving(hostile):
    hostile.max_graph_work = float("inf")
    c = Client("127.0.0.1", hostile.port)
    buf, _ = c.alloc_buffer(1 << 20)
    base = c.buffer_get_base(buf)
    a = T(1, "f32", [32, 32], buf, base)
    out = T(2, "f32", [32, 32], buf, base + 8192, op="MUL_MAT", src=[a, a])
    c.graph_compute([out] * 50_000, [a, out])
    c.sock.close()                                           # gone while its graph computes
    hostile.check()


SERVE_CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
from refimpl.rpc import Server
srv = Server("127.0.0.1", 0, backend="numpy", mem=64 << 20, max_clients=1000).start()
srv.hello_timeout = 1.0
print(srv.port, flush=True)
sys.stdin.read()
"""


def test_descriptor_exhaustion_does_not_stop_the_accept_loop():
    p = subprocess.Popen([sys.executable, "-c", SERVE_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    hello = U8.pack(Cmd.HELLO) + U64.pack(CONN_CAPS_SIZE) + bytes(CONN_CAPS_SIZE)
    try:
        port = int(p.stdout.readline())
        hogs = []
        for _ in range(120):           # more than the server's 64 descriptors; each says HELLO, then holds on
            try:
                h = socket.create_connection(("127.0.0.1", port), timeout=2)
                h.sendall(hello)
                hogs.append(h)
            except OSError:
                break
        time.sleep(1.0)
        for h in hogs:
            h.close()
        time.sleep(0.5)
        t0 = time.monotonic()
        with Client("127.0.0.1", port, timeout=5) as fresh:
            assert fresh.device_count() == 1
        assert time.monotonic() - t0 < 1.0
    finally:
        p.stdin.close()
        p.terminate()
        err = p.stderr.read()
        p.wait(10)
    assert "accept failed" in err, err[-2000:]
    assert "internal error" not in err


def test_threat_model_is_documented():
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "rpc.md")).read()
    for flag in ("--max-clients", "--idle-timeout", "--max-graph-work", "--max-graph-seconds", "--mem"):
        assert flag in doc.split("## Threat model", 1)[-1], flag


def test_closed_connections_are_not_kept_forever():
    """The server keeps the last FINISHED_KEPT closed connections (their counts) and a total, not every one: a
    long-running server saw thousands of clients come and go (benchmarks.soak)."""
    from refimpl.rpc import Server
    from refimpl.rpc.server import FINISHED_KEPT
    with Server("127.0.0.1", 0) as srv:
        for _ in range(FINISHED_KEPT + 40):
            Client("127.0.0.1", srv.port, timeout=10).close()
        t0 = time.monotonic()
        while srv.n_finished < FINISHED_KEPT + 40 and time.monotonic() - t0 < 30:
            time.sleep(0.01)
        assert srv.n_finished == FINISHED_KEPT + 40 and len(srv.finished) == FINISHED_KEPT
        # what callers read: the ones closed since a count, as far back as they are kept
        assert srv.finished_since(srv.n_finished - 3) == list(srv.finished)[-3:]
        assert srv.finished_since(srv.n_finished) == []
        assert len(srv.finished_since(0)) == FINISHED_KEPT
