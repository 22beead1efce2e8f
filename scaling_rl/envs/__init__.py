"""One pure, vectorised env API over gymnax and brax (see docs/architecture.md and `core`).

    env = envs.make("gymnax/Pendulum-v1", num_envs=8)
    state, obs = env.reset(key)
    state, ts = env.step(state, action)      # pure, jittable, vmappable; auto-resets

Names are `gymnax/<EnvId>` and `brax/<name>`; other modules add theirs with `register`.
`envs.point_maze` and `envs.goal` are imported lazily by `make`/`known` when they exist.
"""
from __future__ import annotations

import functools
import importlib
from typing import Callable

from scaling_rl.envs.brax_envs import BRAX_NAMES
from scaling_rl.envs.core import EnvSpec, EnvState, ObsStats, TimeStep, VectorEnv
from scaling_rl.envs.gymnax_envs import GYMNAX_IDS

__all__ = [
    "EnvSpec", "EnvState", "ObsStats", "TimeStep", "VectorEnv", "make", "register", "known",
]

_REGISTRY: dict[str, Callable] = {}
_OPTIONAL_MODULES = ("scaling_rl.envs.point_maze", "scaling_rl.envs.goal")
_optional_loaded = False


def register(name: str, factory: Callable, *, overwrite: bool = False) -> None:
    """Make `name` resolvable by `make`; `factory(num_envs, **kw) -> env`.

    `make` passes `normalize_obs=True` to the factory only when asked for normalisation, so a
    factory that builds a `VectorEnv` should forward it (and its other keywords) there.
    """
    if not overwrite and name in _REGISTRY and _REGISTRY[name] is not factory:
        raise ValueError(f"env {name!r}: already registered; pass overwrite=True to replace it")
    _REGISTRY[name] = factory


def _load_optional() -> None:
    """Import the optional env modules once so their `register` calls run."""
    global _optional_loaded
    if _optional_loaded:
        return
    for module in _OPTIONAL_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            # Only the absence of these modules themselves is fine; any other missing
            # dependency inside them is a real error.
            if err.name not in _OPTIONAL_MODULES:
                raise
    _optional_loaded = True


def known() -> list[str]:
    """Sorted list of every registered env name."""
    _load_optional()
    return sorted(_REGISTRY)


def make(name: str, num_envs: int = 1, normalize_obs: bool = False, **kw):
    """Build env `name` with `num_envs` parallel copies; unknown names raise a one-line ValueError."""
    _load_optional()
    if name not in _REGISTRY:
        raise ValueError(f"unknown env {name!r}; known envs: {', '.join(sorted(_REGISTRY))}")
    if normalize_obs:
        kw["normalize_obs"] = True
    return _REGISTRY[name](num_envs, **kw)


def _gymnax_factory(env_id: str, num_envs: int, **kw):
    from scaling_rl.envs.gymnax_envs import make_gymnax

    return make_gymnax(env_id, num_envs, **kw)


def _brax_factory(brax_name: str, num_envs: int, **kw):
    from scaling_rl.envs.brax_envs import make_brax

    return make_brax(brax_name, num_envs, **kw)


for _env_id in GYMNAX_IDS:
    register(f"gymnax/{_env_id}", functools.partial(_gymnax_factory, _env_id))
for _brax_name in BRAX_NAMES:
    register(f"brax/{_brax_name}", functools.partial(_brax_factory, _brax_name))
