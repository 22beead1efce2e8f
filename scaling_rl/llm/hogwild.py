"""Hogwild! Inference (Rodionov et al., 2025): W workers (the same model) generate in lockstep
over one shared attention cache, each seeing the others' tokens from the step after they are
written.

Storage (per layer, per prompt): the prompt's keys/values once; for every worker a block of its
own tokens; with the interleaved layout also a shared history. Every key is stored once, rotated
at its position *inside its block* (prompt keys at their prompt positions). A worker's view
lays the blocks out in its own order:

- `contiguous`: [prompt, the other workers' blocks (by index), own block];
- `interleaved`: [prompt, history, the others' current steps, own current step]; every
  `step_tokens` tokens each worker's current step is committed to the history (workers in
  index order), its keys re-rotated once to their history positions (no forward pass).

A block at view offset δ holds keys R(l)·k (l: position in the block); the worker's query at
view position p is rotated by p − δ for that block: (R(p − δ) q)·(R(l) k) = (R(p) q)·(R(δ + l) k),
which is the attention of the view laid out contiguously (RoPE scores depend only on relative
positions). So no key is ever re-encoded for a view; `naive` mode does exactly that instead
(gathers each view contiguously, re-rotates every key to its view position and runs the
model's own attention) and is the oracle of the tests and the baseline of
`benchmarks/hogwild.py`.

In lockstep, worker w's token of step t sees the prompt, the other workers' tokens of steps
< t and its own tokens ≤ t. (The reference code, github:eqimp/hogwild_llm, writes every worker's
new key/value of a layer before that layer's attention, so same-step tokens see each other; here
they become visible one step later, which keeps each view a causal prefix, so the model's own
forward can check it. Its interleaved layout is [prompt + history, step header, the other's
current step, own header, own current step] and it rotates keys per block offset (cached);
here queries are rotated.) A "step" of the interleaved layout is a fixed number of tokens
(the paper commits at paragraph ends); the optional header ("worker w: ") opens each worker's
block and so goes to the history with its first step.

Models: RoPE causal LMs with Llama-style layers (llama, qwen2, qwen3, mistral; no sliding
window). The forward re-uses the model's own modules (norms, projections, MLP, rotary table).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F

from scaling_rl.llm import rollout
from scaling_rl.llm.sources import SyncSource

LAYOUTS = ("contiguous", "interleaved")
MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
COLLAB_PROMPT = ("{workers} workers solve this together; each sees what the others write as "
                 "they write it; split the work, do not repeat it. ")
HEADER = "worker {worker}: "


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _expand(table: torch.Tensor, pos: torch.Tensor, dim: int) -> torch.Tensor:
    """table[pos] with singleton axes inserted before the last so it has `dim` axes."""
    out = table[pos]
    while out.dim() < dim:
        out = out.unsqueeze(-2)
    return out


class SharedCache:
    """One Hogwild! cache for B prompts × W workers, and the two ways to step it.

    `step(tokens, write)` (hogwild) and `naive_step(tokens, write)` both feed one token per
    worker ((B, W) ids; only rows with `write` are stored) and return (B, W, vocab) logits.
    """

    def __init__(self, model, prompt_ids, prompt_mask, *, workers: int, capacity: int,
                 layout: str = "contiguous", step_tokens: int = 8):
        if layout not in LAYOUTS:
            raise ValueError(f"layout: {layout!r} is unknown; use one of {LAYOUTS}")
        cfg = model.config
        if getattr(cfg, "model_type", None) not in MODEL_TYPES:
            raise ValueError(f"model: type {getattr(cfg, 'model_type', None)!r} is not supported by "
                             f"hogwild; use one of {MODEL_TYPES}")
        layers = model.model.layers
        if any(getattr(l.self_attn, "sliding_window", None) for l in layers):
            raise ValueError("model: sliding-window attention is not supported by hogwild")
        if workers < 1 or step_tokens < 1:
            raise ValueError(f"workers / step_tokens: {workers} / {step_tokens} must be >= 1")
        self.model, self.layout = model, layout
        self.W, self.n_layers = workers, len(layers)
        attn = layers[0].self_attn
        self.Hkv, self.D = cfg.num_key_value_heads, attn.head_dim
        self.g, self.scaling = cfg.num_attention_heads // self.Hkv, attn.scaling
        dev = prompt_ids.device
        B, P = prompt_ids.shape
        self.B = B
        # the prompt, once per prompt (not per worker)
        kw, cache = rollout._new_cache(model)
        pos = rollout._positions(prompt_mask)
        out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=pos,
                    use_cache=True, logits_to_keep=1, **{kw: cache})
        self.prompt_logits = out.logits[:, -1]
        self.pk = [l.keys.transpose(1, 2) for l in cache.layers]     # (B, P, Hkv, D)
        self.pv = [l.values.transpose(1, 2) for l in cache.layers]
        self.pmask = prompt_mask.bool()
        self.pos_p = pos
        self.n_prompt = self.pmask.sum(-1)
        # worker blocks and history
        T = capacity if layout == "contiguous" else step_tokens
        S = 0 if layout == "contiguous" else workers * capacity
        dt = self.pk[0].dtype
        shape = (self.Hkv, self.D)
        self.wk = [torch.zeros(B, workers, T, *shape, dtype=dt, device=dev) for _ in layers]
        self.wv = [torch.zeros_like(x) for x in self.wk]
        self.hk = [torch.zeros(B, S, *shape, dtype=dt, device=dev) for _ in layers]
        self.hv = [torch.zeros_like(x) for x in self.hk]
        self.L = torch.zeros(B, workers, dtype=torch.long, device=dev)      # tokens per block
        self.hist_len = torch.zeros(B, dtype=torch.long, device=dev)
        self.T, self.S = T, S
        # rotary tables up to the longest view (cos/sin include the model's attention scaling;
        # *_unit are pure rotations, for re-rotating stored keys)
        n_pos = P + S + workers * T + 2
        rot = model.model.rotary_emb
        x = torch.zeros(1, dtype=torch.float32, device=dev)
        cos, sin = rot(x, torch.arange(n_pos, device=dev)[None])
        self.cos, self.sin = cos[0].to(dt), sin[0].to(dt)
        s = float(getattr(rot, "attention_scaling", 1.0) or 1.0)
        self.cos_unit, self.sin_unit = self.cos / s, self.sin / s

    # -- rotations --
    def _rope(self, x, pos):
        return x * _expand(self.cos, pos, x.dim()) + _rotate_half(x) * _expand(self.sin, pos, x.dim())

    def _turn(self, x, delta, inverse: bool = False):
        """Stored keys rotated by `delta` positions (a pure rotation; backwards if `inverse`)."""
        s = _expand(self.sin_unit, delta, x.dim())
        return x * _expand(self.cos_unit, delta, x.dim()) + _rotate_half(x) * (-s if inverse else s)

    # -- the view layout --
    def offsets(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(off (B, V, U): view offset of worker block u in worker v's view, pos (B, V): view
        position of v's next token). Blocks: prompt, history, the others by index, own last."""
        L = self.L
        base = self.n_prompt + self.hist_len                              # (B,)
        before = L.cumsum(-1) - L                                         # (B, U) exclusive
        u = torch.arange(self.W, device=L.device)
        later = (u[None, :] > u[:, None]).long()                          # (V, U): u after v
        off = base[:, None, None] + before[:, None, :] - later[None] * L[:, :, None]
        own = base[:, None] + L.sum(-1, keepdim=True) - L                 # (B, V)
        off = torch.where(torch.eye(self.W, dtype=torch.bool, device=L.device)[None],
                          own[:, :, None], off)
        return off, base[:, None] + L.sum(-1, keepdim=True) + torch.zeros_like(L)

    # -- the Hogwild! step --
    def _attend(self, i, q, off, pos, wmask):
        """q (B, V, Hkv, g, D) unrotated -> attention output over worker v's view."""
        B, V = q.shape[:2]
        parts_s, parts_v = [], []
        qp = self._rope(q, pos)
        parts_s.append(torch.einsum("bvhgd,bphd->bvhgp", qp, self.pk[i]))
        parts_v.append(self.pv[i])
        mask = [self.pmask[:, None, None, None, :].expand(B, V, 1, 1, -1)]
        if self.S:
            qh = self._rope(q, pos - self.n_prompt[:, None])
            parts_s.append(torch.einsum("bvhgd,bshd->bvhgs", qh, self.hk[i]))
            hm = torch.arange(self.S, device=q.device)[None] < self.hist_len[:, None]
            mask.append(hm[:, None, None, None, :].expand(B, V, 1, 1, -1))
        qw = self._rope(q[:, :, None].expand(B, V, self.W, *q.shape[2:]), pos[:, :, None] - off)
        sw = torch.einsum("bvuhgd,buthd->bvhgut", qw, self.wk[i])
        parts_s.append(sw.flatten(-2))
        mask.append(wmask[:, :, None, None, :])
        scores = torch.cat(parts_s, -1).float() * self.scaling
        scores = scores.masked_fill(~torch.cat(mask, -1), float("-inf"))
        a = torch.softmax(scores, -1).to(q.dtype)
        P = self.pk[i].shape[1]
        o = torch.einsum("bvhgp,bphd->bvhgd", a[..., :P], self.pv[i])
        if self.S:
            o = o + torch.einsum("bvhgs,bshd->bvhgd", a[..., P:P + self.S], self.hv[i])
        aw = a[..., P + self.S:].unflatten(-1, (self.W, self.T))
        return o + torch.einsum("bvhgut,buthd->bvhgd", aw, self.wv[i])

    def _make_room(self, write):
        """Interleaved: commit every worker's current step to the history when blocks are full."""
        if self.layout == "interleaved" and bool((self.L + write.long() > self.T).any()):
            self.commit()

    def step(self, tokens: torch.Tensor, write: torch.Tensor) -> torch.Tensor:
        """Feed (B, W) tokens; store the rows where `write`; (B, W, vocab) next-token logits."""
        self._make_room(write)
        m, B, W = self.model.model, self.B, self.W
        off, pos = self.offsets()
        bi, wi = write.nonzero(as_tuple=True)
        ti = self.L[bi, wi]
        u = torch.arange(W, device=tokens.device)
        # own block of view v includes the token written now; the others' do not
        vis = torch.arange(self.T, device=tokens.device)[None, None, None] < (
            self.L[:, None, :] + (write[:, :, None] & (u[:, None] == u[None, :])[None]).long()
        )[..., None]                                                      # (B, V, U, T)
        wmask = vis.flatten(-2)
        h = m.embed_tokens(tokens.reshape(B * W))
        for i, layer in enumerate(m.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(B, W, self.Hkv * self.g, self.D)
            k = attn.k_proj(x).view(B, W, self.Hkv, self.D)
            v = attn.v_proj(x).view(B, W, self.Hkv, self.D)
            if hasattr(attn, "q_norm"):
                q, k = attn.q_norm(q), attn.k_norm(k)
            k = self._rope(k, self.L)                                    # at its block position
            self.wk[i][bi, wi, ti] = k[bi, wi].to(self.wk[i].dtype)
            self.wv[i][bi, wi, ti] = v[bi, wi].to(self.wv[i].dtype)
            o = self._attend(i, q.view(B, W, self.Hkv, self.g, self.D), off, pos, wmask)
            h = h + attn.o_proj(o.reshape(B * W, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        self.L = self.L + write.long()
        return self.model.lm_head(m.norm(h)).view(B, W, -1)

    def commit(self) -> None:
        """Append every worker's current block to the history (index order), re-rotating its
        keys from block positions to history positions; the blocks start empty again."""
        before = self.L.cumsum(-1) - self.L
        t = torch.arange(self.T, device=self.L.device)
        for u in range(self.W):
            bi, ti = (t[None] < self.L[:, u, None]).nonzero(as_tuple=True)
            shift = self.hist_len[bi] + before[bi, u]
            for i in range(self.n_layers):
                self.hk[i][bi, shift + ti] = self._turn(self.wk[i][bi, u, ti], shift)
                self.hv[i][bi, shift + ti] = self.wv[i][bi, u, ti]
        self.hist_len = self.hist_len + self.L.sum(-1)
        self.L = torch.zeros_like(self.L)

    # -- the naive step: every view re-encoded contiguously --
    def _flat(self):
        """Every stored slot of a prompt in storage order [prompt, history, block 0..W-1]:
        (visible (B, F), position in its block (B, F), slot ranges per part)."""
        dev = self.L.device
        B, P = self.pmask.shape
        t, s = torch.arange(self.T, device=dev), torch.arange(self.S, device=dev)
        vis = torch.cat([self.pmask, s[None] < self.hist_len[:, None],
                         (t[None, None] < self.L[..., None]).flatten(1)], 1)
        local = torch.cat([self.pos_p, s[None].expand(B, -1),
                           t[None, None].expand(B, self.W, -1).flatten(1)], 1)
        return vis, local

    def view_order(self) -> torch.Tensor:
        """(V, F) storage slots in worker v's view order, written out block by block."""
        P = self.pmask.shape[1]
        blocks = [list(range(P + self.S + u * self.T, P + self.S + (u + 1) * self.T))
                  for u in range(self.W)]
        head = list(range(P + self.S))
        rows = [head + sum((blocks[u] for u in range(self.W) if u != v), []) + blocks[v]
                for v in range(self.W)]
        return torch.tensor(rows, device=self.L.device)

    def naive_step(self, tokens: torch.Tensor, write: torch.Tensor) -> torch.Tensor:
        """As `step`, but each worker's view is gathered contiguously, every key re-rotated to its
        view position, and the model's own forward runs on it (the cost Hogwild! avoids)."""
        self._make_room(write)
        B, W = self.B, self.W
        vis, local = self._flat()
        order = self.view_order()                                        # (V, F)
        vis_v, local_v = vis[:, order], local[:, order]                  # (B, V, F)
        pos_v = vis_v.long().cumsum(-1) - 1
        delta = torch.where(vis_v, pos_v - local_v, 0)
        kw, cache = rollout._new_cache(self.model)
        for i in range(self.n_layers):
            k = torch.cat([self.pk[i], self.hk[i], self.wk[i].flatten(1, 2)], 1)[:, order]
            v = torch.cat([self.pv[i], self.hv[i], self.wv[i].flatten(1, 2)], 1)[:, order]
            k = self._turn(k, delta)                                     # (B, V, F, Hkv, D)
            cache.update(k.flatten(0, 1).transpose(1, 2), v.flatten(0, 1).transpose(1, 2), i)
        n = vis_v.sum(-1).flatten()                                      # view position of the new token
        mask = torch.cat([vis_v.flatten(0, 1), torch.ones(B * W, 1, dtype=torch.bool,
                                                          device=vis.device)], 1).long()
        out = self.model(input_ids=tokens.reshape(B * W, 1), attention_mask=mask,
                         position_ids=n[:, None], use_cache=True, **{kw: cache})
        bi, wi = write.nonzero(as_tuple=True)
        rows, ti = bi * W + wi, self.L[bi, wi]
        for i, layer in enumerate(cache.layers):
            k_new = layer.keys[rows, :, -1]                              # at view position n
            self.wk[i][bi, wi, ti] = self._turn(k_new, n[rows] - ti, inverse=True)
            self.wv[i][bi, wi, ti] = layer.values[rows, :, -1]
        self.L = self.L + write.long()
        return out.logits[:, -1].view(B, W, -1)

    def cache_bytes(self) -> int:
        """Bytes of the keys/values this cache holds (prompt once, blocks, history)."""
        return sum(x.numel() * x.element_size()
                   for group in (self.pk, self.pv, self.wk, self.wv, self.hk, self.hv) for x in group)

    def view_bytes(self) -> int:
        """Extra bytes one naive step materialises: every view's contiguous keys/values."""
        F_ = self.pmask.shape[1] + self.S + self.W * self.T
        return 2 * self.n_layers * self.B * self.W * F_ * self.Hkv * self.D * self.pk[0].element_size()


# ---- generation -----------------------------------------------------------------------------

def collab_text(prompt: str, workers: int, template: str = COLLAB_PROMPT) -> str:
    """The shared prompt that tells the workers they collaborate, before the task's prompt."""
    return template.format(workers=workers) + prompt


def header_ids(tokenizer, workers: int, template: str = HEADER) -> list[list[int]]:
    """Token ids of each worker's block header ("worker w: ")."""
    return [tokenizer(template.format(worker=w), add_special_tokens=False)["input_ids"]
            for w in range(workers)]


def generate(model, prompt_ids, prompt_mask, *, workers: int, max_new_tokens: int, eos_id,
             pad_id: int, layout: str = "contiguous", step_tokens: int = 8, headers=None,
             temperature: float = 1.0, top_p: float = 1.0, generator=None,
             record_logp: bool = False, version: int = 0, naive: bool = False,
             return_cache: bool = False):
    """W workers per prompt over one shared cache. Returns a `rollout.Batch` with B·W rows (row
    b·W + w: worker w of prompt b); its prompt is the shared prompt followed by the worker's
    header; completion, mask, behaviour log-probs (logits / temperature) and `version` as in
    `rollout.sample`. `headers`: W lists of ids fed (not sampled) at the head of each block.
    `naive`: step by re-encoding each view (same numbers, the baseline's cost)."""
    B, W = prompt_ids.shape[0], workers
    headers = headers or [[] for _ in range(W)]
    if len(headers) != W:
        raise ValueError(f"headers: {len(headers)} given for {W} workers")
    H = max(len(h) for h in headers)
    dev = prompt_ids.device
    with torch.inference_mode():
        cache = SharedCache(model, prompt_ids, prompt_mask, workers=W, layout=layout,
                            step_tokens=step_tokens, capacity=H + max_new_tokens)
        stepper = cache.naive_step if naive else cache.step
        logits = cache.prompt_logits[:, None].expand(B, W, -1).clone()
        for j in range(H):   # headers, teacher-forced; a worker whose header ended waits
            tok = torch.tensor([h[j] if j < len(h) else pad_id for h in headers], device=dev)
            write = torch.tensor([j < len(h) for h in headers], device=dev)[None].expand(B, W)
            new = stepper(tok[None].expand(B, W).contiguous(), write.contiguous())
            logits = torch.where(write[..., None], new, logits)
        done = torch.zeros(B * W, dtype=torch.bool, device=dev)
        tokens, logps = [], []
        for t in range(max_new_tokens):
            flat = logits.reshape(B * W, -1)
            tok = rollout._sample_next(flat, temperature, top_p, generator)
            tok = torch.where(done, torch.full_like(tok, pad_id), tok)
            tokens.append(tok)
            if record_logp:
                logps.append(rollout.token_logp(flat, tok, temperature))
            write = ~done
            done = done | rollout._is_stop(tok, eos_id)
            if bool(done.all()) or t == max_new_tokens - 1:
                break
            logits = stepper(tok.view(B, W), write.view(B, W))
        ids = torch.stack(tokens, 1)
        mask, finished = rollout.first_stop_mask(ids, eos_id)
        logp = torch.stack(logps, 1) if record_logp else None
    p_ids, p_mask = _with_headers(prompt_ids, prompt_mask, headers, pad_id)
    batch = rollout.Batch(p_ids, p_mask, ids.clone(), mask.clone(), finished.clone(),
                          None if logp is None else logp.clone(),
                          torch.full_like(ids, version) if record_logp else None)
    return (batch, cache) if return_cache else batch


def _with_headers(prompt_ids, prompt_mask, headers, pad_id):
    """Each worker's prompt row: shared prompt + its header, re-left-padded (B·W rows)."""
    B, W = prompt_ids.shape[0], len(headers)
    rows, masks = [], []
    for b in range(B):
        real = prompt_ids[b][prompt_mask[b].bool()].tolist()
        for w in range(W):
            rows.append(real + list(headers[w]))
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad_id] * (width - len(r)) + r for r in rows], device=prompt_ids.device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows],
                        device=prompt_ids.device, dtype=prompt_mask.dtype)
    return ids, mask


def sample_groups(model, tokenizer, task, problems, cfg, *, eos_ids, max_len: int, generator,
                  version: int, device) -> tuple[rollout.Batch, np.ndarray]:
    """As `rollout.sample_groups`, each group made of G / W Hogwild! teams of W workers."""
    G, W = cfg.group_size, cfg.hogwild_workers or cfg.group_size
    texts = [p.prompt for p in problems for _ in range(G // W)]
    if cfg.hogwild_prompt:
        texts = [collab_text(t, W) for t in texts]
    ids, mask = rollout.encode_prompts(tokenizer, texts, cfg.chat_template, device)
    headers = header_ids(tokenizer, W) if cfg.hogwild_prompt else None
    with rollout.autocast(torch.device(device), cfg.bf16):
        batch = generate(model, ids, mask, workers=W, max_new_tokens=max_len, eos_id=eos_ids,
                         pad_id=tokenizer.pad_token_id, layout=cfg.hogwild_layout,
                         step_tokens=cfg.hogwild_step_tokens, headers=headers,
                         temperature=cfg.temperature, top_p=cfg.top_p, generator=generator,
                         record_logp=True, version=version)
    rewards = rollout.score(task, [p for p in problems for _ in range(G)], tokenizer, batch)
    return batch, rewards


def check_config(cfg) -> None:
    """Validate a GRPOConfig's hogwild fields (one-line ValueError)."""
    W = cfg.hogwild_workers or cfg.group_size
    if cfg.hogwild_workers < 0 or cfg.group_size % W:
        raise ValueError(f"hogwild_workers: {cfg.hogwild_workers!r} must divide group_size="
                         f"{cfg.group_size} (0: the whole group)")
    if cfg.hogwild_layout not in LAYOUTS:
        raise ValueError(f"hogwild_layout: {cfg.hogwild_layout!r} is unknown; use one of {LAYOUTS}")
    if cfg.hogwild_step_tokens < 1:
        raise ValueError(f"hogwild_step_tokens: {cfg.hogwild_step_tokens!r} must be >= 1")


class HogwildSource(SyncSource):
    """`rollout=hogwild`: the trainer's own loop, each group generated by Hogwild! teams. The
    behaviour log-probs are those of the shared-cache context; the trainer scores completions
    after the prompt alone, so the off-policy objectives (decoupled_ppo, tis) correct the gap."""

    def pull(self) -> dict:
        t = self.trainer
        c = t.cfg
        problems = [t._next_problem() for _ in range(c.prompts_per_step)]
        batch, rewards = sample_groups(t.model, t.tokenizer, t.task, problems, c,
                                       eos_ids=t.eos_ids, max_len=t.max_len, generator=t.gen,
                                       version=t.step, device=t.device)
        batch = rollout.concat([batch], t.tokenizer.pad_token_id, t.max_len)
        t.counters["rollouts"] += rewards.size
        return {"generated": rewards.reshape(len(problems), -1), "rounds": 1,
                "skipped_prompts": 0, "batch": batch, "rewards": rewards}
