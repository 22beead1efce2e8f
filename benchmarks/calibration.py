"""Calibration of the report's 90% intervals on synthetic studies unlike the analysis' own model.

    .venv/bin/python benchmarks/calibration.py --quick            # ~8 min on 2 cores: 5 seeds, 6 studies/generator
    .venv/bin/python benchmarks/calibration.py [--workers 16]      # full: 3, 5, 10 seeds × 40 studies/generator
    .venv/bin/python benchmarks/calibration.py --resume            # continue an interrupted run from its cache
    .venv/bin/python benchmarks/calibration.py --from-cache        # re-print the cached table
    .venv/bin/python benchmarks/calibration.py --points-only       # D_J point intervals only: ~1 s per study
    .venv/bin/python benchmarks/calibration.py --pooled            # coverage of `fit --pool-tasks` (3 tasks)

Every study is run through the whole pipeline (`scaling.analyze`: seed bootstrap, best configuration per
(σ, N) cell, WLS, law selection, allocation), exactly as `scaling-rl fit` would, at two fixed thresholds
J = 0.3, 0.5 in the truth's return units (normalize="none"). Generators (a 5 σ × 4 N grid):

  base         one configuration per cell, log-normal seed warp (sd 0.1 in log D): the benign case
  tied-B       4 batch sizes per cell, all equally good (flat optimum: the min over configs is biased)
  peaked-B     3 batch sizes per cell, a peaked optimum B*(σ) that moves with σ (κ = 0.3)
  heavy-tail   seed effects Student-t with 3 dof (same sd), one configuration per cell
  unequal      seeds per configuration drawn from n … 2n, one configuration per cell
  coarse       12 log points per curve over 4 decades (D_J is interpolated between points 2.3× apart)
  censored     the run stops before the slowest cells reach J = 0.5 (censored there)
  interaction  a σ×N interaction outside the fitted family: a(J) grows with N as (N/1e5)^0.3

Quantities and their targets (what a calibrated interval must cover):
  D_J          every cell's D_J point at both thresholds; target = the generator's exact D_J of the best
               configuration (truth × smallest slow-down among the configurations swept)
  D_min, a, alpha, b, beta, sigma*, N*   at J = 0.5; target = the law fitted without noise to the exact
               best-configuration D_J of every cell (the truth itself when it is in the family; for peaked-B
               and interaction the law's best approximation on this design, what a fit can claim to cover),
               and that law's compute-optimal (σ*, N*) with the true batch model (see `reference`).

Coverage is the fraction of printed intervals that contain the target; a withheld interval (no numbers) is
counted apart, not as a hit or a miss. The binomial interval (Wilson, 95%) uses the number of independent
studies as n (intervals inside one study are correlated; for D_J the per-study coverages are pooled), so
it is honest about the clustering. Rows outside 0.85–0.95 are flagged `LOW`/`HIGH`.

Raw per-interval rows are cached (atomic write) in benchmarks/results/calibration.csv (`--quick`:
calibration_quick.csv; `--points-only`: calibration_points.csv — both generated, not committed (git-ignored):
rerun to make them, ~2 min for 30 studies); the table is printed from them and
written beside them as .md. A run replaces the cached rows of the generators × seeds it runs (with `--resume`,
only the studies missing from them) and keeps every other row. The last line is `pooled_coverage=<x> [lo, hi]`.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import pandas as pd

from scaling_rl.io import atomic_write_text
from scaling_rl.scaling import allocation as alloc
from scaling_rl.scaling import analysis, curves, fitting, laws, report, synthetic
from scaling_rl.scaling.data import Curve, CurveSet

UTDS = tuple(np.geomspace(0.5, 8, 5))
UTDS_WIDE = tuple(np.geomspace(0.5, 16, 6))   # the high-UTD generator's grid: σ = 16 is where it degrades
PARAMS = (1e5, 3e5, 1e6, 3e6)
THRESHOLDS = (0.3, 0.5)
J_LAW = 1                      # index of the threshold whose law / allocation is checked
LAW_PARAMS = ("D_min", "a", "alpha", "b", "beta")
RESULTS = Path(__file__).resolve().parent / "results"


@dataclasses.dataclass(frozen=True)
class InteractionTruth(synthetic.Truth):
    """a(J) grows with N: D_J = D_min·(1 + (a(J)·(N/1e5)^g/σ)^α + (b/N)^β) — not in the fitted family."""
    g: float = 0.3

    def D(self, J, sigma, N, task_index: int = 0):
        p = self.params(J, task_index)
        a = p["a"] * (np.asarray(N, float) / 1e5) ** self.g
        return p["D_min"] * (1 + (a / np.asarray(sigma, float)) ** p["alpha"]
                             + (p["b"] / np.asarray(N, float)) ** p["beta"])


@dataclasses.dataclass(frozen=True)
class HighUTDTruth(synthetic.Truth):
    """High-UTD degradation the family cannot represent: the law × (1 + c·max(0, ln(σ/onset))²), a smooth (C¹)
    factor that is 1 up to σ = onset and grows beyond it. c = 0.12, onset = 4: at the sweep's middle N (5.5e5)
    D(σ = 16) is 5% above D(σ = 8) at every J (11% at N = 1e5, 0.7% at 3e6), where the law keeps falling.
    Realistic: past some UTD more gradient steps per env step overfit the replay data (TD-overfitting,
    plasticity loss), so the data needed rises again; the family's (a/σ)^α term can only flatten."""
    onset: float = 4.0
    c: float = 0.12

    def D(self, J, sigma, N, task_index: int = 0):
        s = np.asarray(sigma, float)
        return super().D(J, sigma, N, task_index) * (1 + self.c * np.maximum(0.0, np.log(s / self.onset)) ** 2)


@dataclasses.dataclass(frozen=True)
class LargeNTruth(synthetic.Truth):
    """Large models stop helping and start to hurt: the law × (1 + c·max(0, ln(N/onset))²), c = 0.1, onset = 1e6,
    so D at N = 3e6 is about 2% above D at 1e6 (σ = 2) where the law's (b/N)^β term promises 9% less.
    Realistic: a sweep that keeps η, B and the architecture fixed across sizes (no μP-style retuning) sees the
    largest networks train worse (optimisation and plasticity troubles of big value networks); the family can
    only saturate in N, never turn up."""
    onset: float = 1e6
    c: float = 0.1

    def D(self, J, sigma, N, task_index: int = 0):
        n = np.asarray(N, float)
        return super().D(J, sigma, N, task_index) * (1 + self.c * np.maximum(0.0, np.log(n / self.onset)) ** 2)


@dataclasses.dataclass(frozen=True)
class Generator:
    name: str
    truth: synthetic.Truth = synthetic.Truth()
    batch_sizes: tuple = (np.nan,)
    warp: str = "normal"           # "normal" | "t3"
    unequal: bool = False
    n_log: int = 120
    log_spaced: bool = True
    reach: float = 0.8             # run length: 1.25 × the slowest cell's D at this J
    noise: float = 0.1
    delta: float = 1.1e7           # FLOPs per env step: the reference optimum (σ*, N*) lies inside the box
    utds: tuple = UTDS
    misspecified: bool = False     # σ*, N* target: the truth's own compute optimum in the box (`true_optimum`)


GENERATORS = (
    Generator("base"),
    Generator("tied-B", truth=synthetic.Truth(kappa=0.0), batch_sizes=(128, 256, 512, 1024), delta=1e10),
    Generator("peaked-B", truth=synthetic.Truth(kappa=0.3), batch_sizes=(128, 512, 2048), delta=1e10),
    Generator("heavy-tail", warp="t3"),
    Generator("unequal", unequal=True),
    Generator("coarse", n_log=12),
    Generator("censored", reach=0.45),
    Generator("interaction", truth=InteractionTruth()),
    Generator("high-UTD", truth=HighUTDTruth(), utds=UTDS_WIDE, misspecified=True),
    Generator("large-N", truth=LargeNTruth(), misspecified=True, delta=1e8),
)
GEN = {g.name: g for g in GENERATORS}


def make_curves(gen: Generator, seeds: int, rng: int) -> CurveSet:
    """One study from `gen` with `seeds` seeds per configuration (n … 2n if gen.unequal)."""
    r = np.random.default_rng(rng)
    tr = gen.truth
    cells = [(s, n, b) for s in gen.utds for n in PARAMS for b in gen.batch_sizes]
    slow = {c: tr.slowdown(c[0], c[2], np.nan) for c in cells}
    t_max = 1.25 * max(tr.D(gen.reach, s, n) * slow[(s, n, b)] for s, n, b in cells)
    if gen.reach < max(THRESHOLDS):
        t_max /= 1.25
    steps = (np.geomspace(t_max / 1e4, t_max, gen.n_log) if gen.log_spaced
             else np.linspace(t_max / gen.n_log, t_max, gen.n_log))
    curves = []
    for s, n, b in cells:
        S = int(r.integers(seeds, 2 * seeds + 1)) if gen.unequal else seeds
        if gen.warp == "t3":
            z = r.standard_t(3, S) / np.sqrt(3.0)     # unit variance, heavy tails
        else:
            z = r.standard_normal(S)
        w = np.exp(gen.noise * z)
        Y = np.stack([synthetic.return_curve(tr, steps / (slow[(s, n, b)] * wk), s, n, 0) for wk in w], axis=1)
        Y = Y + 0.01 * r.standard_normal(Y.shape)
        curves.append(Curve(task="task", utd=float(s), param_count=float(n), batch_size=float(b), lr=float("nan"),
                            steps=steps.copy(), returns=Y))
    return CurveSet(curves, "eval_return", source=f"calibration:{gen.name}")


def true_D(gen: Generator, J: float, s: float, n: float) -> float:
    tr = gen.truth
    return float(tr.D(J, s, n) * min(tr.slowdown(s, b, np.nan) for b in gen.batch_sizes))


def run_fit(gen: Generator, seeds: int, rng: int, n_bootstrap: int) -> dict:
    cs = make_curves(gen, seeds, rng)
    st = analysis.Settings(n_bootstrap=n_bootstrap, thresholds=list(THRESHOLDS), normalize="none", holdout=False,
                           max_starts=4, delta=gen.delta, seed=rng)
    return report.jsonable(analysis.analyze(cs, st))


def _law_record(fit: dict) -> dict | None:
    return next((r for r in fit["data_efficiency_sigma_n"] if r.get("j_index") == J_LAW and "params" in r), None)


def _opt_record(fit: dict) -> dict | None:
    return next((r for r in fit["allocation"]["per_threshold"] if r.get("j_index") == J_LAW), None)


def law_quantities(fit: dict) -> dict[str, dict]:
    """Interval records of the law parameters and σ*, N* at J_LAW (missing -> withheld with the reason)."""
    out = {}
    rec = _law_record(fit)
    for k in LAW_PARAMS:
        if rec is None:
            out[k] = {"estimate": None, "lo": None, "hi": None, "reason": "no D_J(σ,N) fit at this J"}
        elif k not in rec["params"]:
            out[k] = {"estimate": None, "lo": None, "hi": None,
                      "reason": f"not in the selected law ({rec.get('selected_law')})"}
        else:
            out[k] = rec["params"][k]
    opt = _opt_record(fit)
    for k, name in (("sigma", "sigma*"), ("N", "N*")):
        iv = (opt or {}).get("intervals", {}).get(k)
        if iv is None:
            edge = (opt or {}).get("edge") or {}
            out[name] = {"estimate": None, "lo": None, "hi": None,
                         "reason": f"optimum on the box edge ({edge})" if edge else "no optimum at this J"}
        else:
            out[name] = iv
    return out


def true_batch_model(gen: Generator) -> alloc.BatchModel:
    """The batch size the optimum uses in truth: B*(σ) where the optimum is peaked, the geometric mean of
    the swept sizes where they tie (what the per-cell winners average to), B = 1 with no batch axis."""
    b = np.asarray(gen.batch_sizes, float)
    if not np.all(np.isfinite(b)):
        return alloc.BatchModel.constant(1.0)
    if gen.truth.kappa == 0:
        return alloc.BatchModel.constant(float(np.exp(np.mean(np.log(b)))))
    return alloc.BatchModel.power(gen.truth.B0, -gen.truth.s_B)


def true_optimum(gen: Generator, J: float) -> dict:
    """The generator's real compute optimum: argmin over the swept box of F/D_J's cost per unit, i.e. of
    (10·N·B·σ + δ)·D_true(σ, N) with the true batch model (a 241 × 241 log grid, then a bounded Nelder–Mead
    polish); `inside` says whether it is off the box's faces (else the study has no σ*, N* target)."""
    from scipy.optimize import minimize
    bm = true_batch_model(gen)
    lo = np.log([min(gen.utds), min(PARAMS)])
    hi = np.log([max(gen.utds), max(PARAMS)])

    def cost(v):
        s, n = np.exp(np.clip(v[0], lo[0], hi[0])), np.exp(np.clip(v[1], lo[1], hi[1]))
        D = gen.truth.D(J, s, n) * min(gen.truth.slowdown(s, b, np.nan) for b in gen.batch_sizes)
        return np.log((10 * n * bm(s, n) * s + gen.delta) * D)

    ls, ln = np.meshgrid(np.linspace(lo[0], hi[0], 241), np.linspace(lo[1], hi[1], 241), indexing="ij")
    c = np.vectorize(lambda a, b: cost((a, b)))(ls, ln)
    i = np.unravel_index(np.argmin(c), c.shape)
    v0 = np.array([ls[i], ln[i]])
    r = minimize(cost, v0, method="Nelder-Mead", options={"xatol": 1e-6, "fatol": 1e-12})
    v = np.clip(r.x if r.fun <= cost(v0) else v0, lo, hi)
    span = hi - lo
    inside = bool(np.all((v - lo > 1e-3 * span) & (hi - v > 1e-3 * span)))
    return {"sigma": float(np.exp(v[0])), "N": float(np.exp(v[1])), "inside": inside}


def reference(gen_name: str) -> dict:
    """Targets of the law quantities, noise-free: the law D_J(σ,N) fitted (unweighted, in log) to the exact
    best-configuration D_J of every cell at THRESHOLDS[J_LAW] (= the truth's parameters when the truth is in
    the family), and the compute-optimal (σ*, N*) of those parameters with the true batch model, in the
    swept box (None when the optimum is on the box edge: those studies have no target)."""
    gen = GEN[gen_name]
    J = THRESHOLDS[J_LAW]
    cells = [(s, n) for s in gen.utds for n in PARAMS]
    x = {"utd": np.array([c[0] for c in cells]), "param_count": np.array([c[1] for c in cells])}
    ly = np.log([true_D(gen, J, s, n) for s, n in cells])
    f = fitting.fit(fitting.make_problem(laws.DATA_EFFICIENCY_SIGMA_N, x, ly), ly)
    p = f.params
    if gen.misspecified:   # the target is the truth's own optimum, not the law's best approximation's
        opt = true_optimum(gen, J)
        inside = {"sigma": opt["inside"], "N": opt["inside"]}
    else:
        opt = alloc.optimum(p, true_batch_model(gen), gen.delta, sigma_range=(min(gen.utds), max(gen.utds)),
                            n_range=(min(PARAMS), max(PARAMS)))
        inside = {k: lo * (1 + 1e-6) < opt[k] < hi * (1 - 1e-6)
                  for k, (lo, hi) in (("sigma", (min(gen.utds), max(gen.utds))), ("N", (min(PARAMS), max(PARAMS))))}
    ref = {k: float(p[k]) for k in LAW_PARAMS}
    for scale, expo in (("a", "alpha"), ("b", "beta")):
        if ref[expo] > 5:  # the best approximation drops this term (exponent runs off): no target
            ref[scale] = ref[expo] = None
    return {"generator": gen_name, **ref,
            "sigma*": float(opt["sigma"]) if inside["sigma"] else None,
            "N*": float(opt["N"]) if inside["N"] else None, "rse_log": float(np.std(f.residuals))}


def interval_row(gen_name: str, seeds: int, study: int, q: str, cell: str, target, iv: dict) -> dict:
    """One cache row: a printed interval scored against its target (hit/miss), or withheld with its reason."""
    lo, hi = iv.get("lo"), iv.get("hi")
    if target is None or not np.isfinite(target):
        status, reason = "no-target", "reference has no value"
    elif lo is None or hi is None:
        status = "withheld"
        reason = (f"not identified ({iv['not_identified']})" if iv.get("not_identified")
                  else iv.get("reason") or "no interval (no reason given)")
    else:
        status, reason = ("hit" if lo <= target <= hi else "miss"), ""
    return {"generator": gen_name, "seeds": seeds, "study": study, "quantity": q, "cell": cell,
            "target": np.nan if target is None else float(target),
            "estimate": np.nan if iv.get("estimate") is None else float(iv["estimate"]),
            "lo": np.nan if lo is None else float(lo), "hi": np.nan if hi is None else float(hi),
            "status": status, "reason": reason,
            # for `layers`: the interval's total inflation, its lack-of-fit share, and its scale
            "inflation": float(iv.get("inflation") or np.nan), "widen_lof": float(iv.get("widened_for_lack_of_fit") or 1.0),
            "log_scale": bool(iv.get("log", True))}


def points_study(args) -> list[dict]:
    """`--points-only`: the D_J rows of `one_study` without the law fits (seconds instead of a minute per
    study): `data_efficiency` with the settings `analyze` passes it and the same seed, and the same
    `DataEfficiency.point_interval` the report prints, so the rows are those `one_study` makes."""
    gen_name, seeds, study, n_bootstrap = args
    gen = GEN[gen_name]
    rng = 10_000 * seeds + study
    st = analysis.Settings(n_bootstrap=n_bootstrap, thresholds=list(THRESHOLDS), normalize="none", seed=rng)
    de = curves.data_efficiency(make_curves(gen, seeds, rng), st.thresholds, normalize=st.normalize,
                                n_bootstrap=st.n_bootstrap, seed=st.seed, interpolation=st.interpolation,
                                interp_error=st.interp_error, select=st.config_select)
    rows = []
    for g, (u, n) in enumerate(de.groups[["utd", "param_count"]].itertuples(index=False)):
        for j, J in enumerate(THRESHOLDS):
            iv = de.point_interval(g, j, st.level)
            rows.append(interval_row(gen_name, seeds, study, "D_J", f"J={J} σ={u:.3g} N={n:.3g}",
                                     true_D(gen, J, u, n), iv))
    return rows


def one_study(args) -> list[dict]:
    gen_name, seeds, study, n_bootstrap, ref = args
    gen = GEN[gen_name]
    rng = 10_000 * seeds + study
    try:
        fit = run_fit(gen, seeds, rng, n_bootstrap)
    except Exception as e:  # a failed analysis is a result, counted and shown
        return [{"generator": gen_name, "seeds": seeds, "study": study, "quantity": "analysis", "cell": "",
                 "target": np.nan, "estimate": np.nan, "lo": np.nan, "hi": np.nan, "status": "error",
                 "reason": f"{type(e).__name__}: {e}"[:200]}]
    rows = []

    def add(q, cell, target, iv):
        rows.append(interval_row(gen_name, seeds, study, q, cell, target, iv))

    for p in fit["points"]:
        J = THRESHOLDS[p["j_index"]]
        iv = dict(p.get("D_interval") or {})
        iv["estimate"] = p["D"]
        if p.get("censored"):
            iv.setdefault("reason", "censored")
        add("D_J", f"J={J} σ={p['utd']:.3g} N={p['param_count']:.3g}", true_D(gen, J, p["utd"], p["param_count"]), iv)
    for q, iv in law_quantities(fit).items():
        add(q, "", ref.get(q), iv)
    rows.extend(region_rows(gen_name, seeds, study, _opt_record(fit), ref))
    return rows


REGION_LEVELS = ("1%", "5%")
NO_REGION = "the fit has no allocation 'region' (this version of allocation_fits does not make one)"


def region_rows(gen_name: str, seeds: int, study: int, opt: dict | None, ref: dict) -> list[dict]:
    """One row per printed near-optimal region (`fit["allocation"]["per_threshold"][j]["region"][level]`, boxes
    {"sigma": [lo, hi], "N": [lo, hi], ...}): a hit when the target optimum (ref's σ*, N*) lies in both ranges.
    Rows carry lo/hi of the σ range (the N range is in `cell`) and no estimate: the region has none."""
    out = []
    target = (ref.get("sigma*"), ref.get("N*"))
    region = (opt or {}).get("region")
    for lv in REGION_LEVELS:
        box = (region or {}).get(lv) if isinstance(region, dict) else None
        sig, nn = ((box or {}).get("sigma"), (box or {}).get("N")) if isinstance(box, dict) else (None, None)
        row = {"generator": gen_name, "seeds": seeds, "study": study, "quantity": f"region {lv}",
               "cell": "" if nn is None else f"N in [{nn[0]:.4g}, {nn[1]:.4g}]", "target": np.nan,
               "estimate": np.nan, "lo": np.nan, "hi": np.nan, "status": "withheld", "reason": ""}
        if opt is None:
            row["reason"] = "no optimum at this J"
        elif region is None:
            row["reason"] = NO_REGION
        elif any(t is None for t in target):
            row.update(status="no-target", reason="reference has no value")
        elif sig is None or nn is None or None in (*sig, *nn):
            row["reason"] = (box or {}).get("reason") or f"no {lv} box printed"
        else:
            inside = sig[0] <= target[0] <= sig[1] and nn[0] <= target[1] <= nn[1]
            row.update(target=float(target[0]), lo=float(sig[0]), hi=float(sig[1]), status="hit" if inside else "miss")
        out.append(row)
    return out


def _executor(workers: int):
    """A process pool for --workers > 1; one worker runs in this process (no start-up, nothing to pickle)."""
    return ProcessPoolExecutor(max_workers=workers) if workers > 1 else ThreadPoolExecutor(max_workers=1)


def read_cache(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, keep_default_na=False, na_values=[""])


def merge_cache(path: Path, new: pd.DataFrame, gens, seeds) -> pd.DataFrame:
    """The cache after a run over `gens` × `seeds`: the run's rows `new` (which already hold the cached
    studies of those it kept, with --resume) and every cached row of any other generator × seeds, untouched
    (a run over a subset used to overwrite the whole cache)."""
    if not path.exists():
        return new
    old = read_cache(path)
    keep = old[~(old["generator"].isin(gens) & old["seeds"].isin(seeds))]
    return pd.concat([keep, new], ignore_index=True) if len(keep) else new


def wilson(k: float, n: float, z: float = 1.96) -> tuple[float, float]:
    if n <= 0:
        return float("nan"), float("nan")
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, c - h), min(1.0, c + h)


def relative_width(printed: pd.DataFrame) -> float:
    """Median (hi − lo)/estimate of printed intervals (NaN if none, or rows without their bounds)."""
    if not len(printed) or not {"lo", "hi", "estimate"} <= set(printed.columns):
        return float("nan")
    w = (printed["hi"].astype(float) - printed["lo"].astype(float)) / printed["estimate"].astype(float).abs()
    return float(np.median(w))


def summarize(raw: pd.DataFrame) -> pd.DataFrame:
    """Coverage per generator × seeds × quantity; binomial interval with n = independent studies."""
    rows = []
    for (g, s, q), d in raw[raw["quantity"] != "analysis"].groupby(["generator", "seeds", "quantity"], sort=False):
        printed = d[d["status"].isin(["hit", "miss"])]
        per_study = printed.groupby("study")["status"].apply(lambda x: np.mean(x == "hit"))
        n_st = len(per_study)
        cov = float(np.mean(printed["status"] == "hit")) if len(printed) else float("nan")
        lo, hi = wilson(cov * n_st, n_st) if n_st else (float("nan"), float("nan"))
        withheld = d[d["status"] == "withheld"]
        reasons = withheld["reason"].value_counts()
        flag = "" if not n_st else ("LOW" if hi < 0.85 else "HIGH" if lo > 0.95 else
                                    "low?" if cov < 0.85 else "high?" if cov > 0.95 else "")
        rows.append({"generator": g, "seeds": int(s), "quantity": q, "intervals": len(printed), "studies": n_st,
                     "coverage": cov, "lo": lo, "hi": hi, "width": relative_width(printed), "withheld": len(withheld),
                     "why": reasons.index[0][:60] if len(reasons) else "", "flag": flag})
    return _ordered(pd.DataFrame(rows))


def _ordered(tab: pd.DataFrame) -> pd.DataFrame:
    """Rows in GENERATORS order, then seeds, then quantity (D_J, law parameters, optimum)."""
    if not len(tab):
        return tab
    order = {g: i for i, g in enumerate(GEN)}
    qorder = {q: i for i, q in enumerate(("D_J", *LAW_PARAMS, "sigma*", "N*", *(f"region {lv}" for lv in REGION_LEVELS)))}
    keys = [k for k in ("generator", "seeds", "quantity") if k in tab]
    return tab.sort_values(keys, key=lambda c: c.map(order) if c.name == "generator" else
                           c.map(qorder) if c.name == "quantity" else c, kind="stable").reset_index(drop=True)


def by_quantity(raw: pd.DataFrame) -> pd.DataFrame:
    """Coverage per quantity pooled over generators and seeds (Wilson, n = studies that printed one)."""
    rows = []
    printed = raw[raw["status"].isin(["hit", "miss"])]
    for q in dict.fromkeys(printed["quantity"]):
        d = printed[printed["quantity"] == q]
        n_st = d.groupby(["generator", "seeds", "study"]).ngroups
        cov = float(np.mean(d["status"] == "hit"))
        lo, hi = wilson(cov * n_st, n_st)
        rows.append({"quantity": q, "coverage": cov, "lo": lo, "hi": hi, "intervals": len(d), "studies": n_st,
                     "withheld": int(((raw["quantity"] == q) & (raw["status"] == "withheld")).sum())})
    return pd.DataFrame(rows)


def diagnose(raw: pd.DataFrame) -> pd.DataFrame:
    """Why a row misses, per generator × quantity (seeds pooled): each printed interval's error in its own
    units, z = log(estimate/target) / (half-width/z₀.₉₅) (on the side the target lies). Calibrated: rms z ≈ 1;
    rms z > 1: intervals too narrow by that factor; mean z ≠ 0: off-centre (bias) — e.g. selection bias."""
    d = raw[raw["status"].isin(["hit", "miss"]) & ~raw["quantity"].astype(str).str.startswith("region")].copy()
    le = np.log(d["estimate"] / d["target"])
    half = np.where(le > 0, np.log(d["estimate"] / d["lo"]), np.log(d["hi"] / d["estimate"])) / 1.6449
    d["z"] = le / np.maximum(half, 1e-12)
    d["le"] = le
    g = d.groupby(["generator", "quantity"], sort=False).agg(
        n=("z", "size"), coverage=("status", lambda x: float(np.mean(x == "hit"))),
        bias_log=("le", "mean"), mean_z=("z", "mean"), rms_z=("z", lambda x: float(np.sqrt(np.mean(x ** 2))))
    ).reset_index()
    return _ordered(g)


LAYER_GROUPS = {"D_J": ("D_J",), "law": LAW_PARAMS, "optimum": ("sigma*", "N*")}


def layers(raw: pd.DataFrame) -> pd.DataFrame:
    """Does each layer on top of the centred percentile interval earn its place? Per generator × quantity group,
    coverage and rms z of the printed intervals, of the same intervals without the lack-of-fit widening, and
    with no inflation at all (c = 1: the bare percentile interval of the centred replicates). Exact, not
    re-run: a centred interval's ends scale linearly with its inflation about the estimate (in log for positive
    quantities). Rows without a recorded inflation (caches from before it was recorded) are skipped."""
    if "inflation" not in raw:
        return pd.DataFrame()
    d = raw[raw["status"].isin(["hit", "miss"]) & np.isfinite(raw["inflation"].astype(float))].copy()
    if not len(d):
        return pd.DataFrame()
    lg = d["log_scale"].astype(str).str.lower().isin(["true", "1"])
    tf = lambda v: np.where(lg, np.log(np.maximum(v.astype(float), 1e-300)), v.astype(float))
    e, lo, hi, t = tf(d["estimate"]), tf(d["lo"]), tf(d["hi"]), tf(d["target"])
    infl, wl = d["inflation"].astype(float).to_numpy(), d["widen_lof"].astype(float).to_numpy()
    rows = []
    group_of = {q: g for g, qs in LAYER_GROUPS.items() for q in qs}
    d["group"] = d["quantity"].map(group_of)
    for name, f in (("printed", np.ones(len(d))), ("no lack-of-fit widening", 1.0 / wl), ("no inflation", 1.0 / infl)):
        l2, h2 = e + (lo - e) * f, e + (hi - e) * f
        hit = (l2 <= t) & (t <= h2)
        half = np.where(t < e, e - l2, h2 - e) / 1.6449
        z = (e - t) / np.maximum(half, 1e-12)
        dd = pd.DataFrame({"generator": d["generator"].to_numpy(), "group": d["group"].to_numpy(), "hit": hit, "z": z})
        for (g, grp), x in dd.groupby(["generator", "group"], sort=False):
            # σ*, N* carry their scope's inflation, lack-of-fit share folded in and not recorded: not separable
            na = name == "no lack-of-fit widening" and grp == "optimum"
            rows.append({"generator": g, "group": grp, "variant": name, "n": len(x),
                         "coverage": np.nan if na else float(x["hit"].mean()),
                         "rms_z": np.nan if na else float(np.sqrt(np.mean(x["z"] ** 2)))})
    out = pd.DataFrame(rows)
    return out.pivot_table(index=["generator", "group"], columns="variant", values=["coverage", "rms_z"],
                           sort=False, dropna=False).round(3)


def compact(tab: pd.DataFrame) -> str:
    """generator × seeds rows, one column per quantity: coverage (printed intervals), ↓/↑ where the Wilson
    interval lies wholly below 0.85 / above 0.95, "w" where every interval was withheld."""
    qs = list(dict.fromkeys(tab["quantity"]))
    lines = ["| generator | seeds | " + " | ".join(qs) + " |", "|---|---|" + "---|" * len(qs)]
    for (g, s), d in tab.groupby(["generator", "seeds"], sort=False):
        cells = []
        for q in qs:
            r = d[d["quantity"] == q]
            if not len(r):
                cells.append("")
                continue
            r = r.iloc[0]
            if not r["intervals"]:
                cells.append("w" if r["withheld"] else "–")
                continue
            mark = "↓" if r["flag"] == "LOW" else "↑" if r["flag"] == "HIGH" else ""
            cells.append(f"{r['coverage']:.2f}{mark} ({r['intervals']})")
        lines.append(f"| {g} | {s} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render(tab: pd.DataFrame, raw: pd.DataFrame, title: str) -> str:
    lines = [f"# {title}", "",
             "| generator | seeds | quantity | coverage [95% Wilson, n = studies] | intervals | median (hi−lo)/estimate "
             "| withheld | flag |",
             "|---|---|---|---|---|---|---|---|"]
    for r in tab.itertuples():
        cov = "—" if not np.isfinite(r.coverage) else f"{r.coverage:.2f} [{r.lo:.2f}, {r.hi:.2f}]"
        wh = f"{r.withheld}" + (f" ({r.why})" if r.withheld else "")
        width = "—" if not np.isfinite(r.width) else f"{r.width:.3f}"
        lines.append(f"| {r.generator} | {r.seeds} | {r.quantity} | {cov} | {r.intervals} | {width} | {wh} | {r.flag} |")
    printed = raw[raw["status"].isin(["hit", "miss"]) & ~raw["quantity"].astype(str).str.startswith("region")]
    errors = int((raw["status"] == "error").sum())
    cov = float(np.mean(printed["status"] == "hit")) if len(printed) else float("nan")
    n_st = printed.groupby(["generator", "seeds", "study"]).ngroups   # studies that printed an interval
    lo, hi = wilson(cov * n_st, n_st)
    lines += ["", f"pooled over {len(printed)} printed intervals from {n_st} studies: coverage {cov:.3f} "
                  f"[{lo:.3f}, {hi:.3f}]; analyses that raised: {errors}; withheld: "
                  f"{int((raw['status'] == 'withheld').sum())}",
              "", "per quantity, pooled over generators and seeds:", "",
              "| quantity | coverage [95% Wilson, n = studies] | intervals | studies | withheld |", "|---|---|---|---|---|",
              *[f"| {r.quantity} | {r.coverage:.3f} [{r.lo:.3f}, {r.hi:.3f}] | {r.intervals} | {r.studies} | "
                f"{r.withheld} |" for r in by_quantity(raw).itertuples()],
              "", "compact (coverage (printed intervals); ↓/↑ Wilson interval wholly below 0.85 / above 0.95; "
                  "w = all withheld):", "", compact(tab),
              "", "diagnostics (seeds pooled; z = error in units of the interval's own sd; calibrated: rms z ≈ 1, mean z ≈ 0):", "",
              diagnose(raw).round(3).to_string(index=False),
              ]
    lay = layers(raw)
    if len(lay):
        lines += ["", "layers (coverage / rms z as printed, without the lack-of-fit widening, with no inflation; "
                      "exact rescaling of the same intervals):", "", lay.to_string()]
    lines += ["", f"pooled_coverage={cov:.3f} [{lo:.3f}, {hi:.3f}]"]
    return "\n".join(lines)


POOL_TASKS = ("t0", "t1", "t2")     # synthetic.Truth.task_scale: D_J × 1.0, 1.7, 0.6


def pooled_study(args) -> list[dict]:
    """`--pool-tasks` on 3 tasks that differ by a scale: coverage of the pooled law's parameters at J_LAW.
    Target: the truth divided by its median over the cells (the same for every task), fitted without noise."""
    from scaling_rl.scaling.pooled import pooled_fit
    seeds, study, K = args
    truth = synthetic.Truth()
    cs = synthetic.make_study(truth, utds=UTDS, param_counts=PARAMS, tasks=POOL_TASKS, seeds=seeds, noise=0.1,
                              n_log=120, log_spaced=True, rng=20_000 * seeds + study)
    st = analysis.Settings(n_bootstrap=K, thresholds=list(THRESHOLDS), normalize="none", max_starts=4, delta=1.1e7,
                           seed=study)
    res = report.jsonable(pooled_fit(cs, st))
    J = THRESHOLDS[J_LAW]
    cells = [(s, n) for s in UTDS for n in PARAMS]
    D = np.array([truth.D(J, s, n) for s, n in cells])
    ly = np.log(D / np.median(D))
    x = {"utd": np.array([c[0] for c in cells]), "param_count": np.array([c[1] for c in cells])}
    target = fitting.fit(fitting.make_problem(laws.DATA_EFFICIENCY_SIGMA_N, x, ly), ly).params
    row = next(r for r in res["per_threshold"] if r["j_index"] == J_LAW)
    out = []
    for k in LAW_PARAMS:
        iv = row["fit"]["params"][k]
        lo, hi = iv.get("lo"), iv.get("hi")
        status = "withheld" if lo is None or hi is None else ("hit" if lo <= target[k] <= hi else "miss")
        out.append({"generator": "pooled-3-tasks", "seeds": seeds, "study": study, "quantity": k, "cell": "",
                    "target": float(target[k]), "estimate": iv.get("estimate"), "lo": lo, "hi": hi,
                    "status": status, "reason": iv.get("reason") or iv.get("not_identified") or ""})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5 seeds, 6 studies per generator, 40 resamples")
    ap.add_argument("--studies", type=int, default=None, help="independent studies per generator × seeds")
    ap.add_argument("--seeds", default=None, help="comma-separated seed counts (default 3,5,10; quick: 5)")
    ap.add_argument("--generators", default=None, help="comma-separated subset of: " + ", ".join(GEN))
    ap.add_argument("--bootstrap", type=int, default=None, help="seed-bootstrap resamples (default 100; quick 40)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", default=None,
                    help="raw-row cache (.csv); default benchmarks/results/calibration[_quick|_points].csv")
    ap.add_argument("--resume", action="store_true", help="keep the cached studies and run only the missing ones")
    ap.add_argument("--save-every", type=int, default=10, help="rewrite the cache after this many studies")
    ap.add_argument("--from-cache", action="store_true", help="print the table from the cache, compute nothing")
    ap.add_argument("--points-only", action="store_true",
                    help="only the D_J point intervals (no law fits; seconds per study), cache calibration_points.csv")
    ap.add_argument("--pooled", action="store_true",
                    help="instead: coverage of `fit --pool-tasks` (3 tasks differing by a scale), cache calibration_pooled.csv")
    args = ap.parse_args(argv)
    if args.pooled:
        out = Path(args.out) if args.out else RESULTS / "calibration_pooled.csv"
        seeds = [int(s) for s in (args.seeds or "5").split(",")]
        jobs = [(s, i, args.bootstrap or 60) for i in range(args.studies or 12) for s in seeds]
        with _executor(args.workers) as ex:
            raw = pd.DataFrame([r for rows in ex.map(pooled_study, jobs) for r in rows])
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out, raw.to_csv(index=False))
        text = render(summarize(raw), raw, "calibration of `fit --pool-tasks` (3 tasks, scales 1, 1.7, 0.6)")
        atomic_write_text(out.with_suffix(".md"), text + "\n")
        print(text)
        return 0
    out = Path(args.out) if args.out else RESULTS / ("calibration_points.csv" if args.points_only else
                                                     "calibration_quick.csv" if args.quick else "calibration.csv")
    title = ("calibration of 90% D_J point intervals (--points-only)" if args.points_only else
             "calibration of 90% intervals" + (" (quick)" if args.quick else ""))
    if args.from_cache:
        if not out.exists():
            print(f"error: no cache at {out}; run without --from-cache first", file=sys.stderr)
            return 2
        raw = read_cache(out)
        print(render(summarize(raw), raw, title))
        return 0
    try:
        seeds = [int(s) for s in (args.seeds or ("5" if args.quick else "3,5,10")).split(",")]
        gens = (args.generators or ",".join(GEN)).split(",")
    except ValueError:
        print(f"error: --seeds must be comma-separated integers, got {args.seeds!r}", file=sys.stderr)
        return 2
    bad = [g for g in gens if g not in GEN]
    if bad or min(seeds) < 2:
        print(f"error: unknown generator(s) {bad} (known: {', '.join(GEN)})" if bad else
              "error: --seeds needs at least 2 seeds per configuration", file=sys.stderr)
        return 2
    studies = args.studies or (6 if args.quick else 40)
    K = args.bootstrap or (40 if args.quick else 100)
    t0 = time.perf_counter()
    done = pd.DataFrame()
    if args.resume and out.exists():  # studies already in the cache are not run again
        done = read_cache(out)
        done = done[done["generator"].isin(gens) & done["seeds"].isin(seeds)]
    have = set(map(tuple, done[["generator", "seeds", "study"]].drop_duplicates().to_numpy().tolist())) if len(done) else set()
    rows = done.to_dict("records")
    out.parent.mkdir(parents=True, exist_ok=True)

    def save():  # atomic, and merged: the cache keeps every generator × seeds this run does not recompute
        atomic_write_text(out, merge_cache(out, pd.DataFrame(rows), gens, seeds).to_csv(index=False))

    with _executor(args.workers) as ex:
        refs = {} if args.points_only else {r["generator"]: r for r in ex.map(reference, gens)}
        # interleaved (study-major) so a partial run covers every generator × seeds evenly
        jobs = [(g, s, i, K) + (() if args.points_only else (refs[g],))
                for i in range(studies) for s in seeds for g in gens if (g, s, i) not in have]
        futures = [ex.submit(points_study if args.points_only else one_study, j) for j in jobs]
        for n_done, fut in enumerate(as_completed(futures), 1):
            rows.extend(fut.result())
            if n_done % args.save_every == 0:
                save()
    save()
    raw = read_cache(out)
    if not args.points_only and (raw["reason"] == NO_REGION).any():
        print(f"note: region coverage not measured: {NO_REGION}", file=sys.stderr)
    tab = summarize(raw)
    text = render(tab, raw, title)
    if args.points_only:
        atomic_write_text(out.with_suffix(".md"), text + "\n")
    else:
        refs.update({g: reference(g) for g in dict.fromkeys(raw["generator"]) if g in GEN and g not in refs})
        atomic_write_text(out.with_suffix(".md"), text + "\n\nreference targets (noise-free):\n\n"
                          + pd.DataFrame([refs[g] for g in GEN if g in refs]).to_string(index=False) + "\n")
    print(text)
    print(f"[{len(jobs)} studies, {time.perf_counter() - t0:.0f} s, cache {out}]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
