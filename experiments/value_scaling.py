"""Regenerate the key analyses of the value-based scaling papers from a sweep:

- Rybkin et al., *Value-Based Deep RL Scales Predictably* (ICML 2025): data efficiency D_J vs UTD σ
  with D_J(σ) = D_min + (β/σ)^α; optimal batch size and learning rate falling with σ (shared slope,
  per-task intercept); budget-optimal σ for F = C + δ·D.
- Fu et al., *Compute-Optimal Scaling for Value-Based Deep RL* (NeurIPS 2025): D_J(σ, N) over UTD and
  model size, iso-D contours with the compute-optimal path, the data–compute frontier, D*(F) and C*(F).

    python experiments/value_scaling.py SWEEP --out runs/value_scaling [--metric eval_return] [--delta 1e10]
    python experiments/value_scaling.py --synthetic --out runs/value_scaling_demo     # no sweep needed

SWEEP is anything `scaling-rl fit` reads (the sweep store's table or directory, or a published
utd_<σ>/<task>/<metric>/bs_<B>_lr_<η>.npy curve directory). Writes fit.json, report.md and the figures,
and prints which file reproduces which paper figure.
"""
from __future__ import annotations

import argparse
import sys

from scaling_rl import scaling
from scaling_rl.scaling import synthetic

FIGURES = {
    "data_efficiency_sigma": "Rybkin et al.: D_J vs σ per task and threshold, fitted D_J(σ) with 90% bands",
    "hparams_sigma": "Rybkin et al.: B*(σ) and η*(σ), uncertainty-corrected optima with shared-slope fits",
    "data_efficiency_contours": "Fu et al.: iso-D_J contours over (σ, N) with the budget-optimal path",
    "pareto_frontier": "Fu et al.: data–compute Pareto frontier per threshold",
    "budget_scaling": "Fu et al.: D*(F), C*(F), σ*(F), N*(F) power laws",
    "extrapolation": "held-out check: fit on smaller σ / N, predict the largest",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", nargs="?", help="sweep table / directory / curve directory")
    ap.add_argument("--synthetic", action="store_true", help="use a synthetic two-task study with a known law")
    ap.add_argument("--out", required=True)
    ap.add_argument("--metric", default="eval_return")
    ap.add_argument("--delta", type=float, default=None, help="FLOPs per env step (default: sweep median 10·N·B·σ)")
    ap.add_argument("--bootstrap", type=int, default=100)
    ap.add_argument("--thresholds", type=int, default=5)
    ap.add_argument("--share-exponents", action="store_true")
    args = ap.parse_args(argv)
    if bool(args.sweep) == args.synthetic:
        ap.error("pass a SWEEP or --synthetic")
    if args.synthetic:
        curves = synthetic.make_study(synthetic.Truth(), utds=[0.5, 1, 2, 4, 8], param_counts=[1e5, 3e5, 1e6, 3e6],
                                      batch_sizes=[128, 256, 512, 1024], lrs=[1e-4, 3e-4, 1e-3],
                                      tasks=("hopper", "walker"), seeds=4, rng=0, return_scale=1000)
    else:
        try:
            curves = scaling.load_results(args.sweep, args.metric)
        except ValueError as e:
            print(f"value_scaling: error: {e}", file=sys.stderr)
            return 2
    settings = scaling.Settings(n_bootstrap=args.bootstrap, n_thresholds=args.thresholds, delta=args.delta,
                                share_exponents=args.share_exponents)
    fit = scaling.analyze(curves, settings, progress=lambda m: print(f"[value_scaling] {m}", file=sys.stderr))
    paths = scaling.write_outputs(fit, args.out)
    for stem, what in FIGURES.items():
        hit = [p for p in paths if p.endswith(f"/{stem}.png")]
        print(f"{stem + '.png':<32} {what}" + ("" if hit else "  (not produced: see report.md)"))
    print(f"{'report.md':<32} every parameter with its 90% interval; allocation table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
