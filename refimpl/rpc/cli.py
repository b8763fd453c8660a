"""`refimpl serve`: the RPC server on the command line (its flags, and running it until interrupted)."""
from __future__ import annotations

import logging
import os
import sys

from ..cliargs import above, at_least, byte_size
from . import server


def add_parser(sub) -> None:
    """Register `refimpl serve` on the command line's subparsers."""
    s = sub.add_parser("serve", help="serve ggml's RPC protocol (7.0.0, ggml 0.25.3): llama.cpp --rpc and "
                       "test-backend-ops compute their graphs with refimpl's ops")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; the protocol has "
                   "no authentication, so anything else is reachable by anyone on that network)")
    s.add_argument("--port", type=int, default=50052, help="TCP port (default 50052, ggml's rpc-server's)")
    s.add_argument("--backend", choices=["numpy", "numba"], default=None,
                   help="refimpl backend for the ops (default: numba when installed, else numpy)")
    s.add_argument("--numerics", choices=["exact", "ggml", "ggml-nollamafile", "fast"], default="exact",
                   help="exact: the math ggml defines; ggml: ggml-cpu's roundings where emulated, with "
                        "llamafile's sgemm as llama.cpp builds it; ggml-nollamafile: without it; fast: f32 sums")
    s.add_argument("--mem", type=byte_size, default=None, metavar="BYTES",
                   help="bound on all buffers together, e.g. 8G (default: 3/4 of the memory free now)")
    s.add_argument("--dump", metavar="DIR", help="save every computed node's value as DIR/NNNNNN-NAME.npy "
                   "with DIR/index.jsonl (op, type, shapes)")
    s.add_argument("--strict", action="store_true", help="close the connection on a node refimpl cannot "
                   "compute, instead of filling it with NaN")
    s.add_argument("--max-clients", type=above(0, "max-clients", int), default=server.MAX_CLIENTS, metavar="N",
                   help=f"connections served at once; more are closed at once (default {server.MAX_CLIENTS})")
    s.add_argument("--idle-timeout", type=at_least(0, "idle-timeout", float), default=server.IDLE_TIMEOUT_S,
                   metavar="S", help=f"close a connection idle this long, 0: never (default {server.IDLE_TIMEOUT_S:g})")
    s.add_argument("--max-graph-work", type=at_least(0, "max-graph-work", float), default=server.MAX_GRAPH_WORK,
                   metavar="OPS", help="refuse a graph whose estimated work is over this many "
                   f"element-operations, 0: no limit (default 2^{server.MAX_GRAPH_WORK.bit_length() - 1})")
    s.add_argument("--max-graph-seconds", type=at_least(0, "max-graph-seconds", float),
                   default=server.MAX_GRAPH_SECONDS, metavar="S", help="refuse the rest of a graph that computes "
                   f"longer, 0: no limit (default {server.MAX_GRAPH_SECONDS:g})")
    s.add_argument("-v", "--verbose", action="store_true", help="log every connection and command summary")
    s.set_defaults(fn=cli)


def cli(args) -> int:
    """`refimpl serve`: listen until interrupted."""
    from ..ops import current_backend
    level = logging.DEBUG if os.environ.get("REFIMPL_RPC_DEBUG") else logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="refimpl serve: %(message)s")
    try:
        srv = server.Server(args.host, args.port, backend=args.backend or current_backend(), numerics=args.numerics,
                     mem=args.mem, dump=args.dump, strict=args.strict, max_clients=args.max_clients,
                     idle_timeout=args.idle_timeout, max_graph_work=args.max_graph_work,
                     max_graph_seconds=args.max_graph_seconds)
        srv.start()
    except OSError as e:
        print(f"refimpl: error: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(f"refimpl serve: backend {srv.backend}, numerics {srv.numerics}, --mem {srv.memory.limit} bytes",
          file=sys.stderr)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        srv.stop()
        return 130
    return 0
