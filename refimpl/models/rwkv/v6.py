"""RWKV-6 "Finch" as llama.cpp's `rwkv6` architecture: plain functions over refimpl's ops.

    x, state = forward_seq(model, tokens, state, capture)     # x: the last layer's output (n_tokens, n_embd)

Activations are NumPy (n_tokens, n_embd), ggml ne [n_embd, n_tokens]; per-head tensors (n_tokens, n_head,
head_size), ne [head_size, n_head, n_tokens], the layout rwkv_wkv6 takes.

Weights are read from `model.weights`, keyed by BlinkDL's .pth names and in the .pth's layouts (NumPy
order; ggml lists the same dims reversed): `blocks.{i}.att.key.weight` (n_embd, n_embd) is ne [n_embd,
n_embd]; the token-shift LoRA `time_maa_w1` is (n_embd, 5*D_MIX) and `time_maa_w2` (5, D_MIX, n_embd), the
decay LoRA `time_decay_w1` (n_embd, D_DECAY) and `time_decay_w2` (D_DECAY, n_embd) -- these four are the
transposes of what llama.cpp stores, so they are transposed here (they are small and never quantized);
every projection matrix may stay a QTensor. Vectors may be stored (1, 1, n_embd) as in the .pth.

The graph is llama.cpp's `llm_build_rwkv6` (src/models/rwkv6.cpp, rwkv6-base.cpp), op for op:

    x = norm(get_rows(emb, tokens))*ln0.w + ln0.b                               (blocks.0.ln0)
    per layer, with sx = shift(xn) - xn, shift(xn) = [last token's xn of the previous call, xn[:-1]]:
      xn  = LN(x, ln1)                                                          attn_norm-{il}
      m   = mul_mat(w2, tanh(mul_mat(w1, xn + sx*maa_x)))  per mix (5, n_tokens, n_embd), order w k v r g
      x_* = xn + sx*(maa_* + m_*)                                               the five token-shift mixes
      r, k, v = mul_mat(R, x_r), mul_mat(K, x_k), mul_mat(V, x_v);  g = silu(mul_mat(G, x_g))
      w   = exp(-exp(time_decay + mul_mat(decay_w2, tanh(mul_mat(decay_w1, x_w)))))
      y   = rwkv_wkv6(k, v, r, time_faaaa, w, state)                            (per head: u bonus, w decay)
      y   = norm(y per head, 64e-5)*ln_x.w + ln_x.b;   x = x + mul_mat(O, y*g)  ffn_inp-{il}
      xn  = LN(x, ln2)                                                          ffn_norm-{il}
      x   = x + sigmoid(mul_mat(fR, xn + sx*maa_r)) * mul_mat(fV, relu(mul_mat(fK, xn + sx*maa_k))^2)
                                                                                l_out-{il}

The group norm "ln_x" is ggml_norm over each head's head_size values, eps 64e-5 (BlinkDL's F.group_norm
with n_head groups). `rescale_every` (hparams, default 0): llama.cpp's converter divides att.output and
ffn.value of layer i by 2**(i // rescale_every) and its graph halves x after every rescale_every-th layer
(RWKV's fp16 trick); a GGUF loaded through gguf_io keeps its weights as stored, so the same halving is
applied here when hparams say so.

State (refimpl.models.rwkv.state.RwkvState, version 6): shift_att/shift_ffn (n_layer, n_embd) are the last
token's normalised inputs xn of time-mix and channel-mix; wkv (n_layer, n_head, head_size, head_size) is
rwkv_wkv6's s[i][j], i = key index, j = value index. Capture names are llama.cpp's (`inp_embd`,
`attn_norm-{il}`, `ffn_inp-{il}`, `ffn_norm-{il}`, `l_out-{il}`) plus, as for the other versions, `inp_norm`
(after ln0), `r-`, `k-`, `v-`, `g-` (after silu), `w-` (the decay exp(-exp(.))), all (n_tokens, n_embd);
`wkv-{il}` (rwkv_wkv6's output, (n_tokens, n_head, head_size)), `ln_x-`, `attn_out-` (time mixing's output)
and `ffn_out-{il}` (channel mixing's).

Hyper-parameters read from model.hparams: n_layer, n_embd, n_head, head_size, norm_eps (ln0/ln1/ln2, default
1e-5), ln_x_eps (default 64e-5), rescale_every (default 0).

What the graph derives from the weights (transposed LoRA factors, flattened vectors, stacked mixes) is
computed once per weight (`derived`), read-only, so a backend keeps one copy of it as of any weight; the state
is written with set_rows (`write_rows`) into the copy `RwkvState.copy` makes where the backend keeps state.
"""
from __future__ import annotations

import weakref
from typing import Callable

import numpy as np

from ...ops import (add, concat, cont, exp, get_rows, mul, neg, norm, permute, relu, rwkv_wkv6, scale, sigmoid,
                    silu, sqr, sub, tanh)
from ...ops import mul_mat
from ...qtensor import QTensor, dequantize
from ..common import capture_fn, write_rows
from ..common import layer_norm as common_layer_norm
from .state import RwkvState

GROUP_NORM_EPS = 64e-5        # ln_x: llama.cpp and BlinkDL both use 64e-5 (the head-wise group norm)
LAYER_NORM_EPS = 1e-5         # ln0/ln1/ln2/ln_out when hparams carry none (BlinkDL's F.layer_norm default)


# -- weights derived once (shared with v4, v5, v7) -------------------------------------------------------

_DERIVED: dict[tuple, object] = {}


def derived(sources, kind: str, fn: Callable):
    """fn() for the weight(s) `sources`, computed once per (kind, source arrays) and kept read-only (so a
    backend may keep one copy of it, as of any weight). The entry holds weak references to its sources, is
    served only while they are the same objects, and is dropped when any of them is freed (so a later array
    reusing an id never gets it)."""
    srcs = sources if isinstance(sources, tuple) else (sources,)
    key = (kind,) + tuple(id(s) for s in srcs)
    hit = _DERIVED.get(key)
    if hit is None or not all(r() is x for r, x in zip(hit[0], srcs)):
        refs = tuple(weakref.ref(x) for x in srcs)     # ndarrays and QTensors: every weight takes a weak reference
        value = fn()
        for a in value if isinstance(value, tuple) else (value,):
            if isinstance(a, np.ndarray):
                a.flags.writeable = False
        hit = _DERIVED[key] = (refs, value)
        for x in srcs:                                 # dropped when any source is freed, before its id is reused
            weakref.finalize(x, _DERIVED.pop, key, None)
    return hit[1]


# -- helpers shared with v7 -----------------------------------------------------------------------------

def vec(x) -> np.ndarray:
    """A stored vector ((1, 1, n) or (n,), any float type or a QTensor) as a flat f32 array (n,), made once."""
    return derived(x, "vec", lambda: vec_f32(x))


def flat(x):
    """A stored f32 vector's values as a flat array (n,) of its own, made once."""
    return derived(x, "flat", lambda: np.array(x, dtype=np.float32).reshape(-1))


def vec_f32(x) -> np.ndarray:
    """A stored vector's values as a flat f32 array of its own (a quantized one dequantized)."""
    if isinstance(x, QTensor):
        x = dequantize(x)
    return np.array(x, dtype=np.float32).reshape(-1)


def mat(x):
    """A projection matrix as mul_mat takes it: a QTensor or an f32/f16 ndarray unchanged (so quantized
    GGUF weights stay quantized), any other float type (bf16 from a .pth) converted to f32."""
    if isinstance(x, QTensor) or np.asarray(x).dtype in (np.float32, np.float16):
        return x
    return derived(x, "mat", lambda: np.asarray(x, dtype=np.float32))


def lora_t(x) -> np.ndarray:
    """A BlinkDL LoRA factor stored (n_in, n_out) as the mul_mat weight (n_out, n_in) (ne [n_in, n_out]):
    transposed, contiguous; f16 stays f16 (a transpose is exact), QTensors are dequantized first. Made once
    per weight (`derived`)."""
    return derived(x, "lora_t", lambda: _lora_t(x))


def _lora_t(x) -> np.ndarray:
    if isinstance(x, QTensor):
        x = dequantize(x)
    x = np.asarray(x)
    if x.dtype not in (np.float32, np.float16):
        x = x.astype(np.float32)
    return np.ascontiguousarray(np.swapaxes(x, -1, -2))


def layer_norm(x: np.ndarray, w, b, eps: float) -> np.ndarray:
    """llama.cpp's LLM_NORM (models.common.layer_norm) with the weight and bias as flat vectors."""
    return common_layer_norm(x, vec(w), vec(b), eps)


def token_shift(xn: np.ndarray, last: np.ndarray) -> np.ndarray:
    """sx = x_prev - xn with x_prev = [last, xn[:-1]] (ggml_concat along the token dim, then ggml_sub).
    xn (n_tokens, n_embd), last (n_embd,) -> (n_tokens, n_embd)."""
    x_prev = concat(last.reshape(1, -1), xn[:-1], 1)                     # the state is f32
    return sub(x_prev, xn)


def hparam(hp, name: str, default):
    v = getattr(hp, name, None)
    return default if v is None else v


def dims(model) -> tuple[int, int, int, int]:
    """(n_layer, n_embd, n_head, head_size) from model.hparams."""
    hp = model.hparams
    n_embd, head_size = int(hp.n_embd), int(hp.head_size)
    n_head = int(hparam(hp, "n_head", n_embd // head_size))
    return int(hp.n_layer), n_embd, n_head, head_size


def check_tokens(model, tokens) -> np.ndarray:
    tokens = np.asarray(tokens, dtype=np.int32).reshape(-1)
    if tokens.size == 0:
        raise ValueError("forward: no tokens")
    n_vocab = int(model.weights["emb.weight"].shape[0])
    if tokens.min() < 0 or tokens.max() >= n_vocab:
        raise ValueError(f"forward: token id out of range [0, {n_vocab})")
    return tokens


def embed(model, tokens: np.ndarray, eps: float, cap) -> np.ndarray:
    """get_rows of the embedding, then blocks.0.ln0 (llama.cpp's tok_norm): (n_tokens, n_embd) f32."""
    w = model.weights
    x = get_rows(w["emb.weight"], tokens)
    cap("inp_embd", x)
    x = layer_norm(x, w["blocks.0.ln0.weight"], w["blocks.0.ln0.bias"], eps)
    cap("inp_norm", x)
    return x


def group_norm_heads(y: np.ndarray, w, b, eps: float = GROUP_NORM_EPS) -> np.ndarray:
    """ln_x: ggml_norm over each head's head_size values (eps 64e-5), then * ln_x.w + ln_x.b.
    y (n_tokens, n_head, head_size) -> (n_tokens, n_embd)."""
    T = y.shape[0]
    return add(mul(norm(y, eps).reshape(T, -1), vec(w)), vec(b))


# -- RWKV-6 ---------------------------------------------------------------------------------------------

def time_mix(x: np.ndarray, sx: np.ndarray, w: dict, p: str, n_head: int, head_size: int,
             wkv: np.ndarray, cap, il: int, ln_x_eps: float = GROUP_NORM_EPS) -> tuple[np.ndarray, np.ndarray]:
    """RWKV-6 time mixing of xn (n_tokens, n_embd) with sx = x_prev - xn; wkv (n_head, head_size, head_size)
    is this layer's state in. Returns (output (n_tokens, n_embd), new wkv state)."""
    T, C = x.shape
    # data-dependent token shift: five LoRA-made mixes, llama.cpp's fused form
    xxx = add(mul(sx, vec(w[p + "time_maa_x"])), x)
    w1 = lora_t(w[p + "time_maa_w1"])                                   # (5*D_MIX, n_embd)  ne [n_embd, 5*D]
    d_mix = w1.shape[0] // 5
    xxx = tanh(mul_mat(w1, xxx)).reshape(T, 5, 1, d_mix)                # ne [D, 1, 5, T]
    xxx = cont(permute(xxx, 0, 1, 3, 2))                                # (5, T, 1, D)
    w2 = derived(w[p + "time_maa_w2"], "maa_w2",                        # ne [D, n_embd, 1, 5]
                 lambda: lora_t(w[p + "time_maa_w2"]).reshape(5, 1, C, d_mix))
    xxx = mul_mat(w2, xxx)                                              # (5, T, 1, n_embd)
    maa = tuple(w[p + f"time_maa_{c}"] for c in "wkvrg")
    lerp = derived(maa, "lerp", lambda: np.stack([vec_f32(m) for m in maa]).reshape(5, 1, 1, C))
    xxx = add(mul(add(xxx, lerp), sx.reshape(T, 1, C)), x.reshape(T, 1, C))
    xw, xk, xv, xr, xg = (xxx[i].reshape(T, C) for i in range(5))

    r = mul_mat(mat(w[p + "receptance.weight"]), xr)
    k = mul_mat(mat(w[p + "key.weight"]), xk)
    v = mul_mat(mat(w[p + "value.weight"]), xv)
    g = silu(mul_mat(mat(w[p + "gate.weight"]), xg))
    cap(f"r-{il}", r)
    cap(f"k-{il}", k)
    cap(f"v-{il}", v)
    cap(f"g-{il}", g)

    # data-dependent decay: w = exp(-exp(time_decay + LoRA(x_w)))
    dw = mul_mat(lora_t(w[p + "time_decay_w2"]), tanh(mul_mat(lora_t(w[p + "time_decay_w1"]), xw)))
    dw = exp(neg(exp(add(dw, vec(w[p + "time_decay"])))))
    cap(f"w-{il}", dw)

    shp = (T, n_head, head_size)
    u = vec(w[p + "time_faaaa"]).reshape(n_head, head_size)
    out = rwkv_wkv6(k.reshape(shp), v.reshape(shp), r.reshape(shp), u, dw.reshape(shp),
                    wkv.reshape(1, -1))
    y = out[:T].reshape(shp)
    new_wkv = out[T:].reshape(n_head, head_size, head_size)
    cap(f"wkv-{il}", y)
    y = group_norm_heads(y, w[p + "ln_x.weight"], w[p + "ln_x.bias"], ln_x_eps)
    cap(f"ln_x-{il}", y)
    y = mul_mat(mat(w[p + "output.weight"]), mul(y, g))
    cap(f"attn_out-{il}", y)
    return y, new_wkv


def channel_mix(x: np.ndarray, sx: np.ndarray, w: dict, p: str) -> np.ndarray:
    """RWKV-6 channel mixing: sigmoid(R x_r) * V relu(K x_k)^2, x_* = xn + sx*maa_*."""
    xk = add(mul(sx, vec(w[p + "time_maa_k"])), x)
    xr = add(mul(sx, vec(w[p + "time_maa_r"])), x)
    r = sigmoid(mul_mat(mat(w[p + "receptance.weight"]), xr))
    k = sqr(relu(mul_mat(mat(w[p + "key.weight"]), xk)))
    return mul(r, mul_mat(mat(w[p + "value.weight"]), k))


def forward_seq(model, tokens, state: RwkvState | None, capture=None) -> tuple[np.ndarray, RwkvState]:
    """Run `tokens` (any number) after `state` (None: a fresh one); returns the last layer's output
    (n_tokens, n_embd) f32, before ln_out, and the new state (the given one is not modified)."""
    n_layer, n_embd, n_head, head_size = dims(model)
    hp, w = model.hparams, model.weights
    eps = float(hparam(hp, "norm_eps", LAYER_NORM_EPS))
    rescale = int(hparam(hp, "rescale_every", 0))
    ln_x_eps = float(hparam(hp, "ln_x_eps", GROUP_NORM_EPS))
    cap = capture_fn(capture)
    tokens = check_tokens(model, tokens)
    state = (RwkvState.zeros(6, n_layer, n_embd, n_head, head_size) if state is None else state).copy()
    if state.version != 6 or state.wkv.shape != (n_layer, n_head, head_size, head_size):
        raise ValueError(f"state of version {state.version}, wkv {state.wkv.shape} does not fit this RWKV-6 "
                         f"model (n_layer {n_layer}, n_head {n_head}, head_size {head_size})")

    x = embed(model, tokens, eps, cap)
    for il in range(n_layer):
        b = f"blocks.{il}."
        xn = layer_norm(x, w[b + "ln1.weight"], w[b + "ln1.bias"], eps)
        cap(f"attn_norm-{il}", xn)
        sx = token_shift(xn, state.shift_att[il])
        att, wkv = time_mix(xn, sx, w, b + "att.", n_head, head_size, state.wkv[il], cap, il, ln_x_eps)
        write_rows(state.wkv, wkv, il)
        write_rows(state.shift_att, xn[-1], il)
        x = add(att, x)
        cap(f"ffn_inp-{il}", x)
        xn = layer_norm(x, w[b + "ln2.weight"], w[b + "ln2.bias"], eps)
        cap(f"ffn_norm-{il}", xn)
        sx = token_shift(xn, state.shift_ffn[il])
        ffn = channel_mix(xn, sx, w, b + "ffn.")
        cap(f"ffn_out-{il}", ffn)
        write_rows(state.shift_ffn, xn[-1], il)
        x = add(ffn, x)
        if rescale > 0 and (il + 1) % rescale == 0:
            x = scale(x, 0.5)
        cap(f"l_out-{il}", x)
    return x, state

