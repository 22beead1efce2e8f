"""SamS vs uniform vs small-loss DPO batch scheduling at equal compute, side by side in one run.

    python benchmarks/sams_compute.py [--out runs/sams_compute] [--seeds 3] [--uniform-steps 60]
                                      [--noise 0,0.2,0.4] [--result benchmarks/results/sams.txt]

Micro setting (as experiments/dpo_scheduling.py): a tiny Qwen2 (hidden 32, 2 layers, char
tokenizer) warm-started by 300 SFT steps on 2-digit addition (one SFT per seed, shared by every
arm), then DPO on correct vs one-digit-wrong answers with a known fraction of flipped labels,
batch 32, β 0.1, lr 1e-3. Arms, per noise level and seed:

    uniform        --uniform-steps steps of 32 uniformly drawn pairs
    small_loss     32 of 64 candidates (smallest current loss), steps = equal compute
    sams           32 of 64 candidates (SamS, reference definition), steps = equal compute
    sams@steps     SamS with as many steps as uniform (1.75x its compute): what selection buys
                   when scoring is free

Compute (`dpo.step_cost`, in trained-pair equivalents): a uniform step of B pairs costs B, a
scoring step (2·64 + 3·32)/4 = 56 for B = 32 -- every candidate's policy + reference forward is
charged and the trained pairs reuse their reference log-probs -- so equal compute gives the
scoring schedulers round(60·32/56) = 34 steps. Reported per arm (final held-out values after the
arm's steps): preference accuracy (clean held-out pairs, margin > 0) and greedy task accuracy, mean
[95% t-interval over seeds] and the paired difference to uniform (same seed, same SFT start);
flipped fraction among trained pairs; wall-time shares of a step (median over steps > 2, after the
one-off compiles): candidate forwards (score_s) and the scheduler itself (sched_s: SamS's networks,
their fits included); SamS diagnostics: the share of the bandit's reward variance that is the
batch-level term all arms of a step share, the median largest/smallest selection-probability
ratio within a candidate batch, and corr(f1, per-arm reward term) on the last candidate batch.
The paper's claims (arXiv 2506.17252): better quality at small overhead, robustness to label noise.
A table is printed and written to --result; it shows what it shows.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scaling_rl import io as sio  # noqa: E402
from scaling_rl.llm import dpo, sams  # noqa: E402

ARMS = ("uniform", "small_loss", "sams", "sams@steps")


def interval(v) -> tuple[float, float]:
    """(mean, half-width of the 95% t-interval over seeds; nan when n < 2)."""
    from scipy import stats
    v = np.asarray(v, float)
    if len(v) < 2:
        return float(v.mean()), float("nan")
    return float(v.mean()), float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))


def run_arm(cfg: dpo.DPOConfig) -> tuple[pd.DataFrame, dict]:
    """Train one arm in memory; its rows and (SamS) scheduler diagnostics."""
    import torch
    torch.manual_seed(cfg.seed)
    tr = dpo.DPOTrainer(cfg)
    tr.setup()
    df = pd.DataFrame(tr.fit())
    diag = {}
    s = tr.scheduler
    if isinstance(s, sams.SamS):
        x, _, m, pc, _ = s.pending
        _, f1, _ = s.scores(x)
        diag = {"batch_share": s.reward_batch_share(),
                "prob_ratio": float(np.median([r["prob_ratio"] for r in s.stats[1:]])),
                "f1_corr": float(np.corrcoef(f1, sams.sample_terms(m, pc))[0, 1])}
    return df, diag


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/sams_compute")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--uniform-steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--candidates", type=int, default=2)
    ap.add_argument("--sft-steps", type=int, default=300)
    ap.add_argument("--noise", default="0,0.2,0.4")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--result", default="")
    args = ap.parse_args(argv)
    try:
        noises = [float(x) for x in args.noise.split(",")]
        arms = [a for a in args.arms.split(",") if a]
        bad = [a for a in arms if a not in ARMS]
        if bad:
            raise ValueError(f"arms: {bad[0]!r} is unknown; use some of {ARMS}")
        for n in noises:
            dpo.DPOConfig(noise=n)
    except ValueError as e:
        print(f"sams_compute: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    import torch
    torch.set_num_threads(1)
    out = Path(args.out)
    common = dict(hidden_size=32, num_layers=2, num_heads=4, train_pairs=2048, eval_pairs=256,
                  eval_problems=200, batch_size=args.batch, candidates=args.candidates, beta=0.1,
                  lr=1e-3, sft_steps=0)
    uni = dpo.DPOConfig(**common, scheduler="uniform", steps=args.uniform_steps)
    budget = args.uniform_steps * dpo.step_cost(uni)
    rows, t_start = [], time.time()
    for seed in range(args.seeds):
        base_dir = out / f"sft_seed{seed}"
        model = {k: common[k] for k in ("hidden_size", "num_layers", "num_heads", "eval_pairs",
                                         "eval_problems")}
        dpo.run({**model, "steps": 0, "sft_steps": args.sft_steps, "seed": seed}, base_dir)
        for noise in noises:
            for arm in arms:
                sched = arm.split("@")[0]
                cfg = dpo.DPOConfig(**common, scheduler=sched, seed=seed, noise=noise,
                                    init_from=str(base_dir / "base_model"), steps=1)
                steps = (args.uniform_steps if sched == "uniform" or arm.endswith("@steps")
                         else dpo.steps_for_compute(cfg, budget))
                cfg = dataclasses.replace(cfg, steps=steps, eval_every=steps)
                df, diag = run_arm(cfg)
                last = df.iloc[-1]
                warm = df[df["step"] > 2]
                rows.append({"noise": noise, "arm": arm, "seed": seed, "steps": steps,
                             "compute": float(last["compute_pairs"]) / budget,
                             "pref_acc": float(last["eval/pref_accuracy"]),
                             "task_acc": float(last["eval/accuracy"]),
                             "start_pref_acc": float(df.iloc[0]["eval/pref_accuracy"]),
                             "flipped": float(df["selected_flipped"].dropna().mean()),
                             "score_share": float(warm["score_s"].median() / warm["step_s"].median()),
                             "sched_share": float(warm["sched_s"].median() / warm["step_s"].median()),
                             "step_s": float(warm["step_s"].median()), **diag})
                r = rows[-1]
                print(f"seed {seed} noise {noise:.1f} {arm:11s} steps {steps:3d} pref acc "
                      f"{r['pref_acc']:.3f} task acc {r['task_acc']:.3f} flipped {r['flipped']:.3f}"
                      f"  ({time.time() - t_start:.0f} s)", flush=True)
    table = pd.DataFrame(rows)
    sio.atomic_write_text(out / "arms.csv", table.to_csv(index=False))
    lines = [f"SamS vs uniform vs small-loss at equal compute (benchmarks/sams_compute.py; "
             f"{args.seeds} seeds, uniform {args.uniform_steps} steps x {args.batch} pairs, "
             f"candidates {args.batch * args.candidates}, compute in trained-pair equivalents)",
             "final held-out values: mean ± 95% t half-width over seeds; d(uniform): paired "
             "difference to uniform (same seed and SFT start)", ""]
    head = (f"{'noise':>5} {'arm':11s} {'steps':>5} {'compute':>7} {'pref acc':>15} "
            f"{'d(uniform)':>16} {'task acc':>15} {'flipped':>7} {'score %':>7} {'sched %':>7} "
            f"{'batch var %':>11} {'p max/min':>9} {'corr f1':>7}")
    lines.append(head)
    for noise in noises:
        sub = table[table["noise"] == noise]
        ref = sub[sub["arm"] == "uniform"].set_index("seed")
        for arm in arms:
            a = sub[sub["arm"] == arm].set_index("seed")
            pa, ta = interval(a["pref_acc"]), interval(a["task_acc"])
            d = (interval((a["pref_acc"] - ref["pref_acc"]).dropna())
                 if len(ref) and arm != "uniform" else (float("nan"), float("nan")))
            diag = ("" if "batch_share" not in a or a["batch_share"].isna().all() else
                    f"{100 * a['batch_share'].mean():10.0f}% {a['prob_ratio'].median():9.2f} "
                    f"{a['f1_corr'].mean():7.2f}")
            lines.append(
                f"{noise:5.1f} {arm:11s} {int(a['steps'].iloc[0]):5d} {a['compute'].mean():7.2f} "
                f"{pa[0]:.3f} ± {pa[1]:.3f} {d[0]:+.3f} ± {d[1]:.3f}   {ta[0]:.3f} ± {ta[1]:.3f} "
                f"{a['flipped'].mean():7.3f} {100 * a['score_share'].mean():6.1f}% "
                f"{100 * a['sched_share'].mean():6.1f}% {diag}")
    start = table.groupby("seed")["start_pref_acc"].first().mean()
    lines += ["", f"start (SFT) preference accuracy {start:.3f}; score % / sched %: median share of "
              "step wall time in the candidate forwards / the scheduler itself; batch var %: share "
              "of SamS's reward variance that is the per-step batch term; p max/min: median ratio "
              "of the largest to the smallest selection probability in a candidate batch (T = 1); "
              "corr f1: corr(f1, per-arm reward term) on the last candidate batch",
              f"wall time {time.time() - t_start:.0f} s"]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if args.result:
        sio.atomic_write_text(args.result, text)
        print(f"wrote {args.result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
