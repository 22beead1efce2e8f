"""CRL on a brax goal task: one learning chunk runs end to end (the brax compile is the cost, ~1 min).

Learning itself on goal/reacher is measured by `experiments/crl_depth.py --env goal/reacher ...` (README,
CRL section): its compile alone (~2 min on one CPU core) is over the CI budget.
"""
import jax
import numpy as np

from scaling_rl.agents import crl


def test_crl_runs_a_chunk_on_goal_reacher_with_finite_losses():
    cfg = crl.Config(env="goal/reacher", num_envs=4, episode_length=8, env_steps=16 + 64, learning_starts=16,
                     chunk_env_steps=64, utd=0.25, batch_size=8, width=16, depth=4, actor_width=16,
                     actor_depth=4, repr_dim=8, eval_episodes=2, buffer_size=4 * 16)
    agent = crl.make(cfg)
    assert agent.env_spec.obs_dim == 10 and agent.env_spec.action_dim == 2 and agent.num_chunks == 1

    def run(key):
        state, metrics = agent.chunk(agent.init(key))
        return state, metrics

    state, m = jax.device_get(jax.jit(jax.vmap(run))(jax.random.split(jax.random.PRNGKey(0), 2)))
    assert m["grad_steps"].tolist() == [16, 16] and m["env_steps"].tolist() == [80, 80]
    # 4 warm-up + 16 chunk vector steps: each of the 4 envs finishes episodes at steps 8 and 16
    assert m["episodes"].tolist() == [8, 8]
    for key in ("loss/critic", "loss/actor", "loss/alpha", "accuracy", "entropy", "param_norm",
                "time_at_goal", "success_any"):
        assert m[key].shape == (2,) and np.isfinite(m[key]).all(), key
    assert ((0 <= m["time_at_goal"]) & (m["time_at_goal"] <= 8)).all()
    assert ((0 <= m["success_any"]) & (m["success_any"] <= 1)).all()
    assert (m["loss/critic"] > 0).all() and np.isfinite(np.asarray(state.buffer.data["state"])).all()
