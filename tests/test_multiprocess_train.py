"""`scaling-rl train --processes 2`: one trial as two JAX processes (scaling_rl/multiprocess.py).

One module-scoped scenario, in order (every step reuses the programs compiled before it through the
persistent compilation cache that tests/conftest.py sets):
  1. a 3-chunk SAC run over 2 processes; process 1 is killed (-9) once checkpoint 1 exists: the
     launcher and the surviving process exit non-zero, each with one line, well before any timeout;
  2. the same command again resumes from the checkpoint and finishes;
  3. a copy of the killed run's checkpoint (written by 2 processes) is resumed by 1 process with 1
     device: both runs end with the same metrics, to float summation order (and, in `make test-slow`,
     a checkpoint that 1 process wrote is resumed by 2 processes, to the same metrics).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from test_sweep_backends import slurm  # noqa: F401  (fixture: skip, or fail in CI, without a cluster)

from scaling_rl import train, train_cli
from scaling_rl.multiprocess import first_failure
from scaling_rl.sweep import Store

CONFIG = dict(env="gymnax/Pendulum-v1", num_envs=2, env_steps=96, chunk_env_steps=32, batch_size=8,
              width=16, depth=1, learning_starts=8, buffer_size=128, eval_episodes=2, data_parallel=True)
TIME = list(train.TIME_COLUMNS)


def _cmd(out: Path, processes: int = 2) -> list[str]:
    sets = [a for k, v in CONFIG.items() for a in ("--set", f"{k}={v}")]
    return [sys.executable, "-m", "scaling_rl.cli", "train", "--agent", "sac", *sets, "--out", str(out),
            "--no-progress", "--processes", str(processes)]


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("scaling-rl: error:")]


def _children(pid: int) -> list[int]:
    return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _metrics(out: Path) -> pd.DataFrame:
    return pd.read_parquet(out / "metrics.parquet").drop(columns=TIME)


def _copy_run(src: Path, dst: Path, step: int) -> None:
    """A run directory holding `src`'s config and only its checkpoint `step` (as if killed after it)."""
    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")
    shutil.copytree(src / "checkpoints" / str(step), dst / "checkpoints" / str(step))


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    root = tmp_path_factory.mktemp("mp")
    a = root / "two_procs"
    proc = subprocess.Popen(_cmd(a), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while not (a / "checkpoints" / "1").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    victims = _children(proc.pid)
    assert len(victims) == 2
    os.kill(victims[1], signal.SIGKILL)
    killed_at = time.time()
    _, killed_err = proc.communicate(timeout=300)
    killed = {"rc": proc.returncode, "exit_s": time.time() - killed_at, "stderr": killed_err,
              "status": json.loads((a / "status.json").read_text()),
              "rows": pd.read_parquet(a / "metrics.parquet").drop(columns=TIME),
              "steps": sorted(int(p.name) for p in (a / "checkpoints").iterdir() if p.name.isdigit())}
    b = root / "one_proc_from_two"
    _copy_run(a, b, killed["steps"][-1])

    rerun = subprocess.run(_cmd(a), capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]

    # 2 processes -> 1: this (pytest) process has one CPU device
    train.run("sac", train.make_config("sac", CONFIG), b, 1, progress=False)
    return killed, a, b


def test_kill_of_one_process_fails_the_trial_cleanly(scenario):
    killed, *_ = scenario
    assert killed["rc"] != 0
    # no hang: the survivor's collective fails at once (else: heartbeat 60 s; launcher grace 20 s)
    assert killed["exit_s"] < 60, killed["exit_s"]
    errors = _errors(killed["stderr"])
    assert errors and errors[-1].startswith("scaling-rl: error: process 1 of 2 was killed by SIGKILL"), errors
    # the survivor either failed on its own (its collective to the dead peer failed: its own one-line
    # error) or was still blocked (e.g. in orbax's save barrier, which waits for the heartbeat) and
    # the launcher killed it after GRACE_S; which one is a race on a loaded box, both are clean
    own = any(line.startswith("scaling-rl: error: process 0 of 2: ") for line in errors)
    assert own or "others: 0 was killed by SIGKILL" in errors[-1], killed["stderr"][-3000:]
    assert "Check failure stack trace" not in killed["stderr"]   # the survivor did not abort
    assert killed["status"]["status"] == "failed" and killed["steps"]   # checkpoint 1 (at least) kept


def test_rerun_resumes_from_the_last_checkpoint(scenario):
    killed, a, _ = scenario
    status = json.loads((a / "status.json").read_text())
    assert status["status"] == "done" and status["chunk"] == 3
    df = _metrics(a)
    assert list(df["chunk"]) == [0, 1, 2]
    # the chunks run before the kill are the resumed run's (restored from the checkpoint's rows)
    pd.testing.assert_frame_equal(df[df["chunk"] < len(killed["rows"])].reset_index(drop=True),
                                  killed["rows"].reset_index(drop=True))
    assert (a / "curve.png").exists()
    # only process 0 wrote: no stray temporary files of a second writer
    assert not [p.name for p in a.iterdir() if p.name.endswith(".tmp")]


def test_a_two_process_checkpoint_resumes_in_one_process(scenario):
    _, a, b = scenario
    two, one = _metrics(a), _metrics(b)
    assert list(one["chunk"]) == [0, 1, 2]
    float_cols = [k for k in two.columns if two[k].dtype.kind == "f"]
    assert "eval_return" in float_cols and "loss/critic" in float_cols
    # 2 processes x 1 device vs 1 process x 1 device: the same updates up to float summation order
    np.testing.assert_allclose(one[float_cols].to_numpy(), two[float_cols].to_numpy(), rtol=1e-3, atol=1e-3)
    assert not np.allclose(two["loss/critic"].to_numpy(), 0.0)   # it trained


@pytest.mark.slow   # a third 2-process launch (`make test-slow`); 2 -> 1 above and 2 -> 2 (the rerun) stay fast
def test_a_one_process_checkpoint_resumes_over_two_processes(scenario, tmp_path):
    _, a, b = scenario
    c = tmp_path / "two_procs_from_one"
    _copy_run(b, c, 2)
    back = subprocess.run(_cmd(c), capture_output=True, text=True, timeout=600)
    assert back.returncode == 0, back.stderr[-3000:]
    two, again = _metrics(a), _metrics(c)
    assert list(again["chunk"]) == [0, 1, 2]
    float_cols = [k for k in two.columns if two[k].dtype.kind == "f"]
    np.testing.assert_allclose(again[float_cols].to_numpy(), two[float_cols].to_numpy(), rtol=1e-3, atol=1e-3)


def test_the_launcher_blames_the_killed_process_not_the_survivor_it_took_down():
    """Both seen dead in one poll (the survivor's collective fails within ~0.3 s of the kill):
    the signal-killed process is the cause whatever its index; else the lowest failing index."""
    assert first_failure([None, None]) is None and first_failure([0, None, 0]) is None
    assert first_failure([1, -9]) == 1          # process 0's error exit follows process 1's SIGKILL
    assert first_failure([-15, -9]) == 0
    assert first_failure([0, 2, 1]) == 1
    assert first_failure([None, 3]) == 1


@pytest.mark.slurm
def test_a_sweep_trial_runs_as_two_processes_under_slurm(tmp_path, slurm):
    """The Slurm backend with `tasks_per_node: 2`: each array element is 2 srun tasks, i.e. one
    trial over 2 JAX processes (process 0 claims it and writes the store, process 1 follows)."""
    base = {k: v for k, v in CONFIG.items() if k != "env_steps"}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "mpslurm", "agent": "sac", "out_dir": str(tmp_path / "store"), "env_steps": 64, "seeds": 1,
        "base": base, "grid": {"width": [16]},
        "backend": {"name": "slurm", "slurm": {"time_min": 20, "tasks_per_node": 2, "cpus_per_task": 1}}}))
    proc = subprocess.run([sys.executable, "-m", "scaling_rl.cli", "sweep", "run", str(spec), "--no-progress"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = Store(tmp_path / "store")
    (tid,) = store.trial_ids()
    assert store.status(tid)["state"] == "done", store.status(tid)
    status = json.loads((store.trial_dir(tid) / "status.json").read_text())
    assert status["summary"]["processes"] == 2
    assert list(_metrics(store.trial_dir(tid))["chunk"]) == [0, 1]


@pytest.mark.parametrize("extra, message", [
    (["--processes", "2"], "--processes 2: the learner must span the processes; add --set data_parallel=true"),
    (["--processes", "0"], "--processes: must be >= 1, got 0"),
])
def test_processes_bad_input_is_one_line_exit_2(tmp_path, capsys, extra, message):
    from scaling_rl import cli

    assert cli.main(["train", "--agent", "sac", "--out", str(tmp_path / "r"), *extra]) == 2
    assert capsys.readouterr().err == f"scaling-rl: error: {message}\n"
    assert not (tmp_path / "r").exists()


def test_a_status_left_running_by_a_killed_process_0_is_marked_failed(tmp_path):
    from scaling_rl.io import atomic_write_json
    atomic_write_json(tmp_path / "status.json", {"status": "running", "chunk": 1})
    train_cli._mark_failed(tmp_path, "process failure (exit code 137)")
    status = json.loads((tmp_path / "status.json").read_text())
    assert status == {"status": "failed", "chunk": 1, "error": "process failure (exit code 137)"}
    atomic_write_json(tmp_path / "status.json", {"status": "done"})   # a finished run is left alone
    train_cli._mark_failed(tmp_path, "x")
    assert json.loads((tmp_path / "status.json").read_text()) == {"status": "done"}
    train_cli._mark_failed(tmp_path / "missing", "x")   # no run directory: nothing to mark, no error
