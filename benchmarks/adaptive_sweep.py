"""Adaptive design + early stopping vs the full grid, on a simulated study with a known answer.

    .venv/bin/python benchmarks/adaptive_sweep.py [--reps 6] [--width 0.12] [--out runs/bench_adaptive]

The study: the `toy` trial kind's `toy/law` (curves drawn from `scaling.synthetic.Truth`'s D_J(σ, N),
per-seed log-normal D warp 5%, observation noise 0.01, 40 log-spaced log points), σ ∈ {0.5, 1, 2, 4,
8} × N ∈ {1e5, 3e5, 1e6, 3e6} (20 cells), B = 32, thresholds J ∈ {0.3, 0.4, 0.5, 0.6, 0.7}, every
trial's budget 1.25 × the slowest cell's D at J = 0.7. The target: the exponents of σ*(F) and N*(F)
(the budget laws of the honest-laws analysis, 90% seed-bootstrap intervals), to a common interval
width W (`--width`). Compute = Σ over trials and seeds of env steps run × (10·N·B·σ + δ), δ fixed.

Per repetition (its own seeds):
  grid        every cell at the full budget with S seeds, S the smallest of 3, 4, 6, 8 whose
              intervals are both narrower than W (8 if none is), confirmed by a refit with 4× the
              bootstrap replicates (as the adaptive study confirms before it stops);
  grid + ES   the same S-seed grid (the same seeds, so the same curves up to the stop) with
              threshold-aware early stopping (a trial stops once all its seeds' isotonic curves, and
              their mean's, pass the top threshold + margin);
  adaptive    `adaptive:` design (3×3 initial cells, 3 trials of 4 seeds per round, stop at width W)
              with early stopping.
Coverage: how often the final 90% intervals contain the true exponents (the same log-linear budget
law fitted to the true optima at the same thresholds, box and δ). The last line is
`compute_saving_vs_grid=<grid compute / adaptive compute>` (median over repetitions).
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from pathlib import Path

import numpy as np

UTDS = [0.5, 1, 2, 4, 8]
WIDTHS = [316, 548, 1000, 1732]                     # N = width² ≈ 1e5, 3e5, 1e6, 3e6
THRESHOLDS = [0.3, 0.4, 0.5, 0.6, 0.7]
BATCH = 32
SEED_LEVELS = (3, 4, 6, 8)


def budget_steps() -> int:
    from scaling_rl.scaling import synthetic
    truth = synthetic.Truth()
    return int(1.25 * max(truth.D(max(THRESHOLDS), s, w * w) for s in UTDS for w in WIDTHS))


def spec_dict(out: Path, seeds: int, seed0: int, *, early_stop: bool, adaptive: dict | None) -> dict:
    d = {"name": out.name, "agent": "toy", "out_dir": str(out), "seeds": seeds, "seed": seed0,
         "env_steps": budget_steps(),
         "base": {"env": "toy/law", "chunk_env_steps": 20000, "log_points": 120, "batch_size": BATCH},
         "grid": {"utd": UTDS, "width": WIDTHS}, "backend": {"workers": 0}, "checkpoint_every": 1000,
         "compile_cache": False}
    if early_stop:
        d["early_stop"] = {"metric": "eval_return", "thresholds": THRESHOLDS, "margin": 0.02}
    if adaptive is not None:
        d["adaptive"] = adaptive
    return d


def truth_exponents(delta: float) -> dict:
    """σ*(F), N*(F) exponents of the truth: the analysis' budget-law fit on the true optima."""
    from scaling_rl.scaling import allocation as alloc, synthetic
    truth = synthetic.Truth()
    bm = alloc.BatchModel.constant(BATCH)
    box = {"sigma_range": (min(UTDS), max(UTDS)), "n_range": (min(WIDTHS) ** 2, max(WIDTHS) ** 2)}
    opts = [alloc.optimum(truth.params(J), bm, delta, **box) for J in THRESHOLDS]
    lF = np.log([o["F"] for o in opts])
    out = {}
    for ax in ("sigma", "N"):
        out[ax] = float(np.polyfit(lF, np.log([o[ax] for o in opts]), 1)[0])
    return out


def fit_widths(fit: dict) -> dict:
    """{"sigma"|"N": (estimate, lo, hi)} of the budget-law exponents (None when there is no interval)."""
    out = {}
    for law in fit.get("allocation", {}).get("power_laws", []):
        if law["target"] in ("sigma", "N") and "params" in law:
            s = law["params"]["s"]
            out[law["target"]] = (s["estimate"], s.get("lo"), s.get("hi"))
    return out


def width(iv) -> float:
    return math.inf if iv is None or iv[1] is None else iv[2] - iv[1]


def covers(iv, truth: float) -> bool:
    return iv is not None and iv[1] is not None and iv[1] <= truth <= iv[2]


def compute_of(table, delta: float) -> tuple[float, float]:
    """(env steps, FLOPs) a sweep spent: the adaptive study's own accounting (`adaptive.spent`)."""
    from scaling_rl.sweep.adaptive import spent
    use = spent(table, delta)
    return use["env_steps"], use["flops"]


def fit_table(table, delta: float, n_bootstrap: int) -> dict:
    from scaling_rl.scaling import analysis, data
    cs = data.curves_from_table(table, "eval_return")
    st = analysis.Settings(thresholds=THRESHOLDS, normalize="none", n_bootstrap=n_bootstrap, delta=delta,
                           holdout=False, max_starts=4, seed=0)
    return analysis.analyze(cs, st)


def run_grid(out: Path, seeds: int, seed0: int, early_stop: bool):
    from scaling_rl.sweep import collect, parse_spec, run_sweep
    shutil.rmtree(out, ignore_errors=True)
    spec = parse_spec(spec_dict(out, seeds, seed0, early_stop=early_stop, adaptive=None))
    run_sweep(spec, progress=False)
    return collect(out)


def one_rep(root: Path, rep: int, W: float, n_bootstrap: int, delta: float, truth: dict) -> dict:
    from scaling_rl.sweep import parse_spec
    from scaling_rl.sweep.adaptive import proposed_trials, run_adaptive
    seed0 = 1000 * (rep + 1)
    res = {}
    t0 = time.time()
    for S in SEED_LEVELS:   # the smallest grid (seeds per cell) that reaches W, confirmed as the adaptive
        table = run_grid(root / f"grid_{rep}", S, seed0, early_stop=False)   # study confirms its stop
        iv = fit_widths(fit_table(table, delta, n_bootstrap))
        if all(width(iv.get(ax)) <= W for ax in ("sigma", "N")) or S == max(SEED_LEVELS):
            iv = fit_widths(fit_table(table, delta, 4 * n_bootstrap))
            if all(width(iv.get(ax)) <= W for ax in ("sigma", "N")):
                break
    env, fl = compute_of(table, delta)
    res["grid"] = {"seeds": S, "env_steps": env, "flops": fl, "iv": iv, "reached": all(
        width(iv.get(ax)) <= W for ax in ("sigma", "N")), "wall": time.time() - t0}
    t0 = time.time()
    table_es = run_grid(root / f"grid_es_{rep}", S, seed0, early_stop=True)
    env, fl = compute_of(table_es, delta)
    iv = fit_widths(fit_table(table_es, delta, 4 * n_bootstrap))
    res["grid_es"] = {"seeds": S, "env_steps": env, "flops": fl, "iv": iv, "reached": all(
        width(iv.get(ax)) <= W for ax in ("sigma", "N")), "wall": time.time() - t0}
    t0 = time.time()
    out = root / f"adaptive_{rep}"
    shutil.rmtree(out, ignore_errors=True)
    spec = parse_spec(spec_dict(out, 4, seed0, early_stop=True, adaptive={
        "thresholds": THRESHOLDS, "tolerance": W, "n_bootstrap": n_bootstrap, "batch": 3, "max_rounds": 12,
        "delta": delta}))
    state = run_adaptive(spec, progress=False, say=lambda m: None)
    last = state["rounds"][-1]
    fit = json.loads((out / "adaptive" / f"round_{last['round']}" / "fit.json").read_text())
    iv = fit_widths(fit)
    res["adaptive"] = {"seeds": None, "env_steps": last["fit"]["env_steps"], "flops": last["fit"]["flops"], "iv": iv,
                       "reached": all(width(iv.get(ax)) <= W for ax in ("sigma", "N")), "wall": time.time() - t0,
                       "rounds": len(state["rounds"]), "trials": len(proposed_trials(state, spec)),
                       "decision": last["decision"]}
    for k, v in res.items():
        v["covers"] = {ax: covers(v["iv"].get(ax), truth[ax]) for ax in ("sigma", "N")}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--width", type=float, default=0.12, help="target width of each exponent's 90%% interval")
    ap.add_argument("--bootstrap", type=int, default=64)
    ap.add_argument("--out", default="runs/bench_adaptive")
    args = ap.parse_args()
    from scaling_rl.sweep.adaptive import default_delta, cells_of
    from scaling_rl.sweep import parse_spec
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    delta = default_delta(cells_of(parse_spec(spec_dict(root / "probe", 1, 0, early_stop=False, adaptive=None)).trials))
    truth = truth_exponents(delta)
    print(f"truth: σ*(F) exponent {truth['sigma']:.4f}, N*(F) exponent {truth['N']:.4f} (δ = {delta:.3g} FLOPs/step); "
          f"target width W = {args.width}; {args.reps} repetitions; {args.bootstrap} bootstrap replicates per fit")
    reps = []
    for r in range(args.reps):
        res = one_rep(root, r, args.width, args.bootstrap, delta, truth)
        reps.append(res)
        print(f"rep {r}: " + " | ".join(
            f"{k}: {v['flops']:.3g} FLOPs, widths σ {width(v['iv'].get('sigma')):.3f} N {width(v['iv'].get('N')):.3f}"
            + (f", {v['seeds']} seeds" if v["seeds"] else f", {v['trials']} trials / {v['rounds']} rounds ({v['decision']})")
            for k, v in res.items()), flush=True)
    from rich.console import Console
    from rich.table import Table
    tab = Table(title=f"same target width W = {args.width} on both exponents (median over {args.reps} repetitions)")
    for c in ("design", "compute (FLOPs)", "env steps", "× grid compute", "reached W", "coverage σ*", "coverage N*",
              "wall s"):
        tab.add_column(c, justify="right")
    g = np.array([r["grid"]["flops"] for r in reps])
    for name, label in (("grid", "full grid"), ("grid_es", "grid + early stopping"), ("adaptive", "adaptive + early stopping")):
        fl = np.array([r[name]["flops"] for r in reps])
        tab.add_row(label, f"{np.median(fl):.3g}", f"{np.median([r[name]['env_steps'] for r in reps]):.3g}",
                    f"{np.median(g / fl):.2f}", f"{sum(r[name]['reached'] for r in reps)}/{len(reps)}",
                    f"{sum(r[name]['covers']['sigma'] for r in reps)}/{len(reps)}",
                    f"{sum(r[name]['covers']['N'] for r in reps)}/{len(reps)}",
                    f"{np.median([r[name]['wall'] for r in reps]):.1f}")
    Console(width=150).print(tab)
    from scaling_rl.sweep import adaptive_plots
    rows = [{"design": label, "flops": r[name]["flops"],
             "widths": {ax: width(r[name]["iv"].get(ax)) for ax in ("sigma", "N")}}
            for r in reps for name, label in (("grid", "full grid"), ("grid_es", "grid + early stopping"),
                                              ("adaptive", "adaptive + early stopping"))]
    fig = adaptive_plots.plot_comparison(rows, root / "comparison.png", tolerance=args.width)
    adaptive_plots.write_figures(root / "adaptive_0")
    print(f"figures: {fig}, {root / 'adaptive_0' / 'adaptive'}/rounds.png, widths.png")
    es = np.array([r["grid"]["flops"] / r["grid_es"]["flops"] for r in reps])
    ad = np.array([r["grid"]["flops"] / r["adaptive"]["flops"] for r in reps])
    cov_g = np.mean([[r["grid"]["covers"][a] for a in ("sigma", "N")] for r in reps])
    cov_a = np.mean([[r["adaptive"]["covers"][a] for a in ("sigma", "N")] for r in reps])
    print(f"early_stopping_saving_vs_grid={np.median(es):.2f}")
    print(f"coverage_grid={cov_g:.2f} coverage_adaptive={cov_a:.2f}")
    (root / "reps.json").write_text(json.dumps(reps, indent=1, default=str))
    print(f"compute_saving_vs_grid={np.median(ad):.2f}")


if __name__ == "__main__":
    main()
