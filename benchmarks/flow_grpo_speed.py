"""Flow-GRPO speed: sampling throughput, FLOPs per policy update, and Fast vs full-trajectory loss.

    python benchmarks/flow_grpo_speed.py                       # CPU default (toy2d, width 256)
    python benchmarks/flow_grpo_speed.py --dataset shapes --width 512 --groups 16 --t-train 20

One process, one run: the full, Fast (official) and shared-prefix updates are timed alternately
(interleaved repeats, median of each), so machine noise hits all alike. Every repeat starts from the
same parameters with a fresh key (`fold_in(key, repeat)`), so the Fast window starts differ between
repeats. Reported per variant: ms per policy update, of which the rollout (sampling: timed alone on
the same keys), samples per second, analytic FLOPs per update split into sampling / reference /
training (`grpo.update_flops`; 1 backward = 2 forwards), and the FLOPs the timed chunks actually
did (counted by the agent: this follows the window starts drawn). The ratios printed: measured
speedup (s per full update / s per variant update), the analytic expected FLOP ratio, and the
counted FLOP ratio at the starts used. A speedup above the FLOP ratio is time the FLOPs do not
count (per-step noise draws, elementwise SDE work, dispatch), shown by the rollout column.
The last line is `fast_speedup=<x>` (official Fast).
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
    variants = {"full": base, "fast": dataclasses.replace(base, sampler="fast"),
                "shared_prefix": dataclasses.replace(base, sampler="shared_prefix")}
    agents = {k: grpo.make(c) for k, c in variants.items()}
    state = jax.jit(agents["full"].init)(jax.random.PRNGKey(0))   # same params for all
    chunks = {k: jax.jit(a.chunk) for k, a in agents.items()}
    rollouts = {k: jax.jit(a.rollout) for k, a in agents.items()}
    dim, classes = agents["full"].dataset.dim, agents["full"].num_classes
    cond = jax.numpy.zeros((base.groups,), jax.numpy.int32)
    print(f"flow_grpo_speed: {args.dataset} width {args.width} depth {args.depth} · N="
          f"{agents['full'].param_count:,} · B={base.batch_size} (G={base.group_size}) · T_train "
          f"{base.t_train} · window {base.fast_window} · μ={base.num_iterations} · "
          f"{args.repeats} repeats · {jax.devices()[0].platform}")
    times = {k: [] for k in variants}
    roll_times = {k: [] for k in variants}
    counted = {k: [] for k in variants}
    starts = {k: [] for k in variants}
    for k in variants:                                 # compile all first
        jax.block_until_ready(chunks[k](state))
        jax.block_until_ready(rollouts[k](state.params, state.key, cond))
    for rep in range(args.repeats):                    # then interleave, a fresh key per repeat
        s = state.replace(key=jax.random.fold_in(state.key, rep))
        for k in variants:
            t0 = time.perf_counter()
            _, m = jax.block_until_ready(chunks[k](s))
            times[k].append(time.perf_counter() - t0)
            counted[k].append(float(m["flops"]))
            starts[k].append(float(m["window_start"]))
            t0 = time.perf_counter()
            jax.block_until_ready(rollouts[k](s.params, s.key, cond))
            roll_times[k].append(time.perf_counter() - t0)
    per_update = {k: statistics.median(v) / args.updates_per_call for k, v in times.items()}
    flops = {k: grpo.update_flops(c, dim, classes) for k, c in variants.items()}
    for k, cfg in variants.items():
        f = flops[k]
        print(f"  {k:13s}: {per_update[k] * 1e3:8.2f} ms/update (rollout alone "
              f"{statistics.median(roll_times[k]) * 1e3:7.2f} ms)  {cfg.batch_size / per_update[k]:9.1f} "
              f"samples/s  FLOPs/update {f['total']:.3e} (sampling {f['sampling']:.2e}, reference "
              f"{f['reference']:.2e}, training {f['training']:.2e})  mean window start "
              f"{statistics.mean(starts[k]):.2f}")
    n_eval = 256
    sample = jax.jit(lambda params, key: agents["full"].sample_ode(params, key, n_eval, base.t_eval)[0])
    t_ode = statistics.median(_time(sample, state.params, jax.random.PRNGKey(1), repeats=args.repeats))
    print(f"  ODE sampling at T_eval={base.t_eval}: {n_eval / t_ode:,.0f} samples/s")
    for k in ("fast", "shared_prefix"):
        print(f"  {k}: measured speedup {per_update['full'] / per_update[k]:.2f}  analytic FLOPs ratio "
              f"(expected start) {flops['full']['total'] / flops[k]['total']:.2f}  counted FLOPs ratio "
              f"(starts used) {statistics.mean(counted['full']) / statistics.mean(counted[k]):.2f}  "
              f"rollout time ratio {statistics.median(roll_times['full']) / statistics.median(roll_times[k]):.2f}")
    speedup = per_update["full"] / per_update["fast"]
    print(f"fast_speedup={speedup:.2f}")
    return speedup


if __name__ == "__main__":
    main()
