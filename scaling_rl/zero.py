"""ZeRO-1: optimiser state sharded along the mesh axis `data`, for the shard_map'd learners.

The replicated data-parallel update (`parallel.data_parallel_value_and_grad`) keeps a full copy of the
optimiser state (Adam's two moments: 2x the parameters) on every device. With `ShardedOptimizer`
each device keeps 1/n of it:

1. reduce-scatter of the gradients (`lax.psum_scatter`): device i receives the sum of slice i of every
   device's gradient (divided by the total number of micro-batches, i.e. the mean gradient);
2. the optax update on slice i of the parameters with slice i of the optimiser state;
3. all-gather of the updated parameter slices (`lax.all_gather`), so parameters stay replicated.

Slices are taken leaf by leaf along one axis of each leaf (the first, among the largest, divisible
by n), so every slice keeps its leaf's rank: rank-based masks (weight decay on matrices only) and the
flat-vector optimisers of `agents.common` give the same numbers on a slice as on the whole leaf.
Leaves with no divisible axis (a scalar temperature, an odd-sized bias) are kept whole on every device
(their gradient is `pmean`ed); `state_bytes_per_device` counts them. Adam-type updates are elementwise,
so the sharded update equals the replicated one up to float summation order (tests/test_zero.py).
Global-norm clipping is not elementwise: pass `max_grad_norm` here (and build `tx` without it); the
norm is then that of the whole mean gradient (`psum` of the slices' squared norms).

State layout outside `shard_map`: each optimiser-state leaf of rank >= 1 holds the n per-device states
concatenated along axis 0 (spec `P("data")`); scalar leaves (step count, injected hyper-parameters) are
replicated (`P()`), so `common.set_hyperparams` works unchanged. Everything here except `init` and
`state_bytes_per_device` runs inside a `shard_map` over `axis`.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from scaling_rl.parallel import DATA_AXIS


def shard_dims(params: Any, n: int) -> Any:
    """Per leaf: the axis its slices are cut along (largest axis divisible by n; first on ties), or -1
    (kept whole on every device) when none is or n == 1."""
    def dim(x):
        shape = np.shape(x)
        ok = [d for d in range(len(shape)) if n > 1 and shape[d] % n == 0]
        return max(ok, key=lambda d: (shape[d], -d)) if ok else -1
    return jax.tree.map(dim, params)


def _slice(x, d: int, i, n: int):
    """Slice i of n of `x` along axis d (i may be traced)."""
    size = x.shape[d] // n
    return jax.lax.dynamic_slice_in_dim(x, i * size, size, axis=d)


def state_specs(state: Any, axis: str = DATA_AXIS) -> Any:
    """shard_map specs of a sharded optimiser state: P(axis) for leaves of rank >= 1, P() for scalars."""
    return jax.tree.map(lambda x: P(axis) if np.ndim(x) >= 1 else P(), state)


def _exact_invariant(x, axis: str):
    """A value equal on every device, typed invariant over `axis` (psum of device 0's copy: exact)."""
    i = jax.lax.axis_index(axis)
    return jax.lax.psum(jnp.where(i == 0, x, jnp.zeros_like(x)), axis)


@dataclasses.dataclass(frozen=True)
class ShardedOptimizer:
    """An optax transformation whose state is sharded n ways along mesh axis `axis` (ZeRO-1)."""
    tx: optax.GradientTransformation
    n: int
    axis: str = DATA_AXIS
    max_grad_norm: float = 0.0

    def init(self, params: Any) -> Any:
        """The sharded state (layout in the module docstring); plain jnp, no mesh needed."""
        dims = shard_dims(params, self.n)
        states = [self.tx.init(jax.tree.map(lambda p, d: p if d < 0 else _slice(p, d, i, self.n),
                                            params, dims)) for i in range(self.n)]
        return jax.tree.map(lambda *xs: xs[0] if np.ndim(xs[0]) == 0 else jnp.concatenate(xs, 0),
                            *states)

    def step(self, grad_sum: Any, count, state: Any, params: Any) -> tuple[Any, Any]:
        """Inside shard_map: `grad_sum` is this device's sum of `count` micro-batch mean gradients
        (varying), `params` replicated, `state` this device's slice. Returns the replicated updated
        parameters and the new state slice. The gradient used is sum over devices / total count."""
        axis, n = self.axis, self.n
        dims = shard_dims(params, n)
        # (a total of 0 only comes with an all-zero sum: ACCO's first update has no pending gradient)
        total = jnp.maximum(jax.lax.psum(jnp.asarray(count, jnp.float32), axis), 1.0)
        i = jax.lax.axis_index(axis)

        def reduce(g, d):
            g = jax.lax.psum_scatter(g, axis, scatter_dimension=d, tiled=True) if d >= 0 \
                else jax.lax.psum(g, axis)
            return g / total.astype(g.dtype)

        grads = jax.tree.map(reduce, grad_sum, dims)
        if self.max_grad_norm and self.max_grad_norm > 0:
            sharded = sum((jnp.sum(jnp.square(g)) for g, d in
                           zip(jax.tree.leaves(grads), jax.tree.leaves(dims)) if d >= 0), jnp.zeros(()))
            whole = sum((jnp.sum(jnp.square(g)) for g, d in
                         zip(jax.tree.leaves(grads), jax.tree.leaves(dims)) if d < 0), jnp.zeros(()))
            g_norm = jnp.sqrt(jax.lax.psum(sharded, axis) + whole)
            trigger = g_norm < self.max_grad_norm  # same formula as optax.clip_by_global_norm
            grads = jax.tree.map(lambda t: jax.lax.select(
                trigger, t, (t / g_norm.astype(t.dtype)) * self.max_grad_norm), grads)
        p_slice = jax.tree.map(lambda p, d: p if d < 0 else _slice(p, d, i, n), params, dims)
        updates, state = self.tx.update(grads, state, p_slice)
        new_slice = optax.apply_updates(p_slice, updates)

        def gather(p, d):
            if d >= 0:
                return jax.lax.all_gather(p, axis, axis=d, tiled=True, to="invarying")
            return _exact_invariant(p, axis)  # equal on every device already

        new_params = jax.tree.map(gather, new_slice, dims)
        state = jax.tree.map(lambda s: _exact_invariant(s, axis) if np.ndim(s) == 0 else s, state)
        return new_params, state

    def state_bytes_per_device(self, params: Any) -> int:
        """Bytes of optimiser state one device holds (analytic, from shapes)."""
        state = jax.eval_shape(self.init, params)
        return int(sum(x.size * x.dtype.itemsize // (self.n if x.ndim >= 1 else 1)
                       for x in jax.tree.leaves(state)))


def replicated_state_bytes(tx: optax.GradientTransformation, params: Any) -> int:
    """Bytes of a replicated optimiser state (what every device holds without sharding)."""
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(jax.eval_shape(tx.init, params))))


def step_groups(opts, grads, count, opt_states, params):
    """`opts.step` for one `ShardedOptimizer` over all of `params`, or one step per key of a dict of
    them (parameters of keys without an optimiser are kept) -> (new params, new states)."""
    if isinstance(opts, ShardedOptimizer):
        return opts.step(grads, count, opt_states, params)
    new, new_states = dict(params), {}
    for key, opt in opts.items():
        new[key], new_states[key] = opt.step(grads[key], count, opt_states[key], params[key])
    return new, new_states


def group_state_specs(opts, opt_states, axis: str = DATA_AXIS):
    """`state_specs` of one optimiser's state, or per key of a dict of optimisers."""
    if isinstance(opts, ShardedOptimizer):
        return state_specs(opt_states, axis)
    return {k: state_specs(opt_states[k], axis) for k in opts}


def zero_update(loss_fn, opts: dict, mesh, axis: str = DATA_AXIS):
    """A shard_map'd step with ZeRO-1 optimisers, one per top-level parameter group.

    `loss_fn(params, batch, extra) -> (loss, aux)` (a mean over its batch); `opts` is one
    `ShardedOptimizer` for the whole of `params` (then `opt_states` is its state) or a dict mapping keys
    of `params` to `ShardedOptimizer`s (then `opt_states` is keyed like it). Returns
    `f(params, opt_states, batch, extra) -> (params, opt_states, loss, aux)`; `batch` is split along
    `axis`, `params`/`extra` replicated; loss and aux are `pmean`ed (those of the global batch).
    """
    value_and_grad = jax.value_and_grad(loss_fn, has_aux=True)

    def per_shard(params, opt_states, batch, extra):
        varying = jax.tree.map(lambda p: jax.lax.pcast(p, axis, to="varying"), params)
        (loss, aux), grads = value_and_grad(varying, batch, extra)
        loss, aux = jax.lax.pmean((loss, aux), axis)
        new, new_states = step_groups(opts, grads, 1, opt_states, params)
        return new, new_states, loss, aux

    def f(params, opt_states, batch, extra):
        specs = (P(), group_state_specs(opts, opt_states, axis), P(axis), P())
        return jax.shard_map(per_shard, mesh=mesh, in_specs=specs,
                             out_specs=(P(), specs[1], P(), P()))(params, opt_states, batch, extra)

    return f
