"""A multimodal (video) causal LM: a small frame encoder projecting into a Qwen2 LM's embeddings.

`VideoLM` is a `Qwen2ForCausalLM` with one extra submodule, `frame_encoder`: frames (F, frame_dim)
are grouped `frames_per_token` at a time (concatenated) and mapped by an MLP (frame_dim x
frames_per_token -> encoder_hidden -> hidden_size) to F / frames_per_token "frame tokens" in the
LM's embedding space. The prompt the
LM sees is `inputs_embeds` = frame tokens + the question's token embeddings (Long-RL's layout:
video first, then text). It is registered with the transformers Auto classes (model_type
"video_qwen2"), so `save_pretrained` / `load_policy(path)` round-trip the encoder with the LM.

Sampling (`sample_video`) and scoring (`video_logprobs`) take the prefix *embeddings*, so the
embedding cache (`EmbeddingCache`) can encode a video once and hand the same tensor to all G
rollouts of its group and to the training forward (Long-RL's MR-SP stage 1).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from scaling_rl.llm import rollout


class VideoLMConfig(Qwen2Config):
    model_type = "video_qwen2"

    def __init__(self, frame_dim: int = 16, encoder_hidden: int = 64, frames_per_token: int = 1,
                 **kwargs):
        self.frame_dim, self.encoder_hidden = int(frame_dim), int(encoder_hidden)
        self.frames_per_token = int(frames_per_token)
        super().__init__(**kwargs)


class FrameEncoder(nn.Module):
    """(B, F, frame_dim) frames -> (B, F / frames_per_token, hidden) frame tokens: each token is an
    MLP of `frames_per_token` consecutive frames concatenated (a short clip; nothing averaged away)."""

    def __init__(self, frame_dim: int, encoder_hidden: int, hidden_size: int, frames_per_token: int):
        super().__init__()
        self.frames_per_token = frames_per_token
        self.fc1 = nn.Linear(frame_dim * frames_per_token, encoder_hidden)
        self.fc2 = nn.Linear(encoder_hidden, hidden_size)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        B, n, d = frames.shape
        k = self.frames_per_token
        if n % k:
            raise ValueError(f"frames: {n} is not divisible by frames_per_token={k}")
        return self.fc2(F.gelu(self.fc1(frames.reshape(B, n // k, k * d))))

    def flops(self, n_frames: int) -> int:
        """Multiply-adds x 2 of encoding `n_frames` frames (the two matmuls; GELU and biases,
        O(tokens x width), are not counted)."""
        tokens = n_frames // self.frames_per_token
        return 2 * tokens * (self.fc1.in_features * self.fc1.out_features
                             + self.fc2.in_features * self.fc2.out_features)


class VideoLM(Qwen2ForCausalLM):
    config_class = VideoLMConfig

    def __init__(self, config: VideoLMConfig):
        super().__init__(config)
        self.frame_encoder = FrameEncoder(config.frame_dim, config.encoder_hidden,
                                          config.hidden_size, config.frames_per_token)

    def encode_frames(self, frames: torch.Tensor) -> torch.Tensor:
        return self.frame_encoder(frames.to(self.dtype))

    def prefix_embeds(self, video_tokens: torch.Tensor, question_ids: torch.Tensor) -> torch.Tensor:
        """(B, N, H) frame tokens + (Q,) or (B, Q) question ids -> (B, N + Q, H) prompt embeddings."""
        B = video_tokens.shape[0]
        q = question_ids if question_ids.dim() == 2 else question_ids[None].expand(B, -1)
        return torch.cat([video_tokens, self.get_input_embeddings()(q)], dim=1)


AutoConfig.register("video_qwen2", VideoLMConfig, exist_ok=True)
AutoModelForCausalLM.register(VideoLMConfig, VideoLM, exist_ok=True)


def video_config_from(lm_config, *, frame_dim: int, encoder_hidden: int,
                      frames_per_token: int) -> VideoLMConfig:
    """The VideoLMConfig of an LM config (a Qwen2 / Llama-shaped one) plus a frame encoder."""
    cfg = lm_config.to_dict()
    for k in ("model_type", "architectures", "transformers_version", "auto_map"):
        cfg.pop(k, None)
    return VideoLMConfig(frame_dim=frame_dim, encoder_hidden=encoder_hidden,
                         frames_per_token=frames_per_token, **cfg)


def video_lm_from(lm, *, frame_dim: int, encoder_hidden: int, frames_per_token: int,
                  seed: int = 0) -> VideoLM:
    """A VideoLM holding `lm`'s (a Qwen2 / Llama-shaped causal LM built by `tiny_model`) weights
    and a freshly initialised frame encoder (seeded)."""
    if isinstance(lm, VideoLM):
        return lm
    config = video_config_from(lm.config, frame_dim=frame_dim, encoder_hidden=encoder_hidden,
                               frames_per_token=frames_per_token)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = VideoLM(config)
    missing, unexpected = model.load_state_dict(lm.state_dict(), strict=False)
    if unexpected or any(not k.startswith("frame_encoder.") for k in missing):
        raise ValueError(f"model: cannot carry a {type(lm).__name__} into a VideoLM "
                         f"(unexpected {unexpected[:3]}, missing {missing[:3]}); use a tiny:qwen2 model")
    return model.float()


# ---- sampling and scoring from prefix embeddings -------------------------------------------------

@torch.no_grad()
def sample_video(model, prefix: torch.Tensor, *, max_new_tokens: int, eos_id, pad_id: int,
                 temperature: float = 1.0, top_p: float = 1.0,
                 generator: torch.Generator | None = None, record_logp: bool = False,
                 version: int = 0) -> rollout.Batch:
    """One completion per row of `prefix` ((B, L, H) prompt embeddings, no padding: every video
    prompt of a task has one length). Returns a `rollout.Batch` whose prompt fields are empty
    (B, 0); the caller fills them."""
    B, L, _ = prefix.shape
    dev = prefix.device
    cache_kw, cache = rollout._new_cache(model)
    pos = torch.arange(L, device=dev)[None].expand(B, -1)
    out = model(inputs_embeds=prefix, position_ids=pos, use_cache=True, logits_to_keep=1,
                **{cache_kw: cache})
    logits, next_pos = out.logits[:, -1], torch.full((B, 1), L, device=dev, dtype=torch.long)
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    tokens, logps = [], []
    for t in range(max_new_tokens):
        tok = rollout._sample_next(logits, temperature, top_p, generator)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        tokens.append(tok)
        if record_logp:
            logps.append(rollout.token_logp(logits, tok, temperature))
        done = done | rollout._is_stop(tok, eos_id)
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        out = model(input_ids=tok[:, None], position_ids=next_pos, use_cache=True,
                    **{cache_kw: cache})
        logits, next_pos = out.logits[:, -1], next_pos + 1
    ids = torch.stack(tokens, dim=1)
    mask, finished = rollout.first_stop_mask(ids, eos_id)
    ids = ids.masked_fill(mask == 0, pad_id)
    logp = torch.stack(logps, dim=1) * mask if record_logp else None
    empty = torch.zeros((B, 0), dtype=torch.long, device=dev)
    return rollout.Batch(empty, empty, ids, mask, finished, logp,
                         torch.full_like(ids, version) if record_logp else None)


def video_logprobs(model, prefix: torch.Tensor, completion_ids: torch.Tensor,
                   temperature: float = 1.0, with_entropy: bool = False):
    """Per-token log π(completion token | frames, question, earlier tokens): (B, T) float32 (and
    the entropy when asked). Differentiable (wrap in no_grad when not needed); right padding of the
    completions never reaches a scored position (causal attention)."""
    T = completion_ids.shape[1]
    emb = torch.cat([prefix, model.get_input_embeddings()(completion_ids[:, :-1])], dim=1)
    pos = torch.arange(emb.shape[1], device=emb.device)[None].expand(emb.shape[0], -1)
    logits = model(inputs_embeds=emb, position_ids=pos, logits_to_keep=T, use_cache=False).logits
    entropy = rollout.chunked_entropy(logits.detach(), temperature) if with_entropy else None
    return rollout.selective_logprobs(logits, completion_ids, temperature, consume=True), entropy


# ---- the embedding cache (MR-SP stage 1) ------------------------------------------------------------

def split_range(n: int, parts: int, index: int) -> tuple[int, int]:
    """[start, end) of part `index` of `n` items split into `parts` near-equal contiguous parts."""
    base, extra = divmod(n, parts)
    start = index * base + min(index, extra)
    return start, start + base + (index < extra)


class EmbeddingCache:
    """Frame tokens of the videos of one step, encoded once each and reused by every consumer.

    `put(key, frames)` encodes a video (when several torch.distributed workers share it, each
    encodes a contiguous share of its frames and the shares are all-gathered) and returns its slot;
    `get(slot)` returns the cached tensor. `clear()` starts a new step (the encoder may have
    changed). Counters: `encoded_frames`, `encoder_flops` (what was computed: the whole video's
    encoding, summed over the workers that share it), `requested_flops` (what encoding the video
    anew for every `get` would compute) and `encoder_flops_saved` (their difference).
    `shared=False`: this process encodes alone even inside a process group (the video trainer's
    rank 0, whose sequence-parallel workers take part in the update only).
    """

    def __init__(self, model: VideoLM, group=None, shared: bool = True):
        self.model, self.group, self.shared = model, group, shared
        self.slots: list[torch.Tensor] = []
        self.keys: dict = {}
        self.frames_per_slot: list[int] = []
        self.encoded_frames = self.encoder_flops = self.requested_flops = 0

    def clear(self) -> None:
        self.slots, self.keys, self.frames_per_slot = [], {}, []

    def _encode(self, frames: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist
        enc = self.model.frame_encoder
        if (not self.shared or not (dist.is_available() and dist.is_initialized())
                or dist.get_world_size(self.group) == 1):
            return self.model.encode_frames(frames[None])[0]
        world, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        k = enc.frames_per_token
        n_tok = frames.shape[0] // k
        shares = [split_range(n_tok, world, r) for r in range(world)]
        s, e = shares[rank]
        mine = self.model.encode_frames(frames[None, s * k:e * k])[0]
        width = max(b - a for a, b in shares)
        padded = F.pad(mine, (0, 0, 0, width - mine.shape[0]))
        gathered = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(gathered, padded, group=self.group)
        return torch.cat([g[:b - a] for g, (a, b) in zip(gathered, shares)])

    @torch.no_grad()
    def put(self, key, frames: torch.Tensor) -> int:
        if key in self.keys:
            return self.keys[key]
        tokens = self._encode(frames)
        n = frames.shape[0]
        self.encoded_frames += n
        self.encoder_flops += self.model.frame_encoder.flops(n)
        self.keys[key] = len(self.slots)
        self.slots.append(tokens)
        self.frames_per_slot.append(n)
        return self.keys[key]

    def get(self, slot: int) -> torch.Tensor:
        """The cached frame tokens of `slot`; counts one avoided re-encoding."""
        self.requested_flops += self.model.frame_encoder.flops(self.frames_per_slot[slot])
        return self.slots[slot]

    @property
    def encoder_flops_saved(self) -> int:
        return max(0, self.requested_flops - self.encoder_flops)

    def gather(self, slots) -> torch.Tensor:
        """(len(slots), N, H) frame tokens of several rows (each `get` counted)."""
        return torch.stack([self.get(int(s)) for s in slots])
