"""Backends: where trials run. All of them write the same store through `runner`.

local  a pool of spawned worker processes on this machine (inline when workers == 0)
slurm  a submitit job array, one element per trial, requeued on preemption / timeout
ray    one Ray task per trial on `ray.init(address=...)` (a local cluster when no address)

Several trials on one GPU: the local pool sets XLA_PYTHON_CLIENT_MEM_FRACTION = 0.95 / workers
(or `backend.gpu_mem_fraction`) and XLA_PYTHON_CLIENT_PREALLOCATE=false in each worker.

One big trial over many devices: set the agent's `data_parallel: true` in `base`; train.run then
shards each update's batch over every visible device with the core's shard_map path (axis
`data`). On Slurm give the trial a whole node (`slurm.gpus_per_node: 8`, one array element per
trial). One trial over several processes (hosts, or one process per GPU): `slurm.tasks_per_node`
(and `slurm.nodes`) > 1 runs each array element as that many srun tasks (`--kill-on-bad-exit`, so
one dying task ends the element); every task joins the others (`multiprocess.initialize`, from the
SLURM_* variables), process 0 claims the trial and writes the store, the others follow
(`runner.follow_trial`). A requeued element resumes from the trial's last checkpoint.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Callable

from scaling_rl import multiprocess
from scaling_rl.sweep import runner
from scaling_rl.sweep.runner import RunOptions
from scaling_rl.sweep.store import FINISHED, Store


def _finished_count(store: Store, tids) -> int:
    return sum(store.status(t).get("state") in (*FINISHED, "failed") for t in tids)


class Monitor:
    """A progress bar over the run's trials, fed by polling the store (works for every backend)."""

    def __init__(self, store: Store, tids, enabled: bool, label: str):
        self.store, self.tids, self.bar = store, list(tids), None
        if enabled:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)
            self.bar = Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                                TimeRemainingColumn(), transient=False,
                                disable=not sys.stderr.isatty() and not os.environ.get("SCALING_RL_PROGRESS"))
            self.task = self.bar.add_task(label, total=len(self.tids), info="")
            self.bar.start()

    def poll(self) -> int:
        done = _finished_count(self.store, self.tids)
        if self.bar is not None:
            c = {}
            for t in self.tids:
                s = self.store.status(t).get("state", "pending")
                c[s] = c.get(s, 0) + 1
            info = " ".join(f"{k}={v}" for k, v in sorted(c.items()))
            self.bar.update(self.task, completed=done, info=info)
        return done

    def close(self):
        if self.bar is not None:
            self.poll()
            self.bar.stop()


def run_local(opts: RunOptions, workers: int, *, progress: bool = True, poll_s: float = 0.5) -> None:
    """Run the trials with `workers` spawned processes (0: in this process)."""
    store = Store(opts.root)
    if workers == 0 or not opts.trial_ids:
        runner.configure_process(opts)
        runner.worker_loop(opts, 0)
        return
    ctx = mp.get_context("spawn")
    mon = Monitor(store, opts.trial_ids, progress, "sweep")
    procs = {}
    restarts = 0
    try:
        for i in range(workers):
            p = ctx.Process(target=runner.worker_main, args=(opts, i), name=f"sweep-worker-{i}")
            p.start()
            procs[i] = p
        while procs:
            time.sleep(poll_s)
            mon.poll()
            for i, p in list(procs.items()):
                if p.is_alive():
                    continue
                p.join()
                del procs[i]
                if p.exitcode != 0:
                    # a worker died under a trial (segfault, OOM kill): charge that trial and,
                    # while work remains, replace the worker
                    runner.record_crash(store, p.pid, opts.trial_ids, p.exitcode)
                    if runner.unfinished(store, opts.trial_ids) and restarts < 2 * len(opts.trial_ids):
                        restarts += 1
                        q = ctx.Process(target=runner.worker_main, args=(opts, i), name=f"sweep-worker-{i}")
                        q.start()
                        procs[i] = q
    finally:
        for p in procs.values():  # Ctrl-C: the workers go with us (their trials stay resumable)
            if p.is_alive():
                p.terminate()
        for p in procs.values():
            p.join(5)
        mon.close()


# ---- slurm -----------------------------------------------------------------------------------
def _slurm_job_class():
    import submitit

    class TrialJob(submitit.helpers.Checkpointable):
        """One array element: claim and run one trial. On preemption or timeout submitit calls
        `checkpoint` (inherited: resubmit the same call); the requeued job resumes the trial
        from its last train.run checkpoint."""

        def __init__(self, opts: RunOptions):
            self.opts = opts

        def __call__(self, tid: str) -> str:
            runner.configure_process(self.opts)
            if multiprocess.requested_processes() > 1:   # one of several srun tasks of this trial
                multiprocess.initialize()
                if not multiprocess.is_primary():
                    return runner.follow_trial(self.opts, tid)
            return runner.run_trial(self.opts, tid)

    return TrialJob


def run_slurm(opts: RunOptions, slurm: dict, *, workers: int | None = None, progress: bool = True,
              wait: bool = True, poll_s: float = 2.0, folder: str | None = None):
    """Submit one job array (one element per unfinished trial); wait and return the jobs."""
    import submitit

    store = Store(opts.root)
    tids = runner.unfinished(store, opts.trial_ids)
    if not tids:
        return []
    folder = folder or slurm.get("folder") or str(Path(opts.root) / "slurm" / "%j")
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm",
                               slurm_max_num_timeout=int(slurm.get("max_num_timeout", 3)))
    params = dict(timeout_min=int(slurm.get("time_min", 60)),
                  cpus_per_task=int(slurm.get("cpus_per_task", 1)),
                  slurm_array_parallelism=int(workers or slurm.get("array_parallelism") or len(tids)),
                  name=f"sweep-{Path(opts.root).name}")
    if slurm.get("partition"):
        params["slurm_partition"] = slurm["partition"]
    if slurm.get("gpus_per_node"):
        params["gpus_per_node"] = int(slurm["gpus_per_node"])
    if slurm.get("mem_gb"):
        params["mem_gb"] = float(slurm["mem_gb"])
    tasks, nodes = int(slurm.get("tasks_per_node", 1)), int(slurm.get("nodes", 1))
    if tasks * nodes > 1:   # one trial as several JAX processes
        params.update(tasks_per_node=tasks, nodes=nodes, slurm_srun_args=["--kill-on-bad-exit=1"])
    if slurm.get("additional"):
        params["slurm_additional_parameters"] = dict(slurm["additional"])
    ex.update_parameters(**params)
    jobs = ex.map_array(_slurm_job_class()(opts), tids)
    if wait and jobs:
        array_id = str(jobs[0].job_id).split("_")[0]
        _wait(store, opts, progress,
              lambda: not runner.unfinished(store, tids) or not _squeue_has(array_id), poll_s, "slurm")
    return jobs


def _squeue_has(job_id: str) -> bool:
    """Whether Slurm still has any element of the job (pending, running, requeued). Uses squeue,
    not sacct, so it works without an accounting database."""
    import subprocess
    try:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return True
    if out.returncode != 0:   # "Invalid job id": gone from the queue
        return False
    return bool(out.stdout.strip())


def _wait(store, opts, progress, finished: Callable[[], bool], poll_s, label):
    mon = Monitor(store, opts.trial_ids, progress, label)
    try:
        while not finished():
            mon.poll()
            time.sleep(poll_s)
    finally:
        mon.close()


# ---- ray -------------------------------------------------------------------------------------
def _ray_trial(opts: RunOptions, tid: str) -> str:
    runner.configure_process(opts)
    return runner.run_trial(opts, tid)


def run_ray(opts: RunOptions, ray_opts: dict, *, progress: bool = True, poll_s: float = 0.5):
    """One Ray task per unfinished trial; returns their final states."""
    import ray

    store = Store(opts.root)
    tids = runner.unfinished(store, opts.trial_ids)
    if not tids:
        return []
    started_here = False
    if not ray.is_initialized():
        address = ray_opts.get("address")
        kw = dict(include_dashboard=False, log_to_driver=False,
                  runtime_env={"env_vars": {k: v for k, v in os.environ.items()
                                            if k.startswith(("JAX_", "XLA_", "WANDB_", "SCALING_RL_"))}})
        if address:
            ray.init(address=address, **kw)
        else:
            ray.init(num_cpus=int(ray_opts.get("init_num_cpus") or os.cpu_count() or 1), **kw)
        started_here = True
    try:
        task = ray.remote(num_cpus=float(ray_opts.get("num_cpus", 1)),
                          num_gpus=float(ray_opts.get("num_gpus", 0)), max_retries=2)(_ray_trial)
        refs = [task.remote(opts, tid) for tid in tids]
        pending = list(refs)
        mon = Monitor(store, opts.trial_ids, progress, "ray")
        try:
            while pending:
                _, pending = ray.wait(pending, num_returns=len(pending), timeout=poll_s)
                mon.poll()
        finally:
            mon.close()
        return ray.get(refs)
    finally:
        if started_here and not ray_opts.get("keep_alive"):
            ray.shutdown()
