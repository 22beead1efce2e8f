"""Robust fitting of scaling laws: log-space residuals, sum-reduced squared or Huber loss,
positivity by reparameterisation, multi-start L-BFGS-B, batched warm-started refits for the
bootstrap, and bootstrap parameter intervals.

A `Problem` ties a `Law` to data with optional groups (tasks): each law parameter is either shared by
all groups or has one value per group. Parameters are optimised in an unconstrained vector u:
positive ones as log(θ), the rest as θ.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import threading
from typing import Sequence

import numpy as np
from scipy import optimize
from threadpoolctl import threadpool_limits

from .laws import Law

LOSSES = ("squared", "huber")


_blas_limited = threading.local()


def single_threaded_blas(fn):
    """Run `fn` with one BLAS thread: these problems are tiny, and on a shared CPU OpenBLAS's
    spinning worker threads made each L-BFGS-B iteration ~20x slower. Nested calls skip the
    (millisecond) limit switch."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if getattr(_blas_limited, "on", False):
            return fn(*args, **kwargs)
        _blas_limited.on = True
        try:
            with threadpool_limits(limits=1, user_api="blas"):
                return fn(*args, **kwargs)
        finally:
            _blas_limited.on = False

    return wrapper


# ---- losses (sum reduction) ---------------------------------------------------------------------

def rho(r: np.ndarray, loss: str, k: float) -> np.ndarray:
    """Per-residual loss: ½r² or Huber with threshold k (same units as the log residual)."""
    if loss == "squared":
        return 0.5 * r * r
    a = np.abs(r)
    return np.where(a <= k, 0.5 * r * r, k * (a - 0.5 * k))


def psi(r: np.ndarray, loss: str, k: float) -> np.ndarray:
    """Derivative of `rho`."""
    return r if loss == "squared" else np.clip(r, -k, k)


# ---- problem ------------------------------------------------------------------------------------

@dataclasses.dataclass
class Problem:
    """A law bound to inputs, groups and a parameter layout (unconstrained vector of length P)."""

    law: Law
    x: dict[str, np.ndarray]
    groups: np.ndarray
    group_names: tuple[str, ...]
    shared: frozenset[str]
    labels: list[str]
    param_of: list[str]
    group_of: list[str | None]
    cols: dict[str, np.ndarray]
    is_log: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    @property
    def n_params(self) -> int:
        return len(self.labels)

    @property
    def n_obs(self) -> int:
        return len(self.groups)

    def natural(self, u: np.ndarray) -> np.ndarray:
        """Unconstrained -> natural parameter values (any leading shape)."""
        return np.where(self.is_log, np.exp(np.where(self.is_log, u, 0.0)), u)

    def unconstrained(self, theta: np.ndarray) -> np.ndarray:
        return np.where(self.is_log, np.log(np.where(self.is_log, theta, 1.0)), theta)

    def _theta_obs(self, U: np.ndarray) -> dict[str, np.ndarray]:
        T = self.natural(U)
        return {name: T[:, self.cols[name]] for name in self.law.params}

    def predict(self, U: np.ndarray, x: dict[str, np.ndarray] | None = None,
                groups: np.ndarray | None = None) -> np.ndarray:
        """log-predictions (K, n) for parameter vectors U (K, P); defaults to the fitted inputs."""
        U = np.atleast_2d(U)
        if x is None:
            return self.law.core(self.x, self._theta_obs(U))[0]
        groups = np.zeros(len(next(iter(x.values()))), int) if groups is None else np.asarray(groups)
        cols = self._columns_for(groups)
        T = self.natural(U)
        return self.law.core(x, {name: T[:, cols[name]] for name in self.law.params})[0]

    def _columns_for(self, groups: np.ndarray) -> dict[str, np.ndarray]:
        out = {}
        for name in self.law.params:
            if name in self.shared or len(self.group_names) == 1:
                out[name] = np.full(len(groups), self.labels.index(name if name in self.labels else
                                                                      f"{name}[{self.group_names[0]}]"))
            else:
                idx = np.array([self.labels.index(f"{name}[{g}]") for g in self.group_names])
                out[name] = idx[groups]
        return out

    def residual_jacobian(self, U: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Residuals r = pred − log y (K, n) and Jacobian dr/du (K, n, P)."""
        T = self.natural(U)
        th = {name: T[:, self.cols[name]] for name in self.law.params}
        f, grads = self.law.core(self.x, th)
        K, n = f.shape
        J = np.zeros((K, n, self.n_params))
        rows = np.arange(n)
        for name in self.law.params:
            c = self.cols[name]
            g = grads[name] * (th[name] if name in self.law.positive else 1.0)  # chain rule for exp(u)
            J[:, rows, c] = g
        return f - Y, J

    def objective(self, U, Y, W, loss="squared", k=0.1) -> np.ndarray:
        U = np.atleast_2d(U)
        r = self.law.core(self.x, self._theta_obs(U))[0] - Y
        return np.sum(W * rho(r, loss, k), axis=-1)


def make_problem(law: Law, x: dict[str, Sequence[float]], log_y: np.ndarray,
                 groups: Sequence[str] | None = None, shared: Sequence[str] = ()) -> Problem:
    """Lay out parameters: shared ones once, the others once per group (in sorted group order)."""
    x = {k: np.asarray(x[k], float) for k in law.inputs}
    n = len(log_y)
    if groups is None:
        names, gidx = ("all",), np.zeros(n, int)
    else:
        names_arr, gidx = np.unique(np.asarray(groups, str), return_inverse=True)
        names = tuple(str(g) for g in names_arr)
    shared = frozenset(shared) if len(names) > 1 else frozenset(law.params)
    labels, param_of, group_of, cols = [], [], [], {}
    bounds = law.bounds(x, np.asarray(log_y, float))
    lo, hi, is_log = [], [], []
    for name in law.params:
        targets = [None] if name in shared else list(names)
        start = len(labels)
        for g in targets:
            labels.append(name if g is None else f"{name}[{g}]")
            param_of.append(name)
            group_of.append(g)
            b = bounds[name]
            pos = name in law.positive
            is_log.append(pos)
            lo.append(np.log(b[0]) if pos else b[0])
            hi.append(np.log(b[1]) if pos else b[1])
        cols[name] = np.full(n, start) if g is None else start + gidx
    return Problem(law, x, gidx, names, shared, labels, param_of, group_of, cols, np.array(is_log),
                   np.array(lo), np.array(hi))


# ---- single fit: grid of starts + L-BFGS-B ------------------------------------------------------

@dataclasses.dataclass
class Fit:
    """A point fit: natural parameters by label, objective, log-space R² and residuals."""

    problem: Problem
    u: np.ndarray
    objective: float
    r2: float
    residuals: np.ndarray
    converged: bool
    n_starts: int

    @property
    def params(self) -> dict[str, float]:
        return dict(zip(self.problem.labels, map(float, self.problem.natural(self.u))))


def _expand(init) -> list[dict[str, float]]:
    if isinstance(init, dict):
        names = list(init)
        return [dict(zip(names, combo)) for combo in itertools.product(*(init[n] for n in names))]
    return list(init)


def _start_grid(problem: Problem, log_y: np.ndarray) -> np.ndarray:
    """Initial points: the law's grid, with per-group parameters started from their group's own data
    (the k-th start of every group is combined into the k-th start)."""
    law = problem.law
    glob = _expand(law.init(problem.x, log_y))
    per_group = []
    for gi in range(len(problem.group_names)):
        m = problem.groups == gi
        per_group.append(_expand(law.init({k: v[m] for k, v in problem.x.items()}, log_y[m])))
    starts = []
    for k in range(len(glob)):
        u = np.empty(problem.n_params)
        for j in range(problem.n_params):
            nm, g = problem.param_of[j], problem.group_of[j]
            src = glob if g is None else per_group[problem.group_names.index(g)]
            v = src[min(k, len(src) - 1)][nm]
            u[j] = np.log(max(v, 1e-300)) if problem.is_log[j] else v
        starts.append(np.clip(u, problem.lo, problem.hi))
    return np.unique(np.array(starts), axis=0)


def _lbfgsb(problem: Problem, u0, y, w, loss, k, maxiter=2000):
    def fun(u):
        r, J = problem.residual_jacobian(u[None], y[None])
        return float(np.sum(w * rho(r[0], loss, k))), J[0].T @ (w * psi(r[0], loss, k))

    res = optimize.minimize(fun, u0, jac=True, method="L-BFGS-B", bounds=list(zip(problem.lo, problem.hi)),
                            options={"maxiter": maxiter, "ftol": 1e-15, "gtol": 1e-11, "maxcor": 20})
    return res.x, float(res.fun), bool(res.success)


def r2_log(log_y: np.ndarray, log_pred: np.ndarray, w: np.ndarray | None = None) -> float:
    """Coefficient of determination of log y."""
    w = np.ones_like(log_y) if w is None else w
    mu = np.sum(w * log_y) / np.sum(w)
    ss_tot = np.sum(w * (log_y - mu) ** 2)
    return float(1.0 - np.sum(w * (log_y - log_pred) ** 2) / ss_tot) if ss_tot > 0 else float("nan")


@single_threaded_blas
def fit(problem: Problem, log_y: np.ndarray, weights: np.ndarray | None = None, *, loss: str = "squared",
        huber_delta: float = 0.1, max_starts: int = 8) -> Fit:
    """Multi-start fit. Every point of the law's start grid is first refined by a vectorised
    Levenberg–Marquardt pass (all starts at once); L-BFGS-B then runs from the `max_starts` best
    distinct refined points, and the lowest objective wins."""
    if loss not in LOSSES:
        raise ValueError(f"loss: {loss!r} is unknown; use one of {LOSSES}")
    log_y = np.asarray(log_y, float)
    w = np.ones_like(log_y) if weights is None else np.asarray(weights, float)
    starts = _start_grid(problem, log_y)
    M = len(starts)
    refined, obj, _ = refit_batched(problem, starts, np.tile(log_y, (M, 1)), np.tile(w, (M, 1)), loss=loss,
                                    huber_delta=huber_delta, max_iter=60)
    refined = np.where(np.isfinite(refined), refined, starts)
    obj = np.where(np.isfinite(obj), obj, np.inf)
    order, seen = [], set()
    for i in np.argsort(obj):
        key = tuple(np.round(refined[i], 4))
        if key not in seen:
            seen.add(key)
            order.append(i)
        if len(order) == max_starts:
            break
    best = None
    for i in order:
        u, f, ok = _lbfgsb(problem, refined[i], log_y, w, loss, huber_delta)
        if best is None or f < best[1]:
            best = (u, f, ok)
    u, f, ok = best
    pred = problem.predict(u[None])[0]
    return Fit(problem, u, f, r2_log(log_y, pred, w), log_y - pred, ok, M)


# ---- batched refits (bootstrap) -----------------------------------------------------------------

@single_threaded_blas
def refit_batched(problem: Problem, u0: np.ndarray, Y: np.ndarray, W: np.ndarray, *, loss: str = "squared",
                  huber_delta: float = 0.1, max_iter: int = 200, tol: float = 1e-10
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Refit K data sets at once, warm-started from u0 (P,) or from one start per set (K, P):
    Levenberg–Marquardt on the (IRLS-weighted, for Huber) Gauss–Newton model, with per-sample damping
    and box bounds. Returns U (K, P), objective (K,) and a converged flag (K,). Samples with fewer
    weighted points than parameters get NaN."""
    K, P = Y.shape[0], problem.n_params
    U = np.array(np.broadcast_to(np.clip(u0, problem.lo, problem.hi), (K, P)))
    obj = problem.objective(U, Y, W, loss, huber_delta)
    lam = np.full(K, 1e-4)
    done = np.zeros(K, bool)
    eye = np.eye(P)
    for _ in range(max_iter):
        act = np.flatnonzero(~done)
        if act.size == 0:
            break
        Ua, Ya, Wa = U[act], Y[act], W[act]
        r, J = problem.residual_jacobian(Ua, Ya)
        wt = Wa * (1.0 if loss == "squared" else np.minimum(1.0, huber_delta / np.maximum(np.abs(r), 1e-300)))
        g = np.einsum("kn,knp->kp", Wa * psi(r, loss, huber_delta), J)
        H = np.einsum("knp,kn,knq->kpq", J, wt, J)
        dg = np.einsum("kpp->kp", H)
        A = H + lam[act, None, None] * (dg[:, :, None] * eye + 1e-9 * eye)
        step = -np.linalg.solve(A, g[..., None])[..., 0]
        Un = np.clip(Ua + step, problem.lo, problem.hi)
        objn = problem.objective(Un, Ya, Wa, loss, huber_delta)
        better = objn <= obj[act]
        small = np.abs(obj[act] - objn) <= tol * np.maximum(obj[act], 1e-30)
        gsmall = np.max(np.abs(g), axis=1) <= 1e-12 * np.maximum(1.0, obj[act])
        idx = act[better]
        U[idx], obj[idx] = Un[better], objn[better]
        lam[idx] = np.maximum(lam[idx] / 4.0, 1e-12)
        lam[act[~better]] *= 8.0
        done[act[(better & small) | gsmall | (lam[act] > 1e12)]] = True
    ok = done & (np.sum(W > 0, axis=1) >= P)
    U[np.sum(W > 0, axis=1) < P] = np.nan
    return U, obj, ok


@single_threaded_blas
def refit_sequential(problem: Problem, u0: np.ndarray, Y: np.ndarray, W: np.ndarray, *, loss: str = "squared",
                     huber_delta: float = 0.1) -> np.ndarray:
    """Reference implementation of `refit_batched`: one warm-started L-BFGS-B per sample."""
    return np.array([_lbfgsb(problem, u0, y, w, loss, huber_delta)[0] for y, w in zip(Y, W)])


# ---- bootstrap intervals ------------------------------------------------------------------------

def small_sample_inflation(n_seeds: int) -> float:
    """sqrt(n/(n−1)): the seed bootstrap's variance of a mean of n seeds is (n−1)/n of the true one."""
    return float(np.sqrt(n_seeds / (n_seeds - 1))) if n_seeds > 1 else float("nan")


def bootstrap_intervals(problem: Problem, u_hat: np.ndarray, U: np.ndarray, level: float = 0.9,
                        inflation: float = 1.0) -> dict[str, dict[str, float]]:
    """Percentile intervals in unconstrained space (log for positive parameters), with the bootstrap
    deviations from the point estimate scaled by `inflation`; returned in natural units."""
    ok = np.all(np.isfinite(U), axis=1)
    out = {}
    for j, label in enumerate(problem.labels):
        est = float(problem.natural(u_hat)[j])
        if ok.sum() < 2 or not np.isfinite(inflation):
            out[label] = {"estimate": est, "lo": float("nan"), "hi": float("nan"), "std": float("nan")}
            continue
        s = u_hat[j] + inflation * (U[ok, j] - u_hat[j])
        qlo, qhi = np.quantile(s, [(1 - level) / 2, (1 + level) / 2])
        nat = np.exp(s) if problem.is_log[j] else s
        lo, hi = (np.exp([qlo, qhi]) if problem.is_log[j] else (qlo, qhi))
        out[label] = {"estimate": est, "lo": float(lo), "hi": float(hi), "std": float(np.std(nat, ddof=1))}
    return out


def prediction_band(problem: Problem, u_hat: np.ndarray, U: np.ndarray, x: dict[str, np.ndarray],
                    groups: np.ndarray | None = None, level: float = 0.9, inflation: float = 1.0):
    """Point prediction and pointwise percentile band (natural units) on new inputs."""
    est = np.exp(problem.predict(u_hat[None], x, groups)[0])
    ok = np.all(np.isfinite(U), axis=1)
    if ok.sum() < 2 or not np.isfinite(inflation):
        nan = np.full_like(est, np.nan)
        return est, nan, nan
    Us = u_hat + inflation * (U[ok] - u_hat)
    lp = problem.predict(Us, x, groups)
    lo, hi = np.quantile(lp, [(1 - level) / 2, (1 + level) / 2], axis=0)
    return est, np.exp(lo), np.exp(hi)
