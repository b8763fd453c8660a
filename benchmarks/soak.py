"""`refimpl serve` under a long run and restless neighbours: `python -m benchmarks.soak [-o OPS] [--clients 2]`.

One server process (`python -m refimpl serve`, exact numerics). First a quiet pass: the neighbours' graph (a
MUL_MAT of fixed inputs, computed once alone) and test-backend-ops over the selected ops against the server,
after which the server's RSS and open descriptors are read (the warm-up). Then the soak: test-backend-ops over
the same ops again while `--clients` neighbour threads connect, allocate, upload, compute their graph, read it
back and disconnect, over and over, half of them leaving abruptly (the socket closed mid-session, nothing
freed). Printed: the server's RSS and descriptors after the warm-up and after the soak (read from /proc, Linux
only), test-backend-ops' pass counts in both passes, the neighbours' sessions and whether every result they read
back was bit-identical to the quiet one.

The defaults are a slice of the suite (a few minutes on 2 cores); `-o ''` runs the whole suite (about an hour).
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OPS = "ADD,MUL,SCALE,SOFT_MAX,RMS_NORM,ROPE,GET_ROWS,SET_ROWS,CPY,CONT,MUL_MAT,SILU,GELU,SWIGLU,ARGSORT"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc(pid: int) -> tuple[int, int]:
    """(VmRSS in bytes, open descriptors) of a process."""
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def _tbo(binary: Path, port: int, ops: str) -> tuple[int, int, float]:
    """test-backend-ops on the server (RPC0): (cases passed, cases run, seconds)."""
    env = dict(os.environ, GGML_RPC_SERVERS=f"127.0.0.1:{port}")
    cmd = [str(binary), "test", "-b", "RPC0"] + (["-o", ops] if ops else [])
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    out = p.stdout + p.stderr
    ok = len(re.findall(r": \x1b\[1;32mOK\x1b\[0m", out))
    run = ok + len(re.findall(r": \x1b\[1;31mFAIL\x1b\[0m", out))
    return ok, run, time.monotonic() - t0


def _neighbour_graph():
    from refimpl.rpc import Client
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 96)).astype(np.float32)          # ne [96, 64]
    b = rng.standard_normal((8, 96)).astype(np.float32)           # ne [96, 8]
    T = Client.tensor

    def session(port: int, abrupt: bool) -> bytes | None:
        c = Client("127.0.0.1", port, timeout=120)
        try:
            buf, _ = c.alloc_buffer(1 << 16)
            base = c.buffer_get_base(buf)
            ta = T(1, "f32", [96, 64], buf, base)
            tb = T(2, "f32", [96, 8], buf, base + a.nbytes)
            out = T(3, "f32", [64, 8], buf, base + a.nbytes + b.nbytes, op="MUL_MAT", src=(ta, tb))
            c.set_tensor(ta, a.tobytes())
            c.set_tensor(tb, b.tobytes())
            c.graph_compute([out], [ta, tb, out])
            if abrupt:                        # gone while the graph computes: nothing read, nothing freed
                return None
            got = c.get_tensor(out, 0, 64 * 8 * 4)
            c.free_buffer(buf)
            return got
        finally:
            c.close()
    return session


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--ops", default=DEFAULT_OPS, help="test-backend-ops' -o ('' : the whole suite)")
    ap.add_argument("--clients", type=int, default=2, help="neighbour threads (default 2)")
    ap.add_argument("--passes", type=int, default=1, help="soak passes, the RSS read after each (default 1)")
    args = ap.parse_args(argv)
    build = subprocess.run(["bash", str(ROOT / "scripts" / "build_llamacpp.sh"), "--cached"], capture_output=True,
                           text=True)
    if build.returncode != 0:
        print("benchmarks.soak: test-backend-ops is not built: bash scripts/build_llamacpp.sh", file=sys.stderr)
        return 1
    binary = Path(build.stdout.strip().splitlines()[-1]) / "test-backend-ops"
    port = _free_port()
    srv = subprocess.Popen([sys.executable, "-m", "refimpl", "serve", "--port", str(port), "--numerics", "exact"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        session = _neighbour_graph()
        quiet = session(port, abrupt=False)
        q_ok, q_run, q_s = _tbo(binary, port, args.ops)
        time.sleep(1.0)
        rss0, fd0 = _proc(srv.pid)
        stop, counts, mismatch, errors = threading.Event(), [0] * args.clients, [0], []

        def neighbour(k: int):
            i = 0
            while not stop.is_set():
                try:
                    got = session(port, abrupt=(k % 2 == 1 and i % 2 == 1))
                    mismatch[0] += got is not None and got != quiet
                    counts[k] += 1
                except Exception as e:            # noqa: BLE001 -- reported below
                    errors.append(f"{type(e).__name__}: {e}")
                i += 1
        threads = [threading.Thread(target=neighbour, args=(k,), daemon=True) for k in range(args.clients)]
        for t in threads:
            t.start()
        passes = []
        for _ in range(max(args.passes, 1)):
            s_ok, s_run, s_s = _tbo(binary, port, args.ops)
            passes.append((s_ok, s_run, s_s, *_proc(srv.pid), sum(counts)))
        stop.set()
        for t in threads:
            t.join()
        time.sleep(1.0)
        rss1, fd1 = _proc(srv.pid)
    finally:
        srv.terminate()
        srv.wait(timeout=30)
    print(f"test-backend-ops -o {args.ops or '(the whole suite)'} against refimpl serve (exact), port {port}")
    print(f"  quiet pass: {q_ok}/{q_run} OK in {q_s:.0f} s; server RSS {rss0 / 2**20:.0f} MiB, {fd0} descriptors")
    for i, (ok, run, sec, rss, fd, n) in enumerate(passes[:-1] if len(passes) > 1 else []):
        print(f"  soak pass {i + 1}: {ok}/{run} OK in {sec:.0f} s, {n} neighbour sessions so far; server RSS "
              f"{rss / 2**20:.0f} MiB, {fd} descriptors")
    s_ok = min(p[0] for p in passes)
    print(f"  soak pass:  {s_ok}/{s_run} OK in {s_s:.0f} s with {args.clients} neighbours: {sum(counts)} sessions "
          f"({', '.join(map(str, counts))}), {mismatch[0]} results not bit-identical to the quiet one, "
          f"{len(errors)} errors{': ' + errors[0] if errors else ''}")
    print(f"  after the soak: server RSS {rss1 / 2**20:.0f} MiB ({(rss1 - rss0) / 2**20:+.0f} MiB), {fd1} descriptors "
          f"({fd1 - fd0:+d})")
    return 0 if (not errors and not mismatch[0] and fd1 <= fd0 and s_ok == q_ok) else 1


if __name__ == "__main__":
    sys.exit(main())
