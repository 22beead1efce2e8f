"""gymnax backend: classic control and MinAtar as `gymnax/<EnvId>` (observations flattened).

We drive gymnax's own `reset_env`/`step_env` (no gymnax auto-reset) so that `VectorEnv` sees the
true next observation and owns resets; gymnax's time limit is set to our `max_episode_steps` and its
`is_truncated` flag is OR-ed with our step counter.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from scaling_rl.envs.core import EnvSpec, VectorEnv

GYMNAX_IDS = (
    "Pendulum-v1",
    "CartPole-v1",
    "Acrobot-v1",
    "MountainCar-v0",
    "MountainCarContinuous-v0",
    "Breakout-MinAtar",
    "SpaceInvaders-MinAtar",
    "Asterix-MinAtar",
    "Freeway-MinAtar",
)


def _bounds(space, shape: tuple[int, ...]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    low = np.broadcast_to(np.asarray(space.low, np.float32), shape).reshape(-1)
    high = np.broadcast_to(np.asarray(space.high, np.float32), shape).reshape(-1)
    return tuple(float(x) for x in low), tuple(float(x) for x in high)


def make_gymnax(
    env_id: str,
    num_envs: int = 1,
    normalize_obs: bool = False,
    *,
    max_episode_steps: int | None = None,
    env_params: dict | None = None,
    obs_clip: float = 10.0,
) -> VectorEnv:
    """Build a `VectorEnv` over gymnax `env_id`.

    max_episode_steps: time limit (default: gymnax's `max_steps_in_episode`).
    env_params: overrides of gymnax `EnvParams` fields, e.g. {"max_speed": 10.0}.
    """
    import gymnax
    from gymnax.environments import spaces

    env, params = gymnax.make(env_id)
    if env_params:
        params = params.replace(**env_params)
    limit = int(max_episode_steps or params.max_steps_in_episode)
    params = params.replace(max_steps_in_episode=limit)

    obs_dim = int(math.prod(env.observation_space(params).shape))
    action_space = env.action_space(params)
    if isinstance(action_space, spaces.Discrete):
        n = int(action_space.n)
        spec = EnvSpec(f"gymnax/{env_id}", obs_dim, n, True, n, (), (), limit)
    else:
        shape = tuple(action_space.shape)
        low, high = _bounds(action_space, shape)
        spec = EnvSpec(f"gymnax/{env_id}", obs_dim, int(math.prod(shape)), False, 0, low, high, limit)

    def reset_fn(key):
        obs, state = env.reset_env(key, params)
        return state, jnp.reshape(obs, (-1,))

    def step_fn(state, action, key):
        obs, state, reward, terminated, _ = env.step_env(key, state, action, params)
        return state, jnp.reshape(obs, (-1,)), reward, terminated, env.is_truncated(state, params), {}

    return VectorEnv(spec, reset_fn, step_fn, num_envs, normalize_obs, obs_clip)
