"""Adaptive scaling studies: the engine chooses where the next trials go, round by round.

A full grid runs every (σ, N) point to the full budget whether or not it moves the fit. An adaptive
study runs an initial design, fits the law with the honest-laws machinery (`scaling.analysis`), and
proposes the next batch of trials where they most reduce the uncertainty of the quantity the user
asks for, until the intervals are as narrow as asked or the compute is spent::

    adaptive:
      thresholds: [0.3, 0.5, 0.7]    # metric units (curves are not normalised); default: early_stop's
      metric: eval_return            # default: early_stop's metric, else eval_return
      target: frontier               # frontier: the exponents of σ*(F) and N*(F) (budget laws)
                                     # points: D_J at `points` (every threshold)
      points: [{utd: 2, width: 64}]  # target: points (axis values of candidate trials)
      tolerance: 0.1                 # frontier: width of each exponent's interval;
                                     # points: width of log D_J's interval
      initial: grid3                 # grid3: corners, edge midpoints and centre of the σ×N box
                                     # (9 cells: >= 5 parameters + 4 residual dof for D_J(σ,N));
                                     # corners: 4 corners + centre; or a list of axis points
      batch: 4                       # trials proposed per round
      max_rounds: 10
      max_compute: null              # FLOPs (F = C + δ·D over every trial run); null: no cap
      max_replicates: 4              # trials (each of the spec's `seeds` seeds) per candidate
      n_bootstrap: 100               # seed-bootstrap replicates of each round's fit
      confirm_bootstrap: null        # replicates of the confirming refit (default 4 × n_bootstrap)
      level: 0.9
      delta: null                    # FLOPs per env step; null: median 10·N·B·σ of the candidates
                                     # (fixed for the whole study, so every round fits one F)

The candidates are the spec's trials (its grid / zip over utd, width, ...); a candidate's replicate r
is the same config with first seed `seed + r` (new seeds). Cells are (task, σ, N) points; candidates
of one cell with several configs (a B or η axis) are proposed together.

**Where the next trials go** (the criterion is recorded per round). Replicate b of the round's fit is
one resample of seeds for everything (`analysis.Replicates`), so the joint covariance of the target
quantities q (e.g. the σ*(F) and N*(F) exponents) and of the law's predicted log D_J at every candidate
cell is estimated from the replicates themselves — no Jacobians. A new trial at cell c observes
log D_J(c) at every threshold with noise v_j / seeds (v_j: the per-seed variance of log D_J, from the
fit's bootstrap). Linear-Gaussian conditioning gives the variance of q it removes,
Σ_qc (Σ_cc + V)⁻¹ Σ_cq; the score is that reduction, relative to Var(q), summed over the target
quantities still wider than the tolerance, divided by the trial's predicted cost (seeds × env steps
× FLOPs per step; with early stopping, the steps the law says it needs to reach the top threshold).
A batch is chosen greedily, conditioning the covariance on each pick before the next. When the target
is not yet defined in enough replicates (no budget law yet: fewer than 3 interior optima), the
criterion falls back to the per-threshold optima log σ*_J, log N*_J; then to the law's predictive
variance; and with no law at all, to space filling (the unmeasured cell farthest from the measured).

**Stopping**: every target interval narrower than `tolerance` ("tolerance"), or the compute spent /
next batch beyond `max_compute` ("budget"), `max_rounds` ("max_rounds"), or no candidate left
("exhausted"). Before the tolerance (or budget / max_rounds) stops a study, the round is refitted with
`confirm_bootstrap` replicates (default 4 × n_bootstrap) and the decision and the round's fit.json
use that refit: a width estimated from few replicates is noisy, and stopping on a luckily narrow one
would leave the final intervals too narrow (measured: 90% intervals covered the simulated truth 78%
of the time without the confirmation). An optimum on the edge of the swept box gives the frontier no
interval: the study says so and goes on until a stop rule, it does not extrapolate.

**Store** (`<out_dir>/adaptive/`): `state.json` holds the rounds — each round's proposals are written
(atomically) before any of them runs, and its fit summary, compute spent, decision and the next
round's proposals in one atomic write after — so a study killed at any point resumes exactly where it
was, on any backend: finished trials are never rerun (the store skips them) and no proposal is lost.
`round_<r>/fit.json` is each round's whole fit.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from scaling_rl.sweep.design import (  # noqa: F401 (re-exported: the design and its candidates)
    KEYS, TARGETS, Cell, Design, _budgets, cells_of, parse_design)
from scaling_rl.sweep.trial import SpecError, Trial  # noqa: F401

from_spec = parse_design   # the old name (`sweep.cli` and scripts call it)

STATE = "state.json"
MIN_REPLICATES = 10          # usable bootstrap rows needed to estimate a covariance


# ---- candidates ----------------------------------------------------------------------------------
def replicate(t: Trial, r: int) -> Trial:
    """Replicate r of candidate trial t: same config, first seed t.seed + r."""
    return dataclasses.replace(t, seed=t.seed + r)


def flops_per_step(config: dict, N: float, delta: float) -> float:
    """10·N·B·σ + δ: the FLOPs of one env step (F = C + δ·D, as in the analysis)."""
    from scaling_rl.scaling.allocation import compute_flops
    return float(compute_flops(N, config.get("batch_size") or 1, config.get("utd", 1.0), 1)) + delta


def default_delta(cells: Sequence[Cell]) -> float:
    """Median 10·N·B·σ over the candidates (the analysis' default, but of the whole candidate grid)."""
    return float(np.median([flops_per_step(t.config, c.N, 0.0) for c in cells for t in c.trials]))


def initial_cells(design: Design, cells: Sequence[Cell]) -> list[Cell]:
    """The initial design's cells (every task)."""
    if isinstance(design.initial, tuple):
        keys = set(design.initial)
        return [c for c in cells if c.key in keys]
    out = []
    for task in sorted({c.task for c in cells}):
        mine = [c for c in cells if c.task == task]
        sig, ns = sorted({c.sigma for c in mine}), sorted({c.N for c in mine})
        pick_s = {sig[0], sig[len(sig) // 2], sig[-1]}
        pick_n = {ns[0], ns[len(ns) // 2], ns[-1]}
        for c in mine:
            if design.initial == "grid3":
                ok = c.sigma in pick_s and c.N in pick_n
            else:   # corners + centre
                ok = ((c.sigma in (sig[0], sig[-1]) and c.N in (ns[0], ns[-1]))
                      or (c.sigma == sig[len(sig) // 2] and c.N == ns[len(ns) // 2]))
            if ok:
                out.append(c)
    return out


# ---- the state -----------------------------------------------------------------------------------
def state_path(out_dir) -> Path:
    return Path(out_dir) / "adaptive" / STATE


def load_state(out_dir) -> dict:
    p = state_path(out_dir)
    if not p.exists():
        return {"schema": "scaling_rl.adaptive/1", "rounds": []}
    return json.loads(p.read_text())


def _write_state(out_dir, state: dict) -> None:
    from scaling_rl.io import atomic_write_json
    atomic_write_json(state_path(out_dir), state)


def proposed_trials(state: dict, spec) -> list[Trial]:
    """Every trial proposed so far (all rounds), in proposal order."""
    by_id = {}
    for t in spec.trials:
        by_id[t.id] = t
    out, seen = [], set()
    for rnd in state["rounds"]:
        for p in rnd["proposals"]:
            for base_id in p["candidates"]:
                t = replicate(by_id[base_id], int(p["replicate"]))
                if t.id not in seen:
                    seen.add(t.id)
                    out.append(t)
    return out


def _proposal(cell: Cell, r: int, **extra) -> dict:
    return {"task": cell.task, "sigma": cell.sigma, "N": cell.N, "replicate": int(r),
            "candidates": [t.id for t in cell.trials],
            "trials": [replicate(t, r).id for t in cell.trials], **extra}


# ---- one round's fit -----------------------------------------------------------------------------
def fit_round(spec, design: Design, trials: Sequence[Trial], delta: float, progress=None,
              n_bootstrap: int | None = None) -> tuple[dict, dict, Any]:
    """Collect the trials run so far, fit them (the honest-laws analysis, fixed thresholds and δ;
    `n_bootstrap` replicates, default the design's). Returns (fit.json content, capture, table)."""
    from scaling_rl.scaling import analysis, data
    from scaling_rl.sweep.collect import collect

    table = collect(spec.out_dir)
    ids = {t.id for t in trials}
    table = table[table["trial_id"].isin(ids)]
    cs = data.curves_from_table(table, design.metric, source=str(spec.out_dir))
    st = analysis.Settings(thresholds=list(design.thresholds), normalize="none",
                           n_bootstrap=n_bootstrap or design.n_bootstrap,
                           level=design.level, delta=delta, holdout=False, max_starts=4, seed=0)
    cap: dict = {}
    fit = analysis.analyze(cs, st, progress=progress, capture=cap)
    return fit, cap, table


def target_widths(fit: dict, design: Design, cap: dict) -> dict:
    """{name: {"estimate", "lo", "hi", "width", "reason"}} of each target quantity."""
    out = {}
    if design.target == "frontier":
        for law in fit.get("allocation", {}).get("power_laws", []):
            if law["target"] not in ("sigma", "N"):
                continue
            name = f"{law['task']}:{law['target']}*(F) exponent"
            if "params" not in law:
                out[name] = {"estimate": None, "lo": None, "hi": None, "width": math.inf, "reason": law.get("skipped")}
                continue
            s = law["params"]["s"]
            w = (s["hi"] - s["lo"]) if s.get("lo") is not None else math.inf
            out[name] = {"estimate": s["estimate"], "lo": s.get("lo"), "hi": s.get("hi"), "width": w,
                         "reason": s.get("reason")}
        for t in fit.get("tasks", []):   # a task without budget laws yet: its exponents are not determined
            if any(k.startswith(f"{t}:") for k in out):
                continue
            sel = fit.get("model_selection", {}).get(t, {}).get("chosen")
            why = ("no budget law yet: model selection prefers a law without that effect (more σ×N cells needed)"
                   if sel not in (None, "data_efficiency_sigma_n") else
                   "no budget law yet (needs optima inside the swept box at >= 3 thresholds)")
            for ax in ("sigma", "N"):
                out[f"{t}:{ax}*(F) exponent"] = {"estimate": None, "lo": None, "hi": None, "width": math.inf,
                                                 "reason": why}
    else:
        reps = cap.get("reps")
        for key in design.points:
            task, sg, n = key
            for j, J in enumerate(design.thresholds):
                name = f"{task}:D_J(σ={sg:g}, N={n:.4g}) at J={J:g}"
                law = cap.get("laws", {}).get((task, j))
                if law is None or reps is None:
                    out[name] = {"estimate": None, "lo": None, "hi": None, "width": math.inf, "reason": "no law fitted"}
                    continue
                est, vals = _predict(law, sg, n)
                iv = reps.interval(math.exp(est), np.exp(vals), scope=law["scope"])
                w = math.log(iv["hi"] / iv["lo"]) if iv.get("lo") else math.inf
                out[name] = {"estimate": iv["estimate"], "lo": iv.get("lo"), "hi": iv.get("hi"), "width": w,
                             "reason": iv.get("reason")}
    return out


def _predict(law: dict, sigma: float, N: float) -> tuple[float, np.ndarray]:
    """log D_J at (σ, N): point estimate and per-replicate values (NaN where a replicate failed)."""
    from scaling_rl.scaling.allocation import log_data
    ls, ln = math.log(sigma), math.log(N)
    fx = law["fixed"]
    if "fix_n" in fx:
        ln = math.log(fx["fix_n"])
    if "fix_sigma" in fx:
        ls = math.log(fx["fix_sigma"])
    est = float(log_data(law["point"], ls, ln)[0])
    vals = np.array([np.nan if p is None else float(log_data(p, ls, ln)[0]) for p in law["reps"]])
    return est, vals


# ---- where the next trials go --------------------------------------------------------------------
def _seed_variance(cap: dict, nJ: int) -> np.ndarray:
    """Per-seed variance of log D_J at each threshold: the bootstrap variance of a point's log D_J times
    its seeds, median over the measured points (0.01 where nothing is measured)."""
    de = cap.get("de")
    v = np.full(nJ, 0.01)
    if de is None or de.g_boot.shape[0] < 2:
        return v
    n_seeds = de.configs.groupby("group")["n_seeds"].min().reindex(range(len(de.groups))).to_numpy(float)
    for j in range(min(nJ, de.g_boot.shape[2])):
        with np.errstate(invalid="ignore", divide="ignore"):
            lb = np.log(de.g_boot[:, :, j])
        ok = np.all(np.isfinite(lb), axis=0)
        if ok.sum():
            v[j] = max(float(np.median(np.var(lb[:, ok], axis=0, ddof=1) * n_seeds[ok])), 1e-6)
    return v


def _target_columns(design: Design, cap: dict, widths: dict) -> tuple[str, list[np.ndarray]]:
    """The criterion and the per-replicate values (K,) of the quantities it reduces."""
    K = cap["reps"].K if cap.get("reps") is not None else 0
    ok = lambda scope: cap["reps"].ok(scope)   # noqa: E731
    if design.target == "points":
        cols = []
        for key in design.points:
            for j in range(len(design.thresholds)):
                law = cap["laws"].get((key[0], j))
                if law is not None:
                    cols.append(np.where(ok(law["scope"]), _predict(law, key[1], key[2])[1], np.nan))
        return "target points' D_J", cols
    cols = []
    for (task, tg), bl in cap.get("budget_laws", {}).items():
        if tg not in ("sigma", "N"):
            continue
        if widths.get(f"{task}:{tg}*(F) exponent", {}).get("width", math.inf) <= design.tolerance:
            continue   # narrow enough already: spend nothing on it
        v = np.where(ok(bl["scope"]), bl["reps"], np.nan)
        if np.isfinite(v).sum() >= max(MIN_REPLICATES, 0.5 * K):
            cols.append(v)
    if cols:
        return "frontier exponents", cols
    for (task, j), o in cap.get("optima", {}).items():   # no budget law yet: the per-threshold optima
        row = o["row"]
        for ax in ("sigma", "N"):
            if row["free"][ax]:
                v = np.array([np.nan if s is None else math.log(s[ax]) for s in o["reps"]])
                v = np.where(ok(o["scope"]), v, np.nan)
                if np.isfinite(v).sum() >= MIN_REPLICATES:
                    cols.append(v)
    return ("per-threshold optima", cols) if cols else ("", [])


def propose(design: Design, cells: Sequence[Cell], counts: dict, cap: dict | None, widths: dict, delta: float,
            budget_left: float, budget_steps: dict) -> tuple[str, list[dict]]:
    """Up to `design.batch` proposals (cell, replicate, score, predicted cost): see the module docstring."""
    nJ = len(design.thresholds)
    free = [c for c in cells if counts.get(c.key, 0) < design.max_replicates]
    if not free:
        return "exhausted", []

    exp_steps: dict = {}   # cell -> trial -> the steps it should need (early stopping), else its budget

    def cost(c: Cell) -> float:
        steps = exp_steps.get(c.key, {})
        return sum(design.seeds * steps.get(t.id, budget_steps[t.id]) * flops_per_step(t.config, c.N, delta)
                   for t in c.trials)

    laws = {} if cap is None else cap.get("laws", {})
    criterion, cols = _target_columns(design, cap, widths) if laws else ("", [])
    if not laws:  # no law yet: space filling in (log σ, log N)
        return "space filling", _space_filling(design, cells, counts, cost, budget_left)
    # predicted log D_J at every free cell and threshold, per replicate
    K = cap["reps"].K
    F, where = [], []
    for c in free:
        top = None
        for j in range(nJ):
            law = laws.get((c.task, j))
            if law is None:
                continue
            est, v = _predict(law, c.sigma, c.N)
            F.append(np.where(cap["reps"].ok(law["scope"]), v, np.nan))
            where.append((c.key, j))
            top = est   # thresholds ascend: the highest one with a law is what the trial must reach
        if design.early_stop and top is not None:   # early stopping: the trial runs about as long as it needs
            exp_steps[c.key] = {t.id: min(budget_steps[t.id], 1.25 * math.exp(top)) for t in c.trials}
    if not cols:
        criterion, cols = "prediction variance", []
    Q = np.stack(cols, axis=1) if cols else np.zeros((K, 0))
    Fm = np.stack(F, axis=1) if F else np.zeros((K, 0))
    rows = np.all(np.isfinite(Q), axis=1) & np.all(np.isfinite(Fm), axis=1)
    if rows.sum() < MIN_REPLICATES or Fm.shape[1] == 0:
        return "space filling", _space_filling(design, cells, counts, cost, budget_left)
    Z = np.concatenate([Q[rows], Fm[rows]], axis=1)
    Sigma = np.cov(Z, rowvar=False, ddof=1).reshape(Z.shape[1], Z.shape[1])
    nq = Q.shape[1]
    var_q0 = np.diag(Sigma)[:nq].copy()
    noise = _seed_variance(cap, nJ) / max(design.seeds, 1)
    col_of: dict = {}
    for i, (key, j) in enumerate(where):
        col_of.setdefault(key, []).append((nq + i, j))
    picks: list[dict] = []
    counts = dict(counts)
    spent = 0.0
    for _ in range(design.batch):
        best = None
        for c in free:
            if counts.get(c.key, 0) >= design.max_replicates or c.key not in col_of:
                continue
            idx = [i for i, _ in col_of[c.key]]
            V = np.diag([noise[j] for _, j in col_of[c.key]])
            S_cc = Sigma[np.ix_(idx, idx)] + V
            if nq:
                S_qc = Sigma[:nq, idx]
                red = np.einsum("qi,qi->q", S_qc @ np.linalg.pinv(S_cc), S_qc)
                gain = float(np.sum(red / np.maximum(var_q0, 1e-300)))
            else:   # prediction variance: the total variance of every prediction it removes
                S_ac = Sigma[nq:, idx]
                gain = float(np.trace(S_ac @ np.linalg.pinv(S_cc) @ S_ac.T)) / max(len(where), 1)
            cst = cost(c)
            if spent + cst > budget_left:
                continue
            score = gain / cst
            if best is None or score > best[0]:
                best = (score, c, idx, V, gain, cst)
        if best is None:
            break
        score, c, idx, V, gain, cst = best
        S_cc = Sigma[np.ix_(idx, idx)] + V
        Sigma = Sigma - Sigma[:, idx] @ np.linalg.pinv(S_cc) @ Sigma[idx, :]
        picks.append(_proposal(c, counts.get(c.key, 0), score=score, variance_reduction=gain, predicted_cost=cst))
        counts[c.key] = counts.get(c.key, 0) + 1
        spent += cst
    return criterion, picks


def _space_filling(design: Design, cells, counts, cost, budget_left) -> list[dict]:
    """Unmeasured cells farthest (in log σ, log N, each scaled to [0, 1]) from every measured cell."""
    ls = np.log([c.sigma for c in cells])
    ln = np.log([c.N for c in cells])
    span = lambda v: (v - v.min()) / max(v.max() - v.min(), 1e-12)   # noqa: E731
    X = np.stack([span(ls), span(ln)], axis=1)
    measured = [i for i, c in enumerate(cells) if counts.get(c.key, 0) > 0]
    counts = dict(counts)
    picks, spent = [], 0.0
    for _ in range(design.batch):
        best = None
        for i, c in enumerate(cells):
            if counts.get(c.key, 0) >= design.max_replicates:
                continue
            d = min((float(np.sum((X[i] - X[m]) ** 2)) for m in measured), default=1.0)
            cst = cost(c)
            if spent + cst > budget_left:
                continue
            if best is None or (d, -cst) > (best[0], -best[2]):
                best = (d, i, cst)
        if best is None:
            break
        d, i, cst = best
        c = cells[i]
        picks.append(_proposal(c, counts.get(c.key, 0), score=d, variance_reduction=None, predicted_cost=cst))
        counts[c.key] = counts.get(c.key, 0) + 1
        measured.append(i)
        spent += cst
    return picks


# ---- compute accounting --------------------------------------------------------------------------
def spent(table, delta: float) -> dict:
    """Env steps and FLOPs (F = C + δ·D) spent by the trials of a collected `table`: each seed's last
    env step, times its trial's 10·N·B·σ + δ (N, B, σ: the table's param_count, batch_size, utd)."""
    if not len(table):
        return {"env_steps": 0.0, "flops": 0.0}
    cols = {c: (c, "first") for c in ("param_count", "batch_size", "utd") if c in table.columns}
    last = table.groupby(["trial_id", "seed_index"]).agg(steps=("env_steps", "max"), **cols)
    last = last.fillna({c: 1.0 for c in ("batch_size", "utd") if c in last.columns})
    flops = sum(float(r.steps) * flops_per_step(r._asdict(), float(r.param_count), delta)
                for r in last.itertuples(index=False))
    return {"env_steps": float(last["steps"].sum()), "flops": flops}


# ---- the driver ----------------------------------------------------------------------------------
def run_adaptive(spec, *, backend: str | None = None, workers: int | None = None, progress: bool = True,
                 retry_diverged: bool = False, ray_address: str | None = None, say=print,
                 fit_progress=None) -> dict:
    """Run (or resume) the adaptive study of `spec` to a stop rule; returns the final state."""
    from scaling_rl.io import atomic_write_json
    from scaling_rl.scaling import report
    from scaling_rl.sweep.run import run_sweep

    design: Design = spec.adaptive
    cells = cells_of(spec.trials)
    delta = design.delta if design.delta is not None else default_delta(cells)
    budget_steps = _budgets(spec.trials)
    state = load_state(spec.out_dir)
    if not state["rounds"]:
        init = initial_cells(design, cells)
        state["rounds"].append({"round": 0, "criterion": f"initial design ({design.initial if isinstance(design.initial, str) else 'given points'})",
                                "proposals": [_proposal(c, 0) for c in init]})
        state.update(design=_design_record(design), delta=delta)
        _write_state(spec.out_dir, state)
    while True:
        rnd = state["rounds"][-1]
        if rnd.get("decision"):   # the last round was fitted and the study stopped
            return state
        r = rnd["round"]
        trials = proposed_trials(state, spec)
        mine = {tid for p in rnd["proposals"] for tid in p["trials"]}
        say(f"adaptive round {r}: {len(mine)} trial(s) ({rnd['criterion']}); {len(trials)} proposed so far")
        run_sweep(spec, backend=backend, workers=workers, progress=progress, retry_diverged=retry_diverged,
                  ray_address=ray_address, trials=[t for t in trials if t.id in mine])
        fit, cap, table = fit_round(spec, design, trials, delta, progress=fit_progress)
        widths = target_widths(fit, design, cap)
        used = spent(table, delta)
        left = math.inf if design.max_compute is None else design.max_compute - used["flops"]
        met = bool(widths) and all(w["width"] <= design.tolerance for w in widths.values())
        confirm = None
        if met or left <= 0 or r + 1 >= design.max_rounds:
            # The study may stop here: refit with more replicates first. A width from few replicates
            # is itself noisy, and stopping on a lucky narrow one would leave intervals too narrow.
            confirm = {"n_bootstrap": design.confirm_bootstrap, "widths_before": _json_widths(widths)}
            fit, cap, _ = fit_round(spec, design, trials, delta, progress=fit_progress,
                                    n_bootstrap=design.confirm_bootstrap)
            widths = target_widths(fit, design, cap)
            met = bool(widths) and all(w["width"] <= design.tolerance for w in widths.values())
        atomic_write_json(Path(spec.out_dir) / "adaptive" / f"round_{r}" / "fit.json", report.jsonable(fit))
        counts: dict = {}
        for rr in state["rounds"]:
            for p in rr["proposals"]:
                key = (p["task"], p["sigma"], p["N"])
                counts[key] = max(counts.get(key, 0), int(p["replicate"]) + 1)
        rnd["fit"] = {"widths": _json_widths(widths), "trials": len(trials), **used,
                      "remaining_flops": None if design.max_compute is None else left,
                      "stopped_early": _stopped(spec, trials),
                      "n_bootstrap": design.confirm_bootstrap if confirm else design.n_bootstrap}
        if confirm:
            rnd["fit"]["confirmed_from"] = confirm
        decision = None
        if met:
            decision = "stop: tolerance met"
        elif left <= 0:
            decision = "stop: budget spent"
        elif r + 1 >= design.max_rounds:
            decision = "stop: max_rounds"
        nxt = None
        if decision is None:
            criterion, picks = propose(design, cells, counts, cap, widths, delta, left, budget_steps)
            if not picks:
                decision = ("stop: exhausted (every candidate at max_replicates)" if criterion == "exhausted"
                            else "stop: budget (no candidate fits the compute left)")
            else:
                nxt = {"round": r + 1, "criterion": criterion, "proposals": picks}
        rnd["decision"] = decision or "continue"
        if nxt is not None:
            state["rounds"].append(nxt)
        _write_state(spec.out_dir, state)   # fit summary, decision and next proposals: one atomic write
        say(f"adaptive round {r}: " + "; ".join(f"{k} width {v['width']:.3g}" for k, v in widths.items())
            + f"; {used['flops']:.3g} FLOPs, {used['env_steps']:.3g} env steps spent -> {rnd['decision']}")
        if decision is not None:
            return state


def _json_widths(widths: dict) -> dict:
    return {k: {kk: (None if isinstance(vv, float) and not math.isfinite(vv) else vv) for kk, vv in v.items()}
            for k, v in widths.items()}


def _stopped(spec, trials) -> int:
    from scaling_rl.sweep.store import Store
    store = Store(spec.out_dir)
    return sum(1 for t in trials if store.status(t.id).get("stopped_early"))


def _design_record(design: Design) -> dict:
    d = dataclasses.asdict(design)
    d["points"] = [list(p) for p in design.points]
    if isinstance(design.initial, tuple):
        d["initial"] = [list(p) for p in design.initial]
    return d
