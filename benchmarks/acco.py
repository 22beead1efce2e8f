"""ACCO vs DDP / ZeRO-1 vs delayed updates without compensation, MEASURED on 2 JAX processes: wall time
per update and held-out loss at equal wall time, with an injected communication delay, homogeneous
workers and one slowed worker.

    python benchmarks/acco.py [--budget 10] [--comm-ms 15] [--micro 4] [--mb 32] [--slow 2] [--lr 1e-2] [--seed 0]
                              [--plot benchmarks/results/acco.png]   # + held-out loss vs wall time, both settings

Setting: the tiny decoder LM of scaling_rl/tiny_lm.py (2 blocks, width 32, vocabulary 16, sequences of
16 tokens, 8 sequences per micro-batch), Adam, trained by 2 JAX processes of 1 CPU device each
(scaling_rl/multiprocess.py: coordinator on localhost, gloo CPU collectives). Every process computes
its micro-batch gradients on its own device (`jax.value_and_grad`, one micro-batch per call) and the
gradients cross processes only in the communication step, a jitted `shard_map` over the 2-process
mesh: DDP = psum of the gradient sums + replicated Adam; ZeRO-1 = scaling_rl/zero.py (reduce-scatter,
Adam on the process's half of the state, all-gather).

Delay model: gloo on localhost moves these ~30 k parameters in well under a millisecond, so every
communication round is made to take `--comm-ms` more: the communication thread sleeps that long on
the host, then runs the collective program (a latency-dominated link whose latency is the same for
every method). Overlap is real: the communication runs in a second host thread of each process
(`concurrent.futures`), and JAX releases the GIL while it runs, so the main thread keeps computing
micro-batch gradients during the sleep and the collective. Slowed worker (`--slow s`): after each of
its micro-batches, process 1 sleeps (s - 1) times that micro-batch's measured compute time.

Methods (M = `--micro` micro-batches per process per update where fixed):
- DDP, ZeRO-1: compute M micro-batches, then communicate (no overlap);
- delayed, no compensation (scaling_rl/acco.py's "dpu"): the communication of update t's gradients
  overlaps the M micro-batches of update t+1, computed at parameters one update old;
- ACCO (scaling_rl/acco.py's "acco"): two communication rounds per update (the estimate θ̃, then the
  real update); during each round every process computes micro-batches until the round's
  communication has finished (at least one), so the slowed worker contributes fewer and nobody waits
  for it; the update divides the summed gradients by the total count over both processes.

Every method runs for the same wall-clock budget (`--budget` seconds of training, after compiling;
process 0's clock decides, the stop flag travels with the collective); the delayed method and ACCO
start with one set of pending gradients computed before the clock starts (as their first update needs). Process 0 keeps a copy of the
parameters after every update with its time stamp; the held-out loss (256 fresh sequences) is
evaluated afterwards, untimed. Reported per method: updates done, measured wall time per update
(mean; its ratio to ZeRO-1's), micro-batches per update per process, the held-out loss at half and
at the full budget (equal wall time), and the time to first reach ZeRO-1's final loss, as a fraction
of the budget (checked at 1/20-budget steps). One seed per setting, on a shared 2-core machine: the
timings carry that machine's load (rerun to see the spread).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

METHODS = ("ddp", "zero1", "dpu", "acco")
NAMES = {"ddp": "DDP", "zero1": "ZeRO-1", "dpu": "delayed, no compens.", "acco": "ACCO"}
GRID = 20


def worker(args) -> None:
    """One of the 2 processes: every method in turn, each for `budget` seconds; prints one JSON line."""
    import concurrent.futures as cf

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.flatten_util import ravel_pytree
    from jax.sharding import NamedSharding, PartitionSpec as P

    from scaling_rl import multiprocess, parallel, tiny_lm, zero

    multiprocess.initialize()
    me, n, cfg = jax.process_index(), jax.process_count(), tiny_lm.LMConfig()
    mesh = parallel.make_mesh()
    ax = parallel.DATA_AXIS
    local_dev = jax.local_devices()[0]
    init_params, loss_fn = tiny_lm.make_lm(cfg)
    # the parameters travel as one flat vector, padded to a multiple of n (one bucket: one collective per
    # round instead of one per leaf; Adam is elementwise, and the padding's gradient is 0)
    flat0, unravel = ravel_pytree(init_params(jax.random.PRNGKey(0)))
    size, pad = flat0.size, (-flat0.size) % n

    def flat_params(seed):
        return jnp.pad(ravel_pytree(init_params(jax.random.PRNGKey(seed)))[0], (0, pad))

    def flat_loss(w, tokens):
        return loss_fn(unravel(w[:size]), tokens)

    tx = optax.adam(args.lr)
    opt = zero.ShardedOptimizer(tx, n)
    grad = jax.jit(jax.grad(flat_loss))
    add = jax.jit(jnp.add)
    sample = jax.jit(lambda k: tiny_lm.synthetic_batch(k, args.mb, cfg))
    slow = args.slow if me == 1 else 1.0

    def global_(x, spec):
        """A global array over the 2-process mesh from a value every process holds whole."""
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, NamedSharding(mesh, spec), lambda idx: x[idx])

    def per_process(x):
        """(n, ...) global array, row i = process i's `x`."""
        x = np.asarray(x)[None]
        return jax.make_array_from_process_local_data(NamedSharding(mesh, P(ax)), x, (n,) + x.shape[1:])

    def local(x):
        return x.addressable_shards[0].data

    def comm_fn(kind):
        """jit(shard_map): (grad sums (n, ...), counts (n,), opt state, params, stop (n,)) ->
        (params, opt state, any stop) -- one communication round."""
        def zero_step(g, c, s, p, stop):
            new_p, new_s = opt.step(g[0], c[0], s, p)
            return new_p, new_s, jax.lax.psum(stop[0], ax)

        def ddp_step(g, c, s, p, stop):
            total = jax.lax.psum(c[0], ax)
            mean = jax.lax.psum(g[0], ax) / total
            upd, s = tx.update(mean, s, p)
            return optax.apply_updates(p, upd), s, jax.lax.psum(stop[0], ax)

        if kind == "ddp":
            state_spec = jax.tree.map(lambda _: P(), tx.init(flat_params(0)))
            f = ddp_step
        else:
            state_spec = zero.state_specs(jax.eval_shape(opt.init, flat_params(0)), ax)
            f = zero_step
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P(ax), P(ax), state_spec, P(), P(ax)),
                                     out_specs=(P(), state_spec, P())))

    comms = {"ddp": comm_fn("ddp"), "zero1": comm_fn("zero1")}
    pool = cf.ThreadPoolExecutor(1)
    t_mb, t_comm = [], []

    def run(method: str, seed: int) -> dict:
        key = jax.random.fold_in(jax.random.PRNGKey(seed), me)   # each process its own data stream
        params0 = flat_params(seed)                              # the same initial parameters
        comm = comms["ddp" if method == "ddp" else "zero1"]
        if method != "ddp":
            opt_state = jax.tree.map(lambda x: global_(x, P(ax) if x.ndim else P()), opt.init(params0))
        else:
            opt_state = jax.tree.map(lambda x: global_(x, P()), tx.init(params0))
        params = global_(params0, P())
        zeros = jax.device_put(jnp.zeros_like(params0), local_dev)
        counter = [0]

        def micro(p):
            """One micro-batch gradient at (local) params p; the slowed worker then waits."""
            t0 = time.perf_counter()
            g = grad(p, sample(jax.random.fold_in(key, counter[0])))
            jax.block_until_ready(g)
            dt = time.perf_counter() - t0
            counter[0] += 1
            if slow > 1:
                time.sleep((slow - 1) * dt)
            t_mb.append(dt)
            return g

        def accumulate(p, k):
            g = zeros
            for _ in range(k):
                g = add(g, micro(p))
            return g

        def until(p, fut):
            """Micro-batches at p until `fut` is done (at least one)."""
            g, k = add(zeros, micro(p)), 1
            while not fut.done():
                g, k = add(g, micro(p)), k + 1
            return g, k

        def communicate(g, c, s, p, stop):
            time.sleep(args.comm_ms / 1e3)
            t0 = time.perf_counter()
            out = jax.block_until_ready(comm(per_process(g), per_process(np.float32(c)), s, p,
                                             per_process(np.float32(stop))))
            t_comm.append(time.perf_counter() - t0)
            return out

        # compile + warm every program (untimed; the collective also lines the processes up)
        jax.block_until_ready(accumulate(local(params), 1))
        communicate(zeros, 1, opt_state, params, 0)
        counts, snaps = [], []
        pending, pc = (accumulate(local(params), args.micro), args.micro) if method == "dpu" else (None, 0)
        if method == "acco":
            pending, pc = until(local(params), pool.submit(time.sleep, args.comm_ms / 1e3))
        t_start = time.perf_counter()
        stop = False
        while not stop:
            flag = int(me == 0 and time.perf_counter() - t_start >= args.budget)
            if method in ("ddp", "zero1"):
                g = accumulate(local(params), args.micro)
                params, opt_state, any_stop = communicate(g, args.micro, opt_state, params, flag)
                counts.append(args.micro)
            elif method == "dpu":
                fut = pool.submit(communicate, pending, pc, opt_state, params, flag)
                g = accumulate(local(params), args.micro)
                params, opt_state, any_stop = fut.result()
                pending, pc = g, args.micro
                counts.append(args.micro)
            else:
                fut = pool.submit(communicate, pending, pc, opt_state, params, 0)   # round 1: estimate
                g1, c1 = until(local(params), fut)
                estimate = fut.result()[0]
                fut = pool.submit(communicate, add(pending, g1), pc + c1, opt_state, params, flag)
                pending, c2 = until(local(estimate), fut)                           # round 2: the update
                params, opt_state, any_stop = fut.result()
                counts.append(c1 + c2)
                pc = c2
            stop = float(local(any_stop)) > 0
            if me == 0:
                snaps.append((time.perf_counter() - t_start, np.asarray(local(params))))
        out = {"updates": len(counts), "mb_per_update": float(np.mean(counts)),
               "wall": time.perf_counter() - t_start}
        if me == 0:
            held_out = tiny_lm.synthetic_batch(jax.random.PRNGKey(10_000), 256, cfg)
            ev = jax.jit(lambda w, x: loss_fn(unravel(w), x))
            curve, j = [], 0
            for i in range(1, GRID + 1):
                t = args.budget * i / GRID
                while j + 1 < len(snaps) and snaps[j + 1][0] <= t:
                    j += 1
                curve.append(float(ev(snaps[j][1][:size], held_out)) if snaps[j][0] <= t else float("nan"))
            out["curve"] = curve
            out["per_update"] = float(np.mean(np.diff([0.0] + [s[0] for s in snaps])))
        return out

    results = {}
    for slowdown in sorted({1.0, args.slow}):
        slow = slowdown if me == 1 else 1.0
        results[str(slowdown)] = {m: run(m, args.seed) for m in METHODS}
    results["t_mb"] = float(np.median(t_mb))
    results["t_comm"] = float(np.median(t_comm))
    print(json.dumps(results), flush=True)
    pool.shutdown()


def table(res: dict, res1: dict, budget: float) -> list[str]:
    import numpy as np

    target = res["zero1"]["curve"][-1]
    rows = [f"{'method':<22} {'updates':>7} {'t/update':>8} {'vs ZeRO-1':>9} {'mb/upd p0':>9} {'mb/upd p1':>9} "
            f"{'loss @ 1/2':>10} {'loss @ end':>10} {'time to ZeRO-1 final':>20}"]
    for m in METHODS:
        r, c = res[m], res[m]["curve"]
        hit = [i for i, v in enumerate(c) if v <= target]
        ttt = f"{(hit[0] + 1) / GRID:.2f}" if hit else "not reached"
        rows.append(f"{NAMES[m]:<22} {r['updates']:>7d} {r['per_update'] * 1e3:>6.0f}ms "
                    f"{r['per_update'] / res['zero1']['per_update']:>9.2f} {r['mb_per_update']:>9.1f} "
                    f"{res1[m]['mb_per_update']:>9.1f} {c[GRID // 2 - 1]:>10.3f} {c[-1]:>10.3f} {ttt:>20}")
    return rows


def plot(res: dict, budget: float, path: str, title: str) -> None:
    """Held-out loss vs wall time (the GRID checkpoints of process 0) per method, one panel per setting;
    the curves' JSON beside the figure (atomic writes)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from scaling_rl.io import atomic_write_text
    keys = sorted(k for k in res if k not in ("t_mb", "t_comm"))
    fig, axes = plt.subplots(1, len(keys), figsize=(5.2 * len(keys), 3.8), sharey=True, squeeze=False)
    t = budget * np.arange(1, GRID + 1) / GRID
    for ax, key in zip(axes[0], keys):
        for m in METHODS:
            ax.plot(t, res[key][m]["curve"], marker="o", ms=3, label=NAMES[m])
        ax.set_title("homogeneous workers" if float(key) == 1.0 else f"process 1 slowed {float(key):g}x")
        ax.set_xlabel("wall time (s, measured)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out loss")
    axes[0][0].legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    out = os.path.abspath(path)
    tmp = out + ".tmp.png"
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, out)
    curves = {key: {m: res[key][m]["curve"] for m in METHODS} for key in keys}
    atomic_write_text(os.path.splitext(out)[0] + ".json",
                      json.dumps({"budget_s": budget, "grid": GRID, "curves": curves}, indent=1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=10.0, help="training seconds per method and setting")
    ap.add_argument("--comm-ms", type=float, default=15.0, help="injected delay per communication round (ms)")
    ap.add_argument("--micro", type=int, default=4, help="micro-batches per process per update (DDP/ZeRO-1/delayed)")
    ap.add_argument("--slow", type=float, default=2.0, help="slow-down of process 1 in the heterogeneous setting")
    ap.add_argument("--mb", type=int, default=32, help="sequences per micro-batch")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", default=None, help="also write held-out loss vs wall time here (PNG) and its JSON")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for key, low in (("budget", 0.0), ("comm_ms", -1e-12), ("lr", 0.0)):
        if not getattr(args, key) > low:
            print(f"--{key.replace('_', '-')}: must be > {max(low, 0)}, got {getattr(args, key)}", file=sys.stderr)
            return 2
    if args.micro < 1 or args.mb < 1 or args.slow < 1:
        print(f"--micro must be >= 1 and --slow >= 1, got {args.micro}, {args.slow}", file=sys.stderr)
        return 2
    if args.worker:
        worker(args)
        return 0
    from scaling_rl import multiprocess

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update({"JAX_PLATFORMS": "cpu", multiprocess.ENV_COORDINATOR: f"127.0.0.1:{multiprocess.free_port()}",
                multiprocess.ENV_NUM_PROCESSES: "2"})
    argv_w = [sys.executable, os.path.abspath(__file__), *(argv if argv is not None else sys.argv[1:]), "--worker"]
    procs = [subprocess.Popen(argv_w, env={**env, multiprocess.ENV_PROCESS_ID: str(i)}, stdout=subprocess.PIPE,
                              text=True) for i in range(2)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        print(f"acco benchmark: a worker failed (exit codes {[p.returncode for p in procs]})", file=sys.stderr)
        return 1
    r0, r1 = (json.loads(o.strip().splitlines()[-1]) for o in outs)
    t_mb = r0["t_mb"]
    round_s = args.comm_ms / 1e3 + r0["t_comm"]
    print(f"tiny decoder LM, Adam lr {args.lr}, 2 JAX processes x 1 CPU device (gloo), seed {args.seed}; MEASURED wall "
          f"time; a communication round = injected host sleep {args.comm_ms:.0f} ms + the collective program "
          f"(median {r0['t_comm'] * 1e3:.1f} ms on process 0); {args.micro} micro-batches of {args.mb} sequences per "
          f"update, median micro-batch compute {t_mb * 1e3:.1f} ms on process 0: one round ~ "
          f"{round_s / (args.micro * t_mb):.2f}x one update's compute")
    print(f"budget {args.budget:.0f} s of training per method; loss: held-out, at equal wall time (1/2 budget, "
          f"budget); time to ZeRO-1's final loss as a fraction of the budget (1/{GRID} steps)")
    for key in sorted(k for k in r0 if k not in ("t_mb", "t_comm")):
        label = "homogeneous workers" if float(key) == 1.0 else f"process 1 slowed {float(key):g}x"
        print(f"\n{label}:")
        print("\n".join(table(r0[key], r1[key], args.budget)))
    if args.plot:
        plot(r0, args.budget, args.plot, f"ACCO benchmark, seed {args.seed}: 2 processes, round ~ "
             f"{round_s / (args.micro * t_mb):.2f}x an update's compute, {args.budget:.0f} s per method")
        print(f"\nfigure: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
