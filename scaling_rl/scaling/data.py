"""Learning curves in, one `Curve` per configuration out (steps × seeds).

Two sources:
- the sweep store's tidy table (parquet/CSV, or a directory holding one, or a directory of trial
  directories with `config.json` + `metrics.parquet`): one row per (trial, seed, log point) with
  config columns (`utd`, `batch_size`, `lr`, `param_count`, `env`, `agent`, ...), `seed`,
  `env_steps` and metric columns;
- published curve directories `<root>/[w<width>p<param_count>/]utd_<σ>/<task>/<metric>/bs_<B>_lr_<η>[_<key>_<value>...].npy`
  (rows = log points; column 0 = env step, the other columns = seeds; with `steps=(START, EVERY)` every
  column is a seed and row k was logged at env step START + k·EVERY).

A source without model sizes (no `w<width>p<N>/` level, no `param_count` column) can be given one with
`param_count=N`: every curve is then that model size, so the σ-only budget optimum σ*(F) can be computed.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

# Columns that describe a log point or a run, never a configuration.
BOOKKEEPING = frozenset({"trial_id", "seed", "seed_index", "trial_seed", "seeds", "env_steps", "grad_steps",
                         "chunk", "step", "time", "wall_time", "status", "trial_dir", "path", "timestamp",
                         "stopped_early", "stop_step"})
CORE_FIELDS = ("env", "agent", "utd", "batch_size", "lr", "param_count", "width", "depth")
_TIMING = re.compile(r"(seconds|_s$|time|wall|fps|sps|throughput)")


@dataclasses.dataclass
class Curve:
    """All seeds of one configuration on a common grid of env steps."""

    task: str
    utd: float
    param_count: float
    batch_size: float
    lr: float
    steps: np.ndarray            # (T,) increasing env steps
    returns: np.ndarray          # (T, S) metric per seed
    extra: tuple[tuple[str, Any], ...] = ()   # further config fields (width, depth, tau, ...)

    @property
    def n_seeds(self) -> int:
        return self.returns.shape[1]

    @property
    def label(self) -> str:
        ex = "".join(f" {k}={v}" for k, v in self.extra)
        return f"{self.task} σ={self.utd:g} N={self.param_count:.3g} B={self.batch_size:g} η={self.lr:g}{ex}"


@dataclasses.dataclass
class CurveSet:
    """Curves of one metric plus notes on anything the loader had to decide."""

    curves: list[Curve]
    metric: str
    notes: list[str] = dataclasses.field(default_factory=list)
    source: str = ""

    @property
    def tasks(self) -> list[str]:
        return sorted({c.task for c in self.curves})

    def levels(self, field: str) -> np.ndarray:
        vals = np.array([getattr(c, field) for c in self.curves], float)
        return np.unique(vals[np.isfinite(vals)])

    def to_table(self) -> pd.DataFrame:
        """The tidy long table (one row per config, seed, log point)."""
        frames = []
        for i, c in enumerate(self.curves):
            T, S = c.returns.shape
            d = {"trial_id": f"t{i:05d}", "env": c.task, "utd": c.utd, "param_count": c.param_count,
                 "batch_size": c.batch_size, "lr": c.lr, **dict(c.extra)}
            frame = pd.DataFrame({"seed": np.repeat(np.arange(S), T), "env_steps": np.tile(c.steps, S),
                                  self.metric: c.returns.T.reshape(-1)})
            for k, v in d.items():
                frame[k] = v
            frames.append(frame)
        return pd.concat(frames, ignore_index=True)


def parse_steps(spec: str | Sequence[float] | None) -> tuple[float, float] | None:
    """`"START:EVERY"` (or a pair) -> (start, every): the env step of row k of a seed-only array is
    start + k·every. None stays None; anything else is a one-line ValueError."""
    if spec is None:
        return None
    if isinstance(spec, str):
        parts = spec.split(":")
        vals = [_number(v.strip()) for v in parts] if len(parts) == 2 else [None]
    else:
        vals = [_number(str(v)) for v in spec] if len(spec) == 2 else [None]
    if len(vals) != 2 or any(v is None or not math.isfinite(v) for v in vals):
        raise ValueError(f"steps: {spec!r} is not START:EVERY (e.g. 0:5000: row k was logged at env step 0 + k·5000)")
    start, every = vals
    if start < 0 or every <= 0:
        raise ValueError(f"steps: {spec!r} needs START >= 0 and EVERY > 0 env steps")
    return float(start), float(every)


def check_param_count(param_count) -> float | None:
    """A user-given model size: None, or a finite number of parameters > 0 (one-line ValueError)."""
    if param_count is None:
        return None
    v = _number(str(param_count)) if not isinstance(param_count, bool) else None
    if v is None or not math.isfinite(v) or v <= 0:
        raise ValueError(f"param_count: {param_count!r} must be a positive number of parameters, e.g. 2.5e5")
    return v


# (field, what it is, may it be unknown (NaN)): every value must otherwise be a finite number > 0
_LEVEL_FIELDS = (("utd", "UTD ratio σ", False), ("param_count", "model size N", True),
                 ("batch_size", "batch size B", True), ("lr", "learning rate η", True))


def validate_levels(cs: CurveSet) -> None:
    """One-line ValueError on configuration values no law can use: a UTD ratio σ that is missing, infinite or
    <= 0; a model size, batch size or learning rate that is given but infinite or <= 0 (NaN = not recorded is
    fine); model sizes known for some curves and not others (the study's size axis would be half missing);
    env steps that are negative or not finite."""
    if not cs.curves:
        raise ValueError("results: no curves")
    for field, what, may_be_nan in _LEVEL_FIELDS:
        vals = np.array([getattr(c, field) for c in cs.curves], float)
        bad = ~(np.isfinite(vals) & (vals > 0))
        if may_be_nan:
            bad &= ~np.isnan(vals)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"results: {what} ({field}) must be a finite number > 0"
                             f"{' or missing' if may_be_nan else ''}; {int(bad.sum())} of {len(vals)} curve(s) have "
                             f"e.g. {vals[i]:g} ({cs.curves[i].task}, {_where(cs.curves[i])})")
    known = np.array([math.isfinite(c.param_count) for c in cs.curves])
    if known.any() and not known.all():
        i = int(np.flatnonzero(~known)[0])
        raise ValueError(f"results: model size (param_count) known for {int(known.sum())} of {len(known)} curves "
                         f"only (e.g. none for {cs.curves[i].task}, {_where(cs.curves[i])}); give every curve one "
                         "(w<width>p<N>/ level or param_count column) or none (then --param-count N for all)")
    for c in cs.curves:
        st = np.asarray(c.steps, float)
        if st.size and not (np.all(np.isfinite(st)) and st.min() >= 0):
            raise ValueError(f"results: env steps must be finite and >= 0; {c.task} ({_where(c)}) logs "
                             f"{st[~(np.isfinite(st) & (st >= 0))][0]:g}")


def _where(c: Curve) -> str:
    return f"σ={c.utd:g} N={c.param_count:.4g} B={c.batch_size:g} η={c.lr:g}"


def load_results(path: str | Path, metric: str = "eval_return", *, param_count: float | None = None,
                 steps: str | Sequence[float] | None = None) -> CurveSet:
    """Load curves of `metric` from a tidy table file, a directory holding one, a directory of trial
    directories, or a published `.npy` curve directory. `param_count`: the one model size of a source
    that has none; `steps` ("START:EVERY"): the env steps of `.npy` arrays that hold only seed columns.
    Raises ValueError (one line) on bad input."""
    cs = _load(Path(path), metric, check_param_count(param_count), parse_steps(steps))
    validate_levels(cs)
    return cs


def _load(path: Path, metric: str, n: float | None, step_grid: tuple[float, float] | None) -> CurveSet:
    """`load_results` before `validate_levels`: pick the source kind and read it."""
    if not path.exists():
        raise ValueError(f"results: {path} does not exist; pass a parquet/CSV table or a results directory")
    if path.is_dir() and any(p.name.startswith("utd_") for p in path.rglob("utd_*") if p.is_dir()):
        return load_npy_dir(path, metric, param_count=n, steps=step_grid)
    if step_grid is not None:
        raise ValueError(f"steps: only for utd_<σ>/... .npy curve directories; {path} is a table source "
                         "(its env_steps column gives the steps)")
    if path.is_file():
        return curves_from_table(_read_table(path), metric, source=str(path), param_count=n)
    tables = sorted(list(path.glob("*.parquet")) + list(path.glob("*.csv")))
    if len(tables) == 1:
        return curves_from_table(_read_table(tables[0]), metric, source=str(tables[0]), param_count=n)
    for name in ("results.parquet", "table.parquet"):
        if (path / name).exists():
            return curves_from_table(_read_table(path / name), metric, source=str(path / name), param_count=n)
    trials = sorted(p.parent for p in path.rglob("metrics.parquet") if (p.parent / "config.json").exists())
    if trials:
        return curves_from_table(_read_trial_dirs(trials), metric, source=str(path), param_count=n)
    raise ValueError(f"results: no table (*.parquet, *.csv), trial directories or utd_*/ curve layout in {path}")


def _read_table(path: Path) -> pd.DataFrame:
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.suffix == ".csv":
        return pd.read_csv(path)
    raise ValueError(f"results: {path.name} is neither .parquet nor .csv")


def _read_trial_dirs(trials: Iterable[Path]) -> pd.DataFrame:
    frames = []
    for t in trials:
        cfg = json.loads((t / "config.json").read_text())
        df = pd.read_parquet(t / "metrics.parquet")
        for k, v in cfg.items():
            if k not in df.columns and isinstance(v, (int, float, str, bool)):
                df[k] = v
        df["trial_id"] = t.name
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def curves_from_table(df: pd.DataFrame, metric: str = "eval_return", source: str = "", *,
                      param_count: float | None = None) -> CurveSet:
    """Group a tidy table into per-configuration curves of `metric`. `param_count`: the model size of
    a table without one (no `param_count` column, or only missing values in it)."""
    n_given = check_param_count(param_count)
    if n_given is not None:
        if "param_count" in df.columns and pd.to_numeric(df["param_count"], errors="coerce").notna().any():
            raise ValueError("param_count: the table already gives model sizes (param_count column); "
                             "leave param_count (--param-count) unset")
        df = df.assign(param_count=n_given)
    missing = [c for c in ("env_steps", "utd", "param_count") if c not in df.columns]
    if metric not in df.columns:
        metrics = [c for c in df.columns if c not in BOOKKEEPING and c not in CORE_FIELDS
                   and pd.api.types.is_float_dtype(df[c])]
        raise ValueError(f"metric: {metric!r} is not a column; numeric columns are {metrics}")
    if missing:
        hint = "; pass param_count (--param-count N) for a single model size" if missing == ["param_count"] else ""
        raise ValueError(f"results: table lacks column(s) {missing}; the sweep table has env_steps, utd, "
                         f"param_count{hint}")
    for col in ("env_steps", "utd", "param_count", "batch_size", "lr"):
        if col in df.columns and not pd.api.types.is_numeric_dtype(df[col]):
            num = pd.to_numeric(df[col], errors="coerce")
            odd = df[col][num.isna() & df[col].notna()]
            if len(odd):
                raise ValueError(f"results: column {col!r} must be numeric; {len(odd)} row(s) hold e.g. "
                                 f"{odd.iloc[0]!r}")
            df = df.assign(**{col: num})
    df = df[np.isfinite(pd.to_numeric(df[metric], errors="coerce"))].copy()
    if df.empty:
        raise ValueError(f"metric: {metric!r} has no finite values")
    notes = [] if n_given is None else [f"one model size N = {n_given:.4g} (given by param_count): "
                                        "compute-optimal N is not fitted; σ*(F) is, at that N"]
    if "seed" not in df.columns:
        df["seed"] = 0
    if "env" not in df.columns:
        df["env"] = "task"
    for c in ("batch_size", "lr"):
        if c not in df.columns:
            df[c] = np.nan
            notes.append(f"no `{c}` column: its optimum is not fitted")
    task = df["env"].astype(str)
    if "agent" in df.columns and df["agent"].nunique() > 1:
        task = df["agent"].astype(str) + "/" + task
    df["_task"] = task
    base = ["_task", "utd", "param_count", "batch_size", "lr"]
    extra = _extra_config_columns(df, metric, base)
    keys = base + extra
    gkeys = [df[k].astype(str) if k in extra else df[k].fillna(-1.0) for k in keys]
    curves = []
    for _, g in df.groupby(gkeys, sort=True, dropna=False):
        row = g.iloc[0]
        steps, Y, dropped = _align_seeds(g, metric)
        ex = tuple((k, _py(row[k])) for k in extra if k not in ("width", "depth") or g[k].notna().all())
        c = Curve(task=str(row["_task"]), utd=float(row["utd"]), param_count=float(row["param_count"]),
                  batch_size=float(row["batch_size"]), lr=float(row["lr"]), steps=steps, returns=Y, extra=ex)
        if dropped:
            notes.append(f"{c.label}: dropped seed(s) {dropped} that logged under half the steps of the others")
        curves.append(c)
    return CurveSet(curves, metric, notes, source)


def _py(v):
    return v.item() if hasattr(v, "item") else v


def _extra_config_columns(df: pd.DataFrame, metric: str, base: list[str]) -> list[str]:
    """Further config fields: columns constant within each trial (by `trial_id` when present). Without
    trial ids only non-float columns can be told apart from per-run scalars, so only those count."""
    # Seed bookkeeping in any spelling (cfg_seed, trial_seed, ...) differs between replicas of one config.
    # Timings (chunk_seconds, wall_s, fps, ...) are per-run measurements, not settings.
    cand = [c for c in df.columns if c not in BOOKKEEPING and c not in base and c != metric and c not in
            ("env", "agent", "_task") and "/" not in c and "seed" not in c.lower()
            and not _TIMING.search(c.lower())]
    cand = [c for c in cand if df[c].map(lambda v: isinstance(v, (int, float, str, bool, np.generic))
                                         or v is None).all()]
    if not cand:
        return []
    if "trial_id" in df.columns:
        const = df.groupby("trial_id")[cand].nunique(dropna=False).max() <= 1
        cols = [c for c in cand if const[c]]
    else:
        cols = [c for c in cand if not pd.api.types.is_float_dtype(df[c])]
        const = df.groupby(base + ["seed"], dropna=False)[cols].nunique(dropna=False).max() <= 1 if cols else {}
        cols = [c for c in cols if const[c]]
    # Metrics logged as constants (e.g. all-NaN columns) carry no configuration information.
    return [c for c in cols if df[c].nunique(dropna=True) > 1]


def _align_seeds(g: pd.DataFrame, metric: str) -> tuple[np.ndarray, np.ndarray, list]:
    """Put every seed on one step grid: drop seeds that stopped before half the longest one, keep the
    steps all remaining seeds span, interpolate linearly where their log points differ.

    Early stopping (`stopped_early` column of the sweep table): a seed whose trial stopped because it
    *reached* the study's top threshold is never dropped and never truncates the others; past its last
    log point it holds its last isotonic (non-decreasing fit) value, up to the end of the grid the other
    seeds span (its own end when every seed reached). A seed of a trial stopped as `unreachable`
    (censored) is treated like any seed that ended early (not extended)."""
    per_seed = {}
    reached = set()
    for s, gs in g.groupby("seed"):
        if "stopped_early" in gs.columns and (gs["stopped_early"].astype(object) == "reached").any():
            reached.add(s)
        gs = gs.groupby("env_steps")[metric].mean().sort_index()
        per_seed[s] = (gs.index.to_numpy(float), gs.to_numpy(float))
    longest = max(v[0][-1] for v in per_seed.values())
    dropped = [_py(s) for s, v in per_seed.items() if s not in reached and v[0][-1] < 0.5 * longest]
    keep = {s: v for s, v in per_seed.items() if s in reached or v[0][-1] >= 0.5 * longest}
    full = [v for s, v in keep.items() if s not in reached]
    t0 = max(v[0][0] for v in keep.values())
    t1 = min(v[0][-1] for v in full) if full else max(v[0][-1] for v in keep.values())
    grid = np.unique(np.concatenate([v[0] for v in keep.values()]))
    grid = grid[(grid >= t0) & (grid <= t1)]
    cols = []
    for s, (t, y) in keep.items():
        col = np.interp(grid, t, y)
        if s in reached:
            from .isotonic import isotonic_rows   # lazy: scikit-learn's import is slow for the sweep CLI
            col[grid > t[-1]] = isotonic_rows(y[None])[0][-1]
        cols.append(col)
    Y = np.stack(cols, axis=1)
    return grid, Y, dropped


# ---- published .npy layout ----------------------------------------------------------------------

_MODEL_DIR = re.compile(r"^w(?P<width>[0-9.e+-]+)p(?P<params>[0-9.e+-]+)$")
_FILE = re.compile(r"^bs_(?P<bs>[^_]+)_lr_(?P<lr>[^_]+)(?P<rest>(_.+)?)$")


def _number(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


def parse_curve_name(stem: str) -> dict[str, Any]:
    """`bs_256_lr_3e-4_tau_0.005_n_step_3` -> {batch_size: 256, lr: 3e-4, tau: 0.005, n_step: 3}.
    A key is the run of non-numeric tokens before a numeric one; a trailing key without a number keeps
    its own text as value."""
    m = _FILE.match(stem)
    if not m or _number(m["bs"]) is None or _number(m["lr"]) is None:
        raise ValueError(f"curve file: {stem!r} is not bs_<B>_lr_<η>[_<key>_<value>...]")
    out: dict[str, Any] = {"batch_size": float(m["bs"]), "lr": float(m["lr"])}
    key: list[str] = []
    for tok in [t for t in m["rest"].split("_") if t]:
        v = _number(tok)
        if v is None:
            key.append(tok)
        elif key:
            out["_".join(key)] = v
            key = []
        else:
            raise ValueError(f"curve file: {stem!r} has a value {tok!r} without a key")
    if key:
        out["_".join(key[:-1]) or key[0]] = key[-1] if len(key) > 1 else True
    return out


def load_npy_dir(root: str | Path, metric: str, *, param_count: float | None = None,
                 steps: str | Sequence[float] | None = None) -> CurveSet:
    """Read `<root>/[w<width>p<N>/]utd_<σ>/<task>/<metric>/bs_<B>_lr_<η>[...].npy`. Without `steps` an
    array's column 0 is the env step; with `steps` ("START:EVERY") every column is a seed and row k is
    env step START + k·EVERY. `param_count` gives every curve that model size (only for a directory
    without `w<width>p<N>/` level)."""
    root = Path(root)
    n_given = check_param_count(param_count)
    step_grid = parse_steps(steps)
    curves, metrics_seen, notes = [], set(), []
    for f in sorted(root.rglob("*.npy")):
        parts = f.relative_to(root).parts
        i = next((j for j, p in enumerate(parts) if p.startswith("utd_")), None)
        if i is None or len(parts) < i + 4:
            continue
        metrics_seen.add(parts[-2])
        if parts[-2] != metric:
            continue
        width = n = math.nan
        if i == 1 and (m := _MODEL_DIR.match(parts[0])):
            width, n = float(m["width"]), float(m["params"])
            if n_given is not None:
                raise ValueError(f"param_count: {root} already gives model sizes ({parts[0]}/ is "
                                 "w<width>p<N>/); leave param_count (--param-count) unset")
        elif n_given is not None:
            n = n_given
        sigma = _number(parts[i][4:])
        if sigma is None:
            raise ValueError(f"curve layout: {parts[i]!r} is not utd_<number>")
        fields = parse_curve_name(f.stem)
        st, Y = _read_curve_array(f, step_grid)
        extra = tuple(sorted((k, v) for k, v in fields.items() if k not in ("batch_size", "lr")))
        if math.isfinite(width):
            extra = (("width", width),) + extra
        curves.append(Curve(task="/".join(parts[i + 1:-2]), utd=sigma, param_count=n,
                            batch_size=fields["batch_size"], lr=fields["lr"], steps=st, returns=Y, extra=extra))
    if not curves:
        raise ValueError(f"metric: no {metric!r} curves under {root}; metrics found: {sorted(metrics_seen)}")
    if step_grid is not None:
        notes.append(f"arrays hold seed columns only: row k is env step {step_grid[0]:g} + k·{step_grid[1]:g} "
                     "(given by steps)")
    if n_given is not None:
        notes.append(f"one model size N = {n_given:.4g} (given by param_count): compute-optimal N is not fitted; "
                     "σ*(F) is, at that N")
    elif all(math.isnan(c.param_count) for c in curves):
        notes.append("no w<width>p<param_count>/ level: one model size, compute-optimal N is not fitted "
                     "(pass param_count / --param-count N for σ*(F) at that size)")
    return CurveSet(curves, metric, notes, str(root))


def _looks_like_steps(col: np.ndarray) -> bool:
    """Env steps: increasing as stored, or (unsorted) distinct non-negative integers."""
    if col.size == 0 or np.all(np.diff(col) > 0):
        return True
    return bool(np.all(col >= 0) and np.all(col == np.round(col)) and np.unique(col).size == col.size)


def _has_step_column(arr: np.ndarray, start: float, every: float) -> bool:
    """Column 0 is the step grid START + k·EVERY itself, or increases and dwarfs every other column."""
    col, rest = arr[:, 0], arr[:, 1:]
    fin = np.isfinite(col)
    if np.allclose(col[fin], start + every * np.flatnonzero(fin), rtol=1e-9, atol=1e-9):
        return True
    big = np.nanmax(np.abs(rest)) if np.isfinite(rest).any() else np.inf
    return bool(fin.sum() > 1 and np.all(np.diff(col[fin]) > 0) and np.nanmin(col) > 10 * big)


def _read_curve_array(f: Path, step_grid: tuple[float, float] | None) -> tuple[np.ndarray, np.ndarray]:
    """(steps (T,), returns (T, S)) of one curve file; rows with a missing value are dropped."""
    try:
        arr = np.asarray(np.load(f, allow_pickle=False), dtype=float)
    except (ValueError, OSError) as e:
        raise ValueError(f"curve file: {f} is not a numeric .npy array ({str(e).splitlines()[0]})") from None
    if step_grid is None:
        if arr.ndim != 2 or arr.shape[1] < 2:
            raise ValueError(f"curve file: {f} must be 2-D (log points × [env step, seed...]), got shape "
                             f"{arr.shape}; if it holds only seed columns pass steps (--steps START:EVERY)")
        fin = np.isfinite(arr[:, 0])
        if not _looks_like_steps(arr[fin, 0]):
            raise ValueError(f"curve file: column 0 of {f} is not env steps (not increasing); if the arrays hold "
                             "only seed columns pass steps (--steps START:EVERY)")
        arr = arr[np.argsort(arr[:, 0], kind="stable")]
        st, Y = arr[:, 0], arr[:, 1:]
    else:
        if arr.ndim == 1:
            arr = arr[:, None]
        if arr.ndim != 2 or arr.shape[0] < 2:
            raise ValueError(f"curve file: {f} must be 1-D or 2-D (log points × seeds) with >= 2 log points, "
                             f"got shape {arr.shape}")
        start, every = step_grid
        if arr.shape[1] >= 2 and _has_step_column(arr, start, every):
            raise ValueError(f"steps: column 0 of {f} already holds env steps (increasing, from {arr[0, 0]:g}); "
                             "drop steps (--steps): these arrays have a step column")
        st, Y = start + every * np.arange(arr.shape[0]), arr
    keep = np.isfinite(st) & np.all(np.isfinite(Y), axis=1)
    if keep.sum() < 2:
        raise ValueError(f"curve file: {f} has fewer than 2 log points where every seed is finite")
    return st[keep], Y[keep]


def write_npy_dir(cs: CurveSet, root: str | Path, *, step_column: bool = True) -> None:
    """Write curves in the published layout (used by tests and to share a study). `step_column=False`
    writes seed columns only (read back with `steps="START:EVERY"`)."""
    root = Path(root)
    for c in cs.curves:
        ex = dict(c.extra)
        width = ex.pop("width", None)
        base = root / (f"w{width:g}p{c.param_count:.0f}" if width is not None and math.isfinite(c.param_count) else "")
        name = f"bs_{c.batch_size:g}_lr_{c.lr:g}" + "".join(f"_{k}_{v:g}" for k, v in ex.items())
        path = base / f"utd_{c.utd:g}" / c.task / cs.metric / f"{name}.npy"
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, np.column_stack([c.steps, c.returns]) if step_column else np.asarray(c.returns))
