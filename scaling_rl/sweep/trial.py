"""The leaf of `scaling_rl.sweep`: a trial (agent config + seeds) and its stable id, and `SpecError`.

It imports nothing from the package, so `spec` (which validates the `early_stop:` and `adaptive:`
blocks through `early_stop` and `adaptive`) and those modules can all import it without a circle:
spec -> adaptive / early_stop -> trial, never back (`tests/test_sweep_imports.py` checks the graph).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

ID_LEN = 12


class SpecError(ValueError):
    """A spec problem, reported as one line that names the key."""


@dataclasses.dataclass(frozen=True)
class Trial:
    """One point of the sweep: an agent config plus how many seeds (vmapped) and the first seed."""
    agent: str
    config: dict            # the agent Config as a JSON-ready dict (every field, canonical types)
    seeds: int
    seed: int
    axes: dict              # the swept values that make this trial (for tables)

    @property
    def id(self) -> str:
        return trial_id(self.agent, self.config, self.seeds, self.seed)

    def to_json(self) -> dict:
        return {"trial_id": self.id, "agent": self.agent, "config": self.config,
                "seeds": self.seeds, "seed": self.seed, "axes": self.axes}

    @classmethod
    def from_json(cls, d: dict) -> "Trial":
        return cls(d["agent"], d["config"], int(d["seeds"]), int(d["seed"]), d.get("axes", {}))


def canonical_json(obj: Any) -> str:
    """Key-sorted, whitespace-free JSON with shortest-round-trip floats: the same bytes everywhere."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def trial_id(agent: str, config: dict, seeds: int, seed: int) -> str:
    """Stable id of a trial: sha256 of the canonical JSON of its resolved config."""
    blob = canonical_json({"agent": agent, "config": config, "seeds": int(seeds), "seed": int(seed)})
    return hashlib.sha256(blob.encode("ascii")).hexdigest()[:ID_LEN]


def seed_runs(trials) -> set:
    """The individual seed runs of `trials`: (config, first seed, seed index) — seed i of a trial is
    keyed fold_in(PRNGKey(seed), i) by `train.run`, so two trials with one config and first seed share
    their runs. Two designs compared as independent (a grid and an adaptive study) must share none."""
    return {(canonical_json(t.config), int(t.seed), i) for t in trials for i in range(int(t.seeds))}
