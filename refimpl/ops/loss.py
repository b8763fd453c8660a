"""cross_entropy_loss and its gradient cross_entropy_loss_back (ggml's training ops)."""
from __future__ import annotations

import numpy as np

from ..dispatch import op
from ..shapes import fail, same_f32_rows


def _check(name, **arrays):
    same_f32_rows(name, "logits and labels must have the same shape", **arrays)


def _exp_rows(x: np.ndarray):
    """(e, sum): e = fl(exp(fl(x - max))) per row as f32 and the f64 sum of each row (ggml's soft_max pass)."""
    val = x - np.max(x, axis=-1, keepdims=True)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(val.astype(np.float64)).astype(np.float32)
    return val, e, np.sum(e, axis=-1, keepdims=True, dtype=np.float64)


@op("cross_entropy_loss")
def cross_entropy_loss(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_cross_entropy_loss: mean over rows of the cross entropy between labels b and softmax(a).

    a    ne [n_vocab, n_rows, r2, r3]   numpy (r3, r2, n_rows, n_vocab)   f32 logits, rows contiguous
    b    same ne                                                          f32 target distribution per row
    out  ne [1]                         numpy (1,)                        f32

        out = -(1/nr) * sum_rows sum_i b_i * log_softmax(a)_i,    nr = n_rows*r2*r3

    As in ggml-cpu: log_softmax = fl(a - max) - fl(logf(sum_f64 expf(a - max))), multiplied by b in f32 and
    summed per row in f64; exact mode adds the row sums in f64 (ggml-cpu: in f32, per thread) and scales
    by fl(-1/nr). ggml-cpu reads row r at r*nb1 whatever the strides of dims 2 and 3 (its kernel's TODO), so
    for views other than 2-D ones (rows at any even stride) ggml's result is not this value; refimpl computes
    the defined value for any view.
    """
    a, b = np.asarray(a), np.asarray(b)
    _check("cross_entropy_loss", a=a, b=b)
    b = b.reshape(a.shape)
    nr = a.size // a.shape[-1] if a.ndim else 1
    val, _, total = _exp_rows(a)
    lse = np.log(total.astype(np.float32).astype(np.float64)).astype(np.float32)
    st = (val - lse) * b
    rows = np.sum(st, axis=-1, dtype=np.float64).astype(np.float32)
    s = np.float32(np.sum(rows, dtype=np.float64))
    return np.array([s * (np.float32(-1.0) / np.float32(nr))], np.float32)


@op("cross_entropy_loss_back")
def cross_entropy_loss_back(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """ggml_cross_entropy_loss_back: gradient of cross_entropy_loss(b, c) with respect to the logits b.

    a    ne [1]                         numpy (1,) (any shape of one element)   f32: d loss, the upstream gradient
    b    ne [n_vocab, n_rows, r2, r3]   numpy (r3, r2, n_rows, n_vocab)         f32 logits, contiguous
    c    same ne                                                                f32 labels, contiguous
    out  b's shape, f32

        out = (softmax(b) - c) * a / nr,    nr = n_rows*r2*r3

    As in ggml-cpu: exponentials of fl(b - max) rounded to f32, their f64 sum, softmax = e * fl(1/sum), then
    fl(- c), fl(* fl(a/nr)). Exact mode takes each exp correctly rounded where ggml-cpu uses its SIMD
    polynomial (as soft_max_ext).
    """
    a, b, c = np.asarray(a), np.asarray(b), np.asarray(c)
    if a.dtype != np.float32 or a.size != 1:
        fail("cross_entropy_loss_back", "a (the loss gradient) must be one f32 value", a=a, b=b)
    _check("cross_entropy_loss_back", b=b, c=c)
    for k, x in (("b", b), ("c", c)):
        if not x.flags.c_contiguous:
            fail("cross_entropy_loss_back", f"{k} must be contiguous (ggml-cpu asserts it)", b=b, c=c)
    c = c.reshape(b.shape)
    nr = b.size // b.shape[-1] if b.ndim else 1
    _, e, total = _exp_rows(b)
    p = e * (1.0 / total).astype(np.float32)
    return (p - c) * (a.reshape(-1)[0] / np.float32(nr))
