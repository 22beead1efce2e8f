"""Sequence-parallel prefill / log-prob pass over P torch.distributed workers (MR-SP stage 2).

The long sequence (frame tokens + question + completion) is padded at the end to a multiple of P
and cut into P contiguous slices; worker r runs every layer on its slice only. In each attention
layer it all-gathers the keys and values of all slices (after RoPE at their global positions),
and its queries attend to the keys at global positions <= their own (causal). The padding sits
after every real position, so causality keeps it out of every real query. Log-probs of the
labels are computed on the worker's slice (only the positions that score a label reach the LM
head) and all-gathered, so every worker returns the whole (B, L) result, equal to the
single-process pass up to float32 rounding (the test checks this for lengths P does not divide).

Per worker, activations scale with L / P and the gathered K/V with L; on CPU the attention is
two fused flash-attention calls per layer (the slice's causal diagonal block, and every earlier
key) merged by their log-sum-exps, so no score matrix is materialised. By default the pass is
no-grad (old / reference log-probs, the prefill); with `grad=True` it is the training forward: the
key/value all-gather's backward all-reduces their gradients and keeps the worker's slice, and
`all_reduce_grads` sums the parameter gradients (tests/test_long_rl.py checks them against one
process). The trainer does not call it yet (the video update runs in one process).

`launch(fn, world, *args)` forks `world` CPU processes joined by a gloo group (a FileStore, no
ports) and returns each rank's `fn(rank, world, *args)`; tests and benchmarks/long_rl.py use it.
"""
from __future__ import annotations

import math
import multiprocessing
import os
import tempfile
import traceback
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

from scaling_rl.llm import rollout


def _all_gather_cat(x: torch.Tensor, group) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=-2)


class _GatherKV(torch.autograd.Function):
    """All-gather of key/value slices whose backward sums every worker's gradient of the whole
    sequence (all-reduce; gloo has no reduce-scatter) and keeps this worker's slice."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group, ctx.rank, ctx.C = group, dist.get_rank(group), x.shape[-2]
        return _all_gather_cat(x, group)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad[..., ctx.rank * ctx.C:(ctx.rank + 1) * ctx.C, :], None


class _GatherOut(torch.autograd.Function):
    """All-gather of per-slice outputs whose backward keeps this worker's slice of the gradient
    (every worker computes the same loss of the whole gathered output)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.rank, ctx.C = dist.get_rank(group), x.shape[-2]
        return _all_gather_cat(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad[..., ctx.rank * ctx.C:(ctx.rank + 1) * ctx.C, :], None


def _gather_seq(x: torch.Tensor, group, kind=_GatherKV) -> torch.Tensor:
    """All-gather equal slices along dim -2 (the sequence) and concatenate them in rank order;
    differentiable (`kind` gives the backward) when x requires grad."""
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    if world == 1:
        return x
    if torch.is_grad_enabled() and x.requires_grad:
        return kind.apply(x, group)
    return _all_gather_cat(x, group)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float):
    """Causal attention of the queries at global positions start.. start + C - 1 over the gathered
    keys. On CPU: the diagonal block (causal) and the keys before it (all visible) are two fused
    flash-attention calls merged by their log-sum-exps (the ring-attention merge), so no C x L
    score matrix is ever materialised and the keys after the slice are never read. Elsewhere an
    explicit (C, L) mask."""
    C = q.shape[-2]
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    # with gradients: SDPA's own backward (the fused CPU op does not differentiate its lse output,
    # which the merge needs)
    if q.device.type != "cpu" or op is None or (torch.is_grad_enabled() and q.requires_grad):
        q_pos = torch.arange(start, start + C, device=q.device)
        mask = torch.arange(k.shape[-2], device=q.device)[None, :] <= q_pos[:, None]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    diag, lse_d = op(q, k[..., start:start + C, :], v[..., start:start + C, :], 0.0, True, scale=scale)
    if start == 0:
        return diag
    past, lse_p = op(q, k[..., :start, :], v[..., :start, :], 0.0, False, scale=scale)
    lse = torch.logaddexp(lse_d, lse_p)
    return diag * torch.exp(lse_d - lse)[..., None] + past * torch.exp(lse_p - lse)[..., None]


def _layer(layer, x: torch.Tensor, cos, sin, q_pos: torch.Tensor, group) -> torch.Tensor:
    attn = layer.self_attn
    if getattr(attn, "sliding_window", None):
        raise ValueError("sequence parallelism: sliding-window attention layers are not supported")
    B, C, _ = x.shape
    h = layer.input_layernorm(x)
    q = attn.q_proj(h).view(B, C, -1, attn.head_dim).transpose(1, 2)
    k = attn.k_proj(h).view(B, C, -1, attn.head_dim).transpose(1, 2)
    v = attn.v_proj(h).view(B, C, -1, attn.head_dim).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    k, v = _gather_seq(k, group), _gather_seq(v, group)          # (B, kv_heads, L_pad, hd)
    if attn.num_key_value_groups > 1:
        k = k.repeat_interleave(attn.num_key_value_groups, dim=1)
        v = v.repeat_interleave(attn.num_key_value_groups, dim=1)
    out = _attend(q, k, v, int(q_pos[0]), attn.scaling)
    x = x + attn.o_proj(out.transpose(1, 2).reshape(B, C, -1))
    return x + layer.mlp(layer.post_attention_layernorm(x))


def _local_slice(parts, start: int, end: int) -> torch.Tensor:
    """Positions [start, end) of the concatenation of `parts` ((B, L_i, H) tensors, possibly
    expanded views), zero-padded past the end; only this slice is materialised."""
    out, offset = [], 0
    for p in parts:
        a, b = max(start, offset), min(end, offset + p.shape[1])
        if a < b:
            out.append(p[:, a - offset:b - offset])
        offset += p.shape[1]
    x = torch.cat(out, dim=1) if out else parts[0][:, :0]
    return F.pad(x, (0, 0, 0, end - start - x.shape[1]))


def sp_logprobs(model, embeds, labels: torch.Tensor, temperature: float = 1.0,
                group=None, grad: bool = False) -> torch.Tensor:
    """log π(labels[:, t] | inputs[:, :t+1]) for every position t, (B, L) float32, 0 where
    labels < 0, computed over the workers of `group` (all of them hold the same inputs).
    `embeds`: the (B, L, H) input embeddings, or a list of pieces concatenated along the sequence
    (e.g. frame tokens expanded over a group, question, completion): each worker materialises
    only its slice.

    `grad=True`: differentiable (the training forward). Every worker computes the same loss of the
    returned log-probs and calls backward (the all-gathers' backwards are collective, so in the
    same order everywhere); the true gradient is then the sum of the workers' parameter gradients
    (`all_reduce_grads`)."""
    with torch.set_grad_enabled(grad):
        return _sp_logprobs(model, embeds, labels, temperature, group)


def all_reduce_grads(model, group=None) -> None:
    """Sum every trainable parameter's .grad over the workers of `group` (after an SP backward)."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return
    for p in model.parameters():     # the same list on every worker (a collective each)
        if p.requires_grad:
            if p.grad is None:       # this worker's slice did not reach it (e.g. no label scored)
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, group=group)


def _sp_logprobs(model, embeds, labels, temperature, group):
    parts = list(embeds) if isinstance(embeds, (list, tuple)) else [embeds]
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    rank = dist.get_rank(group) if dist.is_initialized() else 0
    B, L = labels.shape
    if sum(p.shape[1] for p in parts) != L:
        raise ValueError(f"labels: length {L} differs from the inputs' {sum(p.shape[1] for p in parts)}")
    C = math.ceil(L / world)
    x = _local_slice(parts, rank * C, (rank + 1) * C)
    lab = F.pad(labels, (0, C * world - L), value=-1)[:, rank * C:(rank + 1) * C]
    q_pos = torch.arange(rank * C, (rank + 1) * C, device=x.device)
    lm = model.model
    cos, sin = lm.rotary_emb(x, q_pos[None].expand(B, -1))
    for layer in lm.layers:
        x = _layer(layer, x, cos, sin, q_pos, group)
    x = lm.norm(x)
    logp = torch.zeros(B, C, dtype=torch.float32, device=x.device)
    if torch.is_grad_enabled() and x.requires_grad:
        # a worker whose slice scores no label still runs the backward: its keys/values feed the
        # others' queries and the backward's all-reduces are collective
        logp = logp + 0.0 * x.sum()
    rows, cols = torch.nonzero(lab >= 0, as_tuple=True)
    if len(rows):
        logits = model.lm_head(x[rows, cols])
        logp = logp.index_put((rows, cols),
                              rollout.selective_logprobs(logits, lab[rows, cols], temperature))
    return _gather_seq(logp[..., None], group, _GatherOut)[:, :L, 0]


def completion_labels(prefix_len: int, completion_ids: torch.Tensor) -> torch.Tensor:
    """(B, prefix_len + T - 1) labels: position prefix_len - 1 + j predicts completion token j."""
    B, T = completion_ids.shape
    lab = torch.full((B, prefix_len + T - 1), -1, dtype=torch.long, device=completion_ids.device)
    lab[:, prefix_len - 1:] = completion_ids
    return lab


def sp_completion_logprobs(model, prefix, completion_ids: torch.Tensor,
                           temperature: float = 1.0, group=None, grad: bool = False) -> torch.Tensor:
    """`multimodal.video_logprobs` (no entropy) computed sequence-parallel: (B, T); no grad unless
    `grad` (see `sp_logprobs`). `prefix`: (B, Lp, H) prompt embeddings or a list of pieces."""
    parts = list(prefix) if isinstance(prefix, (list, tuple)) else [prefix]
    Lp = sum(p.shape[1] for p in parts)
    with torch.set_grad_enabled(grad):
        parts.append(model.get_input_embeddings()(completion_ids[:, :-1]))
    return sp_logprobs(model, parts, completion_labels(Lp, completion_ids), temperature,
                       group, grad)[:, Lp - 1:]


def video_pieces(model, video_tokens: torch.Tensor, question_ids: torch.Tensor, rows: int):
    """Prompt pieces for `sp_completion_logprobs`: one video's (N, H) frame tokens and the question,
    expanded (views, no copies) over `rows` rollouts."""
    q = model.get_input_embeddings()(question_ids)
    return [video_tokens[None].expand(rows, -1, -1), q[None].expand(rows, -1, -1)]


# ---- process launcher -------------------------------------------------------------------------

def _worker(fn, rank, world, store_path, args, queue):
    try:
        torch.set_num_threads(1)   # forked from a parent that may have used intra-op threads
        store = dist.FileStore(store_path, world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
        try:
            queue.put((rank, fn(rank, world, *args), None))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        queue.put((rank, None, traceback.format_exc()))


def launch(fn, world: int, *args, timeout: float = 600.0) -> list:
    """[fn(rank, world, *args) for each rank], each rank in its own forked process, all joined in
    one gloo process group. A failing rank raises RuntimeError with its traceback."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    fd, store_path = tempfile.mkstemp(prefix="sp_store_")
    os.close(fd)
    os.unlink(store_path)
    procs = [ctx.Process(target=_worker, args=(fn, r, world, store_path, args, queue), daemon=True)
             for r in range(world)]
    with warnings.catch_warnings():
        # JAX (imported by the trainer's objectives) warns on every fork; the workers run torch
        # and gloo only and never call into JAX, so its threads' state is never needed there
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
        for p in procs:
            p.start()
    results: dict[int, object] = {}
    try:
        for _ in range(world):
            rank, value, err = queue.get(timeout=timeout)
            if err is not None:
                raise RuntimeError(f"sequence-parallel rank {rank} failed:\n{err}")
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        if os.path.exists(store_path):
            os.unlink(store_path)
    return [results[r] for r in range(world)]
