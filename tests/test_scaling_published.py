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


# ---- values no law can use: one line from the data layer (`data.validate_levels`), whatever the source -----------

def _bad_source(study, root, case):
    """The study as a curve directory (or table) with one kind of bad configuration value."""
    if case.startswith("table_"):
        tab = study.to_table().drop(columns=["param_count"])
        if case == "table_text_utd":
            tab = tab.assign(param_count=1e5, utd=tab["utd"].map(lambda u: "half" if u == 0.5 else str(u)))
        else:   # table_some_sizes: param_count known for some configurations only
            tab = tab.assign(param_count=np.where(tab["utd"] == 1, np.nan, 1e5))
        path = root / "t.csv"
        root.mkdir(parents=True)
        tab.to_csv(path, index=False)
        return path
    data.write_npy_dir(study, root)
    first = sorted(root.rglob("*.npy"))[0]                   # utd_0.5/hop/eval_return/bs_256_lr_0.001.npy
    if case.startswith("utd_"):
        (root / "utd_0.5").rename(root / case)
    elif case in ("bs_0", "lr_-1"):
        first.rename(first.with_name("bs_0_lr_0.001.npy" if case == "bs_0" else "bs_256_lr_-1.npy"))
    elif case in ("w64p0", "some_sizes"):
        for d in sorted(root.glob("utd_*"))[: None if case == "w64p0" else 2]:
            (root / "w64p1e5" if case == "some_sizes" else root / case).mkdir(exist_ok=True)
            d.rename((root / ("w64p1e5" if case == "some_sizes" else case)) / d.name)
    elif case == "negative_steps":
        a = np.load(first)
        a[:, 0] -= a[-1, 0] / 2
        np.save(first, a)
    return root


@pytest.mark.parametrize("case,msg", [
    ("utd_nan", "UTD ratio σ (utd) must be a finite number > 0; 2 of 8 curve(s) have e.g. nan"),
    ("utd_0", "UTD ratio σ (utd) must be a finite number > 0; 2 of 8 curve(s) have e.g. 0"),
    ("utd_-2", "have e.g. -2"),
    ("utd_inf", "have e.g. inf"),
    ("bs_0", "batch size B (batch_size) must be a finite number > 0 or missing; 1 of 8"),
    ("lr_-1", "learning rate η (lr) must be a finite number > 0 or missing"),
    ("w64p0", "model size N (param_count) must be a finite number > 0 or missing; 8 of 8"),
    ("some_sizes", "model size (param_count) known for 4 of 8 curves only"),
    ("negative_steps", "env steps must be finite and >= 0"),
    ("table_text_utd", "column 'utd' must be numeric"),
    ("table_some_sizes", "known for 6 of 8 curves only"),
])
@pytest.mark.parametrize("pool", [False, True])
def test_bad_configuration_values_are_one_line_errors(study, tmp_path, capsys, case, msg, pool):
    src = _bad_source(study, tmp_path / "src", case)
    out = tmp_path / "out"
    assert _fit(src, out, *(["--pool-tasks"] if pool else [])) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("scaling-rl: error: results: ") and msg in err and "\n" not in err, err
    assert not out.exists()
    with pytest.raises(ValueError, match="must be|known for"):
        data.load_results(src)


def test_single_seed_study_fits_without_intervals(study, tmp_path, capsys):
    """One seed per configuration: no bootstrap (K = 0) — the σ-slope test used to crash broadcasting the D_J
    bootstrap's rows against zero replicates."""
    one = data.CurveSet([data.Curve(**{**c.__dict__, "returns": c.returns[:, :1]}) for c in study.curves], study.metric)
    src = tmp_path / "one_seed"
    data.write_npy_dir(one, src)
    assert _fit(src, tmp_path / "fit", "--param-count", "1e5") == 0, capsys.readouterr().err
    fit = json.loads((tmp_path / "fit" / "fit.json").read_text())
    assert "a single seed per configuration: no seed bootstrap" in json.dumps(fit)
    assert _fit(src, tmp_path / "pool", "--pool-tasks", "--param-count", "1e5") == 0
    res = json.loads((tmp_path / "pool" / "pooled.json").read_text())
    assert res["bootstrap"]["n"] == 0 and len(res["per_threshold"]) == 3
    assert all(r["optimum"]["sigma"] > 0 and r["intervals"]["sigma"]["lo"] is None for r in res["per_threshold"])
