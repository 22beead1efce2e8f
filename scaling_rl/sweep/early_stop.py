"""Threshold-aware early stopping: end a trial once the rest of its run cannot change its D_J.

Spec block (top level of a sweep spec)::

    early_stop:
      metric: eval_return        # the logged metric the study's thresholds J are in
      thresholds: [50, 100, 150] # the study's J (metric units), ascending; the top one is J_top,
                                 # the lowest J_low
      margin: 0.0                # metric units >= 0: "reached" needs J_top + margin
      patience: 1                # logged points (>= 1) the crossing must hold
      unreachable: false         # also stop trials that cannot reach J_low (recorded as censored)
      min_fraction: 0.5          # unreachable: only judged at env steps >= min_fraction * budget
      rate_factor: 2.0           # unreachable: >= 1, slack on the steepest rise seen so far

The rule looks only at the trial's own tidy metrics (columns seed, env_steps, <metric>; rows whose
metric is not finite, e.g. chunks without an evaluation, are ignored), so it is deterministic: the
same table always gives the same `Decision`, and a trial killed after the decision but before its
final status reaches it again when resumed.

reached:     every seed's isotonic (non-decreasing least-squares) curve of the metric, AND the isotonic
             curve of the seed mean (log points where every seed has a finite value), is
             >= J_top + margin at each of its last `patience` logged points. A non-decreasing fit
             above J_top + margin has crossed every J, so the remaining run can only move D_J by
             pulling the fit down (later values far below the earlier ones); the margin and patience
             are the user's protection against that.
unreachable: (when enabled) at the last logged step t >= min_fraction * budget, each seed's bound is
             its isotonic value at t + rate_factor * (steepest rise of its isotonic curve per unit of
             log env steps, over its whole history) * log(budget / t); if even the best seed's bound
             is < J_low, the trial stops and is recorded as censored (its D_J stays "not reached").
             Assumption: learning curves do not accelerate in log env steps late in training by more
             than rate_factor times their fastest rise so far. A curve still rising fast enough to
             reach J_low at that pace is never stopped by it.

What a stop costs or saves: saved env steps = seeds * (budget - stop step), budget = the config's
`env_steps`; saved FLOPs = saved env steps * 10*N*B*sigma (`scaling.allocation.compute_flops`:
N = param count, B = batch_size, sigma = utd, 1 for a kind without utd; None without N or B).
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

KEYS = ("metric", "thresholds", "margin", "patience", "unreachable", "min_fraction", "rate_factor")
REASONS = ("reached", "unreachable")
RECORD = "early_stop.json"   # in the trial (or pack) directory: the decision, written when it fires


@dataclasses.dataclass(frozen=True)
class Decision:
    """Why a trial stopped. `stop_step`: its last logged env step; `detail`: the numbers behind it."""
    reason: str                  # "reached" | "unreachable"
    stop_step: int
    threshold: float             # J_top + margin (reached) or J_low (unreachable)
    detail: dict = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        return {"reason": self.reason, "stop_step": int(self.stop_step), "threshold": float(self.threshold),
                "detail": self.detail}

    @classmethod
    def from_json(cls, d: dict) -> "Decision":
        return cls(str(d["reason"]), int(d["stop_step"]), float(d["threshold"]), dict(d.get("detail") or {}))


@dataclasses.dataclass(frozen=True)
class Rule:
    metric: str = "eval_return"
    thresholds: tuple = ()
    margin: float = 0.0
    patience: int = 1
    unreachable: bool = False
    min_fraction: float = 0.5
    rate_factor: float = 2.0

    @property
    def top(self) -> float:
        return float(self.thresholds[-1])

    @property
    def low(self) -> float:
        return float(self.thresholds[0])

    def check(self, df, budget_env_steps: int | None) -> Decision | None:
        """The decision on a trial's tidy metrics so far (None: keep going)."""
        if df is None or len(df) == 0 or self.metric not in df.columns:
            return None
        stop_step = int(np.max(np.asarray(df["env_steps"], float)))
        curves = _seed_curves(df, self.metric)
        if not curves:
            return None
        d = self._reached(df, curves, stop_step)
        if d is None and self.unreachable and budget_env_steps:
            d = self._unreachable(curves, stop_step, float(budget_env_steps))
        return d

    def _reached(self, df, curves: dict, stop_step: int) -> Decision | None:
        target = self.top + self.margin
        p = self.patience
        values = {}
        for s, (_, iso) in curves.items():
            if len(iso) < p or not np.all(iso[-p:] >= target):
                return None
            values[s] = float(iso[-p])
        wide = _wide(df, self.metric)
        if wide is None or len(wide) < p:
            return None
        mean_iso = _iso(wide.to_numpy(float).mean(axis=1))
        if not np.all(mean_iso[-p:] >= target):
            return None
        return Decision("reached", stop_step, target,
                        {"seed_values": {str(k): v for k, v in values.items()}, "mean_value": float(mean_iso[-p]),
                         "j_top": self.top, "margin": self.margin, "patience": p})

    def _unreachable(self, curves: dict, stop_step: int, budget: float) -> Decision | None:
        if stop_step < self.min_fraction * budget or stop_step >= budget:
            return None
        bounds = {}
        for s, (t, iso) in curves.items():
            if len(t) < 2 or t[-1] <= 0:
                return None
            ok = t > 0
            lt, y = np.log(t[ok]), iso[ok]
            if len(lt) < 2:
                return None
            slope = float(np.max(np.diff(y) / np.maximum(np.diff(lt), 1e-12)))
            bounds[s] = float(iso[-1] + self.rate_factor * max(slope, 0.0) * math.log(budget / t[-1]))
        best = max(bounds.values())
        if best >= self.low:
            return None
        return Decision("unreachable", stop_step, self.low,
                        {"bounds": {str(k): v for k, v in bounds.items()}, "best_bound": best,
                         "j_low": self.low, "rate_factor": self.rate_factor, "budget_env_steps": int(budget)})


def _iso(y: np.ndarray) -> np.ndarray:
    from scaling_rl.scaling.curves import isotonic_rows
    return isotonic_rows(np.asarray(y, float)[None])[0]


def _finite(df, metric: str):
    import pandas as pd
    v = pd.to_numeric(df[metric], errors="coerce").to_numpy(float)
    return df[np.isfinite(v)]


def _seed_curves(df, metric: str) -> dict:
    """seed -> (env steps, isotonic curve) over the rows where the metric is finite."""
    out = {}
    seeds = sorted(set(np.asarray(df["seed"]).tolist()))
    fin = _finite(df, metric)
    for s in seeds:
        g = fin[fin["seed"] == s]
        if g.empty:
            return {}       # a seed without a value yet: nothing can be decided
        g = g.groupby("env_steps")[metric].mean().sort_index()
        out[s] = (g.index.to_numpy(float), _iso(g.to_numpy(float)))
    return out


def _wide(df, metric: str):
    """env_steps x seed table of the metric, only steps where every seed is finite."""
    fin = _finite(df, metric)
    if fin.empty:
        return None
    w = fin.pivot_table(index="env_steps", columns="seed", values=metric, aggfunc="mean").sort_index()
    w = w.reindex(columns=sorted(set(np.asarray(df["seed"]).tolist())))
    return w.dropna(axis=0, how="any")


# ---- what a stop saves ------------------------------------------------------------------------
def budget_of(config: dict) -> int | None:
    """A trial's env-step budget per seed: its config's `env_steps`."""
    v = config.get("env_steps")
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def savings(decision: Decision, budget: int | None, seeds: int, config: dict,
            param_count: int | None) -> tuple[int | None, float | None]:
    """(saved env steps, saved FLOPs) of a stop: seeds*(budget - stop step), times 10*N*B*sigma."""
    if budget is None:
        return None, None
    saved = int(seeds) * max(int(budget) - int(decision.stop_step), 0)
    B = config.get("batch_size")
    sigma = config.get("utd", 1.0)
    if param_count is None or not isinstance(B, (int, float)) or not isinstance(sigma, (int, float)):
        return saved, None
    from scaling_rl.scaling.allocation import compute_flops
    return saved, float(compute_flops(param_count, B, sigma, saved))


def status_fields(decision: Decision | None, budget: int | None, seeds: int, config: dict,
                  param_count: int | None) -> dict:
    """What the store records for a trial that ran under a rule (stopped_early None: ran in full)."""
    if decision is None:
        return {"stopped_early": None, "stop_step": None, "budget_env_steps": budget,
                "saved_env_steps": 0, "saved_flops": 0.0, "early_stop": None}
    saved, flops = savings(decision, budget, seeds, config, param_count)
    return {"stopped_early": decision.reason, "stop_step": int(decision.stop_step), "budget_env_steps": budget,
            "saved_env_steps": saved, "saved_flops": flops, "early_stop": decision.to_json()}


# ---- the stop callable handed to a trial kind's run -------------------------------------------
def _write_record(path: Path, obj: dict) -> None:
    from scaling_rl.io import atomic_write_json
    atomic_write_json(path, obj)


def _last_step(df) -> int | None:
    if df is None or len(df) == 0:
        return None
    return int(np.max(np.asarray(df["env_steps"], float)))


class Watcher:
    """`stop(chunk, df) -> dict | None` for one trial: evaluates the rule, records a firing decision
    in `<dir>/early_stop.json`, and afterwards tells the runner what happened (`final`)."""

    def __init__(self, rule: Rule, budget: int | None, directory):
        self.rule, self.budget, self.path = rule, budget, Path(directory) / RECORD
        self.fired: Decision | None = None

    def __call__(self, chunk, df):
        d = self.rule.check(df, self.budget)
        if d is None:
            return None
        self.fired = d
        _write_record(self.path, d.to_json())
        return d.to_json()

    def final(self, df) -> Decision | None:
        """The decision that ended the run whose final table is `df`, or None (it ran in full). A run
        resumed after its kind had already finished it (the callable was not called) is read back from
        the record, accepted only when it matches the table's last step."""
        last = _last_step(df)
        if self.fired is not None and self.fired.stop_step == last:
            return self.fired
        try:
            d = Decision.from_json(json.loads(self.path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return d if d.stop_step == last else None


class PackWatcher:
    """The stop callable of a pack of `members` trials of `n` seeds each: the pack stops when every
    member's rule fires on its own seeds (pack seeds j*n .. j*n+n-1); each member keeps its decision."""

    def __init__(self, rule: Rule, budget: int | None, directory, members: int, n: int):
        self.rule, self.budget, self.path = rule, budget, Path(directory) / RECORD
        self.members, self.n = members, n
        self.fired: list | None = None

    def part(self, df, j: int):
        part = df[(df["seed"] >= j * self.n) & (df["seed"] < (j + 1) * self.n)].copy()
        part["seed"] = part["seed"] - j * self.n
        return part

    def __call__(self, chunk, df):
        ds = [self.rule.check(self.part(df, j), self.budget) for j in range(self.members)]
        if any(d is None for d in ds):
            return None
        self.fired = ds
        rec = {"members": [d.to_json() for d in ds]}
        _write_record(self.path, rec)
        return rec

    def final(self, df) -> list | None:
        """Per-member decisions that ended the pack, or None (it ran in full)."""
        last = _last_step(df)
        if self.fired is not None and all(d.stop_step == last for d in self.fired):
            return self.fired
        try:
            ds = [Decision.from_json(d) for d in json.loads(self.path.read_text())["members"]]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return ds if len(ds) == self.members and all(d.stop_step == last for d in ds) else None


# ---- spec --------------------------------------------------------------------------------------
def _number(key: str, v: Any, *, lo: float | None = None, lo_open: bool = False, hi: float | None = None) -> float:
    from scaling_rl.sweep.spec import SpecError
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise SpecError(f"early_stop.{key}: expected a finite number, got {v!r}")
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise SpecError(f"early_stop.{key}: must be {'>' if lo_open else '>='} {lo:g}, got {v!r}")
    if hi is not None and v > hi:
        raise SpecError(f"early_stop.{key}: must be <= {hi:g}, got {v!r}")
    return float(v)


def from_spec(value: Any, *, kind=None, trials=()) -> Rule:
    """The spec's `early_stop:` mapping -> `Rule` (SpecError, one line naming the key, on bad input)."""
    from scaling_rl.sweep.spec import SpecError
    if not isinstance(value, dict):
        raise SpecError("early_stop: expected a mapping with keys " + ", ".join(KEYS)
                        + " (e.g. early_stop: {thresholds: [100, 200], margin: 5})")
    for k in value:
        if k not in KEYS:
            raise SpecError(f"early_stop.{k}: unknown key; allowed: {', '.join(KEYS)}")
    metric = value.get("metric", "eval_return")
    if not isinstance(metric, str) or not metric.strip():
        raise SpecError(f"early_stop.metric: expected a metric column name, got {metric!r}")
    if "thresholds" not in value:
        raise SpecError("early_stop.thresholds: missing; give the study's thresholds J, e.g. [100, 200]")
    thr = value["thresholds"]
    if isinstance(thr, (int, float)) and not isinstance(thr, bool):
        thr = [thr]
    if not isinstance(thr, list) or not thr:
        raise SpecError(f"early_stop.thresholds: expected a non-empty list of numbers, got {thr!r}")
    thr = [_number("thresholds", v) for v in thr]
    if any(b <= a for a, b in zip(thr, thr[1:])):
        raise SpecError(f"early_stop.thresholds: must be strictly increasing, got {thr}")
    margin = _number("margin", value.get("margin", 0.0), lo=0.0)
    patience = value.get("patience", 1)
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
        raise SpecError(f"early_stop.patience: expected an integer >= 1, got {patience!r}")
    unreachable = value.get("unreachable", False)
    if not isinstance(unreachable, bool):
        raise SpecError(f"early_stop.unreachable: expected true or false, got {unreachable!r}")
    min_fraction = _number("min_fraction", value.get("min_fraction", 0.5), lo=0.0, lo_open=True, hi=1.0)
    rate_factor = _number("rate_factor", value.get("rate_factor", 2.0), lo=1.0)
    if kind is not None and not getattr(kind, "stoppable", False):
        raise SpecError(f"early_stop: agent {kind.name!r} cannot stop a trial early (its run takes no stop "
                        "hook); remove early_stop")
    for t in trials:
        if budget_of(t.config) is None:
            raise SpecError(f"early_stop: trial {t.id} has no env_steps budget in its config; "
                            "early stopping needs one")
    return Rule(metric=metric, thresholds=tuple(thr), margin=margin, patience=patience,
                unreachable=unreachable, min_fraction=min_fraction, rate_factor=rate_factor)
