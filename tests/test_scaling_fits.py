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
def test_replicates_are_fitted_exactly_like_the_point_estimate(loss):
    """`fit_many` on K data sets gives what `fit` gives on each one alone (one estimator), on friendly
    data and on a badly identified set (N spanning a factor 3 with no N effect); a set with too few
    observed points is a counted failure, not a silent NaN."""
    x = _grid(np.geomspace(0.25, 16, 4), np.geomspace(3e4, 1e7, 4))
    truth = {"D_min": 1e5, "a": 2.0, "alpha": 0.8, "b": 1e6, "beta": 0.6}
    ly = np.log(laws.DATA_EFFICIENCY_SIGMA_N.predict(x, truth))
    rng = np.random.default_rng(0)
    prob = fitting.make_problem(laws.DATA_EFFICIENCY_SIGMA_N, x, ly)
    Y = ly + 0.03 * rng.standard_normal((6, 16))
    W = np.ones_like(Y)
    W[0, :3] = 0.0             # censored points left out
    W[1, 5:] = 0.0             # 5 points for 5 parameters: too few
    bf = fitting.fit_many(prob, Y, W, loss=loss, huber_delta=0.03)
    assert list(bf.status) == ["too_few_points" if k == 1 else "ok" for k in range(6)]
    assert np.all(np.isnan(bf.U[1]))
    for k in (0, 2, 3, 4, 5):
        alone = fitting.fit(prob, Y[k], W[k], loss=loss, huber_delta=0.03)
        assert bf.objective[k] == pytest.approx(alone.objective, rel=1e-9, abs=1e-12)
        np.testing.assert_allclose(bf.U[k], alone.u, atol=1e-6)
    # badly identified: no N effect, N over a factor 3
    xb = _grid(np.geomspace(0.25, 16, 4), [1e5, 1.7e5, 3e5])
    lyb = np.log(laws.DATA_EFFICIENCY_SIGMA.predict({"utd": xb["utd"]}, {"D_min": 1e5, "beta": 3e5, "alpha": 0.9}))
    pb = fitting.make_problem(laws.DATA_EFFICIENCY_SIGMA_N, xb, lyb)
    Yb = lyb + 0.02 * rng.standard_normal((4, 12))
    bfb = fitting.fit_many(pb, Yb, loss=loss, huber_delta=0.03)
    for k in range(4):
        alone = fitting.fit(pb, Yb[k], loss=loss, huber_delta=0.03)
        assert bfb.objective[k] == pytest.approx(alone.objective, rel=1e-9, abs=1e-12)
    with pytest.raises(ValueError, match="could not be fitted"):
        fitting.fit(prob, ly[:16] * 1.0, np.r_[np.ones(5), np.zeros(11)])


@pytest.mark.parametrize("K", [40, 100])
def test_percentile_interval_of_K_replicates_holds_its_level_of_the_bootstrap_distribution(K):
    """The interval's ends are quantiles of K replicates at plotting positions i/(K+1) (unbiased for the
    bootstrap distribution's quantiles): on average it holds 90% of that distribution. Linear
    interpolation (positions (i−1)/(K−1)) held 0.856 at K = 40 and 0.882 at K = 100."""
    from scipy import stats
    r = np.random.default_rng(K)
    held = []
    for _ in range(3000):
        reps = r.standard_normal(K)
        reps -= np.median(reps)              # centred on the estimate: the percentile interval
        iv = fitting.interval(0.0, reps, level=0.9, log=False)
        assert iv["method"] == "percentile"
        held.append(stats.norm.cdf(iv["hi"]) - stats.norm.cdf(iv["lo"]))
    assert abs(np.mean(held) - 0.9) < 0.01, np.mean(held)


def _law_lean(n_studies: int = 12, K: int = 48) -> dict:
    """Slopes, over studies, on (truth − estimate) of (median replicate − estimate) and of (interval midpoint −
    estimate), in log for D_min and as is for α, β of the D(σ, N) law at J = 0.5 (make_study: 5 σ × 4 N,
    3 seeds, 120 log points), fitted on `fit_data`'s seed resamples."""
    truth, J = synthetic.Truth(), 0.5
    tp = truth.params(J)
    rows: dict = {"replicates": [], "interval": []}
    tf = {"D_min": np.log, "alpha": float, "beta": float}
    for s in range(n_studies):
        cs = synthetic.make_study(truth, seeds=3, noise=0.05, obs_noise=0.01, n_log=120, log_spaced=True, rng=100 + s)
        de = data_efficiency(cs, thresholds=[J], normalize="none", n_bootstrap=K, seed=s)
        idx, y, Y = de.fit_data(0)
        x = {"utd": de.groups["utd"].to_numpy(float)[idx], "param_count": de.groups["param_count"].to_numpy(float)[idx]}
        st = analysis.Settings(n_bootstrap=K, max_starts=2)
        reps = analysis.Replicates(K, 0, 3, st.level, None, 40)
        f = analysis.fit_with_bootstrap(laws.DATA_EFFICIENCY_SIGMA_N, x, y, Y, st, reps, "D", seeds=np.full(len(y), 3.0))
        p, U, iv = f.params(), [q for q in f.replicate_params() if q], f.intervals()
        rows["replicates"].append([(tf[k](p[k]), np.median([tf[k](q[k]) for q in U]), tf[k](tp[k])) for k in tf])
        rows["interval"].append([(tf[k](p[k]), 0.5 * (tf[k](iv[k]["lo"]) + tf[k](iv[k]["hi"])), tf[k](tp[k]))
                                 for k in tf])
    out = {}
    for name, v in rows.items():
        a = np.array(v)                                   # (studies, params, [estimate, centre, truth])
        out[name] = float(np.mean([np.polyfit(a[:, i, 2] - a[:, i, 0], a[:, i, 1] - a[:, i, 0], 1)[0]
                                   for i in range(a.shape[1])]))
    return out


def test_law_replicates_lean_toward_the_truth_and_the_intervals_do_not():
    """A point's D_J is the crossing of its isotonic seed-mean curve; with 3 seeds the centre of its log
    replicates sits off the point by ~0.1 × the point's own error (toward the truth), and a law fit adds the
    cells up, so the law's replicates lean toward the truth: BCa read that as bias and moved the intervals
    away (budget-law exponents covered 0.81-0.88). `fitting.interval` now centres every quantity's replicates
    on its estimate (median, in log) before taking percentiles, so the printed interval does not follow the
    lean. Measured here (12 studies): replicates ~0.10, interval midpoints ~0."""
    lean = _law_lean()
    assert lean["replicates"] > 0.05, lean      # the defect is there in the resamples (this generator too)
    assert abs(lean["interval"]) < 0.04, lean
