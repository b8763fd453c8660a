"""RWKV-4 ("Dove"): token shift, a per-channel exponentially decaying WKV, a squared-ReLU channel mix.

Shapes are NumPy order with ggml's in brackets: activations (n_tokens, n_embd) = ne [n_embd, n_tokens]; a
weight (n_out, n_in) = ne [n_in, n_out]. Weights are model.weights[...] under BlinkDL's names, prefix
`blocks.{il}.`; the state is RwkvState(version=4): shift_att/shift_ffn (n_layer, n_embd), wkv (n_layer, 3,
n_embd) = aa, bb, pp per layer.

    x = ln0(emb[tokens])                                                        inp_embd, inp_norm
    per block il:
      xx = ln1(x)                                                               attn_norm-{il}
      sx = the previous token's xx (state.shift_att[il] for the first token)    (token shift)
      xk = xx*att.time_mix_k + sx*(1 - att.time_mix_k); likewise xv, xr
      r = sigmoid(att.receptance xr);  k = att.key xk;  v = att.value xv        r-{il}, k-{il}, v-{il}
      wkv = WKV(k, v) per channel (below)                                       wkv-{il}
      x = x + att.output (r * wkv)                                              attn_out-{il}, ffn_inp-{il}
      xx = ln2(x);  sx = the previous token's xx (state.shift_ffn[il])          ffn_norm-{il}
      x = x + sigmoid(ffn.receptance xr) * ffn.value(relu(ffn.key xk)**2)       ffn_out-{il}, l_out-{il}
        (xk, xr mixed with ffn.time_mix_k, ffn.time_mix_r as above)

lnN(x) is LayerNorm: norm(x, 1e-5) * weight + bias. The WKV of channel c with w = -exp(time_decay[c]) < 0
and the bonus u = time_first[c] is an average of the values seen so far, weighted by exp(k) and decayed by
exp(w) per step, the current token weighted by exp(u + k) instead:

    wkv_t = (sum_{i<t} e^{(t-1-i)w + k_i} v_i + e^{u + k_t} v_t) / (sum_{i<t} e^{(t-1-i)w + k_i} + e^{u + k_t})

It is kept stable by storing numerator and denominator scaled by e^{-pp} (aa, bb) with the exponent pp:

    q = max(pp, u + k);     e1 = exp(pp - q);     e2 = exp(u + k - q);     wkv = (e1*aa + e2*v) / (e1*bb + e2)
    q = max(pp + w, k);     e1 = exp(pp + w - q); e2 = exp(k - q);         aa, bb, pp = e1*aa + e2*v, e1*bb + e2, q

(ChatRWKV's "RWKV in 150 lines", the rwkv package and transformers' CPU path compute exactly this.) A fresh
state has aa = bb = 0 and pp = -1e38, so that the first token's e1 is 0. This per-token recurrence is plain
NumPy float32, refimpl's op `rwkv_wkv4` (ggml has no element-wise maximum; rwkv.cpp builds the step from
custom map ops); a backend without a kernel for it runs it on host copies.
"""
from __future__ import annotations

import numpy as np

from ...ops import add, concat, exp, get_rows, mul, mul_mat, relu, rwkv_wkv4, scale, sigmoid, sqr
from ..common import write_rows
from . import RwkvModel, layer_norm
from .state import RwkvState
from .v6 import derived, flat


def shifted(xx: np.ndarray, prev: np.ndarray) -> np.ndarray:
    """the previous token's row for every token: prev (n_embd,) then xx[:-1] (ggml_concat)"""
    return concat(prev.reshape(1, -1), xx[:-1], 1)


def mix(xx: np.ndarray, sx: np.ndarray, m: np.ndarray) -> np.ndarray:
    """xx*m + sx*(1 - m), m (1, 1, n_embd) as stored (m and 1 - m made once per weight)"""
    one_minus = derived(m, "1-m", lambda: np.float32(1.0) - np.asarray(m, np.float32).reshape(-1))
    return add(mul(xx, flat(m)), mul(sx, one_minus))


def forward_seq(model: RwkvModel, tokens: np.ndarray, state: RwkvState, cap):
    """tokens (n_tokens,) int32 from `state` -> (x (n_tokens, n_embd) before ln_out, new RwkvState)."""
    hp, W = model.hparams, model.w
    eps = hp.norm_eps
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
        r = sigmoid(mul_mat(W(a + "receptance.weight"), mix(xx, sx, W(a + "time_mix_r"))))
        k = mul_mat(W(a + "key.weight"), mix(xx, sx, W(a + "time_mix_k")))
        v = mul_mat(W(a + "value.weight"), mix(xx, sx, W(a + "time_mix_v")))
        cap(f"r-{il}", r)
        cap(f"k-{il}", k)
        cap(f"v-{il}", v)
        td = W(a + "time_decay")
        w = derived(td, "-exp", lambda: -exp.reference(np.asarray(td, np.float32).reshape(-1)))
        out = rwkv_wkv4(k, v, w, flat(W(a + "time_first")), state.wkv[il])
        y = out[:-3]
        write_rows(new.wkv, out[-3:], il)
        cap(f"wkv-{il}", y)
        att = mul_mat(W(a + "output.weight"), mul(r, y))
        cap(f"attn_out-{il}", att)
        x = add(x, att)
        cap(f"ffn_inp-{il}", x)
        # channel mix
        xx = layer_norm(x, W(b + "ln2.weight"), W(b + "ln2.bias"), eps)
        cap(f"ffn_norm-{il}", xx)
        sx = shifted(xx, state.shift_ffn[il])
        write_rows(new.shift_ffn, xx[-1], il)
        r = sigmoid(mul_mat(W(f + "receptance.weight"), mix(xx, sx, W(f + "time_mix_r"))))
        k = sqr(relu(mul_mat(W(f + "key.weight"), mix(xx, sx, W(f + "time_mix_k")))))
        out = mul(r, mul_mat(W(f + "value.weight"), k))
        cap(f"ffn_out-{il}", out)
        x = add(x, out)
        if hp.rescale_every and (il + 1) % hp.rescale_every == 0:
            x = scale(x, 0.5)
        cap(f"l_out-{il}", x)
    return x, new
