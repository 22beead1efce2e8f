"""Fidelity beside reward: how far generated samples are from the data (a reward gain that costs
fidelity shows here). All jittable; `held_out` is data the generator was not trained on.

  mmd        unbiased MMD² (RBF kernel) between samples and held-out data; ~0 (can be slightly
             negative) for data-like samples. Bandwidth: the median pairwise distance of the
             held-out data times BANDWIDTH_FACTOR[dataset] (toy 0.25: the median, 2.8, spans the
             ring and barely sees a radius drift of 0.37 — MMD 0.013 vs noise ±0.006 at n = 256;
             at 0.25: 0.033 vs ±0.004).
  radius_w1  toy: 1-Wasserstein distance between the samples' radii and the held-out radii (data
             ring 2.0 ± 0.15; samples pushed off the ring raise it).
  valid_frac shapes: fraction of samples that look like data (`data.shapes_valid`).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from scaling_rl.flow import data


BANDWIDTH_FACTOR = {"toy2d": 0.25, "shapes": 1.0}


def _sq_dists(a, b):
    return jnp.maximum(jnp.sum(a * a, -1)[:, None] + jnp.sum(b * b, -1)[None] - 2.0 * a @ b.T, 0.0)


def median_bandwidth(x):
    """Median pairwise distance of x (n, d) (off-diagonal), the RBF bandwidth."""
    rows, cols = np.triu_indices(x.shape[0], k=1)
    return jnp.median(jnp.sqrt(_sq_dists(x, x))[rows, cols])


def mmd(a, b, scale):
    """Unbiased MMD² between samples a (m, d) and b (n, d) with an RBF kernel of width `scale`."""
    k = lambda x, y: jnp.exp(-_sq_dists(x, y) / (2.0 * scale ** 2))
    m, n = a.shape[0], b.shape[0]
    off = lambda x, size: (jnp.sum(k(x, x)) - size) / (size * (size - 1))
    return off(a, m) + off(b, n) - 2.0 * jnp.mean(k(a, b))


def radius_w1(x, held_out):
    """W1 between the radius distributions of x and held_out (equal sizes: sorted differences)."""
    r = jnp.sort(jnp.linalg.norm(x, axis=-1))
    q = jnp.sort(jnp.linalg.norm(held_out, axis=-1))
    return jnp.mean(jnp.abs(r - q))


def measures(dataset: str, x, held_out) -> dict:
    """The fidelity measures of `dataset` for samples x against held-out data (same count)."""
    scale = BANDWIDTH_FACTOR.get(dataset, 1.0) * median_bandwidth(held_out)
    out = {"mmd": mmd(x, held_out, scale)}
    if dataset == "toy2d":
        out["radius_w1"] = radius_w1(x, held_out)
        out["radius_mean"] = jnp.mean(jnp.linalg.norm(x, axis=-1))
    elif dataset == "shapes":
        out["valid_frac"] = jnp.mean(data.shapes_valid(x).astype(jnp.float32))
    return out
