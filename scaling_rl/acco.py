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

`Acco` and `learner_update` run a whole update as ONE program (the numbers of ACCO, not its overlap);
`OverlappedAcco` (end of this file) runs separate compute and communication programs from the host,
overlapped, with run-time micro-batch counts per device (docs/acco.md).
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

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
    pending, loss, aux)`, loss and aux `pmean`ed, those of the micro-batch(es) computed at θ_t.
    Both rounds are one traced program with fixed counts: nothing overlaps on the host and no device can
    accumulate fewer micro-batches; `OverlappedAcco` below is the learner that does both."""
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


# ---- the overlapped learner: one host loop, separate compute and communication programs --------------
#
# Everything above runs inside ONE jitted shard_map: both rounds of an update, with a count fixed when the
# program is traced, so nothing can overlap on the host and no device can accumulate more or fewer
# micro-batches because of how long the communication takes. `OverlappedAcco` is the learner that does:
# per device a compiled `accumulate` program (one micro-batch gradient added to that device's sum; no
# collective) and one compiled `communicate` program (the ZeRO-1 step: reduce-scatter, sharded
# optimiser step, all-gather; a shard_map over the mesh). A round dispatches `communicate` (JAX returns at
# once: it runs asynchronously) and then, in one host thread per device, runs `accumulate` until that
# communication has finished; so every device computes while the collective runs, and a slow device
# simply contributes fewer micro-batches. The update divides Σ_devices sums by Σ_devices counts.

OVERLAP_MODES = ("ddp", "zero1", "acco")
# compiled programs shared by learners with the same loss / optimiser / mesh (jit caches per function object)
_PROGRAMS: dict = {}


# small host-side helpers as one program each (eager per-leaf ops would compile once per leaf and device)
_minus = jax.jit(lambda a, b: jax.tree.map(jnp.subtract, a, b))
_stack_rows = jax.jit(lambda rows: jax.tree.map(lambda *r: jnp.concatenate(r), *rows))
_split_rows = jax.jit(lambda g, n: [jax.tree.map(lambda x: x[d:d + 1], g) for d in range(n)], static_argnums=1)


class OverlapState(NamedTuple):
    """The overlapped learner's state (outside any shard_map). `params`: replicated global arrays;
    `opt_state`: ZeRO-1 layout (zero1, acco) or replicated (ddp); `pending`: per device (mesh order),
    its gradient / loss / aux sums at the estimate θ̃ not yet applied (acco; arrays on that device);
    `pending_count`: per device, how many micro-batches they hold."""
    params: Any
    opt_state: Any
    pending: tuple
    pending_count: tuple


class _Comm:
    """One dispatched communication round. `done()` without blocking; `result()` blocks. With a
    simulated link latency the dispatch waits that long in a host thread first (benchmarks)."""

    def __init__(self, fn, args, latency_s: float, pool):
        self._fut = self._out = None
        if latency_s > 0:
            self._fut = pool.submit(lambda: jax.block_until_ready((time.sleep(latency_s), fn(*args))[1]))
        else:
            self._out = fn(*args)

    def done(self) -> bool:
        if self._fut is not None:
            return self._fut.done()
        return all(x.is_ready() for x in jax.tree.leaves(self._out))

    def result(self):
        return self._fut.result() if self._fut is not None else self._out


@dataclasses.dataclass
class OverlappedAcco:
    """ACCO (and, for comparison on the same machinery, DDP and ZeRO-1) as a host-driven learner.

    `loss_fn(params, micro_batch, extra) -> (loss, aux)` (a mean over its micro-batch); `opts`: one
    `zero.ShardedOptimizer` over `mesh` (n devices along `axis`). `update(state, source, extra)` runs one
    optimiser update; `source(d, k)` returns micro-batch k (counted over the update) of device d (mesh
    order), as arrays placed on that device or host arrays (then copied there).

    mode "ddp": every device computes `micro` micro-batches at θ_t, then one collective (psum of the
    sums) and a replicated optax step; "zero1": the same with the ZeRO-1 step (reduce-scatter, sharded
    step, all-gather); "acco": two rounds, each a `communicate` dispatch overlapped with `accumulate`
    calls until it finishes (module docstring; at least `min_micro`, at most `max_micro` per device and
    round, `fixed` counts instead when given to `update`). `slowdown[d]` > 1 makes device d wait
    (s - 1) x each micro-batch's measured compute time after it (a slow worker, for benchmarks), and
    `latency_s` delays each communication's dispatch by that long in a host thread (a simulated link)."""
    loss_fn: Callable
    opts: zero.ShardedOptimizer
    mesh: Any
    mode: str = "acco"
    micro: int = 1
    min_micro: int = 1
    max_micro: int | None = None
    slowdown: tuple | None = None
    latency_s: float = 0.0
    axis: str = zero.DATA_AXIS

    def __post_init__(self):
        import concurrent.futures as cf

        if self.mode not in OVERLAP_MODES:
            raise ValueError(f"mode: unknown {self.mode!r}; use one of {', '.join(OVERLAP_MODES)}")
        if not isinstance(self.opts, zero.ShardedOptimizer):
            raise ValueError("opts: the overlapped learner takes one zero.ShardedOptimizer over all parameters")
        self.devices = list(self.mesh.devices.flat)
        n = len(self.devices)
        if self.opts.n != n:
            raise ValueError(f"opts: sharded {self.opts.n} ways, but the mesh has {n} devices along {self.axis!r}")
        for key in ("micro", "min_micro"):
            if int(getattr(self, key)) < 1:
                raise ValueError(f"{key}: must be >= 1, got {getattr(self, key)}")
        if self.max_micro is not None and self.max_micro < self.min_micro:
            raise ValueError(f"max_micro: {self.max_micro} is below min_micro {self.min_micro}")
        self.slowdown = tuple(float(s) for s in (self.slowdown or (1.0,) * n))
        if len(self.slowdown) != n or min(self.slowdown) < 1:
            raise ValueError(f"slowdown: one factor >= 1 per device ({n}), got {self.slowdown}")
        self._pool = cf.ThreadPoolExecutor(n + 1)
        self._programs: dict[str, Any] = {}
        self._warm: set[int] = set()   # devices whose accumulate program has run once (compiled)
        self._host_jits: dict[str, Any] = {}   # init's placement / zeros programs, built on first use
        self.last_counts: list[list[int]] = []   # per round of the last update: micro-batches per device

    # -- programs -----------------------------------------------------------------------------------
    def _accumulate_program(self):
        """(acc, params, micro_batch, extra) -> acc + (grads, loss, aux) of that micro-batch, acc's
        gradient leaves with a leading axis of 1 (the device's row of the (n, ...) array). No collective."""
        key = ("accumulate", self.loss_fn)
        if key in _PROGRAMS:
            self._programs["accumulate"] = _PROGRAMS[key]
        if "accumulate" not in self._programs:
            vg = jax.value_and_grad(self.loss_fn, has_aux=True)

            def acc_fn(acc, params, mb, extra):
                (loss, aux), g = vg(params, mb, extra)
                new = (jax.tree.map(lambda a, b: a + b[None], acc[0], g), acc[1] + loss,
                       jax.tree.map(lambda a, b: a + jnp.asarray(b, jnp.float32), acc[2], aux))
                return new
            self._programs["accumulate"] = _PROGRAMS[key] = jax.jit(acc_fn)
        return self._programs["accumulate"]

    def _communicate_program(self, opt_state):
        """(grad sums (n, ...) split over devices, counts (n,), opt state, params) -> (params, opt
        state): the whole communication of a round, one shard_map'd program."""
        key = ("communicate", self.opts, self.mesh, self.mode == "ddp", self.axis)
        if key in _PROGRAMS:
            self._programs["communicate"] = _PROGRAMS[key]
        if "communicate" not in self._programs:
            ax, opt = self.axis, self.opts
            if self.mode == "ddp":
                spec = jax.tree.map(lambda _: P(), opt_state)

                def step(g, c, s, p):
                    total = jnp.maximum(jax.lax.psum(c[0], ax), 1.0)
                    mean = jax.tree.map(lambda x: jax.lax.psum(x[0], ax) / total, g)
                    if opt.max_grad_norm and opt.max_grad_norm > 0:
                        mean, _ = optax.clip_by_global_norm(opt.max_grad_norm).update(mean, optax.EmptyState())
                    upd, s = opt.tx.update(mean, s, p)
                    return optax.apply_updates(p, upd), s
            else:
                spec = zero.state_specs(opt_state, ax)

                def step(g, c, s, p):
                    return opt.step(jax.tree.map(lambda x: x[0], g), c[0], s, p)
            self._programs["communicate"] = _PROGRAMS[key] = jax.jit(jax.shard_map(
                step, mesh=self.mesh, in_specs=(P(ax), P(ax), spec, P()), out_specs=(P(), spec)))
        return self._programs["communicate"]

    @property
    def programs(self) -> dict:
        """The compiled-on-first-use programs: {"accumulate": ..., "communicate": ...}."""
        return dict(self._programs)

    # -- state --------------------------------------------------------------------------------------
    def init(self, params, example_micro_batch, extra=None, opt_state=None) -> OverlapState:
        """The state at `params` (no pending gradient: the first update's estimate is θ_0 itself), with
        a fresh optimiser state unless `opt_state` (this mode's layout: ZeRO-1 for zero1 / acco, plain
        optax for ddp) is given."""
        self._aux_shape = jax.eval_shape(lambda p, b: self.loss_fn(p, b, extra)[1], params, example_micro_batch)
        rep = NamedSharding(self.mesh, P())
        if self.mode == "ddp":
            opt_state = jax.device_put(self.opts.tx.init(params) if opt_state is None else opt_state, rep)
        else:
            state = self.opts.init(params) if opt_state is None else opt_state
            # placed by one program (a device_put of each leaf would compile a slicing program per leaf),
            # built once per learner: init runs at every host chunk
            if "place" not in self._host_jits:
                self._host_jits["place"] = jax.jit(lambda x: x, out_shardings=jax.tree.map(
                    lambda s: NamedSharding(self.mesh, s), zero.state_specs(state, self.axis)))
            opt_state = self._host_jits["place"](jax.device_put(state, rep))
        if "zeros" not in self._host_jits:
            aux = self._aux_shape
            self._host_jits["zeros"] = jax.jit(lambda p: (
                jax.tree.map(lambda x: jnp.zeros((1,) + jnp.shape(x), jnp.result_type(x)), p),
                jnp.zeros((), jnp.float32), jax.tree.map(lambda a: jnp.zeros(a.shape, jnp.float32), aux)))
        z = self._host_jits["zeros"](params)
        self._zeros = [jax.device_put(z, d) for d in self.devices]
        return OverlapState(jax.device_put(params, rep), opt_state, tuple(self._zeros), (0,) * len(self.devices))

    def from_learner(self, params, opt_state, pending: Pending | None, example_micro_batch,
                     extra=None) -> OverlapState:
        """The state of a learner kept as single-device arrays between host chunks (a train state
        that is checkpointed and seed-stacked): `opt_state` in this mode's layout (ZeRO-1 for zero1 /
        acco, plain optax for ddp), `pending` (acco) the gradients waiting for the next update, rows
        per device (`pending_init`'s layout, also the fused `learner_update`'s)."""
        state = self.init(params, example_micro_batch, extra, opt_state)
        if self.mode != "acco" or pending is None:
            return state
        rows = tuple(jax.device_put((g, z[1], z[2]), dev) for dev, g, z in
                     zip(self.devices, _split_rows(pending.grads, len(self.devices)), self._zeros))
        counts = tuple(int(round(float(c))) for c in np.asarray(pending.count))
        return OverlapState(state.params, state.opt_state, rows, counts)

    def to_learner(self, state: OverlapState, device=None):
        """(params, opt_state, Pending) on one device (default: the mesh's first): the inverse of
        `from_learner` (pending rows stacked in mesh order; zeros for ddp / zero1)."""
        dev = device or self.devices[0]
        rows = jax.device_put([p[0] for p in state.pending], dev)
        grads = _stack_rows(rows)
        count = jax.device_put(np.asarray(state.pending_count, np.float32), dev)
        return (jax.device_put(state.params, dev), jax.device_put(state.opt_state, dev), Pending(grads, count))

    # -- one update ---------------------------------------------------------------------------------
    def _local(self, params):
        """Each device's own copy of replicated global `params`, in mesh order."""
        n, idx = len(self.devices), {d: i for i, d in enumerate(self.devices)}

        def per_device(leaf):
            out = [None] * n
            for s in leaf.addressable_shards:
                out[idx[s.device]] = s.data
            return out
        leaves, tree = jax.tree.flatten(params)
        cols = [per_device(x) for x in leaves]
        return [jax.tree.unflatten(tree, [c[d] for c in cols]) for d in range(n)]

    def _global(self, per_device_acc_grads):
        """(1, ...) leaves, one per device -> (n, ...) global arrays split over the mesh axis."""
        sharding = NamedSharding(self.mesh, P(self.axis))
        n = len(self.devices)
        return jax.tree.map(lambda *xs: jax.make_array_from_single_device_arrays(
            (n,) + xs[0].shape[1:], sharding, list(xs)), *per_device_acc_grads)

    def _work(self, d, params, acc, start_k, source, extra, comm, fixed):
        """Device d: accumulate micro-batches at `params` until `comm` is done (or `fixed` of them)."""
        step, dev, k = self._accumulate_program(), self.devices[d], 0
        if fixed is not None and fixed <= 0:
            return acc, 0
        while True:
            mb = jax.device_put(source(d, start_k + k), dev)
            t0 = time.perf_counter()
            acc = jax.block_until_ready(step(acc, params, mb, extra))
            if self.slowdown[d] > 1 and d in self._warm:   # a first call's compile time is not compute
                time.sleep((self.slowdown[d] - 1) * (time.perf_counter() - t0))
            self._warm.add(d)
            k += 1
            if fixed is not None:
                if k >= fixed:
                    return acc, k
            elif k >= self.min_micro and (comm.done() or (self.max_micro is not None and k >= self.max_micro)):
                return acc, k

    def _round(self, params, accs, start_ks, source, extra, comm, fixed):
        local = self._local(params)
        extras = [jax.device_put(extra, d) for d in self.devices]
        futs = [self._pool.submit(self._work, d, local[d], accs[d], start_ks[d], source, extras[d], comm,
                                  None if fixed is None else int(fixed[d])) for d in range(len(self.devices))]
        out = [f.result() for f in futs]
        return [a for a, _ in out], [k for _, k in out]

    def _communicate(self, state, accs, counts):
        fn = self._communicate_program(state.opt_state)
        g = self._global([a[0] for a in accs])
        c = jax.device_put(np.asarray(counts, np.float32), NamedSharding(self.mesh, P(self.axis)))
        return _Comm(fn, (g, c, state.opt_state, state.params), self.latency_s, self._pool)

    def update(self, state: OverlapState, source: Callable, extra=None, fixed=None):
        """One optimiser update -> (state, loss, aux): mean loss and aux over the micro-batches computed
        at θ_t (all of them for ddp / zero1, round 1's for acco). `fixed`: optional per-round per-device
        counts ((c_dev0, c_dev1, ...) for each of the rounds: 1 for ddp / zero1, 2 for acco) instead of
        'until the communication is done' (tests; ddp / zero1 default to `micro` each)."""
        n = len(self.devices)
        zeros, starts = list(self._zeros), [0] * n
        if self.mode != "acco":
            counts_fixed = fixed[0] if fixed is not None else (self.micro,) * n
            accs, counts = self._round(state.params, zeros, starts, source, extra, None, counts_fixed)
            params, opt_state = self._communicate(state, accs, counts).result()
            self.last_counts = [counts]
            now_accs, now_counts = accs, counts
            new = OverlapState(params, opt_state, state.pending, state.pending_count)
        else:
            # round 1: communicate the estimate θ̃ from the pending sums; accumulate at θ_t meanwhile,
            # on top of the pending sums (so round 2's communication takes pending + new)
            comm = self._communicate(state, state.pending, state.pending_count)
            accs1, c1 = self._round(state.params, list(state.pending), starts, source, extra, comm,
                                    None if fixed is None else fixed[0])
            estimate, _ = comm.result()
            counts1 = [pc + c for pc, c in zip(state.pending_count, c1)]
            # round 2: the real update from pending + round 1; accumulate at θ̃ meanwhile (next pending)
            comm = self._communicate(state, accs1, counts1)
            accs2, c2 = self._round(estimate, zeros, c1, source, extra, comm,
                                    None if fixed is None else fixed[1])
            params, opt_state = comm.result()
            self.last_counts = [c1, c2]
            # the loss / aux of round 1 alone: its sums minus the pending ones it started from
            now_accs = [(None,) + _minus((a[1], a[2]), (p[1], p[2])) for a, p in zip(accs1, state.pending)]
            now_counts = c1
            new = OverlapState(params, opt_state, tuple(accs2), tuple(c2))
        total = float(max(sum(now_counts), 1))
        loss = sum(float(a[1]) for a in now_accs) / total
        aux = jax.tree.map(lambda *xs: sum(np.asarray(x) for x in xs) / total, *[a[2] for a in now_accs])
        return new, loss, aux

    def close(self) -> None:
        """Stop the host threads."""
        self._pool.shutdown()
