"""When the host loop evaluates: the eval schedule (linear or log-spaced in env steps).

Its own module so that agent configs can validate their eval fields without importing the
training loop (the loop calls learners, never the reverse).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np


EVAL_SCHEDULES = ("linear", "log")


def eval_schedule_error(schedule: Any, points: Any) -> str | None:
    """One-line complaint about an (eval_schedule, eval_points) pair, or None if it is valid."""
    if schedule not in EVAL_SCHEDULES:
        return (f"eval_schedule: unknown {schedule!r}; use 'linear' (every eval_every chunks) or "
                f"'log' (eval_points chunks, log-spaced in env steps)")
    if not isinstance(points, (int, np.integer)) or isinstance(points, bool) or points < 2:
        return f"eval_points: must be an integer >= 2 (the first and the last chunk), got {points!r}; e.g. 16"
    return None


def eval_chunks(num_chunks: int, *, schedule: str = "linear", every: int = 1, points: int = 16,
                chunk_env_steps: int = 1, offset_env_steps: int = 0) -> list[int]:
    """The 0-based chunks after which the host loop evaluates (the last chunk always).

    `linear`: every `every` chunks (0: only the last). `log`: `points` chunks (every chunk when
    there are no more than `points`) from the first to the last, as evenly spaced in log(env steps)
    as whole chunks allow -- chunk c ends at offset_env_steps + (c + 1)·chunk_env_steps; each next
    point is the chunk nearest (in log steps) to the previous one's steps × (last / previous)^(1/k),
    k = points still to place, at least one chunk later. Dense early, sparse late; a pure function
    of the config, so a resumed run evaluates at the same steps.
    """
    last = num_chunks - 1
    if num_chunks < 1:
        return []
    if schedule == "linear":
        return [c for c in range(num_chunks) if c == last or (every and (c + 1) % every == 0)]
    if schedule != "log":
        raise ValueError(eval_schedule_error(schedule, points))
    if points >= num_chunks:
        return list(range(num_chunks))

    def steps(c: int) -> float:
        return offset_env_steps + (c + 1) * chunk_env_steps

    chosen = [0]
    while len(chosen) < points:
        k = points - len(chosen)
        prev = chosen[-1]
        target = math.log(steps(prev)) + (math.log(steps(last)) - math.log(steps(prev))) / k
        below = int(math.floor((math.exp(target) - offset_env_steps) / chunk_env_steps)) - 1
        best = min((below, below + 1), key=lambda c: abs(math.log(steps(max(c, 0))) - target))
        chosen.append(min(max(best, prev + 1), num_chunks - k))  # leave room for the k - 1 after it
    return chosen


# --------------------------------------------------------------------------------------------
# The run
