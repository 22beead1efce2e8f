"""Our GRPO step vs TRL's `GRPOTrainer` on the same tiny model, CPU only.

    python benchmarks/grpo_vs_trl.py [--rounds 12] [--block 4] [--warmup 2] [--loss-type dapo] [--out FILE.json]

Both sides: the same randomly initialised tiny Qwen2 (char tokenizer), the same prompts
(2-digit addition), G completions per prompt, the same max completion length, loss type,
ε, β = 0, μ = 1, one optimizer step per generation batch, single-threaded torch.

Interleaved (ABAB...): TRL's training loop drives; after each block of `--block` TRL steps a
callback runs `--block` of our steps, `--rounds` times, after `--warmup` steps of each. Per step
we record wall time and process CPU time (steadier on a shared machine: other jobs' time is not
counted). Per round: ratio = median TRL step / median our step. Reported: the median of the
per-round ratios, a 95% bootstrap interval of that median (rounds resampled, 2000 draws, seed 0)
and the [min, max] of the rounds, for wall and CPU time; a load change hits both sides of a round.

Loss check: one batch of fixed inputs (prompt/completion ids, masks, advantages, and perturbed
old log-probs so both clip edges are hit) is fed to TRL's `compute_loss` and to our objective
(log-probs from the same model + the JAX objective through the bridge), for every loss type.

Needs `trl` (benchmark-only dependency). Last line: `speedup_vs_trl=<x>`.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("WANDB_MODE", "disabled")
warnings.filterwarnings("ignore")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scaling_rl import io as sio  # noqa: E402
from scaling_rl.llm import objectives, rollout  # noqa: E402
from scaling_rl.bridge import torch_op  # noqa: E402
from scaling_rl.llm.models import load_policy, save_policy  # noqa: E402
from scaling_rl.llm.tasks import AdditionTask  # noqa: E402
from scaling_rl.llm.trainer import GRPOConfig, GRPOTrainer  # noqa: E402


MODEL_CPU = [0.0]   # process CPU seconds inside the policy's forward passes and backward so far


def meter_model_time(model_cls) -> None:
    """Count CPU time spent in `model_cls.forward` (every forward: generation, log-probs, the
    training pass) and in `torch.autograd.backward`, the model work both trainers share; the
    rest of a step is the trainer's own (tokenising, rewards, objective, optimizer, bookkeeping)."""
    import functools

    def metered(fn):
        @functools.wraps(fn)
        def inner(*a, **k):
            c0 = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                MODEL_CPU[0] += time.process_time() - c0
        return inner
    model_cls.forward = metered(model_cls.forward)
    torch.autograd.backward = metered(torch.autograd.backward)


def _clocks() -> tuple[float, float, float]:
    return time.perf_counter(), time.process_time(), MODEL_CPU[0]


def _since(t0) -> tuple[float, float, float]:
    return tuple(b - a for a, b in zip(t0, _clocks()))


def build_trl(model_dir, task, args, steps, after_step=None):
    """TRL's trainer for `steps` steps; `after_step(global_step)` runs after each step's timing."""
    import datasets
    import trl
    from transformers import TrainerCallback

    model, tok = load_policy(model_dir)
    problems = task.problems("train", 4096, seed=0)
    ds = datasets.Dataset.from_dict({"prompt": [p.prompt for p in problems],
                                     "key": [p.id for p in problems]})
    eos = tok.eos_token_id

    def addition_reward(prompts, completions, completion_ids, key, **_):
        return [task.reward(task.problem(k), c, eos in ids)
                for c, ids, k in zip(completions, completion_ids, key)]

    times: list[tuple[float, float, float]] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = _clocks()

        def on_step_end(self, args_, state, control, **k):
            times.append(_since(self.t0))
            if after_step is not None:
                after_step(state.global_step)

    cfg = trl.GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_bench_"), use_cpu=True, bf16=False, fp16=False,
        per_device_train_batch_size=args.prompts * args.group_size, gradient_accumulation_steps=1,
        num_generations=args.group_size, max_completion_length=args.max_len, temperature=1.0,
        top_p=1.0, learning_rate=args.lr, beta=0.0, num_iterations=1, epsilon=0.2,
        epsilon_high=0.2, loss_type=args.loss_type, scale_rewards="group", max_steps=steps,
        logging_steps=1, report_to="none", save_strategy="no", seed=0, disable_dropout=True,
        dataloader_num_workers=0, max_grad_norm=1.0, weight_decay=0.0, lr_scheduler_type="constant",
        log_completions=False,
        # our KL term is the plain k3 estimator; TRL >= 1.x multiplies it by the IS ratio by default
        use_bias_correction_kl=False)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=[addition_reward], args=cfg,
                              train_dataset=ds, processing_class=tok, callbacks=[StepTimer()])
    return trainer, times, trl.__version__


def build_ours(model_dir, args, steps) -> GRPOTrainer:
    cfg = GRPOConfig(init_from=str(model_dir), sft_steps=0, steps=steps, prompts_per_step=args.prompts,
                     group_size=args.group_size, max_completion_length=args.max_len, lr=args.lr,
                     loss_type=args.loss_type, beta=0.0, epsilon_low=0.2, epsilon_high=0.2,
                     num_iterations=1, scale_rewards="group", eval_problems=1)
    trainer = GRPOTrainer(cfg)
    trainer.setup()
    return trainer


def time_steps(trainer, n) -> list[tuple[float, float, float]]:
    """(wall s, process CPU s, CPU s in the model's passes) of each of `n` of our steps."""
    times = []
    for _ in range(n):
        t0 = _clocks()
        trainer.train_step()
        times.append(_since(t0))
    return times


def spread(ratios: list[float], draws: int = 2000) -> dict:
    """Median of per-round ratios, its 95% bootstrap interval (rounds resampled), min and max."""
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    return {"median": statistics.median(ratios), "ci95": [meds[int(0.025 * draws)], meds[int(0.975 * draws) - 1]],
            "min": min(ratios), "max": max(ratios), "rounds": len(ratios)}


def interleaved(model_dir, task, args):
    """TRL and our trainer stepping in alternating blocks; per-round step-time ratios."""
    total = args.warmup + args.rounds * args.block
    ours = build_ours(model_dir, args, total)
    meter_model_time(type(ours.model))
    torch.set_num_threads(args.threads)
    time_steps(ours, args.warmup)
    our_blocks: list[list[tuple[float, float, float]]] = []

    def after_trl_step(step):
        torch.set_num_threads(args.threads)  # accelerate may have changed it
        if step > args.warmup and (step - args.warmup) % args.block == 0:
            our_blocks.append(time_steps(ours, args.block))

    trl_trainer, trl_times, trl_version = build_trl(model_dir, task, args, total, after_trl_step)
    torch.set_num_threads(args.threads)
    trl_trainer.train()
    trl_blocks = [trl_times[args.warmup + r * args.block: args.warmup + (r + 1) * args.block]
                  for r in range(args.rounds)]
    if len(our_blocks) != args.rounds or any(len(b) != args.block for b in trl_blocks):
        raise RuntimeError(f"interleaving: {len(our_blocks)} of our blocks and {len(trl_times)} TRL "
                           f"steps for {args.rounds} rounds of {args.block}")
    return trl_trainer, trl_version, trl_blocks, our_blocks


def loss_check(trl_trainer, model, tok, task, args) -> dict[str, float]:
    """|our loss - TRL loss| on identical inputs, per loss type (also with β > 0)."""
    g = torch.Generator().manual_seed(3)
    problems = task.problems("test", args.prompts, seed=5)
    ids, mask = rollout.encode_prompts(tok, [p.prompt for p in problems for _ in range(args.group_size)])
    batch = rollout.sample(model, ids, mask, max_new_tokens=args.max_len, eos_id=tok.eos_token_id,
                           pad_id=tok.pad_token_id, generator=g)
    B, T = batch.completion_ids.shape
    adv = torch.randn(B, generator=g)
    with torch.no_grad():
        logp, _ = rollout.completion_logprobs(model, batch.prompt_ids, batch.prompt_mask,
                                              batch.completion_ids, batch.completion_mask)
    old = logp + 0.3 * torch.randn(B, T, generator=g)      # hits both clip edges
    ref = logp + 0.2 * torch.randn(B, T, generator=g)
    cmask = batch.completion_mask.float()
    num_items = cmask.sum()
    model.eval()
    diffs = {}
    for loss_type in objectives.LOSS_TYPES:
        for beta in (0.0, 0.04):
            trl_trainer.loss_type, trl_trainer.beta = loss_type, beta
            inputs = {"prompt_ids": batch.prompt_ids, "prompt_mask": batch.prompt_mask,
                      "completion_ids": batch.completion_ids, "completion_mask": batch.completion_mask,
                      "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": ref,
                      "num_items_in_batch": num_items}
            theirs = float(trl_trainer.compute_loss(model, inputs).detach())
            op = torch_op(objectives.objective_fn(loss_type, 0.2, 0.2, beta, args.max_len))
            lp, _ = rollout.completion_logprobs(model, batch.prompt_ids, batch.prompt_mask,
                                                batch.completion_ids, batch.completion_mask)
            ours = float(op(lp, old, ref, adv, cmask, num_items)[0].detach())
            diffs[f"{loss_type}/beta={beta}"] = abs(ours - theirs) / max(abs(theirs), 1e-8)
    return diffs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=12, help="interleaved TRL/ours rounds")
    p.add_argument("--block", type=int, default=4, help="steps of each side per round")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-len", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--loss-type", default="dapo", choices=objectives.LOSS_TYPES)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    for key in ("rounds", "block", "threads", "prompts", "max_len"):
        if getattr(args, key) < 1:
            print(f"--{key.replace('_', '-')}: {getattr(args, key)} must be >= 1", file=sys.stderr)
            return 2
    if args.warmup < 0 or args.group_size < 2:
        print("--warmup must be >= 0 and --group-size >= 2", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    task = AdditionTask(2)
    model_dir = Path(tempfile.mkdtemp(prefix="bench_model_"))
    model, tok = load_policy("tiny", seed=0)
    save_policy(model, tok, model_dir)

    trl_trainer, trl_version, trl_blocks, our_blocks = interleaved(model_dir, task, args)
    med = statistics.median
    result = {"trl_version": trl_version, "torch_threads": args.threads,
              "prompts": args.prompts, "group_size": args.group_size, "max_len": args.max_len,
              "loss_type": args.loss_type, "rounds": args.rounds, "block": args.block,
              "load_average": list(os.getloadavg())}
    for key, i in (("", 0), ("_cpu", 1)):   # wall time, process CPU time
        t_trl = [med(t[i] for t in b) for b in trl_blocks]
        t_ours = [med(t[i] for t in b) for b in our_blocks]
        result[f"trl_step{key}_s"] = med(t_trl)
        result[f"ours_step{key}_s"] = med(t_ours)
        name = "speedup_vs_trl" + ("_cpu_time" if key else "")
        sp = spread([a / b for a, b in zip(t_trl, t_ours)])
        result[name], result[name + "_spread"] = sp["median"], sp
    # where the CPU time goes: the model's passes (forwards + backward) vs the trainer's own work;
    # `bound_if_no_overhead`: TRL's step over our model time alone, the ratio with zero overhead
    for side, blocks in (("trl", trl_blocks), ("ours", our_blocks)):
        steps = [t for b in blocks for t in b]
        result[f"{side}_model_cpu_s"] = med(t[2] for t in steps)
        result[f"{side}_overhead_cpu_s"] = med(t[1] - t[2] for t in steps)
    result["bound_if_no_overhead"] = result["trl_step_cpu_s"] / result["ours_model_cpu_s"]

    diffs = loss_check(trl_trainer, trl_trainer.model, tok, task, args)
    max_rel = max(diffs.values())
    result.update({"loss_rel_diff": diffs, "loss_equal": max_rel < 1e-4})
    print(json.dumps(result, indent=2))
    if args.out:
        sio.atomic_write_json(args.out, result)
    print(f"loss_equal={result['loss_equal']} max_rel_diff={max_rel:.2e}")
    for name in ("speedup_vs_trl_cpu_time", "speedup_vs_trl"):
        sp = result[name + "_spread"]
        print(f"{name}={sp['median']:.2f} 95% CI [{sp['ci95'][0]:.2f}, {sp['ci95'][1]:.2f}] "
              f"range [{sp['min']:.2f}, {sp['max']:.2f}] over {sp['rounds']} rounds")
    print(f"CPU s per step: TRL {result['trl_step_cpu_s']:.4f} (model {result['trl_model_cpu_s']:.4f}, "
          f"rest {result['trl_overhead_cpu_s']:.4f}), ours {result['ours_step_cpu_s']:.4f} (model "
          f"{result['ours_model_cpu_s']:.4f}, rest {result['ours_overhead_cpu_s']:.4f}); with no "
          f"overhead of ours the ratio would be {result['bound_if_no_overhead']:.2f}")
    print(f"speedup_vs_trl={result['speedup_vs_trl']:.2f}")
    return 0 if result["loss_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
