"""Flow-GRPO speed: sampling throughput, FLOPs per policy update, and Fast vs full-trajectory loss.

    python benchmarks/flow_grpo_speed.py                       # CPU default (toy2d, width 256)
    python benchmarks/flow_grpo_speed.py --dataset shapes --width 512 --groups 16 --t-train 20

One process, one run: the full and Fast updates are timed alternately (interleaved repeats, median
of each), so machine noise hits both alike. Reported per variant: seconds per policy update, samples
(generations) per second of training, analytic FLOPs per update split into sampling / reference /
training (`grpo.update_flops`; 1 backward = 2 forwards), and ODE sampling throughput at T_eval.
The last line is `fast_speedup=<x>` = (s per full update) / (s per Fast update).
The analytic ratio counts velocity-network FLOPs only; the measured speedup can exceed it because
each SDE step also draws d-dimensional Gaussian noise (threefry on CPU: ~28 ms of the ~88 ms full
shapes rollout, 20 × 64 × 432 normals) and does elementwise score / log-prob work, which Fast's
ODE prefix and suffix skip.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import jax


def _time(fn, *args, repeats: int):
    out = fn(*args)
    jax.block_until_ready(out)           # compile + warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return times


def main(argv=None) -> float:
    from scaling_rl.flow import grpo

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="toy2d")
    p.add_argument("--reward", default=None, help="default: toy_angle (toy2d) / shapes_red (shapes)")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--t-train", type=int, default=20)
    p.add_argument("--t-eval", type=int, default=40)
    p.add_argument("--fast-window", type=int, default=2)
    p.add_argument("--num-iterations", type=int, default=1)
    p.add_argument("--updates-per-call", type=int, default=5, help="policy updates per timed chunk")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)

    reward = args.reward or ("toy_angle" if args.dataset == "toy2d" else "shapes_red")
    base = grpo.Config(dataset=args.dataset, reward=reward, width=args.width, depth=args.depth,
                       groups=args.groups, group_size=args.group_size, t_train=args.t_train,
                       t_eval=args.t_eval, fast_window=args.fast_window,
                       num_iterations=args.num_iterations, pretrain_steps=0,
                       updates=args.updates_per_call, chunk_updates=args.updates_per_call,
                       eval_samples=args.groups * args.group_size)
    variants = {"full": base, "fast": dataclasses.replace(base, fast=True)}
    agents = {k: grpo.make(c) for k, c in variants.items()}
    state = jax.jit(agents["full"].init)(jax.random.PRNGKey(0))   # same params for both
    chunks = {k: jax.jit(a.chunk) for k, a in agents.items()}
    dim, classes = agents["full"].dataset.dim, agents["full"].num_classes
    print(f"flow_grpo_speed: {args.dataset} width {args.width} depth {args.depth} · N="
          f"{agents['full'].param_count:,} · B={base.batch_size} (G={base.group_size}) · T_train "
          f"{base.t_train} · Fast window {base.fast_window} · μ={base.num_iterations} · "
          f"{jax.devices()[0].platform}")
    times = {k: [] for k in variants}
    for k in variants:                                 # compile both first
        _time(chunks[k], state, repeats=0)
    for _ in range(args.repeats):                      # then interleave
        for k in variants:
            times[k] += _time(chunks[k], state, repeats=1)
    per_update = {k: statistics.median(v) / args.updates_per_call for k, v in times.items()}
    for k, cfg in variants.items():
        f = grpo.update_flops(cfg, dim, classes)
        print(f"  {k:4s}: {per_update[k] * 1e3:8.2f} ms/update  {cfg.batch_size / per_update[k]:9.1f} "
              f"samples/s  FLOPs/update {f['total']:.3e} (sampling {f['sampling']:.2e}, reference "
              f"{f['reference']:.2e}, training {f['training']:.2e})  "
              f"{f['total'] / per_update[k] / 1e9:6.2f} GFLOP/s")
    flops_ratio = grpo.update_flops(base, dim, classes)["total"] / \
        grpo.update_flops(variants["fast"], dim, classes)["total"]
    n_eval = 256
    sample = jax.jit(lambda params, key: agents["full"].sample_ode(params, key, n_eval, base.t_eval)[0])
    t_ode = statistics.median(_time(sample, state.params, jax.random.PRNGKey(1), repeats=args.repeats))
    print(f"  ODE sampling at T_eval={base.t_eval}: {n_eval / t_ode:,.0f} samples/s")
    speedup = per_update["full"] / per_update["fast"]
    print(f"  analytic FLOPs ratio full/fast = {flops_ratio:.2f}")
    print(f"fast_speedup={speedup:.2f}")
    return speedup


if __name__ == "__main__":
    main()
