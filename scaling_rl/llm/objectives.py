"""GRPO objective in JAX: group advantages, clipped surrogate, k3 KL, loss aggregation, and the
off-policy objectives of the asynchronous rollout modes (decoupled PPO, truncated IS, VarGrad TB).

Written once here and called from the torch trainer through `scaling_rl.bridge.torch_op`.
Shapes: B completions (G per prompt, groups contiguous), T completion tokens; `mask` (B, T) is 1 on
real completion tokens. Formulas follow DeepSeekMath GRPO, DAPO (clip-higher, token-mean) and
Dr. GRPO (constant normaliser); the per-variant normalisers match TRL's `GRPOTrainer`.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo")
SCALE_REWARDS = ("group", "batch", "none")
ADV_EPS = 1e-4


def _unbiased_std(x: jax.Array, axis=None, keepdims=False) -> jax.Array:
    """Sample standard deviation (Bessel-corrected, as torch.std)."""
    n = x.size if axis is None else x.shape[axis]
    mean = jnp.mean(x, axis=axis, keepdims=True)
    var = jnp.sum((x - mean) ** 2, axis=axis, keepdims=keepdims) / max(n - 1, 1)
    return jnp.sqrt(var)


def group_advantages(rewards: jax.Array, group_size: int, scale: str = "group"):
    """Advantages r - mean(group), divided by the group std, the batch std, or nothing.

    Returns (advantages (B,), zero_std (B,) bool): `zero_std` marks completions whose group has
    identical rewards (their advantage is exactly 0 whatever the scaling).
    """
    if scale not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards: {scale!r} is unknown; use one of {SCALE_REWARDS}")
    grouped = rewards.reshape(-1, group_size)
    centred = (grouped - grouped.mean(axis=1, keepdims=True)).reshape(-1)
    group_std = jnp.repeat(_unbiased_std(grouped, axis=1), group_size)
    zero_std = jnp.isclose(group_std, 0.0)
    if scale == "group":
        adv = centred / (group_std + ADV_EPS)
    elif scale == "batch":
        adv = centred / (_unbiased_std(rewards) + ADV_EPS)
    else:
        adv = centred
    return adv, zero_std


def clipped_surrogate(logp, old_logp, advantages, eps_low: float, eps_high: float):
    """Per-token PPO loss -min(ρA, clip(ρ, 1-ε_low, 1+ε_high)A) and the ratio ρ."""
    ratio = jnp.exp(logp - old_logp)
    adv = advantages[:, None]
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return -jnp.minimum(ratio * adv, clipped * adv), ratio


def k3_kl(logp, ref_logp):
    """Per-token k3 estimator of KL(π || π_ref): exp(q - p) - (q - p) - 1, always >= 0."""
    d = ref_logp - logp
    return jnp.exp(d) - d - 1.0


def masked_mean(x, mask):
    """Mean of x over the positions where mask is 1 (0 if none)."""
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def aggregate(per_token, mask, loss_type: str, max_completion_length: int, num_items=None):
    """Reduce a (B, T) per-token loss to a scalar.

    grpo:    mean over sequences of the per-sequence token mean (length-normalised per sequence)
    bnpo:    token mean over this (mini)batch
    dr_grpo: token sum / (B * max_completion_length) — a constant, length-independent normaliser
    dapo:    token sum / num_items, the number of completion tokens in the whole generation batch
             (equals bnpo when the generation batch is one minibatch)
    """
    total = jnp.sum(per_token * mask)
    if loss_type == "grpo":
        per_seq = jnp.sum(per_token * mask, axis=-1) / jnp.maximum(jnp.sum(mask, axis=-1), 1.0)
        return jnp.mean(per_seq)
    if loss_type == "bnpo":
        return total / jnp.maximum(jnp.sum(mask), 1.0)
    if loss_type == "dr_grpo":
        return total / (per_token.shape[0] * max_completion_length)
    if loss_type == "dapo":
        denom = jnp.sum(mask) if num_items is None else num_items
        return total / jnp.maximum(denom, 1.0)
    raise ValueError(f"loss_type: {loss_type!r} is unknown; use one of {LOSS_TYPES}")


def grpo_objective(logp, old_logp, ref_logp, advantages, mask, num_items, *,
                   loss_type: str = "grpo", eps_low: float = 0.2, eps_high: float = 0.2,
                   beta: float = 0.0, max_completion_length: int = 1):
    """GRPO loss and its diagnostics. `ref_logp` is ignored when beta == 0.

    Returns (loss, metrics) with metrics: kl, clip_ratio/{low,high,region}_mean (token means, as
    TRL: low = ρ < 1-ε_low with A < 0, high = ρ > 1+ε_high with A > 0), ratio_mean.
    """
    return _clipped_objective(logp, old_logp, None, ref_logp, advantages, mask, num_items,
                              loss_type, eps_low, eps_high, beta, max_completion_length)


def _clipped_objective(logp, anchor_logp, token_weights, ref_logp, advantages, mask, num_items,
                       loss_type, eps_low, eps_high, beta, max_completion_length):
    """Clipped surrogate around `anchor_logp`, optionally times per-token weights, + β·k3 KL."""
    mask = mask.astype(logp.dtype)
    per_token, ratio = clipped_surrogate(logp, anchor_logp, advantages, eps_low, eps_high)
    if token_weights is not None:
        per_token = token_weights * per_token
    kl = k3_kl(logp, ref_logp) if beta != 0.0 else jnp.zeros_like(logp)
    if beta != 0.0:
        per_token = per_token + beta * kl
    loss = aggregate(per_token, mask, loss_type, max_completion_length, num_items)
    adv = advantages[:, None]
    low = ((ratio < 1.0 - eps_low) & (adv < 0)).astype(logp.dtype)
    high = ((ratio > 1.0 + eps_high) & (adv > 0)).astype(logp.dtype)
    stop = jax.lax.stop_gradient
    metrics = {
        "kl": stop(masked_mean(kl, mask)),
        "clip_ratio/low_mean": masked_mean(low, mask),
        "clip_ratio/high_mean": masked_mean(high, mask),
        "clip_ratio/region_mean": masked_mean(jnp.maximum(low, high), mask),
        "ratio_mean": stop(masked_mean(ratio, mask)),
    }
    return loss, metrics


@functools.lru_cache(maxsize=None)
def objective_fn(loss_type: str, eps_low: float, eps_high: float, beta: float,
                 max_completion_length: int):
    """`grpo_objective` with its static hyper-parameters bound (cached, so jit caches hit)."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type: {loss_type!r} is unknown; use one of {LOSS_TYPES}")
    return functools.partial(grpo_objective, loss_type=loss_type, eps_low=eps_low,
                             eps_high=eps_high, beta=beta,
                             max_completion_length=max_completion_length)


# ---- off-policy objectives: decoupled PPO (AReaL), truncated IS (PipelineRL), VarGrad TB (TBA) --

OBJECTIVES = ("grpo", "decoupled_ppo", "tis", "vargrad")


def behaviour_weights(prox_logp, behav_logp, cap: float):
    """AReaL's behaviour -> proximal importance weight π_prox/π_behav per token (no gradient).

    With cap > 0, tokens whose weight exceeds the cap are dropped (weight 0), as AReaL does;
    returns (weights, dropped) with `dropped` a 0/1 array.
    """
    w = jnp.exp(jax.lax.stop_gradient(prox_logp - behav_logp))
    if cap <= 0:
        return w, jnp.zeros_like(w)
    dropped = (w > cap).astype(w.dtype)
    return jnp.where(w > cap, 0.0, w), dropped


def decoupled_ppo_objective(logp, prox_logp, behav_logp, ref_logp, advantages, mask, num_items, *,
                            loss_type: str = "grpo", eps_low: float = 0.2, eps_high: float = 0.2,
                            beta: float = 0.0, max_completion_length: int = 1,
                            is_cap: float = 0.0):
    """AReaL's decoupled PPO: the clipped surrogate around the proximal policy (trust region),
    each token weighted by π_prox/π_behav (the policy that sampled it). Behaviour = proximal gives
    weight exp(0) = 1 on every token, i.e. exactly `grpo_objective(logp, prox_logp, ...)`."""
    w, dropped = behaviour_weights(prox_logp, behav_logp, is_cap)
    loss, metrics = _clipped_objective(logp, prox_logp, w, ref_logp, advantages, mask, num_items,
                                       loss_type, eps_low, eps_high, beta, max_completion_length)
    mask = mask.astype(logp.dtype)
    metrics["behav_weight_mean"] = masked_mean(w, mask)
    metrics["behav_dropped_mean"] = masked_mean(dropped, mask)
    return loss, metrics


def truncated_is_objective(logp, behav_logp, ref_logp, advantages, mask, num_items, *,
                           loss_type: str = "grpo", beta: float = 0.0,
                           max_completion_length: int = 1, is_cap: float = 2.0):
    """PipelineRL-style policy gradient with truncated importance weights for tokens sampled by
    (possibly different, per-token) behaviour versions: per token -min(π_θ/μ, c)·A, with the weight
    held constant, so the gradient is -min(π_θ/μ, c)·A·∇log π_θ. `is_cap` = c (<= 0: no cap)."""
    mask = mask.astype(logp.dtype)
    stop = jax.lax.stop_gradient
    rho = jnp.exp(stop(logp - behav_logp))
    weight = jnp.minimum(rho, is_cap) if is_cap > 0 else rho
    # exp(logp - stop(logp)) is 1 in value and has gradient ∇logp
    per_token = -weight * jnp.exp(logp - stop(logp)) * advantages[:, None]
    kl = k3_kl(logp, ref_logp) if beta != 0.0 else jnp.zeros_like(logp)
    if beta != 0.0:
        per_token = per_token + beta * kl
    loss = aggregate(per_token, mask, loss_type, max_completion_length, num_items)
    truncated = (rho > is_cap).astype(logp.dtype) if is_cap > 0 else jnp.zeros_like(rho)
    return loss, {"kl": stop(masked_mean(kl, mask)), "ratio_mean": stop(masked_mean(rho, mask)),
                  "is_truncated_mean": masked_mean(truncated, mask)}


def vargrad_objective(logp, ref_logp, rewards, mask, *, group_size: int, tb_beta: float):
    """Trajectory balance in VarGrad form (TBA): per prompt, the mean squared deviation of
    s_i = log π_θ(y_i|x) - log π_ref(y_i|x) - r_i/β from its group mean. Trajectory balance,
    log Z + log π_θ(y|x) = log π_ref(y|x) + r/β, makes log Z = -s_i: the estimate reported as
    `tb/log_z` is minus the group mean. Valid off-policy: no importance weights."""
    mask = mask.astype(logp.dtype)
    seq = jnp.sum((logp - ref_logp) * mask, axis=-1)
    s = (seq - rewards / tb_beta).reshape(-1, group_size)
    mean_s = jnp.mean(s, axis=1, keepdims=True)
    loss = jnp.mean((s - mean_s) ** 2)
    stop = jax.lax.stop_gradient
    return loss, {"tb/log_z": stop(-jnp.mean(mean_s)), "tb/seq_log_ratio": stop(jnp.mean(seq)),
                  "kl": stop(masked_mean(k3_kl(logp, ref_logp), mask))}


@functools.lru_cache(maxsize=None)
def policy_objective_fn(objective: str, loss_type: str, eps_low: float, eps_high: float,
                        beta: float, max_completion_length: int, is_cap: float = 0.0,
                        tb_beta: float = 1.0, group_size: int = 2):
    """One signature for every objective, for the trainer:
    fn(logp, prox_logp, behav_logp, ref_logp, advantages, rewards, mask, num_items) -> (loss, metrics).
    "grpo" ignores behav_logp and rewards (it is `objective_fn`); "tis" ignores prox_logp;
    "vargrad" uses only logp, ref_logp, rewards and mask."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective: {objective!r} is unknown; use one of {OBJECTIVES}")
    grpo = objective_fn(loss_type, eps_low, eps_high, beta, max_completion_length)
    common = dict(loss_type=loss_type, beta=beta, max_completion_length=max_completion_length)

    def fn(logp, prox_logp, behav_logp, ref_logp, advantages, rewards, mask, num_items):
        if objective == "grpo":
            return grpo(logp, prox_logp, ref_logp, advantages, mask, num_items)
        if objective == "decoupled_ppo":
            return decoupled_ppo_objective(logp, prox_logp, behav_logp, ref_logp, advantages, mask,
                                           num_items, eps_low=eps_low, eps_high=eps_high,
                                           is_cap=is_cap, **common)
        if objective == "tis":
            return truncated_is_objective(logp, behav_logp, ref_logp, advantages, mask, num_items,
                                          is_cap=is_cap, **common)
        return vargrad_objective(logp, ref_logp, rewards, mask, group_size=group_size,
                                 tb_beta=tb_beta)
    return fn
