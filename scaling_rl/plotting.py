"""Learning-curve figure of one training run, from its tidy metrics table."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd

from scaling_rl.io import atomic_savefig

RETURN_COLUMNS = (("episode_return", "train episodes", "tab:blue"),
                  ("eval_return", "eval (deterministic)", "tab:orange"))


def seed_band(df: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per env-step mean, std and count over seeds of `column`, NaNs (no data) dropped."""
    sub = df[["env_steps", column]].dropna()
    out = sub.groupby("env_steps")[column].agg(["mean", "std", "count"]).reset_index()
    out["std"] = out["std"].fillna(0.0)
    return out


def plot_learning_curve(df: pd.DataFrame, path: str | os.PathLike, *, title: str = "") -> None:
    """Write a PNG: return vs env steps (mean ± 1 std over seeds) and, where logged, the
    losses on a log scale beside it. Written atomically."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    loss_cols = [c for c in df.columns if c.startswith("loss/")]
    ncols = 2 if loss_cols else 1
    fig, axes = plt.subplots(1, ncols, figsize=(6.0 * ncols, 4.2), squeeze=False)
    ax = axes[0, 0]
    seeds = df["seed"].nunique() if "seed" in df else 1
    plotted = False
    for column, label, color in RETURN_COLUMNS:
        if column not in df:
            continue
        band = seed_band(df, column)
        if band.empty:
            continue
        x, m, s = band["env_steps"].to_numpy(), band["mean"].to_numpy(), band["std"].to_numpy()
        ax.plot(x, m, color=color, lw=2, marker="o" if len(x) < 30 else None, ms=3,
                label=f"{label} (mean ± std, {seeds} seed{'s' * (seeds != 1)})")
        if seeds > 1:
            ax.fill_between(x, m - s, m + s, color=color, alpha=0.2, lw=0)
        plotted = True
    if not plotted:
        ax.text(0.5, 0.5, "no finished episodes yet", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_xlabel("environment steps (per seed)")
    ax.set_ylabel("return")
    ax.set_title("return")
    ax.grid(alpha=0.3)
    if plotted:
        ax.legend(loc="best", fontsize=8)
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 2k, 10k, 1M

    if loss_cols:
        ax = axes[0, 1]
        for column in loss_cols:
            band = seed_band(df, column)
            m = band["mean"].to_numpy()
            if band.empty or not np.all(np.isfinite(m)):
                continue
            positive = bool(np.all(m > 0))
            ax.plot(band["env_steps"], m if positive else np.abs(m), lw=1.5,
                    label=column if positive else f"|{column}|")
        ax.set_yscale("log")
        ax.set_xlabel("environment steps (per seed)")
        ax.set_title("losses (seed mean)")
        ax.grid(alpha=0.3, which="both")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8)
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 2k, 10k, 1M

    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    atomic_savefig(fig, path, fmt="png", dpi=110)
    plt.close(fig)
