"""Goal-conditioned brax tasks: obs = concat(state, goal), success = ||state[goal_indices] - goal|| < threshold.

Every env here is a `VectorEnv` with two extras the goal-conditioned agents use:
  env.goal_spec      GoalSpec(state_dim, goal_indices, success_threshold)
  env.success(obs)   success flag from observations (any leading shape)
and every step reports `TimeStep.info["success"]`; the reward is that flag as float, so the episode
return is the paper's *time at goal*. Episodes never terminate (unhealthy termination is off), they
truncate at `max_episode_steps` (default 1000, as in the paper).

Tasks (registered as `goal/<name>`):
  reacher          2-link arm; state = cos q, sin q, qdot, fingertip (x, y); goal = brax's own target
                   (uniform in a disc of radius 0.2); threshold 0.05.
  pusher           7-dof arm pushing a cylinder; state = q[:7], qdot[:7], arm tip xyz, object xyz;
                   goal = an (x, y) for the object, sampled away from it; threshold 0.1.
  ant              (x, y) goal at a uniform angle and radius in [goal_radius_min, goal_radius_max];
                   state = ant qpos (with torso x, y) + qvel; threshold 0.5.
  humanoid         like ant, with the humanoid torso; threshold 0.5.
  ant_<layout>     ant in a maze built from `ANT_MAZES[layout]` (walls = boxes in the MJCF);
                   'R' marks the start cell, 'G' the goal cells ('.' free); threshold 0.5.

brax is imported only when an env is built, so importing this module (which `envs.make` does) is cheap.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from scaling_rl.envs import register
from scaling_rl.envs.core import EnvSpec, VectorEnv


@dataclasses.dataclass(frozen=True)
class GoalSpec:
    """Where the goal lives: obs = concat(state[:state_dim], goal[goal_dim]); achieved goal = state[goal_indices]."""

    state_dim: int
    goal_indices: tuple[int, ...]
    success_threshold: float

    @property
    def goal_dim(self) -> int:
        return len(self.goal_indices)

    def achieved(self, state_or_obs: jax.Array) -> jax.Array:
        """Achieved goal of a state (or of the state part of an observation)."""
        return state_or_obs[..., jnp.asarray(self.goal_indices)]

    def success(self, obs: jax.Array) -> jax.Array:
        """Success flag of observations (any leading shape)."""
        goal = obs[..., self.state_dim:]
        return jnp.linalg.norm(self.achieved(obs) - goal, axis=-1) < self.success_threshold


# Ant mazes: '#' wall, '.' free, 'R' start, 'G' goal cell(s). Cell size in metres is `maze_cell`.
ANT_MAZES: dict[str, tuple[str, ...]] = {
    "u_maze": (
        "#####",
        "#R..#",
        "###.#",
        "#G..#",
        "#####",
    ),
    "u4_maze": (
        "######",
        "#R...#",
        "####.#",
        "#G...#",
        "######",
    ),
    "big_maze": (
        "########",
        "#R.#...#",
        "#..#.#.#",
        "##...#.#",
        "#..#...#",
        "#.#.##.#",
        "#...#.G#",
        "########",
    ),
}


class GoalEnv(VectorEnv):
    """A brax env made goal-conditioned.

    base: a brax env. state_fn(pipeline_state) -> state vector. sample_goal(key, base_state) ->
    (base_state, goal): draws the goal and may move things in the scene to show it.
    """

    def __init__(self, name: str, base: Any, num_envs: int, *, state_fn: Callable, sample_goal: Callable,
                 goal_indices: tuple[int, ...], success_threshold: float, max_episode_steps: int = 1000,
                 normalize_obs: bool = False):
        if normalize_obs:
            raise ValueError("normalize_obs: goal-conditioned envs keep raw goals; use normalize_obs=False")
        self.base = base
        self._state_fn = state_fn
        self._sample_goal = sample_goal
        example = jax.eval_shape(lambda k: state_fn(base.reset(k).pipeline_state), jax.random.key(0))
        state_dim = int(example.shape[-1])
        if max(goal_indices) >= state_dim:
            raise ValueError(f"goal_indices: {goal_indices} outside a state of size {state_dim}; "
                             f"use indices below {state_dim}")
        self.goal_spec = GoalSpec(state_dim, tuple(int(i) for i in goal_indices), float(success_threshold))
        ones = (1.0,) * int(base.action_size)
        spec = EnvSpec(name, state_dim + len(goal_indices), int(base.action_size), False, 0,
                       tuple(-x for x in ones), ones, int(max_episode_steps))
        super().__init__(spec, self._reset_one, self._step_one, num_envs)

    def _observe(self, base_state, goal):
        state = self._state_fn(base_state.pipeline_state)
        obs = jnp.concatenate([state, goal]).astype(jnp.float32)
        return obs, jnp.linalg.norm(state[jnp.asarray(self.goal_spec.goal_indices)] - goal) < \
            self.goal_spec.success_threshold

    def _reset_one(self, key):
        k_base, k_goal = jax.random.split(key)
        base_state, goal = self._sample_goal(k_goal, self.base.reset(k_base))
        goal = jnp.asarray(goal, jnp.float32)
        return (base_state, goal), self._observe(base_state, goal)[0]

    def _step_one(self, inner, action, key):
        del key
        base_state, goal = inner
        base_state = self.base.step(base_state, action)
        obs, success = self._observe(base_state, goal)
        no = jnp.zeros((), bool)
        return (base_state, goal), obs, success.astype(jnp.float32), no, no, {"success": success}

    def success(self, obs: jax.Array) -> jax.Array:
        """Success flag of observations (any leading shape)."""
        return self.goal_spec.success(obs)


# --- tasks ------------------------------------------------------------------------------------------
def _disc_goal(key, radius_min: float, radius_max: float, centre=(0.0, 0.0)):
    k_r, k_a = jax.random.split(key)
    r = jax.random.uniform(k_r, (), minval=radius_min, maxval=radius_max)
    a = jax.random.uniform(k_a, (), minval=0.0, maxval=2 * jnp.pi)
    return jnp.asarray(centre) + r * jnp.array([jnp.cos(a), jnp.sin(a)])


def make_reacher(num_envs: int, *, backend: str = "positional", max_episode_steps: int = 1000, **kw):
    from brax import base as brax_base
    from brax.envs.reacher import Reacher

    env = Reacher(backend=backend)
    tip_offset = brax_base.Transform.create(pos=jnp.array([0.11, 0.0, 0.0]))

    def state_fn(ps):
        theta = ps.q[:2]
        tip = ps.x.take(1).do(tip_offset).pos
        return jnp.concatenate([jnp.cos(theta), jnp.sin(theta), ps.qd[:2], tip[:2]])

    def sample_goal(key, s):
        del key  # brax's reset already drew the target; it is our goal (and stays visible)
        return s, s.pipeline_state.x.pos[2, :2]

    return GoalEnv("goal/reacher", env, num_envs, state_fn=state_fn, sample_goal=sample_goal,
                   goal_indices=(6, 7), success_threshold=0.05, max_episode_steps=max_episode_steps, **kw)


def make_pusher(num_envs: int, *, backend: str = "positional", max_episode_steps: int = 1000,
                min_goal_distance: float = 0.1, **kw):
    from brax.envs.pusher import Pusher

    env = Pusher(backend=backend)
    obj, goal_link, tips = env._object_idx, env._goal_idx, env._tips_arm_idx

    def state_fn(ps):
        return jnp.concatenate([ps.q[:7], ps.qd[:7], ps.x.pos[tips], ps.x.pos[obj]])

    def sample_goal(key, s):
        ps = s.pipeline_state
        # the goal body rides on two slide joints (last two q); move it to a random spot
        # at least `min_goal_distance` from the object
        cyl = ps.q[-4:-2]
        offset = _disc_goal(key, min_goal_distance, min_goal_distance + 0.25)
        q = ps.q.at[-2:].set(cyl + offset)
        ps = env.pipeline_init(q, ps.qd)
        s = s.replace(pipeline_state=ps, obs=env._get_obs(ps))
        return s, ps.x.pos[goal_link, :2]

    return GoalEnv("goal/pusher", env, num_envs, state_fn=state_fn, sample_goal=sample_goal,
                   goal_indices=(17, 18), success_threshold=0.1, max_episode_steps=max_episode_steps, **kw)


def _qpos_qvel(ps):
    return jnp.concatenate([ps.q, ps.qd])


def make_ant(num_envs: int, *, backend: str = "positional", max_episode_steps: int = 1000,
             goal_radius_min: float = 2.0, goal_radius_max: float = 6.0, **kw):
    from brax.envs.ant import Ant

    env = Ant(backend=backend, terminate_when_unhealthy=False, exclude_current_positions_from_observation=False)
    return GoalEnv("goal/ant", env, num_envs, state_fn=_qpos_qvel,
                   sample_goal=lambda k, s: (s, _disc_goal(k, goal_radius_min, goal_radius_max)),
                   goal_indices=(0, 1), success_threshold=0.5, max_episode_steps=max_episode_steps, **kw)


def make_humanoid(num_envs: int, *, backend: str = "positional", max_episode_steps: int = 1000,
                  goal_radius_min: float = 1.0, goal_radius_max: float = 4.0, **kw):
    from brax.envs.humanoid import Humanoid

    env = Humanoid(backend=backend, terminate_when_unhealthy=False,
                   exclude_current_positions_from_observation=False)
    return GoalEnv("goal/humanoid", env, num_envs, state_fn=_qpos_qvel,
                   sample_goal=lambda k, s: (s, _disc_goal(k, goal_radius_min, goal_radius_max)),
                   goal_indices=(0, 1), success_threshold=0.5, max_episode_steps=max_episode_steps, **kw)


def maze_cells(layout: tuple[str, ...], cell: float):
    """(walls, start_xy, goal_xys): world centres of wall cells, the 'R' cell and the 'G' cells
    (every free cell when there is no 'G'). Row r, column c has centre (c * cell, r * cell)."""
    if len({len(r) for r in layout}) != 1:
        raise ValueError("layout: rows have different lengths; use a rectangular list of strings")
    grid = np.array([list(r) for r in layout])
    centre = lambda rc: np.array([rc[1] * cell, rc[0] * cell], np.float32)  # noqa: E731
    walls = [centre(rc) for rc in np.argwhere(grid == "#")]
    starts = np.argwhere(grid == "R")
    if len(starts) != 1:
        raise ValueError(f"layout: needs exactly one 'R' start cell, found {len(starts)}; mark one with 'R'")
    goals = np.argwhere(grid == "G")
    if len(goals) == 0:
        goals = np.argwhere(np.isin(grid, [".", "G"]))
    return np.array(walls), centre(starts[0]), np.array([centre(rc) for rc in goals])


def maze_xml(base_xml: str, walls: np.ndarray, cell: float, height: float = 1.0) -> str:
    """Insert one static box per wall cell into an MJCF world (colliding with the robot's feet)."""
    boxes = "".join(
        f'<geom name="wall_{i}" type="box" pos="{x:.3f} {y:.3f} {height / 2:.3f}" '
        f'size="{cell / 2:.3f} {cell / 2:.3f} {height / 2:.3f}" contype="0" conaffinity="1" '
        f'rgba="0.7 0.5 0.3 1"/>\n'
        for i, (x, y) in enumerate(walls))
    anchor = "<worldbody>"
    if anchor not in base_xml:
        raise ValueError("base_xml: no <worldbody> to add walls to; pass an MJCF model")
    return base_xml.replace(anchor, anchor + "\n" + boxes, 1)


def make_ant_maze(num_envs: int, layout: str | tuple[str, ...] = "u_maze", *, backend: str = "positional",
                  max_episode_steps: int = 1000, maze_cell: float = 4.0, goal_jitter: float = 0.5, **kw):
    from brax.envs.ant import Ant
    from brax.io import mjcf
    from etils import epath

    rows = ANT_MAZES[layout] if isinstance(layout, str) else tuple(layout)
    walls, start, goals = maze_cells(rows, maze_cell)
    env = Ant(backend=backend, terminate_when_unhealthy=False, exclude_current_positions_from_observation=False)
    xml = (epath.resource_path("brax") / "envs/assets/ant.xml").read_text()
    sys = mjcf.loads(maze_xml(xml, walls, maze_cell))
    # keep the backend-specific tuning brax's Ant applied to its own system
    sys = sys.tree_replace({"opt.timestep": env.sys.opt.timestep})
    env.sys = sys.replace(actuator=sys.actuator.replace(gear=env.sys.actuator.gear))
    start_j, goals_j = jnp.asarray(start), jnp.asarray(goals)

    def sample_goal(key, s):
        ps = s.pipeline_state
        q = ps.q.at[:2].add(start_j)                 # brax's noisy init, moved to the start cell
        ps = env.pipeline_init(q, ps.qd)
        k_cell, k_jit = jax.random.split(key)
        g = goals_j[jax.random.randint(k_cell, (), 0, goals_j.shape[0])]
        g = g + jax.random.uniform(k_jit, (2,), minval=-goal_jitter, maxval=goal_jitter)
        return s.replace(pipeline_state=ps, obs=env._get_obs(ps)), g

    name = f"goal/ant_{layout if isinstance(layout, str) else 'custom'}"
    genv = GoalEnv(name, env, num_envs, state_fn=_qpos_qvel, sample_goal=sample_goal, goal_indices=(0, 1),
                   success_threshold=0.5, max_episode_steps=max_episode_steps, **kw)
    genv.maze_walls = walls
    return genv


register("goal/reacher", make_reacher)
register("goal/pusher", make_pusher)
register("goal/ant", make_ant)
register("goal/humanoid", make_humanoid)
for _maze in ANT_MAZES:
    register(f"goal/ant_{_maze}", functools.partial(make_ant_maze, layout=_maze))
