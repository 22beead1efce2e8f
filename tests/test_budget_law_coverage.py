"""benchmarks/budget_law_coverage.py's summary: the numbers it prints about intervals, on records whose answer is known."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
blc = pytest.importorskip("budget_law_coverage")


def _rows(lean: float, n: int = 300, seed: int = 0) -> list[dict]:
    """Estimates e ~ N(truth, 1); replicates centred at e + lean·(truth − e), sd 1 (lean > 0: toward the truth)."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(n):
        e = float(rng.normal())
        x = e + lean * (0.0 - e) + rng.normal(size=400)
        rows.append({"rep": r, "S": 3, "N": {"estimate": e, "lo": e - 1.645, "hi": e + 1.645, "method": "percentile",
                                             "reps": x.tolist(), "inflation": 1.0}})
    return rows


def test_summary_measures_where_the_replicates_sit_and_what_each_interval_covers():
    m = blc.summarise(_rows(0.4), "N", 0.0)
    assert m["n"] == 300 and m["withheld"] == 0
    assert m["covered"] / m["n"] == pytest.approx(0.90, abs=0.05)      # ±1.645 around an N(truth, 1) estimate
    assert m["corr"] > 0.5 and m["slope"] == pytest.approx(0.4, abs=0.05)
    assert m["percentile"] > 0.95 and m["basic"] < 0.8                 # leaning toward the truth helps one, hurts the other
    assert m["rms_z"] == pytest.approx(1.0, abs=0.1)
    lo, hi = m["wilson"]
    assert lo < m["covered"] / m["n"] < hi
    m0 = blc.summarise(_rows(0.0, seed=1), "N", 0.0)                   # centred replicates: the three agree
    assert abs(m0["corr"]) < 0.2
    for k in ("percentile", "basic"):
        assert m0[k] == pytest.approx(0.90, abs=0.05)


def test_withheld_intervals_are_counted_not_scored_and_reruns_count_once(tmp_path):
    rows = _rows(0.0, n=10)
    rows[3]["N"]["lo"] = rows[3]["N"]["hi"] = None
    m = blc.summarise(rows, "N", 0.0)
    assert m["n"] == 9 and m["withheld"] == 1
    (tmp_path / "s3.jsonl").write_text("\n".join(json.dumps(r) for r in rows + rows[:2]) + "\n")
    got = blc.load(tmp_path)
    assert list(got) == [3] and [r["rep"] for r in got[3]] == list(range(10))
    # a repetition without the law is counted, not dropped; nothing at all is None
    assert blc.summarise(rows, "sigma", 0.0) == {"n": 0, "withheld": 0, "missing": 10}
    assert blc.summarise([], "N", 0.0) is None
    m = blc.summarise(rows + [{"rep": 10, "S": 3}], "N", 0.0)
    assert (m["n"], m["withheld"], m["missing"]) == (9, 1, 1)
