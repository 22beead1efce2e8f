"""The whole analysis: curves -> D_J -> hyper-parameter and data-efficiency fits with bootstrap
intervals -> model selection -> held-out extrapolation -> compute-optimal allocation. Returns one
JSON-able dict (the content of fit.json), from which the report and every figure are made.

Honesty rules (see DESIGN.md): one estimator (`fitting.fit_many`) for the point fit and every
replicate; replicate b is one resample of seeds used by every threshold, task, law, allocation and
budget law, and a replicate that fails anywhere in a scope (a chain of combined quantities) is dropped
from every quantity of that scope (`Replicates`); every interval
contains its estimate or is absent with a reason; a parameter the data cannot pin down is "not
identified"; optima are searched inside the swept box unless `extrapolate` > 1, and then marked.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Callable

import numpy as np

from . import fitting, laws
from .curves import DataEfficiency, data_efficiency
from .data import CurveSet
# the code lives in three modules; `analysis.<name>` still reaches every name other modules, tests and
# benchmarks use
from .allocation_fits import _allocation, _budget_laws, recommend  # noqa: F401
from .de_fits import (TERMS, _extrapolation, _fit_de_sigma, _fit_de_sigma_n, _point_fit_aicc,  # noqa: F401
                      _sigma_test, _wls_slopes)
from .lawfit import (LOF_P, Fitted, Replicates, Settings, _band, _cell_seeds, _f, _later, _points_of,  # noqa: F401
                     _weights, fit_with_bootstrap, lack_of_fit)

SCHEMA = "scaling_rl.scaling.fit/2"


def analyze(cs: CurveSet, settings: Settings | None = None, progress: Callable[[str], None] | None = None,
            capture: dict | None = None) -> dict:
    """Run the full analysis on a curve set; returns the fit.json content.

    `capture` (a dict, filled in place) receives what the JSON leaves out, for callers that reason
    about the replicates themselves (the adaptive sweep design): "de" (DataEfficiency), "reps"
    (Replicates), "laws" {(task, j): the allocation's law — kind, point and per-replicate full
    parameters, fixed axes, scope}, "optima" {(task, j): point optimum and per-replicate optima},
    "budget_laws" {(task, target): estimate, per-replicate exponent s, scope}."""
    settings = settings or Settings()
    settings.validate()
    say = progress or (lambda msg: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return _analyze(cs, settings, say, {} if capture is None else capture)


@fitting.single_threaded_blas
def _analyze(cs: CurveSet, st: Settings, say, capture: dict) -> dict:
    say("data efficiency (bootstrap over seeds)")
    de = data_efficiency(cs, st.thresholds, n_thresholds=st.n_thresholds, spacing=st.spacing,
                         normalize=st.normalize, n_bootstrap=st.n_bootstrap, seed=st.seed,
                         interpolation=st.interpolation, interp_error=st.interp_error,
                         select=st.config_select)
    table = de.group_table(st.level)
    notes = list(de.notes)
    reps = _replicates(de, st, notes)
    capture.update(de=de, reps=reps, laws={}, optima={}, budget_laws={})
    tasks = sorted(table["task"].unique())
    levels = {f: sorted(float(v) for v in set(de.configs[f]) if np.isfinite(v))
              for f in ("utd", "param_count", "batch_size", "lr")}
    by_task = {t: {f: sorted(float(v) for v in set(de.configs[f][de.configs["task"] == t]) if np.isfinite(v))
                   for f in ("utd", "param_count")} for t in tasks}
    out: dict = {
        "schema": SCHEMA, "source": cs.source, "metric": cs.metric, "tasks": tasks, "levels": levels,
        "levels_by_task": by_task,
        "settings": {**dataclasses.asdict(st), "thresholds": None if st.thresholds is None else list(st.thresholds),
                     "inflation": reps.inflation, "min_seeds": de.min_seeds, "bootstrap_mode": reps.mode},
        "thresholds": {t: v.tolist() for t, v in de.thresholds.items()},
        "normalization": {t: list(v) for t, v in de.normalization.items()},
        "configs": _config_rows(de), "notes": notes,
    }
    finalize: list[Callable[[], None]] = []
    say("optimal batch size and learning rate")
    out["hparams"], hp = _hparams(de, st, reps, finalize)
    say("data-efficiency fits")
    out["data_efficiency_sigma"], sigma_fits = _fit_de_sigma(de, st, reps, tasks, finalize)
    out["data_efficiency_sigma_n"], de_fits, out["model_selection"] = _fit_de_sigma_n(de, st, reps, tasks, notes,
                                                                                     finalize)
    if st.holdout:
        say("held-out extrapolation")
        out["extrapolation"] = _extrapolation(de, st, tasks, out["model_selection"])
    say("compute-optimal allocation")
    out["allocation"] = _allocation(de, table, st, reps, tasks, de_fits, sigma_fits, hp, out, notes, finalize,
                                    capture)
    say("intervals")
    for fn in finalize:  # every fit has registered its failures: intervals use replicates ok everywhere
        fn()
    out["points"] = _point_rows(de, table, reps)
    out["bootstrap"] = reps.summary()
    for scope, m in reps.scopes.items():
        if reps.K and (reps.K - m.sum()) > fitting.MAX_FAIL * reps.K:
            notes.append(f"{scope}: {reps.K - int(m.sum())} of {reps.K} bootstrap replicates failed in at least one of "
                         f"its fits (more than {fitting.MAX_FAIL:.0%}): no intervals there; failures by fit: "
                         + ", ".join(f"{k} {v}" for k, v in reps.failures.items() if v and k.startswith(scope)))
    return out


def _replicates(de: DataEfficiency, st: Settings, notes: list) -> Replicates:
    n = de.min_seeds
    K = int(st.n_bootstrap)
    if K == 0:
        return Replicates(0, 0, n, st.level, "no bootstrap requested (--bootstrap 0)")
    if n < 2:
        return Replicates(0, 0, n, st.level, "a single seed per configuration: no seed bootstrap")
    per_task = de.groups.groupby("task").size().min()
    dof = float(per_task * (n - 1))
    notes.append(f"intervals: seed bootstrap ({K} resamples): percentile intervals of the replicates centred on "
                 f"the estimate (median, in log); deviations scaled by sqrt(n/(n-1))·t_ν/z (n = {n} seeds; ν = the seed degrees of "
                 "freedom behind each quantity: n − 1 for one D_J point, points × (n − 1) for a law): the seed "
                 "bootstrap underestimates the variance of a mean of n seeds by (n-1)/n, and that variance is "
                 "itself estimated")
    if n < fitting.MIN_SEEDS:
        notes.append(f"only {n} seeds per configuration (fewer than {fitting.MIN_SEEDS}): a single D_J point's seed "
                     "bootstrap has too few distinct resamples to be calibrated, so D_J points get no interval; "
                     "laws pool the seeds of all their points (their coverage is tested at 3 seeds)")
    return Replicates(K, de.g_jack.shape[0], n, st.level, None, dof)


def _point_rows(de: DataEfficiency, table, reps: Replicates) -> list[dict]:
    """The table's rows (D_lo/D_hi from `DataEfficiency.point_interval`), each with its whole interval
    record (method, p_below, n_ok/n or the reason there is none)."""
    rows = _json_rows(table)
    gi = {(t, u, -1.0 if n != n else n): g for g, (t, u, n) in
          enumerate(de.groups[["task", "utd", "param_count"]].itertuples(index=False))}
    for r in rows:
        g = gi[(r["task"], r["utd"], -1.0 if r["param_count"] is None else r["param_count"])]
        iv = de.point_interval(g, int(r["j_index"]), reps.level, reason=reps.reason)
        r["D_lo"], r["D_hi"] = iv["lo"], iv["hi"]
        r["D_interval"] = {k: v for k, v in iv.items() if k != "estimate"}
    return rows


def _json_rows(df) -> list[dict]:
    rows = df.to_dict(orient="records")
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) and k not in ("D",) else v)
             for k, v in r.items()} for r in rows]


def _config_rows(de: DataEfficiency) -> list[dict]:
    rows = []
    for i, r in de.configs.iterrows():
        rows.append({"index": int(i), "task": r["task"], "utd": r["utd"], "param_count": r["param_count"],
                     "batch_size": r["batch_size"], "lr": r["lr"], "extra": r["extra"], "n_seeds": int(r["n_seeds"]),
                     "last_step": r["last_step"], "label": r["label"], "D": de.point[i].tolist()})
    return rows


def _hparams(de: DataEfficiency, st: Settings, reps: Replicates, finalize: list) -> tuple[dict, dict]:
    res: dict = {"points": []}
    handles: dict = {}
    g = de.groups
    for field, law_name, law in (("batch_size", "batch_size_sigma", laws.BATCH_SIZE_SIGMA),
                                 ("lr", "lr_sigma", laws.LR_SIGMA)):
        vals = np.unique(de.configs[field].to_numpy(float))
        vals = vals[np.isfinite(vals)]
        if len(vals) < 2:
            res[law_name] = {"skipped": f"only {len(vals)} value(s) of {field} in the sweep"}
            continue
        point, samples = de.hparam_samples(field)
        n_min = de.configs.groupby("group")["n_seeds"].min().to_numpy(float)   # one point: n − 1 seed dof
        for gi in range(len(g)):
            rec = {"field": field, "task": g["task"][gi], "utd": float(g["utd"][gi]),
                   "param_count": _f(g["param_count"][gi])}
            res["points"].append(_later(finalize, rec, lambda gi=gi, point=point, samples=samples: reps.interval(
                float(point[gi]), samples[:, gi], None, scope="hparams",
                inflation=fitting.seed_inflation(int(n_min[gi]), n_min[gi] - 1, reps.level),
                reason=None if reps.n_seeds >= fitting.MIN_SEEDS else f"fewer than {fitting.MIN_SEEDS} seeds: no "
                                                                       "interval for a single point")))
        ok = np.isfinite(point)
        if ok.sum() < 3 or len(np.unique(g["utd"][ok])) < 2:
            res[law_name] = {"skipped": f"{field}: optimum known at fewer than 3 points or one σ"}
            continue
        if np.ptp(np.log(point[ok])) < 1e-9:
            res[law_name] = {"skipped": f"the same {field} ({point[ok][0]:.3g}) wins at every (σ, N): nothing to fit"}
            continue
        x = {"utd": g["utd"].to_numpy(float)[ok]}
        try:
            fitted = fit_with_bootstrap(law, x, point[ok], samples[:, ok], st,
                                        reps, law_name, groups=g["task"].to_numpy()[ok], shared=("s",),
                                        scope="hparams")
        except ValueError as e:
            res[law_name] = {"skipped": str(e)}
            continue
        grid = {"utd": np.geomspace(min(x["utd"]), max(x["utd"]), 40)}
        tasks = fitted.problem.group_names
        res[law_name] = _later(finalize, {}, lambda fitted=fitted, field=field, grid=grid, tasks=tasks: {
            **fitted.record(), "formula": f"{'B' if field == 'batch_size' else 'η'}*(σ) = A_task·σ^s",
            "bands": {t: _band(fitted, grid, t if len(tasks) > 1 else None) for t in tasks}})
        handles[law_name] = fitted
        if field == "batch_size":
            res["batch_size_sigma_n"] = {}
            for t in tasks:
                m = ok & (g["task"].to_numpy() == t) & np.isfinite(g["param_count"].to_numpy(float))
                n_levels = len(np.unique(g["param_count"][m]))
                if m.sum() < 6 or n_levels < 2:
                    res["batch_size_sigma_n"][t] = {"skipped": "needs >= 2 model sizes and >= 6 points"}
                    continue
                xn = {"utd": g["utd"].to_numpy(float)[m], "param_count": g["param_count"].to_numpy(float)[m]}
                try:
                    fn = fit_with_bootstrap(laws.BATCH_SIZE_SIGMA_N, xn, point[m],
                                            samples[:, m], st, reps,
                                            f"batch_size_sigma_n/{t}", scope="hparams")
                except ValueError as e:
                    res["batch_size_sigma_n"][t] = {"skipped": str(e)}
                    continue
                res["batch_size_sigma_n"][t] = _later(finalize, {}, fn.record)
                handles[f"batch_size_sigma_n/{t}"] = fn
    return res, handles

