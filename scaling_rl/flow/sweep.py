"""The `flow_grpo` trial kind: Flow-GRPO runs (`scaling_rl.flow.grpo` through `train.run`) as trials.

    agent: flow_grpo
    base: {pretrain_steps: 1500, updates: 60, chunk_updates: 10}
    grid: {width: [32, 64, 128], group_size: [4, 8], t_train: [5, 10], sampler: [full, fast]}

A trial is one `train.run` of the agent module: config.json, metrics.parquet (one row per seed and
chunk of `chunk_updates` policy updates; env_steps = generations sampled, grad_steps = optimizer
steps, flops = velocity-network FLOPs spent in RL), checkpoints/ and exact resume. N = the velocity
network's parameters. `lr` is packable (optimiser state), so `pack: true` runs an η row as one program.
"""
from __future__ import annotations

from scaling_rl.sweep.registry import TrialKind

AGENT = "scaling_rl.flow.grpo"


def _module():
    from scaling_rl.flow import grpo
    return grpo


def _config_cls():
    return _module().Config


def _param_count(config: dict) -> int:
    mod = _module()
    return int(mod.make(mod.Config.from_dict(config)).param_count)


def _run(config: dict, out_dir: str, seeds: int, seed: int, *, wandb=False, checkpoint_every: int = 1,
         seed_configs=None, stop=None):
    from scaling_rl import train
    return train.run(AGENT, _module().Config.from_dict(config), out_dir, seeds, seed=seed,
                     wandb=wandb, progress=False, checkpoint_every=checkpoint_every,
                     seed_configs=seed_configs, stop=stop)


TRIAL_KIND = TrialKind(name="flow_grpo", config_cls=_config_cls, run=_run, param_count=_param_count,
                       packable=lambda: _module().PACKABLE, stoppable=True)
