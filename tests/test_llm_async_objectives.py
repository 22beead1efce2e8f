"""Off-policy objectives (JAX): decoupled PPO, truncated IS, VarGrad trajectory balance."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scaling_rl.llm import objectives as obj


def _inputs(seed=0, B=6, T=5):
    rng = np.random.default_rng(seed)
    lengths = np.array([5, 3, 1, 4, 2, 5])[:B]
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
    logp = -rng.random((B, T)).astype(np.float32) * 2
    old = logp + 0.3 * rng.standard_normal((B, T)).astype(np.float32)
    ref = logp + 0.2 * rng.standard_normal((B, T)).astype(np.float32)
    adv = rng.standard_normal(B).astype(np.float32)
    return map(jnp.asarray, (logp, old, ref, adv, mask))


@pytest.mark.parametrize("loss_type", obj.LOSS_TYPES)
def test_decoupled_ppo_with_behaviour_equal_proximal_is_todays_loss_exactly(loss_type):
    logp, prox, ref, adv, mask = _inputs()
    kw = dict(loss_type=loss_type, eps_low=0.2, eps_high=0.28, beta=0.05, max_completion_length=5)
    num_items = jnp.float32(float(mask.sum()) + 3)

    def today(lp):
        return obj.grpo_objective(lp, prox, ref, adv, mask, num_items, **kw)

    def decoupled(lp):
        return obj.decoupled_ppo_objective(lp, prox, prox, ref, adv, mask, num_items, is_cap=5.0, **kw)
    (l0, m0), g0 = jax.value_and_grad(today, has_aux=True)(logp)
    (l1, m1), g1 = jax.value_and_grad(decoupled, has_aux=True)(logp)
    np.testing.assert_array_equal(l0, l1)           # bitwise, not approximately
    np.testing.assert_array_equal(g0, g1)
    for k in m0:
        np.testing.assert_array_equal(m0[k], m1[k])
    assert float(m1["behav_weight_mean"]) == 1.0 and float(m1["behav_dropped_mean"]) == 0.0
    # the trainer's one-signature wrapper routes "grpo" to today's objective
    fn = obj.policy_objective_fn("grpo", loss_type, 0.2, 0.28, 0.05, 5)
    np.testing.assert_array_equal(fn(logp, prox, prox - 1.0, ref, adv, adv, mask, num_items)[0], l0)


def test_decoupled_ppo_hand_values():
    # one sequence, three tokens, A = 1; π_θ/π_prox = (1.1, 1.5, 0.5); π_prox/π_behav = (2, 0.5, 8)
    ratio, w = np.array([1.1, 1.5, 0.5]), np.array([2.0, 0.5, 8.0])
    prox = jnp.log(jnp.array([[0.2, 0.4, 0.1]]))
    logp = prox + jnp.log(jnp.asarray(ratio, jnp.float32))[None]
    behav = prox - jnp.log(jnp.asarray(w, jnp.float32))[None]
    mask, adv = jnp.ones((1, 3)), jnp.array([1.0])
    loss, m = obj.decoupled_ppo_objective(logp, prox, behav, logp, adv, mask, None,
                                          loss_type="bnpo", is_cap=5.0)
    # token 3's weight 8 > cap 5: dropped. Surrogates -min(ρ, clip(ρ)): -1.1, -1.2, -0.5
    expected = (2.0 * -1.1 + 0.5 * -1.2 + 0.0) / 3
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert float(m["behav_dropped_mean"]) == pytest.approx(1 / 3)
    g = jax.grad(lambda lp: obj.decoupled_ppo_objective(lp, prox, behav, lp, adv, mask, None,
                                                        loss_type="bnpo", is_cap=5.0)[0])(logp)
    # d(-w ρ A)/dlogp = -w ρ A (unclipped), 0 where clipped or dropped
    np.testing.assert_allclose(g, [[-2.0 * 1.1 / 3, 0.0, 0.0]], rtol=1e-5)
    loss_nocap, _ = obj.decoupled_ppo_objective(logp, prox, behav, logp, adv, mask, None,
                                                loss_type="bnpo", is_cap=0.0)
    assert float(loss_nocap) == pytest.approx((2.0 * -1.1 + 0.5 * -1.2 + 8 * -0.5) / 3, rel=1e-6)


def test_truncated_is_hand_values_and_gradient():
    # tokens from two behaviour versions: π_θ/μ = (0.5, 1.0, 3.0), cap c = 2
    rho = jnp.array([[0.5, 1.0, 3.0]])
    logp = jnp.log(jnp.array([[0.3, 0.2, 0.6]]))
    behav = logp - jnp.log(rho)
    mask, adv = jnp.ones((1, 3)), jnp.array([2.0])

    def f(lp):
        return obj.truncated_is_objective(lp, behav, lp, adv, mask, None, loss_type="bnpo",
                                          is_cap=2.0)
    (loss, m), g = jax.value_and_grad(f, has_aux=True)(logp)
    assert float(loss) == pytest.approx(-(0.5 + 1.0 + 2.0) * 2 / 3, rel=1e-6)
    np.testing.assert_allclose(g, [[-0.5 * 2 / 3, -1.0 * 2 / 3, -2.0 * 2 / 3]], rtol=1e-5)
    assert float(m["is_truncated_mean"]) == pytest.approx(1 / 3)
    # on-policy (μ = π_θ) it is REINFORCE with the group advantage: gradient -A / n per token
    g_on = jax.grad(lambda lp: obj.truncated_is_objective(lp, lp, lp, adv, mask, None,
                                                          loss_type="bnpo")[0])(logp)
    np.testing.assert_allclose(g_on, [[-2 / 3] * 3], rtol=1e-6)


def test_vargrad_hand_values():
    # two prompts x G=2; sequence log-ratios from per-token values, rewards r, β = 0.5
    logp = jnp.array([[-1.0, -2.0], [-0.5, 0.0], [-3.0, -1.0], [-1.0, -1.0]])
    ref = jnp.array([[-1.5, -1.5], [-1.0, 0.0], [-2.0, -2.0], [-1.0, -2.0]])
    mask = jnp.array([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    rewards = jnp.array([1.0, 0.0, 0.0, 1.0])
    loss, m = obj.vargrad_objective(logp, ref, rewards, mask, group_size=2, tb_beta=0.5)
    seq = np.array([0.0, 0.5, 0.0, 1.0])           # Σ mask (logp - ref)
    s = seq - np.array([1.0, 0.0, 0.0, 1.0]) / 0.5  # = (-2, 0.5, 0, -1)
    d = [(-2 - (-0.75)) ** 2, (0.5 - (-0.75)) ** 2, (0 - (-0.5)) ** 2, (-1 - (-0.5)) ** 2]
    assert float(loss) == pytest.approx(np.mean(d), rel=1e-6)
    # log Z = r/β - log π_θ/π_ref = -s per completion: minus the mean of the group means
    assert float(m["tb/log_z"]) == pytest.approx((0.75 + 0.5) / 2, rel=1e-6)
    # gradient: d/dlogp_t = 2/(G·n_groups) (s_i - mean_group) on real tokens
    g = jax.grad(lambda lp: obj.vargrad_objective(lp, ref, rewards, mask, group_size=2,
                                                  tb_beta=0.5)[0])(logp)
    dev = np.array([-1.25, 1.25, 0.5, -0.5])
    np.testing.assert_allclose(g, (2 / 4) * dev[:, None] * np.asarray(mask), rtol=1e-6)
    # equal rewards and an on-reference policy: nothing to correct
    zero, _ = obj.vargrad_objective(ref, ref, jnp.ones(4), mask, group_size=2, tb_beta=0.5)
    assert float(zero) == 0.0


def test_policy_objective_fn_validates_and_dapo_sums_over_minibatches():
    with pytest.raises(ValueError, match="^objective: 'ppo2' is unknown"):
        obj.policy_objective_fn("ppo2", "grpo", 0.2, 0.2, 0.0, 4)
    # dapo with the whole generation batch's token count: minibatch losses add up to the batch loss
    x = jnp.array([[1.0, 2, 3], [4, 5, 6], [7, 8, 9], [1, 1, 1]])
    m = jnp.array([[1.0, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 1]])
    n = m.sum()
    halves = sum(float(obj.aggregate(x[i:i + 2], m[i:i + 2], "dapo", 3, num_items=n)) for i in (0, 2))
    assert halves == pytest.approx(float(obj.aggregate(x, m, "dapo", 3)), rel=1e-6)
    assert math.isclose(float(obj.aggregate(x, m, "dapo", 3)), float((x * m).sum() / n), rel_tol=1e-6)
