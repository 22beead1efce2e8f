"""Batch schedulers: selection rules; SamS's context (hidden states through its encoder, no margin
functions), its per-batch-normalised reward, the lag and pool, and that its networks learn which
arms pay (no language model: synthetic hidden states)."""
import numpy as np
import pytest

from scaling_rl.llm import sams

L, D = 3, 8


def _stats(n, rng, margins=None, hidden=None):
    m = rng.normal(size=n) if margins is None else np.asarray(margins, float)
    h = rng.normal(size=(n, L, D)).astype(np.float32) if hidden is None else hidden
    return {"margins": m, "losses": np.logaddexp(0, -m), "chosen_seq_logp": rng.normal(size=n) - 6,
            "chosen_logp": rng.normal(size=n) - 2, "hidden": h}


def test_features_are_the_hidden_states():
    rng = np.random.default_rng(0)
    st = _stats(5, rng)
    x = sams.features(st)
    assert x.shape == (5, L, D) and x.dtype == np.float32
    np.testing.assert_array_equal(x, st["hidden"])
    with pytest.raises(ValueError, match="hidden"):
        sams.features({k: v for k, v in st.items() if k != "hidden"})
    with pytest.raises(ValueError, match="not \\(arms, layers, width\\)"):
        sams.features({**st, "hidden": np.zeros((5, 8))})


def test_context_ignores_margins_and_follows_hidden_states():
    """Same hidden states, any margins / losses / log-probs: the same scores; other hidden states:
    other scores (the context is the encoding of the policy's hidden states only)."""
    rng = np.random.default_rng(1)
    s = sams.SamS(seed=0)
    a = _stats(16, rng)
    b = _stats(16, rng, hidden=a["hidden"])              # new margins, losses, log-probs
    s.select(a, 4, rng)                                  # builds the networks
    ua, fa, ga = s.scores(sams.features(a))
    ub, fb, gb = s.scores(sams.features(b))
    np.testing.assert_array_equal(ua, ub)
    c = _stats(16, rng)
    uc, _, _ = s.scores(sams.features(c))
    assert np.abs(uc - ua).max() > 1e-3
    e = np.asarray(sams.encode(s.p1, sams.features(a)))
    assert e.shape == (16, s.hidden)
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, rtol=1e-5)   # L2-normalised
    assert ga.shape == (16, s.hidden)


def test_per_arm_reward_is_normalised_per_batch():
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    m = np.array([-1.0, 0.0, 3.0])
    pc = np.array([-5.0, -9.0, -7.0])
    mm_m, mm_p = (m + 1) / 4, (pc + 9) / 4
    want = 0.5 * sig(50 * 0.01 + 0.5) + 0.5 * sig(0.5 * mm_m + 0.5 * (1 - mm_p))
    np.testing.assert_allclose(sams.arm_rewards(0.01, m, pc, 0.5), want, rtol=1e-6)
    # invariant to the scale and offset of margins and log-probs (min-max over the batch)
    np.testing.assert_allclose(sams.arm_rewards(0.01, 100 * m + 7, 0.1 * pc - 3, 0.5), want,
                               rtol=1e-6)
    # the per-arm term spans [σ(0), σ(1)] whatever the margins' spread: best arm vs worst arm
    y = sams.sample_terms(np.array([0.0, 1e-3]), np.array([-1.0, -2.0]))
    np.testing.assert_allclose(y, [sig(0.0), sig(1.0)], rtol=1e-6)
    np.testing.assert_array_equal(sams.minmax([2.0, 2.0]), [0.0, 0.0])     # constant batch
    assert sams.batch_progress(0.8, 0.6) == pytest.approx(0.2)
    assert sams.batch_progress(0.8, 0.6, normalise=True) == pytest.approx(0.25)
    assert sams.batch_progress(0.6, 0.8, normalise=True) == pytest.approx(-0.25)
    assert sams.batch_progress(0.0, 0.0, normalise=True) == 0.0
    assert sams.sig_loss([0.0, 0.0]) == pytest.approx(0.5)


def test_reward_is_lagged_to_the_next_candidate_batch_and_covers_all_arms():
    rng = np.random.default_rng(1)
    s = sams.SamS(updates=1, seed=0)
    st1 = _stats(8, rng)
    s.select(st1, 4, rng)
    s.observe(0.7, None)
    assert s.filled == 0                    # first batch: no reward yet (needs the next loss)
    st2 = _stats(8, rng)
    s.select(st2, 4, rng)
    assert s.filled == 8                    # every candidate arm of batch 1 is rewarded
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    r = sig(-st1["margins"]).mean() - sig(-st2["margins"]).mean()     # un-normalised, sig loss
    assert sams.batch_progress(sams.sig_loss(st1["margins"]), sams.sig_loss(st2["margins"])) \
        == pytest.approx(r)
    want = sams.arm_rewards(r, st1["margins"], st1["chosen_seq_logp"], 0.5)
    np.testing.assert_allclose(s.y[:8], want, rtol=1e-6)
    np.testing.assert_array_equal(s.x[:8], st1["hidden"])
    assert np.isfinite(s.last_fit).all()


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


def test_uniform_and_small_loss():
    rng = np.random.default_rng(0)
    assert list(sams.Uniform().select(None, 4, rng)) == [0, 1, 2, 3]
    st = {"losses": np.array([0.9, 0.1, 0.5, 0.05, 0.7, 0.3])}
    assert sorted(sams.SmallLoss().select(st, 3, rng)) == [1, 3, 5]
    assert not sams.Uniform.needs_stats and sams.SmallLoss.needs_stats
    assert not sams.SmallLoss.needs_hidden and sams.SamS.needs_hidden


def test_sams_learns_rewarding_hidden_directions():
    """The margin is written along one direction of the hidden states; rewards are the per-arm
    term only (λ = 0). After some rounds f1 ranks arms by that term from the hidden states alone,
    and a low temperature then picks the high-reward arms."""
    rng = np.random.default_rng(0)
    direction = rng.normal(size=(L, D)).astype(np.float32)

    def batch(n, m):
        h = (rng.normal(size=(n, L, D)) * 0.3 + m[:, None, None] * direction).astype(np.float32)
        return _stats(n, rng, margins=m, hidden=h) | {"chosen_seq_logp": -6 + 0 * m}

    s = sams.SamS(updates=16, lr=3e-3, explore=0.0, batch_weight=0.0, seed=0)
    for _ in range(30):
        s.select(batch(32, rng.uniform(-2, 2, 32)), 8, rng)
    st = batch(32, np.linspace(-2, 2, 32))
    _, f1, _ = s.scores(sams.features(st))
    assert np.corrcoef(f1, sams.sample_terms(st["margins"], st["chosen_seq_logp"]))[0, 1] > 0.9
    s.temperature = 0.01
    picks = np.concatenate([s.select(st, 8, rng) for _ in range(5)])
    assert np.mean(picks >= 16) > 0.85      # chance: 0.5
    assert s.stats[-1]["prob_ratio"] > 1e3 and s.stats[0]["prob_ratio"] == 1.0


def test_reward_batch_share():
    s = sams.SamS(seed=0)
    s._build(L, D)
    # two steps: per-step means 0 and 1, within-step spread ±0.1 -> share = 0.25 / (0.25 + 0.01)
    s._push(np.zeros((4, L, D)), np.zeros((4, s.hidden)), np.array([-.1, .1, -.1, .1]), 0)
    s._push(np.zeros((4, L, D)), np.zeros((4, s.hidden)), np.array([.9, 1.1, .9, 1.1]), 1)
    assert s.reward_batch_share() == pytest.approx(0.25 / 0.26)


def test_make_scheduler_names_and_reference_defaults():
    from scaling_rl.llm.dpo import DPOConfig
    cfg = DPOConfig(scheduler="sams")
    assert cfg.sams_temperature == 1.0 and cfg.sams_explore == 0.1   # reference: T = 1, f2_weight
    s = sams.make_scheduler(cfg)
    assert isinstance(s, sams.SamS) and s.temperature == 1.0
    assert isinstance(sams.make_scheduler(DPOConfig(scheduler="small_loss")), sams.SmallLoss)

    class C:
        scheduler = "nope"
    with pytest.raises(ValueError, match="scheduler"):
        sams.make_scheduler(C)
    with pytest.raises(ValueError, match="temperature"):
        sams.SamS(temperature=0.0)
