"""Token sampling, seeded and reproducible: `Sampler(temperature, top_k, top_p, min_p, repeat_penalty, seed)`.

The chain follows llama.cpp's default order: repetition penalty over the recent tokens -> top-k -> top-p ->
min-p -> temperature -> draw. temperature <= 0 is greedy (argmax, first index on ties).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Sampler:
    temperature: float = 0.0
    top_k: int = 0              # 0: off
    top_p: float = 1.0          # 1.0: off
    min_p: float = 0.0          # 0.0: off
    repeat_penalty: float = 1.0  # 1.0: off
    repeat_last_n: int = 64
    seed: int | None = None
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self):
        if self.top_k < 0 or not 0.0 < self.top_p <= 1.0 or not 0.0 <= self.min_p <= 1.0 or self.repeat_penalty <= 0:
            raise ValueError(f"invalid sampler settings: {self}")
        self.rng = np.random.default_rng(self.seed)

    def __call__(self, logits: np.ndarray, history=()) -> int:
        return self.sample(logits, history)

    def sample(self, logits: np.ndarray, history=()) -> int:
        """One token id from a (n_vocab,) logits row; `history` = previous token ids (for the penalty)."""
        z = np.asarray(logits, dtype=np.float64).reshape(-1).copy()
        if self.repeat_penalty != 1.0 and len(history):
            recent = np.unique(np.asarray(history[-self.repeat_last_n:], dtype=np.int64))
            v = z[recent]
            z[recent] = np.where(v > 0, v / self.repeat_penalty, v * self.repeat_penalty)
        if self.temperature <= 0:
            return int(np.argmax(z))
        idx = np.argsort(-z, kind="stable")
        if self.top_k > 0:
            idx = idx[: self.top_k]
        zs = z[idx]
        p = np.exp(zs - zs[0])
        p /= p.sum()
        if self.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(p), self.top_p) + 1)
            idx, zs = idx[:keep], zs[:keep]
            p = p[:keep] / p[:keep].sum()
        if self.min_p > 0.0:
            keep = p >= self.min_p * p[0]
            idx, zs = idx[keep], zs[keep]
        zs = zs / self.temperature
        p = np.exp(zs - zs.max())
        p /= p.sum()
        return int(idx[self.rng.choice(len(idx), p=p)])
