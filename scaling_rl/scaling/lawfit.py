"""One law fitted with its seed-bootstrap replicates: analysis `Settings`, the `Replicates` shared by a whole
analysis (scopes, failures, inflation), `fit_with_bootstrap` -> `Fitted` (Welch–Satterthwaite dof per
parameter, lack-of-fit test against the seed noise), and the WLS weights / points of a threshold. Split
out of `analysis` (which re-exports every name)."""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import numpy as np
from scipy import stats

from . import fitting, laws
from .curves import INTERP_ERRORS, DataEfficiency


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
    interp_error: str = "adaptive"              # D_J interpolation uncertainty in the bootstrap: "adaptive" | "uniform" | "none"
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
        if self.interp_error not in INTERP_ERRORS:
            raise ValueError(f"interp_error: {self.interp_error!r} is unknown; use one of {INTERP_ERRORS}")
        if self.config_select not in ("crossfit", "argmin"):
            raise ValueError(f"config_select: {self.config_select!r} is unknown; use 'crossfit' or 'argmin'")
        if self.select not in ("aicc", "full"):
            raise ValueError(f"select: {self.select!r} is unknown; use 'aicc' or 'full'")


class Replicates:
    """The K bootstrap replicates (and S leave-one-seed-out jackknife rows) of one analysis.

    Replicate b is one resample of seeds, used by every fit, threshold, task, allocation and budget
    law. Failures are tracked per *scope* — a chain of quantities that are combined with each other
    (the D_J(σ, N) fits of a task at every threshold + its allocation + its budget laws; one model
    size's D_J(σ) fits; the B*/η* laws): a replicate that fails anywhere in a scope is dropped from
    every quantity of that scope, so no derived quantity mixes resamples, and counted per fit in
    `failures`. Scopes never feed each other, and dropping a replicate from one because an unrelated
    side fit failed would select resamples on an event correlated with the data (biasing it), so they
    are kept apart. Intervals are computed once every fit has registered, each by `fitting.interval` (the
    percentile interval of the replicates centred on the estimate); deviations are scaled by
    `fitting.seed_inflation` with the seed degrees of freedom behind each quantity."""

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
    Uj: np.ndarray              # (0, P): no jackknife refits are made any more (kept for the record's shape)
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
    (NaN/inf = missing); `Yj` (jackknife rows) is not used. ValueError if the point fit is impossible."""
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
        # No jackknife refits: they fed BCa's acceleration, and the intervals are now percentile intervals of
        # the centred replicates (`fitting.interval`); `Yj` is accepted for the callers and not fitted.
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


def _later(finalize: list, target: dict, fn: Callable[[], dict]) -> dict:
    """Fill `target` with fn() once every replicate has registered (intervals need the final mask)."""
    finalize.append(lambda: target.update(fn()))
    return target


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


def _log(Y: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(np.where(np.isfinite(Y) & (Y > 0), Y, np.nan))
