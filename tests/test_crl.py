"""CRL: config errors, energies and InfoNCE math, goal brax envs, and learning on the point U-maze."""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scaling_rl.agents import crl

TINY = dict(env="point_maze/u_maze", num_envs=32, env_steps=1024 + 2 * 8192, learning_starts=1024,
            chunk_env_steps=8192, utd=0.125, batch_size=128, width=64, depth=4, actor_width=64,
            actor_depth=4, repr_dim=16, eval_episodes=256, buffer_size=32 * 1024)


# --- config ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, match", [
    (dict(depth=6), r"^depth: .*use 4 or 8$"),
    (dict(actor_depth=2), r"^actor_depth: .*use 4$"),
    (dict(num_envs=48, utd=0.125, chunk_env_steps=1000), r"^chunk_env_steps: .*use 1008$"),
    (dict(num_envs=64, learning_starts=1000), r"^learning_starts: .*use 1024$"),
    (dict(num_envs=64, buffer_size=1000), r"^buffer_size: .*use 1024$"),
    (dict(batch_size=1), r"^batch_size: .*use >= 2"),
    (dict(energy="manhattan"), r"^energy: .*l2, l2_squared, dot, cosine$"),
    (dict(contrastive_loss="sideways"), r"^contrastive_loss: "),
    (dict(utd=0.0123), r"^utd: "),
    (dict(env_steps=100), r"^env_steps: .*use at least"),
])
def test_invalid_configs_are_one_line_errors_naming_a_fix(overrides, match):
    with pytest.raises(ValueError, match=match) as err:
        crl.Config(**overrides)
    assert "\n" not in str(err.value)


def test_config_json_round_trip():
    cfg = crl.Config(**TINY)
    back = crl.Config.from_dict(json.loads(json.dumps(dataclasses.asdict(cfg))))
    assert back == cfg
    with pytest.raises(ValueError, match="^widht: not a field"):
        crl.Config.from_dict({"widht": 3})
    assert crl.Config(**{**TINY, "env_steps": 1024 + 2 * 8192 + 1}).num_chunks == 3


def test_paper_update_ratio_is_exact():
    cfg = crl.Config(num_envs=512, utd=1 / 40, chunk_env_steps=5 * 512 * 10, learning_starts=512,
                     env_steps=512 + 25600, buffer_size=512 * 100)
    from scaling_rl.agents import common
    assert common.utd_schedule(cfg.utd, cfg.num_envs) == (5, 64)     # 5 vector steps, then 64 updates


def test_not_goal_conditioned_env_is_rejected():
    from scaling_rl import envs
    from scaling_rl.envs.core import EnvSpec, VectorEnv

    spec = EnvSpec("test/no_goal", 3, 2, False, 0, (-1.0, -1.0), (1.0, 1.0), 10)
    envs.register("test/no_goal", lambda n, **kw: VectorEnv(spec, None, None, n), overwrite=True)
    with pytest.raises(ValueError, match="^env: 'test/no_goal' is not goal-conditioned .*point_maze/u_maze"):
        crl.make(crl.Config(**{**TINY, "env": "test/no_goal"}))


# --- energies and losses --------------------------------------------------------------------------
@pytest.mark.parametrize("kind", crl.ENERGIES)
def test_energy_matrix_diagonal_matches_pairs(kind):
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    phi, psi = jax.random.normal(k1, (5, 3)), jax.random.normal(k2, (5, 3))
    m = crl.energy_matrix(phi, psi, kind)
    np.testing.assert_allclose(jnp.diagonal(m), crl.energy_pairs(phi, psi, kind), rtol=1e-5, atol=1e-5)
    ref = {"l2": -np.linalg.norm(phi[:, None] - psi[None], axis=-1),
           "l2_squared": -np.sum((phi[:, None] - psi[None]) ** 2, -1),
           "dot": np.asarray(phi @ psi.T)}
    if kind in ref:
        np.testing.assert_allclose(m, ref[kind], rtol=1e-4, atol=1e-4)
    else:
        assert float(jnp.max(jnp.abs(m))) <= 10.0 + 1e-4       # |cos| / 0.1


def test_infonce_variants_penalty_and_accuracy():
    logits = jnp.array([[2.0, 0.0, 0.0], [1.0, 0.5, 0.0], [0.0, 0.0, 3.0]])
    lse_r = np.log(np.exp(np.asarray(logits)).sum(1))
    lse_c = np.log(np.exp(np.asarray(logits)).sum(0))
    diag = np.diag(np.asarray(logits))
    fwd, _ = crl.infonce_loss(logits, "forward", 0.0)
    bwd, _ = crl.infonce_loss(logits, "backward", 0.0)
    sym, stats = crl.infonce_loss(logits, "symmetric", 0.1)
    np.testing.assert_allclose(fwd, np.mean(lse_r - diag), rtol=1e-6)
    np.testing.assert_allclose(bwd, np.mean(lse_c - diag), rtol=1e-6)
    np.testing.assert_allclose(sym, 0.5 * (fwd + bwd) + 0.1 * np.mean(lse_r ** 2), rtol=1e-6)
    assert float(stats["accuracy"]) == pytest.approx(2 / 3)       # row 1 prefers column 0
    assert float(stats["logits/pos"]) == pytest.approx(diag.mean())
    assert float(stats["logits/neg"]) == pytest.approx((np.sum(logits) - diag.sum()) / 6)


def test_global_negatives_row_blocks_are_the_whole_batch_loss_and_gradient():
    """`contrastive_loss` per row block, with a vmapped axis standing for the data mesh (all_gather,
    axis_index and pmean behave as over devices): its mean over 4 blocks of 2 rows is the whole-batch
    InfoNCE, so are its stats, and the gradient through the all-gather is the whole-batch gradient.
    Per-block negatives (no axis) are another loss. Symmetric InfoNCE: both the row blocks (forward) and
    the column blocks (backward). (The shard_map form over devices and processes: tests/test_multiprocess.py.)"""
    cfg = crl.Config(contrastive_loss="symmetric")
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    x, y = jax.random.normal(k[0], (8, 3)), jax.random.normal(k[1], (8, 2))
    params = {"a": jax.random.normal(k[2], (3, 4)), "b": jax.random.normal(k[3], (2, 4))}

    def whole(p):
        return crl.contrastive_loss(x @ p["a"], y @ p["b"], cfg)

    def blocks(p, axis):
        f = lambda xb, yb: crl.contrastive_loss(xb @ p["a"], yb @ p["b"], cfg, axis)  # noqa: E731
        loss, stats = jax.vmap(f, axis_name="data")(x.reshape(4, 2, 3), y.reshape(4, 2, 2))
        return jnp.mean(loss), jax.tree.map(jnp.mean, stats)

    # one jitted program for all three (eager, each op would compile on its own: ~50 s)
    (loss, stats), grad, (b_loss, b_stats), b_grad, (local_loss, _) = jax.jit(lambda p: (
        *jax.value_and_grad(whole, has_aux=True)(p), *jax.value_and_grad(blocks, has_aux=True)(p, "data"),
        blocks(p, None)))(params)
    np.testing.assert_allclose(b_loss, loss, rtol=1e-5)
    for name in stats:
        np.testing.assert_allclose(b_stats[name], stats[name], rtol=1e-5, atol=1e-6, err_msg=name)
    for g, ref in zip(jax.tree.leaves(b_grad), jax.tree.leaves(grad)):
        np.testing.assert_allclose(g, ref, rtol=1e-4, atol=1e-6)
    assert float(jnp.max(jnp.abs(grad["a"]))) > 0.05
    assert abs(float(local_loss) - float(loss)) > 0.1     # 1 negative per row instead of 7


def test_tanh_gaussian_log_prob_matches_density():
    mean, log_std = jnp.array([[0.3, -0.2]]), jnp.array([[-0.5, 0.1]])
    noise = jnp.array([[0.7, -1.1]])
    a, logp = crl.tanh_gaussian(mean, log_std, noise)
    u = mean + jnp.exp(log_std) * noise
    ref = jax.scipy.stats.norm.logpdf(u, mean, jnp.exp(log_std)) - jnp.log(1 - jnp.tanh(u) ** 2)
    np.testing.assert_allclose(a, jnp.tanh(u), rtol=1e-6)
    np.testing.assert_allclose(logp, ref.sum(-1), rtol=1e-5)


# --- goal-conditioned brax envs (cheap: construction and abstract shapes only) ---------------------
def test_ant_maze_layout_as_data_builds_walls():
    from scaling_rl.envs import goal

    walls, start, goals = goal.maze_cells(goal.ANT_MAZES["u_maze"], 4.0)
    assert len(walls) == 25 - 7 and start.tolist() == [4.0, 4.0] and goals.tolist() == [[4.0, 12.0]]
    xml = goal.maze_xml("<mujoco><worldbody><geom/></worldbody></mujoco>", walls, 4.0)
    assert xml.count('type="box"') == len(walls) and 'conaffinity="1"' in xml
    with pytest.raises(ValueError, match="^layout: needs exactly one 'R'"):
        goal.maze_cells(("###", "#.#", "###"), 1.0)


def test_goal_reacher_declares_goal_and_obs_layout():
    from scaling_rl import envs

    env = envs.make("goal/reacher", num_envs=3, max_episode_steps=7)
    gs = env.goal_spec
    assert (gs.state_dim, gs.goal_indices, gs.success_threshold) == (8, (6, 7), 0.05)
    assert env.spec.obs_dim == 10 and env.spec.action_dim == 2 and env.spec.max_episode_steps == 7
    obs = np.zeros((4, 10), np.float32)
    obs[0, 6:8], obs[0, 8:] = [0.1, 0.1], [0.12, 0.1]          # 0.02 away: success
    obs[1, 6:8], obs[1, 8:] = [0.1, 0.1], [0.1, 0.2]           # 0.1 away: not
    assert np.asarray(env.success(jnp.asarray(obs))).tolist() == [True, False, True, True]
    for name in ("goal/ant", "goal/humanoid", "goal/pusher", "goal/ant_u_maze", "goal/ant_big_maze"):
        assert name in envs.known()


# --- learning and the depth study (one run: the depth script's --tiny mode) -------------------------
@pytest.mark.slow   # a long learning run (`make test-slow`; docs/testing.md)
def test_crl_learns_point_u_maze_far_above_random_and_depth_study_writes_outputs(tmp_path):
    """CRL at depths 4 and 8 (2 seeds each, 1k warm-up + 16k env steps, 2k updates) beats a random
    policy measured in the same test by a wide margin, and the depth script writes md/png/json."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "experiments" / "crl_depth.py"
    spec = importlib.util.spec_from_file_location("crl_depth", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    results = mod.main(["--tiny", "--out", str(tmp_path)])
    cfg = crl.Config.from_dict(results[0]["config"])
    assert cfg.env == "point_maze/u_maze" and crl.make(cfg).num_chunks == 2
    rand = jax.device_get(jax.jit(lambda k: crl.random_policy_metrics(cfg, k, 512))(jax.random.PRNGKey(7)))
    print("random policy:", {k: round(float(v), 3) for k, v in rand.items()})
    assert [r["depth"] for r in results] == [4, 8]
    assert results[1]["param_count"] > results[0]["param_count"]
    for r in results:
        m = {k: np.asarray(v) for k, v in r["chunk_means"].items()}
        assert m["grad_steps"][-1] == 2 * 8192 * cfg.utd and m["env_steps"][-1] == cfg.env_steps
        for key in ("loss/critic", "loss/actor", "accuracy", "logits/pos", "logits/neg", "time_at_goal",
                    "success_any", "alpha", "entropy", "param_norm"):
            assert np.isfinite(m[key]).all(), key
        assert m["loss/critic"][-1] < m["loss/critic"][0]
        assert m["accuracy"][-1] > 2.0 / cfg.batch_size              # far above chance (1/B)
        assert m["logits/pos"][-1] > m["logits/neg"][-1]
        # every seed, not just the mean, is far above random
        assert min(r["success"]) > float(rand["eval_success_any"]) + 0.2, (r["success"], rand)
        assert min(r["time_at_goal"]) > 3 * float(rand["eval_time_at_goal"]), (r["time_at_goal"], rand)
    md = (tmp_path / "depth.md").read_text()
    assert md.count("\n| 4 |") == 1 and md.count("\n| 8 |") == 1 and "±" in md
    assert (tmp_path / "depth.png").read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["seeds"] == 2 and saved["env"] == "point_maze/u_maze"
    # the script's own random-policy row: a 256-episode estimate of the baseline measured above
    assert "\n| random policy | 0 |" in md
    assert abs(saved["random_policy"]["success"] - float(rand["eval_success_any"])) < 0.15
    m, h = mod.mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and h == pytest.approx(4.303 / 3 ** 0.5, rel=1e-3)


# --- data parallel (runs where >= 2 devices exist, e.g. XLA_FLAGS=--xla_force_host_platform_device_count=8)
@pytest.mark.skipif(jax.device_count() < 2, reason="needs >= 2 devices")
def test_data_parallel_update_is_the_mean_of_shard_updates():
    from scaling_rl import parallel

    cfg = crl.Config(**{**TINY, "batch_size": 16})
    single = crl.make(cfg)
    sharded = crl.make(cfg, mesh=parallel.make_mesh(2))
    learner = jax.jit(single.init)(jax.random.PRNGKey(0)).learner
    k = jax.random.split(jax.random.PRNGKey(1), 4)
    half = {"state": jax.random.uniform(k[0], (8, 2), minval=1, maxval=4),
            "action": jax.random.uniform(k[1], (8, 2), minval=-1, maxval=1),
            "goal": jax.random.uniform(k[2], (8, 2), minval=1, maxval=4),
            "noise": jax.random.normal(k[3], (8, 2))}
    # each of the 2 shards sees the same 8 rows, so the pmean'd update equals the 8-row update
    both = jax.tree.map(lambda x: jnp.concatenate([x, x]), half)
    a, aux_a = jax.jit(single.update)(learner, half, k[0])
    b, aux_b = jax.jit(sharded.update)(learner, both, k[0])
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(aux_a["loss/critic"], aux_b["loss/critic"], rtol=1e-5)


@pytest.mark.skipif(jax.device_count() >= 2, reason="the test above runs directly on this multi-device host")
def test_data_parallel_update_in_a_two_device_process():
    """The device count is fixed when jax starts, so the shard_map check runs in its own process."""
    import os
    import subprocess
    import sys

    from forced_devices import xla_flags

    env = dict(os.environ, XLA_FLAGS=xla_flags(2))
    env.pop("SCALING_RL_EXPECTED_SKIPS", None)  # the CI skip allowlist is for the suite, not this child run
    target = f"{__file__}::test_data_parallel_update_is_the_mean_of_shard_updates"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", target],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]


# --- memory: the estimate train.run checks against the budget -------------------------------------
_MEMORY_CASES = {
    "fp32": {},
    # the B x B logits dominate: XLA keeps ~5.9 float32 B x B arrays; bf16 compute saves nothing in the peak
    "batch_heavy_bf16": {"batch_size": 512, "width": 16, "depth": 4, "actor_width": 16, "actor_depth": 4,
                         "compute_dtype": "bfloat16"},
    # parameters and Adam state dominate; remat keeps only each block's input
    "param_heavy_remat": {"batch_size": 16, "width": 128, "actor_width": 128, "remat": True},
}


@pytest.mark.parametrize("case", sorted(_MEMORY_CASES))
def test_memory_estimate_bounds_the_seed_vmapped_chunk(case):
    """nets.memory's analytic peak vs XLA's own buffer assignment of the program training runs: the
    seed-vmapped chunk (train.py jits vmap(chunk)), 2 seeds. The estimate is an upper bound within 20%."""
    from scaling_rl import nets

    cfg = crl.Config(**{**TINY, "num_envs": 16, "learning_starts": 16, "chunk_env_steps": 256,
                        "env_steps": 272, "batch_size": 32, "width": 32, "depth": 16, "actor_width": 32,
                        "actor_depth": 16, "buffer_size": 1024, **_MEMORY_CASES[case]})
    agent = crl.make(cfg)
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    m = jax.jit(jax.vmap(agent.chunk), donate_argnums=0).lower(
        jax.eval_shape(jax.vmap(agent.init), keys)).compile().memory_analysis()
    xla = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
    est = nets.estimate_peak_bytes(crl, cfg, agent, seeds=2)
    assert xla <= est <= 1.2 * xla, (case, est, xla, est / xla)
    assert nets.estimate_peak_bytes(crl, cfg, agent, seeds=6) == 3 * est


def test_cli_refuses_a_config_over_the_memory_budget_before_writing(tmp_path, capsys, monkeypatch):
    from scaling_rl import cli

    out = tmp_path / "run"
    argv = ["train", "--agent", "crl", "--depth", "1024", "--width", "256", "--out", str(out)]
    monkeypatch.setenv("SCALING_RL_MEMORY_BUDGET", "1GiB")   # the estimate: ~3.7 GiB
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and not out.exists()
    assert "memory: estimated peak" in err and "exceeds the 1.00 GiB of $SCALING_RL_MEMORY_BUDGET" in err
    assert "use remat=true" in err
    monkeypatch.setenv("SCALING_RL_MEMORY_BUDGET", "lots")
    assert cli.main(argv) == 2
    assert "cannot read 'lots' as a size" in capsys.readouterr().err and not out.exists()
