"""Figures from a fit.json dict alone (so `scaling-rl plot` can redraw them): PNG + PDF, log axes,
legends, intervals drawn.

Every figure survives real data: panels are laid out per task over that task's own model sizes (no
empty panels when tasks have different parameter counts), fitted curves are drawn over the measured
range (dashed up to `settings.extrapolate` beyond it, never further), axis limits are set by the data
(not by a fit or an interval that runs off), thresholds are labelled per task unless every task shares
them, and anything fit.json lacks (an interval, a fit, a skipped law) is left out instead of failing.
Lines that show a fit carry the gid "fit" (measured range) or "fit-extrapolated".

This module is the figure list (`DRAWERS`) and `plot_all`; the figures live in `plots_fits` (D_J(σ),
B*/η*(σ), the held-out extrapolation check) and `plots_allocation` (contours and near-optimal regions,
Pareto frontier, budget scaling), on the house style and fit.json readers of `plots_common`. Every
name they export is importable from here too.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

from .plots_allocation import REGION_STYLES, draw_budget_scaling, draw_contours, draw_pareto  # noqa: F401
from .plots_allocation import plot_budget_scaling, plot_contours, plot_pareto  # noqa: F401
from .plots_common import CAP, MARKERS, MAX_SIZES, STYLE, TASK_COLORS, _legend_texts, _save, tidy_log_axes  # noqa: F401
from .plots_fits import draw_data_efficiency_sigma, draw_extrapolation, draw_hparams  # noqa: F401
from .plots_fits import plot_data_efficiency_sigma, plot_extrapolation, plot_hparams  # noqa: F401

DRAWERS = {"data_efficiency_sigma": draw_data_efficiency_sigma, "hparams_sigma": draw_hparams,
           "data_efficiency_contours": draw_contours, "pareto_frontier": draw_pareto,
           "budget_scaling": draw_budget_scaling, "extrapolation": draw_extrapolation}


def plot_all(fit: dict, out_dir: str | Path) -> list[str]:
    """Every figure the fit supports; returns the written paths (PNG and PDF)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[str] = []
    with matplotlib.rc_context(STYLE):  # (what pyplot.rc_context calls)
        for name, draw in DRAWERS.items():
            paths += _save(draw(fit), out_dir, name)
    return paths
