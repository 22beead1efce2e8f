"""Trial kinds, looked up by agent name: how to validate a config and how to run one trial.

An entry is a lazily imported `"module:attribute"` path that resolves to a `TrialKind`, so the
registry costs nothing to import and an optional side (the LLM's `grpo`) is only needed when used.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

_ENTRIES: dict[str, str] = {
    "sac": "scaling_rl.sweep.rl_trials:SAC",
    "dqn": "scaling_rl.sweep.rl_trials:DQN",
    "crl": "scaling_rl.sweep.rl_trials:CRL",
    "grpo": "scaling_rl.llm.sweep:TRIAL_KIND",   # provided by the LLM side
    "dpo": "scaling_rl.llm.dpo:TRIAL_KIND",      # DPO with batch schedulers (uniform / SamS)
    "flow_grpo": "scaling_rl.flow.sweep:TRIAL_KIND",   # Flow-GRPO on flow-matching generators
    "toy": "scaling_rl.sweep.toy:TOY",          # JAX-free fake trial for testing the machinery
}
_CACHE: dict[str, "TrialKind"] = {}


@dataclasses.dataclass(frozen=True)
class TrialKind:
    """What the sweep engine needs from an algorithm.

    config_cls: () -> the frozen Config dataclass (with `from_dict`).
    run: (config: dict, out_dir: str, seeds: int, seed: int, *, wandb, checkpoint_every
          [, seed_configs] [, stop]) -> DataFrame
         resumable from out_dir; writes metrics.parquet; raises an exception named `Diverged`
         (with `.step`) on a non-finite loss. `seed_configs` (one config dict per seed) is passed
         only to packing kinds, when packed trials differ in a `packable()` field.
    param_count: (config: dict) -> int | None, the parameter count N used in compute C.
    check: (config: dict) -> None, extra validation beyond the Config (e.g. env name known).
    packable: None if run() cannot take several trials at once; else () -> the config fields,
         besides the seed, in which trials of one pack may differ (see sweep/packing.py).
    stoppable: whether run() takes `stop`: a callable (chunk, table so far) -> dict | None, called
         after each logged chunk (and once on resume, on the table restored); when it returns a
         decision the run writes its final checkpoint / table, records the decision, returns the
         table, and a later rerun returns that table without training more (sweep/early_stop.py).
         Kinds that cannot are refused by a spec's `early_stop:`.
    sequential: whether run() trains its seeds one after another (grpo) rather than together: such
         a kind calls `stop.sequential()` when `stop` has it, then asks `stop` about one seed's
         rows at a time and stops that seed only; the trial counts as stopped when every seed did
         (sweep/early_stop.py). Its `early_stop.unreachable` is refused.
    budget: None, or (config: dict) -> the per-seed budget in the table's env_steps unit, for a kind
         whose config has no `env_steps` (grpo: steps * prompts_per_step * group_size rollouts);
         early stopping's saved env steps are counted against it (`early_stop.budget_of`).
    """
    name: str
    config_cls: Callable[[], type]
    run: Callable[..., Any]
    param_count: Callable[[dict], Any] = lambda config: None
    check: Callable[[dict], None] = lambda config: None
    uses_jax: bool = True
    packable: Callable[[], tuple] | None = None
    stoppable: bool = False
    sequential: bool = False
    budget: Callable[[dict], Any] | None = None


def known() -> list[str]:
    """Names of the registered trial kinds."""
    return sorted(_ENTRIES)


def register(name: str, target: "str | TrialKind") -> None:
    """Add a trial kind: a `TrialKind` or a lazy `"module:attribute"` path to one."""
    if isinstance(target, TrialKind):
        _CACHE[name] = target
        _ENTRIES[name] = f"<registered {name}>"
    else:
        _CACHE.pop(name, None)
        _ENTRIES[name] = target


def get(name: str) -> TrialKind:
    """The trial kind called `name` (ValueError one-liner listing the known ones)."""
    if name in _CACHE:
        return _CACHE[name]
    if name not in _ENTRIES:
        raise ValueError(f"agent: unknown agent {name!r}; allowed: {', '.join(known())}")
    mod_name, _, attr = _ENTRIES[name].partition(":")
    kind = getattr(importlib.import_module(mod_name), attr)
    _CACHE[name] = kind
    return kind


def trial_param_count(kind: TrialKind, config: dict, tdir) -> int | None:
    """N of a trial: what train.run recorded in `tdir`/config.json, else the kind's own count."""
    import json
    from pathlib import Path
    try:
        return int(json.loads((Path(tdir) / "config.json").read_text())["param_count"])
    except (OSError, KeyError, ValueError, TypeError):
        pass
    try:
        return kind.param_count(config)
    except Exception:  # noqa: BLE001 - a count is nice to have, not worth failing for
        return None
