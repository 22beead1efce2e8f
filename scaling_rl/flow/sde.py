r"""Samplers for rectified-flow generators: the ODE, and the SDE with the same marginals.

Convention (the whole package): time runs from noise to data,

    x_t = (1 - t)·ε + t·x,    ε ~ N(0, I),  x ~ data,  t ∈ [0, 1],

so the conditional velocity is d x_t / dt = x - ε and the network learns
v(x_t, t) = E[x - ε | x_t]. (Flow-GRPO writes the same path with τ = 1 - t.)

**The score is a function of the velocity.** Given x (and so ε), x_t ~ N(t·x, (1-t)² I), whose
score in x_t is -(x_t - t·x)/(1-t)² = -ε/(1-t). Averaging over the posterior of (x, ε) given x_t,

    ∇ log p_t(x_t) = -E[ε | x_t] / (1 - t).

From x_t = t·E[x|x_t] + (1-t)·E[ε|x_t] and v = E[x|x_t] - E[ε|x_t]: E[x|x_t] = v + E[ε|x_t], so
x_t = t·v + E[ε|x_t], i.e. E[ε | x_t] = x_t - t·v and

    s(x, t) := ∇ log p_t(x) = -(x - t·v(x, t)) / (1 - t).

**Matching-marginals SDE.** The ODE dx = v dt transports p_t: ∂_t p = -∇·(p v). For any noise
scale σ_t ≥ 0, the SDE

    dx = [v(x, t) + (σ_t² / 2)·s(x, t)] dt + σ_t dW

has Fokker-Planck ∂_t p = -∇·(p v) - (σ_t²/2)∇·(p ∇log p) + (σ_t²/2)Δp = -∇·(p v), because
p ∇log p = ∇p: the score term's drift exactly cancels the diffusion. Same initial law (N(0, I) at
t = 0) and same evolution, so the same marginal p_t at every t. With the score written through v,

    drift(x, t) = v + (σ_t² / (2(1 - t)))·(t·v - x).

**Euler-Maruyama step** from t to t + Δ: x' = μ + σ_t√Δ·z, z ~ N(0, I), with
μ = x + drift(x, t)·Δ. Each step is a Gaussian policy π(x' | x, t) = N(μ_θ, (σ_t√Δ)² I) whose
log-density (summed over dimensions) is `gaussian_logprob`; the KL between two such steps with the
same std (policy vs reference) is ||μ_θ - μ_ref||² / (2 σ_t² Δ).

Noise schedules (`noise_level` a):
  sqrt:      σ_t = a·√(1 - t). The score coefficient σ_t²/(2(1-t)) = a²/2 is constant, so the
             drift stays bounded at both ends, and the noise vanishes at the data end.
  flow_grpo: σ_t = a·√((1 - t)/t), Flow-GRPO's σ = a√(τ/(1-τ)) in our time; t is clamped at the
             first grid step Δ (σ is infinite at pure noise).
Steps only ever evaluate t < 1 (the grid is t_k = k/T, k < T), where the score formula is finite.
"""
from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp

SCHEDULES = ("sqrt", "flow_grpo")
LOG_2PI = math.log(2.0 * math.pi)

# velocity(x (B, d), t (B,)) -> (B, d)
Velocity = Callable[[jax.Array, jax.Array], jax.Array]


def check_schedule(schedule: str) -> None:
    if schedule not in SCHEDULES:
        raise ValueError(f"noise_schedule: {schedule!r} is unknown; use one of {SCHEDULES}")


def noise_sigma(t, noise_level: float, schedule: str, dt: float):
    """σ_t of the SDE (see the module docstring); `dt` is the grid step (clamp for flow_grpo)."""
    check_schedule(schedule)
    t = jnp.asarray(t, jnp.float32)
    if schedule == "sqrt":
        return noise_level * jnp.sqrt(jnp.maximum(1.0 - t, 0.0))
    return noise_level * jnp.sqrt(jnp.maximum(1.0 - t, 0.0) / jnp.maximum(t, dt))


def score_from_velocity(x, v, t):
    """∇log p_t(x) = -(x - t·v) / (1 - t) for the linear path (t < 1); t broadcasts over rows."""
    t = jnp.asarray(t, x.dtype)[..., None]
    return -(x - t * v) / (1.0 - t)


def sde_step_mean(x, v, t, dt, sigma, score: bool = True):
    """Mean of one Euler-Maruyama step: x + (v + σ²/2·s)Δ. `score=False` drops the σ²/2·s term
    (the wrong drift used as a negative control: its marginals drift away from the ODE's)."""
    drift = v
    if score:
        drift = v + 0.5 * (jnp.asarray(sigma, x.dtype)[..., None] ** 2) * score_from_velocity(x, v, t)
    return x + drift * dt


def gaussian_logprob(x, mean, std):
    """log N(x; mean, std² I), summed over the last axis; std broadcasts over rows."""
    d = x.shape[-1]
    std = jnp.asarray(std, x.dtype)
    z = (x - mean) / std[..., None]
    return -0.5 * jnp.sum(z * z, axis=-1) - d * jnp.log(std) - 0.5 * d * LOG_2PI


def gaussian_kl_same_std(mean_p, mean_q, std):
    """KL(N(mean_p, std² I) || N(mean_q, std² I)) = ||mean_p - mean_q||² / (2 std²), per row."""
    diff = mean_p - mean_q
    return jnp.sum(diff * diff, axis=-1) / (2.0 * jnp.asarray(std, diff.dtype) ** 2)


def _times(k, batch: int, num_steps: int):
    return jnp.full((batch,), k / num_steps, jnp.float32)


def ode_step(velocity: Velocity, x, k, num_steps: int):
    """One Euler step of the ODE from t = k/T to (k+1)/T."""
    return x + velocity(x, _times(k, x.shape[0], num_steps)) / num_steps


def ode_path(velocity: Velocity, x0, num_steps: int):
    """Euler ODE from t = 0 to 1 in `num_steps` steps; the states at every grid point, (T+1, B, d)."""
    def body(x, k):
        nxt = ode_step(velocity, x, k, num_steps)
        return nxt, nxt

    _, xs = jax.lax.scan(body, x0, jnp.arange(num_steps))
    return jnp.concatenate([x0[None], xs])


def ode_sample(velocity: Velocity, x0, num_steps: int, start: int = 0, stop: int | None = None):
    """Euler ODE over grid steps [start, stop) (traced bounds allowed; no gradients through it)."""
    stop = num_steps if stop is None else stop
    return jax.lax.fori_loop(start, stop, lambda k, x: ode_step(velocity, x, k, num_steps), x0)


def step_gaussian(x, v, t, num_steps: int, noise_level: float, schedule: str, score: bool = True):
    """The Gaussian policy of one SDE step from time t (B,) given v = v(x, t): (mean (B, d), std (B,))."""
    dt = 1.0 / num_steps
    sigma = noise_sigma(t, noise_level, schedule, dt)
    return sde_step_mean(x, v, t, dt, sigma, score=score), sigma * math.sqrt(dt)


def sde_transition(velocity: Velocity, x, k, key, num_steps: int, noise_level: float,
                   schedule: str, score: bool = True):
    """One SDE step from grid index k: (x_next, mean, std, logp of x_next under the step)."""
    t = _times(k, x.shape[0], num_steps)
    mean, std = step_gaussian(x, velocity(x, t), t, num_steps, noise_level, schedule, score)
    x_next = mean + std[:, None] * jax.random.normal(key, x.shape, x.dtype)
    return x_next, mean, std, gaussian_logprob(x_next, mean, std)


def sde_path(velocity: Velocity, x0, key, num_steps: int, noise_level: float, schedule: str = "sqrt",
             score: bool = True):
    """Euler-Maruyama SDE from t = 0 to 1: (states (T+1, B, d), step log-probs (T, B))."""
    def body(x, inp):
        k, step_key = inp
        nxt, _, _, logp = sde_transition(velocity, x, k, step_key, num_steps, noise_level, schedule,
                                         score)
        return nxt, (nxt, logp)

    keys = jax.random.split(key, num_steps)
    _, (xs, logps) = jax.lax.scan(body, x0, (jnp.arange(num_steps), keys))
    return jnp.concatenate([x0[None], xs]), logps
