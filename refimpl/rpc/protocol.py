"""ggml's RPC wire format, protocol 7.0.0 (ggml 0.25.3, the llama.cpp that llama-cpp-python 0.3.36 vendors).

Every message is little-endian and packed (`#pragma pack(1)` in ggml-rpc.cpp):

    request   | command (u8) | size (u64) | payload (size bytes) |
    response  | size (u64) | payload (size bytes) |          (only the commands listed below answer)

The first command of a connection is HELLO; the server answers with its version. A tensor travels as
`rpc_tensor` (RPC_TENSOR below, 296 bytes): `ne` and `nb` are u32 on the wire, `src`/`view_src` are the
client's tensor ids (0: none), `data` is an address inside the buffer `buffer` names (an id the server
handed out with ALLOC_BUFFER; base and size from BUFFER_GET_BASE and the allocation).
"""
from __future__ import annotations

import enum
import struct

import numpy as np

PROTO_VERSION = (7, 0, 0)
MAX_DIMS = 4
MAX_SRC = 10
MAX_OP_PARAMS = 64           # bytes: 16 int32
MAX_NAME = 64
CONN_CAPS_SIZE = 24          # transport capabilities (RDMA); all zero: plain TCP


class Cmd(enum.IntEnum):
    """`enum rpc_cmd` (HELLO is always 14)."""
    ALLOC_BUFFER = 0
    GET_ALIGNMENT = 1
    GET_MAX_SIZE = 2
    BUFFER_GET_BASE = 3
    FREE_BUFFER = 4
    BUFFER_CLEAR = 5
    SET_TENSOR = 6
    SET_TENSOR_HASH = 7
    GET_TENSOR = 8
    COPY_TENSOR = 9
    GRAPH_COMPUTE = 10
    GET_DEVICE_MEMORY = 11
    INIT_TENSOR = 12
    GET_ALLOC_SIZE = 13
    HELLO = 14
    DEVICE_COUNT = 15
    GRAPH_RECOMPUTE = 16
    MEMSET_TENSOR = 17
    NONE = 18                # client-side only (events); never sent
    COUNT = 19


# struct rpc_tensor, packed
RPC_TENSOR = np.dtype([
    ("id", "<u8"), ("type", "<u4"), ("buffer", "<u8"), ("ne", "<u4", (MAX_DIMS,)), ("nb", "<u4", (MAX_DIMS,)),
    ("op", "<u4"), ("op_params", "<i4", (MAX_OP_PARAMS // 4,)), ("flags", "<i4"), ("src", "<u8", (MAX_SRC,)),
    ("view_src", "<u8"), ("view_offs", "<u8"), ("data", "<u8"), ("name", f"S{MAX_NAME}"), ("use_count", "<i4"),
])
TENSOR_SIZE = RPC_TENSOR.itemsize
assert TENSOR_SIZE == 296, TENSOR_SIZE

# Fixed request sizes (payload bytes) of the commands whose request has a fixed layout.
REQUEST_SIZE = {
    Cmd.HELLO: CONN_CAPS_SIZE,
    Cmd.DEVICE_COUNT: 0,
    Cmd.ALLOC_BUFFER: 4 + 8,                      # device u32, size u64
    Cmd.GET_ALIGNMENT: 4,
    Cmd.GET_MAX_SIZE: 4,
    Cmd.BUFFER_GET_BASE: 8,
    Cmd.FREE_BUFFER: 8,
    Cmd.BUFFER_CLEAR: 8 + 1,
    Cmd.MEMSET_TENSOR: TENSOR_SIZE + 8 + 8 + 1,
    Cmd.SET_TENSOR_HASH: TENSOR_SIZE + 8 + 8,
    Cmd.INIT_TENSOR: TENSOR_SIZE,
    Cmd.GET_TENSOR: TENSOR_SIZE + 8 + 8,
    Cmd.COPY_TENSOR: 2 * TENSOR_SIZE,
    Cmd.GRAPH_RECOMPUTE: 4,
    Cmd.GET_DEVICE_MEMORY: 4,
    Cmd.GET_ALLOC_SIZE: 4 + TENSOR_SIZE * (1 + MAX_SRC),
}
# Variable-size requests: SET_TENSOR (rpc_tensor, cache flag u8, offset u64, data) and GRAPH_COMPUTE.
SET_TENSOR_HEADER = TENSOR_SIZE + 1 + 8

# Commands that answer (the rest send nothing back): HELLO, DEVICE_COUNT, ALLOC_BUFFER, GET_ALLOC_SIZE,
# GET_ALIGNMENT, GET_MAX_SIZE, BUFFER_GET_BASE, SET_TENSOR_HASH, GET_TENSOR (the bytes asked for),
# COPY_TENSOR, GET_DEVICE_MEMORY.

U8, U32, U64 = struct.Struct("<B"), struct.Struct("<I"), struct.Struct("<Q")


def unpack_tensors(raw, n: int, offset: int = 0) -> np.ndarray:
    """n rpc_tensors from raw bytes (a structured array view, no copy)."""
    return np.frombuffer(raw, RPC_TENSOR, count=n, offset=offset)
