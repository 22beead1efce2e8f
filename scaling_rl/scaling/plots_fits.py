"""Figures of the fitted laws against their data: D_J(σ) per task and model size, B*(σ) and η*(σ)
with their shared-slope fits, and the held-out extrapolation check (predicted vs observed D_J).
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from .plots_common import (  # noqa: E402
    MARKERS, TASK_COLORS, _draw_fit, _extrapolate, _j_colors, _legend_handles_j, _level_pct, _level_ticks,
    _log_span, _n_thresholds, _num, _pick, _points, _pos, _same, _save, _shared_thresholds, _size_text,
    _task_sizes, _widths, _with_extrapolation, _yerr, legend_right, tidy_log_axes)


# ---- D_J(σ) per (task, model size) ------------------------------------------------------------

def _de_sigma_panels(fit: dict) -> dict[str, list]:
    """task -> its own model sizes (with points), at most MAX_SIZES of them."""
    out = {}
    for t in fit.get("tasks") or []:
        sizes = _pick(_task_sizes(fit, t))
        if _points(fit, t) and sizes:
            out[t] = sizes
    return out


def _de_sigma_record(fit: dict, task: str, N, j: int) -> dict | None:
    for f in fit.get("data_efficiency_sigma") or []:
        if f.get("task") == task and f.get("j_index") == j and _same(f.get("param_count"), N) \
                and not f.get("skipped") and f.get("band"):
            return f
    return None


def draw_data_efficiency_sigma(fit: dict):
    """D_J vs σ: one row per task over its own model sizes (one panel per task when there is one size),
    one colour per threshold, each fit with its band over the measured σ range."""
    panels = _de_sigma_panels(fit)
    if not panels:
        return None
    tasks = list(panels)
    K = _extrapolate(fit)
    nJ = _n_thresholds(fit)
    colors = _j_colors(nJ)
    shared_j = _shared_thresholds(fit, tasks)
    widths = _widths(fit)
    ncols = max(len(v) for v in panels.values())
    by_row = ncols > 1 or len(tasks) == 1
    if by_row:  # rows = tasks, columns = that task's model sizes
        nrows = len(tasks)
        cells = {(t, N): (r, c) for r, t in enumerate(tasks) for c, N in enumerate(panels[t])}
    else:       # one size per task: wrap the tasks
        ncols = min(4, len(tasks))
        nrows = math.ceil(len(tasks) / ncols)
        cells = {(t, panels[t][0]): divmod(i, ncols) for i, t in enumerate(tasks)}
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols + (2.2 if not shared_j and by_row else 0.6),
                                                    (3.1 if by_row or shared_j else 3.7) * nrows), squeeze=False,
                             sharey="row" if by_row else False)
    used = set(cells.values())
    for r in range(nrows):
        for c in range(ncols):
            if (r, c) not in used:
                fig.delaxes(axes[r, c])
    row_vals: dict[int, tuple[list, list]] = {}
    formula = None
    for (task, N), (r, c) in cells.items():
        ax = axes[r, c]
        ax.set_gid(f"{task}|{_num(N):g}" if N is not None else f"{task}|")  # for the tests
        vals, ends = row_vals.setdefault(r if by_row else (r, c), ([], []))
        pts = [p for p in _points(fit, task) if _same(p.get("param_count"), N)]
        for j in range(nJ):
            pj = [p for p in pts if p.get("j_index") == j]
            ok = [p for p in pj if not p.get("censored") and math.isfinite(_pos(p.get("D")))]
            if ok:
                x = np.array([_num(p["utd"]) for p in ok])
                y = np.array([_num(p["D"]) for p in ok])
                lo, hi = [p.get("D_lo") for p in ok], [p.get("D_hi") for p in ok]
                ax.errorbar(x, y, yerr=_yerr(y, lo, hi), fmt="o", ms=4, color=colors[j], capsize=2, lw=1, zorder=3)
                vals += list(y)
                ends += [*lo, *hi]
            cens = [p for p in pj if p.get("censored") and math.isfinite(_pos(p.get("last_step")))]
            if cens:
                ax.scatter([_num(p["utd"]) for p in cens], [_num(p["last_step"]) for p in cens], marker="^", s=40,
                           facecolors="none", edgecolors=colors[j], zorder=3)
                vals += [_num(p["last_step"]) for p in cens]
            rec = _de_sigma_record(fit, task, N, j)
            if rec is None or not ok:
                continue
            formula = formula or rec.get("formula")
            b = rec["band"]
            mr = [_pos(v) for v in rec.get("measured_range") or []]   # the σ range the law was fitted on
            x_lo, x_hi = (min(mr), max(mr)) if len(mr) == 2 and all(map(math.isfinite, mr)) else (x.min(), x.max())
            _draw_fit(ax, b.get("utd") or [], b.get("estimate") or [], b.get("lo"), b.get("hi"),
                      float(x_lo), float(x_hi), K, colors[j])
        ax.set_xscale("log")
        ax.set_yscale("log")
        sig = [_num(p.get("utd")) for p in pts]
        span = _log_span(_with_extrapolation(sig, K), margin=0.06)
        if span:
            ax.set_xlim(*span)
        _level_ticks(ax, sig)
        ax.set_title(f"{task}, {_size_text(N, widths.get((task, _pos(N))))}", fontsize=10)
        ax.set_xlabel("UTD ratio σ")
        if c == 0 or not by_row:
            ax.set_ylabel("env steps to reach J  (D_J)")
        if not shared_j:  # this task's own threshold values
            handles = _legend_handles_j(fit, task, colors)
            last = max(cc for (t, _), (rr, cc) in cells.items() if t == task)
            if not by_row:
                ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=min(3, len(handles)),
                          fontsize=7, frameon=False, title=f"threshold ({task})", title_fontsize=7)
            elif c == last:
                ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False,
                          title=f"threshold ({task})", fontsize=8)
    for key, (vals, ends) in row_vals.items():
        span = _log_span(vals, ends)
        if span is None:
            continue
        targets = [axes[rr, cc] for (t, _), (rr, cc) in cells.items() if (rr if by_row else (rr, cc)) == key]
        for ax in targets:
            ax.set_ylim(*span)
    handles = _legend_handles_j(fit, tasks[0], colors) if shared_j else []
    handles += [Line2D([], [], color="grey", lw=6, alpha=0.3, label=f"{_level_pct(fit)}% band"),
                Line2D([], [], color="grey", marker="^", ls="", mfc="none", label="censored (≥ last step)")]
    if K > 1:
        handles.append(Line2D([], [], color="grey", ls="--", label=f"fit extrapolated (≤ ×{K:g} beyond σ range)"))
    if shared_j or not by_row:
        fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False,
                   title="threshold" if shared_j else None)
    else:
        fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=len(handles),
                   frameon=False)
    fig.suptitle("Data efficiency vs UTD: " + (formula or "D_J(σ) = D_min + (β/σ)^α"), y=1.0)
    tidy_log_axes(fig)
    fig.tight_layout(rect=(0, 0.03 if not (shared_j or not by_row) else 0, 1, 1))
    return fig


def plot_data_efficiency_sigma(fit: dict, out_dir: Path) -> list[str]:
    return _save(draw_data_efficiency_sigma(fit), out_dir, "data_efficiency_sigma")


# ---- B*(σ), η*(σ) ------------------------------------------------------------------------------

def draw_hparams(fit: dict):
    """B* and η* vs σ: uncertainty-corrected optima (points with intervals; marker = the task's model
    size, smallest first), shared-slope fits over each task's measured σ range."""
    hp = fit.get("hparams") or {}
    panels = [(f, lab) for f, lab in (("batch_size", "batch size B*"), ("lr", "learning rate η*"))
              if isinstance((hp.get(f"{f}_sigma") or {}).get("params"), dict)]
    if not panels:
        return None
    K = _extrapolate(fit)
    tasks = fit.get("tasks") or []
    sizes = {t: [n for n in _task_sizes(fit, t) if n is not None] for t in tasks}
    widths = _widths(fit)
    same_sizes = len({tuple(v) for v in sizes.values()}) <= 1
    n_markers = max((len(v) for v in sizes.values()), default=0)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels) + 1.6, 3.6), squeeze=False)
    for ax, (field, label) in zip(axes[0], panels):
        rec = hp[f"{field}_sigma"]
        vals, ends = [], []
        for ti, task in enumerate(tasks):
            col = TASK_COLORS[ti % len(TASK_COLORS)]
            pts = [p for p in hp.get("points") or [] if p.get("field") == field and p.get("task") == task
                   and math.isfinite(_pos(p.get("estimate")))]
            levels = sizes[task] or [None]
            for ni, N in enumerate(levels):
                sub = [p for p in pts if _same(p.get("param_count"), N)]
                if not sub:
                    continue
                jitter = 1 + 0.03 * (ni - (len(levels) - 1) / 2)
                x = np.array([_num(p["utd"]) for p in sub]) * jitter
                y = np.array([_num(p["estimate"]) for p in sub])
                lo, hi = [p.get("lo") for p in sub], [p.get("hi") for p in sub]
                ax.errorbar(x, y, yerr=_yerr(y, lo, hi), fmt=MARKERS[ni % len(MARKERS)], color=col, ms=4, capsize=2,
                            lw=0.8, alpha=0.85)
                vals += list(y)
                ends += [*lo, *hi]
            band = (rec.get("bands") or {}).get(task)
            xs = [_num(p["utd"]) for p in pts]
            if band and xs:
                _draw_fit(ax, band.get("utd") or [], band.get("estimate") or [], band.get("lo"), band.get("hi"),
                          min(xs), max(xs), K, col, lw=1.6)
        s = (rec.get("params") or {}).get("s") or {}
        title = f"{label} ∝ σ^s"
        if math.isfinite(_num(s)):
            title += f",  s = {_num(s):.2f}"
            if math.isfinite(_num(s.get("lo"))) and math.isfinite(_num(s.get("hi"))):
                title += f" [{_num(s['lo']):.2f}, {_num(s['hi']):.2f}]"
        ax.set_title(title)
        ax.set_xscale("log")
        ax.set_yscale("log")
        span = _log_span(vals, ends)
        if span:
            ax.set_ylim(*span)
        sig = [_num(p.get("utd")) for p in hp.get("points") or [] if p.get("field") == field]
        span = _log_span(_with_extrapolation(sig, K), margin=0.06)
        if span:
            ax.set_xlim(*span)
        _level_ticks(ax, sig)
        ax.set_xlabel("UTD ratio σ")
        ax.set_ylabel(label)
    handles = [Line2D([], [], color=TASK_COLORS[i % len(TASK_COLORS)], lw=1.6, label=t) for i, t in enumerate(tasks)]
    for i in range(n_markers):
        if same_sizes:
            N = sizes[tasks[0]][i]
            lab = _size_text(N, widths.get((tasks[0], N)))
        else:
            ws = {widths.get((t, sizes[t][i])) for t in tasks if i < len(sizes[t])}
            w = ws.pop() if len(ws) == 1 else None
            lab = (f"width {w:g}" if w is not None else f"model size {i + 1} of each task") + \
                (" (smallest)" if i == 0 else " (largest)" if i == n_markers - 1 else "")
        handles.append(Line2D([], [], color="k", marker=MARKERS[i % len(MARKERS)], ls="", label=lab))
    handles.append(Line2D([], [], color="grey", lw=6, alpha=0.3, label=f"{_level_pct(fit)}% band"))
    if K > 1:
        handles.append(Line2D([], [], color="grey", ls="--", label=f"extrapolated (≤ ×{K:g})"))
    return legend_right(fig, handles)


def plot_hparams(fit: dict, out_dir: Path) -> list[str]:
    return _save(draw_hparams(fit), out_dir, "hparams_sigma")


# ---- held-out extrapolation check ------------------------------------------------------------

def draw_extrapolation(fit: dict):
    """Held-out check: predicted vs observed D_J, fit on the smaller levels only."""
    ex = [e for e in fit.get("extrapolation") or [] if isinstance(e, dict) and e.get("points")]
    if not ex:
        return None
    axes_names = sorted({e.get("holdout", "?") for e in ex})
    fig, axes = plt.subplots(1, len(axes_names), figsize=(4.3 * len(axes_names) + 0.4, 4.0), squeeze=False)
    for ax, name in zip(axes[0], axes_names):
        sub = [e for e in ex if e.get("holdout", "?") == name]
        allv = []
        for ti, task in enumerate(fit.get("tasks") or []):
            pts = [p for e in sub if e.get("task") == task for p in e["points"]
                   if math.isfinite(_pos(p.get("observed"))) and math.isfinite(_pos(p.get("predicted")))]
            if not pts:
                continue
            col = TASK_COLORS[ti % len(TASK_COLORS)]
            for held, mk, alpha in ((False, "o", 0.35), (True, "D", 0.95)):
                q = [p for p in pts if bool(p.get("held_out")) == held]
                if not q:
                    continue
                obs = np.array([_num(p["observed"]) for p in q])
                pred = np.array([_num(p["predicted"]) for p in q])
                std = np.array([_num(p.get("observed_std")) for p in q])
                ax.errorbar(obs, pred, xerr=np.where(np.isfinite(std), std, 0), fmt=mk, ms=4 if not held else 5,
                            color=col, alpha=alpha, lw=0.7, capsize=0,
                            label=f"{task} {'held out' if held else 'fitted'}")
                allv += [*obs, *pred]
        if not allv:
            ax.set_axis_off()
            continue
        lo, hi = min(allv) / 1.2, max(allv) * 1.2
        g = np.geomspace(lo, hi, 10)
        ax.plot(g, g, "k-", lw=0.8)
        ax.fill_between(g, g / 1.1, g * 1.1, color="k", alpha=0.08, lw=0, label="±10%")
        errs = [_num(e.get("mean_abs_log_error_heldout")) for e in sub]
        errs = [v for v in errs if math.isfinite(v)]
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("observed D_J (env steps)")
        ax.set_ylabel("predicted D_J (env steps)")
        lab = {"param_count": "largest N", "utd": "largest σ"}.get(name, str(name))
        ax.set_title(f"held out: {lab}" + (f"; mean |log err| = {np.mean(errs):.3f}" if errs else ""))
        ax.legend(fontsize=7, framealpha=0.85)
    tidy_log_axes(fig)
    fig.tight_layout()
    return fig


def plot_extrapolation(fit: dict, out_dir: Path) -> list[str]:
    return _save(draw_extrapolation(fit), out_dir, "extrapolation")
