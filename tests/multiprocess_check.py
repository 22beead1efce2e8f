"""Run by tests/test_multiprocess.py: one trial's learner spanning JAX *processes* (issue 24, part 1).

    python multiprocess_check.py proc <process_id> <num_processes> <port>   # one of N processes, 1 device each
    python multiprocess_check.py devices <n>                                 # one process, n forced host devices

Each builds the SAC and CRL learners with `data_parallel=True` (a mesh over every device the run sees:
after `jax.distributed.initialize()` that is the devices of all processes, with gloo CPU collectives
between processes), runs init + 2 chunks and prints one JSON line: for every float leaf of the final
state, its float64 sum and sum of absolute values, plus the last chunk's metrics. CRL runs twice from
one init: with per-device InfoNCE negatives (the default) and with `global_negatives=True`; and the
gradient of its contrastive loss alone is compared with the whole-batch gradient (`contrastive_grad`).
"""
import os
import sys

MODE = sys.argv[1]
if MODE == "devices":
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={int(sys.argv[2])}").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

if MODE == "proc":   # the launcher's path (scaling_rl/multiprocess.py): gloo, timeouts, heartbeat
    from scaling_rl import multiprocess

    os.environ.update({multiprocess.ENV_COORDINATOR: f"127.0.0.1:{int(sys.argv[4])}",
                       multiprocess.ENV_NUM_PROCESSES: sys.argv[3], multiprocess.ENV_PROCESS_ID: sys.argv[2]})
    multiprocess.initialize()

from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from scaling_rl import parallel  # noqa: E402
from scaling_rl.agents import crl, sac  # noqa: E402

# CRL: one block per network, 2 updates per chunk (utd 0.5 x 4 envs: 1 vector step, then 2 updates);
# 3-step episodes, so the last chunk finishes some (its episode metrics are numbers, not NaN)
CRL = dict(env="point_maze/open", num_envs=4, env_steps=24, learning_starts=16, chunk_env_steps=4, utd=0.5,
           batch_size=8, width=8, depth=4, actor_width=8, actor_depth=4, repr_dim=4, buffer_size=64,
           episode_length=3, eval_episodes=1, data_parallel=True)
CONFIGS = {
    "sac": (sac, dict(env="gymnax/Pendulum-v1", num_envs=2, env_steps=64, chunk_env_steps=32,
                      batch_size=8, width=16, depth=1, learning_starts=8, buffer_size=128,
                      eval_episodes=2, data_parallel=True)),
    "crl": (crl, CRL),
    "crl_global": (crl, {**CRL, "global_negatives": True}),
}


def local(x) -> np.ndarray:
    """The value of a (replicated) array as this process sees it."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        x = x.addressable_shards[0].data
    return np.asarray(x, dtype=np.float64)


def place(tree, spec, mesh):
    """Host arrays -> global arrays on `mesh` with sharding `spec` (a pytree of PartitionSpecs, or one)."""
    specs = spec if not isinstance(spec, P) else jax.tree.map(lambda _: spec, tree)
    return jax.tree.map(lambda x, s: jax.make_array_from_callback(
        np.shape(x), NamedSharding(mesh, s), lambda idx, x=x: np.asarray(np.asarray(x)[idx])), tree, specs)


def run(name, init=None):
    """init + 2 chunks of CONFIGS[name] (from `init`'s state when given: the CRL variants share one)
    -> (the JSON summary, the state after init)."""
    mod, overrides = CONFIGS[name]
    agent = mod.make(mod.Config(**overrides))
    # jitted, the state replicated over the mesh from init on: both chunks then share one compile (eager,
    # the first chunk's local-device inputs and the second's mesh-replicated ones compile twice)
    replicated = NamedSharding(parallel.make_mesh(), P())
    if init is None:
        init = jax.jit(agent.init, out_shardings=replicated)(jax.random.key(0))
    state, chunk = init, jax.jit(agent.chunk, out_shardings=replicated)
    for _ in range(2):
        state, metrics = chunk(state)
    leaves = [x for x in jax.tree.leaves(state)
              if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)]
    return {"sum": [float(local(x).sum()) for x in leaves],
            "abs": [float(np.abs(local(x)).sum()) for x in leaves],
            "metrics": {k: float(local(v).mean()) for k, v in sorted(metrics.items())},
            "devices": jax.device_count(), "processes": jax.process_count()}, init


def contrastive_grad():
    """The gradient of CRL's contrastive loss alone (symmetric InfoNCE: both the row and the column
    blocks) through linear encoders, data parallel over every device, with global negatives and with
    per-device ones, and max |difference| from the whole-batch gradient on this process's own device.
    Adam (the agent's optimiser) hides a gradient that is off by a constant factor; this does not."""
    cfg = crl.Config(contrastive_loss="symmetric")
    rng = np.random.default_rng(0)
    params = {"w_sa": rng.normal(size=(3, 4)).astype(np.float32), "w_g": rng.normal(size=(2, 4)).astype(np.float32)}
    batch = {"x": rng.normal(size=(8, 3)).astype(np.float32), "y": rng.normal(size=(8, 2)).astype(np.float32)}

    def loss(axis):
        return lambda p, b, _: crl.contrastive_loss(b["x"] @ p["w_sa"], b["y"] @ p["w_g"], cfg, axis)

    (_, _), ref = jax.jit(jax.value_and_grad(loss(None), has_aux=True))(params, batch, None)
    mesh = parallel.make_mesh()
    args = (place(params, P(), mesh), place(batch, P("data"), mesh), None)
    out = {}
    for name, axis in (("global", parallel.DATA_AXIS), ("local", None)):
        (_, aux), g = jax.jit(parallel.data_parallel_value_and_grad(loss(axis), mesh))(*args)
        out[name] = {"grad": [local(x).ravel().tolist() for x in jax.tree.leaves(g)],
                     "vs_single": max(float(np.max(np.abs(local(a) - np.asarray(b))))
                                      for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(ref))),
                     "accuracy": float(local(aux["accuracy"]))}
    out["scale"] = max(float(np.max(np.abs(x))) for x in jax.tree.leaves(ref))
    return out


def zero_step():
    """ZeRO-1 (scaling_rl/zero.py) over every device of the run: two sharded SGD-momentum steps with a
    different gradient per device vs the replicated optax update of the mean gradient, computed here
    (SGD-momentum: a state to shard and linear in g, so float rounding stays rounding)."""
    import optax

    from scaling_rl import zero

    mesh, n = parallel.make_mesh(), jax.device_count()
    params = {"w": np.arange(24.0, dtype=np.float32).reshape(8, 3) / 10, "b": np.ones((3,), np.float32),
              "s": np.float32(0.5)}
    grads = [jax.tree.map(lambda p, k=k: np.stack([p * (i + 1) * k + 0.01 * i for i in range(n)]), params)
             for k in (1.0, -0.5)]
    tx = optax.sgd(0.1, momentum=0.9)
    opt = zero.ShardedOptimizer(tx, n)
    state0 = jax.tree.map(np.asarray, opt.init(params))
    specs = zero.state_specs(state0)

    f = jax.jit(jax.shard_map(lambda g, s, p: opt.step(jax.tree.map(lambda x: x[0], g), 1, s, p), mesh=mesh,
                              in_specs=(P("data"), specs, P()), out_specs=(P(), specs)))
    new, state = place(params, P(), mesh), place(state0, specs, mesh)
    ref, ref_state = params, tx.init(params)
    for g in grads:
        new, state = f(place(g, P("data"), mesh), state, new)
        upd, ref_state = tx.update(jax.tree.map(lambda x: x.mean(0), g), ref_state, ref)
        ref = optax.apply_updates(ref, upd)
    diff = max(float(np.max(np.abs(local(a) - np.asarray(b)))) for a, b in
               zip(jax.tree.leaves(new), jax.tree.leaves(ref)))
    return {"vs_replicated": diff,
            "change": max(float(np.max(np.abs(local(a) - b))) for a, b in
                          zip(jax.tree.leaves(new), jax.tree.leaves(params))),
            "params": [local(x).ravel().tolist() for x in jax.tree.leaves(new)],
            "state_shapes": [[list(x.shape), list(x.addressable_shards[0].data.shape)]
                             for x in jax.tree.leaves(state)]}


out = {"sac": run("sac")[0]}
out["crl"], crl_init = run("crl")
out["crl_global"], _ = run("crl_global", crl_init)
out["contrastive_grad"] = contrastive_grad()
out["zero"] = zero_step()
print(json.dumps(out), flush=True)
