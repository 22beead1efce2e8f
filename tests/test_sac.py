"""SAC and the shared off-policy loop: config validation, UTD accounting, n-step targets,
terminated-vs-truncated bootstrapping, the held-out validation stream, and real learning on
gymnax Pendulum-v1 (mean eval return over 3 seeds >= -250)."""
import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from scaling_rl import nets
from scaling_rl import replay
from scaling_rl.agents import common, sac

# --------------------------------------------------------------------------------------------------
# Learning run, shared by several tests: 3 seeds vmapped, host loop of jitted init/chunk/evaluate.
# Budget: 6 000 env steps (500 warm-up) at σ=1 -> 5 500 gradient steps per seed.
# --------------------------------------------------------------------------------------------------
# scan=False: at depth 1 the scanned stack only adds compile time (the scanned path is exercised in
# tests/test_parallel.py and tests/test_nets.py).
PENDULUM = dict(env="gymnax/Pendulum-v1", width=64, depth=1, backbone="bro", scan=False,
                batch_size=128, lr=1e-3, init_alpha=0.1, utd=1.0, num_envs=1, env_steps=6_000,
                learning_starts=500, chunk_env_steps=500, buffer_size=6_000, val_buffer_size=1_000,
                eval_episodes=10, gamma=0.99, tau=0.005)
SEEDS = 3


@pytest.fixture(scope="module")
def pendulum():
    cfg = sac.Config(**PENDULUM)
    agent = sac.make(cfg)
    keys = jax.random.split(jax.random.PRNGKey(0), SEEDS)
    init = jax.jit(jax.vmap(agent.init))
    chunk = jax.jit(jax.vmap(agent.chunk))
    evaluate = jax.jit(jax.vmap(agent.evaluate))
    state0 = init(keys)
    state, history = state0, []
    for i in range(agent.num_chunks):
        state, metrics = chunk(state)
        history.append(jax.device_get(metrics))
    evals = jax.device_get(evaluate(state, jax.random.split(jax.random.PRNGKey(1), SEEDS)))
    return dict(cfg=cfg, agent=agent, chunk=chunk, state0=state0, state=state, history=history,
                evals=evals)


def test_sac_learns_pendulum(pendulum):
    final = pendulum["evals"]["eval_return"]
    print(f"SAC Pendulum-v1 final eval_return per seed: {np.round(final, 1)} mean {np.mean(final):.1f}")
    assert final.shape == (SEEDS,)
    assert np.mean(final) >= -250.0, final
    # The last training episodes agree with the deterministic eval (no eval leakage into training).
    assert np.nanmean(pendulum["history"][-1]["episode_return"]) > -400.0


def test_chunk_metrics_and_counts(pendulum):
    cfg, history = pendulum["cfg"], pendulum["history"]
    required = {"env_steps", "grad_steps", "episode_return", "loss/critic", "loss/actor", "loss/alpha",
                "alpha", "entropy", "td_error/train", "td_error/val", "param_norm", "q_mean"}
    assert required <= set(history[0])
    for i, m in enumerate(history):
        for key in required - {"episode_return"}:
            assert m[key].shape == (SEEDS,) and np.all(np.isfinite(m[key])), key
        env_steps = cfg.warmup_env_steps + (i + 1) * cfg.chunk_env_steps
        np.testing.assert_array_equal(m["env_steps"], env_steps)
        np.testing.assert_array_equal(m["grad_steps"], env_steps - cfg.warmup_env_steps)  # σ = 1
    assert np.all(history[-1]["td_error/val"] > 0) and np.all(history[-1]["td_error/train"] > 0)
    # The temperature is tuned: it moved away from its initial value.
    assert not np.allclose(history[-1]["alpha"], cfg.init_alpha)


def test_param_count_is_the_critic_ensemble(pendulum):
    agent, state = pendulum["agent"], pendulum["state"]
    per_seed = nets.param_count(state.learner["critic"]) // SEEDS
    assert agent.param_count == per_seed
    one = nets.backbone_param_count(sac.critic_backbone(pendulum["cfg"]), 3 + 1) + 64 + 1
    assert agent.param_count == 2 * one


def test_pendulum_transitions_always_bootstrap(pendulum):
    # Pendulum never terminates: every stored transition (incl. time-limit truncations) bootstraps.
    buf = jax.tree.map(lambda x: x[0], pendulum["state"].replay)
    batch = replay.sample(buf, jax.random.PRNGKey(0), 4_000)
    np.testing.assert_allclose(np.asarray(batch["discount"]), 0.99, rtol=1e-6)


def test_validation_stream_is_never_trained_on(pendulum):
    """Replacing the whole validation stream (its env, keys and buffer) changes td_error/val but
    leaves the trained parameters bitwise identical: training never reads it."""
    state0, chunk = pendulum["state0"], pendulum["chunk"]
    poisoned = state0.replace(
        val_rng=jax.random.split(jax.random.PRNGKey(123), SEEDS),
        val_replay=jax.tree.map(lambda x: jnp.full_like(x, jnp.nan) if x.dtype == jnp.float32 else x,
                                state0.val_replay),
        val_obs=state0.val_obs + 0.5)
    a, ma = chunk(state0)
    b, mb = chunk(poisoned)
    for x, y in zip(jax.tree.leaves(a.learner), jax.tree.leaves(b.learner)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    np.testing.assert_array_equal(ma["td_error/train"], mb["td_error/train"])
    assert not np.array_equal(np.asarray(ma["td_error/val"]), np.asarray(mb["td_error/val"]),
                              equal_nan=True)


# --------------------------------------------------------------------------------------------------
# UTD accounting with a counting stand-in algorithm (compiles in seconds; the loop is shared).
# --------------------------------------------------------------------------------------------------


def _counting_algorithm(action_dim: int) -> common.Algorithm:
    def init(key):
        return {"updates": jnp.zeros((), jnp.int32), "sampled": jnp.zeros((), jnp.float32)}

    def act(learner, obs, key, env_steps):
        return jnp.zeros((obs.shape[0], action_dim), jnp.float32)

    def update(learner, batch, key):
        return {"updates": learner["updates"] + 1, "sampled": learner["sampled"] + batch["reward"].sum()
                }, {"loss/critic": jnp.zeros(())}

    return common.Algorithm(init=init, act=act, act_eval=lambda l, o: act(l, o, None, 0), update=update,
                            td_error=lambda l, b, k: jnp.mean(b["reward"]),
                            diagnostics=lambda l: {"param_norm": jnp.zeros(())})


@pytest.mark.parametrize("utd,num_envs,period", [(0.25, 1, (4, 1)), (0.25, 2, (2, 1)), (1.0, 2, (1, 2)),
                                                 (4.0, 1, (1, 4)), (0.5, 4, (1, 2)), (1 / 3, 1, (3, 1))])
def test_utd_schedule(utd, num_envs, period):
    assert tuple(common.utd_schedule(utd, num_envs)) == period


def test_flat_optimizer_matches_optax_adamw():
    params = {"dense": {"kernel": jnp.arange(6.0).reshape(2, 3) / 7, "bias": jnp.ones(3)},
              "norm": {"scale": jnp.full((3,), 0.5)}}
    grads = jax.tree.map(lambda p: jnp.sin(p * 3.0), params)
    flat = common.make_optimizer(1e-2, weight_decay=0.1, max_grad_norm=0.5, flat=True)
    tree = common.make_optimizer(1e-2, weight_decay=0.1, max_grad_norm=0.5, flat=False)

    @jax.jit
    def three_steps(params):
        sf, st = flat.init(params), tree.init(params)
        pf = pt = params
        for _ in range(3):
            uf, sf = flat.update(grads, sf, pf)
            ut, st = tree.update(grads, st, pt)
            pf, pt = optax.apply_updates(pf, uf), optax.apply_updates(pt, ut)
        return pf, pt

    pf, pt = three_steps(params)
    for a, b in zip(jax.tree.leaves(pf), jax.tree.leaves(pt)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    # Weight decay touches weight matrices only: without it, only the kernel would differ.
    no_decay = common.make_optimizer(1e-2, weight_decay=0.0, max_grad_norm=0.5)
    u0, _ = jax.jit(no_decay.update)(grads, no_decay.init(params), params)
    u1, _ = jax.jit(flat.update)(grads, flat.init(params), params)
    np.testing.assert_array_equal(u0["dense"]["bias"], u1["dense"]["bias"])
    np.testing.assert_array_equal(u0["norm"]["scale"], u1["norm"]["scale"])
    assert not np.allclose(u0["dense"]["kernel"], u1["dense"]["kernel"])


@pytest.mark.parametrize("utd,num_envs,reset_every", [(0.25, 1, 0), (4.0, 2, 24)])
def test_utd_gives_exact_grad_steps_per_env_step(utd, num_envs, reset_every):
    """σ=0.25 with one env: 4 env steps then 1 update, so after every 4-env-step chunk grad_steps is
    exactly env_steps/4; σ=4 with two envs: 8 updates per vector step. (σ=1 is checked on the
    Pendulum run.) With resets every 24 grad steps the learner restarts but training continues."""
    chunk_env_steps = 4
    cfg = sac.Config(width=8, depth=1, batch_size=4, num_envs=num_envs, utd=utd, env_steps=8 + 10 * 4,
                     learning_starts=8, chunk_env_steps=chunk_env_steps, buffer_size=64,
                     val_buffer_size=8, eval_episodes=1, reset_every=reset_every)
    agent = common.build_agent(cfg, _counting_algorithm(1), 0)
    state = jax.jit(agent.init)(jax.random.PRNGKey(0))
    assert int(state.env_steps) == 8 and int(state.grad_steps) == 0
    chunk = jax.jit(agent.chunk)
    counts = []
    for _ in range(agent.num_chunks):
        state, m = chunk(state)
        counts.append((int(m["env_steps"]) - 8, int(m["grad_steps"])))
        updates_since_reset = int(m["grad_steps"]) % reset_every if reset_every else int(m["grad_steps"])
        assert int(state.learner["updates"]) == updates_since_reset  # the updates really ran
    assert counts == [(4 * k, int(utd * 4 * k)) for k in range(1, 11)]
    assert int(replay.size(state.replay)) == 8 + 40  # resets keep the replay buffer


# --------------------------------------------------------------------------------------------------
# n-step targets and terminated vs truncated, by hand.
# --------------------------------------------------------------------------------------------------


def _step(obs, reward, terminated, truncated):
    return {"obs": jnp.asarray(obs, jnp.float32)[:, None], "action": jnp.zeros((2, 1), jnp.float32),
            "reward": jnp.asarray(reward, jnp.float32),
            "next_obs": jnp.asarray(obs, jnp.float32)[:, None] + 0.5,
            "terminated": jnp.asarray(terminated), "done": jnp.asarray(terminated) | jnp.asarray(truncated)}


def test_nstep_targets_by_hand():
    """n=3, γ=0.5, two envs. Env 0 runs on; env 1 terminates at step 1 and restarts at step 2.
    Rewards are 1, 2, 4, 8 at steps 0..3 in both envs; obs_t = t (env 0) and 10 + t (env 1)."""
    gamma = 0.5
    window = common.nstep_init(3, _step([0, 0], [0, 0], [False, False], [False, False]))
    steps = [_step([0, 10], [1, 1], [False, False], [False, False]),
             _step([1, 11], [2, 2], [False, True], [False, False]),
             _step([2, 12], [4, 4], [False, False], [False, False]),
             _step([3, 13], [8, 8], [False, False], [False, False])]
    outs = []
    push = jax.jit(common.nstep_push, static_argnums=2)
    for s in steps:
        window, out = push(window, s, gamma)
        outs.append(out)
    # After 3 pushes the oldest entry (step 0) is complete.
    o = outs[2]
    np.testing.assert_allclose(o["obs"][:, 0], [0, 10])
    np.testing.assert_allclose(o["reward"], [1 + 0.5 * 2 + 0.25 * 4, 1 + 0.5 * 2])
    np.testing.assert_allclose(o["next_obs"][:, 0], [2.5, 11.5])  # step 2's / step 1's next obs
    np.testing.assert_allclose(o["discount"], [0.125, 0.0])       # γ³, terminated
    o = outs[3]  # step 1
    np.testing.assert_allclose(o["obs"][:, 0], [1, 11])
    np.testing.assert_allclose(o["reward"], [2 + 0.5 * 4 + 0.25 * 8, 2])
    np.testing.assert_allclose(o["next_obs"][:, 0], [3.5, 11.5])
    np.testing.assert_allclose(o["discount"], [0.125, 0.0])


def test_truncation_bootstraps_termination_does_not():
    gamma = 0.9
    for n in (1, 2):
        window = common.nstep_init(n, _step([0, 0], [0, 0], [False, False], [False, False]))
        if n == 2:
            window, _ = common.nstep_push(window, _step([5, 5], [1, 1], [False, False], [False, False]),
                                          gamma)
        # env 0 is cut by the time limit, env 1 reaches a terminal state, on the same step.
        window, out = common.nstep_push(window, _step([7, 7], [1, 1], [False, True], [True, False]),
                                        gamma)
        np.testing.assert_allclose(out["discount"], [gamma ** n, 0.0], rtol=1e-6)
        np.testing.assert_allclose(out["next_obs"][:, 0], [7.5, 7.5])  # the true next obs


def test_soft_td_target_masks_only_by_discount():
    q_next = jnp.array([[1.0, 2.0], [3.0, 0.0]])  # (critics, B)
    y = sac.soft_td_target(jnp.array([1.0, 1.0]), jnp.array([0.9, 0.0]), q_next,
                           jnp.array([-1.0, -1.0]), 0.5, "min")
    np.testing.assert_allclose(y, [1.0 + 0.9 * (1.0 + 0.5), 1.0])


def test_tanh_gaussian_log_prob_matches_change_of_variables():
    mean, log_std, noise = jnp.array([[0.3]]), jnp.array([[-0.7]]), jnp.array([[1.1]])
    a, logp = sac.tanh_gaussian_sample(mean, log_std, noise)
    u = 0.3 + math.exp(-0.7) * 1.1
    expected = (-0.5 * 1.1 ** 2 - 0.5 * math.log(2 * math.pi) + 0.7) - math.log(1 - math.tanh(u) ** 2)
    np.testing.assert_allclose(a[0, 0], math.tanh(u), rtol=1e-6)
    np.testing.assert_allclose(logp[0], expected, rtol=1e-5)


# --------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides,key", [
    (dict(utd=-1.0), "utd"),
    (dict(utd=0.0), "utd"),
    (dict(batch_size=512, buffer_size=256), "batch_size"),
    (dict(backbone="resnet"), "backbone"),
    (dict(env="gymnax/NoSuchEnv-v0"), "env"),
    (dict(n_step=0), "n_step"),
    (dict(tau=0.0), "tau"),
    (dict(gamma=1.5), "gamma"),
    (dict(num_critics=0), "num_critics"),
    (dict(critic_agg="max"), "critic_agg"),
    (dict(chunk_env_steps=6, utd=0.25), "chunk_env_steps"),
    (dict(env_steps=500), "env_steps"),
    (dict(backbone="crl", depth=6), "depth"),
    (dict(learning_starts=-1), "learning_starts"),
])
def test_config_errors_are_one_line(overrides, key):
    with pytest.raises(ValueError) as err:
        sac.Config(**overrides)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(key), msg


def test_discrete_env_rejected_by_make():
    with pytest.raises(ValueError, match="^env: .*discrete"):
        sac.make(sac.Config(env="gymnax/CartPole-v1"))


def test_config_json_round_trip():
    cfg = sac.Config(utd=0.25, width=32, actor_width=16, target_entropy=-0.5, n_step=3)
    back = sac.Config.from_dict(json.loads(json.dumps(dataclasses.asdict(cfg))))
    assert back == cfg
    with pytest.raises(ValueError, match="^widht: not a field"):
        sac.Config.from_dict({"widht": 3})


def test_learner_reset_keeps_per_seed_optimizer_hyperparams():
    """Packed η lives in the optimiser state; a periodic reset re-initialises the learner but must
    keep the seed's own learning rate (not fall back to the config's)."""
    opt = common.make_adam(0.1)

    def init(key):
        return {"updates": jnp.zeros((), jnp.int32), "opt": opt.init(jnp.zeros(3)),
                "tau": jnp.asarray(0.005, jnp.float32)}

    def update(learner, batch, key):
        return {**learner, "updates": learner["updates"] + 1}, {"loss/critic": jnp.zeros(())}

    algo = _counting_algorithm(1)._replace(
        init=init, update=update,
        set_hparams=lambda l, hp: {**l, "opt": common.set_hyperparams(l["opt"], learning_rate=hp["lr"]),
                                   "tau": jnp.asarray(hp["tau"], jnp.float32)})
    cfg = sac.Config(width=8, depth=1, batch_size=4, utd=1.0, env_steps=8 + 3 * 4, learning_starts=8,
                     chunk_env_steps=4, buffer_size=64, val_buffer_size=8, eval_episodes=1, reset_every=3)
    agent = common.build_agent(cfg, algo, 0)
    state = agent.set_hparams(jax.jit(agent.init)(jax.random.PRNGKey(0)), {"lr": 0.25, "tau": 0.5})
    chunk = jax.jit(agent.chunk)
    for _ in range(agent.num_chunks):
        state, m = chunk(state)
    assert int(m["grad_steps"]) == 12 and int(state.learner["updates"]) == 0  # reset at 12
    assert float(state.learner["opt"].hyperparams["learning_rate"]) == 0.25
    assert float(state.learner["tau"]) == 0.5      # τ (a learner entry, not an optimiser state) too


def test_sac_set_hparams_routes_each_value_to_its_optimizer():
    cfg = sac.Config(width=8, depth=1, batch_size=4, env_steps=8 + 4, learning_starts=8, chunk_env_steps=4,
                     buffer_size=64, val_buffer_size=8, eval_episodes=1, lr=1e-3, actor_lr=None)
    assert sac.hparams(cfg) == {"lr": 1e-3, "actor_lr": 1e-3, "alpha_lr": 3e-4, "weight_decay": 1e-4,
                                "tau": cfg.tau}
    assert set(sac.hparams(cfg)) == set(sac.PACKABLE)
    agent = sac.make(cfg)
    state = jax.eval_shape(agent.init, jax.random.PRNGKey(0))
    state = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), state)
    state = agent.set_hparams(state, {"lr": 0.1, "actor_lr": 0.2, "alpha_lr": 0.3, "weight_decay": 0.4,
                                      "tau": 0.5})
    assert float(state.learner["tau"]) == 0.5     # τ: the learner's own entry (the Polyak update reads it)
    opt = state.learner["opt"]
    got = {name: {k: float(v) for k, v in opt[name].hyperparams.items() if k in ("learning_rate", "weight_decay")}
           for name in ("critic", "actor", "alpha")}
    np.testing.assert_allclose([got["critic"]["learning_rate"], got["critic"]["weight_decay"],
                                got["actor"]["learning_rate"], got["actor"]["weight_decay"],
                                got["alpha"]["learning_rate"]], [0.1, 0.4, 0.2, 0.4, 0.3], rtol=1e-6)
    with pytest.raises(KeyError, match="not one of"):
        common.set_hyperparams(opt["alpha"], weight_decay=0.1)
