"""Robust fitting of scaling laws: log-space residuals, sum-reduced squared or Huber loss,
positivity by reparameterisation, and ONE multi-start estimator (`fit_many`) used for the point fit
and for every bootstrap / jackknife replicate alike; identifiability checks, AICc, and bootstrap
intervals (percentile, of the replicates centred on the estimate) that contain their estimate or are absent
with a reason.

A `Problem` ties a `Law` to data with optional groups (tasks): each law parameter is either shared by
all groups or has one value per group. Parameters are optimised in an unconstrained vector u:
positive ones as log(θ), the rest as θ.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import threading
from typing import Sequence

import numpy as np
from scipy import optimize, special, stats
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
    """Lay out parameters: shared ones once, the others once per group (in sorted group order).
    ValueError (one line) when x lacks one of the law's inputs or its length differs from log_y's."""
    missing = [k for k in law.inputs if k not in x]
    if missing:
        raise ValueError(f"{law.name}: inputs {missing} missing (the law takes {list(law.inputs)}, got {sorted(x)})")
    x = {k: np.asarray(x[k], float) for k in law.inputs}
    bad = [k for k, v in x.items() if v.shape != np.shape(log_y)]
    if bad:
        raise ValueError(f"{law.name}: input(s) {bad} have {[x[k].shape for k in bad]} values for "
                         f"{np.shape(log_y)} observations")
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

    @property
    def params(self) -> dict[str, float]:
        return dict(zip(self.problem.labels, map(float, self.problem.natural(self.u))))


def _expand(init) -> list[dict[str, float]]:
    if isinstance(init, dict):
        names = list(init)
        return [dict(zip(names, combo)) for combo in itertools.product(*(init[n] for n in names))]
    return list(init)


def _start_grid(problem: Problem, log_y: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Initial points: the law's grid from the observed points (`mask`), with per-group parameters
    started from their group's own data (the k-th start of every group is combined into the k-th)."""
    law = problem.law
    mask = np.ones(len(log_y), bool) if mask is None else mask
    init = law.init({k: v[mask] for k, v in problem.x.items()}, log_y[mask])
    if len(problem.group_names) == 1 and isinstance(init, dict):  # fast path (one call per replicate)
        cols = [np.asarray(init[problem.param_of[j]], float) for j in range(problem.n_params)]
        grid = np.stack([g.ravel() for g in np.meshgrid(*cols, indexing="ij")], axis=1)
        grid = np.where(problem.is_log, np.log(np.maximum(grid, 1e-300)), grid)
        return np.unique(np.clip(grid, problem.lo, problem.hi), axis=0)
    glob = _expand(init)
    per_group = []
    for gi in range(len(problem.group_names)):
        m = (problem.groups == gi) & mask
        if not m.any():
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


@dataclasses.dataclass
class BatchFit:
    """Fits of K data sets by the one estimator: U (K, P) unconstrained parameters, objective (K,),
    and status (K,): "ok", "too_few_points" (fewer observed points than parameters + 1) or
    "non_finite" (the optimiser ended on a non-finite objective). Failed rows of U are NaN."""

    U: np.ndarray
    objective: np.ndarray
    status: np.ndarray

    @property
    def ok(self) -> np.ndarray:
        return self.status == "ok"


def min_points(problem: Problem) -> int:
    """Fewest observed points a fit accepts: one more than the parameters (a residual degree of
    freedom, so the fit is tested by the data instead of interpolating them)."""
    return problem.n_params + 1


@single_threaded_blas
def fit_many(problem: Problem, LY: np.ndarray, W: np.ndarray | None = None, *, loss: str = "squared",
             huber_delta: float = 0.1, max_starts: int = 8, warm: np.ndarray | None = None) -> BatchFit:
    """THE estimator, for K data sets at once (rows of LY (K, n), weights W (K, n), 0 = missing).

    Per data set: the law's start grid (from that data set's observed points; plus `warm`, if given,
    as one more start — in addition to the grid, never instead of it) -> 30 Levenberg–Marquardt
    iterations on every start at once (vectorised over all data sets × starts) -> the `max_starts`
    best distinct points iterated by LM to convergence (at most 150 more) -> L-BFGS-B (box bounds) from the best; lowest
    objective wins. The point fit is the K = 1 case, so a bootstrap replicate is fitted exactly like
    the point estimate."""
    if loss not in LOSSES:
        raise ValueError(f"loss: {loss!r} is unknown; use one of {LOSSES}")
    LY = np.atleast_2d(np.asarray(LY, float))
    W = np.ones_like(LY) if W is None else np.atleast_2d(np.asarray(W, float))
    W = np.where(np.isfinite(LY), W, 0.0)
    LY = np.where(W > 0, LY, 0.0)
    K, P = LY.shape[0], problem.n_params
    U = np.full((K, P), np.nan)
    obj = np.full(K, np.nan)
    status = np.full(K, "ok", dtype=object)
    starts, owner = [], []
    for k in range(K):
        m = W[k] > 0
        if m.sum() < min_points(problem):
            status[k] = "too_few_points"
            continue
        S = _start_grid(problem, LY[k], m)
        if warm is not None and np.all(np.isfinite(warm)):
            S = np.vstack([S, np.clip(warm, problem.lo, problem.hi)])
        starts.append(S)
        owner.append(np.full(len(S), k))
    if not starts:
        return BatchFit(U, obj, status)
    A, own = np.vstack(starts), np.concatenate(owner)
    R, ob, _ = _lm(problem, A, LY[own], W[own], loss=loss, huber_delta=huber_delta, max_iter=30)
    R = np.where(np.isfinite(R), R, A)
    ob = np.where(np.isfinite(ob), ob, np.inf)
    pick = []
    for k in np.unique(own):
        rows = np.flatnonzero(own == k)
        seen = set()
        for i in rows[np.argsort(ob[rows], kind="stable")]:
            key = tuple(np.round(R[i], 4))
            if key not in seen:
                seen.add(key)
                pick.append(i)
            if len(seen) == max_starts:
                break
    pick = np.array(pick)
    R2, ob2, conv = _lm(problem, R[pick], LY[own[pick]], W[own[pick]], loss=loss, huber_delta=huber_delta,
                        max_iter=150)
    ob2 = np.where(np.isfinite(ob2), ob2, np.inf)
    span = np.maximum(problem.hi - problem.lo, 1.0)
    for k in np.unique(own[pick]):
        rows = np.flatnonzero(own[pick] == k)
        i = rows[np.argmin(ob2[rows])]
        u, f = R2[i], ob2[i]
        near = np.any((u - problem.lo <= 1e-3 * span) | (problem.hi - u <= 1e-3 * span))
        if near or not conv[i]:
            # L-BFGS-B handles active bounds exactly, and finishes what LM did not; it only polishes,
            # never making the LM point worse. (An interior converged LM point is already a minimum.)
            ul, fl, _ = _lbfgsb(problem, R2[i], LY[k], W[k], loss, huber_delta)
            if fl <= f:
                u, f = ul, fl
        if np.isfinite(f) and np.all(np.isfinite(u)):
            U[k], obj[k] = u, f
        else:
            status[k] = "non_finite"
    return BatchFit(U, obj, status)


def fit(problem: Problem, log_y: np.ndarray, weights: np.ndarray | None = None, *, loss: str = "squared",
        huber_delta: float = 0.1, max_starts: int = 8) -> Fit:
    """The point fit: `fit_many` on one data set. ValueError if it cannot be fitted."""
    log_y = np.asarray(log_y, float)
    w = np.ones_like(log_y) if weights is None else np.asarray(weights, float)
    bf = fit_many(problem, log_y[None], w[None], loss=loss, huber_delta=huber_delta, max_starts=max_starts)
    if not bf.ok[0]:
        raise ValueError(f"fit: {problem.law.name} could not be fitted ({bf.status[0]}: {int((w > 0).sum())} "
                         f"points for {problem.n_params} parameters)")
    u = bf.U[0]
    pred = problem.predict(u[None])[0]
    return Fit(problem, u, float(bf.objective[0]), r2_log(log_y, pred, w), log_y - pred)


# ---- batched refits (bootstrap) -----------------------------------------------------------------

def _lm(problem: Problem, u0: np.ndarray, Y: np.ndarray, W: np.ndarray, *, loss: str = "squared",
        huber_delta: float = 0.1, max_iter: int = 200, tol: float = 1e-10
        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """K local fits at once from u0 (P,) or one start per row (K, P): Levenberg–Marquardt on the
    (IRLS-weighted, for Huber) Gauss–Newton model, with per-row damping and box bounds (a stage of
    `fit_many`, not an estimator on its own). Returns U (K, P), objective (K,), converged (K,)."""
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


# ---- identifiability and model choice -----------------------------------------------------------

RIDGE_FACTOR = 10.0   # a positive parameter whose Wald interval spans more than ×/÷ this is not identified
RIDGE_FREE = 2.0      # ... and a free one (a slope) whose interval half-width exceeds this
NOISE_FLOOR = 0.01    # log-units: no fit is trusted to be more exact than 1% (keeps perfect fits honest)


def aicc(rss: float, n: int, n_params: int) -> float:
    """Small-sample AIC of a Gaussian fit in log space, the noise variance counted as a parameter;
    NaN when n − k − 1 <= 0 (too few points to compare this law at all)."""
    k = n_params + 1
    if n - k - 1 <= 0:
        return float("nan")
    return float(n * math.log(max(rss / n, NOISE_FLOOR ** 2 * 1e-4)) + 2 * k + 2 * k * (k + 1) / (n - k - 1))


def residual_standard_error(rss: float, n: int, n_params: int) -> float:
    return float(math.sqrt(rss / (n - n_params))) if n > n_params else float("nan")


def identifiability(problem: Problem, u: np.ndarray, log_y: np.ndarray, w: np.ndarray | None = None, *,
                    loss: str = "squared", huber_delta: float = 0.1, level: float = 0.9) -> list[str | None]:
    """Per parameter: None if the data pin it down, else why not — on an optimiser bound, or on a flat
    ridge (the Gauss–Newton Wald interval, over ALL parameters including any on a bound, spans more
    than ×/÷ RIDGE_FACTOR, or ±RIDGE_FREE for a free parameter; a singular curvature counts as
    infinitely flat). The residual variance is floored at NOISE_FLOOR² so a perfect fit is no excuse."""
    w = np.ones_like(log_y) if w is None else np.asarray(w, float)
    P = problem.n_params
    span = problem.hi - problem.lo
    on_bound = (np.abs(u - problem.lo) <= 1e-6 * np.maximum(span, 1.0)) | \
               (np.abs(u - problem.hi) <= 1e-6 * np.maximum(span, 1.0))
    r, J = problem.residual_jacobian(u[None], log_y[None])
    r, J = r[0], J[0]
    wt = w * (1.0 if loss == "squared" else np.minimum(1.0, huber_delta / np.maximum(np.abs(r), 1e-300)))
    H = J.T @ (wt[:, None] * J)
    n = int(np.sum(w > 0))
    s2 = max(float(np.sum(w * r * r)) / max(n - P, 1), NOISE_FLOOR ** 2)
    ev, V = np.linalg.eigh(H)
    tiny = ev <= 1e-12 * max(float(ev.max()), 1e-300)
    inv = (V[:, ~tiny] / ev[~tiny]) @ V[:, ~tiny].T
    se = np.sqrt(np.maximum(np.diag(inv) * s2, 0.0))
    se[np.sum(V[:, tiny] ** 2, axis=1) > 1e-6] = np.inf
    half = _z(level) * se
    out: list[str | None] = []
    for j in range(P):
        if on_bound[j]:
            out.append("on the optimiser's bound")
        elif problem.is_log[j] and half[j] > math.log(RIDGE_FACTOR):
            out.append("flat ridge (the data allow " + ("any value" if not np.isfinite(half[j]) else
                       f"×/÷{math.exp(min(half[j], 700)):.3g}") + ")")
        elif not problem.is_log[j] and half[j] > RIDGE_FREE:
            out.append("flat ridge (the data allow " + ("any value" if not np.isfinite(half[j]) else
                       f"±{half[j]:.3g}") + ")")
        else:
            out.append(None)
    return out


# ---- intervals ------------------------------------------------------------------------------------

MIN_SEEDS = 4          # below this a seed bootstrap gives no calibrated interval
MAX_FAIL = 0.10        # a quantity whose replicates fail more often than this gets no interval


def _z(level: float) -> float:
    return float(special.ndtri((1 + level) / 2))


def small_sample_inflation(n_seeds: int) -> float:
    """sqrt(n/(n−1)): the seed bootstrap's variance of a mean of n seeds is (n−1)/n of the true one."""
    return float(np.sqrt(n_seeds / (n_seeds - 1))) if n_seeds > 1 else float("nan")


def seed_inflation(n_seeds: int, dof: float, level: float = 0.9) -> float:
    """Scale of seed-bootstrap deviations: sqrt(n/(n−1)) (the bootstrap's variance bias) × t_ν/z (the
    variance itself is estimated, from ν = Σ(n_c − 1) seed degrees of freedom of the points behind the
    quantity: ν = n − 1 for one configuration's D_J, far more for a law fitted to many points)."""
    if n_seeds < 2 or not dof >= 1:
        return float("nan")
    q = (1 + level) / 2
    return small_sample_inflation(n_seeds) * float(stats.t.ppf(q, dof) / special.ndtri(q))


def effective_dof(problem: Problem, u: np.ndarray, log_y: np.ndarray, w: np.ndarray,
                  n_seeds: np.ndarray) -> np.ndarray:
    """Welch–Satterthwaite degrees of freedom of each parameter (P,). Linearised, parameter p is
    Σ_i c_pi·log ȳ_i with c = (JᵀWJ)⁻¹JᵀW; point i's variance (∝ 1/w_i) is estimated from n_i − 1 seed
    degrees of freedom, so ν_p = (Σ_i c_pi²/w_i)² / Σ_i (c_pi²/w_i)²/(n_i − 1) — far fewer than
    Σ(n_i − 1) when a few points carry the parameter (measured 7–14 instead of 27–60 for D_min)."""
    w = np.asarray(w, float)
    n_seeds = np.asarray(n_seeds, float)
    _, J = problem.residual_jacobian(np.asarray(u, float)[None], np.asarray(log_y, float)[None])
    J = J[0]
    use = (w > 0) & (n_seeds >= 2)
    if use.sum() == 0:
        return np.full(problem.n_params, float("nan"))
    H = J.T @ (w[:, None] * J)
    C = np.linalg.pinv(H) @ (J * w[:, None]).T                       # (P, n)
    a = np.where(use[None], C ** 2 / np.where(w > 0, w, 1.0)[None], 0.0)
    den = np.sum(a ** 2 / np.maximum(n_seeds - 1, 1.0)[None], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        nu = np.sum(a, axis=1) ** 2 / den
    return np.where(np.isfinite(nu) & (den > 0), np.maximum(nu, 1.0), float(np.sum(n_seeds[use] - 1)))


def interval(estimate: float, reps: np.ndarray, jack: np.ndarray | None = None, *, level: float = 0.9,
             inflation: float = 1.0, log: bool = True, n_total: int | None = None,
             reason: str | None = None, unknown: int = 0) -> dict:
    """Bootstrap interval of one quantity (in log space for positive quantities): the percentile interval
    (Efron & Tibshirani 1993 §13.3; Davison & Hinkley 1997 §5.3.1) of the replicates shifted so that their
    median is the estimate, deviations scaled by `inflation`:

        [t + inflation·q_α(t* − med t*),  t + inflation·q_{1−α}(t* − med t*)],   α = (1 − level)/2

    The one rule, for every quantity. The shift is there because on this pipeline the bootstrap's centre is
    not the estimator's bias: a replicate re-selects among near-tied configurations and a D_J crossing is a
    nonlinear function of the seeds, so the replicates' centre sits off the point by a random amount that
    tracks the point's own error (docs/calibration.md), and reading it as bias (BCa, before) moved intervals
    away from the truth. Centred, the interval contains the estimate by construction (the median deviation
    is 0). `jack` is accepted and not used (no acceleration is estimated).

    NaN replicates are failures: with more than MAX_FAIL of `n_total` failed there is no interval and
    `reason` says why. Always returns n_ok / n; `centre_shift` is the median deviation that was removed
    (log units for positive quantities); a printed interval also records its `inflation` and whether it was
    made in `log` space (its ends scale exactly with the inflation about the estimate).

    `unknown` replicates (NaN among `reps`, not failures) have a value the data do not give (e.g. an optimum on
    the search box's edge): each is placed beyond both ends, which widens the interval (the lower end is
    the (α·(m+u) − u)/m quantile of the m others, the upper the (1−α)(m+u)/m one); when that runs out of
    replicates (u > (1 − level)/2 of them) there is no interval."""
    reps = np.asarray(reps, float)
    n = int(n_total if n_total is not None else reps.size)
    good = np.isfinite(reps) & ((reps > 0) if log else True)
    rec = {"estimate": float(estimate), "lo": None, "hi": None, "n_ok": int(good.sum()), "n": n}
    if unknown:
        rec["n_unknown"] = int(unknown)
    est = float(estimate)
    if reason is None:
        if n == 0:
            reason = "no bootstrap replicates"
        elif not np.isfinite(est) or (log and not est > 0):
            reason = "no finite estimate"
        elif n - good.sum() - unknown > MAX_FAIL * n:
            reason = f"{n - int(good.sum()) - unknown} of {n} replicates failed (more than {MAX_FAIL:.0%})"
        elif good.sum() < 10:
            reason = f"only {int(good.sum())} replicates"
        elif not np.isfinite(inflation):
            reason = "a single seed: no seed bootstrap"
    if reason is not None:
        rec["reason"] = reason
        return rec
    tf = np.log if log else (lambda v: v)
    t0 = float(tf(est))
    raw = tf(reps[good]) - t0
    shift = float(np.median(raw))
    dev = inflation * (raw - shift)
    dev = np.where(np.abs(dev) <= 1e-9 * max(1.0, abs(t0)), 0.0, dev)   # float noise is no spread
    m = dev.size
    rec["centre_shift"] = shift
    if not np.any(dev):
        rec["reason"] = ("no bootstrap spread: every replicate gives the estimate (e.g. the same grid point wins "
                         "in every resample), so the data cannot say how far off it is")
        return rec
    alpha = (1 - level) / 2
    qs = np.array([alpha, 1 - alpha])
    if unknown:
        qs = np.array([(qs[0] * (m + unknown) - unknown) / m, qs[1] * (m + unknown) / m])
        if qs[0] < 0 or qs[1] > 1:
            rec["reason"] = (f"{unknown} of {n} replicates have no value here (placed beyond both ends, more than "
                             f"the interval's tails hold)")
            return rec
        rec["widened_for_unknown"] = True
    # plotting positions i/(m+1): unbiased for the bootstrap distribution's quantiles, so the interval holds
    # `level` of it on average; linear interpolation's (i−1)/(m−1) held 0.856 of it at m = 40, 0.882 at 100
    lo, hi = t0 + np.quantile(dev, qs, method="weibull")
    rec.update(lo=float(np.exp(lo) if log else lo), hi=float(np.exp(hi) if log else hi), method="percentile",
               inflation=float(inflation), log=bool(log))
    return rec


def bootstrap_intervals(problem: Problem, u_hat: np.ndarray, U: np.ndarray, level: float = 0.9,
                        inflation: float = 1.0, jack: np.ndarray | None = None,
                        not_identified: Sequence[str | None] | None = None,
                        reason: str | None = None, dof: np.ndarray | None = None) -> dict[str, dict]:
    """`interval` of every parameter (`inflation` a scalar or one per parameter, then with its `dof`) (natural units) from replicate refits U (K, P; NaN rows failed)
    and jackknife refits `jack` (S, P). A parameter that is not identified gets no estimate at all."""
    nat_hat = problem.natural(u_hat)
    nat = problem.natural(U) if len(U) else np.zeros((0, problem.n_params))
    natj = problem.natural(jack) if jack is not None and len(jack) else None
    out = {}
    for j, label in enumerate(problem.labels):
        ni = not_identified[j] if not_identified is not None else None
        infl = float(inflation[j]) if np.ndim(inflation) else inflation
        rec = interval(float(nat_hat[j]), nat[:, j], None if natj is None else natj[:, j], level=level,
                       inflation=infl, log=bool(problem.is_log[j]), n_total=len(U), reason=reason)
        if np.ndim(inflation):
            rec["dof"] = float(dof[j]) if dof is not None else None
        if ni:
            rec.update(estimate=None, lo=None, hi=None, not_identified=ni, value_at_fit=float(nat_hat[j]))
        out[label] = rec
    return out


def prediction_band(problem: Problem, u_hat: np.ndarray, U: np.ndarray, x: dict[str, np.ndarray],
                    groups: np.ndarray | None = None, level: float = 0.9, inflation: float = 1.0,
                    jack: np.ndarray | None = None, reason: str | None = None):
    """Point prediction and pointwise interval (natural units) on new inputs, each point by `interval`
    (NaN where there is none)."""
    est = np.exp(problem.predict(u_hat[None], x, groups)[0])
    lo, hi = np.full_like(est, np.nan), np.full_like(est, np.nan)
    ok = np.all(np.isfinite(U), axis=1) if len(U) else np.zeros(0, bool)
    if ok.sum() < 2 or reason is not None or not np.isfinite(inflation):
        return est, lo, hi
    lp = np.full((len(U), len(est)), np.nan)
    lp[ok] = problem.predict(U[ok], x, groups)
    lj = None
    if jack is not None and len(jack):
        okj = np.all(np.isfinite(jack), axis=1)
        lj = np.full((len(jack), len(est)), np.nan)
        if okj.any():
            lj[okj] = problem.predict(jack[okj], x, groups)
    for i in range(len(est)):
        rec = interval(est[i], np.exp(lp[:, i]), None if lj is None else np.exp(lj[:, i]), level=level,
                       inflation=inflation, n_total=len(U))
        if rec["lo"] is not None:
            lo[i], hi[i] = rec["lo"], rec["hi"]
    return est, lo, hi
