"""Early stopping of the `grpo` trial kind, whose seeds run one after another (sweep/early_stop.py,
llm/sweep.py): each seed stops at its own first crossing, the trial is "reached" only when every
seed stopped, a seed that runs its budget makes the stopped ones run theirs, stopped seeds stay
stopped on resume, and the default path is unchanged.

The tiny model learns nothing in a few steps, so `GRPOTrainer.evaluate` is replaced by a known
per-seed accuracy curve (seed 0 rises by 0.2 per GRPO step, seed 1 by 0.1); everything else (SFT,
rollouts, updates, checkpoints, resume) is the real trainer."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from scaling_rl.llm.trainer import TIMING_COLUMNS
from scaling_rl.sweep import SpecError, Store, collect, parse_spec, registry, run_sweep
from scaling_rl.sweep import early_stop as es

REPO = Path(__file__).resolve().parent.parent
TIMING = list(TIMING_COLUMNS)
SEEDS, STEPS = 2, 6
METRIC = "eval/accuracy"


def base() -> dict:
    raw = yaml.safe_load((REPO / "sweeps" / "grpo_tiny.yaml").read_text())["base"]
    return {**raw, "group_size": 2, "hidden_size": 16, "loss_type": "grpo", "steps": STEPS,
            "eval_every": 1, "checkpoint_every": 2}


PER_STEP = base()["prompts_per_step"] * 2          # rollouts per GRPO step
BUDGET = STEPS * PER_STEP


def accuracy(seed: int, step: int) -> float:
    return min(1.0, (0.2 if seed % 2 == 0 else 0.1) * step)


@pytest.fixture(scope="module")
def fake_eval():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from scaling_rl.llm import trainer
    calls = []
    real_step = trainer.GRPOTrainer.train_step

    def evaluate(self):
        return {METRIC: accuracy(self.cfg.seed, self.step)}

    def train_step(self):
        calls.append((self.cfg.seed, self.step + 1))
        return real_step(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trainer.GRPOTrainer, "evaluate", evaluate)
        mp.setattr(trainer.GRPOTrainer, "train_step", train_step)
        yield calls


@pytest.fixture(scope="module")
def full(fake_eval, tmp_path_factory):
    """The trial run in full without a stop hook (the default path): the reference table."""
    kind = registry.get("grpo")
    return kind.run(base(), str(tmp_path_factory.mktemp("full")), SEEDS, 0).drop(columns=TIMING)


def first_stops(df, rule) -> dict:
    """Independently: each seed's first GRPO step (not the last) where the rule fires on its rows."""
    out = {}
    for s, g in df.groupby("seed"):
        out[s] = next((k for k in range(STEPS) if rule.check(g[g.chunk <= k], BUDGET) is not None), None)
    return out


def grpo_spec(tmp_path, early_stop) -> dict:
    return {"agent": "grpo", "out_dir": str(tmp_path / "s"), "seeds": SEEDS, "base": base(),
            "grid": {"lr": [base()["lr"]]}, "early_stop": early_stop, "backend": {"workers": 0}}


def test_every_seed_stops_at_its_own_crossing_and_the_trial_is_reached(tmp_path, fake_eval, full):
    s = parse_spec(grpo_spec(tmp_path, {"metric": METRIC, "thresholds": [0.2, 0.35]}))
    want = first_stops(full, s.early_stop)
    assert want == {0: 2, 1: 4}                    # seed 0: 0.4 at step 2; seed 1: 0.4 at step 4
    fake_eval.clear()
    run_sweep(s, progress=False)
    assert sorted(fake_eval) == [(0, 1), (0, 2), (1, 1), (1, 2), (1, 3), (1, 4)]   # no step past a stop
    store = Store(s.out_dir)
    (t,) = s.trials
    st = store.status(t.id)
    stops = {i: want[i] * PER_STEP for i in range(SEEDS)}
    assert st["state"] == "done" and st["stopped_early"] == "reached"
    assert st["stop_step"] == max(stops.values()) and st["budget_env_steps"] == BUDGET == 24
    assert st["saved_env_steps"] == sum(BUDGET - v for v in stops.values()) == 24
    assert st["saved_flops"] is None                 # 10*N*B*sigma does not describe a rollout
    d = st["early_stop"]["detail"]
    assert d["seed_stop_steps"] == {str(i): v for i, v in stops.items()} and d["sequential"] is True
    assert d["mean_reached"] is True                 # patience 1: the held seed mean is reached too
    tdir = store.trial_dir(t.id)
    df = pd.read_parquet(tdir / "metrics.parquet").drop(columns=TIMING)
    # every seed's rows are the full run's rows up to its stop step
    prefix = full[full.chunk <= full.seed.map(want)].reset_index(drop=True)
    pd.testing.assert_frame_equal(df, prefix)
    for i in range(SEEDS):                           # the stop step is checkpointed
        assert (tdir / f"seed_{i}" / "checkpoints" / f"step_{want[i]:06d}").is_dir()
    tab = collect(s.out_dir)
    assert set(tab["stopped_early"]) == {"reached"} and len(tab) == len(df)

    # rerun of the finished sweep: nothing; rerun of the kind (killed before its status): no step
    run_sweep(s, progress=False)
    assert store.status(t.id)["attempts"] == 1
    w = es.Watcher(s.early_stop, es.budget_of(t.config, registry.get("grpo")), tdir)
    again = registry.get("grpo").run(t.config, str(tdir), t.seeds, t.seed, stop=w)
    assert len(fake_eval) == 6 and w.final(again).to_json() == st["early_stop"]
    # killed after seed 1's step-2 checkpoint, before its stop checkpoint: it retrains 3 and 4, stops
    # at 4 again; the record alone (no seed asked) gives the decision back too
    import shutil
    shutil.rmtree(tdir / "seed_1" / "checkpoints" / "step_000004")
    (tdir / es.RECORD).unlink()
    w = es.Watcher(s.early_stop, es.budget_of(t.config, registry.get("grpo")), tdir)   # as the runner does
    again = registry.get("grpo").run(t.config, str(tdir), t.seeds, t.seed, stop=w)
    assert fake_eval[6:] == [(1, 3), (1, 4)]
    pd.testing.assert_frame_equal(again.drop(columns=TIMING), df)
    assert w.budget == BUDGET and w.final(again).to_json() == st["early_stop"]
    w2 = es.Watcher(s.early_stop, BUDGET, tdir)
    w2.sequential()
    assert w2.final(again).to_json() == st["early_stop"]


def test_a_seed_that_never_reaches_makes_the_trial_run_in_full(tmp_path, fake_eval, full):
    # J_top 0.9: seed 0 crosses at step 5 of 6 and stops; seed 1 never does, so seed 0 is resumed
    # from its stop checkpoint and run to its budget: the table is the full run's, no step twice
    s = parse_spec(grpo_spec(tmp_path, {"metric": METRIC, "thresholds": [0.5, 0.9]}))
    assert first_stops(full, s.early_stop) == {0: 5, 1: None}
    fake_eval.clear()
    run_sweep(s, progress=False)
    assert sorted(fake_eval) == sorted((i, k) for i in range(SEEDS) for k in range(1, STEPS + 1))
    store = Store(s.out_dir)
    (t,) = s.trials
    st = store.status(t.id)
    assert st["state"] == "done" and st["stopped_early"] is None and st["stop_step"] is None
    assert st["saved_env_steps"] == 0 and st["budget_env_steps"] == BUDGET
    df = pd.read_parquet(store.trial_dir(t.id) / "metrics.parquet").drop(columns=TIMING)
    pd.testing.assert_frame_equal(df, full)          # exactly the run without a stop hook
    rec = json.loads((store.trial_dir(t.id) / es.RECORD).read_text())
    assert set(rec["seeds"]) == {"0"}                # seed 0's stop is on record, and overruled


def test_a_base_policy_already_past_the_target_trains_no_step(tmp_path, fake_eval, full):
    # J_top 0: row 0 (accuracy 0 >= 0) already crosses: every seed stops before its first step
    s = parse_spec(grpo_spec(tmp_path, {"metric": METRIC, "thresholds": [0.0]}))
    fake_eval.clear()
    run_sweep(s, progress=False)
    store = Store(s.out_dir)
    (t,) = s.trials
    st = store.status(t.id)
    assert fake_eval == [] and st["stopped_early"] == "reached" and st["stop_step"] == 0
    assert st["saved_env_steps"] == SEEDS * BUDGET
    tdir = store.trial_dir(t.id)
    for i in range(SEEDS):
        assert sorted(p.name for p in (tdir / f"seed_{i}" / "checkpoints").iterdir()) == ["step_000000"]
    # run on without a stop: from the step-0 checkpoint, exactly the run that never stopped
    df = registry.get("grpo").run(t.config, str(tdir), t.seeds, t.seed)
    pd.testing.assert_frame_equal(df.drop(columns=TIMING), full)


def test_default_path_and_a_stop_that_never_fires_are_the_same_run(tmp_path, fake_eval, full):
    from scaling_rl.llm import trainer
    assert trainer.GRPOTrainer.should_stop(None, {}) is False
    asked = []
    df = registry.get("grpo").run(base(), str(tmp_path / "t"), SEEDS, 0,
                                  stop=lambda chunk, rows: asked.append((chunk, sorted(set(rows.seed)))))
    pd.testing.assert_frame_equal(df.drop(columns=TIMING), full)
    # asked on row 0 (the base policy) and after every step but the last, about the running seed's
    # own rows only; once seed 0 ran its budget the trial cannot count as stopped, so seed 1 is not
    # asked at all
    assert asked == [(k, [0]) for k in range(STEPS)]


KILLED = """
import json, sys, time
from scaling_rl.llm import trainer
from scaling_rl.sweep import parse_spec, run_sweep
real = trainer.GRPOTrainer.train_step
def train_step(self):
    time.sleep(0.2)
    return real(self)
trainer.GRPOTrainer.train_step = train_step
trainer.GRPOTrainer.evaluate = lambda self: {"eval/accuracy": min(1.0, (0.2 if self.cfg.seed % 2 == 0 else 0.1)
                                                                  * self.step)}
run_sweep(parse_spec(json.loads(sys.argv[1])), progress=False)
"""


@pytest.mark.slow   # soak: random kill -9s (`make test-slow`; docs/testing.md)
def test_kill_minus_9_at_random_moments_resumes_to_the_same_stops(tmp_path, fake_eval, full):
    import os
    import random
    import signal
    import subprocess
    import sys
    import time
    raw = grpo_spec(tmp_path, {"metric": METRIC, "thresholds": [0.2, 0.35]})
    s = parse_spec(raw)
    store = Store(s.out_dir)
    rng = random.Random(5)
    tdir = store.trial_dir(s.trials[0].id)
    # attempt 1 killed in seed 0's set-up / SFT / first steps, attempt 2 around seed 0's stop (its
    # step-2 checkpoint) or seed 1's set-up, attempt 3 between seed 1's step-2 checkpoint and its stop
    marks = [(None, 0.3, 1.5), ("seed_0/checkpoints/step_000002", 0.0, 0.8),
             ("seed_1/checkpoints/step_000002", 0.0, 0.4)]
    killed = 0
    for attempt, (mark, lo, hi) in enumerate(marks, 1):
        proc = subprocess.Popen([sys.executable, "-c", KILLED, json.dumps(raw)], cwd=REPO, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 90
        while (proc.poll() is None and time.time() < deadline
               and (store.status(s.trials[0].id).get("attempts", 0) < attempt
                    or (mark is not None and not (tdir / mark).exists()))):
            time.sleep(0.02)
        time.sleep(rng.uniform(lo, hi))
        killed += proc.poll() is None
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.time() + 20
        while any(store.is_locked(t) for t in store.trial_ids()) and time.time() < deadline:
            time.sleep(0.1)
    assert killed >= 2
    fake_eval.clear()
    run_sweep(s, progress=False)
    (t,) = s.trials
    st = store.status(t.id)
    assert st["state"] == "done" and st["stopped_early"] == "reached", st
    assert st["stop_step"] == 4 * PER_STEP and st["saved_env_steps"] == 24
    want = {0: 2, 1: 4}
    assert all(k <= want[i] for i, k in fake_eval)   # nothing trained past a seed's stop step
    df = pd.read_parquet(store.trial_dir(t.id) / "metrics.parquet").drop(columns=TIMING)
    pd.testing.assert_frame_equal(df, full[full.chunk <= full.seed.map(want)].reset_index(drop=True))


# ---- no torch needed -------------------------------------------------------------------------
def test_grpo_kind_budget_and_spec_checks(tmp_path):
    pytest.importorskip("torch")
    kind = registry.get("grpo")
    assert kind.stoppable and kind.sequential
    cfg = parse_spec(grpo_spec(tmp_path, {"metric": METRIC, "thresholds": [0.5]})).trials[0].config
    assert es.budget_of(cfg, kind) == STEPS * PER_STEP and es.budget_of(cfg) is None
    with pytest.raises(SpecError, match=r"^early_stop.unreachable: not supported for agent 'grpo'"):
        parse_spec(grpo_spec(tmp_path, {"metric": METRIC, "thresholds": [0.5], "unreachable": True}))
    w = es.Watcher(es.Rule(metric=METRIC, thresholds=(0.5,), unreachable=True), None, tmp_path)
    with pytest.raises(ValueError, match="^early_stop.unreachable: not supported"):
        w.sequential()


def seq_table(curves: dict, steps) -> pd.DataFrame:
    return pd.concat([pd.DataFrame({"seed": s, "env_steps": steps[:len(y)], "m": y}) for s, y in curves.items()],
                     ignore_index=True)


def run_sequentially(Y: np.ndarray, rule: es.Rule, steps):
    """Each seed (column) stops at its first crossing, as the grpo kind does; the trial's decision."""
    w = es.Watcher(rule, int(steps[-1]), Path("/nonexistent"))
    w.seed_fired = {}
    ends = {}
    for s in range(Y.shape[1]):
        for k in range(1, len(steps)):
            g = seq_table({s: Y[:k, s]}, steps)
            d = rule.check(g, int(steps[-1]))
            if d is not None:
                w.seed_fired[s] = d
                ends[s] = k
                break
        else:
            return None, None
    df = seq_table({s: Y[:ends[s], s] for s in ends}, steps)
    return w._seed_final(df), df


def test_held_seed_mean_is_reached_for_patience_one_not_always_beyond():
    rng = np.random.default_rng(0)
    steps = np.arange(1, 41) * 10
    n = 0
    for _ in range(60):
        tau = rng.uniform(5, 30, 3)
        Y = 1 - np.exp(-np.arange(1, 41)[:, None] / tau[None]) + rng.normal(0, 0.15, (40, 3))
        d, df = run_sequentially(Y, es.Rule(metric="m", thresholds=(0.6,)), steps)
        if d is None:
            continue
        n += 1
        assert d.detail["mean_reached"] and d.stop_step == df.env_steps.max()
        grid, iso = es.held_seed_mean(df, "m")
        assert iso[-1] >= 0.6 and d.detail["mean_value"] == iso[-1]
        saved, flops = es.savings(d, 400, 3, {}, None)
        assert saved == sum(400 - v for v in d.detail["seed_stop_steps"].values()) and flops is None
    assert n > 30
    # patience 2: seed 0 (20, 40, 80, 20) stops at its 4th point, seed 1 (40, 80, 20) at its 3rd and
    # is held at 50 = the target; every seed reached, the held seed mean (30, 60, 50, 35 -> isotonic
    # 48.3 at the last two points) does not: recorded, not acted on
    Y = np.array([[20.0, 40.0], [40.0, 80.0], [80.0, 20.0], [20.0, 0.0], [0.0, 0.0]])
    rule = es.Rule(metric="m", thresholds=(50.0,), patience=2)
    d, df = run_sequentially(Y, rule, np.arange(1, 6) * 10)
    assert d is not None and d.reason == "reached" and d.detail["seed_stop_steps"] == {"0": 40, "1": 30}
    assert d.detail["mean_reached"] is False and d.detail["mean_value"] == pytest.approx(145 / 3)
