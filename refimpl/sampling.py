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


# -- entropix: entropy- and varentropy-adaptive sampling ---------------------------------------------------------
#
# After xjdr-alt/entropix's sampler (its SamplerConfig defaults below, its strategies and their order), written
# from its description: per step the logits' entropy and varentropy (bits) and, from the attention of the last
# layer at the new position, the heads' mean entropy, the variance of the entropy across heads, their agreement
# (mean |p_head - mean_head p|) and the interaction strength (mean |score|), then one of five strategies. Where
# entropix's code does not do what it says, refimpl does what it says, and the docs list the differences:
# its min-p mask is computed on logits it no longer reads (no effect) and its top-p runs over the top-k in
# ascending order (it would drop the likeliest tokens); here min-p filters the tempered probabilities and top-p
# is the usual nucleus. The "clarifying question" token entropix inserts (2564, a Llama 3 id) is a setting
# (`clarifying_token`), off by default: that branch then samples as entropix does after inserting it.

LN_2 = float(np.log(2.0))


@dataclass(frozen=True)
class EntropixConfig:
    """entropix's SamplerConfig, its defaults."""
    temp: float = 0.666
    top_p: float = 0.90
    top_k: int = 27
    min_p: float = 0.03
    low_ent_thresh: float = 0.1
    low_vent_thresh: float = 0.1
    med_ent_thresh: float = 3.0
    high_ent_thresh: float = 5.0
    high_vent_thresh: float = 5.0
    helv_attn_ent_offset: float = 1.3
    helv_attn_ent_coef: float = 0.2
    lehv_interaction_strength_offset: float = 1.2
    lehv_interaction_strength_coef: float = 0.3
    hehv_attn_ent_coef: float = 0.2
    hehv_attn_vent_offset: float = 2.0
    hehv_attn_vent_coef: float = 0.5
    n_adaptive_samples: int = 5
    ada_temp_logits: float = 0.3
    ada_temp_attn: float = 0.2
    ada_temp_agree: float = 0.2
    ada_top_p: float = 0.1
    ada_top_k_int: float = 0.3
    ada_top_k_agree: float = 0.2
    ada_min_p: float = 0.5
    ada_score_logits_ent: float = 0.1
    ada_score_attn_ent: float = 0.2
    ada_score_logits_vent: float = 0.3
    ada_score_attn_vent: float = 0.4
    ada_score_agree: float = 0.5
    ada_score_int: float = 0.6
    clarifying_token: int | None = None


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def entropix_metrics(logits: np.ndarray, scores: np.ndarray) -> dict:
    """The six numbers entropix decides on, in f64.

    logits  (n_vocab,) the next token's logits
    scores  (n_head, n_kv) the last layer's attention logits at the new position (scaled K.Q, the causal mask's
            -inf cells already removed): its softmax over the cells is each head's attention

    logits_entropy     H = -sum p log2 p                     logits_varentropy  sum p (log2 p + H)^2
    attn_entropy       mean over heads of -sum a log2 a (a clipped to [1e-10, 1] inside the log)
    attn_varentropy    variance over heads of that entropy (population variance)
    agreement          mean over heads and cells of |a - mean over heads of a|
    interaction_strength  mean of |scores|
    """
    lp = _log_softmax(np.asarray(logits, np.float64).reshape(-1))
    p = np.exp(lp)
    ent = float(-(p * lp).sum() / LN_2)
    vent = float((p * (lp / LN_2 + ent) ** 2).sum())
    s = np.asarray(scores, np.float64)
    if s.ndim != 2 or s.shape[1] == 0:
        raise ValueError(f"entropix_metrics: scores must be (n_head, n_kv), got shape {s.shape}")
    a = np.exp(_log_softmax(s))
    h = -(a * np.log2(np.clip(a, 1e-10, 1.0))).sum(axis=-1)              # per head
    agreement = float(np.abs(a - a.mean(axis=0, keepdims=True)).mean())
    return {"logits_entropy": ent, "logits_varentropy": vent, "attn_entropy": float(h.mean()),
            "attn_varentropy": float(h.var()), "agreement": agreement,
            "interaction_strength": float(np.abs(s).mean())}


@dataclass
class EntropixSampler:
    """entropix's adaptive sampler: `sample(logits, history, scores)` -> token id; `last` holds the step's
    metrics, the strategy taken and the settings it used (what `--show-metrics` prints). Seeded (`seed`):
    the same logits and scores give the same tokens."""
    config: EntropixConfig = field(default_factory=EntropixConfig)
    seed: int | None = None
    needs_attention = True
    rng: np.random.Generator = field(init=False, repr=False)
    last: dict = field(init=False, default_factory=dict)

    def __post_init__(self):
        self.rng = np.random.default_rng(self.seed)

    def _draw(self, lp: np.ndarray, temperature: float, top_p: float, top_k: int, min_p: float) -> int:
        """One token from log-probabilities lp: tempered, top-k, then the nucleus top_p, then min-p."""
        z = lp / max(float(temperature), 1e-6)
        idx = np.argsort(-z, kind="stable")[: max(1, int(top_k))]
        p = np.exp(z[idx] - z[idx[0]])
        p /= p.sum()
        keep = int(np.searchsorted(np.cumsum(p), top_p) + 1) if top_p < 1.0 else len(p)
        idx, p = idx[:keep], p[:keep]
        if min_p > 0.0:
            ok = p >= min_p * p[0]
            idx, p = idx[ok], p[ok]
        p = p / p.sum()
        return int(idx[self.rng.choice(len(idx), p=p)])

    def sample(self, logits: np.ndarray, history=(), scores: np.ndarray | None = None) -> int:
        if scores is None:
            raise ValueError("EntropixSampler.sample needs the attention scores of the last layer (scores=)")
        c = self.config
        m = entropix_metrics(logits, scores)
        ent, vent = m["logits_entropy"], m["logits_varentropy"]
        attn_ent, attn_vent = m["attn_entropy"], m["attn_varentropy"]
        agree, inter = m["agreement"], m["interaction_strength"]
        lp = _log_softmax(np.asarray(logits, np.float64).reshape(-1))
        if ent < c.low_ent_thresh and vent < c.low_vent_thresh:
            strategy, settings = "argmax", {}
            token = int(np.argmax(lp))
        elif ent > c.high_ent_thresh and vent < c.low_vent_thresh:
            strategy = "clarify"
            if c.clarifying_token is not None and (not len(history) or history[-1] != c.clarifying_token):
                settings, token = {}, int(c.clarifying_token)
            else:
                t = min(1.5, c.temp * (c.helv_attn_ent_offset + c.helv_attn_ent_coef * attn_ent))
                settings = dict(temperature=t, top_p=c.top_p, top_k=c.top_k, min_p=c.min_p)
                token = self._draw(lp, **settings)
        elif ent < c.high_ent_thresh and vent > c.high_vent_thresh:
            strategy = "explore"
            t = min(1.5, c.temp * (c.lehv_interaction_strength_offset + c.lehv_interaction_strength_coef * inter))
            settings = dict(temperature=t, top_p=c.top_p, top_k=max(5, int(c.top_k * (1 + 0.5 * (1 - agree)))),
                            min_p=c.min_p)
            token = self._draw(lp, **settings)
        elif ent > c.med_ent_thresh and vent > c.high_vent_thresh:
            strategy = "resample"
            t = max(2.0, c.temp * (c.hehv_attn_vent_offset + c.hehv_attn_vent_coef * attn_vent))
            settings = dict(temperature=t, top_p=max(0.5, c.top_p - c.hehv_attn_ent_coef * attn_ent), top_k=c.top_k,
                            min_p=c.min_p)
            token = self._draw(lp, **settings)
        else:
            strategy = "adaptive"
            lu, au = ent + vent, attn_ent + attn_vent
            settings = dict(
                temperature=c.temp * (1 + c.ada_temp_logits * lu + c.ada_temp_attn * au - c.ada_temp_agree * agree),
                top_p=float(np.clip(c.top_p * (1 + c.ada_top_p * attn_vent), 0.1, 1.0)),
                top_k=int(np.clip(np.round(c.top_k * (1 + c.ada_top_k_int * inter - c.ada_top_k_agree * agree)),
                                  1, 100)),
                min_p=float(np.clip(c.min_p * (1 - c.ada_min_p * lu), 0.01, 0.5)))
            draws = [self._draw(lp, **settings) for _ in range(c.n_adaptive_samples)]
            # entropix scores each draw by its log-probability plus a confidence term that is the same for all
            # of them: the likeliest draw wins (the first of equals)
            token = max(draws, key=lambda t: lp[t])
        self.last = {"strategy": strategy, **m, **settings, "token": token}
        return token
