"""`refimpl serve` through the installed command: it says where it listens, warns off loopback, and a user
error is one line, never a traceback."""
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from refimpl.rpc import Client

pytestmark = pytest.mark.property

REFIMPL = str(Path(sys.executable).parent / "refimpl")


def _start(*args):
    p = subprocess.Popen([REFIMPL, "serve", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    return p, line


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_listens_answers_and_stops_on_ctrl_c():
    port = _free_port()
    p, line = _start("--port", str(port), "--backend", "numpy", "--mem", "64M")
    try:
        assert line.strip() == f"listening on 127.0.0.1:{port}"
        c = Client("127.0.0.1", port)
        assert c.version == (7, 0, 0) and c.get_max_size() == 64 << 20
        c.close()
    finally:
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=20)
    assert p.returncode == 130 and "Traceback" not in err


def test_non_loopback_host_warns():
    port = _free_port()
    p, line = _start("--host", "0.0.0.0", "--port", str(port), "--backend", "numpy")
    try:
        assert line.startswith("listening on 0.0.0.0:")
    finally:
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=20)
    assert "no authentication" in err


@pytest.mark.parametrize("args, code, says", [
    (["--mem", "lots"], 2, "--mem"),
    (["--numerics", "fastest"], 2, "--numerics"),
    (["--port", "x"], 2, "--port"),
])
def test_bad_flags_are_one_line(args, code, says):
    p = subprocess.run([REFIMPL, "serve", *args], capture_output=True, text=True, timeout=30)
    assert p.returncode == code and says in p.stderr and "Traceback" not in p.stderr


def test_port_in_use_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        p = subprocess.run([REFIMPL, "serve", "--port", str(port)], capture_output=True, text=True, timeout=30,
                           env=dict(os.environ, REFIMPL_BACKEND="numpy"))
    assert p.returncode == 1
    assert p.stderr.strip().splitlines()[-1].startswith(f"refimpl: error: cannot listen on 127.0.0.1:{port}")
    assert "Traceback" not in p.stderr
