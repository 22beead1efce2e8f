"""Run by tests/test_zero.py in a fresh process with 4 forced host devices (XLA_FLAGS must be set before
jax is imported). Prints one JSON line: ZeRO-1 vs replicated data-parallel updates of CRL and SAC
(max abs differences after a few steps) and the per-device shapes of the sharded optimiser state."""
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=4").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import dataclasses  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

from scaling_rl import acco, parallel, replay, goal_replay, zero  # noqa: E402
from scaling_rl.agents import common, crl, sac  # noqa: E402

STEPS = 2


def max_diff(a, b) -> float:
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def on_mesh(tree, mesh, sharded: bool = False):
    """`tree` placed as the shard_map'd update returns it: replicated (`parallel.replicate`), or (optimiser
    state, ACCO's pending gradients) split along `data` as `zero.state_specs` says. An input placed
    otherwise (the init's single-device arrays) would make the second step compile the whole update again."""
    if not sharded:
        return parallel.replicate(tree, mesh)
    return jax.device_put(tree, jax.tree.map(lambda s: NamedSharding(mesh, s), zero.state_specs(tree)))


def run(update, learner, batches, keys):
    f = jax.jit(update)
    for b, k in zip(batches, keys):
        learner, aux = f(learner, b, k)
    size = f._cache_size()
    assert size == 1, f"the update compiled {size} times: place its input as it returns it (on_mesh)"
    return learner, aux


def same_shapes(a, b) -> bool:
    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        x.shape == y.shape and x.dtype == y.dtype for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def per_device_shapes(state, mesh):
    placed = on_mesh(state, mesh, sharded=True)
    return [[list(x.shape), list(x.addressable_shards[0].data.shape)] for x in jax.tree.leaves(placed)]


def main():
    mesh = parallel.make_mesh(4)
    out = {"devices": jax.device_count()}
    which = sys.argv[1:] or ["crl", "sac", "clip"]
    keys = [jax.random.PRNGKey(10 + i) for i in range(STEPS)]

    if "crl" in which:
        out["crl"] = check_crl(mesh, keys)
    if "sac" in which:
        out["sac"] = check_sac(mesh, keys)
    if "clip" in which:
        out["clip"] = check_clip(mesh)
    print(json.dumps(out))


def check_crl(mesh, keys):
    # CRL: deep-ish scanned encoder (8 Dense layers), whole update.
    cfg = crl.Config(env="point_maze/open", num_envs=4, env_steps=512, learning_starts=64, chunk_env_steps=64,
                     batch_size=32, width=16, depth=4, actor_width=8, actor_depth=4, repr_dim=8,
                     buffer_size=256, eval_episodes=1, episode_length=64)
    rep, zro = crl.make(cfg, mesh=mesh), crl.make(dataclasses.replace(cfg, zero_optimizer=True), mesh=mesh)
    state = jax.jit(rep.init)(jax.random.PRNGKey(0))
    # the ZeRO learner from the same params (saves compiling the second init); the agent's own ZeRO init
    # is checked to build the same state structure and shapes (traced, not compiled)
    opt = zero.ShardedOptimizer(common.make_adam(cfg.lr), 4)
    zlearner = state.learner.replace(opt_state=opt.init(state.learner.params))
    same = same_shapes(jax.eval_shape(zro.init, jax.random.PRNGKey(0)).learner, zlearner)
    zstate = state.replace(learner=zlearner)
    rlearner = on_mesh(state.learner, mesh)
    zlearner = on_mesh(zlearner, mesh).replace(opt_state=on_mesh(zlearner.opt_state, mesh, sharded=True))
    batches = [dict(zip(("state", "action", "goal"), (lambda n, f, _: (n["state"], n["action"], f["achieved"]))(
        *goal_replay.sample(state.buffer, jax.random.PRNGKey(20 + i), cfg.batch_size, cfg.gamma))))
        for i in range(STEPS)]
    a, ma = run(rep.update, rlearner, batches, keys)
    b, mb = run(zro.update, zlearner, batches, keys)
    # the learner flag acco=ddp|acco (scaling_rl/acco.py learner_update) from the same ZeRO-1 state
    acc = {}
    for mode in ("ddp", "acco"):
        agent = crl.make(dataclasses.replace(cfg, zero_optimizer=True, acco=mode), mesh=mesh)
        alearner = zlearner.replace(opt_state={"opt": zlearner.opt_state, "pending": on_mesh(
            acco.pending_init(state.learner.params, 4), mesh, sharded=True)})
        if mode == "acco":
            acc["init_same_shapes"] = same_shapes(jax.eval_shape(agent.init, jax.random.PRNGKey(0)).learner,
                                                  alearner)
        c, mc = run(agent.update, alearner, batches, keys)
        acc[mode] = {"vs_zero": max_diff(c.params, b.params), "metrics_vs_zero": max_diff(mc, mb),
                     "change": max_diff(c.params, state.learner.params),
                     "finite": bool(all(jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves((c, mc)))),
                     "pending_count": [float(x) for x in c.opt_state["pending"].count]}
        if mode == "acco":
            acc["pending_shapes"] = [[list(x.shape), list(x.addressable_shards[0].data.shape)]
                                     for x in jax.tree.leaves(c.opt_state["pending"].grads)]
    return {"params": max_diff(a.params, b.params), "metrics": max_diff(ma, mb),
                  "change": max_diff(a.params, state.learner.params),
                  "init_same_shapes": same, "acco": acc,
                  "shapes": per_device_shapes(zstate.learner.opt_state, mesh),
                  "rep_shapes": [list(x.shape) for x in jax.tree.leaves(state.learner.opt_state)]}



def check_sac(mesh, keys):
    # SAC with weight decay and a clipping norm small enough to clip: both must follow the global norm.
    small = dict(width=16, batch_size=32, num_envs=2, env_steps=256, learning_starts=128,
                 chunk_env_steps=32, buffer_size=256, val_buffer_size=64, eval_episodes=1)
    scfg = sac.Config(depth=2, weight_decay=0.1, max_grad_norm=0.05, **small)
    rep, zro = sac.make(scfg, mesh=mesh), sac.make(dataclasses.replace(scfg, zero_optimizer=True), mesh=mesh)
    state = jax.jit(rep.init)(jax.random.PRNGKey(0))
    L = state.learner
    adamw = lambda lr: zero.ShardedOptimizer(common.make_optimizer(lr, scfg.weight_decay, 0.0), 4)  # noqa: E731
    zlearner = {**L, "opt": {"actor": adamw(scfg.lr).init(L["actor"]), "critic": adamw(scfg.lr).init(L["critic"]),
                             "alpha": zero.ShardedOptimizer(common.make_adam(scfg.alpha_lr), 4).init(L["log_alpha"])}}
    same = same_shapes(jax.eval_shape(zro.init, jax.random.PRNGKey(0)).learner, zlearner)
    zstate = state.replace(learner=zlearner)
    zlearner = {**on_mesh(zlearner, mesh), "opt": on_mesh(zlearner["opt"], mesh, sharded=True)}
    batches = [replay.sample(state.replay, jax.random.PRNGKey(30 + i), scfg.batch_size) for i in range(STEPS)]
    a, ma = run(rep.update, on_mesh(state.learner, mesh), batches, keys)
    b, mb = run(zro.update, zlearner, batches, keys)
    nets_a = {k: a[k] for k in ("actor", "critic", "log_alpha")}
    nets_b = {k: b[k] for k in ("actor", "critic", "log_alpha")}
    # acco=acco trains SAC (actor, critic, temperature groups) from the same ZeRO-1 state
    agent = sac.make(dataclasses.replace(scfg, zero_optimizer=True, acco="acco"), mesh=mesh)
    nets0 = {k: L[k] for k in ("actor", "critic", "log_alpha")}
    c, mc = run(agent.update, {**zlearner, "acco_pending": on_mesh(acco.pending_init(nets0, 4), mesh, sharded=True)},
                batches, keys)
    nets_c = {k: c[k] for k in nets0}
    acc = {"change": max_diff(nets_c, nets0), "vs_zero": max_diff(nets_c, nets_b),
           "finite": bool(all(jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves((c, mc)))),
           "pending_count": [float(x) for x in c["acco_pending"].count]}
    out = {"params": max_diff(nets_a, nets_b), "metrics": max_diff(ma, mb),
                  "change": max_diff(nets_a, {k: state.learner[k] for k in nets_a}),
                  "shapes": per_device_shapes(zstate.learner["opt"], mesh), "init_same_shapes": same,
           "acco": acc}
    return out


def check_clip(mesh):
    """ZeRO-1 with max_grad_norm vs optax's clip_by_global_norm + SGD-momentum on the whole gradient (a
    gradient of norm ~ 10 against a threshold of 1, so clipping fires; a sharded leaf, a whole-kept
    odd-sized leaf and a scalar); also the unclipped update, which must differ."""
    import optax
    from jax.sharding import PartitionSpec as P
    params = {"w": jnp.arange(24.0).reshape(8, 3) / 10, "b": jnp.ones((3,)), "s": jnp.asarray(0.5)}
    grads_per_device = jax.tree.map(lambda p: jnp.stack([p * (i + 1) for i in range(4)]), params)
    out = {}
    for clip in (1.0, 0.0):
        tx = optax.sgd(1e-1, momentum=0.9)  # linear in g: Adam's first step would hide the scale
        opt = zero.ShardedOptimizer(tx, 4, max_grad_norm=clip)
        state = opt.init(params)

        def f(g, s, p):
            return opt.step(jax.tree.map(lambda x: x[0], g), 1, s, p)
        specs = zero.state_specs(state)
        new, _ = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("data"), specs, P()),
                                       out_specs=(P(), specs)))(grads_per_device, state, params)
        mean = jax.tree.map(lambda g: jnp.mean(g, 0), grads_per_device)
        ref_tx = optax.chain(optax.clip_by_global_norm(clip), tx) if clip else tx
        ref = optax.apply_updates(params, ref_tx.update(mean, ref_tx.init(params), params)[0])
        out["clipped" if clip else "unclipped"] = {"vs_optax": max_diff(new, ref), "new": new}
    out["clip_effect"] = max_diff(out["clipped"].pop("new"), out["unclipped"].pop("new"))
    out["grad_norm"] = float(optax.global_norm(jax.tree.map(lambda g: jnp.mean(g, 0), grads_per_device)))
    return out


if __name__ == "__main__":
    main()
