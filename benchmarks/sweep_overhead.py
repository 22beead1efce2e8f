"""Sweep engine overhead: per-trial cost beyond training, cold vs warm compilation cache, and
packed (one vmapped program) vs one-by-one trials.

    python benchmarks/sweep_overhead.py [--agent dqn --env gymnax/CartPole-v1] [--trials 4]

Every sweep runs through the real CLI in a fresh process (`scaling-rl sweep run`), so process
start, JAX import, claims and status writes are all counted. Lines printed:

    fixed_overhead_s=<CLI start + worker spawn>  per_trial_overhead_s=<slope over toy trials>
    real_trial_overhead_s=<wall_s - run_s of a real trial: claim, status, param count>
    cold_compile_s=... warm_compile_s=...   (train.run's startup_s: init + lower + compile)
    cold_trial_s=...   warm_trial_s=...     (the whole trial, fresh process each)
    one_by_one_s=...   packed_s=...         (K trials differing in seed and learning rate)
    packed_speedup=<one_by_one_s / packed_s>
    cold_sweep_s=... warm_sweep_s=... warm_whole_trial_speedup=<cold_sweep_s / warm_sweep_s>
                                        (one-trial sweeps, fresh process each: everything counted)
    warm_start_speedup=<cold_compile_s / warm_compile_s>     (final line; startup_s only: no process
                                        start, imports, make() or eval compile -- quote it beside
                                        warm_whole_trial_speedup)
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml


def sweep(tmp: Path, name: str, spec: dict, *, workers: int = 1, timeout: float = 900) -> float:
    """Run a spec through the CLI in a fresh process; returns its wall time in seconds."""
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "scaling_rl.cli", "sweep", "run", str(path),
                           "--workers", str(workers), "--no-progress"],
                          capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name}: sweep failed:\n{proc.stdout}\n{proc.stderr}")
    return wall


def statuses(out: Path) -> list[dict]:
    rows = []
    for d in sorted((out / "trials").iterdir()):
        st = json.loads((d / "trial_status.json").read_text())
        run = d / "status.json"
        st["train"] = json.loads(run.read_text()) if run.exists() else {}
        rows.append(st)
    return rows


def startup_s(status: dict) -> float:
    """train.run's time from start to a compiled first chunk (init + trace + lower + compile)."""
    summary = status["train"]["summary"]
    for key in ("startup_s", "compile_s"):
        if key in summary:
            return float(summary[key])
    raise KeyError(f"no startup time in train.run's summary: {sorted(summary)}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agent", default="dqn")
    ap.add_argument("--env", default="gymnax/CartPole-v1")
    ap.add_argument("--trials", type=int, default=4,
                    help="K trials for packed vs one-by-one (K/2 seeds x 2 learning rates; K even)")
    ap.add_argument("--env-steps", type=int, default=2000)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--toy-trials", type=int, default=20)
    ap.add_argument("--keep", action="store_true", help="keep the temporary stores")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="sweep_bench_"))
    try:
        # 1. engine overhead: toy trials that do no work; the slope between a small and a big
        # sweep is the per-trial cost, the intercept the fixed cost (process start, pool spawn)
        walls = {}
        for n in (2, args.toy_trials):
            out = tmp / f"toy{n}"
            walls[n] = sweep(tmp, f"toy{n}", {"agent": "toy", "out_dir": str(out), "compile_cache": False,
                                             "grid": {"width": list(range(1, n + 1))},
                                             "base": {"chunk_seconds": 0.0}})
        st = statuses(tmp / f"toy{args.toy_trials}")
        # engine time = sweep wall minus the time spent inside the trial function
        engine = {n: walls[n] - sum(s["run_s"] for s in statuses(tmp / f"toy{n}")) for n in walls}
        per_trial = (engine[args.toy_trials] - engine[2]) / (args.toy_trials - 2)
        print(f"toy_sweep_s: 2 trials {walls[2]:.2f}, {args.toy_trials} trials {walls[args.toy_trials]:.2f}",
              flush=True)
        print(f"fixed_overhead_s={engine[2] - 2 * per_trial:.2f}")
        print(f"per_trial_overhead_s={per_trial:.3f}")
        print(f"per_trial_claim_status_s={sum(s['wall_s'] - s['run_s'] for s in st) / len(st):.4f}",
              flush=True)

        base = {"env": args.env, "width": args.width, "depth": 1, "batch_size": 64,
                "learning_starts": 200, "chunk_env_steps": 500, "eval_episodes": 2,
                "buffer_size": 5000}
        real = {"agent": args.agent, "env_steps": args.env_steps, "seeds": 1, "base": base}

        # 2. cold vs warm persistent compilation cache (same shapes, different trial)
        cache = tmp / "jax_cache"
        cold_wall = sweep(tmp, "cold", {**real, "out_dir": str(tmp / "cold"), "compile_cache": str(cache),
                                        "grid": {"seed": [0]}})
        warm_wall = sweep(tmp, "warm", {**real, "out_dir": str(tmp / "warm"), "compile_cache": str(cache),
                                        "grid": {"seed": [1]}})
        cold, warm = statuses(tmp / "cold")[0], statuses(tmp / "warm")[0]
        cc, wc = startup_s(cold), startup_s(warm)
        print(f"real_trial_overhead_s={cold['wall_s'] - cold['run_s']:.3f}")
        print(f"cold_compile_s={cc:.2f} warm_compile_s={wc:.2f}", flush=True)
        print(f"cold_trial_s={cold['wall_s']:.2f} warm_trial_s={warm['wall_s']:.2f} "
              f"trial_speedup={cold['wall_s'] / warm['wall_s']:.2f}", flush=True)

        # 3. packed vs one-by-one: K trials differing in seed and η (each sweep with its own cold
        # cache); packed, they are one program whose seeds carry their own learning rates
        lrs = [1e-3, 3e-4] if args.trials >= 2 else [1e-3]
        grid = {"seed": list(range(max(1, args.trials // len(lrs)))), "lr": lrs}
        t_one = sweep(tmp, "one", {**real, "out_dir": str(tmp / "one"), "grid": grid,
                                   "compile_cache": str(tmp / "cache_one")})
        t_pack = sweep(tmp, "pack", {**real, "out_dir": str(tmp / "pack"), "grid": grid,
                                     "pack": True, "compile_cache": str(tmp / "cache_pack")})
        packs = {s.get("packed_in") for s in statuses(tmp / "pack")}
        if len(packs) != 1 or None in packs:
            raise SystemExit(f"pack: expected all trials in one pack, got {packs}")
        one = sorted(statuses(tmp / "one"), key=lambda s: s["started"])
        if len(one) > 1:  # later trials of one worker: warm cache and a warm process
            later = sum(startup_s(s) for s in one[1:]) / (len(one) - 1)
            print(f"in_worker_cold_startup_s={startup_s(one[0]):.2f} in_worker_warm_startup_s={later:.2f} "
                  f"in_worker_warm_start_speedup={startup_s(one[0]) / later:.2f}")
        n_trials = len(grid["seed"]) * len(grid["lr"])
        print(f"one_by_one_s={t_one:.2f} packed_s={t_pack:.2f} trials={n_trials} (seeds x lr {grid})")
        print(f"packed_speedup={t_one / t_pack:.2f}")
        # the headline's companion: the same cold/warm pair as whole one-trial sweeps (process start,
        # imports, make(), every compile incl. eval, training, writes), which is what a user waits for
        print(f"cold_sweep_s={cold_wall:.2f} warm_sweep_s={warm_wall:.2f} "
              f"warm_whole_trial_speedup={cold_wall / warm_wall:.2f}")
        print(f"warm_start_speedup={cc / wc:.2f}")
    finally:
        if args.keep:
            print(f"stores kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
