"""Running trials: claim -> status running -> trial function -> done | diverged | failed.

Every backend ends up in `worker_loop` (local pool, inline) or `run_claimed` (one slurm array
element, one ray task). Workers need no coordinator: they walk the trial list, take whatever they
can lock, and stop when every trial of the run is finished, so any number of runners (a second
`sweep run`, a requeued slurm job) can work on one store at the same time.

With `RunOptions.early_stop` (a `sweep.early_stop.Rule`) the trial kind's run gets a `stop` callable
that ends it once the rule fires; the trial is still `done`, with `stopped_early` (reason or None),
`stop_step`, `budget_env_steps`, `saved_env_steps`, `saved_flops` and `early_stop` (the decision) in
its status.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from scaling_rl.errors import one_line
from scaling_rl.sweep import early_stop, packing, registry
from scaling_rl.sweep.registry import trial_param_count
from scaling_rl.sweep.store import FINISHED, HOST, Claim, Store, _now

MAX_CRASHES = 3


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """Everything a worker needs (picklable: crosses spawn, submitit and ray boundaries)."""
    root: str
    trial_ids: tuple
    sweep_name: str = "sweep"
    wandb: Any = False                   # False | {"project", "mode", ...}
    checkpoint_every: int = 1
    compile_cache: Any = False           # directory | False
    gpu_mem_fraction: float | None = None
    pack: bool = False
    early_stop: Any = None               # sweep.early_stop.Rule | None


# ---- per-process set-up ----------------------------------------------------------------------
def configure_process(opts: RunOptions) -> None:
    """Environment for a worker: GPU memory share, JAX persistent compilation cache, own wandb service."""
    # A wandb service inherited through $WANDB_SERVICE (e.g. from a parent that used wandb) would
    # outlive a killed attempt and keep its run id "in use", so the resumed attempt could not log.
    # Trials start their own service, which dies with them.
    os.environ.pop("WANDB_SERVICE", None)
    if opts.gpu_mem_fraction:
        os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{opts.gpu_mem_fraction:.3f}"
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if opts.compile_cache:
        os.environ["JAX_COMPILATION_CACHE_DIR"] = str(opts.compile_cache)
        os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
        os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
        if "jax" in sys.modules:  # already imported (ray worker, inline run): update the live config
            enable_compile_cache(str(opts.compile_cache))


def enable_compile_cache(path: str) -> None:
    """Point JAX's persistent compilation cache at `path`, caching every program."""
    import jax
    Path(path).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    with contextlib.suppress(Exception):  # the cache is initialised once per process
        from jax._src import compilation_cache
        compilation_cache.reset_cache()


def die_with_parent() -> None:
    """A worker must not outlive its runner (kill -9 of the runner kills the pool)."""
    parent = os.getppid()
    with contextlib.suppress(Exception):
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    def watch():
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(0.2)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


# ---- one trial -------------------------------------------------------------------------------
def _wandb_arg(opts: RunOptions, tid: str, trial, trial_dir: Path):
    if not opts.wandb:
        return False
    w = dict(opts.wandb) if isinstance(opts.wandb, dict) else {}
    w.setdefault("project", "scaling_rl")
    w.setdefault("mode", os.environ.get("WANDB_MODE", "offline"))
    w.update(group=opts.sweep_name, name=tid,
             config={"trial_id": tid, "agent": trial.agent, "seeds": trial.seeds,
                     "seed": trial.seed, **trial.config})
    return w


def run_claimed(store: Store, claim: Claim, opts: RunOptions) -> str:
    """Run the trial held by `claim` to a final state (unless it is finished already)."""
    t0 = time.time()
    tid = claim.tid
    st = store.status(tid)
    if st.get("state") in FINISHED or st.get("state") == "failed":
        return st["state"]
    trial = store.trial(tid)
    kind = registry.get(trial.agent)
    tdir = store.trial_dir(tid)
    attempts = int(st.get("attempts", 0)) + 1
    store.write_status(claim, "running", started=st.get("started") or _now(), attempt_started=_now(),
                       attempts=attempts, error=None)
    watcher = None
    extra = {}
    try:
        if opts.early_stop is not None:
            if not kind.stoppable:   # refused at spec time; never ignore a rule silently
                raise ValueError(f"early_stop: agent {trial.agent!r} cannot stop a trial early")
            watcher = early_stop.Watcher(opts.early_stop, early_stop.budget_of(trial.config, kind), tdir)
            extra["stop"] = watcher
        t_run = time.time()
        df = kind.run(trial.config, str(tdir), trial.seeds, trial.seed,
                      wandb=_wandb_arg(opts, tid, trial, tdir), checkpoint_every=opts.checkpoint_every, **extra)
        run_s = time.time() - t_run
        n_params = trial_param_count(kind, trial.config, tdir)
        stop_fields = {}
        if watcher is not None:
            stop_fields = early_stop.status_fields(watcher.final(df), watcher.budget, trial.seeds,
                                                   trial.config, n_params)
    except KeyboardInterrupt:
        store.write_status(claim, "pending", error="interrupted")
        raise
    except Exception as e:  # noqa: BLE001 - the sweep goes on
        (tdir / "error.txt").write_text(traceback.format_exc())
        if type(e).__name__ == "Diverged":
            step = getattr(e, "step", None)
            if step is None and e.args and isinstance(e.args[0], (int, float)):
                step = e.args[0]
            store.write_status(claim, "diverged", finished=_now(), error=one_line(e),
                               step=None if step is None else int(step), wall_s=round(time.time() - t0, 3))
            return "diverged"
        store.write_status(claim, "failed", finished=_now(), error=one_line(e),
                           wall_s=round(time.time() - t0, 3))
        return "failed"
    store.write_status(claim, "done", finished=_now(), param_count=n_params,
                       wall_s=round(time.time() - t0, 3), run_s=round(run_s, 3), **stop_fields)
    return "done"


def run_trial(opts: RunOptions, tid: str, *, wait_s: float = 600.0) -> str:
    """Claim one trial (waiting while another process holds it) and run it: slurm / ray entry."""
    store = Store(opts.root)
    deadline = time.time() + wait_s
    while True:
        st = store.status(tid)
        if st.get("state") in FINISHED:
            return st["state"]
        claim = store.try_claim(tid)
        if claim is not None:
            with claim:
                return run_claimed(store, claim, opts)
        if time.time() > deadline:
            return "busy"
        time.sleep(0.5)


def follow_trial(opts: RunOptions, tid: str) -> str:
    """A process other than 0 of a multi-process trial (scaling_rl/multiprocess.py): run the same
    `kind.run` alongside process 0, which claims the trial and writes the store and the run directory
    (train.run writes from process 0 only). Returns the state it found, or "followed"."""
    store = Store(opts.root)
    st = store.status(tid)
    if st.get("state") in (*FINISHED, "failed"):
        return st["state"]
    trial = store.trial(tid)
    kind = registry.get(trial.agent)
    extra = {}
    if opts.early_stop is not None:   # the same pure rule as process 0's Watcher, without its record
        rule, budget = opts.early_stop, early_stop.budget_of(trial.config, kind)
        extra["stop"] = lambda chunk, df: (d.to_json() if (d := rule.check(df, budget)) else None)
    kind.run(trial.config, str(store.trial_dir(tid)), trial.seeds, trial.seed, wandb=False,
             checkpoint_every=opts.checkpoint_every, **extra)
    return "followed"


# ---- the worker loop -------------------------------------------------------------------------
def unfinished(store: Store, tids) -> list[str]:
    """Trials of this run that still need work (failed counts as finished for this run)."""
    return [t for t in tids if store.status(t).get("state") not in (*FINISHED, "failed")]


def worker_loop(opts: RunOptions, index: int = 0, *, poll_s: float = 0.2) -> int:
    """Take and run trials until every trial of the run is finished. Returns trials run here."""
    store = Store(opts.root)
    tids = list(opts.trial_ids)
    if tids:  # start at different places so workers rarely race for the same lock
        k = (index * 2654435761) % len(tids)
        tids = tids[k:] + tids[:k]
    ran = 0
    while True:
        todo = unfinished(store, tids)
        if not todo:
            return ran
        progressed = False
        if opts.pack:
            for group in packing.groups(store, todo, packing.memory_capacity(opts)):
                if len(group) > 1:
                    n = packing.run_pack(store, group, opts, run_single=run_claimed)
                    ran += n
                    progressed |= n > 0
            todo = unfinished(store, tids)
        for tid in todo:
            claim = store.try_claim(tid)
            if claim is None:
                continue
            with claim:
                if store.status(tid).get("state") in (*FINISHED, "failed"):
                    continue
                run_claimed(store, claim, opts)
                ran += 1
                progressed = True
        if not progressed:
            time.sleep(poll_s)


def worker_main(opts: RunOptions, index: int) -> None:
    """Entry point of a spawned local worker."""
    die_with_parent()
    configure_process(opts)
    worker_loop(opts, index)


def record_crash(store: Store, pid: int, tids, exitcode) -> None:
    """A worker died on its own (not the runner): charge the trial it was running; give up after
    MAX_CRASHES so a trial that kills its process cannot loop forever."""
    for tid in tids:
        st = store.status(tid)
        if st.get("state") != "running" or st.get("pid") != pid or st.get("host") != HOST:
            continue
        claim = store.try_claim(tid)
        if claim is None:
            continue
        with claim:
            crashes = int(st.get("crashes", 0)) + 1
            if crashes >= MAX_CRASHES:
                store.write_status(claim, "failed", crashes=crashes, finished=_now(),
                                   error=f"worker process died (exit code {exitcode}) {crashes} times")
            else:
                store.write_status(claim, "pending", crashes=crashes,
                                   error=f"worker process died (exit code {exitcode})")
