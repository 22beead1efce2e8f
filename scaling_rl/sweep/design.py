"""The adaptive study's design: the validated `adaptive:` block of a sweep spec and its candidate cells.

`spec.parse_spec` calls `parse_design` on the block; the study itself (rounds, fits, proposals, the
store) is `sweep.adaptive`, which imports this module and the runner. This module imports neither the
spec nor the runner, so spec -> design and adaptive -> run -> spec never close a circle. The block's
keys are documented in `sweep.adaptive`'s docstring and docs/usage.md.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from scaling_rl.sweep.trial import SpecError, Trial

KEYS = ("thresholds", "metric", "target", "points", "tolerance", "initial", "batch", "max_rounds",
        "max_compute", "max_replicates", "n_bootstrap", "confirm_bootstrap", "level", "delta")
TARGETS = ("frontier", "points")

@dataclasses.dataclass(frozen=True)
class Design:
    """The validated `adaptive:` block (picklable)."""
    thresholds: tuple
    metric: str = "eval_return"
    target: str = "frontier"
    points: tuple = ()            # target points: tuple of candidate cell keys (task, σ, N)
    tolerance: float = 0.1
    initial: Any = "grid3"        # "grid3" | "corners" | tuple of cell keys
    batch: int = 4
    max_rounds: int = 10
    max_compute: float | None = None
    max_replicates: int = 4
    n_bootstrap: int = 100
    confirm_bootstrap: int = 400
    level: float = 0.9
    delta: float | None = None
    seeds: int = 1
    early_stop: bool = False


@dataclasses.dataclass(frozen=True)
class Cell:
    """A (task, σ, N) point of the candidate grid and the spec trials (configs) that make it."""
    task: str
    sigma: float
    N: float
    trials: tuple           # replicate-0 Trials of the cell

    @property
    def key(self) -> tuple:
        return (self.task, self.sigma, self.N)


def _param_count(trial: Trial) -> float:
    from scaling_rl.sweep import registry
    kind = registry.get(trial.agent)
    n = kind.param_count(trial.config)
    if n is None:
        raise SpecError(f"adaptive: agent {trial.agent!r} does not report a parameter count; the σ×N design "
                        "needs one")
    return float(n)


def cells_of(trials: Sequence[Trial]) -> list[Cell]:
    """Group candidate trials into (task, σ, N) cells (sorted)."""
    by: dict[tuple, list] = {}
    for t in trials:
        if "utd" not in t.config:
            raise SpecError("adaptive: the agent's config has no `utd` (σ) field; an adaptive σ×N design needs one")
        key = (str(t.config.get("env", "task")), float(t.config["utd"]), _param_count(t))
        by.setdefault(key, []).append(t)
    return [Cell(*k, tuple(v)) for k, v in sorted(by.items())]


# ---- the spec block ------------------------------------------------------------------------------
def _num(where: str, v: Any, lo: float, *, integer: bool = False, strict: bool = True) -> float:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if integer:
        ok = ok and isinstance(v, int)
    if not ok or (v <= lo if strict else v < lo):
        kind = "an integer" if integer else "a number"
        raise SpecError(f"adaptive.{where}: expected {kind} {'>' if strict else '>='} {lo:g}, got {v!r}")
    return v


def _match_points(where: str, pts: Any, trials: Sequence[Trial], cells: Sequence[Cell]) -> tuple:
    if not isinstance(pts, list) or not pts:
        raise SpecError(f"adaptive.{where}: expected a non-empty list of axis points, e.g. [{{utd: 1, width: 64}}]")
    keys = []
    for p in pts:
        if not isinstance(p, dict) or not p:
            raise SpecError(f"adaptive.{where}: each point is a mapping of swept axis -> value, got {p!r}")
        hits = {c.key for c in cells for t in c.trials
                if all(k in t.axes and t.axes[k] == v for k, v in p.items())}
        if not hits:
            raise SpecError(f"adaptive.{where}: {p} is not a point of the spec's grid")
        keys.extend(sorted(hits))
    return tuple(dict.fromkeys(keys))


def parse_design(block: Any, *, trials: Sequence[Trial], early_stop=None, seeds: int = 1) -> Design:
    """Validate the `adaptive:` block against the spec's candidate trials (SpecError, one line).
    `early_stop`: the spec's parsed `early_stop` rule (its thresholds and metric are the defaults)."""
    if block is True:
        block = {}
    if not isinstance(block, dict):
        raise SpecError(f"adaptive: expected a mapping with keys {', '.join(KEYS)} (or true), got {block!r}")
    for k in block:
        if k not in KEYS:
            raise SpecError(f"adaptive.{k}: unknown key; allowed: {', '.join(KEYS)}")
    if any("seed" in t.axes for t in trials):
        raise SpecError("adaptive: do not sweep `seed`; the design adds seeds itself (replicates of a candidate)")
    thr = block.get("thresholds", getattr(early_stop, "thresholds", None))
    if thr is None:
        raise SpecError("adaptive.thresholds: give the thresholds J (metric units) the law is fitted at, "
                        "e.g. thresholds: [-1200, -800] (or set early_stop.thresholds)")
    if not isinstance(thr, (list, tuple)) or not thr or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in thr):
        raise SpecError(f"adaptive.thresholds: expected a non-empty list of numbers, got {thr!r}")
    if early_stop is not None and max(thr) > max(early_stop.thresholds):
        raise SpecError(f"adaptive.thresholds: {max(thr)} is above early_stop's top threshold "
                        f"{max(early_stop.thresholds)}: trials would stop before reaching it")
    metric = block.get("metric", getattr(early_stop, "metric", "eval_return"))
    if not isinstance(metric, str) or not metric:
        raise SpecError(f"adaptive.metric: expected a column name, got {metric!r}")
    target = block.get("target", "frontier")
    if target not in TARGETS:
        raise SpecError(f"adaptive.target: {target!r}; allowed: {', '.join(TARGETS)}")
    cells = cells_of(trials)
    _budgets(trials)   # every candidate must have a budget to be costed
    sig = sorted({c.sigma for c in cells})
    ns = sorted({c.N for c in cells})
    if target == "frontier" and (len(sig) < 3 or len(ns) < 3):
        raise SpecError(f"adaptive: target frontier needs >= 3 σ (utd) and >= 3 model sizes among the candidates "
                        f"(has {len(sig)} σ, {len(ns)} N)")
    points = ()
    if target == "points":
        points = _match_points("points", block.get("points"), trials, cells)
    elif "points" in block:
        raise SpecError("adaptive.points: only with target: points")
    initial = block.get("initial", "grid3")
    if isinstance(initial, list):
        initial = _match_points("initial", initial, trials, cells)
    elif initial not in ("grid3", "corners"):
        raise SpecError(f"adaptive.initial: {initial!r}; allowed: grid3, corners or a list of axis points")
    nb = int(_num("n_bootstrap", block.get("n_bootstrap", 100), 1, integer=True, strict=False))
    mc = block.get("max_compute")
    if mc is not None:
        mc = float(_num("max_compute", mc, 0))
    delta = block.get("delta")
    if delta is not None:
        delta = float(_num("delta", delta, 0))
    level = _num("level", block.get("level", 0.9), 0)
    if not level < 1:
        raise SpecError(f"adaptive.level: expected a number in (0, 1), got {level!r}")
    return Design(thresholds=tuple(sorted(float(v) for v in thr)), metric=metric, target=target, points=points,
                  tolerance=float(_num("tolerance", block.get("tolerance", 0.1), 0)), initial=initial,
                  batch=int(_num("batch", block.get("batch", 4), 0, integer=True)),
                  max_rounds=int(_num("max_rounds", block.get("max_rounds", 10), 0, integer=True)),
                  max_compute=mc,
                  max_replicates=int(_num("max_replicates", block.get("max_replicates", 4), 0, integer=True)),
                  n_bootstrap=nb,
                  confirm_bootstrap=int(_num("confirm_bootstrap", block.get("confirm_bootstrap") or 4 * nb, nb,
                                             integer=True, strict=False)),
                  level=float(level), delta=delta, seeds=int(seeds), early_stop=early_stop is not None)


def _budgets(trials: Sequence[Trial]) -> dict:
    """trial id -> its per-seed budget (`early_stop.budget_of`: config env_steps, or the kind's own)."""
    from scaling_rl.sweep import registry
    from scaling_rl.sweep.early_stop import budget_of
    out = {t.id: budget_of(t.config, registry.get(t.agent)) for t in trials}
    missing = [tid for tid, b in out.items() if b is None]
    if missing:
        raise SpecError(f"adaptive: trial {missing[0]} has no budget (env_steps); the design needs one to cost trials")
    return out
