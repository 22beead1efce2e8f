"""Compute-optimal allocation of an analysis: the batch-size model, (σ*, N*) per threshold with every
replicate on its own laws, budget laws over F, and `recommend` from a fit.json."""
from __future__ import annotations

import math

import numpy as np

from . import allocation as alloc
from . import fitting
from . import region as regions
from .curves import DataEfficiency
from .lawfit import Replicates, Settings, _later


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
MIN_F_SPAN = 3.0   # a budget law y*(F) is fitted only over optima that span at least this factor in F


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
        sweep_box = {"sigma_range": (min(s_lv) / K, max(s_lv) * K), "n_range": (min(n_lv) / K, max(n_lv) * K)}
        sources = _allocation_sources(de, t, de_fits, sel.get(t), out, n_lv, sigma_fits)
        if sources is None:
            continue
        kind, per_j = sources
        rows = []
        for j, (fitted, key, fixed) in per_j.items():
            p = _full_params(fitted.params(key), kind)
            cells = _cells(de, t, j)
            box, limited = _reach_box(sweep_box, cells, K)
            opt = alloc.optimum(p, bm, delta, **box, **fixed)
            row = {"task": t, "j_index": j, "threshold": float(de.thresholds[t][j]), "kind": kind, **opt,
                   "params": p, "box": {"sigma": list(box["sigma_range"]), "N": list(box["n_range"])},
                   "swept": {"sigma": [min(s_lv), max(s_lv)], "N": [min(n_lv), max(n_lv)]},
                   "free": {"sigma": "fix_sigma" not in fixed, "N": "fix_n" not in fixed}}
            row["reach_limited"] = limited
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
            row["delta_sensitivity"] = _delta_sensitivity(p, bm, delta, box, fixed, cells, lv)
            _later(finalize, row, lambda row=row, p=p, fitted=fitted, key=key, fixed=fixed, box=box, cells=cells,
                   bm=bm, bm_reps=bm_reps, b_ok=b_ok, lv=lv, kind=kind: {"region": _region(
                       row, p, kind, bm, bm_reps, b_ok, delta, box, fixed, fitted, key, cells, lv, reps)})
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
                rbox = {"sigma_range": tuple(row["box"]["sigma"]), "n_range": tuple(row["box"]["N"])}
                so = alloc.optimum_numerical(p, bm, delta, fix_n=base["N"], **rbox)
                no = alloc.optimum_numerical(p, bm, delta, fix_sigma=base["sigma"], **rbox)
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


def _reach_box(box: dict, cells: dict, K: float) -> tuple[dict, dict]:
    """The search box of one threshold: the sweep's box cut to the σ and N levels at which some measured
    configuration reaches J (a law fitted on the cells that reach J says nothing about sizes that never
    do: a capacity-bound N would otherwise look cheapest). Returns the box and which ends were cut."""
    ok = np.isfinite(cells["D"]) & (cells["D"] > 0) & np.isfinite(cells["param_count"])
    if not ok.any():
        return box, {}
    out, limited = dict(box), {}
    for rk, ax, col in (("sigma_range", "sigma", "utd"), ("n_range", "N", "param_count")):
        lo, hi = box[rk]
        r_lo, r_hi = float(cells[col][ok].min()) / K, float(cells[col][ok].max()) * K
        if r_lo > lo * (1 + 1e-9):
            limited[ax] = "lower"
        if r_hi < hi * (1 - 1e-9):
            limited[ax] = "upper" if ax not in limited else "both"
        out[rk] = (max(lo, r_lo), min(hi, r_hi))
    return out, limited


def _cells(de: DataEfficiency, t: str, j: int) -> dict:
    """The measured configurations of task t at threshold j: levels, point D_J and per-replicate D_J."""
    m = (de.configs["task"] == t).to_numpy()
    c = de.configs[m]
    return {"utd": c["utd"].to_numpy(float), "param_count": c["param_count"].to_numpy(float),
            "batch_size": c["batch_size"].to_numpy(float), "D": de.point[m, j],
            "D_boot": de.boot[:, m, j] if de.boot.size else np.zeros((0, int(m.sum())))}


def _region(row: dict, p: dict, kind: str, bm, bm_reps, b_ok, delta: float, box: dict, fixed: dict, fitted,
            key, cells: dict, lv: dict, reps: Replicates) -> dict:
    """The near-optimal region of one allocation row (see `region`): the law's, the cells', and the box
    holding both. Replicates dropped from the law's scope are left out of the law's region."""
    ok = reps.ok(fitted.scope) if reps.K else np.zeros(0, bool)
    qs = [None if (q is None or not ok[b]) else _full_params(q, kind)
          for b, q in enumerate(fitted.replicate_params(key))] if reps.K else []
    breps = None if bm_reps is None else [bm_reps[b] if b_ok[b] else None for b in range(len(bm_reps))]
    law = regions.law_region(p, bm, delta, box, fixed, qs, breps, level=reps.level)
    ok_cells = np.isfinite(cells["param_count"])
    cell = regions.cell_region({k: v[ok_cells] for k, v in cells.items() if k not in ("D", "D_boot")},
                               cells["D"][ok_cells], cells["D_boot"][:, ok_cells], delta, lv, level=reps.level)
    return {"law": law, "cells": cell, **regions.combine(law, cell, row)}


def _delta_sensitivity(p: dict, bm, delta: float, box: dict, fixed: dict, cells: dict, lv: dict) -> dict:
    """Where the optimum goes if one env step costs δ×0.1 or δ×10: the law's optimum and the best measured
    configuration (δ is the user's assumption, so the report shows how much the answer rests on it)."""
    out = {}
    for f in (0.1, 10.0):
        o = alloc.optimum_numerical(p, bm, delta * f, **box, **fixed)
        ok = np.isfinite(cells["param_count"])
        cr = regions.cell_region({k: v[ok] for k, v in cells.items() if k not in ("D", "D_boot")}, cells["D"][ok],
                                 np.zeros((0, int(ok.sum()))), delta * f, lv)
        out[f"{f:g}"] = {"delta": delta * f, "law": {"sigma": o["sigma"], "N": o["N"], "at_bound": o["at_bound"]},
                         "best_cell": cr.get("best")}
    return out


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
        if F.max() < MIN_F_SPAN * F.min():
            out.append({**base, "skipped": f"the optima span only ×{F.max() / F.min():.2g} in F (a law needs "
                                           f">= ×{MIN_F_SPAN:g}): not a budget law",
                        "F_range": [float(F.min()), float(F.max())]})
            continue
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
