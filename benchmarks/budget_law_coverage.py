"""Coverage of the budget-law exponents' intervals of a fixed-seed grid (no stopping rule), and why they missed.

    .venv/bin/python benchmarks/budget_law_coverage.py --seeds 3 --reps 72 [--first-rep 0] [--out DIR]
    .venv/bin/python benchmarks/budget_law_coverage.py --report-only --out benchmarks/results/budget_law_coverage

The study is `adaptive_sweep.py`'s (the `toy/law` curves, 5 σ × 4 N cells, B = 32, thresholds 0.3…0.7,
early stopping on) with the grid + ES baseline's own seeds (repetition r: global seeds 10⁷ + 100·r + k), but
every repetition stops at exactly `--seeds` seeds per cell: the coverage is unconditional — no "stop when
the interval is narrow enough" rule picks which intervals are kept (`adaptive_sweep.py` has that rule).
Each repetition is fitted with `--bootstrap` seed-bootstrap replicates (256: the confirming refit's count),
and its record keeps the σ*(F) and N*(F) exponents' estimate, reported interval (method; BCa in old records)
and the replicates with their seed inflation, so the report can also say what the percentile and the basic
("reflected") interval built from the same replicates would have covered.

Printed per seeds × exponent: coverage of the reported interval (Wilson 90% over repetitions), how many
were BCa, the coverage of the percentile and basic alternatives, rms z = (estimate − truth) / inflated
replicate sd, and corr(median replicate − estimate, truth − estimate): positive means the replicates sit
on the truth's side of the estimate, the reverse of what BCa's bias correction assumes. Repetitions whose
interval was withheld, or that have no budget law at all, are counted and shown beside the row, not scored.

Why they missed (2026-12-05): each cell's D_J replicates were not centred on the cell's point — the mean of
their logs sat ~0.1 × the point's error toward the truth (the crossing of an isotonic seed-mean curve is not
linear in the seeds); the law fits add the cells up, so every law, optimum and budget law leaned, and BCa
moved the intervals away. Records before any fix: <out>/s<S>.jsonl of benchmarks/results/budget_law_coverage/;
with the cells' replicates mean-centred (the fix of 2026-12-05, since replaced): .../centred/. Now (2026-12-06)
no input is re-centred and there is no BCa: every interval is the percentile interval of its own replicates
centred on the estimate (`fitting.interval`, docs/calibration.md), so the "BCa" column of new records is 0
and "percentile" below is the uncentred alternative. Not re-run for that change (72 sweeps per row).
Records: <out>/s<S>.jsonl, one line per repetition, appended as each finishes (a rerun skips done ones).
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import adaptive_sweep as study  # noqa: E402  (the study's definition: cells, thresholds, seeds, truth)

KEYS = ("estimate", "lo", "hi", "method", "p_below", "centre_shift", "reason", "n_ok", "n", "n_unknown")


def run_one(root: Path, rep: int, seeds: int, n_bootstrap: int, delta: float) -> dict:
    from scaling_rl.sweep import collect, parse_spec, run_sweep
    out = root / f"grid_{seeds}_{rep}"
    shutil.rmtree(out, ignore_errors=True)
    run_sweep(parse_spec(study.spec_dict(out, 1, 0, grid_seeds=study.grid_seeds(rep, seeds))), progress=False)
    cap: dict = {}
    fit = study.fit_table(collect(out), delta, n_bootstrap, capture=cap)
    shutil.rmtree(out, ignore_errors=True)
    R = cap["reps"]
    rec = {"rep": rep, "S": seeds}
    for law in fit.get("allocation", {}).get("power_laws", []):
        ax = law["target"]
        if ax not in study.AXES or "params" not in law:
            continue
        s = law["params"]["s"]
        rec[ax] = {k: s.get(k) for k in KEYS}
        bl = cap["budget_laws"].get((law["task"], ax))
        if bl is not None:
            rec[ax]["reps"] = [None if not np.isfinite(v) else float(f"{v:.7g}") for v in bl["reps"]]
            rec[ax]["inflation"] = float(R.scope_inflation.get(bl["scope"], R.inflation))
    return rec


def load(root: Path) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for f in sorted(root.glob("s*.jsonl")):
        rows = {}
        for line in f.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                rows[r["rep"]] = r      # a repetition run twice counts once
        if rows:
            out[int(f.stem[1:])] = [rows[k] for k in sorted(rows)]
    return out


def summarise(rows: list[dict], ax: str, truth: float) -> dict | None:
    """Coverage of the reported, percentile and basic intervals over the repetitions that have replicates."""
    rep_cov, pct, basic, zs, off, err, bca, withheld, missing = [], [], [], [], [], [], 0, 0, 0
    for r in rows:
        d = r.get(ax)
        if not d or d.get("reps") is None:   # no budget law at all (e.g. optima on the box edge): counted
            missing += 1
            continue
        if d.get("lo") is None:
            withheld += 1
            continue
        e = d["estimate"]
        x = np.array([np.nan if v is None else v for v in d["reps"]], float)
        x = x[np.isfinite(x)]   # the alternatives use the finite replicates (the reported one widens for the rest)
        rep_cov.append(d["lo"] <= truth <= d["hi"])
        bca += d.get("method") == "BCa"
        dev = d["inflation"] * (x - e)
        q_lo, q_hi = np.quantile(dev, [0.05, 0.95], method="weibull")   # the toolkit's plotting positions
        pct.append(e + q_lo <= truth <= e + q_hi)
        basic.append(e - q_hi <= truth <= e - q_lo)
        zs.append((e - truth) / dev.std())
        off.append(np.median(x) - e)
        err.append(truth - e)
    n = len(rep_cov)
    if n == 0:
        return {"n": 0, "withheld": withheld, "missing": missing} if withheld or missing else None
    off, err = np.array(off), np.array(err)
    return {"n": n, "withheld": withheld, "missing": missing, "covered": int(sum(rep_cov)), "wilson": study.wilson(int(sum(rep_cov)), n),
            "bca": int(bca), "percentile": float(np.mean(pct)), "basic": float(np.mean(basic)),
            "rms_z": float(np.sqrt(np.mean(np.square(zs)))), "mean_z": float(np.mean(zs)),
            "corr": float(np.corrcoef(off, err)[0, 1]) if n > 2 else math.nan,
            "slope": float(np.polyfit(err, off, 1)[0]) if n > 2 else math.nan}


def report(root: Path, truth: dict) -> None:
    by_s = load(root)
    if not by_s:
        raise SystemExit(f"budget_law_coverage: no records (s<S>.jsonl) in {root}")
    print("unconditional coverage of the budget-law exponents' 90% intervals (no stopping rule); "
          f"truth: σ*(F) exp. {truth['sigma']:.4f}, N*(F) exp. {truth['N']:.4f}")
    print(f"{'seeds':>5} {'exponent':>9} {'reps':>4} {'reported (Wilson 90%)':>26} {'BCa':>7} {'percentile':>10} "
          f"{'basic':>6} {'rms z':>6} {'mean z':>7} {'corr(off, err)':>14} {'slope':>6}")
    for S, rows in sorted(by_s.items()):
        for ax in study.AXES:
            m = summarise(rows, ax, truth[ax])
            gone = "" if m is None else ", ".join(
                f"{m[k]} {w}" for k, w in (("withheld", "withheld"), ("missing", "without a budget law")) if m[k])
            if m is None or m["n"] == 0:
                print(f"{S:>5} {ax:>9}  no repetition with an interval" + (f" ({gone})" if gone else ""))
                continue
            lo, hi = m["wilson"]
            cov = f"{m['covered']}/{m['n']} = {m['covered'] / m['n']:.2f} [{lo:.2f}, {hi:.2f}]"
            print(f"{S:>5} {ax:>9} {m['n']:>4} {cov:>26} {m['bca']:>3}/{m['n']:<3} {m['percentile']:>10.2f} "
                  f"{m['basic']:>6.2f} {m['rms_z']:>6.2f} {m['mean_z']:>7.2f} {m['corr']:>14.2f} {m['slope']:>6.2f}"
                  + (f"  ({gone}: not scored)" if gone else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[3], help="seeds per cell (one record file each)")
    ap.add_argument("--reps", type=int, default=72)
    ap.add_argument("--first-rep", type=int, default=0, help="first repetition index (split a run over processes)")
    ap.add_argument("--bootstrap", type=int, default=256)
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--out", default="runs/bench_budget_law_coverage")
    args = ap.parse_args()
    if args.reps < 1 or args.bootstrap < 20 or min(args.seeds) < study.MIN_SEEDS:
        raise SystemExit(f"budget_law_coverage: need --reps >= 1, --bootstrap >= 20, --seeds >= {study.MIN_SEEDS}")
    from scaling_rl.sweep import parse_spec
    from scaling_rl.sweep.adaptive import cells_of, default_delta
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    delta = default_delta(cells_of(parse_spec(study.spec_dict(root / "probe", 1, 0, early_stop=False)).trials))
    truth = study.truth_exponents(delta)
    if not args.report_only:
        done = load(root)
        for S in args.seeds:
            have = {r["rep"] for r in done.get(S, [])}
            for r in range(args.first_rep, args.first_rep + args.reps):
                if r in have:
                    continue
                rec = run_one(root, r, S, args.bootstrap, delta)
                with open(root / f"s{S}.jsonl", "a") as f:   # one line per repetition: a crash loses one at most
                    f.write(json.dumps(rec) + "\n")
                iv = rec.get("N", {})
                print(f"rep {r}, {S} seeds: N*(F) exp. {iv.get('estimate', math.nan):.4f} "
                      f"[{iv.get('lo')}, {iv.get('hi')}] ({iv.get('method')})", flush=True)
    report(root, truth)


if __name__ == "__main__":
    main()
