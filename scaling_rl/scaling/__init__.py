"""Scaling-law analysis: curves -> D_J -> fits with bootstrap intervals -> compute-optimal allocation.

Plain numpy/scipy/scikit-learn/pandas/matplotlib; needs no JAX.

    from scaling_rl import scaling
    curves = scaling.load_results("runs/sweep/results.parquet", metric="eval_return")
    fit = scaling.analyze(curves, scaling.Settings(n_bootstrap=100, delta=1e10))
    scaling.write_outputs(fit, "runs/fit")                 # fit.json, report.md, figures
    scaling.recommend(fit, budget_flops=1e17)              # σ, N, B, D, C for a budget
"""
from .allocation import (BatchModel, budget, compute_flops, optimum, optimum_numerical, optimum_semi_analytic,
                         optimum_sigma_only, optimum_two_term, pareto_frontier)
from .analysis import Settings, analyze, fit_with_bootstrap, recommend
from .curves import DataEfficiency, data_efficiency, first_crossing, isotonic_rows
from .data import Curve, CurveSet, curves_from_table, load_npy_dir, load_results, parse_curve_name, write_npy_dir
from .fitting import (bootstrap_intervals, fit, make_problem, prediction_band, refit_batched, refit_sequential,
                      small_sample_inflation)
from .laws import (BATCH_SIZE_SIGMA, BATCH_SIZE_SIGMA_N, DATA_EFFICIENCY_SIGMA, DATA_EFFICIENCY_SIGMA_N, LR_SIGMA,
                   Law, power_law)
from .report import load_fit, render_report, write_outputs

__all__ = [
    "BatchModel", "budget", "compute_flops", "optimum", "optimum_numerical", "optimum_semi_analytic",
    "optimum_sigma_only", "optimum_two_term", "pareto_frontier", "Settings", "analyze", "fit_with_bootstrap",
    "recommend", "DataEfficiency", "data_efficiency", "first_crossing", "isotonic_rows", "Curve", "CurveSet",
    "curves_from_table", "load_npy_dir", "load_results", "parse_curve_name", "write_npy_dir", "bootstrap_intervals",
    "fit", "make_problem", "prediction_band", "refit_batched", "refit_sequential", "small_sample_inflation",
    "BATCH_SIZE_SIGMA", "BATCH_SIZE_SIGMA_N", "DATA_EFFICIENCY_SIGMA", "DATA_EFFICIENCY_SIGMA_N", "LR_SIGMA", "Law",
    "power_law", "load_fit", "render_report", "write_outputs",
]
