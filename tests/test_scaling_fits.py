"""Fits: gradients, recovery of a known truth, robust loss, shared exponents, batched refits, and
calibration of the bootstrap intervals."""
import math

import numpy as np
import pytest

from scaling_rl.scaling import analysis, fitting, laws, synthetic
from scaling_rl.scaling.curves import data_efficiency


def _grid(us, ns):
    s, n = np.meshgrid(us, ns)
    return {"utd": s.ravel(), "param_count": n.ravel()}


@pytest.mark.parametrize("law,x,theta", [
    (laws.DATA_EFFICIENCY_SIGMA, {"utd": np.geomspace(0.25, 16, 7)}, {"D_min": 2e5, "beta": 3e5, "alpha": 0.9}),
    (laws.DATA_EFFICIENCY_SIGMA_N, _grid([0.5, 2, 8], [1e5, 1e6, 1e7]),
     {"D_min": 1e5, "a": 2.0, "alpha": 0.8, "b": 1e6, "beta": 0.6}),
    (laws.BATCH_SIZE_SIGMA_N, _grid([0.5, 2, 8], [1e5, 1e6, 1e7]), {"a": 500.0, "alpha": 0.4, "b": 3e5, "c": 1.5}),
    (laws.BATCH_SIZE_SIGMA, {"utd": np.geomspace(0.25, 16, 5)}, {"A": 500.0, "s": -0.4}),
])
def test_analytic_jacobian_matches_finite_differences(law, x, theta):
    ly = np.log(law.predict(x, theta))
    prob = fitting.make_problem(law, x, ly)
    u = prob.unconstrained(np.array([theta[n] for n in prob.labels])) + 0.05
    r, J = prob.residual_jacobian(u[None], ly[None])
    for j in range(prob.n_params):
        du = np.zeros_like(u)
        du[j] = 1e-6
        r2, _ = prob.residual_jacobian((u + du)[None], ly[None])
        np.testing.assert_allclose((r2 - r)[0] / 1e-6, J[0, :, j], rtol=1e-4, atol=1e-6)


def test_noiseless_laws_are_recovered_exactly():
    x = _grid(np.geomspace(0.25, 16, 5), np.geomspace(3e4, 1e7, 5))
    truth = {"D_min": 1e5, "a": 2.0, "alpha": 0.8, "b": 1e6, "beta": 0.6}
    ly = np.log(laws.DATA_EFFICIENCY_SIGMA_N.predict(x, truth))
    f = fitting.fit(fitting.make_problem(laws.DATA_EFFICIENCY_SIGMA_N, x, ly), ly)
    for k, v in truth.items():
        assert f.params[k] == pytest.approx(v, rel=1e-5)
    assert f.r2 == pytest.approx(1.0, abs=1e-10)
    xs = {"utd": np.geomspace(0.25, 16, 6)}
    t1 = {"D_min": 3e5, "beta": 5e6, "alpha": 0.7}
    ly1 = np.log(laws.DATA_EFFICIENCY_SIGMA.predict(xs, t1))
    f1 = fitting.fit(fitting.make_problem(laws.DATA_EFFICIENCY_SIGMA, xs, ly1), ly1)
    for k, v in t1.items():
        assert f1.params[k] == pytest.approx(v, rel=1e-4)


def test_recovers_ground_truth_from_noisy_curves_within_5_percent():
    """Curves from a known D_J(σ, N), seeds with 5% (log-normal) noise in data efficiency plus
    return noise; the whole pipeline (isotonic, crossing, best config, multi-start fit) recovers
    every parameter within 5%. With this design (9 × 9 grid over 2.4 decades of σ and 4.5 of N, 24
    seeds, log-spaced logging) the least determined parameters (a, b) scatter by ~1.5% across noise
    draws (largest of 10 draws: 3.2%), so 5% is ~3 sd."""
    truth = synthetic.Truth()
    J = 0.5
    cs = synthetic.make_study(truth, utds=np.geomspace(0.125, 32, 9), param_counts=np.geomspace(1e3, 3e7, 9),
                              seeds=24, noise=0.05, obs_noise=0.01, log_spaced=True, rng=0)
    de = data_efficiency(cs, thresholds=[J], normalize="none", n_bootstrap=1)
    idx, y, _ = de.fit_data(0)
    assert len(idx) == 81
    x = {"utd": de.groups["utd"].to_numpy()[idx], "param_count": de.groups["param_count"].to_numpy()[idx]}
    ly = np.log(y)
    f = fitting.fit(fitting.make_problem(laws.DATA_EFFICIENCY_SIGMA_N, x, ly), ly)
    for k, v in truth.params(J).items():
        assert f.params[k] == pytest.approx(v, rel=0.05), k
    assert f.r2 > 0.99


def test_huber_resists_an_outlier_that_squared_loss_does_not():
    x = _grid(np.geomspace(0.25, 16, 5), np.geomspace(3e4, 1e7, 5))
    truth = {"D_min": 1e5, "a": 2.0, "alpha": 0.8, "b": 1e6, "beta": 0.6}
    ly = np.log(laws.DATA_EFFICIENCY_SIGMA_N.predict(x, truth))
    ly += 0.01 * np.random.default_rng(0).standard_normal(ly.size)
    ly[12] += np.log(3.0)  # one run three times slower than the law says
    prob = fitting.make_problem(laws.DATA_EFFICIENCY_SIGMA_N, x, ly)
    sq = fitting.fit(prob, ly, loss="squared")
    hu = fitting.fit(prob, ly, loss="huber", huber_delta=0.05)
    err = lambda f: max(abs(math.log(f.params[k] / v)) for k, v in truth.items())  # noqa: E731
    assert err(hu) < 0.1 < err(sq)
    assert abs(hu.residuals[12]) > 0.9  # the outlier is left as a residual, not fitted


def test_sum_reduction_and_log_r2():
    x = {"utd": np.array([1.0, 2.0, 4.0, 8.0])}
    ly = np.log([10.0, 6.0, 3.0, 2.0])
    prob = fitting.make_problem(laws.BATCH_SIZE_SIGMA, x, ly)
    u = np.array([math.log(10.0), -0.7])
    r = prob.predict(u[None])[0] - ly
    assert prob.objective(u[None], ly[None], np.ones((1, 4)))[0] == pytest.approx(0.5 * np.sum(r ** 2))
    f = fitting.fit(prob, ly)
    ss_res = np.sum(f.residuals ** 2)
    assert f.r2 == pytest.approx(1 - ss_res / np.sum((ly - ly.mean()) ** 2))


def test_shared_slope_with_per_task_intercepts():
    s = np.tile(np.geomspace(0.25, 16, 6), 3)
    tasks = np.repeat(["a", "b", "c"], 6)
    A = {"a": 300.0, "b": 800.0, "c": 120.0}
    y = np.array([A[t] for t in tasks]) * s ** -0.4 * np.exp(0.02 * np.random.default_rng(1).standard_normal(18))
    prob = fitting.make_problem(laws.BATCH_SIZE_SIGMA, {"utd": s}, np.log(y), groups=tasks, shared=("s",))
    assert prob.labels == ["A[a]", "A[b]", "A[c]", "s"]
    f = fitting.fit(prob, np.log(y))
    assert f.params["s"] == pytest.approx(-0.4, abs=0.03)
    for t, v in A.items():
        assert f.params[f"A[{t}]"] == pytest.approx(v, rel=0.05)


def test_shared_exponents_across_tasks():
    x1 = _grid(np.geomspace(0.25, 16, 5), np.geomspace(3e4, 1e7, 5))
    x = {k: np.concatenate([v, v]) for k, v in x1.items()}
    tasks = np.repeat(["hop", "walk"], 25)
    t_hop = {"D_min": 1e5, "a": 2.0, "alpha": 0.8, "b": 1e6, "beta": 0.6}
    t_walk = {**t_hop, "D_min": 3e5, "a": 1.0, "b": 3e5}
    ly = np.log(np.concatenate([laws.DATA_EFFICIENCY_SIGMA_N.predict(x1, t_hop),
                                laws.DATA_EFFICIENCY_SIGMA_N.predict(x1, t_walk)]))
    prob = fitting.make_problem(laws.DATA_EFFICIENCY_SIGMA_N, x, ly, groups=tasks, shared=("alpha", "beta"))
    f = fitting.fit(prob, ly)
    assert f.params["alpha"] == pytest.approx(0.8, rel=1e-4)
    assert f.params["b[walk]"] == pytest.approx(3e5, rel=1e-4)


@pytest.mark.parametrize("loss", ["squared", "huber"])
def test_batched_refits_match_warm_started_lbfgsb(loss):
    x = _grid(np.geomspace(0.25, 16, 4), np.geomspace(3e4, 1e7, 4))
    truth = {"D_min": 1e5, "a": 2.0, "alpha": 0.8, "b": 1e6, "beta": 0.6}
    ly = np.log(laws.DATA_EFFICIENCY_SIGMA_N.predict(x, truth))
    rng = np.random.default_rng(0)
    prob = fitting.make_problem(laws.DATA_EFFICIENCY_SIGMA_N, x, ly)
    f = fitting.fit(prob, ly + 0.03 * rng.standard_normal(16), loss=loss, huber_delta=0.03)
    Y = ly + 0.03 * rng.standard_normal((12, 16))
    W = np.ones_like(Y)
    W[0, :3] = 0.0  # a sample with censored points left out
    U, obj, ok = fitting.refit_batched(prob, f.u, Y, W, loss=loss, huber_delta=0.03)
    ref = fitting.refit_sequential(prob, f.u, Y, W, loss=loss, huber_delta=0.03)
    assert ok.all()
    ref_obj = np.array([prob.objective(r[None], y[None], w[None], loss, 0.03)[0] for r, y, w in zip(ref, Y, W)])
    assert np.all(obj <= ref_obj * (1 + 1e-6) + 1e-12)
    np.testing.assert_allclose(U, ref, atol=2e-3)


def test_bootstrap_intervals_cover_the_truth():
    """Calibration: over 40 independent synthetic studies (5 × 5 grid of (σ, N), 5 seeds, 5% seed
    noise), the 90% intervals of the 5 parameters of D_J(σ, N) must cover the truth in >= 85% of the
    200 (study, parameter) cases, every parameter in >= 75% of its 40; the 50% intervals must cover
    in 30-70% (so wide, uninformative intervals fail too).

    Tolerance: at a true 90%, 200 cases have a binomial sd of ~2.1% (85% is ~2.4 sd below); 40 cases
    per parameter have ~4.7% (75% is ~3 sd below); 100 studies measured 92.8% pooled. Logging is
    log-spaced so every crossing is finely resolved: with 200 evenly spaced log points the fastest
    runs cross within 1-2 log intervals, their D_J is off by up to 2% (linear interpolation) or 0.5%
    (log-step interpolation), a bias the seed bootstrap cannot see, and this test fails (82-85%
    pooled, 71-77% for D_min) — the report flags such coarsely resolved points."""
    truth = synthetic.Truth()
    J = 0.5
    th = truth.params(J)
    st = analysis.Settings(max_starts=2)
    cover90, cover50, widths = [], [], []
    for trial in range(40):
        cs = synthetic.make_study(truth, utds=np.geomspace(0.25, 16, 5), param_counts=np.geomspace(3e4, 1e7, 5),
                                  seeds=5, noise=0.05, obs_noise=0.01, log_spaced=True, rng=1000 + trial)
        de = data_efficiency(cs, thresholds=[J], normalize="none", n_bootstrap=100, seed=trial)
        x = {"utd": de.groups["utd"].to_numpy(), "param_count": de.groups["param_count"].to_numpy()}
        infl = fitting.small_sample_inflation(de.min_seeds)
        fitted = analysis.fit_with_bootstrap(laws.DATA_EFFICIENCY_SIGMA_N, x, de.g_point[:, 0], de.g_boot[:, :, 0],
                                             st, infl)
        iv90 = fitted.intervals()
        iv50 = fitting.bootstrap_intervals(fitted.problem, fitted.fit.u, fitted.U, 0.5, infl)
        cover90.append([iv90[k]["lo"] <= th[k] <= iv90[k]["hi"] for k in fitted.problem.labels])
        cover50.append([iv50[k]["lo"] <= th[k] <= iv50[k]["hi"] for k in fitted.problem.labels])
        widths.append([math.log(iv90[k]["hi"] / iv90[k]["lo"]) for k in fitted.problem.labels])
    cover90, cover50 = np.array(cover90), np.array(cover50)
    assert cover90.mean() >= 0.85, cover90.mean(axis=0)
    assert cover90.mean(axis=0).min() >= 0.75, cover90.mean(axis=0)
    assert 0.3 <= cover50.mean() <= 0.7, cover50.mean(axis=0)
    assert np.median(widths) < 0.5  # intervals are informative (< ±25% for a typical parameter)
