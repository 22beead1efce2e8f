"""`rollout=ray`: the rollout workers as Ray actors, with AReaL's staleness bound.

The trainer drives the actors: the groups of step s (s·P .. s·P + P - 1) are cut into units of
P / K prompts, and every unit with s <= latest version + η is handed out at once (to the least loaded
actor, which queues it), together with a reference to that version's weights (one `ray.put` per
published version; an actor loads them only when its version is older). Actors generate on the
trainer's device type (a GPU share each, `num_gpus` = cluster GPUs / K up to 1). A Ray instance
the source started is shut down by `close()`. A unit counts when its result arrives, and each group index
is consumed once, so a killed actor is simply replaced (new actor, latest weights) and its unit
handed out again: nothing is lost or counted twice. Uses a running Ray (`ray.init` first for a
cluster); otherwise starts a local one.
"""
from __future__ import annotations

import dataclasses

import time

from scaling_rl.llm.sources import OrderedSource, build_sampler, cpu_state


class _RolloutActor:
    """Ray actor body: a `Sampler` that loads weights of a newer version when handed one."""

    def __init__(self, spec: dict):
        self.sampler = build_sampler(spec)

    def generate(self, first_index: int, n_prompts: int, version: int, weights: list, worker: int):
        import ray
        if version > self.sampler.version:
            self.sampler.load(ray.get(weights[0]), version)
        return self.sampler.generate(first_index, n_prompts, worker)

    def pid(self) -> int:
        import os
        return os.getpid()


class RaySource(OrderedSource):
    """K rollout actors (`searchers`), units of P / K prompts, staleness bound η."""

    def __init__(self, trainer):
        import ray
        super().__init__(trainer)
        c = self.cfg = trainer.cfg
        self.ray, self.actors, self.running = ray, [], {}
        self.owns_ray = not ray.is_initialized()         # then close() shuts it down
        if self.owns_ray:
            ray.init(include_dashboard=False, log_to_driver=False)
        try:
            # actors generate where the trainer runs: on a GPU each gets a share of the cluster's
            # GPUs (Ray sets CUDA_VISIBLE_DEVICES, so "cuda" inside an actor is its own share)
            self.device, gpus = "cpu", 0.0
            if trainer.device.type == "cuda":
                have = float(ray.cluster_resources().get("GPU", 0))
                if have <= 0:
                    raise ValueError("device: cuda with rollout=ray, but the Ray cluster has no GPU; "
                                     "start Ray with GPUs (ray start --num-gpus) or use device=cpu")
                self.device, gpus = "cuda", min(1.0, have / c.searchers)
            self.remote_cls = ray.remote(num_cpus=1, num_gpus=gpus, max_restarts=0)(_RolloutActor)
        except Exception:
            self.close()
            raise
        self.unit = c.prompts_per_step // c.searchers
        self.version, self.weights = trainer.step, [ray.put(cpu_state(trainer.model))]
        self.next_unit = trainer.step * c.searchers      # units of step s: s·K .. s·K + K - 1
        self.todo: list[int] = []                        # units to hand out again (dead actor)
        self.actors = [self._new_actor(k) for k in range(c.searchers)]
        self._submit()                                   # generation starts with the source

    def _new_actor(self, k: int):
        t = self.trainer
        spec = {"config": dataclasses.asdict(self.cfg), "model_config": t.model.config,
                "state": cpu_state(t.model), "tokenizer": t.tokenizer,
                "stream_seed": self.cfg.seed * 7919 + 1 + k + 104729 * (t.step + self.restarts),
                "device": self.device, "version": self.version}
        return self.remote_cls.remote(spec)

    def _submit(self) -> None:
        """Hand out every unit the staleness bound allows (not one per idle actor: an actor queues
        its calls, so up to η + 1 steps of units are in flight), each to the least loaded actor."""
        while self.actors:
            unit = self.todo[0] if self.todo else self.next_unit
            if unit // self.cfg.searchers > self.version + self.cfg.max_staleness:
                return                                   # the staleness bound: wait for weights
            if self.todo:
                self.todo.pop(0)
            else:
                self.next_unit += 1
            load = [0] * len(self.actors)
            for slot, _ in self.running.values():
                load[slot] += 1
            k = load.index(min(load))
            fut = self.actors[k].generate.remote(unit * self.unit, self.unit, self.version,
                                                 self.weights, k)
            self.running[fut] = (k, unit)

    def _receive(self, timeout: float):
        self._submit()
        if not self.running:
            time.sleep(timeout)
            return []
        ready, _ = self.ray.wait(list(self.running), num_returns=1, timeout=timeout)
        out = []
        for fut in ready:
            k, unit = self.running.pop(fut)
            try:
                out += self.ray.get(fut)
            except (self.ray.exceptions.RayActorError, self.ray.exceptions.ActorDiedError,
                    self.ray.exceptions.ActorUnavailableError):
                # replace the actor (once) and redo its units, the queued ones included
                lost = [u for f, (slot, u) in list(self.running.items()) if slot == k]
                for f in [f for f, (slot, _) in self.running.items() if slot == k]:
                    self.running.pop(f)
                self.restarts += 1
                self.actors[k] = self._new_actor(k)
                self.todo = sorted(set(self.todo) | {unit, *lost})
        self._submit()
        return out

    def publish(self, model, version: int) -> None:
        self.version, self.weights = version, [self.ray.put(cpu_state(model))]
        self._submit()                                   # a new version may unlock units

    def close(self) -> None:
        for actor in self.actors:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self.actors, self.running = [], {}
        if self.owns_ray and self.ray.is_initialized():
            self.ray.shutdown()                          # a Ray this source started
        self.owns_ray = False

