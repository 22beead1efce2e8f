"""One trial over several JAX processes: start them (locally) or join them (under Slurm).

Two ways in, one code path (`initialize`, called before JAX touches a device):

- locally, `scaling-rl train ... --processes N` re-runs the same command as N child processes
  (`launch`), with a coordinator on 127.0.0.1:<free port> passed to them in
  SCALING_RL_COORDINATOR / SCALING_RL_NUM_PROCESSES / SCALING_RL_PROCESS_ID;
- under Slurm, `srun -n N scaling-rl train ...` starts the N processes and `jax.distributed.initialize()`
  reads the SLURM_* variables of the step (coordinator: the first node of the step).

Either way every process then calls `jax.distributed.initialize`, with gloo CPU collectives when the
devices are CPUs, so `jax.devices()` lists the devices of every process and the agents' data-parallel
mesh (`parallel.make_mesh`) spans them. Every process runs the same jitted programs; only process 0
writes the run directory (config, metrics, status, curve), and all of them take part in orbax's
checkpoint saves (orbax writes replicated arrays from the primary process).

Failure: if any process dies (kill -9, OOM), the survivors do not wait for it forever. Collectives to
a dead peer fail, and the coordination service drops a process whose heartbeat stops for
`HEARTBEAT_S`; the local launcher also kills the survivors `GRACE_S` after the first process failed
and reports it in one line. Rerunning the same command resumes from the last complete checkpoint.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

ENV_COORDINATOR = "SCALING_RL_COORDINATOR"
ENV_NUM_PROCESSES = "SCALING_RL_NUM_PROCESSES"
ENV_PROCESS_ID = "SCALING_RL_PROCESS_ID"
HEARTBEAT_S = int(os.environ.get("SCALING_RL_HEARTBEAT_S", "60"))   # a starved process must not look dead
INIT_TIMEOUT_S = int(os.environ.get("SCALING_RL_INIT_TIMEOUT_S", "120"))
COLLECTIVE_TIMEOUT_S = int(os.environ.get("SCALING_RL_COLLECTIVE_TIMEOUT_S", "600"))
GRACE_S = float(os.environ.get("SCALING_RL_GRACE_S", "20"))


def slurm_tasks() -> int:
    """Number of tasks of the Slurm step this process belongs to (1 outside an srun step)."""
    if "SLURM_JOB_ID" not in os.environ or "SLURM_PROCID" not in os.environ:
        return 1
    for var in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 1


def launched() -> bool:
    """Whether this process is one of several started by `launch`."""
    return ENV_NUM_PROCESSES in os.environ


def requested_processes() -> int:
    """How many processes this trial runs as, from the environment (1: single process)."""
    if launched():
        return int(os.environ[ENV_NUM_PROCESSES])
    return slurm_tasks()


def initialize() -> int:
    """Join the trial's other processes (no-op for a single process); returns the process count.

    Must run before JAX uses a device. Idempotent."""
    n = requested_processes()
    if n <= 1:
        return 1
    import jax
    from jax._src import distributed

    if distributed.global_state.client is not None:  # already joined
        return jax.process_count()
    platforms = os.environ.get("JAX_PLATFORMS", "") or str(jax.config.jax_platforms or "")
    if platforms in ("", "cpu") or platforms.startswith("cpu"):
        # CPU devices of different processes talk over gloo (TCP); without it cross-process
        # collectives are unimplemented on CPU
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        # gloo's rendezvous and collectives give up after 30 s by default: too short when one process
        # compiles a program much later than the other (a loaded machine); a dead peer is caught by
        # the heartbeat instead
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_cpu_collective_timeout_seconds" not in flags:
            os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_collective_timeout_seconds={COLLECTIVE_TIMEOUT_S}".strip()
    if launched():
        _die_with_parent()
    kw = dict(initialization_timeout=INIT_TIMEOUT_S, heartbeat_timeout_seconds=HEARTBEAT_S)
    if launched():
        jax.distributed.initialize(coordinator_address=os.environ[ENV_COORDINATOR], num_processes=n,
                                   process_id=int(os.environ[ENV_PROCESS_ID]), **kw)
    else:  # srun: jax reads SLURM_STEP_NODELIST / SLURM_NTASKS / SLURM_PROCID / SLURM_LOCALID
        jax.distributed.initialize(**kw)
    return jax.process_count()


def process_index() -> int:
    """This process's index (0 for a single process), without initialising JAX's backends early."""
    if requested_processes() <= 1:
        return 0
    import jax

    return jax.process_index()


def process_count() -> int:
    """How many processes this trial runs as (1 without `initialize`)."""
    if requested_processes() <= 1:
        return 1
    import jax

    return jax.process_count()


def is_primary() -> bool:
    """Whether this process writes the run directory (process 0)."""
    return process_index() == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """A launched process dies with its launcher (SIGKILL when the launcher exits)."""
    with contextlib.suppress(Exception):
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _describe(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


def first_failure(codes: list[int | None]) -> int | None:
    """The process to blame among exit codes seen in one poll (None: running), or None when none
    failed. A process killed by a signal is the cause; an error exit seen in the same poll is
    usually its consequence (the survivor's collective to the dead peer failed)."""
    bad = [i for i, c in enumerate(codes) if c not in (None, 0)]
    return min(bad, key=lambda i: (codes[i] >= 0, i)) if bad else None


def launch(args: list[str], n: int, *, grace_s: float | None = None, poll_s: float = 0.1) -> int:
    """Run `python -m scaling_rl.cli *args` as `n` processes of one JAX program (coordinator on
    localhost); return 0 when all succeed, else the first failure's exit code (a signal: 128 + sig),
    after printing what happened in one line. Survivors of a failure get `grace_s` to exit on their
    own (their collectives fail, or the heartbeat drops them), then are killed."""
    grace_s = GRACE_S if grace_s is None else grace_s
    env = dict(os.environ)
    env.update({ENV_COORDINATOR: f"127.0.0.1:{free_port()}", ENV_NUM_PROCESSES: str(n)})
    procs = []
    try:
        for i in range(n):
            procs.append(subprocess.Popen([sys.executable, "-m", "scaling_rl.cli", *args],
                                          env={**env, ENV_PROCESS_ID: str(i)}))
        first, failed_at = None, None
        while True:
            codes = [p.poll() for p in procs]
            if first is None:
                first = first_failure(codes)
                if first is not None:
                    failed_at = time.monotonic()
            if all(c is not None for c in codes):
                break
            if failed_at is not None and time.monotonic() - failed_at > grace_s:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                for p in procs:
                    p.wait()
                break
            time.sleep(poll_s)
    finally:  # Ctrl-C or an error here: the processes go with the launcher
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if first is None:
        return 0
    code = procs[first].returncode
    others = ", ".join(f"{i} {_describe(p.returncode)}" for i, p in enumerate(procs) if i != first)
    print(f"scaling-rl: error: process {first} of {n} {_describe(code)} (others: {others}); "
          f"rerun the same command to resume from the last checkpoint", file=sys.stderr)
    return 128 - code if code < 0 else code
