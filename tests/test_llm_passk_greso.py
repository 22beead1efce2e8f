"""Unbiased pass@k against exact combinatorics; GRESO selective-rollout bookkeeping."""
from fractions import Fraction
from math import comb

import numpy as np
import pytest

from scaling_rl.llm.greso import GresoConfig, SelectiveRollout
from scaling_rl.llm.passk import pass_at_k, pass_at_k_curve, powers_of_two


def _exact(n, c, k):
    return float(1 - Fraction(comb(n - c, k), comb(n, k)))


@pytest.mark.parametrize("n", [1, 5, 16, 100, 256])
def test_pass_at_k_matches_exact_combinatorics(n):
    rng = np.random.default_rng(n)
    cs = sorted({0, n, *map(int, rng.integers(0, n + 1, size=6))})
    ks = sorted({1, n, *map(int, rng.integers(1, n + 1, size=6))})
    for c in cs:
        for k in ks:
            assert pass_at_k(n, c, k) == pytest.approx(_exact(n, c, k), abs=1e-12)


def test_pass_at_k_edges_and_errors():
    assert pass_at_k(256, 0, 256) == 0.0
    assert pass_at_k(256, 1, 256) == 1.0           # n - c < k
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="k"):
        pass_at_k(10, 3, 11)
    with pytest.raises(ValueError, match="c"):
        pass_at_k(10, 11, 1)


def test_curve_is_monotone_mean_over_problems():
    curve = pass_at_k_curve([0, 1, 5, 8], 8, [1, 2, 4, 8])
    assert curve[1] == pytest.approx((0 + 1 / 8 + 5 / 8 + 1) / 4)
    assert curve[8] == pytest.approx(3 / 4)
    vals = list(curve.values())
    assert all(a <= b for a, b in zip(vals, vals[1:]))
    assert powers_of_two(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert powers_of_two(100)[-1] == 100


def test_greso_keep_probability_follows_streak():
    s = SelectiveRollout(GresoConfig(p_init=0.5, floor=0.01, step=0.0))
    assert s.keep_probability("new") == 1.0
    s.observe(["a", "b"], [np.ones(4), np.zeros(4)])       # a all-correct (easy), b all-wrong (hard)
    assert s.kind == {"a": "easy", "b": "hard"}
    assert s.keep_probability("a") == pytest.approx(0.5)
    s.observe(["a"], [np.ones(4)])
    assert s.keep_probability("a") == pytest.approx(0.25)  # p^z with z = 2
    for _ in range(10):
        s.observe(["a"], [np.ones(4)])
    assert s.keep_probability("a") == pytest.approx(0.01)  # floor
    s.observe(["a"], [np.array([1.0, 0, 1, 1])])             # informative again -> reset
    assert s.keep_probability("a") == 1.0


def test_greso_select_skips_at_the_right_rate_and_counts():
    s = SelectiveRollout(GresoConfig(p_init=0.5, step=0.0))
    s.observe(["x"], [np.zeros(8)])
    rng = np.random.default_rng(0)
    kept = sum(s.select("x", rng) for _ in range(4000))
    assert kept / 4000 == pytest.approx(0.5, abs=0.03)
    assert s.skipped == 4000 - kept
    assert all(s.select("fresh", rng) for _ in range(50))


def test_greso_adapts_exploration_toward_target():
    cfg = GresoConfig(target=0.25, step=0.01, p_init=0.5, p_min=0.05, p_max=0.95)
    s = SelectiveRollout(cfg)
    # 4 of 8 groups easy (share 0.5 > 0.125): p_easy goes down; no hard ones: p_hard goes up
    groups = [np.ones(4)] * 4 + [np.array([0, 1, 0, 1.0])] * 4
    stats = s.observe(list(range(8)), groups)
    assert s.p["easy"] == pytest.approx(0.49) and s.p["hard"] == pytest.approx(0.51)
    assert stats["greso/zero_var_easy"] == 0.5 and stats["greso/zero_var_hard"] == 0.0
    for _ in range(200):
        s.observe(list(range(8)), groups)
    assert s.p["easy"] == pytest.approx(0.05) and s.p["hard"] == pytest.approx(0.95)


def test_greso_state_round_trip():
    s = SelectiveRollout()
    s.observe([1, 2, 3], [np.ones(2), np.zeros(2), np.array([0, 1.0])])
    s.skipped = 7
    t = SelectiveRollout()
    t.load_state_dict(s.state_dict())
    assert (t.p, t.streak, t.kind, t.skipped) == (s.p, s.streak, s.kind, s.skipped)
