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
"""
from __future__ import annotations

import numpy as np
import torch

from scaling_rl.llm import rollout
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
        self.cache = EmbeddingCache(self.model)
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
        b = batch if rows is None else rollout.select(batch, rows)
        prefix = model.prefix_embeds(self.cache.gather(b.prompt_ids[:, 0].tolist()), b.prompt_ids[:, 1:])
        return video_logprobs(model, prefix, b.completion_ids, self.cfg.temperature, with_entropy)

    def train_step(self) -> dict:
        self.cache.clear()
        before = (self.cache.encoder_flops, self.cache.encoder_flops_saved)
        # the counters enter the row inside train_step: add this step's share when the update ran
        self._cache_before = before
        return super().train_step()

    def _update(self, batch, rewards) -> dict:
        out = super()._update(batch, rewards)
        flops, saved = self._cache_before
        self.counters["encoder_flops"] += self.cache.encoder_flops - flops
        self.counters["encoder_flops_saved"] += self.cache.encoder_flops_saved - saved
        return out
