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

Cost of a step: keys and values are stored head-major (prompt and history (B, Hkv, ·, D), blocks
(B, Hkv, W, T, D)); a step attends only over written slots (the prompt, the history's
`hist_len.max()` slots, the blocks' first `max(L + write)` slots) with batched matmuls per
(prompt | history | block, head) and one softmax over their concatenated scores; the per-step
rotations and the mask are built once for all layers. Per token a worker still reads W blocks,
so attention work grows with W (an independent sample reads its own tokens only).

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
        # storage is head-major, as the attention's batched matmuls read it: prompt and history
        # (B, Hkv, P or S, D), worker blocks (B, Hkv, W, T, D)
        self.pk = [l.keys for l in cache.layers]
        self.pv = [l.values for l in cache.layers]
        self.pmask = prompt_mask.bool()
        self.pos_p = pos
        self.n_prompt = self.pmask.sum(-1)
        # worker blocks and history
        T = capacity if layout == "contiguous" else step_tokens
        S = 0 if layout == "contiguous" else workers * capacity
        dt = self.pk[0].dtype
        H, D = self.Hkv, self.D
        self.wk = [torch.zeros(B, H, workers, T, D, dtype=dt, device=dev) for _ in layers]
        self.wv = [torch.zeros_like(x) for x in self.wk]
        self.hk = [torch.zeros(B, H, S, D, dtype=dt, device=dev) for _ in layers]
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
    def _tables(self, write):
        """What every layer of one step shares: query rotations (scaled by the attention scaling)
        for the prompt, the history and each (view, block) pair, the key rotation of the new
        tokens, and the additive mask over the written slots only (prompt, the history's
        `hist_len.max()` slots, the blocks' first `(L + write).max()` slots)."""
        off, pos = self.offsets()                                         # (B, V, U), (B, V)
        L, W, dev = self.L, self.W, self.L.device
        t = int((L + write.long()).max())
        sh = int(self.hist_len.max()) if self.S else 0
        sc = self.scaling

        def q_rot(p):   # (B, V) or (B, V, U) positions -> cos, sin for q laid out (B, H, [U,] V, g, D)
            c, s_ = self.cos[p] * sc, self.sin[p] * sc
            if p.dim() == 3:
                c, s_ = c.transpose(1, 2), s_.transpose(1, 2)             # (B, U, V, D)
            return c.unsqueeze(1).unsqueeze(-2), s_.unsqueeze(1).unsqueeze(-2)
        u = torch.arange(W, device=dev)
        own = (write[:, :, None] & (u[:, None] == u[None, :])[None]).long()   # (B, V, U)
        # own block of view v includes the token written now; the others' do not
        vis_w = torch.arange(t, device=dev)[None, None, None] < (L[:, None, :] + own)[..., None]
        B = self.B
        parts = [self.pmask[:, None].expand(B, W, -1)]
        if sh:
            hm = torch.arange(sh, device=dev)[None] < self.hist_len[:, None]
            parts.append(hm[:, None].expand(B, W, -1))
        parts.append(vis_w.transpose(2, 3).flatten(-2))      # (B, V, t·U): slot-major, block-minor
        vis = torch.cat(parts, -1)
        bias = torch.zeros(vis.shape, dtype=self.cos.dtype, device=dev).masked_fill_(~vis, float("-inf"))
        return {"t": t, "sh": sh, "q_p": q_rot(pos),
                "q_h": q_rot(pos - self.n_prompt[:, None]) if sh else None,
                "q_w": q_rot(pos[:, :, None] - off),
                "k": (self.cos[L].unsqueeze(-2), self.sin[L].unsqueeze(-2)),   # (B, W, 1, D)
                "bias": bias[:, None, :, None]}                           # (B, 1, V, 1, F)

    def _attend(self, i, q, tab):
        """q (B, V, Hkv, g, D) unrotated -> (B·V, Hkv·g·D) attention output over each worker's
        view: batched matmuls over (prompt, head), (history, head) and (block, head), one softmax
        over the written slots."""
        B, V, H, g, D = q.shape
        t, sh = tab["t"], tab["sh"]
        q = q.permute(0, 2, 1, 3, 4)                                      # (B, H, V, g, D)
        rq = _rotate_half(q)

        def rot(c_s, qq=q, rr=rq):
            return qq * c_s[0] + rr * c_s[1]
        qp = rot(tab["q_p"]).reshape(B, H, V * g, D)
        scores = [qp @ self.pk[i].transpose(-1, -2)]                      # (B, H, Vg, P)
        if sh:
            qh = rot(tab["q_h"]).reshape(B, H, V * g, D)
            scores.append(qh @ self.hk[i][:, :, :sh].transpose(-1, -2))
        qw = rot(tab["q_w"], q[:, :, None], rq[:, :, None])              # (B, H, U, V, g, D)
        kw = self.wk[i][:, :, :, :t]                                      # (B, H, U, t, D)
        sw = qw.reshape(B, H, self.W, V * g, D) @ kw.transpose(-1, -2)   # (B, H, U, Vg, t)
        scores.append(sw.permute(0, 1, 3, 4, 2).flatten(-2))              # (B, H, Vg, t·U)
        s = torch.cat(scores, -1)
        F_ = s.shape[-1]
        s = s.view(B, H, V, g, F_) + tab["bias"]
        a = torch.softmax(s, -1, dtype=torch.float32).to(q.dtype).view(B, H, V * g, F_)
        P = self.pk[i].shape[2]
        o = a[..., :P] @ self.pv[i]
        if sh:
            o = o + a[..., P:P + sh] @ self.hv[i][:, :, :sh]
        aw = a[..., P + sh:].unflatten(-1, (t, self.W)).permute(0, 1, 4, 2, 3)   # (B, H, U, Vg, t)
        o = o + (aw @ self.wv[i][:, :, :, :t]).sum(2)                     # (B, H, Vg, D)
        return o.view(B, H, V, g * D).transpose(1, 2).reshape(B * V, H * g * D)

    def _make_room(self, write):
        """Interleaved: commit every worker's current step to the history when blocks are full."""
        if self.layout == "interleaved" and bool((self.L + write.long() > self.T).any()):
            self.commit()

    def step(self, tokens: torch.Tensor, write: torch.Tensor) -> torch.Tensor:
        """Feed (B, W) tokens; store the rows where `write`; (B, W, vocab) next-token logits."""
        self._make_room(write)
        m, B, W = self.model.model, self.B, self.W
        tab = self._tables(write)
        bi, wi = write.nonzero(as_tuple=True)
        ti = self.L[bi, wi]
        # every row writes (lockstep generation before any stop): one scatter per tensor
        every = bi.numel() == B * W
        slot = self.L[:, None, :, None, None].expand(B, self.Hkv, W, 1, self.D)
        ck, sk = tab["k"]
        h = m.embed_tokens(tokens.reshape(B * W))
        for i, layer in enumerate(m.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(B, W, self.Hkv * self.g, self.D)
            k = attn.k_proj(x).view(B, W, self.Hkv, self.D)
            v = attn.v_proj(x).view(B, W, self.Hkv, self.D)
            if hasattr(attn, "q_norm"):
                q, k = attn.q_norm(q), attn.k_norm(k)
            k = k * ck + _rotate_half(k) * sk                            # at its block position
            if every:
                self.wk[i].scatter_(3, slot, k.to(self.wk[i].dtype).transpose(1, 2)[:, :, :, None])
                self.wv[i].scatter_(3, slot, v.to(self.wv[i].dtype).transpose(1, 2)[:, :, :, None])
            else:
                self.wk[i][bi, :, wi, ti] = k[bi, wi].to(self.wk[i].dtype)
                self.wv[i][bi, :, wi, ti] = v[bi, wi].to(self.wv[i].dtype)
            o = self._attend(i, q.view(B, W, self.Hkv, self.g, self.D), tab)
            h = h + attn.o_proj(o)
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
                self.hk[i][bi, :, shift + ti] = self._turn(self.wk[i][bi, :, u, ti], shift)
                self.hv[i][bi, :, shift + ti] = self.wv[i][bi, :, u, ti]
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
            # slot-major views (B, F, Hkv, D) of the head-major storage, gathered per view
            k = torch.cat([self.pk[i], self.hk[i], self.wk[i].flatten(2, 3)], 2).transpose(1, 2)[:, order]
            v = torch.cat([self.pv[i], self.hv[i], self.wv[i].flatten(2, 3)], 2).transpose(1, 2)[:, order]
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
            self.wk[i][bi, :, wi, ti] = self._turn(k_new, n[rows] - ti, inverse=True)
            self.wv[i][bi, :, wi, ti] = layer.values[rows, :, -1]
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


# Objectives that train correctly on tokens sampled by another policy. A Hogwild! token is sampled
# from π(· | prompt, the other workers' tokens so far, own tokens), while the trainer scores it
# after the prompt alone, π(· | prompt, own tokens): the samples are off-policy even at staleness 0.
# decoupled_ppo weights each token by π_prox/π_behav and tis by min(π_θ/π_behav, c), with π_behav
# the shared-context log-prob recorded at sampling time; vargrad (trajectory balance) has its
# optimum π ∝ π_ref·exp(r/β) whatever distribution the samples come from. Plain grpo has neither:
# it anchors its ratio on the prompt-only log-probs (`old = logp.detach()`), i.e. it would treat
# the samples as drawn from the policy being trained, a biased gradient.
OFF_POLICY_OBJECTIVES = ("decoupled_ppo", "tis", "vargrad")


def check_config(cfg) -> None:
    """Validate a GRPOConfig's hogwild fields (one-line ValueError); `objective` must be one of
    OFF_POLICY_OBJECTIVES."""
    W = cfg.hogwild_workers or cfg.group_size
    if cfg.hogwild_workers < 0 or cfg.group_size % W:
        raise ValueError(f"hogwild_workers: {cfg.hogwild_workers!r} must divide group_size="
                         f"{cfg.group_size} (0: the whole group)")
    if cfg.hogwild_layout not in LAYOUTS:
        raise ValueError(f"hogwild_layout: {cfg.hogwild_layout!r} is unknown; use one of {LAYOUTS}")
    if cfg.hogwild_step_tokens < 1:
        raise ValueError(f"hogwild_step_tokens: {cfg.hogwild_step_tokens!r} must be >= 1")
    if cfg.objective not in OFF_POLICY_OBJECTIVES:
        raise ValueError(f"objective: {cfg.objective!r} cannot train on hogwild rollouts (sampled "
                         "seeing the other workers, scored after the prompt alone); use one of "
                         f"{OFF_POLICY_OBJECTIVES}")


class HogwildSource(SyncSource):
    """`rollout=hogwild`: the trainer's own loop, each group generated by Hogwild! teams. The
    behaviour log-probs are those of the shared-cache context; the trainer scores completions
    after the prompt alone, so the off-policy objectives (decoupled_ppo, tis) correct the gap
    (`check_config` refuses objective=grpo, which would not)."""

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
