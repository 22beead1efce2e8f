"""Pooled-task mode (`scaling-rl fit --pool-tasks`): tasks differing by a scale share one law after each task's
D_J is divided by its median; σ*(F) across thresholds with intervals."""
import json

import numpy as np
import pytest

from scaling_rl.cli import main
from scaling_rl.scaling import report, synthetic
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
