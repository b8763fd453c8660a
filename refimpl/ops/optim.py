"""opt_step_adamw and opt_step_sgd: ggml's optimizer steps (the last nodes of a ggml training graph).

In ggml both update their operands in place (the node is a view of the weights a; AdamW also rewrites its
moments m and v). refimpl returns the new values instead and leaves its inputs alone.
"""
from __future__ import annotations

import numpy as np

from ..dispatch import op
from ..rounding import fma32
from ..shapes import fail, same_f32_rows

f32 = np.float32


def _check(name: str, params: np.ndarray, n_params: int, **arrays) -> None:
    same_f32_rows(name, **arrays)
    if params.dtype != np.float32 or params.size != n_params:
        fail(name, f"the params tensor must hold {n_params} f32 values, got {params.size} {params.dtype}",
             params=params)


@op("opt_step_adamw")
def opt_step_adamw(a: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray,
                   adamw_params: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml_opt_step_adamw(ctx, a, grad, m, v, adamw_params): one AdamW step (decoupled weight decay).

    a             ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32 weights, rows contiguous
    grad, m, v    a's ne                                        f32 gradient, first and second moments
    adamw_params  ne [7]                numpy (7,)              f32 [alpha, beta1, beta2, eps, wd, beta1h, beta2h]
    out           (a', m', v'), each a's shape, f32

        m' = m*beta1 + g*(1 - beta1)          v' = v*beta2 + g*g*(1 - beta2)
        a' = a*(1 - alpha*wd) - alpha * (m'*beta1h) / (sqrtf(v'*beta2h) + eps)

    beta1h, beta2h are the bias corrections 1/(1 - beta^t) the caller computes (ggml_opt does). f32 steps
    in ggml-cpu's order, the first product of each sum fused into it (one FMA, as GCC compiles the kernel:
    bit-identical to ggml-cpu). ggml writes a', m', v' over a, m, v; refimpl returns them.
    """
    a, grad, m, v, p = (np.asarray(x) for x in (a, grad, m, v, adamw_params))
    _check("opt_step_adamw", p, 7, a=a, grad=grad, m=m, v=v)
    alpha, beta1, beta2, eps, wd, beta1h, beta2h = (f32(x) for x in p.reshape(-1))
    keep = f32(1) - alpha * wd
    g = grad.reshape(a.shape)
    with np.errstate(all="ignore"):
        m2 = fma32(m.reshape(a.shape), beta1, g * (f32(1) - beta1))
        v2 = fma32(v.reshape(a.shape), beta2, g * g * (f32(1) - beta2))
        mh = m2 * beta1h
        vh = np.sqrt(v2 * beta2h) + eps
        return fma32(a, keep, -(alpha * mh / vh)), m2, v2


@op("opt_step_sgd")
def opt_step_sgd(a: np.ndarray, grad: np.ndarray, sgd_params: np.ndarray) -> np.ndarray:
    """ggml_opt_step_sgd(ctx, a, grad, sgd_params): one SGD step with weight decay (ggml 0.25.3).

    a           ne [n0, n1, n2, n3]   numpy (n3, n2, n1, n0)   f32 weights, rows contiguous
    grad        a's ne                                        f32
    sgd_params  ne [2]                numpy (2,)              f32 [alpha, wd]
    out         a's shape, f32

        a' = fma(a, 1 - alpha*wd, -(alpha*g))        (f32 steps, one FMA as GCC compiles ggml-cpu's loop)

    ggml writes a' over a; refimpl returns it.
    """
    a, grad, p = (np.asarray(x) for x in (a, grad, sgd_params))
    _check("opt_step_sgd", p, 2, a=a, grad=grad)
    alpha, wd = (f32(x) for x in p.reshape(-1))
    with np.errstate(all="ignore"):
        return fma32(a, f32(1) - alpha * wd, -(alpha * grad.reshape(a.shape)))
