"""Pieces shared by the off-policy value learners (SAC, DQN); CRL may reuse the small helpers.

Small pure helpers: `make_optimizer` (AdamW + clipping), `polyak_update`, `global_norm`,
`linear_schedule`, `utd_schedule`, `nstep_init` / `nstep_push`, `first_episode_returns`.

`BaseConfig` holds the fields every off-policy learner has, with their validation; `OffPolicy` is
the env/replay/UTD/validation loop that turns an algorithm's pure functions (`Algorithm`) into the
agent contract of docs/architecture.md (init, chunk, evaluate, num_chunks, param_count).

How the loop spends env steps and updates (all inside one jitted `chunk`):
- UTD σ is exact, with no masking: σ·num_envs is written as U/P in lowest terms, and one *period*
  is P vectorised env steps (P·num_envs env steps) followed by U gradient steps in a `lax.scan`.
  σ=4, 1 env: P=1, U=4; σ=0.25, 1 env: P=4, U=1; σ=0.25, 4 envs: P=1, U=1. So after any number of
  periods grad_steps == σ·(env_steps - warm-up env steps) exactly; `chunk_env_steps` must be a
  multiple of P·num_envs. σ therefore changes shapes (scan lengths) and is not a traced value.
- Warm-up (`learning_starts`) happens in `init`: uniformly random actions fill the training and
  validation buffers, so every chunk is a learning chunk (no per-update `cond`, which under a seed
  vmap would become a select that pays for every skipped update).
- n-step returns: every env keeps a window of its last n one-step transitions; the oldest is complete
  once n newer steps are known and is written to the buffer as (obs, action, reward=Σγ^k r_k,
  next_obs, discount). The sum stops at the first episode end in the window; `discount` is
  γ^m·(1 - terminated) for the m steps used, so a time-limit truncation still bootstraps (from the
  true `next_obs`, not the auto-reset one) and only `terminated` cuts the bootstrap. The first n-1
  steps of a run only fill the window (they happen in `init`).
- Validation TD error (Fu et al. 2025, TD-overfitting): a second env instance with its own keys
  (`val_num_envs` copies) is stepped in lock-step with the training envs by the same behaviour
  policy (with its own exploration noise from its own rng stream); its transitions go to a separate
  buffer that only `td_error/val` reads. Training never samples it: perturbing the validation
  stream leaves the trained parameters bitwise unchanged (tests/test_sac.py).
- Chunk diagnostics (`td_error/train`, `td_error/val`, `param_norm`, `q_mean`, ...) are computed
  after the chunk's updates from keys of a separate diagnostics stream, so turning them on or off
  never changes training. `td_error/train` and `td_error/val` are the same estimator (mean squared
  TD error of the critic on one batch of `batch_size`) on the two buffers.
- Evaluation is `agent.evaluate(state, key)` (deterministic policy, `eval_episodes` fresh envs, one
  episode each); `chunk` does not evaluate (the host loop calls `evaluate` between chunks), while
  `make_train` evaluates after every chunk and stacks `eval_return` with the chunk metrics.
- Periodic resets (`reset_every` > 0): when a period's updates cross a multiple of `reset_every`
  grad steps, the learner (networks, targets, optimiser states, temperature) is re-initialised from a
  fresh key; the replay buffer is kept (Nikishin et al. 2022; D'Oro et al. 2023).
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from fractions import Fraction
from typing import Any, Callable, NamedTuple

import flax.struct
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax

from scaling_rl import envs as envs_lib
from scaling_rl import replay as replay_lib
from scaling_rl.eval_schedule import eval_schedule_error

MAX_UTD_DENOMINATOR = 64

# --------------------------------------------------------------------------------------------------
# Small pure helpers
# --------------------------------------------------------------------------------------------------


def kernel_mask(params: Any) -> Any:
    """True for weight matrices (ndim >= 2), False for biases and LayerNorm scales/offsets."""
    return jax.tree.map(lambda x: jnp.ndim(x) >= 2, params)


def _adamw(learning_rate, weight_decay, max_grad_norm: float, decay_all: bool,
           flat: bool) -> optax.GradientTransformation:
    """The optimiser `make_optimizer` wraps (learning_rate and weight_decay may be traced)."""
    parts = []
    if max_grad_norm and max_grad_norm > 0:
        parts.append(optax.clip_by_global_norm(max_grad_norm))
    if not flat:
        parts.append(optax.adamw(learning_rate, weight_decay=weight_decay,
                                 mask=None if decay_all else kernel_mask))
        return optax.chain(*parts)
    parts += [optax.scale_by_adam(), optax.scale_by_learning_rate(learning_rate)]
    inner = optax.chain(*parts)

    def decay_vector(params):
        leaves = jax.tree.leaves(params)
        return np.concatenate([np.full(int(np.size(x)), 1.0 if decay_all or np.ndim(x) >= 2 else 0.0,
                                       np.float32) for x in leaves])

    def init_fn(params):
        return inner.init(jax.flatten_util.ravel_pytree(params)[0])

    def update_fn(grads, state, params=None):
        flat_grads, unravel = jax.flatten_util.ravel_pytree(grads)
        flat_params = jax.flatten_util.ravel_pytree(params)[0]
        updates, state = inner.update(flat_grads, state, flat_params)
        # always present (x - 0 == x), so one program serves any weight decay, zero included
        updates = updates - learning_rate * weight_decay * decay_vector(params) * flat_params
        return unravel(updates), state

    return optax.GradientTransformation(init_fn, update_fn)


def make_optimizer(lr: float, weight_decay: float = 0.0, max_grad_norm: float = 0.0,
                   decay_all: bool = False, flat: bool = True) -> optax.GradientTransformation:
    """AdamW (decoupled weight decay on weight matrices only, unless `decay_all`), preceded by
    global-norm gradient clipping when `max_grad_norm` > 0. `lr` may be a float or a traced array.

    The learning rate and weight decay are optimiser *state* (`optax.inject_hyperparams`, keys
    `learning_rate`, `weight_decay`), not constants of the program: `set_hyperparams` changes them
    per seed, which is how trials that differ only in η share one vmapped program (sweep packing).

    `flat=True` runs the whole optimiser on one concatenated parameter vector (same numbers as
    `optax.adamw`; tests/test_sac.py checks): a few big fused loops instead of ~10 small ones per
    parameter leaf, which cuts XLA compile time of an update by a third and is faster on CPU.
    """
    factory = optax.inject_hyperparams(_adamw, static_args=("max_grad_norm", "decay_all", "flat"))
    return factory(learning_rate=lr, weight_decay=weight_decay, max_grad_norm=max_grad_norm,
                   decay_all=decay_all, flat=flat)


def _adam(learning_rate) -> optax.GradientTransformation:
    return optax.adam(learning_rate)  # b1, b2, eps stay Python constants (as in optax.adam)


def make_adam(lr: float) -> optax.GradientTransformation:
    """Plain Adam with only its learning rate in the optimiser state (see `make_optimizer`)."""
    return optax.inject_hyperparams(_adam)(learning_rate=lr)


def _is_injected(x) -> bool:
    return isinstance(x, optax.InjectStatefulHyperparamsState)


def set_hyperparams(opt_state: Any, **values) -> Any:
    """`opt_state` (of `make_optimizer` / `make_adam`) with hyper-parameters replaced, e.g.
    `set_hyperparams(s, learning_rate=1e-3)`; values keep the stored dtype. Unknown names raise."""
    if not _is_injected(opt_state):
        raise TypeError(f"set_hyperparams: not an inject_hyperparams state: {type(opt_state).__name__}")
    hp = dict(opt_state.hyperparams)
    for name, value in values.items():
        if name not in hp:
            raise KeyError(f"set_hyperparams: {name!r} is not one of {sorted(hp)}")
        hp[name] = jnp.asarray(value, hp[name].dtype).reshape(hp[name].shape)
    return opt_state._replace(hyperparams=hp)


# Learner entries that hold a hyper-parameter outside an optimiser state (a traced, possibly per-seed
# value: the target networks' Polyak rate τ), so trials differing in it share one packed program.
HPARAM_KEYS = ("tau",)


def copy_hyperparams(dst: Any, src: Any) -> Any:
    """`dst` with every injected optimiser state's hyper-parameters, and the `HPARAM_KEYS` entries of
    a learner dict, taken from the same place in `src` (same structure), e.g. to keep packed per-seed
    learning rates and τ across a learner reset."""
    out = jax.tree.map(lambda d, s: d._replace(hyperparams=s.hyperparams) if _is_injected(d) else d,
                       dst, src, is_leaf=_is_injected)
    if isinstance(out, dict) and isinstance(src, dict):
        out = {**out, **{k: src[k] for k in HPARAM_KEYS if k in out and k in src}}
    return out


def polyak_update(target: Any, online: Any, tau: float | jax.Array) -> Any:
    """target <- (1 - tau)·target + tau·online, leafwise (tau=1 copies); `tau` a number or a traced
    scalar (the learner's own `tau` entry, per seed when packed)."""
    return jax.tree.map(lambda t, o: t + tau * (o - t), target, online)


def global_norm(tree: Any) -> jax.Array:
    """L2 norm of all leaves of a pytree together (parameter norm: a plasticity proxy)."""
    return optax.tree.norm(tree)


def linear_schedule(start: float, end: float, duration: float, step: jax.Array) -> jax.Array:
    """Linear interpolation from `start` (step 0) to `end` (step >= duration), then constant."""
    frac = jnp.clip(jnp.asarray(step, jnp.float32) / max(float(duration), 1.0), 0.0, 1.0)
    return start + frac * (end - start)


class UTDSchedule(NamedTuple):
    """One period = `vector_steps` vectorised env steps, then `updates` gradient steps."""

    vector_steps: int
    updates: int


def utd_fraction(utd: float) -> Fraction:
    """σ as an exact small fraction (0.25 -> 1/4, 1/3 -> 1/3); ValueError if it is not one."""
    frac = Fraction(utd).limit_denominator(MAX_UTD_DENOMINATOR)
    if frac <= 0 or abs(float(frac) - utd) > 1e-9 * max(1.0, abs(utd)):
        raise ValueError(f"utd: {utd!r} is not a positive fraction with denominator <= "
                         f"{MAX_UTD_DENOMINATOR}; use e.g. 0.25, 0.5, 1, 2 or 8")
    return frac


def utd_schedule(utd: float, num_envs: int) -> UTDSchedule:
    """Exact period structure for σ gradient steps per env step with `num_envs` envs per vector step."""
    per_vector_step = utd_fraction(utd) * num_envs
    return UTDSchedule(vector_steps=per_vector_step.denominator, updates=per_vector_step.numerator)


def nstep_init(n: int, example: dict) -> dict:
    """An empty window of the last `n` one-step transitions; `example` is one batched transition."""
    return jax.tree.map(lambda x: jnp.zeros((n,) + jnp.shape(x), jnp.asarray(x).dtype), example)


def nstep_push(window: dict, transition: dict, gamma: float) -> tuple[dict, dict]:
    """Append a batched one-step transition and return (window, n-step transition of the oldest).

    `transition` has obs, action, reward, next_obs, terminated, done, each with leading axis
    num_envs. The returned transition (obs, action, reward, next_obs, discount) starts at the oldest
    window entry; it is only meaningful once the window has seen n pushes. Returns stop at the first
    episode end inside the window; `discount` = γ^m (1 - terminated) of the m-th (last used) step.
    """
    window = jax.tree.map(lambda w, x: jnp.concatenate([w[1:], x[None].astype(w.dtype)]), window,
                          transition)
    n = window["reward"].shape[0]
    done = window["done"].astype(jnp.float32)  # (n, E)
    # included[k] = 1 while no earlier step in the window ended the episode.
    alive_before = jnp.concatenate([jnp.ones_like(done[:1]), 1.0 - done[:-1]], axis=0)
    included = jnp.cumprod(alive_before, axis=0)
    powers = gamma ** jnp.arange(n, dtype=jnp.float32)
    reward = jnp.sum(powers[:, None] * window["reward"] * included, axis=0)
    last = (jnp.sum(included, axis=0) - 1).astype(jnp.int32)  # (E,) index of the last step used
    envs_idx = jnp.arange(last.shape[0])
    next_obs = window["next_obs"][last, envs_idx]
    terminated = window["terminated"][last, envs_idx].astype(jnp.float32)
    discount = gamma ** (last.astype(jnp.float32) + 1.0) * (1.0 - terminated)
    out = {"obs": window["obs"][0], "action": window["action"][0], "reward": reward,
           "next_obs": next_obs, "discount": discount}
    return window, out


def first_episode_returns(env, act_fn: Callable, key: jax.Array, obs_stats=None) -> jax.Array:
    """Return of the first episode of each of `env.num_envs` fresh envs under `act_fn(obs)`.

    With `obs_stats` (training statistics of a normalising env) those are used, frozen, from the
    second observation on (the reset observation is normalised by its own batch).
    """
    env_state, obs = env.reset(key)
    if obs_stats is not None:
        env_state = env_state.replace(obs_stats=obs_stats)
    n = env.num_envs

    def step(carry, _):
        env_state, obs, ret, finished = carry
        env_state, ts = env.step(env_state, act_fn(obs), update_obs_stats=False)
        ret = jnp.where(ts.done & ~finished, ts.episode_return, ret)
        return (env_state, ts.obs, ret, finished | ts.done), None

    init = (env_state, obs, jnp.zeros((n,), jnp.float32), jnp.zeros((n,), bool))
    (_, _, ret, _), _ = jax.lax.scan(step, init, None, length=env.spec.max_episode_steps)
    return ret


# --------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------

BACKBONES = ("bro", "simba", "crl", "mlp")


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _is_num(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


@dataclasses.dataclass(frozen=True)
class BaseConfig:
    """Fields shared by the off-policy value learners; subclasses add their own and a default env.

    Units: `env_steps`, `learning_starts`, `chunk_env_steps`, `buffer_size` count single env
    transitions (one vectorised step of num_envs envs = num_envs env steps); `reset_every` counts
    gradient steps. `utd` = gradient steps per env step (σ), may be < 1.
    """

    env: str = "gymnax/Pendulum-v1"
    num_envs: int = 1
    env_steps: int = 20_000           # total per seed, including the warm-up
    utd: float = 1.0                  # σ: gradient steps per env step
    batch_size: int = 256
    lr: float = 3e-4
    weight_decay: float = 1e-4        # AdamW, on weight matrices
    max_grad_norm: float = 10.0       # global-norm clipping; 0 disables
    width: int = 256
    depth: int = 2                    # residual blocks (bro/simba/mlp) or Dense layers (crl)
    backbone: str = "bro"
    activation: str | None = None     # None: the backbone kind's own
    scan: bool = True                 # scan the depth stack (compile time flat in depth)
    remat: bool = False
    compute_dtype: str = "float32"
    tau: float = 0.005                # Polyak rate of the target networks, per gradient step
    gamma: float = 0.99
    n_step: int = 1
    reset_every: int = 0              # re-initialise the learner every K gradient steps; 0: never
    learning_starts: int = 1_000      # env steps of uniformly random actions before learning
    buffer_size: int = 100_000
    val_num_envs: int = 1             # envs of the held-out validation stream
    val_buffer_size: int = 10_000
    chunk_env_steps: int = 1_000      # env steps per jitted host chunk
    eval_episodes: int = 10           # deterministic eval: this many fresh envs, one episode each
    eval_schedule: str = "linear"     # host-loop evals: "linear" (every eval_every chunks) or "log"
    eval_points: int = 16             # "log": evaluations, log-spaced in env steps (train.eval_chunks)
    normalize_obs: bool = False
    data_parallel: bool = False       # shard each update's batch over all devices (axis `data`)

    def __post_init__(self):
        self._validate()

    # Subclasses extend `_validate` (call super first).
    def _validate(self) -> None:
        for key in ("num_envs", "env_steps", "batch_size", "width", "depth", "n_step", "buffer_size",
                    "val_num_envs", "val_buffer_size", "chunk_env_steps", "eval_episodes"):
            v = getattr(self, key)
            if not _is_int(v) or v < 1:
                raise ValueError(f"{key}: must be an integer >= 1, got {v!r}; e.g. {_example(key)}")
        if (err := eval_schedule_error(self.eval_schedule, self.eval_points)) is not None:
            raise ValueError(err)
        for key in ("reset_every", "learning_starts"):
            v = getattr(self, key)
            if not _is_int(v) or v < 0:
                raise ValueError(f"{key}: must be an integer >= 0, got {v!r}; use 0 to disable")
        for key in ("utd", "lr", "tau", "gamma", "weight_decay", "max_grad_norm"):
            if not _is_num(getattr(self, key)):
                raise ValueError(f"{key}: must be a number, got {getattr(self, key)!r}")
        if not self.utd > 0:
            raise ValueError(f"utd: must be > 0 (gradient steps per env step), got {self.utd}; "
                             "e.g. 0.25, 1 or 8")
        utd_fraction(self.utd)
        if not self.lr > 0:
            raise ValueError(f"lr: must be > 0, got {self.lr}; e.g. 3e-4")
        if not 0 < self.tau <= 1:
            raise ValueError(f"tau: must be in (0, 1], got {self.tau}; e.g. 0.005")
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"gamma: must be in [0, 1], got {self.gamma}; e.g. 0.99")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay: must be >= 0, got {self.weight_decay}; e.g. 1e-4")
        if self.max_grad_norm < 0:
            raise ValueError(f"max_grad_norm: must be >= 0 (0 disables), got {self.max_grad_norm}")
        if self.backbone not in BACKBONES:
            raise ValueError(f"backbone: unknown {self.backbone!r}; use one of {', '.join(BACKBONES)}")
        if self.backbone == "crl" and self.depth % 4:
            raise ValueError(f"depth: crl depth counts Dense layers, a multiple of 4, got {self.depth}; "
                             f"use {max(4, self.depth // 4 * 4)}")
        if self.batch_size > self.buffer_size:
            raise ValueError(f"batch_size: {self.batch_size} exceeds the replay capacity buffer_size="
                             f"{self.buffer_size}; lower batch_size or raise buffer_size")
        if self.batch_size > self.val_buffer_size:
            raise ValueError(f"batch_size: {self.batch_size} exceeds val_buffer_size="
                             f"{self.val_buffer_size}; raise val_buffer_size")
        if self.env not in envs_lib.known():
            raise ValueError(f"env: unknown {self.env!r}; known envs: {', '.join(envs_lib.known())}")
        if self.learning_starts % self.num_envs:
            raise ValueError(f"learning_starts: {self.learning_starts} is not a multiple of num_envs="
                             f"{self.num_envs}; use {_round_up(self.learning_starts, self.num_envs)}")
        sched = utd_schedule(self.utd, self.num_envs)
        period = sched.vector_steps * self.num_envs
        if self.chunk_env_steps % period:
            raise ValueError(f"chunk_env_steps: {self.chunk_env_steps} is not a multiple of the UTD "
                             f"period ({period} env steps for utd={self.utd}, num_envs={self.num_envs}); "
                             f"use {_round_up(self.chunk_env_steps, period)}")
        if self.env_steps < self.warmup_env_steps + self.chunk_env_steps:
            raise ValueError(f"env_steps: {self.env_steps} leaves no learning chunk after "
                             f"{self.warmup_env_steps} warm-up env steps; use at least "
                             f"{self.warmup_env_steps + self.chunk_env_steps}")
        if self.data_parallel and self.batch_size % jax.device_count():
            raise ValueError(f"batch_size: {self.batch_size} does not split over "
                             f"{jax.device_count()} devices for data_parallel; use a multiple")

    @property
    def warmup_env_steps(self) -> int:
        """Env steps taken in `init`: max(learning_starts, (n_step - 1)·num_envs)."""
        return max(self.learning_starts, (self.n_step - 1) * self.num_envs)

    @property
    def num_chunks(self) -> int:
        """Chunks after the warm-up; the last one may overshoot env_steps by < chunk_env_steps."""
        return math.ceil((self.env_steps - self.warmup_env_steps) / self.chunk_env_steps)

    @classmethod
    def from_dict(cls, d: dict):
        """Build from a plain dict (e.g. parsed JSON); unknown keys are a one-line error."""
        return config_from_dict(cls, d)

    def to_dict(self) -> dict:
        """Plain dict of the fields (JSON-serialisable)."""
        return dataclasses.asdict(self)


def config_from_dict(cls, d: dict):
    """Any agent's frozen Config dataclass from a plain dict (e.g. parsed JSON): unknown keys are a
    one-line error, JSON number types are coerced to the field's int/float type."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"{unknown[0]}: not a field of {cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}; "
                         f"known: {', '.join(sorted(names))}")
    hints = typing.get_type_hints(cls)
    return cls(**{k: _coerce(v, hints.get(k)) for k, v in d.items()})


def _coerce(value, hint):
    """JSON gives ints for floats like 1.0 -> keep; floats for int fields like 1000.0 -> int."""
    if hint is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if hint is float and _is_int(value):
        return float(value)
    return value


def _round_up(x: int, m: int) -> int:
    return max(m, -(-x // m) * m)


def _example(key: str) -> str:
    return {"batch_size": "256", "width": "256", "depth": "2", "n_step": "1 or 3"}.get(key, "1")


# --------------------------------------------------------------------------------------------------
# The off-policy loop
# --------------------------------------------------------------------------------------------------


class Algorithm(NamedTuple):
    """The pure functions an off-policy learner supplies; `learner` is its own pytree (params, target
    params, optimiser states, temperature...). Actions are in the agent's units ([-1, 1] continuous,
    int32 discrete)."""

    init: Callable[[jax.Array], Any]                                # key -> learner
    act: Callable[[Any, jax.Array, jax.Array, jax.Array], jax.Array]  # (learner, obs, key, env_steps)
    act_eval: Callable[[Any, jax.Array], jax.Array]                 # deterministic (learner, obs)
    update: Callable[[Any, dict, jax.Array], tuple[Any, dict]]      # one gradient step
    td_error: Callable[[Any, dict, jax.Array], jax.Array]           # mean squared TD error on a batch
    diagnostics: Callable[[Any], dict]                              # param_norm etc.
    # (learner, {name: scalar}) -> learner with those optimiser hyper-parameters (`PACKABLE` names)
    set_hparams: Callable[[Any, dict], Any] | None = None


@flax.struct.dataclass
class TrainState:
    """Everything a run carries between chunks (a pytree; no Python-side state)."""

    learner: Any
    env_state: Any
    obs: jax.Array
    window: dict
    replay: Any
    val_env_state: Any
    val_obs: jax.Array
    val_window: dict
    val_replay: Any
    rng: jax.Array        # training stream: behaviour noise, batch sampling, update noise, resets
    val_rng: jax.Array    # behaviour noise of the validation envs only
    diag_rng: jax.Array   # chunk diagnostics only (never touches training)
    env_steps: jax.Array  # int32
    grad_steps: jax.Array  # int32
    chunk: jax.Array       # int32, chunks done


class Agent(NamedTuple):
    """The agent contract (docs/architecture.md) plus the one-step `update` for tests/parallel."""

    init: Callable
    chunk: Callable
    evaluate: Callable
    num_chunks: int
    param_count: int
    update: Callable       # (learner, batch, key) -> (learner, metrics): one gradient step
    env_spec: Any
    # (state, {name: scalar}) -> state whose optimisers use those hyper-parameters (the agent
    # module's `PACKABLE` names; values from its `hparams(cfg)`); None: nothing is packable
    set_hparams: Callable | None = None
    # (seed-stacked state) -> (state, metrics): a chunk run from the host instead of `chunk` (which
    # then raises): a learner whose update is several programs dispatched by the host (crl overlap=true)
    host_chunk: Callable | None = None


def _transition(obs, action, ts) -> dict:
    return {"obs": obs, "action": action, "reward": ts.reward, "next_obs": ts.next_obs,
            "terminated": ts.terminated, "done": ts.done}


def example_transition(spec) -> dict:
    """One stored (n-step) transition without batch axis (what the replay buffers hold)."""
    action = (jnp.zeros((), jnp.int32) if spec.discrete else jnp.zeros((spec.action_dim,), jnp.float32))
    obs = jnp.zeros((spec.obs_dim,), jnp.float32)
    return {"obs": obs, "action": action, "reward": jnp.zeros((), jnp.float32), "next_obs": obs,
            "discount": jnp.zeros((), jnp.float32)}


def random_actions(spec, key: jax.Array, n: int) -> jax.Array:
    """Uniform actions in the agent's units for `n` envs."""
    if spec.discrete:
        return jax.random.randint(key, (n,), 0, spec.num_actions, jnp.int32)
    return jax.random.uniform(key, (n, spec.action_dim), jnp.float32, -1.0, 1.0)


def build_agent(cfg: BaseConfig, algo: Algorithm, param_count: int, env_spec=None) -> Agent:
    """Wrap `algo` in the env / replay / UTD / validation loop described in the module docstring."""
    env = envs_lib.make(cfg.env, num_envs=cfg.num_envs, normalize_obs=cfg.normalize_obs)
    val_env = envs_lib.make(cfg.env, num_envs=cfg.val_num_envs, normalize_obs=cfg.normalize_obs)
    eval_env = envs_lib.make(cfg.env, num_envs=cfg.eval_episodes, normalize_obs=cfg.normalize_obs)
    spec = env.spec
    sched = utd_schedule(cfg.utd, cfg.num_envs)
    periods_per_chunk = cfg.chunk_env_steps // (sched.vector_steps * cfg.num_envs)
    warmup_vector_steps = cfg.warmup_env_steps // cfg.num_envs
    prefill_vector_steps = cfg.n_step - 1  # window-only steps (no complete n-step transition yet)
    example = example_transition(spec)
    gamma = cfg.gamma

    def env_step(env_, env_state, obs, window, buf, action, store: bool):
        env_state, ts = env_.step(env_state, action)
        window, out = nstep_push(window, _transition(obs, action, ts), gamma)
        if store:
            buf = replay_lib.add(buf, out)
        ret_sum = jnp.sum(jnp.where(ts.done, ts.episode_return, 0.0))
        return env_state, ts.obs, window, buf, ret_sum, jnp.sum(ts.done)

    def empty_window(n_envs: int) -> dict:
        one = {"obs": jnp.zeros((n_envs, spec.obs_dim), jnp.float32),
               "action": jnp.zeros((n_envs,) + spec.action_shape, example["action"].dtype),
               "reward": jnp.zeros((n_envs,), jnp.float32),
               "next_obs": jnp.zeros((n_envs, spec.obs_dim), jnp.float32),
               "terminated": jnp.zeros((n_envs,), bool), "done": jnp.zeros((n_envs,), bool)}
        return nstep_init(cfg.n_step, one)

    def init(key: jax.Array) -> TrainState:
        k_learner, k_env, k_val_env, k_rng, k_val, k_diag, k_warm, k_val_warm = jax.random.split(key, 8)
        env_state, obs = env.reset(k_env)
        val_env_state, val_obs = val_env.reset(k_val_env)
        carry = (env_state, obs, empty_window(cfg.num_envs), replay_lib.init(cfg.buffer_size, example),
                 val_env_state, val_obs, empty_window(cfg.val_num_envs),
                 replay_lib.init(cfg.val_buffer_size, example))

        def warm_step(store):
            def step(carry, keys):
                es, o, w, b, ves, vo, vw, vb = carry
                es, o, w, b, _, _ = env_step(env, es, o, w, b, random_actions(spec, keys[0], cfg.num_envs),
                                             store)
                ves, vo, vw, vb, _, _ = env_step(val_env, ves, vo, vw, vb,
                                                 random_actions(spec, keys[1], cfg.val_num_envs), store)
                return (es, o, w, b, ves, vo, vw, vb), None
            return step

        def keys_for(k, n):
            return jnp.stack([jax.random.split(k, max(n, 1)),
                              jax.random.split(jax.random.fold_in(k, 1), max(n, 1))], axis=1)[:n]

        n_pre = min(prefill_vector_steps, warmup_vector_steps)
        if n_pre:
            carry, _ = jax.lax.scan(warm_step(False), carry, keys_for(k_warm, n_pre))
        if warmup_vector_steps - n_pre:
            carry, _ = jax.lax.scan(warm_step(True), carry,
                                    keys_for(k_val_warm, warmup_vector_steps - n_pre))
        es, o, w, b, ves, vo, vw, vb = carry
        return TrainState(
            learner=algo.init(k_learner), env_state=es, obs=o, window=w, replay=b,
            val_env_state=ves, val_obs=vo, val_window=vw, val_replay=vb,
            rng=k_rng, val_rng=k_val, diag_rng=k_diag,
            env_steps=jnp.asarray(warmup_vector_steps * cfg.num_envs, jnp.int32),
            grad_steps=jnp.zeros((), jnp.int32), chunk=jnp.zeros((), jnp.int32))

    def vector_step(state: TrainState, _):
        rng, k_act = jax.random.split(state.rng)
        val_rng, k_val_act = jax.random.split(state.val_rng)
        action = algo.act(state.learner, state.obs, k_act, state.env_steps)
        val_action = algo.act(state.learner, state.val_obs, k_val_act, state.env_steps)
        env_state, obs, window, buf, ret_sum, n_done = env_step(
            env, state.env_state, state.obs, state.window, state.replay, action, True)
        val_env_state, val_obs, val_window, val_buf, _, _ = env_step(
            val_env, state.val_env_state, state.val_obs, state.val_window, state.val_replay,
            val_action, True)
        state = state.replace(env_state=env_state, obs=obs, window=window, replay=buf,
                              val_env_state=val_env_state, val_obs=val_obs, val_window=val_window,
                              val_replay=val_buf, rng=rng, val_rng=val_rng,
                              env_steps=state.env_steps + cfg.num_envs)
        return state, (ret_sum, n_done)

    def grad_step(state: TrainState, _):
        rng, k_sample, k_update = jax.random.split(state.rng, 3)
        batch = replay_lib.sample(state.replay, k_sample, cfg.batch_size)
        learner, metrics = algo.update(state.learner, batch, k_update)
        return state.replace(learner=learner, rng=rng, grad_steps=state.grad_steps + 1), metrics

    def period(state: TrainState, _):
        state, (ret_sum, n_done) = jax.lax.scan(vector_step, state, None, length=sched.vector_steps)
        old_grad_steps = state.grad_steps
        state, metrics = jax.lax.scan(grad_step, state, None, length=sched.updates)
        if cfg.reset_every:
            crossed = (state.grad_steps // cfg.reset_every) > (old_grad_steps // cfg.reset_every)
            rng, k_reset = jax.random.split(state.rng)
            # a reset keeps the (possibly per-seed, packed) optimiser hyper-parameters
            learner = jax.lax.cond(crossed, lambda: copy_hyperparams(algo.init(k_reset), state.learner),
                                   lambda: state.learner)
            state = state.replace(learner=learner, rng=rng)
        metrics = jax.tree.map(lambda m: jnp.mean(m, axis=0), metrics)
        return state, (jnp.sum(ret_sum), jnp.sum(n_done), metrics)

    def chunk(state: TrainState) -> tuple[TrainState, dict]:
        state, (ret_sum, n_done, metrics) = jax.lax.scan(period, state, None, length=periods_per_chunk)
        metrics = jax.tree.map(lambda m: jnp.mean(m, axis=0), metrics)
        episodes = jnp.sum(n_done)
        k_train, k_val, k_td_train, k_td_val = jax.random.split(
            jax.random.fold_in(state.diag_rng, state.chunk), 4)
        train_batch = replay_lib.sample(state.replay, k_train, cfg.batch_size)
        val_batch = replay_lib.sample(state.val_replay, k_val, cfg.batch_size)
        metrics.update(algo.diagnostics(state.learner))
        metrics["td_error/train"] = algo.td_error(state.learner, train_batch, k_td_train)
        metrics["td_error/val"] = algo.td_error(state.learner, val_batch, k_td_val)
        metrics["episode_return"] = jnp.where(episodes > 0, jnp.sum(ret_sum) / jnp.maximum(episodes, 1),
                                              jnp.nan)
        metrics["episodes"] = episodes.astype(jnp.int32)
        metrics["env_steps"] = state.env_steps
        metrics["grad_steps"] = state.grad_steps
        return state.replace(chunk=state.chunk + 1), metrics

    def evaluate(state: TrainState, key: jax.Array) -> dict:
        obs_stats = state.env_state.obs_stats if cfg.normalize_obs else None
        rets = first_episode_returns(eval_env, lambda obs: algo.act_eval(state.learner, obs), key,
                                     obs_stats)
        return {"eval_return": jnp.mean(rets), "eval_return_std": jnp.std(rets)}

    set_hparams = None
    if algo.set_hparams is not None:
        def set_hparams(state: TrainState, hp: dict) -> TrainState:
            return state.replace(learner=algo.set_hparams(state.learner, hp))

    return Agent(init=init, chunk=chunk, evaluate=evaluate, num_chunks=cfg.num_chunks,
                 param_count=int(param_count), update=algo.update, env_spec=spec,
                 set_hparams=set_hparams)


def make_train_from_agent(agent: Agent) -> Callable[[jax.Array], tuple[TrainState, dict]]:
    """Pure `train(key)`: init, then `num_chunks` chunks in a scan, evaluating after each chunk."""

    def train(key: jax.Array):
        k_init, k_eval = jax.random.split(key)
        state = agent.init(k_init)

        def body(state, i):
            state, metrics = agent.chunk(state)
            metrics.update(agent.evaluate(state, jax.random.fold_in(k_eval, i)))
            return state, metrics

        return jax.lax.scan(body, state, jnp.arange(agent.num_chunks))

    return train


__all__ = [name for name, obj in list(globals().items())
           if not name.startswith("_") and not isinstance(obj, types.ModuleType)]
