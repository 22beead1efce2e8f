"""Seeds in one program: 8 SAC seeds vmapped in one jitted `train` vs 8 sequential calls of the
1-seed jitted `train`, the same total work (env steps and gradient steps per seed).

    .venv/bin/python benchmarks/seeds_vmap.py [--seeds 8] [--width 64] [--env-steps 1500]

Compile time is measured separately and excluded from both run times (each program is compiled
once; the sequential runs reuse theirs). Best of `--repeats` for each. Last line:
speedup_vmap_over_sequential=<sequential run time / vmapped run time> (target >= 3 on a CPU).

Both sides are whole-run XLA programs (no Python per step), so vmap only wins by batching ops: on
a CPU the gain is large where per-op overhead dominates (small nets) and shrinks where the 1-seed
run is already compute bound. Measured on the shared 2-core dev box (load ~8): width 16 / batch 32
-> 3.00; width 64 / batch 128 -> 1.41.
"""
from __future__ import annotations

import argparse
import time

import jax

from scaling_rl.agents import sac


def timed(fn, *args) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--env-steps", type=int, default=1500)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()

    cfg = sac.Config(env="gymnax/Pendulum-v1", width=args.width, depth=args.depth,
                     batch_size=args.batch_size, env_steps=args.env_steps, learning_starts=500,
                     chunk_env_steps=500, buffer_size=max(args.env_steps, args.batch_size),
                     val_buffer_size=max(500, args.batch_size), eval_episodes=2, utd=1.0,
                     scan=args.depth > 1)  # a 1-block scan only adds compile time
    train = sac.make_train(cfg)
    keys = jax.random.split(jax.random.PRNGKey(0), args.seeds)
    grad_steps = (cfg.env_steps - cfg.warmup_env_steps) * cfg.utd * args.seeds

    t0 = time.perf_counter()
    vmapped = jax.jit(jax.vmap(train)).lower(keys).compile()
    vmap_compile = time.perf_counter() - t0
    t0 = time.perf_counter()
    single = jax.jit(train).lower(keys[0]).compile()
    single_compile = time.perf_counter() - t0

    vmap_run = min(timed(vmapped, keys) for _ in range(args.repeats))

    def sequential():
        return [single(k) for k in keys]

    seq_run = min(timed(sequential) for _ in range(args.repeats))

    print(f"SAC Pendulum-v1 width={cfg.width} depth={cfg.depth} batch={cfg.batch_size} utd={cfg.utd} "
          f"env_steps/seed={cfg.env_steps} seeds={args.seeds} devices={jax.devices()[0].platform}"
          f"x{jax.device_count()}")
    print(f"{'mode':<22}{'compile_s':>10}{'run_s':>10}{'updates/s':>12}")
    print(f"{'vmap (1 program)':<22}{vmap_compile:>10.1f}{vmap_run:>10.2f}{grad_steps / vmap_run:>12.0f}")
    print(f"{'sequential (8 calls)':<22}{single_compile:>10.1f}{seq_run:>10.2f}"
          f"{grad_steps / seq_run:>12.0f}")
    print(f"speedup_vmap_over_sequential={seq_run / vmap_run:.2f}")


if __name__ == "__main__":
    main()
