"""Figures that survive real data: per-task model sizes (a published curve set whose parameter counts
differ by task), fits whose stored curves run far beyond the measured σ, missing intervals and skipped
laws. Most tests draw from a hand-built fit.json (known content, independent of the estimator); one
runs the real pipeline on a small published-layout study."""
import copy
import dataclasses
import math

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import numpy as np
import pytest

from scaling_rl.scaling import plots, synthetic

TASKS = {"ant": 27, "hopper": 11, "humanoid": 376, "walker": 17}   # observation sizes
WIDTHS = [64, 128, 256, 512]
SIGMAS = [0.5, 1.0, 2.0, 4.0, 8.0]
TRUTH = synthetic.Truth(task_scale=(1.0, 1.7, 0.6, 1.3))
DELTA = 4e8
B = 256.0
CAP_FACTOR = 1.5 * plots.CAP   # interval ends may widen an axis by plots.CAP, plus the margin


def _n(width, obs):
    return float(2 * width * width + width * (obs + 8))


def _thresholds(ti, shared):
    return [0.5, 0.6, 0.7] if shared else [round(0.5 + 0.013 * ti, 3), round(0.6 + 0.011 * ti, 3),
                                            round(0.7 + 0.009 * ti, 3)]


def _grid_optimum(p, box):
    """argmin over a log grid of F = (10·N·B·σ + δ)·D(σ, N) inside box ((σ0, σ1), (N0, N1))."""
    S, N = np.meshgrid(np.geomspace(*box[0], 161), np.geomspace(*box[1], 161))
    D = p["D_min"] * (1 + (p["a"] / S) ** p["alpha"] + (p["b"] / N) ** p["beta"])
    C = 10 * N * B * S * D
    F = C + DELTA * D
    i = np.unravel_index(np.argmin(F), F.shape)
    return {"sigma": S[i], "N": N[i], "B": B, "D": D[i], "C": C[i], "F": F[i]}


def make_fit(extrapolate=1.0, shared_thresholds=False, wide_bands=True, one_size=False, n_tasks=4, n_widths=4):
    """A fit.json-shaped dict for 4 tasks × 4 widths with per-task N; stored fit curves span σ/100…σ×100
    (as a fit may store them) so that drawing them unclipped blows the axes up."""
    fit = {"schema": "scaling_rl.scaling.fit/2", "source": "hand-built", "metric": "eval_return",
           "tasks": list(TASKS)[:n_tasks], "settings": {"level": 0.9, "extrapolate": extrapolate, "n_bootstrap": 20},
           "thresholds": {}, "points": [], "configs": [], "data_efficiency_sigma": [],
           "data_efficiency_sigma_n": [], "hparams": {"points": []}, "extrapolation": [],
           "allocation": {"delta": DELTA, "per_threshold": [], "power_laws": [], "batch_models": {}}}
    bands = {}
    for ti, (task, obs) in enumerate(list(TASKS.items())[:n_tasks]):
        thr = _thresholds(ti, shared_thresholds)
        fit["thresholds"][task] = thr
        Ns = [None] if one_size else [_n(w, obs) for w in WIDTHS[:n_widths]]
        fit["allocation"]["batch_models"][task] = {"kind": "constant", "B0": B, "s": 0.0}
        for wi, N in enumerate(Ns):
            Nv = 1e5 if N is None else N
            for s in SIGMAS:
                fit["configs"].append({"task": task, "utd": s, "param_count": N, "batch_size": B, "lr": 3e-4,
                                       "extra": {} if N is None else {"width": float(WIDTHS[wi])}})
            for j, J in enumerate(thr):
                for s in SIGMAS:
                    D = float(TRUTH.D(J, s, Nv, ti))
                    censored = (ti, wi, j, s) == (1, 0, 2, 0.5)
                    fit["points"].append({"task": task, "utd": s, "param_count": N, "j_index": j, "threshold": J,
                                          "D": None if censored else D, "censored": censored,
                                          "last_step": 3 * D if censored else 5 * D,
                                          "D_lo": None if (j + wi) % 3 == 0 else 0.93 * D,
                                          "D_hi": None if (j + wi) % 3 == 0 else 1.08 * D,
                                          "best_batch_size": B})
                rec = {"task": task, "param_count": N, "j_index": j, "threshold": J,
                       "formula": "D_J(σ) = D_min + (β/σ)^α"}
                if (ti, wi, j) == (2, 1, 0):
                    rec["skipped"] = "needs >= 4 σ levels for a 3-parameter law"
                else:
                    lo_s, hi_s = (SIGMAS[0] / 100, SIGMAS[-1] * 100) if wide_bands else (SIGMAS[0], SIGMAS[-1])
                    g = np.geomspace(lo_s, hi_s, 60)
                    est = TRUTH.D(J, g, Nv, ti)
                    no_iv = (ti + j) % 2 == 0
                    rec["band"] = {"utd": g.tolist(), "estimate": est.tolist(),
                                   "lo": [None] * len(g) if no_iv else (0.9 * est).tolist(),
                                   "hi": [None] * len(g) if no_iv else (1.1 * est).tolist()}
                    rec["params"] = {"D_min": {"estimate": 1e6, "lo": None, "hi": None, "reason": "2 seeds"}}
                    rec["not_identified"] = {"alpha": "flat ridge"} if j == 2 else {}
                    bands[(task, N, j)] = rec["band"]
                fit["data_efficiency_sigma"].append(rec)
        # B*(σ) points per (σ, N) and a band per task over σ/100…σ×100
        for N in Ns:
            for s in SIGMAS:
                b = float(TRUTH.batch_size_star(s)) * (1 + 0.05 * ti)
                fit["hparams"]["points"].append({"field": "batch_size", "task": task, "utd": s, "param_count": N,
                                                 "estimate": b, "lo": 0.8 * b if s > 1 else None,
                                                 "hi": 1.25 * b if s > 1 else None})
        g = np.geomspace(SIGMAS[0] / 100, SIGMAS[-1] * 100, 40)
        bstar = TRUTH.batch_size_star(g) * (1 + 0.05 * ti)
        fit["hparams"].setdefault("batch_size_sigma", {"params": {"s": {"estimate": -0.4, "lo": None, "hi": None}},
                                                       "bands": {}})
        fit["hparams"]["batch_size_sigma"]["bands"][task] = {"utd": g.tolist(), "estimate": bstar.tolist(),
                                                             "lo": (0.9 * bstar).tolist(), "hi": (1.1 * bstar).tolist()}
        if one_size:
            continue
        # compute-optimal allocation inside the (K-)box; the hardest threshold's optimum is put 100× beyond.
        box = ((SIGMAS[0], SIGMAS[-1]), (min(Ns), max(Ns)))
        kbox = tuple((a / extrapolate, b_ * extrapolate) for a, b_ in box)
        rows = []
        for j, J in enumerate(thr):
            p = TRUTH.params(J, ti)
            o = _grid_optimum(p, kbox)
            row = {"task": task, "j_index": j, "threshold": J, "kind": "full", **o, "params": p,
                   "free": {"sigma": True, "N": True}, "box": {"sigma": list(kbox[0]), "N": list(kbox[1])},
                   "extrapolated": {"sigma": not box[0][0] <= o["sigma"] <= box[0][1],
                                    "N": not box[1][0] <= o["N"] <= box[1][1]},
                   "edge": {}, "intervals": {k: ({"estimate": o[k], "lo": o[k] / 1.2, "hi": o[k] * 1.2} if j != 1
                                                 else {"estimate": o[k], "lo": None, "hi": None, "reason": "edge"})
                                             for k in ("sigma", "N", "D", "C", "F")}}
            if j == len(thr) - 1:
                row.update(sigma=o["sigma"] * 100, edge={"sigma": "upper"})
            rows.append(row)
        fit["allocation"]["per_threshold"] += rows
        F = np.array([r["F"] for r in rows[:2]])
        for tg in ("D", "C", "sigma", "N"):
            y = np.array([r[tg] for r in rows[:2]])
            s_ = float(np.diff(np.log(y))[0] / np.diff(np.log(F))[0])
            fit["allocation"]["power_laws"].append({
                "task": task, "target": tg, "formula": f"{tg}* = A·F^s", "F_range": [float(F.min()), float(F.max())],
                "params": {"A": {"estimate": float(y[0] / F[0] ** s_), "lo": None, "hi": None, "reason": "n_ok 3/20"},
                           "s": {"estimate": s_, "lo": None, "hi": None}}})
        fit["extrapolation"].append({"task": task, "j_index": 0, "holdout": "utd", "mean_abs_log_error_heldout": None,
                                     "points": [{"observed": 1e6 * (k + 1), "predicted": 1.1e6 * (k + 1),
                                                 "observed_std": None, "held_out": k == 3} for k in range(4)]})
    fit["levels"] = {"utd": SIGMAS, "param_count": sorted({c["param_count"] for c in fit["configs"]
                                                           if c["param_count"] is not None})}
    return fit, bands


def _groups(fit):
    return {(p["task"], p["param_count"]) for p in fit["points"]}


def _panel_points(fit, gid):
    task, n = gid.split("|")
    return [p for p in fit["points"] if p["task"] == task
            and (p["param_count"] is None if n == "" else math.isclose(p["param_count"], float(n), rel_tol=1e-5))]


def _legends(fig):
    return plots._legend_texts(fig)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.mark.parametrize("K", [1.0, 2.0])
def test_data_efficiency_sigma_panels_fits_limits_and_legends(K):
    fit, _ = make_fit(extrapolate=K)
    fig = plots.draw_data_efficiency_sigma(fit)
    # one panel per (task, its own N) with data: 16, not the 4 × 16 union of all parameter counts
    nonempty = [ax for ax in fig.axes if ax.lines or ax.collections]
    assert len(fig.axes) == len(nonempty) == len(_groups(fit)) == 16
    n_dashed = 0
    for ax in fig.axes:
        pts = _panel_points(fit, ax.get_gid())
        assert pts, ax.get_gid()
        ok = [p for p in pts if not p["censored"]]
        s_lo, s_hi = min(p["utd"] for p in ok), max(p["utd"] for p in ok)
        # fitted curves: over the measured σ range, dashed at most a factor K beyond it
        fits = [ln for ln in ax.lines if ln.get_gid() in ("fit", "fit-extrapolated")]
        assert fits
        for ln in fits:
            x = np.asarray(ln.get_xdata(), float)
            k = 1.0 if ln.get_gid() == "fit" else K
            assert x.min() >= s_lo / k * (1 - 1e-9) and x.max() <= s_hi * k * (1 + 1e-9)
            assert (ln.get_linestyle() == "--") == (ln.get_gid() == "fit-extrapolated")
        n_dashed += sum(ln.get_gid() == "fit-extrapolated" for ln in fits)
        # y-limits set by the row's data (D and censored last steps), not by the fits (~1e9 at σ/100)
        row = [p for p in fit["points"] if p["task"] == pts[0]["task"]]
        vals = [p["D"] for p in row if not p["censored"]] + [p["last_step"] for p in row if p["censored"]]
        y0, y1 = ax.get_ylim()
        assert min(vals) / 2 <= y0 <= min(vals) and max(vals) <= y1 <= max(vals) * 2
    assert (n_dashed > 0) == (K > 1)
    # thresholds differ by task: each task's legend shows its own J values
    legends = _legends(fig)
    for task, thr in fit["thresholds"].items():
        match = [labels for title, labels in legends if task in title]
        assert match and match[0] == [f"J = {v:.3g}" for v in thr], (task, legends)


def test_data_efficiency_sigma_shared_thresholds_and_one_size_per_task():
    fit, _ = make_fit(shared_thresholds=True, one_size=True)
    fig = plots.draw_data_efficiency_sigma(fit)
    assert len(fig.axes) == 4 and all(ax.lines for ax in fig.axes)   # one panel per task, wrapped
    labels = [lab for _, labs in _legends(fig) for lab in labs if lab.startswith("J =")]
    assert labels == ["J = 0.5", "J = 0.6", "J = 0.7"]                # one legend serves every task


def test_hparams_fits_within_measured_sigma_and_data_limits():
    fit, _ = make_fit(extrapolate=1.5)
    fig = plots.draw_hparams(fit)
    ax = fig.axes[0]
    for ln in ax.lines:
        if ln.get_gid() in ("fit", "fit-extrapolated"):
            x = np.asarray(ln.get_xdata(), float)
            k = 1.0 if ln.get_gid() == "fit" else 1.5
            assert x.min() >= SIGMAS[0] / k * (1 - 1e-9) and x.max() <= SIGMAS[-1] * k * (1 + 1e-9)
    est = [p["estimate"] for p in fit["hparams"]["points"]]
    y0, y1 = ax.get_ylim()
    assert min(est) / 1.6 <= y0 <= min(est) and max(est) <= y1 <= max(est) * 1.6
    # model sizes differ by task: markers are labelled by width, not by one task's N
    labels = [lab for _, labs in _legends(fig) for lab in labs]
    assert "width 64 (smallest)" in labels and not any(lab.startswith("N =") for lab in labels)


def test_allocation_figures_stay_in_the_swept_box_and_label_per_task():
    K = 3.0
    fit, _ = make_fit(extrapolate=K)
    fig = plots.draw_contours(fit)
    assert sorted(ax.get_gid() for ax in fig.axes if ax.get_gid()) == sorted(TASKS)
    for ax in (a for a in fig.axes if a.get_gid() in TASKS):
        task = ax.get_gid()
        ns = [p["param_count"] for p in fit["points"] if p["task"] == task]
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        assert SIGMAS[0] / K / 1.5 <= x0 <= SIGMAS[0] and SIGMAS[-1] <= x1 <= SIGMAS[-1] * K * 1.5
        assert min(ns) / K / 1.5 <= y0 <= min(ns) and max(ns) <= y1 <= max(ns) * K * 1.5
        assert any("optimum beyond" in t.get_text() for t in ax.texts)       # the 100× optimum is not drawn
    legends = _legends(fig)
    for task, thr in fit["thresholds"].items():
        labels = next(labels for title, labels in legends if title.startswith(task))
        assert [f"optimum, J = {v:.3g}" for v in thr] == [lab for lab in labels if lab.startswith("optimum, J")]

    fig = plots.draw_pareto(fit)
    for ax in (a for a in fig.axes if a.get_gid() in TASKS):
        task = ax.get_gid()
        rows = [r for r in fit["allocation"]["per_threshold"] if r["task"] == task]
        pts = [p for p in fit["points"] if p["task"] == task and not p["censored"]]
        C = [10 * p["param_count"] * B * p["utd"] * p["D"] for p in pts] + [r["C"] for r in rows]
        D = [p["D"] for p in pts] + [r["D"] for r in rows]
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        assert min(C) / 2 <= x0 <= min(C) and max(C) <= x1 <= max(C) * 2
        assert min(D) / 2 <= y0 <= min(D) and max(D) <= y1 <= max(D) * 2
        assert any(ln.get_gid() == "fit" for ln in ax.lines)
        assert ax.get_legend().get_title().get_text() == task
        assert [t.get_text() for t in ax.get_legend().get_texts()] == [f"J = {v:.3g}" for v in fit["thresholds"][task]]

    fig = plots.draw_budget_scaling(fit)
    for ax in fig.axes:
        task, tg = (ax.get_gid() or "|").split("|")
        if tg not in ("sigma", "N"):
            continue
        rows = [r for r in fit["allocation"]["per_threshold"] if r["task"] == task and not r["edge"]]
        vals = [r[tg] for r in rows]
        y0, y1 = ax.get_ylim()
        # the 100× box-edge σ* does not set the axis (it is an arrow on the border)
        assert min(vals) / CAP_FACTOR <= y0 <= min(vals) and max(vals) <= y1 <= max(vals) * CAP_FACTOR


def test_every_figure_draws_without_intervals_or_with_skipped_laws(tmp_path):
    fit, _ = make_fit(extrapolate=2.0, n_tasks=2, n_widths=2)
    bare = copy.deepcopy(fit)
    for p in bare["points"]:
        p["D_lo"] = p["D_hi"] = None
    for r in bare["allocation"]["per_threshold"]:
        r.pop("intervals")
    for law in bare["allocation"]["power_laws"][::2]:
        law.clear()
        law.update(task="ant", target="D", skipped="needs optima strictly inside the searched box")
    bare["settings"].pop("extrapolate")
    paths = plots.plot_all(bare, tmp_path)
    names = sorted({p.rsplit("/", 1)[1].split(".")[0] for p in paths})
    assert names == sorted(plots.DRAWERS)
    img = mpimg.imread(tmp_path / "data_efficiency_sigma.png")
    assert img[..., :3].std() > 0.05


def test_real_pipeline_on_a_published_layout_study():
    """analyze() on 4 tasks × 4 widths whose parameter counts differ by task, then the σ figure."""
    from scaling_rl.scaling import analysis
    from scaling_rl.scaling.data import CurveSet
    from scaling_rl.scaling.report import jsonable
    curves = []
    for ti, (task, obs) in enumerate(TASKS.items()):
        Ns = [_n(w, obs) for w in WIDTHS]
        cs = synthetic.make_study(synthetic.Truth(task_scale=(TRUTH.task_scale[ti],)), utds=[0.5, 1, 2, 4],
                                  param_counts=Ns, tasks=[task], seeds=4, n_log=30, rng=ti)
        curves += [dataclasses.replace(c, extra=(("width", float(WIDTHS[Ns.index(c.param_count)])),))
                   for c in cs.curves]
    fit = jsonable(analysis.analyze(CurveSet(curves, "eval_return"),
                                    analysis.Settings(n_bootstrap=8, n_thresholds=2, holdout=False)))
    fig = plots.draw_data_efficiency_sigma(fit)
    groups = {(p["task"], p["param_count"]) for p in fit["points"]}
    assert len(groups) == 16 and len([ax for ax in fig.axes if ax.lines or ax.collections]) == 16
    for ax in fig.axes:
        for ln in ax.lines:
            if ln.get_gid() == "fit":
                assert min(ln.get_xdata()) >= 0.5 * (1 - 1e-9) and max(ln.get_xdata()) <= 4 * (1 + 1e-9)
