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

What a stop costs or saves: saved env steps = seeds * (budget - stop step), budget = the per-seed
budget in the table's env_steps unit: the config's `env_steps`, or the kind's own `TrialKind.budget`
(grpo: steps * prompts_per_step * group_size rollouts); saved FLOPs = saved env steps * 10*N*B*sigma
(`scaling.allocation.compute_flops`: N = param count, B = batch_size, sigma = utd, 1 for a kind
without utd; None without N or B: grpo has no batch_size, and 10*N*B*sigma per rollout does not
describe it, since a rollout's FLOPs depend on its tokens, so its saved FLOPs are None).

Kinds whose seeds run one after another (`TrialKind.sequential`, grpo): the rule cannot see every
seed at once, so it is applied seed by seed (`Watcher.sequential`):

- while seed i trains, `stop(chunk, rows)` gets seed i's own rows only, on its first row (grpo:
  row 0, the base policy) and after each logged step but the last (and once on resume, on the rows
  restored); the rule on a one-seed table is the per-seed
  condition above (the "seed mean" of one seed is that seed), and when it fires seed i checkpoints
  and ends, and the next seed starts. The rule is deterministic and asked again on a resumed seed's
  rows before it trains, so a stopped seed stays stopped after a kill -9 anywhere;
- the trial is "reached" only when every seed stopped so; a seed that runs its whole budget (the
  rule never fired) makes the kind resume the seeds that had stopped and run them to their budget
  too (exact on CPU: resuming from the stop checkpoint gives the numbers of a run that never
  stopped), so a trial is either stopped in every seed or run in full, never mixed;
- each seed stops at its own first crossing (its stop step, `seed_stop_steps` in the decision's
  detail; the trial's `stop_step` is the largest), and saved env steps = sum over seeds of
  (budget - its stop step);
- guaranteed: every seed's isotonic curve is >= J_top + margin at its last `patience` logged points
  (exactly the parallel rule's per-seed condition). The seed-mean condition is not part of the
  decision: it needs every seed's values at the same steps, which do not exist yet while an earlier
  seed is being stopped. On the curves the analysis builds (`scaling.data._align_seeds`: a reached
  seed held at its last isotonic value past its end) it holds by construction for patience = 1: at
  its first crossing a seed's last finite value is itself >= J_top + margin (the isotonic fit's
  last value is the largest mean of a suffix of the points; the rule was asked at every earlier
  point, from the first, and found it below the target, so the new point is above it), and every seed that ended earlier is held at a value >= J_top + margin,
  so the seed mean at the last common step is >= J_top + margin. For patience > 1 a seed's last
  point may lie below the target (0, 100, 40 stops at 40 with target 50, patience 2) and the held
  seed mean is not guaranteed (seeds 20, 40, 80, 20 and 40, 80, 20, target 50, patience 2: both
  stop, the second held at 50; seed mean 30, 60, 50, 35, isotonic 48.3 at the last two points): the
  decision records it (`detail.mean_value`, `detail.mean_reached`) without acting on it;
- `unreachable` is not supported (refused at spec time): one hopeless seed says nothing about the
  seeds still to run, and a trial whose seeds stopped for different reasons has no single status.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

KEYS = ("metric", "thresholds", "margin", "patience", "unreachable", "min_fraction", "rate_factor")
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
def budget_of(config: dict, kind=None) -> int | None:
    """A trial's budget per seed in its table's env_steps unit: `kind.budget(config)` when the trial
    kind defines one (grpo: rollouts), else the config's `env_steps`."""
    hook = getattr(kind, "budget", None)
    v = hook(config) if hook is not None else config.get("env_steps")
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def savings(decision: Decision, budget: int | None, seeds: int, config: dict,
            param_count: int | None) -> tuple[int | None, float | None]:
    """(saved env steps, saved FLOPs) of a stop: seeds*(budget - stop step) (a sequential kind's
    decision: the sum over its seeds' own stop steps), times 10*N*B*sigma."""
    if budget is None:
        return None, None
    per_seed = (decision.detail or {}).get("seed_stop_steps")
    if per_seed:
        saved = sum(max(int(budget) - int(v), 0) for v in per_seed.values())
    else:
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
    in `<dir>/early_stop.json`, and afterwards tells the runner what happened (`final`).

    A kind whose seeds run one after another calls `sequential()` first; from then on each
    call judges the one seed whose rows it is given (module docstring)."""

    def __init__(self, rule: Rule, budget: int | None, directory):
        self.rule, self.budget, self.path = rule, budget, Path(directory) / RECORD
        self.fired: Decision | None = None
        self.seed_fired: dict | None = None    # sequential: seed -> its Decision

    def sequential(self) -> None:
        """Switch to seed-by-seed judging (kinds whose seeds run one after another)."""
        if self.rule.unreachable:   # refused at spec time (from_spec); never ignore a rule silently
            raise ValueError("early_stop.unreachable: not supported for a kind whose seeds run one "
                             "after another; remove it")
        if self.seed_fired is None:
            self.seed_fired = {}

    def __call__(self, chunk, df):
        if self.seed_fired is not None:
            return self._seed_call(df)
        d = self.rule.check(df, self.budget)
        if d is None:
            return None
        self.fired = d
        _write_record(self.path, d.to_json())
        return d.to_json()

    def _seed_call(self, df):
        seeds = sorted(set(np.asarray(df["seed"]).tolist())) if len(df) else []
        if len(seeds) != 1:
            raise ValueError(f"early_stop: a sequential kind asks about one seed at a time, got seeds {seeds}")
        d = self.rule.check(df, self.budget)
        if d is None:
            return None
        self.seed_fired[seeds[0]] = d
        rec = self._seed_record()
        rec[str(seeds[0])] = d.to_json()
        _write_record(self.path, {"seeds": rec})
        return d.to_json()

    def _seed_record(self) -> dict:
        try:
            rec = json.loads(self.path.read_text())["seeds"]
            return dict(rec) if isinstance(rec, dict) else {}
        except (OSError, ValueError, KeyError, TypeError):
            return {}

    def _seed_final(self, df) -> Decision | None:
        """Every seed of `df` stopped as reached (its decision's step = its own last step): the trial's
        decision; else None."""
        if df is None or len(df) == 0:
            return None
        rec = self._seed_record()
        per = {}
        for s, g in df.groupby("seed"):
            last = _last_step(g)
            d = self.seed_fired.get(s) if self.seed_fired else None
            if d is None or d.stop_step != last:
                try:
                    d = Decision.from_json(rec[str(s)])
                except (KeyError, ValueError, TypeError):
                    return None
            if d.reason != "reached" or d.stop_step != last:
                return None
            per[s] = d
        return sequential_decision(self.rule, df, per)

    def final(self, df) -> Decision | None:
        """The decision that ended the run whose final table is `df`, or None (it ran in full). A run
        resumed after its kind had already finished it (the callable was not called) is read back from
        the record, accepted only when it matches the table's last step."""
        if self.seed_fired is not None:
            return self._seed_final(df)
        last = _last_step(df)
        if self.fired is not None and self.fired.stop_step == last:
            return self.fired
        try:
            d = Decision.from_json(json.loads(self.path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return d if d.stop_step == last else None


def held_seed_mean(df, metric: str):
    """Isotonic curve of the seed mean on the curves the analysis builds when every seed of `df`
    reached (`scaling.data._align_seeds`: each seed held at its last isotonic value past its end):
    (env steps, values), or None without a finite value."""
    from scaling_rl.scaling.data import _align_seeds
    fin = _finite(df, metric)
    if fin.empty:
        return None
    fin = fin.assign(stopped_early="reached")
    fin[metric] = fin[metric].astype(float)
    grid, Y, _ = _align_seeds(fin, metric)
    return grid, _iso(Y.mean(axis=1))


def sequential_decision(rule: Rule, df, per_seed: dict) -> Decision:
    """The decision of a trial whose seeds ran one after another and each stopped as reached
    (`per_seed`: seed -> its Decision): stop_step = the largest seed stop step (the table's last);
    the detail keeps every seed's stop step and value and the held seed mean (not guaranteed for
    patience > 1, module docstring)."""
    target = rule.top + rule.margin
    p = rule.patience
    held = held_seed_mean(df, rule.metric)
    mean_value = float(held[1][-p]) if held is not None and len(held[1]) >= p else float("nan")
    mean_ok = bool(held is not None and len(held[1]) >= p and np.all(held[1][-p:] >= target))
    values = {}
    for s, d in per_seed.items():
        v = (d.detail or {}).get("seed_values") or {}
        values[str(s)] = float(next(iter(v.values()))) if v else float("nan")
    return Decision("reached", max(int(d.stop_step) for d in per_seed.values()), target,
                    {"sequential": True,
                     "seed_stop_steps": {str(s): int(d.stop_step) for s, d in per_seed.items()},
                     "seed_values": values, "mean_value": mean_value, "mean_reached": mean_ok,
                     "j_top": rule.top, "margin": rule.margin, "patience": p})


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
    from scaling_rl.sweep.trial import SpecError
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise SpecError(f"early_stop.{key}: expected a finite number, got {v!r}")
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise SpecError(f"early_stop.{key}: must be {'>' if lo_open else '>='} {lo:g}, got {v!r}")
    if hi is not None and v > hi:
        raise SpecError(f"early_stop.{key}: must be <= {hi:g}, got {v!r}")
    return float(v)


def from_spec(value: Any, *, kind=None, trials=()) -> Rule:
    """The spec's `early_stop:` mapping -> `Rule` (SpecError, one line naming the key, on bad input)."""
    from scaling_rl.sweep.trial import SpecError
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
    if unreachable and getattr(kind, "sequential", False):
        raise SpecError(f"early_stop.unreachable: not supported for agent {kind.name!r} (its seeds run one "
                        "after another: one hopeless seed says nothing about the next); remove it")
    for t in trials:
        if budget_of(t.config, kind) is None:
            what = "budget" if getattr(kind, "budget", None) is not None else "env_steps budget in its config"
            raise SpecError(f"early_stop: trial {t.id} has no {what}; early stopping needs one")
    return Rule(metric=metric, thresholds=tuple(thr), margin=margin, patience=patience,
                unreachable=unreachable, min_fraction=min_fraction, rate_factor=rate_factor)
