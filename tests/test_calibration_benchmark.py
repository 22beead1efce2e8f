"""The machinery of benchmarks/calibration.py (tiny: the coverage numbers themselves come from the benchmark)."""
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from scaling_rl.scaling import synthetic

_spec = importlib.util.spec_from_file_location(
    "calibration", Path(__file__).resolve().parents[1] / "benchmarks" / "calibration.py")
cal = importlib.util.module_from_spec(_spec)
sys.modules["calibration"] = cal   # its dataclasses look their module up
_spec.loader.exec_module(cal)


def test_generators_differ_as_documented():
    base = cal.make_curves(cal.GEN["base"], 3, 0)
    assert len(base.curves) == 20 and {c.n_seeds for c in base.curves} == {3}
    tied = cal.make_curves(cal.GEN["tied-B"], 3, 0)
    assert len(tied.curves) == 80 and len({c.batch_size for c in tied.curves}) == 4
    uneq = cal.make_curves(cal.GEN["unequal"], 3, 0)
    assert {c.n_seeds for c in uneq.curves} <= set(range(3, 7)) and len({c.n_seeds for c in uneq.curves}) > 1
    assert len(cal.make_curves(cal.GEN["coarse"], 3, 0).curves[0].steps) == 12
    cens = cal.make_curves(cal.GEN["censored"], 3, 0)
    reached = [np.max(c.returns.mean(axis=1)) >= 0.5 for c in cens.curves]
    assert 0 < sum(reached) < len(reached)        # some cells never reach J = 0.5, others do
    # the truth's D_J of a cell's best configuration: tied sizes cost nothing, peaked ones do
    assert cal.true_D(cal.GEN["tied-B"], 0.5, 1.0, 1e5) == pytest.approx(synthetic.Truth().D(0.5, 1.0, 1e5))
    assert cal.true_D(cal.GEN["peaked-B"], 0.5, 2.0, 1e5) > 1.01 * synthetic.Truth().D(0.5, 2.0, 1e5)  # B* = 388
    it = cal.InteractionTruth()
    assert it.D(0.5, 1.0, 1e6) / synthetic.Truth().D(0.5, 1.0, 1e6) > it.D(0.5, 1.0, 1e5) / synthetic.Truth().D(0.5, 1.0, 1e5)


def test_reference_is_the_truth_inside_the_family_and_drops_vanishing_terms_outside():
    ref = cal.reference("base")
    p = synthetic.Truth().params(0.5)
    for k in cal.LAW_PARAMS:
        assert ref[k] == pytest.approx(p[k], rel=1e-6)
    assert 0.5 < ref["sigma*"] < 8 and 1e5 < ref["N*"] < 3e6
    inter = cal.reference("interaction")
    assert inter["b"] is None and inter["beta"] is None and inter["rse_log"] > 0.05


def test_summary_counts_hits_withheld_and_a_binomial_interval_over_studies():
    rows = []
    for study in range(20):
        for q, status in (("alpha", "hit" if study < 17 else "miss"), ("sigma*", "withheld")):
            rows.append({"generator": "g", "seeds": 5, "study": study, "quantity": q, "status": status,
                         "reason": "optimum on the box edge" if status == "withheld" else ""})
    tab = cal.summarize(pd.DataFrame(rows)).set_index("quantity")
    a = tab.loc["alpha"]
    assert a["coverage"] == pytest.approx(0.85) and a["studies"] == 20 and a["withheld"] == 0
    assert a["lo"] == pytest.approx(0.6396, abs=1e-3) and a["hi"] == pytest.approx(0.9476, abs=1e-3)  # Wilson 17/20
    s = tab.loc["sigma*"]
    assert s["intervals"] == 0 and s["withheld"] == 20 and s["why"] == "optimum on the box edge"


def test_one_study_checks_every_printed_interval_and_the_cli_rejects_bad_input(tmp_path, capsys):
    gen = cal.GEN["base"]
    rows = pd.DataFrame(cal.one_study(("base", 4, 0, 20, cal.reference("base"))))
    dj = rows[rows["quantity"] == "D_J"]
    assert len(dj) == 40 and set(rows["status"]) <= {"hit", "miss", "withheld", "no-target"}
    r = dj.iloc[0]
    assert r["target"] == pytest.approx(cal.true_D(gen, 0.3, cal.UTDS[0], cal.PARAMS[0]))
    printed = dj[dj["status"].isin(["hit", "miss"])]
    inside = (printed["lo"] <= printed["target"]) & (printed["target"] <= printed["hi"])
    assert ((printed["status"] == "hit") == inside).all() and len(printed) > 30
    assert set(rows["quantity"]) == {"D_J", *cal.LAW_PARAMS, "sigma*", "N*", "region 1%", "region 5%"}
    reg = rows[rows["quantity"].str.startswith("region")]
    assert len(reg) == 2 and set(reg["status"]) <= {"hit", "miss", "withheld"}
    assert cal.main(["--from-cache", "--out", str(tmp_path / "none.csv")]) == 2
    assert cal.main(["--generators", "nope", "--out", str(tmp_path / "x.csv")]) == 2
    assert "unknown generator" in capsys.readouterr().err


def test_a_run_over_some_generators_keeps_the_cached_rows_of_the_others(tmp_path):
    """`--resume --generators X` (and a plain run over a subset) used to rewrite the cache with X's rows only,
    deleting every other generator's results: now a run replaces only the generator × seeds it computes."""
    out = tmp_path / "cal.csv"
    other = pd.DataFrame([{"generator": "tied-B", "seeds": 5, "study": i, "quantity": "alpha", "cell": "",
                           "target": 1.0, "estimate": 1.0, "lo": 0.9, "hi": 1.1, "status": "hit", "reason": ""}
                          for i in range(3)])
    out.write_text(other.to_csv(index=False))
    common = ["--points-only", "--generators", "base", "--seeds", "4", "--bootstrap", "10", "--out", str(out)]
    assert cal.main(["--resume", "--studies", "1", *common]) == 0
    raw = cal.read_cache(out)
    assert (raw["generator"] == "tied-B").sum() == 3          # kept (was: dropped)
    base = raw[raw["generator"] == "base"]
    assert set(base["study"]) == {0} and len(base) == 40 and set(base["quantity"]) == {"D_J"}
    first = base.reset_index(drop=True)
    assert cal.main(["--resume", "--studies", "2", *common]) == 0          # study 0 is not run again
    raw = cal.read_cache(out)
    assert (raw["generator"] == "tied-B").sum() == 3
    pd.testing.assert_frame_equal(raw[(raw["generator"] == "base") & (raw["study"] == 0)].reset_index(drop=True), first)
    assert set(raw.loc[raw["generator"] == "base", "study"]) == {0, 1}
    assert cal.main(["--studies", "1", *common]) == 0                     # a plain run replaces base × 4 only
    raw = cal.read_cache(out)
    assert (raw["generator"] == "tied-B").sum() == 3 and set(raw.loc[raw["generator"] == "base", "study"]) == {0}
    assert "median (hi−lo)/estimate" in out.with_suffix(".md").read_text()


def test_misspecified_generators_degrade_where_the_law_cannot():
    mid = np.sqrt(cal.PARAMS[0] * cal.PARAMS[-1])
    hu, law = cal.HighUTDTruth(), synthetic.Truth()
    assert cal.GEN["high-UTD"].utds[-1] == pytest.approx(16.0) and len(cal.GEN["high-UTD"].utds) == 6
    assert hu.D(0.5, 16.0, mid) / hu.D(0.5, 8.0, mid) == pytest.approx(1.05, abs=0.003)   # 5% worse at σ = 16
    assert law.D(0.5, 16.0, mid) / law.D(0.5, 8.0, mid) < 0.91                          # the family keeps falling
    assert hu.D(0.3, 4.0, mid) == pytest.approx(law.D(0.3, 4.0, mid))                    # untouched up to σ = 4
    ln, = [cal.LargeNTruth()]
    assert ln.D(0.5, 2.0, 3e6) / ln.D(0.5, 2.0, 1e6) == pytest.approx(1.017, abs=0.003)
    assert law.D(0.5, 2.0, 3e6) / law.D(0.5, 2.0, 1e6) < 0.92
    assert len(cal.make_curves(cal.GEN["high-UTD"], 3, 0).curves) == 24


def test_misspecified_targets_are_the_truths_own_compute_optimum():
    # in the family the numerical argmin of (10·N·B·σ + δ)·D is the allocation module's optimum
    base = cal.GEN["base"]
    o = cal.true_optimum(base, 0.5)
    p = synthetic.Truth().params(0.5)
    want = cal.alloc.optimum(p, cal.true_batch_model(base), base.delta, sigma_range=(0.5, 8), n_range=(1e5, 3e6))
    assert o["inside"] and o["sigma"] == pytest.approx(want["sigma"], rel=2e-3) and o["N"] == pytest.approx(want["N"], rel=2e-3)
    # outside it the target is the truth's optimum, not the best-fitting law's (σ 2.54 vs 2.18 for high-UTD)
    gen = cal.GEN["high-UTD"]
    ref = cal.reference("high-UTD")
    t = cal.true_optimum(gen, 0.5)
    assert ref["sigma*"] == pytest.approx(t["sigma"]) and ref["N*"] == pytest.approx(t["N"])
    lp = {k: ref[k] for k in cal.LAW_PARAMS}
    approx = cal.alloc.optimum(lp, cal.true_batch_model(gen), gen.delta, sigma_range=(0.5, 16), n_range=(1e5, 3e6))
    assert approx["sigma"] < 0.9 * t["sigma"]
    assert 1e5 < cal.reference("large-N")["N*"] < 3e6


def test_region_rows_score_the_printed_box_against_the_true_optimum():
    ref = {"sigma*": 2.0, "N*": 3e5}
    box = lambda s, n: {"sigma": s, "N": n, "from": "law+cells"}
    opt = {"region": {"1%": box([1.5, 2.5], [2e5, 2.9e5]), "5%": box([1.0, 4.0], [1e5, 1e6])}}
    rows = {r["quantity"]: r for r in cal.region_rows("g", 5, 0, opt, ref)}
    assert rows["region 5%"]["status"] == "hit" and rows["region 1%"]["status"] == "miss"   # N* outside the 1% box
    assert (rows["region 5%"]["lo"], rows["region 5%"]["hi"]) == (1.0, 4.0)
    absent = cal.region_rows("g", 5, 0, {"intervals": {}}, ref)
    assert {r["status"] for r in absent} == {"withheld"} and absent[0]["reason"] == cal.NO_REGION
    partial = cal.region_rows("g", 5, 0, {"region": {"5%": box([1.0, 4.0], [1e5, 1e6])}}, ref)
    assert partial[0]["status"] == "withheld" and "1%" in partial[0]["reason"] and partial[1]["status"] == "hit"
    tab = cal.summarize(pd.DataFrame([r | {"study": i} for i in range(4) for r in cal.region_rows("g", 5, 0, opt, ref)]))
    assert tab.set_index("quantity").loc["region 5%", "coverage"] == 1.0


def test_layers_rescale_the_printed_interval_exactly():
    """Target 0.75 of the half-width from the estimate on an interval inflated 2× (of which 1.25× lack of fit):
    printed a hit, without the widening (half-width × 0.8) still a hit, bare (× 0.5) a miss."""
    row = {"generator": "g", "seeds": 5, "study": 0, "quantity": "alpha", "cell": "", "estimate": 1.0,
           "lo": 0.8, "hi": 1.2, "target": 1.15, "status": "hit", "reason": "", "inflation": 2.0, "widen_lof": 1.25,
           "log_scale": False}
    lay = cal.layers(pd.DataFrame([row]))
    cov = lay["coverage"].iloc[0]
    assert cov["printed"] == 1.0 and cov["no lack-of-fit widening"] == 1.0 and cov["no inflation"] == 0.0
    rz = lay["rms_z"].iloc[0]
    assert rz["printed"] == pytest.approx(0.75 * 1.6449, rel=1e-3) and rz["no inflation"] == pytest.approx(1.5 * 1.6449, rel=1e-3)
    far = dict(row, target=1.19)     # 0.95 of the half-width: a hit printed, a miss at 1/1.25 = 0.8 of it
    cov2 = cal.layers(pd.DataFrame([far]))["coverage"].iloc[0]
    assert cov2["printed"] == 1.0 and cov2["no lack-of-fit widening"] == 0.0
