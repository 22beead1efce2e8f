"""GRPO on the long-video counting task with a frame encoder + LM policy (`multimodal=video`).

    scaling-rl grpo --out runs/video multimodal=video frames=256 frame_encoder_hidden=64 steps=40
    scaling_rl.llm.grpo_run.run({"multimodal": "video", "frames": 256}, "runs/video")

`VideoGRPOTrainer` is the GRPO trainer with video prompts: the tiny Qwen2 LM is wrapped in a
`VideoLM` (a fresh frame encoder), the SFT warm start trains encoder and LM on reference answers,
and GRPO then keeps the encoder frozen (so the policy, the old policy and the reference share one
encoding of each video). Each step encodes every video of the step once (`EmbeddingCache`) and
reuses the frame tokens for the G rollouts of its group, the old/reference log-prob passes and
every training forward; `encoder_flops` / `encoder_flops_saved` count what was encoded and what
re-encoding per use would have added. A batch row's `prompt_ids` is [cache slot, question ids]
with the slot column masked out, so rows keep pointing at their video through `select`/`concat`.

`sp_workers=P` (> 1) runs the update sequence-parallel (MR-SP stage 2, as the reference runs SP
inside the actor's update): P - 1 forked CPU workers and this process form one gloo group, each
holding a replica of the policy, the reference and the optimizer. Every update pass (old and
reference log-probs, each minibatch's training forward) runs on all P ranks, each over 1/P of
every sequence (`seq_parallel.sp_completion_logprobs`). This process alone computes the
objective (JAX); the gradient of the loss with respect to the log-probs is sent to the workers, all
ranks run the backward of their slice, sum the parameter gradients, clip and step the optimizer,
and after each update every rank's parameter checksums are checked equal to rank 0's. Rollouts,
evaluation and checkpoints stay in this process. With `measure_update_memory` set, `update_peak_kib` holds each
rank's peak resident-set rise during the last update (benchmarks/long_rl.py --trainer reads it).
"""
from __future__ import annotations

import numpy as np
import torch

from scaling_rl.llm import rollout, seq_parallel as sp
from scaling_rl.llm.multimodal import EmbeddingCache, sample_video, video_lm_from, video_logprobs
from scaling_rl.llm.trainer import EVAL_SEED, GRPOTrainer
from scaling_rl.llm.video_task import QUESTION, VideoCountTask
from scaling_rl.llm.warm_start import _completion_tensors, sft_loop


class VideoGRPOTrainer(GRPOTrainer):
    def __init__(self, config, out_dir=None):
        super().__init__(config, out_dir)
        c = config
        self.task = VideoCountTask(c.frames, c.frame_dim, c.video_events, c.format_reward)
        self.pool = self.task.problems("train", c.train_pool, seed=c.seed)
        self.eval_set = self.task.problems("test", c.eval_problems, seed=EVAL_SEED)
        self.rng = np.random.default_rng(c.seed)
        self.order = self.rng.permutation(len(self.pool))
        self.counters.update(encoder_flops=0, encoder_flops_saved=0)
        self.cache: EmbeddingCache | None = None
        self.question_ids: torch.Tensor | None = None
        self.sp: sp.WorkerPool | None = None    # sp_workers > 1: started at the first update
        # opt-in (it resets the process's peak resident set, which getrusage reports too):
        # per rank, the peak resident-set rise during the last update, KiB
        self.measure_update_memory = False
        self.update_peak_kib: list[int] = []

    # -- policy --
    def _set_policy(self, model, tokenizer):
        c = self.cfg
        model = video_lm_from(model, frame_dim=c.frame_dim, encoder_hidden=c.frame_encoder_hidden,
                              frames_per_token=c.frames_per_token, seed=c.seed)
        if (model.config.frame_dim, model.config.frames_per_token) != (c.frame_dim, c.frames_per_token):
            raise ValueError(f"init_from: the saved policy encodes frame_dim={model.config.frame_dim}, "
                             f"frames_per_token={model.config.frames_per_token}; the config asks "
                             f"{c.frame_dim}, {c.frames_per_token}")
        super()._set_policy(model, tokenizer)
        self.model.frame_encoder.requires_grad_(False)  # frozen in GRPO (SFT unfreezes it)
        self.cache = EmbeddingCache(self.model, shared=False)
        ids = tokenizer(QUESTION, add_special_tokens=False)["input_ids"]
        self.question_ids = torch.tensor(ids, dtype=torch.long, device=self.device)

    def frames_of(self, problems) -> torch.Tensor:
        return torch.from_numpy(np.stack([self.task.video(p) for p in problems])).to(self.device)

    def _prefix(self, model, problems, with_grad=False) -> torch.Tensor:
        """Prompt embeddings encoded afresh (SFT and evaluation: no cache)."""
        with torch.set_grad_enabled(with_grad):
            tokens = model.encode_frames(self.frames_of(problems))
        return model.prefix_embeds(tokens, self.question_ids)

    # -- SFT warm start: encoder + LM on reference answers --
    def _warm_start(self, steps: int, progress: bool) -> dict:
        c, model = self.cfg, self.model
        model.frame_encoder.requires_grad_(True)
        rng = np.random.default_rng(c.seed + 7919)
        probe = self.task.problems("train", 200, seed=c.seed + 2)

        def batch_loss():
            probs = [self.pool[int(i)] for i in rng.integers(len(self.pool), size=c.sft_batch_size)]
            ids, mask = _completion_tensors(self.tokenizer, [p.answer for p in probs], self.max_len,
                                            self.device)
            logp, _ = video_logprobs(model, self._prefix(model, probs, with_grad=True), ids)
            return -(logp * mask).sum() / mask.sum()

        # torch's AdamW default weight decay (0.01), as this warm start has always used
        info = sft_loop(model, steps=steps, lr=c.sft_lr, batch_loss=batch_loss,
                        probe_accuracy=lambda: self._accuracy(probe), target_accuracy=c.sft_target_accuracy,
                        weight_decay=0.01, log=print if progress else None)
        model.frame_encoder.requires_grad_(False)
        return info

    # -- evaluation --
    @torch.no_grad()
    def _accuracy(self, problems, chunk: int = 32) -> float:
        rewards = []
        for s in range(0, len(problems), chunk):
            part = problems[s:s + chunk]
            batch = sample_video(self.model, self._prefix(self.model, part), max_new_tokens=self.max_len,
                                 eos_id=self.eos_ids, pad_id=self.tokenizer.pad_token_id,
                                 temperature=0.0)
            rewards.append(rollout.score(self.task, part, self.tokenizer, batch))
        return float((np.concatenate(rewards) >= 1.0).mean())

    def evaluate(self) -> dict:
        return {"eval/accuracy": self._accuracy(self.eval_set)}

    # -- rollouts from the embedding cache --
    def _rollout(self, problems):
        c, G = self.cfg, self.cfg.group_size
        slots = [self.cache.put(p.id, self.frames_of([p])[0]) for p in problems]
        rows = [s for s in slots for _ in range(G)]
        prefix = self.model.prefix_embeds(self.cache.gather(rows), self.question_ids)
        batch = sample_video(self.model, prefix, max_new_tokens=self.max_len, eos_id=self.eos_ids,
                             pad_id=self.tokenizer.pad_token_id, temperature=c.temperature,
                             top_p=c.top_p, generator=self.gen, record_logp=True, version=self.step)
        rewards = rollout.score(self.task, [p for p in problems for _ in range(G)], self.tokenizer, batch)
        B, Q = len(rows), len(self.question_ids)
        slot_col = torch.tensor(rows, dtype=torch.long, device=self.device)[:, None]
        batch.prompt_ids = torch.cat([slot_col, self.question_ids[None].expand(B, -1)], dim=1)
        batch.prompt_mask = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=self.device),
                                       torch.ones(B, Q, dtype=torch.long, device=self.device)], dim=1)
        return batch, rewards

    def _logprobs(self, model, batch, rows=None, with_entropy=False):
        if self.sp is not None:
            grad = torch.is_grad_enabled()
            rows = None if rows is None else [int(r) for r in rows]
            sp.send(("logp", "policy" if model is self.model else "reference", rows, with_entropy, grad))
            logp, ent = _sp_pass(model, self._sp_batch, rows, self.cfg.temperature, grad, with_entropy)
            if grad:   # the loss's gradient here goes to the workers before the SP backward runs
                logp.register_hook(lambda g: sp.send(("backward", g)))
            return logp, ent
        b = batch if rows is None else rollout.select(batch, rows)
        prefix = model.prefix_embeds(self.cache.gather(b.prompt_ids[:, 0].tolist()), b.prompt_ids[:, 1:])
        return video_logprobs(model, prefix, b.completion_ids, self.cfg.temperature, with_entropy)

    def _after_backward(self) -> None:
        if self.sp is not None:
            sp.all_reduce_grads(self.model)

    def close(self) -> None:
        super().close()
        if self.sp is not None:
            self.sp.close()
            self.sp = None

    def train_step(self) -> dict:
        self.cache.clear()
        before = (self.cache.encoder_flops, self.cache.encoder_flops_saved)
        # the counters enter the row inside train_step: add this step's share when the update ran
        self._cache_before = before
        return super().train_step()

    def _update(self, batch, rewards) -> dict:
        measure = self.measure_update_memory
        start = _reset_peak() if measure else -1
        if self.sp is None and self.cfg.sp_workers > 1:
            self.sp = sp.WorkerPool(self.cfg.sp_workers, _serve, self.model, self.ref_model, self.opt,
                                    self.cfg)
        if self.sp is None:
            out = super()._update(batch, rewards)
            self.update_peak_kib = [_peak_rise(start)] if measure else []
        else:
            self._sp_batch = (torch.stack(self.cache.slots), batch.prompt_ids, batch.completion_ids)
            try:
                sp.send(("batch", measure, *self._sp_batch))
                out = super()._update(batch, rewards)
                sp.send(("check",))
                peaks = _check_replicas(self.model, _peak_rise(start))
                self.update_peak_kib = peaks if measure else []
            except BaseException as exc:
                self.sp.broken = True
                err = self.sp.failure(exc) if isinstance(exc, RuntimeError) else exc
                if err is exc:
                    raise
                raise err from exc
            finally:
                self._sp_batch = None
        flops, saved = self._cache_before
        self.counters["encoder_flops"] += self.cache.encoder_flops - flops
        self.counters["encoder_flops_saved"] += self.cache.encoder_flops_saved - saved
        return out


# ---- the sequence-parallel update (sp_workers > 1) ------------------------------------------------

def _sp_pass(model, sp_batch, rows, temperature, grad, with_entropy):
    """One update pass over this rank's slice of every sequence: (log-probs, entropies or None)."""
    slots, prompt_ids, completion_ids = sp_batch
    if rows is not None:
        prompt_ids, completion_ids = prompt_ids[rows], completion_ids[rows]
    rollout.set_training(model, grad)      # as the one-process update: train mode for its forwards
    with torch.set_grad_enabled(grad):
        question = model.get_input_embeddings()(prompt_ids[:, 1:])
    pieces = [sp.RowGather(slots, prompt_ids[:, 0]), question]
    out = sp.sp_completion_logprobs(model, pieces, completion_ids, temperature, grad=grad,
                                    with_entropy=with_entropy)
    return out if with_entropy else (out, None)


def _serve(rank, world, model, ref_model, opt, cfg) -> None:
    """A worker rank: mirror rank 0's update passes until it sends None."""
    logp, sp_batch, start = None, None, 0
    while (msg := sp.recv()) is not None:
        kind = msg[0]
        if kind == "batch":
            start, sp_batch = (_reset_peak() if msg[1] else -1), msg[2:]
        elif kind == "logp":
            _, which, rows, with_entropy, grad = msg
            logp, _ = _sp_pass(model if which == "policy" else ref_model, sp_batch, rows,
                               cfg.temperature, grad, with_entropy)
        elif kind == "backward":       # as GRPOTrainer._update's minibatch step
            opt.zero_grad(set_to_none=True)
            logp.backward(msg[1])
            logp = None
            sp.all_reduce_grads(model)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            opt.step()
        elif kind == "check":
            rollout.set_training(model, False)
            sp_batch = None
            _check_replicas(model, _peak_rise(start))
        else:
            raise ValueError(f"sequence-parallel worker: unknown message {kind!r}")


def _check_replicas(model, peak_kib: int) -> list[int]:
    """Collective: every rank's parameter checksums (a float64 sum per tensor) equal rank 0's
    exactly (the ranks apply the same summed gradients to the same start, so they should stay
    bit-equal; a checksum catches any drift, not every possible difference); returns each rank's
    peak."""
    import torch.distributed as dist
    sums = torch.stack([p.detach().double().sum() for p in model.parameters()])
    mine = [sums, peak_kib]
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    bad = [r for r, (s, _) in enumerate(every) if not torch.equal(s, every[0][0])]
    if bad:
        raise RuntimeError(f"sequence parallelism: the parameters of ranks {bad} differ from rank 0's")
    return [int(k) for _, k in every]


def _status_kib(field: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def _reset_peak() -> int:
    """Reset this process's peak resident set (Linux) and return the resident set now, KiB."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return -1
    return _status_kib("VmRSS")


def _peak_rise(start: int) -> int:
    """Peak resident-set rise since `_reset_peak` returned `start`, KiB (-1 where unknown)."""
    peak = _status_kib("VmHWM")
    return peak - start if start >= 0 and peak >= 0 else -1
