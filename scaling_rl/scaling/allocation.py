"""Compute-optimal allocation of UTD σ and model size N for a data-efficiency law.

Compute to reach J: C = 10·N·B·σ·D FLOPs (N parameters, B batch size, σ gradient steps per env step,
D env steps). Budget: F = C + δ·D, δ = the cost of one env step in FLOPs. With u = 10·N·B·σ (FLOPs
per env step), F = (u + δ)·D(σ, N).

For D = D_min·(1 + (a/σ)^α + (b/N)^β) and B = B0·σ^s, log F is convex in (log σ, log N) (a log-sum-exp
plus a softplus of linear functions), so the stationary point is the optimum. Writing x = (a/σ)^α,
y = (b/N)^β, e = 1 + s and w = u/(u+δ), stationarity reads e·w = α·x/(1+x+y) and w = β·y/(1+x+y):
- the *two-term* model (D ≈ D_min·(x + y), far above D_min) gives w = αβ/(eβ + α) exactly, hence
  u* = δ·w/(1−w) and a 2×2 linear system in (log σ, log N): a closed form;
- the full model reduces to one monotone equation in y, solved by bracketing (`optimum_semi_analytic`).
`optimum_numerical` minimises F with L-BFGS-B in log space for any batch-size model; tests check that
all three agree.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import optimize, special

from .fitting import single_threaded_blas

FLOPS_FACTOR = 10.0  # C = 10·N·B·σ·D, as in the value-scaling papers


def compute_flops(N, B, sigma, D):
    """C = 10·N·B·σ·D."""
    return FLOPS_FACTOR * np.asarray(N, float) * np.asarray(B, float) * np.asarray(sigma, float) * np.asarray(D, float)


def budget(C, D, delta: float):
    """F = C + δ·D."""
    return np.asarray(C, float) + delta * np.asarray(D, float)


@dataclasses.dataclass(frozen=True)
class BatchModel:
    """The batch size used at (σ, N): constant, B0·σ^s, or B*(σ,N) = a/(σ^α·(1+(b/N)^c))."""

    kind: str                      # "constant" | "power" | "sigma_n"
    params: dict

    @staticmethod
    def constant(B: float) -> "BatchModel":
        return BatchModel("constant", {"B0": float(B), "s": 0.0})

    @staticmethod
    def power(B0: float, s: float) -> "BatchModel":
        return BatchModel("power", {"B0": float(B0), "s": float(s)})

    def log_b(self, ls, ln):
        """log B and its derivatives with respect to log σ and log N."""
        p = self.params
        if self.kind in ("constant", "power"):
            return math.log(p["B0"]) + p["s"] * ls, p["s"] + 0.0 * ls, 0.0 * ln
        z = p["c"] * (math.log(p["b"]) - ln)
        sp = np.logaddexp(0.0, z)
        return math.log(p["a"]) - p["alpha"] * ls - sp, -p["alpha"] + 0.0 * ls, p["c"] * np.exp(z - sp)

    def __call__(self, sigma, N):
        return np.exp(self.log_b(np.log(np.asarray(sigma, float)), np.log(np.asarray(N, float)))[0])

    @property
    def closed_form_ok(self) -> bool:
        return self.kind in ("constant", "power")

    def to_dict(self) -> dict:
        return {"kind": self.kind, **self.params}

    @staticmethod
    def from_dict(d: dict) -> "BatchModel":
        d = dict(d)
        return BatchModel(d.pop("kind"), d)


def log_data(p: dict, ls, ln, two_term: bool = False):
    """log D(σ, N) for D_min·(1+(a/σ)^α+(b/N)^β) (without the 1 if `two_term`) and its derivatives
    with respect to log σ and log N."""
    lx = p["alpha"] * (math.log(p["a"]) - ls)
    ly = p["beta"] * (math.log(p["b"]) - ln)
    m = np.maximum(lx, ly) if two_term else np.maximum(0.0, np.maximum(lx, ly))
    e0, ex, ey = (0.0 if two_term else np.exp(-m)), np.exp(lx - m), np.exp(ly - m)
    s = e0 + ex + ey
    return math.log(p["D_min"]) + m + np.log(s), -p["alpha"] * ex / s, -p["beta"] * ey / s


def log_budget(p: dict, batch: BatchModel, delta: float, ls, ln, two_term: bool = False):
    """log F(σ, N) and its gradient in (log σ, log N)."""
    lb, dbs, dbn = batch.log_b(ls, ln)
    lu = math.log(FLOPS_FACTOR) + lb + ls + ln
    lF_cost = np.logaddexp(lu, math.log(delta)) if delta > 0 else lu
    w = np.exp(lu - lF_cost)
    ld, dds, ddn = log_data(p, ls, ln, two_term)
    return lF_cost + ld, w * (1.0 + dbs) + dds, w * (1.0 + dbn) + ddn


def _point(p, batch, delta, ls, ln, method: str, two_term: bool = False, **extra) -> dict:
    sigma, N = float(np.exp(ls)), float(np.exp(ln))
    D = float(np.exp(log_data(p, ls, ln, two_term)[0]))
    B = float(batch(sigma, N))
    C = float(compute_flops(N, B, sigma, D))
    return {"sigma": sigma, "N": N, "B": B, "D": D, "C": C, "F": float(budget(C, D, delta)), "method": method, **extra}


@single_threaded_blas
def optimum_numerical(p: dict, batch: BatchModel, delta: float, *, sigma_range=(1e-4, 1e4),
                      n_range=(1e2, 1e13), fix_sigma: float | None = None, fix_n: float | None = None,
                      x0: tuple[float, float] | None = None, two_term: bool = False) -> dict:
    """argmin F over (σ, N) (or over one of them with the other fixed): L-BFGS-B on log F in
    (log σ, log N) from a small grid of starts. Flags a solution on the box edge."""
    lo = np.log([sigma_range[0], n_range[0]])
    hi = np.log([sigma_range[1], n_range[1]])
    free = np.array([fix_sigma is None, fix_n is None])
    fixed = np.log([fix_sigma or 1.0, fix_n or 1.0])

    def fun(z):
        v = fixed.copy()
        v[free] = z
        f, gs, gn = log_budget(p, batch, delta, v[0], v[1], two_term)
        return float(f), np.array([gs, gn], float)[free]

    if x0 is not None:
        starts = [np.log(x0)[free]]
    elif batch.closed_form_ok:  # log F is convex in (log σ, log N) here: one start finds the optimum
        starts = [(0.5 * (lo + hi))[free]]
    else:
        grids = [np.linspace(lo[i] + 0.2 * (hi[i] - lo[i]), hi[i] - 0.2 * (hi[i] - lo[i]), 3) for i in range(2)]
        starts = [np.array(s)[free] for s in np.array(np.meshgrid(*grids)).reshape(2, -1).T]
        starts = list({tuple(s): s for s in starts}.values())
    best = None
    for z0 in starts:
        r = optimize.minimize(fun, z0, jac=True, method="L-BFGS-B", bounds=list(zip(lo[free], hi[free])),
                              options={"ftol": 1e-15, "gtol": 1e-10, "maxiter": 1000})
        if best is None or r.fun < best.fun:
            best = r
    v = fixed.copy()
    v[free] = best.x
    edge = bool(np.any(np.isclose(v[free], lo[free], atol=1e-6) | np.isclose(v[free], hi[free], atol=1e-6)))
    out = _point(p, batch, delta, v[0], v[1], "numerical", two_term, at_bound=edge)
    if fix_sigma is not None:
        out["sigma"] = float(fix_sigma)   # exactly the value asked for, not exp(log(value))
    if fix_n is not None:
        out["N"] = float(fix_n)
    return out


def _power_batch(batch: BatchModel) -> tuple[float, float]:
    if not batch.closed_form_ok:
        raise ValueError("batch model: closed forms need a constant or power-law batch size B0·σ^s")
    e = 1.0 + batch.params["s"]
    if e <= 0:
        raise ValueError(f"batch model: B ∝ σ^{batch.params['s']:.3g} makes compute fall with σ; no optimum")
    return batch.params["B0"], e


def optimum_two_term(p: dict, batch: BatchModel, delta: float) -> dict:
    """Closed-form optimum of F for the two-term model D = D_min·((a/σ)^α + (b/N)^β)."""
    B0, e = _power_batch(batch)
    al, be = p["alpha"], p["beta"]
    w = al * be / (e * be + al)
    if not (0 < w < 1) or delta <= 0:
        raise ValueError("two-term model: no finite optimum (needs δ > 0 and αβ < eβ + α)")
    u = delta * w / (1 - w)
    k1 = math.log(u / (FLOPS_FACTOR * B0))
    k2 = math.log(e * be) + be * math.log(p["b"]) - math.log(al) - al * math.log(p["a"])
    det = e * be + al
    ls, ln = (be * k1 - k2) / det, (e * k2 + al * k1) / det
    sigma, N = math.exp(ls), math.exp(ln)
    D = p["D_min"] * ((p["a"] / sigma) ** al + (p["b"] / N) ** be)
    B = B0 * sigma ** (e - 1)
    C = float(compute_flops(N, B, sigma, D))
    return {"sigma": sigma, "N": N, "B": B, "D": D, "C": C, "F": C + delta * D, "method": "closed_form_two_term"}


@single_threaded_blas
def optimum_semi_analytic(p: dict, batch: BatchModel, delta: float) -> dict:
    """Optimum of F for the full model: the stationarity conditions reduce to one monotone equation
    in y = (b/N)^β, solved by bracketing in log y."""
    B0, e = _power_batch(batch)
    al, be = p["alpha"], p["beta"]
    r = e * be / al  # x = r·y

    def parts(t):  # t = log y
        ln = math.log(p["b"]) - t / be
        ls = math.log(p["a"]) - (math.log(r) + t) / al
        lu = math.log(FLOPS_FACTOR * B0) + e * ls + ln
        return ls, ln, lu

    def g(t):
        y = math.exp(t)
        _, _, lu = parts(t)
        lhs = be * y / (1 + y * (1 + r))
        rhs = float(special.expit(lu - math.log(delta))) if delta > 0 else 1.0  # no overflow
        return lhs - rhs

    t = optimize.brentq(g, -60.0, 60.0, xtol=1e-14, rtol=1e-14, maxiter=500)
    ls, ln, _ = parts(t)
    return _point(p, batch, delta, ls, ln, "semi_analytic")


@single_threaded_blas
def optimum(p: dict, batch: BatchModel, delta: float, **kw) -> dict:
    """Numerical optimum inside the search box, with the unconstrained semi-analytic optimum attached
    when the batch model allows it and both axes are free. `agree` compares the two only when the
    semi-analytic optimum lies inside the box (else None: the box binds and they must differ)."""
    num = optimum_numerical(p, batch, delta, **kw)
    if batch.closed_form_ok and kw.get("fix_sigma") is None and kw.get("fix_n") is None:
        try:
            ana = optimum_semi_analytic(p, batch, delta)
        except (ValueError, RuntimeError, OverflowError):
            return num
        sr, nr = kw.get("sigma_range", (1e-4, 1e4)), kw.get("n_range", (1e2, 1e13))
        inside = bool(sr[0] <= ana["sigma"] <= sr[1] and nr[0] <= ana["N"] <= nr[1])
        num["semi_analytic"] = {**{k: ana[k] for k in ("sigma", "N", "D", "F")}, "inside_box": inside}
        num["agree"] = bool(abs(math.log(ana["F"] / num["F"])) < 1e-6) if inside else None
    return num


def optimum_fast(p: dict, batch: BatchModel, delta: float, **kw) -> dict:
    """Semi-analytic optimum when available (bootstrap loops), else numerical."""
    if batch.closed_form_ok:
        try:
            return optimum_semi_analytic(p, batch, delta)
        except (ValueError, RuntimeError):
            pass
    return optimum_numerical(p, batch, delta, **kw)


@single_threaded_blas
def pareto_frontier(p: dict, batch: BatchModel, deltas: np.ndarray, **kw) -> list[dict]:
    """Data–compute Pareto frontier: optima of C + δ·D over a range of δ."""
    return [optimum_fast(p, batch, float(d), **kw) for d in deltas]


@single_threaded_blas
def optimum_sigma_only(p_sigma: dict, batch: BatchModel, delta: float, N: float,
                       sigma_range=(1e-4, 1e4)) -> dict:
    """For a one-model-size study, D(σ) = D_min + (β/σ)^α: argmin over σ of (10·N·B(σ)·σ + δ)·D(σ)."""
    def logF(ls):
        lb = batch.log_b(ls, math.log(N))[0]
        lu = math.log(FLOPS_FACTOR * N) + lb + ls
        ld = np.logaddexp(math.log(p_sigma["D_min"]), p_sigma["alpha"] * (math.log(p_sigma["beta"]) - ls))
        return float((np.logaddexp(lu, math.log(delta)) if delta > 0 else lu) + ld)

    r = optimize.minimize_scalar(logF, bounds=np.log(sigma_range), method="bounded",
                                 options={"xatol": 1e-10, "maxiter": 1000})
    sigma = float(np.exp(r.x))
    D = p_sigma["D_min"] + (p_sigma["beta"] / sigma) ** p_sigma["alpha"]
    B = float(batch(sigma, N))
    C = float(compute_flops(N, B, sigma, D))
    edge = bool(np.isclose(r.x, np.log(sigma_range), atol=1e-4).any())
    return {"sigma": sigma, "N": N, "B": B, "D": D, "C": C, "F": C + delta * D, "method": "numerical_sigma_only",
            "at_bound": edge}
