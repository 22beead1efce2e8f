"""Trial kinds for the JAX agents (sac, dqn, crl): validation via the agent Config, runs via train.run."""
from __future__ import annotations

import functools

from scaling_rl.sweep.registry import TrialKind


def _config_cls(agent: str):
    from scaling_rl import agents
    return agents.get(agent).Config


def _check(config: dict) -> None:
    env = config.get("env")
    if env is None:
        return
    from scaling_rl import envs
    known = list(envs.known())
    if known and env not in known:
        raise ValueError(f"env: unknown env {env!r}; allowed: {', '.join(sorted(known))}")


def _param_count(agent: str, config: dict):
    from scaling_rl import agents
    mod = agents.get(agent)
    return int(mod.make(mod.Config.from_dict(config)).param_count)


def _packable(agent: str) -> tuple:
    from scaling_rl import agents
    return tuple(getattr(agents.get(agent), "PACKABLE", ()))


def _run(agent: str, config: dict, out_dir: str, seeds: int, seed: int, *, wandb=False,
         checkpoint_every: int = 1, seed_configs=None, stop=None, seed_ids=None):
    from scaling_rl import agents, train
    cfg = agents.get(agent).Config.from_dict(config)
    return train.run(agent, cfg, out_dir, seeds, seed=seed, wandb=wandb, progress=False,
                     checkpoint_every=checkpoint_every, seed_configs=seed_configs, stop=stop,
                     seed_ids=seed_ids)


def _kind(agent: str) -> TrialKind:
    return TrialKind(name=agent, config_cls=functools.partial(_config_cls, agent),
                     run=functools.partial(_run, agent),
                     param_count=functools.partial(_param_count, agent), check=_check,
                     packable=functools.partial(_packable, agent), stoppable=True)


SAC = _kind("sac")
DQN = _kind("dqn")
CRL = _kind("crl")
