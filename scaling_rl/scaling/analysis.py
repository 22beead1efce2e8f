"""The whole analysis: curves -> D_J -> hyper-parameter and data-efficiency fits with bootstrap
intervals -> held-out extrapolation -> compute-optimal allocation. Returns one JSON-able dict (the
content of fit.json), from which the report and every figure are made.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Callable, Sequence

import numpy as np

from . import allocation as alloc
from . import fitting, laws
from .curves import DataEfficiency, data_efficiency
from .data import CurveSet

SCHEMA = "scaling_rl.scaling.fit/1"


@dataclasses.dataclass
class Settings:
    """Analysis options (all recorded in fit.json)."""

    thresholds: Sequence[float] | None = None   # in normalised units; default: chosen per task
    n_thresholds: int = 5
    spacing: str = "linear"                     # "linear" | "log"
    interpolation: str = "log"                  # D_J between log points: "log" (env-step) | "linear"
    normalize: str = "task"                     # "task" | "none"
    n_bootstrap: int = 100
    level: float = 0.9
    loss: str = "squared"                       # "squared" | "huber"
    huber_delta: float = 0.1                    # in log units
    share_exponents: bool = False               # one α (and β) for all tasks
    delta: float | None = None                  # FLOPs per env step; None: median FLOPs per env step of the sweep
    batch_model: str = "auto"                   # "auto" | "constant" | "power" | "sigma_n"
    max_starts: int = 8
    holdout: bool = True
    seed: int = 0

    def validate(self) -> None:
        if self.loss not in fitting.LOSSES:
            raise ValueError(f"loss: {self.loss!r} is unknown; use one of {fitting.LOSSES}")
        if not 0 < self.level < 1:
            raise ValueError(f"level: {self.level} must be in (0, 1), e.g. 0.9")
        if self.n_bootstrap < 0:
            raise ValueError(f"n_bootstrap: {self.n_bootstrap} must be >= 0")
        if self.delta is not None and not self.delta > 0:
            raise ValueError(f"delta: {self.delta} must be > 0 (FLOPs per env step)")
        if self.batch_model not in ("auto", "constant", "power", "sigma_n"):
            raise ValueError(f"batch_model: {self.batch_model!r} is unknown; use auto, constant, power or sigma_n")
        if self.interpolation not in ("log", "linear"):
            raise ValueError(f"interpolation: {self.interpolation!r} is unknown; use 'log' or 'linear'")
        if self.n_thresholds < 1:
            raise ValueError(f"n_thresholds: {self.n_thresholds} must be >= 1")


# ---- a fitted law with its bootstrap ------------------------------------------------------------

@dataclasses.dataclass
class Fitted:
    problem: fitting.Problem
    fit: fitting.Fit
    U: np.ndarray               # (K, P) bootstrap refits (NaN rows failed)
    inflation: float
    level: float

    def intervals(self) -> dict:
        return fitting.bootstrap_intervals(self.problem, self.fit.u, self.U, self.level, self.inflation)

    def columns(self, group: str | None) -> list[int]:
        p = self.problem
        return [p.labels.index(n if n in p.labels else f"{n}[{group}]") for n in p.law.params]

    def params(self, group: str | None = None) -> dict[str, float]:
        nat = self.problem.natural(self.fit.u)
        return {n: float(nat[c]) for n, c in zip(self.problem.law.params, self.columns(group))}

    def samples(self, group: str | None = None) -> list[dict[str, float]]:
        """Bootstrap parameter sets, deviations from the estimate scaled by the inflation factor."""
        if not np.isfinite(self.inflation):
            return []
        cols = self.columns(group)
        ok = np.all(np.isfinite(self.U), axis=1)
        Us = self.fit.u + self.inflation * (self.U[ok] - self.fit.u)
        nat = self.problem.natural(Us)
        return [{n: float(row[c]) for n, c in zip(self.problem.law.params, cols)} for row in nat]

    def record(self, group: str | None = None, **extra) -> dict:
        iv = self.intervals()
        p = self.problem
        if group is None:
            params = iv
            m = np.ones(p.n_obs, bool)
        else:
            params = {n: iv[p.labels[c]] for n, c in zip(p.law.params, self.columns(group))}
            m = p.groups == p.group_names.index(group)
        x = {k: v[m].tolist() for k, v in p.x.items()}
        return {"law": p.law.name, "formula": p.law.formula, "params": params, "r2_log": self.fit.r2,
                "objective": self.fit.objective, "converged": self.fit.converged, "n_points": int(m.sum()),
                "n_starts": self.fit.n_starts, "shared": sorted(p.shared) if len(p.group_names) > 1 else [],
                "n_bootstrap_ok": int(np.all(np.isfinite(self.U), axis=1).sum()),
                "inputs": x, "residuals_log": self.fit.residuals[m].tolist(),
                "at_bound": [p.labels[j] for j in range(p.n_params)
                             if np.isclose(self.fit.u[j], p.lo[j]) or np.isclose(self.fit.u[j], p.hi[j])],
                **extra}


def fit_with_bootstrap(law: laws.Law, x: dict, y: np.ndarray, Y: np.ndarray | None, settings: Settings,
                       inflation: float, groups=None, shared=()) -> Fitted:
    """Point fit on y (natural units, > 0); refit every bootstrap row of Y (K, n), NaN/inf = missing."""
    ly = np.log(y)
    prob = fitting.make_problem(law, x, ly, groups, shared)
    f = fitting.fit(prob, ly, loss=settings.loss, huber_delta=settings.huber_delta, max_starts=settings.max_starts)
    if Y is None or len(Y) == 0:
        U = np.full((0, prob.n_params), np.nan)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            LY = np.log(Y)
        W = np.isfinite(LY).astype(float)
        U, _, ok = fitting.refit_batched(prob, f.u, np.where(W > 0, LY, 0.0), W, loss=settings.loss,
                                         huber_delta=settings.huber_delta)
        U[~ok] = np.nan
    return Fitted(prob, f, U, inflation, settings.level)


def _band(fitted: Fitted, x: dict, group: str | None) -> dict:
    gi = None if group is None else np.full(len(next(iter(x.values()))), fitted.problem.group_names.index(group))
    est, lo, hi = fitting.prediction_band(fitted.problem, fitted.fit.u, fitted.U, x, gi, fitted.level,
                                          fitted.inflation)
    return {**{k: np.asarray(v).tolist() for k, v in x.items()}, "estimate": est.tolist(), "lo": lo.tolist(),
            "hi": hi.tolist()}


def _interval(samples: np.ndarray, est: float, level: float, inflation: float) -> dict:
    """Percentile interval of positive quantities in log space around `est` (inflated deviations)."""
    s = np.asarray(samples, float)
    s = s[np.isfinite(s) & (s > 0)]
    if s.size < 2 or not np.isfinite(inflation) or not est > 0:
        return {"estimate": est, "lo": float("nan"), "hi": float("nan")}
    ls = math.log(est) + inflation * (np.log(s) - math.log(est))
    lo, hi = np.exp(np.quantile(ls, [(1 - level) / 2, (1 + level) / 2]))
    return {"estimate": est, "lo": float(lo), "hi": float(hi)}


# ---- the pipeline -------------------------------------------------------------------------------

def analyze(cs: CurveSet, settings: Settings | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """Run the full analysis on a curve set; returns the fit.json content."""
    settings = settings or Settings()
    settings.validate()
    say = progress or (lambda msg: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return _analyze(cs, settings, say)


@fitting.single_threaded_blas
def _analyze(cs: CurveSet, st: Settings, say) -> dict:
    say("data efficiency (bootstrap over seeds)")
    de = data_efficiency(cs, st.thresholds, n_thresholds=st.n_thresholds, spacing=st.spacing,
                         normalize=st.normalize, n_bootstrap=st.n_bootstrap, seed=st.seed,
                         interpolation=st.interpolation)
    table = de.group_table(st.level)
    infl = fitting.small_sample_inflation(de.min_seeds)
    notes = list(de.notes)
    if np.isfinite(infl) and infl != 1.0:
        notes.append(f"bootstrap deviations scaled by sqrt(n/(n-1)) = {infl:.3f} (n = {de.min_seeds} seeds): "
                     "the seed bootstrap underestimates the variance of a mean of n seeds by (n-1)/n")
    tasks = sorted(table["task"].unique())
    levels = {f: sorted(float(v) for v in set(de.configs[f]) if np.isfinite(v))
              for f in ("utd", "param_count", "batch_size", "lr")}
    out: dict = {
        "schema": SCHEMA, "source": cs.source, "metric": cs.metric, "tasks": tasks, "levels": levels,
        "settings": {**dataclasses.asdict(st), "thresholds": None if st.thresholds is None else list(st.thresholds),
                     "inflation": infl, "min_seeds": de.min_seeds},
        "thresholds": {t: v.tolist() for t, v in de.thresholds.items()},
        "normalization": {t: list(v) for t, v in de.normalization.items()},
        "points": _json_rows(table), "configs": _config_rows(de), "notes": notes,
    }
    say("optimal batch size and learning rate")
    out["hparams"], hp = _hparams(de, table, st, infl, notes)
    say("data-efficiency fits")
    out["data_efficiency_sigma"], _ = _fit_de_sigma(de, st, infl, tasks)
    out["data_efficiency_sigma_n"], de_fits = _fit_de_sigma_n(de, st, infl, tasks, notes)
    if st.holdout:
        say("held-out extrapolation")
        out["extrapolation"] = _extrapolation(de, st, tasks, bool(de_fits))
    say("compute-optimal allocation")
    out["allocation"] = _allocation(de, table, st, infl, tasks, de_fits, hp, out, notes)
    return out


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


def _hparams(de: DataEfficiency, table, st: Settings, infl: float, notes: list) -> tuple[dict, dict]:
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
        for gi in range(len(g)):
            res["points"].append({"field": field, "task": g["task"][gi], "utd": float(g["utd"][gi]),
                                  "param_count": _f(g["param_count"][gi]),
                                  **_interval(samples[:, gi], float(point[gi]), st.level, infl)})
        ok = np.isfinite(point)
        if ok.sum() < 3 or len(np.unique(g["utd"][ok])) < 2:
            res[law_name] = {"skipped": f"{field}: optimum known at fewer than 3 points or one σ"}
            continue
        if np.ptp(np.log(point[ok])) < 1e-9:
            res[law_name] = {"skipped": f"the same {field} ({point[ok][0]:.3g}) wins at every (σ, N): nothing to fit"}
            continue
        x = {"utd": g["utd"].to_numpy(float)[ok]}
        fitted = fit_with_bootstrap(law, x, point[ok], samples[:, ok] if len(samples) > 1 else None, st, infl,
                                    groups=g["task"].to_numpy()[ok], shared=("s",))
        grid = {"utd": np.geomspace(min(x["utd"]) / 1.5, max(x["utd"]) * 1.5, 40)}
        tasks = fitted.problem.group_names
        res[law_name] = {**fitted.record(), "formula": f"{'B' if field == 'batch_size' else 'η'}*(σ) = A_task·σ^s",
                         "bands": {t: _band(fitted, grid, t if len(tasks) > 1 else None) for t in tasks}}
        handles[law_name] = fitted
        # B*(σ, N) per task
        if field == "batch_size":
            res["batch_size_sigma_n"] = {}
            for t in tasks:
                m = ok & (g["task"].to_numpy() == t) & np.isfinite(g["param_count"].to_numpy(float))
                n_levels = len(np.unique(g["param_count"][m]))
                if m.sum() < 6 or n_levels < 2:
                    res["batch_size_sigma_n"][t] = {"skipped": "needs >= 2 model sizes and >= 6 points"}
                    continue
                xn = {"utd": g["utd"].to_numpy(float)[m], "param_count": g["param_count"].to_numpy(float)[m]}
                fn = fit_with_bootstrap(laws.BATCH_SIZE_SIGMA_N, xn, point[m],
                                        samples[:, m] if len(samples) > 1 else None, st, infl)
                res["batch_size_sigma_n"][t] = fn.record()
                handles[f"batch_size_sigma_n/{t}"] = fn
    return res, handles


def _f(v) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


def _points_of(de: DataEfficiency, mask: np.ndarray, j: int):
    """(idx, x, y, Y) of the usable (task, σ, N) points in `mask` at threshold j."""
    idx, y, Y = de.fit_data(j, mask)
    x = {"utd": de.groups["utd"].to_numpy(float)[idx], "param_count": de.groups["param_count"].to_numpy(float)[idx]}
    return idx, x, y, (Y if de.g_boot.shape[0] > 1 else None)


def _fit_de_sigma(de: DataEfficiency, st: Settings, infl: float, tasks: list[str]):
    """D_J(σ) at every model size, per task (or jointly with a shared α)."""
    recs, handles = [], {}
    g = de.groups
    ns = sorted(set(np.nan_to_num(g["param_count"].to_numpy(float), nan=-1.0)))
    for n in ns:
        nmask = np.nan_to_num(g["param_count"].to_numpy(float), nan=-1.0) == n
        for j in range(de.n_thresholds):
            task_sets = [tasks] if st.share_exponents and len(tasks) > 1 else [[t] for t in tasks]
            for ts in task_sets:
                m = nmask & g["task"].isin(ts).to_numpy()
                idx, x, y, Y = _points_of(de, m, j)
                ok_tasks = [t for t in ts if len(np.unique(x["utd"][g["task"].to_numpy()[idx] == t])) >= 3]
                meta = {"param_count": None if n < 0 else n, "j_index": j}
                if len(ok_tasks) < len(ts) or len(idx) < 4 * len(ts):
                    for t in ts:
                        recs.append({**meta, "task": t, "threshold": float(de.thresholds[t][j]),
                                     "skipped": "needs >= 3 σ levels that reach J"})
                    continue
                grp = g["task"].to_numpy()[idx] if len(ts) > 1 else None
                fitted = fit_with_bootstrap(laws.DATA_EFFICIENCY_SIGMA, {"utd": x["utd"]}, y, Y, st, infl,
                                            groups=grp, shared=("alpha",))
                grid = {"utd": np.geomspace(x["utd"].min() / 1.5, x["utd"].max() * 1.5, 50)}
                for t in ts:
                    key = t if len(ts) > 1 else None
                    recs.append({**fitted.record(key), **meta, "task": t, "threshold": float(de.thresholds[t][j]),
                                 "band": _band(fitted, grid, key)})
                    handles[(t, n, j)] = (fitted, key)
    return recs, handles


def _fit_de_sigma_n(de: DataEfficiency, st: Settings, infl: float, tasks: list[str], notes: list):
    recs, handles = [], {}
    g = de.groups
    for j in range(de.n_thresholds):
        task_sets = [tasks] if st.share_exponents and len(tasks) > 1 else [[t] for t in tasks]
        for ts in task_sets:
            m = g["task"].isin(ts).to_numpy()
            idx, x, y, Y = _points_of(de, m, j)
            tk = g["task"].to_numpy()[idx]
            fine = all(len(np.unique(x["utd"][tk == t])) >= 2 and len(np.unique(x["param_count"][tk == t])) >= 2
                       and (tk == t).sum() >= 6 for t in ts) and np.all(np.isfinite(x["param_count"]))
            if not fine:
                for t in ts:
                    recs.append({"task": t, "j_index": j, "threshold": float(de.thresholds[t][j]),
                                 "skipped": "needs >= 2 σ and >= 2 model sizes and >= 6 points reaching J"})
                continue
            fitted = fit_with_bootstrap(laws.DATA_EFFICIENCY_SIGMA_N, x, y, Y, st, infl,
                                        groups=tk if len(ts) > 1 else None, shared=("alpha", "beta"))
            for t in ts:
                key = t if len(ts) > 1 else None
                recs.append({**fitted.record(key), "task": t, "j_index": j, "threshold": float(de.thresholds[t][j])})
                handles[(t, j)] = (fitted, key)
    return recs, handles


def _extrapolation(de: DataEfficiency, st: Settings, tasks: list[str], two_d: bool) -> list[dict]:
    """Fit on all but the largest N (or σ) level, predict the held-out level."""
    out = []
    g = de.groups
    plain = dataclasses.replace(st, max_starts=min(st.max_starts, 8))
    for t in tasks:
        for j in range(de.n_thresholds):
            idx, x, y, _ = _points_of(de, (g["task"] == t).to_numpy(), j)
            law = laws.DATA_EFFICIENCY_SIGMA_N if two_d else laws.DATA_EFFICIENCY_SIGMA
            for axis in (("param_count", "utd") if two_d else ("utd",)):
                lv = np.unique(x[axis])
                if len(lv) < 3:
                    continue
                held = x[axis] == lv[-1]
                train = ~held
                if two_d and (len(np.unique(x["utd"][train])) < 2 or len(np.unique(x["param_count"][train])) < 2
                              or train.sum() < 6):
                    continue
                if not two_d and (len(np.unique(x["utd"][train])) < 3 or train.sum() < 4):
                    continue
                xin = {k: v for k, v in x.items() if k in law.inputs}
                ly = np.log(y)
                prob = fitting.make_problem(law, {k: v[train] for k, v in xin.items()}, ly[train])
                f = fitting.fit(prob, ly[train], loss=plain.loss, huber_delta=plain.huber_delta,
                                max_starts=plain.max_starts)
                pred = np.exp(prob.predict(f.u[None], xin)[0])
                err = np.log(pred / y)
                out.append({"task": t, "j_index": j, "threshold": float(de.thresholds[t][j]), "holdout": axis,
                            "held_level": float(lv[-1]), "law": law.name,
                            "mean_abs_log_error_train": float(np.mean(np.abs(err[train]))),
                            "mean_abs_log_error_heldout": float(np.mean(np.abs(err[held]))),
                            "points": [{"utd": float(x["utd"][i]), "param_count": _f(x["param_count"][i]),
                                        "observed": float(y[i]), "predicted": float(pred[i]),
                                        "observed_std": _f(np.nanstd(np.where(np.isfinite(de.g_boot[:, idx[i], j]),
                                                                              de.g_boot[:, idx[i], j], np.nan)))
                                        if de.g_boot.shape[0] > 1 else None,
                                        "held_out": bool(held[i])} for i in range(len(y))]})
    return out


def _batch_model(de: DataEfficiency, table, st: Settings, hp: dict, task: str, notes: list) -> alloc.BatchModel:
    kind = st.batch_model
    bfit = hp.get("batch_size_sigma")
    if kind == "auto":
        kind = "power" if bfit is not None else "constant"
    if kind == "sigma_n":
        f = hp.get(f"batch_size_sigma_n/{task}")
        if f is None:
            raise ValueError("batch_model: sigma_n needs a B*(σ, N) fit (>= 2 batch sizes and model sizes)")
        return alloc.BatchModel("sigma_n", f.params())
    if kind == "power":
        if bfit is None:
            raise ValueError("batch_model: power needs >= 2 batch sizes in the sweep")
        p = bfit.params(task if len(bfit.problem.group_names) > 1 else None)
        return alloc.BatchModel.power(p["A"], p["s"])
    sub = table[table["task"] == task]
    b = sub["best_batch_size"].to_numpy(float)
    b = b[np.isfinite(b) & (b > 0)]
    if b.size == 0:
        notes.append(f"{task}: batch size unknown; compute counted per sample (B = 1)")
        return alloc.BatchModel.constant(1.0)
    return alloc.BatchModel.constant(float(np.exp(np.mean(np.log(b)))))


def _allocation(de: DataEfficiency, table, st: Settings, infl: float, tasks: list[str], de_fits: dict,
                hp: dict, out: dict, notes: list) -> dict:
    res: dict = {"per_threshold": [], "power_laws": [], "batch_models": {}}
    n_levels = out["levels"]["param_count"]
    if not de_fits and not n_levels:
        res["skipped"] = "no model size (param_count) known: compute cannot be counted"
        return res
    # δ: user's, or the median FLOPs per env step 10·N·B·σ over the sweep's (σ, N) at their best B.
    u = []
    for _, r in table.iterrows():
        b = r["best_batch_size"] if np.isfinite(r["best_batch_size"]) else 1.0
        if np.isfinite(r["param_count"]):
            u.append(alloc.FLOPS_FACTOR * r["param_count"] * b * r["utd"])
    delta = st.delta if st.delta is not None else float(np.median(u))
    res["delta"] = delta
    res["delta_source"] = "user" if st.delta is not None else "median FLOPs per env step (10·N·B·σ) of the sweep"
    s_lv, n_lv = out["levels"]["utd"], out["levels"]["param_count"]
    box = {"sigma_range": (min(s_lv) / 1e3, max(s_lv) * 1e3), "n_range": (min(n_lv) / 1e3, max(n_lv) * 1e3)}
    for t in tasks:
        try:
            bm = _batch_model(de, table, st, hp, t, notes)
        except ValueError as e:
            res["skipped"] = str(e)
            return res
        res["batch_models"][t] = bm.to_dict()
        rows = []
        for j in range(de.n_thresholds):
            if (t, j) not in de_fits:
                continue
            fitted, key = de_fits[(t, j)]
            p = fitted.params(key)
            opt = alloc.optimum(p, bm, delta, **box)
            row = {"task": t, "j_index": j, "threshold": float(de.thresholds[t][j]), **opt, "params": p}
            try:
                two = alloc.optimum_two_term(p, bm, delta)
                row["two_term_closed_form"] = {k: two[k] for k in ("sigma", "N", "D", "F")}
            except ValueError as e:
                row["two_term_closed_form"] = {"skipped": str(e)}
            row["extrapolated"] = bool(not (min(s_lv) <= opt["sigma"] <= max(s_lv))
                                       or not (min(n_lv) <= opt["N"] <= max(n_lv)))
            samples = [alloc.optimum_fast(q, bm, delta, **box) for q in fitted.samples(key)]
            row["intervals"] = {k: _interval([s[k] for s in samples], opt[k], st.level, 1.0)
                                for k in ("sigma", "N", "B", "D", "C", "F")}
            row["_samples"] = samples
            rows.append(row)
        if not rows:
            continue
        # Scaling one axis only, from the optimum of the easiest target.
        base = rows[0]
        for row in rows:
            fitted, key = de_fits[(t, row["j_index"])]
            p = fitted.params(key)
            so = alloc.optimum_numerical(p, bm, delta, fix_n=base["N"], **box)
            no = alloc.optimum_numerical(p, bm, delta, fix_sigma=base["sigma"], **box)
            row["sigma_only"] = {"sigma": so["sigma"], "N": so["N"], "F": so["F"], "F_ratio": so["F"] / row["F"]}
            row["N_only"] = {"sigma": no["sigma"], "N": no["N"], "F": no["F"], "F_ratio": no["F"] / row["F"]}
        # D*(F), C*(F), σ*(F), N*(F) across thresholds.
        if len(rows) >= 3:
            F = np.array([r["F"] for r in rows])
            Fb = _sample_matrix(rows, "F")
            for target in ("D", "C", "sigma", "N"):
                y = np.array([r[target] for r in rows])
                Yb = _sample_matrix(rows, target)
                law = laws.power_law("F", f"{target}_of_F")
                prob = fitting.make_problem(law, {"F": F}, np.log(y))
                f = fitting.fit(prob, np.log(y), max_starts=4)
                U = np.full((0, 2), np.nan)
                if Fb is not None:
                    # Each bootstrap sample has its own F*, so refit on its own x.
                    U = np.array([_refit_power(law, Fb[k], Yb[k], f.u) for k in range(len(Fb))])
                fitted = Fitted(prob, f, U, 1.0, st.level)
                res["power_laws"].append({**fitted.record(), "task": t, "target": target,
                                          "formula": f"{target}* = A·F^s"})
        for r in rows:
            r.pop("_samples")
        res["per_threshold"].extend(rows)
    # One-size studies: σ-only optimum from D_J(σ).
    if not de_fits:
        res["sigma_only_studies"] = _sigma_only_allocation(out, st, tasks, delta, de, table, hp, notes)
    return res


def _sample_matrix(rows: list[dict], key: str) -> np.ndarray | None:
    n = min(len(r["_samples"]) for r in rows)
    if n < 2:
        return None
    return np.array([[r["_samples"][k][key] for r in rows] for k in range(n)])


def _refit_power(law, x, y, u0):
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y)) and np.all(x > 0) and np.all(y > 0)):
        return np.full(2, np.nan)
    lx, ly = np.log(x), np.log(y)
    A = np.vstack([np.ones_like(lx), lx]).T
    c, s = np.linalg.lstsq(A, ly, rcond=None)[0]  # squared loss in log space is linear least squares
    return np.array([c, s])


def _sigma_only_allocation(out, st, tasks, delta, de, table, hp, notes) -> list[dict]:
    rows = []
    for rec in out["data_efficiency_sigma"]:
        if "skipped" in rec or rec["param_count"] is None:
            continue
        bm = _batch_model(de, table, st, hp, rec["task"], notes)
        p = {k: v["estimate"] for k, v in rec["params"].items()}
        o = alloc.optimum_sigma_only(p, bm, delta, rec["param_count"])
        rows.append({"task": rec["task"], "j_index": rec["j_index"], "threshold": rec["threshold"], **o})
    return rows


def recommend(fit: dict, budget_flops: float, task: str | None = None) -> dict:
    """Choose σ and N for a budget F (FLOPs, F = C + δ·D) from the fitted power laws σ*(F), N*(F),
    D*(F), C*(F) of `task`; also the highest threshold J whose optimal budget fits in F (interpolated
    in log F). `extrapolated` says F lies outside the fitted thresholds' budgets."""
    al = fit.get("allocation", {})
    task = task or fit["tasks"][0]
    laws_ = {p["target"]: p for p in al.get("power_laws", []) if p["task"] == task}
    if len(laws_) < 4:
        raise ValueError(f"recommend: no budget power laws for task {task!r} (need D_J(σ,N) fits at >= 3 thresholds)")
    if not budget_flops > 0:
        raise ValueError(f"budget: {budget_flops} must be > 0 FLOPs")
    out = {"task": task, "F": float(budget_flops), "delta": al["delta"]}
    for tg, law in laws_.items():
        A, s = law["params"]["A"], law["params"]["s"]
        out[tg] = A["estimate"] * budget_flops ** s["estimate"]
    rows = sorted((r for r in al["per_threshold"] if r["task"] == task), key=lambda r: r["F"])
    lF = np.log([r["F"] for r in rows])
    out["threshold_reachable"] = float(np.interp(np.log(budget_flops), lF, [r["threshold"] for r in rows]))
    out["extrapolated"] = bool(not (lF[0] <= np.log(budget_flops) <= lF[-1]))
    bm = alloc.BatchModel.from_dict(al["batch_models"][task])
    out["B"] = float(bm(out["sigma"], out["N"]))
    return out
