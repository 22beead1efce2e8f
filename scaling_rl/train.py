"""The host loop: N seeds of one agent configuration in one compiled program, run chunk by chunk.

Between jitted chunks the host collects metrics (one `device_get` per chunk), evaluates, appends
tidy rows to `metrics.parquet`, logs to wandb and a progress bar, and checkpoints the whole train
state with orbax. A run directory holds:

    config.json        agent, full agent config, seeds, seed, library versions (written first)
    metrics.parquet    tidy table: seed, chunk, env_steps, grad_steps, <metrics>, wall_time,
                       chunk_time (train), eval_time, env_steps_per_s (all seeds, train only)
    checkpoints/<k>/   train state after k chunks + JSON meta (chunk index, metric rows so far)
    status.json        {"status": running|done|diverged|failed, ...} plus a summary when done
    curve.png          return vs env steps, mean ± std over seeds

Rerunning with the same directory and config resumes from the newest checkpoint; on CPU the
result is bitwise identical to an uninterrupted run. Everything is validated before anything
is written. The agent registry and configs are `agent_config` (re-exported here); the `scaling-rl
train` command is `train_cli`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import platform
import time
import types
import typing
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from scaling_rl import io, program_cache
from scaling_rl.agent_config import (  # noqa: F401 (re-exported: the agent registry and configs)
    ConfigError, _config_dict, _field_types, _one_line, agent_module, known_agents, make_config, parse_value)
from scaling_rl.eval_schedule import EVAL_SCHEDULES, eval_chunks, eval_schedule_error  # noqa: F401 (re-exported)

# Columns that depend on the machine and load, not on the computation (excluded from resume checks).
TIME_COLUMNS = ("wall_time", "chunk_time", "eval_time", "env_steps_per_s")
# Seed-independent stream ids folded into the run key (the init key of seed i is fold_in(root, i)).
_EVAL_STREAM = 0x0E7A1


class Diverged(RuntimeError):
    """A loss (or the parameter norm) became non-finite; the metrics up to then are written."""

    def __init__(self, step: int, message: str = ""):
        self.step = int(step)
        super().__init__(message or f"diverged at env step {self.step}")


def _versions() -> dict[str, str]:
    return {"python": platform.python_version(), **program_cache.package_versions(
        ("scaling_rl", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy"))}


# --------------------------------------------------------------------------------------------
# Metrics rows


def _strip_weak_types(tree: Any) -> Any:
    """Make every leaf strongly typed, so a freshly initialised state, a chunk's output state and
    a restored checkpoint all have the same avals (one compiled program, bitwise-equal resume)."""
    import jax

    def leaf(x):
        if getattr(x, "weak_type", False):
            return jax.lax.convert_element_type(x, x.dtype)
        return x

    return jax.tree.map(leaf, tree)


def _scalar(x: np.ndarray) -> float | int:
    x = np.asarray(x)
    if x.size != 1:
        x = np.mean(x)
    x = x.reshape(())
    if np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.bool_):
        return int(x)
    return float(x)


def chunk_rows(chunk: int, metrics: Mapping[str, np.ndarray], seeds: int,
               chunk_env_steps: int) -> list[dict[str, Any]]:
    """Tidy rows (one per seed) from one chunk's seed-vmapped host metrics."""
    rows = []
    for s in range(seeds):
        row: dict[str, Any] = {"seed": s, "chunk": chunk}
        for key, value in metrics.items():
            row[key] = _scalar(np.asarray(value)[s])
        row.setdefault("env_steps", (chunk + 1) * chunk_env_steps)
        row["env_steps"] = int(row["env_steps"])
        if "grad_steps" in row and float(row["grad_steps"]).is_integer():
            row["grad_steps"] = int(row["grad_steps"])
        rows.append(row)
    return rows


def metrics_frame(rows: list[dict[str, Any]]):
    """The tidy table: identity columns first, metrics sorted, timing columns last."""
    import pandas as pd

    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=["seed", "chunk", "env_steps", "grad_steps"])
    first = [c for c in ("seed", "chunk", "env_steps", "grad_steps") if c in df]
    last = [c for c in TIME_COLUMNS if c in df]
    middle = sorted(c for c in df.columns if c not in first and c not in last)
    df = df[first + middle + last]
    for c in ("seed", "chunk", "env_steps"):
        df[c] = df[c].astype("int64")
    return df.sort_values(["chunk", "seed"], kind="stable").reset_index(drop=True)


def _non_finite(metrics: Mapping[str, np.ndarray]) -> list[str]:
    """Names of divergence-relevant metrics (losses, parameter norm) that are not finite."""
    bad = []
    for key, value in metrics.items():
        if key.startswith("loss") or key == "param_norm":
            v = np.asarray(value, dtype=np.float64)
            if not np.all(np.isfinite(v)):
                bad.append(key)
    return bad


def _summary(df, extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(extra)
    if df.empty:
        return out
    last = df[df["chunk"] == df["chunk"].max()]
    out["env_steps"] = int(last["env_steps"].max())
    for key in ("episode_return", "eval_return", "grad_steps"):
        if key in last:
            v = last[key].to_numpy(dtype=np.float64)
            v = v[np.isfinite(v)]
            if v.size:
                out[f"final_{key}_mean"] = float(v.mean())
                out[f"final_{key}_std"] = float(v.std())
    if "wall_time" in df:
        out["wall_time"] = float(df["wall_time"].max())
    return out


def run(agent_name: str, cfg: Any, out_dir: str | os.PathLike, seeds: int, *, seed: int = 0,
        wandb: bool | Mapping[str, Any] = False, progress: bool = True,
        checkpoint_every: int = 1, eval_every: int = 1,
        on_chunk: Callable[[int, Any], None] | None = None,
        seed_configs: typing.Sequence[Any] | None = None,
        stop: Callable[[int, Any], Any] | None = None,
        seed_ids: typing.Sequence[tuple[int, int]] | None = None):
    """Train `seeds` seeds of `agent_name` with `cfg` (its Config, or a dict for
    `Config.from_dict`) into `out_dir`; returns the tidy metrics DataFrame.

    `seed_configs` (one Config or dict per seed) lets seed i train with its own values of the
    agent module's `PACKABLE` fields (learning rates, weight decay: optimiser state, not program);
    every other field must equal `cfg`'s. This is how the sweep packs trials differing in η into
    one vmapped program. The per-seed values are recorded in config.json (`seed_hparams`).
    `seed_ids` (one (root seed, index) pair per seed) gives seed i the key
    fold_in(PRNGKey(root), index) instead of fold_in(PRNGKey(seed), i): a packed trial's seeds then
    follow exactly the random streams they have when the trial runs alone (recorded as `seed_ids`).

    Resumes from the newest checkpoint in `out_dir` (the config must match the one there);
    returns the stored table at once when the run is already complete. Checkpoints every
    `checkpoint_every` chunks (0: only at the end) and evaluates every `eval_every` chunks
    (0: only at the end; never when the config has `eval_episodes == 0`), or, when the config
    has `eval_schedule='log'`, after `eval_points` log-spaced chunks (`eval_chunks`; then
    `eval_every` must stay 1). `on_chunk(chunk,
    table)` is called after each chunk's rows are written and its checkpoint queued.
    `stop(chunk, table)` (early stopping, scaling_rl/sweep/early_stop.py) is asked after every chunk
    but the last (before its checkpoint is queued and `on_chunk` is called), and once when resuming from a checkpoint, on the restored rows:
    when it returns a decision (a JSON-ready dict, anything truthy) the run checkpoints that chunk,
    writes status.json `done` with `stopped` = the decision and `chunk` = the chunks run, and returns
    the table; a rerun then returns the stored table (a stopped run is never continued).
    Raises ConfigError before writing anything on bad input, and Diverged(step) after
    writing the metrics so far when a loss becomes non-finite.
    """
    # ---- validate everything before touching the disk
    mod = agent_module(agent_name)
    if isinstance(cfg, Mapping):
        try:
            cfg = mod.Config.from_dict(dict(cfg)) if hasattr(mod.Config, "from_dict") else mod.Config(**cfg)
        except (ValueError, TypeError) as e:
            raise ConfigError(_one_line(e)) from None
    elif not isinstance(cfg, mod.Config):
        raise ConfigError(f"cfg: expected {agent_name}.Config or a dict, got {type(cfg).__name__}")
    seeds = int(seeds) if isinstance(seeds, np.integer) else seeds
    seed = int(seed) if isinstance(seed, np.integer) else seed
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise ConfigError(f"seeds: must be an integer >= 1, got {seeds!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed: must be an integer >= 0, got {seed!r}")
    for name, value in (("checkpoint_every", checkpoint_every), ("eval_every", eval_every)):
        if not isinstance(value, int) or value < 0:
            raise ConfigError(f"{name}: must be an integer >= 0, got {value!r}")
    schedule, points = _eval_schedule(cfg)
    if (err := eval_schedule_error(schedule, points)) is not None:
        raise ConfigError(err)
    if schedule == "log" and eval_every != 1:
        raise ConfigError(f"eval_every: {eval_every} applies to eval_schedule='linear' only; "
                          "with eval_schedule='log' set eval_points instead")
    seed_hparams = _seed_hparams(agent_name, mod, cfg, seeds, seed_configs)
    if seed_ids is not None:
        try:
            seed_ids = [[int(r), int(i)] for r, i in seed_ids]
        except (TypeError, ValueError):
            raise ConfigError("seed_ids: expected one (root seed, index) pair of integers per seed") from None
        if len(seed_ids) != seeds or any(r < 0 or not 0 <= i < 2 ** 32 for r, i in seed_ids):
            raise ConfigError(f"seed_ids: expected {seeds} (root seed >= 0, index >= 0) pairs, got {len(seed_ids)}")
    try:
        agent = mod.make(cfg)
        from scaling_rl.nets import memory   # estimated peak memory vs the budget (docs/deep_stacks.md)
        memory.check_fits(mod, cfg, agent, seeds)
    except (ValueError, TypeError) as e:
        raise ConfigError(_one_line(e)) from None

    out = Path(out_dir)
    record = {"agent": agent_name, "config": _config_dict(cfg), "seeds": seeds, "seed": seed}
    if seed_hparams is not None:
        record["seed_hparams"] = seed_hparams
    if seed_ids is not None:
        record["seed_ids"] = seed_ids
    config_path, status_path = out / "config.json", out / "status.json"
    if (problem := io.output_dir_problem(out)) is not None:
        raise ConfigError(f"out: {problem}")
    if config_path.exists():
        old = _read_run_file(config_path)
        old_record = {k: old.get(k) for k in record}
        old_record["config"] = _with_new_defaults(old_record["config"], cfg)
        if old_record != record:
            raise ConfigError(f"out: {out} holds a different run ({_first_difference(old_record, record)}); "
                              "use a new --out or the same config to resume")
    if status_path.exists():   # refused or answered before the lock file is made: a done run is final
        if (done := _done_table(out, _read_run_file(status_path))) is not None:
            return done
    out.mkdir(parents=True, exist_ok=True)
    from scaling_rl import multiprocess

    primary = multiprocess.is_primary()   # several processes (multiprocess.py): process 0 writes
    with _exclusive(out) if primary else contextlib.nullcontext():
        if primary and not config_path.exists():
            io.atomic_write_json(config_path, {**record, "param_count": int(agent.param_count),
                                               "num_chunks": int(agent.num_chunks),
                                               "versions": _versions()})
        status = _read_run_file(status_path) if status_path.exists() else {}
        if (done := _done_table(out, status)) is not None:
            return done
        if status.get("status") == "diverged":
            raise Diverged(status.get("step", 0), f"already diverged at env step {status.get('step', 0)}")
        return _loop(agent_name, mod, cfg, agent, out, seeds, seed if seed_ids is None else seed_ids, wandb,
                     progress, checkpoint_every, eval_every, on_chunk, seed_hparams, stop)


def _read_run_file(path: Path) -> dict:
    """A run directory's config.json / status.json as a dict; ConfigError (one line) when it is
    empty, not JSON or not an object (a run never writes such a file: the directory is not ours)."""
    from scaling_rl.errors import CorruptFile

    try:
        return io.read_json_object(path)
    except CorruptFile as e:
        raise ConfigError(f"out: {e}; not a run this command wrote: use a new --out (or remove the file)") from None


def _done_table(out: Path, status: dict):
    """The stored table of a finished run (None when the run is not done); ConfigError when unreadable."""
    if status.get("status") != "done" or not (out / "metrics.parquet").exists():
        return None
    import pandas as pd

    try:
        return pd.read_parquet(out / "metrics.parquet")
    except Exception as e:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ...
        raise ConfigError(f"out: {out / 'metrics.parquet'}: not a readable parquet table "
                          f"({type(e).__name__}); use a new --out") from None


def _with_new_defaults(old_config: Any, cfg: Any) -> Any:
    """A stored config with the fields it predates filled in, where `cfg` has their defaults:
    a run started before a Config field was added resumes as long as the field keeps its default."""
    if not isinstance(old_config, dict):
        return old_config
    now = _config_dict(cfg)
    filled = dict(old_config)
    for f in dataclasses.fields(cfg):
        if f.name not in filled and f.default is not dataclasses.MISSING:
            default = json.loads(json.dumps(f.default, default=str))
            if now.get(f.name) == default:
                filled[f.name] = default
    return filled


def _eval_schedule(cfg) -> tuple[Any, Any]:
    """(eval_schedule, eval_points) of a config; configs without the fields evaluate linearly."""
    return getattr(cfg, "eval_schedule", "linear"), getattr(cfg, "eval_points", 16)


def _seed_hparams(agent_name: str, mod, cfg, seeds: int, seed_configs) -> list[dict] | None:
    """Validate `seed_configs` against `cfg`; the per-seed `mod.hparams` values (None if not given)."""
    if seed_configs is None:
        return None
    packable = getattr(mod, "PACKABLE", None)
    if not packable or not hasattr(mod, "hparams"):
        raise ConfigError(f"seed_configs: agent {agent_name} has no per-seed hyper-parameters (PACKABLE)")
    if isinstance(seed_configs, (str, bytes, Mapping)) or len(seed_configs) != seeds:
        n = len(seed_configs) if isinstance(seed_configs, (list, tuple)) else type(seed_configs).__name__
        raise ConfigError(f"seed_configs: expected a list of {seeds} configs (one per seed), got {n}")
    base = {k: v for k, v in _config_dict(cfg).items() if k not in packable}
    out = []
    for i, c in enumerate(seed_configs):
        if isinstance(c, Mapping):
            try:
                c = mod.Config.from_dict(dict(c))
            except (ValueError, TypeError) as e:
                raise ConfigError(f"seed_configs[{i}]: {_one_line(e)}") from None
        elif not isinstance(c, mod.Config):
            raise ConfigError(f"seed_configs[{i}]: expected {agent_name}.Config or a dict, got {type(c).__name__}")
        other = {k: v for k, v in _config_dict(c).items() if k not in packable}
        if other != base:
            raise ConfigError(f"seed_configs[{i}]: differs from cfg outside {', '.join(packable)} "
                              f"({_first_difference(base, other)}); such trials cannot share a program")
        out.append(mod.hparams(c))
    return out


@contextlib.contextmanager
def _exclusive(out: Path):
    """Hold an exclusive lock on the run directory (released by the OS if the process dies)."""
    import fcntl

    with open(out / ".lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"out: {out} is in use by another training process") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _first_difference(old: Mapping, new: Mapping) -> str:
    def flat(d, prefix=""):
        items = {}
        for k, v in d.items():
            if isinstance(v, Mapping):
                items.update(flat(v, f"{prefix}{k}."))
            else:
                items[f"{prefix}{k}"] = v
        return items

    a, b = flat(old), flat(new)
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            return f"{key}: {a.get(key)!r} there, {b.get(key)!r} now"
    return "differs"


def _loop(agent_name, mod, cfg, agent, out: Path, seeds, seed, wandb_opts, progress, checkpoint_every,
          eval_every, on_chunk, seed_hparams=None, stop=None):
    job = _Run(agent_name, mod, cfg, agent, out, seeds, seed, seed_hparams, checkpoint_every=checkpoint_every,
               eval_every=eval_every, on_chunk=on_chunk, stop=stop)
    finished = False
    try:
        job.restore()
        if job.start < job.num_chunks and job.stopped is None:
            job.train(wandb_opts, progress)
        df = job.finish()
        finished = True
        return df
    except (Diverged, KeyboardInterrupt):
        raise
    except Exception as e:
        if not isinstance(e, ConfigError):
            job.write_failed(e)
        raise
    finally:
        job.close(finished)


def seed_keys(seed, seeds: int):
    """The init keys of a run's seeds: fold_in(PRNGKey(seed), i), or, when `seed` is a list of
    (root, index) pairs (`run`'s `seed_ids`), fold_in(PRNGKey(root), index) per seed."""
    import jax

    if isinstance(seed, int):
        root = jax.random.PRNGKey(seed)
        return jax.vmap(lambda i: jax.random.fold_in(root, i))(np.arange(seeds, dtype=np.uint32))
    by_root: dict[int, list[int]] = {}
    for j, (r, _) in enumerate(seed):
        by_root.setdefault(int(r), []).append(j)
    keys = [None] * len(seed)
    for r, rows in by_root.items():   # one vmapped fold per root: the same bits as the int path
        got = seed_keys(r, 1 + max(int(seed[j][1]) for j in rows))
        for j in rows:
            keys[j] = got[int(seed[j][1])]
    return jax.numpy.stack(keys)


class _HostChunk:
    """An agent's host-driven chunk (`Agent.host_chunk`) where a compiled chunk program would be."""
    status = "host"

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, state):
        return self.fn(state)


class _Programs:
    """A run's jitted programs (init, chunk, eval; seed-vmapped), each prepared once, through the
    program cache when the agent allows it. `built` holds them in the order they were prepared."""

    def __init__(self, agent_name, mod, cfg, agent, seeds, seed, seed_hparams):
        import jax

        self.agent = agent
        self.seed_keys = seed_keys(seed, seeds)
        # traced programs are cached next to the persistent compilation cache (when one is set):
        # a warm trial skips tracing and lowering as well as XLA compilation
        self.cache_dir = program_cache.default_dir() if _program_cacheable(mod, cfg) else None
        # PACKABLE values (learning rates, weight decay) live in the optimiser state and are set from
        # an input right after init, so no program depends on them: trials differing only in them
        # share every program, packed (one program, per-seed values) or one by one
        packable = getattr(mod, "PACKABLE", ()) or ()
        if seed_hparams is None and packable and hasattr(mod, "hparams") and agent.set_hparams is not None:
            seed_hparams = [mod.hparams(cfg)] * seeds
        if seed_hparams is None:
            packable = ()
            self.init_args = (self.seed_keys,)
            init_one = jax.vmap(lambda k: _strip_weak_types(agent.init(k)))
        else:  # each seed's optimisers get its own hyper-parameters right after init
            hp = {k: np.asarray([h[k] for h in seed_hparams], np.float32) for k in seed_hparams[0]}
            self.init_args = (self.seed_keys, hp)
            init_one = jax.vmap(lambda k, h: _strip_weak_types(agent.set_hparams(agent.init(k), h)))
        self.key = {"agent": agent_name, "seeds": seeds,
                    "hparams": sorted(seed_hparams[0]) if seed_hparams else None,
                    "config": {k: v for k, v in _config_dict(cfg).items() if k not in packable}}
        self.built = {"init": self._prepare("init", init_one, self.init_args)}

    def _prepare(self, name: str, fn, args, **kw):
        return program_cache.prepare(fn, args, key={**self.key, "program": name}, cache_dir=self.cache_dir, **kw)

    @property
    def init(self):
        return self.built["init"]

    def init_state(self):
        return self.init(*self.init_args)

    def compile_chunk(self, state):
        """The chunk program for states like `state` (donated), compiled now."""
        import jax

        if getattr(self.agent, "host_chunk", None) is not None:   # several programs dispatched from the host per chunk
            self.built["chunk"] = _HostChunk(self.agent.host_chunk)
            return self.built["chunk"]

        def chunk_one(state):
            state, metrics = self.agent.chunk(state)
            return _strip_weak_types(state), metrics

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*donated buffers were not usable.*")
            compiled = self._prepare("chunk", jax.vmap(chunk_one), (state,), donate=True).compile_now()
        self.built["chunk"] = compiled
        return compiled

    def evaluate(self, state, chunk: int):
        """The agent's evaluation of every seed after `chunk`, with keys that depend only on the
        seed and the chunk (so a resumed run evaluates alike); prepared on first use."""
        import jax

        stream = jax.vmap(lambda k: jax.random.fold_in(jax.random.fold_in(k, _EVAL_STREAM), chunk))
        keys = stream(self.seed_keys)
        if "eval" not in self.built:
            self.built["eval"] = self._prepare("eval", jax.vmap(self.agent.evaluate), (state, keys))
        return self.built["eval"](state, keys)

    def statuses(self) -> dict[str, Any]:
        return {k: p.status for k, p in self.built.items()}


class _Run:
    """One call of the host loop: what to run (schedule, programs, checkpointer) and how far it got
    (train state, rows, the early-stop decision). `_loop` drives it: restore, train, finish; and
    write_failed / close when that goes wrong or is over."""

    def __init__(self, agent_name, mod, cfg, agent, out: Path, seeds, seed, seed_hparams, *,
                 checkpoint_every, eval_every, on_chunk, stop):
        from scaling_rl.checkpoint import Checkpointer

        self.t_start = time.perf_counter()
        self.agent_name, self.cfg, self.agent, self.out, self.seeds = agent_name, cfg, agent, out, seeds
        self.checkpoint_every, self.on_chunk, self.stop = checkpoint_every, on_chunk, stop
        self.num_chunks = num_chunks = int(agent.num_chunks)
        self.chunk_env_steps = int(getattr(cfg, "chunk_env_steps", 0) or cfg.env_steps // max(num_chunks, 1))
        self.do_eval = int(getattr(cfg, "eval_episodes", 1) or 0) > 0 and hasattr(agent, "evaluate")
        schedule, points = _eval_schedule(cfg)
        self.eval_at = set(eval_chunks(num_chunks, schedule=schedule, every=eval_every, points=points,
                                       chunk_env_steps=self.chunk_env_steps,
                                       offset_env_steps=int(getattr(cfg, "warmup_env_steps", 0) or 0)))
        self.status_path, self.metrics_path = out / "status.json", out / "metrics.parquet"
        self.title = (f"{agent_name} on {getattr(cfg, 'env', '?')} · width {getattr(cfg, 'width', '?')} "
                      f"depth {getattr(cfg, 'depth', '?')} utd {getattr(cfg, 'utd', '?')} "
                      f"batch {getattr(cfg, 'batch_size', '?')} lr {getattr(cfg, 'lr', '?')} · "
                      f"N={agent.param_count:,}")
        self.programs = _Programs(agent_name, mod, cfg, agent, seeds, seed, seed_hparams)
        from scaling_rl import multiprocess

        # every process runs the programs and takes part in checkpoint saves; process 0 writes the rest
        self.primary = multiprocess.is_primary()
        self.ckpt = Checkpointer(out / "checkpoints", max_to_keep=2)
        self.logger = None
        self.bar = None
        self.state = None
        self.rows: list[dict[str, Any]] = []
        self.wall_offset = 0.0
        self.start = 0             # chunks done before this call (the checkpoint resumed from)
        self.stopped = None        # the early-stop decision that ended the run, if any
        self.end = num_chunks      # chunks run when the run is declared done
        self.startup_s = 0.0

    def restore(self) -> None:
        """Resume from the newest checkpoint (state, rows, wall time), mark the run running, and
        on a resume ask the stop rule once, on the restored rows."""
        start = self.ckpt.latest_step() or 0
        if start > self.num_chunks:
            raise ConfigError(f"out: checkpoint at chunk {start} is past the run's {self.num_chunks} chunks")
        if start:
            self.state, meta = self.ckpt.restore(start, self.programs.init.out_abstract)
            self.rows = [dict(r) for r in meta["rows"]]
            self.wall_offset = float(meta.get("wall_time", 0.0))
        self.start = start
        self._write_json(self.status_path, {"status": "running", "chunk": start, "num_chunks": self.num_chunks})
        if self.stop is not None and 0 < start < self.num_chunks and self.rows:
            # killed after the decision but before status.json said done: the rule is a pure
            # function of the table, so asking it again on the restored rows gives the same answer
            self.stopped = self.stop(start - 1, metrics_frame(self.rows)) or None
            if self.stopped is not None:
                self.end = start

    def train(self, wandb_opts, progress) -> None:
        """Compile the chunk program, then run chunks from `start` to the last or a stop decision."""
        from scaling_rl.logging_utils import Progress, WandbLogger

        if self.state is None:
            self.state = self.programs.init_state()
        compiled = self.programs.compile_chunk(self.state)
        self.startup_s = time.perf_counter() - self.t_start
        if wandb_opts and self.primary:
            self.logger = WandbLogger(wandb_opts, out_dir=str(self.out), agent=self.agent_name,
                                      config=dataclasses.asdict(self.cfg), seeds=self.seeds)
        self.bar = Progress(progress and self.primary, total=self.num_chunks, completed=self.start,
                            description=f"{self.agent_name.rsplit('.', 1)[-1]} ×{self.seeds}")
        for chunk in range(self.start, self.num_chunks):
            if self._chunk(compiled, chunk):
                self.end = chunk + 1
                break
        self.ckpt.wait()  # the final checkpoint is durable before the run is declared done

    def _chunk(self, compiled, chunk: int) -> bool:
        """Run and record one chunk: rows to metrics.parquet, divergence check, wandb, stop decision,
        checkpoint, status.json, progress bar, `on_chunk`. True when the run stops after it."""
        metrics, new_rows, wall = self._step(compiled, chunk)
        self.rows.extend(new_rows)
        df = metrics_frame(self.rows)
        if self.primary:
            io.atomic_write_parquet(self.metrics_path, df)
        self._check_finite(chunk, metrics, new_rows, df)

        if self.logger is not None:
            self.logger.log(new_rows)
        last = chunk + 1 == self.num_chunks
        if self.stop is not None and not last:
            self.stopped = self.stop(chunk, df) or None
        every = self.checkpoint_every
        if last or self.stopped is not None or (every and (chunk + 1) % every == 0):
            # save() first waits for the previous save (raising its errors), then copies
            # the state to host and writes in the background while the next chunk runs.
            self.ckpt.save(chunk + 1, self.state, {"chunk": chunk + 1, "rows": self.rows, "wall_time": wall,
                                                   "num_chunks": self.num_chunks})
        if not last and self.stopped is None:
            self._write_json(self.status_path, {"status": "running", "chunk": chunk + 1,
                                                    "num_chunks": self.num_chunks,
                                                    "env_steps": new_rows[0]["env_steps"]})
        self.bar.update(chunk + 1, steps=new_rows[0]["env_steps"],
                        ret=_nanmean([r.get("episode_return", math.nan) for r in new_rows]),
                        eval=_nanmean([r.get("eval_return", math.nan) for r in new_rows]),
                        sps=new_rows[0]["env_steps_per_s"])
        if self.on_chunk is not None:
            self.on_chunk(chunk, df)
        return self.stopped is not None

    def _step(self, compiled, chunk: int):
        """Train one chunk (and evaluate after it, when scheduled): (host metrics, its timed rows, wall time)."""
        t0 = time.perf_counter()
        from scaling_rl.checkpoint import to_host

        self.state, metrics = compiled(self.state)
        metrics = to_host(metrics)   # also reads arrays replicated over several processes
        chunk_time = time.perf_counter() - t0
        if self.do_eval and chunk in self.eval_at:
            evaluated = to_host(self.programs.evaluate(self.state, chunk))
            for key, value in evaluated.items():
                metrics[key if key.startswith("eval") else f"eval_{key}"] = value
        eval_time = time.perf_counter() - t0 - chunk_time
        new_rows = chunk_rows(chunk, metrics, self.seeds, self.chunk_env_steps)
        wall = self.wall_offset + time.perf_counter() - self.t_start
        for r in new_rows:
            r.update(wall_time=wall, chunk_time=chunk_time, eval_time=eval_time,
                     env_steps_per_s=self.seeds * self.chunk_env_steps / max(chunk_time, 1e-9))
        return metrics, new_rows, wall

    def _check_finite(self, chunk: int, metrics, new_rows, df) -> None:
        """Raise Diverged when a loss or the parameter norm is non-finite, after writing the
        diverged status, the curve and (to wandb) the chunk's rows."""
        bad = _non_finite(metrics)
        if not bad:
            return
        seeds = self.seeds
        step = max(r["env_steps"] for r in new_rows)
        bad_seeds = sorted({s for key in bad for s in range(seeds)
                            if not np.all(np.isfinite(np.asarray(metrics[key], np.float64)[s]))})
        self._write_json(self.status_path, {
            "status": "diverged", "step": step, "chunk": chunk, "num_chunks": self.num_chunks,
            "metrics": bad, "seeds": bad_seeds})
        if self.primary:
            _try_plot(df, self.out / "curve.png", self.title)
        if self.logger is not None:
            self.logger.log(new_rows)
        raise Diverged(step, f"diverged at env step {step}: {', '.join(bad)} non-finite (seeds {bad_seeds})")

    def finish(self):
        """Declare the run done: the table (rewritten when missing or when this call ran no
        chunk), the curve, status.json `done` with the summary (and the stop decision); the table."""
        df = metrics_frame(self.rows)
        if self.primary and (not self.metrics_path.exists() or self.start == self.end):
            io.atomic_write_parquet(self.metrics_path, df)
        if self.primary:
            _try_plot(df, self.out / "curve.png", self.title)
        from scaling_rl import multiprocess

        summary = _summary(df, {"param_count": int(self.agent.param_count), "seeds": self.seeds,
                                "processes": multiprocess.process_count(),
                                "startup_s": self.startup_s, "program_cache": self.programs.statuses()})
        done = {"status": "done", "chunk": self.end, "num_chunks": self.num_chunks, "summary": summary}
        if self.stopped is not None:
            done["stopped"] = self.stopped
        self._write_json(self.status_path, done)
        if self.logger is not None:
            self.logger.run.summary.update(summary)
        return df

    def _write_json(self, path: Path, obj) -> None:
        if self.primary:
            io.atomic_write_json(path, obj)

    def write_failed(self, e: BaseException) -> None:
        self._write_json(self.status_path, {"status": "failed", "error": f"{type(e).__name__}: "
                                                f"{_one_line(e)}", "num_chunks": self.num_chunks})

    def close(self, finished: bool) -> None:
        """Close the progress bar, the wandb run and the checkpointer (whose pending save a
        finished run waits for and reports; an unfinished one keeps its original error)."""
        if self.bar is not None:
            self.bar.close()
        if self.logger is not None:
            self.logger.finish(exit_code=0 if finished else 1)
        if finished:
            self.ckpt.close()  # waits; a failed save raises here
        else:
            try:
                self.ckpt.close()
            except Exception:  # noqa: BLE001 - keep the original error
                pass


def _program_cacheable(mod: types.ModuleType, cfg) -> bool:
    """Traced programs are cached only for built-in agents (the cache's fingerprint hashes the
    scaling_rl source, not a user's module) and single-program (not data-parallel) runs."""
    return mod.__name__.startswith("scaling_rl.") and not getattr(cfg, "data_parallel", False)


def _nanmean(values) -> float:
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else math.nan


def _try_plot(df, path: Path, title: str) -> None:
    from scaling_rl.plotting import plot_learning_curve

    plot_learning_curve(df, path, title=title)


def load_state(out_dir: str | os.PathLike, step: int | None = None):
    """(state, meta) of a run directory's checkpoint `step` (default: newest), seed axis first."""
    import jax

    out = Path(out_dir)
    record = json.loads((out / "config.json").read_text())
    mod = agent_module(record["agent"])
    agent = mod.make(mod.Config.from_dict(record["config"]))
    keys = seed_keys(record.get("seed_ids") or record["seed"], record["seeds"])
    abstract = jax.eval_shape(jax.vmap(lambda k: _strip_weak_types(agent.init(k))), keys)
    from scaling_rl.checkpoint import Checkpointer

    ckpt = Checkpointer(out / "checkpoints")
    try:
        step = ckpt.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"{out}: no checkpoint")
        return ckpt.restore(step, abstract)
    finally:
        ckpt.close()
