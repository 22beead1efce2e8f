"""A long-video counting task generated in code: how many times does a rare event happen?

Each video is `frames` synthetic frames of `frame_dim` pixels: a per-video scene (a random mean
image) plus per-frame pixel noise; in 1..`max_events` frames, chosen at random, a flash (a fixed
pattern, the same for every video) is added. The question is "count:" and the answer the number
of flashes ("3"), scored exactly (1.0), else `format_reward` for a finished single digit, else 0.
Frames are a pure function of the problem id, so nothing is stored. Difficulty grows with length:
the flashes are the same few frames whatever the length, so they are a smaller share of the frame
tokens the policy attends over (counting them by attention means telling k / F from (k+1) / F).
"""
from __future__ import annotations

import numpy as np

from scaling_rl.llm.tasks import Problem, _split_of

QUESTION = "count:"
NOISE = 0.5          # per-pixel noise std around the scene
FLASH = 4.0          # norm of the flash pattern added on event frames


class VideoCountTask:
    name = "video"

    def __init__(self, frames: int = 256, frame_dim: int = 16, max_events: int = 4,
                 format_reward: float = 0.0, test_fraction: float = 0.1, pool_size: int = 100_000):
        if frames < 8:
            raise ValueError(f"frames: {frames} is below 8")
        if not 1 <= max_events <= 9:
            raise ValueError(f"video_events: {max_events} is outside [1, 9]")
        if frame_dim < 2:
            raise ValueError(f"frame_dim: {frame_dim} is below 2")
        self.frames, self.frame_dim, self.max_events = frames, frame_dim, max_events
        self.format_reward = format_reward
        keys = np.arange(pool_size)
        test = np.array([_split_of(int(k), test_fraction) == "test" for k in keys])
        self._keys = {"test": keys[test], "train": keys[~test]}
        pattern = np.random.default_rng(2507_07966).standard_normal(frame_dim)
        self.pattern = (FLASH * pattern / np.linalg.norm(pattern)).astype(np.float32)

    def problem(self, key: int) -> Problem:
        rng = np.random.default_rng([int(key), self.frames, 25])
        count = int(rng.integers(1, self.max_events + 1))
        where = np.sort(rng.choice(self.frames, size=count, replace=False))
        return Problem(int(key), QUESTION, str(count), tuple(int(i) for i in where), count)

    def video(self, problem: Problem) -> np.ndarray:
        """(frames, frame_dim) float32 frames of `problem` (deterministic in its id)."""
        rng = np.random.default_rng([problem.id, self.frames, self.frame_dim, 52])
        scene = rng.standard_normal(self.frame_dim).astype(np.float32)
        x = scene + NOISE * rng.standard_normal((self.frames, self.frame_dim)).astype(np.float32)
        x[list(problem.numbers)] += self.pattern
        return x

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        pool = self._keys[split]
        keys = np.random.default_rng(seed).choice(pool, size=min(n, len(pool)), replace=False)
        return [self.problem(int(k)) for k in keys]

    def max_answer_chars(self) -> int:
        return 1

    def solution(self, problem: Problem) -> str:
        return problem.answer

    def reward(self, problem: Problem, completion: str, finished: bool) -> float:
        text = completion.strip()
        if not finished or not (len(text) == 1 and text.isdigit()):
            return 0.0
        return 1.0 if int(text) == problem.target else self.format_reward


def check_config(cfg) -> None:
    """One-line ValueErrors for settings the video trainer cannot run."""
    def need(cond, key, what):
        if not cond:
            raise ValueError(f"{key}: {getattr(cfg, key)!r} {what}")
    need(cfg.multimodal in ("", "video"), "multimodal", "is unknown; use video (or leave it empty)")
    need(cfg.rollout == "sync", "rollout", "must be sync with multimodal=video")
    need(cfg.model in ("tiny", "tiny:qwen2") or bool(cfg.init_from), "model",
         "must be tiny / tiny:qwen2 with multimodal=video (or init_from a saved video policy)")
    for key in ("frames", "frame_dim", "frame_encoder_hidden", "frames_per_token", "video_events"):
        need(getattr(cfg, key) >= 1, key, "must be >= 1")
    need(cfg.frames % cfg.frames_per_token == 0, "frames",
         f"is not divisible by frames_per_token={cfg.frames_per_token}")
    need(not cfg.bf16, "bf16", "is not supported with multimodal=video")
    need(cfg.sp_workers == 1 or cfg.device == "cpu", "sp_workers",
         f"> 1 runs forked gloo CPU workers; it needs device=cpu (got device={cfg.device!r})")
