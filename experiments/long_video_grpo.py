"""GRPO on the long-video counting task at two or three lengths: greedy accuracy vs steps.

    python experiments/long_video_grpo.py                          # frames 64 and 256 (~8 min)
    python experiments/long_video_grpo.py --frames 256 1024 --frames-per-token 4 --steps 30

Each length is one `multimodal=video` GRPO run (scaling_rl.llm.video_grpo) with the same budget:
a short SFT warm start (encoder + LM), then GRPO with the encoder frozen and the embedding cache
on. Frames are encoded `--frames-per-token` at a time (4: 1024 frames are 256 frame tokens). The
table is held-out greedy accuracy (`--eval-problems` problems; chance is 1 / video_events) by
step, with a binomial standard error, and the sampled training reward of the last steps; the run
directories hold the full metrics. One seed per length: a difference between lengths smaller
than about two standard errors is not identified.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from scaling_rl.llm.grpo_run import run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--frames-per-token", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--sft-steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--eval-problems", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/long_video_grpo")
    a = ap.parse_args(argv)
    if any(f % a.frames_per_token for f in a.frames):
        print(f"long_video_grpo: every --frames must be divisible by --frames-per-token={a.frames_per_token}",
              file=sys.stderr)
        return 2
    tables = {}
    for n in a.frames:
        cfg = dict(multimodal="video", frames=n, frames_per_token=a.frames_per_token, steps=a.steps,
                   sft_steps=a.sft_steps, sft_batch_size=32, sft_lr=3e-3, lr=3e-4,
                   prompts_per_step=8, group_size=8, eval_every=a.eval_every,
                   checkpoint_every=a.steps, eval_problems=a.eval_problems, seed=a.seed)
        df = run(cfg, Path(a.out) / f"frames_{n}")
        tables[n] = df
        print(f"frames {n}: done ({len(df) - 1} steps)", flush=True)
    print(f"\nheld-out greedy accuracy (± binomial SE, {a.eval_problems} problems; chance 0.25) by GRPO step:")
    steps = sorted(set.intersection(*[set(df.loc[df["eval/accuracy"].notna(), "step"]) for df in tables.values()]))
    print("step  " + "  ".join(f"{f'{n} frames':>16}" for n in a.frames))
    for s in steps:
        cells = []
        for n in a.frames:
            acc = float(tables[n].set_index("step").loc[s, "eval/accuracy"])
            se = math.sqrt(acc * (1 - acc) / a.eval_problems)
            cells.append(f"{acc:.2f} ± {se:.2f}".rjust(16))
        print(f"{s:4d}  " + "  ".join(cells))
    last = max(1, a.steps // 4)
    print(f"\nsampled training reward (T=1), mean of the first / last {last} steps:")
    for n, df in tables.items():
        r = df.loc[df["step"] > 0, "reward"]
        print(f"  {n:5d} frames: {r.iloc[:last].mean():.3f} -> {r.iloc[-last:].mean():.3f}   "
              f"encoder FLOPs saved by the cache / spent: "
              f"{df['encoder_flops_saved'].iloc[-1] / df['encoder_flops'].iloc[-1]:.1f}x")
    summary = pd.concat([df.assign(frames=n) for n, df in tables.items()])
    out = Path(a.out) / "summary.csv"
    tmp = out.with_suffix(".tmp")
    summary.to_csv(tmp, index=False)
    tmp.replace(out)
    print(f"\nmetrics of every run: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
