"""Reading a store: one tidy table for the whole sweep, and status counts with an ETA."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

from scaling_rl.errors import CorruptFile
from scaling_rl.io import atomic_write_parquet, output_file_problem, read_json_object
from scaling_rl.sweep.store import STATES, Store

RESULTS = "results.parquet"
KEY_COLUMNS = ("trial_id", "agent", "status", "param_count", "seed", "seed_index", "trial_seed",
               "seeds", "chunk", "env_steps", "grad_steps")


def _param_count(store: Store, tid: str, st: dict):
    if st.get("param_count") is not None:
        return int(st["param_count"])
    cfg = store.trial_dir(tid) / "config.json"
    if cfg.exists():
        with_count = read_json_object(cfg, what="a run record").get("param_count")
        if with_count is not None:
            return int(with_count)
    return None


def _read_metrics(path: Path):
    """A trial's metrics table; CorruptFile (naming the file) when it is not a readable parquet table."""
    import pandas as pd
    try:
        df = pd.read_parquet(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ... on a damaged file
        raise CorruptFile(path, f"not a readable parquet table ({type(e).__name__})") from None
    if not df.empty and "seed" not in df.columns:
        raise CorruptFile(path, "no `seed` column: not a trial's metrics table")
    return df


def _trial_frame(store: Store, tid: str):
    """One trial's rows of the tidy table (None when it has no metrics yet); CorruptFile on a bad file."""
    path = store.trial_dir(tid) / "metrics.parquet"
    trial, st = store.trial(tid), store.status(tid)   # both checked even for a trial without metrics
    if not path.exists():
        return None
    df = _read_metrics(path)
    if df.empty:
        return None
    df = df.rename(columns={"seed": "seed_index"})
    df["seed_index"] = df["seed_index"].astype("int64")
    df["trial_seed"] = trial.seed
    df["seeds"] = trial.seeds
    df["seed"] = trial.seed * trial.seeds + df["seed_index"]
    df["trial_id"] = tid
    df["agent"] = trial.agent
    df["status"] = st.get("state", "pending")
    df["param_count"] = _param_count(store, tid, st)
    df["stopped_early"] = st.get("stopped_early")
    df["stop_step"] = float(st["stop_step"]) if st.get("stop_step") is not None else float("nan")
    for k, v in trial.config.items():
        col = f"cfg_{k}" if k in df.columns else k
        df[col] = json.dumps(v) if isinstance(v, (list, dict)) else v
    return df


def check_results_path(root, out) -> str | None:
    """Why `out` may not receive the collected table of store `root` (one line), or None: not .parquet,
    a directory, unwritable, or inside the store's own folders (trials/, adaptive/, .jax_cache/); the
    store's sweep.json is not .parquet, so it is refused too."""
    out, root = Path(out), Path(root)
    if out.suffix != ".parquet":
        return f"--out {out}: the table is parquet; give a .parquet path"
    try:
        rel = out.resolve().relative_to(root.resolve())
    except ValueError:
        rel = None
    if rel is not None and rel.parts and rel.parts[0] in ("trials", "adaptive", ".jax_cache"):
        return f"--out {out}: a file of the sweep store {root} itself; give a path outside trials/ and adaptive/"
    problem = output_file_problem(out)
    return None if problem is None else f"--out: {problem}"


def collect(root, *, out: str | None = None, progress: bool = False):
    """Concatenate every trial's metrics into one tidy DataFrame and write it (parquet).

    Columns: trial_id, agent, status, param_count (N), seed, seed_index, trial_seed, seeds,
    chunk, env_steps, grad_steps, every metric, and every config field (utd = sigma,
    batch_size = B, lr, width, depth, env, ...). A config field whose name is also a metric
    column (env_steps: budget vs step) is prefixed `cfg_`. `seed` is unique per replica of a
    config: trial_seed * seeds + seed_index. Early stopping (sweep/early_stop.py): every row of a
    stopped trial carries `stopped_early` ("reached" | "unreachable"; None for a trial that ran its
    budget) and `stop_step` (its last env step; NaN when not stopped), which `scaling.data` uses to
    put replicas stopped at different steps on one grid. A stopped trial keeps all its rows.
    A trial whose trial.json, trial_status.json or metrics.parquet cannot be read raises CorruptFile
    naming the first such file and trial before anything is written.
    """
    import pandas as pd

    store = Store(root)
    tids = store.trial_ids()
    frames = []
    it = tids
    if progress and tids:
        from rich.progress import track
        it = track(tids, description="collect", transient=True)
    bad = []
    for tid in it:
        try:
            df = _trial_frame(store, tid)
        except CorruptFile as e:
            bad.append((tid, e))
            continue
        if df is not None:
            frames.append(df)
    if bad:   # refuse before writing: a table silently missing trials would bias every fit made from it
        tid, e = bad[0]
        more = f" (and {len(bad) - 1} more: {', '.join(t for t, _ in bad[1:4])}{' ...' if len(bad) > 4 else ''})" \
            if len(bad) > 1 else ""
        raise CorruptFile(e.path, f"{e.problem}; trial {tid} unreadable{more}: rerun or remove the trial, "
                          "nothing was collected")
    if frames:
        table = pd.concat(frames, ignore_index=True)
        first = [c for c in KEY_COLUMNS if c in table.columns]
        table = table[first + [c for c in table.columns if c not in first]]
        table = table.sort_values(["trial_id", "chunk", "seed_index"], kind="stable").reset_index(drop=True)
    else:
        table = pd.DataFrame(columns=list(KEY_COLUMNS))
    dest = Path(out) if out else store.root / RESULTS
    atomic_write_parquet(dest, table)
    return table


def status_summary(root) -> dict:
    """Counts per state (a `running` trial whose runner died shows as `interrupted`; one whose trial.json or
    trial_status.json is corrupt as `unreadable`, listed with why in `unreadable`) and an ETA;
    `early_stop`: trials stopped early (stopped, reached, unreachable) and the env steps / FLOPs
    they saved (saved_flops None when some stopped trial's FLOPs could not be computed)."""
    store = Store(root)
    counts = {s: 0 for s in (*STATES, "interrupted", "unreadable")}
    walls, running_elapsed, diverged = [], [], []
    es = {"stopped": 0, "reached": 0, "unreachable": 0, "saved_env_steps": 0, "saved_flops": 0.0}
    now = time.time()
    unreadable = []
    for tid in store.trial_ids():
        why = store.unreadable(tid)
        if why is not None:
            counts["unreadable"] += 1
            unreadable.append((tid, why))
            continue
        st = store.status(tid)
        state = store.effective_state(tid, st)
        counts[state] += 1
        if state == "done" and st.get("wall_s") is not None:
            walls.append(float(st["wall_s"]))
        if state == "running" and st.get("attempt_started"):
            running_elapsed.append(now - float(st["attempt_started"]))
        if state == "diverged":
            diverged.append((tid, st.get("step")))
        if state == "done" and st.get("stopped_early"):
            es["stopped"] += 1
            es[st["stopped_early"]] = es.get(st["stopped_early"], 0) + 1
            es["saved_env_steps"] += int(st.get("saved_env_steps") or 0)
            if es["saved_flops"] is not None:
                es["saved_flops"] = (None if st.get("saved_flops") is None
                                     else es["saved_flops"] + float(st["saved_flops"]))
    total = sum(counts.values())
    left = counts["pending"] + counts["interrupted"] + counts["running"]
    eta = None
    if walls and left:
        mean = sum(walls) / len(walls)
        lanes = max(1, counts["running"])
        eta = max(0.0, (left * mean - sum(min(e, mean) for e in running_elapsed)) / lanes)
    return {"root": str(store.root), "total": total, "counts": counts, "eta_s": eta,
            "mean_trial_s": (sum(walls) / len(walls)) if walls else None, "diverged": diverged,
            "early_stop": es, "unreadable": unreadable}


def format_eta(seconds) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "unknown"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"
