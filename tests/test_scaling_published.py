"""Refitting published curve sets through `scaling-rl fit`: `--param-count N` for directories without a
`w<width>p<N>/` level, `--steps START:EVERY` for `.npy` arrays that hold only seed columns; bad input
exits 2 with one line and nothing written."""
import json

import numpy as np
import pytest

from scaling_rl.cli import main
from scaling_rl.scaling import data, synthetic

EVERY = 2.0e5


@pytest.fixture(scope="module")
def study():
    """Two tasks, four σ, one (unnamed) model size, four seeds, logged every EVERY env steps from EVERY."""
    cs = synthetic.make_study(synthetic.Truth(), utds=[0.5, 1, 2, 4], param_counts=[1e5], batch_sizes=[256.0],
                              lrs=[1e-3], tasks=["hop", "run"], seeds=4, n_log=40, rng=3)
    # Re-log on a regular grid START + k·EVERY so that --steps can describe it exactly.
    grid = EVERY * np.arange(1, 161)
    for c in cs.curves:
        c.returns = np.stack([np.interp(grid, c.steps, c.returns[:, s]) for s in range(c.n_seeds)], axis=1)
        c.steps = grid.copy()
    return cs


@pytest.fixture(scope="module")
def seed_only_dir(study, tmp_path_factory):
    root = tmp_path_factory.mktemp("published") / "curves"
    data.write_npy_dir(study, root, step_column=False)
    return root


@pytest.fixture(scope="module")
def with_steps_dir(study, tmp_path_factory):
    root = tmp_path_factory.mktemp("published_steps") / "curves"
    data.write_npy_dir(study, root)
    return root


def _fit(src, out, *extra):
    return main(["fit", str(src), "--out", str(out), "--bootstrap", "10", "--n-thresholds", "3", "--no-figures",
                 "--quiet", *extra])


def test_loader_steps_and_param_count_roundtrip(study, seed_only_dir, with_steps_dir):
    cs = data.load_results(seed_only_dir, steps=f"{EVERY:g}:{EVERY:g}", param_count=1e5)
    ref = data.load_results(with_steps_dir)
    assert len(cs.curves) == len(ref.curves) == len(study.curves)
    for a, b in zip(cs.curves, ref.curves):
        assert (a.task, a.utd) == (b.task, b.utd) and a.param_count == 1e5 and np.isnan(b.param_count)
        np.testing.assert_allclose(a.steps, b.steps)
        np.testing.assert_allclose(a.returns, b.returns)
    assert any("seed columns only" in n for n in cs.notes) and any("N = 1e+05" in n for n in cs.notes)
    assert data.parse_steps("0:5e3") == (0.0, 5000.0) and data.parse_steps((10, 20)) == (10.0, 20.0)
    # The tidy-table path takes --param-count too.
    table = study.to_table().drop(columns=["param_count"])
    assert {c.param_count for c in data.curves_from_table(table, param_count=3e5).curves} == {3e5}


def test_fit_seed_only_arrays_with_param_count_gives_sigma_star(seed_only_dir, tmp_path):
    out = tmp_path / "fit"
    assert _fit(seed_only_dir, out, "--steps", f"{EVERY:g}:{EVERY:g}", "--param-count", "1e5",
                "--extrapolate", "2") == 0
    fit = json.loads((out / "fit.json").read_text())
    assert fit["levels"]["param_count"] == [1e5] and fit["settings"]["extrapolate"] == 2.0
    al = fit["allocation"]
    assert "skipped" not in al or "model size" not in al["skipped"]
    sig = [r for r in al.get("per_threshold", []) if r["kind"] == "sigma_law"]   # one-size study: σ only
    assert {r["task"] for r in sig} == {"hop", "run"}
    assert all(r["N"] == 1e5 and not r["free"]["N"] and r["sigma"] > 0 and r["F"] > 0 for r in sig)
    report = (out / "report.md").read_text()
    assert "no model size" not in report and "seed columns only" in report
    # Without --param-count the same data has no model size: the budget optimum is skipped, with a hint.
    out2 = tmp_path / "fit2"
    assert _fit(seed_only_dir, out2, "--steps", f"{EVERY:g}:{EVERY:g}") == 0
    fit2 = json.loads((out2 / "fit.json").read_text())
    assert fit2["levels"]["param_count"] == [] and not fit2["allocation"].get("per_threshold")
    assert any("--param-count" in n for n in fit2["notes"])


@pytest.mark.parametrize("src,args,msg", [
    ("seed_only", [], "pass steps (--steps START:EVERY)"),                      # seed columns read as steps
    ("seed_only", ["--steps", "5000"], "is not START:EVERY"),
    ("seed_only", ["--steps", "0:0"], "EVERY > 0"),
    ("seed_only", ["--steps=-1:10"], "START >= 0"),
    ("seed_only", ["--steps", "1:2", "--param-count=-5"], "param_count: -5"),
    ("seed_only", ["--steps", "1:2", "--param-count", "inf"], "must be a positive number"),
    ("seed_only", ["--steps", "1:2", "--extrapolate", "0.5"], "--extrapolate: 0.5"),
    ("with_steps", ["--steps", f"{EVERY:g}:{EVERY:g}"], "already holds env steps"),
    ("with_steps", ["--steps", "0:1"], "already holds env steps"),
    ("table", ["--steps", "0:10"], "steps: only for"),
    ("table", ["--param-count", "1e5"], "already gives model sizes"),
    ("model_dirs", ["--param-count", "1e5"], "already gives model sizes"),
])
def test_bad_published_input_exits_2_and_writes_nothing(study, seed_only_dir, with_steps_dir, tmp_path, capsys,
                                                         src, args, msg):
    if src == "table":
        path = tmp_path / "t.parquet"
        study.to_table().assign(param_count=1e5).to_parquet(path)
    elif src == "model_dirs":
        path = tmp_path / "m"
        cs = data.CurveSet([data.Curve(**{**c.__dict__, "extra": (("width", 64.0),)}) for c in study.curves[:2]],
                           study.metric)
        data.write_npy_dir(cs, path)
    else:
        path = seed_only_dir if src == "seed_only" else with_steps_dir
    out = tmp_path / "out"
    assert _fit(path, out, *args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("scaling-rl: error:") and msg in err and "\n" not in err, err
    assert not out.exists()


def test_param_count_that_is_not_a_number_is_an_argparse_exit_2(seed_only_dir, tmp_path):
    with pytest.raises(SystemExit) as e:
        _fit(seed_only_dir, tmp_path / "o", "--param-count", "big")
    assert e.value.code == 2 and not (tmp_path / "o").exists()
