"""Compute-optimal allocation: numerical optimum vs closed forms, budget accounting, one-axis scaling."""
import math

import numpy as np
import pytest

from scaling_rl.scaling import allocation as al

P = {"D_min": 1e5, "a": 1.5, "alpha": 1.0, "b": 3e5, "beta": 0.8}


def test_compute_and_budget():
    assert al.compute_flops(1e6, 256, 2.0, 1e5) == pytest.approx(10 * 1e6 * 256 * 2.0 * 1e5)
    assert al.budget(5e15, 1e5, 1e9) == pytest.approx(5e15 + 1e14)
    o = al.optimum_numerical(P, al.BatchModel.constant(256), 1e10)
    assert o["C"] == pytest.approx(10 * o["N"] * o["B"] * o["sigma"] * o["D"])
    assert o["F"] == pytest.approx(o["C"] + 1e10 * o["D"])


@pytest.mark.parametrize("batch", [al.BatchModel.constant(256.0), al.BatchModel.power(512.0, -0.4)])
@pytest.mark.parametrize("delta", [1e8, 1e10, 1e12])
def test_closed_form_two_term_optimum_equals_numerical(batch, delta):
    closed = al.optimum_two_term(P, batch, delta)
    num = al.optimum_numerical(P, batch, delta, two_term=True)
    assert not num["at_bound"]
    for k in ("sigma", "N", "D", "F"):
        assert num[k] == pytest.approx(closed[k], rel=1e-5), k
    # the stationarity condition behind the closed form: u/(u+δ) = αβ/((1+s)β + α)
    u = 10 * closed["N"] * closed["B"] * closed["sigma"]
    e = 1 + batch.params["s"]
    assert u / (u + delta) == pytest.approx(P["alpha"] * P["beta"] / (e * P["beta"] + P["alpha"]), rel=1e-9)


@pytest.mark.parametrize("batch", [al.BatchModel.constant(256.0), al.BatchModel.power(512.0, -0.4)])
@pytest.mark.parametrize("delta", [1e8, 1e10, 1e12])
def test_semi_analytic_full_model_optimum_equals_numerical(batch, delta):
    semi = al.optimum_semi_analytic(P, batch, delta)
    num = al.optimum(P, batch, delta)
    assert num["agree"]
    for k in ("sigma", "N", "D", "F"):
        assert num[k] == pytest.approx(semi[k], rel=1e-5), k
    # it is a minimum: F rises when σ or N moves by ±5%
    for ds, dn in ((1.05, 1), (1 / 1.05, 1), (1, 1.05), (1, 1 / 1.05)):
        s, n = semi["sigma"] * ds, semi["N"] * dn
        D = math.exp(al.log_data(P, math.log(s), math.log(n))[0])
        assert al.budget(al.compute_flops(n, batch(s, n), s, D), D, delta) > semi["F"]


def test_log_budget_gradient_with_a_sigma_n_batch_model():
    bm = al.BatchModel("sigma_n", {"a": 600.0, "alpha": 0.3, "b": 2e5, "c": 1.2})
    ls, ln = math.log(3.0), math.log(4e5)
    f, gs, gn = al.log_budget(P, bm, 1e10, ls, ln)
    h = 1e-6
    assert (al.log_budget(P, bm, 1e10, ls + h, ln)[0] - f) / h == pytest.approx(gs, rel=1e-4)
    assert (al.log_budget(P, bm, 1e10, ls, ln + h)[0] - f) / h == pytest.approx(gn, rel=1e-4)
    o = al.optimum(P, bm, 1e10)
    assert "semi_analytic" not in o and not o["at_bound"]
    with pytest.raises(ValueError, match="closed forms"):
        al.optimum_semi_analytic(P, bm, 1e10)


def test_scaling_one_axis_only_costs_more():
    batch = al.BatchModel.power(512.0, -0.4)
    easy = al.optimum(P, batch, 1e10)
    hard_p = {**P, "a": 6.0, "b": 2e6}            # a harder target needs more σ and N
    hard = al.optimum(hard_p, batch, 1e10)
    s_only = al.optimum_numerical(hard_p, batch, 1e10, fix_n=easy["N"])
    n_only = al.optimum_numerical(hard_p, batch, 1e10, fix_sigma=easy["sigma"])
    assert s_only["N"] == pytest.approx(easy["N"]) and n_only["sigma"] == pytest.approx(easy["sigma"])
    assert s_only["F"] > hard["F"] * 1.001 and n_only["F"] > hard["F"] * 1.001


def test_pareto_frontier_trades_data_for_compute():
    front = al.pareto_frontier(P, al.BatchModel.constant(256.0), np.geomspace(1e8, 1e12, 6))
    C = np.array([f["C"] for f in front])
    D = np.array([f["D"] for f in front])
    assert np.all(np.diff(C) > 0) and np.all(np.diff(D) < 0)  # dearer data -> more compute, less data


def test_sigma_only_study_optimum():
    p = {"D_min": 2e5, "beta": 3e5, "alpha": 0.9}
    o = al.optimum_sigma_only(p, al.BatchModel.constant(256.0), 1e10, N=1e6)
    grid = np.geomspace(1e-3, 1e3, 20001)
    D = p["D_min"] + (p["beta"] / grid) ** p["alpha"]
    F = 10 * 1e6 * 256 * grid * D + 1e10 * D
    assert o["sigma"] == pytest.approx(grid[np.argmin(F)], rel=2e-3)


def test_semi_analytic_survives_a_flat_model_size_exponent():
    """β ≈ 0.1 (as fitted on the quickstart sweep) sends log N far out at the root bracket's ends;
    the stationarity equation must not overflow there (it did: math.exp(log δ − log u) > 1e308)."""
    flat = {"D_min": 100.0, "a": 28.7, "alpha": 0.88, "b": 6.9e10, "beta": 0.115}
    batch = al.BatchModel.constant(128.0)
    semi = al.optimum_semi_analytic(flat, batch, 2.33e7)
    num = al.optimum(flat, batch, 2.33e7)
    assert math.isfinite(semi["F"]) and semi["F"] > 0
    assert num["F"] == pytest.approx(semi["F"], rel=1e-3)   # flat valley: numerical stops ~1e-4 short
