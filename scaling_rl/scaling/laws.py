"""Scaling laws as log-space predictors with analytic gradients.

Every law predicts log(y) from named inputs and named parameters; `core` returns the prediction and
its partial derivatives with respect to each *natural* parameter, vectorised over a leading batch
axis K (bootstrap samples or optimiser starts). The fitter (`fitting.py`) reparameterises positive
parameters as exp(u) and assembles Jacobians from these partials.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

Arrays = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Law:
    """A parametric law y = f(inputs; params), fitted as log y."""

    name: str
    formula: str
    inputs: tuple[str, ...]
    params: tuple[str, ...]
    positive: frozenset[str]
    # core(x: name -> (n,), theta: name -> (K, n)) -> (log_pred (K, n), d log_pred / d theta: name -> (K, n))
    core: Callable[[Arrays, Arrays], tuple[np.ndarray, Arrays]]
    # init(x, log_y) -> starting points (natural values) for the multi-start, either a list of full
    # parameter dicts or a dict name -> candidate values (expanded as a Cartesian grid)
    init: Callable[[Arrays, np.ndarray], "list[dict[str, float]] | dict[str, list[float]]"]
    # bounds(x, log_y) -> name -> (lo, hi) in natural units (keeps degenerate directions finite)
    bounds: Callable[[Arrays, np.ndarray], dict[str, tuple[float, float]]]

    def predict(self, x: Arrays, theta: dict[str, float]) -> np.ndarray:
        """Natural-scale prediction for one parameter set (no group structure)."""
        n = len(next(iter(x.values())))
        th = {k: np.full((1, n), float(v)) for k, v in theta.items()}
        return np.exp(self.core({k: np.asarray(v, float) for k, v in x.items()}, th)[0][0])


def _logsumexp0(*terms: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """log(1 + sum exp(t)) and the softmax weight of each term (stable)."""
    m = np.maximum.reduce([np.zeros_like(terms[0]), *terms])
    e0 = np.exp(-m)
    es = [np.exp(t - m) for t in terms]
    s = e0 + sum(es)
    return m + np.log(s), [e / s for e in es]


# ---- D_J(sigma) = D_min + (beta / sigma)^alpha -------------------------------------------------

def _de_sigma_core(x, th):
    ls = np.log(x["utd"])
    dmin, beta, alpha = th["D_min"], th["beta"], th["alpha"]
    lz = alpha * (np.log(beta) - ls)
    f = np.logaddexp(np.log(dmin), lz)
    pz = np.exp(lz - f)  # share of the sigma term in D
    return f, {"D_min": (1.0 - pz) / dmin, "beta": alpha / beta * pz, "alpha": (np.log(beta) - ls) * pz}


def _de_sigma_init(x, ly):
    # β carries units of σ·D^(1/α), so it is started from the data for each (D_min, α) pair.
    d0, dmed = float(np.exp(ly.min())), float(np.exp(np.median(ly)))
    smed = float(np.exp(np.median(np.log(x["utd"]))))
    starts = []
    for frac in (0.3, 0.7, 0.95):
        for alpha in (0.3, 1.0, 3.0):
            excess = max(dmed - frac * d0, 0.5 * frac * d0)
            starts.append({"D_min": frac * d0, "alpha": alpha, "beta": smed * excess ** (1 / alpha)})
    return starts


def _de_sigma_bounds(x, ly):
    dmin_lo, dmax = float(np.exp(ly.min())), float(np.exp(ly.max()))
    s = x["utd"]
    log_beta_hi = float(np.log(s.max())) + min(600.0, np.log(1e3 * dmax) / 0.05)
    return {"D_min": (dmin_lo * 1e-4, dmax * 2), "alpha": (5e-2, 20.0),
            "beta": (float(s.min()) * 1e-6, float(np.exp(log_beta_hi)))}


DATA_EFFICIENCY_SIGMA = Law(
    name="data_efficiency_sigma", formula="D_J(σ) = D_min + (β/σ)^α",
    inputs=("utd",), params=("D_min", "beta", "alpha"), positive=frozenset({"D_min", "beta", "alpha"}),
    core=_de_sigma_core, init=_de_sigma_init, bounds=_de_sigma_bounds)


# ---- D_J(sigma, N) = D_min * (1 + (a / sigma)^alpha + (b / N)^beta) ------------------------------

def _de_sigma_n_core(x, th):
    ls, ln = np.log(x["utd"]), np.log(x["param_count"])
    dmin, a, alpha, b, beta = th["D_min"], th["a"], th["alpha"], th["b"], th["beta"]
    la, lb = np.log(a) - ls, np.log(b) - ln
    lse, (px, py) = _logsumexp0(alpha * la, beta * lb)
    f = np.log(dmin) + lse
    return f, {"D_min": 1.0 / dmin, "a": alpha / a * px, "alpha": la * px,
               "b": beta / b * py, "beta": lb * py}


def _de_sigma_n_init(x, ly):
    d0 = float(np.exp(ly.min()))
    s, n = np.log(x["utd"]), np.log(x["param_count"])
    return {"D_min": [0.3 * d0, 0.8 * d0], "a": list(np.exp(np.quantile(s, [0.25, 0.75]))),
            "alpha": [0.4, 1.0, 2.5], "b": list(np.exp(np.quantile(n, [0.25, 0.75]))),
            "beta": [0.4, 1.0, 2.5]}


def _de_sigma_n_bounds(x, ly):
    dmin_lo, dmax = float(np.exp(ly.min())), float(np.exp(ly.max()))
    s, n = x["utd"], x["param_count"]
    return {"D_min": (dmin_lo * 1e-4, dmax * 2), "alpha": (1e-2, 20.0), "beta": (1e-2, 20.0),
            "a": (float(s.min()) * 1e-6, float(s.max()) * 1e6),
            "b": (float(n.min()) * 1e-6, float(n.max()) * 1e6)}


DATA_EFFICIENCY_SIGMA_N = Law(
    name="data_efficiency_sigma_n", formula="D_J(σ,N) = D_min·(1 + (a/σ)^α + (b/N)^β)",
    inputs=("utd", "param_count"), params=("D_min", "a", "alpha", "b", "beta"),
    positive=frozenset({"D_min", "a", "alpha", "b", "beta"}),
    core=_de_sigma_n_core, init=_de_sigma_n_init, bounds=_de_sigma_n_bounds)


# ---- the laws nested in D_J(σ, N): drop the σ term, the N term, or both ------------------------

_TERMS = {"utd": ("a", "alpha"), "param_count": ("b", "beta")}


def _nested_de_law(terms: tuple[str, ...], name: str, formula: str) -> Law:
    """D_min·(1 + Σ_{x in terms} (c_x/x)^e_x): the full law with the other terms removed. Inputs are
    always (utd, param_count), so every nested law takes the same data."""
    params = ("D_min",) + tuple(p for t in terms for p in _TERMS[t])

    def core(x, th):
        dmin = th["D_min"]
        if not terms:
            return np.log(dmin) + 0.0 * x["utd"], {"D_min": 1.0 / dmin}
        logs = []
        for t in terms:
            c, e = _TERMS[t]
            logs.append(np.log(th[c]) - np.log(x[t]))
        lse, shares = _logsumexp0(*[th[_TERMS[t][1]] * lg for t, lg in zip(terms, logs)])
        grads = {"D_min": 1.0 / dmin}
        for t, lg, p in zip(terms, logs, shares):
            c, e = _TERMS[t]
            grads[c] = th[e] / th[c] * p
            grads[e] = lg * p
        return np.log(dmin) + lse, grads

    def init(x, ly):
        full = _de_sigma_n_init(x, ly)
        return {k: v for k, v in full.items() if k in params}

    def bounds(x, ly):
        return {k: v for k, v in _de_sigma_n_bounds(x, ly).items() if k in params}

    return Law(name=name, formula=formula, inputs=("utd", "param_count"), params=params,
               positive=frozenset(params), core=core, init=init, bounds=bounds)


DATA_EFFICIENCY_SIGMA_ONLY = _nested_de_law(("utd",), "data_efficiency_sigma_only", "D_J(σ,N) = D_min·(1 + (a/σ)^α)")
DATA_EFFICIENCY_N_ONLY = _nested_de_law(("param_count",), "data_efficiency_n_only", "D_J(σ,N) = D_min·(1 + (b/N)^β)")
DATA_EFFICIENCY_CONSTANT = _nested_de_law((), "data_efficiency_constant", "D_J(σ,N) = D_min")
# Candidates for model selection, most to least complex; `terms` says which inputs a law depends on.
DATA_EFFICIENCY_FAMILY = (
    (DATA_EFFICIENCY_SIGMA_N, ("utd", "param_count")),
    (DATA_EFFICIENCY_SIGMA_ONLY, ("utd",)),
    (DATA_EFFICIENCY_N_ONLY, ("param_count",)),
    (DATA_EFFICIENCY_CONSTANT, ()),
)


# ---- D_J(σ) constant: the law nested in D_min + (β/σ)^α -------------------------------------------

def _const_core(x, th):
    return np.log(th["D_min"]) + 0.0 * x["utd"], {"D_min": 1.0 / th["D_min"]}


DATA_EFFICIENCY_SIGMA_CONSTANT = Law(
    name="data_efficiency_sigma_constant", formula="D_J(σ) = D_min", inputs=("utd",), params=("D_min",),
    positive=frozenset({"D_min"}), core=_const_core,
    init=lambda x, ly: {"D_min": [float(np.exp(np.mean(ly)))]},
    bounds=lambda x, ly: {"D_min": _de_sigma_bounds(x, ly)["D_min"]})


# ---- B*(sigma, N) = a / (sigma^alpha * (1 + (b / N)^c)) ----------------------------------------

def _bs_sigma_n_core(x, th):
    ls, ln = np.log(x["utd"]), np.log(x["param_count"])
    a, alpha, b, c = th["a"], th["alpha"], th["b"], th["c"]
    lb = np.log(b) - ln
    sp = np.logaddexp(0.0, c * lb)
    p = np.exp(c * lb - sp)
    f = np.log(a) - alpha * ls - sp
    return f, {"a": 1.0 / a, "alpha": -ls + 0.0 * a, "b": -c / b * p, "c": -lb * p}


def _bs_sigma_n_init(x, ly):
    n = np.log(x["param_count"])
    return {"a": [float(np.exp(ly.max())), float(np.exp(ly.max())) * 3], "alpha": [0.0, 0.5],
            "b": list(np.exp(np.quantile(n, [0.0, 0.5, 1.0]))), "c": [0.5, 2.0]}


def _bs_sigma_n_bounds(x, ly):
    n = x["param_count"]
    return {"a": (float(np.exp(ly.min())) * 1e-3, float(np.exp(ly.max())) * 1e4), "alpha": (-5.0, 5.0),
            "b": (float(n.min()) * 1e-6, float(n.max()) * 1e6), "c": (1e-2, 20.0)}


BATCH_SIZE_SIGMA_N = Law(
    name="batch_size_sigma_n", formula="B*(σ,N) = a / (σ^α·(1 + (b/N)^c))",
    inputs=("utd", "param_count"), params=("a", "alpha", "b", "c"), positive=frozenset({"a", "b", "c"}),
    core=_bs_sigma_n_core, init=_bs_sigma_n_init, bounds=_bs_sigma_n_bounds)


# ---- y = A * x^s (a line in log-log; used with a shared slope and per-task coefficients) ---------

def power_law(input_name: str, name: str | None = None) -> Law:
    """y = A·x^s on input `input_name`; A > 0, s free."""

    def core(x, th):
        lx = np.log(x[input_name])
        a, s = th["A"], th["s"]
        return np.log(a) + s * lx, {"A": 1.0 / a, "s": lx + 0.0 * s}

    def init(x, ly):
        lx = np.log(x[input_name])
        slope = float(np.polyfit(lx, ly, 1)[0]) if np.ptp(lx) > 0 else 0.0
        return {"s": [slope, 0.0], "A": [float(np.exp(np.mean(ly - slope * lx)))]}

    def bounds(x, ly):
        return {"A": (1e-300, 1e300), "s": (-20.0, 20.0)}

    return Law(name=name or f"power_law_{input_name}", formula=f"y = A·{input_name}^s", inputs=(input_name,),
               params=("A", "s"), positive=frozenset({"A"}), core=core, init=init, bounds=bounds)


BATCH_SIZE_SIGMA = power_law("utd", "batch_size_sigma")
LR_SIGMA = power_law("utd", "lr_sigma")
