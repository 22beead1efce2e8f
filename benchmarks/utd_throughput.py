"""Gradient updates per second at UTD σ = 1, 4, 8 for the same SAC model (one jitted chunk each).

    .venv/bin/python benchmarks/utd_throughput.py [--width 256] [--depth 2] [--updates 1024]

Every σ runs the same number of gradient steps per chunk (`--updates`), so a chunk at σ=8 takes
8× fewer env steps than at σ=1; the UTD loop is a scan of U updates after each vectorised env
step (no host round trip, no masking), so throughput should not drop as σ grows. Compile excluded;
best of `--repeats`. Last line: updates_per_s_ratio_utd8_over_utd1=<x> (target >= 0.9).
Measured on the shared 2-core dev box (load ~8, so noisy): 9.8 / 11.5 / 8.7 updates/s at σ=1/4/8,
ratio 0.90 (width 256, depth 2, batch 256).
"""
from __future__ import annotations

import argparse
import time

import jax

from scaling_rl.agents import sac

UTDS = (1, 4, 8)


def measure(utd: int, args) -> dict:
    chunk_env_steps = args.updates // utd
    cfg = sac.Config(env="gymnax/Pendulum-v1", width=args.width, depth=args.depth,
                     batch_size=args.batch_size, utd=float(utd), num_envs=1,
                     learning_starts=args.batch_size, chunk_env_steps=chunk_env_steps,
                     env_steps=args.batch_size + chunk_env_steps * (args.repeats + 1),
                     buffer_size=10_000, val_buffer_size=max(1_000, args.batch_size), eval_episodes=1)
    agent = sac.make(cfg)
    state = jax.jit(agent.init)(jax.random.PRNGKey(0))
    t0 = time.perf_counter()
    chunk = jax.jit(agent.chunk).lower(state).compile()
    compile_s = time.perf_counter() - t0
    state, _ = chunk(state)  # warm-up run
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        state, metrics = chunk(state)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t0)
    best = min(times)
    return {"utd": utd, "env_steps": chunk_env_steps, "updates": args.updates, "compile_s": compile_s,
            "chunk_s": best, "updates_per_s": args.updates / best}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--updates", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    rows = [measure(u, args) for u in UTDS]
    print(f"SAC Pendulum-v1 bro width={args.width} depth={args.depth} batch={args.batch_size} "
          f"({jax.devices()[0].platform}x{jax.device_count()}); {args.updates} updates per chunk")
    print(f"{'utd':>4}{'env_steps':>11}{'compile_s':>11}{'chunk_s':>10}{'updates/s':>12}")
    for r in rows:
        print(f"{r['utd']:>4}{r['env_steps']:>11}{r['compile_s']:>11.1f}{r['chunk_s']:>10.3f}"
              f"{r['updates_per_s']:>12.1f}")
    print(f"updates_per_s_ratio_utd8_over_utd1={rows[-1]['updates_per_s'] / rows[0]['updates_per_s']:.2f}")


if __name__ == "__main__":
    main()
