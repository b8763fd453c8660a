"""Sampler: greedy is argmax, filters keep what they promise, seeds reproduce."""
import numpy as np
import pytest

from refimpl.sampling import Sampler


pytestmark = pytest.mark.property

def test_greedy_is_argmax_and_penalty_can_change_it():
    z = np.array([0.1, 3.0, 2.9, -1.0])
    assert Sampler().sample(z) == 1
    assert Sampler(repeat_penalty=1.1).sample(z, history=[1]) == 2   # 3.0/1.1 < 2.9


def test_top_k_1_is_greedy_at_any_temperature():
    z = np.random.default_rng(0).standard_normal(100)
    s = Sampler(temperature=5.0, top_k=1, seed=3)
    assert all(s.sample(z) == int(np.argmax(z)) for _ in range(20))


def test_top_p_and_min_p_only_draw_from_the_kept_set():
    z = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    draws = {Sampler(temperature=1.0, top_p=0.7, seed=s).sample(z) for s in range(200)}
    assert draws == {0, 1}                     # 0.5 < 0.7 <= 0.8: the first two
    draws = {Sampler(temperature=1.0, min_p=0.5, seed=s).sample(z) for s in range(200)}
    assert draws == {0, 1}                     # p >= 0.25


def test_seed_reproduces_and_distribution_matches():
    z = np.log(np.array([0.2, 0.8]))
    a = [Sampler(temperature=1.0, seed=7).sample(z) for _ in range(5)]
    b = [Sampler(temperature=1.0, seed=7).sample(z) for _ in range(5)]
    assert a == b
    s = Sampler(temperature=1.0, seed=1)
    freq = np.mean([s.sample(z) for _ in range(4000)])
    assert abs(freq - 0.8) < 4 * np.sqrt(0.8 * 0.2 / 4000)      # within 4 sigma


def test_invalid_settings_rejected():
    with pytest.raises(ValueError):
        Sampler(top_p=0.0)
