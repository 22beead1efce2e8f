"""Flow-GRPO (Liu et al., NeurIPS 2025) for the rectified-flow generators of this package.

One policy update:
 1. Draw `groups` conditions (uniform class labels; unconditional models ignore them) and sample
    `group_size` (G) generations per condition with the matching-marginals SDE at `t_train` steps
    (`scaling_rl.flow.sde`). Every SDE step is a Gaussian policy N(μ_θ(x_t, t), s_t² I).
 2. Score the final samples with the reward plug-in; advantages are normalised within each group
    (`scaling_rl.llm.objectives.group_advantages`: the same definition as the LLM GRPO).
 3. μ = `num_iterations` gradient steps on  mean over (sample, step) of
        -min(ρ A, clip(ρ, 1-ε, 1+ε) A) + β·KL(N(μ_θ, s²) || N(μ_ref, s²)),
    ρ = π_θ(x_{t+1}|x_t) / π_old(x_{t+1}|x_t) per denoising step (the clipped surrogate and the
    loss aggregation are `llm.objectives`'); the KL to the frozen pretrained reference is the
    closed form ||μ_θ - μ_ref||² / (2 s²) between the step Gaussians (same std).
Options: denoising reduction (`t_train` < `t_eval`: train on short trajectories, evaluate with the
full-length ODE) and the `sampler`:
  full           every sample its own noise, SDE on all T steps, loss on all T steps;
  fast           Flow-GRPO-Fast as the official code runs it: every sample its own initial noise and
                 its own deterministic ODE prefix up to a random step k, SDE only on a window of
                 W = `fast_window` steps [k, k+W) placed in the first half of the trajectory
                 (k ~ U{0..max(T//2 - W, 0)}), ODE to the end; the loss covers the window only.
                 Sampling still costs B·T velocity evaluations, training B·W instead of B·T;
  shared_prefix  our earlier variant (a different idea: group branching): each group shares one
                 noise and one ODE prefix up to k ~ U{0..T-W} (anywhere), then branches into G
                 samples for the window; sampling n·k + B·(T-k).

Agent contract (docs/architecture.md): `Config`, `make(cfg) -> Agent(init, chunk, evaluate, ...)`,
so `scaling_rl.train.run("scaling_rl.flow.grpo", cfg, out_dir, seeds)` gives metrics.parquet,
checkpoints, exact resume and seed vmapping. `init` pretrains the generator by flow matching with
the key of `pretrain_seed` (every seed shares the same reference), then copies it to the policy;
with `reference_params` (a file of `flax.serialization.to_bytes(agent.pretrain())`, e.g. written once
and shared by several runs: experiments/flow_grpo.py) it uses those parameters instead of pretraining
(the same state, bit for bit, when the file holds this config's pretraining: test_flow_grpo).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, NamedTuple

import flax.serialization
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from scaling_rl import nets
from scaling_rl.agents import common
from scaling_rl.flow import data as data_lib
from scaling_rl.flow import fidelity
from scaling_rl.flow import rewards as rewards_lib
from scaling_rl.flow import sde
from scaling_rl.flow.model import Pretrainer, VelocityNet, velocity_flops, velocity_param_count
from scaling_rl.llm.objectives import (ADV_EPS, SCALE_REWARDS, aggregate, clipped_surrogate,
                                      group_advantages)

PACKABLE = ("lr",)
HELD_OUT_STREAM = 0x4E1D     # held-out data for fidelity: fold_in(PRNGKey(pretrain_seed), this)
SAMPLERS = ("full", "fast", "shared_prefix")
ADV_POOLS = ("group", "prompt")
LOGP_REDUCES = ("sum", "mean")
# the Config fields that determine the pretrained reference (`agent.pretrain()`), e.g. to key a cache
PRETRAIN_FIELDS = ("dataset", "conditional", "guidance_scale", "label_dropout", "kind", "width", "depth",
                   "pretrain_steps", "pretrain_batch", "pretrain_lr", "pretrain_warmup", "pretrain_seed")


@dataclasses.dataclass(frozen=True)
class Config:
    dataset: str = "toy2d"           # data_lib.DATASETS
    reward: str = "toy_angle"        # rewards_lib.known()
    conditional: bool = False        # class-conditioned generator (conditions drawn per group)
    guidance_scale: float = 0.0      # classifier-free guidance w (0: off): v = v_u + w·(v_c - v_u);
                                     # the net gets a null class, pretraining drops labels w.p.
    label_dropout: float = 0.1       # label_dropout; sampling and the policy use the guided v
    kind: str = "bro"                # backbone (scaling_rl.nets)
    width: int = 64
    depth: int = 2
    pretrain_steps: int = 1500
    pretrain_batch: int = 256
    pretrain_lr: float = 3e-3
    pretrain_warmup: int = 0         # linear warm-up steps of the pretraining lr (0: cosine decay only)
    pretrain_seed: int = 0
    lr: float = 1e-3
    max_grad_norm: float = 1.0
    group_size: int = 8              # G
    groups: int = 8                  # conditions per update; batch B = groups · G
    num_iterations: int = 1          # μ
    clip_eps: float = 0.2
    beta: float = 0.01               # KL coefficient
    scale_rewards: str = "group"     # llm.objectives.SCALE_REWARDS ("batch": the paper's global std)
    adv_pool: str = "group"          # ADV_POOLS: centre/scale per group, or per prompt across the batch
    adv_clip: float = 0.0            # clip advantages to ±adv_clip (0: off; the paper uses 5)
    drop_equal_groups: bool = False  # leave groups whose rewards are all equal out of the loss
    logp_reduce: str = "sum"         # LOGP_REDUCES: step log-prob summed (density) or averaged over
                                     # dimensions (the official code; pair with clip_eps ~1e-4)
    noise_level: float = 0.7         # a in σ_t (sde.py)
    noise_schedule: str = "sqrt"
    t_train: int = 10
    t_eval: int = 40
    sampler: str = "full"            # SAMPLERS: full | fast (official) | shared_prefix
    fast_window: int = 2             # W, SDE/loss steps of fast and shared_prefix
    updates: int = 60                # policy updates in the whole run
    chunk_updates: int = 10          # updates per jitted chunk (= one metrics row)
    eval_samples: int = 256
    reference_params: str = ""       # file of flax.serialization.to_bytes(params) of the velocity net:
                                     # the reference (and initial policy) instead of pretraining

    def __post_init__(self):
        data_lib.get(self.dataset)
        rewards_lib.get(self.reward)
        sde.check_schedule(self.noise_schedule)
        for name, options in (("adv_pool", ADV_POOLS), ("logp_reduce", LOGP_REDUCES)):
            if getattr(self, name) not in options:
                raise ValueError(f"{name}: {getattr(self, name)!r} is unknown; use one of {options}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler: {self.sampler!r} is unknown; use one of {SAMPLERS}")
        if self.scale_rewards not in SCALE_REWARDS:
            raise ValueError(f"scale_rewards: {self.scale_rewards!r} is unknown; use one of {SCALE_REWARDS}")
        nets.BackboneConfig(kind=self.kind, width=self.width, depth=self.depth)
        for name, lo in (("pretrain_steps", 0), ("pretrain_warmup", 0), ("pretrain_batch", 1), ("group_size", 2), ("groups", 1),
                         ("num_iterations", 1), ("t_train", 1), ("t_eval", 1), ("fast_window", 1),
                         ("updates", 1), ("chunk_updates", 1), ("eval_samples", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ValueError(f"{name}: must be an integer >= {lo}, got {value!r}")
        for name in ("pretrain_lr", "lr", "noise_level"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)!r}")
        if self.guidance_scale > 0 and not self.conditional:
            raise ValueError("guidance_scale: classifier-free guidance needs conditional: true")
        if not 0.0 <= self.label_dropout < 1.0:
            raise ValueError(f"label_dropout: must be in [0, 1), got {self.label_dropout!r}")
        for name in ("clip_eps", "beta", "max_grad_norm", "adv_clip", "guidance_scale"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)!r}")
        if self.updates % self.chunk_updates:
            fit = self.updates // self.chunk_updates * self.chunk_updates or self.chunk_updates
            raise ValueError(f"updates: {self.updates} is not a multiple of chunk_updates="
                             f"{self.chunk_updates}; use {fit}")
        if self.windowed and self.fast_window > self.t_train:
            raise ValueError(f"fast_window: {self.fast_window} is longer than t_train={self.t_train}")
        if self.reward.startswith("shapes") and self.dataset != "shapes":
            raise ValueError(f"reward: {self.reward!r} needs dataset 'shapes', got {self.dataset!r}")
        if self.reward == "shapes_count" and not self.conditional:
            raise ValueError("conditional: shapes_count scores the count asked by the condition; set true")

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        return common.config_from_dict(cls, d)

    @property
    def batch_size(self) -> int:
        return self.groups * self.group_size

    @property
    def windowed(self) -> bool:
        """SDE (and loss) on a window of steps only: the fast and shared_prefix samplers."""
        return self.sampler != "full"

    @property
    def window(self) -> int:
        """Denoising steps in the loss (and SDE steps while sampling)."""
        return self.fast_window if self.windowed else self.t_train

    @property
    def max_window_start(self) -> int:
        """The window starts at k ~ U{0..max_window_start}: fast keeps it in the first half."""
        if self.sampler == "fast":
            return max(self.t_train // 2 - self.window, 0)
        return self.t_train - self.window

    @property
    def env_steps(self) -> int:
        """Generations sampled over the run (the data axis)."""
        return self.updates * self.batch_size

    @property
    def chunk_env_steps(self) -> int:
        return self.chunk_updates * self.batch_size

    @property
    def guided(self) -> bool:
        return self.guidance_scale > 0

    def net_classes(self, num_classes: int) -> int:
        """Classes the velocity net embeds: the data's, plus the null class under guidance."""
        return num_classes + 1 if self.guided and num_classes else num_classes

    def eval_flops(self, dim: int, num_classes: int) -> float:
        """FLOPs of one (guided: conditional + unconditional) velocity evaluation."""
        f = velocity_flops(self.backbone(), dim, self.net_classes(num_classes))
        return float(f * (2 if self.guided else 1))

    def backbone(self) -> nets.BackboneConfig:
        return nets.BackboneConfig(kind=self.kind, width=self.width, depth=self.depth)


def hparams(cfg: Config) -> dict[str, float]:
    """The `PACKABLE` values a run of `cfg` puts in its optimiser state."""
    return {"lr": float(cfg.lr)}


@flax.struct.dataclass
class FlowState:
    params: Any
    ref_params: Any
    opt_state: Any
    key: jax.Array
    update: jax.Array        # policy updates done
    evals: jax.Array         # velocity evaluations spent in RL so far (forward-equivalents), as
                             # two int32 digits [high, low] in base 2^30 (`add_evals`, `total_evals`):
                             # one int32 would wrap past 2.1e9, reachable in sweeps


EVALS_BASE = 2 ** 30


def add_evals(counter, n):
    """counter [high, low] (int32, base 2^30) + n (int32 scalar, n < 2^30): exact up to 2^60."""
    low = counter[1] + jnp.asarray(n, jnp.int32)
    return jnp.stack([counter[0] + low // EVALS_BASE, low % EVALS_BASE]).astype(jnp.int32)


def total_evals(counter):
    """The count held by `counter`, as float32 (for FLOPs)."""
    c = jnp.asarray(counter).astype(jnp.float32)
    return c[0] * float(EVALS_BASE) + c[1]


def update_flops(cfg: Config, dim: int, num_classes: int) -> dict[str, float]:
    """Expected FLOPs of one policy update, split by phase (1 backward = 2 forwards).

    sampling: B·T velocity evaluations (full and fast; shared_prefix: n·E[k] + B·(T - E[k]) with
    k ~ U{0..T-W}); reference: B·W (only when β > 0); training: μ·B·W·3.
    """
    f = cfg.eval_flops(dim, num_classes)
    b, t, w, n = cfg.batch_size, cfg.t_train, cfg.window, cfg.groups
    k = cfg.max_window_start / 2.0
    sampling = (n * k + b * (t - k)) if cfg.sampler == "shared_prefix" else b * t
    out = {"sampling": f * sampling, "reference": f * b * w if cfg.beta > 0 else 0.0,
           "training": f * 3.0 * cfg.num_iterations * b * w}
    out["total"] = sum(out.values())
    return out


def advantages(r, cond, group_size: int, scale: str, pool: str, clip: float):
    """Advantages of rewards r (B,) with conditions cond (B,): centred (and scaled by `scale`)
    within each group (`pool='group'`, `llm.objectives.group_advantages`) or within each prompt
    pooled across the batch (`'prompt'`: all samples with the same condition, as the official
    per-prompt stat tracker; an unconditional model has one prompt), then clipped to ±clip (> 0).
    Returns (adv (B,), equal (B,) bool: the sample's group has all-equal rewards)."""
    adv, equal = group_advantages(r, group_size, scale)
    if pool == "prompt":
        same = (cond[:, None] == cond[None]).astype(r.dtype)             # (B, B)
        count = jnp.sum(same, axis=1)
        mean = same @ r / count
        var = same @ (r * r) / count - mean ** 2
        std = jnp.sqrt(jnp.maximum(var * count / jnp.maximum(count - 1, 1), 0.0))
        if scale == "group":
            adv = (r - mean) / (std + ADV_EPS)
        elif scale == "batch":
            adv = (r - mean) / (jnp.std(r, ddof=1) + ADV_EPS)
        else:
            adv = r - mean
    if clip > 0:
        adv = jnp.clip(adv, -clip, clip)
    return adv, equal


def grpo_loss(logp, old_logp, mean, ref_mean, std, advantages, clip_eps: float, beta: float,
              mask=None):
    """Flow-GRPO objective on (B, W) step log-probs; mean/ref_mean (B, W, d), std (B, W).

    Returns (loss, metrics): loss = mean over the (mask's) steps and samples of the clipped
    surrogate + β·KL(step Gaussian of θ || of the reference).
    """
    per_step, ratio = clipped_surrogate(logp, old_logp, advantages, clip_eps, clip_eps)
    kl = sde.gaussian_kl_same_std(mean, ref_mean, std)
    mask = jnp.ones_like(logp) if mask is None else mask
    loss = aggregate(per_step + beta * kl, mask, "bnpo", logp.shape[1])
    stop = jax.lax.stop_gradient
    clipped = (jnp.abs(ratio - 1.0) > clip_eps).astype(logp.dtype)
    return loss, {"kl": stop(jnp.mean(kl)), "loss/policy": stop(jnp.mean(per_step)),
                  "ratio_mean": stop(jnp.mean(ratio)), "clip_frac": stop(jnp.mean(clipped))}


class FlowAgent(NamedTuple):
    """The agent contract (common.Agent's fields) plus the pieces tests and benchmarks call."""

    init: Callable
    chunk: Callable
    evaluate: Callable
    num_chunks: int
    param_count: int
    update: Callable          # (state) -> (state, metrics): one policy update
    env_spec: Any
    set_hparams: Callable
    net: VelocityNet
    rollout: Callable         # (params, key, cond_groups) -> (x, cond, xs, xs_next, idx, evals)
    step_stats: Callable      # (params, xs, xs_next, idx, cond) -> (logp, mean, std), (B, W, ...)
    sample_ode: Callable      # (params, key, num, num_steps) -> (x, cond)
    velocity: Callable        # (params, cond) -> velocity(x, t)
    pretrainer: Pretrainer
    pretrain: Callable        # () -> the pretrained params `init` uses when no reference_params
    dataset: data_lib.Dataset
    num_classes: int


def make(cfg: Config):
    """The agent for `cfg` (docs/architecture.md contract) plus `rollout`/`sample_ode` helpers."""
    ds = data_lib.get(cfg.dataset)
    num_classes = ds.num_classes if cfg.conditional else 0
    net_classes = cfg.net_classes(num_classes)
    net = VelocityNet(cfg.backbone(), ds.dim, net_classes)
    reward_fn = rewards_lib.get(cfg.reward)
    opt = common.make_optimizer(cfg.lr, 0.0, cfg.max_grad_norm)
    pretrainer = Pretrainer(net, ds.sample, cfg.pretrain_steps, cfg.pretrain_batch, cfg.pretrain_lr,
                            cfg.label_dropout if cfg.guided else 0.0, num_classes, cfg.pretrain_warmup)
    T, W, G, n, B, d = cfg.t_train, cfg.window, cfg.group_size, cfg.groups, cfg.batch_size, ds.dim
    flops_per_eval = cfg.eval_flops(d, num_classes)

    def guided_velocity(params, x, t, cond):
        """v(x, t | cond); under guidance v_u + w·(v_c - v_u) with the null class for v_u."""
        if not num_classes:
            return net.apply(params, x, t, None)
        v_c = net.apply(params, x, t, cond)
        if not cfg.guided:
            return v_c
        v_u = net.apply(params, x, t, jnp.full_like(cond, num_classes))
        return v_u + cfg.guidance_scale * (v_c - v_u)

    def velocity(params, cond):
        return lambda x, t: guided_velocity(params, x, t, cond)

    def draw_conditions(key, count):
        if not num_classes:
            return jnp.zeros((count,), jnp.int32)
        return jax.random.randint(key, (count,), 0, num_classes)

    def net_init(key):
        return net.init(key, jnp.zeros((1, d)), jnp.zeros((1,)),
                        jnp.zeros((1,), jnp.int32) if num_classes else None)

    def pretrain():
        """The reference: `net` initialised and flow-matching pretrained with the pretrain_seed's keys."""
        p_init, p_train = jax.random.split(jax.random.PRNGKey(cfg.pretrain_seed))
        params = net_init(p_init)
        if cfg.pretrain_steps:
            params, _ = pretrainer.run(params, p_train)
        return params

    loaded = (load_params(cfg.reference_params, jax.eval_shape(net_init, jax.random.PRNGKey(0)))
              if cfg.reference_params else None)

    def init(key):
        params = pretrain() if loaded is None else jax.tree.map(jnp.asarray, loaded)
        return FlowState(params=params, ref_params=params, opt_state=opt.init(params), key=key,
                         update=jnp.zeros((), jnp.int32), evals=jnp.zeros((2,), jnp.int32))

    def ode_counted(vel, x, start, stop):
        """ODE over grid steps [start, stop) and the velocity evaluations it did (rows × steps)."""
        def body(k, carry):
            x, count = carry
            return sde.ode_step(vel, x, k, T), count + x.shape[0]
        return jax.lax.fori_loop(start, stop, body, (x, jnp.zeros((), jnp.int32)))

    def rollout(params, key, cond_groups):
        """G generations per condition; returns final x (B, d), the window's states and indices, and
        the velocity evaluations done. Keys: `k_start, k_noise, k_steps = split(key, 3)`; the
        initial noise is normal(k_noise, (B, d)) (shared_prefix: (groups, d), one per group)."""
        cond = jnp.repeat(cond_groups, G)
        k_start, k_noise, k_steps = jax.random.split(key, 3)
        vel = velocity(params, cond)
        start = jax.random.randint(k_start, (), 0, cfg.max_window_start + 1) if cfg.windowed else \
            jnp.zeros((), jnp.int32)
        if cfg.sampler == "shared_prefix":
            x = jax.random.normal(k_noise, (n, d))
            x, prefix_evals = ode_counted(velocity(params, cond_groups), x, 0, start)
            x = jnp.repeat(x, G, axis=0)
        else:
            x = jax.random.normal(k_noise, (B, d))
            x, prefix_evals = ode_counted(vel, x, 0, start)

        def step(x, inp):
            j, k = inp
            x_next, _, _, _ = sde.sde_transition(vel, x, start + j, k, T, cfg.noise_level,
                                                 cfg.noise_schedule)
            return x_next, (x, x_next)

        x, (xs, xs_next) = jax.lax.scan(step, x, (jnp.arange(W), jax.random.split(k_steps, W)))
        x, suffix_evals = ode_counted(vel, x, start + W, T)
        evals = prefix_evals + B * W + suffix_evals
        return x, cond, xs, xs_next, start + jnp.arange(W), evals

    def step_stats(params, xs, xs_next, idx, cond):
        """Step Gaussians of the window under `params`: logp (B, W), mean (B, W, d), std (B, W)."""
        t = jnp.broadcast_to((idx / T)[:, None], (W, B)).astype(jnp.float32).reshape(-1)
        x = xs.reshape(W * B, d)
        c = jnp.tile(cond, W)
        v = guided_velocity(params, x, t, c)
        mean, std = sde.step_gaussian(x, v, t, T, cfg.noise_level, cfg.noise_schedule)
        logp = sde.gaussian_logprob(xs_next.reshape(W * B, d), mean, std)
        if cfg.logp_reduce == "mean":
            logp = logp / d
        swap = lambda a: jnp.swapaxes(a.reshape((W, B) + a.shape[1:]), 0, 1)
        return swap(logp), swap(mean), swap(std)

    def update(state: FlowState):
        """One Flow-GRPO policy update: rollout, rewards, advantages, μ gradient steps."""
        key, k_cond, k_roll = jax.random.split(state.key, 3)
        cond_groups = draw_conditions(k_cond, n)
        params = state.params
        x, cond, xs, xs_next, idx, evals = rollout(jax.lax.stop_gradient(params), k_roll, cond_groups)
        r = reward_fn(x, cond)
        adv, zero_std = advantages(r, cond, G, cfg.scale_rewards, cfg.adv_pool, cfg.adv_clip)
        keep = jnp.broadcast_to((~zero_std if cfg.drop_equal_groups else
                                 jnp.ones_like(zero_std))[:, None], (B, W)).astype(jnp.float32)
        if cfg.beta > 0:
            _, ref_mean, _ = step_stats(state.ref_params, xs, xs_next, idx, cond)
            evals = evals + B * W
        else:
            ref_mean = None

        def loss_fn(p, old_logp, first):
            logp, mean, std = step_stats(p, xs, xs_next, idx, cond)
            # the first iteration's old policy is the current one: ρ = 1 exactly, gradient intact
            old = jnp.where(first, jax.lax.stop_gradient(logp), old_logp)
            ref = jax.lax.stop_gradient(mean) if ref_mean is None else ref_mean
            loss, m = grpo_loss(logp, old, mean, ref, std, adv, cfg.clip_eps, cfg.beta, keep)
            return loss, (m, old)

        def inner(carry, i):
            p, opt_state, old_logp = carry
            (loss, (m, old)), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, old_logp, i == 0)
            updates, opt_state = opt.update(grads, opt_state, p)
            p = optax.apply_updates(p, updates)
            m = {**m, "loss": loss, "grad_norm": common.global_norm(grads)}
            return (p, opt_state, old), m

        (params, opt_state, _), ms = jax.lax.scan(
            inner, (params, state.opt_state, jnp.zeros((B, W))), jnp.arange(cfg.num_iterations))
        evals = evals + 3 * cfg.num_iterations * B * W
        metrics = {k: jnp.mean(v) for k, v in ms.items()}
        metrics.update(reward=jnp.mean(r), reward_std=jnp.std(r), zero_std_frac=jnp.mean(zero_std),
                       window_start=idx[0].astype(jnp.float32))
        new = state.replace(params=params, opt_state=opt_state, key=key, update=state.update + 1,
                            evals=add_evals(state.evals, evals))
        return new, metrics

    def chunk(state: FlowState):
        state, ms = jax.lax.scan(lambda s, _: update(s), state, None, length=cfg.chunk_updates)
        metrics = {k: jnp.mean(v) for k, v in ms.items()}
        metrics["reward_last"] = ms["reward"][-1]
        metrics.update(env_steps=state.update * B, grad_steps=state.update * cfg.num_iterations,
                       flops=total_evals(state.evals) * flops_per_eval,
                       param_norm=common.global_norm(state.params))
        return state, metrics

    def sample_ode(params, key, num, num_steps):
        """`num` ODE samples at `num_steps` Euler steps; conditions cycle over the classes."""
        cond = jnp.arange(num) % num_classes if num_classes else jnp.zeros((num,), jnp.int32)
        x0 = jax.random.normal(key, (num, d))
        return sde.ode_sample(velocity(params, cond), x0, num_steps), cond

    def evaluate(state: FlowState, key):
        """ODE at t_eval steps: mean reward (eval_return), fidelity to held-out data beside it
        (`fidelity.measures`, as eval_fid_*, for the policy and the reference), diversity and
        distance to the reference."""
        x, cond = sample_ode(state.params, key, cfg.eval_samples, cfg.t_eval)
        x_ref, _ = sample_ode(state.ref_params, key, cfg.eval_samples, cfg.t_eval)
        held_out, _ = ds.sample(jax.random.fold_in(jax.random.PRNGKey(cfg.pretrain_seed),
                                                   HELD_OUT_STREAM), cfg.eval_samples)
        r = reward_fn(x, cond)
        out = {"eval_return": jnp.mean(r), "eval_diversity": diversity(x, cond),
               "eval_ref_return": jnp.mean(reward_fn(x_ref, cond)),
               "eval_ref_distance": jnp.mean(jnp.linalg.norm(x - x_ref, axis=-1))}
        for name, value in fidelity.measures(cfg.dataset, x, held_out).items():
            out[f"eval_fid_{name}"] = value
        for name, value in fidelity.measures(cfg.dataset, x_ref, held_out).items():
            out[f"eval_ref_fid_{name}"] = value
        return out

    def set_hparams(state: FlowState, hp):
        return state.replace(opt_state=common.set_hyperparams(state.opt_state, learning_rate=hp["lr"]))

    return FlowAgent(init=init, chunk=chunk, evaluate=evaluate,
                     num_chunks=cfg.updates // cfg.chunk_updates,
                     param_count=velocity_param_count(cfg.backbone(), d, net_classes),
                     update=update, env_spec=None, set_hparams=set_hparams, net=net,
                     rollout=rollout, step_stats=step_stats, sample_ode=sample_ode,
                     velocity=velocity, pretrainer=pretrainer, pretrain=pretrain, dataset=ds,
                     num_classes=num_classes)


def load_params(path: str, abstract):
    """Params read from `path` (flax.serialization.to_bytes), checked against `abstract` (a tree of
    ShapeDtypeStructs: structure, shapes, dtypes); ValueError (one line) when they do not match."""
    try:
        state = flax.serialization.msgpack_restore(Path(path).read_bytes())
    except (OSError, ValueError, TypeError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"reference_params: cannot read {path!r}: {why}") from None
    want = flax.serialization.to_state_dict(abstract)
    flat_want = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(want)}
    flat_got = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(state)}
    if flat_got.keys() != flat_want.keys():
        diff = sorted(flat_got.keys() ^ flat_want.keys())
        raise ValueError(f"reference_params: {path!r} does not hold this config's velocity net "
                         f"({len(diff)} parameters differ, e.g. {diff[0]})")
    for name, w in flat_want.items():
        g = np.asarray(flat_got[name])
        if tuple(g.shape) != tuple(w.shape) or g.dtype != w.dtype:
            raise ValueError(f"reference_params: {path!r} does not hold this config's velocity net "
                             f"({name}: {g.dtype}{list(g.shape)} in the file, {w.dtype}{list(w.shape)} expected)")
    return flax.serialization.from_state_dict(abstract, state)


def diversity(x, cond):
    """Mean pairwise L2 distance between samples of the same condition (collapse -> 0)."""
    dist = jnp.sqrt(jnp.maximum(jnp.sum((x[:, None] - x[None]) ** 2, axis=-1), 0.0))
    same = (cond[:, None] == cond[None]) & ~jnp.eye(x.shape[0], dtype=bool)
    return jnp.sum(jnp.where(same, dist, 0.0)) / jnp.maximum(jnp.sum(same), 1)
