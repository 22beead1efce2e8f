"""Curves -> data efficiency D_J, with a bootstrap over seeds.

Per configuration: per-task return normalisation, seed-mean curve, isotonic regression (a learning
curve's noise is not progress), D_J = the env step at which the isotonic curve first reaches J,
linearly interpolated between the two log points around the crossing. A curve that never reaches J is
*censored*: D_J = inf, kept in every table and flagged, never silently dropped.

Per (task, σ, N): the best batch size / learning rate (and any other swept field) is chosen per
bootstrap sample; D_J(σ, N) is the best configuration's D_J; B*, η* are the geometric means of the
per-sample winners ("uncertainty-corrected best"), and the configurations within error of the best are
listed.
"""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pandas as pd
from .data import Curve, CurveSet
from .isotonic import isotonic_rows  # noqa: F401  (re-exported: scaling.curves.isotonic_rows)

GROUP_KEYS = ("task", "utd", "param_count")
COARSE_LOG_POINTS = 10


def first_crossing(steps: np.ndarray, Ymono: np.ndarray, thresholds: np.ndarray,
                   interpolation: str = "log", return_bracket: bool = False):
    """D (K, nJ): first env step where each non-decreasing row of Ymono (K, T) reaches each threshold,
    interpolated between the two log points around the crossing, linearly in the step or in its log
    (`interpolation="log"`, the default: learning curves are closer to linear in log-steps, and linear
    interpolation over a coarse early log grid overestimates D); the first log point if the curve
    starts above J; inf if it never gets there. With `return_bracket`, also log(t1/t0) of the two
    log points around each crossing (0 where there is no interpolation)."""
    Ymono = np.atleast_2d(Ymono)
    T = Ymono.shape[1]
    J = np.asarray(thresholds, float)
    idx = np.sum(Ymono[:, :, None] < J[None, None, :], axis=1)  # first index with y >= J
    i1 = np.clip(idx, 1, T - 1)
    y0 = np.take_along_axis(Ymono, i1 - 1, axis=1)
    y1 = np.take_along_axis(Ymono, i1, axis=1)
    t0, t1 = steps[i1 - 1], steps[i1]
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.clip((J[None, :] - y0) / (y1 - y0), 0.0, 1.0)
        if interpolation == "log":
            D = np.where(t0 > 0, t0 * (t1 / np.where(t0 > 0, t0, 1.0)) ** frac, t0 + frac * (t1 - t0))
        elif interpolation == "linear":
            D = t0 + frac * (t1 - t0)
        else:
            raise ValueError(f"interpolation: {interpolation!r} is unknown; use 'log' or 'linear'")
    D = np.where(idx == 0, steps[0], D)
    D = np.where(idx >= T, np.inf, D)
    if not return_bracket:
        return D
    with np.errstate(divide="ignore", invalid="ignore"):
        br = np.where((idx > 0) & (idx < T) & (t0 > 0), np.log(np.where(t0 > 0, t1 / np.where(t0 > 0, t0, 1), 1.0)), 0.0)
    return D, br



ADAPTIVE_GAP_FACTOR = 2.0
UNRESOLVED_RISE = 0.5


def interpolation_gap(steps: np.ndarray, ymono: np.ndarray, thresholds: np.ndarray,
                      interpolation: str = "log") -> np.ndarray:
    """(nJ,) |log D_cubic − log D|: how far a shape-preserving cubic (PCHIP, in log env-steps) through
    the non-decreasing curve `ymono` (T,) puts each threshold's crossing from `first_crossing`'s
    piecewise-linear one; 0 where D_J is not interpolated (not reached, reached at the first log point,
    a bracket starting at step ≤ 0, where `first_crossing` has no log bracket either). Two interpolants
    of different order that agree say the curve is smooth over the bracket at this logging density; the
    gap is the data's own estimate of the interpolation error (`interp_error="adaptive"`), where a fixed
    share of the bracket would assume the worst curve. inf where one bracket holds more than
    UNRESOLVED_RISE of the curve's whole rise: the points do not resolve the shape there (a steep
    sigmoid between two log points: both interpolants miss alike), so no estimate, and the caller falls
    back to the bracket bound. In log steps the cubic goes through the points at steps > 0 only (a
    curve logged from step 0 keeps its gaps beyond the first bracket)."""
    from scipy.interpolate import PchipInterpolator
    from scipy.optimize import brentq
    J = np.atleast_1d(np.asarray(thresholds, float))
    y = np.asarray(ymono, float)
    steps = np.asarray(steps, float)
    out = np.zeros(len(J))
    idx = np.sum(y[:, None] < J[None, :], axis=0)
    skip = int(np.sum(steps <= 0)) if interpolation == "log" else 0   # a leading step 0 has no log
    if len(steps) - skip < 3 or np.all((idx <= skip) | (idx >= len(y))):
        return out
    xx = np.log(steps[skip:]) if interpolation == "log" else steps
    p = PchipInterpolator(xx, y[skip:])   # strictly increasing x; isotonic plateaus get zero slope
    lin = first_crossing(steps, y[None], J, interpolation)[0]
    rise = float(y[-1] - y[0])
    for j, (i, thr) in enumerate(zip(idx, J)):
        if i <= skip or i >= len(y) or not np.isfinite(lin[j]):
            continue
        if y[i] - y[i - 1] > UNRESOLVED_RISE * rise:   # the shape is not resolved: no estimate, the bound
            out[j] = np.inf
            continue
        a, b = xx[i - 1 - skip], xx[i - skip]
        fa, fb = float(p(a)) - thr, float(p(b)) - thr
        if fb == 0.0:
            root = b
        elif fa >= 0.0 or fb < 0.0:     # cannot happen for a monotone cubic through monotone data
            continue
        else:
            root = brentq(lambda v: float(p(v)) - thr, a, b, xtol=1e-10)
        d = np.exp(root) if interpolation == "log" else root
        if d > 0:
            out[j] = abs(np.log(d) - np.log(lin[j]))
    return out


@dataclasses.dataclass
class DataEfficiency:
    """D_J for every configuration and every (task, σ, N), point estimate and bootstrap samples."""

    thresholds: dict[str, np.ndarray]     # task -> (nJ,) in (normalised) metric units
    normalization: dict[str, tuple[float, float]]
    configs: pd.DataFrame                 # one row per configuration (C)
    point: np.ndarray                     # (C, nJ) from all seeds
    boot: np.ndarray                      # (K, C, nJ)
    groups: pd.DataFrame                  # one row per (task, σ, N) (G)
    g_point: np.ndarray                   # (G, nJ) best configuration's D_J
    g_best: np.ndarray                    # (G, nJ) config index of the point best (-1 if censored)
    g_boot: np.ndarray                    # (K, G, nJ) per-sample best D_J
    g_boot_best: np.ndarray               # (K, G, nJ) per-sample winning config (-1 if censored)
    curves_iso: list[np.ndarray]          # per config: isotonic seed-mean curve (normalised)
    curves_mean: list[np.ndarray]         # per config: raw seed-mean curve (normalised)
    notes: list[str]
    g_left: np.ndarray                    # (G, nJ) best D_J is the first log point (an upper bound)
    g_boot_left: np.ndarray               # (K, G, nJ) same per bootstrap sample
    g_resolution: np.ndarray              # (G, nJ) log points of the best configuration before D_J
    jack: np.ndarray                      # (S, C, nJ) leave-seed-s-out D_J (s-th seed of every config)
    g_jack: np.ndarray                    # (S, G, nJ) leave-seed-s-out best D_J
    g_jack_left: np.ndarray               # (S, G, nJ)
    interp_error: str = "adaptive"        # interpolation uncertainty added to the bootstrap rows
    g_select: np.ndarray | None = None    # (G, nJ) how D_J was chosen: "single", "argmin", "crossfit", "clear"

    def fit_data(self, j: int, mask: np.ndarray | None = None):
        """Indices, point D_J (G',) and bootstrap D_J (K, G') of the (task, σ, N) points usable in a fit
        at threshold j: reached J, and not already at the first log point. Unusable bootstrap entries
        are NaN. The replicates are each point's seed-resampled D_J as they are (not re-centred: `fitting.interval`
        centres each derived quantity's replicates on its estimate, once, at the end)."""
        ok = np.isfinite(self.g_point[:, j]) & ~self.g_left[:, j]
        if mask is not None:
            ok &= mask
        idx = np.flatnonzero(ok)
        Y = np.where(self.g_boot_left[:, idx, j], np.nan, self.g_boot[:, idx, j])
        return idx, self.g_point[idx, j], Y

    def fit_data_jack(self, j: int, idx: np.ndarray) -> np.ndarray:
        """Leave-one-seed-out D_J (S, G') of the points `idx` at threshold j (NaN = unusable)."""
        return np.where(self.g_jack_left[:, idx, j] | ~np.isfinite(self.g_jack[:, idx, j]), np.nan,
                        self.g_jack[:, idx, j])

    @property
    def n_thresholds(self) -> int:
        return len(next(iter(self.thresholds.values())))

    @property
    def min_seeds(self) -> int:
        return int(self.configs["n_seeds"].min())

    def group_table(self, level: float = 0.9) -> pd.DataFrame:
        """Long table per (task, σ, N, J): D_J point, bootstrap mean/std and `level` interval,
        censoring, best config, and the configurations within error of the best."""
        rows = []
        cfg = self.configs
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-censored points -> NaN statistics
            fin = np.where(np.isfinite(self.boot), self.boot, np.nan)
            c_std = np.nanstd(fin, axis=0, ddof=1) if self.boot.shape[0] > 1 else np.full(self.point.shape, np.nan)
            gfin = np.where(np.isfinite(self.g_boot), self.g_boot, np.nan)
            g_mean = np.nanmean(gfin, axis=0)
            g_std = np.nanstd(gfin, axis=0, ddof=1) if self.g_boot.shape[0] > 1 else np.full(self.g_point.shape, np.nan)
        single = self.configs.groupby("group")["n_seeds"].min().to_numpy() < 2
        for g, grow in self.groups.iterrows():
            members = np.flatnonzero(cfg["group"].to_numpy() == g)
            for j in range(self.n_thresholds):
                best = self.g_best[g, j]
                D = self.g_point[g, j]
                within = []
                if best >= 0:
                    tol = np.sqrt(np.nan_to_num(c_std[members, j]) ** 2 + np.nan_to_num(c_std[best, j]) ** 2)
                    within = [int(c) for c, t in zip(members, tol) if self.point[c, j] <= self.point[best, j] + t]
                winners = self.g_boot_best[:, g, j]
                bvals = cfg["batch_size"].to_numpy()[winners[winners >= 0]]
                lvals = cfg["lr"].to_numpy()[winners[winners >= 0]]
                censored_cfg = [int(c) for c in members if not np.isfinite(self.point[c, j])]
                iv = self.point_interval(g, j, level)
                rows.append({
                    "task": grow["task"], "utd": grow["utd"], "param_count": grow["param_count"], "j_index": j,
                    "threshold": float(self.thresholds[grow["task"]][j]), "D": float(D),
                    "D_boot_mean": float(g_mean[g, j]),
                    "D_boot_std": float("nan") if single[g] else float(g_std[g, j]),
                    "D_lo": _nan_if_none(iv["lo"]), "D_hi": _nan_if_none(iv["hi"]),
                    "censored": bool(not np.isfinite(D)),
                    "left_censored": bool(self.g_left[g, j]),
                    "log_points_before": int(self.g_resolution[g, j]),
                    "censored_boot_frac": float(np.mean(~np.isfinite(self.g_boot[:, g, j]))),
                    "last_step": float(cfg["last_step"].to_numpy()[members].max()),
                    "best_config": int(best),
                    "best_batch_size": float(cfg["batch_size"].iloc[best]) if best >= 0 else float("nan"),
                    "best_lr": float(cfg["lr"].iloc[best]) if best >= 0 else float("nan"),
                    "batch_size_star": _geomean(bvals), "lr_star": _geomean(lvals),
                    "within_error": within, "censored_configs": censored_cfg,
                    # A censored config that stopped logging before the best's D_J might have beaten it.
                    "ambiguous": bool(best >= 0 and any(cfg["last_step"].iloc[c] < D for c in censored_cfg)),
                    "n_seeds": int(cfg["n_seeds"].to_numpy()[members].min()),
                    "config_selection": str(self.g_select[g, j]) if self.g_select is not None else "",
                })
        return pd.DataFrame(rows)

    def point_interval(self, g: int, j: int, level: float = 0.9, reason: str | None = None) -> dict:
        """`fitting.interval` of the best D_J of group g at threshold j (the one definition, used by the
        table and the report): seed-bootstrap replicates (a censored resample counts as failed), centred on
        the point by `fitting.interval`, deviations × seed_inflation(n, n − 1); fewer than MIN_SEEDS seeds,
        or a censored point, give no interval and say why."""
        from . import fitting
        D = float(self.g_point[g, j])
        if not np.isfinite(D):
            return {"estimate": D, "lo": None, "hi": None, "reason": "censored"}
        n = int(self.configs["n_seeds"].to_numpy()[self.configs["group"].to_numpy() == g].min())
        if reason is None and n < fitting.MIN_SEEDS:
            reason = (f"fewer than {fitting.MIN_SEEDS} seeds per configuration: no seed-bootstrap interval "
                      "for a single point")
        cens = float(np.mean(~np.isfinite(self.g_boot[:, g, j])))
        if reason is None and cens > fitting.MAX_FAIL:
            reason = f"censored (never reaches J) in {cens:.0%} of the resamples"
        Y = np.where(np.isfinite(self.g_boot[:, g, j]), self.g_boot[:, g, j], np.nan)
        return fitting.interval(D, Y, self.g_jack[:, g, j], level=level,
                                inflation=fitting.seed_inflation(n, n - 1, level), n_total=len(Y), reason=reason)

    def hparam_samples(self, field: str) -> tuple[np.ndarray, np.ndarray]:
        """Uncertainty-corrected optimum of `field` per group (G,) and per bootstrap sample (K, G):
        geometric means of the winning configurations' values over samples and thresholds (a
        sample's value averages over thresholds only)."""
        vals = np.log(self.configs[field].to_numpy(float))
        win = self.g_boot_best
        v = np.where(win >= 0, vals[np.maximum(win, 0)], np.nan)  # (K, G, nJ)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-censored groups -> NaN
            per_sample = np.exp(np.nanmean(v, axis=2))
            point = np.exp(np.nanmean(v, axis=(0, 2)))
        return point, per_sample


def _crossfit(H: np.ndarray, M: np.ndarray | None = None) -> np.ndarray:
    """Cross-fitted best D_J from half-seed D_J H (2, K, n_m, nJ): the winner on half q estimated on the other
    half, geometric mean over q -> (K, nJ); the estimates are read from M (default H; `_shrink_between` for
    bootstrap replicates). inf (censored) propagates."""
    M = H if M is None else M
    a0, a1 = np.argmin(H[0], axis=1), np.argmin(H[1], axis=1)            # (K, nJ)
    d0 = np.take_along_axis(M[1], a0[:, None], axis=1)[:, 0]             # chosen on half 0, measured on 1
    d1 = np.take_along_axis(M[0], a1[:, None], axis=1)[:, 0]
    with np.errstate(invalid="ignore"):
        return np.sqrt(d0 * d1)


# A half-seed bootstrap spreads (h − 1)/h of its half's seed variance (h = 2, 3 at 5 seeds), the seed
# inflation downstream corrects (n − 1)/n: each half's replicates are rescaled about their half's D_J by
# sqrt(h/(h − 1)·(n − 1)/n) so the two agree (a module constant so the tie test can switch it off).
HALF_RESCALE = True


def _shrink_between(Hb: np.ndarray, Hp: np.ndarray, vf: np.ndarray) -> np.ndarray:
    """Half-seed replicates Hb (2, K, n_m, nJ) with each configuration's level moved from its observed half
    D_J Hp (2, n_m, nJ) to its empirical-Bayes (James–Stein, positive part) estimate in log: the mean over the
    cell's configurations + λ·(own − mean), λ = max(0, 1 − v̄/s²), v̄ the mean seed variance of one half's D_J
    (the replicates' variance × vf (2,)) and s² the spread of the observed half D_J over configurations.

    Why: a replicate picks its winner on one resampled half and reads it on the other; over replicates the
    winner varies, so the replicate spread is the seed noise of the reading plus the spread of the candidates'
    observed levels. Where the configurations tie, that spread IS seed noise, counted a second time: 4 tied
    batch sizes at 10 seeds, D_J intervals covered 0.975 over 100 studies (rms z 0.73) and the law parameters
    0.94–0.97 over 200 (rms z 0.77–0.87). Shrunk (and the halves rescaled, `HALF_RESCALE`), a tie spreads only
    by its noise and a real gap keeps its spread (λ → 1): D_J 0.94 at 10 seeds, 0.93 at 5; law 0.91–0.935
    over the same 200 (rms z 0.89–0.97; `benchmarks/selection_bias.py`, README). The point and the selection
    are untouched.
    A censored or unmeasured configuration leaves that half and threshold unshrunk."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        L = np.log(Hb)
        P = np.log(Hp)                                                          # (2, n_m, nJ)
        ok = np.all(np.isfinite(L), axis=1) & np.isfinite(P)                  # (2, n_m, nJ)
        v = np.var(np.where(np.isfinite(L), L, 0.0), axis=1, ddof=1) * vf[:, None, None]
        s2 = np.var(np.where(ok, P, 0.0), axis=1, ddof=1)                     # (2, nJ)
        lam = np.clip(1.0 - np.mean(v, axis=1) / np.where(s2 > 0, s2, np.inf), 0.0, 1.0)
        centre = np.mean(P, axis=1, keepdims=True)
        shift = (lam[:, None] - 1.0) * (P - centre)                           # (2, n_m, nJ): EB level − own
        good = np.all(ok, axis=1)[:, None] & (Hp.shape[1] > 1)
        shift = np.where(good & np.isfinite(shift), shift, 0.0)
    return Hb * np.exp(shift)[:, None]


CLEAR_WINNER_Z = 3.0


def _clear_winner(a: np.ndarray, P: np.ndarray, boot: np.ndarray, H: np.ndarray, n_seeds: np.ndarray) -> np.ndarray:
    """(nJ,) True where the selection among a cell's configurations is not in doubt: the point's winner `a`
    (index into the cell's configurations, per threshold) also wins on each half of the seeds (H: (2, n_m, nJ)
    half-seed D_J), and every other configuration's all-seed D_J (P: (n_m, nJ)) is above the winner's by at
    least CLEAR_WINNER_Z standard errors of the difference in log (variances from the configurations' all-seed
    bootstraps `boot` (K, n_m, nJ), × n/(n − 1); a configuration with a censored replicate has no finite
    variance, so it neither is nor beats a clear winner, unless it never reaches J at all).

    There the minimum over configurations has (almost) no selection bias to remove, and the winner's own D_J
    with its all-seed bootstrap is the calibrated estimate; cross-fitting it would only estimate it from
    half-seed bootstraps (2 and 3 seeds at 5), whose spread is (h−1)/h of the truth's instead of the (n−1)/n
    that the seed inflation corrects (measured, peaked-B, 5 seeds, 30 studies: the cells with a clear winner
    covered 0.73–0.82 cross-fitted). The margin must be wide: a winner that is clear only by the bootstrap's
    own judgement (≥ 95% of the resamples) is often a lucky one among tied configurations, and then its own
    D_J is biased low (tied batch sizes: such cells covered 0.13–0.21)."""
    jj = np.arange(P.shape[1])
    if boot.shape[0] < 2:                                # no bootstrap spread to judge a margin by
        return np.zeros(P.shape[1], bool)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        L = np.log(boot)
        var = np.where(np.all(np.isfinite(L), axis=0), np.var(np.where(np.isfinite(L), L, 0.0), axis=0, ddof=1),
                       np.inf) * (n_seeds / np.maximum(n_seeds - 1, 1))[:, None]       # (n_m, nJ)
        gap = np.log(P) - np.log(P[a, jj])[None]
        z = np.where(np.isposinf(P) & np.isfinite(P[a, jj])[None], np.inf,
                     gap / np.sqrt(var + var[a, jj][None]))
    z[a, jj] = np.inf
    agree = (np.argmin(H[0], axis=0) == a) & (np.argmin(H[1], axis=0) == a)
    return agree & np.isfinite(P[a, jj]) & np.all(np.nan_to_num(z, nan=-np.inf) >= CLEAR_WINNER_Z, axis=0)


def _nan_if_none(v) -> float:
    return float("nan") if v is None else float(v)


def _geomean(v: np.ndarray) -> float:
    v = np.asarray(v, float)
    v = v[np.isfinite(v) & (v > 0)]
    return float(np.exp(np.mean(np.log(v)))) if v.size else float("nan")


def normalize_curves(cs: CurveSet, mode: str = "task") -> tuple[list[np.ndarray], dict[str, tuple[float, float]]]:
    """Per-task affine map of returns to [0, 1] by the lowest and highest seed-mean value of the task
    (`mode="task"`), or identity (`mode="none"`)."""
    if mode not in ("task", "none"):
        raise ValueError(f"normalize: {mode!r} is unknown; use 'task' or 'none'")
    norm = {}
    for task in cs.tasks:
        means = [c.returns.mean(axis=1) for c in cs.curves if c.task == task]
        lo, hi = float(min(m.min() for m in means)), float(max(m.max() for m in means))
        norm[task] = (lo, hi) if (mode == "task" and hi > lo) else (0.0, 1.0)
    return [(c.returns - norm[c.task][0]) / (norm[c.task][1] - norm[c.task][0]) for c in cs.curves], norm


def choose_thresholds(iso: list[np.ndarray], curves: list[Curve], n: int = 5, spacing: str = "linear",
                      margin: float = 0.02) -> dict[str, np.ndarray]:
    """Per task, n thresholds from just above the highest starting level to the highest level that
    every (σ, N) reaches with its best configuration (less `margin` of the task's range)."""
    if spacing not in ("linear", "log"):
        raise ValueError(f"spacing: {spacing!r} is unknown; use 'linear' or 'log'")
    out = {}
    for task in sorted({c.task for c in curves}):
        reach: dict[tuple, float] = {}
        start, lo, hi = -np.inf, np.inf, -np.inf
        for y, c in zip(iso, curves):
            if c.task != task:
                continue
            key = (c.utd, c.param_count)
            reach[key] = max(reach.get(key, -np.inf), float(y[-1]))
            start = max(start, float(y[0]))
            lo, hi = min(lo, float(y.min())), max(hi, float(y.max()))
        top = min(reach.values()) - margin * (hi - lo)
        if not top > start:
            raise ValueError(f"thresholds: in {task!r} some (σ, N) never improves on the best starting "
                             f"level ({start:.3g}); pass --thresholds explicitly")
        k = np.arange(1, n + 1) / n
        gain = k if spacing == "linear" else np.geomspace(0.1, 1.0, n)
        out[task] = start + (top - start) * gain
    return out


INTERP_ERRORS = ("adaptive", "uniform", "none")
SELECTS = ("crossfit", "argmin")
CROSSFIT_MIN_SEEDS = 4


def data_efficiency(cs: CurveSet, thresholds: dict[str, np.ndarray] | np.ndarray | None = None, *,
                    n_thresholds: int = 5, spacing: str = "linear", normalize: str = "task",
                    n_bootstrap: int = 100, seed: int = 0, interpolation: str = "log",
                    interp_error: str = "adaptive", select: str = "crossfit") -> DataEfficiency:
    """D_J for every configuration and every (task, σ, N), with `n_bootstrap` resamples of seeds.

    Replicate b is ONE resample of seeds: each configuration's seeds are resampled once and that
    resample gives its D_J at every threshold. Leave-one-seed-out rows (`jack`: jackknife refits of the laws)
    drop seed s of every configuration at once.

    Interpolation uncertainty: the crossing between two log points t0 < t1 is only known to within the
    bracket, an error the seed bootstrap cannot see; each bootstrap D_J is multiplied by exp(U),
    U ~ Uniform(−h, h), so coarse logging widens every interval downstream instead of hiding in it.
    `interp_error="adaptive"` (default): h = min(2·gap, log(t1/t0)/4), gap = `interpolation_gap` of
    the configuration's all-seed curve (how far a PCHIP cubic puts the crossing from the linear one:
    small where the curve is smooth at this logging density; the bracket bound where one bracket holds
    over half of the curve's rise); `"uniform"`:
    h = log(t1/t0)/4 always (the worst case over one bracket; on smooth synthetic curves logged at 12
    points over 4 decades it made D_J intervals 3× too wide, coverage 1.00); `"none"` turns it off.

    Several configurations in a (task, σ, N) cell (B, η swept inside it): the minimum over configurations
    of their seed-mean D_J is biased low (the luckiest configuration wins; with 4 tied batch sizes and 5
    seeds, 90% point intervals covered 0.78). `select="crossfit"` (default) chooses the winner on one half
    of every configuration's seeds and estimates its D_J on the other half, both ways, and takes the
    geometric mean of the two; each replicate resamples seeds within each half (its winner is a random one of
    the near-tied configurations, so the replicates centre on their average, off the point: `fitting.interval`
    centres every interval on its estimate), and leave-seed-s-out rows cross-fit the halves with seed s left
    out of its own half (halves drawn apart from the
    replicate's full resample, which still picks the per-replicate winner for B*, η*: the two are
    independent resamples of the same seeds, so the full resample and everything it feeds — per-
    configuration spreads, the within-error set — are what they were without cross-fitting). A cell whose
    winner is not in doubt (`_clear_winner`) is not cross-fitted: its D_J, replicates and jackknife rows are
    the winner's own, from all its seeds (`g_select` says which cells). A cell where some
    configuration has fewer than 4 seeds falls back to the plain minimum, and a note says so.
    `select="argmin"` is the plain minimum everywhere."""
    if interp_error not in INTERP_ERRORS:
        raise ValueError(f"interp_error: {interp_error!r} is unknown; use one of {INTERP_ERRORS}")
    if select not in SELECTS:
        raise ValueError(f"select: {select!r} is unknown; use one of {SELECTS}")
    if not cs.curves:
        raise ValueError("results: no curves")
    Ys, norm = normalize_curves(cs, normalize)
    means = [y.mean(axis=1) for y in Ys]
    iso = [isotonic_rows(m[None])[0] for m in means]
    if thresholds is None:
        thr = choose_thresholds(iso, cs.curves, n_thresholds, spacing)
    elif isinstance(thresholds, dict):
        thr = {t: np.sort(np.asarray(v, float)) for t, v in thresholds.items()}
    else:
        thr = {t: np.sort(np.asarray(thresholds, float)) for t in cs.tasks}
    if set(thr) != set(cs.tasks) or len({len(v) for v in thr.values()}) != 1:
        raise ValueError("thresholds: need the same number of thresholds for every task")
    nJ = len(next(iter(thr.values())))

    gkey0 = [(c.task, c.utd, -1.0 if c.param_count != c.param_count else c.param_count) for c in cs.curves]
    members0: dict = {}
    for i, k in enumerate(gkey0):
        members0.setdefault(k, []).append(i)
    crossfit = np.zeros(len(cs.curves), bool)
    n_fallback = 0
    if select == "crossfit":
        for m in members0.values():
            if len(m) < 2:
                continue
            if min(cs.curves[i].n_seeds for i in m) >= CROSSFIT_MIN_SEEDS:
                crossfit[m] = True
            else:
                n_fallback += 1

    rng = np.random.default_rng(seed)
    rng_x = np.random.default_rng([seed, 19])   # the halves' resamples (single-config cells keep `rng`'s stream)
    K = max(int(n_bootstrap), 1)
    C = len(cs.curves)
    point = np.empty((C, nJ))
    boot = np.empty((K, C, nJ))
    S_max = max(c.n_seeds for c in cs.curves)
    jack = np.empty((S_max, C, nJ))
    half_point = np.full((2, C, nJ), np.nan)        # D_J from seeds [:S//2] and [S//2:] (cross-fitted cells)
    half_boot = np.full((2, K, C, nJ), np.nan)
    half_jack = np.full((2, S_max, C, nJ), np.nan)  # half q's D_J without seed s (= half_point if s is not in q)

    def jitter(D, br, r, cap):   # D, br (K, nJ): the replicates times exp(U(−h, h)) (see the docstring)
        if interp_error == "none":
            return D
        return D * np.exp(r.uniform(-1.0, 1.0, size=br.shape) * np.minimum(0.25 * br, cap[None, :]))

    for i, (c, Y) in enumerate(zip(cs.curves, Ys)):
        J = thr[c.task]
        point[i] = first_crossing(c.steps, iso[i][None], J, interpolation)[0]
        cap = (ADAPTIVE_GAP_FACTOR * interpolation_gap(c.steps, iso[i], J, interpolation)
               if interp_error == "adaptive" else np.full(len(J), np.inf))   # "uniform": the quarter bracket
        S = Y.shape[1]
        counts = rng.multinomial(S, np.full(S, 1.0 / S), size=K)          # resample seeds
        if crossfit[i]:
            h = S // 2
            cA = rng_x.multinomial(h, np.full(h, 1.0 / h), size=K)
            cB = rng_x.multinomial(S - h, np.full(S - h, 1.0 / (S - h)), size=K)
            for q, (sl, cq) in enumerate(((slice(0, h), cA), (slice(h, S), cB))):
                Yq = Y[:, sl]
                half_point[q, i] = first_crossing(c.steps, isotonic_rows(Yq.mean(axis=1)[None]), J, interpolation)[0]
                nq = Yq.shape[1]
                half_jack[q, :, i] = half_point[q, i]
                half_jack[q, sl, i] = first_crossing(c.steps, isotonic_rows((1.0 - np.eye(nq)) @ Yq.T / (nq - 1)), J,
                                                     interpolation)
                hb, hbr = first_crossing(c.steps, isotonic_rows(cq @ Yq.T / Yq.shape[1]), J, interpolation,
                                         return_bracket=True)
                if HALF_RESCALE and nq > 1:
                    c_q = np.sqrt(nq / (nq - 1) * (S - 1) / S)
                    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                        hp = half_point[q, i][None]
                        hb = np.where(np.isfinite(hb) & np.isfinite(hp), hp * (hb / hp) ** c_q, hb)
                half_boot[q, :, i] = jitter(hb, hbr, rng_x, cap)
        bmeans = counts @ Y.T / S                                          # (K, T)
        reps, br = first_crossing(c.steps, isotonic_rows(bmeans), J, interpolation, return_bracket=True)
        boot[:, i] = jitter(reps, br, rng, cap)
        if S > 1:
            keep = 1.0 - np.eye(S_max)[:, :S]                             # drop seed s (beyond S: drop none)
            keep[S:] = 1.0
            jack[:, i] = first_crossing(c.steps, isotonic_rows(keep @ Y.T / keep.sum(axis=1, keepdims=True)), J,
                                        interpolation)
        else:
            jack[:, i] = np.nan

    cfg = pd.DataFrame([{"task": c.task, "utd": c.utd, "param_count": c.param_count, "batch_size": c.batch_size,
                         "lr": c.lr, "extra": dict(c.extra), "n_seeds": c.n_seeds, "first_step": float(c.steps[0]),
                         "last_step": float(c.steps[-1]), "label": c.label} for c in cs.curves])
    gkey = cfg[list(GROUP_KEYS)].fillna({"param_count": -1.0})
    groups = gkey.drop_duplicates().sort_values(list(GROUP_KEYS)).reset_index(drop=True)
    gindex = {tuple(r): g for g, r in enumerate(groups.itertuples(index=False))}
    cfg["group"] = [gindex[tuple(r)] for r in gkey.itertuples(index=False)]
    groups["param_count"] = groups["param_count"].replace(-1.0, np.nan)
    G = len(groups)
    g_point = np.full((G, nJ), np.inf)
    g_best = np.full((G, nJ), -1)
    g_boot = np.full((K, G, nJ), np.inf)
    g_boot_best = np.full((K, G, nJ), -1)
    g_jack = np.full((S_max, G, nJ), np.inf)
    g_jack_best = np.full((S_max, G, nJ), -1)
    clear = np.zeros((G, nJ), bool)                 # cross-fitted cell whose winner is not in doubt
    g_select = np.full((G, nJ), "single", dtype=object)
    for g in range(G):
        m = np.flatnonzero(cfg["group"].to_numpy() == g)
        sub = point[m]
        a = np.argmin(sub, axis=0)
        g_point[g] = sub[a, np.arange(nJ)]
        g_best[g] = np.where(np.isfinite(g_point[g]), m[a], -1)
        bs = boot[:, m]                                                     # (K, n_m, nJ)
        ab = np.argmin(bs, axis=1)
        g_boot[:, g] = np.take_along_axis(bs, ab[:, None], axis=1)[:, 0]
        g_boot_best[:, g] = np.where(np.isfinite(g_boot[:, g]), m[ab], -1)
        js = np.where(np.isnan(jack[:, m]), np.inf, jack[:, m])
        aj = np.argmin(js, axis=1)
        g_jack[:, g] = np.take_along_axis(js, aj[:, None], axis=1)[:, 0]
        g_jack_best[:, g] = np.where(np.isfinite(g_jack[:, g]), m[aj], -1)
        if len(m) > 1:
            g_select[g] = "argmin"
        if crossfit[m].all():
            clear[g] = _clear_winner(a, sub, boot[:, m], half_point[:, m], cfg["n_seeds"].to_numpy()[m])
            xp = _crossfit(half_point[:, m][:, None])[0]
            n_min = min(cfg["n_seeds"].to_numpy()[m])
            hs = np.array([n_min // 2, n_min - n_min // 2], float)
            vf = np.full(2, n_min / (n_min - 1.0)) if HALF_RESCALE else hs / (hs - 1)   # replicate var -> seed var
            xb = _crossfit(half_boot[:, :, m], _shrink_between(half_boot[:, :, m], half_point[:, m], vf))
            xj = _crossfit(half_jack[:, :, m])
            w = m[a]                                                        # (nJ,) the point's winner
            jj = np.arange(nJ)
            g_point[g] = np.where(clear[g], point[w, jj], xp)
            g_boot[:, g] = np.where(clear[g][None], boot[:, w, jj], xb)
            g_jack[:, g] = np.where(clear[g][None], jack[:, w, jj], xj)
            g_jack_best[:, g] = np.where(np.isfinite(g_jack[:, g]), w[None], -1)
            g_best[g] = np.where(np.isfinite(g_point[g]), w, -1)
            g_select[g] = np.where(clear[g], "clear", "crossfit")
    # Reached at or before the first log point: D_J is only an upper bound ("left-censored").
    first = cfg["first_step"].to_numpy()
    g_left = (g_best >= 0) & (g_point <= first[np.maximum(g_best, 0)])
    g_boot_left = (g_boot_best >= 0) & (g_boot <= first[np.maximum(g_boot_best, 0)])
    g_jack_left = (g_jack_best >= 0) & (g_jack <= first[np.maximum(g_jack_best, 0)])
    # Log points before the crossing (best configuration): a crossing in the first few log intervals is
    # coarsely interpolated, an error the seed bootstrap does not see.
    g_resolution = np.zeros((G, nJ), int)
    for g in range(G):
        for j in range(nJ):
            if g_best[g, j] >= 0:
                g_resolution[g, j] = int(np.searchsorted(cs.curves[g_best[g, j]].steps, g_point[g, j]))
    notes = list(cs.notes)
    n_x = len({gkey0[i] for i in np.flatnonzero(crossfit)})
    if n_x:
        n_clear, n_pts = int(clear.sum()), int(np.isin(g_select, ["clear", "crossfit"]).sum())
        notes.append(f"{n_x} (task, σ, N) cell(s) with several configurations: where the best configuration is not in "
                     f"doubt (it wins on each half of the seeds and by ≥ {CLEAR_WINNER_Z:g} standard errors; "
                     f"{n_clear} of {n_pts} (cell, J) points) D_J is that configuration's own, from all its seeds; "
                     "elsewhere it is cross-fitted (best configuration chosen on half of the seeds, D_J estimated on "
                     "the other half, both ways, geometric mean), so the choice does not bias D_J low "
                     "(table column `config_selection`: clear / crossfit)")
        few = min(cs.curves[i].n_seeds for i in np.flatnonzero(crossfit))
        if few < 10 and n_clear < n_pts:
            notes.append(f"cross-fitted D_J with {few} seeds per configuration: where the optimum over B/η is peaked "
                         "but not clear, the choice made on half of the seeds errs and those D_J sit a little high "
                         "(calibration, peaked batch-size optimum, 30 studies: D_J point intervals covered 0.87 at "
                         "5 seeds, 0.92 at 10, for 90% nominal; one configuration 0.87 and 0.88; 0.93–0.94 where "
                         "the configurations tie)")
    if n_fallback:
        notes.append(f"{n_fallback} (task, σ, N) cell(s) with several configurations but fewer than "
                     f"{CROSSFIT_MIN_SEEDS} seeds in some configuration: D_J is the minimum over configurations "
                     "(biased low when configurations tie; intervals may under-cover)")
    coarse = int(np.sum((g_best >= 0) & (g_resolution < COARSE_LOG_POINTS) & ~g_left))
    if coarse:
        notes.append(f"{coarse} (task, σ, N, J) point(s) reach J within their first {COARSE_LOG_POINTS} log points: "
                     "D_J there is interpolated coarsely" + (
                         " (that uncertainty is in the intervals: each bootstrap D_J is jittered by up to a quarter "
                         "of its log-point bracket)" if interp_error == "uniform" else
                         " (that uncertainty is in the intervals: each bootstrap D_J is jittered by up to twice the gap "
                         "between the linear crossing and a PCHIP cubic's through the same points, at most a quarter "
                         "of the log-point bracket)" if interp_error == "adaptive" else
                         " and the intervals do not include that error") +
                     "; log-spaced logging (dense early) removes it")
    if g_left.any():
        notes.append(f"{int(g_left.sum())} (task, σ, N, J) point(s) are above J at the first log point: D_J is "
                     "only an upper bound there (left-censored), listed, left out of the fits")
    if cfg["n_seeds"].min() < 2:
        notes.append("some configurations have a single seed: their D_J has no bootstrap uncertainty (std NaN)")
    n_cens = int(np.sum(~np.isfinite(g_point)))
    if n_cens:
        notes.append(f"{n_cens} (task, σ, N, J) point(s) never reach J with any configuration: censored, "
                     "listed in the table, left out of the fits")
    notes.append(f"D_J is interpolated ({'in log env-steps' if interpolation == 'log' else 'linearly'}) between "
                 "the two log points around the crossing of the isotonic seed-mean curve")
    return DataEfficiency(thr, norm, cfg, point, boot, groups, g_point, g_best, g_boot, g_boot_best,
                          iso, means, notes, g_left, g_boot_left, g_resolution, jack, g_jack, g_jack_left,
                          interp_error, g_select)
