"""Trajectory-aware replay with hindsight future-goal sampling (jittable, pure).

Storage is time-major per env: every leaf is (T, E, ...), one row per vectorised env step, written as a
ring over T. Each stored step carries the id of the episode it belongs to (a per-env counter that
increments after `done`), so in logical (oldest -> newest) order the ids of one env are non-decreasing
and the steps of one episode are contiguous.

`sample` picks a step i uniformly over all stored (t, env) pairs and an offset k >= 0 within the SAME
episode with P(k) proportional to gamma**k, truncated at the newest stored step of that episode. With
`future` fields that describe the transition's *next* state (e.g. the achieved goal of next_obs), the
future state is s_{i+1+k}: a state j > i with P ∝ gamma**(j - i). Episode boundaries are never
crossed: the end of i's episode is found by binary search over episode ids.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp


class TrajectoryBuffer(NamedTuple):
    data: Any                   # pytree, leaves (T, E, ...)
    episode_id: jax.Array       # (T, E) int32
    episode_counter: jax.Array  # (E,) int32 id of each env's current episode
    head: jax.Array             # () int32 next row to write
    size: jax.Array             # () int32 rows filled (<= T)


def init(capacity: int, num_envs: int, example: Any) -> TrajectoryBuffer:
    """Empty buffer of `capacity` rows of `num_envs` steps; `example` = pytree of ONE step of one env."""
    if capacity < 2:
        raise ValueError(f"capacity: {capacity} rows is too small for future sampling; use >= 2")
    data = jax.tree.map(lambda x: jnp.zeros((capacity, num_envs) + jnp.shape(x), jnp.asarray(x).dtype), example)
    return TrajectoryBuffer(data=data, episode_id=jnp.zeros((capacity, num_envs), jnp.int32),
                            episode_counter=jnp.zeros((num_envs,), jnp.int32),
                            head=jnp.zeros((), jnp.int32), size=jnp.zeros((), jnp.int32))


def capacity(buf: TrajectoryBuffer) -> int:
    return buf.episode_id.shape[0]


def nbytes(capacity_rows: int, num_envs: int, example: Any) -> int:
    """Bytes held by a buffer of this shape (data + episode ids)."""
    per = sum(jnp.asarray(x).size * jnp.asarray(x).dtype.itemsize for x in jax.tree.leaves(example))
    return int(capacity_rows * num_envs * (per + 4))


def add(buf: TrajectoryBuffer, step: Any, done: jax.Array) -> TrajectoryBuffer:
    """Write one vectorised step (leaves (E, ...)); `done` (E,) closes each env's episode after it."""
    t = buf.head
    data = jax.tree.map(lambda d, x: jax.lax.dynamic_update_index_in_dim(d, x.astype(d.dtype), t, 0),
                        buf.data, step)
    ids = jax.lax.dynamic_update_index_in_dim(buf.episode_id, buf.episode_counter, t, 0)
    cap = capacity(buf)
    return TrajectoryBuffer(data=data, episode_id=ids,
                            episode_counter=buf.episode_counter + done.astype(jnp.int32),
                            head=(t + 1) % cap, size=jnp.minimum(buf.size + 1, cap))


def _physical(buf: TrajectoryBuffer, logical):
    """Row of logical index (0 = oldest stored)."""
    cap = capacity(buf)
    return (buf.head - buf.size + logical) % cap


def episode_last_index(buf: TrajectoryBuffer, logical, env):
    """Logical index of the newest stored step of the episode that holds (logical, env)."""
    cap = capacity(buf)
    target = buf.episode_id[_physical(buf, logical), env]
    lo, hi = logical, buf.size - 1          # invariant: id[lo] == target, answer in [lo, hi]

    def body(_, lohi):
        lo, hi = lohi
        mid = (lo + hi + 1) // 2
        same = buf.episode_id[_physical(buf, mid), env] == target
        return jnp.where(same, mid, lo), jnp.where(same, hi, mid - 1)

    lo, hi = jax.lax.fori_loop(0, max(1, int(cap).bit_length()), body, (lo, hi))
    return lo


def truncated_geometric(key, gamma: float, max_offset):
    """k in {0, ..., max_offset} with P(k) ∝ gamma**k (inverse CDF; exact for each max_offset)."""
    u = jax.random.uniform(key, jnp.shape(max_offset))
    n = max_offset.astype(jnp.float32) + 1.0
    # P(K < k) = (1 - gamma**k) / (1 - gamma**n)  ->  k = floor(log(1 - u (1 - gamma**n)) / log gamma)
    k = jnp.floor(jnp.log1p(-u * (1.0 - gamma ** n)) / jnp.log(gamma))
    return jnp.clip(k, 0, max_offset).astype(jnp.int32)


def sample(buf: TrajectoryBuffer, key, batch_size: int, gamma: float = 0.99):
    """(now, future, offset): `now` = pytree at step i; `future` = same pytree at step i + offset of the
    same episode, offset >= 0 with P ∝ gamma**offset. Leaves are (batch_size, ...)."""
    k_env, k_t, k_off = jax.random.split(key, 3)
    num_envs = buf.episode_id.shape[1]
    env = jax.random.randint(k_env, (batch_size,), 0, num_envs)
    logical = jax.random.randint(k_t, (batch_size,), 0, jnp.maximum(buf.size, 1))
    last = jax.vmap(episode_last_index, in_axes=(None, 0, 0))(buf, logical, env)
    offset = truncated_geometric(k_off, gamma, last - logical)
    rows_now = _physical(buf, logical)
    rows_fut = _physical(buf, logical + offset)
    now = jax.tree.map(lambda d: d[rows_now, env], buf.data)
    fut = jax.tree.map(lambda d: d[rows_fut, env], buf.data)
    return now, fut, offset
