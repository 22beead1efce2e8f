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
from typing import Callable, Sequence

import numpy as np
from scipy import stats

from . import allocation as alloc
from . import fitting, laws
from .curves import DataEfficiency, data_efficiency
from .data import CurveSet

SCHEMA = "scaling_rl.scaling.fit/2"


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
    extrapolate: float = 1.0                    # search optima up to ×K beyond the swept σ and N (marked)
    weights: str = "auto"                       # "auto" (WLS when >= 4 seeds) | "none" | "bootstrap"
    interp_error: str = "uniform"               # D_J interpolation uncertainty in the bootstrap: "uniform" | "none"
    select: str = "aicc"                        # D_J(σ, N): "aicc" (nested laws, AICc) | "full"
    config_select: str = "crossfit"             # best B/η per cell: "crossfit" (unbiased D_J) | "argmin"

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
        if not (isinstance(self.extrapolate, (int, float)) and self.extrapolate >= 1):
            raise ValueError(f"extrapolate: {self.extrapolate} must be a factor >= 1 (1 = stay inside the sweep)")
        if self.weights not in ("auto", "none", "bootstrap"):
            raise ValueError(f"weights: {self.weights!r} is unknown; use auto, none or bootstrap")
        if self.interp_error not in ("uniform", "none"):
            raise ValueError(f"interp_error: {self.interp_error!r} is unknown; use 'uniform' or 'none'")
        if self.config_select not in ("crossfit", "argmin"):
            raise ValueError(f"config_select: {self.config_select!r} is unknown; use 'crossfit' or 'argmin'")
        if self.select not in ("aicc", "full"):
            raise ValueError(f"select: {self.select!r} is unknown; use 'aicc' or 'full'")


# ---- replicates shared by the whole analysis -----------------------------------------------------

class Replicates:
    """The K bootstrap replicates (and S leave-one-seed-out jackknife rows) of one analysis.

    Replicate b is one resample of seeds, used by every fit, threshold, task, allocation and budget
    law. Failures are tracked per *scope* — a chain of quantities that are combined with each other
    (the D_J(σ, N) fits of a task at every threshold + its allocation + its budget laws; one model
    size's D_J(σ) fits; the B*/η* laws): a replicate that fails anywhere in a scope is dropped from
    every quantity of that scope, so no derived quantity mixes resamples, and counted per fit in
    `failures`. Scopes never feed each other, and dropping a replicate from one because an unrelated
    side fit failed would select resamples on an event correlated with the data (biasing it), so they
    are kept apart. Intervals are computed once every fit has registered. Deviations from the estimate
    are scaled by `fitting.seed_inflation` with the seed degrees of freedom behind each quantity."""

    def __init__(self, K: int, S: int, n_seeds: int, level: float, reason: str | None = None, dof: float = 0):
        self.K, self.S, self.n_seeds, self.level, self.reason = K, S, n_seeds, level, reason
        self.mode = "seed" if K else "none"
        self.scopes: dict[str, np.ndarray] = {}
        self.failures: dict[str, int] = {}
        self.dof = dof
        self.inflation = fitting.seed_inflation(n_seeds, dof, level)   # for derived quantities
        self.scope_inflation: dict[str, float] = {}   # per scope: its laws' largest (Welch–Satterthwaite) inflation

    def inflation_for(self, dof: float) -> float:
        return fitting.seed_inflation(self.n_seeds, dof, self.level)

    def ok(self, scope: str) -> np.ndarray:
        return self.scopes.get(scope, np.ones(self.K, bool))

    def register(self, name: str, ok_own: np.ndarray, scope: str) -> None:
        ok_own = np.asarray(ok_own, bool)
        self.failures[name] = int((~ok_own).sum())
        self.scopes[scope] = self.ok(scope) & ok_own

    def interval(self, est: float, reps: np.ndarray, jack: np.ndarray | None = None, log: bool = True,
                 reason: str | None = None, scope: str = "", inflation: float | None = None,
                 unknown: np.ndarray | None = None) -> dict:
        """Interval of a quantity derived from the laws of `scope`: deviations scaled by `inflation`, else the
        scope's laws' largest inflation, else the study-level one. `unknown` (K,) marks replicates whose value
        the data do not give (see `fitting.interval`: they widen the interval or withhold it)."""
        reps = np.where(self.ok(scope), np.asarray(reps, float), np.nan) if self.K else np.zeros(0)
        infl = inflation if inflation is not None else self.scope_inflation.get(scope, self.inflation)
        u = int(np.sum(np.asarray(unknown, bool) & self.ok(scope))) if unknown is not None and self.K else 0
        return fitting.interval(est, reps, jack, level=self.level, inflation=infl, log=log,
                                n_total=self.K, reason=reason or self.reason, unknown=u)

    def summary(self) -> dict:
        return {"mode": self.mode, "n": self.K, "jackknife_rows": self.S,
                "n_ok": int(min((m.sum() for m in self.scopes.values()), default=self.K)),
                "n_ok_by_scope": {k: int(m.sum()) for k, m in self.scopes.items()},
                "n_seeds": self.n_seeds, "dof_derived": self.dof, "inflation_derived": self.inflation,
                "failures": {k: v for k, v in self.failures.items() if v}, "reason": self.reason}


@dataclasses.dataclass
class Fitted:
    """A law fitted by the one estimator, with its aligned replicate refits."""

    problem: fitting.Problem
    fit: fitting.Fit
    U: np.ndarray               # (K, P) replicate refits (NaN rows failed)
    Uj: np.ndarray              # (S, P) jackknife refits
    reps: Replicates
    not_identified: list
    weights: np.ndarray
    inflation: float = float("nan")
    scope: str = ""
    inflation_params: np.ndarray | None = None   # (P,) per parameter, from its Welch–Satterthwaite ν
    dof: np.ndarray | None = None
    lack_of_fit: dict | None = None               # `lack_of_fit`: F test against the seed noise

    def columns(self, group: str | None) -> list[int]:
        p = self.problem
        return [p.labels.index(n if n in p.labels else f"{n}[{group}]") for n in p.law.params]

    def params(self, group: str | None = None) -> dict[str, float]:
        nat = self.problem.natural(self.fit.u)
        return {n: float(nat[c]) for n, c in zip(self.problem.law.params, self.columns(group))}

    def replicate_params(self, group: str | None = None) -> list[dict[str, float] | None]:
        """Parameter sets of every replicate b (None where it failed here), aligned with b."""
        cols = self.columns(group)
        nat = self.problem.natural(self.U) if len(self.U) else np.zeros((0, self.problem.n_params))
        return [({n: float(row[c]) for n, c in zip(self.problem.law.params, cols)}
                 if np.all(np.isfinite(row)) else None) for row in nat]

    def identified(self, group: str | None = None) -> bool:
        cols = self.columns(group)
        return not any(self.not_identified[c] for c in cols)

    def intervals(self) -> dict:
        reps = self.reps
        U = np.where(reps.ok(self.scope)[:, None], self.U, np.nan) if len(self.U) else self.U
        infl = self.inflation if self.inflation_params is None else self.inflation_params
        out = fitting.bootstrap_intervals(self.problem, self.fit.u, U, reps.level, infl,
                                          self.Uj if len(self.Uj) else None, self.not_identified, reps.reason,
                                          dof=self.dof)
        if self.lack_of_fit and self.lack_of_fit["misspecified"]:
            for rec in out.values():
                if rec.get("lo") is not None:
                    rec["widened_for_lack_of_fit"] = self.lack_of_fit["widen"]
        return out

    def record(self, group: str | None = None, **extra) -> dict:
        iv = self.intervals()
        p = self.problem
        if group is None:
            params, m = iv, np.ones(p.n_obs, bool)
        else:
            params = {n: iv[p.labels[c]] for n, c in zip(p.law.params, self.columns(group))}
            m = p.groups == p.group_names.index(group)
        x = {k: v[m].tolist() for k, v in p.x.items()}
        n_all = int(np.sum(self.weights > 0))
        rss = float(np.sum(self.weights * self.fit.residuals ** 2))
        return {"law": p.law.name, "formula": p.law.formula, "params": params, "r2_log": self.fit.r2,
                "rse_log": fitting.residual_standard_error(rss, n_all, p.n_params),
                "aicc": fitting.aicc(rss, n_all, p.n_params),
                "objective": self.fit.objective, "n_points": int(m.sum()), "n_params": p.n_params,
                "shared": sorted(p.shared) if len(p.group_names) > 1 else [],
                "n_bootstrap": self.reps.K, "bootstrap_scope": self.scope,
                "n_bootstrap_ok": int(np.sum(self.reps.ok(self.scope) & np.all(np.isfinite(self.U), axis=1)))
                if len(self.U) else 0, "n_bootstrap_failed_here": int(np.sum(~np.all(np.isfinite(self.U), axis=1)))
                if len(self.U) else 0,
                "weighted": bool(np.ptp(self.weights[self.weights > 0]) > 0) if n_all else False,
                "inputs": x, "residuals_log": self.fit.residuals[m].tolist(),
                "not_identified": {p.labels[j]: r for j, r in enumerate(self.not_identified) if r and m.any()
                                   and (group is None or p.group_of[j] in (None, group))},
                "at_bound": [p.labels[j] for j, r in enumerate(self.not_identified) if r == "on the optimiser's bound"],
                "lack_of_fit": self.lack_of_fit, **extra}


def fit_with_bootstrap(law: laws.Law, x: dict, y: np.ndarray, Y: np.ndarray | None, settings: Settings,
                       reps: Replicates, name: str, groups=None, shared=(), Yj: np.ndarray | None = None,
                       weights: np.ndarray | None = None, scope: str | None = None,
                       seeds: np.ndarray | None = None) -> Fitted:
    """Point fit on y (natural units, > 0) and the same estimator on every replicate row of Y (K, n)
    (NaN/inf = missing) and jackknife row of Yj. ValueError if the point fit is impossible."""
    ly = np.log(y)
    prob = fitting.make_problem(law, x, ly, groups, shared)
    w = np.ones_like(ly) if weights is None else np.asarray(weights, float)
    kw = dict(loss=settings.loss, huber_delta=settings.huber_delta, max_starts=settings.max_starts)
    f = fitting.fit(prob, ly, w, **kw)
    P = prob.n_params
    U, Uj = np.full((reps.K, P), np.nan), np.full((0, P), np.nan)
    if Y is not None and reps.K:
        with np.errstate(divide="ignore", invalid="ignore"):
            LY = np.log(Y)
        W = np.where(np.isfinite(LY), w[None], 0.0)
        bf = fitting.fit_many(prob, LY, W, warm=f.u, **kw)
        U = np.where(bf.ok[:, None], bf.U, np.nan)
        reps.register(name, bf.ok, scope or name)
        if Yj is not None and len(Yj):
            with np.errstate(divide="ignore", invalid="ignore"):
                LJ = np.log(Yj)
            bj = fitting.fit_many(prob, LJ, np.where(np.isfinite(LJ), w[None], 0.0), warm=f.u, **kw)
            Uj = np.where(bj.ok[:, None], bj.U, np.nan)
    ni = fitting.identifiability(prob, f.u, ly, w, loss=settings.loss, huber_delta=settings.huber_delta,
                                 level=settings.level)
    if seeds is None:
        seeds = np.full(len(ly), float(reps.n_seeds))
    dof = fitting.effective_dof(prob, f.u, ly, w, seeds)
    infl_p = np.array([reps.inflation_for(d) for d in dof])
    lof = lack_of_fit(prob, f.residuals, w, Y, seeds) if Y is not None and reps.K else None
    if lof is not None and lof["misspecified"]:
        infl_p = infl_p * lof["widen"]
    ident = np.array([not r for r in ni], bool)
    # bands and derived quantities (optima, budget laws): the largest inflation of the identified parameters
    infl = float(np.max(infl_p[ident])) if ident.any() and np.all(np.isfinite(infl_p[ident])) else \
        reps.inflation_for(len(ly) * max(reps.n_seeds - 1, 0)) * (lof["widen"] if lof and lof["misspecified"] else 1.0)
    reps.scope_inflation[scope or name] = max(reps.scope_inflation.get(scope or name, 0.0), infl)
    return Fitted(prob, f, U, Uj, reps, ni, w, infl, scope or name, infl_p, dof, lof)


LOF_P = 0.01   # lack-of-fit p-value below which a law is called misspecified and its intervals widened


def lack_of_fit(prob: fitting.Problem, resid: np.ndarray, w: np.ndarray, Y: np.ndarray,
                seeds: np.ndarray) -> dict | None:
    """Lack-of-fit F test with the seeds as replicates: the law's weighted mean squared residual over the
    seed-noise variance of the points it fits (each point's seed-bootstrap variance × n/(n − 1), weighted
    alike and averaged), F = [Σ w r²/(n − P)] / [Σ w v/n] on (n − P, Σ(n_i − 1)) degrees of freedom.

    The seed bootstrap carries seed noise only: where the law cannot follow the means (a σ×N interaction
    outside the family: law parameters covered 0.50–0.71, N* 0.20–0.58 measured), the residuals exceed the
    noise and the intervals are too narrow for the parameters' best approximation on this design (the
    weights, fixed across replicates, then also move the target). With p < LOF_P the law is marked
    misspecified and every interval from it (parameters, bands, optima, budget laws) is widened by
    sqrt(F) — the quasi-likelihood scale that treats the misfit as extra noise. None without replicates."""
    with np.errstate(divide="ignore", invalid="ignore"):
        LY = np.log(Y)
    fin = np.isfinite(LY)
    ok = (w > 0) & np.isfinite(resid) & (fin.sum(axis=0) >= 3) & (np.asarray(seeds, float) >= 2)
    n, P = int(ok.sum()), prob.n_params
    if n - P < 1:
        return None
    v = np.array([np.var(LY[fin[:, i], i], ddof=1) if ok[i] else np.nan for i in range(len(ok))])
    ns = np.asarray(seeds, float)
    v = v * ns / (ns - 1)
    if not np.all(v[ok] > 0):
        return None
    F = float(np.sum(w[ok] * resid[ok] ** 2) / (n - P) / (np.sum(w[ok] * v[ok]) / n))
    nu = float(np.sum(ns[ok] - 1))
    p = float(stats.f.sf(F, n - P, nu))
    return {"F": F, "dof": [n - P, nu], "p": p, "misspecified": bool(p < LOF_P), "widen": float(max(1.0, np.sqrt(F)))}


def _band(fitted: Fitted, x: dict, group: str | None) -> dict:
    gi = None if group is None else np.full(len(next(iter(x.values()))), fitted.problem.group_names.index(group))
    reps = fitted.reps
    U = np.where(reps.ok(fitted.scope)[:, None], fitted.U, np.nan) if len(fitted.U) else fitted.U
    est, lo, hi = fitting.prediction_band(fitted.problem, fitted.fit.u, U, x, gi, reps.level, fitted.inflation,
                                          fitted.Uj if len(fitted.Uj) else None, reps.reason)
    return {**{k: np.asarray(v).tolist() for k, v in x.items()}, "estimate": est.tolist(), "lo": lo.tolist(),
            "hi": hi.tolist()}


# ---- the pipeline -------------------------------------------------------------------------------

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
    notes.append(f"intervals: seed bootstrap ({K} resamples; BCa where the replicates are not centred on the "
                 f"estimate); deviations scaled by sqrt(n/(n-1))·t_ν/z (n = {n} seeds; ν = the seed degrees of "
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


def _later(finalize: list, target: dict, fn: Callable[[], dict]) -> dict:
    """Fill `target` with fn() once every replicate has registered (intervals need the final mask)."""
    finalize.append(lambda: target.update(fn()))
    return target


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


def _f(v) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


def _weights(de: DataEfficiency, st: Settings, reps: Replicates, idx: np.ndarray, j: int) -> np.ndarray:
    """WLS weights 1/v̂ (normalised to mean 1) from a variance FUNCTION of the points, not their raw
    bootstrap variances: log var(log D_J) is regressed on log D_J across the points and v̂ is that fit
    (floored at NOISE_FLOOR²). Raw per-point variances from a few seeds are noisy (χ² with n − 1 dof),
    and weights that noisy — held fixed in every replicate — made the intervals under-cover (75% for
    nominal 90% at 5 seeds, measured); a 2-parameter variance function keeps a real trend (e.g. noisier
    slow configurations) without the noise. Default with >= MIN_SEEDS seeds."""
    use = st.weights == "bootstrap" or (st.weights == "auto" and reps.n_seeds >= fitting.MIN_SEEDS)
    if not use or de.g_boot.shape[0] < 2 or len(idx) < 3:
        return np.ones(len(idx))
    with np.errstate(divide="ignore", invalid="ignore"):
        L = np.log(np.where(np.isfinite(de.g_boot[:, idx, j]), de.g_boot[:, idx, j], np.nan))
    v = np.nanvar(L, axis=0, ddof=1)
    ld = np.log(de.g_point[idx, j])
    ns = _cell_seeds(de, idx, j)
    ok = np.isfinite(v) & (v > 0) & np.isfinite(ld)
    if ok.sum() < 3:
        return np.ones(len(idx))
    # the variance of a mean of n seeds is (per-seed variance)/n: the function is fitted to n·v and divided
    # by each cell's own n, so a 16-seed cell weighs ~4× a 4-seed one (the adaptive design's extra seeds count)
    A = np.vstack([np.ones(ok.sum()), ld[ok]]).T
    coef = np.linalg.lstsq(A, np.log(v[ok] * ns[ok]), rcond=None)[0]
    vhat = np.maximum(np.exp(coef[0] + coef[1] * ld) / ns, fitting.NOISE_FLOOR ** 2)
    w = 1.0 / vhat
    return w / w.mean()


def _cell_seeds(de: DataEfficiency, idx: np.ndarray, j: int) -> np.ndarray:
    """Seeds behind each cell's D_J at threshold j: the best configuration's (the fewest of the cell's where
    none is known)."""
    n_cfg = de.configs["n_seeds"].to_numpy(float)
    n_min = de.configs.groupby("group")["n_seeds"].min().to_numpy(float)
    best = de.g_best[idx, j]
    return np.where(best >= 0, n_cfg[np.maximum(best, 0)], n_min[idx])


def _points_of(de: DataEfficiency, mask: np.ndarray, j: int):
    """(idx, x, y, Y, Yj) of the usable (task, σ, N) points in `mask` at threshold j."""
    idx, y, Y = de.fit_data(j, mask)
    x = {"utd": de.groups["utd"].to_numpy(float)[idx], "param_count": de.groups["param_count"].to_numpy(float)[idx]}
    return idx, x, y, Y, de.fit_data_jack(j, idx)


def _point_fit_aicc(law: laws.Law, x: dict, y: np.ndarray, w: np.ndarray, st: Settings) -> dict:
    """Point fit of one candidate law (for model selection): AICc, RSE, R², or why it cannot be fitted."""
    ly = np.log(y)
    prob = fitting.make_problem(law, x, ly)
    n = int(np.sum(w > 0))
    if n < fitting.min_points(prob):
        return {"law": law.name, "n_params": prob.n_params, "aicc": None,
                "skipped": f"{n} points for {prob.n_params} parameters"}
    f = fitting.fit(prob, ly, w, loss=st.loss, huber_delta=st.huber_delta, max_starts=st.max_starts)
    rss = float(np.sum(w * f.residuals ** 2))
    a = fitting.aicc(rss, n, prob.n_params)
    return {"law": law.name, "formula": law.formula, "n_params": prob.n_params, "aicc": a if math.isfinite(a) else None,
            "rse_log": fitting.residual_standard_error(rss, n, prob.n_params), "r2_log": f.r2}


def _fit_de_sigma(de: DataEfficiency, st: Settings, reps: Replicates, tasks: list[str], finalize: list):
    """D_J(σ) at every model size, per task (or jointly with a shared α), tested against D_J = const."""
    recs, handles = [], {}
    g = de.groups
    P = len(laws.DATA_EFFICIENCY_SIGMA.params)
    ns = sorted(set(np.nan_to_num(g["param_count"].to_numpy(float), nan=-1.0)))
    for n in ns:
        nmask = np.nan_to_num(g["param_count"].to_numpy(float), nan=-1.0) == n
        for j in range(de.n_thresholds):
            task_sets = [tasks] if st.share_exponents and len(tasks) > 1 else [[t] for t in tasks]
            for ts in task_sets:
                m = nmask & g["task"].isin(ts).to_numpy()
                idx, x, y, Y, Yj = _points_of(de, m, j)
                tk = g["task"].to_numpy()[idx]
                meta = {"param_count": None if n < 0 else n, "j_index": j}
                counts = {t: len(np.unique(x["utd"][tk == t])) for t in ts}
                if any(c < P + 1 for c in counts.values()):
                    for t in ts:
                        if not m[g["task"].to_numpy() == t].any():
                            continue
                        recs.append({**meta, "task": t, "threshold": float(de.thresholds[t][j]),
                                     "skipped": f"needs >= {P + 1} σ levels reaching J for a {P}-parameter law "
                                                f"(has {counts[t]})"})
                    continue
                grp = tk if len(ts) > 1 else None
                w = _weights(de, st, reps, idx, j)
                try:
                    scope = f"D_J(σ)/{'+'.join(ts)}/N={n:g}"
                    fitted = fit_with_bootstrap(laws.DATA_EFFICIENCY_SIGMA, {"utd": x["utd"]}, y, Y, st, reps,
                                                f"{scope}/J{j}", groups=grp, shared=("alpha",), Yj=Yj, weights=w,
                                                scope=scope, seeds=_cell_seeds(de, idx, j))
                except ValueError as e:
                    for t in ts:
                        recs.append({**meta, "task": t, "threshold": float(de.thresholds[t][j]), "skipped": str(e)})
                    continue
                selection = None
                if len(ts) == 1:
                    full = _point_fit_aicc(laws.DATA_EFFICIENCY_SIGMA, {"utd": x["utd"]}, y, w, st)
                    const = _point_fit_aicc(laws.DATA_EFFICIENCY_SIGMA_CONSTANT, {"utd": x["utd"]}, y, w, st)
                    selection = {"candidates": [full, const]}
                    slopes = _wls_slopes(np.log(x["utd"]), np.log(y)[None], w)[0], \
                        _wls_slopes(np.log(x["utd"]), _log(Y), w) if Y is not None else np.zeros(0)
                    _later(finalize, selection, lambda selection=selection, fitted=fitted, slopes=slopes, full=full,
                           const=const, n=len(y): _sigma_test(selection, fitted, slopes, full, const, n, st))
                grid = {"utd": np.geomspace(x["utd"].min() / st.extrapolate, x["utd"].max() * st.extrapolate, 50)}
                for t in ts:
                    key = t if len(ts) > 1 else None
                    rec = {**meta, "task": t, "threshold": float(de.thresholds[t][j]),
                           "measured_range": [float(x["utd"][tk == t].min()), float(x["utd"][tk == t].max())]}
                    if selection is not None:
                        rec["selection"] = selection
                    recs.append(_later(finalize, rec, lambda fitted=fitted, key=key, grid=grid: {
                        **fitted.record(key), "band": _band(fitted, grid, key)}))
                    handles[(t, n, j)] = (fitted, key)
    return recs, handles


def _log(Y: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(np.where(np.isfinite(Y) & (Y > 0), Y, np.nan))


def _wls_slopes(lx: np.ndarray, LY: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least-squares slope of each row of LY (K, n; NaN = missing) on lx (n,); NaN where a row
    has fewer than 3 points or no spread in lx."""
    W = np.where(np.isfinite(LY), w[None], 0.0)
    L = np.nan_to_num(LY)
    sw = W.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        mx = (W * lx[None]).sum(axis=1) / sw
        my = (W * L).sum(axis=1) / sw
        dx = lx[None] - mx[:, None]
        sxx = (W * dx ** 2).sum(axis=1)
        out = (W * dx * (L - my[:, None])).sum(axis=1) / sxx
    return np.where((np.sum(W > 0, axis=1) >= 3) & (sxx > 1e-12), out, np.nan)


def _sigma_test(selection: dict, fitted: Fitted, slopes, full: dict, const: dict, n: int, st: Settings) -> dict:
    """Is there a σ effect at this N and J? The seed bootstrap's interval of the σ slope (WLS of log D_J on
    log σ, the fit's weights), with the law's inflation, decides: excluding 0 -> the σ law; containing 0 ->
    the σ effect is not identified (never "no dependence" while the data's own interval excludes 0).
    AICc is not used: with 6 points and 4 parameters its small-sample term (40) swamped real effects
    (21 of 25 per-size fits on a generator with a σ effect everywhere were labelled D_J = const). Without
    bootstrap replicates an F test of the nested point fits at the same level decides."""
    s0, S = slopes
    reps = fitted.reps
    S = np.where(reps.ok(fitted.scope), S, np.nan) if len(S) else S
    iv = fitting.interval(s0, S, None, level=reps.level, inflation=fitted.inflation, log=False, n_total=reps.K,
                          reason=reps.reason)
    selection["sigma_slope"] = iv
    if iv["lo"] is not None:
        effect = iv["lo"] > 0 or iv["hi"] < 0
        selection["rule"] = (f"seed-bootstrap {reps.level:.0%} interval of the σ slope of log D_J: "
                             f"{iv['estimate']:.3g} [{iv['lo']:.3g}, {iv['hi']:.3g}]")
    else:
        rss1 = (full.get("rse_log") or float("nan")) ** 2 * max(n - full["n_params"], 1)
        rss0 = (const.get("rse_log") or float("nan")) ** 2 * max(n - const["n_params"], 1)
        d1, d2 = full["n_params"] - const["n_params"], n - full["n_params"]
        if d2 < 1 or not (np.isfinite(rss0) and np.isfinite(rss1)):
            selection.update(chosen="data_efficiency_sigma",
                             evidence=f"not tested: no bootstrap interval ({iv.get('reason')}) and {n} points")
            return {}
        F = ((rss0 - rss1) / d1) / max(rss1 / d2, fitting.NOISE_FLOOR ** 2)
        p = float(stats.f.sf(F, d1, d2))
        effect = p < 1 - reps.level
        selection["rule"] = f"F test of the σ law against D_J = const: F = {F:.3g}, p = {p:.2g} ({iv.get('reason')})"
    if effect:
        selection.update(chosen="data_efficiency_sigma", evidence="σ effect identified: " + selection["rule"])
    else:
        selection.update(chosen="data_efficiency_sigma_constant",
                         evidence="σ effect not identified (its interval includes 0): " + selection["rule"])
        ni = fitted.not_identified
        for c, name in enumerate(fitted.problem.labels):
            if name in ("beta", "alpha") and not ni[c]:
                ni[c] = "σ effect not identified at this N and J (its interval includes no σ dependence)"
    return {}


TERMS = {law.name: terms for law, terms in laws.DATA_EFFICIENCY_FAMILY}   # which inputs each nested law uses


def _select_de_law(de: DataEfficiency, st: Settings, reps: Replicates, t: str) -> dict:
    """AICc of the nested laws of D_J(σ, N) at every threshold of task t, summed over the thresholds at
    which every candidate can be compared; the lowest total wins (one law per task, so budget laws
    across thresholds are consistent)."""
    g = de.groups
    per_j, totals = [], {law.name: 0.0 for law, _ in laws.DATA_EFFICIENCY_FAMILY}
    rep_totals = {law.name: np.zeros(reps.K) for law, _ in laws.DATA_EFFICIENCY_FAMILY}
    used = 0
    for j in range(de.n_thresholds):
        idx, x, y, Y, _ = _points_of(de, (g["task"] == t).to_numpy(), j)
        if len(idx) == 0 or not np.all(np.isfinite(x["param_count"])):
            continue
        w = _weights(de, st, reps, idx, j)
        cands = [_point_fit_aicc(law, x, y, w, st) for law, _ in laws.DATA_EFFICIENCY_FAMILY]
        per_j.append({"j_index": j, "n_points": len(y), "candidates": cands})
        if all(c["aicc"] is not None for c in cands):
            used += 1
            for c in cands:
                totals[c["law"]] += c["aicc"]
            if reps.K and st.select == "aicc":
                for law, _ in laws.DATA_EFFICIENCY_FAMILY:
                    rep_totals[law.name] += _replicate_aicc(law, x, Y, w, st)
    if st.select == "full":
        return {"chosen": "data_efficiency_sigma_n", "rule": "full law (select = full)", "per_threshold": per_j}
    if used == 0:
        # Compare the laws that can be compared at every threshold; the full law if none can.
        elig = [law.name for law, _ in laws.DATA_EFFICIENCY_FAMILY
                if per_j and all(next(c for c in pj["candidates"] if c["law"] == law.name)["aicc"] is not None
                                 for pj in per_j)]
        if not elig:
            return {"chosen": "data_efficiency_sigma_n", "rule": "not tested: too few points for AICc",
                    "per_threshold": per_j}
        totals = {n: sum(next(c for c in pj["candidates"] if c["law"] == n)["aicc"] for pj in per_j) for n in elig}
        used = len(per_j)
    best = min(totals, key=totals.get)
    # Evidence: the thresholds share the seeds, so summed AICc differences (and Akaike weights from them,
    # once "3e-35") count the same evidence ~nJ times. Instead: how often each law wins when the whole
    # selection is redone on every seed-bootstrap replicate.
    share, n_rep = {n: None for n in totals}, 0
    if reps.K and st.select == "aicc" and used == len(per_j):
        R = np.vstack([rep_totals[n] for n in totals])              # (laws, K)
        okr = np.all(np.isfinite(R), axis=0) & reps.ok(f"D_J(σ,N)/{t}")
        n_rep = int(okr.sum())
        if n_rep:
            wins = np.argmin(R[:, okr], axis=0)
            share = {n: float(np.mean(wins == i)) for i, n in enumerate(totals)}
    rule = f"lowest AICc summed over {used} threshold(s)"
    if share[best] is not None:
        rule += (f"; chosen in {share[best]:.0%} of {n_rep} seed-bootstrap replicates (the replicates' intervals "
                 "are for the chosen law: parameters of different nested laws are different quantities, so they "
                 "do not carry the choice" + ("; the choice is uncertain" if share[best] < 0.9 else "") + ")")
    return {"chosen": best, "rule": rule, "n_replicates_selection": n_rep,
            "laws": [{"law": n, "formula": next(law.formula for law, _ in laws.DATA_EFFICIENCY_FAMILY if law.name == n),
                      "aicc_total": v, "delta_aicc": v - totals[best], "bootstrap_share": share[n],
                      "preferred_at": int(sum(1 for pj in per_j
                                              if min((c for c in pj["candidates"] if c["aicc"] is not None),
                                                     key=lambda c: c["aicc"], default={"law": None})["law"] == n))}
                     for n, v in totals.items()],
            "per_threshold": per_j}


def _replicate_aicc(law: laws.Law, x: dict, Y: np.ndarray, w: np.ndarray, st: Settings) -> np.ndarray:
    """AICc of `law` refitted (the one estimator) on every replicate row of Y (K, n); NaN where it failed."""
    LY = _log(Y)
    prob = fitting.make_problem(law, x, np.nanmean(LY, axis=0))
    W = np.where(np.isfinite(LY), w[None], 0.0)
    bf = fitting.fit_many(prob, LY, W, loss=st.loss, huber_delta=st.huber_delta, max_starts=st.max_starts)
    n = np.sum(W > 0, axis=1)
    out = np.array([fitting.aicc(2.0 * o, int(k), prob.n_params) if ok else np.nan
                    for o, k, ok in zip(bf.objective, n, bf.ok)])
    return out


def _fit_de_sigma_n(de: DataEfficiency, st: Settings, reps: Replicates, tasks: list[str], notes: list,
                    finalize: list):
    recs, handles, selection = [], {}, {}
    g = de.groups
    law_of = {law.name: law for law, _ in laws.DATA_EFFICIENCY_FAMILY}
    joint = st.share_exponents and len(tasks) > 1
    for t in tasks:
        tm = (g["task"] == t).to_numpy()
        pcs = g["param_count"].to_numpy(float)[tm]
        if not np.all(np.isfinite(pcs)) or len(np.unique(pcs)) < 2 or len(np.unique(g["utd"][tm])) < 2:
            continue
        selection[t] = _select_de_law(de, st, reps, t) if not joint else {
            "chosen": "data_efficiency_sigma_n", "rule": "full law (shared exponents across tasks)"}
        ch = selection[t]["chosen"]
        if ch != "data_efficiency_sigma_n":
            missing = {"data_efficiency_sigma_only": "N", "data_efficiency_n_only": "σ",
                       "data_efficiency_constant": "σ and N"}[ch]
            notes.append(f"{t}: {missing} effect not identified — model selection ({selection[t]['rule']}) prefers "
                         f"{law_of[ch].formula}; the full D_J(σ, N) law is not reported"
                         + ("; allocation over σ only" if ch == "data_efficiency_sigma_only" else ""))
    for j in range(de.n_thresholds):
        task_sets = [[t for t in tasks if t in selection]] if joint else [[t] for t in tasks if t in selection]
        for ts in task_sets:
            if not ts:
                continue
            law = law_of[selection[ts[0]]["chosen"]]
            m = g["task"].isin(ts).to_numpy()
            idx, x, y, Y, Yj = _points_of(de, m, j)
            tk = g["task"].to_numpy()[idx]
            need = len(law.params) + 1
            fine = all((tk == t).sum() >= need for t in ts) and \
                all(len(np.unique(x[ax][tk == t])) >= 2 for t in ts for ax in TERMS[law.name])
            if not fine:
                for t in ts:
                    recs.append({"task": t, "j_index": j, "threshold": float(de.thresholds[t][j]), "law": law.name,
                                 "skipped": f"needs >= {need} points reaching J for the {len(law.params)}-parameter "
                                            f"law{' and >= 2 levels of each of its inputs' if TERMS[law.name] else ''}"
                                            f" (has {int((tk == t).sum()) if len(ts) == 1 else len(tk)})"})
                continue
            w = _weights(de, st, reps, idx, j)
            try:
                scope = f"D_J(σ,N)/{'+'.join(ts)}"
                fitted = fit_with_bootstrap(law, x, y, Y, st, reps, f"{scope}/J{j}",
                                            groups=tk if len(ts) > 1 else None,
                                            shared=tuple(p for p in ("alpha", "beta") if p in law.params), Yj=Yj,
                                            weights=w, scope=scope, seeds=_cell_seeds(de, idx, j))
            except ValueError as e:
                for t in ts:
                    recs.append({"task": t, "j_index": j, "threshold": float(de.thresholds[t][j]), "skipped": str(e)})
                continue
            for t in ts:
                key = t if len(ts) > 1 else None
                rec = {"task": t, "j_index": j, "threshold": float(de.thresholds[t][j]), "selected_law": law.name,
                       "terms": list(TERMS[law.name])}
                recs.append(_later(finalize, rec, lambda fitted=fitted, key=key: fitted.record(key)))
                handles[(t, j)] = (fitted, key)
    return recs, handles, selection


def _extrapolation(de: DataEfficiency, st: Settings, tasks: list[str], selection: dict) -> list[dict]:
    """Fit on all but the largest level of one axis (the chosen law's inputs), predict the held-out level."""
    out = []
    g = de.groups
    law_of = {law.name: law for law, _ in laws.DATA_EFFICIENCY_FAMILY}
    for t in tasks:
        two_d = t in selection
        law = law_of[selection[t]["chosen"]] if two_d else laws.DATA_EFFICIENCY_SIGMA
        axes = TERMS[law.name] if two_d else ("utd",)
        for j in range(de.n_thresholds):
            idx, x, y, _, _ = _points_of(de, (g["task"] == t).to_numpy(), j)
            for axis in axes:
                lv = np.unique(x[axis])
                if len(lv) < 3:
                    continue
                held = x[axis] == lv[-1]
                train = ~held
                xin = {k: v for k, v in x.items() if k in law.inputs}
                if not two_d and len(np.unique(x["param_count"][train])) > 1:
                    continue  # the σ-only law needs one model size
                ly = np.log(y)
                prob = fitting.make_problem(law, {k: v[train] for k, v in xin.items()}, ly[train])
                if train.sum() < fitting.min_points(prob) or any(len(np.unique(x[a][train])) < 2 for a in axes):
                    continue
                try:
                    f = fitting.fit(prob, ly[train], loss=st.loss, huber_delta=st.huber_delta,
                                    max_starts=st.max_starts)
                except ValueError:
                    continue
                pred = np.exp(prob.predict(f.u[None], xin)[0])
                err = np.log(pred / y)
                out.append({"task": t, "j_index": j, "threshold": float(de.thresholds[t][j]), "holdout": axis,
                            "held_level": float(lv[-1]), "train_max": float(lv[-2]), "law": law.name,
                            "mean_abs_log_error_train": float(np.mean(np.abs(err[train]))),
                            "mean_abs_log_error_heldout": float(np.mean(np.abs(err[held]))),
                            "points": [{"utd": float(x["utd"][i]), "param_count": _f(x["param_count"][i]),
                                        "observed": float(y[i]), "predicted": float(pred[i]),
                                        "observed_std": _f(np.nanstd(np.where(np.isfinite(de.g_boot[:, idx[i], j]),
                                                                              de.g_boot[:, idx[i], j], np.nan)))
                                        if de.g_boot.shape[0] > 1 else None,
                                        "held_out": bool(held[i])} for i in range(len(y))]})
    return out


def _batch_model(de: DataEfficiency, table, st: Settings, hp: dict, task: str, notes: list,
                 replicates: bool = False):
    """The batch model of task t's allocation; with `replicates`, also its per-replicate models (aligned with
    replicate b; None where the B* law's refit failed), so replicate b of σ*, N*, F* and the budget laws uses
    replicate b's own batch law (a fixed B*(σ) exponent hid ±20% of σ* at δ = 1e9). A constant batch model
    has no replicates (the same value in every replicate)."""
    kind = st.batch_model
    bfit = hp.get("batch_size_sigma")
    if kind == "auto":
        kind = "power" if bfit is not None else "constant"
    if kind == "sigma_n":
        f = hp.get(f"batch_size_sigma_n/{task}")
        if f is None:
            raise ValueError("batch_model: sigma_n needs a B*(σ, N) fit (>= 2 batch sizes and model sizes)")
        bm = alloc.BatchModel("sigma_n", f.params())
        return (bm, [None if q is None else alloc.BatchModel("sigma_n", q) for q in f.replicate_params()],
                f.scope) if replicates else bm
    if kind == "power":
        if bfit is None:
            raise ValueError("batch_model: power needs >= 2 batch sizes in the sweep")
        key = task if len(bfit.problem.group_names) > 1 else None
        p = bfit.params(key)
        bm = alloc.BatchModel.power(p["A"], p["s"])
        return (bm, [None if q is None else alloc.BatchModel.power(q["A"], q["s"]) for q in bfit.replicate_params(key)],
                bfit.scope) if replicates else bm
    bm = _constant_batch(table, task, notes)
    return (bm, None, None) if replicates else bm


def _constant_batch(table, task: str, notes: list) -> alloc.BatchModel:
    sub = table[table["task"] == task]
    b = sub["best_batch_size"].to_numpy(float)
    b = b[np.isfinite(b) & (b > 0)]
    if b.size == 0:
        notes.append(f"{task}: batch size unknown; compute counted per sample (B = 1)")
        return alloc.BatchModel.constant(1.0)
    return alloc.BatchModel.constant(float(np.exp(np.mean(np.log(b)))))


QUANTITIES = ("sigma", "N", "B", "D", "C", "F")


def _allocation(de: DataEfficiency, table, st: Settings, reps: Replicates, tasks: list[str], de_fits: dict,
                sigma_fits: dict, hp: dict, out: dict, notes: list, finalize: list, capture: dict) -> dict:
    res: dict = {"per_threshold": [], "power_laws": [], "batch_models": {}, "extrapolate": st.extrapolate}
    n_levels = out["levels"]["param_count"]
    if not n_levels:
        res["skipped"] = "no model size (param_count) known: compute cannot be counted (pass --param-count N)"
        return res
    u = []
    for _, r in table.iterrows():
        b = r["best_batch_size"] if np.isfinite(r["best_batch_size"]) else 1.0
        if np.isfinite(r["param_count"]):
            u.append(alloc.FLOPS_FACTOR * r["param_count"] * b * r["utd"])
    delta = st.delta if st.delta is not None else float(np.median(u))
    res["delta"] = delta
    res["delta_source"] = "user" if st.delta is not None else "median FLOPs per env step (10·N·B·σ) of the sweep"
    sel = out.get("model_selection", {})
    for t in tasks:
        try:
            bm, bm_reps, bm_scope = _batch_model(de, table, st, hp, t, notes, replicates=True)
        except ValueError as e:
            res["skipped"] = str(e)
            return res
        res["batch_models"][t] = bm.to_dict()
        lv = out["levels_by_task"][t]
        s_lv, n_lv = lv["utd"], lv["param_count"]
        if not n_lv:
            continue
        K = st.extrapolate
        box = {"sigma_range": (min(s_lv) / K, max(s_lv) * K), "n_range": (min(n_lv) / K, max(n_lv) * K)}
        sources = _allocation_sources(de, t, de_fits, sel.get(t), out, n_lv, sigma_fits)
        if sources is None:
            continue
        kind, per_j = sources
        rows = []
        for j, (fitted, key, fixed) in per_j.items():
            p = _full_params(fitted.params(key), kind)
            opt = alloc.optimum(p, bm, delta, **box, **fixed)
            row = {"task": t, "j_index": j, "threshold": float(de.thresholds[t][j]), "kind": kind, **opt,
                   "params": p, "box": {"sigma": list(box["sigma_range"]), "N": list(box["n_range"])},
                   "swept": {"sigma": [min(s_lv), max(s_lv)], "N": [min(n_lv), max(n_lv)]},
                   "free": {"sigma": "fix_sigma" not in fixed, "N": "fix_n" not in fixed}}
            row["edge"] = _edges(opt, row)
            row["extrapolated"] = {"sigma": not (min(s_lv) * (1 - 1e-9) <= opt["sigma"] <= max(s_lv) * (1 + 1e-9)),
                                   "N": not (min(n_lv) * (1 - 1e-9) <= opt["N"] <= max(n_lv) * (1 + 1e-9))}
            samples = []
            b_ok = reps.ok(bm_scope) if bm_scope else np.ones(reps.K, bool)
            for b, q in enumerate(fitted.replicate_params(key)):
                bm_b = bm if bm_reps is None else (bm_reps[b] if b_ok[b] else None)
                if q is None or bm_b is None:
                    samples.append(None)
                    continue
                try:
                    o = alloc.optimum_numerical(_full_params(q, kind), bm_b, delta, **box, **fixed)
                    samples.append(o if np.isfinite(o["F"]) else None)
                except (ValueError, FloatingPointError):
                    samples.append(None)
            ok = np.array([s_ is not None for s_ in samples], bool)
            if len(samples):
                reps.register(f"{fitted.scope}/allocation/J{j}", ok | ~np.all(np.isfinite(fitted.U), axis=1),
                              fitted.scope)
            row["scope"] = fitted.scope
            row["_samples"] = samples
            capture["laws"][(t, j)] = {"kind": kind, "point": p, "fixed": fixed, "scope": fitted.scope,
                                       "batch": bm, "batch_reps": bm_reps, "delta": delta, "box": box,
                                       "reps": [None if q is None else _full_params(q, kind)
                                                for q in fitted.replicate_params(key)]}
            capture["optima"][(t, j)] = {"point": opt, "reps": samples, "scope": fitted.scope, "row": row}
            row["sigma_only"] = row["N_only"] = None
            rows.append(row)
        if not rows:
            continue
        if kind == "full":
            base = rows[0]
            for row in rows:
                fitted, key, _ = per_j[row["j_index"]]
                p = _full_params(fitted.params(key), kind)
                so = alloc.optimum_numerical(p, bm, delta, fix_n=base["N"], **box)
                no = alloc.optimum_numerical(p, bm, delta, fix_sigma=base["sigma"], **box)
                row["sigma_only"] = {"sigma": so["sigma"], "N": so["N"], "F": so["F"], "F_ratio": so["F"] / row["F"],
                                     "at_bound": so["at_bound"]}
                row["N_only"] = {"sigma": no["sigma"], "N": no["N"], "F": no["F"], "F_ratio": no["F"] / row["F"],
                                 "at_bound": no["at_bound"]}
        for row in rows:
            _later(finalize, row, lambda row=row: {"intervals": _optimum_intervals(row, reps)})
        finalize.append(lambda rows=rows: [r.pop("_samples", None) for r in rows])  # after their intervals
        res["per_threshold"].extend(rows)
        res["power_laws"].extend(_budget_laws(t, rows, reps, st, finalize, capture))
    return res


def _allocation_sources(de, t, de_fits, sel, out, n_lv, sigma_fits):
    """Which law drives the allocation of task t: ("full" | "sigma_only" | "n_only", {j: (fitted, key,
    fixed axes)}), from the selected D_J(σ, N) law, or the D_J(σ) law of a one-size study."""
    if sel is not None and sel.get("chosen"):
        ch = sel["chosen"]
        kind = {"data_efficiency_sigma_n": "full", "data_efficiency_sigma_only": "sigma_only",
                "data_efficiency_n_only": "n_only", "data_efficiency_constant": None}[ch]
        if kind is None:
            return None
        fixed = {"full": {}, "sigma_only": {"fix_n": min(n_lv)}, "n_only": {"fix_sigma": min(out["levels_by_task"][t]["utd"])}}[kind]
        per_j = {j: (f, key, fixed) for (tt, j), (f, key) in de_fits.items() if tt == t}
        return kind, dict(sorted(per_j.items()))
    if len(n_lv) == 1:  # a one-size study: D_J(σ) at that N
        per_j = {j: (f, key, {"fix_n": n}) for (tt, n, j), (f, key) in sigma_fits.items() if tt == t}
        return ("sigma_law", dict(sorted(per_j.items()))) if per_j else None
    return None


def _full_params(p: dict, kind: str) -> dict:
    """Parameters of D_min·(1 + (a/σ)^α + (b/N)^β) for any nested law (a dropped term has a vanishing
    coefficient), or of D_min + (β/σ)^α written in that form (kind "sigma_law")."""
    if kind == "sigma_law":  # D_min + (β/σ)^α = D_min·(1 + (a/σ)^α), a = β·D_min^(−1/α)
        return {"D_min": p["D_min"], "a": p["beta"] * p["D_min"] ** (-1.0 / p["alpha"]), "alpha": p["alpha"],
                "b": 1e-300, "beta": 1.0}
    q = {"a": 1e-300, "alpha": 1.0, "b": 1e-300, "beta": 1.0, **p}
    return q


def _edges(opt: dict, row: dict) -> dict:
    """Which free axis of allocation `row` (its `box` and `free`) the optimum `opt` ended on the edge of
    ("lower" | "upper"), if any: the point optimum or one replicate's."""
    out = {}
    for ax in ("sigma", "N"):
        if not row["free"][ax]:
            continue
        lo, hi = row["box"][ax]
        if abs(math.log(opt[ax] / lo)) < 1e-4:
            out[ax] = "lower"
        elif abs(math.log(opt[ax] / hi)) < 1e-4:
            out[ax] = "upper"
    return out


def _optimum_intervals(row: dict, reps: Replicates) -> dict:
    res = {}
    samples = row["_samples"]
    for k in QUANTITIES:
        vals = np.array([np.nan if s_ is None else s_[k] for s_ in samples], float)
        reason = None
        if k in ("sigma", "N") and not row["free"][k]:
            reason = "fixed (not identified by the selected law)"
        elif row["edge"]:
            reason = "optimum on the edge of the searched box (" + ", ".join(
                f"{a} {e}" for a, e in row["edge"].items()) + ")"
        else:
            n_edge = sum(1 for s_ in samples if s_ is not None and _edges(s_, row))
            if n_edge > fitting.MAX_FAIL * len(samples):
                reason = (f"in {n_edge} of {len(samples)} replicates the optimum sits on the search box's edge: "
                          "the interval would be set by the box, not the data")
        res[k] = reps.interval(row[k], vals, None, reason=reason, scope=row["scope"])
        if k in ("sigma", "N") and res[k]["lo"] is not None:  # the optimum was only searched inside the box
            lo_b, hi_b = row["box"][k]
            if res[k]["hi"] > hi_b or res[k]["lo"] < lo_b:
                res[k]["clipped_to_box"] = True
                res[k]["lo"], res[k]["hi"] = max(res[k]["lo"], lo_b), min(res[k]["hi"], hi_b)
    return res


def _budget_laws(t: str, rows: list[dict], reps: Replicates, st: Settings, finalize: list,
                 capture: dict | None = None) -> list[dict]:
    """D*(F), C*(F), σ*(F), N*(F) across thresholds: log-linear least squares on (F*_j, target_j) for the
    point and for every replicate b on its own optima (aligned: replicate b of every threshold)."""
    out = []
    interior = [r for r in rows if not r["edge"]]
    targets = ["D", "C"] + [k for k in ("sigma", "N") if rows[0]["free"][k]]
    for target in targets:
        base = {"task": t, "target": target, "formula": f"{target}* = A·F^s"}
        if len(interior) < 3:
            out.append({**base, "skipped": f"needs optima strictly inside the searched box at >= 3 thresholds "
                                           f"(has {len(interior)} of {len(rows)})"})
            continue
        F = np.array([r["F"] for r in interior])
        y = np.array([r[target] for r in interior])
        c, s_ = _loglinear(F, y)
        reps_c, reps_s = np.full(reps.K, np.nan), np.full(reps.K, np.nan)
        on_edge = np.zeros(reps.K, bool)
        for b in range(reps.K):
            pts = [r["_samples"][b] for r in interior]
            if any(p is None for p in pts):
                continue
            edge = any(_edges(p, r) for p, r in zip(pts, interior))
            if edge:  # this replicate's optimum is not an optimum: its budget law is unknown (widens, not dropped)
                on_edge[b] = True
                continue
            reps_c[b], reps_s[b] = _loglinear(np.array([p["F"] for p in pts]), np.array([p[target] for p in pts]))
        pred = c + s_ * np.log(F)
        ss = np.sum((np.log(y) - np.log(y).mean()) ** 2)
        rec = {**base, "n_points": len(interior), "r2_log": float(1 - np.sum((np.log(y) - pred) ** 2) / ss) if ss > 0
               else float("nan"), "F_range": [float(F.min()), float(F.max())],
               "points": [{"F": float(f), "value": float(v)} for f, v in zip(F, y)]}
        # Not an estimator failure, so not dropped from its scope: a replicate whose optimum sits on the box
        # edge has no budget law inside the box; its value is unknown, placed beyond both ends of the interval
        # (widening it), and too many of them withhold it. Dropping them (as once) cut the tails.
        n_edge = int(on_edge.sum())
        why = (f"in {n_edge} of {reps.K} replicates an optimum sits on the search box's edge (more than "
               f"{fitting.MAX_FAIL:.0%}): the budget law is not determined inside the sweep"
               if n_edge > fitting.MAX_FAIL * reps.K else None)
        rec["n_replicates_on_edge"] = n_edge
        sc = interior[0]["scope"]
        if capture is not None:
            capture["budget_laws"][(t, target)] = {"estimate": s_, "reps": reps_s, "scope": sc, "why": why}
        # A (the value at F = 1 FLOP) is an extrapolation far outside the data; the value at the fitted
        # optima's geometric-mean budget F_ref is what the data determine, so the report shows that.
        lref = float(np.mean(np.log(F)))
        out.append(_later(finalize, rec, lambda c=c, s_=s_, rc=reps_c, rs=reps_s, why=why, sc=sc, lref=lref,
                          ue=on_edge: {
            "params": {"A": reps.interval(math.exp(c), np.exp(rc), reason=why, scope=sc, unknown=ue),
                       "s": reps.interval(s_, rs, log=False, reason=why, scope=sc, unknown=ue)},
            "at_F_ref": {"F_ref": math.exp(lref), **reps.interval(math.exp(c + s_ * lref), np.exp(rc + rs * lref),
                                                                   reason=why, scope=sc, unknown=ue)},
            "bootstrap_scope": sc}))
    return out


def _loglinear(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """log y = c + s·log x by least squares (the squared-loss log-space fit of y = A·x^s, exactly)."""
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y)) and np.all(x > 0) and np.all(y > 0)):
        return float("nan"), float("nan")
    lx, ly = np.log(x), np.log(y)
    A = np.vstack([np.ones_like(lx), lx]).T
    c, s = np.linalg.lstsq(A, ly, rcond=None)[0]
    return float(c), float(s)


def recommend(fit: dict, budget_flops: float, task: str | None = None, extrapolate: bool = False) -> dict:
    """Choose σ and N for a budget F (FLOPs, F = C + δ·D) from the fitted budget laws σ*(F), N*(F),
    D*(F), C*(F) of `task`. Budgets outside the range of the fitted optima are refused unless
    `extrapolate`, and then marked; the held-out extrapolation error of the data-efficiency law is
    attached as the factor by which an extrapolated answer may be off."""
    al = fit.get("allocation", {})
    task = task or fit["tasks"][0]
    laws_ = {p["target"]: p for p in al.get("power_laws", []) if p["task"] == task and "params" in p}
    if "D" not in laws_ or "C" not in laws_:
        raise ValueError(f"recommend: no budget laws for task {task!r} (need optima inside the sweep at >= 3 "
                         "thresholds)")
    if not budget_flops > 0:
        raise ValueError(f"budget: {budget_flops} must be > 0 FLOPs")
    F_lo, F_hi = laws_["D"]["F_range"]
    inside = F_lo * (1 - 1e-9) <= budget_flops <= F_hi * (1 + 1e-9)
    if not inside and not extrapolate:
        raise ValueError(f"budget: {budget_flops:.3g} FLOPs is outside the fitted optima's range [{F_lo:.3g}, "
                         f"{F_hi:.3g}]; pass extrapolate=True to extrapolate (marked)")
    out = {"task": task, "F": float(budget_flops), "delta": al["delta"], "extrapolated": not inside}
    for tg, law in laws_.items():
        A, s = law["params"]["A"], law["params"]["s"]
        out[tg] = A["estimate"] * budget_flops ** s["estimate"]
    rows = sorted((r for r in al["per_threshold"] if r["task"] == task and not r.get("edge")), key=lambda r: r["F"])
    for ax in ("sigma", "N"):
        if ax not in out and rows:
            out[ax] = rows[0][ax]
            out[f"{ax}_fixed"] = True
    lF = np.log([r["F"] for r in rows])
    out["threshold_reachable"] = float(np.interp(np.log(budget_flops), lF, [r["threshold"] for r in rows]))
    ex = [e["mean_abs_log_error_heldout"] for e in fit.get("extrapolation") or [] if e["task"] == task]
    out["heldout_error_factor"] = float(math.exp(max(ex))) if ex else None
    bm = alloc.BatchModel.from_dict(al["batch_models"][task])
    out["B"] = float(bm(out["sigma"], out["N"]))
    return out
