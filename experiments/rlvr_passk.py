"""Micro RLVR study: pass@k of an SFT base model vs the same model after GRPO (Yue et al. 2025).

    python experiments/rlvr_passk.py [--out runs/rlvr_passk] [--steps 150] [--n 256] [--problems 100]

Yue et al. ("Does RL really incentivize reasoning capacity beyond the base model?") find that
RL-trained models win at small k while the base model catches up, or overtakes, at large k. Here:
a tiny Qwen2 is SFT-warm-started on 2-digit addition (stopped at a chosen greedy accuracy), then
trained with GRPO; both are sampled n times (temperature 1) on held-out problems and the unbiased
pass@k is computed for k = 1, 2, 4, ..., n. Writes `passk.csv` (k, base, rl), `passk.png`,
`summary.json` into --out; prints the table. Runs in a few minutes on a 2-core CPU.
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
from scaling_rl.llm.passk import pass_at_k_curve, powers_of_two  # noqa: E402
from scaling_rl.llm.trainer import policy_path, run  # noqa: E402


def sample_counts(model_dir, problems, task, n, seed, max_len):
    import torch

    from scaling_rl.llm.models import load_policy
    from scaling_rl.llm.rollout import correct_counts
    torch.set_num_threads(1)
    model, tok = load_policy(str(model_dir))
    return correct_counts(model, tok, task, problems, n=n, max_new_tokens=max_len, seed=seed)


def plot(df: pd.DataFrame, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(df["k"], df["base"], "o-", label="SFT base")
    ax.plot(df["k"], df["rl"], "s-", label="GRPO")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    sio.atomic_savefig(fig, path, fmt="png", dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/rlvr_passk")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--sft-target-accuracy", type=float, default=0.6)
    p.add_argument("--n", type=int, default=256, help="samples per problem (max k)")
    p.add_argument("--problems", type=int, default=100, help="held-out problems")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    out = Path(args.out)
    t0 = time.time()
    cfg = dict(task="addition", digits=2, seed=args.seed, sft_steps=600,
               sft_target_accuracy=args.sft_target_accuracy, steps=args.steps, lr=args.lr,
               prompts_per_step=16, group_size=8, loss_type="grpo", eval_every=25,
               checkpoint_every=50, eval_problems=200)
    metrics = run(cfg, out / "run", progress=False)
    t_train = time.time() - t0

    from scaling_rl.llm.tasks import AdditionTask
    task = AdditionTask(2)
    problems = task.problems("test", args.problems, seed=2025)
    ks = powers_of_two(args.n)
    counts = {}
    for name, which in (("base", "base"), ("rl", "final")):
        counts[name] = sample_counts(policy_path(out / "run", which), problems, task, args.n,
                                     seed=args.seed + 11, max_len=task.max_answer_chars() + 1)
    curves = {name: pass_at_k_curve(c, args.n, ks) for name, c in counts.items()}
    df = pd.DataFrame({"k": ks, "base": [curves["base"][k] for k in ks],
                       "rl": [curves["rl"][k] for k in ks]})
    df["rl_minus_base"] = df["rl"] - df["base"]
    sio.atomic_write_text(out / "passk.csv", df.to_csv(index=False))
    crossover = next((int(k) for k, d in zip(df["k"], df["rl_minus_base"]) if d <= 0), None)
    summary = {
        "problems": len(problems), "n": args.n, "grpo_steps": args.steps,
        "base_greedy_accuracy": float(metrics["eval/accuracy"].iloc[0]),
        "rl_greedy_accuracy": float(metrics["eval/accuracy"].dropna().iloc[-1]),
        "pass@1": {"base": curves["base"][1], "rl": curves["rl"][1]},
        f"pass@{args.n}": {"base": curves["base"][args.n], "rl": curves["rl"][args.n]},
        "first_k_where_base_catches_up": crossover,
        "problems_solved_at_n": {name: int((c > 0).sum()) for name, c in counts.items()},
        "problems_solved_only_by": {
            "base": int(((counts["base"] > 0) & (counts["rl"] == 0)).sum()),
            "rl": int(((counts["rl"] > 0) & (counts["base"] == 0)).sum())},
        "minutes": (time.time() - t0) / 60, "train_minutes": t_train / 60,
    }
    sio.atomic_write_json(out / "summary.json", summary)
    plot(df, out / "passk.png", f"2-digit addition, tiny Qwen2, {len(problems)} held-out problems, "
                                f"n={args.n}")
    with pd.option_context("display.float_format", "{:.4f}".format):
        print(df.to_string(index=False))
    print({k: v for k, v in summary.items() if k not in ("minutes", "train_minutes")})
    print(f"wrote {out}/passk.csv, passk.png, summary.json in {summary['minutes']:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
