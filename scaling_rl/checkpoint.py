"""Orbax checkpoints of a whole train state plus a small JSON record, saved asynchronously.

A checkpoint step is one directory `<dir>/<step>/` holding two items: `state` (the pytree of
arrays, via `StandardSave`) and `meta` (a JSON dict: chunk index, metric rows so far, ...).
Orbax writes each step to a temporary directory and renames it when complete, so a process
killed mid-save leaves the previous step as the latest one.

The state is copied to host memory before the save is queued. That lets the caller donate the
device buffers to the next jitted chunk while the write is still in flight.
"""
from __future__ import annotations

import copy
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

_STATE, _META = "state", "meta"


def _is_key(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def to_host(tree: Any) -> Any:
    """Owned numpy copies of every leaf (typed PRNG keys become their uint32 key data). An array
    replicated over devices of several processes (a multi-process mesh) is read from this
    process's first shard, which holds all of it."""

    def leaf(x):
        if _is_key(x):
            x = jax.random.key_data(x)
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            if not x.is_fully_replicated:
                raise ValueError(f"an array of shape {x.shape} is split across processes; "
                                 "only replicated arrays can be copied to one host")
            x = x.addressable_shards[0].data
        return np.array(jax.device_get(x), copy=True)

    return jax.tree.map(leaf, tree)


def _storable_abstract(abstract: Any) -> Any:
    """The abstract tree as stored on disk: typed keys replaced by uint32 key data."""

    def leaf(x):
        sharding = getattr(x, "sharding", None)
        if sharding is None:
            sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        if _is_key(x):
            data = jax.eval_shape(jax.random.key_data, x)
            return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=sharding)
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    return jax.tree.map(leaf, abstract)


def _rewrap_keys(restored: Any, abstract: Any) -> Any:
    """Typed keys back from their key data. Leaves whose abstract value has no sharding come back
    uncommitted (placed by the first program that uses them, as a fresh init's are), so a state
    restored on one device feeds a program over a mesh of several devices or processes."""

    def leaf(x, a):
        if getattr(a, "sharding", None) is None:
            x = jax.numpy.asarray(np.asarray(x))
        if _is_key(a):
            return jax.random.wrap_key_data(x, impl=a.dtype._impl.name)  # works for abstract `a`
        return x

    return jax.tree.map(leaf, restored, abstract)


class Checkpointer:
    """Numbered checkpoints of (state, meta) in `directory`, keeping the newest `max_to_keep`.

    `save` returns once the state is on the host; the write continues in the background.
    `wait` blocks until it is on disk and re-raises any error it hit (so no save is lost
    silently); `save` also waits for the previous one first. Use as a context manager, or
    call `close`, which waits too.
    """

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int | None = 2,
                 async_save: bool = True):
        self.directory = os.path.abspath(os.fspath(directory))
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            enable_async_checkpointing=async_save,
            create=True,
        )
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=(_STATE, _META))

    def latest_step(self) -> int | None:
        """The newest complete step, or None when there is none."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, step: int, state: Any, meta: dict | None = None) -> None:
        """Queue a save of `state` (any pytree of arrays) and JSON-able `meta` as `step`."""
        self.wait()
        saved = self._manager.save(
            step,
            args=ocp.args.Composite(**{
                _STATE: ocp.args.StandardSave(to_host(state)),
                _META: ocp.args.JsonSave(copy.deepcopy(dict(meta or {}))),  # written later
            }),
            force=True,
        )
        if not saved:
            raise RuntimeError(f"checkpoint step {step} was not saved (does it already exist?)")

    def wait(self) -> None:
        """Block until queued saves are on disk; raise the error of a failed one."""
        self._manager.wait_until_finished()
        self._manager.check_for_errors()

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
        """Restore `step` into the structure/shapes/dtypes of `abstract_state` (e.g. from
        `jax.eval_shape`); leaves without a sharding land on the default device."""
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(**{
                _STATE: ocp.args.StandardRestore(_storable_abstract(abstract_state)),
                _META: ocp.args.JsonRestore(),
            }),
        )
        return _rewrap_keys(restored[_STATE], abstract_state), dict(restored[_META])

    def close(self) -> None:
        """Wait for pending saves (raising their errors) and release the manager."""
        try:
            self.wait()
        finally:
            self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:  # do not mask the original error with a secondary save error
            try:
                self.close()
            except Exception:  # noqa: BLE001
                pass
