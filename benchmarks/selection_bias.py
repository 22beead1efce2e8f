"""Honest laws under the design researchers run (issue 19, items 0 and 1), old rule vs new side by side.

    .venv/bin/python benchmarks/selection_bias.py [--studies 40] [--law-studies 25] [--sigma-studies 5]

A. D_J point intervals in cells with 4 equally good batch sizes (κ = 0), 5 seeds, 3 σ × 2 N, J = 0.5:
   coverage of the 90% interval of every cell over `--studies` independent studies and the mean log
   error, for the plain minimum over configurations ("argmin"), cross-fitting ("crossfit") and one
   configuration per cell (the reference). The estimand: the same cell with one configuration and 400 seeds.
B. The D(σ, N) law's parameters (5 × 5 grid, 4 tied batch sizes, 5 and 10 seeds (`--law-seeds`), 10% seed
   noise): coverage of the five 90% parameter intervals over `--law-studies` studies, one configuration (the
   law machinery's own level) vs argmin vs crossfit; estimand: one configuration, 400 seeds.
C. The σ effect per model size (item 0): 6 σ levels 0.5…16, 5 sizes, 5 seeds, 5% seed noise, a σ effect
   at every size; how many per-size D_J(σ) fits are labelled "no σ dependence" by AICc (old rule) and by
   the seed-bootstrap interval of the σ slope (new rule).
D. The batch law's uncertainty in σ* (item 2): 5 σ, 1 size, 2 batch sizes, 5 seeds, δ = 1e9: the 90%
   log-width of σ* over replicates when replicate b uses its own B*(σ) law (now) vs the point law (before).
Last line: `crossfit_point_coverage=<x> argmin_point_coverage=<y> sigma_mislabelled_new=<a>/<n>`.
"""
from __future__ import annotations

import argparse

import numpy as np

from scaling_rl.scaling import analysis, laws, synthetic
from scaling_rl.scaling.curves import data_efficiency

TIED = (128, 256, 512, 1024)


def _binom(p: float, n: int) -> str:
    return f"{p:.3f} ± {1.645 * np.sqrt(max(p * (1 - p), 1e-9) / n):.3f}"


def part_a(studies: int) -> dict:
    tr = synthetic.Truth(kappa=0.0)
    utds, pcs, J = (0.5, 2.0, 8.0), (1e5, 1e6), 0.5
    ref = data_efficiency(synthetic.make_study(tr, utds=utds, param_counts=pcs, seeds=400, noise=0.1, n_log=120,
                                               log_spaced=True, rng=999), thresholds=[J], normalize="none",
                          n_bootstrap=1).g_point[:, 0]
    out = {}
    for name, bs, sel in (("one config", (np.nan,), "argmin"), ("argmin", TIED, "argmin"), ("crossfit", TIED, "crossfit")):
        cover, err = [], []
        for r in range(studies):
            cs = synthetic.make_study(tr, utds=utds, param_counts=pcs, batch_sizes=bs, seeds=5, noise=0.1, n_log=120,
                                      log_spaced=True, rng=r)
            de = data_efficiency(cs, thresholds=[J], normalize="none", n_bootstrap=200, seed=r, select=sel)
            for g in range(len(ref)):
                iv = de.point_interval(g, 0)
                cover.append(iv["lo"] is not None and iv["lo"] <= ref[g] <= iv["hi"])
                err.append(np.log(de.g_point[g, 0] / ref[g]))
        out[name] = (np.mean(cover), len(cover), np.mean(err))
    print("\nA. D_J point intervals, 4 tied batch sizes, 5 seeds (90% nominal)")
    print(f"{'estimator':12s} {'coverage':>16s} {'cases':>6s} {'mean log error':>15s}")
    for k, (c, n, e) in out.items():
        print(f"{k:12s} {_binom(c, n):>16s} {n:6d} {e:15.4f}")
    return out


def _law_fit(select: str, seeds: int, rng: int, K: int, bs=TIED):
    cs = synthetic.make_study(synthetic.Truth(kappa=0.0), utds=np.geomspace(0.25, 16, 5),
                              param_counts=np.geomspace(3e4, 1e7, 5), batch_sizes=bs, seeds=seeds, noise=0.1,
                              obs_noise=0.01, log_spaced=True, n_log=120, rng=rng)
    st = analysis.Settings(n_bootstrap=K, max_starts=4, seed=rng)
    de = data_efficiency(cs, thresholds=[0.5], normalize="none", n_bootstrap=K, seed=rng, select=select)
    reps = analysis._replicates(de, st, [])
    idx, x, y, Y, Yj = analysis._points_of(de, np.ones(len(de.groups), bool), 0)
    w = analysis._weights(de, st, reps, idx, 0)
    return analysis.fit_with_bootstrap(laws.DATA_EFFICIENCY_SIGMA_N, x, y, Y, st, reps, "D", Yj=Yj, weights=w)


def part_b(studies: int, seeds_list=(5, 10), rng0: int = 1000) -> dict:
    est = _law_fit("argmin", 400, 12345, 30, bs=(np.nan,)).params()
    out = {}
    for seeds in seeds_list:
        for sel, bs in (("one config", (np.nan,)), ("argmin", TIED), ("crossfit", TIED)):
            cov = {k: [] for k in est}
            for r in range(studies):
                iv = _law_fit("argmin" if sel == "one config" else sel, seeds, rng0 + r, 60, bs=bs).intervals()
                for k, v in est.items():
                    cov[k].append(iv[k].get("lo") is not None and iv[k]["lo"] <= v <= iv[k]["hi"])
            out[(sel, seeds)] = {k: float(np.mean(v)) for k, v in cov.items()}
    print(f"\nB. D(σ, N) law parameters, 4 tied batch sizes (one config: the reference), {studies} studies "
          f"(90% nominal; ±{1.645 * np.sqrt(0.09 / studies):.2f})")
    print(f"{'estimator':12s} {'seeds':>5s} " + " ".join(f"{k:>7s}" for k in est))
    for (sel, seeds), c in out.items():
        print(f"{sel:12s} {seeds:5d} " + " ".join(f"{c[k]:7.2f}" for k in est))
    return out


def part_c(studies: int) -> tuple[int, int, int]:
    old = new = n = 0
    for r in range(studies):
        cs = synthetic.make_study(synthetic.Truth(), utds=(0.5, 1, 2, 4, 8, 16), param_counts=np.geomspace(1e5, 1e7, 5),
                                  seeds=5, noise=0.05, n_log=80, log_spaced=True, rng=r)
        fit = analysis.analyze(cs, analysis.Settings(n_bootstrap=60, n_thresholds=1, max_starts=4, holdout=False,
                                                     seed=r))
        for rec in fit["data_efficiency_sigma"]:
            sel = rec.get("selection")
            if not sel:
                continue
            n += 1
            full, const = sel["candidates"]
            old += full["aicc"] is not None and const["aicc"] is not None and const["aicc"] < full["aicc"]
            new += sel["chosen"].endswith("_constant")
    print(f"\nC. per-size D_J(σ) fits labelled 'no σ dependence' (true σ effect at every size): AICc {old}/{n}, "
          f"σ-slope interval {new}/{n}")
    return old, new, n


def part_d() -> None:
    from scaling_rl.scaling import allocation as alloc
    cs = synthetic.make_study(synthetic.Truth(), utds=[0.5, 1, 2, 4, 8], param_counts=(1e6,), batch_sizes=[128, 512],
                              seeds=5, n_log=60, log_spaced=True, rng=3)
    cap: dict = {}
    analysis.analyze(cs, analysis.Settings(n_bootstrap=60, n_thresholds=3, max_starts=4, holdout=False, delta=1e9),
                     capture=cap)
    print("\nD. σ* 90% log-width over replicates: own B*(σ) law per replicate vs the point B*(σ) law")
    for (t, j), law in cap["laws"].items():
        own, point = [], []
        for b, q in enumerate(law["reps"]):
            if q is None or law["batch_reps"] is None or law["batch_reps"][b] is None:
                continue
            own.append(alloc.optimum_numerical(q, law["batch_reps"][b], law["delta"], **law["box"], **law["fixed"])["sigma"])
            point.append(alloc.optimum_numerical(q, law["batch"], law["delta"], **law["box"], **law["fixed"])["sigma"])
        w = lambda v: float(np.diff(np.quantile(np.log(v), [0.05, 0.95]))[0])  # noqa: E731
        print(f"J index {j}: own {w(own):.3f}  point {w(point):.3f}  ({len(own)} replicates)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", type=int, default=40)
    ap.add_argument("--law-studies", type=int, default=25)
    ap.add_argument("--sigma-studies", type=int, default=5)
    ap.add_argument("--law-seeds", default="5,10", help="seeds per configuration of part B's studies")
    ap.add_argument("--law-rng", type=int, default=1000, help="part B's first study seed (studies rng, rng + 1, ...)")
    args = ap.parse_args()
    a = part_a(args.studies) if args.studies else None   # --studies 0: part A not run (no "nan" rows)
    if args.law_studies:
        part_b(args.law_studies, [int(x) for x in args.law_seeds.split(",")], args.law_rng)
    _, new, n = part_c(args.sigma_studies)
    part_d()
    points = (f"crossfit_point_coverage={a['crossfit'][0]:.3f} argmin_point_coverage={a['argmin'][0]:.3f} "
              if a else "")
    print(f"{points}sigma_mislabelled_new={new}/{n}")


if __name__ == "__main__":
    main()
