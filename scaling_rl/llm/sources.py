"""The rollout layer: where the trainer gets its groups from and where it sends its weights.

    source = make_source(trainer)      # by `config.rollout` (scaling_rl.llm.source_factory)
    data = source.pull()               # one step's groups, as `GRPOTrainer.collect()` returns them
    source.publish(model, version)     # after each update: weights of policy version `version`
    source.close()

Every completion carries per token its behaviour log-prob and the policy version that sampled it
(`rollout.Batch.logp`, `.versions`). Sources:

- `sync`: today's loop in the trainer's process (`trainer.collect()`); the same completions.
- `async` (AReaL): one worker process with its own model copy generates whole steps ahead of the
  trainer. Group j belongs to step j // prompts_per_step and is started only once the worker holds
  weights of version >= step - η (`max_staleness`), so a consumed token is never more than η
  versions old; the queue is bounded by the same rule.
- `pipeline` (PipelineRL): as `async`, but the worker decodes with continuous batching and takes
  new weights between decode steps without dropping running sequences (`inflight.decode_stream`),
  so a completion's tokens may come from several versions.
- `tba` (TBA): K searcher processes generate without a staleness bound into a replay buffer the
  trainer samples by reward and recency; searchers get new weights every `sync_every` steps.
- `ray`: the `async` rule with the workers as Ray actors (weights shipped once per version through
  the object store); a dead actor is replaced and its unfinished step regenerated.
- `hogwild` (Hogwild! Inference): in-process, each group's workers share one KV cache
  (`scaling_rl.llm.hogwild`).

Groups are consumed in index order, each exactly once; workers do not share a prompt stream with
the trainer (their own seed), so async runs are reproducible only up to scheduling.
"""
from __future__ import annotations

import dataclasses
import os
import queue
import time

import numpy as np
import torch

from scaling_rl.llm import rollout

SOURCES = ("sync", "async", "pipeline", "tba", "ray", "hogwild")
POLL_S = 0.05


# ---- the generation side (in a worker process, a Ray actor, or in-process) ---------------------

@dataclasses.dataclass
class Group:
    """G completions of one prompt, on the CPU (what workers send to the trainer)."""
    index: int                  # position in the worker's stream (step = index // prompts_per_step)
    problem_id: int
    batch: rollout.Batch
    rewards: np.ndarray         # (G,)
    worker: int = 0
    # the worker's cumulative seconds so far (generating, loading weights, blocked by the
    # staleness bound or a full queue; CPU seconds generating and of the whole process), on the
    # last group of each hand-over: the benchmark's profile
    stats: dict | None = None

    @property
    def oldest_version(self) -> int:
        m = self.batch.completion_mask.bool()
        return int(torch.where(m, self.batch.versions, 1 << 62).min())


class Sampler:
    """A policy copy, the task and its own prompt stream: turns prompts into scored groups."""

    def __init__(self, cfg, model, tokenizer, stream_seed: int, device="cpu"):
        from scaling_rl.llm.tasks import make_task
        self.cfg, self.tokenizer = cfg, tokenizer
        self.device = torch.device(device)
        self.model = model.float().to(self.device).eval().requires_grad_(False)
        self.task = make_task(cfg.task, digits=cfg.digits, countdown_numbers=cfg.countdown_numbers,
                              format_reward=cfg.format_reward, dataset=cfg.dataset, reward=cfg.reward)
        self.max_len = rollout.completion_budget(cfg.max_completion_length, self.task, tokenizer)
        self.pool = self.task.problems("train", cfg.train_pool, seed=cfg.seed)
        self.rng = np.random.default_rng(stream_seed)
        self.gen = torch.Generator(device=self.device).manual_seed(stream_seed)
        self.order, self.cursor = self.rng.permutation(len(self.pool)), 0
        self.eos_ids = rollout.stop_ids(self.model, tokenizer)
        self.version = 0
        self.stats = {"gen_s": 0.0, "load_s": 0.0, "blocked_s": 0.0, "gen_cpu_s": 0.0,
                      "cpu_s": 0.0}

    def load(self, state: dict, version: int) -> None:
        """New weights, in place (running sequences keep their KV cache)."""
        t0 = time.perf_counter()
        load_weights(self.model, state)
        self.version = int(version)
        self.stats["load_s"] += time.perf_counter() - t0

    def next_problem(self):
        if self.cursor >= len(self.order):
            self.order, self.cursor = self.rng.permutation(len(self.pool)), 0
        self.cursor += 1
        return self.pool[int(self.order[self.cursor - 1])]

    def generate(self, first_index: int, n_prompts: int, worker: int = 0) -> list[Group]:
        """n_prompts groups sampled as one batch with the current weights."""
        G = self.cfg.group_size
        problems = [self.next_problem() for _ in range(n_prompts)]
        batch, rewards = rollout.sample_groups(self.model, self.tokenizer, self.task, problems,
                                               self.cfg, eos_ids=self.eos_ids, max_len=self.max_len,
                                               generator=self.gen, version=self.version,
                                               device=self.device)
        return [Group(first_index + i, p.id, _to_cpu(rollout.select(batch, range(i * G, (i + 1) * G))),
                      rewards[i * G:(i + 1) * G], worker) for i, p in enumerate(problems)]

    def group_from_rows(self, index: int, problem, rows: list[tuple], worker: int = 0) -> Group:
        """A group from G finished sequences (prompt, tokens, logps, versions, finished)."""
        tok = self.tokenizer
        T = max(len(r[1]) for r in rows)
        P = max(len(r[0]) for r in rows)

        def pad(seq, width, value, left=False):
            extra = [value] * (width - len(seq))
            return extra + list(seq) if left else list(seq) + extra
        prompt_ids = torch.tensor([pad(r[0], P, tok.pad_token_id, True) for r in rows])
        prompt_mask = torch.tensor([pad([1] * len(r[0]), P, 0, True) for r in rows])
        ids = torch.tensor([pad(r[1], T, tok.pad_token_id) for r in rows])
        mask, finished = rollout.first_stop_mask(ids, self.eos_ids)
        mask = mask * torch.tensor([pad([1] * len(r[1]), T, 0) for r in rows])
        batch = rollout.Batch(prompt_ids, prompt_mask, ids, mask, finished,
                              torch.tensor([pad(r[2], T, 0.0) for r in rows], dtype=torch.float32),
                              torch.tensor([pad(r[3], T, -1) for r in rows], dtype=torch.long))
        rewards = rollout.score(self.task, [problem] * len(rows), tok, batch)
        return Group(index, problem.id, batch, rewards, worker)


def _pack(groups: list[Group]) -> list[Group]:
    """Batch tensors -> numpy arrays: pickled by value through a queue (torch tensors would each
    go through a shared-memory segment and a file-descriptor hand-over, ms apiece)."""
    return [dataclasses.replace(g, batch=rollout.Batch(*[
        None if v is None else v.numpy() for v in (getattr(g.batch, f.name)
                                                   for f in dataclasses.fields(g.batch))]))
            for g in groups]


def _unpack(groups: list[Group]) -> list[Group]:
    return [dataclasses.replace(g, batch=rollout.Batch(*[
        None if v is None else torch.from_numpy(v) for v in (getattr(g.batch, f.name)
                                                              for f in dataclasses.fields(g.batch))]))
            for g in groups]


def _to_cpu(batch: rollout.Batch) -> rollout.Batch:
    return rollout.Batch(*[None if v is None else v.detach().cpu()
                           for v in (getattr(batch, f.name) for f in dataclasses.fields(batch))])


def _aliases(state: dict) -> set[str]:
    """Keys of `state` whose tensor is one listed earlier (tied weights: the LM head sharing the
    embedding appears twice in `state_dict()`)."""
    seen, out = set(), set()
    for k, v in state.items():
        key = (v.data_ptr(), tuple(v.shape), v.dtype)
        if key in seen:
            out.add(k)
        seen.add(key)
    return out


def cpu_state(model) -> dict:
    """The model's weights as CPU tensors, each tensor once (tied weights are not shipped twice):
    what is shipped to workers for one version; load it with `load_weights`."""
    state = model.state_dict()
    skip = _aliases(state)
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items() if k not in skip}


def pack_state(state: dict) -> dict:
    """CPU weights -> numpy arrays (bfloat16 as ("bfloat16", int16 bits)): pickled by value through
    a process queue's pipe. Torch tensors would each go through a /dev/shm segment, and Docker's
    default 64 MB /dev/shm cannot hold one version of a 0.5B model."""
    return {k: ("bfloat16", v.view(torch.int16).numpy()) if v.dtype == torch.bfloat16 else v.numpy()
            for k, v in state.items()}


def _unpack_tensor(v):
    if isinstance(v, tuple):
        return torch.from_numpy(v[1]).view(torch.bfloat16)
    return torch.from_numpy(v) if isinstance(v, np.ndarray) else v


def load_weights(model, state: dict) -> None:
    """`cpu_state` / `pack_state` weights into `model`, in place; only tied aliases may be absent."""
    state = {k: _unpack_tensor(v) for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    bad = sorted(set(missing) - _aliases(model.state_dict())) + sorted(unexpected)
    if bad:
        raise KeyError(f"weights: {bad[0]} missing or unexpected in a shipped state")


def build_sampler(spec: dict) -> Sampler:
    """A worker's Sampler from a spec (validated config dict, model config, weights, tokenizer).
    The config travels as a plain namespace: importing the trainer (and JAX) would add seconds
    to every worker start."""
    import types

    from transformers import AutoModelForCausalLM
    torch.set_num_threads(1)
    cfg = types.SimpleNamespace(**spec["config"])
    model = AutoModelForCausalLM.from_config(spec["model_config"], attn_implementation="sdpa")
    load_weights(model, spec["state"])
    sampler = Sampler(cfg, model, spec["tokenizer"], spec["stream_seed"], spec["device"])
    sampler.version = spec["version"]
    return sampler


# ---- worker process --------------------------------------------------------------------------

def _worker_main(spec: dict, weights_q, out_q, stop_ev) -> None:
    """Loop of one local worker process: mode "async" | "pipeline" | "searcher"."""
    sampler = build_sampler(spec)
    cfg = sampler.cfg
    parent, mode, worker = spec["parent_pid"], spec["mode"], spec["worker"]
    P, eta = cfg.prompts_per_step, cfg.max_staleness

    def alive():
        return not stop_ev.is_set() and os.getppid() == parent

    def poll(block: bool) -> int:
        latest = None
        try:
            latest = weights_q.get(timeout=POLL_S) if block else weights_q.get_nowait()
            while True:
                latest = weights_q.get_nowait()
        except queue.Empty:
            pass
        if latest is not None:
            sampler.load(latest[1], latest[0])
        return sampler.version

    def put(groups) -> None:
        sampler.stats["cpu_s"] = time.process_time()   # the whole worker process, every thread
        groups[-1].stats = dict(sampler.stats)
        item = _pack(groups)
        t0 = time.perf_counter()
        while alive():
            try:
                out_q.put(item, timeout=POLL_S)
                break
            except queue.Full:
                poll(False)
        if "blocked_s" in sampler.stats:
            sampler.stats["blocked_s"] += time.perf_counter() - t0

    def allowed(index: int) -> bool:  # the staleness bound: step - version <= η
        return mode == "searcher" or index // P <= sampler.version + eta

    next_index = spec["first_index"]
    if mode == "pipeline":
        # decoding and taking weights interleave per token: only load / CPU time are separable
        for k in ("gen_s", "gen_cpu_s", "blocked_s"):
            sampler.stats.pop(k)
        done: dict[int, list] = {}       # group index -> finished sequences
        problems: dict[int, object] = {}
        current = [next_index, cfg.group_size]  # (group being started, members started)

        def next_request():
            nonlocal next_index
            if current[1] == cfg.group_size:  # start the next group, if the bound allows
                if not allowed(next_index):
                    return None
                problems[next_index], done[next_index] = sampler.next_problem(), []
                current[:] = [next_index, 0]
                next_index += 1
            current[1] += 1
            j = current[0]
            text = rollout.render_prompts(sampler.tokenizer, [problems[j].prompt], cfg.chat_template)
            return j, sampler.tokenizer(text[0], add_special_tokens=False)["input_ids"]

        def emit(j, prompt, tokens, logps, versions, finished):
            done[j].append((prompt, tokens, logps, versions, finished))
            if len(done[j]) == cfg.group_size:
                put([sampler.group_from_rows(j, problems.pop(j), done.pop(j), worker)])

        from scaling_rl.llm.inflight import decode_stream
        with rollout.autocast(sampler.device, cfg.bf16):
            decode_stream(sampler.model, slots=P * cfg.group_size, next_request=next_request,
                          poll=poll, emit=emit, should_stop=lambda: not alive(),
                          max_new_tokens=sampler.max_len, eos_id=sampler.eos_ids,
                          pad_id=sampler.tokenizer.pad_token_id, temperature=cfg.temperature,
                          top_p=cfg.top_p, generator=sampler.gen)
        return
    chunk = P if mode == "async" else max(1, P // max(cfg.searchers, 1))
    while alive():
        poll(False)
        if not allowed(next_index):
            t0 = time.perf_counter()
            poll(True)
            sampler.stats["blocked_s"] += time.perf_counter() - t0
            continue
        t0, c0 = time.perf_counter(), time.process_time()
        groups = sampler.generate(next_index, chunk, worker)
        sampler.stats["gen_s"] += time.perf_counter() - t0
        sampler.stats["gen_cpu_s"] += time.process_time() - c0
        put(groups)
        next_index += chunk


class _Worker:
    """One local worker process and its two queues; always stopped by `close()`."""

    def __init__(self, trainer, mode: str, worker: int, first_index: int):
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        c = trainer.cfg
        # searchers: one finished chunk waits while the next is generated (fresh weights sooner)
        depth = 1 if mode == "searcher" else (c.max_staleness + 2) * c.prompts_per_step
        self.weights_q, self.out_q = ctx.Queue(), ctx.Queue(maxsize=depth)
        self.stop_ev = ctx.Event()
        spec = {"config": dataclasses.asdict(c), "model_config": trainer.model.config,
                "state": pack_state(cpu_state(trainer.model)), "tokenizer": trainer.tokenizer,
                "stream_seed": c.seed * 7919 + 1 + worker + 104729 * trainer.step,
                "device": str(trainer.device), "version": trainer.step, "parent_pid": os.getpid(),
                "mode": mode, "worker": worker, "first_index": first_index}
        self.proc = ctx.Process(target=_worker_main, args=(spec, self.weights_q, self.out_q,
                                                           self.stop_ev), daemon=True,
                                name=f"rollout-{mode}-{worker}")
        self.proc.start()

    def send(self, state: dict, version: int) -> None:
        self.weights_q.put((version, state))

    def get(self, timeout: float) -> list[Group]:
        """Every group waiting in the queue (waiting up to `timeout` for the first)."""
        out = []
        try:
            out += _unpack(self.out_q.get(timeout=timeout))
            while True:
                out += _unpack(self.out_q.get_nowait())
        except queue.Empty:
            if not out and not self.proc.is_alive():
                raise RuntimeError(f"rollout worker {self.proc.name} exited with code "
                                   f"{self.proc.exitcode}") from None
        return out

    def close(self) -> None:
        self.stop_ev.set()
        for q in (self.out_q, self.weights_q):  # a full queue would block the child's exit
            try:
                while True:
                    q.get_nowait()
            except (queue.Empty, OSError, ValueError):
                pass
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)
        for q in (self.out_q, self.weights_q):
            q.close()
            q.cancel_join_thread()


# ---- trainer side ------------------------------------------------------------------------------

def assemble(trainer, groups: list[Group]) -> dict:
    """Groups -> the dict `GRPOTrainer.collect()` returns (batch on the trainer's device)."""
    batch = rollout.concat([g.batch for g in groups], trainer.tokenizer.pad_token_id,
                           trainer.max_len)
    batch = rollout.Batch(*[None if v is None else v.to(trainer.device)
                            for v in (getattr(batch, f.name) for f in dataclasses.fields(batch))])
    rewards = np.concatenate([g.rewards for g in groups]).astype(np.float32)
    return {"generated": rewards.reshape(len(groups), -1), "rounds": 1, "skipped_prompts": 0,
            "batch": batch, "rewards": rewards}


class SyncSource:
    """Today's synchronous loop: the trainer generates with its own model, RNG and generator."""

    def __init__(self, trainer):
        self.trainer = trainer

    def pull(self) -> dict:
        return self.trainer.collect()

    def publish(self, model, version: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def close(self) -> None:
        pass


class OrderedSource:
    """Base of the sources whose workers number their groups: step s takes groups
    s·P .. s·P + P - 1 (each exactly once, whatever order they arrive in)."""

    timeout_s = 600.0

    def __init__(self, trainer):
        self.trainer = trainer
        self.pending: dict[int, Group] = {}
        self.consumed: list[int] = []   # `Group.index` of every group trained on, in order
        self.consumed_from: list[int] = []  # the `Group.worker` that generated each of them
        self.wait_s = 0.0
        self.restarts = 0               # workers replaced after dying
        self.worker_stats: dict = {}    # the latest cumulative `Group.stats` received

    def _receive(self, timeout: float) -> list[Group]:
        raise NotImplementedError

    def pull(self) -> dict:
        P = self.trainer.cfg.prompts_per_step
        want = range(self.trainer.step * P, (self.trainer.step + 1) * P)
        t0 = time.perf_counter()
        while any(j not in self.pending for j in want):
            if time.perf_counter() - t0 > self.timeout_s:
                raise RuntimeError(f"rollout: no groups for step {self.trainer.step} in "
                                   f"{self.timeout_s:.0f} s")
            for g in self._receive(POLL_S * 4):
                self.trainer.counters["rollouts"] += len(g.rewards)  # generated, used or not
                if g.stats:
                    self.worker_stats = g.stats
                if g.index >= want[0]:  # a group from before a restart is not used twice
                    self.pending.setdefault(g.index, g)
        wait = time.perf_counter() - t0
        self.wait_s += wait
        groups = [self.pending.pop(j) for j in want]
        self._check(groups, want)
        self.consumed += [g.index for g in groups]
        self.consumed_from += [g.worker for g in groups]
        data = assemble(self.trainer, groups)
        data["source"] = {"source/wait_s": wait, "source/queued_groups": len(self.pending),
                          "source/restarts": self.restarts,
                          **{f"source/worker_{k}": v for k, v in self.worker_stats.items()}}
        return data

    def _check(self, groups: list[Group], want: range) -> None:
        """At consumption: the groups are this step's, and no token is more than η versions old
        (a violation is a bug in the source, so it stops the run rather than being logged)."""
        step, eta = self.trainer.step, self.trainer.cfg.max_staleness
        if [g.index for g in groups] != list(want):
            raise RuntimeError(f"rollout: step {step} assembled groups {[g.index for g in groups]}, "
                               f"wanted {list(want)}")
        for g in groups:
            if step - g.oldest_version > eta:
                raise RuntimeError(f"rollout: group {g.index} has a token of version "
                                   f"{g.oldest_version}, {step - g.oldest_version} versions behind "
                                   f"step {step} (max_staleness={eta})")

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class ProcessSource(OrderedSource):
    """`async` / `pipeline`: one local worker process with its own model copy. A worker that dies
    is replaced (current weights, a fresh prompt stream) up to `max_restarts` times; groups are
    consumed by index, so regenerated ones are never counted twice."""

    max_restarts = 3

    def __init__(self, trainer, mode: str):
        super().__init__(trainer)
        self.mode = mode
        self.worker = self._start()

    def _start(self) -> _Worker:
        t = self.trainer
        return _Worker(t, self.mode, self.restarts, t.step * t.cfg.prompts_per_step)

    def _receive(self, timeout):
        try:
            return self.worker.get(timeout)
        except RuntimeError:
            if self.restarts >= self.max_restarts:
                raise
            self.restarts += 1
            self.worker.close()
            self.worker = self._start()
            return []

    def publish(self, model, version: int) -> None:
        self.worker.send(pack_state(cpu_state(model)), version)

    def close(self) -> None:
        self.worker.close()


class ReplayBuffer:
    """TBA's trajectory buffer: groups, sampled part by reward (∝ exp(mean reward / T), without
    replacement) and part by recency (the newest groups). Resumable through `state_dict`."""

    def __init__(self, capacity: int, reward_fraction: float, temperature: float, seed: int):
        self.capacity, self.reward_fraction, self.temperature = capacity, reward_fraction, temperature
        self.groups: list[Group] = []
        self.added = 0
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self.groups)

    def add(self, group: Group) -> None:
        self.groups.append(group)
        self.added += 1
        if len(self.groups) > self.capacity:
            self.groups.pop(0)

    def sample(self, n: int) -> list[Group]:
        if len(self.groups) < n:
            raise ValueError(f"replay: {len(self.groups)} groups, {n} wanted")
        n_reward = int(round(n * self.reward_fraction))
        recent = list(range(len(self.groups) - (n - n_reward), len(self.groups)))
        rest = np.arange(len(self.groups) - len(recent))
        chosen = list(recent)
        if n_reward:
            r = np.array([float(self.groups[i].rewards.mean()) for i in rest])
            p = np.exp((r - r.max()) / self.temperature)
            chosen += list(self.rng.choice(rest, size=n_reward, replace=False, p=p / p.sum()))
        return [self.groups[int(i)] for i in sorted(chosen)]

    def state_dict(self) -> dict:
        return {"groups": list(self.groups), "added": self.added,
                "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.groups, self.added = list(state["groups"]), int(state["added"])
        self.rng.bit_generator.state = state["rng"]


class TBASource:
    """K searcher processes feeding a replay buffer; each step waits until at least the recency
    share of a batch is new (groups not seen before), then samples the buffer."""

    def __init__(self, trainer):
        c = self.cfg = trainer.cfg
        self.trainer = trainer
        self.buffer = ReplayBuffer(c.replay_capacity, c.replay_reward_fraction,
                                   c.replay_temperature, c.seed + 17)
        self.workers = [_Worker(trainer, "searcher", k, 10**9 * k) for k in range(c.searchers)]
        self.fresh = max(1, c.prompts_per_step - int(round(c.prompts_per_step * c.replay_reward_fraction)))

    def _drain(self, timeout: float) -> int:
        n = 0
        for w in self.workers:
            for g in w.get(timeout / len(self.workers)):
                self.buffer.add(g)
                self.trainer.counters["rollouts"] += len(g.rewards)  # generated, not replayed
                n += 1
        return n

    def pull(self) -> dict:
        t0, new = time.perf_counter(), 0
        while new < self.fresh or len(self.buffer) < self.cfg.prompts_per_step:
            new += self._drain(POLL_S * 4)
        wait = time.perf_counter() - t0
        data = assemble(self.trainer, self.buffer.sample(self.cfg.prompts_per_step))
        data["source"] = {"source/wait_s": wait, "replay/size": len(self.buffer),
                          "replay/added": self.buffer.added}
        return data

    def publish(self, model, version: int) -> None:
        if version % self.cfg.sync_every == 0:
            state = pack_state(cpu_state(model))     # packed once, sent to every searcher
            for w in self.workers:
                w.send(state, version)

    def state_dict(self) -> dict:
        return {"replay": self.buffer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("replay"):
            self.buffer.load_state_dict(state["replay"])

    def close(self) -> None:
        for w in self.workers:
            w.close()

