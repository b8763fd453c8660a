"""RWKV-7 "Goose" as llama.cpp's `rwkv7` architecture: plain functions over refimpl's ops.

    x, state = forward_seq(model, tokens, state, capture)     # x: the last layer's output (n_tokens, n_embd)

Activations are NumPy (n_tokens, n_embd), ggml ne [n_embd, n_tokens]; per-head tensors (n_tokens, n_head,
head_size), ne [head_size, n_head, n_tokens], the layout rwkv_wkv7 takes.

Weights are read from `model.weights`, keyed by BlinkDL's .pth names and in the .pth's layouts (NumPy
order; ggml lists the same dims reversed). The LoRA factors `att.w1` (n_embd, D_DECAY), `att.w2` (D_DECAY,
n_embd) and likewise a1/a2 (D_AAA), v1/v2 (D_MV), g1/g2 (D_GATE) are the transposes of llama.cpp's
tensors, so they are transposed here (small, never quantized); projections may stay QTensors. Vectors
(x_r .. x_g, w0, a0, v0, k_k, k_a, ffn.x_k) may be stored (1, 1, n_embd); r_k is (n_head, head_size).

The graph is llama.cpp's `llm_build_rwkv7` (src/models/rwkv7.cpp, rwkv7-base.cpp), op for op:

    x = norm(get_rows(emb, tokens))*ln0.w + ln0.b                               (blocks.0.ln0)
    per layer, with sx = shift(xn) - xn (shift: the previous token's xn, the state's for the first):
      xn  = LN(x, ln1)                                                          attn_norm-{il}
      x_c = xn + sx*x_c  for c in r w k v a g                                   (time_mix_lerp_fused)
      r, k, v = mul_mat(R, x_r), mul_mat(K, x_k), mul_mat(V, x_v)
      w   = exp(-0.606531 * sigmoid(w0 + w2·tanh(w1·x_w)))          the decay, in (exp(-e^-0.5), 1)
      v   = v + (v_first - v) * sigmoid(v0 + v2·(v1·x_v))           layers > 0; v_first = layer 0's v
      g   = g2·sigmoid(g1·x_g);   a = sigmoid(a0 + a2·(a1·x_a))     gate, in-context learning rate
      kk  = l2_norm(k*k_k per head, 1e-12);   k = k + (a*(k*k_a) - k*k_a)
      y   = rwkv_wkv7(r, w, k, v, -kk, kk*a, state)
      y   = norm(y per head, 64e-5)*ln_x.w + ln_x.b + v * sum_head(k*r*r_k)     (the "bonus")
      x   = x + mul_mat(O, y*g)                                                 ffn_inp-{il}
      xn  = LN(x, ln2)                                                          ffn_norm-{il}
      x   = x + mul_mat(fV, relu(mul_mat(fK, xn + sx*ffn.x_k))^2)               l_out-{il}

BlinkDL writes the decay as exp(-exp(-softplus(-(w0 + ...)) - 0.5)); that is the same number, since
exp(-softplus(-z)) = sigmoid(z) and exp(-0.5) = 0.606531 (llama.cpp's constant, used here as f32).

State (RwkvState, version 7): shift_att/shift_ffn (n_layer, n_embd) are the last token's xn of time-mix
and channel-mix; wkv (n_layer, n_head, head_size, head_size) is rwkv_wkv7's s[i][j], i = VALUE index,
j = key index (the transpose of v6's layout). Capture names are llama.cpp's (`inp_embd`, `attn_norm-{il}`,
`ffn_inp-{il}`, `ffn_norm-{il}`, `l_out-{il}`) plus, as for the other versions, `inp_norm`, `r-`, `w-` (the
decay), `k-` (before the k_a update), `v-` (after the value residual), `a-`, `g-`, all (n_tokens, n_embd);
`kk-{il}` (n_tokens, n_head, head_size), `wkv-{il}` (rwkv_wkv7's output, same shape), `ln_x-`, `attn_out-`
and `ffn_out-{il}`.

Hyper-parameters read from model.hparams: n_layer, n_embd, n_head, head_size, norm_eps (default 1e-5),
ln_x_eps (default 64e-5). A checkpoint without att.g1/g2 runs ungated (llama.cpp's has_gating).
Under `refimpl.backend("cuda")` activations and state stay on the device, as for RWKV-6 (v6.py).
"""
from __future__ import annotations

import numpy as np

from ...ops import (add, exp, l2_norm, mul, neg, relu, repeat, rwkv_wkv7, scale, sigmoid, sqr, sub, sum_rows, tanh)
from ...ops import mul_mat
from ..common import write_rows
from .state import RwkvState
from .v6 import (GROUP_NORM_EPS, LAYER_NORM_EPS, capture_fn, check_tokens, derived, dims, embed, group_norm_heads,
                 hparam, layer_norm, lora_t, mat, token_shift, vec, vec_f32)

DECAY_SCALE = -0.606531       # -exp(-0.5), as llama.cpp writes it
KK_EPS = 1e-12                # l2_norm eps of kk (F.normalize's default)


def lora(w: dict, name: str, x: np.ndarray, mid=None) -> np.ndarray:
    """name2 · mid(name1 · x) with the .pth factors name1 (n_embd, D), name2 (D, n_out); mid None: identity."""
    h = mul_mat(lora_t(w[name + "1"]), x)
    if mid is not None:
        h = mid(h)
    return mul_mat(lora_t(w[name + "2"]), h)


def time_mix(x: np.ndarray, sx: np.ndarray, w: dict, p: str, n_head: int, head_size: int,
             wkv: np.ndarray, v_first: np.ndarray | None, cap, il: int, ln_x_eps: float = GROUP_NORM_EPS):
    """RWKV-7 time mixing of xn (n_tokens, n_embd) with sx = x_prev - xn; wkv (n_head, head_size,
    head_size) is this layer's state in, v_first layer 0's values (None at layer 0).
    Returns (output (n_tokens, n_embd), new wkv state, v_first)."""
    T, C = x.shape
    gated = p + "g1" in w
    names = "rwkvag" if gated else "rwkva"
    n = len(names)
    lerps = tuple(w[p + f"x_{c}"] for c in names)
    lerp = derived(lerps, "lerp", lambda: np.stack([vec_f32(m) for m in lerps]).reshape(n, 1, 1, C))
    sx_rep = repeat(sx.reshape(1, 1, T, C), (n, 1, T, C))                         # ggml_repeat
    xxx = add(mul(sx_rep, lerp), x)                                              # (n, 1, T, n_embd)
    xr, xw, xk, xv, xa = (xxx[i, 0] for i in range(5))

    r = mul_mat(mat(w[p + "receptance.weight"]), xr)
    dw = add(lora(w, p + "w", xw, tanh), vec(w[p + "w0"]))
    dw = exp(scale(sigmoid(dw), DECAY_SCALE))
    k = mul_mat(mat(w[p + "key.weight"]), xk)
    v = mul_mat(mat(w[p + "value.weight"]), xv)
    if v_first is None:
        v_first = v
    else:
        mix = sigmoid(add(lora(w, p + "v", xv), vec(w[p + "v0"])))
        v = add(v, mul(sub(v_first, v), mix))
    g = lora(w, p + "g", xxx[5, 0], sigmoid) if gated else None
    a = sigmoid(add(lora(w, p + "a", xa), vec(w[p + "a0"])))
    for n, t in (("r", r), ("w", dw), ("k", k), ("v", v), ("a", a)) + ((("g", g),) if gated else ()):
        cap(f"{n}-{il}", t)

    shp = (T, n_head, head_size)
    kk = l2_norm(mul(k, vec(w[p + "k_k"])).reshape(shp), KK_EPS)
    cap(f"kk-{il}", kk)
    ka = mul(k, vec(w[p + "k_a"]))
    k = add(k, sub(mul(a, ka), ka))

    r3, k3, v3, a3 = (t.reshape(shp) for t in (r, k, v, a))
    out = rwkv_wkv7(r3, dw.reshape(shp), k3, v3, neg(kk), mul(kk, a3), wkv.reshape(1, -1))
    y = out[:T].reshape(shp)
    new_wkv = out[T:].reshape(n_head, head_size, head_size)
    cap(f"wkv-{il}", y)
    y = group_norm_heads(y, w[p + "ln_x.weight"], w[p + "ln_x.bias"], ln_x_eps)
    cap(f"ln_x-{il}", y)
    rk = sum_rows(mul(mul(k3, r3), vec(w[p + "r_k"]).reshape(n_head, head_size)))   # (T, n_head, 1)
    y = add(y, mul(v3, rk).reshape(T, C))
    if gated:
        y = mul(y, g)
    y = mul_mat(mat(w[p + "output.weight"]), y)
    cap(f"attn_out-{il}", y)
    return y, new_wkv, v_first


def channel_mix(x: np.ndarray, sx: np.ndarray, w: dict, p: str) -> np.ndarray:
    """RWKV-7 channel mixing: V relu(K x_k)^2 with x_k = xn + sx*x_k (no receptance gate)."""
    xk = add(mul(sx, vec(w[p + "x_k"])), x)
    return mul_mat(mat(w[p + "value.weight"]), sqr(relu(mul_mat(mat(w[p + "key.weight"]), xk))))


def forward_seq(model, tokens, state: RwkvState | None, capture=None) -> tuple[np.ndarray, RwkvState]:
    """Run `tokens` (any number) after `state` (None: a fresh one); returns the last layer's output
    (n_tokens, n_embd) f32, before ln_out, and the new state (the given one is not modified)."""
    n_layer, n_embd, n_head, head_size = dims(model)
    hp, w = model.hparams, model.weights
    eps = float(hparam(hp, "norm_eps", LAYER_NORM_EPS))
    ln_x_eps = float(hparam(hp, "ln_x_eps", GROUP_NORM_EPS))
    cap = capture_fn(capture)
    tokens = check_tokens(model, tokens)
    state = (RwkvState.zeros(7, n_layer, n_embd, n_head, head_size) if state is None else state).copy()
    if state.version != 7 or state.wkv.shape != (n_layer, n_head, head_size, head_size):
        raise ValueError(f"state of version {state.version}, wkv {state.wkv.shape} does not fit this RWKV-7 "
                         f"model (n_layer {n_layer}, n_head {n_head}, head_size {head_size})")

    x = embed(model, tokens, eps, cap)
    v_first = None
    for il in range(n_layer):
        b = f"blocks.{il}."
        xn = layer_norm(x, w[b + "ln1.weight"], w[b + "ln1.bias"], eps)
        cap(f"attn_norm-{il}", xn)
        sx = token_shift(xn, state.shift_att[il])
        att, wkv, v_first = time_mix(xn, sx, w, b + "att.", n_head, head_size, state.wkv[il], v_first, cap, il,
                                     ln_x_eps)
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
        cap(f"l_out-{il}", x)
    return x, state
