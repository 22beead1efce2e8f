"""GRPO on a `transformers` causal LM, with the objective in JAX (through `scaling_rl.bridge`).

    df = run({"task": "addition", "steps": 40, "loss_type": "dapo"}, "runs/grpo")

One run = optional SFT warm start -> `base_model/` (the reference policy and pass@k baseline) ->
`steps` GRPO updates. Each step: pick prompts (optionally through GRESO selective rollouts and
DAPO-style dynamic sampling), sample G completions each, score them, compute group advantages,
then μ = `num_iterations` passes of `num_minibatches` optimizer steps on the clipped surrogate
(+ β·k3 KL to the reference). The run directory holds `grpo_config.json` (not config.json,
which a sweep engine owns when this runs as a trial), `metrics.parquet` (one row per step; row 0
is the base policy), `base_model/` and `checkpoints/step_XXXXXX/`. Rerunning with the same
directory resumes from the last checkpoint and gives the same numbers on CPU; raising `steps`
extends a finished run, any other config change is refused.

This module is the run: checkpoint-directory helpers, `GRPOTrainer` and `run`. The config and its checks
live in `grpo_config`, the SFT warm start in `warm_start`; their names are importable from here too.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pandas as pd
import torch

from scaling_rl import io as sio
from scaling_rl.bridge import to_jax, to_torch, torch_op
from scaling_rl.llm import objectives, rollout
from scaling_rl.llm.greso import GresoConfig, SelectiveRollout
from scaling_rl.llm.grpo_config import GRPOConfig, _is_device, config_from_dict, resolve_device  # noqa: F401
from scaling_rl.llm.models import load_policy, save_policy
from scaling_rl.llm.tasks import make_task
from scaling_rl.llm.warm_start import _completion_tensors, sft, sft_loop  # noqa: F401

EVAL_SEED = 1234  # the held-out evaluation problems do not depend on the run seed
# per-step columns measured with clocks: they differ between two runs of the same config (drop them to compare)
TIMING_COLUMNS = ("tokens_per_s", "generation_s", "step_s", "publish_s", "generation_cpu_s", "step_cpu_s")


# ---- checkpoint directory helpers --------------------------------------------------------------

def _atomic_dir(final: Path):
    """Context manager yielding a temp dir that is renamed to `final` on success."""
    @contextlib.contextmanager
    def cm():
        tmp = final.parent / f".{final.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            yield tmp
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return cm()


def latest_checkpoint(out_dir) -> Path | None:
    ckpts = sorted(Path(out_dir, "checkpoints").glob("step_*"))
    return ckpts[-1] if ckpts else None


def policy_path(out_dir, which: str = "final") -> Path:
    """Saved policy directory of a run: "base" (after SFT) or "final" (last checkpoint)."""
    if which == "base":
        return Path(out_dir, "base_model")
    ckpt = latest_checkpoint(out_dir)
    if ckpt is None:
        raise FileNotFoundError(f"{out_dir}: no checkpoint yet")
    return ckpt / "model"


@functools.lru_cache(maxsize=None)
def _advantages_fn(group_size: int, scale: str):
    return jax.jit(functools.partial(objectives.group_advantages, group_size=group_size, scale=scale))


# ---- the trainer -------------------------------------------------------------------------------

class GRPOTrainer:
    """Holds the policy, optimizer, RNGs and selective-rollout state of one run."""

    def __init__(self, config: GRPOConfig, out_dir=None):
        self.cfg = c = config
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.device = resolve_device(c.device)
        self.task = make_task(c.task, digits=c.digits, countdown_numbers=c.countdown_numbers,
                              format_reward=c.format_reward, dataset=c.dataset, reward=c.reward)
        self.max_len = c.max_completion_length  # in tokens; 0 is resolved once the tokenizer is known
        self.pool = self.task.problems("train", c.train_pool, seed=c.seed)
        self.eval_set = self.task.problems("test", c.eval_problems, seed=EVAL_SEED)
        self.rng = np.random.default_rng(c.seed)
        self.gen = torch.Generator(device=self.device).manual_seed(c.seed)
        self.order = self.rng.permutation(len(self.pool))
        self.cursor, self.epoch, self.step = 0, 0, 0
        # rollouts: completions generated; trained_on: completions in updates (TBA replays a
        # completion several times, dynamic sampling drops some, a restart regenerates some)
        self.counters = {"rollouts": 0, "trained_on": 0, "rollouts_saved": 0, "num_tokens": 0}
        self.greso = (SelectiveRollout(GresoConfig(target=c.greso_target, step=c.greso_step))
                      if c.selective_rollouts else None)
        self.rows: list[dict] = []
        self.objective = self.policy_objective = None  # built in _set_policy (need max_len)
        self.source = None               # built in setup(): source_factory.make_source(self)
        jax_gpu = jax.default_backend() == "gpu" and self.device.type == "cuda"
        self._objective_device = self.device if jax_gpu else torch.device("cpu")
        self.version_log: list[dict] = []  # per step: versions of every consumed completion
        self.model = self.tokenizer = self.ref_model = self.opt = None
        self.eos_ids: tuple[int, ...] = ()

    def autocast(self):
        """bfloat16 autocast around forward passes when `bf16` (weights and log-probs stay fp32)."""
        return rollout.autocast(self.device, self.cfg.bf16)

    def _placed(self, model):
        """`model` in float32 on the run's device, in eval mode."""
        return model.float().to(self.device).eval()

    def _set_policy(self, model, tokenizer):
        c = self.cfg
        self.model, self.tokenizer = self._placed(model), tokenizer
        self.eos_ids = rollout.stop_ids(model, tokenizer)
        self.max_len = rollout.completion_budget(c.max_completion_length, self.task, tokenizer)
        self.objective = torch_op(objectives.objective_fn(
            c.loss_type, float(c.epsilon_low), float(c.epsilon_high), float(c.beta), self.max_len))
        self.policy_objective = torch_op(objectives.policy_objective_fn(
            c.objective, c.loss_type, float(c.epsilon_low), float(c.epsilon_high), float(c.beta),
            self.max_len, float(c.is_cap), float(c.tb_beta), c.group_size))

    # -- set-up / persistence --
    def _make_optimizer(self):
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=self.cfg.lr,
                                     weight_decay=self.cfg.weight_decay, betas=(0.9, 0.99),
                                     foreach=True)

    @property
    def needs_reference(self) -> bool:
        return self.cfg.beta > 0 or self.cfg.objective == "vargrad"

    def _load_reference(self, path):
        if self.needs_reference:
            ref, _ = load_policy(str(path))
            self.ref_model = self._placed(ref).requires_grad_(False)

    def setup(self, progress: bool = False) -> None:
        """Fresh start (SFT warm start -> base_model/) or resume from the last checkpoint."""
        c = self.cfg
        ckpt = latest_checkpoint(self.out_dir) if self.out_dir else None
        if ckpt is not None:
            self._restore(ckpt)
            return
        base_dir = self.out_dir / "base_model" if self.out_dir else None
        if base_dir is not None and base_dir.exists():
            self._set_policy(*load_policy(str(base_dir)))
            row0 = None
        else:
            source = c.init_from or c.model
            self._set_policy(*load_policy(source, hidden_size=c.hidden_size,
                                          num_layers=c.num_layers, num_heads=c.num_heads,
                                          seed=c.seed))
            row0 = {"step": 0}
            sft_steps = self.sft_steps()
            if sft_steps:
                info = self._warm_start(sft_steps, progress)
                row0.update({f"sft/{k}": v for k, v in info.items()})
            row0.update(self.evaluate())
            if base_dir is not None:
                # row 0 on disk before base_model/: a run killed after base_model/ is written
                # resumes from it and reads row 0 back from metrics.parquet
                self.rows = [row0]
                self._write_metrics()
                with _atomic_dir(base_dir) as tmp:
                    save_policy(self.model, self.tokenizer, tmp)
        self.model.eval()
        self._make_optimizer()
        if base_dir is not None:
            self._load_reference(base_dir)
        else:
            self._reference_from_memory()
        self._start_source({})
        if row0 is not None:
            self.rows = [row0]
        elif self.out_dir and (self.out_dir / "metrics.parquet").exists():
            self.rows = pd.read_parquet(self.out_dir / "metrics.parquet").query("step == 0") \
                .to_dict("records")

    def _warm_start(self, steps: int, progress: bool) -> dict:
        c = self.cfg
        return sft(self.model, self.tokenizer, self.task, steps=steps, batch_size=c.sft_batch_size,
                   lr=c.sft_lr, seed=c.seed, max_len=self.max_len,
                   target_accuracy=c.sft_target_accuracy, log=print if progress else None,
                   chat_template=c.chat_template, autocast=self.autocast)

    def sft_steps(self) -> int:
        """SFT steps before RL: opt-in for pretrained weights (SFT at `sft_lr` would rewrite them),
        400 by default for the tiny randomly initialised models; never when starting `init_from`."""
        c = self.cfg
        if c.init_from:
            return 0
        if c.sft_steps >= 0:
            return c.sft_steps
        tiny = c.model == "tiny" or c.model.startswith("tiny:")
        return 400 if tiny else 0

    def _start_source(self, state: dict) -> None:
        from scaling_rl.llm.source_factory import make_source
        self.source = make_source(self)
        self.source.load_state_dict(state)

    def close(self) -> None:
        """Stop the rollout source's workers (idempotent)."""
        if self.source is not None:
            self.source.close()
            self.source = None

    def _reference_from_memory(self):
        if self.needs_reference:
            import copy
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)

    def save(self) -> None:
        # the rows first: a kill between the two leaves rows past the last checkpoint, which
        # `_restore` drops; the other order could leave a checkpoint whose rows were never written
        self._write_metrics()
        ckpt = self.out_dir / "checkpoints" / f"step_{self.step:06d}"
        with _atomic_dir(ckpt) as tmp:
            save_policy(self.model, self.tokenizer, tmp / "model")
            torch.save({
                "optimizer": self.opt.state_dict(),
                "torch_generator": self.gen.get_state(),
                "numpy_rng": self.rng.bit_generator.state,
                "order": self.order.tolist(), "cursor": self.cursor, "epoch": self.epoch,
                "step": self.step, "counters": dict(self.counters),
                "greso": self.greso.state_dict() if self.greso else None,
                "source": self.source.state_dict() if self.source else {},
            }, tmp / "trainer_state.pt")
        old = sorted((self.out_dir / "checkpoints").glob("step_*"))[:-self.cfg.keep_checkpoints]
        for path in old:
            shutil.rmtree(path, ignore_errors=True)

    def _restore(self, ckpt: Path) -> None:
        self._set_policy(*load_policy(str(ckpt / "model")))
        self._make_optimizer()
        state = torch.load(ckpt / "trainer_state.pt", weights_only=False, map_location="cpu")
        self.opt.load_state_dict(state["optimizer"])
        self.gen.set_state(state["torch_generator"].cpu())
        self.rng.bit_generator.state = state["numpy_rng"]
        self.order = np.asarray(state["order"])
        self.cursor, self.epoch, self.step = state["cursor"], state["epoch"], state["step"]
        self.counters = {**self.counters, **state["counters"]}
        if self.greso is not None and state["greso"] is not None:
            self.greso.load_state_dict(state["greso"])
        self._load_reference(self.out_dir / "base_model")
        self._start_source(state.get("source") or {})
        metrics = self.out_dir / "metrics.parquet"
        if metrics.exists():
            df = pd.read_parquet(metrics)
            self.rows = df[df["step"] <= self.step].to_dict("records")

    def _write_metrics(self) -> None:
        if self.out_dir is not None:
            sio.atomic_write_parquet(self.out_dir / "metrics.parquet", self.metrics_frame())

    def metrics_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    # -- evaluation --
    def evaluate(self) -> dict:
        """Greedy accuracy on the held-out problems, plus sampled pass@1 if `eval_samples` > 0.

        Sampling uses its own generator seeded by the step, so evaluating never perturbs the
        training stream and two runs evaluated at the same step share random numbers.
        """
        chat = self.cfg.chat_template
        with self.autocast():
            out = {"eval/accuracy": rollout.accuracy(self.model, self.tokenizer, self.task,
                                                     self.eval_set, max_new_tokens=self.max_len,
                                                     chat_template=chat)}
            if self.cfg.eval_samples:
                counts = rollout.correct_counts(
                    self.model, self.tokenizer, self.task, self.eval_set, n=self.cfg.eval_samples,
                    max_new_tokens=self.max_len, temperature=self.cfg.temperature,
                    top_p=self.cfg.top_p, seed=EVAL_SEED + self.step, chat_template=chat)
                out["eval/pass@1"] = float(counts.mean() / self.cfg.eval_samples)
        return out

    # -- rollouts --
    def _next_problem(self):
        if self.cursor >= len(self.order):
            self.order = self.rng.permutation(len(self.pool))
            self.cursor, self.epoch = 0, self.epoch + 1
        problem = self.pool[int(self.order[self.cursor])]
        self.cursor += 1
        return problem

    def _rollout(self, problems) -> tuple[rollout.Batch, np.ndarray]:
        # behaviour log-probs only where an objective reads them: the grpo objective takes the
        # old log-probs (this policy's, = the behaviour policy's in sync), and recording them is
        # a full-vocabulary log-softmax per decode step
        return rollout.sample_groups(self.model, self.tokenizer, self.task, problems, self.cfg,
                                     eos_ids=self.eos_ids, max_len=self.max_len,
                                     generator=self.gen, version=self.step, device=self.device,
                                     record_logp=self.cfg.objective != "grpo")

    def collect(self) -> dict:
        """Groups for one update: GRESO pre-filter, rollouts, optional dynamic-sampling refill."""
        c, G = self.cfg, self.cfg.group_size
        need, rounds = c.prompts_per_step, 0
        max_rounds = c.max_sampling_rounds if c.dynamic_sampling else 1
        kept_batches, kept_rewards, all_rewards, skipped, greso_stats = [], [], [], 0, {}
        while need > 0 and rounds < max_rounds:
            rounds += 1
            chosen = []
            for _ in range(len(self.pool)):
                if len(chosen) == need:
                    break
                problem = self._next_problem()
                if self.greso is None or self.greso.select(problem.id, self.rng):
                    chosen.append(problem)
                else:
                    skipped += 1
            if not chosen:
                break
            batch, rewards = self._rollout(chosen)
            grouped = rewards.reshape(-1, G)
            all_rewards.append(grouped)
            greso_stats = self.greso.observe([p.id for p in chosen], grouped) if self.greso else {}
            informative = np.ptp(grouped, axis=1) > 0
            keep = np.flatnonzero(informative) if c.dynamic_sampling else np.arange(len(chosen))
            keep = keep[:need]
            if len(keep):
                rows = (keep[:, None] * G + np.arange(G)).reshape(-1)
                kept_batches.append(rollout.select(batch, rows))
                kept_rewards.append(grouped[keep].reshape(-1))
            need -= len(keep)
        every = np.concatenate(all_rewards) if all_rewards else np.zeros((0, G), np.float32)
        self.counters["rollouts"] += every.size
        self.counters["rollouts_saved"] += skipped * G
        out = {"generated": every, "rounds": rounds, "skipped_prompts": skipped}
        if self.greso:
            out["greso"] = greso_stats
        if kept_batches:
            out["batch"] = rollout.concat(kept_batches, self.tokenizer.pad_token_id, self.max_len)
            out["rewards"] = np.concatenate(kept_rewards)
        return out

    # -- one GRPO step --
    def _logprobs(self, model, batch, rows=None, with_entropy=False):
        b = batch if rows is None else rollout.select(batch, rows)
        # no-grad passes (old / reference) run in the training minibatch's rows, so their logits
        # never exceed those of one training forward
        micro = -(-batch.completion_ids.shape[0] // self.cfg.num_minibatches)
        with self.autocast():
            return rollout.completion_logprobs(model, b.prompt_ids, b.prompt_mask,
                                               b.completion_ids, b.completion_mask,
                                               self.cfg.temperature, with_entropy, micro)

    def train_step(self) -> dict:
        t0, c0 = time.perf_counter(), time.process_time()
        data = self.source.pull()
        t_gen, c_gen = time.perf_counter() - t0, time.process_time() - c0
        gen = data["generated"]
        row: dict[str, Any] = {
            "step": self.step + 1, "epoch": self.epoch,
            "reward": float(gen.mean()) if gen.size else float("nan"),
            "reward_std": float(gen.std(ddof=1)) if gen.size > 1 else float("nan"),
            "frac_reward_zero_std": float((np.ptp(gen, axis=1) == 0).mean()) if gen.size else float("nan"),
            "sampling_rounds": data["rounds"], "skipped_prompts": data["skipped_prompts"],
            **data.get("greso", {}),
        }
        if "batch" in data:
            row.update(self._staleness(data["batch"]))
            row.update(self._update(data["batch"], data["rewards"]))
        else:  # every group was uninformative: nothing to learn from this step
            row["groups_used"] = 0
        row.update(data.get("source", {}))
        self.step += 1
        t_pub = time.perf_counter()
        self.source.publish(self.model, self.step)
        elapsed = time.perf_counter() - t0
        row.update(self.counters)
        row["tokens_per_s"] = row.pop("_step_tokens", 0) / elapsed
        row["generation_s"], row["step_s"] = t_gen, elapsed
        row["publish_s"] = t0 + elapsed - t_pub
        # CPU seconds of this process (every thread): wall time on a shared machine is not
        row["generation_cpu_s"], row["step_cpu_s"] = c_gen, time.process_time() - c0
        return row

    def _staleness(self, batch: rollout.Batch) -> dict:
        """Versions of the consumed completions; staleness = trainer version - token version."""
        if batch.versions is None:
            return {}
        m = batch.completion_mask.bool()
        big = torch.iinfo(torch.long).max
        oldest = torch.where(m, batch.versions, big).min(-1).values.cpu()
        newest = torch.where(m, batch.versions, -1).max(-1).values.cpu()
        self.version_log.append({"step": self.step, "oldest": oldest.numpy(),
                                 "newest": newest.numpy()})
        stale = self.step - oldest.double()
        return {"staleness_mean": float(stale.mean()), "staleness_max": float(stale.max()),
                "mixed_version_frac": float((newest != oldest).double().mean())}

    def _after_backward(self) -> None:
        """Between a minibatch's backward and its gradient clipping (the video trainer's
        sequence-parallel update all-reduces the gradients here)."""

    def _update(self, batch: rollout.Batch, rewards: np.ndarray) -> dict:
        c = self.cfg
        adv, zero_std = _advantages_fn(c.group_size, c.scale_rewards)(
            to_jax(torch.from_numpy(rewards)))
        adv = to_torch(adv).clone().to(self.device)
        rewards_t = torch.from_numpy(rewards).to(self.device)
        mask = batch.completion_mask.float()
        B = mask.shape[0]
        lengths = batch.completion_mask.sum(-1).float()
        step_tokens = int(batch.prompt_mask.sum() + batch.completion_mask.sum())
        self.counters["num_tokens"] += step_tokens
        self.counters["trained_on"] += B
        need_old = c.num_iterations > 1 or c.num_minibatches > 1
        with torch.no_grad():
            old_logp = self._logprobs(self.model, batch)[0] if need_old else None
            ref_logp = self._logprobs(self.ref_model, batch)[0] if self.needs_reference else None
            behav = batch.logp if batch.logp is not None else old_logp
        splits = np.array_split(np.arange(B), min(c.num_minibatches, B))
        if c.objective == "vargrad":  # groups must stay whole inside a minibatch
            groups = np.array_split(np.arange(B // c.group_size), min(c.num_minibatches, B // c.group_size))
            splits = [(g[:, None] * c.group_size + np.arange(c.group_size)).reshape(-1) for g in groups]
        # as TRL's num_items_in_batch: the completion tokens of the whole generation batch, so a
        # minibatch's loss is its token sum over that count and the minibatches add up to dapo
        # a Python number, not a tensor: an array would be committed to the device it was made on
        # (the host) and the jitted objective, whose inputs sit on JAX's GPU, would refuse it
        num_items = float(mask.sum())
        rollout.set_training(self.model, True)
        logs: dict[str, list] = {}
        whole = len(splits) == 1   # one minibatch: every row, no gathers (same values)
        for _ in range(c.num_iterations):
            for rows in splits:
                rows_t = None if whole else torch.as_tensor(rows, device=self.device)

                def pick(t):
                    return t if rows_t is None else t[rows_t]
                logp, ent = self._logprobs(self.model, batch, None if whole else rows,
                                           with_entropy=not logs)
                old = logp.detach() if old_logp is None else pick(old_logp)
                ref = torch.zeros_like(logp) if ref_logp is None else pick(ref_logp)
                mask_rows = pick(mask)
                # JAX runs the objective where it can read the tensors (DLPack): on the host
                # unless JAX itself has the GPU; `.to` is differentiable, so gradients flow back
                to_obj = [t.to(self._objective_device) for t in (logp, old, ref, pick(adv), mask_rows)]
                if c.objective == "grpo":
                    loss, m = self.objective(*to_obj, num_items)
                else:
                    bh = old if behav is None else pick(behav)
                    lp, old_o, ref_o, adv_o, mask_o = to_obj
                    loss, m = self.policy_objective(
                        lp, old_o, bh.to(self._objective_device), ref_o, adv_o,
                        pick(rewards_t).to(self._objective_device), mask_o, num_items)
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                self._after_backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), c.max_grad_norm)
                self.opt.step()
                if ent is not None:
                    logs["entropy"] = [float((ent * mask_rows).sum() / mask_rows.sum().clamp(min=1))]
                for k, v in {"loss": loss, "grad_norm": grad_norm, **m}.items():
                    logs.setdefault(k, []).append(float(v.detach()))
        rollout.set_training(self.model, False)
        out = {k: float(np.mean(v)) for k, v in logs.items()}
        out.update({
            "groups_used": B // c.group_size,
            "frac_zero_advantage": float(np.asarray(zero_std).mean()),
            "completions/mean_length": float(lengths.mean()),
            "completions/min_length": float(lengths.min()),
            "completions/max_length": float(lengths.max()),
            "completions/clipped_ratio": float((~batch.finished).float().mean()),
            "_step_tokens": step_tokens,
        })
        return out

    def should_stop(self, row: dict) -> bool:
        """Early-stopping hook (never, here): asked before the first step on the last row so far
        (row 0, the base policy, on a fresh start; the last restored row on resume) and after each
        step's row is appended to `rows`, except the last step's. True ends training: the step is
        checkpointed and `train` returns. A subclass must answer from the rows alone
        (deterministically), so a resumed run stops where it stopped."""
        return False

    def train(self, progress: bool = False) -> pd.DataFrame:
        c = self.cfg
        # a resumed run that had stopped early stays stopped (its stop step was checkpointed)
        stopped = self.step < c.steps and bool(self.rows) and self.should_stop(self.rows[-1])
        if stopped and self.out_dir is not None:
            ckpt = latest_checkpoint(self.out_dir)
            if ckpt is None or ckpt.name != f"step_{self.step:06d}":
                self.save()
        while not stopped and self.step < c.steps:
            row = self.train_step()
            last = self.step == c.steps
            if self.step % c.eval_every == 0 or last:
                row.update(self.evaluate())
            else:
                row["eval/accuracy"] = float("nan")
            self.rows.append(row)
            stopped = not last and self.should_stop(row)
            if progress:
                print(f"step {self.step:4d}  reward {row['reward']:.3f}  "
                      f"eval {row['eval/accuracy']:.3f}  loss {row.get('loss', float('nan')):+.4f}"
                      + ("  (stopped early)" if stopped else ""), flush=True)
            if self.out_dir is not None and (self.step % c.checkpoint_every == 0 or last or stopped):
                self.save()
        self._write_metrics()
        return self.metrics_frame()


@contextlib.contextmanager
def _torch_threads(n: int):
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def run(config: dict | GRPOConfig, out_dir, *, progress: bool = False,
        trainer_cls: type | None = None) -> pd.DataFrame:
    """Train (or resume) one GRPO run in `out_dir`; returns the metrics table (also on disk).

    `trainer_cls` (a GRPOTrainer subclass) lets a caller add checks, e.g. the sweep's divergence test.
    """
    cfg = config if isinstance(config, GRPOConfig) else GRPOConfig.from_dict(dict(config))
    if trainer_cls is None and cfg.multimodal:
        raise ValueError(f"multimodal: {cfg.multimodal!r} needs its trainer; call "
                         "scaling_rl.llm.grpo_run.run (the CLI does)")
    out = Path(out_dir)
    # not config.json: a sweep engine running this as a trial owns that file in the trial dir
    cfg_path = out / "grpo_config.json"
    resolved = dataclasses.asdict(cfg)
    if cfg_path.exists():
        previous = json.loads(cfg_path.read_text())
        # `steps` may change: rerunning with more steps extends a finished run
        diff = sorted(k for k in set(previous) | set(resolved)
                      if k != "steps" and previous.get(k) != resolved.get(k))
        if diff:
            raise ValueError(f"out_dir: {out} holds a run with a different config ({', '.join(diff)}); "
                             "use a new directory")
    sio.atomic_write_json(cfg_path, resolved)
    with _torch_threads(cfg.torch_threads):
        torch.manual_seed(cfg.seed)
        trainer = (trainer_cls or GRPOTrainer)(cfg, out)
        try:
            trainer.setup(progress)
            return trainer.train(progress=progress)
        finally:
            trainer.close()
