"""Run by tests/test_parallel.py in a fresh process: 8 forced host devices, so XLA_FLAGS must be set
before jax is imported. Prints one JSON line with the max abs differences between the data-parallel
(8-device shard_map) and the single-device computation on the same global batch."""
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from scaling_rl import parallel, replay  # noqa: E402
from scaling_rl.agents import dqn, sac  # noqa: E402


def max_diff(a, b) -> float:
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def max_scale(a) -> float:
    return max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(a))


def one_update(mod, cfg, mesh):
    """State after init, one batch of the global batch size, and the update on 1 vs `mesh` devices."""
    single, sharded = mod.make(cfg), mod.make(cfg, mesh=mesh)
    state = jax.jit(single.init)(jax.random.PRNGKey(0))
    batch = replay.sample(state.replay, jax.random.PRNGKey(1), cfg.batch_size)
    key = jax.random.PRNGKey(2)
    a, ma = jax.jit(single.update)(state.learner, batch, key)
    b, mb = jax.jit(sharded.update)(state.learner, batch, key)
    change = max_diff(a, state.learner)
    return {"params": max_diff(a, b), "metrics": max_diff(ma, mb), "change": change,
            "scale": max_scale(a)}


def main():
    out = {"devices": jax.device_count()}
    mesh = parallel.make_mesh()
    out["mesh"] = dict(mesh.shape)
    # Small shapes: compile time is the cost here. The SAC update goes through the scanned stack.
    small = dict(width=16, batch_size=64, num_envs=2, env_steps=256, learning_starts=128,
                 chunk_env_steps=32, buffer_size=256, val_buffer_size=64, eval_episodes=1)
    sac_cfg = sac.Config(depth=2, **small)
    out["sac"] = one_update(sac, sac_cfg, mesh)
    out["dqn"] = one_update(dqn, dqn.Config(depth=1, scan=False, **small), mesh)

    # A whole chunk (32 env steps, 32 updates) with seeds vmapped, via Config(data_parallel=True).
    sac_cfg = sac.Config(depth=1, scan=False, **small)
    dp_cfg = dataclasses_replace(sac_cfg, data_parallel=True)
    keys = jax.random.split(jax.random.PRNGKey(3), 2)
    single, sharded = sac.make(sac_cfg), sac.make(dp_cfg)
    state = jax.jit(jax.vmap(single.init))(keys)
    a, ma = jax.jit(jax.vmap(single.chunk))(state)
    b, mb = jax.jit(jax.vmap(sharded.chunk))(state)
    out["chunk"] = {"params": max_diff(a.learner, b.learner), "scale": max_scale(a.learner),
                    "grad_steps": int(mb["grad_steps"][0])}
    print(json.dumps(out))


def dataclasses_replace(cfg, **kw):
    import dataclasses
    return dataclasses.replace(cfg, **kw)


if __name__ == "__main__":
    main()
