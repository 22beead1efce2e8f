"""Completions/s and time to a target accuracy: async (AReaL) and pipelined (PipelineRL) vs sync.

    python benchmarks/async_throughput.py [--steps 24] [--eta 2] [--target 0.0] [--out FILE.json]

Same SFT start, model, task (2-digit addition) and batch (16 prompts x 8) for every mode, one
process, run one after another. Wall time is the GRPO steps' own time (generation wait included;
the one-off worker start-up is reported separately). Time to target: wall time of the first
evaluation whose held-out sampled pass@1 reaches `--target` (default: the SFT start's pass@1 +
0.02); evaluations run only at the start and the end, so time to target is the end time or none. On this 2-core CPU the worker and the trainer share the cores, so overlap buys little;
`benchmarks/gpu/run.sh --sections f` runs GRPO on a GPU. Last line: `speedup_async_over_sync=<x>`
(trained-on completions/s of async over sync; generated/s is reported per mode too).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.async_rl import run_variant, sft_start  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--eta", type=int, default=2)
    p.add_argument("--target", type=float, default=0.0)
    p.add_argument("--task", default="addition")
    p.add_argument("--out", default="")
    p.add_argument("--device", default="cpu")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--prompts", type=int, default=16, help="prompts per step (x 8 completions)")
    args = p.parse_args(argv)
    extra = dict(device=args.device, bf16=args.bf16, hidden_size=args.hidden_size,
                 num_layers=args.num_layers, num_heads=args.num_heads,
                 prompts_per_step=args.prompts, torch_threads=1 if args.device == "cpu" else 4)
    # evaluate only at the start and the end: a worker keeps generating while the trainer
    # evaluates, which would credit the async modes with overlap that training alone lacks
    run_extra = dict(extra, eval_every=args.steps)
    import torch
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="async_bench_"))
    base = sft_start(work, args.task, 0, extra)
    results = {}
    for name, eta in (("sync", None), ("areal", args.eta), ("pipeline", args.eta)):
        t0 = time.perf_counter()
        df = run_variant(name, eta, work, base, args.task, args.steps, 0, run_extra)
        total = time.perf_counter() - t0
        steps = df[df["step"] > 0]
        wall = float(df["wall_s"].max())            # without the one-off worker start-up
        start = float(df.loc[df["step"] == 0, "eval/pass@1"].iloc[0])
        target = args.target or start + 0.02
        hit = df[(df["step"] > 0) & (df["eval/pass@1"] >= target)]
        results[name] = {
            # trained-on completions: `rollouts` also counts groups received ahead of their step
            "completions_per_s": float(steps["trained_on"].iloc[-1] / wall),
            "generated_per_s": float(steps["rollouts"].iloc[-1] / wall),
            "wall_s": wall, "startup_s": float(df["startup_s"].iloc[0]),
            "run_s_incl_startup_and_eval": total,
            "time_to_target_s": float(df.loc[hit.index[0], "wall_s"]) if len(hit) else None,
            "target": target, "pass@1_start": start,
            "pass@1_end": float(df["eval/pass@1"].dropna().iloc[-1]),
            "staleness_mean": float(steps["staleness_mean"].mean()),
        }
        print(name, json.dumps(results[name]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    sync = results["sync"]["completions_per_s"]
    print(f"speedup_pipeline_over_sync={results['pipeline']['completions_per_s'] / sync:.2f}")
    print(f"speedup_async_over_sync={results['areal']['completions_per_s'] / sync:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
