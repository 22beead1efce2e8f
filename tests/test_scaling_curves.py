"""Curves -> D_J: isotonic smoothing, interpolated crossings, censoring, seeds, best B/η, loaders."""
import math

import numpy as np
import pandas as pd
import pytest
from sklearn.isotonic import isotonic_regression

from scaling_rl.scaling import curves as cv
from scaling_rl.scaling import data, synthetic
from scaling_rl.scaling.data import Curve, CurveSet


def _set(*curves, metric="eval_return"):
    return CurveSet(list(curves), metric)


def _curve(steps, returns, **kw):
    d = dict(task="t", utd=1.0, param_count=1e5, batch_size=256.0, lr=3e-4)
    d.update(kw)
    return Curve(steps=np.asarray(steps, float), returns=np.asarray(returns, float).reshape(len(steps), -1), **d)


def test_isotonic_rows_matches_sklearn():
    rng = np.random.default_rng(0)
    Y = np.cumsum(rng.normal(0.1, 1.0, size=(20, 50)), axis=1)
    got = cv.isotonic_rows(Y)
    want = np.stack([isotonic_regression(y) for y in Y])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert np.all(np.diff(got, axis=1) >= -1e-12)


def test_first_crossing_interpolates_between_log_points():
    steps = np.array([100.0, 200.0, 400.0])
    y = np.array([[0.0, 0.5, 1.0]])
    lin = cv.first_crossing(steps, y, [0.25, 0.75], interpolation="linear")[0]
    np.testing.assert_allclose(lin, [150.0, 300.0])
    log = cv.first_crossing(steps, y, [0.25, 0.75], interpolation="log")[0]
    np.testing.assert_allclose(log, [100 * 2 ** 0.5, 200 * 2 ** 0.5])
    # Starting above J -> the first log point; never reaching J -> inf (censored).
    np.testing.assert_array_equal(cv.first_crossing(steps, y, [-1.0, 1.5])[0], [100.0, np.inf])


def test_never_reaching_J_is_censored_and_reported_not_dropped():
    steps = np.linspace(1e4, 1e6, 50)
    fast = _curve(steps, np.tile(np.linspace(0, 1, 50)[:, None], (1, 3)), utd=2.0)
    slow = _curve(steps, np.tile(np.linspace(0, 0.5, 50)[:, None], (1, 3)), utd=1.0)
    de = cv.data_efficiency(_set(fast, slow), thresholds=[0.3, 0.8], normalize="none", n_bootstrap=10)
    tab = de.group_table()
    assert len(tab) == 4  # both (σ, N) points at both thresholds are kept
    row = tab[(tab.utd == 1.0) & (tab.threshold == 0.8)].iloc[0]
    assert row.censored and math.isinf(row.D) and row.last_step == steps[-1]
    assert row.censored_boot_frac == 1.0
    assert not tab[(tab.utd == 1.0) & (tab.threshold == 0.3)].iloc[0].censored
    assert any("censored" in n for n in de.notes)


def test_non_monotone_noise_is_smoothed_before_the_crossing():
    steps = np.arange(1, 11) * 100.0
    # A single-log-point spike above J at step 200, then the curve falls back and rises for good.
    y = np.array([0.1, 0.9, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8])
    de = cv.data_efficiency(_set(_curve(steps, y)), thresholds=[0.55], normalize="none", n_bootstrap=1)
    iso = isotonic_regression(y)
    want = cv.first_crossing(steps, iso[None], [0.55])[0, 0]
    assert de.point[0, 0] == pytest.approx(want)
    assert de.point[0, 0] > 600.0  # not the spike at 200 (raw first crossing)


def test_single_seed_gives_no_uncertainty_instead_of_false_precision():
    steps = np.linspace(1e4, 1e6, 40)
    c = _curve(steps, np.linspace(0, 1, 40))
    de = cv.data_efficiency(_set(c), thresholds=[0.5], normalize="none", n_bootstrap=20)
    row = de.group_table().iloc[0]
    assert np.isfinite(row.D)
    assert math.isnan(row.D_boot_std) and math.isnan(row.D_lo)
    assert any("single seed" in n for n in de.notes)


def test_seed_bootstrap_spread_matches_seed_noise():
    truth = synthetic.Truth()
    cs = synthetic.make_study(truth, utds=[1.0], param_counts=[1e6], seeds=20, noise=0.1, obs_noise=0.0, rng=3)
    de = cv.data_efficiency(cs, thresholds=[0.5], normalize="none", n_bootstrap=400, seed=1)
    row = de.group_table().iloc[0]
    # log D of a 20-seed mean: std ≈ 0.1 / sqrt(20); the bootstrap should see about that.
    assert row.D_boot_std / row.D == pytest.approx(0.1 / math.sqrt(20), rel=0.35)
    assert row.D == pytest.approx(truth.D(0.5, 1.0, 1e6), rel=0.08)


def test_uncertainty_corrected_best_batch_size_and_lr():
    truth = synthetic.Truth()
    cs = synthetic.make_study(truth, utds=[0.5, 4.0], param_counts=[1e6], batch_sizes=[128, 256, 512, 1024],
                              lrs=[1e-4, 3e-4, 1e-3], seeds=4, rng=0)
    de = cv.data_efficiency(cs, thresholds=[0.3, 0.5], normalize="none", n_bootstrap=30)
    tab = de.group_table()
    for s in (0.5, 4.0):
        sub = tab[tab.utd == s]
        b_true, lr_true = truth.batch_size_star(s), truth.lr_star(s)
        # within a factor of the grid spacing of the truth
        assert all(abs(math.log(b / b_true)) < math.log(2.0) for b in sub.batch_size_star)
        assert all(abs(math.log(lr / lr_true)) < math.log(3.0) for lr in sub.lr_star)
    point, samples = de.hparam_samples("batch_size")
    assert point.shape == (2,) and samples.shape == (30, 2)
    assert point[0] > point[1]  # B* falls with σ


def test_within_error_set_holds_ties_and_excludes_clearly_worse_configs():
    """Two learning rates 0.1% apart are tied (both within error of the best, whichever wins); one 30×
    off the optimum is clearly slower (κ·log²(30) ≈ 1.7× the data) and is excluded."""
    truth = synthetic.Truth()
    lr_star = float(truth.lr_star(1.0))
    cs = synthetic.make_study(truth, utds=[1.0], param_counts=[1e6], lrs=[lr_star, lr_star * 1.001, lr_star * 30],
                              seeds=6, noise=0.05, log_spaced=True, rng=2)
    de = cv.data_efficiency(cs, thresholds=[0.3, 0.5], normalize="none", n_bootstrap=60)
    lrs = de.configs["lr"].to_numpy()
    far = int(np.argmax(lrs))
    tied = sorted(int(i) for i in np.argsort(lrs)[:2])
    for r in de.group_table().itertuples():
        assert sorted(c for c in r.within_error if c != far) == tied, (r.j_index, r.within_error)
        assert far not in r.within_error


def test_thresholds_default_to_the_level_every_point_reaches():
    cs = synthetic.make_study(synthetic.Truth(), utds=[0.5, 2.0], param_counts=[1e5, 1e6], seeds=2, rng=0)
    de = cv.data_efficiency(cs, n_thresholds=4, normalize="task", n_bootstrap=5)
    thr = de.thresholds["task"]
    assert len(thr) == 4 and np.all(np.diff(thr) > 0)
    assert not de.group_table().censored.any()
    with pytest.raises(ValueError, match="spacing"):
        cv.data_efficiency(cs, spacing="cubic", n_bootstrap=2)


# ---- loaders ------------------------------------------------------------------------------------

def test_tidy_table_round_trip_with_trial_ids_and_extra_fields():
    cs = synthetic.make_study(synthetic.Truth(), utds=[1.0, 2.0], param_counts=[1e5], batch_sizes=[256.0],
                              lrs=[3e-4], seeds=3, n_log=30, rng=0)
    tab = cs.to_table()
    tab["tau"] = np.where(tab["utd"] == 1.0, 0.005, 0.01)       # an extra config field
    tab["loss/critic"] = np.random.default_rng(0).normal(size=len(tab))  # a metric, not config
    back = data.curves_from_table(tab, "eval_return")
    assert len(back.curves) == 2
    for c in back.curves:
        orig = next(o for o in cs.curves if o.utd == c.utd)
        np.testing.assert_allclose(c.returns, orig.returns)
        np.testing.assert_allclose(c.steps, orig.steps)
        assert dict(c.extra) == {"tau": 0.005 if c.utd == 1.0 else 0.01}


def test_reads_the_sweep_collect_layout():
    """scaling_rl.sweep.collect: one trial per (config, trial_seed) packing several seeds, seed =
    trial_seed * seeds + seed_index, status/agent/chunk/grad_steps columns, cfg_-prefixed clashes,
    other metrics (NaN where not logged)."""
    cs = synthetic.make_study(synthetic.Truth(), utds=[1.0, 2.0], param_counts=[1e5, 4e5], batch_sizes=[256.0],
                              lrs=[3e-4], seeds=4, n_log=20, rng=0)
    frames = []
    for i, c in enumerate(cs.curves):
        for trial_seed in (0, 1):  # two trials of the same config, 2 seeds each
            for k in range(2):
                sd = trial_seed * 2 + k
                frames.append(pd.DataFrame({
                    "trial_id": f"cfg{i}-s{trial_seed}", "agent": "sac", "status": "done", "param_count": c.param_count,
                    "seed": sd, "seed_index": k, "trial_seed": trial_seed, "seeds": 2,
                    "chunk": np.arange(len(c.steps)), "env_steps": c.steps, "grad_steps": c.steps * c.utd,
                    "eval_return": c.returns[:, sd], "episode_return": np.nan, "loss/critic": 1.0,
                    "utd": c.utd, "batch_size": c.batch_size, "lr": c.lr, "width": 256 if c.param_count == 1e5 else 512,
                    "depth": 2, "env": "gymnax/Pendulum-v1", "cfg_env_steps": 5e5, "cfg_seed": trial_seed}))
    back = data.curves_from_table(pd.concat(frames, ignore_index=True), "eval_return")
    assert len(back.curves) == 4 and all(c.n_seeds == 4 for c in back.curves)
    for c in back.curves:
        orig = next(o for o in cs.curves if o.utd == c.utd and o.param_count == c.param_count)
        np.testing.assert_allclose(c.returns, orig.returns)
        assert dict(c.extra) == {"width": 256 if c.param_count == 1e5 else 512}


def test_tidy_table_aligns_seeds_and_drops_short_ones():
    rows = []
    for seed, steps in ((0, [10, 20, 30, 40]), (1, [15, 25, 35, 45]), (2, [10, 20])):
        for s in steps:
            rows.append({"seed": seed, "env_steps": s, "eval_return": s / 10.0, "utd": 1.0, "param_count": 1e5,
                         "env": "t", "episode_return": np.nan})
    cs = data.curves_from_table(pd.DataFrame(rows), "eval_return")
    (c,) = cs.curves
    assert c.n_seeds == 2 and c.steps[0] == 15 and c.steps[-1] == 40
    np.testing.assert_allclose(c.returns[:, 0], c.steps / 10.0)
    assert any("dropped seed" in n for n in cs.notes)


def test_missing_metric_or_columns_are_one_line_errors():
    tab = pd.DataFrame({"env_steps": [1, 2], "utd": [1, 1], "param_count": [1, 1], "eval_return": [0.0, 1.0]})
    with pytest.raises(ValueError, match="metric: 'success'"):
        data.curves_from_table(tab, "success")
    with pytest.raises(ValueError, match="lacks column"):
        data.curves_from_table(tab.drop(columns="utd"), "eval_return")


def test_parse_curve_name():
    assert data.parse_curve_name("bs_256_lr_3e-4") == {"batch_size": 256.0, "lr": 3e-4}
    assert data.parse_curve_name("bs_512_lr_0.001_tau_0.005_n_step_3") == {
        "batch_size": 512.0, "lr": 1e-3, "tau": 0.005, "n_step": 3.0}
    with pytest.raises(ValueError):
        data.parse_curve_name("batch_256")


def test_npy_layout_round_trip(tmp_path):
    cs = synthetic.make_study(synthetic.Truth(), utds=[0.5, 2.0], param_counts=[1e5, 4e5], batch_sizes=[128.0],
                              lrs=[1e-3], tasks=("dmc/walker-run",), seeds=3, n_log=20, rng=0)
    for c in cs.curves:  # model-size level w<width>p<N>/ and an extra field in the file name
        c.extra = (("width", 256.0 if c.param_count == 1e5 else 512.0), ("tau", 0.005))
    data.write_npy_dir(cs, tmp_path)
    assert (tmp_path / "w256p100000" / "utd_0.5" / "dmc/walker-run" / "eval_return" /
            "bs_128_lr_0.001_tau_0.005.npy").exists()
    back = data.load_results(tmp_path, "eval_return")
    assert len(back.curves) == 4
    for c in back.curves:
        orig = next(o for o in cs.curves if o.utd == c.utd and o.param_count == c.param_count)
        assert c.task == "dmc/walker-run" and dict(c.extra)["tau"] == 0.005
        np.testing.assert_allclose(c.returns, orig.returns)
    with pytest.raises(ValueError, match="metrics found"):
        data.load_results(tmp_path, "episode_return")
