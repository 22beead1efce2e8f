"""Pooled-task fit (`scaling-rl fit --pool-tasks`): one D_J(σ, N) law and one σ*(F) law across tasks.

Studies over many tasks (e.g. a benchmark suite with a few seeds per task) often cannot fit a law per task.
Following the pooled analysis of the value-scaling literature, each task's D_J at threshold j is divided by
that task's median D_J over its (σ, N) cells ("median crossing"), which removes the task's own scale; one
law D̃_J(σ, N) = D̃_min·(1 + (a/σ)^α + (b/N)^β) (σ-only when the study has one model size) is then fitted
to the normalised points of all tasks together. Compute-optimal σ* and N* use that law with D̃ rescaled by
the geometric mean of the task medians (a typical task), and σ*(F) = k·F^e is fitted across thresholds.

Uncertainty: the seed bootstrap of `data_efficiency` (replicate b resamples every task's seeds); replicate b
divides by its own medians, refits the pooled law by the point estimator (`analysis.fit_with_bootstrap`),
recomputes every optimum and refits σ*(F) — one resample for every quantity. A replicate whose median is
undefined (a cell censored in that resample), whose refit fails, or whose optimum sits on the search box's
edge is a failure; failures are counted and more than `fitting.MAX_FAIL` of them withhold the interval.
A threshold is pooled only where every (σ, N) cell of every task reached it (a median over the cells
that happen to reach J would be biased low); the others are listed as skipped. For the same reason the pool is
the (σ, N) cells that every task has; a cell swept for some tasks only is left out, with a note.

One model size (the design of the value-scaling paper's pooled σ*(F): a curve directory without a
`w<width>p<N>/` level, given `--param-count N`): the σ-only law D̃_J(σ) = D̃_min·(1 + (a/σ)^α) is pooled, σ* is
optimised at that fixed N, and σ*(F) is fitted where ≥ 3 interior optima span ≥ `MIN_F_SPAN` in F. Without any
model size the pooled D̃_J(σ) law is still fitted, but compute (10·N·B·σ·D) cannot be counted: the allocation is
skipped and `allocation.reason` says why.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from . import allocation as alloc
from . import fitting, laws
from .allocation_fits import MIN_F_SPAN
from .analysis import Settings, _replicates, fit_with_bootstrap
from .curves import data_efficiency
from .data import CurveSet

SCOPE = "pooled"
NO_N_REASON = ("no model size known (no w<width>p<N>/ level, no param_count column, no --param-count): compute "
               "C = 10·N·B·σ·D cannot be counted, so σ*, F* and σ*(F) are not computed; pass --param-count N")


def _median_normalise(vals: np.ndarray, tasks: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
    """vals (..., G') divided per task by the task's median over its points; a task with any missing
    point in a row gets NaN for that row (its median would be over a different set of cells)."""
    out = np.full(vals.shape, np.nan)
    med = {}
    for t in np.unique(tasks):
        m = tasks == t
        v = vals[..., m]
        ok = np.all(np.isfinite(v) & (v > 0), axis=-1, keepdims=True)
        md = np.median(np.where(ok, v, 1.0), axis=-1, keepdims=True)
        out[..., m] = np.where(ok, v / md, np.nan)
        med[str(t)] = np.where(ok[..., 0], md[..., 0], np.nan)
    return out, med


def _batch_and_delta(de, st: Settings) -> tuple[alloc.BatchModel, float, str]:
    b = de.configs["batch_size"].to_numpy(float)
    b = b[np.isfinite(b) & (b > 0)]
    bm = alloc.BatchModel.constant(float(np.exp(np.mean(np.log(b)))) if b.size else 1.0)
    g = de.groups
    u = alloc.FLOPS_FACTOR * g["param_count"].to_numpy(float) * bm(1.0, 1.0) * g["utd"].to_numpy(float)
    if st.delta is not None:
        return bm, float(st.delta), "user"
    return bm, float(np.median(u)), "median FLOPs per env step (10·N·B·σ) of the sweep"


def pooled_fit(cs: CurveSet, settings: Settings | None = None,
               progress: Callable[[str], None] | None = None) -> dict:
    """The pooled analysis as a JSON-able dict (see the module docstring). ValueError on unusable input."""
    st = settings or Settings()
    st.validate()
    say = progress or (lambda m: None)
    if len(cs.tasks) < 2:
        raise ValueError(f"--pool-tasks: needs at least 2 tasks, the study has {len(cs.tasks)} ({', '.join(cs.tasks)})")
    say("pooled: data efficiency (bootstrap over seeds)")
    de = data_efficiency(cs, st.thresholds, n_thresholds=st.n_thresholds, spacing=st.spacing, normalize=st.normalize,
                         n_bootstrap=st.n_bootstrap, seed=st.seed, interpolation=st.interpolation,
                         interp_error=st.interp_error)
    notes = list(de.notes)
    reps = _replicates(de, st, notes)
    g = de.groups
    tasks_all = g["task"].to_numpy().astype(str)
    utd, N = g["utd"].to_numpy(float), g["param_count"].to_numpy(float)
    # the median of task t is over its (σ, N) cells: it removes the task's scale only if every task has the same
    # cells, so the pool is the cells every task has (the others are listed, not silently mixed in)
    cell = [(float(u), float(n)) for u, n in zip(utd, np.where(np.isfinite(N), N, -1.0))]
    common = set.intersection(*({c for c, t in zip(cell, tasks_all) if t == task} for task in cs.tasks))
    in_pool = np.array([c in common for c in cell], bool)
    levels = {t: sorted(set(utd[in_pool & (tasks_all == t)])) for t in cs.tasks}
    if any(len(v) < 2 for v in levels.values()):
        raise ValueError("--pool-tasks: every task needs at least 2 UTD ratios σ in the (σ, N) cells all tasks share; "
                         + ", ".join(f"{t}: {len(v)}" for t, v in levels.items()))
    n_known = bool(np.all(np.isfinite(N)))
    n_levels = sorted(set(N[in_pool])) if n_known else []
    law = laws.DATA_EFFICIENCY_SIGMA_N if len(n_levels) >= 2 else laws.DATA_EFFICIENCY_SIGMA_ONLY
    bm, delta, delta_source = _batch_and_delta(de, st) if n_known else (None, float("nan"), "")
    box = {"sigma_range": (float(utd[in_pool].min()), float(utd[in_pool].max()))}
    fixed = {}
    if n_known:
        box["n_range"] = (float(min(n_levels)), float(max(n_levels)))
        if len(n_levels) == 1:
            fixed = {"fix_n": n_levels[0]}
    else:
        notes.append("pooled: " + NO_N_REASON + (f" (--delta {st.delta:g} is unused)" if st.delta is not None else ""))
    dropped = sorted({(t, c) for t, c in zip(tasks_all, cell) if c not in common})
    if dropped:
        notes.append(f"pooled: {len(dropped)} (task, σ, N) cell(s) not swept for every task are left out of the pool "
                     "(a task's median must be over the same cells as the others'): " +
                     ", ".join(f"{t} σ={c[0]:g}" for t, c in dropped[:8]) +
                     (" ..." if len(dropped) > 8 else ""))
    out = {"law": law.name, "formula": law.formula, "tasks": list(cs.tasks), "normalization": "median D_J per task",
           "thresholds": {t: v.tolist() for t, v in de.thresholds.items()}, "delta": delta,
           "delta_source": delta_source, "batch_model": bm.to_dict() if bm else None, "per_threshold": [],
           "skipped": [], "notes": notes, "n_cells": len(common),
           "allocation": {"computed": True} if n_known else {"computed": False, "reason": NO_N_REASON}}
    K = reps.K
    opt_rows = []
    for j in range(de.n_thresholds):
        idx, y, Y = de.fit_data(j, in_pool)
        complete = {t: int((tasks_all[idx] == t).sum()) == int((in_pool & (tasks_all == t)).sum()) for t in cs.tasks}
        if not all(complete.values()):
            out["skipped"].append({"j_index": j, "reason": "not every (σ, N) cell of "
                                   + ", ".join(t for t, c in complete.items() if not c) + " reaches this threshold"})
            continue
        tk = tasks_all[idx]
        yn, med = _median_normalise(y, tk)
        Yn, med_b = _median_normalise(Y, tk) if K else (None, {})
        Yj = de.fit_data_jack(j, idx)
        Yjn = _median_normalise(Yj, tk)[0] if len(Yj) else None
        # every D_J law takes (utd, param_count); the σ-only one ignores N, which may then be unknown (NaN)
        x = {"utd": utd[idx], "param_count": N[idx]}
        try:
            fitted = fit_with_bootstrap(law, x, yn, Yn, st, reps, f"pooled D_J(σ,N) j={j}", Yj=Yjn, scope=SCOPE)
        except ValueError as e:
            out["skipped"].append({"j_index": j, "reason": f"pooled law could not be fitted: {e}"})
            continue
        scale = float(np.exp(np.mean(np.log(list(med.values())))))
        scale_b = (np.exp(np.mean(np.log(np.stack(list(med_b.values()), axis=0)), axis=0)) if K else np.zeros(0))
        row = {"j_index": j, "thresholds": {t: float(de.thresholds[t][j]) for t in cs.tasks},
               "medians": {t: float(v) for t, v in med.items()}, "scale": scale, "_fitted": fitted}
        if n_known:
            p = _env_params(fitted.params(), scale)
            opt = alloc.optimum(p, bm, delta, **box, **fixed)
            row["optimum"] = {k: opt[k] for k in ("sigma", "N", "B", "D", "C", "F")}
            row["edge"] = _edge(opt, box, fixed)
            samples = []
            for b, q in enumerate(fitted.replicate_params()):
                if q is None or not np.isfinite(scale_b[b]):
                    samples.append(None)
                    continue
                o = alloc.optimum_numerical(_env_params(q, scale_b[b]), bm, delta, **box, **fixed)
                samples.append(None if _edge(o, box, fixed) else o)
            row["_samples"] = samples
            opt_rows.append(row)
        out["per_threshold"].append(row)
    if not out["per_threshold"]:
        raise ValueError("--pool-tasks: no threshold is reached by every (σ, N) cell of every task: nothing to pool "
                         "(choose lower --thresholds)")
    say("pooled: intervals")
    out["sigma_law"] = _sigma_law(opt_rows, reps) if n_known else {"formula": "σ*(F) = k·F^e", "reason": NO_N_REASON}
    for row in out["per_threshold"]:  # after every fit registered its failures
        fitted = row.pop("_fitted")
        row["fit"] = fitted.record()
        if "_samples" in row:
            samples = row.pop("_samples")
            row["intervals"] = {}
            for k in ("sigma", "N", "D", "F"):
                vals = np.array([np.nan if s is None else s[k] for s in samples], float)
                reason = None
                if k == "N" and fixed:
                    reason = "one model size: N is fixed"
                elif row["edge"]:
                    reason = "optimum on the edge of the swept box (" + ", ".join(
                        f"{a} {e}" for a, e in row["edge"].items()) + "): beyond the sweep"
                row["intervals"][k] = reps.interval(row["optimum"][k], vals, reason=reason, scope=SCOPE)
    out["bootstrap"] = reps.summary()
    return out


def _env_params(p: dict, scale: float) -> dict:
    q = {"a": 1e-300, "alpha": 1.0, "b": 1e-300, "beta": 1.0, **p}
    q["D_min"] = p["D_min"] * scale
    return q


def _edge(opt: dict, box: dict, fixed: dict) -> dict:
    e = {}
    for ax, key, fx in (("sigma", "sigma_range", "fix_sigma"), ("N", "n_range", "fix_n")):
        if key not in box or fx in fixed:
            continue
        lo, hi = box[key]
        if abs(math.log(opt[ax] / lo)) < 1e-4:
            e[ax] = "lower"
        elif abs(math.log(opt[ax] / hi)) < 1e-4:
            e[ax] = "upper"
    return e


def _loglinear(x, y) -> tuple[float, float]:
    x, y = np.asarray(x, float), np.asarray(y, float)
    if not (np.all(np.isfinite(x) & (x > 0)) and np.all(np.isfinite(y) & (y > 0))):
        return float("nan"), float("nan")
    e, c = np.polyfit(np.log(x), np.log(y), 1)
    return float(c), float(e)


def _sigma_law(rows: list[dict], reps) -> dict:
    """σ*(F) = k·F^e across the thresholds whose point optimum is inside the box; replicate b uses its own
    optimum at each of those thresholds (a replicate with any edge/failed optimum is a failure)."""
    use = [r for r in rows if not r["edge"]]
    res = {"formula": "σ*(F) = k·F^e", "thresholds_used": [r["j_index"] for r in use],
           "thresholds_on_edge": [r["j_index"] for r in rows if r["edge"]]}
    if len(use) < 3:
        res["reason"] = (f"{len(use)} threshold(s) with an optimum inside the swept box: σ*(F) needs at least 3 "
                         "(2 points fit any power law exactly)")
        return res
    F = [r["optimum"]["F"] for r in use]
    S = [r["optimum"]["sigma"] for r in use]
    res["F_range"] = [float(min(F)), float(max(F))]
    if max(F) < MIN_F_SPAN * min(F):
        res["reason"] = (f"the optima span only ×{max(F) / min(F):.2g} in F (a law needs >= ×{MIN_F_SPAN:g}): "
                         "not a budget law")
        res["points"] = [{"F": f, "sigma": s} for f, s in zip(F, S)]
        return res
    c, e = _loglinear(F, S)
    res.update(k=math.exp(c), e=e, points=[{"F": f, "sigma": s} for f, s in zip(F, S)])
    kb, eb = np.full(reps.K, np.nan), np.full(reps.K, np.nan)
    for b in range(reps.K):
        sb = [r["_samples"][b] if "_samples" in r else None for r in use]
        if any(s is None for s in sb):
            continue
        cb, eb[b] = _loglinear([s["F"] for s in sb], [s["sigma"] for s in sb])
        kb[b] = math.exp(cb) if np.isfinite(cb) else np.nan
    res["intervals"] = {"e": reps.interval(e, eb, log=False, scope=SCOPE), "k": reps.interval(math.exp(c), kb,
                                                                                            scope=SCOPE)}
    res["n_failed"] = int(np.sum(~np.isfinite(eb)))
    return res


def render_pooled(res: dict) -> str:
    """pooled.md: the pooled law per threshold, the optima and σ*(F), every number with its interval or
    the reason it has none (the report's own `_ci` formatting)."""
    from .report import _FOOTNOTES, _ci, _g
    _FOOTNOTES.clear()   # `_ci` numbers each reason an interval is withheld; they are listed at the end
    pnames = ["D̃_min", "a", "α", "b", "β"][:5 if res["law"] == laws.DATA_EFFICIENCY_SIGMA_N.name else 3]
    cols = ["j", "thresholds", "medians (env steps)", *pnames, "R² (log)", "σ*", "N*", "F*"]
    alloc_ok = res.get("allocation", {}).get("computed", True)
    budget = (f"Optima use D̃ × the geometric mean of the task medians, δ = {_g(res['delta'])} FLOPs per env step "
              f"({res['delta_source'] or '–'})." if alloc_ok else
              f"**Allocation skipped**: {res['allocation']['reason']}.")
    lines = [f"# Pooled-task fit ({len(res['tasks'])} tasks: {', '.join(res['tasks'])})", "",
             f"Each task's D_J divided by its median D_J over the {res.get('n_cells', '')} (σ, N) cells every task "
             f"has; one law fitted to all tasks: `{res['formula']}` (D̃ dimensionless). {budget} Intervals: seed "
             f"bootstrap, {res['bootstrap']['n']} resamples, {res['bootstrap']['n_ok']} ok in every fit.", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in res["per_threshold"]:
        p = r["fit"]["params"]
        iv = r.get("intervals", {})
        lines.append(f"| {r['j_index']} | " + ", ".join(f"{t} {_g(v)}" for t, v in r["thresholds"].items())
                     + " | " + ", ".join(f"{t} {_g(v)}" for t, v in r["medians"].items()) + " | "
                     + " | ".join(_ci(v) for v in p.values()) + f" | {r['fit']['r2_log']:.3f} | "
                     + " | ".join(_ci(iv.get(k)) for k in ("sigma", "N", "F")) + " |")
    for s in res["skipped"]:
        lines.append(f"\nthreshold {s['j_index']} not pooled: {s['reason']}")
    sl = res["sigma_law"]
    lines += ["", "## σ*(F) across thresholds", ""]
    if "intervals" in sl:
        lines.append(f"σ*(F) = k·F^e: e = {_ci(sl['intervals']['e'])}, k = {_ci(sl['intervals']['k'])} "
                     f"(thresholds {sl['thresholds_used']}, F from {_g(sl['F_range'][0])} to {_g(sl['F_range'][1])}; "
                     f"replicates with an optimum on the box edge counted as failed: {sl['n_failed']})")
    else:
        lines.append(f"σ*(F): not fitted ({sl.get('reason')})")
        if sl.get("points"):
            lines.append("optima: " + ", ".join(f"σ* {_g(q['sigma'])} at F {_g(q['F'])}" for q in sl["points"]))
    lines += ["", "## Notes", ""] + [f"- {n}" for n in res["notes"]]
    if _FOOTNOTES:
        lines += ["", "## Footnotes", ""] + [f"[{i}] {why}" for why, i in _FOOTNOTES.items()]
    return "\n".join(lines) + "\n"


def write_pooled(res: dict, out_dir) -> list[str]:
    """pooled.json and pooled.md in out_dir (atomic writes); returns their paths."""
    from pathlib import Path

    from ..io import atomic_write_json, atomic_write_text
    from .report import jsonable
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = jsonable(res)
    atomic_write_json(out / "pooled.json", data)
    atomic_write_text(out / "pooled.md", render_pooled(data))
    return [str(out / "pooled.json"), str(out / "pooled.md")]
