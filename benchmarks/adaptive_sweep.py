"""Adaptive design + early stopping vs grid + early stopping, independent seeds, on a simulated study.

    .venv/bin/python benchmarks/adaptive_sweep.py [--reps 50] [--widths 0.05 0.07 0.09] [--max-minutes 60]
    .venv/bin/python benchmarks/adaptive_sweep.py --quick          # 2 repetitions, one width, 32 replicates

The study: the `toy` trial kind's `toy/law` (curves drawn from `scaling.synthetic.Truth`'s D_J(σ, N),
per-seed log-normal D warp 5%, observation noise 0.01, 120 log-spaced log points), σ ∈ {0.5, 1, 2, 4,
8} × N ∈ {1e5, 3e5, 1e6, 3e6} (20 cells), B = 32, thresholds J ∈ {0.3, 0.4, 0.5, 0.6, 0.7}, every
trial's budget 1.25 × the slowest cell's D at J = 0.7. The target: the exponents of σ*(F) and N*(F)
(the budget laws of the honest-laws analysis, 90% seed-bootstrap intervals) narrower than W, for each
W of `--widths`. Compute = Σ over trials and seeds of env steps run × (10·N·B·σ + δ), δ fixed.

Per repetition r, the two designs get DISJOINT seeds (grid: global seeds 10⁷ + 100·r + k; adaptive:
first trial seed 1 + 1000·r, global seeds 4× that and up), so their outcomes are independent:

  grid + ES   every cell as one-seed trials (each stops on its own once its isotonic curve passes the
              top threshold + margin: the most chances to stop a grid can have), seeds added one at a
              time to every cell: S = 3, 4, ..., --max-seeds. For each W the grid's cost is that of the
              smallest S whose fit reaches W — decided as the adaptive study decides its stop (widths
              from --bootstrap replicates, confirmed by a refit with 4× as many). A researcher adding
              seeds to a grid until the intervals are narrow enough pays exactly this.
  adaptive    the `adaptive:` design (--initial cells, --trial-seeds seeds per trial, 3 trials per
              round, at most 12 rounds, stop at width W, confirmed the same way), early stopping on.
  full grid   (for the old figure) the grid + ES's S seeds per cell run to the full budget: its
              compute is exact arithmetic (budget × FLOPs per step), no run needed.

Printed per W (90% intervals; each contains its estimate):
  adaptive_saving_vs_grid_es  mean grid+ES compute / mean adaptive compute over repetitions; interval:
                              percentile bootstrap over repetitions (2000 resamples, the two designs
                              resampled independently, as their seeds are);
  early_stopping_saving       full grid / grid + ES at the same seeds (the old `compute_saving_vs_grid`
                              was mostly this: adaptive+ES vs the full grid is printed beside it);
  ceiling                     mean grid+ES compute / mean compute of the adaptive study's initial round
                              alone: no adaptive design that starts with that round can save more;
  coverage                    of each true exponent by each design's final interval, with a Wilson 90%
                              interval over repetitions;
  reached                     repetitions whose final intervals are narrower than W.
Each repetition is written to <out>/reps/rep_<r>.json as it finishes; a rerun with the same settings
resumes (skips finished repetitions). `--max-minutes` stops starting new repetitions after that long.
"""
from __future__ import annotations

import argparse
import hashlib
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
MIN_SEEDS = 3
AXES = ("sigma", "N")


def budget_steps() -> int:
    from scaling_rl.scaling import synthetic
    truth = synthetic.Truth()
    return int(1.25 * max(truth.D(max(THRESHOLDS), s, w * w) for s in UTDS for w in WIDTHS))


def spec_dict(out: Path, seeds: int, seed0: int, *, grid_seeds: list | None = None, adaptive: dict | None = None,
              early_stop: bool = True) -> dict:
    grid = {"utd": UTDS, "width": WIDTHS}
    if grid_seeds is not None:
        grid["seed"] = list(grid_seeds)
    d = {"name": out.name, "agent": "toy", "out_dir": str(out), "seeds": seeds, "seed": seed0,
         "env_steps": budget_steps(),
         "base": {"env": "toy/law", "chunk_env_steps": 20000, "log_points": 120, "batch_size": BATCH},
         "grid": grid, "backend": {"workers": 0}, "checkpoint_every": 1000, "compile_cache": False}
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
    return {ax: float(np.polyfit(lF, np.log([o[ax] for o in opts]), 1)[0]) for ax in AXES}


def intervals(fit: dict) -> dict:
    """{"sigma"|"N": [estimate, lo, hi]} of the budget-law exponents (lo, hi None: no interval)."""
    out = {}
    for law in fit.get("allocation", {}).get("power_laws", []):
        if law["target"] in AXES and "params" in law:
            s = law["params"]["s"]
            out[law["target"]] = [s["estimate"], s.get("lo"), s.get("hi")]
    return out


def width(iv) -> float:
    return math.inf if iv is None or iv[1] is None else iv[2] - iv[1]


def max_width(ivs: dict) -> float:
    return max(width(ivs.get(ax)) for ax in AXES)


def covers(iv, truth: float) -> bool:
    return iv is not None and iv[1] is not None and iv[1] <= truth <= iv[2]


def fit_table(table, delta: float, n_bootstrap: int, capture: dict | None = None) -> dict:
    """The honest-laws analysis of a results table (`capture`: filled with what the JSON leaves out)."""
    from scaling_rl.scaling import analysis, data
    cs = data.curves_from_table(table, "eval_return")
    st = analysis.Settings(thresholds=THRESHOLDS, normalize="none", n_bootstrap=n_bootstrap, delta=delta,
                           holdout=False, max_starts=4, seed=0)
    return analysis.analyze(cs, st, capture=capture)


def grid_seeds(rep: int, S: int) -> range:
    """The grid + ES baseline's global seeds of repetition `rep`, first S of them (disjoint from the adaptive's)."""
    g0 = 10_000_000 + 100 * rep
    return range(g0, g0 + S)


def full_budget_flops(table, delta: float) -> float:
    """FLOPs of the same trials run to their whole budget (no early stopping)."""
    from scaling_rl.sweep.adaptive import flops_per_step
    per = table.groupby(["trial_id", "seed_index"]).agg(N=("param_count", "first"), utd=("utd", "first"),
                                                         batch_size=("batch_size", "first"))
    return float(sum(budget_steps() * flops_per_step({"utd": r.utd, "batch_size": r.batch_size}, float(r.N), delta)
                     for r in per.itertuples(index=False)))


def run_grid_es(root: Path, rep: int, Ws: list, n_bootstrap: int, delta: float, max_seeds: int) -> dict:
    """The grid + ES baseline for every W: one-seed trials, seeds added to every cell one at a time."""
    from scaling_rl.sweep import collect, parse_spec, run_sweep
    from scaling_rl.sweep.adaptive import spent
    out = root / f"grid_es_{rep}"
    shutil.rmtree(out, ignore_errors=True)
    res, todo, run_s, fit_total = {}, sorted(Ws, reverse=True), 0.0, 0.0
    for S in range(MIN_SEEDS, max_seeds + 1):
        t0 = time.time()   # add seed S to every cell (the store skips the trials already run)
        run_sweep(parse_spec(spec_dict(out, 1, 0, grid_seeds=grid_seeds(rep, S))), progress=False)
        sub = collect(out)
        run_s += time.time() - t0
        fit_s = time.time()
        iv = intervals(fit_table(sub, delta, n_bootstrap))
        confirmed = None
        if todo and (max_width(iv) <= todo[0] or S == max_seeds):
            confirmed = intervals(fit_table(sub, delta, 4 * n_bootstrap))
        fit_total += time.time() - fit_s
        print(f"  rep {rep} grid + ES, {S} seeds: widths σ {width(iv.get('sigma')):.3f} N {width(iv.get('N')):.3f}"
              + (f", confirmed {width(confirmed.get('sigma')):.3f} {width(confirmed.get('N')):.3f}" if confirmed else ""),
              flush=True)
        use = spent(sub, delta)
        for W in list(todo):
            if confirmed is not None and (max_width(confirmed) <= W or S == max_seeds):
                res[str(W)] = {"seeds": S, "flops": use["flops"], "env_steps": use["env_steps"],
                               "full_grid_flops": full_budget_flops(sub, delta), "iv": confirmed,
                               "reached": max_width(confirmed) <= W, "wall_run": run_s, "wall_fit": fit_total}
                todo.remove(W)
        if not todo:
            break
    if rep > 0:
        shutil.rmtree(out, ignore_errors=True)
    return res


def run_adaptive_study(root: Path, rep: int, W: float, n_bootstrap: int, delta: float, trial_seeds: int,
                       initial: str) -> dict:
    from scaling_rl.sweep import parse_spec
    from scaling_rl.sweep.adaptive import proposed_trials, run_adaptive
    out = root / f"adaptive_{rep}_w{W:g}"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.time()
    spec = parse_spec(spec_dict(out, trial_seeds, 1 + 1000 * rep, adaptive={
        "thresholds": THRESHOLDS, "tolerance": W, "n_bootstrap": n_bootstrap, "batch": 3, "max_rounds": 12,
        "delta": delta, "initial": initial}))
    state = run_adaptive(spec, progress=False, say=lambda m: None)
    last = state["rounds"][-1]
    iv = intervals(json.loads((out / "adaptive" / f"round_{last['round']}" / "fit.json").read_text()))
    res = {"flops": last["fit"]["flops"], "env_steps": last["fit"]["env_steps"], "iv": iv,
           "reached": max_width(iv) <= W, "rounds": len(state["rounds"]),
           "trials": len(proposed_trials(state, spec)), "decision": last["decision"],
           "initial_flops": state["rounds"][0]["fit"]["flops"], "wall": time.time() - t0}
    if rep > 0:   # keep the first repetition's store for its figures; the rest only cost disk
        shutil.rmtree(out, ignore_errors=True)
    return res


def wilson(k: int, n: int, level: float = 0.9) -> tuple[float, float]:
    from scipy.stats import norm
    if n == 0:
        return (0.0, 1.0)
    z = float(norm.ppf(0.5 + level / 2))
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, c - h), min(1.0, c + h))


def ratio_of_means(a: np.ndarray, b: np.ndarray, level: float = 0.9, n_boot: int = 2000, seed: int = 0,
                   paired: bool = False):
    """mean(a) / mean(b) and its percentile-bootstrap interval over repetitions: a and b resampled
    independently (independent seeds), or together when `paired` (the same seeds)."""
    rng = np.random.default_rng(seed)
    est = float(np.mean(a) / np.mean(b))
    if len(a) < 2:
        return est, None, None
    ia = rng.integers(0, len(a), (n_boot, len(a)))
    ib = ia if paired else rng.integers(0, len(b), (n_boot, len(b)))
    boot = a[ia].mean(axis=1) / b[ib].mean(axis=1)
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return est, float(min(lo, est)), float(max(hi, est))


def fmt_iv(est, lo, hi) -> str:
    return f"{est:.2f} [{lo:.2f}, {hi:.2f}]" if lo is not None else f"{est:.2f} (one repetition: no interval)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--widths", type=float, nargs="+", default=[0.05, 0.07, 0.09],
                    help="target widths W of each exponent's 90%% interval")
    ap.add_argument("--bootstrap", type=int, default=64, help="replicates per fit (4x for a confirming refit)")
    ap.add_argument("--max-seeds", type=int, default=8, help="the grid's largest seeds per cell")
    ap.add_argument("--trial-seeds", type=int, default=4, help="seeds per adaptive trial")
    ap.add_argument("--initial", default="grid3", choices=("grid3", "corners"), help="the adaptive initial design")
    ap.add_argument("--max-minutes", type=float, default=None, help="start no repetition after this long")
    ap.add_argument("--first-rep", type=int, default=0, help="first repetition index (split a long run over processes)")
    ap.add_argument("--report-only", action="store_true", help="report every finished repetition in --out; run nothing")
    ap.add_argument("--grid-from", default=None,
                    help="take each repetition's grid + ES from this other --out (same widths, bootstrap and max "
                         "seeds: the same seeds, so the same grid), waiting for it: compares adaptive variants")
    ap.add_argument("--quick", action="store_true", help="2 repetitions, the middle width, 32 replicates")
    ap.add_argument("--out", default="runs/bench_adaptive")
    args = ap.parse_args()
    if args.quick:
        args.reps, args.bootstrap = min(args.reps, 2), 32
        args.widths = [sorted(args.widths)[len(args.widths) // 2]]
    if args.reps < 1 or args.bootstrap < 2 or args.max_seeds < MIN_SEEDS or args.trial_seeds < 1 or \
            not all(w > 0 for w in args.widths):
        raise SystemExit("adaptive_sweep: need --reps >= 1, --bootstrap >= 2, --max-seeds >= 3, "
                         "--trial-seeds >= 1 and widths > 0")
    from scaling_rl.io import atomic_write_json
    from scaling_rl.sweep import parse_spec
    from scaling_rl.sweep.adaptive import cells_of, default_delta
    root = Path(args.out)
    if not args.report_only:
        (root / "reps").mkdir(parents=True, exist_ok=True)
    delta = default_delta(cells_of(parse_spec(spec_dict(root / "probe", 1, 0, early_stop=False)).trials))
    truth = truth_exponents(delta)
    Ws = sorted(set(args.widths))
    def key_of(widths, v: int = 3) -> str:   # a repetition's record names its settings (its widths among them)
        # v: 3 = intervals at plotting positions with the adaptive interpolation error (2026-12-04 on); 2 = before
        settings = {"widths": sorted(float(w) for w in widths), "bootstrap": args.bootstrap,
                    "max_seeds": args.max_seeds, "trial_seeds": args.trial_seeds, "initial": args.initial, "v": v}
        return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]

    key = key_of(Ws)
    print(f"truth: σ*(F) exponent {truth['sigma']:.4f}, N*(F) exponent {truth['N']:.4f} (δ = {delta:.3g} FLOPs/step); "
          + (f"widths W = {Ws}; " if not args.report_only else "") + ("finished repetitions in --out (their widths);" if args.report_only else f"up to {args.reps} repetitions;") + f" {args.bootstrap} bootstrap replicates per fit "
          f"(confirm {4 * args.bootstrap}); grid S = {MIN_SEEDS}..{args.max_seeds}; adaptive: {args.initial}, "
          f"{args.trial_seeds}-seed trials", flush=True)
    t_start = time.time()
    reps = []
    old_reps = 0
    if args.report_only:
        where = root / "reps" if (root / "reps").is_dir() else root   # a run's --out, or a folder of its records
        for path in sorted(where.glob("rep_*.json"), key=lambda p: int(p.stem.split("_")[1])):
            res = json.loads(path.read_text())   # every finished repetition, whatever its widths
            if res.get("settings") == key_of(res["grid_es"]):
                reps.append(res)
            elif res.get("settings") == key_of(res["grid_es"], v=2):
                old_reps += 1
                reps.append(res)
        if old_reps:
            print(f"{old_reps} of {len(reps)} repetitions were run before 2026-12-04's interval changes (linear-"
                  "quantile ends, quarter-bracket interpolation error): reported as they were", flush=True)
        Ws = sorted({float(w) for r in reps for w in r["grid_es"]})
    def one(r: int, widths: list, grid: dict | None) -> None:
        t0 = time.time()
        res = {"rep": r, "grid_es": grid or run_grid_es(root, r, widths, args.bootstrap, delta, args.max_seeds),
               "adaptive": {str(W): run_adaptive_study(root, r, W, args.bootstrap, delta, args.trial_seeds,
                                                       args.initial) for W in widths}, "wall": time.time() - t0}
        res["settings"] = key_of(res["grid_es"])
        atomic_write_json(root / "reps" / f"rep_{r}.json", res)
        reps.append(res)
        print(f"rep {r} ({res['wall']:.0f} s): " + " | ".join(
            f"W={W:g}: grid+ES {res['grid_es'][str(W)]['seeds']} seeds {res['grid_es'][str(W)]['flops']:.3g}, "
            f"adaptive {res['adaptive'][str(W)]['flops']:.3g} ({res['adaptive'][str(W)]['trials']} trials, "
            f"{res['adaptive'][str(W)]['decision']})" for W in widths), flush=True)

    def out_of_time() -> bool:
        return args.max_minutes is not None and time.time() - t_start > 60 * args.max_minutes

    if args.grid_from and not args.report_only:
        # the other run's repetitions as they finish (any order), at the widths both runs have
        done: set = set()
        while len(done) < args.reps and not out_of_time():
            todo = []
            for other in sorted((Path(args.grid_from) / "reps").glob("rep_*.json")):
                r = int(other.stem.split("_")[1])
                if r not in done:
                    o = json.loads(other.read_text())
                    widths = [W for W in Ws if str(W) in o["grid_es"]]
                    if widths:
                        todo.append((r, widths, {str(W): o["grid_es"][str(W)] for W in widths}))
            if not todo:
                time.sleep(20)
                continue
            r, widths, grid = todo[0]
            done.add(r)
            path = root / "reps" / f"rep_{r}.json"
            if path.exists() and json.loads(path.read_text()).get("settings") == key_of(widths):
                reps.append(json.loads(path.read_text()))
            else:
                one(r, widths, grid)
    for r in range(args.first_rep, args.first_rep + (0 if args.report_only or args.grid_from else args.reps)):
        path = root / "reps" / f"rep_{r}.json"
        if path.exists() and json.loads(path.read_text()).get("settings") == key:
            reps.append(json.loads(path.read_text()))
            continue
        if out_of_time():
            print(f"--max-minutes {args.max_minutes} reached: stopping after {len(reps)} repetitions", flush=True)
            break
        one(r, Ws, None)
    if reps:
        Ws = sorted({float(w) for r in reps for w in r["grid_es"]})
    if not reps:
        raise SystemExit("adaptive_sweep: no repetition finished")
    report(reps, Ws, truth, root)


def report(reps: list, Ws: list, truth: dict, root: Path) -> None:
    from rich.console import Console
    from rich.table import Table
    tab = Table(title=f"{len(reps)} repetitions, independent seeds per design; 90% intervals (bootstrap over "
                      f"repetitions for ratios, Wilson for proportions)")
    for c in ("W", "design", "mean FLOPs", "seeds / trials", "reached W", "coverage σ*(F) exp.", "coverage N*(F) exp.",
              "per-rep wall s"):
        tab.add_column(c, justify="right")
    lines = []
    for W in Ws:
        mine = [r for r in reps if str(W) in r["grid_es"]]   # repetitions run at this width
        n = len(mine)
        g = [r["grid_es"][str(W)] for r in mine]
        a = [r["adaptive"][str(W)] for r in mine]
        cg = np.array([g_["flops"] for g_ in g])
        ca = np.array([a_["flops"] for a_ in a])
        cf = np.array([g_["full_grid_flops"] for g_ in g])
        ci = np.array([a_["initial_flops"] for a_ in a])
        for name, rows, extra in (
                ("grid + ES", g, f"S = {np.median([x['seeds'] for x in g]):g} (median; "
                                 f"{min(x['seeds'] for x in g)}–{max(x['seeds'] for x in g)})"),
                ("adaptive + ES", a, f"{np.median([x['trials'] for x in a]):g} trials, "
                                     f"{np.median([x['rounds'] for x in a]):g} rounds (median)")):
            cov = []
            for ax in AXES:
                k = sum(covers(x["iv"].get(ax), truth[ax]) for x in rows)
                lo, hi = wilson(k, n)
                cov.append(f"{k}/{n} [{lo:.2f}, {hi:.2f}]")
            wall = np.median([x.get("wall", x.get("wall_fit", 0.0) + x.get("wall_run", 0.0)) for x in rows])
            tab.add_row(f"{W:g}", name, f"{np.mean([x['flops'] for x in rows]):.3g}", extra,
                        f"{sum(x['reached'] for x in rows)}/{n}", *cov, f"{wall:.0f}")
        sav = ratio_of_means(cg, ca)
        es = ratio_of_means(cf, cg, seed=1, paired=True)
        old = ratio_of_means(cf, ca, seed=2)
        ceil = ratio_of_means(cg, ci, seed=3)
        lines += [f"W={W:g}: early_stopping_saving (full grid / grid + ES, same seeds) = {fmt_iv(*es)}; "
                  f"adaptive + ES vs the full grid (the old compute_saving_vs_grid) = {fmt_iv(*old)}",
                  f"W={W:g}: ceiling (grid + ES / the adaptive initial round alone) = {fmt_iv(*ceil)}",
                  f"adaptive_saving_vs_grid_es={sav[0]:.2f} " + (f"[{sav[1]:.2f}, {sav[2]:.2f}]" if sav[1] is not None
                                                                 else "(one repetition: no interval)")
                  + f" (W={W:g}, {n} repetitions)"]
    Console(width=160).print(tab)
    for line in lines:
        print(line)
    try:
        from scaling_rl.sweep import adaptive_plots
        rows = [{"design": label, "flops": r[k][str(W)]["flops"],
                 "widths": {ax: width(r[k][str(W)]["iv"].get(ax)) for ax in AXES}}
                for r in reps for W in Ws if str(W) in r["grid_es"] for k, label in (("grid_es", "grid + early stopping"),
                                                           ("adaptive", "adaptive + early stopping"))]
        fig = adaptive_plots.plot_comparison(rows, root / "comparison.png", tolerance=min(Ws))
        print(f"figure: {fig}")
    except Exception as e:   # the figure is a convenience; the numbers above are the result
        print(f"figure not written: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
