"""Trained-on completions/s of async (AReaL) and pipelined (PipelineRL) GRPO over sync, fairly.

    python benchmarks/async_throughput.py [--task countdown] [--steps 14] [--warmup 4]
        [--repeats 3] [--eta 2] [--modes sync,async,pipeline,sync2] [--out FILE.json]

Same SFT start, model, task and batch (16 prompts x 8) for every mode, one process.
Fairness:
- same threads per role: generation runs on one torch thread and training on one in every mode
  (sync: one process doing both in turn; async/pipeline: a worker process generating while the
  trainer trains). `sync2` is sync given both of the box's threads (the other fair question:
  does async beat handing sync every core?).
- same accounting: throughput = completions trained on in steps warmup+1..steps over the sum of
  those steps' wall time (`step_s`: pull + update + weight publishing), for every mode. The first
  `--warmup` steps (worker start-up, JAX compilation, filling the worker's lead) are excluded
  for all modes alike; `end_to_end` ratios count every step from the first (worker start-up and
  compilation included). The worker may enter the window up to η steps ahead; the profile
  prints its lead so the bias can be read off.
- interleaved repeats: repeat r runs the modes in rotated order; ratios are per repeat (each mode
  against the sync run of the same repeat) and reported as median [min, max] over repeats.
Profile per step (window means): trainer `wait` (sync: generating), `train` (log-probs, loss,
backward, optimizer), `publish` (weights to the worker); worker `gen`, `load` (weights in),
`blocked` (by the staleness bound or a full queue).
CPU accounting (every process's CPU seconds, all threads): `cpu_per_step_async_over_sync` (> 1:
async wastes CPU: polling, shipping, oversubscribed threads) and
`one_core_per_role_speedup_async_over_sync` = sync's CPU per step over the slower role's (what
wall-clock would show with one idle core per role). On a shared machine the scheduler may give
this session a fixed CPU share however many processes it runs (Linux autogroups: one per
session), so async's two processes split what sync's one gets; the `share` column shows it.
Countdown's completions have heterogeneous lengths (expressions of 5 to 14 characters);
`experiments/async_rl.py` measures learning against wall-clock. Last line:
`speedup_async_over_sync=<median>`.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.async_rl import run_variant, sft_start  # noqa: E402

MODES = {  # name -> (variant in experiments/async_rl.py, η used, torch threads of the trainer)
    "sync": ("sync", None, 1),
    "sync2": ("sync", None, 2),
    "async": ("areal", "eta", 1),
    "pipeline": ("pipeline", "eta", 1),
}


def window_stats(df, warmup: int) -> dict:
    """Throughput and per-step profile over steps warmup+1..last (and end to end from step 1)."""
    steps = df[df["step"] > 0].set_index("step")
    win = steps[steps.index > warmup]
    n = len(win)
    first = steps.loc[warmup] if warmup > 0 else None

    def done(col):  # cumulative counter over the window
        base = float(first[col]) if first is not None and col in steps else 0.0
        return float(win[col].iloc[-1]) - base if col in steps else float("nan")

    wait = win["generation_s"]
    publish = win["publish_s"] if "publish_s" in win else wait * 0
    out = {
        "completions_per_s": done("trained_on") / float(win["step_s"].sum()),
        "generated_per_s": done("rollouts") / float(win["step_s"].sum()),
        "end_to_end_per_s": float(steps["trained_on"].iloc[-1]) / float(steps["step_s"].sum()),
        "step_s": float(win["step_s"].mean()),
        "trainer_wait_s": float(wait.mean()),
        "trainer_train_s": float((win["step_s"] - wait - publish).mean()),
        "trainer_publish_s": float(publish.mean()),
        "completion_len_mean": float(win["completions/mean_length"].mean()),
        "completion_len_max": float(win["completions/max_length"].max()),
        "staleness_mean": float(win["staleness_mean"].mean()),
        "steps_timed": n,
    }
    # CPU seconds per step by role: the trainer process (sync: generation + training) and the
    # worker process (generating; `worker_cpu_s` is the whole process, polling included)
    out["trainer_cpu_s"] = float(win["step_cpu_s"].mean())
    out["trainer_wait_cpu_s"] = float(win["generation_cpu_s"].mean())
    for k in ("gen_s", "load_s", "blocked_s", "gen_cpu_s", "cpu_s"):
        col = f"source/worker_{k}"
        if col in steps and first is not None and not steps[col].isna().any():
            out[f"worker_{k}"] = done(col) / n
    worker_cpu = out.get("worker_cpu_s", 0.0)
    # the CPU share this run got (CPU seconds per wall second; 2 = both cores of an idle box)
    out["cpu_share"] = (out["trainer_cpu_s"] + worker_cpu) / out["step_s"]
    # one idle core per role: a step takes as long as its slowest role's CPU time
    out["one_core_per_role_step_s"] = max(out["trainer_cpu_s"], worker_cpu)
    out["cpu_per_step_s"] = out["trainer_cpu_s"] + worker_cpu
    if "source/queued_groups" in win:
        out["worker_lead_groups_at_window_start"] = float(first["source/queued_groups"]) \
            if first is not None else 0.0
    return out


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values), "values": values}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="countdown")
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--eta", type=int, default=2)
    p.add_argument("--modes", default="sync,async,pipeline,sync2")
    p.add_argument("--prompts", type=int, default=16, help="prompts per step (x 8 completions)")
    p.add_argument("--base", default="", help="reuse this SFT start (a saved policy directory)")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    bad = [m for m in modes if m not in MODES]
    if bad or "sync" not in modes:
        p.error(f"--modes: {bad[0] if bad else 'sync'!r} " + ("is unknown" if bad else "is needed")
                + f"; use some of {', '.join(MODES)} with sync")
    if not 0 < args.warmup < args.steps:
        p.error(f"--warmup: {args.warmup} must be in [1, --steps)")
    import torch
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="async_bench_"))
    extra = dict(prompts_per_step=args.prompts, torch_threads=1)
    base = Path(args.base) if args.base else sft_start(work, args.task, 0, extra)
    # evaluations only before the first and after the last step (outside every step's time)
    run_extra = dict(extra, eval_every=args.steps, eval_problems=20, eval_samples=0)
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(args.repeats):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for m in order:
            name, eta, threads = MODES[m]
            label = f"r{r}_{m}"
            df = run_variant(name, args.eta if eta else None, work / label, base, args.task,
                             args.steps, 0, dict(run_extra, torch_threads=threads))
            shutil.rmtree(work / label, ignore_errors=True)
            stats = window_stats(df, args.warmup)
            runs[m].append(stats)
            print(f"repeat {r} {m:8s}", json.dumps({k: round(v, 4) if isinstance(v, float) else v
                                                   for k, v in stats.items()}), flush=True)
    result = {"task": args.task, "steps": args.steps, "warmup": args.warmup, "eta": args.eta,
              "prompts": args.prompts, "cpu_count": os.cpu_count(),
              "load_avg_at_end": os.getloadavg(), "runs": runs, "ratios": {}}
    cols = ("completions_per_s", "step_s", "trainer_wait_s", "trainer_train_s", "trainer_publish_s",
            "worker_gen_s", "worker_load_s", "worker_blocked_s", "trainer_cpu_s", "worker_gen_cpu_s",
            "worker_cpu_s", "cpu_share")
    print("\nper step, median over repeats (seconds; trainer wait = sync's generation; w. = worker; "
          "cpu = CPU seconds of the process, every thread; share = CPU s per wall s)")
    print(f"{'mode':9s} {'compl/s':>8s} {'step':>6s} {'wait':>6s} {'train':>6s} {'publish':>7s} "
          f"{'w.gen':>6s} {'w.load':>6s} {'w.block':>7s} {'cpu':>6s} {'w.gcpu':>6s} {'w.cpu':>6s} "
          f"{'share':>5s}")
    for m in modes:
        med = {k: statistics.median(s.get(k, float("nan")) for s in runs[m]) for k in cols}
        print(f"{m:9s} " + " ".join(f"{med[k]:{w}.{d}f}" for k, w, d in zip(
            cols, (8, 6, 6, 6, 7, 6, 6, 7, 6, 6, 6, 5), (1, 3, 3, 3, 4, 3, 4, 3, 3, 3, 3, 2))))
    for m in modes:
        if m == "sync":
            continue
        for key, col in (("", "completions_per_s"), ("end_to_end_", "end_to_end_per_s")):
            ratios = [a[col] / s[col] for a, s in zip(runs[m], runs["sync"])]
            result["ratios"][f"{key}speedup_{m}_over_sync"] = summary(ratios)
        if m == "async":
            # CPU accounting: total CPU per step (waste shows as > 1 / ratio < 1) and the speedup
            # one idle core per role would give (sync's CPU per step over the slowest role's)
            result["ratios"]["cpu_per_step_async_over_sync"] = summary(
                [a["cpu_per_step_s"] / s["cpu_per_step_s"] for a, s in zip(runs[m], runs["sync"])])
            result["ratios"]["one_core_per_role_speedup_async_over_sync"] = summary(
                [s["cpu_per_step_s"] / a["one_core_per_role_step_s"]
                 for a, s in zip(runs[m], runs["sync"])])
    for k, v in result["ratios"].items():
        print(f"{k}: median {v['median']:.2f} [min {v['min']:.2f}, max {v['max']:.2f}] "
              f"over {v['n']} interleaved repeats")
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} "
          f"on {os.cpu_count()} cores (wall-clock ratios need an idle box; CPU ratios do not)")
    if args.out:
        from scaling_rl import io as sio
        sio.atomic_write_json(args.out, result)
    if "async" in modes:
        print(f"speedup_async_over_sync={result['ratios']['speedup_async_over_sync']['median']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
