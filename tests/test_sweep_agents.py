"""The sweep engine on real agents (train.run): store contents, collect for the scaling fit,
kill -9 mid-trial resumes from the checkpoint, wandb offline run files per trial."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from scaling_rl.sweep import Store, collect

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not (REPO / "scaling_rl" / "agents" / "dqn.py").exists(),
                                reason="the dqn agent is not in this checkout")
SCALING_RL = [sys.executable, "-m", "scaling_rl.cli"]
CACHE = REPO / ".jax_cache"   # the suite's persistent compile cache: reruns compile less


def spec_file(tmp_path: Path, out: Path, extra: str = "", env_steps: int = 1500) -> Path:
    p = tmp_path / "spec.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: dqn_tiny
        agent: dqn
        out_dir: {out}
        env_steps: {env_steps}
        seeds: 2
        compile_cache: {CACHE}
        base: {{env: gymnax/CartPole-v1, width: 16, depth: 1, batch_size: 32, learning_starts: 200,
                chunk_env_steps: 500, eval_episodes: 2, buffer_size: 2000}}
        grid: {{seed: [3]}}
    """) + extra)
    return p


def test_dqn_sweep_resumes_after_kill_and_collects_for_the_fit(tmp_path):
    out = tmp_path / "store"
    # 24 chunks of ~30 ms (warm caches), so the kill lands mid-run, not after the last checkpoint
    spec = spec_file(tmp_path, out, "wandb: {project: sweeptest, mode: offline}\n", env_steps=12000)
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    # a parent that used wandb exports its service ($WANDB_SERVICE); the killed attempt must not
    # leave its run id "in use" there for the resumed one (trials start their own service)
    import wandb
    wandb.teardown()   # an earlier test in this worker may hold a singleton that exported no service
    wandb.setup()
    env["WANDB_SERVICE"] = os.environ["WANDB_SERVICE"]
    proc = subprocess.Popen([*SCALING_RL, "sweep", "run", str(spec), "--workers", "1", "--no-progress"],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=env)
    store = Store(out)
    deadline = time.time() + 240
    killed = False
    while time.time() < deadline and proc.poll() is None:  # kill -9 once a checkpoint exists
        ckpts = [d for t in store.trial_ids() for d in (store.trial_dir(t) / "checkpoints").glob("[0-9]*")
                 if d.name.isdigit()]  # a finished orbax step (in-flight ones carry a tmp suffix)
        if ckpts:
            os.killpg(proc.pid, signal.SIGKILL)
            before = pd.read_parquet(store.trial_dir(store.trial_ids()[0]) / "metrics.parquet")
            killed = True
            break
        time.sleep(0.02)
    proc.wait(timeout=60)
    assert killed, "the sweep finished before it could be interrupted"
    n_total = json.loads((store.trial_dir(store.trial_ids()[0]) / "config.json").read_text())["num_chunks"]
    assert before["chunk"].max() < n_total - 1, "killed after the last chunk: nothing left to resume"
    done = subprocess.run([*SCALING_RL, "sweep", "run", str(spec), "--workers", "1", "--no-progress"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    tids = store.trial_ids()
    assert len(tids) == 1
    for tid in tids:
        st = store.status(tid)
        assert st["state"] == "done", st
        d = store.trial_dir(tid)
        assert json.loads((d / "config.json").read_text())["config"]["width"] == store.trial(tid).config["width"]
        df = pd.read_parquet(d / "metrics.parquet")
        n_chunks = json.loads((d / "config.json").read_text())["num_chunks"]
        assert len(df) == n_chunks * 2 and not df.duplicated(["seed", "chunk"]).any()
        assert sorted(set(df["chunk"])) == list(range(n_chunks))
        # wandb is a logger: one offline run per trial, grouped by sweep name
        # (the killed attempt left its own run dir; the resumed one appends to the same run id)
        runs = sorted(d.glob("wandb/offline-run-*/run-*.wandb"))
        assert runs, list(d.rglob("*"))[:20]
        assert len({r.name for r in runs}) == 1
        assert b"dqn_tiny" in runs[-1].read_bytes() and tid.encode() in runs[-1].read_bytes()
    assert store.status(tids[0])["attempts"] == 2  # interrupted once, resumed from its checkpoint
    # resumed, not restarted: the rows of the checkpointed chunk are the ones written before the kill
    after = pd.read_parquet(store.trial_dir(tids[0]) / "metrics.parquet")
    assert after.loc[after.chunk == 0, "wall_time"].tolist() == before.loc[before.chunk == 0, "wall_time"].tolist()
    table = collect(out)
    for col in ("trial_id", "agent", "env", "utd", "batch_size", "lr", "width", "depth", "param_count",
                "seed", "env_steps", "grad_steps", "episode_return", "eval_return"):
        assert col in table.columns, col
    assert len(table) == n_chunks * 2 and not table.duplicated(["trial_id", "seed", "chunk"]).any()
    assert sorted(set(table["seed"])) == [6, 7]  # unique replica number: trial seed 3 x 2 seeds + index
    for tid in tids:
        assert table.loc[table.trial_id == tid, "param_count"].iloc[0] == \
            json.loads((store.trial_dir(tid) / "config.json").read_text())["param_count"]
