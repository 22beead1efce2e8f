"""Speed of the seed bootstrap for D_J(σ, N): 1000 resamples of a 4 × 4 (σ, N) grid × 5 seeds, each
resample -> seed-mean curves -> isotonic regression -> D_J -> refit of the 5-parameter law.

    .venv/bin/python benchmarks/fit_speed.py [--resamples 1000] [--reference 50]

Every replicate is refitted by THE estimator of the point fit (`fitting.fit_many`: the law's start
grid + the point estimate as one more start -> vectorised Levenberg–Marquardt over all replicates ×
starts -> the best distinct starts to convergence -> L-BFGS-B polish). Prints a table of stages and the
failure count; the last line is `bootstrap_1000_seconds=<x>` (resampling + D_J + refits + intervals,
after the point fit). The reference row times the same estimator one replicate at a time
(`fitting.fit` in a loop) on a subset, scaled to the full count; it is not part of the total.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from scaling_rl.scaling import fitting, laws, synthetic
from scaling_rl.scaling.curves import data_efficiency


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--reference", type=int, default=50, help="one-at-a-time refits to time (0: skip)")
    args = ap.parse_args()
    K = args.resamples
    truth = synthetic.Truth()
    J = 0.5
    cs = synthetic.make_study(truth, utds=np.geomspace(0.5, 8, 4), param_counts=np.geomspace(1e5, 3e6, 4), seeds=5,
                              n_log=200, log_spaced=True, rng=0)
    rows = []

    def stage(name, fn):
        t = time.perf_counter()
        out = fn()
        rows.append((name, time.perf_counter() - t))
        return out

    fitting.fit(fitting.make_problem(laws.DATA_EFFICIENCY_SIGMA_N, {"utd": np.ones(6) * [1, 2, 1, 2, 1, 2],
                                                                      "param_count": np.ones(6) * [1, 1, 2, 2, 3, 3]},
                                     np.zeros(6)), np.zeros(6))  # warm imports / caches
    de = stage(f"resample seeds, isotonic, D_J  (16 configs × {K})",
               lambda: data_efficiency(cs, thresholds=[J], normalize="none", n_bootstrap=K, seed=0))
    idx, y, Y = de.fit_data(0)
    x = {"utd": de.groups["utd"].to_numpy()[idx], "param_count": de.groups["param_count"].to_numpy()[idx]}
    prob = fitting.make_problem(laws.DATA_EFFICIENCY_SIGMA_N, x, np.log(y))
    point = stage("point fit (start grid + LM, L-BFGS-B polish)", lambda: fitting.fit(prob, np.log(y)))
    LY = np.log(Y)
    W = np.isfinite(LY).astype(float)
    bf = stage(f"{K} refits by the point estimator (batched)",
               lambda: fitting.fit_many(prob, np.where(W > 0, LY, 0.0), W, warm=point.u))
    iv = stage("intervals (centred percentile)", lambda: fitting.bootstrap_intervals(
        prob, point.u, bf.U, 0.9, fitting.seed_inflation(5, len(y) * 4)))
    total = sum(t for _, t in rows)
    ref = None
    if args.reference:
        n = min(args.reference, K)
        t = time.perf_counter()
        R = []
        for k in range(n):
            try:
                R.append(fitting.fit(prob, LY[k], W[k]).objective)
            except ValueError:
                R.append(np.nan)
        ref = (time.perf_counter() - t) * K / n
        agree = float(np.nanmax(np.abs(np.array(R) - bf.objective[:n]) / np.maximum(np.abs(R), 1e-12)))

    print(f"{'stage':<58} {'seconds':>9}")
    print("-" * 68)
    for name, t in rows:
        print(f"{name:<58} {t:9.3f}")
    print("-" * 68)
    print(f"{'total (bootstrap of D_J(σ, N), ' + str(K) + ' resamples)':<58} {total:9.3f}")
    if ref is not None:
        print(f"{'reference: the same estimator one at a time, scaled to ' + str(K):<58} {ref:9.3f}"
              f"   (max relative objective difference: {agree:.1e})")
    fails = {st: int(np.sum(bf.status == st)) for st in set(bf.status)}
    print(f"replicates ok: {int(bf.ok.sum())}/{K}  (status counts: {fails})")
    print("90% intervals: " + ", ".join(
        f"{k} [{v['lo']:.3g}, {v['hi']:.3g}] ({v.get('method')})" if v["lo"] is not None else f"{k}: {v.get('reason')}"
        for k, v in iv.items()))
    print(f"truth at J={J}: " + ", ".join(f"{k} {v:.3g}" for k, v in truth.params(J).items()))
    print(f"bootstrap_{K}_seconds={total:.3f}")


if __name__ == "__main__":
    main()
