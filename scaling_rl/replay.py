"""A jittable fixed-capacity ring buffer that lives inside the training state.

    buf = replay.init(capacity, example)        # example: pytree of ONE transition (no batch axis)
    buf = replay.add(buf, batch)                # batch: same pytree with a leading axis n
    batch = replay.sample(buf, key, batch_size) # uniform over the filled entries

The buffer is a `flax.struct.dataclass` of plain arrays, so it jits, scans, vmaps over seeds
(`jax.vmap(replay.init ...)` or a vmapped train state) and sits per-device inside `jax.shard_map`.
Entries fill slots 0, 1, ... in order and then wrap around, overwriting the oldest; the filled
slots are therefore always [0, size), which is what `sample` draws from.
"""
from __future__ import annotations

import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

# Share of currently available host memory `check_fits` allows one buffer by default: the rest is
# for XLA temporaries, the model and the other processes on the machine.
DEFAULT_MEMORY_FRACTION = 0.5


@struct.dataclass
class ReplayBuffer:
    """Ring buffer state: `data` leaves have a leading capacity axis."""

    data: Any
    position: jax.Array  # int32: slot the next entry is written to
    count: jax.Array  # int32: number of filled slots (<= capacity)
    capacity: int = struct.field(pytree_node=False)


def _abstract(example: Any) -> Any:
    """Shape/dtype of each leaf of one transition (arrays, scalars or ShapeDtypeStructs)."""

    def leaf(x):
        if isinstance(x, jax.ShapeDtypeStruct):
            return x
        return jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x))

    return jax.tree.map(leaf, example)


def _check_capacity(capacity: Any) -> int:
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
        raise ValueError(f"capacity: must be a positive int, got {capacity!r}; e.g. 1_000_000")
    return int(capacity)


def init(capacity: int, example: Any) -> ReplayBuffer:
    """Empty buffer of `capacity` transitions shaped like `example` (zeros; nothing filled)."""
    capacity = _check_capacity(capacity)
    data = jax.tree.map(
        lambda a: jnp.zeros((capacity, *a.shape), a.dtype), _abstract(example)
    )
    return ReplayBuffer(
        data=data,
        position=jnp.zeros((), jnp.int32),
        count=jnp.zeros((), jnp.int32),
        capacity=capacity,
    )


def size(buf: ReplayBuffer) -> jax.Array:
    """Number of filled entries (int32 scalar)."""
    return buf.count


def add(buf: ReplayBuffer, batch: Any) -> ReplayBuffer:
    """Write the n entries of `batch` (leading axis n) after the newest, overwriting the oldest.

    n may exceed the free space or even the capacity (then only the last `capacity` entries stay).
    """
    leaves = jax.tree.leaves(batch)
    if not leaves:
        raise ValueError("batch: has no arrays; pass a pytree with a leading batch axis")
    n = leaves[0].shape[0]
    if any(x.shape[0] != n for x in leaves):
        raise ValueError(
            f"batch: leading axes differ ({sorted({x.shape[0] for x in leaves})}); "
            "every leaf needs the same number of entries"
        )
    cap = buf.capacity
    kept = min(n, cap)  # static: with n > cap only the newest `cap` entries can survive
    # Slots of the kept entries; unique, so the scatter order does not matter.
    start = buf.position + (n - kept)
    slots = (start + jnp.arange(kept, dtype=jnp.int32)) % cap

    def write(store, new):
        return store.at[slots].set(new[n - kept:].astype(store.dtype), unique_indices=True)

    data = jax.tree.map(write, buf.data, batch)
    return buf.replace(
        data=data,
        position=((buf.position + n) % cap).astype(jnp.int32),
        count=jnp.minimum(buf.count + n, cap).astype(jnp.int32),
    )


def sample(buf: ReplayBuffer, key: jax.Array, batch_size: int) -> Any:
    """`batch_size` entries drawn uniformly with replacement from the filled ones.

    An empty buffer cannot raise under jit: it returns copies of slot 0 (zeros).
    """
    idx = jax.random.randint(key, (batch_size,), 0, jnp.maximum(buf.count, 1))
    return jax.tree.map(lambda store: store[idx], buf.data)


def nbytes(capacity: int, example: Any) -> int:
    """Exact bytes of a buffer's `data` for `capacity` transitions like `example` (counters: +8)."""
    capacity = _check_capacity(capacity)
    per_entry = sum(
        math.prod(a.shape) * np.dtype(a.dtype).itemsize for a in jax.tree.leaves(_abstract(example))
    )
    return capacity * per_entry


def available_memory_bytes() -> int:
    """Host memory currently available (os.sysconf), the default budget's basis."""
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_fits(
    capacity: int, example: Any, budget_bytes: int | None = None, *, copies: int = 1
) -> int:
    """Raise a one-line ValueError unless `copies` buffers (e.g. one per vmapped seed) fit.

    budget_bytes defaults to DEFAULT_MEMORY_FRACTION of the available host memory. Returns the
    bytes needed.
    """
    if budget_bytes is None:
        budget_bytes = int(DEFAULT_MEMORY_FRACTION * available_memory_bytes())
    per_entry = nbytes(1, example)
    needed = copies * nbytes(capacity, example)
    if needed > budget_bytes:
        max_capacity = budget_bytes // max(copies * per_entry, 1)
        raise ValueError(
            f"capacity: {capacity} x {copies} buffer(s) need {needed} bytes "
            f"({needed / 2**30:.2f} GiB) but the budget is {budget_bytes} bytes; "
            f"max capacity that fits is {max_capacity}"
        )
    return needed
