"""Velocity network on a residual backbone, the rectified-flow loss, and jitted pretraining.

v_θ(x_t, t, c) = Dense_d(Backbone(concat(x_t, fourier(t), onehot(c)))), zero-initialised head
(the untrained net is the zero velocity field). Path and time convention: `scaling_rl.flow.sde`.
Flow matching: t ~ U(0, 1), x_t = (1-t)ε + t·x, loss = ||v_θ(x_t, t, c) - (x - ε)||² (mean over
dimensions and batch).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from scaling_rl import nets

TIME_FREQUENCIES = 8


def time_features(t):
    """Fourier features of t ∈ [0, 1]: sin/cos(2^k π t), k < 8 -> (..., 16)."""
    freqs = jnp.pi * 2.0 ** jnp.arange(TIME_FREQUENCIES, dtype=jnp.float32)
    angles = jnp.asarray(t, jnp.float32)[..., None] * freqs
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


class VelocityNet(nn.Module):
    """(x (B, d), t (B,), cond (B,) int) -> velocity (B, d); `num_classes` 0 = unconditional."""

    backbone: nets.BackboneConfig
    dim: int
    num_classes: int = 0

    @nn.compact
    def __call__(self, x, t, cond=None):
        feats = [jnp.asarray(x, jnp.float32), time_features(t)]
        if self.num_classes:
            feats.append(jax.nn.one_hot(cond, self.num_classes, dtype=jnp.float32))
        h = nets.Backbone(self.backbone)(jnp.concatenate(feats, axis=-1))
        return nn.Dense(self.dim, kernel_init=nn.initializers.zeros, name="head")(h)


def input_dim(dim: int, num_classes: int) -> int:
    return dim + 2 * TIME_FREQUENCIES + num_classes


def velocity_param_count(backbone: nets.BackboneConfig, dim: int, num_classes: int) -> int:
    """Exact parameter count of `VelocityNet` (the N of compute C)."""
    return (nets.backbone_param_count(backbone, input_dim(dim, num_classes))
            + nets.dense_head_param_count(backbone.width, dim))


def velocity_flops(backbone: nets.BackboneConfig, dim: int, num_classes: int) -> int:
    """Forward FLOPs of one velocity evaluation (backbone + head; time features not counted)."""
    return (nets.backbone_flops(backbone, input_dim(dim, num_classes))
            + nets.dense_head_flops(backbone.width, dim))


def flow_matching_loss(apply, params, x, cond, key):
    """Rectified-flow regression loss on a data batch x (B, d) with labels cond (B,)."""
    kt, ke = jax.random.split(key)
    t = jax.random.uniform(kt, (x.shape[0],))
    eps = jax.random.normal(ke, x.shape)
    xt = (1.0 - t[:, None]) * eps + t[:, None] * x
    return jnp.mean((apply(params, xt, t, cond) - (x - eps)) ** 2)


@dataclasses.dataclass(frozen=True)
class Pretrainer:
    """Jittable flow-matching pretraining: `run(params, key) -> (params, losses (steps,))`."""

    net: VelocityNet
    sample: Any          # dataset sampler (key, n) -> (x, label)
    steps: int
    batch_size: int
    lr: float
    label_dropout: float = 0.0   # classifier-free guidance: replace labels by `null_label` w.p. this
    null_label: int = -1
    warmup: int = 0              # linear warm-up steps from 0 to `lr` before the cosine decay

    def schedule(self):
        """Learning rate per step: cosine decay from `lr` to 5% of it over `steps` (after a linear
        warm-up from 0 over `warmup` steps when > 0)."""
        if self.warmup:
            return optax.warmup_cosine_decay_schedule(0.0, self.lr, self.warmup, max(self.steps, self.warmup + 1),
                                                      end_value=0.05 * self.lr)
        return optax.cosine_decay_schedule(self.lr, max(self.steps, 1), alpha=0.05)

    def run(self, params, key):
        opt = optax.adam(self.schedule())

        def step(carry, k):
            params, opt_state = carry
            kd, kl = jax.random.split(k)
            x, label = self.sample(kd, self.batch_size)
            cond = label if self.net.num_classes else None
            if self.label_dropout > 0:
                drop = jax.random.uniform(jax.random.fold_in(kd, 1), label.shape) < self.label_dropout
                cond = jnp.where(drop, self.null_label, label)
            loss, grads = jax.value_and_grad(
                lambda p: flow_matching_loss(self.net.apply, p, x, cond, kl))(params)
            updates, opt_state = opt.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        (params, _), losses = jax.lax.scan(step, (params, opt.init(params)),
                                           jax.random.split(key, self.steps))
        return params, losses
