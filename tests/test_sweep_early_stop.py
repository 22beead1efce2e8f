"""Threshold-aware early stopping (scaling_rl/sweep/early_stop.py): the rule, its spec block, what the
store records, packing, resume after kill -9, and the `_align_seeds` extension (JAX-free toy trials,
plus one tiny DQN run through train.run)."""
from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.isotonic import IsotonicRegression

from scaling_rl import cli
from scaling_rl.sweep import SpecError, Store, collect, parse_spec, run_sweep, status_summary
from scaling_rl.sweep import early_stop as es
from scaling_rl.sweep import registry, toy

REPO = Path(__file__).resolve().parent.parent
SCALING_RL = [sys.executable, "-m", "scaling_rl.cli"]


def iso(y) -> np.ndarray:
    """Isotonic fit by scikit-learn's estimator (a different code path from the rule's)."""
    y = np.asarray(y, float)
    return IsotonicRegression().fit_transform(np.arange(len(y)), y)


def table(steps, Y, metric="eval_return") -> pd.DataFrame:
    """Tidy rows: one per seed and log point (Y: (T, S))."""
    T, S = Y.shape
    return pd.DataFrame({"seed": np.tile(np.arange(S), T), "chunk": np.repeat(np.arange(T), S),
                         "env_steps": np.repeat(np.asarray(steps), S), metric: Y.reshape(-1)})


def prefixes(df):
    """The table as it grows, one logged point at a time."""
    for k, step in enumerate(sorted(set(df["env_steps"]))):
        yield k, step, df[df["env_steps"] <= step]


def crossed(df, metric, target, patience) -> bool:
    """Independent statement of "reached": every seed's and the seed mean's isotonic curve (finite
    rows) >= target at its last `patience` points."""
    fin = df[np.isfinite(df[metric])]
    for s in sorted(set(df["seed"])):
        y = fin[fin.seed == s].sort_values("env_steps")[metric].to_numpy()
        if len(y) < patience or not np.all(iso(y)[-patience:] >= target - 1e-9):
            return False
    w = fin.pivot_table(index="env_steps", columns="seed", values=metric).dropna()
    if len(w) < patience:
        return False
    return bool(np.all(iso(w.to_numpy().mean(axis=1))[-patience:] >= target - 1e-9))


# ---- the rule --------------------------------------------------------------------------------
def test_reached_never_fires_before_every_seed_crosses_top_plus_margin():
    """Property over random noisy curves (NaN evaluations included): the first firing prefix is the
    first where every seed's (and the mean's) isotonic curve is >= J_top + margin for `patience`
    points; no earlier prefix fires; a curve set that ends crossed always fires somewhere."""
    rng = np.random.default_rng(0)
    fired_any = 0
    for case in range(100):
        S = int(rng.integers(1, 5))
        T = int(rng.integers(4, 25))
        steps = np.unique(np.round(np.geomspace(100, 10_000, T)).astype(int))
        T = len(steps)
        tau = rng.uniform(500, 20_000, size=S)
        Y = 100 * (1 - np.exp(-steps[:, None] / tau[None])) + rng.normal(0, rng.uniform(0, 15), (T, S))
        if case % 3 == 0:   # log-spaced evaluation: some chunks have no value
            Y[rng.random(T) < 0.3, :] = np.nan
        margin = float(rng.choice([0.0, 2.0, 5.0]))
        patience = int(rng.integers(1, 4))
        rule = es.Rule(thresholds=(30.0, float(rng.uniform(40, 90))), margin=margin, patience=patience)
        df = table(steps, Y)
        first = None
        for k, step, part in prefixes(df):
            d = rule.check(part, 10_000)
            want = crossed(part, "eval_return", rule.top + margin, patience)
            assert (d is not None) == want, (case, k)
            if d is not None and first is None:
                first = k
                assert d.reason == "reached" and d.stop_step == step
                assert d.threshold == pytest.approx(rule.top + margin)
                assert all(v >= rule.top + margin - 1e-9 for v in d.detail["seed_values"].values())
        if first is not None:
            fired_any += 1
            assert rule.check(df[df["env_steps"] < steps[first]], 10_000) is None   # one step earlier: no
    assert 15 < fired_any < 100   # the cases exercise both outcomes


def test_rule_is_deterministic_and_ignores_missing_metric():
    steps = np.array([100, 200, 400, 800])
    Y = np.array([[10.0, 12.0], [50.0, 55.0], [np.nan, np.nan], [80.0, 90.0]])
    rule = es.Rule(thresholds=(20.0, 60.0), margin=5.0)
    df = table(steps, Y)
    a, b = rule.check(df, 1000), rule.check(df.sample(frac=1.0, random_state=1), 1000)
    assert a == b and a.reason == "reached" and a.stop_step == 800
    assert rule.check(df[df.env_steps <= 400], 1000) is None          # 400 has no value: 50 < 65
    assert es.Rule(metric="other", thresholds=(1.0,)).check(df, 1000) is None   # metric not logged


def test_unreachable_stops_a_hopeless_curve_and_spares_one_that_gets_there():
    """Assumption documented in early_stop: no late acceleration in log steps beyond rate_factor times
    the steepest rise so far. Curves here: a plateau far below J_low (stopped, censored, only once
    t >= min_fraction·budget), and curves linear or concave in log-steps that reach J_low by the
    budget (never stopped by the rule)."""
    budget = 100_000
    steps = np.unique(np.round(np.geomspace(1000, budget, 30)).astype(int))
    rule = es.Rule(thresholds=(50.0, 80.0), unreachable=True, min_fraction=0.5, rate_factor=2.0)
    plateau = np.stack([10 * (1 - np.exp(-steps / 3000.0)), 12 * (1 - np.exp(-steps / 2000.0))], axis=1)
    fired = [(step, rule.check(part, budget)) for _, step, part in prefixes(table(steps, plateau))]
    stops = [(step, d) for step, d in fired if d is not None]
    assert stops, "a plateau at 10 never reaches J_low = 50"
    step, d = stops[0]
    assert d.reason == "unreachable" and step >= 0.5 * budget and d.detail["best_bound"] < 50
    assert all(dd is None for s, dd in fired if s < 0.5 * budget)
    assert rule.check(table(steps, plateau)[lambda x: x.env_steps <= step], budget) == d   # deterministic
    lt = np.log(steps / steps[0]) / np.log(budget / steps[0])
    for late in (51.0 * lt, 60.0 * np.sqrt(lt), 55.0 * lt ** 1.5):   # reach J_low = 50 at the budget
        Y = np.stack([late, late + 1.0], axis=1)
        for _, step, part in prefixes(table(steps, Y)):
            assert rule.check(part, budget) is None, (step, late[-1])


def test_savings_and_status_fields():
    d = es.Decision("reached", 300, 41.0, {})
    cfg = {"env_steps": 1000, "batch_size": 32, "utd": 2.0}
    fields = es.status_fields(d, 1000, 3, cfg, 50)
    assert fields["stopped_early"] == "reached" and fields["stop_step"] == 300
    assert fields["saved_env_steps"] == 3 * 700
    assert fields["saved_flops"] == pytest.approx(3 * 700 * 10 * 50 * 32 * 2.0)
    assert es.status_fields(d, 1000, 3, cfg, None)["saved_flops"] is None        # no N: not computable
    assert es.savings(d, 1000, 1, {"batch_size": 4}, 10) == (700, pytest.approx(700 * 10 * 10 * 4))   # no utd: σ=1
    assert es.status_fields(None, 1000, 3, cfg, 50)["stopped_early"] is None


# ---- spec ------------------------------------------------------------------------------------
def spec(tmp_path, early_stop, **more):
    return {"agent": "toy", "out_dir": str(tmp_path / "s"), "env_steps": 1000, "seeds": 2,
            "base": {"chunk_env_steps": 100}, "grid": {"width": [4, 16]}, "early_stop": early_stop,
            "backend": {"workers": 0}, **more}


@pytest.mark.parametrize("block, message", [
    ([40], "early_stop: expected a mapping"),
    ({"thresholds": [40], "typo": 1}, "early_stop.typo: unknown key"),
    ({"margin": 1.0}, "early_stop.thresholds: missing"),
    ({"thresholds": []}, "early_stop.thresholds: expected a non-empty list"),
    ({"thresholds": [50, 40]}, "early_stop.thresholds: must be strictly increasing"),
    ({"thresholds": [40, "x"]}, "early_stop.thresholds: expected a finite number"),
    ({"thresholds": [40, float("nan")]}, "early_stop.thresholds: expected a finite number"),
    ({"thresholds": [40], "margin": -1}, "early_stop.margin: must be >= 0"),
    ({"thresholds": [40], "patience": 0}, "early_stop.patience: expected an integer >= 1"),
    ({"thresholds": [40], "patience": 1.5}, "early_stop.patience: expected an integer >= 1"),
    ({"thresholds": [40], "unreachable": "yes"}, "early_stop.unreachable: expected true or false"),
    ({"thresholds": [40], "min_fraction": 0}, "early_stop.min_fraction: must be > 0"),
    ({"thresholds": [40], "min_fraction": 1.5}, "early_stop.min_fraction: must be <= 1"),
    ({"thresholds": [40], "rate_factor": 0.5}, "early_stop.rate_factor: must be >= 1"),
    ({"thresholds": [40], "metric": ""}, "early_stop.metric: expected a metric column name"),
])
def test_bad_early_stop_blocks_fail_in_one_line(tmp_path, block, message):
    with pytest.raises(SpecError) as e:
        parse_spec(spec(tmp_path, block))
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_good_block_parses_to_a_picklable_rule(tmp_path):
    import pickle
    s = parse_spec(spec(tmp_path, {"thresholds": [20, 40], "margin": 1, "patience": 2, "unreachable": True}))
    assert s.early_stop == es.Rule("eval_return", (20.0, 40.0), 1.0, 2, True, 0.5, 2.0)
    assert pickle.loads(pickle.dumps(s.early_stop)) == s.early_stop
    assert parse_spec(spec(tmp_path, {"thresholds": 40})).early_stop.thresholds == (40.0,)


def test_kinds_that_cannot_stop_are_refused(tmp_path):
    import dataclasses
    registry.register("toy_nostop", dataclasses.replace(toy.TOY, name="toy_nostop", stoppable=False))
    try:
        with pytest.raises(SpecError, match=r"^early_stop: agent 'toy_nostop' cannot stop a trial early"):
            parse_spec({**spec(tmp_path, {"thresholds": [40]}), "agent": "toy_nostop"})
    finally:
        registry._ENTRIES.pop("toy_nostop", None)
        registry._CACHE.pop("toy_nostop", None)
    # every built-in kind has a stop hook (grpo seed by seed: tests/test_llm_early_stop.py)
    assert all(registry.get(k).stoppable for k in ("sac", "dqn", "crl", "flow_grpo", "toy", "grpo"))


# ---- the sweep -------------------------------------------------------------------------------
def first_stop(cfg: toy.Config, rule: es.Rule, seeds: int, seed: int = 0):
    """Where the rule first fires on the toy curve of a trial (independently of the runner)."""
    rows = [{"seed": s, "chunk": c, "env_steps": cfg.chunk_ends[c], "eval_return": toy.curve(cfg, seed + s, c)}
            for c in range(cfg.num_chunks) for s in range(seeds)]
    df = pd.DataFrame(rows)
    for c in range(cfg.num_chunks - 1):      # the last chunk is the budget: never "early"
        if rule.check(df[df.chunk <= c], cfg.env_steps) is not None:
            return c
    return None


def test_stopped_trials_keep_rows_reason_and_savings(tmp_path, capsys):
    # width 64 reaches J_top + margin = 81 after 3 chunks, width 4 after 9 (of 10), width 1 never does
    s = parse_spec(spec(tmp_path, {"thresholds": [40, 80], "margin": 1.0}, grid={"width": [1, 4, 64]}))
    summary = run_sweep(s, progress=False)
    store = Store(s.out_dir)
    total_saved = 0
    for t in s.trials:
        st = store.status(t.id)
        cfg = toy.Config.from_dict(t.config)
        c = first_stop(cfg, s.early_stop, t.seeds)
        df = pd.read_parquet(store.trial_dir(t.id) / "metrics.parquet")
        assert st["state"] == "done" and st["budget_env_steps"] == 1000
        if c is None:
            assert t.config["width"] == 1
            assert st["stopped_early"] is None and st["saved_env_steps"] == 0
            assert len(df) == cfg.num_chunks * 2
            continue
        assert st["stopped_early"] == "reached" and st["stop_step"] == cfg.chunk_ends[c]
        assert sorted(set(df["chunk"])) == list(range(c + 1)) and len(df) == (c + 1) * 2   # every row kept
        assert st["saved_env_steps"] == 2 * (1000 - cfg.chunk_ends[c])
        n = cfg.width ** 2 * cfg.depth
        assert st["saved_flops"] == pytest.approx(st["saved_env_steps"] * 10 * n * cfg.batch_size * cfg.utd)
        assert st["early_stop"]["reason"] == "reached" and st["early_stop"]["threshold"] == 81.0
        total_saved += st["saved_env_steps"]
    assert summary["early_stop"]["stopped"] == 2 and summary["early_stop"]["reached"] == 2
    assert summary["early_stop"]["saved_env_steps"] == total_saved > 0
    tab = collect(s.out_dir)
    by = tab.groupby("trial_id").agg(n=("chunk", "size"), why=("stopped_early", "first"), at=("stop_step", "first"))
    for t in s.trials:
        st = store.status(t.id)
        assert by.loc[t.id, "n"] == len(pd.read_parquet(store.trial_dir(t.id) / "metrics.parquet"))
        assert (by.loc[t.id, "why"] or None) == st["stopped_early"]
        assert (math.isnan(by.loc[t.id, "at"]) if st["stop_step"] is None else by.loc[t.id, "at"] == st["stop_step"])
    # a rerun repeats nothing and the stopped trials stay stopped
    logs = {t.id: (store.trial_dir(t.id) / "executions.log").read_text() for t in s.trials}
    run_sweep(s, progress=False)
    assert logs == {t.id: (store.trial_dir(t.id) / "executions.log").read_text() for t in s.trials}
    capsys.readouterr()
    assert cli.main(["sweep", "status", str(s.out_dir), "--trials"]) == 0
    out = capsys.readouterr().out
    assert "stopped early: 2" in out and "reached @" in out


def test_unreachable_trial_is_censored_not_dropped(tmp_path):
    # utd 0.01, width 1: the toy curve creeps to ~18 by the budget; width 16 / utd 4 reaches 85 early
    s = parse_spec(spec(tmp_path, {"thresholds": [85, 90], "unreachable": True}, env_steps=2000,
                        grid={"width": [1, 16], "utd": [0.01, 4.0]}))
    run_sweep(s, progress=False)
    store = Store(s.out_dir)
    st = {(t.config["width"], t.config["utd"]): store.status(t.id) for t in s.trials}
    slow = st[(1, 0.01)]
    assert slow["state"] == "done" and slow["stopped_early"] == "unreachable"
    assert slow["stop_step"] >= 0.5 * 2000 and slow["early_stop"]["detail"]["best_bound"] < 85
    assert slow["saved_env_steps"] == 2 * (2000 - slow["stop_step"])
    assert st[(16, 4.0)]["stopped_early"] == "reached"
    # the curves that do reach J_low (width 16 at utd 0.01 gets to 85 only late) are not cut
    for key, v in st.items():
        if v["stopped_early"] != "unreachable":
            assert key != (1, 0.01)
    tab = collect(s.out_dir)
    t_slow = [t.id for t in s.trials if (t.config["width"], t.config["utd"]) == (1, 0.01)][0]
    rows = tab[tab.trial_id == t_slow]
    assert len(rows) == 2 * (slow["stop_step"] // 100) and set(rows["stopped_early"]) == {"unreachable"}
    from scaling_rl.scaling import data
    cs = data.curves_from_table(tab, "eval_return")
    assert len(cs.curves) == 4     # the censored configuration is still a curve (never reaching J)


def test_pack_stops_when_every_member_has_stopped_each_keeps_its_decision(tmp_path):
    # toy rate grows with lr**0.1: the lr=0.1 member reaches J before the lr=1e-3 one; the pack stops
    # when both have, and each member records its own decision at the pack's stop step
    s = parse_spec(spec(tmp_path, {"thresholds": [30, 50]}, pack=True,
                        grid={"seed": [0, 1], "lr": [1e-3, 1e-1], "width": [4]}))
    run_sweep(s, progress=False)
    store = Store(s.out_dir)
    packs = {store.status(t.id)["packed_in"] for t in s.trials}
    assert len(packs) == 1
    pack_df = pd.read_parquet(store.root / "packs" / packs.pop() / "metrics.parquet")
    stop = int(pack_df["env_steps"].max())
    alone = {t.config["lr"]: first_stop(toy.Config.from_dict(t.config), s.early_stop, 2, 0) for t in s.trials}
    assert alone[1e-1] < alone[1e-3]
    assert stop == toy.Config.from_dict(s.trials[0].config).chunk_ends[alone[1e-3]]
    values = set()
    for t in s.trials:
        st = store.status(t.id)
        assert st["state"] == "done" and st["stopped_early"] == "reached" and st["stop_step"] == stop
        assert st["saved_env_steps"] == 2 * (1000 - stop)
        df = pd.read_parquet(store.trial_dir(t.id) / "metrics.parquet")
        assert int(df["env_steps"].max()) == stop and set(df["seed"]) == {0, 1}
        values.add(tuple(st["early_stop"]["detail"]["seed_values"].values()))
    assert len(values) == 4    # each member's own numbers


def test_killed_after_the_decision_resumes_to_the_same_stop(tmp_path):
    """The window kill -9 can hit: the rule fired and the table is written, the trial status is not.
    The resumed trial asks the rule again on its table, trains nothing more, and records the stop."""
    s = parse_spec(spec(tmp_path, {"thresholds": [20, 40], "margin": 1.0}, grid={"width": [4]}))
    t = s.trials[0]
    from scaling_rl.sweep import prepare
    store = prepare(s)
    tdir = store.trial_dir(t.id)
    w = es.Watcher(s.early_stop, 1000, tdir)
    toy.run(t.config, str(tdir), t.seeds, t.seed, stop=w)      # the "killed" attempt
    assert w.fired is not None
    rows = pd.read_parquet(tdir / "metrics.parquet")
    (tdir / es.RECORD).unlink()   # even without the record: the rule is re-asked on the table
    run_sweep(s, progress=False)
    st = store.status(t.id)
    assert st["state"] == "done" and st["stopped_early"] == "reached" and st["stop_step"] == w.fired.stop_step
    pd.testing.assert_frame_equal(pd.read_parquet(tdir / "metrics.parquet"), rows)
    assert len((tdir / "executions.log").read_text().splitlines()) == 2


@pytest.mark.slow   # soak (`make test-slow`); the deterministic kill: test_killed_after_the_decision_resumes_to_the_same_stop
def test_kill_minus_9_at_random_moments_then_resume(tmp_path):
    out = tmp_path / "store"
    p = tmp_path / "spec.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: es_kill
        agent: toy
        out_dir: {out}
        env_steps: 1000
        seeds: 2
        base: {{chunk_seconds: 0.4, chunk_env_steps: 100}}
        grid: {{width: [1, 2, 3, 4]}}
        early_stop: {{thresholds: [40, 70]}}
        backend: {{workers: 2}}
    """))
    s = parse_spec(__import__("yaml").safe_load(p.read_text()))
    want = {t.id: first_stop(toy.Config.from_dict(t.config), s.early_stop, 2) for t in s.trials}
    assert any(c is None for c in want.values()) and any(c is not None for c in want.values())
    store = Store(out)
    rng = random.Random(7)
    for attempt in range(3):
        proc = subprocess.Popen([*SCALING_RL, "sweep", "run", str(p), "--no-progress"], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(1.5, 2.5))
        assert proc.poll() is None, "the sweep finished before it was killed: give it more work"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.time() + 20
        while any(store.is_locked(t) for t in store.trial_ids()) and time.time() < deadline:
            time.sleep(0.1)
    done = subprocess.run([*SCALING_RL, "sweep", "run", str(p), "--no-progress"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for t in s.trials:
        st = store.status(t.id)
        cfg = toy.Config.from_dict(t.config)
        df = pd.read_parquet(store.trial_dir(t.id) / "metrics.parquet")
        assert st["state"] == "done" and not df.duplicated(["seed", "chunk"]).any()
        c = want[t.id]
        last = cfg.num_chunks - 1 if c is None else c
        assert sorted(set(df["chunk"])) == list(range(last + 1))
        assert st["stopped_early"] == (None if c is None else "reached")
    logs = {t: (store.trial_dir(t) / "executions.log").read_text() for t in store.trial_ids()}
    subprocess.run([*SCALING_RL, "sweep", "run", str(p), "--no-progress"], check=True, timeout=120,
                   capture_output=True)
    assert logs == {t: (store.trial_dir(t) / "executions.log").read_text() for t in store.trial_ids()}
    assert max(store.status(t)["attempts"] for t in store.trial_ids()) >= 2


# ---- curves: replicas stopped at different steps ----------------------------------------------
def test_align_seeds_holds_reached_seeds_and_gives_the_full_run_d_j():
    from scaling_rl.scaling import data
    from scaling_rl.scaling.curves import first_crossing, isotonic_rows

    steps = np.unique(np.round(np.geomspace(1000, 100_000, 25)).astype(int))
    tau = np.array([4000.0, 6000.0, 9000.0, 15000.0, 20000.0, 30000.0])   # 3 replica trials x 2 seeds
    rng = np.random.default_rng(3)
    Y = 100 * (1 - np.exp(-steps[:, None] / tau[None])) + rng.normal(0, 1.0, (len(steps), 6))
    rule = es.Rule(thresholds=(40.0, 70.0), margin=3.0)
    frames, stops = [], []
    for r in range(3):
        part = table(steps, Y[:, 2 * r:2 * r + 2])
        stop = next((st for _, st, p in prefixes(part) if rule.check(p, 100_000) is not None), None)
        stops.append(stop)
        if r < 2:   # replicas 0, 1 stopped (reached); replica 2 ran its whole budget
            part = part[part.env_steps <= stop].assign(stopped_early="reached", stop_step=float(stop))
        else:
            part = part.assign(stopped_early=None, stop_step=np.nan)
        frames.append(part.assign(seed=part.seed + 2 * r, trial_id=f"t{r}"))
    assert stops[0] < stops[1] < steps[-1]
    common = dict(env="toy/law", utd=1.0, param_count=64.0, batch_size=32.0, lr=1e-3)
    stopped = pd.concat(frames, ignore_index=True).assign(**common)
    full = table(steps, Y).assign(**common, trial_id=lambda d: "t" + (d.seed // 2).astype(str))
    c_stop = data.curves_from_table(stopped, "eval_return")
    c_full = data.curves_from_table(full, "eval_return")
    assert len(c_stop.curves) == 1 and not c_stop.notes        # nothing dropped, no extra config key
    a, b = c_stop.curves[0], c_full.curves[0]
    assert a.n_seeds == 6 and np.array_equal(a.steps, b.steps)  # the full grid: nobody truncated
    for s, stop in ((0, stops[0]), (2, stops[1])):             # held at the last isotonic value
        held = a.returns[a.steps > stop, s]
        own = isotonic_rows(Y[steps <= stop, s][None])[0][-1]
        assert np.allclose(held, own) and own >= rule.top + rule.margin
    J = np.array([20.0, 40.0, 55.0, 70.0])
    d_stop, br = first_crossing(a.steps, isotonic_rows(a.returns.mean(axis=1)[None]), J, return_bracket=True)
    d_full = first_crossing(b.steps, isotonic_rows(b.returns.mean(axis=1)[None]), J)
    assert np.all(np.isfinite(d_stop))
    # every threshold up to J_top (the rule's top, the one early stopping is about), not only the first
    assert J[-1] == rule.top
    assert np.all(np.abs(np.log(d_stop[0] / d_full[0])) <= br[0] + 1e-12)
    # at J_top the held seeds sit below where their full runs go, so the seed mean crosses later: here
    # +19% (one log-point bracket, 0.19) — early stopping does shift D_J(J_top), within its bracket
    assert 0 < np.log(d_stop[0, -1] / d_full[0, -1]) <= br[0, -1] + 1e-12
    # a censored (unreachable) replica is not extended: it is a seed that ended early like any other
    # (here before half the longest, so dropped with a note; otherwise it would truncate the grid)
    cens = stopped.copy()
    cens.loc[cens.trial_id == "t1", "stopped_early"] = "unreachable"
    c_cens = data.curves_from_table(cens, "eval_return")
    assert stops[1] < 0.5 * steps[-1]
    assert c_cens.curves[0].n_seeds == 4 and "dropped seed(s) [2, 3]" in c_cens.notes[0]
    late = cens[(cens.trial_id != "t1") | (cens.env_steps <= 60_000)]   # censored at 60k >= half: truncates
    late = pd.concat([late, stopped[(stopped.trial_id == "t1")].iloc[:0]])
    full_t1 = table(steps, Y[:, 2:4]).assign(seed=lambda d: d.seed + 2, trial_id="t1", stopped_early="unreachable",
                                             stop_step=60_000.0, **common)
    late = pd.concat([late[late.trial_id != "t1"], full_t1[full_t1.env_steps <= 60_000]], ignore_index=True)
    c_late = data.curves_from_table(late, "eval_return")
    assert c_late.curves[0].n_seeds == 6 and c_late.curves[0].steps[-1] <= 60_000


# ---- train.run (tiny DQN) --------------------------------------------------------------------
@pytest.mark.skipif(not (REPO / "scaling_rl" / "agents" / "dqn.py").exists(), reason="no dqn agent here")
def test_train_run_stops_checkpoints_and_stays_stopped(tmp_path):
    from scaling_rl import agents, train
    from scaling_rl.sweep.runner import enable_compile_cache
    enable_compile_cache(str(REPO / ".jax_cache"))
    cfg = agents.get("dqn").Config.from_dict(
        {"env": "gymnax/CartPole-v1", "width": 16, "depth": 1, "batch_size": 32, "learning_starts": 200,
         "chunk_env_steps": 500, "eval_episodes": 2, "buffer_size": 2000, "env_steps": 2000})
    calls = []

    def stop(chunk, df):
        calls.append(chunk)
        return {"reason": "reached", "stop_step": int(df["env_steps"].max())} if chunk >= 1 else None

    out = tmp_path / "run"
    df = train.run("dqn", cfg, out, 2, seed=0, progress=False, checkpoint_every=0, stop=stop)
    assert calls == [0, 1] and sorted(set(df["chunk"])) == [0, 1]
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "done" and status["chunk"] == 2 and status["stopped"]["stop_step"] == int(df["env_steps"].max())
    assert (out / "checkpoints" / "2").exists()            # the stop chunk was checkpointed
    # a rerun returns the stored table and never continues the stopped run
    again = train.run("dqn", cfg, out, 2, seed=0, progress=False, stop=lambda c, d: None)
    pd.testing.assert_frame_equal(again, pd.read_parquet(out / "metrics.parquet"))
    assert len(again) == len(df)
    # killed after the checkpoint, before status.json said done: the rule, asked again on the
    # restored rows, stops it at once (no chunk run)
    (out / "status.json").write_text(json.dumps({"status": "running", "chunk": 2}))
    calls.clear()
    again = train.run("dqn", cfg, out, 2, seed=0, progress=False, stop=stop)
    assert calls == [1] and sorted(set(again["chunk"])) == [0, 1]
    assert json.loads((out / "status.json").read_text())["stopped"]["stop_step"] == int(df["env_steps"].max())


@pytest.mark.skipif(not (REPO / "scaling_rl" / "agents" / "dqn.py").exists(), reason="no dqn agent here")
def test_dqn_sweep_trial_stops_through_the_runner(tmp_path):
    # CartPole's eval return is >= 8 from the start: J_top = 5 is reached at the first evaluation
    s = parse_spec({"agent": "dqn", "out_dir": str(tmp_path / "s"), "env_steps": 2000, "seeds": 2,
                    "compile_cache": str(REPO / ".jax_cache"),
                    "base": {"env": "gymnax/CartPole-v1", "width": 16, "depth": 1, "batch_size": 32,
                             "learning_starts": 200, "chunk_env_steps": 500, "eval_episodes": 2,
                             "buffer_size": 2000},
                    "grid": {"seed": [3]}, "early_stop": {"thresholds": [2, 5]}, "backend": {"workers": 0}})
    run_sweep(s, progress=False)
    store = Store(s.out_dir)
    t = s.trials[0]
    st = store.status(t.id)
    df = pd.read_parquet(store.trial_dir(t.id) / "metrics.parquet")
    assert st["state"] == "done" and st["stopped_early"] == "reached"
    assert st["stop_step"] == int(df["env_steps"].max()) and sorted(set(df["chunk"])) == [0]
    assert st["saved_env_steps"] == 2 * (2000 - st["stop_step"])
    assert st["saved_flops"] == pytest.approx(st["saved_env_steps"] * 10 * st["param_count"] * 32 * t.config["utd"])
    assert json.loads((store.trial_dir(t.id) / "status.json").read_text())["stopped"]["reason"] == "reached"
