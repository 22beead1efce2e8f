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
import functools
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


class Pending(NamedTuple):
    """A learner's ACCO state besides its ZeRO-1 optimiser state: per device, the gradient sum computed
    at the estimate θ̃ and not yet applied (leading axis: 1 per device, spec P(axis)) and its count."""
    grads: Any
    count: Any


LEARNER_MODES = ("off",) + MODES


def check_learner_mode(mode, zero_optimizer: bool) -> None:
    """A learner Config's `acco` field: one-line ValueError unless valid (ACCO runs on ZeRO-1)."""
    if mode not in LEARNER_MODES:
        raise ValueError(f"acco: unknown {mode!r}; use one of {', '.join(LEARNER_MODES)}")
    if mode != "off" and not zero_optimizer:
        raise ValueError(f"acco: {mode!r} runs on the sharded optimiser; also set zero_optimizer=true")


def pending_init(params, n: int) -> Pending:
    """No pending gradient: the first update uses only its own round-1 gradients."""
    return Pending(jax.tree.map(lambda p: jnp.zeros((n,) + jnp.shape(p), jnp.result_type(p)), params),
                   jnp.zeros((n,), jnp.float32))


def learner_update(loss_fn: Callable, opts, mesh, mode: str = "acco", axis: str = zero.DATA_AXIS):
    """ACCO for a shard_map'd learner, on ZeRO-1 optimisers (`opts` as in `zero.zero_update`).

    `loss_fn(params, batch, extra) -> (loss, aux)` (a mean over its batch). Per device, on its shard:
    "ddp": gradient at θ_t, then the sharded step (the zero-delay case: `zero.zero_update`'s numbers);
    "dpu": the sharded step with the pending gradient (computed at θ_{t-1}), the shard's gradient at θ_t
    becomes pending; "acco": the shard splits into two equal micro-batches, one per communication round
    (module docstring): estimate θ̃ from the pending gradient, half 1 at θ_t, the real step with
    pending + half 1, half 2 at θ̃ (pending for the next update) -- for a loss over in-batch negatives
    (CRL's InfoNCE) a micro-batch then has half the negatives. The first update has no pending
    gradient (count 0). Returns `f(params, opt_states, pending, batch, extra) -> (params, opt_states,
    pending, loss, aux)`, loss and aux `pmean`ed, those of the micro-batch(es) computed at θ_t."""
    if mode not in MODES:
        raise ValueError(f"acco: unknown mode {mode!r}; use one of {', '.join(MODES)}")
    value_and_grad = jax.value_and_grad(loss_fn, has_aux=True)

    opt_step = functools.partial(zero.step_groups, opts)   # (grads, count, states, params)

    def per_shard(params, opt_states, pending, batch, extra):
        grad = lambda p, b: value_and_grad(  # noqa: E731
            jax.tree.map(lambda x: jax.lax.pcast(x, axis, to="varying"), p), b, extra)
        add = lambda a, b: jax.tree.map(jnp.add, a, b)  # noqa: E731
        g_prev, c_prev = jax.tree.map(lambda x: x[0], pending.grads), pending.count[0]
        if mode == "acco":
            rows = jax.tree.leaves(batch)[0].shape[0]
            if rows % 2:
                raise ValueError(f"acco: the per-device batch ({rows}) must split into 2 micro-batches; "
                                 f"use a batch size divisible by 2 x the device count")
            half1, half2 = (jax.tree.map(lambda x: x[i * (rows // 2):(i + 1) * (rows // 2)], batch) for i in (0, 1))
            estimate, _ = opt_step(g_prev, c_prev, opt_states, params)        # round 1, communication
            (loss, aux), g1 = grad(params, half1)                               # round 1, compute
            new, opt_states = opt_step(add(g_prev, g1), c_prev + 1, opt_states, params)  # round 2
            (_, _), g_next = grad(estimate, half2)                              # round 2, compute
            c_next = 1.0
        else:  # the whole shard at θ_t, one micro-batch
            (loss, aux), g = grad(params, batch)
            if mode == "ddp":
                new, opt_states = opt_step(g, 1.0, opt_states, params)
                g_next, c_next = jax.tree.map(jnp.zeros_like, g), 0.0
            else:
                new, opt_states = opt_step(g_prev, c_prev, opt_states, params)
                g_next, c_next = g, 1.0
        loss, aux = jax.lax.pmean((loss, aux), axis)
        c_next = jax.lax.pcast(jnp.full((1,), c_next, jnp.float32), axis, to="varying")
        return new, opt_states, Pending(jax.tree.map(lambda x: x[None], g_next), c_next), loss, aux

    def f(params, opt_states, pending, batch, extra):
        state_spec = zero.group_state_specs(opts, opt_states, axis)
        pend_spec = Pending(jax.tree.map(lambda _: P(axis), pending.grads), P(axis))
        return jax.shard_map(per_shard, mesh=mesh, in_specs=(P(), state_spec, pend_spec, P(axis), P()),
                             out_specs=(P(), state_spec, pend_spec, P(), P()))(
            params, opt_states, pending, batch, extra)

    return f
