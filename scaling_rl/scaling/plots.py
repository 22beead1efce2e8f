"""Figures from a fit.json dict alone (so `scaling-rl plot` can redraw them): PNG + PDF, log axes,
legends, intervals drawn.

Every figure survives real data: panels are laid out per task over that task's own model sizes (no
empty panels when tasks have different parameter counts), fitted curves are drawn over the measured
range (dashed up to `settings.extrapolate` beyond it, never further), axis limits are set by the data
(not by a fit or an interval that runs off), thresholds are labelled per task unless every task shares
them, and anything fit.json lacks (an interval, a fit, a skipped law) is left out instead of failing.
Lines that show a fit carry the gid "fit" (measured range) or "fit-extrapolated".
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullFormatter  # noqa: E402

from ..io import atomic_savefig  # noqa: E402
from . import allocation as alloc  # noqa: E402
from .fitting import single_threaded_blas  # noqa: E402

TASK_COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
STYLE = {"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 8,
         "axes.grid": True, "grid.alpha": 0.3, "grid.linewidth": 0.5}
MAX_SIZES = 6        # model sizes shown per task (evenly picked beyond that)
CAP = 3.0            # interval ends further than this factor outside the data do not widen the axes


def tidy_log_axes(fig) -> None:
    """No labels on minor log ticks (they collide); on axes spanning under two decades, label 1-2-5
    multiples in plain notation instead, and on axes spanning under a factor 4, evenly spaced values.
    Axes given fixed ticks (the sweep's levels) keep them."""
    fmt = FuncFormatter(lambda v, _: f"{v:.3g}")
    for ax in fig.axes:
        for axis, lim in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            if axis.get_scale() != "log":
                continue
            axis.set_minor_formatter(NullFormatter())
            axis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))  # fewer tick artists: faster draws
            if isinstance(axis.get_major_locator(), FixedLocator):
                continue
            lo, hi = sorted(lim)
            if lo > 0 and hi / lo < 4:
                ticks = [t for t in MaxNLocator(4).tick_values(lo, hi) if lo <= t <= hi and t > 0]
                axis.set_major_locator(FixedLocator(ticks))
                axis.set_major_formatter(fmt)
            elif lo > 0 and np.log10(hi / lo) < 2.5:
                axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
                axis.set_major_formatter(fmt)


def _save(fig, out_dir: Path, name: str) -> list[str]:
    if fig is None:
        return []
    tidy_log_axes(fig)
    paths = []
    for ext in ("png", "pdf"):
        path = out_dir / f"{name}.{ext}"
        atomic_savefig(fig, path, fmt=ext, dpi=150, bbox_inches="tight")
        paths.append(str(path))
    plt.close(fig)
    return paths


# ---- reading fit.json defensively -------------------------------------------------------------

def _num(v) -> float:
    """A float, NaN for None / missing / non-numbers (fit.json writes non-finite values as null)."""
    if isinstance(v, dict):
        v = v.get("estimate")
    try:
        return float("nan") if v is None or isinstance(v, bool) else float(v)
    except (TypeError, ValueError):
        return float("nan")


def _pos(v) -> float:
    x = _num(v)
    return x if math.isfinite(x) and x > 0 else float("nan")


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def _same(a, b) -> bool:
    """Equal model sizes (None / NaN = unknown equals unknown)."""
    a, b = _num(a), _num(b)
    if not (math.isfinite(a) and math.isfinite(b)):
        return not math.isfinite(a) and not math.isfinite(b)
    return math.isclose(a, b, rel_tol=1e-9)


def _settings(fit: dict) -> dict:
    return fit.get("settings") or {}


def _level_pct(fit: dict) -> int:
    lv = _num(_settings(fit).get("level"))
    return int(round(100 * lv)) if math.isfinite(lv) else 90


def _extrapolate(fit: dict) -> float:
    """The factor K by which fits may be drawn (and optima searched) beyond the swept range."""
    k = _num(_settings(fit).get("extrapolate", 1.0))
    return k if math.isfinite(k) and k >= 1 else 1.0


def _thresholds(fit: dict, task: str) -> list[float]:
    return [_num(v) for v in (fit.get("thresholds") or {}).get(task) or []]


def _n_thresholds(fit: dict) -> int:
    return max((len(v or []) for v in (fit.get("thresholds") or {}).values()), default=0)


def _shared_thresholds(fit: dict, tasks: list[str]) -> bool:
    """Every task has the same threshold values (one legend serves them all)."""
    ref = _thresholds(fit, tasks[0]) if tasks else []
    return all(len(_thresholds(fit, t)) == len(ref) and np.allclose(_thresholds(fit, t), ref, rtol=1e-6, atol=0)
               for t in tasks)


def _j_text(fit: dict, task: str, j: int) -> str:
    thr = _thresholds(fit, task)
    return f"J = {thr[j]:.3g}" if 0 <= j < len(thr) and math.isfinite(thr[j]) else f"threshold {j + 1}"


def _j_colors(n: int):
    cmap = plt.get_cmap("viridis")
    return [cmap(0.1 + 0.8 * i / max(n - 1, 1)) for i in range(max(n, 1))]


def _pick(levels: list, k: int = MAX_SIZES) -> list:
    if len(levels) <= k:
        return levels
    idx = np.unique(np.round(np.linspace(0, len(levels) - 1, k)).astype(int))
    return [levels[i] for i in idx]


def _points(fit: dict, task: str | None = None) -> list[dict]:
    return [p for p in fit.get("points") or [] if task is None or p.get("task") == task]


def _task_levels(fit: dict, task: str) -> tuple[list[float], list[float]]:
    """(σ levels, N levels) of one task: fit.json's `levels_by_task` or the task's own points."""
    lv = (fit.get("levels_by_task") or {}).get(task)
    if lv:
        s = [v for v in (_pos(x) for x in lv.get("utd") or []) if math.isfinite(v)]
        n = [v for v in (_pos(x) for x in lv.get("param_count") or []) if math.isfinite(v)]
    else:
        pts = _points(fit, task)
        s = [v for v in (_pos(p.get("utd")) for p in pts) if math.isfinite(v)]
        n = [v for v in (_pos(p.get("param_count")) for p in pts) if math.isfinite(v)]
    return sorted(set(s)), sorted(set(n))


def _task_sizes(fit: dict, task: str) -> list[float | None]:
    """The model sizes of one task's points (None: unknown), smallest first."""
    ns = {_pos(p.get("param_count")) for p in _points(fit, task)}
    known = sorted(n for n in ns if math.isfinite(n))
    return known + ([None] if any(not math.isfinite(n) for n in ns) or not ns else [])


def _widths(fit: dict) -> dict:
    """(task, N) -> network width, where the configurations record one."""
    out = {}
    for c in fit.get("configs") or []:
        w = _num((c.get("extra") or {}).get("width"))
        n = _pos(c.get("param_count"))
        if math.isfinite(w) and math.isfinite(n):
            out[(c.get("task"), n)] = w
    return out


def _size_text(N, width=None) -> str:
    if N is None or not math.isfinite(_num(N)):
        return "one model size"
    return f"N = {_fmt(_num(N))}" + (f" (width {width:g})" if width is not None and math.isfinite(width) else "")


def _log_span(values, ends=(), margin: float = 0.08, cap: float = CAP):
    """(lo, hi) for a log axis set by the data: the positive finite `values` with a margin of `margin`
    of their log width (at least a factor 1.2 wide); interval `ends` widen it only where they lie within
    a factor `cap` of the values. None if there are no values."""
    v = np.array([_num(x) for x in values], float)
    v = v[np.isfinite(v) & (v > 0)]
    if not v.size:
        return None
    lo, hi = float(v.min()), float(v.max())
    e = np.array([_num(x) for x in ends], float)
    e = e[np.isfinite(e) & (e > 0) & (e >= lo / cap) & (e <= hi * cap)]
    if e.size:
        lo, hi = min(lo, float(e.min())), max(hi, float(e.max()))
    llo, lhi = math.log(lo), math.log(hi)
    w = max(lhi - llo, math.log(1.2))
    mid = (llo + lhi) / 2
    llo, lhi = min(llo, mid - w / 2), max(lhi, mid + w / 2)
    return math.exp(llo - margin * w), math.exp(lhi + margin * w)


def _with_extrapolation(values, K: float) -> list[float]:
    """The values plus their range stretched by the factor K (the x-range a fit may be drawn over)."""
    v = [x for x in (_pos(y) for y in values) if math.isfinite(x)]
    return v + ([min(v) / K, max(v) * K] if v and K > 1 else [])


def _level_ticks(ax, levels, axis: str = "x") -> None:
    """Major ticks at the sweep's own levels (few of them), labelled plainly."""
    lv = sorted({v for v in (_pos(x) for x in levels) if math.isfinite(v)})
    if 1 <= len(lv) <= 8:
        a = ax.xaxis if axis == "x" else ax.yaxis
        a.set_major_locator(FixedLocator(lv))
        a.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))


def _yerr(est, lo, hi):
    """Asymmetric error bars; a missing end (no interval) draws no bar on that side."""
    est, lo, hi = (np.array([_num(v) for v in a], float) for a in (est, lo, hi))
    lo = np.where(np.isfinite(lo), lo, est)
    hi = np.where(np.isfinite(hi), hi, est)
    return np.nan_to_num(np.vstack([np.maximum(est - lo, 0), np.maximum(hi - est, 0)]))


def _flag(row: dict) -> str:
    """'edge' (optimum on the searched box's edge), 'extrapolated' (outside the swept range) or ''."""
    if row.get("edge") or row.get("at_bound"):
        return "edge"
    ex = row.get("extrapolated")
    if isinstance(ex, dict):
        ex = any(ex.values())
    return "extrapolated" if ex else ""


def _interp_log(xs, x, y):
    """y(xs) interpolated linearly in log-log; NaN where fewer than two positive points exist."""
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    if ok.sum() < 2:
        return np.full(len(xs), np.nan)
    return np.exp(np.interp(np.log(xs), np.log(x[ok]), np.log(y[ok]), left=np.nan, right=np.nan))


def _draw_fit(ax, x, est, lo, hi, x_lo: float, x_hi: float, K: float, color, lw: float = 1.5,
              alpha: float = 0.18) -> list:
    """A fitted curve (with its band when lo/hi exist) over the measured range [x_lo, x_hi], solid, and
    up to a factor K beyond it, dashed; nothing further, and nothing the curve's grid does not cover."""
    x = np.array([_num(v) for v in x], float)
    est = np.array([_num(v) for v in est], float)
    lo = np.array([_num(v) for v in lo], float) if lo is not None else np.full_like(x, np.nan)
    hi = np.array([_num(v) for v in hi], float) if hi is not None else np.full_like(x, np.nan)
    ok = np.isfinite(x) & (x > 0) & np.isfinite(est) & (est > 0)
    if ok.sum() < 2 or not (x_hi >= x_lo > 0):
        return []
    order = np.argsort(x[ok])
    x, est, lo, hi = (a[ok][order] for a in (x, est, lo, hi))
    segments = [(x_lo, x_hi, "-", alpha, "fit")]
    if K > 1:
        segments += [(x_lo / K, x_lo, "--", alpha / 2, "fit-extrapolated"),
                     (x_hi, x_hi * K, "--", alpha / 2, "fit-extrapolated")]
    lines = []
    for a, b, ls, al, gid in segments:
        a, b = max(a, x[0]), min(b, x[-1])
        if not b > a * (1 + 1e-9):
            continue
        xs = np.unique(np.concatenate([[a], x[(x > a) & (x < b)], [b]]))
        (ln,) = ax.plot(xs, _interp_log(xs, x, est), color=color, lw=lw, ls=ls, gid=gid)
        lines.append(ln)
        ylo, yhi = _interp_log(xs, x, lo), _interp_log(xs, x, hi)
        band = np.isfinite(ylo) & np.isfinite(yhi)
        if band.any():
            ax.fill_between(xs, ylo, yhi, where=band, color=color, alpha=al, lw=0)
    return lines


def _legend_handles_j(fit: dict, task: str, colors, marker="o", lw=1.5, prefix="") -> list:
    return [Line2D([], [], color=colors[j], marker=marker, lw=lw, label=prefix + _j_text(fit, task, j))
            for j in range(len(_thresholds(fit, task)))]


def _legend_texts(fig) -> list[tuple[str, list[str]]]:
    """(title, labels) of every legend of a figure (used by the tests)."""
    legs = [ax.get_legend() for ax in fig.axes] + list(fig.legends)
    return [(lg.get_title().get_text(), [t.get_text() for t in lg.get_texts()]) for lg in legs if lg is not None]


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
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    tidy_log_axes(fig)
    fig.tight_layout()
    return fig


def plot_hparams(fit: dict, out_dir: Path) -> list[str]:
    return _save(draw_hparams(fit), out_dir, "hparams_sigma")


# ---- compute-optimal allocation ----------------------------------------------------------------

def _allocation_rows(fit: dict) -> list[dict]:
    """The per-threshold optima (or, from older fits of one-size studies, the σ-only optima)."""
    al = fit.get("allocation") or {}
    rows = al.get("per_threshold") or al.get("sigma_only_studies") or []
    return sorted((r for r in rows if isinstance(r, dict) and "task" in r), key=lambda r: (r["task"],
                                                                                            r.get("j_index", 0)))


def _law_params(p: dict | None) -> dict | None:
    """Natural parameters of D_min·(1 + (a/σ)^α + (b/N)^β) with any term missing (a nested law), or
    None without a positive D_min."""
    if not isinstance(p, dict):
        return None
    q = {k: _num(v) for k, v in p.items()}
    if not q.get("D_min", 0) > 0:
        return None
    return q


def _log_d(p: dict, ls, ln):
    """log D(σ, N) for the (possibly nested) law in `p`; a term whose parameters are missing is absent."""
    terms = [np.zeros_like(ls + ln)]
    for c, e, lx in (("a", "alpha", ls), ("b", "beta", ln)):
        if p.get(c, 0) > 0 and math.isfinite(p.get(e, float("nan"))):
            terms.append(p[e] * (math.log(p[c]) - lx))
    return math.log(p["D_min"]) + np.logaddexp.reduce(np.stack(terms), axis=0)


def _full(p: dict) -> dict:
    """The same law with vanishing coefficients for missing terms (what allocation.py evaluates)."""
    return {"a": 1e-300, "alpha": 1.0, "b": 1e-300, "beta": 1.0,
            **{k: v for k, v in p.items() if math.isfinite(v) and (k not in ("a", "b") or v > 0)}}


def _fixed_axes(r: dict) -> set[str]:
    """Axes ("sigma", "N") an optimum row holds fixed (the law does not depend on them, or one size)."""
    free = r.get("free") or {}
    out = {k for k in ("sigma", "N") if free.get(k) is False}
    kind = r.get("kind") or ("sigma_law" if r.get("method") == "numerical_sigma_only" else "full")
    if kind in ("sigma_law", "sigma_only"):
        out.add("N")
    elif kind == "n_only":
        out.add("sigma")
    return out


def _row_params(fit: dict, r: dict) -> dict | None:
    p = _law_params(r.get("params"))
    if p is None:  # older fits: the D_J(σ, N) record of this threshold
        rec = next((f for f in fit.get("data_efficiency_sigma_n") or [] if f.get("task") == r["task"]
                    and f.get("j_index") == r.get("j_index") and isinstance(f.get("params"), dict)), None)
        p = _law_params(rec and rec["params"])
    return p


def _tasks_with_rows(fit: dict, rows: list[dict], two_d: bool = False) -> list[str]:
    out = []
    for t in fit.get("tasks") or []:
        if not any(r["task"] == t for r in rows):
            continue
        s_lv, n_lv = _task_levels(fit, t)
        if two_d and (len(s_lv) < 2 or len(n_lv) < 2):
            continue
        out.append(t)
    return out


def _in_box(v: float, lo: float, hi: float, K: float = 1.0) -> bool:
    return math.isfinite(v) and lo / K * (1 - 1e-6) <= v <= hi * K * (1 + 1e-6)


def _mask_outside(ax, box, view) -> None:
    """Fade the part of the view outside the swept box and outline the box."""
    (s0, s1), (n0, n1) = box
    (x0, x1), (y0, y1) = view
    for (a, b), (c, d) in (((x0, s0), (y0, y1)), ((s1, x1), (y0, y1)), ((s0, s1), (y0, n0)), ((s0, s1), (n1, y1))):
        if b > a and d > c:
            ax.add_patch(Rectangle((a, c), b - a, d - c, color="white", alpha=0.45, lw=0, zorder=2))
    ax.add_patch(Rectangle((s0, n0), s1 - s0, n1 - n0, fill=False, ls="--", lw=1.0, ec="0.3", zorder=2))


REGION_STYLES = (("5%", "-"), ("1%", ":"))


def _draw_regions(ax, row: dict, color) -> int:
    """The near-optimal regions (5%, 1%) of one allocation row as rectangles in (σ, N); returns how many."""
    n = 0
    for k, ls in REGION_STYLES:
        reg = (row.get("region") or {}).get(k)
        if not reg or "sigma" not in reg or "N" not in reg:
            continue
        (s0, s1), (n0, n1) = reg["sigma"], reg["N"]
        ax.add_patch(Rectangle((s0, n0), s1 - s0, n1 - n0, fill=False, ec="C1", lw=1.6, ls=ls,
                                                  zorder=5, gid=f"region-{k}"))
        n += 1
    return n


def draw_contours(fit: dict):
    """Iso-D_J contours over each task's own (σ, N) range for its hardest fitted threshold, the sweep
    grid, and the budget-optimal (σ*, N*) of every threshold with intervals (the compute-optimal path).
    Colours are scaled to D_J inside the swept box; outside it (shown only as far as `extrapolate`
    allows) the map is faded, and extrapolated optima are drawn open."""
    al = fit.get("allocation") or {}
    rows = [r for r in _allocation_rows(fit) if r.get("kind", "full") == "full"]
    tasks = _tasks_with_rows(fit, rows, two_d=True)
    K = _extrapolate(fit)
    panels = []
    for task in tasks:
        trows = [r for r in rows if r["task"] == task]
        p = next((q for q in (_row_params(fit, r) for r in reversed(trows)) if q is not None), None)
        if p is not None:
            panels.append((task, trows, p))
    if not panels:
        return None
    nJ = _n_thresholds(fit)
    colors = _j_colors(nJ)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.8 * len(panels) + 0.4, 5.6), squeeze=False)
    for ax, (task, trows, p) in zip(axes[0], panels):
        ax.set_gid(task)
        s_lv, n_lv = _task_levels(fit, task)
        box = ((min(s_lv), max(s_lv)), (min(n_lv), max(n_lv)))
        shown = [r for r in trows if _in_box(_num(r.get("sigma")), *box[0], K) and _in_box(_num(r.get("N")), *box[1], K)]
        view = (_log_span([*box[0], *(_num(r["sigma"]) for r in shown)], margin=0.05),
                _log_span([*box[1], *(_num(r["N"]) for r in shown)], margin=0.05))
        sg, ng = np.geomspace(*view[0], 120), np.geomspace(*view[1], 120)
        S, Nn = np.meshgrid(sg, ng)
        D = np.exp(_log_d(p, np.log(S), np.log(Nn)))
        inside = (S >= box[0][0]) & (S <= box[0][1]) & (Nn >= box[1][0]) & (Nn <= box[1][1])
        dbox = D[inside & np.isfinite(D)]
        if dbox.size and dbox.max() > dbox.min() * (1 + 1e-9):
            levels = np.geomspace(dbox.min(), dbox.max(), 9)
            cf = ax.contourf(S, Nn, D, levels=levels, cmap="Blues_r", norm=matplotlib.colors.LogNorm(),
                             extend="both", alpha=0.85)
            cs = ax.contour(S, Nn, D, levels=levels[1:-1], colors="k", linewidths=0.5, alpha=0.6)
            ax.clabel(cs, fmt=lambda v: f"{v:.2g}", fontsize=7)
            cb = fig.colorbar(cf, ax=ax, pad=0.02, ticks=levels[::2], format=FuncFormatter(lambda v, _: f"{v:.2g}"))
            cb.ax.yaxis.set_minor_formatter(NullFormatter())
            cb.set_label("D_J (env steps)")
        _mask_outside(ax, box, view)
        G = sorted({(_num(q.get("utd")), _num(q.get("param_count"))) for q in _points(fit, task)
                    if math.isfinite(_pos(q.get("param_count")))})
        if G:
            ax.scatter(*zip(*G), s=14, color="k", marker="x", lw=0.8, zorder=3)
        missing = []
        for r in trows:
            j = r.get("j_index", 0)
            if r not in shown:
                missing.append(_j_text(fit, task, j))
                continue
            iv = r.get("intervals") or {}
            s_iv, n_iv = iv.get("sigma") or {}, iv.get("N") or {}
            open_ = bool(_flag(r))
            ax.errorbar([_num(r["sigma"])], [_num(r["N"])], xerr=_yerr([r["sigma"]], [s_iv.get("lo")], [s_iv.get("hi")]),
                        yerr=_yerr([r["N"]], [n_iv.get("lo")], [n_iv.get("hi")]), fmt="*", ms=11,
                        color=colors[j % len(colors)], mfc="white" if open_ else colors[j % len(colors)],
                        mec=colors[j % len(colors)] if open_ else "k", mew=1.0 if open_ else 0.5, capsize=2,
                        zorder=4)
        if len(shown) > 1:
            ax.plot([_num(r["sigma"]) for r in shown], [_num(r["N"]) for r in shown], color="C3", lw=1.2, ls="--",
                    zorder=3)
        n_regions = _draw_regions(ax, trows[-1], colors[trows[-1].get("j_index", 0) % len(colors)])
        if missing:
            ax.text(0.02, 0.98, "optimum beyond " + ("the sweep" if K == 1 else f"×{K:g} of the sweep") + ": "
                    + ", ".join(missing), transform=ax.transAxes, va="top", fontsize=7,
                    bbox=dict(fc="white", alpha=0.8, lw=0))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(*view[0])
        ax.set_ylim(*view[1])
        ax.set_xlabel("UTD ratio σ")
        ax.set_ylabel("critic parameters N")
        ax.set_title(f"{task}: iso-D_J contours ({_j_text(fit, task, trows[-1].get('j_index', 0))})", fontsize=10)
        handles = [Line2D([], [], color="k", marker="x", ls="", label="sweep (σ, N)"),
                   Line2D([], [], color="0.3", ls="--", lw=1.0, label="swept range"),
                   Line2D([], [], color="C3", ls="--", lw=1.2, label="compute-optimal path")]
        handles += [Line2D([], [], color=colors[j % len(colors)], marker="*", ms=9, mec="k", mew=0.5, ls="",
                           label="optimum, " + _j_text(fit, task, j)) for j in sorted({r.get("j_index", 0) for r in trows})]
        if any(_flag(r) for r in shown):
            handles.append(Line2D([], [], color="grey", marker="*", ms=9, mfc="white", ls="",
                                  label="extrapolated / on the box edge"))
        handles += [Line2D([], [], color="C1", ls=ls, lw=1.6, label=f"within {k} of the least budget, "
                           + _j_text(fit, task, trows[-1].get("j_index", 0))) for k, ls in REGION_STYLES[:n_regions]]
        _level_ticks(ax, s_lv, "x")
        _level_ticks(ax, n_lv, "y")
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, framealpha=0.85,
                  fontsize=7, title=f"{task}, δ = {_fmt(_num(al.get('delta')))} FLOPs/step", title_fontsize=7)
    tidy_log_axes(fig)
    fig.tight_layout()
    return fig


def plot_contours(fit: dict, out_dir: Path) -> list[str]:
    return _save(draw_contours(fit), out_dir, "data_efficiency_contours")


@single_threaded_blas  # once for the whole sweep of δ, not per optimisation
def _frontier(p: dict, bm, r: dict, delta: float, box, K: float) -> np.ndarray:
    """(C, D, class) along the data–compute frontier (optima of C + δ·D over δ): class 0 inside the
    swept box, 1 within the factor K beyond it, 2 further (not drawn)."""
    fixed = {{"N": "fix_n", "sigma": "fix_sigma"}[k]: _num(r.get(k)) for k in _fixed_axes(r)}
    if "fix_n" in fixed and "fix_sigma" in fixed:
        return np.zeros((0, 3))
    wide = {"sigma_range": (box[0][0] / 1e3, box[0][1] * 1e3), "n_range": (box[1][0] / 1e3, box[1][1] * 1e3)}
    out, x0 = [], None
    for d in np.geomspace(delta / 1e3, delta * 1e3, 25):
        try:
            o = alloc.optimum_numerical(_full(p), bm, float(d), x0=x0, **wide, **fixed)
        except (ValueError, FloatingPointError, ZeroDivisionError):
            continue
        x0 = (o["sigma"], o["N"])
        cls = 0 if _in_box(o["sigma"], *box[0]) and _in_box(o["N"], *box[1]) else \
            1 if _in_box(o["sigma"], *box[0], K) and _in_box(o["N"], *box[1], K) else 2
        out.append((o["C"], o["D"], cls))
    return np.array(out, float).reshape(-1, 3)


def draw_pareto(fit: dict):
    """Data–compute Pareto frontier per threshold (minimisers of C + δ·D over δ) where its optima lie in
    the swept range (dashed up to `extrapolate` beyond), the sweep's runs, and the chosen δ's optimum."""
    al = fit.get("allocation") or {}
    rows = _allocation_rows(fit)
    tasks = _tasks_with_rows(fit, rows)
    delta = _num(al.get("delta"))
    if not tasks or not delta > 0:
        return None
    K = _extrapolate(fit)
    nJ = _n_thresholds(fit)
    colors = _j_colors(nJ)
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.8 * len(tasks) + 0.6, 4.0), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        ax.set_gid(task)
        try:
            bm = alloc.BatchModel.from_dict((al.get("batch_models") or {})[task])
        except (KeyError, TypeError, ValueError):
            bm = None
        s_lv, n_lv = _task_levels(fit, task)
        if not n_lv:
            n_lv = sorted({v for v in (_pos(r.get("N")) for r in rows if r["task"] == task) if math.isfinite(v)})
        box = ((min(s_lv), max(s_lv)), (min(n_lv), max(n_lv))) if s_lv and n_lv else None
        xs, ys = [], []
        trows = [r for r in rows if r["task"] == task]
        for r in trows:
            j = r.get("j_index", 0)
            col = colors[j % len(colors)]
            p = _row_params(fit, r)
            if p is not None and bm is not None and box is not None:
                fr = _frontier(p, bm, r, delta, box, K)
                if len(fr):
                    ax.plot(fr[:, 0], np.where(fr[:, 2] <= 1, fr[:, 1], np.nan), color=col, lw=1.5, ls="--",
                            gid="fit-extrapolated")
                    ax.plot(fr[:, 0], np.where(fr[:, 2] == 0, fr[:, 1], np.nan), color=col, lw=1.5, gid="fit")
            pts = [q for q in _points(fit, task) if q.get("j_index") == j and not q.get("censored")
                   and math.isfinite(_pos(q.get("param_count"))) and math.isfinite(_pos(q.get("D")))]
            if pts and bm is not None:
                C = [alloc.compute_flops(_num(q["param_count"]),
                                         _pos(q.get("best_batch_size")) if math.isfinite(_pos(q.get("best_batch_size")))
                                         else bm(_num(q["utd"]), _num(q["param_count"])), _num(q["utd"]), _num(q["D"]))
                     for q in pts]
                D = [_num(q["D"]) for q in pts]
                ax.scatter(C, D, s=10, color=col, alpha=0.5)
                xs += C
                ys += D
            if math.isfinite(_pos(r.get("C"))) and math.isfinite(_pos(r.get("D"))):
                open_ = bool(_flag(r))
                ax.plot([_num(r["C"])], [_num(r["D"])], marker="*", ms=12, color=col, ls="",
                        mfc="white" if open_ else col, mec=col if open_ else "k", mew=1.0 if open_ else 0.5)
                xs.append(_num(r["C"]))
                ys.append(_num(r["D"]))
        ax.set_xscale("log")
        ax.set_yscale("log")
        for span, setter in ((_log_span(xs), ax.set_xlim), (_log_span(ys), ax.set_ylim)):
            if span:
                setter(*span)
        ax.set_xlabel("compute C = 10·N·B·σ·D  (FLOPs)")
        ax.set_ylabel("data D_J  (env steps)")
        ax.set_title(f"{task}: data–compute frontier")
        handles = [Line2D([], [], color=colors[j % len(colors)], lw=1.5, label=_j_text(fit, task, j))
                   for j in sorted({r.get("j_index", 0) for r in trows})]
        ax.legend(handles=handles, loc="upper right", framealpha=0.85, fontsize=7, title=task, title_fontsize=7)
    handles = [Line2D([], [], color="grey", marker="o", ls="", alpha=0.5, label="sweep runs (best B, η)"),
               Line2D([], [], color="grey", marker="*", ms=11, mec="k", ls="", label=f"optimum at δ = {_fmt(delta)}"),
               Line2D([], [], color="grey", marker="*", ms=11, mfc="white", ls="", label="optimum extrapolated / on edge")]
    if K > 1:
        handles.append(Line2D([], [], color="grey", ls="--", label=f"frontier beyond the sweep (≤ ×{K:g})"))
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    tidy_log_axes(fig)
    fig.tight_layout()
    return fig


def plot_pareto(fit: dict, out_dir: Path) -> list[str]:
    return _save(draw_pareto(fit), out_dir, "pareto_frontier")


def draw_budget_scaling(fit: dict):
    """D*(F), C*(F) and σ*(F), N*(F) across thresholds with their power-law fits over the optima's
    budget range; extrapolated (or box-edge) optima drawn open; σ*/N* left out where the law fixes them."""
    al = fit.get("allocation") or {}
    laws_ = [p for p in al.get("power_laws") or [] if isinstance(p, dict)]
    rows = _allocation_rows(fit)
    tasks = [t for t in _tasks_with_rows(fit, rows)
             if sum(math.isfinite(_pos(r.get("F"))) for r in rows if r["task"] == t) >= 1]
    if not tasks:
        return None
    fig, axes = plt.subplots(len(tasks), 3, figsize=(13.5, 4.2 * len(tasks)), squeeze=False)
    panels = (("D", "C0", "o", "data D* (env steps)"), ("C", "C1", "s", "compute C* (FLOPs)"),
              ("sigma", "C2", "^", "UTD σ*"), ("N", "C4", "D", "parameters N*"))
    for r_i, task in enumerate(tasks):
        trows = [r for r in rows if r["task"] == task and math.isfinite(_pos(r.get("F")))]
        F = np.array([_num(r["F"]) for r in trows])
        flags = np.array([_flag(r) for r in trows])
        ivF = [(r.get("intervals") or {}).get("F") or {} for r in trows]
        xerr = _yerr(F, [v.get("lo") for v in ivF], [v.get("hi") for v in ivF])
        twin = axes[r_i, 2].twinx()
        targets = [axes[r_i, 0], axes[r_i, 1], axes[r_i, 2], twin]
        handles = []
        for ax, (tg, col, mk, lab) in zip(targets, panels):
            ax.set_gid(f"{task}|{tg}")
            y = np.array([_pos(r.get(tg)) for r in trows])
            fixed = tg in ("sigma", "N") and all(tg in _fixed_axes(r) for r in trows)
            if fixed or not np.isfinite(y).any():
                if ax is twin:
                    twin.set_yticks([])
                continue
            iv = [(r.get("intervals") or {}).get(tg) or {} for r in trows]
            lo, hi = [v.get("lo") for v in iv], [v.get("hi") for v in iv]
            yerr = _yerr(y, lo, hi)
            edge = flags == "edge"
            # An optimum on the searched box's edge is not an optimum: it does not set the axis, and
            # where it falls outside it is an arrow on the border ("beyond the sweep").
            span = _log_span(y[~edge], [v for v, e in zip([*lo, *hi], [*edge, *edge]) if not e]) or \
                _log_span(y)
            h = None
            for sel, mfc in ((flags == "", col), (flags == "extrapolated", "white")):
                if sel.any():
                    e = ax.errorbar(F[sel], y[sel], xerr=xerr[:, sel], yerr=yerr[:, sel], fmt=mk, color=col,
                                    mfc=mfc, ms=5, capsize=2, lw=0.8, label=lab if h is None else None)
                    h = h or e
            for f_, v in zip(F[edge], y[edge]):
                if not math.isfinite(v):
                    continue
                if span[0] <= v <= span[1]:
                    ax.plot([f_], [v], marker=mk, ls="", color=col, mfc="white", ms=5, alpha=0.6)
                else:
                    up = v > span[1]
                    ax.plot([f_], [0.97 if up else 0.03], marker="^" if up else "v", ls="", color=col, mfc="white",
                            ms=7, transform=ax.get_xaxis_transform(), clip_on=False)
            law = next((p for p in laws_ if p.get("task") == task and p.get("target") == tg
                        and not p.get("skipped") and isinstance(p.get("params"), dict)), None)
            ln = None
            if law:
                A, s = _num(law["params"].get("A")), _num(law["params"].get("s"))
                s_iv = law["params"].get("s") or {}
                fr = [_num(v) for v in law.get("F_range") or []]
                if not fr and (~edge).any():  # older fits: the budgets of the optima it was fitted on
                    fr = [F[~edge].min(), F[~edge].max()]
                if math.isfinite(A) and math.isfinite(s) and fr and all(math.isfinite(v) for v in fr):
                    fg = np.geomspace(min(fr), max(fr), 20)
                    fitlab = f"∝ F^{s:.2f}"
                    if isinstance(s_iv, dict) and math.isfinite(_num(s_iv.get("lo"))) and \
                            math.isfinite(_num(s_iv.get("hi"))):
                        fitlab += f" [{_num(s_iv['lo']):.2f}, {_num(s_iv['hi']):.2f}]"
                    (ln,) = ax.plot(fg, A * fg ** s, color=col, lw=1.2, ls="--", label=f"fit {fitlab}", gid="fit")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_ylim(*span)
            ax.set_ylabel(lab, color=col if ax in targets[2:] else "k")
            if ax in targets[2:]:
                handles += [x for x in (h, ln) if x is not None]
            else:
                ax.legend(framealpha=0.85, fontsize=7)
                ax.set_title(f"{task}: {lab.split(' (')[0]} at the optimum")
        if (flags == "extrapolated").any():
            handles.append(Line2D([], [], color="grey", marker="o", mfc="white", ls="",
                                  label="outside the swept range (extrapolated)"))
        if (flags == "edge").any():
            handles.append(Line2D([], [], color="grey", marker="^", mfc="white", ls="",
                                  label="on the searched box's edge: beyond the sweep"))
        if handles:
            axes[r_i, 2].legend(handles=handles, framealpha=0.85, fontsize=7, loc="upper center",
                                bbox_to_anchor=(0.5, -0.2), ncol=2)
        fixed_n = [r for r in trows if "N" in _fixed_axes(r)]
        axes[r_i, 2].set_title(f"{task}: optimal σ* (N = {_fmt(_num(fixed_n[0]['N']))} fixed)"
                               if fixed_n and len(fixed_n) == len(trows) else f"{task}: optimal σ* and N*")
        for ax in axes[r_i]:
            ax.set_xlabel("budget F = C + δ·D  (FLOPs)")
            ax.set_xscale("log")
        span = _log_span(F)
        if span:
            for ax in axes[r_i]:
                ax.set_xlim(*span)
    tidy_log_axes(fig)
    fig.tight_layout()
    return fig


def plot_budget_scaling(fit: dict, out_dir: Path) -> list[str]:
    return _save(draw_budget_scaling(fit), out_dir, "budget_scaling")


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


DRAWERS = {"data_efficiency_sigma": draw_data_efficiency_sigma, "hparams_sigma": draw_hparams,
           "data_efficiency_contours": draw_contours, "pareto_frontier": draw_pareto,
           "budget_scaling": draw_budget_scaling, "extrapolation": draw_extrapolation}


def plot_all(fit: dict, out_dir: str | Path) -> list[str]:
    """Every figure the fit supports; returns the written paths (PNG and PDF)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[str] = []
    with plt.rc_context(STYLE):
        for name, draw in DRAWERS.items():
            paths += _save(draw(fit), out_dir, name)
    return paths
