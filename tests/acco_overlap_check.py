"""Run by tests/test_acco.py in a fresh process with 2 forced host devices (XLA_FLAGS before jax import).
Prints one JSON line about the overlapped ACCO learner (scaling_rl/acco.py `OverlappedAcco`): which
collectives its two programs contain, how many micro-batches each device computed while a round's
communication was in flight (with a simulated link latency and one slowed device), and three ACCO
updates with uneven per-device counts against the same updates computed by hand with plain optax."""
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=2").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from scaling_rl import acco, parallel, tiny_lm, zero  # noqa: E402

N, MB = 2, 4
CFG = tiny_lm.LMConfig(width=16, depth=1)
# per update: round-1 and round-2 micro-batch counts of (device 0, device 1); uneven on purpose
COUNTS = [[(2, 1), (1, 2)], [(1, 3), (2, 1)], [(3, 1), (1, 1)]]


def max_diff(a, b) -> float:
    a, b = jax.device_get((a, b))
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def collectives(text: str) -> list[str]:
    return sorted({op for op in ("all_reduce", "reduce_scatter", "all_gather") if f"stablehlo.{op}" in text})


def main():
    mesh = parallel.make_mesh(N)
    init_params, lm_loss = tiny_lm.make_lm(CFG)
    params = init_params(jax.random.PRNGKey(0))
    sample = jax.jit(lambda k: tiny_lm.synthetic_batch(k, MB, CFG))

    def loss_fn(p, tokens, _extra):
        loss = lm_loss(p, tokens)
        return loss, {"loss_again": loss}

    def source_for(u):
        return lambda d, k: sample(jax.random.fold_in(jax.random.PRNGKey(u), 100 * d + k))

    tx = optax.sgd(0.1, momentum=0.9)   # linear in the gradient: exact comparisons (see acco_check.py)
    learner = acco.OverlappedAcco(loss_fn, zero.ShardedOptimizer(tx, N), mesh, "acco")
    out = {"devices": jax.device_count()}

    # 1. three ACCO updates with the fixed uneven counts, vs the hand-computed ones
    state = learner.init(params, sample(jax.random.PRNGKey(0)))
    got, losses = [], []
    for u, counts in enumerate(COUNTS, 1):
        state, loss, aux = learner.update(state, source_for(u), fixed=counts)
        got.append(jax.device_get(state.params))
        losses.append((loss, float(aux["loss_again"])))
    out["counts_seen"] = learner.last_counts

    grad = jax.jit(jax.grad(lambda p, b: lm_loss(p, b)))
    lossj = jax.jit(lm_loss)

    def grad_sum(p, u, d, ks):
        return jax.tree.map(lambda *g: sum(g), *[grad(p, source_for(u)(d, k)) for k in ks]) if ks else None

    def add(*trees):
        trees = [t for t in trees if t is not None]
        return jax.tree.map(lambda *x: sum(x), *trees)

    def opt(p, s, g_sum, count):
        g = jax.tree.map(lambda x: x / max(count, 1), g_sum)
        upd, s = tx.update(g, s, p)
        return optax.apply_updates(p, upd), s

    theta, s = params, tx.init(params)
    pend, pend_n = jax.tree.map(jnp.zeros_like, params), 0
    ref, ref_loss = [], []
    for u, ((a0, a1), (b0, b1)) in enumerate(COUNTS, 1):
        estimate, _ = opt(theta, s, pend, pend_n)                                  # round 1: θ̃ (state dropped)
        g_now = add(grad_sum(theta, u, 0, range(a0)), grad_sum(theta, u, 1, range(a1)))   # at θ_t
        ref_loss.append(sum(float(lossj(theta, source_for(u)(d, k))) for d, c in ((0, a0), (1, a1))
                            for k in range(c)) / (a0 + a1))
        theta_new, s = opt(theta, s, add(pend, g_now), pend_n + a0 + a1)          # round 2: the update
        pend = add(grad_sum(estimate, u, 0, range(a0, a0 + b0)), grad_sum(estimate, u, 1, range(a1, a1 + b1)))
        pend_n = b0 + b1
        theta = theta_new
        ref.append(theta)
    out["vs_hand"] = [max_diff(g, r) for g, r in zip(got, ref)]
    out["change"] = [max_diff(r, params) for r in ref]
    out["loss_vs_hand"] = [abs(l - r) for (l, _), r in zip(losses, ref_loss)]
    out["aux_vs_loss"] = [abs(l - a) for l, a in losses]
    # the same updates with every count equal to 2: a different result (the counts matter)
    eq = acco.OverlappedAcco(loss_fn, zero.ShardedOptimizer(tx, N), mesh, "acco")
    st = eq.init(params, sample(jax.random.PRNGKey(0)))
    for u in range(1, len(COUNTS) + 1):
        st, _, _ = eq.update(st, source_for(u), fixed=[(2, 2), (2, 2)])
    out["equal_counts_vs_hand"] = max_diff(jax.device_get(st.params), ref[-1])

    # 2. zero1 (no overlap) with uneven counts == one optax step on the mean over the micro-batches used
    z = acco.OverlappedAcco(loss_fn, zero.ShardedOptimizer(tx, N), mesh, "zero1")
    zs = z.init(params, sample(jax.random.PRNGKey(0)))
    zs, _, _ = z.update(zs, source_for(1), fixed=[(3, 1)])
    zref, _ = opt(params, tx.init(params), add(grad_sum(params, 1, 0, range(3)), grad_sum(params, 1, 1, range(1))), 4)
    out["zero1_vs_hand"] = max_diff(jax.device_get(zs.params), zref)
    d = acco.OverlappedAcco(loss_fn, zero.ShardedOptimizer(tx, N), mesh, "ddp")
    ds = d.init(params, sample(jax.random.PRNGKey(0)))
    ds, _, _ = d.update(ds, source_for(1), fixed=[(3, 1)])
    out["ddp_vs_hand"] = max_diff(jax.device_get(ds.params), zref)

    # 3. the two programs: per-device accumulation has no collective; communication has the ZeRO-1 ones
    progs = learner.programs
    local = learner._local(state.params)
    acc_text = progs["accumulate"].lower(learner._zeros[0], local[0], sample(jax.random.PRNGKey(0)), None).as_text()
    comm_text = progs["communicate"].lower(
        learner._global([a[0] for a in state.pending]), jnp.ones((N,)), state.opt_state, state.params).as_text()
    out["programs"] = sorted(progs)
    out["accumulate_collectives"] = collectives(acc_text)
    out["communicate_collectives"] = collectives(comm_text)
    out["ddp_communicate_collectives"] = collectives(d.programs["communicate"].lower(
        d._global([a[0] for a in d._zeros]), jnp.ones((N,)), ds.opt_state, ds.params).as_text())

    # 4. overlap: a 0.4 s link; device 1 slowed 10x. Counts are decided by the communication finishing.
    learner.latency_s, learner.slowdown = 0.4, (1.0, 10.0)
    rounds = []
    for u in range(4, 6):
        state, _, _ = learner.update(state, source_for(u))
        rounds += learner.last_counts
    out["overlap_counts"] = rounds
    learner.close()
    eq.close()
    z.close()
    d.close()
    t0 = time.perf_counter()
    out["crl"] = crl_training()
    out["crl_seconds"] = time.perf_counter() - t0
    print(json.dumps(out))


def crl_training() -> dict:
    """5. The training path: CRL with overlap=true (host-driven chunks on OverlappedAcco)."""
    import dataclasses
    import tempfile

    import pandas as pd

    from scaling_rl import train
    from scaling_rl.agents import crl

    cfg = crl.Config(env="point_maze/open", num_envs=4, env_steps=64 + 2 * 64, learning_starts=64,
                     chunk_env_steps=64, utd=0.125, batch_size=16, width=16, depth=4, actor_width=8, actor_depth=4,
                     repr_dim=8, buffer_size=256, eval_episodes=1, episode_length=64, data_parallel=True,
                     zero_optimizer=True)
    r = {}
    # (a) ZeRO-1 run from the host with one micro-batch per device == the jitted ZeRO-1 chunk
    jitted = crl.make(cfg)
    host = crl.make(dataclasses.replace(cfg, overlap=True, overlap_micro=1))
    state = jax.jit(jitted.init)(jax.random.PRNGKey(3))
    a, chunk = state, jax.jit(jitted.chunk)
    b = jax.jit(lambda t: jax.tree.map(lambda x: x[None], t))(state)   # one seed, stacked
    for _ in range(2):
        a, ma = chunk(a)
        b, mb = host.host_chunk(b)
    a, b, state = jax.device_get((a, b, state))
    b1 = jax.tree.map(lambda x: x[0], b)
    r["host_vs_jitted_params"] = max_diff(a.learner.params, b1.learner.params)
    r["host_vs_jitted_loss"] = abs(float(ma["loss/critic"]) - float(mb["loss/critic"][0]))
    r["params_change"] = max_diff(a.learner.params, state.learner.params)
    r["grad_steps"] = [int(a.grad_steps), int(b1.grad_steps)]
    # the state keeps the init's layout (what a checkpoint restores into)
    r["same_layout"] = jax.tree.structure(b1) == jax.tree.structure(state) and all(
        x.shape == y.shape and x.dtype == y.dtype for x, y in zip(jax.tree.leaves(b1), jax.tree.leaves(state)))
    try:
        host.chunk(state)
    except ValueError as e:
        r["chunk_error"] = str(e)
    # (b) ACCO through train.run with a straggler: device 1 10x slower, a 20 ms link per round, at most
    # 6 micro-batches per device and round
    with tempfile.TemporaryDirectory() as tmp:
        acfg = dataclasses.replace(cfg, overlap=True, acco="acco", overlap_slowdown=10.0, overlap_latency_ms=20.0,
                                   overlap_max_micro=6)   # 2 chunks: the pending sums cross a chunk boundary
        df = train.run("crl", acfg, tmp, seeds=1, progress=False)
        status = json.loads(pd.io.common.Path(tmp, "status.json").read_text())
    r["status"] = status["status"]
    r["program_status"] = status["summary"]["program_cache"].get("chunk")
    r["micro_batches"] = [[float(x) for x in df[f"micro_batches/d{d}"]] for d in range(N)]
    r["finite"] = bool(np.isfinite(df["loss/critic"]).all())
    r["acco_grad_steps"] = [int(x) for x in df["grad_steps"]]
    return r


if __name__ == "__main__":
    main()
