"""`make_source(trainer)`: the rollout source of `trainer.cfg.rollout`.

Its own module so that the sources built on `sources.py` (Hogwild!, Ray) import it one way: the
factory imports them, they never import the factory (no import circle).
"""
from __future__ import annotations

from scaling_rl.llm.sources import SOURCES, ProcessSource, SyncSource, TBASource


def make_source(trainer):
    """The source of `trainer.cfg.rollout`, started from the trainer's current weights."""
    mode = trainer.cfg.rollout
    if mode == "sync":
        return SyncSource(trainer)
    if mode in ("async", "pipeline"):
        return ProcessSource(trainer, mode)
    if mode == "tba":
        return TBASource(trainer)
    if mode == "hogwild":
        from scaling_rl.llm.hogwild import HogwildSource
        return HogwildSource(trainer)
    if mode == "ray":   # ray is an optional dependency: imported only when asked for
        from scaling_rl.llm.ray_source import RaySource
        return RaySource(trainer)
    raise ValueError(f"rollout: {mode!r} is unknown; use one of {SOURCES}")
