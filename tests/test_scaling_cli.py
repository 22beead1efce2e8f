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


def _walk_intervals(node, found, path=""):
    """Every dict that carries an estimate (a parameter, a D_J point interval, an optimum)."""
    if isinstance(node, dict):
        if ("estimate" in node and not isinstance(node["estimate"], list)) or isinstance(node.get("not_identified"), str):
            found.append((path, node))
        for k, v in node.items():
            _walk_intervals(v, found, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _walk_intervals(v, found, f"{path}[{i}]")


def check_honest(fit: dict) -> int:
    """The acceptance rule on a whole fit.json: every interval contains its estimate or is absent with a
    reason; n_ok/n is on every bootstrapped quantity; nothing not identified carries an estimate;
    allocations stay in their search box. Returns the number of intervals checked."""
    found = []
    _walk_intervals(fit, found)
    n = 0
    for path, p in found:
        if isinstance(p.get("not_identified"), str):
            assert p["estimate"] is None and p["lo"] is None and p["hi"] is None, path
            continue
        if p.get("lo") is None or p.get("hi") is None:
            assert p.get("reason"), f"{path}: no interval and no reason"
        else:
            assert p["lo"] <= p["estimate"] <= p["hi"], f"{path}: {p}"
            n += 1
        if "n" in p:
            assert 0 <= p["n_ok"] <= p["n"], path
    for rec in [*fit["data_efficiency_sigma"], *fit["data_efficiency_sigma_n"]]:
        for label in rec.get("at_bound", []):
            assert rec["params"][label.split("[")[0]]["estimate"] is None, (label, rec["params"])
    for r in fit["allocation"].get("per_threshold", []):
        for ax in ("sigma", "N"):
            lo, hi = r["box"][ax]
            assert lo * (1 - 1e-9) <= r[ax] <= hi * (1 + 1e-9)
            if r["extrapolated"][ax]:
                assert fit["allocation"]["extrapolate"] > 1
        if r.get("semi_analytic") is not None:
            # the two optimisers are compared only when the unconstrained optimum is inside the box,
            # and then they must agree; otherwise the box binds and the optimum is on its edge
            if r["semi_analytic"]["inside_box"]:
                assert r["agree"] is True
            else:
                assert r["agree"] is None and r["edge"]
    return n


def test_fit_writes_report_and_json_with_honest_intervals(fitted):
    text = (fitted / "fit.json").read_text()
    fit = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert fit["metric"] == "eval_return" and fit["allocation"]["delta"] == 3e9
    records = []
    _walk_params(fit, records)
    assert len(records) >= 10
    assert check_honest(fit) >= 10
    # 3 seeds: below the minimum for one point's seed bootstrap -> no D_J point intervals; laws pool seeds
    assert fit["bootstrap"]["mode"] == "seed" and fit["bootstrap"]["n_seeds"] == 3
    assert all(p["D_lo"] is None and "seeds" in p["D_interval"]["reason"] for p in fit["points"] if not p["censored"])
    for rec in records:
        if "n_bootstrap" in rec:
            assert rec["n_bootstrap"] == 30 and 0 <= rec["n_bootstrap_ok"] <= 30
    assert len(fit["data_efficiency_sigma_n"]) == 3 and all("params" in r for r in fit["data_efficiency_sigma_n"])
    assert fit["model_selection"]["task"]["chosen"] == "data_efficiency_sigma_n"
    report = (fitted / "report.md").read_text()
    for section in ("## Data efficiency D_J(σ, N)", "## Compute-optimal allocation", "## Held-out extrapolation",
                    "B*(σ) = A_task·σ^s", "## Model selection", "D_J(σ,N)/task 30/30"):
        assert section in report
    assert "nan" not in report.lower().replace("nan-", "")
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
