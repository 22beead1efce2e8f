"""Near-optimal regions (scaling.region) and the report's summary: the region holds the optimum even
when the law is wrong, budget laws need a real span in F, and the report leads with the answer."""
import dataclasses
import math

import numpy as np
import pytest

from scaling_rl.scaling import allocation as alloc
from scaling_rl.scaling import analysis, region, report, synthetic

LV = {"utd": [0.5, 1.0, 2.0, 4.0, 8.0], "param_count": [1e5, 1e6]}


def _cells(D, s=(0.5, 1, 2, 4, 8), n=1e5, B=100.0):
    return {"utd": np.array(s, float), "param_count": np.full(len(s), n), "batch_size": np.full(len(s), B)}, \
        np.array(D, float)


def test_cell_region_reaches_half_a_step_and_names_the_best_cell():
    cfg, D = _cells([100, 60, 40, 41, 80])
    u = alloc.FLOPS_FACTOR * 1e5 * 100 * cfg["utd"] + 1e9     # F = (10·N·B·σ + δ)·D
    r = region.cell_region(cfg, D, np.zeros((0, 5)), 1e9, LV)
    F = u * D
    assert r["best"]["sigma"] == 2.0 and r["best"]["F"] == pytest.approx(F.min())
    # within 5%: only σ = 2 (σ = 4 costs 1.2× as much), so the box is σ = 2 ± half a step in log
    assert r["5%"]["sigma"] == pytest.approx([math.sqrt(2), math.sqrt(8)])
    assert r["5%"]["N"] == pytest.approx([1e5, math.sqrt(1e5 * 1e6)])   # the lowest N is the sweep's edge
    assert [c["sigma"] for c in r["5%"]["cells"]] == [2.0]


def test_cell_region_keeps_what_the_replicates_cannot_rule_out():
    cfg, D = _cells([100, 60, 40, 41, 80], s=(0.5, 1, 2, 2.05, 8))
    rng = np.random.default_rng(0)
    boot = D * np.exp(0.1 * rng.standard_normal((200, 5)))
    r = region.cell_region(cfg, D, boot, 1e12, {"utd": [0.5, 1, 2, 2.05, 8], "param_count": [1e5]})
    cells = {c["sigma"]: c for c in r["5%"]["cells"]}
    assert set(cells) == {2.0, 2.05}                       # 2.5% apart, both near-optimal
    assert 0.05 < cells[2.05]["share"] < 1.0
    never = region.cell_region(cfg, np.full(5, np.inf), np.full((10, 5), np.inf), 1e9, LV)
    assert "skipped" in never


def test_law_region_holds_the_optimum_and_one_percent_is_inside_five():
    p = {"D_min": 1e5, "a": 2.0, "alpha": 1.0, "b": 3e5, "beta": 0.8}
    bm = alloc.BatchModel.constant(256.0)
    box = {"sigma_range": (0.25, 16.0), "n_range": (1e4, 1e8)}
    opt = alloc.optimum_numerical(p, bm, 1e9, **box)
    r = region.law_region(p, bm, 1e9, box, {})
    for k in ("1%", "5%"):
        assert r[k]["sigma"][0] <= opt["sigma"] <= r[k]["sigma"][1]
        assert r[k]["N"][0] <= opt["N"] <= r[k]["N"][1]
    assert r["5%"]["sigma"][0] <= r["1%"]["sigma"][0] and r["1%"]["sigma"][1] <= r["5%"]["sigma"][1]
    # replicates whose laws put the optimum elsewhere widen the region
    reps = [{**p, "a": p["a"] * f} for f in np.geomspace(0.3, 3, 20)]
    wide = region.law_region(p, bm, 1e9, box, {}, reps)
    assert wide["5%"]["sigma"][1] / wide["5%"]["sigma"][0] > r["5%"]["sigma"][1] / r["5%"]["sigma"][0]
    # a fixed axis is a single value
    one = region.law_region(p, bm, 1e9, box, {"fix_n": 1e6})
    assert one["5%"]["N"] == pytest.approx([1e6, 1e6])


@dataclasses.dataclass(frozen=True)
class HighUTDDegradation(synthetic.Truth):
    """D_J gets worse beyond σ ≈ 4 (~12% at σ = 16 vs 8): high-UTD overfitting, outside the law family."""

    def D(self, J, sigma, N, task_index: int = 0):
        s = np.asarray(sigma, float)
        return super().D(J, sigma, N, task_index) * (1 + 0.06 * np.maximum(0.0, np.log2(s / 4)) ** 2)


def _true_optimum(truth, J, delta, B, utds, ns):
    S, Nn = np.meshgrid(np.geomspace(min(utds), max(utds), 161), np.geomspace(min(ns), max(ns), 161))
    F = (alloc.FLOPS_FACTOR * Nn * B * S + delta) * truth.D(J, S, Nn)
    k = np.unravel_index(np.argmin(F), F.shape)
    return S[k], Nn[k]


@pytest.fixture(scope="module")
def misspecified():
    truth = HighUTDDegradation()
    utds, ns = (0.5, 1, 2, 4, 8, 16), (1e5, 3e5, 1e6, 3e6)
    cs = synthetic.make_study(truth, utds=utds, param_counts=ns, seeds=5, n_log=60, log_spaced=True, noise=0.05,
                              rng=7)
    st = analysis.Settings(n_bootstrap=30, thresholds=[0.5], normalize="none", max_starts=4, delta=3e8)
    return truth, utds, ns, report.jsonable(analysis.analyze(cs, st))


def test_region_holds_the_true_optimum_of_a_law_the_family_cannot_represent(misspecified):
    truth, utds, ns, fit = misspecified
    row = fit["allocation"]["per_threshold"][0]
    s_true, n_true = _true_optimum(truth, 0.5, 3e8, 1.0, utds, ns)   # no batch size swept: B = 1
    reg = row["region"]["5%"]
    assert reg["sigma"][0] <= s_true <= reg["sigma"][1], (s_true, reg)
    assert reg["N"][0] <= n_true <= reg["N"][1], (n_true, reg)
    assert row["region"]["cells"]["5%"]["sigma"][0] <= s_true <= row["region"]["cells"]["5%"]["sigma"][1]
    # the true budget at the region's worst corner is within a few % of the optimum: the region is not "everything"
    F = lambda s, n: (alloc.FLOPS_FACTOR * n * s + 3e8) * truth.D(0.5, s, n)   # noqa: E731
    corners = [F(s, n) for s in reg["sigma"] for n in reg["N"]]
    assert max(corners) / F(s_true, n_true) < 1.5


def test_report_leads_with_a_short_summary(misspecified):
    *_, fit = misspecified
    text = report.render_report(fit)
    head = text.split("## Details")[0]
    bullets = [ln for ln in head.splitlines() if ln.startswith("- ")]
    assert text.startswith("# Scaling-law fit") and "## Summary" in head
    assert 4 <= len(bullets) <= 10, bullets
    assert "within 5% of the least budget" in head and "δ = 3e+08 FLOPs per env step (given)" in head
    assert "δ×0.1" in head and "δ×10" in head and "10× the budget" in head
    assert "### Near-optimal regions" in text
    # one threshold: no budget law (a law needs optima over >= 3× in F), said so
    laws = fit["allocation"]["power_laws"]
    assert laws and all("skipped" in p for p in laws)


def test_summary_says_when_delta_was_assumed(misspecified):
    *_, fit = misspecified
    fit = {**fit, "allocation": {**fit["allocation"], "delta_source": "median FLOPs per env step"}}
    assert "**assumed**" in report.summary_lines(fit)[2] and "--delta" in report.summary_lines(fit)[2]


def test_budget_laws_need_a_span_in_f():
    rows = [{"F": f, "D": f / 10, "C": f / 2, "sigma": 2.0, "N": 1e5, "edge": {}, "free": {"sigma": True, "N": True},
             "scope": "s", "_samples": []} for f in (1e12, 1.5e12, 2e12)]
    from scaling_rl.scaling.allocation_fits import _budget_laws
    from scaling_rl.scaling.lawfit import Replicates
    out = _budget_laws("t", rows, Replicates(0, 0, 5, 0.9), analysis.Settings(), [])
    assert all("only ×2 in F" in p["skipped"] for p in out), out
