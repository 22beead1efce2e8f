"""Synthetic studies with a known answer: learning curves generated from a ground-truth D_J(σ, N).

For every threshold J in (0, 1) the truth is D_J(σ, N) = D_min(J)·(1 + (a(J)/σ)^α + (b(J)/N)^β) with
D_min(J) = D0·(J/(1−J))^γ and a(J), b(J) growing exponentially with J, so D_J increases with J and the normalised
return curve R(t) = sup{J : D_J ≤ t} is well defined. Seeds differ by a log-normal time warp
(`noise` = std of log D per seed) plus additive return noise; a batch size or learning rate away from
its optimum B*(σ) = B0·σ^(−s_B), η*(σ) = η0·σ^(−s_η) slows learning by 1 + κ·log²(value/optimum).
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Sequence

import numpy as np

from .data import Curve, CurveSet


@dataclasses.dataclass(frozen=True)
class Truth:
    """Ground-truth data-efficiency law and hyper-parameter optima."""

    D0: float = 2e5
    gamma: float = 1.0
    a0: float = 0.8
    alpha: float = 1.0
    b0: float = 1e5
    beta: float = 0.8
    growth_a: float = 3.0      # a(J) = a0·exp(growth_a·J): harder targets need more σ ...
    growth_b: float = 3.0      # b(J) = b0·exp(growth_b·J): ... and larger models
    B0: float = 512.0
    s_B: float = 0.4
    lr0: float = 3e-4
    s_lr: float = 0.3
    kappa: float = 0.15
    task_scale: tuple[float, ...] = (1.0, 1.7, 0.6)   # D0 multiplier per task

    def params(self, J: float, task_index: int = 0) -> dict[str, float]:
        """Parameters of D_J(σ, N) = D_min·(1 + (a/σ)^α + (b/N)^β) at threshold J."""
        return {"D_min": self.D0 * self.task_scale[task_index] * (J / (1 - J)) ** self.gamma,
                "a": self.a0 * np.exp(self.growth_a * J), "alpha": self.alpha,
                "b": self.b0 * np.exp(self.growth_b * J), "beta": self.beta}

    def D(self, J, sigma, N, task_index: int = 0):
        p = self.params(J, task_index)
        return p["D_min"] * (1 + (p["a"] / np.asarray(sigma, float)) ** p["alpha"]
                             + (p["b"] / np.asarray(N, float)) ** p["beta"])

    def batch_size_star(self, sigma):
        return self.B0 * np.asarray(sigma, float) ** (-self.s_B)

    def lr_star(self, sigma):
        return self.lr0 * np.asarray(sigma, float) ** (-self.s_lr)

    def slowdown(self, sigma, B, lr):
        pen = 1.0
        if np.isfinite(B):
            pen += self.kappa * np.log(B / self.batch_size_star(sigma)) ** 2
        if np.isfinite(lr):
            pen += self.kappa * np.log(lr / self.lr_star(sigma)) ** 2
        return pen


def return_curve(truth: Truth, t: np.ndarray, sigma: float, N: float, task_index: int) -> np.ndarray:
    """R(t): the inverse of J -> D_J(σ, N), by interpolation on a fine grid of J."""
    Jg = np.linspace(1e-4, 1 - 1e-4, 4000)
    Dg = truth.D(Jg, sigma, N, task_index)
    return np.interp(np.log(t), np.log(Dg), Jg, left=0.0, right=Jg[-1])


def make_study(truth: Truth = Truth(), *, utds: Sequence[float] = (0.5, 1, 2, 4, 8),
               param_counts: Sequence[float] = (1e5, 3e5, 1e6, 3e6), batch_sizes: Sequence[float] = (np.nan,),
               lrs: Sequence[float] = (np.nan,), tasks: Sequence[str] = ("task",), seeds: int = 5,
               noise: float = 0.05, obs_noise: float = 0.01, n_log: int = 200, reach: float = 0.8,
               metric: str = "eval_return", return_scale: float = 1.0, log_spaced: bool = False,
               rng: np.random.Generator | int = 0) -> CurveSet:
    """A full factorial study; every curve is logged at n_log evenly spaced env steps (log-spaced over
    four decades if `log_spaced`) up to the step where the slowest (σ, N) reaches `reach`, times 1.25."""
    rng = np.random.default_rng(rng)
    t_max = 1.25 * max(truth.D(reach, s, n, ti) * truth.slowdown(s, b, lr)
                       for s, n, b, lr, ti in itertools.product(utds, param_counts, batch_sizes, lrs,
                                                                range(len(tasks))))
    steps = np.geomspace(t_max / 1e4, t_max, n_log) if log_spaced else np.linspace(t_max / n_log, t_max, n_log)
    curves = []
    for ti, task in enumerate(tasks):
        for s, n, b, lr in itertools.product(utds, param_counts, batch_sizes, lrs):
            slow = truth.slowdown(s, b, lr)
            warp = np.exp(noise * rng.standard_normal(seeds))          # per-seed D multiplier
            Y = np.stack([return_curve(truth, steps / (slow * w), s, n, ti) for w in warp], axis=1)
            Y = Y + obs_noise * rng.standard_normal(Y.shape)
            curves.append(Curve(task=task, utd=float(s), param_count=float(n), batch_size=float(b), lr=float(lr),
                                steps=steps.copy(), returns=return_scale * Y))
    return CurveSet(curves, metric, source="synthetic")


def make_table(truth: Truth = Truth(), **kw):
    """The same study as the sweep store's tidy table (with trial ids)."""
    return make_study(truth, **kw).to_table()
