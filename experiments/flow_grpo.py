"""Flow-GRPO vs denoising reduction vs Flow-GRPO-Fast: evaluation reward against training FLOPs.

    python experiments/flow_grpo.py                    # CPU default: 2-D toy, 3 seeds, ~2-4 min
    python experiments/flow_grpo.py --out runs/flow_grpo_shapes --dataset shapes \\
        --reward shapes_red --width 512 --depth 4 --pretrain-steps 20000 --pretrain-batch 256 \\
        --pretrain-lr 1e-3 --lr 3e-4 --groups 16 --group-size 16 --updates 400 --chunk-updates 10 --seeds 3  # GPU

Three variants from the same pretrained reference (`pretrain_seed` 0), same seeds and number of
policy updates:
  flow_grpo  T_train = T_eval (no reduction), loss on every denoising step;
  reduction  T_train < T_eval (denoising reduction), every step;
  fast       T_train < T_eval, shared ODE prefix per group, SDE branching and loss on a random
             window of `fast_window` steps (Flow-GRPO-Fast).
Evaluation is always the ODE at T_eval (noise from the seed and chunk key: fresh each chunk, shared by policy and reference) (`eval_return`, the reward), with the
per-step KL to the reference (train-time; also × T_train, since steps on a finer grid are
closer: the per-trajectory figure compares variants), and diversity = mean pairwise distance of same-condition
samples (a collapse to one mode — reward hacking — drives it to 0). FLOPs are the velocity-network
FLOPs of sampling + reference + training, analytic (`grpo.update_flops`).

Each variant is one resumable `train.run` under --out/<variant>/ (rerun to resume / reuse).
Writes curves.csv (variant, seed, chunk, flops, eval_return, kl, eval_diversity, ...),
flow_grpo.png, table.md, summary.json into --out.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pandas as pd  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scaling_rl import io as sio  # noqa: E402

METRICS = ("eval_return", "kl", "kl_path", "eval_diversity", "reward", "flops", "env_steps")


def variants(base, t_train: int, window: int) -> dict:
    return {"flow_grpo": dataclasses.replace(base, t_train=base.t_eval, fast=False),
            "reduction": dataclasses.replace(base, t_train=t_train, fast=False),
            "fast": dataclasses.replace(base, t_train=t_train, fast=True, fast_window=window)}


def flops_to(curve: pd.DataFrame, target: float):
    """FLOPs (seed mean) at the first chunk where the seed-mean eval reward reaches `target`."""
    hit = curve[curve["eval_return"] >= target]
    return float(hit["flops"].iloc[0]) if len(hit) else None


def plot(mean: pd.DataFrame, sd: pd.DataFrame, ref_reward: float, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for (name, m), (_, s) in zip(mean.groupby("variant", sort=False), sd.groupby("variant", sort=False)):
        for ax, key in zip(axes, ("eval_return", "kl_path", "eval_diversity")):
            ax.plot(m["flops"], m[key], "o-", ms=3, label=name)
            ax.fill_between(m["flops"], m[key] - s[key], m[key] + s[key], alpha=0.2)
    axes[0].axhline(ref_reward, color="grey", ls="--", lw=1, label="pretrained")
    for ax, label in zip(axes, ("eval reward (ODE at T_eval)", "KL to reference (per step × T_train)",
                                "diversity (pairwise distance)")):
        ax.set_xscale("log")
        ax.set_xlabel("training FLOPs (velocity net)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    sio.atomic_savefig(fig, path, fmt="png", dpi=120)
    plt.close(fig)


def table(rows: list[dict]) -> str:
    head = ("| variant | T_train | loss steps | FLOPs / update | final eval reward | KL / step | "
            "KL × T_train | diversity | FLOPs to target | train s |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        to = "not reached" if r["flops_to_target"] is None else f"{r['flops_to_target']:.2e}"
        lines.append(f"| {r['variant']} | {r['t_train']} | {r['loss_steps']} | {r['flops_per_update']:.2e} | "
                     f"{r['eval_return']:.3f} ± {r['eval_return_sd']:.3f} | {r['kl']:.3f} | {r['kl_path']:.2f} | "
                     f"{r['eval_diversity']:.3f} | {to} | {r['wall_s']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import jax

    from scaling_rl import train
    from scaling_rl.flow import grpo

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/flow_grpo")
    p.add_argument("--dataset", default="toy2d")
    p.add_argument("--reward", default="toy_angle")
    p.add_argument("--conditional", action="store_true")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--pretrain-steps", type=int, default=1500)
    p.add_argument("--pretrain-batch", type=int, default=256)
    p.add_argument("--pretrain-lr", type=float, default=3e-3)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--beta", type=float, default=0.01)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--t-eval", type=int, default=40)
    p.add_argument("--t-train", type=int, default=10)
    p.add_argument("--fast-window", type=int, default=2)
    p.add_argument("--updates", type=int, default=80)
    p.add_argument("--chunk-updates", type=int, default=4)
    p.add_argument("--eval-samples", type=int, default=256)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--target", type=float, default=0.9, help="eval reward for 'FLOPs to target'")
    args = p.parse_args(argv)

    base = grpo.Config(dataset=args.dataset, reward=args.reward, conditional=args.conditional,
                       width=args.width, depth=args.depth, pretrain_steps=args.pretrain_steps,
                       pretrain_batch=args.pretrain_batch, pretrain_lr=args.pretrain_lr, lr=args.lr, beta=args.beta,
                       groups=args.groups, group_size=args.group_size, t_eval=args.t_eval,
                       updates=args.updates, chunk_updates=args.chunk_updates,
                       eval_samples=args.eval_samples)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    frames, rows, ref_reward = [], [], math.nan
    for name, cfg in variants(base, args.t_train, args.fast_window).items():
        df = train.run("scaling_rl.flow.grpo", cfg, out / name, seeds=args.seeds, progress=False)
        wall = float(df["wall_time"].max())    # the run's own clock (compile + pretraining included)
        # per-step KLs are smaller on finer grids: per step × T_train compares whole trajectories
        df = df.assign(variant=name, kl_path=df["kl"] * cfg.t_train)
        frames.append(df)
        ref_reward = float(df["eval_ref_return"].mean())
        last = df[df["chunk"] == df["chunk"].max()]
        agent = grpo.make(cfg)
        curve = df.groupby("chunk")[list(METRICS)].mean()
        rows.append({"variant": name, "t_train": cfg.t_train, "loss_steps": cfg.window,
                     "flops_per_update": grpo.update_flops(cfg, agent.dataset.dim, agent.num_classes)["total"],
                     "eval_return": float(last["eval_return"].mean()),
                     "eval_return_sd": float(last["eval_return"].std(ddof=1)) if len(last) > 1 else 0.0,
                     "kl": float(last["kl"].mean()), "kl_path": float(last["kl_path"].mean()),
                     "eval_diversity": float(last["eval_diversity"].mean()),
                     "flops_to_target": flops_to(curve, args.target), "wall_s": wall,
                     "param_count": agent.param_count})
        print(f"{name}: final eval reward {rows[-1]['eval_return']:.3f}, KL {rows[-1]['kl']:.3f}, "
              f"diversity {rows[-1]['eval_diversity']:.3f}, FLOPs to {args.target}: "
              f"{rows[-1]['flops_to_target']}", flush=True)
    curves = pd.concat(frames, ignore_index=True)
    cols = ["variant", "seed", "chunk"] + [c for c in METRICS if c in curves] + ["eval_ref_return"]
    sio.atomic_write_text(out / "curves.csv", curves[cols].to_csv(index=False))
    keys = list(METRICS)
    mean = curves.groupby(["variant", "chunk"], sort=False)[keys].mean().reset_index()
    sd = curves.groupby(["variant", "chunk"], sort=False)[keys].std(ddof=1).fillna(0.0).reset_index()
    plot(mean, sd, ref_reward, out / "flow_grpo.png")
    text = (f"Pretrained reference: eval reward {ref_reward:.3f} (ODE, T_eval={args.t_eval}); "
            f"{args.seeds} seeds, {args.updates} updates of B={base.batch_size} (G={base.group_size}); "
            f"target {args.target}; N={rows[0]['param_count']:,}; {jax.devices()[0].platform}.\n\n"
            + table(rows))
    sio.atomic_write_text(out / "table.md", text)
    sio.atomic_write_json(out / "summary.json", {"args": vars(args), "reference_eval_return": ref_reward,
                                                 "variants": rows})
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
