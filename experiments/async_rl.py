"""Sync GRPO vs AReaL (η sweep) vs PipelineRL vs TBA on the tiny tasks, from one SFT start.

    python experiments/async_rl.py --out runs/async_rl [--task addition|countdown] [--steps 40]
        [--etas 1,2,4,8] [--variants sync,areal,pipeline,tba] [--seeds 1]

One SFT warm start (`<out>/base`) is shared by every variant; each variant is a GRPO run with
`init_from` that start and its own rollout source / objective:
    sync      rollout=sync      objective=grpo
    areal_η   rollout=async     objective=decoupled_ppo  max_staleness=η   (one row per η)
    pipeline  rollout=pipeline  objective=tis            max_staleness=2
    tba       rollout=tba       objective=vargrad        searchers=2
Writes `<out>/results.parquet` (every step of every run: variant, eta, seed, step, wall_s,
samples, reward, eval accuracy, staleness_mean/max, mixed_version_frac, ...), `<out>/table.md`
(final accuracy, completions/s, measured staleness) and `<out>/async_rl.png` (accuracy vs
wall-clock and vs samples). `eta` is a column, so the table can be fitted like σ. On this 2-core
CPU generation and training share the cores: the wall-clock numbers measure what overlap buys
here, not on a GPU (see benchmarks/gpu/run.sh).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = {
    "sync": dict(rollout="sync", objective="grpo"),
    "areal": dict(rollout="async", objective="decoupled_ppo"),
    "pipeline": dict(rollout="pipeline", objective="tis", max_staleness=2),
    "tba": dict(rollout="tba", objective="vargrad", searchers=2),
}


def base_config(task: str, steps: int, seed: int) -> dict:
    return dict(task=task, seed=seed, steps=steps, prompts_per_step=16, group_size=8, lr=2e-4,
                eval_problems=100, eval_samples=8, eval_every=max(steps // 4, 1),
                checkpoint_every=max(steps, 1))


def sft_start(out: Path, task: str, seed: int, extra: dict | None = None) -> Path:
    """The shared warm start: SFT until 30% greedy train accuracy (room for RL to improve),
    saved under <out>/base. `extra`: config overrides (model size, device, bf16)."""
    from scaling_rl.llm.trainer import run
    run(dict(base_config(task, 0, seed), sft_steps=600, sft_target_accuracy=0.3, **(extra or {})),
        out / "base")
    return out / "base" / "base_model"


def run_variant(name: str, eta: int | None, out: Path, base: Path, task: str, steps: int,
                seed: int, extra: dict | None = None):
    """One GRPO run from `base`; returns its metrics with variant, eta, wall_s, samples columns."""
    from scaling_rl.llm.trainer import run
    cfg = dict(base_config(task, steps, seed), init_from=str(base), sft_steps=0, **VARIANTS[name])
    cfg.update({k: v for k, v in (extra or {}).items()
                if k not in ("hidden_size", "num_layers", "num_heads")})  # the model is `base`'s
    if eta is not None:
        cfg["max_staleness"] = eta
    label = f"{name}_{eta}" if eta is not None else name
    t0 = time.perf_counter()
    df = run(cfg, out / f"{label}_s{seed}")
    df = df.assign(variant=label, eta=cfg.get("max_staleness", 0) if name != "sync" else 0,
                   seed=seed, run_wall_s=time.perf_counter() - t0)
    return add_clocks(df)


def add_clocks(df):
    """wall_s: GRPO steps' time so far without the one-off worker start-up (`startup_s`: the first
    step's wait for its groups less the worker's time generating them, which sync pays too, so
    no mode gets its first step's generation for free); samples: new completions trained on."""
    df = df.copy()
    wait = df["source/wait_s"] if "source/wait_s" in df else df["step_s"] * 0
    startup = float(wait[df["step"] == 1].fillna(0).sum())
    if "source/worker_gen_s" in df:  # cumulative; at step 1: the first groups' generation
        startup -= min(startup, float(df.loc[df["step"] == 1, "source/worker_gen_s"].fillna(0).sum()))
    df["startup_s"] = startup
    df["wall_s"] = df["step_s"].fillna(0).cumsum() - startup * (df["step"] >= 1)
    # `rollouts` counts generated completions (async: also groups received ahead of their step),
    # `trained_on` those in updates (TBA: replays too); the smaller is new completions trained on
    used = df[["rollouts", "trained_on"]].min(axis=1) if "trained_on" in df else df["rollouts"]
    df["samples"] = used.fillna(0)
    return df


def _range(values, fmt: str) -> str:
    return f"[{format(values.min(), fmt)}, {format(values.max(), fmt)}]"


def summarise(df):
    """One row per variant: final accuracy, completions/s, staleness."""
    import pandas as pd
    rows = []
    for label, g in df.groupby("variant", sort=False):
        last = g[g["step"] == g["step"].max()]
        start = g[g["step"] == 0]
        # per seed (each its own SFT start and run): the spread columns are [min, max] over seeds
        end = g[g["step"] == g.groupby("seed")["step"].transform("max")].set_index("seed")
        rate = end["samples"] / g.groupby("seed")["wall_s"].max()
        rows.append({
            "variant": label, "eta": int(g["eta"].iloc[0]), "seeds": int(g["seed"].nunique()),
            "pass@1 start": float(start["eval/pass@1"].mean()),
            "pass@1 end": float(last["eval/pass@1"].mean()),
            # seeds start from their own SFT base (different pass@1): the spread is of the gain
            "pass@1 gain [min, max]": _range(end["eval/pass@1"] - start.set_index("seed")["eval/pass@1"], "+.3f"),
            "greedy end": float(last["eval/accuracy"].mean()),
            "wall s": float(g.groupby("seed")["wall_s"].max().mean()),
            "worker start s": float(g["startup_s"].mean()),
            "completions/s": float(last["samples"].mean() / g.groupby("seed")["wall_s"].max().mean()),
            "completions/s [min, max]": _range(rate, ".0f"),
            "staleness mean": float(g["staleness_mean"].mean()),
            "staleness max": float(g["staleness_max"].max()),
            "mixed-version completions": float(g.get("mixed_version_frac", pd.Series([0.0])).mean()),
        })
    return pd.DataFrame(rows)


def markdown(table) -> str:
    """A pipe table (pandas' to_markdown needs `tabulate`, which is not a dependency)."""
    cells = [[f"{v:.3f}" if isinstance(v, float) else str(v) for v in row]
             for row in table.itertuples(index=False)]
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in cells]) + "\n"


def plot(df, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from scaling_rl import io as sio
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for label, g in df.groupby("variant", sort=False):
        g = g.dropna(subset=["eval/pass@1"]).groupby("step").mean(numeric_only=True)
        axes[0].plot(g["wall_s"], g["eval/pass@1"], marker="o", label=label)
        axes[1].plot(g["samples"], g["eval/pass@1"], marker="o", label=label)
    axes[0].set_xlabel("wall-clock of the GRPO steps (s)")
    axes[1].set_xlabel("completions sampled")
    for ax in axes:
        ax.set_ylabel("held-out sampled pass@1")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    sio.atomic_savefig(fig, path)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/async_rl")
    p.add_argument("--task", default="addition")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--etas", default="1,2,4,8")
    p.add_argument("--variants", default="sync,areal,pipeline,tba")
    p.add_argument("--seeds", type=int, default=1)
    args = p.parse_args(argv)
    import pandas as pd
    import torch

    from scaling_rl import io as sio
    torch.set_num_threads(1)
    out = Path(args.out)
    frames = []
    for seed in range(args.seeds):
        base = sft_start(out / f"seed{seed}", args.task, seed)
        for name in args.variants.split(","):
            if name not in VARIANTS:
                p.error(f"--variants: {name!r} is unknown; use {', '.join(VARIANTS)}")
            etas = [int(e) for e in args.etas.split(",")] if name == "areal" else [None]
            for eta in etas:
                df = run_variant(name, eta, out / f"seed{seed}", base, args.task, args.steps, seed)
                frames.append(df)
                print(summarise(df).to_string(index=False, header=not frames[:-1]), flush=True)
    df = pd.concat(frames, ignore_index=True)
    sio.atomic_write_parquet(out / "results.parquet", df)
    table = summarise(df)
    (out / "table.md").write_text(markdown(table))
    plot(df, out / "async_rl.png")
    print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
