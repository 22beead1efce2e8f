"""Trials per hour: a sweep whose trials share shapes, run packed (one vmapped program per pack,
scaling_rl/sweep/packing.py) vs one by one, side by side at 1, 8, 32 and 128 trials.

    python benchmarks/packed_trials.py [--sizes 1 8 32 128] [--out benchmarks/results/packed_trials.txt]

Each sweep is a real `run_sweep` of a spec (local backend, inline worker, the store written as always)
in a fresh Python process, so both variants pay their own start-up and compilation: trials/hour =
trials / wall seconds of that process's `run_sweep` × 3600. The trials differ in their first seed and
in lr (grid seed × lr, 1 seed each), the shapes are tiny DQN on gymnax CartPole (width 8, 2 chunks
of 4 env steps): the per-trial host work (program set-up, eval, checkpoints, parquet, store writes)
is what packing removes on a CPU, while on a GPU the launch-bound step is (docs/deep_stacks.md).
One run per cell on a shared CPU: other processes compete for the cores, so ratios are noisy (±20%).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BASE = dict(env="gymnax/CartPole-v1", width=8, depth=1, batch_size=4, env_steps=8 + 8,
            learning_starts=8, chunk_env_steps=4, buffer_size=64, val_buffer_size=8)
LRS = (1e-3, 3e-3)


def spec_dict(out: str, trials: int, pack: bool) -> dict:
    """`trials` trials of one seed each: seeds 0..⌈trials/2⌉-1 × the lrs (one lr when trials == 1)."""
    lrs = LRS[:1] if trials == 1 else LRS
    if trials % len(lrs):
        raise SystemExit(f"--sizes: {trials} is not a multiple of {len(lrs)}")
    return {"agent": "dqn", "out_dir": out, "seeds": 1, "pack": pack, "base": BASE,
            "grid": {"seed": list(range(trials // len(lrs))), "lr": list(lrs)}}


def one(trials: int, pack: bool, out: str) -> dict:
    """Run one sweep in this process; its wall seconds and how many programs (packs) it used."""
    from scaling_rl.sweep import run_sweep
    from scaling_rl.sweep.spec import parse_spec
    from scaling_rl.sweep.store import Store

    spec = parse_spec(spec_dict(out, trials, pack))
    t0 = time.perf_counter()
    run_sweep(spec, workers=0, progress=False)
    wall = time.perf_counter() - t0
    store = Store(spec.out_dir)
    states = [store.status(t.id).get("state") for t in spec.trials]
    packs = {store.status(t.id).get("packed_in") for t in spec.trials}
    return {"trials": trials, "pack": pack, "wall_s": wall, "done": states.count("done"),
            "programs": len(packs - {None}) + sum(store.status(t.id).get("packed_in") is None
                                                  for t in spec.trials)}


def measure(trials: int, pack: bool, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, __file__, "--one", str(trials), "--pack", str(int(pack)), "--dir", tmp]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True)
        except subprocess.TimeoutExpired:
            return {"trials": trials, "pack": pack, "wall_s": None, "done": None, "programs": None}
        except subprocess.CalledProcessError as e:
            raise SystemExit(f"sweep of {trials} trials (pack={pack}) failed: {e.stderr.strip().splitlines()[-1]}")
        return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per sweep before it is given up")
    ap.add_argument("--out", default=None, help="also write the table here")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--pack", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one is not None:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        print(json.dumps(one(a.one, bool(a.pack), str(Path(a.dir) / "s"))))
        return 0
    if any(k < 1 for k in a.sizes):
        raise SystemExit("--sizes: every size must be >= 1")
    import jax
    lines = [f"# packed trials vs one by one  ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
             f"{platform.node()}, {os.cpu_count()} CPUs, jax {jax.__version__} on {jax.default_backend()})",
             "# tiny DQN CartPole trials (1 seed each, grid seed x lr); wall = the whole run_sweep in a fresh process",
             f"{'trials':>7} {'alone s':>9} {'packed s':>9} {'programs':>9} {'alone tr/h':>11} "
             f"{'packed tr/h':>12} {'ratio':>7}"]
    print("\n".join(lines), flush=True)
    for k in a.sizes:
        alone, packed = measure(k, False, a.timeout), measure(k, True, a.timeout)
        for r in (alone, packed):
            if r["done"] is not None and r["done"] != k:
                raise SystemExit(f"{k} trials (pack={r['pack']}): only {r['done']} done")
        rate = [None if r["wall_s"] is None else k / r["wall_s"] * 3600 for r in (alone, packed)]
        ratio = f"{rate[1] / rate[0]:7.2f}" if None not in rate else "    n/a"
        fmt = lambda v, w, p: f"{v:{w}.{p}f}" if v is not None else f"{'>' + str(int(a.timeout)):>{w}}"  # noqa: E731
        line = (f"{k:7d} {fmt(alone['wall_s'], 9, 1)} {fmt(packed['wall_s'], 9, 1)} "
                f"{str(packed['programs']):>9} {fmt(rate[0], 11, 0)} {fmt(rate[1], 12, 0)} {ratio}")
        print(line, flush=True)
        lines.append(line)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
