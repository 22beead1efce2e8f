"""The house style of the fit figures and what every figure module shares: style constants, log-axis
tidying, saving (PNG + PDF), defensive readers of fit.json (a missing or null value reads as NaN or an
empty list, never an error), log-axis limits set by the data, fitted curves with their bands, threshold
legends.

The figures themselves live in `plots_fits` (fitted laws against their data) and `plots_allocation`
(compute-optimal allocation); `plots` draws them all.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullFormatter  # noqa: E402

from ..io import atomic_savefig  # noqa: E402

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


def legend_right(fig, handles):
    """The figure's shared legend to the right of its panels, log axes tidied, laid out: `fig`."""
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    tidy_log_axes(fig)
    fig.tight_layout()
    return fig
