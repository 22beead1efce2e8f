"""Hogwild! Inference: tokens/s and cache memory vs naive view re-encoding and vs independent samples.

    python benchmarks/hogwild.py [--workers 2 4 8] [--prompts 4] [--tokens 48] [--reps 3]
                                 [--prompt-chars 0] [--hidden-size 128] [--num-layers 4] [--device cpu]

For each worker count W, the same total tokens (prompts x W x tokens, no early stop) are made by
- `hogwild`: W workers per prompt on one shared cache, queries rotated per block
  (`scaling_rl.llm.hogwild`, contiguous layout; `interleaved` with 8-token steps as well);
- `naive`: the same shared cache and the same numbers, but every step each worker's view is
  gathered contiguously and every key re-rotated to its view position, then the model's own
  attention runs (the cost the RoPE trick avoids);
- `independent`: ordinary KV-cached sampling of prompts x W rows (no sharing: each row sees only
  its own tokens; `rollout.sample`).
Ratios are hogwild / other tokens/s, per repetition (methods run back to back in each repetition,
the order rotated); shown as median [min, max] over `--reps`, by two clocks: the process's CPU
time (`time.process_time`, one torch thread: what the method computes, robust to other jobs on a
shared machine) and wall time. The Hogwild! step attends only over written slots (prompt, the
history so far, each block's first max(L) slots) with batched matmuls per (block, head). Memory: key/value bytes held at the end
(hogwild: its shared cache; independent: prompts x W rows x (prompt + tokens) positions; naive:
the shared cache plus the contiguous per-view copies one step materialises), computed from the
tensors' shapes; on CUDA the peak allocated bytes above the weights are shown too.
Last lines: `hogwild_over_independent_w<max W>=<median>` and `hogwild_over_naive_w<max W>=<median>`
(CPU-time clock).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = ["12+34=", "5*7+2=", "(3+4)*5=", "81-27=", "9*9-1=", "64/8+3=", "7+8*2=", "100-45="]


def _sync(device):
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--tokens", type=int, default=48, help="tokens per worker")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--prompt-chars", type=int, default=0,
                   help="lengthen every prompt to this many characters (a shared context)")
    p.add_argument("--hidden-size", type=int, default=128)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if min(args.workers) < 1 or args.prompts < 1 or args.tokens < 2 or args.reps < 1:
        print("hogwild benchmark: --workers >= 1, --prompts >= 1, --tokens >= 2, --reps >= 1",
              file=sys.stderr)
        return 2
    import torch

    from scaling_rl.llm import hogwild, rollout
    from scaling_rl.llm.models import load_policy
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model, tok = load_policy("tiny", hidden_size=args.hidden_size, num_layers=args.num_layers,
                             num_heads=args.num_heads)
    model = model.to(device).eval()
    texts = [PROMPTS[i % len(PROMPTS)] for i in range(args.prompts)]
    if args.prompt_chars:
        texts = [(t * args.prompt_chars)[-args.prompt_chars:] for t in texts]
    ids, mask = rollout.encode_prompts(tok, texts, device=device)
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    per_pos = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 4   # k + v, fp32
    T, B = args.tokens, args.prompts
    never = -1                                                          # no early stop

    def run(method, W, seed):
        gen = torch.Generator(device=device).manual_seed(seed)
        kw = dict(max_new_tokens=T, eos_id=never, pad_id=tok.pad_token_id, generator=gen)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        _sync(device)
        t0, c0 = time.perf_counter(), time.process_time()
        if method == "independent":
            rows_ids, rows_mask = ids.repeat_interleave(W, 0), mask.repeat_interleave(W, 0)
            rollout.sample(model, rows_ids, rows_mask, **kw)
            nbytes = per_pos * B * W * (ids.shape[1] + T)
        else:
            layout = "interleaved" if method == "interleaved" else "contiguous"
            _, cache = hogwild.generate(model, ids, mask, workers=W, layout=layout, step_tokens=8,
                                        naive=method == "naive", return_cache=True, **kw)
            nbytes = cache.cache_bytes() + (cache.view_bytes() if method == "naive" else 0)
        _sync(device)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        peak = torch.cuda.max_memory_allocated(device) - base if device.type == "cuda" else None
        return (B * W * T / cpu, B * W * T / wall), nbytes, peak

    methods = ["hogwild", "interleaved", "naive", "independent"]
    run("hogwild", 2, 0)                                                # warm-up
    print(f"model: tiny qwen2 hidden {args.hidden_size} x {args.num_layers} layers; {B} prompts of "
          f"{ids.shape[1]} tokens, {T} tokens per worker; ratios hogwild / other, median [min, max] over {args.reps} reps")
    header = ("W", "clock", "tok/s vs naive", "tok/s vs indep.", "interleaved vs naive",
              "interleaved vs indep.", "mem vs naive", "mem vs indep.")
    widths = (3, 5) + (22,) * 4 + (12, 13)
    print(" | ".join(f"{h:>{w}}" for h, w in zip(header, widths)))
    last = None
    for W in args.workers:
        tps = {m: [] for m in methods}
        mem, peak = {}, {}
        for r in range(args.reps):
            order = methods[r % len(methods):] + methods[:r % len(methods)]
            for m in order:
                tps[m].append(None)
                tps[m][-1], mem[m], peak[m] = run(m, W, r)

        def ratio(a, b, clock):
            x = np.array([v[clock] for v in tps[a]]) / np.array([v[clock] for v in tps[b]])
            return x, f"{np.median(x):.2f} [{x.min():.2f}, {x.max():.2f}]"
        for clock, name in ((0, "cpu"), (1, "wall")):
            hn, s_hn = ratio("hogwild", "naive", clock)
            hi, s_hi = ratio("hogwild", "independent", clock)
            _, s_in = ratio("interleaved", "naive", clock)
            _, s_ii = ratio("interleaved", "independent", clock)
            row = (str(W), name, s_hn, s_hi, s_in, s_ii, f"{mem['hogwild'] / mem['naive']:.2f}",
                   f"{mem['hogwild'] / mem['independent']:.2f}")
            print(" | ".join(f"{c:>{w}}" for c, w in zip(row, widths)), flush=True)
            if clock == 0:
                last = (W, float(np.median(hn)), float(np.median(hi)))
        if device.type == "cuda":
            print(f"   cuda peak bytes above weights: " +
                  ", ".join(f"{m} {peak[m] / 2**20:.1f} MiB" for m in methods))
    print(f"hogwild_over_independent_w{last[0]}={last[2]:.2f}")
    print(f"hogwild_over_naive_w{last[0]}={last[1]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
