"""The sweep store: one directory per trial, statuses written atomically, trials claimed with locks.

Layout::

    <root>/sweep.json                 the last spec run against this store (for the record)
    <root>/trials/<id>/trial.json     agent, resolved config, seeds, first seed, swept axes
    <root>/trials/<id>/trial_status.json  state, timestamps, host, pid, attempts, error, step
    <root>/trials/<id>/lock           flock'ed by whoever runs the trial (host/pid written inside)
    <root>/trials/<id>/...            what the trial writes: config.json, metrics.parquet, checkpoints/

Claims are `flock(LOCK_EX | LOCK_NB)` on the trial's lock file, held for the whole run: the kernel
drops it when the holder dies (kill -9 included), so a crashed trial is claimable again at once and
two writers can never run one trial. Only the holder of the lock rewrites trial_status.json (atomic
replace); the first status is created with a no-overwrite `link`, so concurrent `add`s never clobber
a newer state.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Iterable, Iterator

from scaling_rl.errors import CorruptFile
from scaling_rl.io import atomic_write_json, read_json_object
from scaling_rl.sweep.trial import Trial

STATES = ("pending", "running", "done", "failed", "diverged")
FINISHED = ("done", "diverged")          # never rerun (diverged reruns only when asked)
HOST = socket.gethostname()


def _now() -> float:
    return round(time.time(), 3)


def _create_if_absent(path: Path, text: str) -> bool:
    """Atomically create `path` with `text` unless it exists (a reader never sees it half-written)."""
    if path.exists():
        return False
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)     # fails with EEXIST instead of overwriting
        return True
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Claim:
    """An exclusive hold on one trial; release() (or process death) lets others take it."""

    def __init__(self, store: "Store", tid: str, fd: int):
        self.store, self.tid, self.fd = store, tid, fd

    def release(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class Store:
    """A directory of trials."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.trials_dir = self.root / "trials"

    # ---- layout -----------------------------------------------------------------------------
    def trial_dir(self, tid: str) -> Path:
        return self.trials_dir / tid

    def exists(self) -> bool:
        return self.trials_dir.is_dir()

    def trial_ids(self) -> list[str]:
        if not self.trials_dir.is_dir():
            return []
        return sorted(p.name for p in self.trials_dir.iterdir() if (p / "trial.json").exists())

    def add(self, trials: Iterable[Trial]) -> int:
        """Create the directories of trials not in the store yet (pending). Returns how many were new."""
        new = 0
        for t in trials:
            d = self.trial_dir(t.id)
            d.mkdir(parents=True, exist_ok=True)
            _create_if_absent(d / "trial.json", json.dumps(t.to_json(), indent=2, sort_keys=True) + "\n")
            if _create_if_absent(d / "trial_status.json", json.dumps(
                    {"state": "pending", "trial_id": t.id, "created": _now(), "attempts": 0},
                    indent=2, sort_keys=True) + "\n"):
                new += 1
        return new

    def trial(self, tid: str) -> Trial:
        """The trial's record; CorruptFile (one line naming the file) when trial.json is unreadable."""
        path = self.trial_dir(tid) / "trial.json"
        d = read_json_object(path, what="a trial record")
        try:
            return Trial.from_json(d)
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptFile(path, f"not a trial record ({type(e).__name__}: {e})") from None

    # ---- status ------------------------------------------------------------------------------
    def status(self, tid: str) -> dict:
        """The trial's status (pending when absent); CorruptFile when trial_status.json is unreadable."""
        path = self.trial_dir(tid) / "trial_status.json"
        try:
            st = read_json_object(path, what="a trial status")
        except FileNotFoundError:
            return {"state": "pending", "trial_id": tid, "attempts": 0}
        if st.get("state", "pending") not in STATES:
            raise CorruptFile(path, f"unknown state {st.get('state')!r}; allowed: {', '.join(STATES)}")
        return st

    def unreadable(self, tid: str) -> str | None:
        """Why the trial's trial.json or trial_status.json cannot be read (one line), or None. A trial
        whose directory exists without trial.json is one another process is adding right now (`add`
        makes the directory, then links the record in atomically): absent is not unreadable."""
        try:
            self.trial(tid)
            self.status(tid)
        except CorruptFile as e:
            return str(e)
        except FileNotFoundError:
            return None
        return None

    def write_status(self, claim: Claim, state: str, **fields) -> dict:
        """Update the claimed trial's status (only the claim holder writes it)."""
        assert state in STATES, state
        st = self.status(claim.tid)
        st.update(fields)
        st.update(state=state, updated=_now(), host=HOST, pid=os.getpid())
        atomic_write_json(self.trial_dir(claim.tid) / "trial_status.json", st)
        return st

    # ---- claims ------------------------------------------------------------------------------
    def try_claim(self, tid: str) -> Claim | None:
        """Take the trial's lock without waiting; None when someone else holds it."""
        path = self.trial_dir(tid) / "lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{HOST} {os.getpid()} {_now()}\n".encode(), 0)
        return Claim(self, tid, fd)

    def is_locked(self, tid: str) -> bool:
        """Whether some live process holds the trial's lock (does not disturb the holder)."""
        path = self.trial_dir(tid) / "lock"
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False

    def effective_state(self, tid: str, st: dict | None = None) -> str:
        """The status, with a `running` whose runner is gone reported as `interrupted`."""
        st = st or self.status(tid)
        state = st.get("state", "pending")
        if state == "running":
            dead_here = st.get("host") == HOST and st.get("pid") and not pid_alive(int(st["pid"]))
            if dead_here or not self.is_locked(tid):
                return "interrupted"
        return state

    def counts(self) -> dict[str, int]:
        """Trials per effective state; `unreadable`: trials whose trial.json / trial_status.json is corrupt."""
        out = {s: 0 for s in (*STATES, "interrupted", "unreadable")}
        for tid in self.trial_ids():
            out["unreadable" if self.unreadable(tid) else self.effective_state(tid)] += 1
        return out

    def statuses(self) -> Iterator[tuple[str, dict]]:
        for tid in self.trial_ids():
            yield tid, self.status(tid)

    # ---- ownership ---------------------------------------------------------------------------
    def owner(self) -> dict | None:
        """The spec this store belongs to, from sweep.json ({"name", "agent"}); None when the store
        has no record yet. CorruptFile when sweep.json is unreadable."""
        try:
            rec = read_json_object(self.root / "sweep.json", what="a sweep record")
        except FileNotFoundError:
            return None
        spec = rec.get("spec")
        if not isinstance(spec, dict):
            raise CorruptFile(self.root / "sweep.json", "no `spec` mapping: not a sweep record")
        return {"name": spec.get("name"), "agent": spec.get("agent")}

    def foreign(self, name: str, agent: str) -> str | None:
        """Why a spec (`name`, `agent`) may not run in this store (one line), or None. A store belongs to
        one spec, by name and agent (the same spec with more grid values or seeds extends it); a
        directory holding a `train` run (config.json / status.json, no trials/) is not a store."""
        if not self.root.exists():
            return None
        if not self.root.is_dir():
            return f"{self.root} is not a directory"
        if not self.trials_dir.exists() and any((self.root / f).exists() for f in ("config.json", "status.json")):
            return f"{self.root} holds a single `train` run (config.json / status.json), not a sweep store"
        try:
            own = self.owner()
        except CorruptFile as e:
            return f"{e}; cannot tell which sweep the store belongs to"
        if own is None:
            return None
        if own["agent"] != agent or (own["name"] is not None and own["name"] != name):   # no name: legacy record
            return (f"{self.root} holds sweep {own['name']!r} (agent {own['agent']}), not {name!r} (agent {agent}); "
                    "give another out_dir, or --force to add this spec's trials to that store")
        return None

    def write_sweep_record(self, spec_raw: dict, trial_ids: list[str]) -> None:
        atomic_write_json(self.root / "sweep.json", {"spec": json.loads(json.dumps(spec_raw, default=str)),
                                                     "trials": trial_ids, "written": _now()})
