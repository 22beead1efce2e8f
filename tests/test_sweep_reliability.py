"""Sweep reliability: kill -9 the local runner at random moments; many writers on one store."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from scaling_rl.sweep import Store, collect, toy

SCALING_RL = [sys.executable, "-m", "scaling_rl.cli"]


def spec_file(tmp_path: Path, out: Path, widths, chunk_seconds: float, workers: int,
              env_steps: int = 800) -> Path:
    p = tmp_path / "spec.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: reliability
        agent: toy
        out_dir: {out}
        env_steps: {env_steps}
        seeds: 2
        base: {{chunk_seconds: {chunk_seconds}, chunk_env_steps: 100}}
        grid: {{width: {list(widths)}}}
        backend: {{workers: {workers}}}
    """))
    return p


def check_store(store: Store, n_trials: int) -> None:
    """Every trial done once, with exactly its rows: no torn, missing or duplicated rows."""
    tids = store.trial_ids()
    assert len(tids) == n_trials
    for tid in tids:
        st = store.status(tid)
        assert st["state"] == "done", (tid, st)
        df = pd.read_parquet(store.trial_dir(tid) / "metrics.parquet")
        cfg = toy.Config.from_dict(store.trial(tid).config)
        assert len(df) == cfg.num_chunks * 2 and not df.duplicated(["seed", "chunk"]).any()
        assert sorted(set(df["chunk"])) == list(range(cfg.num_chunks))
        assert all(df["episode_return"] == [toy.curve(cfg, s, c) for s, c in zip(df["seed"], df["chunk"])])
    table = collect(store.root)
    assert len(table) == sum(toy.Config.from_dict(store.trial(t).config).num_chunks * 2 for t in tids)
    assert not table.duplicated(["trial_id", "seed", "chunk"]).any()


def wait_unlocked(store: Store, timeout: float = 20.0) -> None:
    """After the runner is killed its workers must die too (their locks free up)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not any(store.is_locked(t) for t in store.trial_ids()):
            return
        time.sleep(0.1)
    raise AssertionError("workers outlived their killed runner")


@pytest.mark.slow   # soak (`make test-slow`); a killed runner that resumes: test_sweep_agents, test_sweep_adaptive
def test_kill_minus_9_at_random_moments_then_rerun_finishes_everything_once(tmp_path):
    out = tmp_path / "store"
    n = 6
    # 6 trials x 10 chunks x 0.5 s on 2 workers = 15 s of work: 5 kills at most 3 s apart cannot finish it
    spec = spec_file(tmp_path, out, [2 + i for i in range(n)], chunk_seconds=0.5, workers=2, env_steps=1000)
    rng = random.Random(1234)
    store = Store(out)
    kills = 0
    for attempt in range(5):  # bounded: exactly 5 kills, each at a random moment
        proc = subprocess.Popen([*SCALING_RL, "sweep", "run", str(spec), "--no-progress"],
                                start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(1.0, 3.0))
        assert proc.poll() is None, "the sweep finished before it was killed: give it more work"
        if attempt % 2 == 0:
            os.kill(proc.pid, signal.SIGKILL)       # the runner only: its workers must follow
        else:
            os.killpg(proc.pid, signal.SIGKILL)     # the whole process group
        proc.wait()
        kills += 1
        wait_unlocked(store)
    assert kills >= 5
    proc = subprocess.run([*SCALING_RL, "sweep", "run", str(spec), "--no-progress"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    check_store(store, n)
    # done exactly once: a further rerun executes nothing
    before = {t: (store.trial_dir(t) / "executions.log").read_text() for t in store.trial_ids()}
    finished = {t: store.status(t)["finished"] for t in store.trial_ids()}
    subprocess.run([*SCALING_RL, "sweep", "run", str(spec), "--no-progress"], check=True, timeout=120,
                   capture_output=True)
    assert before == {t: (store.trial_dir(t) / "executions.log").read_text() for t in store.trial_ids()}
    assert finished == {t: store.status(t)["finished"] for t in store.trial_ids()}
    # and some trial really was interrupted and resumed along the way
    assert max(store.status(t)["attempts"] for t in store.trial_ids()) >= 2


def test_eight_concurrent_writers_lose_nothing(tmp_path):
    out = tmp_path / "store"
    n = 16
    spec = spec_file(tmp_path, out, [2 + i for i in range(n)], chunk_seconds=0.01, workers=0)
    procs = [subprocess.Popen([*SCALING_RL, "sweep", "run", str(spec), "--workers", "0", "--no-progress"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(8)]
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    store = Store(out)
    check_store(store, n)
    # no trial ran twice (nobody crashed, so each ran exactly once, under one lock)
    runs = [len((store.trial_dir(t) / "executions.log").read_text().splitlines()) for t in store.trial_ids()]
    assert runs == [1] * n
    assert len({store.status(t)["pid"] for t in store.trial_ids()}) >= 2  # the work was shared


def test_a_trial_another_process_is_adding_is_not_unreadable(tmp_path):
    """`add` makes the trial directory, then links trial.json in: a concurrent `sweep run` checking the
    store in between must not call that trial unreadable (it raised FileNotFoundError -> exit 2)."""
    store = Store(tmp_path / "store")
    d = store.trial_dir("abc123")
    d.mkdir(parents=True)
    assert store.unreadable("abc123") is None
    (d / "trial.json").write_text("{")
    assert "not valid JSON" in store.unreadable("abc123")
