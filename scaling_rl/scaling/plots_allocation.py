"""Figures of the compute-optimal allocation: iso-D_J contours over (σ, N) with the optima, the
compute-optimal path and the near-optimal regions; the data–compute Pareto frontier; and the optima's
scaling with the budget F (D*, C*, σ*, N* with their power laws).
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
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

from . import allocation as alloc  # noqa: E402
from .fitting import single_threaded_blas  # noqa: E402
from .plots_common import (  # noqa: E402
    _extrapolate, _fmt, _j_colors, _j_text, _level_ticks, _log_span, _n_thresholds, _num, _points, _pos,
    _save, _task_levels, _yerr, legend_right, tidy_log_axes)


# ---- compute-optimal allocation ----------------------------------------------------------------

def _flag(row: dict) -> str:
    """'edge' (optimum on the searched box's edge), 'extrapolated' (outside the swept range) or ''."""
    if row.get("edge") or row.get("at_bound"):
        return "edge"
    ex = row.get("extrapolated")
    if isinstance(ex, dict):
        ex = any(ex.values())
    return "extrapolated" if ex else ""


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
        shown = [r for r in trows
                 if _in_box(_num(r.get("sigma")), *box[0], K) and _in_box(_num(r.get("N")), *box[1], K)]
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
            ax.errorbar([_num(r["sigma"])], [_num(r["N"])],
                        xerr=_yerr([r["sigma"]], [s_iv.get("lo")], [s_iv.get("hi")]),
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
                           label="optimum, " + _j_text(fit, task, j))
                    for j in sorted({r.get("j_index", 0) for r in trows})]
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
               Line2D([], [], color="grey", marker="*", ms=11, mfc="white", ls="",
                      label="optimum extrapolated / on edge")]
    if K > 1:
        handles.append(Line2D([], [], color="grey", ls="--", label=f"frontier beyond the sweep (≤ ×{K:g})"))
    return legend_right(fig, handles)


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
