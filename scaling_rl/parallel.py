"""Devices and seeds: a mesh, a data-parallel (shard_map'd) gradient, and the seed axis.

Two axes of parallelism, composed the same way everywhere:
- **seeds** are a `jax.vmap` axis: N independent runs in one compiled program (`seed_keys`).
- **devices** are a mesh axis `data`: an update is written once for one shard and wrapped with
  `jax.shard_map`; the batch is split along `data`, parameters and optimiser states are replicated,
  and the gradients (and loss/metrics) are averaged with `lax.pmean`. Because every loss here is a
  mean over its batch and the shards are equal in size, the pmean of per-shard gradients equals the
  gradient of the global batch, so n devices reproduce the 1-device update up to float summation
  order (tests/test_parallel.py runs this on 8 forced host devices in a subprocess).
  Legacy `jax.pmap` is not used.

Agents opt in with `Config(data_parallel=True)` (a mesh over all devices) or
`make(cfg, mesh=make_mesh(4))`. CRL and SAC also take `zero_optimizer=True`: the optimiser state is then
sharded along `data` instead of replicated (ZeRO-1: reduce-scatter, sharded step, all-gather;
`scaling_rl/zero.py`), and with `acco="acco"` (`scaling_rl/acco.py` `learner_update`) ACCO's two-round
update with its delay compensation, fused into the jitted chunk (no host overlap, fixed counts; the
overlapped learner is `acco.OverlappedAcco`, docs/acco.md). The rest of a chunk (acting, env steps, replay) is computed
replicated; only the gradient computation — the expensive part at large batch and width — is split.

Multi-host (a pod slice or several GPU nodes): call `jax.distributed.initialize()` first thing in
every process (on SLURM / TPU pods it reads the coordinator address, process count and id from the
environment; elsewhere pass `coordinator_address=`, `num_processes=`, `process_id=`). After that
`jax.devices()` lists the devices of *all* hosts, so `make_mesh()` spans them, and the same jitted
program runs on every host (SPMD). Because the batch is sampled inside the program from a
replicated buffer with a replicated key, every host computes the same global batch and keeps only
its shard — no host-to-host data loading is needed. Feeding host-local data instead would use
`jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), local_batch)`. Only process
0 should write logs and checkpoints (`jax.process_index() == 0`).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA_AXIS = "data"


def make_mesh(n_devices: int | None = None, axis: str = DATA_AXIS) -> Mesh:
    """A 1-D mesh over the first `n_devices` devices (default: all, across hosts after
    `jax.distributed.initialize()`), with axis name `axis`."""
    devices = jax.devices()
    n = len(devices) if n_devices is None else int(n_devices)
    if not 1 <= n <= len(devices):
        raise ValueError(f"n_devices: {n_devices} is not in [1, {len(devices)}] (devices available); "
                         f"use None for all")
    return Mesh(np.asarray(devices[:n]), (axis,))


def mesh_size(mesh: Mesh | None, axis: str = DATA_AXIS) -> int:
    """Number of devices along `axis` (1 without a mesh)."""
    return 1 if mesh is None else int(mesh.shape[axis])


def resolve_mesh(mesh: Mesh | None, data_parallel: bool, batch_size: int,
                 axis: str = DATA_AXIS) -> Mesh | None:
    """The mesh an agent trains on (all local devices when `data_parallel` and none given), checking
    that the global batch splits evenly over it (one-line ValueError naming a batch size that does)."""
    if mesh is None and data_parallel:
        mesh = make_mesh(axis=axis)
    n = mesh_size(mesh, axis)
    if batch_size % n:
        raise ValueError(f"batch_size: {batch_size} does not split over {n} devices; "
                         f"use {-(-batch_size // n) * n}")
    return mesh


def data_parallel_value_and_grad(loss_fn: Callable, mesh: Mesh | None, axis: str = DATA_AXIS
                                 ) -> Callable:
    """`loss_fn(params, batch, extra) -> (loss, aux)` -> `f(params, batch, extra) -> ((loss, aux), grads)`.

    Without a mesh this is `jax.value_and_grad(loss_fn, has_aux=True)`. With one, `batch` (every
    leaf's leading axis) is split over `axis`, `params` and `extra` are replicated, and loss, aux
    and grads are `pmean`ed, so the result is that of the global batch. `loss_fn` must average over
    its batch and the batch size must be divisible by the number of devices along `axis`.
    Per-sample randomness belongs in `batch` (drawn before the call) so that it does not depend on
    the device count.
    """
    value_and_grad = jax.value_and_grad(loss_fn, has_aux=True)
    if mesh is None:
        return value_and_grad

    def per_shard(params, batch, extra):
        # `params` arrive invariant over `axis`; differentiating through that implicit broadcast
        # would already psum the gradients (vma typing). Casting them to per-shard ("varying")
        # values first makes each shard's gradient its own, so the one pmean below is the mean.
        params = jax.tree.map(lambda p: jax.lax.pcast(p, axis, to="varying"), params)
        return jax.lax.pmean(value_and_grad(params, batch, extra), axis)

    return jax.shard_map(per_shard, mesh=mesh, in_specs=(P(), P(axis), P()), out_specs=P())


def shard_batch(batch: Any, mesh: Mesh, axis: str = DATA_AXIS) -> Any:
    """Place a host batch on `mesh`, split along its leading axis (outside jit)."""
    return jax.device_put(batch, NamedSharding(mesh, P(axis)))


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Place a pytree on every device of `mesh` (outside jit)."""
    return jax.device_put(tree, NamedSharding(mesh, P()))


def seed_keys(seed: int, num_seeds: int) -> jax.Array:
    """`num_seeds` independent keys for a vmapped seed axis: fold_in(PRNGKey(seed), i)."""
    root = jax.random.PRNGKey(seed)
    return jax.vmap(lambda i: jax.random.fold_in(root, i))(np.arange(num_seeds, dtype=np.uint32))
