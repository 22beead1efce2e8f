"""`scaling-rl fit` / `scaling-rl plot`: outputs, strict JSON with every interval, bad input -> exit 2."""
import json
import math

import matplotlib.image as mpimg
import pytest

from scaling_rl.cli import main
from scaling_rl.scaling import synthetic

FIGURES = ["data_efficiency_sigma", "hparams_sigma", "data_efficiency_contours", "pareto_frontier",
           "budget_scaling", "extrapolation"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep") / "results.parquet"
    table = synthetic.make_table(synthetic.Truth(), utds=[0.5, 1, 2, 4], param_counts=[1e5, 3e5, 1e6],
                                 batch_sizes=[256, 512], lrs=[3e-4], seeds=3, n_log=60, rng=0, return_scale=100)
    table.to_parquet(path)
    return path


@pytest.fixture(scope="module")
def fitted(sweep, tmp_path_factory):
    out = tmp_path_factory.mktemp("fit") / "out"
    # Figures are drawn once, by `plot` below (drawing is most of the CLI's time on a small sweep).
    rc = main(["fit", str(sweep), "--out", str(out), "--bootstrap", "30", "--n-thresholds", "3", "--delta", "3e9",
               "--quiet", "--no-figures"])
    assert rc == 0
    return out


def _walk_params(node, found):
    if isinstance(node, dict):
        if "params" in node and isinstance(node["params"], dict):
            found.append(node)
        for v in node.values():
            _walk_params(v, found)
    elif isinstance(node, list):
        for v in node:
            _walk_params(v, found)


def test_fit_writes_report_and_json_with_every_interval(fitted):
    text = (fitted / "fit.json").read_text()
    fit = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert fit["metric"] == "eval_return" and fit["allocation"]["delta"] == 3e9
    records = []
    _walk_params(fit, records)
    assert len(records) >= 10
    for rec in records:
        for name, p in rec["params"].items():
            if isinstance(p, dict) and "estimate" in p:  # every fitted parameter carries an interval
                assert p["lo"] is not None and p["hi"] is not None, name
                assert p["lo"] <= p["hi"], name
    assert len(fit["data_efficiency_sigma_n"]) == 3 and all("params" in r for r in fit["data_efficiency_sigma_n"])
    assert all(r["agree"] for r in fit["allocation"]["per_threshold"])
    report = (fitted / "report.md").read_text()
    for section in ("## Data efficiency D_J(σ, N)", "## Compute-optimal allocation", "## Held-out extrapolation",
                    "B*(σ) = A_task·σ^s"):
        assert section in report
    assert not list(fitted.glob("*.png"))


def test_plot_draws_every_figure_from_fit_json(fitted, tmp_path):
    out = tmp_path / "figs"
    assert main(["plot", str(fitted), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{n}.{e}" for n in FIGURES for e in ("png", "pdf"))
    for name in FIGURES:
        img = mpimg.imread(out / f"{name}.png")
        assert img.shape[0] > 300 and img.shape[1] > 500 and img[..., :3].std() > 0.05  # not blank
        assert (out / f"{name}.pdf").read_bytes()[:4] == b"%PDF"


@pytest.mark.parametrize("args,msg", [
    (["{missing}", "--metric", "eval_return"], "does not exist"),
    (["{sweep}", "--metric", "success_rate"], "metric: 'success_rate'"),
    (["{sweep}", "--delta", "-1"], "delta"),
    (["{sweep}", "--level", "1.5"], "level"),
    (["{sweep}", "--bootstrap", "-3"], "n_bootstrap"),
    (["{notes}"], "neither .parquet nor .csv"),
])
def test_fit_bad_input_exits_2_and_writes_nothing(sweep, tmp_path, capsys, args, msg):
    (tmp_path / "notes.txt").write_text("hello")
    fill = {"sweep": str(sweep), "missing": str(tmp_path / "nope.parquet"), "notes": str(tmp_path / "notes.txt")}
    out = tmp_path / "out"
    rc = main(["fit", *[a.format(**fill) for a in args], "--out", str(out), "--quiet"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("scaling-rl: error:") and msg in err and "\n" not in err
    assert not out.exists()


def test_fit_bad_choice_is_an_argparse_exit_2(sweep, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["fit", str(sweep), "--out", str(tmp_path / "o"), "--loss", "cauchy"])
    assert e.value.code == 2 and not (tmp_path / "o").exists()


def test_plot_bad_input_exits_2(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    (tmp_path / "fit.json").write_text("{not json")
    assert main(["plot", str(tmp_path)]) == 2
    (tmp_path / "fit.json").write_text(json.dumps({"schema": "something else"}))
    assert main(["plot", str(tmp_path)]) == 2
    assert "not a scaling_rl fit.json" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fit.json"]


def test_fit_reads_the_published_npy_layout(tmp_path):
    from scaling_rl.scaling import data
    cs = synthetic.make_study(synthetic.Truth(), utds=[0.5, 1, 2, 4], param_counts=[1e5], batch_sizes=[256.0],
                              lrs=[1e-3], seeds=3, n_log=50, rng=1)
    data.write_npy_dir(cs, tmp_path / "curves")
    out = tmp_path / "fit"
    assert main(["fit", str(tmp_path / "curves"), "--out", str(out), "--bootstrap", "10", "--n-thresholds", "2",
                 "--no-figures", "--quiet"]) == 0
    fit = json.loads((out / "fit.json").read_text())
    assert all("params" in r for r in fit["data_efficiency_sigma"])
    assert fit["data_efficiency_sigma_n"] == [] or all("skipped" in r for r in fit["data_efficiency_sigma_n"])
    assert not math.isnan(fit["data_efficiency_sigma"][0]["r2_log"])
