"""Agents: one file per algorithm, each exposing `Config`, `make(config)` and `make_train(config)`."""
from __future__ import annotations

import importlib

AGENTS = {
    "sac": "scaling_rl.agents.sac",
    "dqn": "scaling_rl.agents.dqn",
    "crl": "scaling_rl.agents.crl",
}


def get(name: str):
    """Import and return the agent module called `name` (one-line error listing the known ones)."""
    if name not in AGENTS:
        raise ValueError(f"unknown agent {name!r}; known agents: {', '.join(sorted(AGENTS))}")
    return importlib.import_module(AGENTS[name])
