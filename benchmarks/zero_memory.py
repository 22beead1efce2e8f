"""Optimiser-state and total memory per device of the CRL update, replicated data parallel vs ZeRO-1
(`crl.Config(zero_optimizer=True)`, scaling_rl/zero.py), for deep CRL encoders.

    python benchmarks/zero_memory.py [--devices 4] [--width 256] [--depths 64,256,1024] [--batch 256]

Runs in one process on `--devices` forced CPU devices (XLA_FLAGS set before jax is imported). Nothing is
allocated: the update `agent.update(learner, batch, key)` is lowered from abstract shapes with the
learner's optimiser state placed as ZeRO-1 shards it (`zero.state_specs`: P("data") on rank >= 1,
replicated scalars; everything else replicated) and compiled; the per-device numbers are XLA's
`compiled.memory_analysis()` of the partitioned program (arguments = parameters + optimiser state +
batch; temp = activations, gradients, collectives' buffers). `opt state / device` is counted from the
state's shapes (exact). Columns are MiB per device and the ratio ZeRO-1 / replicated.
"""
from __future__ import annotations

import argparse
import os
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depths", default="64,256,1024")
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args(argv)
    try:
        depths = [int(d) for d in args.depths.split(",")]
    except ValueError:
        print(f"--depths: expected comma-separated integers, got {args.depths!r}", file=sys.stderr)
        return 2
    if args.devices < 2 or args.batch % args.devices:
        print(f"--devices: need >= 2 devices dividing --batch {args.batch}, got {args.devices}", file=sys.stderr)
        return 2
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={args.devices}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import dataclasses

    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    from scaling_rl import parallel, zero
    from scaling_rl.agents import crl

    mesh = parallel.make_mesh(args.devices)
    mib = 2.0 ** -20
    print(f"CRL update, width {args.width}, batch {args.batch}, {args.devices} forced CPU devices; "
          "MiB per device (XLA memory analysis)")
    print(f"{'depth':>6} {'params M':>9} | {'opt state rep':>13} {'ZeRO-1':>8} {'ratio':>6} | "
          f"{'args rep':>9} {'ZeRO-1':>8} | {'args+temp rep':>13} {'ZeRO-1':>8} {'ratio':>6}")
    for depth in depths:
        cfg = crl.Config(env="point_maze/open", width=args.width, depth=depth, actor_width=64,
                         actor_depth=4, batch_size=args.batch, num_envs=4, env_steps=4096,
                         learning_starts=64, chunk_env_steps=64, buffer_size=256, eval_episodes=1,
                         episode_length=64)
        row = {}
        for name, c in (("rep", cfg), ("zero", dataclasses.replace(cfg, zero_optimizer=True))):
            agent = crl.make(c, mesh=mesh)
            state = jax.eval_shape(agent.init, jax.random.PRNGKey(0))
            learner = state.learner
            rep = NamedSharding(mesh, P())
            opt_specs = zero.state_specs(learner.opt_state) if name == "zero" else \
                jax.tree.map(lambda _: P(), learner.opt_state)
            shard = learner.replace(params=jax.tree.map(lambda _: rep, learner.params),
                                    opt_state=jax.tree.map(lambda s: NamedSharding(mesh, s), opt_specs))
            data = state.buffer.data  # (rows, envs, dim) per field
            batch = {k: jax.ShapeDtypeStruct((args.batch, data[f].shape[-1]), jnp.float32)
                     for k, f in (("state", "state"), ("action", "action"), ("goal", "achieved"))}
            compiled = jax.jit(agent.update, in_shardings=(shard, NamedSharding(mesh, P("data")), rep),
                               out_shardings=(shard, rep)).lower(
                learner, batch, jax.ShapeDtypeStruct((2,), jnp.uint32)).compile()
            m = compiled.memory_analysis()
            opt_bytes = sum(x.size * x.dtype.itemsize // (args.devices if name == "zero" and x.ndim else 1)
                            for x in jax.tree.leaves(learner.opt_state))
            row[name] = (opt_bytes, m.argument_size_in_bytes, m.argument_size_in_bytes + m.temp_size_in_bytes)
            n_params = sum(x.size for x in jax.tree.leaves(learner.params))
        r, z = row["rep"], row["zero"]
        print(f"{depth:>6} {n_params / 1e6:>9.2f} | {r[0] * mib:>13.1f} {z[0] * mib:>8.1f} {z[0] / r[0]:>6.3f} | "
              f"{r[1] * mib:>9.1f} {z[1] * mib:>8.1f} | {r[2] * mib:>13.1f} {z[2] * mib:>8.1f} {z[2] / r[2]:>6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
