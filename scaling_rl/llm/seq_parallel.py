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
key) merged by their log-sum-exps, so no score matrix is materialised, in the forward and in the
backward (`_MergedFlash`). By default the pass is
no-grad (old / reference log-probs, the prefill); with `grad=True` it is the training forward: the
key/value all-gather's backward all-reduces their gradients and keeps the worker's slice, and
`all_reduce_grads` sums the parameter gradients (tests/test_long_rl.py checks them against one
process). The video trainer's
update runs on it with `sp_workers` > 1 (`video_grpo`, `WorkerPool` below).

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


def _flash_merge(q, k, v, start: int, scale: float):
    """(output, log-sum-exp) of `_MergedFlash`'s forward."""
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    C = q.shape[-2]
    out, lse = op(q, k[..., start:start + C, :], v[..., start:start + C, :], 0.0, True, scale=scale)
    if start == 0:
        return out, lse
    past, lse_p = op(q, k[..., :start, :], v[..., :start, :], 0.0, False, scale=scale)
    merged = torch.logaddexp(lse, lse_p)
    return out * torch.exp(lse - merged)[..., None] + past * torch.exp(lse_p - merged)[..., None], merged


class _MergedFlash(torch.autograd.Function):
    """Causal attention of a slice's queries (global positions start.. start + C - 1) over the
    gathered keys, as two fused CPU flash-attention calls: the diagonal block (causal) and the keys
    before it (all visible), merged by their log-sum-exps (the ring-attention merge). No C x L
    score matrix is materialised and the keys after the slice are never read. Backward: each
    block's flash backward given the *merged* output and log-sum-exp is exactly that block's share
    of the whole attention's gradient (as ring attention's backward); the keys after the slice get
    zero."""

    @staticmethod
    def forward(ctx, q, k, v, start: int, scale: float):
        out, lse = _flash_merge(q, k, v, start, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.start, ctx.scale = start, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
        q, k, v, out, lse = ctx.saved_tensors
        start, scale, C = ctx.start, ctx.scale, q.shape[-2]
        grad, out = grad.contiguous(), out.contiguous()
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)

        def block(a, b, causal):
            dq_b, dk_b, dv_b = bwd(grad, q, k[..., a:b, :].contiguous(), v[..., a:b, :].contiguous(),
                                   out, lse, 0.0, causal, scale=scale)
            dk[..., a:b, :], dv[..., a:b, :] = dk_b, dv_b
            return dq_b
        dq = block(start, start + C, True)
        if start > 0:
            dq = dq + block(0, start, False)
        return dq, dk, dv, None, None


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float):
    """Causal attention of the queries at global positions start.. start + C - 1 over the gathered
    keys: on CPU `_MergedFlash` (with or without gradients); elsewhere SDPA with an explicit
    (C, L) mask."""
    C = q.shape[-2]
    if q.device.type != "cpu" or getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu",
                                         None) is None:
        q_pos = torch.arange(start, start + C, device=q.device)
        mask = torch.arange(k.shape[-2], device=q.device)[None, :] <= q_pos[:, None]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _MergedFlash.apply(q.contiguous(), k.contiguous(), v.contiguous(), start, scale)
    return _flash_merge(q, k, v, start, scale)[0]


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
                group=None, grad: bool = False, with_entropy: bool = False):
    """log π(labels[:, t] | inputs[:, :t+1]) for every position t, (B, L) float32, 0 where
    labels < 0, computed over the workers of `group` (all of them hold the same inputs).
    `embeds`: the (B, L, H) input embeddings, or a list of pieces concatenated along the sequence
    (e.g. frame tokens expanded over a group, question, completion): each worker materialises
    only its slice.

    `grad=True`: differentiable (the training forward). Every worker computes the same loss of the
    returned log-probs and calls backward (the all-gathers' backwards are collective, so in the
    same order everywhere); the true gradient is then the sum of the workers' parameter gradients
    (`all_reduce_grads`).

    `with_entropy=True` returns (log-probs, entropies): the entropy of softmax(logits /
    temperature) at every scored position (no gradient), 0 elsewhere."""
    with torch.set_grad_enabled(grad):
        logp, ent = _sp_logprobs(model, embeds, labels, temperature, group, with_entropy)
    return (logp, ent) if with_entropy else logp


def all_reduce_grads(model, group=None) -> None:
    """Sum every trainable parameter's .grad over the workers of `group` (after an SP backward)."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return
    for p in model.parameters():     # the same list on every worker (a collective each)
        if p.requires_grad:
            if p.grad is None:       # this worker's slice did not reach it (e.g. no label scored)
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, group=group)


def _sp_logprobs(model, embeds, labels, temperature, group, with_entropy=False):
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
    ent = torch.zeros(B, C, dtype=torch.float32, device=x.device) if with_entropy else None
    rows, cols = torch.nonzero(lab >= 0, as_tuple=True)
    if len(rows):
        logits = model.lm_head(x[rows, cols])
        if with_entropy:   # before the log-probs: their backward may reuse the logits' memory
            ent[rows, cols] = rollout.chunked_entropy(logits.detach(), temperature)
        logp = logp.index_put((rows, cols),
                              rollout.selective_logprobs(logits, lab[rows, cols], temperature))
    logp = _gather_seq(logp[..., None], group, _GatherOut)[:, :L, 0]
    if with_entropy:   # no gradient: a plain all-gather
        ent = _gather_seq(ent[..., None], group)[:, :L, 0]
    return logp, ent


def completion_labels(prefix_len: int, completion_ids: torch.Tensor) -> torch.Tensor:
    """(B, prefix_len + T - 1) labels: position prefix_len - 1 + j predicts completion token j."""
    B, T = completion_ids.shape
    lab = torch.full((B, prefix_len + T - 1), -1, dtype=torch.long, device=completion_ids.device)
    lab[:, prefix_len - 1:] = completion_ids
    return lab


def sp_completion_logprobs(model, prefix, completion_ids: torch.Tensor,
                           temperature: float = 1.0, group=None, grad: bool = False,
                           with_entropy: bool = False):
    """`multimodal.video_logprobs` computed sequence-parallel: (B, T) log-probs, and with
    `with_entropy` also the (B, T) entropies, as (log-probs, entropies); no grad unless `grad`
    (see `sp_logprobs`). `prefix`: (B, Lp, H) prompt embeddings or a list of pieces."""
    parts = list(prefix) if isinstance(prefix, (list, tuple)) else [prefix]
    Lp = sum(p.shape[1] for p in parts)
    with torch.set_grad_enabled(grad):
        parts.append(model.get_input_embeddings()(completion_ids[:, :-1]))
    out = sp_logprobs(model, parts, completion_labels(Lp, completion_ids), temperature,
                      group, grad, with_entropy)
    if with_entropy:
        return out[0][:, Lp - 1:], out[1][:, Lp - 1:]
    return out[:, Lp - 1:]


class RowGather:
    """`source[index]` ((S, N, H) per-video frame tokens picked per row) as a lazy (B, N, H)
    sequence piece: `_local_slice` materialises only a worker's positions of it."""

    def __init__(self, source: torch.Tensor, index: torch.Tensor):
        self.source, self.index = source, index
        self.shape = (len(index), source.shape[1], source.shape[2])

    def __getitem__(self, key):
        rows, cols = key
        if rows != slice(None):
            raise IndexError("RowGather: only [:, a:b] slices")
        return self.source[:, cols][self.index]


def video_pieces(model, video_tokens: torch.Tensor, question_ids: torch.Tensor, rows: int):
    """Prompt pieces for `sp_completion_logprobs`: one video's (N, H) frame tokens and the question,
    expanded (views, no copies) over `rows` rollouts."""
    q = model.get_input_embeddings()(question_ids)
    return [video_tokens[None].expand(rows, -1, -1), q[None].expand(rows, -1, -1)]


# ---- process launcher -------------------------------------------------------------------------

def _store_path() -> str:
    """A fresh path for a gloo FileStore (the file must not exist yet)."""
    fd, path = tempfile.mkstemp(prefix="sp_store_")
    os.close(fd)
    os.unlink(path)
    return path


def _join_group(store_path: str, rank: int, world: int, timeout: float) -> None:
    import datetime
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=timeout))


def _fork(target, ranks, *args) -> list:
    """Started forked processes `target(rank, *args)`, one per rank."""
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=target, args=(r, *args), daemon=True) for r in ranks]
    with warnings.catch_warnings():
        # JAX (imported by the trainer's objectives) warns on every fork; the workers run torch
        # and gloo only and never call into JAX, so its threads' state is never needed there
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
        for p in procs:
            p.start()
    return procs


def _reap(procs, store_path: str) -> None:
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    if os.path.exists(store_path):
        os.unlink(store_path)


def _worker(rank, fn, world, store_path, timeout, args, queue):
    try:
        torch.set_num_threads(1)   # forked from a parent that may have used intra-op threads
        _join_group(store_path, rank, world, timeout)
        try:
            queue.put((rank, fn(rank, world, *args), None))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        queue.put((rank, None, traceback.format_exc()))


def launch(fn, world: int, *args, timeout: float = 600.0) -> list:
    """[fn(rank, world, *args) for each rank], each rank in its own forked process, all joined in
    one gloo process group. A failing rank raises RuntimeError with its traceback."""
    queue = multiprocessing.get_context("fork").Queue()
    store_path = _store_path()
    procs = _fork(_worker, range(world), fn, world, store_path, timeout, args, queue)
    results: dict[int, object] = {}
    try:
        for _ in range(world):
            rank, value, err = queue.get(timeout=timeout)
            if err is not None:
                raise RuntimeError(f"sequence-parallel rank {rank} failed:\n{err}")
            results[rank] = value
    finally:
        _reap(procs, store_path)
    return [results[r] for r in range(world)]


# ---- a persistent pool: the caller as rank 0 ------------------------------------------------------

def send(message) -> None:
    """Rank 0 of a `WorkerPool`: hand `message` (any picklable object, tensors included) to every
    worker's `recv()`."""
    dist.broadcast_object_list([message], src=0)


def recv():
    """A `WorkerPool` worker: the next message rank 0 `send`s."""
    box = [None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _pool_worker(rank, serve, world, store_path, timeout, args, errors):
    try:
        torch.set_num_threads(1)
        _join_group(store_path, rank, world, timeout)
        serve(rank, world, *args)
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to rank 0, whose next collective then fails
        errors.put((rank, traceback.format_exc()))
        errors.close()
        errors.join_thread()   # the queue's feeder thread must write it before _exit
        os._exit(1)
    os._exit(0)        # skip the inherited parent's atexit handlers (JAX's among them)


class WorkerPool:
    """The calling process as rank 0 and `world - 1` forked CPU workers in one gloo group (the
    default process group), kept across calls. Each worker runs `serve(rank, world, *args)`, which
    reads rank 0's `send`s with `recv()` and returns at `None` (`close` sends it). Forked workers
    start with a copy of the caller's memory (models, optimizer state): fork the pool when that
    state is final. A worker that fails makes rank 0's next collective fail; `failure(exc)` turns
    that into a RuntimeError with the worker's traceback. Collectives time out after `timeout` s."""

    def __init__(self, world: int, serve, *args, timeout: float = 600.0):
        if dist.is_initialized():
            raise RuntimeError("sequence parallelism: this process already has a torch.distributed group")
        self.errors = multiprocessing.get_context("fork").Queue()
        self.store_path = _store_path()
        self.procs = _fork(_pool_worker, range(1, world), serve, world, self.store_path, timeout, args,
                           self.errors)
        self.broken = False   # set when rank 0 left a protocol midway: close() then kills the workers
        try:
            _join_group(self.store_path, 0, world, timeout)
        except BaseException as exc:
            _reap(self.procs, self.store_path)
            self.procs = []
            raise self.failure(exc) from exc

    def failure(self, exc: BaseException) -> BaseException:
        """The error to raise for `exc`: a worker's traceback if one failed, else `exc` itself. A
        failed worker has written its traceback before exiting; while every worker lives, the
        queue is only glanced at."""
        import queue
        alive = all(p.is_alive() for p in self.procs)
        try:
            rank, err = self.errors.get(timeout=0.2 if alive else 5)
        except queue.Empty:
            return exc
        return RuntimeError(f"sequence-parallel worker {rank} failed:\n{err}")

    def close(self) -> None:
        """Stop the workers and leave the process group (idempotent)."""
        if not self.procs:
            return
        try:
            if self.broken:   # the workers may wait inside any collective: no message reaches them
                for p in self.procs:
                    p.kill()
            elif all(p.is_alive() for p in self.procs):
                send(None)
            if dist.is_initialized():
                dist.destroy_process_group()
        finally:
            _reap(self.procs, self.store_path)
            self.procs = []
