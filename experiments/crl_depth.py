"""Depth study (Wang et al. 2025, Fig. 1/3): CRL encoder depth -> time at goal and success.

Every depth trains `--seeds` seeds in one vmapped program; the score of a seed is its deterministic
evaluation after the last chunk (`eval_time_at_goal`, `eval_success_any`). Writes, under --out:
  results.json   per-depth per-seed scores, per-chunk metric means over seeds, the config of each depth,
                 and `random_policy` (the same evaluation under uniformly random actions)
  depth.md       table: a random-policy row, then depth, encoder params, time at goal and success
                 (mean ± 95% t-CI over seeds)
  depth.png      both metrics vs depth (log2 axis) with the CIs

CPU scale (point big maze, 200-step episodes, depths 4 and 16, ~4 min on one core; both learn,
with no depth effect at this budget, see README):   python experiments/crl_depth.py
CI smoke (depths 4, 8; 2 seeds):    python experiments/crl_depth.py --tiny --out /tmp/crl_depth
GPU scale (brax, paper settings):   python experiments/crl_depth.py --env goal/ant_u_maze \
    --depths 4,8,16,32,64 --seeds 3 --env-steps 50000000 --num-envs 512 --utd 0.025 \
    --batch-size 512 --width 256 --chunk-env-steps 1024000 --episode-length 1000
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import time
from pathlib import Path

import jax
import numpy as np

from scaling_rl import io
from scaling_rl.agents import crl

# CI: two depths, two seeds, a budget in which CRL already learns the point U-maze (tests assert it)
TINY = dict(env="point_maze/u_maze", depths="4,8", seeds=2, env_steps=1024 + 2 * 8192, num_envs=32, utd=0.125,
            episode_length=0, buffer_rows=1024)


def mean_ci(x, level: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the two-sided t confidence interval (0 for one seed)."""
    from scipy import stats

    x = np.asarray(x, np.float64)
    if len(x) < 2:
        return float(x.mean()), 0.0
    half = stats.t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return float(x.mean()), float(half)


def study_config(args, depth: int) -> crl.Config:
    learning_starts = max(args.num_envs, (args.learning_starts // args.num_envs) * args.num_envs)
    return crl.Config(env=args.env, num_envs=args.num_envs, env_steps=args.env_steps,
                      learning_starts=learning_starts, chunk_env_steps=args.chunk_env_steps, utd=args.utd,
                      batch_size=args.batch_size, width=args.width, depth=depth, actor_width=args.width,
                      actor_depth=args.actor_depth or depth, repr_dim=args.repr_dim,
                      eval_episodes=args.eval_episodes, episode_length=args.episode_length,
                      buffer_size=args.num_envs * args.buffer_rows)


def random_baseline(args) -> dict:
    """The same deterministic-evaluation metrics under uniformly random actions (what learning must beat)."""
    cfg = study_config(args, 4)
    key = jax.random.PRNGKey(args.seed + 10_000)
    m = jax.device_get(jax.jit(lambda k: crl.random_policy_metrics(cfg, k, max(cfg.eval_episodes, 256)))(key))
    return {"time_at_goal": float(m["eval_time_at_goal"]), "success": float(m["eval_success_any"])}


def run_depth(args, depth: int) -> dict:
    cfg = study_config(args, depth)
    agent = crl.make(cfg)
    train = jax.jit(jax.vmap(crl.make_train(cfg)))
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(args.seed), i))(np.arange(args.seeds))
    t0 = time.perf_counter()
    _, metrics = train(keys)
    metrics = jax.device_get(metrics)
    secs = time.perf_counter() - t0
    out = {"depth": depth, "param_count": agent.param_count, "seconds": secs,
           "time_at_goal": metrics["eval_time_at_goal"][:, -1].tolist(),
           "success": metrics["eval_success_any"][:, -1].tolist(),
           "chunk_means": {k: np.asarray(v, np.float64).mean(0).tolist() for k, v in metrics.items()},
           "config": dataclasses.asdict(cfg)}
    t, s = mean_ci(out["time_at_goal"]), mean_ci(out["success"])
    print(f"depth {depth:4d}  N={agent.param_count:>10,}  time_at_goal {t[0]:7.1f} ± {t[1]:5.1f}  "
          f"success {s[0]:.2f} ± {s[1]:.2f}  ({secs:.0f} s)", flush=True)
    return out


def table(results: list[dict], env: str, seeds: int, random: dict | None = None) -> str:
    lines = [f"CRL depth study on `{env}` ({seeds} seeds; mean ± 95% CI; final deterministic eval)", "",
             "| depth | encoder params | time at goal | success |", "|---:|---:|---:|---:|"]
    if random is not None:
        lines.append(f"| random policy | 0 | {random['time_at_goal']:.1f} | {random['success']:.2f} |")
    for r in results:
        t, s = mean_ci(r["time_at_goal"]), mean_ci(r["success"])
        lines.append(f"| {r['depth']} | {r['param_count']:,} | {t[0]:.1f} ± {t[1]:.1f} | {s[0]:.2f} ± {s[1]:.2f} |")
    return "\n".join(lines) + "\n"


def plot(results: list[dict], path: Path, env: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    depths = [r["depth"] for r in results]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, key, label in ((axes[0], "time_at_goal", "time at goal (steps)"), (axes[1], "success", "success (any)")):
        stats = [mean_ci(r[key]) for r in results]
        ax.errorbar(depths, [m for m, _ in stats], yerr=[h for _, h in stats], marker="o", capsize=3)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("encoder depth (Dense layers)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.suptitle(f"CRL depth study: {env}")
    fig.tight_layout()
    io.atomic_savefig(fig, path, fmt="png", dpi=120)
    plt.close(fig)


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="point_maze/big_maze")
    p.add_argument("--depths", default="4,16")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--env-steps", type=int, default=1024 + 12 * 8192)
    p.add_argument("--learning-starts", type=int, default=1024)
    p.add_argument("--num-envs", type=int, default=128)
    p.add_argument("--chunk-env-steps", type=int, default=8192)
    p.add_argument("--utd", type=float, default=0.0625)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--actor-depth", type=int, default=4, help="0: the same as the encoder depth")
    p.add_argument("--repr-dim", type=int, default=16)
    p.add_argument("--eval-episodes", type=int, default=128)
    p.add_argument("--episode-length", type=int, default=200, help="0: the env's own")
    p.add_argument("--buffer-rows", type=int, default=1024, help="buffer steps kept per env")
    p.add_argument("--out", default="runs/crl_depth")
    p.add_argument("--tiny", action="store_true", help="seconds-sized smoke run (CI)")
    args = p.parse_args(argv)
    if args.tiny:
        for k, v in TINY.items():
            setattr(args, k, v)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    random = random_baseline(args)
    results = [run_depth(args, int(d)) for d in args.depths.split(",")]
    io.atomic_write_json(out / "results.json", {"env": args.env, "seeds": args.seeds, "random_policy": random,
                                                "results": results})
    io.atomic_write_text(out / "depth.md", table(results, args.env, args.seeds, random))
    plot(results, out / "depth.png", args.env)
    print(table(results, args.env, args.seeds, random))
    return results


if __name__ == "__main__":
    main()
