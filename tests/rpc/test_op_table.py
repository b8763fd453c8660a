"""The server's op table against the ggml.h it claims to speak: a version change fails here, loudly,
instead of computing the wrong op."""
import pytest
import re

import numpy as np

from refimpl.rpc import ggml_ops, protocol
from refimpl.rpc.server import WIRE_TYPES

from . import _vendor


pytestmark = pytest.mark.property

def test_op_enums_are_ggml_0_25_3s():
    h = _vendor.read("ggml/include/ggml.h")
    ops = _vendor.enum(h, "ggml_op")
    assert ops[-1] == "GGML_OP_COUNT" and len(ops) - 1 == 101
    assert [o.removeprefix("GGML_OP_") for o in ops[:-1]] == list(ggml_ops.OP_NAMES)
    un = _vendor.enum(h, "ggml_unary_op")
    assert [o.removeprefix("GGML_UNARY_OP_") for o in un[:-1]] == list(ggml_ops.UNARY_NAMES)
    glu = _vendor.enum(h, "ggml_glu_op")
    assert [o.removeprefix("GGML_GLU_OP_") for o in glu[:-1]] == list(ggml_ops.GLU_NAMES)


def test_every_op_is_handled_or_listed_with_a_reason():
    for name in ggml_ops.OP_NAMES:
        assert (name in ggml_ops.OPS) + (name in ggml_ops.NO_COMPUTE) + (name in ggml_ops.NOT_COMPUTED) == 1, name
    for name in ggml_ops.UNARY_NAMES:
        assert (name in ggml_ops.UNARY) != (name in ggml_ops.UNARY_NOT_COMPUTED), name
    for name in ggml_ops.GLU_NAMES:
        assert (name in ggml_ops.GLU) != (name in ggml_ops.GLU_NOT_COMPUTED), name


def test_types_match_ggml_0_25_3s():
    h = _vendor.read("ggml/include/ggml.h")
    m = re.search(r"enum\s+ggml_type\s*\{(.*?)\};", h, re.S)
    body = re.sub(r"//[^\n]*", "", m.group(1))           # removed types are commented out
    ids = dict((k, int(v)) for k, v in re.findall(r"GGML_TYPE_(\w+)\s*=\s*(\d+)", body))
    assert ids.pop("COUNT") == 43
    assert {v: k.lower() for k, v in ids.items()} == {t: name.lower() for t, (name, _, _) in WIRE_TYPES.items()}
    common = _vendor.read("ggml/src/ggml-common.h")
    assert re.search(r"#define QK2_0 64", common) and "sizeof(ggml_half) + QK2_0 / 4" in common
    assert WIRE_TYPES[42][1:] == (64, 2 + 64 // 4)


def test_protocol_matches_ggml_rpc():
    h = _vendor.read("ggml/include/ggml-rpc.h")
    ver = tuple(int(re.search(rf"RPC_PROTO_{k}_VERSION\s+(\d+)", h).group(1)) for k in ("MAJOR", "MINOR", "PATCH"))
    assert ver == protocol.PROTO_VERSION
    src = _vendor.read("ggml/src/ggml-rpc/ggml-rpc.cpp")
    cmds = _vendor.enum(src, "rpc_cmd")
    assert [c.removeprefix("RPC_CMD_") for c in cmds] == [c.name for c in protocol.Cmd]
    # struct rpc_tensor's fields, in order, with the sizes our dtype gives them
    body = re.search(r"struct rpc_tensor \{(.*?)\};", src, re.S).group(1)
    fields = [re.match(r"\s*\w+\s+(\w+)", line).group(1) for line in body.strip().splitlines()
              if line.strip() and not line.strip().startswith("//")]
    assert fields == list(protocol.RPC_TENSOR.names)
    assert protocol.RPC_TENSOR.itemsize == 296
    tr = _vendor.read("ggml/src/ggml-rpc/transport.h")
    assert f"RPC_CONN_CAPS_SIZE = {protocol.CONN_CAPS_SIZE};" in tr


def test_param_layouts_read_as_ggml_writes_them():
    """Spot checks of op_params against ggml.c's constructors (the ones whose layout is not one value)."""
    c = _vendor.read("ggml/src/ggml.c")
    assert "int32_t params[16] = { /*n_past*/ 0, n_dims, mode, /*n_ctx*/ 0, n_ctx_orig };" in c
    for k, name in ((5, "freq_base"), (6, "freq_scale"), (7, "ext_factor"), (8, "attn_factor"),
                    (9, "beta_fast"), (10, "beta_slow")):
        assert re.search(rf"memcpy\(params \+\s*{k}, &{name},", c), name
    assert "ggml_set_op_params_i32(a, 15, n_offs);" in c
    assert "float params[] = { scale, max_bias, logit_softcap };" in c
    assert "result->src[0] = b;\n    result->src[1] = c;\n    result->src[2] = a;" in c      # set_rows' order
    assert "int32_t params[] = { nb1, nb2, nb3, offset, inplace ? 1 : 0 };" in c
    assert "int32_t params[] = { s0, s1, p0, p1, d0, d1, (is_2D ? 1 : 0) };" in c
    assert "ggml_set_op_params_i32(result, 8, 0); // not circular by default" in c
    assert "ggml_set_op_params_f32(result, 2, alpha);\n    ggml_set_op_params_f32(result, 3, limit);" in c
    p = ggml_ops.Params(np.array([3, 0, 0, 0, 0, *np.float32([2.5]).view(np.int32)] + [0] * 10, np.int32))
    assert p.i(0) == 3 and p.f(5) == 2.5
