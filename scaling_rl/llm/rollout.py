"""Sampling and scoring with a torch causal LM: prompts -> completions -> rewards / log-probs.

Prompts are left-padded; position ids come from the attention mask, so padding never shifts a
sequence. Sampling is our own KV-cached loop (temperature, top-p, stop at any of the EOS ids) driven by an
explicit `torch.Generator`, which makes runs reproducible and resumable. With `record_logp=True` a
batch also carries the behaviour policy's per-token log-prob (under logits / temperature, the
trainer's convention; top-p truncation is not renormalised into it) and the policy version of each
token, which the asynchronous objectives need.
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
    logp: torch.Tensor | None = None      # (B, T) behaviour log-prob of each sampled token
    versions: torch.Tensor | None = None  # (B, T) int64 policy version that sampled each token


def set_training(model, mode: bool) -> None:
    """`model.train(mode)` without transformers' per-call re-kernelisation (~1.5 ms a call on the
    tiny model, more on a deep one; two calls per GRPO step). Sets every module's `training` flag
    (dropout), and a model using hub kernels (`use_kernels`, transformers' default) is kernelised
    once for training: training kernels also run forward-only passes, so switching back and forth
    never needs a new kernel mapping. A `model.eval()` elsewhere (inference kernels) is undone at
    the next call."""
    from transformers import PreTrainedModel
    for module in model.modules():   # a wrapper's inner transformers model included
        module.training = mode
        # `use_kernels` exists from transformers 5.x on (pyproject allows >= 4.45: absent there)
        if isinstance(module, PreTrainedModel) and getattr(module, "use_kernels", False):
            from kernels import Mode
            if getattr(module, "_kernels_mode", None) != Mode.TRAINING:
                module.kernels_mode = Mode.TRAINING


def stop_ids(model, tokenizer) -> tuple[int, ...]:
    """Every id that ends a completion: the tokenizer's EOS and all of the generation config's."""
    ids = {tokenizer.eos_token_id}
    gen_cfg = getattr(model, "generation_config", None)
    extra = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
    ids.update(extra if isinstance(extra, (list, tuple)) else [extra])
    return tuple(sorted(i for i in ids if i is not None))


def _is_stop(tokens: torch.Tensor, eos_id) -> torch.Tensor:
    if isinstance(eos_id, torch.Tensor):
        return torch.isin(tokens, eos_id)
    if not isinstance(eos_id, int) and len(eos_id) == 1:
        eos_id = int(next(iter(eos_id)))
    if isinstance(eos_id, int):
        return tokens == eos_id
    return torch.isin(tokens, torch.as_tensor(list(eos_id), device=tokens.device))


def first_stop_mask(ids: torch.Tensor, eos_id) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask = 1 up to and including the first stop id (everything when none), finished (B,))."""
    is_eos = _is_stop(ids, eos_id)
    after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    return (~after_eos).long(), is_eos.any(-1)


def completion_budget(max_completion_length: int, task, tokenizer) -> int:
    """Completion length in tokens: `max_completion_length` when > 0; 0 means the task's longest
    answer + EOS, which is a token count only for a one-token-per-character tokenizer (the tiny
    built-in models). With any other tokenizer 0 is refused: characters are not tokens, and a
    pretrained chat model writes more than the bare answer (cut off, every reward would be 0)."""
    if max_completion_length > 0:
        return int(max_completion_length)
    from scaling_rl.llm.models import one_token_per_char
    if not one_token_per_char(tokenizer):
        raise ValueError("max_completion_length: 0 (the task's answer length in characters) needs a "
                         "one-token-per-character tokenizer; set a budget in tokens for this model, "
                         "e.g. max_completion_length=256")
    return task.max_answer_chars() + 1


def render_prompts(tokenizer, prompts: list[str], chat_template: bool = False) -> list[str]:
    """Prompts as the model sees them: through the tokenizer's chat template (one user turn plus
    the generation prompt) when `chat_template` is set and the tokenizer has one, else unchanged."""
    if not chat_template or not getattr(tokenizer, "chat_template", None):
        return list(prompts)
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                          add_generation_prompt=True) for p in prompts]


def encode_prompts(tokenizer, prompts: list[str], chat_template: bool = False,
                   device=None) -> tuple[torch.Tensor, torch.Tensor]:
    prompts = render_prompts(tokenizer, prompts, chat_template)
    enc = tokenizer(prompts, padding=True, padding_side="left", return_tensors="pt",
                    add_special_tokens=False)
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


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
           eos_id, pad_id: int, temperature: float = 1.0, top_p: float = 1.0,
           generator: torch.Generator | None = None, record_logp: bool = False,
           version: int = 0, record_versions: bool | None = None, shared_prefix: int = 1) -> Batch:
    """Sample one completion per row, stopping a row at any id of `eos_id` (an int or a sequence)
    and the batch when all rows stopped. `record_logp`: also return the behaviour log-probs;
    `record_versions` (default: `record_logp`): `version` as every token's policy version.
    `shared_prefix=k`: rows are runs of k copies of one prompt (each run's prompt is encoded once)."""
    with torch.inference_mode():
        ids, logp = _sample(model, prompt_ids, prompt_mask, max_new_tokens, eos_id, pad_id,
                            temperature, top_p, generator, record_logp, shared_prefix)
        mask, finished = first_stop_mask(ids, eos_id)
    # clones made outside inference mode, so autograd may later save them (e.g. gather indices)
    record_versions = record_logp if record_versions is None else record_versions
    versions = torch.full_like(ids, version) if record_versions else None
    return Batch(prompt_ids, prompt_mask, ids.clone(), mask.clone(), finished.clone(),
                 None if logp is None else logp.clone(), versions)


def token_logp(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / temperature)[token] in float32 (the trainer's log-prob convention)."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return F.log_softmax(logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)


def _sample(model, prompt_ids, prompt_mask, max_new_tokens, eos_id, pad_id, temperature, top_p,
            generator, record_logp=False, shared_prefix=1):
    B, dev = prompt_ids.shape[0], prompt_ids.device
    pos = _positions(prompt_mask)
    cache_kw, cache = _new_cache(model)  # filled in place by every forward
    # shared_prefix = k: rows come in runs of k identical prompts (G completions of one prompt);
    # the prompt is encoded once per run and its KV cache and last logits repeated k times
    k = shared_prefix if shared_prefix > 1 and B % shared_prefix == 0 else 1
    out = model(input_ids=prompt_ids[::k], attention_mask=prompt_mask[::k], position_ids=pos[::k],
                use_cache=True, logits_to_keep=1, **{cache_kw: cache})
    logits = out.logits[:, -1]
    if k > 1:
        cache.batch_repeat_interleave(k)
        logits = logits.repeat_interleave(k, dim=0)
    attn, next_pos = prompt_mask, pos[:, -1:] + 1
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    if not isinstance(eos_id, int) and len(eos_id) > 1:   # one tensor, not one per decode step
        eos_id = torch.as_tensor(list(eos_id), device=dev)
    tokens, logps = [], []
    for t in range(max_new_tokens):
        tok = _sample_next(logits, temperature, top_p, generator)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        tokens.append(tok)
        if record_logp:
            logps.append(token_logp(logits, tok, temperature))
        done = done | _is_stop(tok, eos_id)
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        attn = torch.cat([attn, torch.ones(B, 1, dtype=attn.dtype, device=dev)], dim=1)
        out = model(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos,
                    use_cache=True, **{cache_kw: cache})
        logits = out.logits[:, -1]
        next_pos = next_pos + 1
    return torch.stack(tokens, dim=1), (torch.stack(logps, dim=1) if record_logp else None)


CHUNK_ELEMENTS = 1 << 22  # float32 working set of the chunked log-softmax: 16 MB per chunk


def _chunks(n: int, vocab: int):
    step = max(1, CHUNK_ELEMENTS // max(vocab, 1))
    return [(s, min(s + step, n)) for s in range(0, n, step)]


class _SelectiveLogSoftmax(torch.autograd.Function):
    """log softmax(logits / T)[token] for (N, V) logits without materialising the log-softmax:
    the chosen logit minus a float32 logsumexp, a chunk of rows at a time. Saves only the logits it
    was given (no float32 copy); backward recomputes the softmax chunk by chunk."""

    @staticmethod
    def forward(ctx, logits, tokens, temperature, consume):
        out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(out)
        for s, e in _chunks(logits.shape[0], logits.shape[1]):
            x = logits[s:e].float()
            if temperature != 1.0:
                x = x / temperature
            lse[s:e] = torch.logsumexp(x, -1)
            out[s:e] = x.gather(-1, tokens[s:e, None]).squeeze(-1) - lse[s:e]
        ctx.temperature, ctx.consume = temperature, consume
        ctx.save_for_backward(logits, tokens, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        logits, tokens, lse = ctx.saved_tensors
        t = ctx.temperature
        # consume: the gradient overwrites the logits chunk by chunk (their last use), so the
        # backward needs no second logits-sized buffer
        out = logits if ctx.consume else torch.empty_like(logits)
        for s, e in _chunks(logits.shape[0], logits.shape[1]):
            x = logits[s:e].float()
            if t != 1.0:
                x = x / t
            g = torch.exp(x - lse[s:e, None])
            g.mul_(-grad[s:e, None])
            g.scatter_add_(-1, tokens[s:e, None], grad[s:e, None].to(g.dtype))
            if t != 1.0:
                g.div_(t)
            out[s:e] = g
        return out, None, None, None


def selective_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0,
                       consume: bool = False) -> torch.Tensor:
    """float32 log softmax(logits / temperature) at `tokens` ((..., V) logits, (...) tokens),
    differentiable, peak extra memory one float32 chunk (`CHUNK_ELEMENTS`) besides the gradient.
    `consume=True`: the backward writes the gradient into `logits` (nothing may read them after)."""
    V = logits.shape[-1]
    flat = _SelectiveLogSoftmax.apply(logits.reshape(-1, V), tokens.reshape(-1), float(temperature),
                                      bool(consume))
    return flat.view(tokens.shape)


@torch.no_grad()
def chunked_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) per row, float32, a chunk of rows at a time."""
    V = logits.shape[-1]
    flat = logits.reshape(-1, V)
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
    for s, e in _chunks(flat.shape[0], V):
        x = flat[s:e].float()
        if temperature != 1.0:
            x = x / temperature
        lse = torch.logsumexp(x, -1)
        out[s:e] = lse - (torch.softmax(x, -1) * x).sum(-1)
    return out.view(logits.shape[:-1])


def completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                        temperature: float = 1.0, with_entropy: bool = False,
                        micro_batch: int | None = None):
    """Per-token log π(token | prefix) of the completion under `model` (logits / temperature).

    Returns (logp (B, T), entropy (B, T) or None), float32. Differentiable; wrap in no_grad when
    not needed. Memory: the model's logits of the rows in flight (B x T x V in its dtype) plus one
    float32 chunk (a selective log-softmax; no full-vocabulary float32 copy or log-softmax is
    made). `micro_batch`: without grad, run at most that many rows per forward.
    """
    B = completion_ids.shape[0]
    if micro_batch and B > micro_batch and not torch.is_grad_enabled():
        parts = [completion_logprobs(model, prompt_ids[s:s + micro_batch],
                                     prompt_mask[s:s + micro_batch],
                                     completion_ids[s:s + micro_batch],
                                     completion_mask[s:s + micro_batch], temperature, with_entropy)
                 for s in range(0, B, micro_batch)]
        return (torch.cat([p[0] for p in parts]),
                torch.cat([p[1] for p in parts]) if with_entropy else None)
    T = completion_ids.shape[1]
    # the last completion token predicts nothing we score: feeding all but it makes the kept
    # logits exactly the T positions that predict completion tokens, contiguous (no slice copy)
    ids = torch.cat([prompt_ids, completion_ids[:, :-1]], dim=1)
    mask = torch.cat([prompt_mask, completion_mask[:, :-1].to(prompt_mask.dtype)], dim=1)
    out = model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask),
                logits_to_keep=T, use_cache=False)
    logits = out.logits
    entropy = chunked_entropy(logits.detach(), temperature) if with_entropy else None
    # the logits die here (only log-probs and entropy are returned): the backward may reuse them
    logp = selective_logprobs(logits, completion_ids, temperature, consume=True)
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


def autocast(device: torch.device, bf16: bool):
    """bfloat16 autocast on `device` when `bf16` (weights stay float32), else a no-op context."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)


def sample_groups(model, tokenizer, task, problems, cfg, *, eos_ids, max_len: int,
                  generator, version: int, device, record_logp: bool = True) -> tuple[Batch, np.ndarray]:
    """`cfg.group_size` completions of each problem (rows grouped per problem), with `version`
    (and behaviour log-probs unless `record_logp=False`), and their rewards; `cfg` gives sampling
    and template settings."""
    G = cfg.group_size
    # each prompt tokenised once, its row repeated G times (the same left-padded rows as
    # tokenising the G copies: the batch's longest prompt, hence the padding, is unchanged)
    ids, mask = encode_prompts(tokenizer, [p.prompt for p in problems], cfg.chat_template, device)
    ids, mask = ids.repeat_interleave(G, dim=0), mask.repeat_interleave(G, dim=0)
    with autocast(torch.device(device), cfg.bf16):
        batch = sample(model, ids, mask, max_new_tokens=max_len, eos_id=eos_ids,
                       pad_id=tokenizer.pad_token_id, temperature=cfg.temperature,
                       top_p=cfg.top_p, generator=generator, record_logp=record_logp,
                       record_versions=True, version=version, shared_prefix=G)
    rewards = score(task, [p for p in problems for _ in range(G)], tokenizer, batch)
    return batch, rewards


def correct_counts(model, tokenizer, task, problems, *, n: int, max_new_tokens: int,
                   temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
                   batch_size: int = 2048, chat_template: bool = False) -> np.ndarray:
    """How many of n samples per problem earn the full reward (pass@k input)."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    counts = np.zeros(len(problems), dtype=np.int64)
    flat = [(j, p) for j, p in enumerate(problems) for _ in range(n)]
    set_training(model, False)
    for start in range(0, len(flat), batch_size):
        chunk = flat[start:start + batch_size]
        ids, mask = encode_prompts(tokenizer, [p.prompt for _, p in chunk], chat_template, device)
        batch = sample(model, ids, mask, max_new_tokens=max_new_tokens,
                       eos_id=stop_ids(model, tokenizer), pad_id=tokenizer.pad_token_id,
                       temperature=temperature, top_p=top_p, generator=gen)
        rewards = score(task, [p for _, p in chunk], tokenizer, batch)
        np.add.at(counts, [j for j, _ in chunk], (rewards >= 1.0).astype(np.int64))
    return counts


def accuracy(model, tokenizer, task, problems, *, max_new_tokens: int,
             chat_template: bool = False) -> float:
    """Greedy-decoding accuracy (fraction of problems with full reward)."""
    return float(correct_counts(model, tokenizer, task, problems, n=1,
                                max_new_tokens=max_new_tokens, temperature=0.0,
                                chat_template=chat_template).mean())


def _pad_to(x: torch.Tensor, width: int, value: int, left: bool) -> torch.Tensor:
    extra = width - x.shape[1]
    if extra <= 0:
        return x
    return F.pad(x, (extra, 0) if left else (0, extra), value=value)


def concat(batches: list[Batch], pad_id: int, completion_width: int | None = None) -> Batch:
    """Stack batches row-wise, re-padding prompts (left) and completions (right) to common widths.
    Behaviour log-probs / versions are kept when every batch has them (padded with 0 / -1)."""
    P = max(b.prompt_ids.shape[1] for b in batches)
    T = completion_width or max(b.completion_ids.shape[1] for b in batches)

    def cat(name, width, value, left):
        parts = [getattr(b, name) for b in batches]
        if any(p is None for p in parts):
            return None
        return torch.cat([_pad_to(p, width, value, left) for p in parts])

    return Batch(cat("prompt_ids", P, pad_id, True), cat("prompt_mask", P, 0, True),
                 cat("completion_ids", T, pad_id, False), cat("completion_mask", T, 0, False),
                 torch.cat([b.finished for b in batches]), cat("logp", T, 0.0, False),
                 cat("versions", T, -1, False))


def select(batch: Batch, rows) -> Batch:
    rows = torch.as_tensor(rows, dtype=torch.long, device=batch.prompt_ids.device)
    values = (getattr(batch, f.name) for f in dataclasses.fields(batch))
    return Batch(*[None if v is None else v[rows] for v in values])
