"""Continuous batching with in-flight weight updates (PipelineRL) over one KV cache.

`decode_stream` keeps `slots` sequences decoding together. Between two decode steps it calls
`poll()`, which may load new weights into the model in place and returns the policy version: the
running sequences continue with the new weights and their KV cache (computed by older versions)
is kept, so one sequence's tokens can come from several versions; each token records the version
and the log-prob of the weights that produced its logits. A finished slot is refilled at once with
the next request (its prompt is prefilled alone and written into the slot's row of the cache), so
short completions never wait for long ones.

Cache layout: every row has the same cache length L; a row's prompt sits right-aligned at the
time it was inserted and columns to its left are masked. Columns no live row attends to are cut
from the left, so L stays below the longest prompt + `max_new_tokens` + a few.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Hashable

import torch

from scaling_rl.llm import rollout


@dataclasses.dataclass
class _Row:
    key: Hashable
    prompt: list[int]
    tokens: list[int] = dataclasses.field(default_factory=list)
    logps: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)


def _layers(cache):
    return cache.layers


def decode_stream(model, *, slots: int, next_request: Callable[[], tuple | None],
                  poll: Callable[[bool], int], emit: Callable[..., None],
                  should_stop: Callable[[], bool], max_new_tokens: int, eos_id, pad_id: int,
                  temperature: float = 1.0, top_p: float = 1.0,
                  generator: torch.Generator | None = None) -> None:
    """Decode requests `(key, prompt_ids)` from `next_request()` (None: nothing to start now) in
    `slots` rows until `should_stop()`; `emit(key, prompt, tokens, logps, versions, finished)` once
    per finished sequence. `poll(idle)` runs before every decode step (idle: no live row; it may
    block there waiting for work) and returns the current version."""
    dev = next(model.parameters()).device
    cache_kw, cache = rollout._new_cache(model)
    rows: list[_Row | None] = [None] * slots
    attn = torch.zeros(slots, 0, dtype=torch.long, device=dev)
    next_pos = torch.zeros(slots, 1, dtype=torch.long, device=dev)
    logits = torch.zeros(slots, model.config.vocab_size, device=dev)
    logit_version = torch.zeros(slots, dtype=torch.long, device=dev)
    version = poll(True)
    with torch.inference_mode():
        while not should_stop():
            # refill free slots (prefilled together with the weights of this version)
            new = []
            for i in range(slots):
                if rows[i] is None:
                    req = next_request()
                    if req is None:
                        break
                    rows[i] = _Row(req[0], list(req[1]))
                    new.append(i)
            if new:
                attn, next_pos = _insert(model, cache_kw, cache, attn, next_pos, rows, new,
                                         logits, pad_id)
                logit_version[new] = version
            live = [i for i in range(slots) if rows[i] is not None]
            if not live:
                version = poll(True)
                continue
            # sample one token for every live row from its current logits
            live_t = torch.tensor(live, device=dev)
            tok = torch.full((slots,), pad_id, dtype=torch.long, device=dev)
            tok[live_t] = rollout._sample_next(logits[live_t], temperature, top_p, generator)
            lp = torch.zeros(slots, device=dev)
            lp[live_t] = rollout.token_logp(logits[live_t], tok[live_t], temperature)
            stop = rollout._is_stop(tok, eos_id)
            # one device -> host read per decode step (not four per live row): float64 holds
            # token ids, versions and flags exactly
            host = torch.stack([tok.double(), lp.double(), logit_version.double(),
                                stop.double()]).tolist()
            for i in live:
                r = rows[i]
                r.tokens.append(int(host[0][i]))
                r.logps.append(float(host[1][i]))
                r.versions.append(int(host[2][i]))
                finished = bool(host[3][i])
                if finished or len(r.tokens) >= max_new_tokens:
                    emit(r.key, r.prompt, r.tokens, r.logps, r.versions, finished)
                    rows[i] = None
            live = [i for i in range(slots) if rows[i] is not None]
            if not live:
                version = poll(False)
                continue
            # weights may change here: the next logits (and KV entries) come from the new version
            version = poll(False)
            alive = torch.tensor([r is not None for r in rows], device=dev)
            pending_tok = torch.where(alive, tok, torch.full_like(tok, pad_id))
            attn = torch.cat([attn, torch.ones(slots, 1, dtype=attn.dtype, device=dev)], dim=1)
            out = model(input_ids=pending_tok[:, None], attention_mask=attn, position_ids=next_pos,
                        use_cache=True, **{cache_kw: cache})
            logits = out.logits[:, -1].float()
            logit_version[live] = version
            next_pos = torch.where(alive[:, None], next_pos + 1, torch.zeros_like(next_pos))
            attn = _compact(cache, attn, rows)


def _insert(model, cache_kw, cache, attn, next_pos, rows, new, logits, pad_id):
    """Prefill the prompts of rows `new` together and write them into the shared cache."""
    dev = attn.device
    prompts = [rows[i].prompt for i in new]
    P = max(len(p) for p in prompts)
    ids = torch.full((len(new), P), pad_id, dtype=torch.long, device=dev)
    pmask = torch.zeros((len(new), P), dtype=torch.long, device=dev)
    for j, p in enumerate(prompts):
        ids[j, P - len(p):] = torch.tensor(p, device=dev)
        pmask[j, P - len(p):] = 1
    kw, fresh = rollout._new_cache(model)
    out = model(input_ids=ids, attention_mask=pmask, position_ids=rollout._positions(pmask),
                use_cache=True, logits_to_keep=1, **{kw: fresh})
    logits[new] = out.logits[:, -1].float()
    L = attn.shape[1]
    if L < P:  # widen every row on the left (masked columns)
        attn = torch.cat([torch.zeros(attn.shape[0], P - L, dtype=attn.dtype, device=dev), attn], 1)
        for layer in _layers(cache):
            if layer.is_initialized and layer.keys.numel():
                pad = layer.keys.new_zeros(*layer.keys.shape[:2], P - L, layer.keys.shape[-1])
                layer.keys = torch.cat([pad, layer.keys], dim=-2)
                layer.values = torch.cat([pad.clone(), layer.values], dim=-2)
        L = P
    idx = torch.tensor(new, device=dev)
    for layer, src in zip(_layers(cache), _layers(fresh)):
        if not layer.is_initialized or layer.keys.numel() == 0:  # first insertion: build rows
            shape = (attn.shape[0], *src.keys.shape[1:2], L, src.keys.shape[-1])
            layer.lazy_initialization(src.keys, src.values)
            layer.keys = src.keys.new_zeros(shape)
            layer.values = src.values.new_zeros(shape)
        layer.keys[idx, :, L - P:] = src.keys
        layer.values[idx, :, L - P:] = src.values
        layer.keys[idx, :, :L - P] = 0
        layer.values[idx, :, :L - P] = 0
    attn = attn.clone()
    attn[idx] = 0
    attn[idx, L - P:] = pmask
    next_pos = next_pos.clone()
    next_pos[idx, 0] = pmask.sum(-1)
    return attn, next_pos


def _compact(cache, attn, rows):
    """Drop cache columns that no live row attends to (all on the left)."""
    live = torch.tensor([r is not None for r in rows], device=attn.device)
    used = attn[live].any(0)
    if not bool(used.any()):
        return attn
    first = int(used.nonzero()[0])
    if first == 0:
        return attn
    for layer in _layers(cache):
        layer.keys = layer.keys[:, :, first:]
        layer.values = layer.values[:, :, first:]
    return attn[:, first:]
