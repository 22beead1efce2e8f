"""The data-efficiency laws of an analysis: D_J(σ) per model size (σ effect decided by the seed-bootstrap
interval of its slope), D_J(σ, N) with nested-law selection across replicates, held-out extrapolation."""
from __future__ import annotations

import math

import numpy as np
from scipy import stats

from . import fitting, laws
from .curves import DataEfficiency
from .lawfit import (Fitted, Replicates, Settings, _band, _cell_seeds, _f, _later, _log, _points_of, _weights,
                     fit_with_bootstrap)


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
    # no replicates in use (e.g. one seed: K = 0) -> no slope replicates either, whatever the D_J bootstrap holds
    S = np.where(reps.ok(fitted.scope), S, np.nan) if reps.K and len(S) else S[:0]
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
