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
    if p.get("lo") is None or p.get("hi") is None:
        return f"{_g(p['estimate'], 4)} (no interval)"
    return f"{_g(p['estimate'], 4)} [{_g(p['lo'])}, {_g(p['hi'])}]"


def _param_table(recs: list[dict], keys: list[str], head: list[str]) -> list[str]:
    params = []
    for r in recs:
        if "params" in r:
            params = list(r["params"])
            break
    lines = ["| " + " | ".join(head + params + ["R² (log)", "points"]) + " |",
             "|" + "---|" * (len(head) + len(params) + 2)]
    for r in recs:
        cells = [_g(r.get(k)) for k in keys]
        if "skipped" in r:
            lines.append("| " + " | ".join(cells + [f"skipped: {r['skipped']}"] + [""] * (len(params) + 1)) + " |")
            continue
        bound = set(r.get("at_bound") or [])
        cells += [_ci(r["params"][p]) + (" †" if any(b == p or b.startswith(p + "[") for b in bound) else "")
                  for p in params] + [_g(r["r2_log"], 4), str(r["n_points"])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render_report(fit: dict, figures: list[str] | None = None) -> str:
    """The markdown report."""
    st = fit["settings"]
    lvl = int(round(100 * st["level"]))
    L = [f"# Scaling-law fit: `{fit['metric']}`", "",
         f"Source: `{fit['source']}`  ", f"Tasks: {', '.join(fit['tasks'])}  ",
         "Levels: " + "; ".join(f"{k} = {', '.join(_g(v) for v in vs)}" for k, vs in fit["levels"].items() if vs) + "  ",
         f"Bootstrap: {st['n_bootstrap']} resamples of seeds (min {st['min_seeds']} seeds per configuration); "
         f"{lvl}% percentile intervals; loss = {st['loss']}"
         + (f" (Huber δ = {st['huber_delta']} in log units)" if st["loss"] == "huber" else "")
         + ", sum over points, residuals in log space; multi-start grid + L-BFGS-B.", ""]
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

    L += ["## Data efficiency D_J(σ) per model size", "", "D_J(σ) = D_min + (β/σ)^α "
          "(† = estimate on the optimiser's bound: that parameter is not identified by these points)", ""]
    L += _param_table(fit["data_efficiency_sigma"], ["task", "param_count", "threshold"], ["task", "N", "J"]) + [""]
    if fit["data_efficiency_sigma_n"]:
        L += ["## Data efficiency D_J(σ, N)", "", "D_J(σ, N) = D_min·(1 + (a/σ)^α + (b/N)^β)", ""]
        L += _param_table(fit["data_efficiency_sigma_n"], ["task", "threshold"], ["task", "J"]) + [""]

    ex = fit.get("extrapolation") or []
    if ex:
        L += ["## Held-out extrapolation", "",
              "Fit on all but the largest level of one axis, predict that level. Errors are mean |log(pred/obs)|.", "",
              "| task | J | held out | train error | held-out error |", "|---|---|---|---|---|"]
        L += [f"| {e['task']} | {_g(e['threshold'])} | {e['holdout']} = {_g(e['held_level'])} | "
              f"{_g(e['mean_abs_log_error_train'])} | {_g(e['mean_abs_log_error_heldout'])} |" for e in ex] + [""]

    al = fit["allocation"]
    L += ["## Compute-optimal allocation", ""]
    if al.get("skipped"):
        L += [f"Skipped: {al['skipped']}", ""]
    if "delta" in al:
        L += [f"Compute C = 10·N·B·σ·D FLOPs; budget F = C + δ·D with δ = {_g(al['delta'])} FLOPs per env step "
              f"({al['delta_source']}).", ""]
        for t, bm in al.get("batch_models", {}).items():
            L.append(f"- batch size used for {t}: " + ", ".join(f"{k} = {_g(v)}" for k, v in bm.items()))
        L.append("")
    rows = al.get("per_threshold", [])
    if rows:
        L += ["| task | J | σ* | N* | B | D* | C* | F* | F if σ only | F if N only | semi-analytic agrees |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            iv = r["intervals"]
            L.append(f"| {r['task']} | {_g(r['threshold'])} | {_ci(iv['sigma'])} | {_ci(iv['N'])} | {_g(r['B'])} | "
                     f"{_ci(iv['D'])} | {_ci(iv['C'])} | {_ci(iv['F'])} | ×{_g(r['sigma_only']['F_ratio'])} | "
                     f"×{_g(r['N_only']['F_ratio'])} | {'yes' if r.get('agree') else 'n/a'}"
                     f"{' (extrapolated)' if r.get('extrapolated') else ''} |")
        L += ["", "σ only / N only: keep the other axis at the optimum of the lowest J and scale just one; "
              "the factor is the extra budget needed.", ""]
    if al.get("power_laws"):
        L += ["### Budget scaling across thresholds", "", "| task | law | A | s | R² (log) |", "|---|---|---|---|---|"]
        L += [f"| {p['task']} | {p['formula']} | {_ci(p['params']['A'])} | {_ci(p['params']['s'])} | "
              f"{_g(p['r2_log'], 4)} |" for p in al["power_laws"]] + [""]
    for r in al.get("sigma_only_studies", []):
        L.append(f"- {r['task']} N = {_g(r['N'])}, J = {_g(r['threshold'])}: σ* = {_g(r['sigma'])}, "
                 f"D = {_g(r['D'])}, F = {_g(r['F'])}")
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
