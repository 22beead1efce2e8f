"""Our GRPO step vs TRL's `GRPOTrainer` on the same tiny model, CPU only.

    python benchmarks/grpo_vs_trl.py [--steps 8] [--warmup 2] [--loss-type dapo] [--out FILE.json]

Both sides: the same randomly initialised tiny Qwen2 (char tokenizer), the same prompts
(2-digit addition), G completions per prompt, the same max completion length, loss type,
ε, β = 0, μ = 1, one optimizer step per generation batch, single-threaded torch.
Per-step wall time (and process CPU time, steadier on a shared machine) is measured after
`--warmup` steps; we report medians.

Loss check: one batch of fixed inputs (prompt/completion ids, masks, advantages, and perturbed
old log-probs so both clip edges are hit) is fed to TRL's `compute_loss` and to our objective
(log-probs from the same model + the JAX objective through the bridge), for every loss type.

Needs `trl` (benchmark-only dependency). Last line: `speedup_vs_trl=<x>`.
"""
from __future__ import annotations

import argparse
import json
import os
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


def build_trl(model_dir, task, args, steps):
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

    times: list[tuple[float, float]] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = (time.perf_counter(), time.process_time())

        def on_step_end(self, *a, **k):
            times.append((time.perf_counter() - self.t0[0], time.process_time() - self.t0[1]))

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


def time_ours(model_dir, args, steps) -> list[tuple[float, float]]:
    cfg = GRPOConfig(init_from=str(model_dir), sft_steps=0, steps=steps, prompts_per_step=args.prompts,
                     group_size=args.group_size, max_completion_length=args.max_len, lr=args.lr,
                     loss_type=args.loss_type, beta=0.0, epsilon_low=0.2, epsilon_high=0.2,
                     num_iterations=1, scale_rewards="group", eval_problems=1)
    trainer = GRPOTrainer(cfg)
    trainer.setup()
    times = []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        trainer.train_step()
        times.append((time.perf_counter() - t0, time.process_time() - c0))
    return times


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
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-len", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--loss-type", default="dapo", choices=objectives.LOSS_TYPES)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    task = AdditionTask(2)
    model_dir = Path(tempfile.mkdtemp(prefix="bench_model_"))
    model, tok = load_policy("tiny", seed=0)
    save_policy(model, tok, model_dir)

    total = args.warmup + args.steps
    trl_trainer, trl_times, trl_version = build_trl(model_dir, task, args, total)
    trl_trainer.train()
    torch.set_num_threads(args.threads)  # accelerate may have changed it
    ours = time_ours(model_dir, args, total)
    t_trl = statistics.median(t for t, _ in trl_times[args.warmup:])
    t_ours = statistics.median(t for t, _ in ours[args.warmup:])
    # CPU time of this process: less sensitive than wall time to other jobs on a shared box
    c_trl = statistics.median(c for _, c in trl_times[args.warmup:])
    c_ours = statistics.median(c for _, c in ours[args.warmup:])

    diffs = loss_check(trl_trainer, trl_trainer.model, tok, task, args)
    max_rel = max(diffs.values())
    result = {"trl_version": trl_version, "torch_threads": args.threads,
              "prompts": args.prompts, "group_size": args.group_size, "max_len": args.max_len,
              "loss_type": args.loss_type, "steps_timed": args.steps,
              "trl_step_s": t_trl, "ours_step_s": t_ours, "speedup_vs_trl": t_trl / t_ours,
              "trl_step_cpu_s": c_trl, "ours_step_cpu_s": c_ours,
              "speedup_vs_trl_cpu_time": c_trl / c_ours,
              "loss_rel_diff": diffs, "loss_equal": max_rel < 1e-4}
    print(json.dumps(result, indent=2))
    if args.out:
        sio.atomic_write_json(args.out, result)
    print(f"loss_equal={result['loss_equal']} max_rel_diff={max_rel:.2e}")
    print(f"speedup_vs_trl={t_trl / t_ours:.2f}")
    return 0 if result["loss_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
