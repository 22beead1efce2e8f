"""Batch schedulers: selection rules, SamS reward / lag / pool, and that its networks learn which
arms pay (no model: synthetic features)."""
import numpy as np
import pytest

from scaling_rl.llm import sams


def _stats(n, rng, margins=None):
    m = rng.normal(size=n) if margins is None else np.asarray(margins, float)
    return {"margins": m, "losses": np.logaddexp(0, -m), "chosen_logp": rng.normal(size=n) - 2,
            "rejected_logp": rng.normal(size=n) - 2}


def test_features_columns():
    rng = np.random.default_rng(0)
    st = _stats(5, rng)
    x = sams.features(st)
    assert x.shape == (5, len(sams.FEATURES)) and x.dtype == np.float32
    p = 1 / (1 + np.exp(-st["margins"]))
    np.testing.assert_allclose(x[:, 1], p, rtol=1e-6)
    np.testing.assert_allclose(x[:, 2], 4 * p * (1 - p), rtol=1e-5)
    np.testing.assert_allclose(x[:, 3], st["losses"], rtol=1e-6)


def test_uniform_and_small_loss():
    rng = np.random.default_rng(0)
    assert list(sams.Uniform().select(None, 4, rng)) == [0, 1, 2, 3]
    st = {"losses": np.array([0.9, 0.1, 0.5, 0.05, 0.7, 0.3])}
    assert sorted(sams.SmallLoss().select(st, 3, rng)) == [1, 3, 5]


def test_gumbel_top_k_is_distinct_and_follows_scores():
    rng = np.random.default_rng(0)
    scores = np.arange(10, dtype=float)
    idx = sams.gumbel_top_k(scores, 10, 1.0, rng)
    assert sorted(idx) == list(range(10))
    assert sorted(sams.gumbel_top_k(scores, 3, 1e-3, rng)) == [7, 8, 9]     # T -> 0: top-k
    counts = np.zeros(10)
    for _ in range(400):
        counts[sams.gumbel_top_k(scores, 1, 2.0, rng)] += 1
    assert counts[9] > counts[0] * 5      # ∝ exp(9/2) vs exp(0)


def test_reward_is_lagged_batch_progress_plus_margin():
    assert sams.batch_progress(0.8, 0.6) == pytest.approx(0.25)
    assert sams.batch_progress(0.6, 0.8) == pytest.approx(-0.25)
    y = sams.arm_rewards(0.01, np.array([0.0, 2.0]), 0.5)
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    np.testing.assert_allclose(y, 0.5 * sig(0.5) + 0.5 * sig(np.array([0.0, 2.0])), rtol=1e-6)

    rng = np.random.default_rng(1)
    s = sams.SamS(updates=1, seed=0)
    st1 = _stats(8, rng)
    idx1 = s.select(st1, 4, rng)
    s.observe(0.7, None)
    assert s.filled == 0                    # first batch: no reward yet (needs the next loss)
    s.select(_stats(8, rng), 4, rng)
    s.observe(0.6, None)
    assert s.filled == 4                    # batch 1 rewarded with (0.7 - 0.6) / 0.7
    want = sams.arm_rewards((0.7 - 0.6) / 0.7, st1["margins"][idx1], 0.5)
    np.testing.assert_allclose(s.y[:4], want, rtol=1e-6)
    np.testing.assert_allclose(s.x[:4], sams.features(st1)[idx1], rtol=1e-6)


def test_sams_learns_to_pick_rewarding_arms():
    """Arms with a large margin earn more (sample term); after some rounds SamS picks them far
    more often than chance, and its exploitation net ranks them higher."""
    rng = np.random.default_rng(0)
    s = sams.SamS(updates=8, lr=3e-3, explore=0.1, temperature=0.02, batch_weight=0.0, seed=0)
    for _ in range(25):
        st = _stats(32, rng, margins=rng.uniform(-3, 3, 32))
        s.select(st, 8, rng)
        s.observe(0.5, None)
    st = _stats(32, rng, margins=np.linspace(-3, 3, 32))
    picks = np.concatenate([s.select(st, 8, rng) for _ in range(20)])
    assert np.mean(picks >= 16) > 0.85      # chance: 0.5
    _, f1, _ = s.scores(sams.features(st))
    assert np.corrcoef(f1, st["margins"])[0, 1] > 0.9


def test_make_scheduler_names():
    class C:
        scheduler, sams_hidden, sams_lr, sams_updates = "sams", 64, 1e-3, 1
        sams_explore, sams_temperature, sams_batch_weight, seed = 0.5, 0.1, 0.5, 0
    assert isinstance(sams.make_scheduler(C), sams.SamS)
    C.scheduler = "small_loss"
    assert isinstance(sams.make_scheduler(C), sams.SmallLoss)
    C.scheduler = "nope"
    with pytest.raises(ValueError, match="scheduler"):
        sams.make_scheduler(C)
