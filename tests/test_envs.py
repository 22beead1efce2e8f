"""Behaviour of the pure vectorised env API (scaling_rl.envs): shapes, auto-reset, time limits,
termination, episode statistics, determinism, vmap over seeds, observation normalisation."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scaling_rl import envs


def _run(env, steps, key):
    """Reset and take `steps` uniformly random actions; returns (obs0, final state, ts, actions)."""
    reset_key, act_key = jax.random.split(key)
    state, obs0 = env.reset(reset_key)

    def body(state, k):
        action = env.sample_action(k)
        state, ts = env.step(state, action)
        return state, (ts, action)

    state, (ts, actions) = jax.lax.scan(body, state, jax.random.split(act_key, steps))
    return obs0, state, ts, actions


@functools.lru_cache(maxsize=None)
def rollout_fn(name, num_envs, steps, **kw):
    """(env, jitted key -> rollout), cached so tests sharing a configuration share one compile."""
    env = envs.make(name, num_envs=num_envs, **kw)
    return env, jax.jit(functools.partial(_run, env, steps))


# The canonical configurations (most tests reuse their compiled rollouts).
CARTPOLE = ("gymnax/CartPole-v1", 4, 80)
PENDULUM = ("gymnax/Pendulum-v1", 4, 80)
PENDULUM_KW = {"max_episode_steps": 7}


def rollout(config, key, **kw):
    env, fn = rollout_fn(*config, **kw)
    return fn(key)


@pytest.mark.parametrize(
    "config,kw,obs_dim,discrete,num_actions",
    [
        (PENDULUM, PENDULUM_KW, 3, False, 0),
        (CARTPOLE, {}, 4, True, 2),
        (("gymnax/Breakout-MinAtar", 2, 3), {}, 400, True, 3),  # (10, 10, 4) flattened
    ],
)
def test_gymnax_shapes_and_dtypes(config, kw, obs_dim, discrete, num_actions):
    name, n, steps = config
    env, _ = rollout_fn(*config, **kw)
    spec = env.spec
    assert (spec.name, spec.obs_dim, spec.discrete, spec.num_actions) == (
        name, obs_dim, discrete, num_actions)
    assert spec.action_shape == (() if discrete else (1,))
    obs0, state, ts, actions = rollout(config, jax.random.key(0), **kw)
    assert obs0.shape == (n, obs_dim) and obs0.dtype == jnp.float32
    assert ts.obs.shape == ts.next_obs.shape == (steps, n, obs_dim)
    assert ts.obs.dtype == ts.next_obs.dtype == jnp.float32
    assert ts.reward.shape == (steps, n) and ts.reward.dtype == jnp.float32
    for flag in (ts.terminated, ts.truncated, ts.done):
        assert flag.shape == (steps, n) and flag.dtype == jnp.bool_
    assert ts.episode_length.dtype == jnp.int32 and ts.episode_return.dtype == jnp.float32
    assert actions.shape == (steps, n, *spec.action_shape)
    assert state.step_count.shape == (n,)
    assert envs.make(name).spec.max_episode_steps == {"gymnax/Pendulum-v1": 200,
                                                      "gymnax/CartPole-v1": 500}.get(name, 1000)


def test_brax_reacher_shapes_and_bounds():
    # brax compiles slowly on CPU (tens of seconds): one small program for the whole test
    env, fn = rollout_fn("brax/reacher", 2, 3)
    spec = env.spec
    assert (spec.obs_dim, spec.action_dim, spec.discrete, spec.max_episode_steps) == (11, 2, False, 1000)
    assert spec.action_low == (-1.0, -1.0) and spec.action_high == (1.0, 1.0)
    obs0, state, ts, _ = fn(jax.random.key(0))
    assert obs0.shape == (2, 11) and obs0.dtype == jnp.float32
    assert ts.next_obs.shape == (3, 2, 11) and ts.reward.shape == (3, 2)
    assert ts.reward.dtype == jnp.float32 and ts.done.dtype == jnp.bool_
    assert not bool(ts.done.any())  # reacher never terminates; 3 << 1000 steps
    assert np.isfinite(np.asarray(ts.next_obs)).all()
    assert not np.allclose(ts.next_obs[0], ts.next_obs[-1])  # it moves
    assert not np.allclose(obs0[0], obs0[1])  # independent resets per env
    np.testing.assert_array_equal(state.step_count, [3, 3])
    assert set(ts.info) >= {"reward_dist", "reward_ctrl"}  # brax metrics ride along in info


def test_pendulum_truncates_at_time_limit_and_auto_resets():
    _, state, ts, _ = rollout(PENDULUM, jax.random.key(1), **PENDULUM_KW)
    expect = np.zeros((80, 4), bool)
    expect[6::7] = True  # after every 7th step
    np.testing.assert_array_equal(ts.truncated, expect)
    np.testing.assert_array_equal(ts.done, expect)
    assert not bool(ts.terminated.any())  # Pendulum never terminates
    np.testing.assert_array_equal(ts.episode_length[expect], 7)
    # obs == next_obs except at the reset steps, where obs is a fresh episode's first observation
    same = np.all(np.asarray(ts.obs) == np.asarray(ts.next_obs), axis=-1)
    np.testing.assert_array_equal(same, ~expect)
    np.testing.assert_array_equal(state.step_count, [80 % 7] * 4)


def test_cartpole_termination_sets_terminated_not_truncated():
    _, _, ts, _ = rollout(CARTPOLE, jax.random.key(2))  # random play drops the pole in ~20 steps
    term, trunc = np.asarray(ts.terminated), np.asarray(ts.truncated)
    assert term.any(axis=0).all() and not trunc.any()
    np.testing.assert_array_equal(ts.done, term)
    for t, e in np.argwhere(term):
        # the terminal next_obs is out of bounds; the reset obs is a fresh start within +-0.05
        nxt, obs = np.asarray(ts.next_obs[t, e]), np.asarray(ts.obs[t, e])
        assert abs(nxt[0]) > 2.4 or abs(nxt[2]) > 0.2094
        assert np.abs(obs).max() <= 0.05
        assert 1 <= ts.episode_length[t, e] <= t + 1


@pytest.mark.parametrize("config,kw", [(CARTPOLE, {}), (PENDULUM, PENDULUM_KW)])
def test_episode_return_equals_sum_of_rewards(config, kw):
    _, _, ts, _ = rollout(config, jax.random.key(3), **kw)
    reward, done = np.asarray(ts.reward), np.asarray(ts.done)
    acc, length = np.zeros(reward.shape[1]), np.zeros(reward.shape[1], int)
    finished = 0
    for t in range(reward.shape[0]):
        acc, length = acc + reward[t], length + 1
        np.testing.assert_allclose(ts.episode_return[t], np.where(done[t], acc, 0.0),
                                   rtol=1e-5, atol=1e-4)
        np.testing.assert_array_equal(ts.episode_length[t], np.where(done[t], length, 0))
        finished += done[t].sum()
        acc, length = np.where(done[t], 0.0, acc), np.where(done[t], 0, length)
    assert finished >= 8


def test_continuous_actions_are_rescaled_from_unit_box():
    env = envs.make("gymnax/Pendulum-v1", num_envs=4)
    state, _ = jax.jit(env.reset)(jax.random.key(0))
    state, _ = jax.jit(env.step)(state, jnp.array([[1.0], [-1.0], [0.25], [5.0]]))
    # Pendulum torque bounds are [-2, 2]; out-of-box actions are clipped to the box first
    np.testing.assert_allclose(state.inner.last_u, [2.0, -2.0, 0.5, 2.0], rtol=1e-6)


def test_determinism_and_vmap_over_seeds():
    env, fn = rollout_fn(*CARTPOLE)
    a, b, c = (fn(jax.random.key(k))[2] for k in (7, 7, 8))
    np.testing.assert_array_equal(a.next_obs, b.next_obs)
    assert not np.array_equal(a.next_obs, c.next_obs)

    keys = jax.random.split(jax.random.key(0), 3)
    obs0, states, ts, _ = jax.jit(jax.vmap(functools.partial(_run, env, CARTPOLE[2])))(keys)
    assert obs0.shape == (3, 4, 4) and ts.next_obs.shape == (3, 80, 4, 4)
    for i in range(3):
        ts_i = fn(keys[i])[2]
        np.testing.assert_allclose(ts.next_obs[i], ts_i.next_obs, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(ts.done[i], ts_i.done)
    assert not np.allclose(ts.next_obs[0], ts.next_obs[1])


def test_unknown_name_lists_known_ones():
    with pytest.raises(ValueError) as err:
        envs.make("gymnax/NoSuchEnv-v0")
    msg = str(err.value)
    assert "\n" not in msg and "gymnax/NoSuchEnv-v0" in msg
    for name in ("gymnax/Pendulum-v1", "gymnax/Breakout-MinAtar", "brax/reacher", "brax/ant"):
        assert name in msg and name in envs.known()


def test_register_makes_a_name_resolvable():
    calls = []

    def factory(num_envs, **kw):
        calls.append((num_envs, kw))
        return envs.make("gymnax/CartPole-v1", num_envs, **kw)

    envs.register("test/cartpole-alias", factory, overwrite=True)
    env = envs.make("test/cartpole-alias", num_envs=2, normalize_obs=True)
    assert calls == [(2, {"normalize_obs": True})] and env.normalize_obs
    assert "test/cartpole-alias" in envs.known()
    with pytest.raises(ValueError, match="already registered"):
        envs.register("test/cartpole-alias", lambda n, **kw: None)


def test_observation_normalisation():
    raw0, _, raw_ts, _ = rollout(PENDULUM, jax.random.key(4), **PENDULUM_KW)
    norm_env, fn = rollout_fn(*PENDULUM, normalize_obs=True, **PENDULUM_KW)
    _, state, ts, _ = fn(jax.random.key(4))  # same key -> same dynamics as the raw rollout
    # running statistics are exactly the moments of every observation seen (reset + next_obs)
    seen = np.concatenate([np.asarray(raw0), np.asarray(raw_ts.next_obs).reshape(-1, 3)])
    assert float(state.obs_stats.count) == seen.shape[0]
    np.testing.assert_allclose(state.obs_stats.mean, seen.mean(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.obs_stats.var, seen.var(0), rtol=1e-4, atol=1e-5)
    # the normalised stream is ~ zero-mean unit-variance once the statistics have settled
    late = np.asarray(ts.next_obs[40:]).reshape(-1, 3)
    np.testing.assert_allclose(late.mean(0), 0.0, atol=0.3)
    np.testing.assert_allclose(late.std(0), 1.0, atol=0.3)
    # it is the raw stream standardised with the current statistics
    last = (np.asarray(raw_ts.next_obs[-1]) - np.asarray(state.obs_stats.mean)) / np.sqrt(
        np.asarray(state.obs_stats.var) + 1e-8)
    np.testing.assert_allclose(ts.next_obs[-1], np.clip(last, -10, 10), rtol=1e-4, atol=1e-4)
    # evaluation steps can leave the statistics untouched
    frozen_step = jax.jit(functools.partial(norm_env.step, update_obs_stats=False))
    frozen, _ = frozen_step(state, norm_env.sample_action(jax.random.key(0)))
    np.testing.assert_array_equal(frozen.obs_stats.mean, state.obs_stats.mean)
    np.testing.assert_array_equal(frozen.obs_stats.count, state.obs_stats.count)
