"""Figures of an adaptive scaling study (`sweep.adaptive`), drawn from its `state.json` alone.

* `plot_rounds`: where the trials went — per task a σ × N panel (log axes), every proposal a marker
  coloured by its round; repeated proposals of one cell (replicates) are fanned out around the cell and
  counted ("×k"); optional candidates not proposed yet are drawn as light grey crosses.
* `plot_widths`: the interval width of each target quantity vs the compute spent after each round,
  with the tolerance; a quantity without an interval (infinite width / None) is a marker on the top
  edge labelled "no interval".
* `plot_comparison`: adaptive vs grid designs — width vs compute per frontier exponent, one colour per
  design (several repetitions per design allowed).
* `write_figures`: `<out_dir>/adaptive/rounds.png` and `widths.png`.

Every function tolerates partial state (no rounds, a running round without "fit", None / NaN values)
and draws what there is. Figures are written atomically and closed; `return_fig=True` hands the saved
figure back instead of closing it (the caller closes it). Artists carry gids the tests inspect:
"round <r>" (proposal markers), "count" (×k labels), "candidates", "width <name>" (a quantity's
finite widths), "no-interval" (top-edge markers), "tolerance", "design <name>".
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import BoundaryNorm, ListedColormap  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

from ..io import atomic_savefig  # noqa: E402
from ..scaling.plots_common import MARKERS, STYLE, tidy_log_axes  # noqa: E402  (one house style)

COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]
MAX_LEGEND_ROUNDS = 10   # more rounds than this: a discrete colorbar instead of a legend
TOP = 0.94               # axes fraction where "no interval" markers sit
DPI = 150


# ---- reading the state defensively ---------------------------------------------------------------
def _num(v: Any) -> float:
    """A float; NaN for None / bools / non-numbers."""
    try:
        return float("nan") if v is None or isinstance(v, bool) else float(v)
    except (TypeError, ValueError):
        return float("nan")


def _pos(v: Any) -> float:
    x = _num(v)
    return x if math.isfinite(x) and x > 0 else float("nan")


def _rounds(state: dict | None) -> list[dict]:
    rounds = (state or {}).get("rounds") or []
    return [r for r in rounds if isinstance(r, dict)]


def _round_no(rnd: dict, i: int) -> int:
    r = _num(rnd.get("round"))
    return int(r) if math.isfinite(r) else i


def _proposals(state: dict | None) -> list[dict]:
    """Every proposal as {round, task, sigma, N, replicate, n_trials}, in order (invalid σ/N: NaN)."""
    out = []
    for i, rnd in enumerate(_rounds(state)):
        for p in rnd.get("proposals") or []:
            if not isinstance(p, dict):
                continue
            rep = _num(p.get("replicate"))
            trials = p.get("trials")
            out.append({"round": _round_no(rnd, i), "task": str(p.get("task", "task")), "sigma": _pos(p.get("sigma")),
                        "N": _pos(p.get("N")), "replicate": int(rep) if math.isfinite(rep) else 0,
                        "n_trials": len(trials) if isinstance(trials, (list, tuple)) else 1})
    return out


def _candidate_keys(candidates: Iterable | None) -> list[tuple[str, float, float]]:
    """(task, σ, N) of each candidate: tuples / lists, mappings with task/sigma/N, or objects with `.key`."""
    out = []
    for c in candidates or []:
        if hasattr(c, "key"):
            c = c.key
        if isinstance(c, dict):
            c = (c.get("task"), c.get("sigma"), c.get("N"))
        try:
            task, s, n = c
        except (TypeError, ValueError):
            continue
        s, n = _pos(s), _pos(n)
        if math.isfinite(s) and math.isfinite(n):
            out.append((str(task), s, n))
    return list(dict.fromkeys(out))


def _quantity_label(name: str) -> str:
    return name.replace("sigma*", "σ*").replace(":", ": ", 1)


def _tolerance(state: dict | None, tolerance) -> float:
    if tolerance is None:
        tolerance = ((state or {}).get("design") or {}).get("tolerance")
    return _pos(tolerance)


# ---- axes helpers --------------------------------------------------------------------------------
def _log_span(values, margin: float = 0.08) -> tuple[float, float] | None:
    """(lo, hi) of a log axis over the positive finite values with a margin (at least a factor 1.5 wide)."""
    v = np.array([_num(x) for x in values], float)
    v = v[np.isfinite(v) & (v > 0)]
    if not v.size:
        return None
    llo, lhi = math.log(v.min()), math.log(v.max())
    w = max(lhi - llo, math.log(1.5))
    mid = (llo + lhi) / 2
    llo, lhi = min(llo, mid - w / 2), max(lhi, mid + w / 2)
    return math.exp(llo - margin * w), math.exp(lhi + margin * w)


def _level_ticks(axis, levels) -> None:
    """Major ticks at the sweep's own levels (when few), labelled plainly; no minor labels."""
    lv = sorted({v for v in (_pos(x) for x in levels) if math.isfinite(v)})
    axis.set_minor_formatter(NullFormatter())
    if 1 <= len(lv) <= 8:
        axis.set_major_locator(FixedLocator(lv))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))


def _min_log_step(levels) -> float:
    """The smallest spacing of the levels in log10 units (0.3 for fewer than two levels)."""
    lv = np.unique(np.log10([v for v in levels if math.isfinite(v) and v > 0]))
    return float(np.min(np.diff(lv))) if lv.size >= 2 else 0.3


def _round_colors(rounds: Sequence[int]) -> dict[int, tuple]:
    """One distinct colour per round: tab10 for up to 10 rounds, viridis sampled beyond."""
    rounds = sorted(set(rounds))
    if len(rounds) <= 10:
        cmap = plt.get_cmap("tab10")
        return {r: cmap(i) for i, r in enumerate(rounds)}
    cmap = plt.get_cmap("viridis")
    return {r: cmap(i / max(len(rounds) - 1, 1)) for i, r in enumerate(rounds)}


def _save(fig, path, return_fig: bool):
    """Write `fig` atomically to `path`; close it unless it is handed back."""
    try:
        atomic_savefig(fig, path, dpi=DPI, bbox_inches="tight")
    except BaseException:
        plt.close(fig)
        raise
    if return_fig:
        return fig
    plt.close(fig)
    return Path(path)


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="grey", gid="empty")
    ax.set_xticks([])
    ax.set_yticks([])


# ---- where the trials went -----------------------------------------------------------------------
def _fan(m: int, rx: float, ry: float) -> list[tuple[float, float]]:
    """Offsets (log10 units) of m markers at one cell: the first at the centre, the rest on a ring."""
    if m <= 1:
        return [(0.0, 0.0)] * m
    out = [(0.0, 0.0)]
    for k in range(m - 1):
        a = math.pi / 4 + 2 * math.pi * k / (m - 1)
        out.append((rx * math.cos(a), ry * math.sin(a)))
    return out


def draw_rounds(state: dict | None, *, candidates=None):
    """The figure of `plot_rounds` (not saved, not closed)."""
    props = _proposals(state)
    rounds_all = sorted({_round_no(r, i) for i, r in enumerate(_rounds(state))})
    cands = _candidate_keys(candidates)
    ok = [p for p in props if math.isfinite(p["sigma"]) and math.isfinite(p["N"])]
    tasks = sorted({p["task"] for p in ok} | {c[0] for c in cands})
    ncols = min(3, max(len(tasks), 1))
    nrows = max(math.ceil(len(tasks) / ncols), 1)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.4 * ncols + 1.6, 3.8 * nrows), squeeze=False)
    flat = list(axes.ravel())
    for ax in flat[max(len(tasks), 1):]:
        fig.delaxes(ax)
    colors = _round_colors(rounds_all or [0])
    if not tasks:
        _empty(flat[0], "no proposals yet")
    for ax, task in zip(flat, tasks):
        mine = [p for p in ok if p["task"] == task]
        proposed = {(p["sigma"], p["N"]) for p in mine}
        tc = [c for c in cands if c[0] == task]
        sig = [p["sigma"] for p in mine] + [c[1] for c in tc]
        ns = [p["N"] for p in mine] + [c[2] for c in tc]
        rx, ry = 0.16 * _min_log_step(sig), 0.16 * _min_log_step(ns)
        unexplored = [c for c in tc if (c[1], c[2]) not in proposed]
        if unexplored:
            ax.scatter([c[1] for c in unexplored], [c[2] for c in unexplored], marker="x", s=30, color="0.75",
                       lw=1, zorder=1, gid="candidates", label="unexplored candidate")
        by_cell: dict[tuple, list[dict]] = {}
        for p in mine:
            by_cell.setdefault((p["sigma"], p["N"]), []).append(p)
        xy: dict[int, list[tuple[float, float]]] = {}
        for (s, n), ps in by_cell.items():
            ps = sorted(ps, key=lambda p: (p["round"], p["replicate"]))
            for p, (dx, dy) in zip(ps, _fan(len(ps), rx, ry)):
                xy.setdefault(p["round"], []).append((s * 10 ** dx, n * 10 ** dy))
            if len(ps) > 1:
                ax.annotate(f"×{len(ps)}", (s, n), xytext=(9, 7), textcoords="offset points", fontsize=7,
                            color="0.2", gid="count", zorder=4)
        for r in sorted(xy):
            pts = np.array(xy[r])
            ax.scatter(pts[:, 0], pts[:, 1], s=34, color=colors[r], edgecolors="black", linewidths=0.5,
                       zorder=3, gid=f"round {r}", label=f"round {r}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis, vals, rad in ((ax.xaxis, sig, rx), (ax.yaxis, ns, ry)):
            span = _log_span([v * 10 ** (k * rad * 2.5) for v in vals for k in (-1, 1)], margin=0.05)
            if span:
                (ax.set_xlim if axis is ax.xaxis else ax.set_ylim)(*span)
            _level_ticks(axis, vals)
        n_trials = sum(p["n_trials"] for p in mine)
        ax.set_title(f"{task}: {n_trials} trial{'s' * (n_trials != 1)} in {len(by_cell)} cell"
                     f"{'s' * (len(by_cell) != 1)}", fontsize=10)
        ax.set_xlabel("UTD ratio σ")
        ax.set_ylabel("parameters N")
    legend_rounds = [r for r in rounds_all if any(p["round"] == r for p in ok)]
    extra = [Line2D([], [], marker="x", ls="", color="0.75", label="unexplored candidate")] if cands else []
    if len(rounds_all) <= MAX_LEGEND_ROUNDS:
        handles = [Line2D([], [], marker="o", ls="", mfc=colors[r], mec="black", mew=0.5, label=f"round {r}")
                   for r in legend_rounds] + extra
        if handles:
            fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False,
                       title="proposed in")
    else:   # many rounds: a discrete colorbar
        cmap = ListedColormap([colors[r] for r in rounds_all])
        bounds = np.arange(len(rounds_all) + 1) - 0.5
        sm = plt.cm.ScalarMappable(cmap=cmap, norm=BoundaryNorm(bounds, cmap.N))
        cb = fig.colorbar(sm, ax=flat[:max(len(tasks), 1)], fraction=0.04, pad=0.02)
        step = max(1, math.ceil(len(rounds_all) / 12))
        cb.set_ticks(list(range(0, len(rounds_all), step)))
        cb.set_ticklabels([str(rounds_all[i]) for i in range(0, len(rounds_all), step)])
        cb.set_label("round")
        if extra:
            fig.legend(handles=extra, loc="upper center", bbox_to_anchor=(0.5, 0.0), frameon=False)
    n_trials = sum(p["n_trials"] for p in props)
    n_bad = len(props) - len(ok)
    title = (f"Adaptive design: {n_trials} trial{'s' * (n_trials != 1)} over {len(rounds_all)} "
             f"round{'s' * (len(rounds_all) != 1)}")
    if n_bad:
        title += f" ({n_bad} proposal{'s' * (n_bad != 1)} without σ/N not drawn)"
    fig.suptitle(title, y=1.0)
    tidy_log_axes(fig)
    if len(rounds_all) <= MAX_LEGEND_ROUNDS:
        fig.tight_layout()
    return fig


def plot_rounds(state: dict | None, path, *, candidates=None, return_fig: bool = False):
    """Where the trials went over the rounds, written to `path` (PNG); returns the path (or the figure,
    saved but left open, with return_fig=True)."""
    with plt.rc_context(STYLE):
        fig = draw_rounds(state, candidates=candidates)
        return _save(fig, path, return_fig)


# ---- interval widths vs compute ------------------------------------------------------------------
def _width(v: Any) -> float:
    """A width entry ({"width": ...} or a number) as a float; inf where there is no interval."""
    if isinstance(v, dict):
        v = v.get("width")
    x = _num(v)
    return x if math.isfinite(x) and x >= 0 else math.inf


def _width_series(state: dict | None) -> tuple[list[str], list[dict]]:
    """(quantity names in first-seen order, one row per fitted round {round, flops, widths{name: w}})."""
    names: list[str] = []
    rows = []
    for i, rnd in enumerate(_rounds(state)):
        fit = rnd.get("fit")
        if not isinstance(fit, dict):
            continue
        widths = fit.get("widths") if isinstance(fit.get("widths"), dict) else {}
        for k in widths:
            if k not in names:
                names.append(k)
        rows.append({"round": _round_no(rnd, i), "flops": _pos(fit.get("flops")),
                     "widths": {k: _width(v) for k, v in widths.items()}})
    return names, rows


def _width_axis(ax, finite: list[float], tol: float) -> None:
    """y axis for widths: log when everything is positive; the top ~15% left free for the top-edge
    'no interval' markers."""
    vals = [v for v in finite if math.isfinite(v)] + ([tol] if math.isfinite(tol) else [])
    if vals and min(vals) > 0:
        ax.set_yscale("log")
        lo, hi = min(vals), max(vals)
        llo, lhi = math.log(lo), math.log(hi)
        w = max(lhi - llo, math.log(2.0))
        ax.set_ylim(math.exp(llo - 0.1 * w), math.exp(lhi + 0.3 * w))
        ax.yaxis.set_minor_formatter(NullFormatter())
    elif vals:
        hi = max(max(vals), 1e-12)
        ax.set_ylim(0, 1.3 * hi)
    else:
        ax.set_ylim(0, 1)


def _x_axis(ax, xs: list[float]) -> None:
    ax.set_xscale("log")
    span = _log_span(xs)
    if span:
        ax.set_xlim(*span)
    ax.xaxis.set_minor_formatter(NullFormatter())


def _no_interval(ax, xs, color, marker, *, gid: str = "no-interval", label: bool = True) -> None:
    """Open markers on the top edge (x in data, y in axes units) for widths without an interval."""
    if not xs:
        return
    tr = blended_transform_factory(ax.transData, ax.transAxes)
    ax.scatter(xs, [TOP] * len(xs), transform=tr, marker=marker, s=46, facecolors="none", edgecolors=color,
               linewidths=1.3, zorder=4, gid=gid, clip_on=False)
    if label:
        ax.text(xs[0], TOP - 0.045, "no interval", transform=tr, ha="center", va="top", fontsize=7, color=color,
                gid="no-interval-label")


def _tolerance_line(ax, tol: float) -> list:
    if not math.isfinite(tol):
        return []
    ax.axhline(tol, color="0.3", ls="--", lw=1, zorder=1, gid="tolerance")
    return [Line2D([], [], color="0.3", ls="--", lw=1, label=f"tolerance {tol:.3g}")]


def draw_widths(state: dict | None, tolerance=None):
    """The figure of `plot_widths` (not saved, not closed)."""
    tol = _tolerance(state, tolerance)
    names, rows = _width_series(state)
    rows = [r for r in rows if math.isfinite(r["flops"])]
    fig, ax = plt.subplots(figsize=(7.0, 4.4))
    if not rows or not names:
        _empty(ax, "no fitted round yet")
        ax.set_title("Interval width vs compute")
        fig.tight_layout()
        return fig
    xs = [r["flops"] for r in rows]
    finite = [w for r in rows for w in r["widths"].values() if math.isfinite(w)]
    _x_axis(ax, xs)
    _width_axis(ax, finite, tol)
    log_y = ax.get_yscale() == "log"
    handles = []
    for qi, name in enumerate(names):
        color, marker = COLORS[qi % len(COLORS)], MARKERS[qi % len(MARKERS)]
        pts = [(r["flops"], r["widths"].get(name, math.inf)) for r in rows]
        fin = [(x, w) for x, w in pts if math.isfinite(w) and (w > 0 or not log_y)]
        if fin:
            ax.plot([x for x, _ in fin], [w for _, w in fin], color=color, marker=marker, ms=6, lw=1.5, zorder=3,
                    gid=f"width {name}")
        _no_interval(ax, [x for x, w in pts if not math.isfinite(w)], color, marker)
        handles.append(Line2D([], [], color=color, marker=marker, label=_quantity_label(name)))
    tr = blended_transform_factory(ax.transData, ax.transAxes)
    last = -math.inf
    for r in rows:   # round numbers along the bottom edge (skipped where they would collide)
        lx = math.log10(r["flops"])
        lo, hi = (math.log10(v) for v in ax.get_xlim())
        if (lx - last) / max(hi - lo, 1e-12) >= 0.04:
            ax.text(r["flops"], 0.02, f"r{r['round']}", transform=tr, ha="center", va="bottom", fontsize=7,
                    color="0.35", gid="round-label")
            last = lx
    handles += _tolerance_line(ax, tol)
    if any(not math.isfinite(w) for r in rows for w in r["widths"].values()):
        handles.append(Line2D([], [], marker="o", ls="", mfc="none", mec="0.3", label="no interval (top edge)"))
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False)
    ax.set_xlabel("compute spent F (FLOPs)")
    ax.set_ylabel("interval width")
    decision = next((r.get("decision") for r in reversed(_rounds(state)) if r.get("decision")), None)
    ax.set_title(f"Interval width vs compute ({len(rows)} fitted round{'s' * (len(rows) != 1)}"
                 + (f"; {decision}" if decision else "") + ")")
    tidy_log_axes(fig)
    fig.tight_layout()
    return fig


def plot_widths(state: dict | None, path, tolerance=None, *, return_fig: bool = False):
    """Interval width of each target quantity vs the FLOPs spent after each round, written to `path`;
    `tolerance` defaults to the state's design tolerance."""
    with plt.rc_context(STYLE):
        fig = draw_widths(state, tolerance)
        return _save(fig, path, return_fig)


# ---- adaptive vs grid ----------------------------------------------------------------------------
QUANTITIES = (("sigma", "σ*(F) exponent"), ("N", "N*(F) exponent"))


def draw_comparison(rows: Sequence[dict], tolerance=None):
    """The figure of `plot_comparison` (not saved, not closed)."""
    tol = _pos(tolerance)
    rows = [r for r in rows or [] if isinstance(r, dict)]
    designs = list(dict.fromkeys(str(r.get("design", "?")) for r in rows))
    color = {d: COLORS[i % len(COLORS)] for i, d in enumerate(designs)}
    marker = {d: MARKERS[i % len(MARKERS)] for i, d in enumerate(designs)}
    fig, axes = plt.subplots(1, 2, figsize=(11.0, 4.3), squeeze=False)
    ok = [r for r in rows if math.isfinite(_pos(r.get("flops")))]
    any_none = False
    for ax, (key, label) in zip(axes[0], QUANTITIES):
        if not ok:
            _empty(ax, "no runs")
            ax.set_title(label)
            continue
        widths = {id(r): _width((r.get("widths") or {}).get(key)) for r in ok}
        _x_axis(ax, [_pos(r["flops"]) for r in ok])
        _width_axis(ax, [w for w in widths.values() if math.isfinite(w)], tol)
        log_y = ax.get_yscale() == "log"
        for d in designs:
            mine = [r for r in ok if str(r.get("design", "?")) == d]
            fin = [(_pos(r["flops"]), widths[id(r)]) for r in mine
                   if math.isfinite(widths[id(r)]) and (widths[id(r)] > 0 or not log_y)]
            if fin:
                ax.scatter([x for x, _ in fin], [w for _, w in fin], s=40, color=color[d], marker=marker[d],
                           edgecolors="black", linewidths=0.4, alpha=0.85, zorder=3, gid=f"design {d}")
            none = [_pos(r["flops"]) for r in mine if not math.isfinite(widths[id(r)])]
            any_none = any_none or bool(none)
            _no_interval(ax, none, color[d], marker[d], label=False)
        _tolerance_line(ax, tol)
        ax.set_title(label)
        ax.set_xlabel("compute F (FLOPs)")
        ax.set_ylabel("interval width")
    handles = [Line2D([], [], marker=marker[d], ls="", color=color[d], mec="black", mew=0.4,
                      label=f"{d} (n={sum(str(r.get('design', '?')) == d for r in ok)})") for d in designs]
    if math.isfinite(tol):
        handles.append(Line2D([], [], color="0.3", ls="--", lw=1, label=f"tolerance {tol:.3g}"))
    if any_none:
        handles.append(Line2D([], [], marker="o", ls="", mfc="none", mec="0.3", label="no interval (top edge)"))
    if handles:
        fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False, title="design")
    fig.suptitle("Adaptive vs grid: interval width vs compute", y=1.0)
    tidy_log_axes(fig)
    fig.tight_layout()
    return fig


def plot_comparison(rows: Sequence[dict], path, tolerance=None, *, return_fig: bool = False):
    """Width vs compute per frontier exponent for several designs, written to `path`. `rows`: dicts
    {"design": str, "flops": float, "widths": {"sigma": float|None, "N": float|None}}."""
    with plt.rc_context(STYLE):
        fig = draw_comparison(rows, tolerance)
        return _save(fig, path, return_fig)


# ---- the study's figures -------------------------------------------------------------------------
def write_figures(out_dir, state: dict | None = None, candidates=None) -> list[Path]:
    """`<out_dir>/adaptive/rounds.png` and `widths.png` from `state` (read from
    `<out_dir>/adaptive/state.json` when None; an absent file is an empty study). Returns the paths."""
    folder = Path(out_dir) / "adaptive"
    if state is None:
        p = folder / "state.json"
        state = json.loads(p.read_text()) if p.exists() else {"rounds": []}
    return [plot_rounds(state, folder / "rounds.png", candidates=candidates),
            plot_widths(state, folder / "widths.png")]
