"""GRPO objective (JAX) against hand-computed values, and through the bridge against torch."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scaling_rl.llm import objectives as obj

torch = pytest.importorskip("torch")


def test_group_advantages_hand_values():
    r = jnp.array([1.0, 0, 0, 0, 1, 1, 1, 1])
    adv, zero = obj.group_advantages(r, 4, "group")
    # group 1: mean .25, unbiased std sqrt((.75^2 + 3 * .25^2) / 3) = 0.5
    np.testing.assert_allclose(adv[:4], np.array([0.75, -0.25, -0.25, -0.25]) / (0.5 + 1e-4),
                               rtol=1e-6)
    np.testing.assert_array_equal(adv[4:], 0.0)  # all-equal rewards -> zero advantage
    assert list(np.asarray(zero)) == [False] * 4 + [True] * 4
    adv_none, _ = obj.group_advantages(r, 4, "none")
    np.testing.assert_allclose(adv_none, [0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0], atol=1e-7)
    adv_batch, _ = obj.group_advantages(r, 4, "batch")
    batch_std = np.std(np.asarray(r), ddof=1)
    np.testing.assert_allclose(adv_batch, np.asarray(adv_none) / (batch_std + 1e-4), rtol=1e-6)
    with pytest.raises(ValueError, match="scale_rewards"):
        obj.group_advantages(r, 4, "nope")


def test_aggregations_with_masks_and_ragged_lengths():
    x = jnp.array([[1.0, 2, 3], [4, 5, 6]])
    m = jnp.array([[1.0, 1, 0], [1, 0, 0]])
    assert float(obj.aggregate(x, m, "grpo", 4)) == pytest.approx(((1 + 2) / 2 + 4) / 2)
    assert float(obj.aggregate(x, m, "bnpo", 4)) == pytest.approx(7 / 3)
    assert float(obj.aggregate(x, m, "dr_grpo", 4)) == pytest.approx(7 / (2 * 4))
    assert float(obj.aggregate(x, m, "dapo", 4, num_items=10.0)) == pytest.approx(0.7)
    assert float(obj.aggregate(x, m, "dapo", 4)) == pytest.approx(7 / 3)
    empty = jnp.zeros_like(m)
    for kind in obj.LOSS_TYPES:  # no tokens at all -> 0, not NaN
        assert float(obj.aggregate(x, empty, kind, 4)) == 0.0
    with pytest.raises(ValueError, match="loss_type"):
        obj.aggregate(x, m, "ppo", 4)


def test_clipping_both_sides_and_clip_higher():
    ratio = jnp.array([[1.5, 0.5, 1.25, 1.0]])
    logp = jnp.log(ratio)
    old = jnp.zeros_like(logp)
    pos, neg = jnp.array([1.0]), jnp.array([-1.0])
    loss, _ = obj.clipped_surrogate(logp, old, pos, 0.2, 0.2)
    np.testing.assert_allclose(loss, [[-1.2, -0.5, -1.2, -1.0]], rtol=1e-6)
    loss, _ = obj.clipped_surrogate(logp, old, neg, 0.2, 0.2)
    np.testing.assert_allclose(loss, [[1.5, 0.8, 1.25, 1.0]], rtol=1e-6)
    loss, _ = obj.clipped_surrogate(logp, old, pos, 0.2, 0.28)  # clip-higher: 1.25 not clipped
    np.testing.assert_allclose(loss, [[-1.28, -0.5, -1.25, -1.0]], rtol=1e-6)


def test_gradient_vanishes_where_clipped():
    logp = jnp.log(jnp.array([[1.5, 0.5, 1.1]]))
    mask = jnp.ones_like(logp)

    def f(lp, adv):
        return obj.grpo_objective(lp, jnp.zeros_like(lp), lp, adv, mask, None,
                                  eps_low=0.2, eps_high=0.2)[0]
    g_pos = jax.grad(f)(logp, jnp.array([1.0]))
    # A > 0: ratio 1.5 clipped (0 grad); 0.5 and 1.1 unclipped: d(-ρA/3)/dlogp = -ρ/3
    np.testing.assert_allclose(g_pos, [[0.0, -0.5 / 3, -1.1 / 3]], rtol=1e-6)
    g_neg = jax.grad(f)(logp, jnp.array([-1.0]))
    np.testing.assert_allclose(g_neg, [[1.5 / 3, 0.0, 1.1 / 3]], rtol=1e-6)


def test_k3_kl_and_beta():
    logp = jnp.log(jnp.array([[0.5, 0.25]]))
    ref = jnp.log(jnp.array([[0.25, 0.25]]))
    kl = obj.k3_kl(logp, ref)
    np.testing.assert_allclose(kl, [[0.5 - math.log(0.5) - 1, 0.0]], rtol=1e-6)
    mask = jnp.ones_like(logp)
    adv = jnp.array([0.0])
    loss, m = obj.grpo_objective(logp, logp, ref, adv, mask, None, beta=0.1, loss_type="bnpo")
    assert float(loss) == pytest.approx(0.1 * float(kl.mean()), rel=1e-6)
    assert float(m["kl"]) == pytest.approx(float(kl.mean()), rel=1e-6)
    loss0, m0 = obj.grpo_objective(logp, logp, ref, adv, mask, None, beta=0.0)
    assert float(loss0) == 0.0 and float(m0["kl"]) == 0.0


def test_clip_ratio_metrics():
    ratio = jnp.array([[1.5, 0.5, 1.0], [1.5, 0.5, 1.0]])
    logp = jnp.log(ratio)
    mask = jnp.array([[1.0, 1, 1], [1, 1, 0]])
    adv = jnp.array([1.0, -1.0])
    _, m = obj.grpo_objective(logp, jnp.zeros_like(logp), logp, adv, mask, None)
    # high: row 0 token 0 (ρ>1.2, A>0); low: row 1 token 1 (ρ<0.8, A<0); 5 real tokens
    assert float(m["clip_ratio/high_mean"]) == pytest.approx(1 / 5)
    assert float(m["clip_ratio/low_mean"]) == pytest.approx(1 / 5)
    assert float(m["clip_ratio/region_mean"]) == pytest.approx(2 / 5)


def test_all_equal_rewards_give_zero_loss_and_gradient():
    adv, _ = obj.group_advantages(jnp.ones(8), 4, "group")
    logp = jnp.log(jnp.full((8, 3), 0.3))
    mask = jnp.ones((8, 3))
    for kind in obj.LOSS_TYPES:
        f = lambda lp: obj.grpo_objective(lp, jax.lax.stop_gradient(lp), lp, adv, mask, None,
                                          loss_type=kind)[0]
        value, grad = jax.jit(jax.value_and_grad(f))(logp)
        assert float(value) == 0.0
        np.testing.assert_array_equal(grad, 0.0)


def _torch_reference(logp, old, ref, adv, mask, num_items, loss_type, eps_low, eps_high, beta,
                     max_len):
    """The same objective written directly in torch (formulas as in TRL's GRPOTrainer)."""
    ratio = torch.exp(logp - old)
    a = adv[:, None]
    per_token = -torch.min(ratio * a, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * a)
    if beta:
        per_token = per_token + beta * (torch.exp(ref - logp) - (ref - logp) - 1)
    if loss_type == "grpo":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    if loss_type == "bnpo":
        return (per_token * mask).sum() / mask.sum().clamp(min=1)
    if loss_type == "dr_grpo":
        return (per_token * mask).sum() / (per_token.shape[0] * max_len)
    return (per_token * mask).sum() / num_items


@pytest.mark.parametrize("loss_type", obj.LOSS_TYPES)
def test_objective_through_bridge_matches_torch(loss_type):
    from scaling_rl.bridge import torch_op
    g = torch.Generator().manual_seed(1)
    B, T = 6, 5
    lengths = torch.tensor([5, 3, 1, 4, 2, 5])
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    base = -torch.rand(B, T, generator=g) * 2
    old = base + 0.3 * torch.randn(B, T, generator=g)   # ratios spread across both clip edges
    ref = base + 0.2 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    num_items = torch.tensor(float(mask.sum()) + 3)
    kw = dict(loss_type=loss_type, eps_low=0.2, eps_high=0.28, beta=0.05, max_len=T)
    op = torch_op(obj.objective_fn(loss_type, 0.2, 0.28, 0.05, T))
    grads = []
    for fn in ("jax", "torch"):
        logp = base.clone().requires_grad_()
        if fn == "jax":
            loss, metrics = op(logp, old, ref, adv, mask, num_items)
        else:
            loss = _torch_reference(logp, old, ref, adv, mask, num_items, **kw)
        loss.backward()
        grads.append((loss.detach(), logp.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-5, atol=1e-6)
    assert 0 < float(metrics["clip_ratio/region_mean"].detach()) < 1
