"""The server's answer to every command of protocol 7.0.0, spoken by refimpl.rpc.Client.

Expected values are identities (bytes written are the bytes read; a graph of exact integer arithmetic
gives NumPy's integers) or ggml's documented constants (version 7.0.0, alignment 32)."""
import time

import numpy as np
import pytest

from refimpl.rpc import Client
from refimpl.rpc.protocol import TENSOR_SIZE, Cmd

pytestmark = pytest.mark.property

T = Client.tensor


def wait_closed(server, n=1, timeout=5.0):
    t0 = time.monotonic()
    while server.n_finished < n and time.monotonic() - t0 < timeout:
        time.sleep(0.01)
    return list(server.finished)


def test_hello_and_device_queries(client, server):
    assert client.version == (7, 0, 0)
    assert client.device_count() == 1
    assert client.get_alignment() == 32
    assert client.get_max_size() == 256 << 20
    free, total = client.get_device_memory()
    assert (free, total) == (256 << 20, 256 << 20)


def test_buffers_roundtrip_and_accounting(client, server):
    buf, size = client.alloc_buffer(4096)
    assert buf != 0 and size == 4096
    base = client.buffer_get_base(buf)
    assert base % 4096 == 0
    assert client.get_device_memory()[0] == (256 << 20) - 4096
    a = T(1, "f32", [16, 4], buf, base + 256)
    data = np.arange(64, dtype=np.float32)
    client.set_tensor(a, data.tobytes())
    assert np.frombuffer(client.get_tensor(a, 0, 256), np.float32).tolist() == data.tolist()
    assert client.get_tensor(a, 8, 8) == data[2:4].tobytes()
    client.memset_tensor(a, 4, 8, 0xFF)
    got = np.frombuffer(client.get_tensor(a, 0, 16), np.uint8)
    assert got[4:12].tolist() == [255] * 8 and got[:4].tolist() == list(data[:1].view(np.uint8))
    b = T(2, "f32", [16, 4], buf, base + 1024)
    assert client.copy_tensor(a, b) == 1
    assert client.get_tensor(b, 0, 256) == client.get_tensor(a, 0, 256)
    assert client.get_alloc_size(T(3, "q4_0", [64, 3], buf, base)) == 3 * 2 * 18
    assert client.set_tensor_hash(a, 1234) == 0                 # no blob cache: "send the bytes"
    client.init_tensor(a)
    client.buffer_clear(buf, 7)
    assert set(client.get_tensor(a, 0, 256)) == {7}
    client.free_buffer(buf)
    assert client.get_device_memory()[0] == 256 << 20
    assert client.alloc_buffer(1 << 40) == (0, 0)               # over --mem: a null buffer, not a crash
    assert client.device_count() == 1                          # and the connection goes on


def _f32(client, t, n):
    return np.frombuffer(client.get_tensor(t, 0, 4 * n), np.float32)


def test_graph_compute_elementwise_views_and_inplace(client):
    buf, _ = client.alloc_buffer(1 << 16)
    base = client.buffer_get_base(buf)
    a = T(1, "f32", [4, 3], buf, base, name="a")
    b = T(2, "f32", [4, 1], buf, base + 64, name="b")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.array([10, 20, 30, 40], np.float32)
    client.set_tensor(a, x.tobytes())
    client.set_tensor(b, y.tobytes())
    add = T(3, "f32", [4, 3], buf, base + 128, op="ADD", src=[a, b], name="add")
    # a transposed view of add (no bytes of its own), then a contiguous copy of it
    tr = T(4, "f32", [3, 4], buf, base + 128, nb=[16, 4, 48, 48], op="TRANSPOSE", src=[add], view_src=add)
    cont = T(5, "f32", [3, 4], buf, base + 256, op="CONT", src=[tr], name="cont")
    # in place: mul writes into add's own bytes (ggml_mul_inplace: a view of add)
    mul = T(6, "f32", [4, 3], buf, base + 128, op="MUL", src=[add, b], view_src=add, name="mul_inplace")
    client.graph_compute([add, tr, cont, mul], [a, b, add, tr, cont, mul])
    assert _f32(client, cont, 12).reshape(4, 3).tolist() == (x + y).T.tolist()
    assert _f32(client, mul, 12).reshape(3, 4).tolist() == ((x + y) * y).tolist()
    # GRAPH_RECOMPUTE runs the stored graph again on the same bytes: mul once more, in place
    client.set_tensor(a, x.tobytes())
    client.graph_recompute()
    assert _f32(client, mul, 12).reshape(3, 4).tolist() == ((x + y) * y).tolist()


def test_mul_mat_and_quantized_get_rows(client):
    import refimpl
    rng = np.random.default_rng(0)
    w = rng.integers(-3, 4, (8, 32)).astype(np.float32)
    q = refimpl.quantize(rng.standard_normal((8, 32)).astype(np.float32), "q8_0")
    buf, _ = client.alloc_buffer(1 << 16)
    base = client.buffer_get_base(buf)
    wt = T(1, "f16", [32, 8], buf, base)                  # f16 weights: b becomes f16, integers stay exact
    client.set_tensor(wt, w.astype(np.float16).tobytes())
    qt = T(7, "q8_0", [32, 8], buf, base + 8192)
    client.set_tensor(qt, q.tobytes())
    xs = rng.integers(-2, 3, (2, 32)).astype(np.float32)
    xt = T(2, "f32", [32, 2], buf, base + 1024)
    client.set_tensor(xt, xs.tobytes())
    mm = T(3, "f32", [8, 2], buf, base + 2048, op="MUL_MAT", src=[wt, xt])
    ids = T(4, "i32", [3], buf, base + 4096)
    client.set_tensor(ids, np.array([5, 0, 5], np.int32).tobytes())
    rows = T(5, "f32", [32, 3], buf, base + 4352, op="GET_ROWS", src=[qt, ids])
    client.graph_compute([mm, rows], [wt, qt, xt, mm, ids, rows])
    assert _f32(client, mm, 16).reshape(2, 8).tolist() == (xs @ w.T).tolist()
    assert _f32(client, rows, 96).reshape(3, 32).tolist() == np.asarray(q)[[5, 0, 5]].tolist()


def test_unsupported_node_is_nan_and_logged(client, server, rpc_log):
    buf, _ = client.alloc_buffer(4096)
    base = client.buffer_get_base(buf)
    a = T(1, "f32", [4], buf, base)
    client.set_tensor(a, np.ones(4, np.float32).tobytes())
    bad = T(2, "f32", [4], buf, base + 64, op="OPT_STEP_SGD", src=[a], name="opt")
    ok = T(3, "f32", [4], buf, base + 128, op="SQR", src=[a], name="sq")
    client.graph_compute([bad, ok], [a, bad, ok])
    assert np.isnan(_f32(client, bad, 4)).all()
    assert _f32(client, ok, 4).tolist() == [1.0] * 4
    msgs = rpc_log.messages()
    assert any("OPT_STEP_SGD" in m and "ne [4, 1, 1, 1]" in m and "numpy (1, 1, 1, 4)" in m for m in msgs), msgs
    client.close()
    (conn,) = wait_closed(server)
    assert conn.computed["SQR"] == 1 and conn.refused["OPT_STEP_SGD"] == 1
    assert any("1 nodes computed (SQR 1); 1 refused (OPT_STEP_SGD 1)" in m
               for m in rpc_log.messages(0)), rpc_log.messages(0)


def test_strict_closes_on_refused_node(rpc_log):
    from refimpl.rpc import Server
    with Server("127.0.0.1", 0, mem=1 << 20, strict=True) as srv:
        c = Client("127.0.0.1", srv.port, timeout=10)
        buf, _ = c.alloc_buffer(1024)
        base = c.buffer_get_base(buf)
        a = T(1, "f32", [4], buf, base)
        bad = T(2, "f32", [4], buf, base + 64, op="CUSTOM", src=[a])
        c.graph_compute([bad], [a, bad])
        with pytest.raises(ConnectionError):
            c.device_count()
        assert any("--strict" in m for m in rpc_log.messages())


def test_clients_do_not_share_buffers(server, rpc_log):
    a, b = Client("127.0.0.1", server.port), Client("127.0.0.1", server.port)
    buf_a, _ = a.alloc_buffer(1024)
    base_a = a.buffer_get_base(buf_a)
    a.set_tensor(T(1, "f32", [4], buf_a, base_a), np.full(4, 3, np.float32).tobytes())
    # b names a's buffer: not one of b's, so b's connection is closed and a's buffer is untouched
    b.send(Cmd.BUFFER_GET_BASE, buf_a.to_bytes(8, "little"))
    with pytest.raises(ConnectionError):
        b.recv()
    assert a.get_tensor(T(1, "f32", [4], buf_a, base_a), 0, 16) == np.full(4, 3, np.float32).tobytes()
    assert any("not one of this connection's" in m for m in rpc_log.messages())
    a.close()


def test_out_of_bounds_tensor_closes_only_that_connection(server, rpc_log):
    good, bad = Client("127.0.0.1", server.port), Client("127.0.0.1", server.port)
    buf, _ = bad.alloc_buffer(256)
    base = bad.buffer_get_base(buf)
    bad.set_tensor(T(1, "f32", [128], buf, base), bytes(512))          # 512 bytes into a 256-byte buffer
    with pytest.raises(ConnectionError):
        bad.device_count()
    assert good.device_count() == 1
    assert any("outside its buffer" in m for m in rpc_log.messages())
    good.close()


@pytest.mark.parametrize("what, message", [
    ("a region past the buffer's end", "outside its buffer"),
    ("a tensor past the buffer's end", "outside its buffer"),
    ("a buffer of no one", "names no buffer"),
    ("q4_0 with ne0 off its block", "not a multiple of"),
    ("an invalid type", "invalid tensor type"),
])
@pytest.mark.parametrize("cmd", ["SET_TENSOR", "GET_TENSOR"])
def test_tensor_data_commands_check_every_field(server, rpc_log, what, message, cmd):
    """SET_TENSOR and GET_TENSOR read only a tensor's type, buffer, ne, nb and data (no Node built): each
    check the full parse makes still closes the connection with the error that names it, and a good
    region right beside each bad one still round-trips."""
    c = Client("127.0.0.1", server.port)
    buf, _ = c.alloc_buffer(256)
    base = c.buffer_get_base(buf)
    good = T(1, "f32", [32], buf, base + 128)
    c.set_tensor(good, np.arange(32, dtype=np.float32).tobytes())
    assert c.get_tensor(good, 64, 64) == np.arange(16, 32, dtype=np.float32).tobytes()
    t, offset = {"a region past the buffer's end": (good, 128),
                 "a tensor past the buffer's end": (T(1, "f32", [33], buf, base + 128), 0),
                 "a buffer of no one": (T(1, "f32", [4], buf + 1, base), 0),
                 "q4_0 with ne0 off its block": (T(1, "q4_0", [32], buf, base), 0),
                 "an invalid type": (T(1, "f32", [4], buf, base), 0)}[what]
    if what == "an invalid type":
        t = t[:8] + (99).to_bytes(4, "little") + t[12:]
    if what == "q4_0 with ne0 off its block":
        t = t[:20] + (31).to_bytes(4, "little") + t[24:]
    if cmd == "SET_TENSOR":
        c.set_tensor(t, bytes(16), offset)
        with pytest.raises(ConnectionError):
            c.device_count()
    else:
        with pytest.raises(ConnectionError):
            c.get_tensor(t, offset, 16)
    assert any(message in m for m in rpc_log.messages()), rpc_log.messages()


def test_first_command_must_be_hello(server):
    c = Client("127.0.0.1", server.port, hello=False)
    c.send(Cmd.DEVICE_COUNT)
    with pytest.raises(ConnectionError):
        c.recv()


def test_request_sizes_are_exact(server):
    c = Client("127.0.0.1", server.port)
    c.send(Cmd.GET_ALIGNMENT, b"\0" * 5)          # 4 expected
    with pytest.raises(ConnectionError):
        c.recv()
    assert TENSOR_SIZE == 296


def test_refused_strided_node_leaves_the_gaps_between_its_rows(client):
    """A node that is a strided view (rows 64 bytes apart, 34 bytes each) is NaN-filled row by row: the bytes
    between its rows belong to other tensors and keep their values."""
    buf, _ = client.alloc_buffer(4096)
    base = client.buffer_get_base(buf)
    whole = T(1, "i8", [256], buf, base)
    client.set_tensor(whole, bytes(range(256)))
    a = T(2, "f32", [4], buf, base + 1024)
    q = T(3, "q8_0", [32, 4], buf, base, nb=[34, 64, 256, 256], op="CUSTOM", src=[a])
    client.graph_compute([q], [a, q])
    got = client.get_tensor(whole, 0, 256)
    for r in range(4):
        assert got[64 * r:64 * r + 34] == b"\xff" * 34
        assert got[64 * r + 34:64 * r + 64] == bytes(range(64 * r + 34, 64 * r + 64))


def test_dump_writes_each_node_with_its_sources(tmp_path):
    """--dump DIR: each computed node as DIR/NNNNNN-NAME.npy and a line of DIR/index.jsonl naming its op, ne,
    NumPy shape and sources. The graph is ggml's examples/simple: A (4 x 2) and B (3 x 2) as ne [2, 4] and
    ne [2, 3], mul_mat(A, B) of ne [4, 3], whose printed answer ggml's README gives."""
    import json
    from refimpl.rpc import Server
    A = np.array([[2, 8], [5, 1], [4, 2], [8, 6]], np.float32)
    B = np.array([[10, 5], [9, 9], [5, 4]], np.float32)
    with Server("127.0.0.1", 0, backend="numpy", dump=tmp_path) as srv, Client("127.0.0.1", srv.port) as c:
        buf, _ = c.alloc_buffer(1024)
        base = c.buffer_get_base(buf)
        a = T(1, "f32", [2, 4], buf, base, name="a")
        b = T(2, "f32", [2, 3], buf, base + 64, name="b")
        y = T(3, "f32", [4, 3], buf, base + 128, op="MUL_MAT", src=[a, b], name="result")
        c.set_tensor(a, A.tobytes())
        c.set_tensor(b, B.tobytes())
        c.graph_compute([y], [a, b, y])
        got = np.frombuffer(c.get_tensor(y, 0, 48), np.float32).reshape(3, 4)
    want = np.array([[60, 55, 50, 110], [90, 54, 54, 126], [42, 29, 28, 64]], np.float32)
    np.testing.assert_array_equal(got, want)
    (line,) = [json.loads(x) for x in (tmp_path / "index.jsonl").read_text().splitlines()]
    assert (line["name"], line["op"], line["ne"][:2], line["shape"], line["srcs"]) == \
        ("result", "MUL_MAT", [4, 3], [1, 1, 3, 4], ["a", "b"])
    np.testing.assert_array_equal(np.load(tmp_path / line["file"]), want.reshape(1, 1, 3, 4))
