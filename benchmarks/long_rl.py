"""Long-RL's MR-SP at micro scale: step time and peak memory per worker vs video length.

    python benchmarks/long_rl.py                         # frames 256..4096, P = 2, G = 4
    python benchmarks/long_rl.py --frames 256 1024 --world 4 --cap-mib 64

One measured step is the part of a GRPO step that MR-SP changes, all without gradients, for one
video and a group of G rollouts: encode the video, sample the G rollouts (prefill over the frame
tokens + question, then the answer tokens), then the old-policy and reference log-prob passes over
the G full sequences. Variants:

  naive     one process; the video is re-encoded for every use (each rollout, each pass's row)
  cache     one process; the video is encoded once and its frame tokens reused (MR-SP stage 1)
  cache+sp  P forked gloo processes; each encodes 1/P of the frames (all-gathered), samples G/P
            rollouts, and the two log-prob passes are sequence-parallel (MR-SP stage 2)

With `--train`, the measured step is instead the training forward + backward of one minibatch
of the G rollouts (the frame encoder frozen, as in GRPO; a weighted sum of the completion
log-probs as the loss): `train` in one process (`video_logprobs`) vs `train+sp` on P workers
(`sp_completion_logprobs(grad=True)`, backward, `all_reduce_grads`).

With `--trainer`, the measured step is `VideoGRPOTrainer`'s whole update on one group of G
rollouts (old and reference log-prob passes, `--minibatches` training forwards + backwards, the
optimizer steps), `sp_workers=1` vs `sp_workers=P`: the trainer's own path, with every rank's
peak resident-set rise over the update (`update_peak_kib`, reset at its start) and the fastest of
`--reps` updates after a warm-up update (the JAX objective compiles there). Otherwise each
configuration runs in freshly forked processes; "peak MiB" is the largest per-worker rise of the
resident set during the step over its resident set just before it (ru_maxrss - RSS before; the
allocator is set to return every block >= 64 KiB to the OS, so this tracks live tensors).
Times are the fastest of `--reps` steps after one warm-up step (the box is shared: the minimum is
the least disturbed), the slowest rank's for P workers. The box's other
load makes times noisy: compare ratios within one run.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time

import numpy as np
import torch

from scaling_rl.llm.models import char_tokenizer, tiny_model
from scaling_rl.llm.multimodal import EmbeddingCache, sample_video, split_range, video_lm_from, video_logprobs
from scaling_rl.llm.seq_parallel import launch, sp_completion_logprobs, video_pieces
from scaling_rl.llm.video_task import QUESTION, VideoCountTask


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _malloc_returns_large_blocks() -> None:
    """glibc: serve every block >= 64 KiB by mmap and never raise that threshold (by default it
    grows after frees, after which big tensors stay in the heap and the resident set stops tracking
    live memory)."""
    import ctypes
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD (setting it disables the dynamic rise)
        libc.mallopt(-1, 64 * 1024)  # M_TRIM_THRESHOLD
    except OSError:
        pass


def _step(rank, world, model, frames, variant, G, eos, pad, question, reps):
    """One benchmark step on this rank; returns (median seconds, peak MiB above the start RSS)."""
    _malloc_returns_large_blocks()
    gen = torch.Generator().manual_seed(rank)
    enc = model.frame_encoder

    def encode(cache, n_uses):
        if variant == "naive":  # re-encode per use
            tokens = [model.encode_frames(frames[None])[0] for _ in range(n_uses)]
            return torch.stack(tokens)
        return cache.gather([cache.put(0, frames)] * n_uses)

    def once():
        with torch.no_grad():
            cache = EmbeddingCache(model)
            rows = G if variant != "cache+sp" else split_range(G, world, rank)[1] - split_range(G, world, rank)[0]
            prefix = model.prefix_embeds(encode(cache, rows), question)
            b = sample_video(model, prefix, max_new_tokens=2, eos_id=eos, pad_id=pad, generator=gen,
                             record_logp=True)
            # every rank needs the G completions for the SP passes: all rollouts in one tensor
            comp = b.completion_ids
            if variant == "cache+sp":
                import torch.distributed as dist
                counts = [split_range(G, world, r)[1] - split_range(G, world, r)[0] for r in range(world)]
                width = max(counts)
                padded = torch.nn.functional.pad(comp, (0, 0, 0, width - comp.shape[0]), value=pad)
                parts = [torch.empty_like(padded) for _ in range(world)]
                dist.all_gather(parts, padded)
                comp = torch.cat([p[:c] for p, c in zip(parts, counts)])
            for _ in range(2):  # old policy and reference passes
                if variant == "cache+sp":   # each worker materialises only its slice
                    pieces = video_pieces(model, cache.get(cache.put(0, frames)), question, G)
                    sp_completion_logprobs(model, pieces, comp)
                else:
                    video_logprobs(model, model.prefix_embeds(encode(cache, G), question), comp)
        return cache

    once()  # warm-up: thread pools, kernels, allocator arenas (one-time, not counted)
    before = _rss_kib()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return min(times), max(0, peak - before) / 1024, enc.flops(len(frames))


def _train_step(rank, world, model, frames, variant, G, question, reps):
    """One training forward + backward on this rank; (fastest seconds, peak MiB above the start)."""
    _malloc_returns_large_blocks()
    from scaling_rl.llm.seq_parallel import all_reduce_grads
    model.frame_encoder.requires_grad_(False)
    comp = torch.randint(3, 20, (G, 4), generator=torch.Generator().manual_seed(0))
    weights = torch.randn(comp.shape, generator=torch.Generator().manual_seed(1))

    def once():
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            tokens = model.encode_frames(frames[None])[0]
        if variant == "train+sp":
            pieces = video_pieces(model, tokens, question, G)
            logp = sp_completion_logprobs(model, pieces, comp, grad=True)
        else:
            prefix = model.prefix_embeds(tokens[None].expand(G, -1, -1), question)
            logp, _ = video_logprobs(model, prefix, comp)
        (logp * weights).sum().backward()
        all_reduce_grads(model)

    once()
    before = _rss_kib()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return min(times), max(0, peak - before) / 1024, 0


def measure(model, task, n_frames, variant, world, G, reps):
    tok = char_tokenizer()
    problem = task.problems("train", 1, seed=0)[0]
    frames = torch.from_numpy(task.video(problem))
    question = torch.tensor(tok(QUESTION, add_special_tokens=False)["input_ids"])
    if variant.startswith("train"):
        out = launch(_train_step, world, model, frames, variant, G, question, reps)
    else:
        out = launch(_step, world, model, frames, variant, G, tok.eos_token_id, tok.pad_token_id,
                     question, reps)
    return max(o[0] for o in out), max(o[1] for o in out), out[0][2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    ap.add_argument("--world", type=int, default=2, help="P: sequence-parallel workers")
    ap.add_argument("--group", type=int, default=4, help="G: rollouts per video")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--frame-dim", type=int, default=64)
    ap.add_argument("--encoder-hidden", type=int, default=512)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--cap-mib", type=float, default=0.0,
                    help="per-worker memory cap (0: the cache variant's peak at the middle length)")
    ap.add_argument("--train", action="store_true",
                    help="measure a training forward + backward instead (train vs train+sp)")
    ap.add_argument("--trainer", action="store_true",
                    help="measure VideoGRPOTrainer's update, sp_workers=1 vs --world")
    ap.add_argument("--minibatches", type=int, default=2, help="--trainer: num_minibatches")
    a = ap.parse_args(argv)
    if a.world < 2 or a.group < a.world or any(f < 8 for f in a.frames):
        print("long_rl: need --world >= 2, --group >= --world and frames >= 8", file=sys.stderr)
        return 2
    tok = char_tokenizer()
    lm = tiny_model(tok, hidden_size=a.hidden, num_layers=a.layers, num_heads=4, seed=0)
    model = video_lm_from(lm, frame_dim=a.frame_dim, encoder_hidden=a.encoder_hidden,
                          frames_per_token=1).eval()
    lm_params = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("frame_encoder"))
    print(f"policy: LM {lm_params / 1e3:.0f}k params (hidden {a.hidden}, {a.layers} layers), frame encoder "
          f"{a.frame_dim}->{a.encoder_hidden}->{a.hidden} ({model.frame_encoder.flops(1) / 1e3:.0f} kFLOP/frame); "
          f"G={a.group}, P={a.world}, torch threads 1 per process, {os.cpu_count()} CPUs")
    rows = []
    frames = sorted(a.frames)
    if a.train:
        return _train_table(model, frames, a)
    if a.trainer:
        return _trainer_table(frames, a)
    for n in frames:
        task = VideoCountTask(frames=n, frame_dim=a.frame_dim)
        for variant, world in (("naive", 1), ("cache", 1), ("cache+sp", a.world)):
            t, mib, flops = measure(model, task, n, variant, world, a.group, a.reps)
            rows.append(dict(frames=n, tokens=n + len(QUESTION) + 1, variant=variant, workers=world,
                             step_s=t, peak_mib=mib))
            print(f"  frames {n:5d}  {variant:9s} P={world}  step {t:7.3f} s  peak/worker {mib:7.1f} MiB",
                  flush=True)
    import pandas as pd
    df = pd.DataFrame(rows)
    step = df.pivot(index="frames", columns="variant", values="step_s")
    mem = df.pivot(index="frames", columns="variant", values="peak_mib")
    print("\nstep time relative to naive (lower is faster) and peak MiB per worker:")
    print(f"{'frames':>7} {'cache/naive':>12} {'sp/naive':>9} {'sp/cache':>9} "
          f"{'MiB naive':>10} {'MiB cache':>10} {'MiB sp':>8} {'sp/cache MiB':>13}")
    for n in frames:
        s, m = step.loc[n], mem.loc[n]
        print(f"{n:7d} {s['cache'] / s['naive']:12.2f} {s['cache+sp'] / s['naive']:9.2f} "
              f"{s['cache+sp'] / s['cache']:9.2f} {m['naive']:10.1f} {m['cache']:10.1f} {m['cache+sp']:8.1f} "
              + (f"{m['cache+sp'] / m['cache']:13.2f}" if m["cache"] > 0.5 else f"{'n/a':>13}"))
    cap = a.cap_mib or float(mem["cache"].iloc[len(frames) // 2])
    fit = {v: [n for n in frames if mem.loc[n, v] <= cap] for v in ("naive", "cache", "cache+sp")}
    longest = {v: (max(f) if f else None) for v, f in fit.items()}
    print(f"\nmemory cap {cap:.1f} MiB per worker ({'given' if a.cap_mib else 'cache peak at the middle length'}):"
          " longest measured length that fits: " + ", ".join(
              f"{v} {longest[v] if longest[v] else 'none'}" + (" (the longest measured: may fit more)"
                                                               if longest[v] == frames[-1] else "")
              for v in longest))
    # per-worker peak is close to linear in length here: slope of a least-squares line through 0
    L = np.asarray(frames, dtype=float)
    slope = {v: float(L @ mem[v].to_numpy() / (L @ L)) for v in ("naive", "cache", "cache+sp")}
    print("frames at the cap from a line through 0 fitted to peak vs frames (an interpolation on the "
          "measured range, extrapolated beyond it): " + ", ".join(
              f"{v} {cap / slope[v]:.0f}" for v in slope)
          + f"; cache+sp / cache {slope['cache'] / slope['cache+sp']:.2f}x")
    common = [n for n in frames if all(n in f for f in fit.values())]
    if common:
        n = common[-1]
        print(f"speedup of cache+sp over naive at the longest length all fit ({n} frames): "
              f"{step.loc[n, 'naive'] / step.loc[n, 'cache+sp']:.2f}x (Long-RL reports up to 2.1x on 8 GPUs); "
              f"cache alone {step.loc[n, 'naive'] / step.loc[n, 'cache']:.2f}x")
    else:
        print("speedup at a common length: not identified (no length fits the cap in every variant)")
    n = frames[-1]
    print(f"at the longest measured length ({n} frames): naive/cache+sp {step.loc[n, 'naive'] / step.loc[n, 'cache+sp']:.2f}x, "
          f"naive/cache {step.loc[n, 'naive'] / step.loc[n, 'cache']:.2f}x")
    g = a.group
    print(f"encoder FLOPs per step: naive {3 * g} encodings, cache 1 ({3 * g - 1} saved per video), "
          f"cache+sp 1 split over {a.world} workers")
    return 0


def _train_table(model, frames, a) -> int:
    print(f"training forward + backward of G={a.group} rollouts (encoder frozen), fastest of {a.reps}; "
          f"peak MiB per worker above the resident set before the step")
    print(f"{'frames':>7} {'MiB train':>10} {'MiB train+sp':>13} {'sp/train MiB':>13} {'step sp/train':>14}")
    for n in frames:
        task = VideoCountTask(frames=n, frame_dim=a.frame_dim)
        t1, m1, _ = measure(model, task, n, "train", 1, a.group, a.reps)
        tp, mp, _ = measure(model, task, n, "train+sp", a.world, a.group, a.reps)
        print(f"{n:7d} {m1:10.1f} {mp:13.1f} " + (f"{mp / m1:13.2f}" if m1 > 0.5 else f"{'n/a':>13}")
              + f" {tp / t1:14.2f}", flush=True)
    return 0


def _trainer_update(n_frames: int, a, sp_workers: int) -> tuple[float, list[int]]:
    """(fastest update seconds, per-rank peak KiB of the last update) of a VideoGRPOTrainer."""
    from scaling_rl.llm.grpo_config import GRPOConfig
    from scaling_rl.llm.video_grpo import VideoGRPOTrainer
    cfg = GRPOConfig.from_dict(dict(
        multimodal="video", frames=n_frames, frame_dim=a.frame_dim, frame_encoder_hidden=a.encoder_hidden,
        hidden_size=a.hidden, num_layers=a.layers, sft_steps=1, sft_batch_size=2, prompts_per_step=1,
        group_size=a.group, num_minibatches=a.minibatches, num_iterations=1, beta=0.05, train_pool=8,
        eval_problems=2, sp_workers=sp_workers, torch_threads=1))
    torch.manual_seed(0)
    tr = VideoGRPOTrainer(cfg)
    tr.measure_update_memory = True
    try:
        tr.setup()
        tr.cache.clear()
        tr._cache_before = (0, 0)
        batch, _ = tr._rollout(tr.pool[:1])
        rewards = np.linspace(0, 1, a.group, dtype=np.float32)[None]   # every advantage non-zero
        times = []
        for i in range(a.reps + 1):
            t0 = time.perf_counter()
            tr._update(batch, rewards)
            if i:
                times.append(time.perf_counter() - t0)
        return min(times), list(tr.update_peak_kib)
    finally:
        tr.close()


def _trainer_table(frames, a) -> int:
    _malloc_returns_large_blocks()   # inherited by the forked workers
    torch.set_num_threads(1)
    print(f"VideoGRPOTrainer update of G={a.group} rollouts ({a.minibatches} minibatches, encoder frozen, "
          f"KL to the reference), fastest of {a.reps} after a warm-up; peak MiB per rank over the update")
    print(f"{'frames':>7} {'MiB P=1':>8} {'MiB per rank P=' + str(a.world):>22} {'max rank / P=1':>15} "
          f"{'update SP / P=1':>16}")
    for n in frames:
        t1, k1 = _trainer_update(n, a, 1)
        tp, kp = _trainer_update(n, a, a.world)
        m1, mp = k1[0] / 1024, [k / 1024 for k in kp]
        print(f"{n:7d} {m1:8.1f} {' / '.join(f'{m:.1f}' for m in mp):>22} "
              + (f"{max(mp) / m1:15.2f}" if m1 > 0.5 else f"{'n/a':>15}") + f" {tp / t1:16.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
