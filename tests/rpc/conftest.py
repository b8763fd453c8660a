import logging

import pytest

from refimpl.rpc import Client, Server


class LogCapture(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def messages(self, level=logging.WARNING):
        return [r.getMessage() for r in self.records if r.levelno >= level]


@pytest.fixture
def rpc_log():
    h = LogCapture()
    lg = logging.getLogger("refimpl.rpc")
    old = lg.level
    lg.setLevel(logging.DEBUG)
    lg.addHandler(h)
    yield h
    lg.removeHandler(h)
    lg.setLevel(old)


@pytest.fixture
def server(rpc_log):
    """An in-process refimpl RPC server on a free loopback port (NumPy backend, exact numerics)."""
    srv = Server("127.0.0.1", 0, backend="numpy", numerics="exact", mem=256 << 20).start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    c = Client("127.0.0.1", server.port, timeout=20)
    yield c
    c.close()
