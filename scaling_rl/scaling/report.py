"""fit.json + report.md: every fitted parameter with its interval, fit quality, censoring, held-out
extrapolation and the compute-optimal allocation, written atomically."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from ..io import atomic_write_json, atomic_write_text


def jsonable(obj: Any) -> Any:
    """numpy -> Python, non-finite floats -> None (strict JSON), tuples -> lists, recursively."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        v = float(obj)
        return v if math.isfinite(v) else None
    return obj


def write_fit(fit: dict, path: str | Path) -> None:
    atomic_write_json(path, jsonable(fit))


def load_fit(path: str | Path) -> dict:
    """Read fit.json (a file or the directory holding it); ValueError if it is not one."""
    path = Path(path)
    if path.is_dir():
        path = path / "fit.json"
    if not path.is_file():
        raise ValueError(f"fit: {path} not found; run `scaling-rl fit` first")
    try:
        fit = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"fit: {path} is not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(fit, dict) or not str(fit.get("schema", "")).startswith("scaling_rl.scaling.fit/"):
        raise ValueError(f"fit: {path} is not a scaling_rl fit.json")
    return fit


# ---- markdown -----------------------------------------------------------------------------------

def _g(v, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, (int, float)):
        return f"{v:.{digits}g}"
    return str(v)


_FOOTNOTES: dict[str, int] = {}   # reason -> footnote number, filled while one report renders


def _footnote(why: str) -> str:
    """The footnote number of a reason (a repeated reason is one footnote)."""
    return str(_FOOTNOTES.setdefault(str(why), len(_FOOTNOTES) + 1))


def _ci(p: dict) -> str:
    """A quantity as the report prints it: "est [lo, hi]", "est (no interval:
    why)", or "not identified (why)" — a parameter the data cannot pin down is never a number."""
    if p is None:
        return "–"
    if p.get("not_identified"):
        return f"not identified [{_footnote(p['not_identified'])}]"
    if p.get("lo") is None or p.get("hi") is None:
        why = p.get("reason")
        return f"{_g(p['estimate'], 4)} (no interval{' [' + _footnote(why) + ']' if why else ''})"
    mark = ("ʷ" if p.get("widened_for_lack_of_fit") else "") + (
        " (interval cut at the searched box)" if p.get("clipped_to_box") else "")
    return f"{_g(p['estimate'], 4)} [{_g(p['lo'])}, {_g(p['hi'])}]{mark}"


def _n_ok(r: dict) -> str:
    n = r.get("n_bootstrap")
    return f"{r.get('n_bootstrap_ok', 0)}/{n}" if n else "–"


def _param_table(recs: list[dict], keys: list[str], head: list[str]) -> list[str]:
    params: list[str] = []
    for r in recs:
        for k in r.get("params", {}):
            if k not in params:
                params.append(k)
    lines = ["| " + " | ".join(head + ["law"] + params + ["R² (log)", "RSE (log)", "AICc", "points", "replicates ok"])
             + " |", "|" + "---|" * (len(head) + len(params) + 6)]
    for r in recs:
        cells = [_g(r.get(k)) for k in keys]
        if "skipped" in r:
            lines.append("| " + " | ".join(cells + [f"skipped: {r['skipped']}"] + [""] * (len(params) + 5)) + " |")
            continue
        law = r.get("formula", r.get("law", ""))
        sel = r.get("selection") or {}
        if sel.get("chosen", "").endswith("_constant"):
            law += " (σ effect not identified)"
        cells += [law] + [_ci(r["params"][p]) if p in r["params"] else "—" for p in params] + [
            _g(r["r2_log"], 4), _g(r.get("rse_log")), _g(r.get("aicc"), 4), str(r["n_points"]), _n_ok(r)]
        lines.append("| " + " | ".join(cells) + " |")
    for r in recs:
        lof = r.get("lack_of_fit") or {}
        if lof.get("misspecified"):
            where = ", ".join(f"{h} = {_g(r.get(k))}" for k, h in zip(keys, head))
            lines += ["", f"ʷ {where}: law misspecified — lack-of-fit F = {_g(lof['F'])} on ({_g(lof['dof'][0])}, "
                          f"{_g(lof['dof'][1])}) dof, p = {_g(lof['p'], 2)}: the residuals exceed the seed noise, so its "
                          f"intervals (and the optima and budget laws from it) are widened ×√F = {_g(lof['widen'])}"]
    return lines


def _selection_lines(fit: dict) -> list[str]:
    sel = fit.get("model_selection") or {}
    if not sel:
        return []
    L = ["## Model selection for D_J(σ, N)", "",
         "Nested laws fitted at every threshold; the law with the lowest AICc (summed over the thresholds where "
         "all can be compared) is reported and used for the allocation. Δ = AICc − best (the thresholds share "
         "their seeds, so Δ overstates the evidence); replicates = share of seed-bootstrap replicates in which "
         "the whole selection picks this law.", ""]
    for t, s_ in sel.items():
        L.append(f"**{t}**: chosen **{s_['chosen']}** — {s_['rule']}")
        if s_.get("laws"):
            L += ["", "| law | formula | AICc (sum) | Δ | replicates | best at thresholds |", "|---|---|---|---|---|---|"]
            L += [f"| {l_['law']} | {l_['formula']} | {_g(l_['aicc_total'], 5)} | {_g(l_['delta_aicc'], 3)} | "
                  f"{'—' if l_.get('bootstrap_share') is None else format(l_['bootstrap_share'], '.0%')} | "
                  f"{l_['preferred_at']} |" for l_ in s_["laws"]]
        L.append("")
    return L


def _optimum_cell(r: dict, ax: str) -> str:
    """σ* or N* of an allocation row: a value, a fixed value, or "beyond the sweep" when it sits on the
    search box's edge (then it is not an optimum, and is not printed as one)."""
    iv = r["intervals"][ax]
    if not r["free"][ax]:
        return f"{_g(r[ax])} (fixed: not identified)"
    edge = (r.get("edge") or {}).get(ax)
    word = {"sigma": "σ", "N": "N"}[ax]
    if edge and (r.get("reach_limited") or {}).get(ax) in (edge, "both"):
        bound = r["box"][ax][1 if edge == "upper" else 0]
        return (f"{_g(bound)}: the {'largest' if edge == 'upper' else 'smallest'} {word} at which a measured "
                f"configuration reaches J ({'larger' if edge == 'upper' else 'smaller'} ones never do)")
    if edge:
        bound = r["box"][ax][1 if edge == "upper" else 0]
        return (f"beyond the sweep ({'≥' if edge == 'upper' else '≤'} {_g(bound)}): extend {word} "
                f"{'upward' if edge == 'upper' else 'downward'}")
    return _ci(iv) + (" (extrapolated)" if r.get("extrapolated", {}).get(ax) else "")


# ---- the two-minute summary ---------------------------------------------------------------------

def _raw(fit: dict, task: str, J: float) -> float:
    """A threshold in the metric's own units (J is normalised when the fit normalised per task)."""
    lo, hi = fit["normalization"][task]
    return lo + J * (hi - lo) if fit["settings"]["normalize"] == "task" else J


def _rng(v: list | None, digits: int = 3) -> str:
    if not v:
        return "–"
    return _g(v[0], digits) if abs(v[1] / v[0] - 1) < 1e-6 else f"[{_g(v[0], digits)}, {_g(v[1], digits)}]"


def _region_text(r: dict, key: str = "5%") -> str:
    reg = (r.get("region") or {}).get(key)
    if not reg:
        return "no region (no law and no measured configuration reaches J)"
    t = ", ".join(f"{name} {'∈' if _rng(reg[ax]).startswith('[') else '='} {_rng(reg[ax])}"
                  for ax, name in (("sigma", "σ"), ("N", "N"), ("B", "B")) if reg.get(ax))
    if reg.get("agree") is False:
        best = r["region"]["cells"]["best"]
        t += (f" — the law and the measured cells DISAGREE (law σ* {_g(r['sigma'])}, N* {_g(r['N'])}; best measured "
              f"σ {_g(best['sigma'])}, N {_g(best['N'])}, B {_g(best['B'])}): the law misdescribes the data near the "
              "optimum, the region holds both")
    return t


def _ten_x(fit: dict, rows: list[dict]) -> str:
    """The 10× question from the per-threshold optima: inside their budget range, what 10× the budget of the
    cheapest threshold reaches and where; else what to sweep next."""
    rows = sorted(rows, key=lambda r: r["F"])
    F0 = rows[0]["F"]
    Fmax = rows[-1]["F"]
    edges = sorted({f"{ {'sigma': 'σ', 'N': 'N'}[ax]} {'upward' if e == 'upper' else 'downward'}"
                    for r in rows for ax, e in (r.get("edge") or {}).items()
                    if (r.get("reach_limited") or {}).get(ax) not in (e, "both")})
    if 10 * F0 <= Fmax * (1 + 1e-9):
        lF = np.log([r["F"] for r in rows])
        x = math.log(10 * F0)
        k = int(np.searchsorted(lF, x))
        r = rows[min(k, len(rows) - 1)]
        j = float(np.interp(x, lF, [q["threshold"] for q in rows]))
        t = rows[0]["task"]
        pct = f" ({100 * j:.0f}%)" if fit["settings"]["normalize"] == "task" else ""
        return (f"**10× the budget** of the lowest threshold ({_g(F0)} → {_g(10 * F0)} FLOPs) reaches about "
                f"J = {_g(_raw(fit, t, j), 4)}{pct}; near-optimal at the next threshold up (J = "
                f"{_g(_raw(fit, t, r['threshold']), 4)}): {_region_text(r)}.")
    nxt = ("extend " + ", ".join(edges) + "; " if edges else "")
    return (f"**10× the budget** ({_g(10 * F0)} FLOPs) is outside what this sweep measured (its optima span "
            f"×{_g(Fmax / F0)} in F): to answer it, {nxt}run longer (more env steps) so that higher thresholds are "
            "reached by most cells, and sweep the larger σ/N that the region points to.")


def summary_lines(fit: dict) -> list[str]:
    """The report's first block (at most ~10 lines): the thresholds in the metric's units and what they
    mean, the near-optimal region per threshold, the 10× answer (or what to sweep next), how the answer
    moves with δ, and where more seeds would pay."""
    al = fit.get("allocation") or {}
    L = ["## Summary", ""]
    if "delta" in al:
        L.append(f"- Budget F = C + δ·D with C = 10·N·B·σ·D and δ = {_g(al['delta'])} FLOPs per env step ("
                 + ("given" if al.get("delta_source") == "user" else "**assumed**: the sweep's median 10·N·B·σ; "
                    "pass --delta, the cost of one env step in your setting") + ").")
    for t in fit["tasks"]:
        lo, hi = fit["normalization"][t]
        thr = fit["thresholds"][t]
        if fit["settings"]["normalize"] == "task":
            L.append(f"- {t}: thresholds J = " + ", ".join(f"{_g(_raw(fit, t, j), 4)} ({100 * j:.0f}%)" for j in thr)
                     + f" in `{fit['metric']}` (% of the way from the worst, {_g(lo, 4)}, to the best seed-mean "
                     f"value, {_g(hi, 4)}, in the sweep).")
        else:
            L.append(f"- {t}: thresholds J = " + ", ".join(_g(j, 4) for j in thr) + f" in `{fit['metric']}`.")
    rows = [r for r in al.get("per_threshold", []) if r.get("region")]
    if al.get("skipped") or not rows:
        L.append(f"- No allocation: {al.get('skipped') or 'no law or measured configuration supports one'}.")
        return L + [""]
    for t in fit["tasks"]:
        tr = sorted((r for r in rows if r["task"] == t), key=lambda r: r["threshold"])
        if not tr:
            continue
        show = tr if len(tr) <= 3 else [tr[0], tr[len(tr) // 2], tr[-1]]
        for r in show:
            L.append(f"- {t}, J = {_g(_raw(fit, t, r['threshold']), 4)}: within 5% of the least budget "
                     f"(F* ≈ {_g(r['F'])} FLOPs): {_region_text(r)}.")
        L.append("- " + _ten_x(fit, tr))
        ds = tr[-1].get("delta_sensitivity") or {}
        if ds:
            L.append(f"- δ moves the answer (J = {_g(_raw(fit, t, tr[-1]['threshold']), 4)}): " + "; ".join(
                f"δ×{k}: law σ* {_g(v['law']['sigma'])}, N* {_g(v['law']['N'])}"
                + (" (edge)" if v["law"]["at_bound"] else "")
                + (f", best cell σ {_g(v['best_cell']['sigma'])}, N {_g(v['best_cell']['N'])}, "
                   f"B {_g(v['best_cell']['B'])}" if v.get("best_cell") else "") for k, v in ds.items()) + ".")
        und = {(c["sigma"], c["N"], c["B"]): c for r in tr for c in
               ((r["region"].get("cells") or {}).get("5%") or {}).get("undecided", [])}
        if und:
            cs_ = sorted(und.values(), key=lambda c: abs(c["share"] - 0.5))[:3]
            L.append("- More seeds would pay at " + "; ".join(
                f"σ {_g(c['sigma'])}, N {_g(c['N'])}, B {_g(c['B'])}" for c in cs_)
                + ": the seed resamples split on whether these are near-optimal.")
        else:
            L.append("- More seeds: every measured configuration is clearly in or out of the near-optimal region; "
                     "more seeds would mainly narrow the law's intervals.")
    return L + [""]


def render_report(fit: dict, figures: list[str] | None = None) -> str:
    """The markdown report: the summary first, then the details (footnotes for withheld intervals)."""
    _FOOTNOTES.clear()
    body = _render_details(fit, figures)
    L = [f"# Scaling-law fit: `{fit['metric']}`", ""] + summary_lines(fit) + [body]
    if _FOOTNOTES:
        L += ["## Footnotes", ""] + [f"[{i}] {why}" for why, i in _FOOTNOTES.items()] + [""]
    return "\n".join(L)


def _render_details(fit: dict, figures: list[str] | None = None) -> str:
    st = fit["settings"]
    lvl = int(round(100 * st["level"]))
    bs = fit.get("bootstrap") or {}
    mode = {"seed": "seed bootstrap", "none": "none"}.get(bs.get("mode"), "?")
    L = ["## Details", "",
         f"Source: `{fit['source']}`  ", f"Tasks: {', '.join(fit['tasks'])}  ",
         "Levels: " + "; ".join(f"{k} = {', '.join(_g(v) for v in vs)}" for k, vs in fit["levels"].items() if vs) + "  ",
         f"Intervals: {lvl}% — {mode}, {bs.get('n', 0)} resamples; replicates ok: "
         + (", ".join(f"{k} {v}/{bs.get('n', 0)}" for k, v in (bs.get("n_ok_by_scope") or {}).items()) or "–")
         + " (a replicate that fails in any fit of a chain of combined quantities is dropped from all of them); "
         "percentile intervals of the seed-bootstrap replicates centred on the estimate (Efron & Tibshirani 1993; "
         f"Davison & Hinkley 1997 §5.3); min {st['min_seeds']} seeds per "
         f"configuration; loss = {st['loss']}"
         + (f" (Huber δ = {st['huber_delta']} in log units)" if st["loss"] == "huber" else "")
         + ", residuals in log space" + (", weighted by 1/var(log D_J)" if st.get("weights") == "bootstrap" or (
             st.get("weights") == "auto" and st["min_seeds"] >= 4) else "")
         + "; one estimator (start grid → LM → L-BFGS-B) for the point fit and every replicate.", ""]
    if bs.get("failures"):
        L += ["Replicate failures by fit: " + ", ".join(f"{k}: {v}" for k, v in bs["failures"].items()), ""]
    if fit.get("notes"):
        L += ["## Notes", ""] + [f"- {n}" for n in fit["notes"]] + [""]
    L += ["## Thresholds", ""]
    for t, thr in fit["thresholds"].items():
        lo, hi = fit["normalization"][t]
        L.append(f"- {t}: J = {', '.join(_g(v) for v in thr)} "
                 f"({'normalised: 0 = ' + _g(lo) + ', 1 = ' + _g(hi) if st['normalize'] == 'task' else 'raw metric'})")
    pts = fit["points"]
    left = [p for p in pts if p.get("left_censored")]
    if left:
        L += ["", f"{len(left)} point(s) are already above J at the first log point (D_J is an upper bound; "
              "left out of the fits)."]
    cens = [p for p in pts if p["censored"]]
    L += ["", f"{len(pts)} (task, σ, N, J) points, {len(cens)} censored (never reach J with any configuration; "
          "kept here, left out of the fits).", ""]
    if cens:
        L += ["| task | σ | N | J | last logged step |", "|---|---|---|---|---|"]
        L += [f"| {p['task']} | {_g(p['utd'])} | {_g(p['param_count'])} | {_g(p['threshold'])} | {_g(p['last_step'])} |"
              for p in cens] + [""]
    amb = [p for p in pts if p.get("ambiguous")]
    if amb:
        L += [f"{len(amb)} point(s) have a censored configuration that stopped logging before the best one "
              "reached J: the best there is a lower bound.", ""]

    hp = fit["hparams"]
    L += ["## Optimal batch size and learning rate", "",
          "Per (σ, N) the best configuration is chosen in every bootstrap sample; B* and η* are geometric "
          "means of the winners (intervals: spread of the winners).", ""]
    for name, label in (("batch_size_sigma", "B*(σ)"), ("lr_sigma", "η*(σ)")):
        r = hp.get(name)
        if r is None:
            continue
        if "skipped" in r:
            L.append(f"- {label}: skipped ({r['skipped']})")
            continue
        L += [f"**{r['formula']}** (shared slope, one coefficient per task); R² (log) = {_g(r['r2_log'], 4)}, "
              f"{r['n_points']} points", ""]
        L += ["| parameter | estimate [interval] |", "|---|---|"]
        L += [f"| {k} | {_ci(v)} |" for k, v in r["params"].items()] + [""]
    for t, r in (hp.get("batch_size_sigma_n") or {}).items():
        if "skipped" in r:
            L.append(f"- B*(σ, N) for {t}: skipped ({r['skipped']})")
            continue
        L += [f"**B*(σ, N) = a / (σ^α·(1 + (b/N)^c))** for {t}: R² (log) = {_g(r['r2_log'], 4)}", "",
              "| parameter | estimate [interval] |", "|---|---|"]
        L += [f"| {k} | {_ci(v)}{' †' if k in (r.get('at_bound') or []) else ''} |"
              for k, v in r["params"].items()] + [""]
    L.append("")

    L += ["## Data efficiency D_J(σ) per model size", "", "D_J(σ) = D_min + (β/σ)^α, tested against D_J = const "
          "by AICc where the points allow it.", ""]
    L += _param_table(fit["data_efficiency_sigma"], ["task", "param_count", "threshold"], ["task", "N", "J"]) + [""]
    L += _selection_lines(fit)
    if fit["data_efficiency_sigma_n"]:
        L += ["## Data efficiency D_J(σ, N) (selected law)", ""]
        L += _param_table(fit["data_efficiency_sigma_n"], ["task", "threshold"], ["task", "J"]) + [""]

    ex = fit.get("extrapolation") or []
    if ex:
        L += ["## Held-out extrapolation", "",
              "Fit on all but the largest level of one axis, predict that level. Errors are mean |log(pred/obs)|; "
              "×e^error is how far an extrapolation of that size may be off.", "",
              "| task | J | held out | from | train error | held-out error |", "|---|---|---|---|---|---|"]
        L += [f"| {e['task']} | {_g(e['threshold'])} | {e['holdout']} = {_g(e['held_level'])} | "
              f"≤ {_g(e.get('train_max'))} | {_g(e['mean_abs_log_error_train'])} | "
              f"{_g(e['mean_abs_log_error_heldout'])} (×{_g(math.exp(e['mean_abs_log_error_heldout']))}) |"
              for e in ex] + [""]

    al = fit["allocation"]
    L += ["## Compute-optimal allocation", ""]
    if al.get("skipped"):
        L += [f"Skipped: {al['skipped']}", ""]
    if "delta" in al:
        K = al.get("extrapolate", 1.0)
        L += [f"Compute C = 10·N·B·σ·D FLOPs; budget F = C + δ·D with δ = {_g(al['delta'])} FLOPs per env step "
              f"({al['delta_source']}). Optima are searched "
              + ("inside the swept σ and N (pass --extrapolate K to search K× beyond; such values are marked)."
                 if K == 1 else f"up to ×{_g(K)} beyond the swept σ and N; values outside the sweep are marked "
                                "(extrapolated)."), ""]
        for t, bm in al.get("batch_models", {}).items():
            L.append(f"- batch size used for {t}: " + ", ".join(f"{k} = {_g(v)}" for k, v in bm.items()))
        L.append("")
    rows = al.get("per_threshold", [])
    if rows:
        L += ["| task | J | law | σ* | N* | B | D* | C* | F* | F if σ only | F if N only | unconstrained optimum |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            iv = r["intervals"]
            sa = r.get("semi_analytic")
            check = ("–" if sa is None else "agrees" if r.get("agree") else
                     f"outside the box (σ {_g(sa['sigma'])}, N {_g(sa['N'])})" if not sa.get("inside_box")
                     else "DISAGREES")
            so = f"×{_g(r['sigma_only']['F_ratio'])}" if r.get("sigma_only") else "–"
            no = f"×{_g(r['N_only']['F_ratio'])}" if r.get("N_only") else "–"
            L.append(f"| {r['task']} | {_g(r['threshold'])} | {r.get('kind', '')} | {_optimum_cell(r, 'sigma')} | "
                     f"{_optimum_cell(r, 'N')} | {_g(r['B'])} | {_ci(iv['D'])} | {_ci(iv['C'])} | {_ci(iv['F'])} | "
                     f"{so} | {no} | {check} |")
        L += ["", "σ only / N only: keep the other axis at the optimum of the lowest J and scale just one; "
              "the factor is the extra budget needed. An optimum on the edge of the searched box is not an "
              "optimum: the sweep must be extended in that direction.", ""]
    reg_rows = [r for r in rows if r.get("region")]
    if reg_rows:
        L += ["### Near-optimal regions", "",
              "Allocations whose budget is within 1% / 5% of the least one, as a confidence set: an allocation is "
              f"left out only if it is ε-near-optimal in fewer than {(1 - st['level']) / 2:.0%} of the seed-bootstrap "
              "replicates. *law*: on the fitted D_J(σ, N) over the searched box; *cells*: on the measured "
              "configurations' own D_J (no law), each axis reaching halfway to the next swept level (the grid's "
              "resolution); *region*: the box holding both.", "",
              "| task | J | ε | region σ | region N | region B | law σ | law N | cells σ | cells N | cells B | agree |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in reg_rows:
            for k in ("1%", "5%"):
                g_ = r["region"].get(k) or {}
                lw = (r["region"].get("law") or {}).get(k) or {}
                ce = (r["region"].get("cells") or {}).get(k) or {}
                agree = {True: "yes", False: "**no**"}.get(g_.get("agree"), "–")
                L.append(f"| {r['task']} | {_g(r['threshold'])} | {k} | {_rng(g_.get('sigma'))} | {_rng(g_.get('N'))} | "
                         f"{_rng(g_.get('B'))} | {_rng(lw.get('sigma'))} | {_rng(lw.get('N'))} | "
                         f"{_rng(ce.get('sigma'))} | {_rng(ce.get('N'))} | {_rng(ce.get('B'))} | {agree} |")
        L.append("")
    if al.get("power_laws"):
        L += ["### Budget scaling across thresholds", "",
              "y* = y_ref·(F/F_ref)^s, F_ref = geometric mean of the fitted optima's budgets (A = y at F = 1 FLOP "
              "is in fit.json). Valid over the F range of the optima only.", "",
              "| task | law | y at F_ref | s | R² (log) | F range |", "|---|---|---|---|---|---|"]
        for p in al["power_laws"]:
            if "skipped" in p:
                L.append(f"| {p['task']} | {p['formula']} | skipped: {p['skipped']} | | | |")
            else:
                ref = p.get("at_F_ref") or {}
                L.append(f"| {p['task']} | {p['formula']} | {_ci(ref) if ref else '–'} (F_ref {_g(ref.get('F_ref'))}) | "
                         f"{_ci(p['params']['s'])} | {_g(p['r2_log'], 4)} | "
                         f"{_g(p['F_range'][0])}–{_g(p['F_range'][1])} (×{_g(p['F_range'][1] / p['F_range'][0])}) |")
        L.append("")
    if figures:
        L += ["## Figures", ""] + [f"![{Path(f).stem}]({Path(f).name})" for f in figures if f.endswith(".png")]
    return "\n".join(L) + "\n"


def write_outputs(fit: dict, out_dir: str | Path, figures: bool = True) -> list[str]:
    """Write fit.json, the figures (PNG + PDF) and report.md into out_dir; returns the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fit = jsonable(fit)
    write_fit(fit, out_dir / "fit.json")
    paths = [str(out_dir / "fit.json")]
    figs: list[str] = []
    if figures:
        from .plots import plot_all
        figs = plot_all(fit, out_dir)
    atomic_write_text(out_dir / "report.md", render_report(fit, figs))
    return paths + figs + [str(out_dir / "report.md")]
