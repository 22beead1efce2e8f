"""Verifiable rewards as plug-ins by name: `reward(x (B, d), cond (B,) int) -> (B,) float32`, in JAX.

Built in:
  toy_angle        2-D toy: g·cos(angle to +x) - (1 - g), g = exp(-½((|x| - R)/(1.5·s))²) the
                   ring gate (R = 2, s = 0.15 the data's radius and mode std): leaving the ring
                   costs reward, so pushing samples off it cannot game the angle. Data average
                   ≈ -0.17; the rightmost mode with the data's spread ≈ 0.66; a point at angle 0
                   and radius 2.369 (where ungated Fast drifted) -0.48.
  shapes_count     shapes: 1 if the detector counts exactly cond + 1 shapes (the label's count).
  shapes_red       shapes: fraction of detected shapes that are red (0 when none). Shapes are
                   what `data.detect_shapes` accepts: data-like squares (a faint red wash or a
                   solid red image has none, so scores 0; the data average is 1/3).
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


RING_WIDTH = 1.5 * data.TOY_STD


def toy_angle(x, cond):
    del cond
    radius = jnp.linalg.norm(x, axis=-1)
    cos = x[..., 0] / jnp.maximum(radius, 1e-6)
    on_ring = jnp.exp(-0.5 * ((radius - data.TOY_RADIUS) / RING_WIDTH) ** 2)
    return on_ring * cos - (1.0 - on_ring)


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
