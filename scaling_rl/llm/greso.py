"""GRESO selective rollouts (Zheng et al. 2025, "Act Only When It Pays").

A prompt whose last z rollout groups (in consecutive epochs) all had zero reward variance gives
no GRPO signal and probably will not next time either. Before rolling it out again it is kept
with probability max(p^z, floor) and skipped otherwise, where p is an exploration probability
kept separately for "easy" (last group all correct) and "hard" (all wrong) prompts. After every
step each p moves by `step` (within [p_min, p_max]) toward making that kind's share of
zero-variance groups among rolled-out prompts equal to target/2, so the two kinds together aim
at the `target` zero-variance share. Prompts with z = 0 are always rolled out.
"""
from __future__ import annotations

import dataclasses
from typing import Hashable, Iterable, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class GresoConfig:
    target: float = 0.25        # zero-variance share of rolled-out groups to aim for
    step: float = 0.01          # change of p per training step
    p_min: float = 0.05
    p_max: float = 0.95
    p_init: float = 0.5
    floor: float = 0.01         # every prompt keeps at least this chance of being explored
    easy_threshold: float = 0.5  # a zero-variance group with reward >= this counts as "easy"

    def __post_init__(self):
        if not 0.0 <= self.target <= 1.0:
            raise ValueError(f"greso.target: {self.target} is outside [0, 1]")
        if not 0.0 < self.p_min <= self.p_init <= self.p_max <= 1.0:
            raise ValueError("greso.p_init: need 0 < p_min <= p_init <= p_max <= 1")
        if not 0.0 <= self.floor <= 1.0 or self.step < 0:
            raise ValueError("greso.floor/step: need floor in [0, 1] and step >= 0")


class SelectiveRollout:
    """Per-prompt zero-variance history plus the two adaptive exploration probabilities."""

    def __init__(self, config: GresoConfig = GresoConfig()):
        self.config = config
        self.p = {"easy": config.p_init, "hard": config.p_init}
        self.streak: dict[Hashable, int] = {}   # consecutive zero-variance epochs
        self.kind: dict[Hashable, str] = {}     # "easy" | "hard" for the last zero-variance group
        self.skipped = 0                        # prompts skipped so far

    def keep_probability(self, prompt_id: Hashable) -> float:
        z = self.streak.get(prompt_id, 0)
        if z == 0:
            return 1.0
        return max(self.p[self.kind[prompt_id]] ** z, self.config.floor)

    def select(self, prompt_id: Hashable, rng: np.random.Generator) -> bool:
        """True to roll the prompt out, False to skip it (counted)."""
        keep = rng.random() < self.keep_probability(prompt_id)
        if not keep:
            self.skipped += 1
        return bool(keep)

    def observe(self, prompt_ids: Sequence[Hashable], group_rewards: Iterable[np.ndarray]) -> dict:
        """Record the rollout groups of one step and adapt p; returns the step's shares."""
        n, n_easy, n_hard = 0, 0, 0
        for pid, rewards in zip(prompt_ids, group_rewards):
            rewards = np.asarray(rewards, dtype=np.float64)
            n += 1
            if np.ptp(rewards) == 0.0:
                kind = "easy" if rewards[0] >= self.config.easy_threshold else "hard"
                self.streak[pid] = self.streak.get(pid, 0) + 1
                self.kind[pid] = kind
                n_easy += kind == "easy"
                n_hard += kind == "hard"
            else:
                self.streak.pop(pid, None)
                self.kind.pop(pid, None)
        if n:
            c = self.config
            for kind, count in (("easy", n_easy), ("hard", n_hard)):
                direction = -1.0 if count / n > c.target / 2 else 1.0
                self.p[kind] = float(np.clip(self.p[kind] + direction * c.step, c.p_min, c.p_max))
        return {"greso/zero_var_easy": n_easy / max(n, 1), "greso/zero_var_hard": n_hard / max(n, 1),
                "greso/p_easy": self.p["easy"], "greso/p_hard": self.p["hard"]}

    def state_dict(self) -> dict:
        return {"p": dict(self.p), "streak": [[k, v] for k, v in self.streak.items()],
                "kind": [[k, v] for k, v in self.kind.items()], "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self.p = dict(state["p"])
        self.streak = {k: int(v) for k, v in state["streak"]}
        self.kind = {k: str(v) for k, v in state["kind"]}
        self.skipped = int(state["skipped"])
