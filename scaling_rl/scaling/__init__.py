"""Scaling-law analysis: curves -> D_J -> fits with bootstrap intervals -> compute-optimal allocation.

Plain numpy/scipy/scikit-learn/pandas/matplotlib; needs no JAX.

    from scaling_rl import scaling
    curves = scaling.load_results("runs/sweeps/quickstart/results.parquet", metric="eval_return")
    fit = scaling.analyze(curves, scaling.Settings(n_bootstrap=100, delta=1e10))
    scaling.write_outputs(fit, "runs/fit")                 # fit.json, report.md, figures
    scaling.recommend(fit, budget_flops=1e17)              # σ, N, B, D, C for a budget

Names are imported lazily, so `scaling-rl` (which imports `scaling_rl.scaling.cli`) starts fast.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "allocation": ["BatchModel", "budget", "compute_flops", "optimum", "optimum_numerical", "optimum_semi_analytic",
                   "optimum_sigma_only", "optimum_two_term", "pareto_frontier"],
    "analysis": ["Settings", "analyze", "fit_with_bootstrap", "recommend"],
    "curves": ["DataEfficiency", "data_efficiency", "first_crossing", "isotonic_rows"],
    "data": ["Curve", "CurveSet", "curves_from_table", "load_npy_dir", "load_results", "parse_curve_name",
             "write_npy_dir"],
    "fitting": ["aicc", "bootstrap_intervals", "fit", "fit_many", "identifiability", "interval", "make_problem",
                "prediction_band", "small_sample_inflation"],
    "laws": ["BATCH_SIZE_SIGMA", "BATCH_SIZE_SIGMA_N", "DATA_EFFICIENCY_FAMILY", "DATA_EFFICIENCY_SIGMA",
             "DATA_EFFICIENCY_SIGMA_N", "DATA_EFFICIENCY_SIGMA_ONLY", "LR_SIGMA", "Law", "power_law"],
    "report": ["load_fit", "render_report", "write_outputs"],
    "plots": ["plot_all"],
}
_WHERE = {name: mod for mod, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
