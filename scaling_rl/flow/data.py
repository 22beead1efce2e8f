"""Datasets made in code (no downloads), as jittable samplers `sample(key, n) -> (x (n, d), label (n,))`.

toy2d:  a mixture of 8 isotropic Gaussians (std 0.15) on a circle of radius 2; the label is the
        component. Its exact rectified-flow velocity is known in closed form (`toy2d_velocity`),
        which lets tests check samplers without a trained network.
shapes: 12×12 RGB images in [-1, 1] on a 3×3 grid of 4×4 cells; 1-3 cells hold a 2×2 square of
        pure red, green or blue at one of 3×3 offsets; background -1. The label is count - 1.
        `detect_shapes` recovers count / colours exactly on data, and on generated samples counts
        only cells whose content looks like a data square (the verifiable-reward detector).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

TOY_MODES, TOY_RADIUS, TOY_STD = 8, 2.0, 0.15
SIDE, CELL, GRID, SQUARE, MAX_SHAPES, COLOURS = 12, 4, 3, 2, 3, 3   # colours: red, green, blue
DATASETS = ("toy2d", "shapes")


@dataclasses.dataclass(frozen=True)
class Dataset:
    name: str
    dim: int
    num_classes: int
    sample: Callable


def toy2d_means() -> jax.Array:
    angles = 2.0 * jnp.pi * jnp.arange(TOY_MODES) / TOY_MODES
    return TOY_RADIUS * jnp.stack([jnp.cos(angles), jnp.sin(angles)], axis=-1)


def toy2d_sample(key, n: int):
    """n points of the 8-Gaussian ring and their component labels."""
    k1, k2 = jax.random.split(key)
    label = jax.random.randint(k1, (n,), 0, TOY_MODES)
    x = toy2d_means()[label] + TOY_STD * jax.random.normal(k2, (n, 2))
    return x, label


def toy2d_velocity(x, t):
    """Exact v(x, t) = (E[x_data | x_t] - x_t) / (1 - t) for the toy mixture (t < 1).

    Given component k, x_t ~ N(t·m_k, ((1-t)² + t²s²) I) and E[x_data | x_t, k] =
    m_k + t s² (x_t - t m_k) / ((1-t)² + t²s²); the components are weighted by their posterior.
    """
    t = jnp.asarray(t, x.dtype)[:, None, None]               # (B, 1, 1)
    m = toy2d_means()[None]                                  # (1, K, 2)
    var = (1 - t) ** 2 + t ** 2 * TOY_STD ** 2
    xb = x[:, None, :]
    logw = -jnp.sum((xb - t * m) ** 2, axis=-1, keepdims=True) / (2 * var)
    w = jax.nn.softmax(logw, axis=1)
    post_mean = m + t * TOY_STD ** 2 * (xb - t * m) / var
    e_data = jnp.sum(w * post_mean, axis=1)
    return (e_data - x) / (1 - t[:, 0])


def _cell_offsets():
    rows, cols = jnp.meshgrid(jnp.arange(GRID), jnp.arange(GRID), indexing="ij")
    return rows.reshape(-1) * CELL, cols.reshape(-1) * CELL             # (9,), (9,)


def shapes_sample(key, n: int):
    """n procedural images (flattened, (n, 12·12·3)) and labels count - 1."""
    kc, kp, kcol, ko = jax.random.split(key, 4)
    count = jax.random.randint(kc, (n,), 1, MAX_SHAPES + 1)
    cells = jax.vmap(lambda k: jax.random.permutation(k, GRID * GRID)[:MAX_SHAPES])(
        jax.random.split(kp, n))                                         # (n, 3) distinct cells
    colour = jax.random.randint(kcol, (n, MAX_SHAPES), 0, COLOURS)
    offset = jax.random.randint(ko, (n, MAX_SHAPES, 2), 0, CELL - SQUARE + 1)
    r0, c0 = _cell_offsets()
    top = r0[cells] + offset[..., 0]                                     # (n, 3)
    left = c0[cells] + offset[..., 1]
    rr = jnp.arange(SIDE)[None, None, :, None]
    cc = jnp.arange(SIDE)[None, None, None, :]
    inside = ((rr >= top[..., None, None]) & (rr < top[..., None, None] + SQUARE)
              & (cc >= left[..., None, None]) & (cc < left[..., None, None] + SQUARE))
    active = jnp.arange(MAX_SHAPES)[None, :] < count[:, None]
    inside = inside & active[..., None, None]                            # (n, 3, H, W)
    paint = jax.nn.one_hot(colour, COLOURS)[..., None, None, :]           # (n, 3, 1, 1, C)
    img = jnp.max(jnp.where(inside[..., None], paint, 0.0), axis=1)      # (n, H, W, C) in {0, 1}
    return (2.0 * img - 1.0).reshape(n, -1), count - 1


def _windows(a, op=jnp.add):
    """2×2-window reductions (`op` of the 4 corners; add -> means) over the last two (4×4) axes -> (..., 3, 3)."""
    corners = (a[..., :-1, :-1], a[..., 1:, :-1], a[..., :-1, 1:], a[..., 1:, 1:])
    if op is jnp.add:
        return sum(corners) / 4.0
    return op(op(corners[0], corners[1]), op(corners[2], corners[3]))


def _window_masks():
    """(9 windows, 4, 4) bool: the pixels of each 2×2 window of a 4×4 cell."""
    rr = jnp.arange(CELL)[None, :, None]
    cc = jnp.arange(CELL)[None, None, :]
    top = (jnp.arange(9) // 3)[:, None, None]
    left = (jnp.arange(9) % 3)[:, None, None]
    return (rr >= top) & (rr < top + SQUARE) & (cc >= left) & (cc < left + SQUARE)


def detect_shapes(x):
    """Per-cell detector on flattened images (..., 12·12·3). A cell holds a shape when one of its
    2×2 windows looks like the data's squares: all 4 pixels bright (> 0) in one channel, the other
    two channels dark (< 0) on all 4, and every other pixel of the cell dark (< 0) in every channel.
    So a faint wash (0.01 everywhere), a solid colour, or a blob bigger than a square is not a
    shape; isolated bright pixels are not either. The colour is that channel. Exact on data.
    Returns (occupied (..., 9) bool, colour (..., 9) int, count (...,) int)."""
    img = x.reshape(x.shape[:-1] + (GRID, CELL, GRID, CELL, COLOURS))
    img = jnp.moveaxis(img, -4, -3).reshape(x.shape[:-1] + (GRID * GRID, CELL, CELL, COLOURS))
    img = jnp.moveaxis(img, -1, -3)                                      # (..., 9, C, 4, 4)
    flat = lambda a: a.reshape(a.shape[:-2] + (-1,))                     # (..., 3, 3) -> (..., 9)
    colour = jnp.argmax(flat(_windows(img)), axis=-2)                    # (..., 9 cells, 9 windows)
    lo = flat(_windows(img, jnp.minimum))                                # (..., 9, C, 9 windows)
    hi = flat(_windows(img, jnp.maximum))
    pick = jax.nn.one_hot(colour, COLOURS, axis=-2, dtype=bool)          # (..., 9, C, 9)
    bright = jnp.max(jnp.where(pick, lo, -jnp.inf), axis=-2) > 0.0
    others_dark = jnp.max(jnp.where(pick, -jnp.inf, hi), axis=-2) < 0.0
    lit = jnp.max(img, axis=-3)[..., None, :, :]                         # (..., 9, 1, 4, 4)
    outside = jnp.max(jnp.where(_window_masks(), -jnp.inf, lit), axis=(-2, -1))   # (..., 9, 9)
    square = bright & others_dark & (outside < 0.0)
    occupied = jnp.any(square, axis=-1)
    first = jnp.argmax(square, axis=-1)
    cell_colour = jnp.take_along_axis(colour, first[..., None], axis=-1)[..., 0]
    return occupied, cell_colour, jnp.sum(occupied, axis=-1)


def shapes_valid(x):
    """(...,) bool: the image looks like data — 1 to 3 detected squares and no lit pixel
    (brightest channel > 0) anywhere else (4 lit pixels per square, none besides)."""
    _, _, count = detect_shapes(x)
    lit = jnp.sum(jnp.max(x.reshape(x.shape[:-1] + (-1, COLOURS)), axis=-1) > 0.0, axis=-1)
    return (count >= 1) & (count <= MAX_SHAPES) & (lit == SQUARE * SQUARE * count)


def get(name: str) -> Dataset:
    """The dataset called `name` (one-line ValueError listing the known ones)."""
    if name == "toy2d":
        return Dataset("toy2d", 2, TOY_MODES, toy2d_sample)
    if name == "shapes":
        return Dataset("shapes", SIDE * SIDE * COLOURS, MAX_SHAPES, shapes_sample)
    raise ValueError(f"dataset: {name!r} is unknown; use one of {DATASETS}")
