"""The SFT warm start before RL: `sft_loop` (the optimiser, schedule and early stop every SFT here
runs: GRPO's, DPO's and the video trainer's), `sft` (teacher-forced cross-entropy on a task's
reference solutions) and `_completion_tensors` (right-padded `text + EOS` token ids and mask).
"""
from __future__ import annotations

import contextlib
import math

import numpy as np
import torch

from scaling_rl.llm import rollout


def _completion_tensors(tokenizer, texts: list[str], width: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded token ids of `text + EOS` and their mask."""
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    out = torch.full((len(ids), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        row = (row + [tokenizer.eos_token_id])[:width]
        out[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1
    return out.to(device), mask.to(device)


def sft_loop(model, *, steps: int, lr: float, batch_loss, probe_accuracy, target_accuracy: float = 0.0,
             check_every: int = 50, weight_decay: float = 0.0, log=None) -> dict:
    """The warm-start loop every SFT here runs: AdamW (β 0.9/0.98), 20-step linear warm-up into a cosine
    decay, gradient clipping at 1; `batch_loss()` draws a batch and returns its loss. Stops early once
    `probe_accuracy()` (greedy, model in eval mode) reaches `target_accuracy`, checked every
    `check_every` steps and at the last (0 disables). Returns {"loss", "steps", "probe_accuracy"}."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.98))
    loss_value, probe_acc, step = float("nan"), float("nan"), 0
    for step in range(1, steps + 1):
        rollout.set_training(model, True)
        warm = min(1.0, step / 20)
        for group in opt.param_groups:
            group["lr"] = lr * warm * 0.5 * (1 + math.cos(math.pi * (step - 1) / steps))
        loss = batch_loss()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_value = float(loss.detach())
        if target_accuracy > 0 and (step % check_every == 0 or step == steps):
            rollout.set_training(model, False)
            probe_acc = probe_accuracy()
            if log:
                log(f"sft step {step:5d}  loss {loss_value:.3f}  probe accuracy {probe_acc:.3f}")
            if probe_acc >= target_accuracy:
                break
    rollout.set_training(model, False)
    return {"loss": loss_value, "steps": step, "probe_accuracy": probe_acc}


def sft(model, tokenizer, task, *, steps: int, batch_size: int, lr: float, seed: int,
        max_len: int, target_accuracy: float = 0.0, check_every: int = 50,
        weight_decay: float = 0.0, log=None, chat_template: bool = False,
        autocast=contextlib.nullcontext) -> dict:
    """Teacher-forced cross-entropy on reference solutions of training problems (`sft_loop`).

    Stops early once greedy accuracy on 200 training problems reaches `target_accuracy` (checked
    every `check_every` steps; 0 disables), so the warm start lands at a chosen skill level rather
    than at a step count (the carry in addition is learnt abruptly, at a seed-dependent step).
    Returns {"loss", "steps", "probe_accuracy"}.
    """
    rng = np.random.default_rng(seed + 7919)
    pool = task.problems("train", 100_000, seed=seed + 1)
    probe = task.problems("train", 200, seed=seed + 2)

    def batch_loss():
        probs = [pool[int(i)] for i in rng.integers(len(pool), size=batch_size)]
        device = next(model.parameters()).device
        p_ids, p_mask = rollout.encode_prompts(tokenizer, [p.prompt for p in probs], chat_template,
                                               device)
        c_ids, c_mask = _completion_tensors(tokenizer, [task.solution(p) for p in probs], max_len,
                                            device)
        with autocast():
            logp, _ = rollout.completion_logprobs(model, p_ids, p_mask, c_ids, c_mask)
        return -(logp * c_mask).sum() / c_mask.sum()

    def probe_accuracy():
        with autocast():
            return rollout.accuracy(model, tokenizer, task, probe, max_new_tokens=max_len,
                                    chat_template=chat_template)

    return sft_loop(model, steps=steps, lr=lr, batch_loss=batch_loss, probe_accuracy=probe_accuracy,
                    target_accuracy=target_accuracy, check_every=check_every, weight_decay=weight_decay,
                    log=log)
