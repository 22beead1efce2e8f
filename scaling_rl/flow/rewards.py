"""Verifiable rewards as plug-ins by name: `reward(x (B, d), cond (B,) int) -> (B,) float32`, in JAX.

Built in:
  toy_angle        2-D toy: cos of the sample's angle to the +x axis (smooth; the pretrained ring
                   scores 0 on average, a policy on the rightmost mode ~1).
  shapes_count     shapes: 1 if the detector counts exactly cond + 1 shapes (the label's count).
  shapes_red       shapes: fraction of detected shapes that are red (0 when none).
  shapes_red_left  shapes: fraction of detected shapes that are red *and* in the left column.
  brightness       any images: 1 - 10·|mean brightness in [0, 1] - 0.1| (smooth target).
`register(name, fn)` adds one; `get(name)` raises a one-line ValueError for an unknown name.
"""
from __future__ import annotations

from typing import Callable

import jax.numpy as jnp

from scaling_rl.flow import data

BRIGHTNESS_TARGET = 0.1
RED = 0

Reward = Callable  # (x, cond) -> (B,)


def toy_angle(x, cond):
    del cond
    return x[..., 0] / jnp.maximum(jnp.linalg.norm(x, axis=-1), 1e-6)


def shapes_count(x, cond):
    _, _, count = data.detect_shapes(x)
    return (count == cond + 1).astype(jnp.float32)


def _fraction(mask, occupied):
    n = jnp.sum(occupied, axis=-1)
    return jnp.where(n > 0, jnp.sum(mask & occupied, axis=-1) / jnp.maximum(n, 1), 0.0)


def shapes_red(x, cond):
    del cond
    occupied, colour, _ = data.detect_shapes(x)
    return _fraction(colour == RED, occupied).astype(jnp.float32)


def shapes_red_left(x, cond):
    del cond
    occupied, colour, _ = data.detect_shapes(x)
    left = (jnp.arange(data.GRID * data.GRID) % data.GRID) == 0
    return _fraction((colour == RED) & left, occupied).astype(jnp.float32)


def brightness(x, cond):
    del cond
    mean = jnp.mean((jnp.clip(x, -1.0, 1.0) + 1.0) / 2.0, axis=-1)
    return 1.0 - 10.0 * jnp.abs(mean - BRIGHTNESS_TARGET)


_REWARDS: dict[str, Reward] = {
    "toy_angle": toy_angle, "shapes_count": shapes_count, "shapes_red": shapes_red,
    "shapes_red_left": shapes_red_left, "brightness": brightness,
}


def register(name: str, fn: Reward) -> None:
    """Add a reward plug-in `fn(x, cond) -> (B,)` under `name`."""
    _REWARDS[name] = fn


def known() -> list[str]:
    return sorted(_REWARDS)


def get(name: str) -> Reward:
    """The reward called `name` (one-line ValueError listing the known ones)."""
    if name not in _REWARDS:
        raise ValueError(f"reward: {name!r} is unknown; use one of {', '.join(known())}")
    return _REWARDS[name]
