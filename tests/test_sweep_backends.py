"""Sweep backends against real schedulers: a local Ray cluster and a real single-node Slurm
cluster (`bash scripts/slurm_cluster.sh start`; CI sets SCALING_RL_REQUIRE_SLURM=1 so a missing
cluster fails instead of skipping)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from scaling_rl.sweep import Store, parse_spec, run_sweep, toy

SCALING_RL = [sys.executable, "-m", "scaling_rl.cli"]


def _slurm_up() -> str | None:
    """None when a Slurm cluster answers, else why not."""
    if not shutil.which("sinfo") or not shutil.which("sbatch"):
        return "slurm is not installed (run: bash scripts/slurm_cluster.sh start)"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"sinfo failed: {e}"
    states = out.stdout.split()
    if out.returncode != 0 or not any(s.rstrip("*") in ("idle", "mix", "alloc") for s in states):
        return f"no usable Slurm node (sinfo: {out.stdout.strip() or out.stderr.strip()})"
    return None


@pytest.fixture
def slurm():
    why = _slurm_up()
    if why:
        if os.environ.get("SCALING_RL_REQUIRE_SLURM") == "1":
            pytest.fail(f"SCALING_RL_REQUIRE_SLURM=1 but {why}")
        pytest.skip(why)


def check_done(store: Store, tids, seeds: int) -> None:
    for tid in tids:
        st = store.status(tid)
        assert st["state"] == "done", (tid, st)
        cfg = toy.Config.from_dict(store.trial(tid).config)
        df = pd.read_parquet(store.trial_dir(tid) / "metrics.parquet")
        assert len(df) == cfg.num_chunks * seeds and not df.duplicated(["seed", "chunk"]).any()


@pytest.mark.slurm
def test_slurm_job_array_runs_sweep_and_requeue_resumes(tmp_path, slurm):
    out = tmp_path / "store"
    spec = tmp_path / "spec.yaml"
    spec.write_text(textwrap.dedent(f"""\
        name: slurmtest
        agent: toy
        out_dir: {out}
        env_steps: 1000
        seeds: 2
        base: {{chunk_seconds: 0.3}}
        grid: {{width: [3, 5, 7]}}
        backend: {{name: slurm, slurm: {{time_min: 5, array_parallelism: 2}}}}
    """))
    proc = subprocess.Popen([*SCALING_RL, "sweep", "run", str(spec), "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    store = Store(out)
    # preempt one running array element (submitit's requeue signal), then let it start at once
    job, deadline = None, time.time() + 120
    while job is None and time.time() < deadline and proc.poll() is None:
        for tid in store.trial_ids():
            st = store.status(tid)
            mp = store.trial_dir(tid) / "metrics.parquet"
            if st.get("state") == "running" and mp.exists() and len(pd.read_parquet(mp)) >= 4:
                job = _job_of(st["pid"])
                victim = tid
                break
        time.sleep(0.2)
    assert job, "no trial got going under slurm"
    subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=30)
    deadline = time.time() + 60
    while time.time() < deadline:  # requeued jobs wait ~2 min to become eligible: not in a test
        q = subprocess.run(["squeue", "-h", "-j", job, "-o", "%r"], capture_output=True, text=True)
        if "BeginTime" in q.stdout:
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], timeout=30)
            break
        time.sleep(0.3)
    text, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, text
    check_done(store, store.trial_ids(), seeds=2)
    st = store.status(victim)
    assert st["attempts"] == 2, st  # preempted once, resumed from its checkpoint
    executions = (store.trial_dir(victim) / "executions.log").read_text().splitlines()
    assert len(executions) == 2
    assert (out / "slurm").is_dir() and any((out / "slurm").iterdir())


def _job_of(pid: int) -> str | None:
    """The Slurm job id of a process (from its environment), e.g. '12_1'."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    d = dict(e.split(b"=", 1) for e in env if b"=" in e)
    array, task = d.get(b"SLURM_ARRAY_JOB_ID"), d.get(b"SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array.decode()}_{task.decode()}"
    job = d.get(b"SLURM_JOB_ID")
    return job.decode() if job else None


def test_ray_backend_runs_tasks_on_local_cluster(tmp_path):
    pytest.importorskip("ray")
    spec = parse_spec({"agent": "toy", "out_dir": str(tmp_path / "s"), "seeds": 2,
                       "base": {"chunk_seconds": 0.02},
                       "grid": {"width": [2, 3, 4]},
                       "backend": {"name": "ray", "ray": {"init_num_cpus": 2, "num_cpus": 1}}})
    summary = run_sweep(spec, progress=False)
    assert summary["counts"]["done"] == 3
    store = Store(spec.out_dir)
    check_done(store, store.trial_ids(), seeds=2)
    pids = {store.status(t)["pid"] for t in store.trial_ids()}
    assert os.getpid() not in pids  # ran in Ray worker processes
    # same spec, same store: a rerun (any backend) has nothing left to do
    assert run_sweep(spec, backend="local", workers=0, progress=False)["counts"]["done"] == 3
    assert all(len((store.trial_dir(t) / "executions.log").read_text().splitlines()) == 1
               for t in store.trial_ids())
