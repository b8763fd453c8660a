"""The RWKV model's hyper-parameters and weights (the loaders in checkpoint.py and gguf_io.py build them)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import RWKVError


@dataclass(frozen=True)
class HParams:
    """Hyper-parameters, read from the tensors' shapes (checkpoints) or GGUF metadata.

    n_head, head_size are 0 for v4 (one WKV per channel, no heads). variant is the version the `rwkv` package
    would report: "4", "5.0", "5.1", "5.2", "6.0", "7.0". norm_eps is every LayerNorm's (ln0, ln1, ln2,
    ln_out: torch's default 1e-5); ln_x_eps the per-head norm's of v5-v7 (64e-5: RWKV-LM divides by
    head_size_divisor = 8 before a 1e-5 GroupNorm, the same as 1e-5 * 8**2 without the division).
    """
    n_layer: int
    n_embd: int
    n_head: int
    head_size: int
    vocab: int
    n_ffn: int
    variant: str
    norm_eps: float = 1e-5
    ln_x_eps: float = 64e-5
    rescale_every: int = 0


@dataclass
class RwkvModel:
    version: int                          # 4, 5, 6, 7 (hparams.variant has the minor version)
    hparams: HParams
    weights: dict[str, np.ndarray] = field(repr=False)
    tokenizer: Any = None
    path: str = ""

    def w(self, name: str) -> np.ndarray:
        """weights[name], with an error that names the tensor when it is missing"""
        try:
            return self.weights[name]
        except KeyError:
            raise RWKVError(f"{self.path or 'model'}: RWKV-{self.hparams.variant} tensor {name!r} is missing",
                            self.path or None) from None
