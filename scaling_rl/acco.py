"""ACCO — accumulate while you communicate (Nabli et al., NeurIPS 2025), on a ZeRO-1 sharded optimiser.

With ZeRO-1 (scaling_rl/zero.py) one update is: gradients -> reduce-scatter -> sharded optimiser step ->
all-gather. Done in sequence, the devices idle during the communication. Overlapping it with the next
gradient computation means those gradients are computed on parameters one update old (`"dpu"`,
delayed parameter update), which hurts transformer training. ACCO splits every update into two
communication rounds and compensates the delay:

  round 1: communicate  θ̃_{t+1} = Opt(θ_t, s_t; g_prev)        (an *estimate*; the state is discarded)
           compute      g_now = Σ grads at θ_t                   (micro-batches, concurrently)
  round 2: communicate  θ_{t+1}, s_{t+1} = Opt(θ_t, s_t; g_prev + g_now)      (the real update)
           compute      g_prev' = Σ grads at θ̃_{t+1}             (concurrently)

so the gradients of an update are computed half at θ_t and half at an estimate of θ_t, never at stale
parameters. Gradients are *sums* with a micro-batch count per device, and the update uses
Σ_devices sum / Σ_devices count: devices may accumulate different numbers of micro-batches in a round
(heterogeneous workers), which is the point of accumulating "while" communicating.

`"ddp"` runs round by round without overlap (compute, then the sharded step on those gradients): the
zero-delay case, equal to ordinary data-parallel training. Everything here is written for one device
inside a `jax.shard_map` over `axis` (`Acco.shard_mapped` wraps it); on one process the two branches of a
round are independent in the dataflow, which is what lets a runtime overlap them. Micro-batches arrive
stacked, (M, micro_batch, ...), and `count` (≤ M, per device) says how many to use.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from scaling_rl import zero

MODES = ("ddp", "dpu", "acco")


class AccoState(NamedTuple):
    params: Any        # replicated θ_t
    opt_state: Any     # this device's optimiser-state slice (zero.ShardedOptimizer layout)
    pending: Any       # this device's gradient sum waiting to be communicated (leading axis: 1 per device)
    pending_count: Any  # (1,) micro-batches in `pending` on this device


def accumulate(loss_fn: Callable, params, micro_batches, count, axis: str):
    """Σ of the first `count` micro-batch gradients of `loss_fn(params, mb) -> loss` and Σ of their
    losses (inside shard_map: `params` typed varying over `axis`)."""
    grad_fn = jax.value_and_grad(loss_fn)
    zeros = jax.tree.map(jnp.zeros_like, params)
    l_zero = jax.lax.pcast(jnp.zeros(()), axis, to="varying")

    def body(carry, xs):
        g_sum, l_sum = carry
        i, mb = xs
        loss, g = grad_fn(params, mb)
        use = (i < count).astype(loss.dtype)
        return (jax.tree.map(lambda a, b: a + use * b, g_sum, g), l_sum + use * loss), None

    m = jax.tree.leaves(micro_batches)[0].shape[0]
    (g_sum, l_sum), _ = jax.lax.scan(body, (zeros, l_zero), (jnp.arange(m), micro_batches))
    return g_sum, l_sum


@dataclasses.dataclass(frozen=True)
class Acco:
    """`loss_fn(params, micro_batch) -> mean loss`; `opt`: the ZeRO-1 optimiser; `mode` in MODES."""
    loss_fn: Callable
    opt: zero.ShardedOptimizer
    mode: str = "acco"

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode: unknown {self.mode!r}; use one of {', '.join(MODES)}")

    def _varying(self, params):
        return jax.tree.map(lambda p: jax.lax.pcast(p, self.opt.axis, to="varying"), params)

    def init(self, params, opt_state, micro_batches, count) -> AccoState:
        """Inside shard_map. The first gradients (at θ_0) fill `pending` (dpu, acco)."""
        g, _ = accumulate(self.loss_fn, self._varying(params), micro_batches, count, self.opt.axis)
        c = jnp.asarray(count, jnp.float32).reshape(1)
        if self.mode == "ddp":
            g, c = jax.tree.map(jnp.zeros_like, g), jnp.zeros_like(c)
        return AccoState(params, opt_state, jax.tree.map(lambda x: x[None], g), c)

    def step(self, state: AccoState, batches_1, count_1, batches_2, count_2):
        """One optimiser update (two rounds); returns (state, mean loss of the micro-batches computed).
        `batches_r`/`count_r`: this device's micro-batches of round r and how many it computes."""
        params, opt_state = state.params, state.opt_state
        pending = jax.tree.map(lambda x: x[0], state.pending)
        pc = state.pending_count[0]
        c1, c2 = jnp.asarray(count_1, jnp.float32), jnp.asarray(count_2, jnp.float32)
        acc = lambda p, b, c: accumulate(self.loss_fn, self._varying(p), b, c, self.opt.axis)  # noqa: E731
        if self.mode == "ddp":
            g1, l1 = acc(params, batches_1, c1)
            g2, l2 = acc(params, batches_2, c2)
            g = jax.tree.map(jnp.add, g1, g2)
            params, opt_state = self.opt.step(g, c1 + c2, opt_state, params)
            new_pending, new_pc = jax.tree.map(jnp.zeros_like, pending), jnp.zeros_like(pc)
        elif self.mode == "dpu":
            # communicate the gradients of θ_{t-1} while computing those of θ_t
            new_params, opt_state = self.opt.step(pending, pc, opt_state, params)
            g1, l1 = acc(params, batches_1, c1)
            g2, l2 = acc(params, batches_2, c2)
            params, new_pending, new_pc = new_params, jax.tree.map(jnp.add, g1, g2), c1 + c2
        else:
            estimate, _ = self.opt.step(pending, pc, opt_state, params)       # round 1, comm
            g1, l1 = acc(params, batches_1, c1)                               # round 1, compute
            g = jax.tree.map(jnp.add, pending, g1)
            new_params, opt_state = self.opt.step(g, pc + c1, opt_state, params)  # round 2, comm
            new_pending, l2 = acc(estimate, batches_2, c2)                    # round 2, compute
            params, new_pc = new_params, c2
        axis = self.opt.axis
        loss = jax.lax.psum(l1 + l2, axis) / jax.lax.psum(c1 + c2, axis)
        return AccoState(params, opt_state, jax.tree.map(lambda x: x[None], new_pending),
                         jnp.reshape(new_pc, (1,))), loss

    def specs(self, state: AccoState) -> AccoState:
        """shard_map specs of an AccoState (params replicated; the rest per device)."""
        ax = self.opt.axis
        return AccoState(P(), zero.state_specs(state.opt_state, ax),
                         jax.tree.map(lambda _: P(ax), state.pending), P(ax))

    def shard_mapped(self, mesh, example_params):
        """(init, step) as jitted shard_map'd functions over `mesh`. init(params, batches, counts);
        step(state, batches_1, counts_1, batches_2, counts_2) -> (state, loss). Batches: (n·M, mb, ...)
        split along axis 0 (device i gets rows i·M..(i+1)·M); counts: (n,) micro-batches per device."""
        ax = self.opt.axis
        opt_state = jax.eval_shape(self.opt.init, example_params)
        pend = jax.tree.map(lambda p: jax.ShapeDtypeStruct((1,) + p.shape, p.dtype), example_params)
        spec = self.specs(AccoState(example_params, opt_state, pend, None))

        def init(params, batches, counts):
            opt_state = self.opt.init(params)
            return jax.shard_map(lambda p, o, b, c: self.init(p, o, b, c[0]), mesh=mesh,
                                 in_specs=(P(), spec.opt_state, P(ax), P(ax)), out_specs=spec)(
                params, opt_state, batches, counts)

        def step(state, b1, c1, b2, c2):
            return jax.shard_map(lambda s, x1, n1, x2, n2: self.step(s, x1, n1[0], x2, n2[0]), mesh=mesh,
                                 in_specs=(spec, P(ax), P(ax), P(ax), P(ax)), out_specs=(spec, P()))(
                state, b1, c1, b2, c2)

        return jax.jit(init), jax.jit(step)
