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


def _ci(p: dict) -> str:
    """A quantity as the report prints it: "est [lo, hi]" (BCa intervals marked ᵇ), "est (no interval:
    why)", or "not identified (why)" — a parameter the data cannot pin down is never a number."""
    if p is None:
        return "–"
    if p.get("not_identified"):
        return f"not identified ({p['not_identified']})"
    if p.get("lo") is None or p.get("hi") is None:
        why = p.get("reason")
        return f"{_g(p['estimate'], 4)} (no interval{': ' + why if why else ''})"
    mark = ("ᵇ" if p.get("method") == "BCa" else "") + ("ʷ" if p.get("widened_for_lack_of_fit") else "") + (
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
    if edge:
        bound = r["box"][ax][1 if edge == "upper" else 0]
        word = {"sigma": "σ", "N": "N"}[ax]
        return (f"beyond the sweep ({'≥' if edge == 'upper' else '≤'} {_g(bound)}): extend {word} "
                f"{'upward' if edge == 'upper' else 'downward'}")
    return _ci(iv) + (" (extrapolated)" if r.get("extrapolated", {}).get(ax) else "")


def render_report(fit: dict, figures: list[str] | None = None) -> str:
    """The markdown report."""
    st = fit["settings"]
    lvl = int(round(100 * st["level"]))
    bs = fit.get("bootstrap") or {}
    mode = {"seed": "seed bootstrap", "none": "none"}.get(bs.get("mode"), "?")
    L = [f"# Scaling-law fit: `{fit['metric']}`", "",
         f"Source: `{fit['source']}`  ", f"Tasks: {', '.join(fit['tasks'])}  ",
         "Levels: " + "; ".join(f"{k} = {', '.join(_g(v) for v in vs)}" for k, vs in fit["levels"].items() if vs) + "  ",
         f"Intervals: {lvl}% — {mode}, {bs.get('n', 0)} resamples; replicates ok: "
         + (", ".join(f"{k} {v}/{bs.get('n', 0)}" for k, v in (bs.get("n_ok_by_scope") or {}).items()) or "–")
         + " (a replicate that fails in any fit of a chain of combined quantities is dropped from all of them); "
         f"percentile intervals where the "
         f"replicates are centred on the estimate, BCa (marked ᵇ) where not; min {st['min_seeds']} seeds per "
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
