"""ACCO vs ZeRO-1 / DDP vs delayed updates without compensation: time per update and loss vs wall time,
with a communication delay comparable to compute and one slowed worker.

    python benchmarks/acco.py [--rho 1.0] [--slow 2.0] [--micro 4] [--updates 150] [--seeds 2] [--lr 1e-2]

Setting: the tiny decoder LM of scaling_rl/tiny_lm.py (2 blocks, width 32, vocabulary 16, sequences of
16 tokens, 8 sequences per micro-batch) trained with Adam on 2 forced CPU devices in ONE process
(`jax.shard_map` over axis `data`; scaling_rl/acco.py on a ZeRO-1 optimiser). Losses are real
training; wall time is MODELLED, because on forced host devices the collectives are memory copies
(no real communication to overlap) and this shared 2-core box's timings are noise:

- compute: one micro-batch on a worker takes t (the unit of time) on the fast worker and `slow`·t on
  the slowed one (worker 1);
- communication: one round (reduce-scatter of the gradient sum, sharded Adam step, all-gather of the
  parameters) takes T_c = rho · micro · t, i.e. `rho` times one update's compute on a fast worker;
  DDP's all-reduce moves the same bytes, so DDP and ZeRO-1 are one row (same update, same time; ZeRO-1
  only saves memory: benchmarks/zero_memory.py);
- ZeRO-1 / DDP: every worker computes `micro` micro-batches, then communicates: micro·slow·t + T_c;
- delayed (no compensation, "dpu"): communication of update t overlaps the `micro` micro-batches of
  update t+1: max(micro·slow·t, T_c);
- ACCO: two rounds per update, each lasting max(T_c, k_i·s_i·t) where worker i computes
  k_i = max(1, floor(T_c / (s_i·t))) micro-batches while the round's communication runs (so the slowed
  worker contributes fewer, and nobody waits for it unless one micro-batch is longer than T_c).

Every method runs until the modelled time reaches `updates` ZeRO-1 updates' worth; the held-out loss
(256 fresh sequences) is taken at 10 equally spaced times. Reported per method: time per update (and
its ratio to ZeRO-1), micro-batches per update, the held-out loss at half and full budget (mean over
seeds, [min, max] over seeds), and the time to first reach the worst ZeRO-1 seed's final loss (at the
10 checkpoints; "not reached" otherwise) as a fraction of the budget (ZeRO-1's time).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time


def schedule(method: str, micro: int, rho: float, slow: float):
    """(per-round micro-batch counts of worker 0 and 1, modelled time per update in units of t, mode)."""
    t_c = rho * micro
    if method == "zero1":
        return (micro // 2, micro // 2), micro * slow + t_c, "ddp"
    if method == "delayed":
        return (micro // 2, micro // 2), max(micro * slow, t_c), "dpu"
    ks = tuple(max(1, math.floor(t_c / s)) for s in (1.0, slow))
    return ks, 2 * max([t_c] + [k * s for k, s in zip(ks, (1.0, slow))]), "acco"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rho", type=float, default=1.0, help="communication round / one update's compute")
    ap.add_argument("--slow", type=float, default=2.0, help="slow-down of worker 1 (1 = homogeneous)")
    ap.add_argument("--micro", type=int, default=4, help="micro-batches per worker per ZeRO-1 update (even)")
    ap.add_argument("--updates", type=int, default=150, help="budget: this many ZeRO-1 updates' time")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-2)
    args = ap.parse_args(argv)
    if args.micro < 2 or args.micro % 2:
        print(f"--micro: must be an even integer >= 2, got {args.micro}", file=sys.stderr)
        return 2
    for key in ("rho", "lr"):
        if not getattr(args, key) > 0:
            print(f"--{key}: must be > 0, got {getattr(args, key)}", file=sys.stderr)
            return 2
    if args.slow < 1 or args.updates < 10 or args.seeds < 1:
        print("--slow must be >= 1, --updates >= 10, --seeds >= 1", file=sys.stderr)
        return 2
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_force_host_platform_device_count=2").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from scaling_rl import acco, parallel, tiny_lm, zero

    n, mb, cfg = 2, 8, tiny_lm.LMConfig()
    mesh = parallel.make_mesh(n)
    init_params, loss_fn = tiny_lm.make_lm(cfg)
    opt = zero.ShardedOptimizer(optax.adam(args.lr), n)
    eval_loss = jax.jit(loss_fn)
    held_out = tiny_lm.synthetic_batch(jax.random.PRNGKey(10_000), 256, cfg)
    methods = ("zero1", "delayed", "acco")
    plans = {m: schedule(m, args.micro, args.rho, args.slow) for m in methods}
    budget = args.updates * plans["zero1"][1]
    checkpoints = [budget * (i + 1) / 10 for i in range(10)]

    @jax.jit
    def batches(key, like):
        k_max = like.shape[0]
        k1, k2 = jax.random.split(key)
        return [tiny_lm.synthetic_batch(k, n * k_max * mb, cfg).reshape(n * k_max, mb, cfg.seq_len)
                for k in (k1, k2)]

    results = {m: [] for m in methods}
    step_seconds = []
    for m in methods:
        ks, per_update, mode = plans[m]
        init, step = acco.Acco(loss_fn, opt, mode).shard_mapped(mesh, init_params(jax.random.PRNGKey(0)))
        like, counts = jnp.zeros((max(ks),)), jnp.asarray(ks, jnp.int32)
        for seed in range(args.seeds):
            key = jax.random.PRNGKey(seed)
            params = init_params(jax.random.fold_in(key, 0))
            state = init(params, batches(jax.random.fold_in(key, 1), like)[0], counts)
            now, curve, u = 0.0, [], 0
            while now < budget:
                b1, b2 = batches(jax.random.fold_in(key, 2 + u), like)
                t0 = time.perf_counter()
                state, _ = step(state, b1, counts, b2, counts)
                if m == "zero1" and seed == 0 and u >= 3:
                    jax.block_until_ready(state.params)
                    step_seconds.append(time.perf_counter() - t0)
                now += per_update
                u += 1
                while len(curve) < len(checkpoints) and now >= checkpoints[len(curve)] - 1e-9:
                    curve.append(float(eval_loss(state.params, held_out)))
            results[m].append({"curve": curve, "updates": u})

    final_zero = float(np.max([r["curve"][-1] for r in results["zero1"]]))  # every ZeRO-1 seed reaches it

    def time_to(curve, target):
        for i, v in enumerate(curve):
            if v <= target:
                return checkpoints[i]
        return None

    def fmt(vals):
        return f"{np.mean(vals):.3f} [{min(vals):.3f}, {max(vals):.3f}]"

    t_mb = float(np.median(step_seconds)) / args.micro if step_seconds else float("nan")
    print(f"tiny decoder LM, Adam lr {args.lr}, 2 forced CPU devices in one process, {args.seeds} seeds; "
          f"modelled time: T_c = {args.rho} x {args.micro} t per communication round, worker 1 "
          f"{args.slow}x slower (measured t here ~ {t_mb * 1e3:.1f} ms, not used)")
    print(f"budget: {budget:.0f} t = {args.updates} ZeRO-1 updates; loss: held-out mean [min, max] over "
          f"seeds; target = worst ZeRO-1 seed's final loss {final_zero:.3f}; time to target: mean over seeds, "
          f"at 1/10-budget checkpoints, as a fraction of the budget")
    print(f"{'method':<22} {'t/update':>8} {'vs ZeRO-1':>9} {'mb/update':>9} {'updates':>7} "
          f"{'loss @ 1/2 budget':>22} {'loss @ budget':>22} {'time to target':>15}")
    names = {"zero1": "ZeRO-1 (= DDP)", "delayed": "delayed, no compens.", "acco": "ACCO"}
    for m in methods:
        ks, per_update, _ = plans[m]
        mbs = 2 * sum(ks)  # two rounds, both workers
        curves = [r["curve"] for r in results[m]]
        times = [time_to(c, final_zero) for c in curves]
        if all(t is not None for t in times):
            ttt = f"{np.mean(times) / budget:.2f} (seeds)"
        else:
            ttt = f"not reached {sum(t is None for t in times)}/{len(times)}"
        print(f"{names[m]:<22} {per_update:>8.1f} {per_update / plans['zero1'][1]:>9.2f} {mbs:>9d} "
              f"{int(np.mean([r['updates'] for r in results[m]])):>7d} {fmt([c[4] for c in curves]):>22} "
              f"{fmt([c[-1] for c in curves]):>22} {ttt:>15}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
