"""ACCO vs DDP vs ZeRO-1 through the learner the training path uses (scaling_rl/acco.py `OverlappedAcco`):
MEASURED wall time to a held-out loss, homogeneous workers and one slowed worker, side by side in one run.

    python benchmarks/acco.py [--budget 8] [--comm-ms 15] [--micro 4] [--mb 32] [--slow 2] [--lr 1e-2] [--seed 0]
                              [--plot benchmarks/results/acco.png]   # + held-out loss vs wall time, both settings

Setting: the tiny decoder LM of scaling_rl/tiny_lm.py (2 blocks, width 32, vocabulary 16, sequences of 16
tokens), Adam, on a mesh of 2 forced CPU devices in one process. Every method is the same
`OverlappedAcco` object with a different `mode`, so the compute program (`accumulate`, one micro-batch
gradient added to the device's sum, per device in its own host thread) and the communication program
(`communicate`, one shard_map'd collective step) are the same code for all three:
- DDP ("ddp"): `--micro` micro-batches per device, then psum of the sums + replicated Adam;
- ZeRO-1 ("zero1"): the same, with reduce-scatter, Adam on the device's half of the state, all-gather;
- ACCO ("acco"): two rounds per update; each dispatches `communicate` and every device accumulates
  micro-batches until it has finished (at least one), so the slowed worker contributes fewer and nobody
  waits for it; the update divides Σ sums by Σ counts.

Delay model: the in-process collective of ~30 k parameters takes well under a millisecond, so each
communication is dispatched `--comm-ms` after it is issued (`latency_s`: a host thread sleeps, then
dispatches; the same for every method): a latency-bound link. Slowed worker (`--slow s`): after each
micro-batch, device 1's thread sleeps (s - 1) x that micro-batch's measured compute time.

Every method runs for the same wall-clock budget after compiling (untimed warm-up update); a copy of the
parameters is kept after every update with its time stamp and the held-out loss (256 fresh sequences)
is evaluated afterwards, untimed, on a grid of 1/40 budgets. Reported per method: updates, wall time
per update, micro-batches per update per device, held-out loss at 1/2 and the full budget, and the wall
time to first reach a target loss (ZeRO-1's final loss in that setting; and `--target` if given) with
its ratio to DDP's and ZeRO-1's. One seed per run on a shared 2-core machine: both devices' threads and
every other process compete for the same 2 cores, which is the main reason overlap saves little here.
"""
from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

METHODS = ("ddp", "zero1", "acco")
NAMES = {"ddp": "DDP", "zero1": "ZeRO-1", "acco": "ACCO"}
GRID = 40


@functools.lru_cache(maxsize=None)
def _lm(mb: int):
    """The LM, its loss in the learner's signature and a micro-batch sampler: one object per run, so the
    compiled `accumulate` program is shared by every method."""
    import jax

    from scaling_rl import tiny_lm
    cfg = tiny_lm.LMConfig()
    init_params, lm_loss = tiny_lm.make_lm(cfg)

    def loss_fn(p, tokens, _extra):
        return lm_loss(p, tokens), {}
    return cfg, init_params, lm_loss, loss_fn, jax.jit(lambda k: tiny_lm.synthetic_batch(k, mb, cfg))


def run_method(method: str, slow: float, args) -> dict:
    """Train with `method` for `args.budget` seconds; the held-out loss curve on the time grid."""
    import jax
    import numpy as np
    import optax

    from scaling_rl import acco, parallel, tiny_lm, zero

    cfg, init_params, lm_loss, loss_fn, sample = _lm(args.mb)
    mesh = parallel.make_mesh(2)
    params0 = init_params(jax.random.PRNGKey(args.seed))
    root = jax.random.PRNGKey(10_000 + args.seed)

    def source_for(u):
        key = jax.random.fold_in(root, u)
        return lambda d, k: sample(jax.random.fold_in(key, 1000 * d + k))

    learner = acco.OverlappedAcco(loss_fn, zero.ShardedOptimizer(optax.adam(args.lr), 2), mesh, method,
                                  micro=args.micro, latency_s=args.comm_ms / 1e3, slowdown=(1.0, slow))
    warm = learner.init(params0, sample(root))
    for w in range(2):   # compile every program on every device (untimed)
        warm = learner.update(warm, source_for(10**6 + w))[0]
    jax.block_until_ready(warm.params)
    state = learner.init(params0, sample(root))
    counts, snaps, u = [], [], 0
    t_start = time.perf_counter()
    while time.perf_counter() - t_start < args.budget:
        state, _, _ = learner.update(state, source_for(u))
        jax.block_until_ready(state.params)
        snaps.append((time.perf_counter() - t_start, state.params))
        counts.append([sum(r[d] for r in learner.last_counts) for d in range(2)])
        u += 1
    learner.close()
    held_out = tiny_lm.synthetic_batch(jax.random.PRNGKey(999_999), 256, cfg)
    ev = jax.jit(lm_loss)
    curve, j = [], -1
    for i in range(1, GRID + 1):
        t = args.budget * i / GRID
        while j + 1 < len(snaps) and snaps[j + 1][0] <= t:
            j += 1
        curve.append(float(ev(jax.device_get(snaps[j][1]), held_out)) if j >= 0 else float(ev(params0, held_out)))
    times = [s[0] for s in snaps]
    return {"updates": len(snaps), "per_update": float(np.mean(np.diff([0.0] + times))),
            "mb_per_update": np.mean(counts, axis=0).tolist(), "curve": curve}


def time_to(curve: list[float], target: float, budget: float) -> float:
    """Seconds to the first grid point at or below `target` (inf if never)."""
    for i, v in enumerate(curve):
        if v <= target:
            return budget * (i + 1) / GRID
    return float("inf")


def table(res: dict, budget: float, target: float | None) -> list[str]:
    targets = [("ZeRO-1 final", res["zero1"]["curve"][-1])] + ([("--target", target)] if target else [])
    head = (f"{'method':<8} {'updates':>7} {'t/update':>9} {'mb/upd d0':>9} {'mb/upd d1':>9} "
            f"{'loss @ 1/2':>10} {'loss @ end':>10}")
    for name, v in targets:
        head += f" | t to {v:.3f} ({name}) {'vs DDP':>7} {'vs ZeRO-1':>9}"
    rows = [head]
    for m in METHODS:
        r, c = res[m], res[m]["curve"]
        row = (f"{NAMES[m]:<8} {r['updates']:>7d} {r['per_update'] * 1e3:>7.0f}ms {r['mb_per_update'][0]:>9.1f} "
               f"{r['mb_per_update'][1]:>9.1f} {c[GRID // 2 - 1]:>10.3f} {c[-1]:>10.3f}")
        for name, v in targets:
            t = {k: time_to(res[k]["curve"], v, budget) for k in METHODS}
            ratio = lambda a, b: f"{a / b:.2f}" if np.isfinite(a) and np.isfinite(b) else "n/a"  # noqa: E731
            cell = f"{t[m]:.1f} s" if np.isfinite(t[m]) else "not reached"
            row += f" | {cell:>{len(f't to {v:.3f} ({name})')}} {ratio(t[m], t['ddp']):>7} {ratio(t[m], t['zero1']):>9}"
        rows.append(row)
    return rows


def plot(results: dict, budget: float, path: str, title: str) -> None:
    """Held-out loss vs wall time per method, one panel per setting; the curves' JSON beside it (atomic)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from scaling_rl.io import atomic_write_text
    keys = list(results)
    fig, axes = plt.subplots(1, len(keys), figsize=(5.2 * len(keys), 3.8), sharey=True, squeeze=False)
    t = budget * np.arange(1, GRID + 1) / GRID
    for ax, key in zip(axes[0], keys):
        for m in METHODS:
            ax.plot(t, results[key][m]["curve"], marker="o", ms=2, label=NAMES[m])
        ax.set_title("homogeneous workers" if float(key) == 1.0 else f"device 1 slowed {float(key):g}x")
        ax.set_xlabel("wall time (s, measured)")
        ax.set_yscale("log")
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
    atomic_write_text(os.path.splitext(out)[0] + ".json", json.dumps(
        {"budget_s": budget, "grid": GRID, "curves": {k: {m: results[k][m]["curve"] for m in METHODS}
                                                      for k in keys}}, indent=1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=8.0, help="training seconds per method and setting")
    ap.add_argument("--comm-ms", type=float, default=15.0, help="simulated link latency per communication (ms)")
    ap.add_argument("--micro", type=int, default=4, help="micro-batches per device per update (DDP, ZeRO-1)")
    ap.add_argument("--slow", type=float, default=2.0, help="slow-down of device 1 in the heterogeneous setting")
    ap.add_argument("--mb", type=int, default=32, help="sequences per micro-batch")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", type=float, default=None, help="also report the wall time to this held-out loss")
    ap.add_argument("--plot", default=None, help="also write held-out loss vs wall time here (PNG) and its JSON")
    args = ap.parse_args(argv)
    for key, low in (("budget", 0.0), ("comm_ms", -1e-12), ("lr", 0.0)):
        if not getattr(args, key) > low:
            print(f"--{key.replace('_', '-')}: must be > {max(low, 0)}, got {getattr(args, key)}", file=sys.stderr)
            return 2
    if args.micro < 1 or args.mb < 1 or args.slow < 1:
        print(f"--micro and --mb must be >= 1 and --slow >= 1, got {args.micro}, {args.mb}, {args.slow}",
              file=sys.stderr)
        return 2
    results = {str(s): {m: run_method(m, s, args) for m in METHODS} for s in sorted({1.0, args.slow})}
    print(f"tiny decoder LM, Adam lr {args.lr}, seed {args.seed}; OverlappedAcco (the ACCO learner) on 2 forced CPU "
          f"devices in one process; MEASURED wall time; each communication = {args.comm_ms:g} ms simulated link "
          f"latency + the collective; DDP / ZeRO-1: {args.micro} micro-batches of {args.mb} sequences per device "
          f"per update; ACCO: until each round's communication is done")
    print(f"budget {args.budget:g} s of training per method; held-out loss at equal wall time; time to a target "
          f"loss on a 1/{GRID}-budget grid")
    for key, res in results.items():
        label = "homogeneous workers" if float(key) == 1.0 else f"device 1 slowed {float(key):g}x"
        print(f"\n{label}:")
        print("\n".join(table(res, args.budget, args.target)))
    if args.plot:
        plot(results, args.budget, args.plot, f"ACCO benchmark (OverlappedAcco), seed {args.seed}: 2 CPU devices, "
             f"{args.comm_ms:g} ms link, {args.budget:g} s per method")
        print(f"\nfigure: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
