"""Figures from a fit.json dict alone (so `scaling-rl plot` can redraw them): PNG + PDF, log axes,
legends, intervals drawn."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from ..io import atomic_savefig  # noqa: E402
from . import allocation as alloc  # noqa: E402

TASK_COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
STYLE = {"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 8,
         "axes.grid": True, "grid.alpha": 0.3, "grid.linewidth": 0.5}


def _tidy_log_axes(fig) -> None:
    """No labels on minor log ticks (they collide); on axes spanning under two decades, label 1-2-5
    multiples in plain notation instead."""
    fmt = FuncFormatter(lambda v, _: f"{v:.3g}")
    for ax in fig.axes:
        for axis, lim in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            if axis.get_scale() != "log":
                continue
            axis.set_minor_formatter(NullFormatter())
            axis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))  # fewer tick artists: faster draws
            lo, hi = sorted(lim)
            if lo > 0 and np.log10(hi / lo) < 2:
                axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
                axis.set_major_formatter(fmt)


def _save(fig, out_dir: Path, name: str) -> list[str]:
    _tidy_log_axes(fig)
    paths = []
    for ext in ("png", "pdf"):
        path = out_dir / f"{name}.{ext}"
        atomic_savefig(fig, path, fmt=ext, dpi=150, bbox_inches="tight")
        paths.append(str(path))
    plt.close(fig)
    return paths


def _j_colors(n: int):
    cmap = plt.get_cmap("viridis")
    return [cmap(0.1 + 0.8 * i / max(n - 1, 1)) for i in range(n)]


def _num(v) -> float:
    return float("nan") if v is None else float(v)


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def _pick(levels: list[float], k: int = 4) -> list[float]:
    if len(levels) <= k:
        return levels
    idx = np.unique(np.round(np.linspace(0, len(levels) - 1, k)).astype(int))
    return [levels[i] for i in idx]


def _yerr(est, lo, hi):
    est, lo, hi = (np.array([_num(v) for v in a]) for a in (est, lo, hi))
    lo = np.where(np.isfinite(lo), lo, est)
    hi = np.where(np.isfinite(hi), hi, est)
    return np.vstack([np.maximum(est - lo, 0), np.maximum(hi - est, 0)])


def plot_data_efficiency_sigma(fit: dict, out_dir: Path) -> list[str]:
    """D_J vs σ: one panel per (task, model size), one colour per threshold, fit with its band."""
    tasks = fit["tasks"]
    n_levels = _pick(fit["levels"]["param_count"]) or [None]
    nJ = len(next(iter(fit["thresholds"].values())))
    colors = _j_colors(nJ)
    fig, axes = plt.subplots(len(tasks), len(n_levels), figsize=(3.6 * len(n_levels) + 0.6, 3.1 * len(tasks)),
                             squeeze=False, sharey="row")
    for r, task in enumerate(tasks):
        for c, N in enumerate(n_levels):
            ax = axes[r, c]
            for j in range(nJ):
                pts = [p for p in fit["points"] if p["task"] == task and p["j_index"] == j
                       and (N is None or _num(p["param_count"]) == N)]
                ok = [p for p in pts if not p["censored"]]
                if ok:
                    x = np.array([p["utd"] for p in ok])
                    y = np.array([p["D"] for p in ok])
                    ax.errorbar(x, y, yerr=_yerr(y, [p["D_lo"] for p in ok], [p["D_hi"] for p in ok]), fmt="o",
                                ms=4, color=colors[j], capsize=2, lw=1, zorder=3)
                cens = [p for p in pts if p["censored"]]
                if cens:
                    ax.scatter([p["utd"] for p in cens], [p["last_step"] for p in cens], marker="^", s=40,
                               facecolors="none", edgecolors=colors[j], zorder=3)
                rec = next((f for f in fit["data_efficiency_sigma"] if f["task"] == task and f["j_index"] == j
                            and (N is None or _num(f["param_count"]) == N) and "band" in f), None)
                if rec:
                    b = rec["band"]
                    ax.plot(b["utd"], b["estimate"], color=colors[j], lw=1.5)
                    lo, hi = np.array([_num(v) for v in b["lo"]]), np.array([_num(v) for v in b["hi"]])
                    if np.isfinite(lo).any():
                        ax.fill_between(b["utd"], lo, hi, color=colors[j], alpha=0.18, lw=0)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"{task}" + ("" if N is None else f", N = {_fmt(N)}"))
            ax.set_xlabel("UTD ratio σ")
            if c == 0:
                ax.set_ylabel("env steps to reach J  (D_J)")
    thr = fit["thresholds"][tasks[0]]
    handles = [Line2D([], [], color=colors[j], marker="o", lw=1.5, label=f"J = {thr[j]:.2f}") for j in range(nJ)]
    handles += [Line2D([], [], color="grey", lw=6, alpha=0.3, label=f"{int(100 * fit['settings']['level'])}% band"),
                Line2D([], [], color="grey", marker="^", ls="", mfc="none", label="censored (≥ last step)")]
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False,
               title="threshold" + (f" ({tasks[0]})" if len(tasks) > 1 else ""))
    fig.suptitle("Data efficiency vs UTD: D_J(σ) = D_min + (β/σ)^α", y=1.0)
    fig.tight_layout()
    return _save(fig, out_dir, "data_efficiency_sigma")


def plot_hparams(fit: dict, out_dir: Path) -> list[str]:
    """B* and η* vs σ: uncertainty-corrected optima (points with intervals), shared-slope fits."""
    hp = fit["hparams"]
    panels = [(f, lab) for f, lab in (("batch_size", "batch size B*"), ("lr", "learning rate η*"))
              if "params" in (hp.get(f"{f}_sigma") or {})]
    if not panels:
        return []
    n_levels = fit["levels"]["param_count"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels) + 1.2, 3.6), squeeze=False)
    for ax, (field, label) in zip(axes[0], panels):
        rec = hp[f"{field}_sigma"]
        for ti, task in enumerate(fit["tasks"]):
            col = TASK_COLORS[ti % len(TASK_COLORS)]
            pts = [p for p in hp["points"] if p["field"] == field and p["task"] == task and p["estimate"]]
            for ni, N in enumerate(n_levels or [None]):
                sub = [p for p in pts if N is None or _num(p["param_count"]) == N]
                if not sub:
                    continue
                jitter = 1 + 0.03 * (ni - (len(n_levels) - 1) / 2) if n_levels else 1
                x = np.array([p["utd"] for p in sub]) * jitter
                y = np.array([p["estimate"] for p in sub])
                ax.errorbar(x, y, yerr=_yerr(y, [p["lo"] for p in sub], [p["hi"] for p in sub]),
                            fmt=MARKERS[ni % len(MARKERS)], color=col, ms=4, capsize=2, lw=0.8, alpha=0.85)
            band = rec["bands"].get(task)
            if band:
                ax.plot(band["utd"], band["estimate"], color=col, lw=1.6)
                lo, hi = np.array([_num(v) for v in band["lo"]]), np.array([_num(v) for v in band["hi"]])
                if np.isfinite(lo).any():
                    ax.fill_between(band["utd"], lo, hi, color=col, alpha=0.18, lw=0)
        s = rec["params"]["s"]
        ax.set_title(f"{label} ∝ σ^s,  s = {s['estimate']:.2f}" +
                     (f" [{s['lo']:.2f}, {s['hi']:.2f}]" if s.get("lo") is not None else ""))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("UTD ratio σ")
        ax.set_ylabel(label)
    handles = [Line2D([], [], color=TASK_COLORS[i % len(TASK_COLORS)], lw=1.6, label=t)
               for i, t in enumerate(fit["tasks"])]
    handles += [Line2D([], [], color="k", marker=MARKERS[i % len(MARKERS)], ls="", label=f"N = {_fmt(N)}")
                for i, N in enumerate(n_levels)]
    handles += [Line2D([], [], color="grey", lw=6, alpha=0.3, label=f"{int(100 * fit['settings']['level'])}% band")]
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.tight_layout()
    return _save(fig, out_dir, "hparams_sigma")


def _de_params(fit: dict, task: str, j: int) -> dict | None:
    rec = next((f for f in fit["data_efficiency_sigma_n"] if f["task"] == task and f["j_index"] == j
                and "params" in f), None)
    return None if rec is None else {k: v["estimate"] for k, v in rec["params"].items()}


def _allocation_setup(fit: dict):
    """(allocation section, its per-threshold rows, tasks that have rows, one colour per threshold)."""
    al = fit.get("allocation", {})
    rows = al.get("per_threshold", [])
    tasks = [t for t in fit["tasks"] if any(r["task"] == t for r in rows)]
    colors = _j_colors(len(next(iter(fit["thresholds"].values())))) if tasks else []
    return al, rows, tasks, colors


def plot_contours(fit: dict, out_dir: Path) -> list[str]:
    """Iso-D_J contours over (σ, N) for the hardest fitted threshold, the sweep grid, and the
    budget-optimal (σ*, N*) of every threshold with intervals (the compute-optimal path)."""
    al, rows, tasks, colors = _allocation_setup(fit)
    if not tasks:
        return []
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.0 * len(tasks) + 1.2, 4.2), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        trows = [r for r in rows if r["task"] == task]
        jt = trows[-1]["j_index"]
        p = _de_params(fit, task, jt)
        s_lv, n_lv = fit["levels"]["utd"], fit["levels"]["param_count"]
        xs = [*s_lv, *(r["sigma"] for r in trows)]
        ns = [*n_lv, *(r["N"] for r in trows)]
        sg = np.geomspace(min(xs) / 2, max(xs) * 2, 120)
        ng = np.geomspace(min(ns) / 3, max(ns) * 3, 120)
        S, Nn = np.meshgrid(sg, ng)
        D = np.exp(alloc.log_data(p, np.log(S), np.log(Nn))[0])
        levels = np.geomspace(D.min(), np.quantile(D, 0.95), 9)
        cf = ax.contourf(S, Nn, D, levels=levels, cmap="Blues_r", norm=matplotlib.colors.LogNorm(), extend="max",
                         alpha=0.85)
        cs = ax.contour(S, Nn, D, levels=levels[1:], colors="k", linewidths=0.5, alpha=0.6)
        ax.clabel(cs, fmt=lambda v: f"{v:.2g}", fontsize=7)
        cb = fig.colorbar(cf, ax=ax, pad=0.02, ticks=levels[::2], format=FuncFormatter(lambda v, _: f"{v:.2g}"))
        cb.ax.yaxis.set_minor_formatter(NullFormatter())
        cb.set_label("D_J (env steps)")
        G = np.array([(pt["utd"], pt["param_count"]) for pt in fit["points"]
                      if pt["task"] == task and pt["j_index"] == jt and pt["param_count"] is not None])
        ax.scatter(G[:, 0], G[:, 1], s=14, color="k", marker="x", lw=0.8, label="sweep (σ, N)", zorder=3)
        for r in trows:
            iv = r["intervals"]
            xe = _yerr([r["sigma"]], [iv["sigma"]["lo"]], [iv["sigma"]["hi"]])
            ye = _yerr([r["N"]], [iv["N"]["lo"]], [iv["N"]["hi"]])
            ax.errorbar([r["sigma"]], [r["N"]], xerr=xe, yerr=ye, fmt="*", ms=11, color=colors[r["j_index"]],
                        mec="k", mew=0.5, capsize=2, zorder=4)
        ax.plot([r["sigma"] for r in trows], [r["N"] for r in trows], color="C3", lw=1.2, ls="--", zorder=3,
                label="compute-optimal path")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("UTD ratio σ")
        ax.set_ylabel("critic parameters N")
        ax.set_title(f"{task}: iso-D_J contours (J = {trows[-1]['threshold']:.2f})")
        ax.legend(loc="lower left", framealpha=0.85)
    thr = fit["thresholds"][tasks[0]]
    handles = [Line2D([], [], color=colors[j], marker="*", ms=11, mec="k", mew=0.5, ls="",
                      label=f"optimum, J = {thr[j]:.2f}") for j in range(len(colors))]
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False,
               title=f"δ = {_fmt(al['delta'])} FLOPs/step")
    fig.tight_layout()
    return _save(fig, out_dir, "data_efficiency_contours")


def plot_pareto(fit: dict, out_dir: Path) -> list[str]:
    """Data–compute Pareto frontier per threshold (minimisers of C + δ·D over δ), sweep points, and
    the chosen δ's optimum."""
    al, rows, tasks, colors = _allocation_setup(fit)
    if not tasks:
        return []
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.8 * len(tasks) + 1.2, 4.0), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        bm = alloc.BatchModel.from_dict(al["batch_models"][task])
        for r in (r for r in rows if r["task"] == task):
            j = r["j_index"]
            p = r["params"]
            deltas = np.geomspace(al["delta"] / 1e3, al["delta"] * 1e3, 40)
            front = alloc.pareto_frontier(p, bm, deltas)
            ax.plot([f["C"] for f in front], [f["D"] for f in front], color=colors[j], lw=1.5)
            pts = [q for q in fit["points"] if q["task"] == task and q["j_index"] == j and not q["censored"]
                   and q["param_count"] is not None]
            C = [alloc.compute_flops(q["param_count"], q["best_batch_size"] or bm(q["utd"], q["param_count"]),
                                     q["utd"], q["D"]) for q in pts]
            ax.scatter(C, [q["D"] for q in pts], s=10, color=colors[j], alpha=0.5)
            ax.plot([r["C"]], [r["D"]], marker="*", ms=12, color=colors[j], mec="k", mew=0.5)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("compute C = 10·N·B·σ·D  (FLOPs)")
        ax.set_ylabel("data D_J  (env steps)")
        ax.set_title(f"{task}: data–compute frontier")
    thr = fit["thresholds"][tasks[0]]
    handles = [Line2D([], [], color=colors[j], lw=1.5, label=f"J = {thr[j]:.2f}") for j in range(len(colors))]
    handles += [Line2D([], [], color="grey", marker="o", ls="", alpha=0.5, label="sweep runs (best B, η)"),
                Line2D([], [], color="grey", marker="*", ms=11, mec="k", ls="", label=f"optimum at δ = {_fmt(al['delta'])}")]
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.tight_layout()
    return _save(fig, out_dir, "pareto_frontier")


def plot_budget_scaling(fit: dict, out_dir: Path) -> list[str]:
    """D*(F), C*(F) and σ*(F), N*(F) across thresholds with their power-law fits."""
    al = fit.get("allocation", {})
    laws_ = al.get("power_laws", [])
    rows = al.get("per_threshold", [])
    tasks = [t for t in fit["tasks"] if any(r["task"] == t for r in rows)]
    if not tasks:
        return []
    fig, axes = plt.subplots(len(tasks), 3, figsize=(13.5, 3.4 * len(tasks)), squeeze=False)
    panels = (("D", "C0", "o", "data D* (env steps)"), ("C", "C1", "s", "compute C* (FLOPs)"),
              ("sigma", "C2", "^", "UTD σ*"), ("N", "C4", "D", "parameters N*"))
    for r_i, task in enumerate(tasks):
        trows = [r for r in rows if r["task"] == task]
        F = np.array([r["F"] for r in trows])
        xerr = _yerr(F, [r["intervals"]["F"]["lo"] for r in trows], [r["intervals"]["F"]["hi"] for r in trows])
        twin = axes[r_i, 2].twinx()
        targets = [axes[r_i, 0], axes[r_i, 1], axes[r_i, 2], twin]
        handles = []
        for ax, (tg, col, mk, lab) in zip(targets, panels):
            y = np.array([r[tg] for r in trows])
            iv = [r["intervals"][tg] for r in trows]
            h = ax.errorbar(F, y, xerr=xerr, yerr=_yerr(y, [v["lo"] for v in iv], [v["hi"] for v in iv]), fmt=mk,
                            color=col, ms=5, capsize=2, lw=0.8, label=lab)
            law = next((p for p in laws_ if p["task"] == task and p["target"] == tg), None)
            fitlab = ""
            if law:
                A, s = law["params"]["A"]["estimate"], law["params"]["s"]["estimate"]
                s_iv = law["params"]["s"]
                fg = np.geomspace(F.min() / 1.5, F.max() * 1.5, 20)
                fitlab = f"∝ F^{s:.2f}" + (f" [{s_iv['lo']:.2f}, {s_iv['hi']:.2f}]" if s_iv.get("lo") is not None else "")
                (ln,) = ax.plot(fg, A * fg ** s, color=col, lw=1.2, ls="--", label=f"fit {fitlab}")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_ylabel(lab, color=col if ax in targets[2:] else "k")
            if ax in targets[2:]:
                handles += [h] + ([ln] if law else [])
            else:
                ax.legend(framealpha=0.85)
                ax.set_title(f"{task}: {lab.split(' (')[0]} at the optimum")
        axes[r_i, 2].legend(handles=handles, framealpha=0.85, fontsize=7)
        axes[r_i, 2].set_title(f"{task}: optimal σ* and N*")
        for ax in axes[r_i]:
            ax.set_xlabel("budget F = C + δ·D  (FLOPs)")
    fig.tight_layout()
    return _save(fig, out_dir, "budget_scaling")


def plot_extrapolation(fit: dict, out_dir: Path) -> list[str]:
    """Held-out check: predicted vs observed D_J, fit on the smaller levels only."""
    ex = fit.get("extrapolation") or []
    if not ex:
        return []
    axes_names = sorted({e["holdout"] for e in ex})
    fig, axes = plt.subplots(1, len(axes_names), figsize=(4.3 * len(axes_names) + 0.4, 4.0), squeeze=False)
    for ax, name in zip(axes[0], axes_names):
        sub = [e for e in ex if e["holdout"] == name]
        allv = []
        for ti, task in enumerate(fit["tasks"]):
            pts = [p for e in sub if e["task"] == task for p in e["points"]]
            if not pts:
                continue
            col = TASK_COLORS[ti % len(TASK_COLORS)]
            for held, mk, alpha in ((False, "o", 0.35), (True, "D", 0.95)):
                q = [p for p in pts if p["held_out"] == held]
                if not q:
                    continue
                obs = np.array([p["observed"] for p in q])
                pred = np.array([p["predicted"] for p in q])
                std = np.array([_num(p["observed_std"]) for p in q])
                ax.errorbar(obs, pred, xerr=np.where(np.isfinite(std), std, 0), fmt=mk, ms=4 if not held else 5,
                            color=col, alpha=alpha, lw=0.7, capsize=0,
                            label=f"{task} {'held out' if held else 'fitted'}")
                allv += [*obs, *pred]
        lo, hi = min(allv) / 1.2, max(allv) * 1.2
        g = np.geomspace(lo, hi, 10)
        ax.plot(g, g, "k-", lw=0.8)
        ax.fill_between(g, g / 1.1, g * 1.1, color="k", alpha=0.08, lw=0, label="±10%")
        err = np.mean([e["mean_abs_log_error_heldout"] for e in sub])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("observed D_J (env steps)")
        ax.set_ylabel("predicted D_J (env steps)")
        lab = "largest N" if name == "param_count" else "largest σ"
        ax.set_title(f"held out: {lab}; mean |log err| = {err:.3f}")
        ax.legend(fontsize=7, framealpha=0.85)
    fig.tight_layout()
    return _save(fig, out_dir, "extrapolation")


def plot_all(fit: dict, out_dir: str | Path) -> list[str]:
    """Every figure the fit supports; returns the written paths (PNG and PDF)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[str] = []
    with plt.rc_context(STYLE):
        for fn in (plot_data_efficiency_sigma, plot_hparams, plot_contours, plot_pareto, plot_budget_scaling,
                   plot_extrapolation):
            paths += fn(fit, out_dir)
    return paths
