"""Run by tests/test_acco.py in a fresh process with 2 forced host devices (XLA_FLAGS before jax import).
Prints one JSON line: ACCO's zero-delay mode vs a plain optax step, a heterogeneous step vs the
single-device mean gradient, per-device state shapes, and loss curves of ddp / dpu / acco training of
the tiny decoder LM (scaling_rl/tiny_lm.py) at equal steps (the curves only with ACCO_CHECK_CURVES=1)."""
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=2").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from scaling_rl import acco, parallel, tiny_lm, zero  # noqa: E402

N, M, MB = 2, 2, 8           # devices, micro-batches per round per device, sequences per micro-batch
CFG = tiny_lm.LMConfig()
STEPS = int(os.environ.get("ACCO_CHECK_STEPS", "60"))
LR = float(os.environ.get("ACCO_CHECK_LR", "1e-2"))


def max_diff(a, b) -> float:
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def rounds(key):
    """Round-1 and round-2 micro-batches for all devices: two (N·M, MB, T) arrays."""
    k1, k2 = jax.random.split(key)
    return [tiny_lm.synthetic_batch(k, N * M * MB, CFG).reshape(N * M, MB, CFG.seq_len) for k in (k1, k2)]


def main():
    mesh = parallel.make_mesh(N)
    init_params, loss_fn = tiny_lm.make_lm(CFG)
    params = init_params(jax.random.PRNGKey(0))
    tx = optax.adam(LR)
    opt = zero.ShardedOptimizer(tx, N)
    full = jnp.full((N,), M, jnp.int32)
    out = {"devices": jax.device_count()}
    fns = {mode: acco.Acco(loss_fn, opt, mode).shard_mapped(mesh, params) for mode in acco.MODES}
    # Exact checks use SGD with momentum (a state to shard, linear in the gradient): Adam's first step
    # ~ lr·g/|g| turns float-rounding differences of near-zero gradient entries into lr-sized ones.
    exact_tx = optax.sgd(0.1, momentum=0.9)
    exact = acco.Acco(loss_fn, zero.ShardedOptimizer(exact_tx, N), "ddp").shard_mapped(mesh, params)

    # 1. zero delay (mode ddp) == a plain replicated optax Adam step on the mean gradient of all micro-batches
    b1, b2 = rounds(jax.random.PRNGKey(1))
    init, step = exact
    tx = exact_tx
    state, loss = step(init(params, b1, full), b1, full, b2, full)
    every = jnp.concatenate([b1, b2]).reshape(-1, CFG.seq_len)
    g = jax.grad(loss_fn)(params, every)
    ref = optax.apply_updates(params, tx.update(g, tx.init(params), params)[0])
    out["ddp_vs_optax"] = max_diff(state.params, ref)
    out["ddp_change"] = max_diff(state.params, params)
    out["ddp_loss_vs_direct"] = abs(float(loss) - float(loss_fn(params, every)))

    # 2. heterogeneous workers: device 0 computes 2 micro-batches per round, device 1 only 1
    counts = jnp.asarray([2, 1], jnp.int32)
    state, _ = step(init(params, b1, counts), b1, counts, b2, counts)
    used = jnp.concatenate([b[:2] for b in (b1, b2)] + [b[M:M + 1] for b in (b1, b2)]).reshape(-1, CFG.seq_len)
    g = jax.grad(loss_fn)(params, used)  # mean over the 6 micro-batches actually computed
    ref = optax.apply_updates(params, tx.update(g, tx.init(params), params)[0])
    out["hetero_vs_optax"] = max_diff(state.params, ref)
    out["hetero_vs_equal"] = max_diff(state.params, step(init(params, b1, full), b1, full, b2, full)[0].params)

    tx = optax.adam(LR)

    # 3. ACCO state per device: optimiser moments halved, pending gradients one copy per device
    init, step = fns["acco"]
    state = init(params, b1, full)
    state = step(state, b1, full, b2, full)[0]
    out["shapes"] = {"opt": [[list(x.shape), list(x.addressable_shards[0].data.shape)]
                             for x in jax.tree.leaves(state.opt_state)],
                     "pending": [[list(x.shape), list(x.addressable_shards[0].data.shape)]
                                 for x in jax.tree.leaves(state.pending)],
                     "params": [list(x.shape) for x in jax.tree.leaves(params)]}

    # 4. training curves at equal steps (same data stream for every mode): the learning comparison, run
    # only when asked (ACCO_CHECK_CURVES=1: tests/test_acco.py's slow test)
    if os.environ.get("ACCO_CHECK_CURVES", "0") != "1":
        print(json.dumps(out))
        return
    data = [rounds(jax.random.PRNGKey(100 + t)) for t in range(STEPS + 1)]
    curves = {}
    for mode, (init, step) in fns.items():
        state = init(params, data[0][0], full)
        losses = []
        for t in range(STEPS):
            state, loss = step(state, data[t + 1][0], full, data[t + 1][1], full)
            losses.append(float(loss))
        held_out = tiny_lm.synthetic_batch(jax.random.PRNGKey(999), 256, CFG)
        curves[mode] = {"train": losses, "eval": float(loss_fn(state.params, held_out))}
    out["curves"] = curves
    print(json.dumps(out))


if __name__ == "__main__":
    main()
