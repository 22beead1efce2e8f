"""Near-optimal regions: the allocations (σ, N, B) whose budget F = C + δ·D is within ε of the
minimum, from the fitted law *and* from the measured configurations, with their bootstrap spread.

Why a region and not only the point optimum: a budget surface is flat near its minimum, so the point
(σ*, N*) moves a lot for a tiny change in F, and a law that is slightly wrong (a high-UTD degradation
its family cannot represent) moves it out of its own interval while the budget it costs is off by <1%.
What a researcher can act on is the set of allocations that are near-optimal.

The region is a confidence set by test inversion (the idea of Hansen, Lunde & Nason 2011, "The Model
Confidence Set", applied to allocations): an allocation θ is left out only if the seed bootstrap rejects
"θ is within ε of the optimum" at the one-sided level (1 − level)/2, i.e. θ is ε-near-optimal in fewer
than that share of the replicates (replicate b compares θ with replicate b's own optimum). It is made
twice, from two estimators that fail differently:
- **law**: F(θ) of the fitted law D_J(σ, N) on a grid over the searched box (each replicate on its own
  law and batch model);
- **cells**: F of every measured configuration (σ, N, B, η) from its own D_J, no law at all (each
  replicate on its own resampled D_J). A grid localises an optimum only to its spacing, so each axis
  of the cells' region reaches halfway (in log) to the next swept level on either side.
The printed region is the smallest box holding both; `agree` says whether each estimator's optimum lies
in the other's region. When they disagree the law is not describing the data near the optimum.
"""
from __future__ import annotations

import math

import numpy as np

from . import allocation as alloc

EPSILONS = (0.01, 0.05)     # "within 1% / 5% of the minimal budget"
N_GRID = 41                 # grid points per free axis of the law's region


def _key(eps: float) -> str:
    return f"{round(100 * eps):d}%"


def _share_level(level: float) -> float:
    return (1.0 - level) / 2.0


def _box(sig: np.ndarray, n: np.ndarray, b: np.ndarray | None = None) -> dict:
    out = {"sigma": [float(sig.min()), float(sig.max())], "N": [float(n.min()), float(n.max())]}
    if b is not None and b.size:
        out["B"] = [float(b.min()), float(b.max())]
    return out


def _grid(box: dict, fixed: dict, n_grid: int = N_GRID) -> tuple[np.ndarray, np.ndarray]:
    """(log σ, log N) of the grid over the searched box; a fixed axis is one value."""
    axes = []
    for ax, fix in (("sigma_range", fixed.get("fix_sigma")), ("n_range", fixed.get("fix_n"))):
        lo, hi = box[ax]
        axes.append(np.array([math.log(fix)]) if fix is not None else np.linspace(math.log(lo), math.log(hi), n_grid))
    ls, ln = np.meshgrid(*axes, indexing="ij")
    return ls.ravel(), ln.ravel()


def _log_f(p: dict, batch: alloc.BatchModel, delta: float, ls: np.ndarray, ln: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return np.asarray(alloc.log_budget(p, batch, delta, ls, ln)[0], float)


def law_region(p: dict, batch: alloc.BatchModel, delta: float, box: dict, fixed: dict,
               reps: list[dict | None] | None = None, batch_reps: list | None = None,
               level: float = 0.9, epsilons=EPSILONS) -> dict:
    """The law's near-optimal region per ε: grid points ε-near-optimal under the point law, or in at
    least (1 − level)/2 of the usable replicates. Returns {"1%": box + share of replicates agreeing, ...}."""
    ls, ln = _grid(box, fixed)
    lf = _log_f(p, batch, delta, ls, ln)
    rel = lf - np.nanmin(lf)
    rel_b = []
    for b, q in enumerate(reps or []):
        bm = batch if batch_reps is None else batch_reps[b]
        if q is None or bm is None:
            continue
        lfb = _log_f(q, bm, delta, ls, ln)
        if np.all(np.isfinite(lfb)):
            rel_b.append(lfb - lfb.min())
    rel_b = np.array(rel_b) if rel_b else np.zeros((0, ls.size))
    out = {}
    for eps in epsilons:
        tol = math.log1p(eps)
        near = rel <= tol
        share = (rel_b <= tol).mean(axis=0) if len(rel_b) else np.zeros(ls.size)
        keep = near | (share >= _share_level(level)) if len(rel_b) else near
        s, n = np.exp(ls[keep]), np.exp(ln[keep])
        out[_key(eps)] = {**_box(s, n, np.atleast_1d(batch(s, n))), "n_replicates": int(len(rel_b)),
                          "grid_points": int(keep.sum()), "of_grid": int(keep.size)}
    return out


def _half_steps(levels: list[float], lo: float, hi: float) -> tuple[float, float]:
    """Extend [lo, hi] (swept levels) halfway in log to the neighbouring swept levels (the grid's
    resolution); at the sweep's edge the range stops at the edge."""
    lv = sorted(levels)
    i, k = lv.index(lo), lv.index(hi)
    a = math.sqrt(lv[i - 1] * lv[i]) if i > 0 else lv[i]
    b = math.sqrt(lv[k] * lv[k + 1]) if k + 1 < len(lv) else lv[k]
    return a, b


def cell_region(configs: dict, D: np.ndarray, D_boot: np.ndarray, delta: float, levels: dict,
                level: float = 0.9, epsilons=EPSILONS) -> dict:
    """The measured configurations' near-optimal region per ε, without any law.

    `configs`: arrays "utd", "param_count", "batch_size" (C,) of one task; D (C,) their D_J (inf or NaN
    = never reached J); D_boot (K, C) per replicate. A configuration is in if it is ε-near-optimal by its
    point D_J, or in at least (1 − level)/2 of the replicates (each against that replicate's best). The
    box reaches halfway to the neighbouring swept σ and N (`levels`). Also returns the best cell and the
    cells whose membership the replicates split (more seeds there would decide them)."""
    s, n = np.asarray(configs["utd"], float), np.asarray(configs["param_count"], float)
    B = np.asarray(configs["batch_size"], float)
    B = np.where(np.isfinite(B) & (B > 0), B, 1.0)
    u = alloc.FLOPS_FACTOR * n * B * s + delta
    with np.errstate(invalid="ignore", over="ignore"):
        F = np.where(np.isfinite(D) & (D > 0), u * D, np.inf)
        Fb = np.where(np.isfinite(D_boot) & (D_boot > 0), u[None, :] * D_boot, np.inf)
    if not np.isfinite(F).any():
        return {"skipped": "no configuration reaches J"}
    best = int(np.argmin(F))
    rows_ok = np.isfinite(Fb).any(axis=1)
    Fb = Fb[rows_ok]
    out = {"best": {"sigma": float(s[best]), "N": float(n[best]), "B": float(B[best]), "F": float(F[best]),
                    "D": float(D[best])}}
    for eps in epsilons:
        near = F <= (1 + eps) * F[best]
        if len(Fb):
            share = (Fb <= (1 + eps) * Fb.min(axis=1, keepdims=True)).mean(axis=0)
            keep = near | (share >= _share_level(level))
        else:
            share, keep = near.astype(float), near
        sl, sh = _half_steps(levels["utd"], float(s[keep].min()), float(s[keep].max()))
        nl, nh = _half_steps(levels["param_count"], float(n[keep].min()), float(n[keep].max()))
        undecided = np.flatnonzero((share > _share_level(level)) & (share < 1 - _share_level(level)))
        out[_key(eps)] = {"sigma": [sl, sh], "N": [nl, nh], "B": [float(B[keep].min()), float(B[keep].max())],
                          "cells": [{"sigma": float(s[c]), "N": float(n[c]), "B": float(B[c]),
                                     "F_ratio": float(F[c] / F[best]), "share": float(share[c])}
                                    for c in np.flatnonzero(keep)],
                          "undecided": [{"sigma": float(s[c]), "N": float(n[c]), "B": float(B[c]),
                                         "share": float(share[c])} for c in undecided],
                          "n_replicates": int(len(Fb))}
    return out


def _inside(v: float, rng: list[float], tol: float = 1e-9) -> bool:
    return rng[0] * (1 - tol) <= v <= rng[1] * (1 + tol)


def combine(law: dict | None, cells: dict | None, law_opt: dict | None) -> dict:
    """The printed region per ε: the smallest box holding the law's and the cells' regions, and whether
    each estimator's optimum lies inside the other's region."""
    out = {}
    for k in (_key(e) for e in EPSILONS):
        lr = (law or {}).get(k)
        cr = (cells or {}).get(k) if cells and "skipped" not in cells else None
        parts = [r for r in (lr, cr) if r]
        if not parts:
            continue
        box = {ax: [min(r[ax][0] for r in parts if ax in r), max(r[ax][1] for r in parts if ax in r)]
               for ax in ("sigma", "N", "B") if any(ax in r for r in parts)}
        rec = {**box, "from": "+".join(n for n, r in (("law", lr), ("cells", cr)) if r)}
        if lr and cr and law_opt is not None:
            best = cells["best"]
            rec["agree"] = bool(_inside(law_opt["sigma"], cr["sigma"]) and _inside(law_opt["N"], cr["N"])
                                and _inside(best["sigma"], lr["sigma"]) and _inside(best["N"], lr["N"]))
        out[k] = rec
    return out
