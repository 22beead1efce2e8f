"""Per-seed (packable) hyper-parameters of every agent: `PACKABLE` names match `hparams(cfg)`, and
`agent.set_hparams` writes each value into the optimiser state that uses it (the sweep packs
trials differing in these into one vmapped program; tests/test_train.py checks the numbers)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from scaling_rl import agents
from scaling_rl.agents import common

CONFIGS = {
    "dqn": dict(env="gymnax/CartPole-v1", width=8, depth=1, batch_size=4, env_steps=8 + 4,
                learning_starts=8, chunk_env_steps=4, buffer_size=64, val_buffer_size=8),
    "crl": dict(env="point_maze/u_maze", num_envs=4, env_steps=64 + 64, learning_starts=64,
                chunk_env_steps=64, batch_size=8, width=8, depth=4, actor_width=8, actor_depth=4,
                repr_dim=4, eval_episodes=2, buffer_size=256, utd=0.25),
    "sac": dict(width=8, depth=1, batch_size=4, env_steps=8 + 4, learning_starts=8, chunk_env_steps=4,
                buffer_size=64, val_buffer_size=8, eval_episodes=1),
}
# where each packable value must land: {name: [(optimizer path, hyper-parameter), ...]}
ROUTES = {
    "dqn": {"lr": [("opt", "learning_rate")], "weight_decay": [("opt", "weight_decay")],
            "tau": [(None, "tau")]},
    "crl": {"lr": [("opt_state", "learning_rate")]},
    "sac": {"lr": [("opt/critic", "learning_rate")], "actor_lr": [("opt/actor", "learning_rate")],
            "alpha_lr": [("opt/alpha", "learning_rate")],
            "weight_decay": [("opt/critic", "weight_decay"), ("opt/actor", "weight_decay")],
            "tau": [(None, "tau")]},   # None: a learner entry of its own (the Polyak rate), not an optimiser's
}


def _opt(learner, path):
    node = learner
    for part in path.split("/"):
        node = getattr(node, part) if hasattr(node, part) else node[part]
    return node


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_set_hparams_routes_every_packable_value(name):
    mod = agents.get(name)
    cfg = mod.Config(**CONFIGS[name])
    assert tuple(mod.hparams(cfg)) == tuple(mod.PACKABLE) and set(ROUTES[name]) == set(mod.PACKABLE)
    agent = mod.make(cfg)
    state = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                         jax.eval_shape(agent.init, jax.random.PRNGKey(0)))
    values = {k: 0.1 * (i + 1) for i, k in enumerate(mod.PACKABLE)}
    state = jax.jit(agent.set_hparams)(state, values)
    for key, places in ROUTES[name].items():
        for path, hp in places:
            got = float(state.learner[hp] if path is None else _opt(state.learner, path).hyperparams[hp])
            np.testing.assert_allclose(got, values[key], rtol=1e-6, err_msg=f"{name}.{key} -> {path}")


def test_injected_optimizer_uses_the_state_learning_rate():
    """Changing the stored lr changes the step exactly as building the optimiser with it would."""
    params, grads = jnp.array([[1.0, -2.0]]), jnp.array([[0.5, 0.25]])  # a matrix: decayed
    base = common.make_optimizer(1e-3, weight_decay=0.0, max_grad_norm=0.0)
    state = common.set_hyperparams(base.init(params), learning_rate=0.05, weight_decay=0.1)
    got, _ = base.update(grads, state, params)
    ref = common.make_optimizer(0.05, weight_decay=0.1, max_grad_norm=0.0)
    want, _ = ref.update(grads, ref.init(params), params)
    np.testing.assert_array_equal(got, want)
    want_optax, _ = optax.adamw(0.05, weight_decay=0.1).update(grads, optax.adamw(0.05).init(params), params)
    np.testing.assert_allclose(got, want_optax, rtol=1e-6)
