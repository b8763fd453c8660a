"""RWKV-5 ("Eagle"; 5.0, 5.1, 5.2): multi-head matrix-valued state, a per-head group norm, a gate from 5.1 on.

Shapes are NumPy order with ggml's in brackets: activations (n_tokens, n_embd) = ne [n_embd, n_tokens]; per
head (n_tokens, n_head, head_size) = ne [head_size, n_head, n_tokens]. Weights are model.weights[...] under
BlinkDL's names, prefix `blocks.{il}.`; the state is RwkvState(version=5): shift_att/shift_ffn (n_layer,
n_embd), wkv (n_layer, n_head, head_size, head_size) with s[i][j], i = key index, j = value index.

    x = ln0(emb[tokens])                                                        inp_embd, inp_norm
    per block il:
      xx = ln1(x);  sx = the previous token's xx (state.shift_att[il])          attn_norm-{il}
      xk = xx*att.time_mix_k + sx*(1 - att.time_mix_k); likewise xv, xr (and xg, 5.1+)
      r = att.receptance xr;  k = att.key xk;  v = att.value xv   (no sigmoid)  r-{il}, k-{il}, v-{il}
      g = silu(att.gate xg)                                        (5.1, 5.2)   g-{il}
      per head, with w = exp(-exp(att.time_decay)) and the bonus u:
        y[j] = sum_i r[i] * (u[i] * k[i] * v[j] + s[i][j]);   s[i][j] = s[i][j] * w[i] + k[i] * v[j]
                                                                                wkv-{il}
      y = norm(y per head, 64e-5) * att.ln_x.weight + att.ln_x.bias  (GroupNorm with n_head groups)
                                                                                ln_x-{il}
      x = x + att.output(y)   (5.0)  or  att.output(y * g)  (5.1, 5.2)          attn_out-{il}, ffn_inp-{il}
      channel mix as RWKV-4: x = x + sigmoid(ffn.receptance xr) * ffn.value(relu(ffn.key xk)**2)
                                                                                ffn_norm-{il}, ffn_out-{il}, l_out-{il}

Versions: 5.0 and 5.1 have one decay per head (att.time_decay (n_head,)), 5.2 one per channel (n_head,
head_size); u is att.time_faaaa as is, or exp(att.time_first) in early 5.0 files (both per head in 5.0/5.1,
per channel in 5.2). 5.0 has no gate.

The WKV is ggml's rwkv_wkv6 (RWKV-6's op, as llama.cpp's RWKV-6 graph uses it) with the decay the same for
every token: its td input is w broadcast over the tokens (RWKV-6 makes it data-dependent). Its formula is
the one above term for term, state layout included. The per-head norm is ggml_norm on (n_tokens, n_head,
head_size) rows with eps 64e-5 (as llama.cpp's RWKV-6 ln_x); RWKV-LM's GroupNorm(n_head) of y / 8 with eps
1e-5 is the same normalisation. Under `refimpl.backend("cuda")` activations and state stay on the device, the
decay and bonus are computed once per layer (see v6.py).
"""
from __future__ import annotations

import numpy as np

from ...ops import add, exp, get_rows, mul, mul_mat, norm, relu, repeat, rwkv_wkv6, scale, sigmoid, silu, sqr
from ..common import write_rows
from . import RwkvModel, layer_norm
from .state import RwkvState
from .v4 import mix, shifted
from .v6 import derived


def decay_and_bonus(model: RwkvModel, il: int) -> tuple[np.ndarray, np.ndarray]:
    """(w, u) of block il as (n_head, head_size) f32: w = exp(-exp(time_decay)) in (0, 1), u the bonus."""
    hp, a = model.hparams, f"blocks.{il}.att."
    H, N = hp.n_head, hp.head_size
    w = exp.reference(-exp.reference(model.w(a + "time_decay")))     # at load, on the host: ggml's expf
    if a + "time_faaaa" in model.weights:
        u = model.w(a + "time_faaaa")
    else:
        u = exp.reference(model.w(a + "time_first"))
    expand = lambda t: np.array(np.broadcast_to(np.asarray(t).reshape(H, -1), (H, N)), np.float32)  # noqa: E731
    return expand(w), expand(u)


def forward_seq(model: RwkvModel, tokens: np.ndarray, state: RwkvState, cap):
    """tokens (n_tokens,) int32 from `state` -> (x (n_tokens, n_embd) before ln_out, new RwkvState)."""
    hp, W = model.hparams, model.w
    eps, T, H, N = hp.norm_eps, tokens.shape[0], hp.n_head, hp.head_size
    gated = hp.variant in ("5.1", "5.2")
    new = state.copy()
    x = get_rows(W("emb.weight"), tokens)
    cap("inp_embd", x)
    x = layer_norm(x, W("blocks.0.ln0.weight"), W("blocks.0.ln0.bias"), eps)
    cap("inp_norm", x)
    for il in range(hp.n_layer):
        b, a, f = f"blocks.{il}.", f"blocks.{il}.att.", f"blocks.{il}.ffn."
        # time mix
        xx = layer_norm(x, W(b + "ln1.weight"), W(b + "ln1.bias"), eps)
        cap(f"attn_norm-{il}", xx)
        sx = shifted(xx, state.shift_att[il])
        write_rows(new.shift_att, xx[-1], il)
        r = mul_mat(W(a + "receptance.weight"), mix(xx, sx, W(a + "time_mix_r")))
        k = mul_mat(W(a + "key.weight"), mix(xx, sx, W(a + "time_mix_k")))
        v = mul_mat(W(a + "value.weight"), mix(xx, sx, W(a + "time_mix_v")))
        cap(f"r-{il}", r)
        cap(f"k-{il}", k)
        cap(f"v-{il}", v)
        if gated:
            g = silu(mul_mat(W(a + "gate.weight"), mix(xx, sx, W(a + "time_mix_g"))))
            cap(f"g-{il}", g)
        w, u = derived(W(a + "time_decay"), "decay_and_bonus", lambda: decay_and_bonus(model, il))
        td = repeat(w, (T, H, N))
        out = rwkv_wkv6(k.reshape(T, H, N), v.reshape(T, H, N), r.reshape(T, H, N), u, td,
                        state.wkv[il].reshape(1, H * N * N))
        y = out[:T].reshape(T, H, N)
        write_rows(new.wkv, out[T:].reshape(H, N, N), il)
        cap(f"wkv-{il}", y)
        hn = lambda t: derived(t, "hn", lambda: np.array(t, np.float32).reshape(H, N))  # noqa: E731
        y = add(mul(norm(y, hp.ln_x_eps), hn(W(a + "ln_x.weight"))), hn(W(a + "ln_x.bias")))
        y = y.reshape(T, H * N)
        cap(f"ln_x-{il}", y)
        if gated:
            y = mul(y, g)
        att = mul_mat(W(a + "output.weight"), y)
        cap(f"attn_out-{il}", att)
        x = add(x, att)
        cap(f"ffn_inp-{il}", x)
        # channel mix (as RWKV-4)
        xx = layer_norm(x, W(b + "ln2.weight"), W(b + "ln2.bias"), eps)
        cap(f"ffn_norm-{il}", xx)
        sx = shifted(xx, state.shift_ffn[il])
        write_rows(new.shift_ffn, xx[-1], il)
        r = sigmoid(mul_mat(W(f + "receptance.weight"), mix(xx, sx, W(f + "time_mix_r"))))
        kk = sqr(relu(mul_mat(W(f + "key.weight"), mix(xx, sx, W(f + "time_mix_k")))))
        out = mul(r, mul_mat(W(f + "value.weight"), kk))
        cap(f"ffn_out-{il}", out)
        x = add(x, out)
        if hp.rescale_every and (il + 1) % hp.rescale_every == 0:
            x = scale(x, 0.5)
        cap(f"l_out-{il}", x)
    return x, new
