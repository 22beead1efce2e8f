"""How much early stopping moves D_J at the rule's top threshold J_top (issue 19, item 9).

    .venv/bin/python benchmarks/early_stop_shift.py [--trials 200] [--noise 0.02 0.08]

"Early stopping changes no fit" is not true in general: the isotonic (non-decreasing) fit of a seed-mean
curve pools a later dip with earlier values, so the full run's D_J can differ from the stopped run's even
at thresholds crossed before the stop. Per trial (3 seeds, R(t) = 1 − exp(−t/τ), τ log-normal per seed,
Gaussian observation noise `noise` in units of the return range, 40 log-spaced log points), the rule
(thresholds 0.4, 0.7; margin 0.03; patience 2) stops it; the stopped curve is aligned as the analysis
does it (`scaling.data.curves_from_table`: reached seeds hold their last isotonic value) and D_J at J_top
and at the lower threshold is compared with the same trial run to the end. Prints, per noise level, the
share of stopped trials whose D_J moved, the median and the extreme log-shift, and how many exceed the
log-point bracket around the crossing. Curves with final level `--plateau` (1.0, and 0.8: flattening just above J_top + margin). Last line:
`j_top_shifted_share=<x>` for the last (plateau, noise).
"""
from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from scaling_rl.scaling import data
from scaling_rl.scaling.curves import first_crossing, isotonic_rows
from scaling_rl.sweep import early_stop as es


def _table(steps, Y, stop=None):
    T, S = Y.shape
    df = pd.DataFrame({"seed": np.tile(np.arange(S), T), "env_steps": np.repeat(steps, S),
                       "eval_return": Y.reshape(-1)})
    df = df.assign(env="toy", utd=1.0, param_count=64.0, batch_size=32.0, lr=1e-3, trial_id="t")
    if stop is not None:
        df = df[df.env_steps <= stop].assign(stopped_early="reached", stop_step=float(stop))
    return df


def _d(df, J):
    c = data.curves_from_table(df, "eval_return").curves[0]
    return first_crossing(c.steps, isotonic_rows(c.returns.mean(axis=1)[None]), J, return_bracket=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--noise", type=float, nargs="+", default=[0.02, 0.08])
    ap.add_argument("--plateau", type=float, nargs="+", default=[1.0, 0.8],
                    help="the curves' final level (0.8: they flatten just above J_top + margin = 0.73)")
    args = ap.parse_args()
    steps = np.unique(np.round(np.geomspace(1000, 200_000, 40)))
    rule = es.Rule(thresholds=(0.4, 0.7), margin=0.03, patience=2)
    J = np.array([0.4, 0.7])
    print(f"{'plateau':>7s} {'noise':>6s} {'stopped':>8s} {'J':>5s} {'moved':>7s} {'median shift':>13s} {'extreme':>9s} "
          f"{'> bracket':>9s}")
    share = float("nan")
    for plateau, noise in [(p, n) for p in args.plateau for n in args.noise]:
        rng = np.random.default_rng(0)
        shifts = {j: [] for j in J}
        over = {j: 0 for j in J}
        n_stop = 0
        for _ in range(args.trials):
            tau = 8000.0 * np.exp(0.3 * rng.standard_normal(3))
            Y = plateau * (1 - np.exp(-steps[:, None] / tau[None])) + noise * rng.standard_normal((len(steps), 3))
            full = _table(steps, Y)
            stop = None
            for st in steps:
                if rule.check(full[full.env_steps <= st], None) is not None:
                    stop = st
                    break
            if stop is None or stop >= steps[-1]:
                continue
            n_stop += 1
            (ds,), (brs,) = _d(_table(steps, Y, stop), J)
            (df_,), _ = _d(full, J)
            for k, j in enumerate(J):
                if np.isfinite(ds[k]) and np.isfinite(df_[k]):
                    sh = float(np.log(ds[k] / df_[k]))
                    shifts[j].append(sh)
                    over[j] += abs(sh) > brs[k] + 1e-12
        for j in J:
            s = np.array(shifts[j])
            moved = np.abs(s) > 1e-9
            ext = s[np.argmax(np.abs(s))] if s.size else float("nan")
            print(f"{plateau:7.2f} {noise:6.2f} {n_stop:8d} {j:5.2f} {moved.mean() if s.size else float('nan'):7.1%} "
                  f"{np.median(s[moved]) if moved.any() else 0.0:13.4f} {ext:9.4f} {over[j]:9d}")
            if j == J[-1]:
                share = float(moved.mean()) if s.size else float("nan")
    print(f"j_top_shifted_share={share:.3f}")


if __name__ == "__main__":
    main()
