"""`rollout=ray`: the rollout workers as Ray actors, with AReaL's staleness bound.

The trainer drives the actors: the groups of step s (s·P .. s·P + P - 1) are cut into units of
P / K prompts, and a unit is handed to an idle actor only while s <= latest version + η, together
with a reference to that version's weights (one `ray.put` per published version; an actor loads
them only when its version is older). A unit counts when its result arrives, and each group index
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
        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)
        self.ray = ray
        self.unit = c.prompts_per_step // c.searchers
        self.remote_cls = ray.remote(num_cpus=1, max_restarts=0)(_RolloutActor)
        self.version, self.weights = trainer.step, [ray.put(cpu_state(trainer.model))]
        self.next_unit = trainer.step * c.searchers      # units of step s: s·K .. s·K + K - 1
        self.todo: list[int] = []                        # units to hand out again (dead actor)
        self.actors = [self._new_actor(k) for k in range(c.searchers)]
        self.running: dict = {}                          # future -> (actor slot, unit)

    def _new_actor(self, k: int):
        t = self.trainer
        spec = {"config": dataclasses.asdict(self.cfg), "model_config": t.model.config,
                "state": cpu_state(t.model), "tokenizer": t.tokenizer,
                "stream_seed": self.cfg.seed * 7919 + 1 + k + 104729 * (t.step + self.restarts),
                "device": "cpu", "version": self.version}
        return self.remote_cls.remote(spec)

    def _submit(self) -> None:
        busy = {slot for slot, _ in self.running.values()}
        for k, actor in enumerate(self.actors):
            if k in busy:
                continue
            unit = self.todo[0] if self.todo else self.next_unit
            if unit // self.cfg.searchers > self.version + self.cfg.max_staleness:
                return                                   # the staleness bound: wait for weights
            if self.todo:
                self.todo.pop(0)
            else:
                self.next_unit += 1
            fut = actor.generate.remote(unit * self.unit, self.unit, self.version, self.weights, k)
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
                self.restarts += 1                       # replace the actor, redo its unit
                self.actors[k] = self._new_actor(k)
                self.todo.append(unit)
                self.todo.sort()
        self._submit()
        return out

    def publish(self, model, version: int) -> None:
        self.version, self.weights = version, [self.ray.put(cpu_state(model))]

    def close(self) -> None:
        for actor in self.actors:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self.actors, self.running = [], {}

