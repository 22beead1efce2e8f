"""Pooled-task mode (`scaling-rl fit --pool-tasks`): tasks differing by a scale share one law after each task's
D_J is divided by its median; σ*(F) across thresholds with intervals."""
import json
import shutil

import numpy as np
import pytest

from scaling_rl.cli import main
from scaling_rl.scaling import data, fitting, laws, report, synthetic
from scaling_rl.scaling.analysis import Settings
from scaling_rl.scaling.pooled import pooled_fit

TASKS = ("t0", "t1", "t2")   # synthetic.Truth.task_scale: D_J × 1.0, 1.7, 0.6
KW = dict(utds=np.geomspace(0.5, 8, 4), param_counts=np.geomspace(1e5, 3e6, 3), tasks=TASKS, seeds=4, n_log=60,
          log_spaced=True, rng=3)
ST = dict(n_bootstrap=30, thresholds=[0.3, 0.45, 0.6], normalize="none", max_starts=4, delta=1.1e7)


@pytest.fixture(scope="module")
def pooled():
    return report.jsonable(pooled_fit(synthetic.make_study(synthetic.Truth(), **KW), Settings(**ST)))


def test_pooled_law_removes_task_scales_and_recovers_the_shared_exponents(pooled):
    truth = synthetic.Truth()
    assert [r["j_index"] for r in pooled["per_threshold"]] == [0, 1, 2] and not pooled["skipped"]
    for r in pooled["per_threshold"]:
        m = r["medians"]
        # the medians carry the task scales (1.7 and 0.6 of t0's), so one law fits all three tasks
        assert m["t1"] / m["t0"] == pytest.approx(1.7, rel=0.05) and m["t2"] / m["t0"] == pytest.approx(0.6, rel=0.05)
        assert r["fit"]["r2_log"] > 0.99 and r["fit"]["n_points"] == 36
        p = r["fit"]["params"]
        assert p["alpha"]["lo"] <= truth.alpha <= p["alpha"]["hi"], p["alpha"]
        assert p["alpha"]["n_ok"] == p["alpha"]["n"] == 30
        # the optimum has intervals containing it, inside the swept box
        iv = r["intervals"]["sigma"]
        assert 0.5 <= iv["lo"] <= r["optimum"]["sigma"] <= iv["hi"] <= 8
    sl = pooled["sigma_law"]
    assert sl["thresholds_used"] == [0, 1, 2] and sl["n_failed"] == 0
    e = sl["intervals"]["e"]
    assert e["lo"] < sl["e"] < e["hi"] and 0 < sl["e"] < 0.5  # σ* grows slowly with the budget


def test_pool_tasks_cli_writes_pooled_report_and_rejects_one_task(tmp_path, capsys):
    table = tmp_path / "r.parquet"
    synthetic.make_table(synthetic.Truth(), **{**KW, "seeds": 3}).to_parquet(table)
    out = tmp_path / "out"
    assert main(["fit", str(table), "--out", str(out), "--pool-tasks", "--bootstrap", "20", "--thresholds",
                 "0.3,0.5", "--normalize", "none", "--quiet"]) == 0
    res = json.loads((out / "pooled.json").read_text())
    assert res["tasks"] == list(TASKS) and len(res["per_threshold"]) == 2
    md = (out / "pooled.md").read_text()
    assert "σ*(F): not fitted (2 threshold(s)" in md and "| 0 | t0 0.3" in md
    one = tmp_path / "one.parquet"
    synthetic.make_table(synthetic.Truth(), **{**KW, "tasks": ("t0",), "seeds": 3}).to_parquet(one)
    capsys.readouterr()
    assert main(["fit", str(one), "--out", str(tmp_path / "o2"), "--pool-tasks", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "needs at least 2 tasks" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o2").exists()


# ---- one model size: a published multi-task curve directory without a w<W>p<N>/ level ----------------------------
# The pooled σ*(F) of the value-scaling paper: several tasks, one model size, σ swept, a few (B, η) per cell.
# kappa = 0: the (B, η) configurations tie, so the truth is inside the σ-only family at this N and its σ* is
# known in closed form: F(σ) = (c·σ + δ)·D_min·(K + a/σ), K = 1 + (b/N)^β, c = 10·N·B  ->  σ* = sqrt(δ·a / (c·K)).
ONE_N, DELTA, J_ONE = 1.5e5, 4e9, (0.25, 0.45, 0.65)
ONE_TRUTH = synthetic.Truth(kappa=0.0)
ONE_BS = (128.0, 256.0)


def _one_size_dir(root):
    cs = synthetic.make_study(ONE_TRUTH, utds=[0.5, 1, 2, 4, 8], param_counts=[ONE_N], batch_sizes=list(ONE_BS),
                              lrs=[3e-4], tasks=["hop", "run", "walk"], seeds=4, n_log=40, log_spaced=True, rng=5)
    data.write_npy_dir(cs, root)
    return root


def _pool(src, out, *extra):
    return main(["fit", str(src), "--out", str(out), "--pool-tasks", "--bootstrap", "20", "--normalize", "none",
                 "--thresholds", ",".join(map(str, J_ONE)), "--quiet", *extra])


@pytest.fixture(scope="module")
def one_size(tmp_path_factory):
    base = tmp_path_factory.mktemp("one_size")
    src = _one_size_dir(base / "curves")
    with_n, without_n = base / "with_n", base / "without_n"
    rc = (_pool(src, with_n, "--param-count", f"{ONE_N:g}", "--delta", f"{DELTA:g}"), _pool(src, without_n))
    return src, rc, json.loads((with_n / "pooled.json").read_text()), json.loads((without_n / "pooled.json").read_text()), \
        (with_n / "pooled.md").read_text(), (without_n / "pooled.md").read_text()


def _true_optimum(J: float) -> tuple[float, float]:
    p = ONE_TRUTH.params(J)
    c = 10 * ONE_N * float(np.exp(np.mean(np.log(ONE_BS))))       # the pooled fit's constant batch model
    K = 1 + (p["b"] / ONE_N) ** p["beta"]
    s = float(np.sqrt(DELTA * p["a"] / (c * K)))
    scale = float(np.exp(np.mean(np.log(ONE_TRUTH.task_scale))))   # D of a typical task: geometric mean of scales
    return s, (c * s + DELTA) * p["D_min"] * scale * (K + p["a"] / s)


def test_one_size_curve_dir_pooled_fit_gives_sigma_star_of_F(one_size):
    src, rc, res, _, md, _ = one_size
    assert rc == (0, 0)
    assert not list(src.glob("w*p*")) and len(list(src.rglob("*.npy"))) == 3 * 5 * 2   # no model-size level
    assert res["law"] == laws.DATA_EFFICIENCY_SIGMA_ONLY.name and res["n_cells"] == 5 and not res["skipped"]
    assert res["allocation"] == {"computed": True} and res["delta"] == DELTA and res["delta_source"] == "user"
    assert [r["j_index"] for r in res["per_threshold"]] == [0, 1, 2]
    truth_s, truth_f = zip(*[_true_optimum(j) for j in J_ONE])
    for r, s_true, f_true in zip(res["per_threshold"], truth_s, truth_f):
        assert r["fit"]["n_points"] == 15 and r["fit"]["r2_log"] > 0.9
        al = r["fit"]["params"]["alpha"]
        assert al["lo"] <= ONE_TRUTH.alpha <= al["hi"]
        opt, iv = r["optimum"], r["intervals"]
        assert opt["N"] == ONE_N and not r["edge"] and "one model size" in iv["N"]["reason"]
        # measured: σ* 3.29 / 3.47 / 4.38 against the truth's 3.28 / 3.81 / 4.32; F* within 2.5 %
        assert opt["sigma"] == pytest.approx(s_true, rel=0.15) and iv["sigma"]["lo"] <= s_true <= iv["sigma"]["hi"]
        assert opt["F"] == pytest.approx(f_true, rel=0.05) and iv["F"]["lo"] < opt["F"] < iv["F"]["hi"]
    sl = res["sigma_law"]
    truth_e = float(np.polyfit(np.log(truth_f), np.log(truth_s), 1)[0])          # 0.111
    e = sl["intervals"]["e"]
    assert sl["thresholds_used"] == [0, 1, 2] and sl["n_failed"] == 0 and "reason" not in sl
    assert sl["F_range"][1] / sl["F_range"][0] > 3 and np.isfinite(sl["e"]) and np.isfinite(sl["k"])
    assert e["lo"] < sl["e"] < e["hi"] and e["lo"] <= truth_e <= e["hi"] and sl["e"] == pytest.approx(truth_e, abs=0.05)
    assert "σ*(F) = k·F^e: e = " in md and "Allocation skipped" not in md
    assert "## Footnotes" in md and "one model size: N is fixed" in md


def test_one_size_without_param_count_fits_the_pooled_law_and_says_why_no_allocation(one_size):
    _, rc, with_n, res, _, md = one_size
    assert rc[1] == 0 and res["law"] == laws.DATA_EFFICIENCY_SIGMA_ONLY.name
    assert res["allocation"]["computed"] is False and "--param-count" in res["allocation"]["reason"]
    assert "cannot be counted" in res["sigma_law"]["reason"] and "e" not in res["sigma_law"]
    assert len(res["per_threshold"]) == 3
    for r, r_n in zip(res["per_threshold"], with_n["per_threshold"]):
        assert "optimum" not in r and "intervals" not in r
        # the data-efficiency law does not depend on N being known: the same fit, interval for interval
        for k in ("D_min", "a", "alpha"):
            assert r["fit"]["params"][k]["estimate"] == pytest.approx(r_n["fit"]["params"][k]["estimate"], rel=1e-9)
            assert r["fit"]["params"][k]["lo"] == pytest.approx(r_n["fit"]["params"][k]["lo"], rel=1e-9)
    assert "**Allocation skipped**: no model size known" in md and "σ*(F): not fitted (no model size known" in md


def test_one_size_sigma_law_withheld_over_a_narrow_budget_range(one_size, tmp_path):
    src = one_size[0]
    out = tmp_path / "narrow"
    assert main(["fit", str(src), "--out", str(out), "--pool-tasks", "--bootstrap", "10", "--normalize", "none",
                 "--thresholds", "0.40,0.42,0.44", "--param-count", f"{ONE_N:g}", "--delta", f"{DELTA:g}",
                 "--quiet"]) == 0
    sl = json.loads((out / "pooled.json").read_text())["sigma_law"]
    assert sl["F_range"][1] / sl["F_range"][0] < 3 and "not a budget law" in sl["reason"] and "e" not in sl
    assert len(sl["points"]) == 3 and "optima: σ* " in (out / "pooled.md").read_text()


def test_pool_keeps_only_the_cells_every_task_has(one_size, tmp_path):
    src = tmp_path / "curves"
    shutil.copytree(one_size[0], src)
    shutil.rmtree(src / "utd_8" / "run")                     # run was not swept at σ = 8
    out = tmp_path / "o"
    assert _pool(src, out, "--param-count", f"{ONE_N:g}", "--delta", f"{DELTA:g}") == 0
    res = json.loads((out / "pooled.json").read_text())
    assert res["n_cells"] == 4 and all(r["fit"]["n_points"] == 12 for r in res["per_threshold"])
    assert any("2 (task, σ, N) cell(s) not swept for every task" in n and "hop σ=8" in n for n in res["notes"])
    assert all(r["optimum"]["sigma"] <= 4 for r in res["per_threshold"])     # the box is the pooled cells'


def test_make_problem_names_a_missing_input_in_one_line():
    ly = np.log([3.0, 2.0, 1.5])
    with pytest.raises(ValueError, match=r"^data_efficiency_sigma_only: inputs \['param_count'\] missing"):
        fitting.make_problem(laws.DATA_EFFICIENCY_SIGMA_ONLY, {"utd": [1.0, 2.0, 4.0]}, ly)
    with pytest.raises(ValueError, match=r"input\(s\) \['utd'\] have \[\(2,\)\] values for \(3,\) observations"):
        fitting.make_problem(laws.DATA_EFFICIENCY_SIGMA_ONLY, {"utd": [1.0, 2.0], "param_count": [1, 1, 1]}, ly)
    # the σ-only law ignores N: an unknown model size (NaN) is a valid input
    p = fitting.make_problem(laws.DATA_EFFICIENCY_SIGMA_ONLY, {"utd": [1.0, 2.0, 4.0], "param_count": [np.nan] * 3}, ly)
    assert p.n_params == 3 and np.all(np.isfinite(p.lo)) and np.all(np.isfinite(p.hi))
