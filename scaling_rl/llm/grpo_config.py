"""The configuration of a GRPO run: `GRPOConfig` (every field with its default, checked on
construction with a one-line ValueError naming the key), `config_from_dict` (the flat-dict loader that
GRPO and DPO share) and `resolve_device` (a config's `device` as a torch.device).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from scaling_rl.llm import objectives


def config_from_dict(cls, d: dict[str, Any], what: str):
    """`cls(**d)` for a flat config dataclass, each value converted to its field default's type;
    a one-line ValueError for an unknown key or a value of the wrong type (shared by GRPO and DPO)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - set(fields))
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown {what} config key; known keys: {', '.join(fields)}")
    out = {}
    for k, v in d.items():
        typ = type(fields[k].default)
        if typ is bool and not isinstance(v, bool):
            raise ValueError(f"{k}: {v!r} is not a boolean; use true or false")
        if typ is int and isinstance(v, float) and v != int(v):
            raise ValueError(f"{k}: {v!r} is not an integer")
        try:
            out[k] = typ(v) if not isinstance(v, typ) else v
        except (TypeError, ValueError):
            raise ValueError(f"{k}: {v!r} is not a {typ.__name__}") from None
    return cls(**out)


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    # policy
    model: str = "tiny"               # "tiny", "tiny:llama", or a local path / hub id
    hidden_size: int = 64             # tiny models only
    num_layers: int = 2
    num_heads: int = 4
    init_from: str = ""               # saved policy directory to start from (skips SFT)
    # task
    task: str = "addition"            # "addition" | "countdown" | "jsonl" | a registered plug-in
    dataset: str = ""                 # task=jsonl: JSONL file of {"prompt", "answer", ...}
    reward: str = ""                  # a registered reward name replacing the task's own
    chat_template: bool = True        # wrap prompts in the tokenizer's chat template if it has one
    digits: int = 2
    countdown_numbers: int = 3
    format_reward: float = 0.0
    train_pool: int = 2048            # training problems (one epoch = one pass over them)
    eval_problems: int = 200
    eval_samples: int = 0             # > 0: also sampled pass@1 with this many samples/problem
    # SFT warm start (before GRPO; gives the base model a non-zero pass@1)
    sft_steps: int = -1               # -1: 400 on the tiny built-in models, 0 (off) on pretrained
                                      # weights; > 0 runs SFT on any model (never with init_from)
    sft_batch_size: int = 64
    sft_lr: float = 1e-2
    sft_target_accuracy: float = 0.0  # stop SFT once greedy train accuracy reaches this (0: off)
    # GRPO
    steps: int = 40
    prompts_per_step: int = 16
    group_size: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_completion_length: int = 0    # tokens; 0: the task's longest answer + EOS (tiny models'
                                      # one-token-per-character tokenizer only)
    lr: float = 1e-4
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    beta: float = 0.0                 # KL weight; 0 skips the reference model
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2         # > epsilon_low is DAPO's clip-higher
    num_iterations: int = 1           # μ: updates per generation batch (old log-probs stored)
    num_minibatches: int = 1
    loss_type: str = "grpo"           # grpo | dr_grpo | dapo | bnpo
    scale_rewards: str = "group"      # group | batch | none
    # rollouts
    dynamic_sampling: bool = False    # drop zero-variance groups and resample (DAPO)
    max_sampling_rounds: int = 4
    selective_rollouts: bool = False  # GRESO pre-rollout filter
    greso_target: float = 0.25
    greso_step: float = 0.01
    # rollout layer (scaling_rl.llm.sources) and off-policy objectives
    rollout: str = "sync"             # sync | async (AReaL) | pipeline (PipelineRL) | tba | ray | hogwild
    objective: str = "grpo"           # grpo | decoupled_ppo (AReaL) | tis (PipelineRL) | vargrad (TBA)
    max_staleness: int = 1            # η: generation runs at most η policy versions ahead
    is_cap: float = 5.0               # decoupled_ppo: drop tokens with π_prox/π_behav above it;
                                      # tis: truncation c of π_θ/π_behav (<= 0: no cap)
    tb_beta: float = 0.5              # vargrad: rewards enter as r / tb_beta
    searchers: int = 2                # tba / ray: K generation workers (searchers, actors)
    sync_every: int = 1               # tba: searchers receive weights every this many steps
    replay_capacity: int = 256        # tba: groups kept in the replay buffer
    replay_reward_fraction: float = 0.25  # tba: share of each batch drawn by reward (rest: recency)
    replay_temperature: float = 0.1   # tba: reward-prioritised draw ∝ exp(mean group reward / T)
    hogwild_workers: int = 0          # hogwild: workers sharing one cache (must divide G; 0: all G)
    hogwild_layout: str = "contiguous"  # hogwild: contiguous | interleaved (scaling_rl.llm.hogwild)
    hogwild_step_tokens: int = 8      # hogwild interleaved: tokens per step committed to the history
    hogwild_prompt: bool = False      # hogwild: tell the workers they collaborate (prompt + headers)
    # multimodal (scaling_rl.llm.video_grpo): "video" trains a frame encoder + LM on the long-video
    # counting task (task is then ignored); the encoder is trained in SFT, frozen in GRPO
    multimodal: str = ""              # "" | "video"
    frames: int = 256                 # video: frames per video
    frame_dim: int = 16               # video: pixels per frame
    frame_encoder_hidden: int = 64    # video: the frame encoder MLP's hidden width
    frames_per_token: int = 1         # video: consecutive frames encoded into one frame token
    video_events: int = 4             # video: the answer (flash count) is in 1..video_events
    sp_workers: int = 1               # video: processes the update's passes are sequence-parallel over (CPU)
    # bookkeeping
    eval_every: int = 10
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    seed: int = 0
    torch_threads: int = 1            # tiny models run fastest single-threaded
    device: str = "cpu"               # "cpu", "cuda", "cuda:1", ... or "auto" (cuda if available)
    bf16: bool = False                # bfloat16 autocast for forward passes (weights stay float32)

    def __post_init__(self):
        def need(cond, key, what):
            if not cond:
                raise ValueError(f"{key}: {getattr(self, key)!r} {what}")
        need(self.loss_type in objectives.LOSS_TYPES, "loss_type", f"is unknown; use one of {objectives.LOSS_TYPES}")
        need(self.scale_rewards in objectives.SCALE_REWARDS, "scale_rewards",
             f"is unknown; use one of {objectives.SCALE_REWARDS}")
        from scaling_rl.llm import tasks as _tasks
        need(self.task in _tasks.TASKS, "task", f"is unknown; use one of {sorted(_tasks.TASKS)}")
        need(self.task != "jsonl" or self.dataset, "dataset", "is empty; task=jsonl needs a JSONL file")
        need(not self.reward or self.reward in _tasks.REWARDS, "reward",
             f"is not registered; known: {sorted(_tasks.REWARDS)}")
        need(self.device == "auto" or _is_device(self.device), "device",
             "is not a torch device; use cpu, cuda, cuda:<i> or auto")
        need(self.sft_steps >= -1, "sft_steps", "must be >= 0 (or -1: the model's default)")
        for key in ("steps", "max_completion_length", "weight_decay", "beta", "eval_samples",
                    "epsilon_low", "epsilon_high", "format_reward", "seed"):
            need(getattr(self, key) >= 0, key, "is negative; use a value >= 0")
        for key in ("prompts_per_step", "num_iterations", "num_minibatches", "train_pool",
                    "eval_problems", "sft_batch_size", "eval_every", "checkpoint_every",
                    "keep_checkpoints", "max_sampling_rounds", "torch_threads", "hidden_size",
                    "num_layers", "num_heads"):
            need(getattr(self, key) >= 1, key, "must be >= 1")
        need(self.group_size >= 2, "group_size", "must be >= 2 (advantages compare within a group)")
        need(self.temperature > 0, "temperature", "must be > 0 for training (greedy samples have no "
             "usable log-probs); evaluation is already greedy")
        need(0 < self.top_p <= 1, "top_p", "is outside (0, 1]")
        need(self.lr > 0 and self.sft_lr > 0, "lr", "must be > 0 (lr and sft_lr)")
        need(self.epsilon_low < 1, "epsilon_low", "must be < 1")
        from scaling_rl.llm import sources as _sources
        need(self.rollout in _sources.SOURCES, "rollout", f"is unknown; use one of {_sources.SOURCES}")
        need(self.objective in objectives.OBJECTIVES, "objective",
             f"is unknown; use one of {objectives.OBJECTIVES}")
        need(self.rollout == "sync" or not (self.selective_rollouts or self.dynamic_sampling),
             "rollout", "cannot use selective_rollouts / dynamic_sampling (sync only); use rollout=sync")
        for key in ("max_staleness", "searchers", "sync_every", "replay_capacity"):
            need(getattr(self, key) >= 1, key, "must be >= 1")
        need(self.tb_beta > 0 and self.replay_temperature > 0, "tb_beta",
             "must be > 0 (tb_beta and replay_temperature)")
        need(0 <= self.replay_reward_fraction <= 1, "replay_reward_fraction", "is outside [0, 1]")
        need(self.is_cap <= 0 or self.is_cap >= 1, "is_cap", "must be >= 1 (or <= 0: no cap)")
        need(self.rollout != "tba" or self.replay_capacity >= self.prompts_per_step, "replay_capacity",
             "must hold at least prompts_per_step groups")
        need(self.rollout != "ray" or self.prompts_per_step % self.searchers == 0, "searchers",
             f"must divide prompts_per_step={self.prompts_per_step} for rollout=ray")
        need(self.prompts_per_step * self.group_size % self.num_minibatches == 0, "num_minibatches",
             "must divide prompts_per_step * group_size")
        need(self.sp_workers >= 1, "sp_workers", "must be >= 1")
        need(self.sp_workers == 1 or self.multimodal == "video", "sp_workers",
             "> 1 needs multimodal=video (the sequence-parallel update is the video trainer's)")
        if self.multimodal:
            from scaling_rl.llm.video_task import check_config as _check_video
            _check_video(self)
        if self.rollout == "hogwild":
            from scaling_rl.llm.hogwild import check_config
            check_config(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GRPOConfig":
        return config_from_dict(cls, d, "GRPO")


def _is_device(name: str) -> bool:
    try:
        torch.device(name)
    except (RuntimeError, TypeError):
        return False
    return True


def resolve_device(name: str) -> torch.device:
    """torch.device for a config's `device`; a CUDA device without CUDA is a one-line error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {name!r} but torch.cuda.is_available() is False; use device=cpu")
    return dev
