"""Point-mass maze: layouts (snake corridor), walls, goal sampling, auto-reset, success, throughput."""
import collections
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scaling_rl import envs
from scaling_rl.envs import point_maze as pm


def _free(walls, p):
    x, y = np.floor(np.asarray(p)).astype(int).T
    return ~walls[y, x]


def _path_lengths(walls, start):
    """Breadth-first cell distances from `start` (row, col) to every free cell it can reach."""
    free = {tuple(c) for c in np.argwhere(~walls)}
    dist, todo = {start: 0}, collections.deque([start])
    while todo:
        r, c = todo.popleft()
        for n in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
            if n in free and n not in dist:
                dist[n] = dist[(r, c)] + 1
                todo.append(n)
    return free, dist


@pytest.mark.parametrize("layout", sorted(pm.LAYOUTS))
def test_layouts_are_connected_and_walled(layout):
    walls = pm.layout_walls(layout)
    assert walls[0].all() and walls[-1].all() and walls[:, 0].all() and walls[:, -1].all()
    free, dist = _path_lengths(walls, tuple(np.argwhere(~walls)[0]))
    assert set(dist) == free


def test_snake_maze_neighbours_across_a_wall_are_far_along_the_path():
    free, dist = _path_lengths(pm.layout_walls("snake_maze"), (1, 1))
    # one corridor of 39 cells: (row 1, col 1) and (row 3, col 1) are 2 apart in space, 18 along it
    assert len(free) == 39 and max(dist.values()) == 38 and dist[(3, 1)] == 18
    assert envs.make("point_maze/snake_maze", num_envs=2).spec.name == "point_maze/snake_maze"


def test_registered_and_reset_in_free_distinct_cells():
    env = envs.make("point_maze/u_maze", num_envs=64)
    assert env.spec.obs_dim == 4 and env.spec.action_dim == 2 and not env.spec.discrete
    assert env.goal_spec.state_dim == 2 and env.goal_spec.goal_indices == (0, 1)
    state, obs = jax.jit(env.reset)(jax.random.PRNGKey(0))
    assert obs.shape == (64, 4) and obs.dtype == jnp.float32
    walls = env.walls_np
    assert _free(walls, obs[:, :2]).all() and _free(walls, obs[:, 2:]).all()
    assert (np.floor(obs[:, :2]) != np.floor(obs[:, 2:])).any(axis=1).all()


def test_walls_block_and_slide():
    env = pm.PointMaze(1, "u_maze", max_speed=0.25)
    state, _ = env.reset(jax.random.PRNGKey(0))
    # cell (row 1, col 1); the cell below (row 2, col 1) is a wall, the one to the right is free
    state = state.replace(inner=state.inner._replace(pos=jnp.array([[1.5, 1.5]]), goal=jnp.array([[3.5, 3.5]])))
    step = jax.jit(env.step)
    for _ in range(10):
        state, ts = step(state, jnp.array([[0.4, 1.0]]))       # push into the wall, drift right
    x, y = np.asarray(ts.next_obs[0, :2])
    assert 1.5 < y < 2.0                         # stopped at the wall (moved down only inside its cell)
    assert x == pytest.approx(1.5 + 10 * 0.1, abs=1e-5)   # kept sliding along x


def test_random_walk_never_enters_walls():
    env = pm.PointMaze(32, "big_maze", max_episode_steps=50)
    state, obs = env.reset(jax.random.PRNGKey(1))

    def step(state, key):
        a = jax.random.uniform(key, (32, 2), minval=-2, maxval=2)     # out-of-range actions get clipped
        state, ts = env.step(state, a)
        return state, ts.next_obs[:, :2]

    _, pos = jax.lax.scan(step, state, jax.random.split(jax.random.PRNGKey(2), 200))
    assert _free(env.walls_np, pos.reshape(-1, 2)).all()
    steps = np.linalg.norm(np.diff(np.asarray(pos[:40]), axis=0), axis=-1)
    assert steps.max() <= 0.25 * np.sqrt(2) + 1e-5


def test_success_reward_truncation_and_auto_reset():
    env = pm.PointMaze(2, "open", max_episode_steps=5, success_threshold=0.5)
    state, _ = env.reset(jax.random.PRNGKey(3))
    state = state.replace(inner=state.inner._replace(pos=jnp.array([[2.5, 2.5], [2.5, 2.5]]),
                                                     goal=jnp.array([[2.6, 2.5], [5.5, 5.5]])))
    total = np.zeros(2)
    step = jax.jit(env.step)
    for t in range(5):
        state, ts = step(state, jnp.zeros((2, 2)))
        total += np.asarray(ts.reward)
        assert np.array_equal(np.asarray(env.success(ts.next_obs)), [True, False])
        assert np.array_equal(np.asarray(ts.info["success"]), [True, False])
        assert np.array_equal(np.asarray(env.goal_spec.success(ts.next_obs)), [True, False])
        assert bool(ts.done.any()) == (t == 4)
    assert np.array_equal(np.asarray(ts.truncated), [True, True]) and not ts.terminated.any()
    np.testing.assert_allclose(ts.episode_return, [5.0, 0.0])     # time at goal
    np.testing.assert_allclose(total, [5.0, 0.0])
    assert np.array_equal(np.asarray(ts.episode_length), [5, 5])
    np.testing.assert_allclose(ts.next_obs[0, :2], [2.5, 2.5])      # true last obs, before the reset
    assert not np.allclose(ts.obs[:, 2:], [[2.6, 2.5], [5.5, 5.5]])   # new goals after auto-reset
    assert (np.asarray(state.step_count) == 0).all() and (np.asarray(state.episode_return) == 0).all()


def test_force_dynamics_has_velocity_state():
    env = pm.PointMaze(4, "open", dynamics="force")
    state, obs = jax.jit(env.reset)(jax.random.PRNGKey(0))
    assert obs.shape == (4, 6) and env.goal_spec.state_dim == 4
    state, ts = jax.jit(env.step)(state, jnp.ones((4, 2)))
    np.testing.assert_allclose(ts.next_obs[:, 2:4], 0.25)


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(ValueError, match="max_speed"):
        pm.PointMaze(1, "open", max_speed=1.5)
    with pytest.raises(ValueError, match="dynamics"):
        pm.PointMaze(1, "open", dynamics="teleport")
    with pytest.raises(ValueError, match="layout"):
        pm.PointMaze(1, ("###", "##"))


def test_throughput_tens_of_thousands_steps_per_second():
    n, steps = 256, 200
    env = pm.PointMaze(n, "u_maze")

    @jax.jit
    def rollout(key):
        state, _ = env.reset(key)

        def step(state, k):
            state, ts = env.step(state, jax.random.uniform(k, (n, 2), minval=-1, maxval=1))
            return state, ts.reward.sum()
        return jax.lax.scan(step, state, jax.random.split(key, steps))[1].sum()

    rollout(jax.random.PRNGKey(0)).block_until_ready()
    t0 = time.perf_counter()
    rollout(jax.random.PRNGKey(1)).block_until_ready()
    sps = n * steps / (time.perf_counter() - t0)
    print(f"point_maze env-steps/s: {sps:,.0f}")
    assert sps > 2e4
