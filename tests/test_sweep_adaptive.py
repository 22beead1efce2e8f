"""Adaptive scaling studies (sweep.adaptive): spec validation, the initial design, the proposal
criterion, stop rules, the simulated study against its known answer, and resume after kill -9."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from scaling_rl.sweep import SpecError, parse_spec
from scaling_rl.sweep import adaptive as ad

UTDS = [0.5, 1, 2, 4, 8]
WIDTHS = [316, 548, 1000, 1732]
THRESHOLDS = [0.3, 0.4, 0.5, 0.6, 0.7]
BUDGET = 22_000_000


def spec_dict(out, *, adaptive=None, seeds=4, seed=0, **base) -> dict:
    return {"name": "sim", "agent": "toy", "out_dir": str(out), "seeds": seeds, "seed": seed, "env_steps": BUDGET,
            "base": {"env": "toy/law", "chunk_env_steps": 20000, "log_points": 120, "batch_size": 32, **base},
            "grid": {"utd": UTDS, "width": WIDTHS}, "backend": {"workers": 0}, "checkpoint_every": 1000,
            "compile_cache": False,
            "adaptive": {"thresholds": THRESHOLDS, "tolerance": 0.06, "n_bootstrap": 48, "batch": 3,
                         "max_rounds": 4, **(adaptive or {})}}


def truth_exponents(delta: float) -> dict:
    from scaling_rl.scaling import allocation as alloc, synthetic
    truth = synthetic.Truth()
    box = {"sigma_range": (min(UTDS), max(UTDS)), "n_range": (min(WIDTHS) ** 2, max(WIDTHS) ** 2)}
    opts = [alloc.optimum(truth.params(J), alloc.BatchModel.constant(32), delta, **box) for J in THRESHOLDS]
    lF = np.log([o["F"] for o in opts])
    return {ax: float(np.polyfit(lF, np.log([o[ax] for o in opts]), 1)[0]) for ax in ("sigma", "N")}


# ---- the spec block ------------------------------------------------------------------------------
@pytest.mark.parametrize("block, message", [
    ({"bogus": 1}, "adaptive.bogus: unknown key"),
    ({"thresholds": None}, "adaptive.thresholds: give the thresholds"),
    ({"tolerance": 0}, "adaptive.tolerance: expected a number > 0"),
    ({"batch": 1.5}, "adaptive.batch: expected an integer > 0"),
    ({"target": "best"}, "adaptive.target: 'best'; allowed: frontier, points"),
    ({"target": "points", "points": [{"utd": 3, "width": 316}]}, "is not a point of the spec's grid"),
    ({"initial": "random"}, "adaptive.initial: 'random'"),
    ({"level": 1.5}, "adaptive.level: expected a number in (0, 1)"),
])
def test_bad_adaptive_blocks_are_one_line_errors(tmp_path, block, message):
    d = spec_dict(tmp_path / "s")
    d["adaptive"] = {**d["adaptive"], **block}
    if block.get("thresholds", 0) is None:
        del d["adaptive"]["thresholds"]
    with pytest.raises(SpecError) as e:
        parse_spec(d)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "s").exists()


def test_adaptive_refuses_seed_axis_and_a_too_small_box(tmp_path):
    d = spec_dict(tmp_path / "s")
    d["grid"] = {**d["grid"], "seed": [0, 1]}
    with pytest.raises(SpecError, match="do not sweep `seed`"):
        parse_spec(d)
    d = spec_dict(tmp_path / "s")
    d["grid"] = {"utd": [1, 2], "width": WIDTHS}
    with pytest.raises(SpecError, match=r"needs >= 3 σ \(utd\) and >= 3 model sizes"):
        parse_spec(d)


def test_initial_designs_pick_corners_midpoints_and_centre(tmp_path):
    spec = parse_spec(spec_dict(tmp_path / "s"))
    cells = ad.cells_of(spec.trials)
    assert len(cells) == 20 and {c.N for c in cells} == {w * w for w in WIDTHS}
    g3 = ad.initial_cells(spec.adaptive, cells)
    assert sorted({c.sigma for c in g3}) == [0.5, 2.0, 8.0]
    assert sorted({c.N for c in g3}) == [316.0 ** 2, 1000.0 ** 2, 1732.0 ** 2] and len(g3) == 9
    corners = ad.initial_cells(parse_spec(spec_dict(tmp_path / "s", adaptive={"initial": "corners"})).adaptive, cells)
    assert sorted((c.sigma, c.N) for c in corners) == sorted(
        [(0.5, 316.0 ** 2), (0.5, 1732.0 ** 2), (8.0, 316.0 ** 2), (8.0, 1732.0 ** 2), (2.0, 1000.0 ** 2)])
    given = parse_spec(spec_dict(tmp_path / "s", adaptive={"initial": [{"utd": 1, "width": 548}]})).adaptive
    assert [(c.sigma, c.N) for c in ad.initial_cells(given, cells)] == [(1.0, 548.0 ** 2)]


# ---- the criterion -------------------------------------------------------------------------------
class _Reps:
    def __init__(self, K):
        self.K = K

    def ok(self, scope):
        return np.ones(self.K, bool)


def test_criterion_goes_where_the_target_uncertainty_is(tmp_path):
    """Replicates where the σ*(F) exponent moves with `a` (the σ term): a trial at small σ, where D_J
    depends most on a, removes most of its variance; at large σ and large N almost nothing (costs are
    made equal by a dominant δ)."""
    spec = parse_spec(spec_dict(tmp_path / "s", adaptive={"batch": 2}))
    design, cells = spec.adaptive, ad.cells_of(spec.trials)
    rng = np.random.default_rng(0)
    K = 200
    la = 0.3 * rng.standard_normal(K)
    base = {"D_min": 1e5, "a": 2.0, "alpha": 1.0, "b": 3e5, "beta": 0.8}
    reps = [{**base, "a": 2.0 * np.exp(x), "b": 3e5 * np.exp(0.01 * rng.standard_normal())} for x in la]
    law = {"point": base, "reps": reps, "fixed": {}, "scope": "t"}
    cap = {"reps": _Reps(K), "laws": {("toy/law", j): law for j in range(len(THRESHOLDS))}, "optima": {},
           "budget_laws": {("toy/law", "sigma"): {"reps": 0.1 + 0.05 * la + 0.002 * rng.standard_normal(K),
                                                  "scope": "t"}}}
    steps = {t.id: 1e6 for c in cells for t in c.trials}
    crit, picks = ad.propose(design, cells, {}, cap, {}, 1e15, np.inf, steps)
    assert crit == "frontier exponents" and len(picks) == 2
    assert picks[0]["sigma"] == 0.5                      # the most informative about `a`
    assert picks[0]["variance_reduction"] > 0.5          # most of Var(exponent) at once
    assert picks[1]["variance_reduction"] < picks[0]["variance_reduction"]   # conditioned on the first pick
    # with no budget law and no optima in the capture: predictive variance, then space filling
    cap2 = {**cap, "budget_laws": {}}
    assert ad.propose(design, cells, {}, cap2, {}, 1e15, np.inf, steps)[0] == "prediction variance"
    crit, picks = ad.propose(design, cells, {c.key: 1 for c in cells[:1]}, None, {}, 1e15, np.inf, steps)
    assert crit == "space filling" and (picks[0]["sigma"], picks[0]["N"]) == (8.0, 1732.0 ** 2)
    # a budget too small for any trial: nothing proposed
    assert ad.propose(design, cells, {}, cap, {}, 1e15, 1.0, steps)[1] == []
    # every candidate at max_replicates: exhausted
    assert ad.propose(design, cells, {c.key: 4 for c in cells}, cap, {}, 1e15, np.inf, steps)[0] == "exhausted"


# ---- the simulated study -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    out = tmp_path_factory.mktemp("adaptive") / "study"
    spec = parse_spec(spec_dict(out, seed=0))   # the default seed, not one searched for
    state = ad.run_adaptive(spec, progress=False, say=lambda m: None)
    return spec, state


def test_simulated_study_rounds_are_recorded_and_recover_the_truth(simulated):
    spec, state = simulated
    rounds = state["rounds"]
    assert rounds[0]["criterion"].startswith("initial design") and len(rounds[0]["proposals"]) == 9
    for r in rounds[1:]:
        assert r["criterion"] in ("frontier exponents", "per-threshold optima", "prediction variance")
        assert 1 <= len(r["proposals"]) <= 3 and all(p["predicted_cost"] > 0 for p in r["proposals"])
    assert all("fit" in r and r["decision"] for r in rounds)
    assert rounds[-1]["decision"].startswith("stop")
    # a stop is decided on a refit with confirm_bootstrap (4 × 48) replicates, and that refit is reported
    assert rounds[-1]["fit"]["n_bootstrap"] == 192 and "widths_before" in rounds[-1]["fit"]["confirmed_from"]
    assert all(r["fit"]["n_bootstrap"] == 48 for r in rounds[:-1] if "confirmed_from" not in r["fit"])
    flops = [r["fit"]["flops"] for r in rounds]
    assert flops == sorted(flops) and flops[0] > 0
    # every proposed trial ran, and only those
    from scaling_rl.sweep.store import Store
    store = Store(spec.out_dir)
    proposed = {t.id for t in ad.proposed_trials(state, spec)}
    assert set(store.trial_ids()) == proposed
    assert all(store.status(t)["state"] == "done" for t in proposed)
    fit = json.loads((Path(spec.out_dir) / "adaptive" / f"round_{rounds[-1]['round']}" / "fit.json").read_text())
    truth = truth_exponents(state["delta"])
    laws = {p["target"]: p["params"]["s"] for p in fit["allocation"]["power_laws"] if "params" in p}
    # One study says little about 90% coverage (that is benchmarks/adaptive_sweep.py's job, over
    # independent repetitions); what must hold for any seed is that the truth is not far outside:
    # within twice the interval's half-width of the estimate (about 3.3 standard errors; a correct
    # study fails this about once in a few hundred seeds, a biased or far too narrow one often).
    for ax in ("sigma", "N"):
        s = laws[ax]
        assert s["lo"] <= s["estimate"] <= s["hi"]
        half = max(s["hi"] - s["estimate"], s["estimate"] - s["lo"])
        assert abs(truth[ax] - s["estimate"]) <= 2 * half, (ax, s, truth[ax])
    widths = rounds[-1]["fit"]["widths"]
    assert set(widths) == {"toy/law:sigma*(F) exponent", "toy/law:N*(F) exponent"}


def test_budget_stop_after_the_initial_design(tmp_path):
    spec = parse_spec(spec_dict(tmp_path / "s", adaptive={"max_compute": 1e12, "n_bootstrap": 16}))
    state = ad.run_adaptive(spec, progress=False, say=lambda m: None)
    assert len(state["rounds"]) == 1 and state["rounds"][0]["decision"] == "stop: budget spent"
    assert state["rounds"][0]["fit"]["flops"] > 1e12


# ---- resume after kill -9 ------------------------------------------------------------------------
def test_kill_9_mid_round_resumes_without_repeating_or_losing_anything(tmp_path):
    import yaml
    out = tmp_path / "study"
    d = spec_dict(out, seed=2000, chunk_seconds=0.004, adaptive={"n_bootstrap": 16, "max_rounds": 3, "tolerance": 1e-6})
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(d))
    cmd = [sys.executable, "-m", "scaling_rl.cli", "sweep", "run", str(spec_path), "--no-progress"]
    env = {**os.environ, "MPLBACKEND": "Agg"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    state_file = out / "adaptive" / "state.json"
    deadline = time.time() + 120
    before = None
    while time.time() < deadline:   # kill once round 1 is proposed and at least one of its trials finished
        if state_file.exists():
            st = json.loads(state_file.read_text())
            if len(st["rounds"]) >= 2:
                ids = [t for p in st["rounds"][1]["proposals"] for t in p["trials"]]
                done = [t for t in ids if (out / "trials" / t / "trial_status.json").exists() and json.loads(
                    (out / "trials" / t / "trial_status.json").read_text())["state"] == "done"]
                if done and len(done) < len(ids):
                    before = st
                    os.killpg(proc.pid, signal.SIGKILL)
                    break
        time.sleep(0.02)
    proc.wait(30)
    assert before is not None, "never caught round 1 half-way"
    execs_before = {t.name: (t / "executions.log").read_text().count("\n")
                    for t in (out / "trials").iterdir() if (t / "executions.log").exists()}
    done_before = {t for t in execs_before
                   if json.loads((out / "trials" / t / "trial_status.json").read_text())["state"] == "done"}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    after = json.loads(state_file.read_text())
    assert after["rounds"][1]["proposals"] == before["rounds"][1]["proposals"]   # no proposal lost or redrawn
    assert after["rounds"][0] == before["rounds"][0]
    for t in done_before:   # no finished trial ran again
        assert (out / "trials" / t / "executions.log").read_text().count("\n") == execs_before[t]
    assert after["rounds"][-1]["decision"] == "stop: max_rounds"
    assert (out / "adaptive" / "rounds.png").exists() and (out / "adaptive" / "widths.png").exists()


def test_cli_adaptive_flag_needs_thresholds(tmp_path):
    import yaml
    d = spec_dict(tmp_path / "s")
    del d["adaptive"]
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(d))
    r = subprocess.run([sys.executable, "-m", "scaling_rl.cli", "sweep", "run", str(p), "--adaptive"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "adaptive.thresholds: give the thresholds" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "s").exists()
    d["adaptive"] = {"thresholds": THRESHOLDS}
    p.write_text(yaml.safe_dump(d))
    r = subprocess.run([sys.executable, "-m", "scaling_rl.cli", "sweep", "run", str(p), "--dry-run"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "initial design 9 cells" in r.stdout and not (tmp_path / "s").exists()


def test_widths_before_any_budget_law_name_both_exponents_and_say_why(tmp_path):
    design = parse_spec(spec_dict(tmp_path / "s")).adaptive
    fit = {"tasks": ["t"], "allocation": {"power_laws": []},
           "model_selection": {"t": {"chosen": "data_efficiency_constant"}}}
    w = ad.target_widths(fit, design, {})
    assert set(w) == {"t:sigma*(F) exponent", "t:N*(F) exponent"}
    assert all(v["width"] == float("inf") and "model selection prefers" in v["reason"] for v in w.values())
    fit["allocation"]["power_laws"] = [{"task": "t", "target": "sigma", "params": {"s": {
        "estimate": 0.1, "lo": 0.05, "hi": 0.2}}}, {"task": "t", "target": "N", "skipped": "needs optima"}]
    w = ad.target_widths(fit, design, {})
    assert w["t:sigma*(F) exponent"]["width"] == pytest.approx(0.15)
    assert w["t:N*(F) exponent"]["width"] == float("inf") and w["t:N*(F) exponent"]["reason"] == "needs optima"


def test_points_target_narrows_d_j_where_asked(tmp_path):
    """target: points — the design reduces the uncertainty of D_J at the chosen (σ, N), and the widths
    it reports are the log-widths of D_J's intervals there (one per threshold)."""
    spec = parse_spec(spec_dict(tmp_path / "s", seed=4000, adaptive={
        "target": "points", "points": [{"utd": 1, "width": 548}], "tolerance": 0.02, "max_rounds": 2,
        "n_bootstrap": 32, "max_compute": 1e19}))
    assert spec.adaptive.points == (("toy/law", 1.0, 548.0 ** 2),)
    state = ad.run_adaptive(spec, progress=False, say=lambda m: None)
    r0, r1 = state["rounds"]
    assert r1["criterion"] == "target points' D_J" and len(r1["proposals"]) == 3
    w0, w1 = r0["fit"]["widths"], r1["fit"]["widths"]
    assert len(w0) == len(THRESHOLDS) and all("D_J(σ=1, N=3.003e+05)" in k for k in w0)
    assert all(0 < v["width"] < 1 and v["lo"] <= v["estimate"] <= v["hi"] for v in w1.values())
    # the target cell is not in the 3x3 initial design: measuring it (or its neighbours) is what helps
    assert any((p["sigma"], p["N"]) == (1.0, 548.0 ** 2) for p in r1["proposals"])
    assert r0["fit"]["remaining_flops"] == pytest.approx(1e19 - r0["fit"]["flops"])


def test_early_stopping_costs_a_trial_by_the_highest_threshold_with_a_law(tmp_path):
    """With early stopping a candidate is costed by the steps the law says it needs to reach the top
    threshold — the highest one with a fitted law when the top ones have none yet."""
    import dataclasses
    spec = parse_spec(spec_dict(tmp_path / "s", adaptive={"batch": 1}))
    design = dataclasses.replace(spec.adaptive, early_stop=True)
    cells = ad.cells_of(spec.trials)
    K = 50
    rng = np.random.default_rng(1)
    laws = {}
    for j, d_min in ((0, 1e4), (1, 1e5)):   # thresholds 2..4: no law
        p = {"D_min": d_min, "a": 1.0, "alpha": 1.0, "b": 1e5, "beta": 1.0}
        laws[("toy/law", j)] = {"point": p, "fixed": {}, "scope": "t",
                                "reps": [{**p, "a": float(np.exp(0.2 * rng.standard_normal()))} for _ in range(K)]}
    cap = {"reps": _Reps(K), "laws": laws, "optima": {}, "budget_laws": {}}
    steps = {t.id: float(BUDGET) for c in cells for t in c.trials}
    crit, picks = ad.propose(design, cells, {}, cap, {}, 1e15, np.inf, steps)
    (p,) = picks
    cell = next(c for c in cells if (c.sigma, c.N) == (p["sigma"], p["N"]))
    need = 1.25 * np.exp(ad._predict(laws[("toy/law", 1)], cell.sigma, cell.N)[0])
    assert need < BUDGET
    assert p["predicted_cost"] == pytest.approx(4 * need * ad.flops_per_step(cell.trials[0].config, cell.N, 1e15))


def test_quickstart_grid_and_adaptive_specs_share_no_seed_run():
    # the README's grid-vs-adaptive comparison fits two designs: on the same seeds it would compare
    # mostly the same runs (max_replicates: 1 reruns the grid's own trials)
    from scaling_rl.sweep import load_spec
    from scaling_rl.sweep.trial import seed_runs
    root = Path(__file__).resolve().parents[1] / "sweeps"
    grid = load_spec(root / "quickstart.yaml")
    spec = load_spec(root / "quickstart_adaptive.yaml")
    runs = seed_runs(ad.replicate(t, r) for t in spec.trials for r in range(spec.adaptive.max_replicates))
    assert len(runs) == 16 * 5 and len(seed_runs(grid.trials)) == 16 * 5
    assert not runs & seed_runs(grid.trials)
    # the check itself sees a shared run
    assert seed_runs([grid.trials[0]]) <= seed_runs(grid.trials)
