"""Pure-JAX 2-D point-mass maze: goal-conditioned, layouts as data, tens of thousands of steps/s on CPU.

The agent is a point in a grid maze whose cells are 1 x 1 (cell (r, c) spans x in [c, c+1),
y in [r, r+1)). Actions are 2-D in [-1, 1], scaled by `max_speed` and applied either as a velocity
(default) or as a force on a damped velocity. Walls block motion axis by axis (the point slides along
a wall instead of sticking to it). Start and goal are drawn uniformly inside free cells (distinct cells).

Observation = concat(state, goal): state = position (x, y) [+ velocity for `dynamics="force"`],
goal = target position. Success = ||position - goal|| < `success_threshold`. The reward is the success
indicator, so `episode_return` is the paper's *time at goal*. Episodes never terminate, they truncate
at `max_episode_steps` (as in the paper's brax tasks).

Registered names: `point_maze/open`, `point_maze/u_maze`, `point_maze/big_maze`, `point_maze/snake_maze`
(more layouts: add a tuple of strings to `LAYOUTS`).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from scaling_rl.envs import register
from scaling_rl.envs.core import EnvSpec, VectorEnv
from scaling_rl.envs.goal import GoalSpec

# '#' wall, '.' free. Outer walls are part of the layout.
LAYOUTS: dict[str, tuple[str, ...]] = {
    "open": (
        "#######",
        "#.....#",
        "#.....#",
        "#.....#",
        "#.....#",
        "#.....#",
        "#######",
    ),
    "u_maze": (
        "#####",
        "#...#",
        "###.#",
        "#...#",
        "#####",
    ),
    "big_maze": (
        "##########",
        "#..#.....#",
        "#..#.##..#",
        "#....#...#",
        "####.#.###",
        "#....#...#",
        "#.##...#.#",
        "#..#.#.#.#",
        "#....#...#",
        "##########",
    ),
    # a serpentine corridor: cells one wall apart can be ~20 cells apart along the path, so the
    # critic's embedding must "unfold" the maze (the CPU-scale depth study's task)
    "snake_maze": (
        "###########",
        "#.........#",
        "#########.#",
        "#.........#",
        "#.#########",
        "#.........#",
        "#########.#",
        "#.........#",
        "###########",
    ),
}


def layout_walls(layout: str | tuple[str, ...]) -> np.ndarray:
    """Boolean (H, W) wall grid of a named or literal layout (row 0 is y in [0, 1))."""
    rows = LAYOUTS[layout] if isinstance(layout, str) else tuple(layout)
    if len({len(r) for r in rows}) != 1:
        raise ValueError("layout: rows have different lengths; use a rectangular list of strings")
    walls = np.array([[ch == "#" for ch in r] for r in rows], dtype=bool)
    if walls.all():
        raise ValueError("layout: no free cell; mark free cells with '.'")
    return walls


class PointMazeState(NamedTuple):
    """One env's state (VectorEnv adds the env axis, rng, step counter and episode statistics)."""

    pos: jax.Array            # (2,)
    vel: jax.Array            # (2,) (zero for velocity dynamics)
    goal: jax.Array           # (2,)


class PointMaze(VectorEnv):
    """Vectorised point-mass maze: a `VectorEnv` plus `goal_spec`, `success(obs)` and the wall grid.

    Actions in [-1, 1]^2 are mapped by VectorEnv onto [-max_speed, max_speed]^2 (clipped). Each step's
    `TimeStep.info["success"]` is the per-step success flag; `reward` is the same flag as float.
    """

    def __init__(self, num_envs: int, layout: str | tuple[str, ...] = "u_maze", *, name: str | None = None,
                 max_episode_steps: int = 100, max_speed: float = 0.25, success_threshold: float = 0.5,
                 dynamics: str = "velocity", damping: float = 0.5, normalize_obs: bool = False):
        if dynamics not in ("velocity", "force"):
            raise ValueError(f"dynamics: {dynamics!r} unknown; use 'velocity' or 'force'")
        if not 0 < max_speed < 1:
            raise ValueError(f"max_speed: {max_speed} must be in (0, 1) so a step cannot jump a wall; e.g. 0.25")
        if normalize_obs:
            raise ValueError("normalize_obs: goal-conditioned envs keep raw goals; use normalize_obs=False")
        self.walls_np = layout_walls(layout)
        self.walls = jnp.asarray(self.walls_np)
        free = np.argwhere(~self.walls_np)                                 # (n_free, 2) as (row, col)
        self.free_cells = jnp.asarray(free[:, ::-1].astype(np.float32))    # (x, y) of cell corners
        self.max_speed = float(max_speed)
        self.success_threshold = float(success_threshold)
        self.dynamics = dynamics
        self.damping = float(damping)
        state_dim = 2 if dynamics == "velocity" else 4
        self.goal_spec = GoalSpec(state_dim=state_dim, goal_indices=(0, 1),
                                  success_threshold=self.success_threshold)
        spec = EnvSpec(
            name=name or f"point_maze/{layout if isinstance(layout, str) else 'custom'}",
            obs_dim=state_dim + 2, action_dim=2, discrete=False, num_actions=0,
            action_low=(-self.max_speed,) * 2, action_high=(self.max_speed,) * 2,
            max_episode_steps=int(max_episode_steps))
        super().__init__(spec, self._reset_one, self._step_one, num_envs)

    def _sample_start_goal(self, key):
        n = self.free_cells.shape[0]
        k_first, k_second, k_start, k_goal = jax.random.split(key, 4)
        # two distinct free cells, uniform jitter inside each (kept 0.1 away from cell edges)
        first = jax.random.randint(k_first, (), 0, n)
        second = (first + jax.random.randint(k_second, (), 1, max(n, 2))) % n
        jit_s = jax.random.uniform(k_start, (2,), minval=0.1, maxval=0.9)
        jit_g = jax.random.uniform(k_goal, (2,), minval=0.1, maxval=0.9)
        return self.free_cells[first] + jit_s, self.free_cells[second] + jit_g

    def _blocked(self, p):
        h, w = self.walls_np.shape
        c = jnp.clip(jnp.floor(p[0]).astype(jnp.int32), 0, w - 1)
        r = jnp.clip(jnp.floor(p[1]).astype(jnp.int32), 0, h - 1)
        return self.walls[r, c]

    def _move(self, pos, delta):
        # axis by axis, so a blocked axis slides along the wall; |delta| < 1 so no tunnelling
        px = pos.at[0].add(delta[0])
        hit_x = self._blocked(px)
        pos = jnp.where(hit_x, pos, px)
        py = pos.at[1].add(delta[1])
        hit_y = self._blocked(py)
        return jnp.where(hit_y, pos, py), jnp.stack([hit_x, hit_y])

    def _obs(self, s: PointMazeState):
        state = s.pos if self.dynamics == "velocity" else jnp.concatenate([s.pos, s.vel])
        return jnp.concatenate([state, s.goal]).astype(jnp.float32)

    def _reset_one(self, key):
        pos, goal = self._sample_start_goal(key)
        s = PointMazeState(pos, jnp.zeros(2, jnp.float32), goal)
        return s, self._obs(s)

    def _step_one(self, s: PointMazeState, action, key):
        del key                                   # deterministic dynamics
        if self.dynamics == "velocity":
            vel = action
        else:
            vel = jnp.clip((1.0 - self.damping) * s.vel + action, -self.max_speed, self.max_speed)
        pos, hit = self._move(s.pos, vel)
        if self.dynamics == "force":
            vel = jnp.where(hit, 0.0, vel)        # a wall stops motion along its normal
        s = PointMazeState(pos, vel, s.goal)
        reached = jnp.linalg.norm(pos - s.goal) < self.success_threshold
        return (s, self._obs(s), reached.astype(jnp.float32), jnp.zeros((), bool), jnp.zeros((), bool),
                {"success": reached})

    def success(self, obs: jax.Array) -> jax.Array:
        """Success flag from observations of any leading shape (position vs goal)."""
        goal = obs[..., self.goal_spec.state_dim:]
        return jnp.linalg.norm(obs[..., :2] - goal, axis=-1) < self.success_threshold


def make_point_maze(num_envs: int, layout: str = "u_maze", **kw) -> PointMaze:
    """Factory: `make_point_maze(num_envs, layout, max_episode_steps=..., max_speed=..., ...)`."""
    return PointMaze(num_envs, layout, **kw)


for _layout in LAYOUTS:
    register(f"point_maze/{_layout}",
             lambda num_envs, _l=_layout, **kw: PointMaze(num_envs, _l, name=f"point_maze/{_l}", **kw))
