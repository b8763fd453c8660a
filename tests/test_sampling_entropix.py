"""The entropix sampler (refimpl.sampling.EntropixSampler): its metrics against values worked out by hand, every
strategy reached, seeded runs reproducible, and the decode loop feeding it the model's attention."""
import math
import subprocess
import sys

import numpy as np
import pytest

import refimpl
from refimpl.sampling import EntropixConfig, EntropixSampler, entropix_metrics

pytestmark = pytest.mark.property


def test_metrics_by_hand():
    """p = (1/2, 1/4, 1/4): H = 1.5 bits, varentropy = 1/2 (1/2)^2 + 2 (1/4)(1/2)^2 = 0.25. Two heads over two
    cells, scores (0, 0) and (ln 3, 0): attention (1/2, 1/2) and (3/4, 1/4), entropies 1 and
    h = -(3/4 log2 3/4 + 1/4 log2 1/4); their mean, population variance, mean |a - mean a| = 1/8, mean |s|."""
    m = entropix_metrics(np.log([0.5, 0.25, 0.25]), np.array([[0.0, 0.0], [math.log(3.0), 0.0]]))
    h = -(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25))
    assert m["logits_entropy"] == pytest.approx(1.5, abs=1e-12)
    assert m["logits_varentropy"] == pytest.approx(0.25, abs=1e-12)
    assert m["attn_entropy"] == pytest.approx((1.0 + h) / 2, abs=1e-12)
    assert m["attn_varentropy"] == pytest.approx(((1.0 - h) / 2) ** 2, abs=1e-12)
    assert m["agreement"] == pytest.approx(0.125, abs=1e-12)
    assert m["interaction_strength"] == pytest.approx(math.log(3.0) / 4, abs=1e-12)
    u = entropix_metrics(np.zeros(8), np.zeros((3, 4)))        # uniform: log2 n bits, no spread at all
    assert (u["logits_entropy"], u["logits_varentropy"], u["attn_entropy"], u["attn_varentropy"], u["agreement"],
            u["interaction_strength"]) == pytest.approx((3.0, 0.0, 2.0, 0.0, 0.0, 0.0), abs=1e-12)
    with pytest.raises(ValueError, match="n_head, n_kv"):
        entropix_metrics(np.zeros(4), np.zeros(4))


def _mixture(p_top: float, n_rest: int) -> np.ndarray:
    """Logits of one token at p_top and n_rest tokens sharing the rest equally."""
    return np.log(np.array([p_top] + [(1 - p_top) / n_rest] * n_rest))


CASES = {                              # logits -> the strategy entropix's thresholds pick (its defaults)
    "argmax": np.array([30.0] + [0.0] * 63),                        # H ~ 0, varentropy ~ 0
    "clarify": np.zeros(64),                                         # H = 6 > 5, varentropy 0 < 0.1
    "explore": _mixture(0.9, 10000),                                 # H ~ 1.8 < 5, varentropy ~ 24 > 5
    "resample": _mixture(0.5, 4000),                                 # H ~ 7.0 > 5, varentropy ~ 36 > 5
    "adaptive": np.array([2.0, 1.0, 0.5, 0.0] + [-3.0] * 20),        # H ~ 2.2, varentropy ~ 3.7: in between
}


@pytest.mark.parametrize("strategy", sorted(CASES))
def test_every_strategy_is_reached(strategy):
    s = EntropixSampler(seed=3)
    t = s.sample(CASES[strategy], [], np.zeros((2, 5)))
    assert s.last["strategy"] == strategy and 0 <= t < len(CASES[strategy])
    if strategy == "argmax":
        assert t == 0 and "temperature" not in s.last
    if strategy == "resample":                    # entropix's "resampling in the mist": temperature >= 2
        assert s.last["temperature"] >= 2.0 and s.last["top_p"] >= 0.5
    if strategy == "explore":                     # "exploring forks": top-k widened by low agreement (0 here)
        assert s.last["top_k"] == int(27 * 1.5) and s.last["temperature"] <= 1.5
    if strategy == "adaptive":
        assert 1 <= s.last["top_k"] <= 100 and 0.01 <= s.last["min_p"] <= 0.5


def test_clarifying_token_is_a_setting():
    """High entropy, low varentropy: entropix inserts its "clarifying question" token once, then samples; off
    by default (no vocabulary refimpl runs has entropix's token 2564)."""
    s = EntropixSampler(config=EntropixConfig(clarifying_token=7), seed=0)
    assert s.sample(CASES["clarify"], [1, 2], np.zeros((1, 3))) == 7
    s.sample(CASES["clarify"], [1, 2, 7], np.zeros((1, 3)))
    assert "temperature" in s.last                  # the second time it sampled, with entropix's raised temperature
    assert s.last["temperature"] == pytest.approx(min(1.5, 0.666 * (1.3 + 0.2 * np.log2(3))))
    d = EntropixSampler(seed=0)
    d.sample(CASES["clarify"], [1, 2], np.zeros((1, 3)))
    assert d.last["strategy"] == "clarify" and "temperature" in d.last


def test_seeded_runs_are_reproducible():
    rng = np.random.default_rng(0)
    steps = [(rng.standard_normal(500) * rng.uniform(0.5, 4), rng.standard_normal((4, 9)) * 3) for _ in range(40)]
    runs = [[EntropixSampler(seed=s).sample(lg, [], sc) for lg, sc in steps] for s in (11, 11, 12)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_it_needs_the_attention():
    with pytest.raises(ValueError, match="attention scores"):
        EntropixSampler().sample(np.zeros(4), [])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.models.tiny import write_tiny_llama
    return write_tiny_llama(tmp_path_factory.mktemp("ent") / "tiny.gguf", seed=5)


def test_the_decode_loop_feeds_the_last_layers_attention(tiny):
    """generate with the entropix sampler: every step gets the last layer's attention logits over the cells in
    use (n_head rows), equal to the captured kq times 1/sqrt(head_dim); two seeded runs give the same tokens."""
    from refimpl.models import llama
    model = llama.load(tiny)
    seen = []

    class Spy(EntropixSampler):
        def sample(self, logits, history=(), scores=None):
            seen.append((len(history), None if scores is None else np.array(scores)))
            return super().sample(logits, history, scores)

    with refimpl.backend("numpy"):
        toks = [[], []]
        for k in range(2):
            list(llama.generate(model, [5, 9, 17], 6, Spy(seed=4), on_token=toks[k].append))
    assert toks[0] == toks[1] and len(toks[0]) == 6
    hp = model.hparams
    for n_hist, sc in seen[:6]:
        assert sc.shape == (hp.n_head, n_hist)      # one row per head, a cell per position so far
    # the first step's scores are the prompt's last row of kq-{L}, scaled as soft_max scales it
    cap: dict = {}
    with refimpl.backend("numpy"):
        llama.forward(model, [5, 9, 17], llama.new_cache(model, 3), capture=cap)
    want = cap[f"kq-{hp.n_layer - 1}"][:, -1, :3].astype(np.float64) / math.sqrt(hp.head_dim)
    np.testing.assert_array_equal(seen[0][1], want)


def test_cli_entropix_with_metrics(tiny):
    r = subprocess.run([sys.executable, "-m", "refimpl", "generate", "-m", str(tiny), "-p", "ab", "-n", "4",
                        "--sampler", "entropix", "--show-metrics", "-r", "3", "--backend", "numpy"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("[entropix ")]
    assert len(lines) == 4 and all("varentropy" in ln and "interaction" in ln for ln in lines), r.stderr
