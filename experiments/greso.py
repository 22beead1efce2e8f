"""Rollouts needed to reach a given accuracy, with and without GRESO selective rollouts.

    python experiments/greso.py [--out runs/greso] [--steps 100] [--target 0.0]

GRESO (Zheng et al. 2025, "Act Only When It Pays") skips, before rollout, prompts whose recent
groups all had zero reward variance. It is compared, as in the paper, on top of DAPO dynamic
sampling (zero-variance groups are dropped and more prompts drawn until the batch is full): both
runs start from the same SFT base, use the same seed, pool (small, so prompts recur every few
steps) and budget of effective prompts per step. Writes `curves.csv` (run, step, rollouts,
eval accuracy), `greso.png`, `summary.json` into --out. A few minutes on a 2-core CPU.

Accuracy is sampled pass@1 on 200 held-out problems (8 samples each, same random numbers for both
runs). The target defaults to 98% of the best accuracy the baseline reaches (3-eval trailing mean);
"rollouts to target" is the cumulative number of sampled completions when a run first reaches it.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pandas as pd  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scaling_rl import io as sio  # noqa: E402
from scaling_rl.llm.trainer import policy_path, run  # noqa: E402


def smoothed(curve: pd.DataFrame) -> pd.Series:
    """Trailing mean over 3 evaluations: single evals wobble by about ±0.015 here."""
    return curve["eval/pass@1"].rolling(3, min_periods=1).mean()


def rollouts_to(curve: pd.DataFrame, target: float):
    hit = curve[smoothed(curve).to_numpy() >= target]
    return int(hit["rollouts"].iloc[0]) if len(hit) else None


def plot(curves: pd.DataFrame, target: float, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, c in curves.groupby("run"):
        ax.plot(c["rollouts"], c["eval/pass@1"], "o-", ms=3, label=name)
    ax.axhline(target, color="grey", ls="--", lw=1, label=f"target {target:.3f}")
    ax.set_xlabel("rollouts (sampled completions)")
    ax.set_ylabel("held-out pass@1 (8 samples / problem)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    sio.atomic_savefig(fig, path, fmt="png", dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/greso")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--target", type=float, default=0.0, help="accuracy target (0: automatic)")
    p.add_argument("--pool", type=int, default=128, help="training prompts (one epoch)")
    p.add_argument("--sft-target-accuracy", type=float, default=0.85,
                   help="a strong base makes many groups all-correct, GRESO's regime")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    out = Path(args.out)
    t0 = time.time()
    base = dict(task="addition", digits=2, seed=args.seed, sft_steps=800,
                sft_target_accuracy=args.sft_target_accuracy, steps=0, eval_problems=200)
    run(base, out / "base")
    common = dict(init_from=str(policy_path(out / "base", "base")), sft_steps=0, task="addition",
                  digits=2, seed=args.seed, steps=args.steps, lr=1e-4, prompts_per_step=16,
                  group_size=8, loss_type="dapo", train_pool=args.pool, dynamic_sampling=True,
                  max_sampling_rounds=4, eval_every=5, checkpoint_every=args.steps,
                  eval_problems=200, eval_samples=8)
    frames = []
    for name, extra in (("dynamic_sampling", {}), ("greso", {"selective_rollouts": True})):
        df = run({**common, **extra}, out / name)
        df.loc[0, "rollouts"] = 0
        df["run"] = name
        frames.append(df)
    curves = pd.concat(frames, ignore_index=True)
    evals = curves.dropna(subset=["eval/pass@1"])[["run", "step", "rollouts", "eval/pass@1",
                                                     "rollouts_saved"]]
    sio.atomic_write_text(out / "curves.csv", evals.to_csv(index=False))
    baseline = evals[evals.run == "dynamic_sampling"]
    greso = evals[evals.run == "greso"]
    target = args.target or 0.98 * float(smoothed(baseline).max())
    need = {name: rollouts_to(c, target) for name, c in (("dynamic_sampling", baseline),
                                                        ("greso", greso))}
    last = {name: c.iloc[-1] for name, c in (("dynamic_sampling", baseline), ("greso", greso))}
    summary = {
        "target_accuracy": target,
        "base_accuracy": float(baseline["eval/pass@1"].iloc[0]),
        "rollouts_to_target": need,
        "rollout_saving_to_target": (1 - need["greso"] / need["dynamic_sampling"])
        if need["greso"] and need["dynamic_sampling"] else None,
        "total_rollouts": {k: int(v["rollouts"]) for k, v in last.items()},
        "greso_rollouts_skipped": int(last["greso"]["rollouts_saved"]),
        "final_accuracy": {k: float(v["eval/pass@1"]) for k, v in last.items()},
        "final_accuracy_smoothed": {"dynamic_sampling": float(smoothed(baseline).iloc[-1]),
                                    "greso": float(smoothed(greso).iloc[-1])},
        "total_rollout_saving": float(1 - last["greso"]["rollouts"]
                                      / last["dynamic_sampling"]["rollouts"]),
        "baseline_zero_variance_share": float(
            curves[(curves.run == "dynamic_sampling") & (curves.step > 0)]["frac_reward_zero_std"].mean()),
        "steps": args.steps, "minutes": (time.time() - t0) / 60,
    }
    sio.atomic_write_json(out / "summary.json", summary)
    plot(evals, target, out / "greso.png")
    print(evals.to_string(index=False))
    print({k: v for k, v in summary.items() if k != "minutes"})
    print(f"wrote {out}/curves.csv, greso.png, summary.json in {summary['minutes']:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
