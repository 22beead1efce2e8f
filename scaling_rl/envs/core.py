"""The one env API: a pure, batched, auto-resetting vector env built from single-env functions.

A backend adapter (gymnax, brax, point maze, goal wrappers) supplies two pure single-env functions

    reset_fn(key) -> (inner_state, obs)                                   # obs: (obs_dim,)
    step_fn(inner_state, action, key) -> (inner_state, obs, reward, terminated, truncated, info)

where `action` is already in the env's own units and `truncated` is the backend's own time-limit flag
(False if it has none). `VectorEnv` vmaps them over `num_envs` and adds, once for every backend:
the rng kept in the state, our own step counter and time limit, auto-reset, episode statistics,
action rescaling from [-1, 1] and optional running observation normalisation.

Conventions (the contract in docs/architecture.md):
- Continuous actions are given in [-1, 1] (clipped there) and mapped affinely onto
  [action_low, action_high]. Discrete actions are int32 indices of shape (num_envs,).
- `terminated`: the MDP reached a terminal state (do not bootstrap). `truncated`: the episode was cut
  by the time limit (ours at `max_episode_steps`, or the backend's own) and did NOT terminate, so
  exactly one of them is set when an episode ends. `done = terminated | truncated`.
- `next_obs` is the true next observation of the transition (before auto-reset, use it to
  bootstrap); `obs` is what to act on next (the fresh reset observation where `done`).
- `episode_return` / `episode_length` hold the finished episode's totals where `done`, 0 elsewhere,
  so the mean over finished episodes is `sum(ret * done) / sum(done)`.
- With `normalize_obs=True` both `obs` and `next_obs` are normalised as
  clip((x - mean) / sqrt(var + 1e-8), -obs_clip, obs_clip) with running statistics (Chan/Welford
  merge of per-step batch moments) kept in `state.obs_stats`; they are updated with the reset batch
  and then with every step's raw `next_obs` batch, unless `step(..., update_obs_stats=False)`
  (evaluation envs: copy the training stats in with `state.replace(obs_stats=...)`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import struct

_NORM_EPS = 1e-8


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """Static description of an env (hashable; safe to close over in jitted code).

    Discrete envs: action shape (), `num_actions` = n, `action_dim` = n (the policy-head size),
    `action_low`/`action_high` = (). Continuous envs: action shape (action_dim,), `num_actions` = 0,
    `action_low`/`action_high` = per-dimension bounds of the env's own units (what [-1, 1] maps to).
    """

    name: str
    obs_dim: int
    action_dim: int
    discrete: bool
    num_actions: int
    action_low: tuple[float, ...]
    action_high: tuple[float, ...]
    max_episode_steps: int

    @property
    def action_shape(self) -> tuple[int, ...]:
        """Shape of one env's action: () for discrete, (action_dim,) for continuous."""
        return () if self.discrete else (self.action_dim,)


@struct.dataclass
class ObsStats:
    """Running observation moments over every observation seen so far (count weighs the merge)."""

    count: jax.Array  # float32 scalar
    mean: jax.Array  # (obs_dim,)
    var: jax.Array  # (obs_dim,), population variance


@struct.dataclass
class EnvState:
    """Batched env state; every leaf has leading axis num_envs except `rng` and `obs_stats`."""

    inner: Any  # backend state pytree, leading axis num_envs
    rng: jax.Array  # one key; split each step
    step_count: jax.Array  # int32 (num_envs,): steps taken in the current episode
    episode_return: jax.Array  # float32 (num_envs,): running return of the current episode
    episode_length: jax.Array  # int32 (num_envs,)
    obs_stats: ObsStats


@struct.dataclass
class TimeStep:
    """One batched transition; see the module docstring for the exact meaning of each field."""

    obs: jax.Array  # (num_envs, obs_dim) float32
    next_obs: jax.Array  # (num_envs, obs_dim) float32
    reward: jax.Array  # (num_envs,) float32
    terminated: jax.Array  # (num_envs,) bool
    truncated: jax.Array  # (num_envs,) bool
    done: jax.Array  # (num_envs,) bool
    episode_return: jax.Array  # (num_envs,) float32, valid where done (0 elsewhere)
    episode_length: jax.Array  # (num_envs,) int32, valid where done (0 elsewhere)
    info: dict = struct.field(default_factory=dict)  # backend extras, each (num_envs, ...)


def init_obs_stats(obs_dim: int) -> ObsStats:
    """Empty statistics: the first merge replaces them by the batch moments exactly."""
    return ObsStats(
        count=jnp.zeros((), jnp.float32),
        mean=jnp.zeros((obs_dim,), jnp.float32),
        var=jnp.ones((obs_dim,), jnp.float32),
    )


def merge_obs_stats(stats: ObsStats, batch: jax.Array) -> ObsStats:
    """Merge the moments of `batch` (n, obs_dim) into `stats` (parallel Welford / Chan et al.)."""
    n = jnp.asarray(batch.shape[0], jnp.float32)
    b_mean = batch.mean(axis=0)
    b_var = batch.var(axis=0)
    total = stats.count + n
    delta = b_mean - stats.mean
    mean = stats.mean + delta * (n / total)
    m2 = stats.var * stats.count + b_var * n + jnp.square(delta) * (stats.count * n / total)
    return ObsStats(count=total, mean=mean, var=m2 / total)


def apply_obs_norm(stats: ObsStats, obs: jax.Array, clip: float) -> jax.Array:
    """Standardise `obs` with `stats` and clip to [-clip, clip]."""
    z = (obs - stats.mean) / jnp.sqrt(stats.var + _NORM_EPS)
    return jnp.clip(z, -clip, clip)


def _strong(tree: Any, like: Any) -> Any:
    """Cast every leaf of `tree` to the (strong) dtype of `like`, so reset and step states match."""
    def cast(x, a):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            return x
        return jax.lax.convert_element_type(x, a.dtype)

    return jax.tree.map(cast, tree, like)


def _where_done(done: jax.Array, on_done: Any, otherwise: Any) -> Any:
    """Leafwise select along the leading env axis."""

    def select(a, b):
        mask = done.reshape(done.shape + (1,) * (a.ndim - 1))
        return jnp.where(mask, a, b)

    return jax.tree.map(select, on_done, otherwise)


class VectorEnv:
    """A batched, pure, auto-resetting env over `num_envs` copies of one single-env backend.

    `reset(key) -> (state, obs)` and `step(state, action) -> (state, TimeStep)` are pure functions of
    their arguments (jit/vmap/scan them freely); the object itself holds only static configuration.
    """

    def __init__(
        self,
        spec: EnvSpec,
        reset_fn: Callable,
        step_fn: Callable,
        num_envs: int = 1,
        normalize_obs: bool = False,
        obs_clip: float = 10.0,
    ):
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs: must be a positive int, got {num_envs!r}; e.g. num_envs=8")
        if spec.max_episode_steps < 1:
            raise ValueError(
                f"max_episode_steps: must be >= 1, got {spec.max_episode_steps}; e.g. 1000"
            )
        self.spec = spec
        self.num_envs = num_envs
        self.normalize_obs = bool(normalize_obs)
        self.obs_clip = float(obs_clip)
        self._reset_fn = reset_fn
        self._step_fn = step_fn
        self._inner_like = {}  # dtypes of one env's inner state after a step, per key type

    def __repr__(self) -> str:
        return (
            f"VectorEnv({self.spec.name!r}, num_envs={self.num_envs}, "
            f"normalize_obs={self.normalize_obs})"
        )

    # -- helpers -----------------------------------------------------------------------------------
    def _inner_dtypes(self, key: jax.Array) -> Any:
        """Abstract single-env inner state after one step: its dtypes are the canonical ones.

        Cached per key type, since a backend may keep (typed or raw uint32) keys in its state.
        """
        abstract_key = jax.ShapeDtypeStruct(key.shape, key.dtype)
        cache_key = (str(key.dtype), tuple(key.shape))
        if cache_key not in self._inner_like:

            def one_step(key):
                inner, _ = self._reset_fn(key)
                action = jnp.zeros(self.spec.action_shape, self._action_dtype())
                return self._step_fn(inner, action, key)[0]

            self._inner_like[cache_key] = jax.eval_shape(one_step, abstract_key)
        return self._inner_like[cache_key]

    def _action_dtype(self):
        return jnp.int32 if self.spec.discrete else jnp.float32

    def _env_action(self, action: jax.Array) -> jax.Array:
        """Map the agent's action onto the env's units (see module docstring)."""
        if self.spec.discrete:
            return jnp.asarray(action).astype(jnp.int32).reshape((self.num_envs,))
        action = jnp.asarray(action, jnp.float32).reshape((self.num_envs, self.spec.action_dim))
        low = jnp.asarray(self.spec.action_low, jnp.float32)
        high = jnp.asarray(self.spec.action_high, jnp.float32)
        return low + (jnp.clip(action, -1.0, 1.0) + 1.0) * 0.5 * (high - low)

    def _batched_reset(self, key: jax.Array) -> tuple[Any, jax.Array]:
        inner, obs = jax.vmap(self._reset_fn)(jax.random.split(key, self.num_envs))
        inner = _strong(inner, self._inner_dtypes(key))
        return inner, jnp.asarray(obs, jnp.float32).reshape((self.num_envs, self.spec.obs_dim))

    def _present(self, stats: ObsStats, obs: jax.Array) -> jax.Array:
        return apply_obs_norm(stats, obs, self.obs_clip) if self.normalize_obs else obs

    # -- API ---------------------------------------------------------------------------------------
    def reset(self, key: jax.Array) -> tuple[EnvState, jax.Array]:
        """Reset all envs; returns (state, obs) with obs (num_envs, obs_dim) float32."""
        rng, reset_key = jax.random.split(key)
        inner, obs = self._batched_reset(reset_key)
        stats = init_obs_stats(self.spec.obs_dim)
        if self.normalize_obs:
            stats = merge_obs_stats(stats, obs)
        zeros_i = jnp.zeros((self.num_envs,), jnp.int32)
        state = EnvState(
            inner=inner,
            rng=rng,
            step_count=zeros_i,
            episode_return=jnp.zeros((self.num_envs,), jnp.float32),
            episode_length=zeros_i,
            obs_stats=stats,
        )
        return state, self._present(stats, obs)

    def step(
        self, state: EnvState, action: jax.Array, update_obs_stats: bool = True
    ) -> tuple[EnvState, TimeStep]:
        """Step all envs with `action`, auto-resetting finished ones; returns (state, TimeStep)."""
        rng, step_key, reset_key = jax.random.split(state.rng, 3)
        env_action = self._env_action(action)
        inner, next_obs, reward, terminated, env_truncated, info = jax.vmap(self._step_fn)(
            state.inner, env_action, jax.random.split(step_key, self.num_envs)
        )
        inner = _strong(inner, self._inner_dtypes(state.rng))
        next_obs = jnp.asarray(next_obs, jnp.float32).reshape((self.num_envs, self.spec.obs_dim))
        reward = jnp.asarray(reward, jnp.float32).reshape((self.num_envs,))
        terminated = jnp.asarray(terminated).astype(bool).reshape((self.num_envs,))
        step_count = state.step_count + 1
        time_up = (step_count >= self.spec.max_episode_steps) | jnp.asarray(env_truncated).astype(
            bool
        ).reshape((self.num_envs,))
        truncated = time_up & ~terminated
        done = terminated | truncated

        # Only pay for a batched reset when some env finished (a select under an outer vmap).
        def reset_done(operands):
            inner, obs = operands
            fresh_inner, fresh_obs = self._batched_reset(reset_key)
            return _where_done(done, fresh_inner, inner), _where_done(done, fresh_obs, obs)

        inner, obs = jax.lax.cond(jnp.any(done), reset_done, lambda o: o, (inner, next_obs))

        ep_return = state.episode_return + reward
        ep_length = state.episode_length + 1
        stats = state.obs_stats
        if self.normalize_obs and update_obs_stats:
            stats = merge_obs_stats(stats, next_obs)
        new_state = EnvState(
            inner=inner,
            rng=rng,
            step_count=jnp.where(done, 0, step_count),
            episode_return=jnp.where(done, 0.0, ep_return),
            episode_length=jnp.where(done, 0, ep_length),
            obs_stats=stats,
        )
        ts = TimeStep(
            obs=self._present(stats, obs),
            next_obs=self._present(stats, next_obs),
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            done=done,
            episode_return=jnp.where(done, ep_return, 0.0),
            episode_length=jnp.where(done, ep_length, 0),
            info=info,
        )
        return new_state, ts

    def sample_action(self, key: jax.Array) -> jax.Array:
        """Uniformly random batched action in the agent's action space (for tests and warm-up)."""
        if self.spec.discrete:
            return jax.random.randint(key, (self.num_envs,), 0, self.spec.num_actions, jnp.int32)
        return jax.random.uniform(
            key, (self.num_envs, self.spec.action_dim), jnp.float32, -1.0, 1.0
        )
