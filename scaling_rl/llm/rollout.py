"""Sampling and scoring with a torch causal LM: prompts -> completions -> rewards / log-probs.

Prompts are left-padded; position ids come from the attention mask, so padding never shifts a
sequence. Sampling is our own KV-cached loop (temperature, top-p, EOS stop) driven by an explicit
`torch.Generator`, which makes runs reproducible and resumable.
"""
from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import torch
import torch.nn.functional as F


@dataclasses.dataclass
class Batch:
    prompt_ids: torch.Tensor        # (B, P) left-padded
    prompt_mask: torch.Tensor       # (B, P)
    completion_ids: torch.Tensor    # (B, T) right-padded with pad after EOS
    completion_mask: torch.Tensor   # (B, T) 1 up to and including the first EOS
    finished: torch.Tensor          # (B,) bool: an EOS was produced


def encode_prompts(tokenizer, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    enc = tokenizer(prompts, padding=True, padding_side="left", return_tensors="pt",
                    add_special_tokens=False)
    return enc["input_ids"], enc["attention_mask"]


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def _sample_next(logits: torch.Tensor, temperature: float, top_p: float,
                 generator: torch.Generator | None) -> torch.Tensor:
    if temperature == 0.0:
        return logits.argmax(-1)
    probs = F.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        cum = sorted_p.cumsum(-1)
        drop = cum - sorted_p >= top_p          # keep the smallest prefix with mass >= top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _new_cache(model):
    """(kwarg name, empty DynamicCache): transformers 5 renamed `past_key_values` to `cache`."""
    from transformers import DynamicCache
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    try:
        cache = DynamicCache(config=model.config)
    except TypeError:
        cache = DynamicCache()
    return name, cache


def sample(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *, max_new_tokens: int,
           eos_id: int, pad_id: int, temperature: float = 1.0, top_p: float = 1.0,
           generator: torch.Generator | None = None) -> Batch:
    """Sample one completion per row, stopping rows at EOS and the batch when all stopped."""
    with torch.inference_mode():
        ids, mask, finished = _sample(model, prompt_ids, prompt_mask, max_new_tokens, eos_id,
                                      pad_id, temperature, top_p, generator)
    # clones made outside inference mode, so autograd may later save them (e.g. gather indices)
    return Batch(prompt_ids, prompt_mask, ids.clone(), mask.clone(), finished.clone())


def _sample(model, prompt_ids, prompt_mask, max_new_tokens, eos_id, pad_id, temperature, top_p,
            generator):
    B = prompt_ids.shape[0]
    pos = _positions(prompt_mask)
    cache_kw, cache = _new_cache(model)  # filled in place by every forward
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=pos,
                use_cache=True, logits_to_keep=1, **{cache_kw: cache})
    logits = out.logits[:, -1]
    attn, next_pos = prompt_mask, pos[:, -1:] + 1
    done = torch.zeros(B, dtype=torch.bool)
    tokens = []
    for t in range(max_new_tokens):
        tok = _sample_next(logits, temperature, top_p, generator)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        tokens.append(tok)
        done = done | (tok == eos_id)
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        attn = torch.cat([attn, torch.ones(B, 1, dtype=attn.dtype)], dim=1)
        out = model(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos,
                    use_cache=True, **{cache_kw: cache})
        logits = out.logits[:, -1]
        next_pos = next_pos + 1
    ids = torch.stack(tokens, dim=1)
    is_eos = ids == eos_id
    # mask = 1 up to and including the first EOS (everything when none)
    after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    mask = (~after_eos).long()
    return ids, mask, is_eos.any(-1)


def completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                        temperature: float = 1.0, with_entropy: bool = False):
    """Per-token log π(token | prefix) of the completion under `model` (logits / temperature).

    Returns (logp (B, T), entropy (B, T) or None). Differentiable; wrap in no_grad when not needed.
    """
    T = completion_ids.shape[1]
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    out = model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask),
                logits_to_keep=T + 1, use_cache=False)
    logits = out.logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    logsm = F.log_softmax(logits, dim=-1)
    logp = logsm.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logsm.exp() * logsm).sum(-1)
    return logp, entropy


def decode(tokenizer, batch: Batch) -> list[str]:
    """Completion texts, cut at the first EOS, special tokens dropped."""
    ids = batch.completion_ids.masked_fill(batch.completion_mask == 0, tokenizer.pad_token_id)
    return tokenizer.batch_decode(ids.tolist(), skip_special_tokens=True)


def score(task, problems, tokenizer, batch: Batch) -> np.ndarray:
    """Task rewards, one per row of `batch` (row i answers problems[i])."""
    texts = decode(tokenizer, batch)
    fin = batch.finished.tolist()
    return np.array([task.reward(p, t, f) for p, t, f in zip(problems, texts, fin)],
                    dtype=np.float32)


def correct_counts(model, tokenizer, task, problems, *, n: int, max_new_tokens: int,
                   temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
                   batch_size: int = 2048) -> np.ndarray:
    """How many of n samples per problem earn the full reward (pass@k input)."""
    gen = torch.Generator().manual_seed(seed)
    counts = np.zeros(len(problems), dtype=np.int64)
    flat = [(j, p) for j, p in enumerate(problems) for _ in range(n)]
    model.eval()
    for start in range(0, len(flat), batch_size):
        chunk = flat[start:start + batch_size]
        ids, mask = encode_prompts(tokenizer, [p.prompt for _, p in chunk])
        batch = sample(model, ids, mask, max_new_tokens=max_new_tokens,
                       eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                       temperature=temperature, top_p=top_p, generator=gen)
        rewards = score(task, [p for _, p in chunk], tokenizer, batch)
        np.add.at(counts, [j for j, _ in chunk], (rewards >= 1.0).astype(np.int64))
    return counts


def accuracy(model, tokenizer, task, problems, *, max_new_tokens: int) -> float:
    """Greedy-decoding accuracy (fraction of problems with full reward)."""
    return float(correct_counts(model, tokenizer, task, problems, n=1,
                                max_new_tokens=max_new_tokens, temperature=0.0).mean())


def _pad_to(x: torch.Tensor, width: int, value: int, left: bool) -> torch.Tensor:
    extra = width - x.shape[1]
    if extra <= 0:
        return x
    return F.pad(x, (extra, 0) if left else (0, extra), value=value)


def concat(batches: list[Batch], pad_id: int, completion_width: int | None = None) -> Batch:
    """Stack batches row-wise, re-padding prompts (left) and completions (right) to common widths."""
    P = max(b.prompt_ids.shape[1] for b in batches)
    T = completion_width or max(b.completion_ids.shape[1] for b in batches)
    return Batch(
        torch.cat([_pad_to(b.prompt_ids, P, pad_id, True) for b in batches]),
        torch.cat([_pad_to(b.prompt_mask, P, 0, True) for b in batches]),
        torch.cat([_pad_to(b.completion_ids, T, pad_id, False) for b in batches]),
        torch.cat([_pad_to(b.completion_mask, T, 0, False) for b in batches]),
        torch.cat([b.finished for b in batches]),
    )


def select(batch: Batch, rows) -> Batch:
    rows = torch.as_tensor(rows, dtype=torch.long)
    return Batch(batch.prompt_ids[rows], batch.prompt_mask[rows], batch.completion_ids[rows],
                 batch.completion_mask[rows], batch.finished[rows])
