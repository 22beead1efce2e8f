"""A JAX-free fake trial with the same contract as `train.run`, for exercising the sweep machinery.

It "trains" for `chunks` chunks of `chunk_seconds` each, appends one row per seed and chunk to
`metrics.parquet` (written atomically: the table is its own checkpoint, so a rerun resumes after
the last complete chunk), records every execution in `executions.log`, and can be told to diverge
or fail at a given chunk. `stop` (early stopping, sweep/early_stop.py) is asked after every chunk but
the last, and once on resume: when it answers, the table so far is written and returned.

`env: toy/law` is a simulated scaling study with a known answer: the return curve of seed s is
R(t / w_s) of `scaling.synthetic.Truth` (its D_J(σ, N) law, σ = utd, N = width²·depth = the trial's
param_count), w_s = exp(law_noise·z_s) a per-seed log-normal warp of D, plus law_obs_noise·z per logged
point; batch size and learning rate do not matter there. Noise is keyed on the global seed
(trial.seed·seeds + s, the `seed` of the sweep table) and the configuration, so replicate trials of
one configuration are independent draws. `log_points` > 0 logs at that many log-spaced env steps from
chunk_env_steps to env_steps (one chunk per log point) instead of every chunk_env_steps.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path

from scaling_rl.sweep.registry import TrialKind

ENVS = ("toy/line", "toy/bowl", "toy/law")


class Diverged(RuntimeError):
    """Non-finite loss at env step `step` (same name and shape as scaling_rl.train.Diverged)."""

    def __init__(self, step: int):
        super().__init__(f"non-finite loss at env step {step}")
        self.step = step


@dataclasses.dataclass(frozen=True)
class Config:
    env: str = "toy/line"
    width: int = 8
    depth: int = 1
    utd: float = 1.0
    batch_size: int = 32
    lr: float = 1e-3
    env_steps: int = 400
    chunk_env_steps: int = 100
    chunk_seconds: float = 0.0
    diverge_at_chunk: int = -1
    fail_at_chunk: int = -1
    law_noise: float = 0.05
    law_obs_noise: float = 0.01
    log_points: int = 0

    def __post_init__(self):
        if self.env not in ENVS:
            raise ValueError(f"env: unknown env {self.env!r}; allowed: {', '.join(ENVS)}")
        if not self.utd > 0:
            raise ValueError(f"utd: {self.utd!r} is not allowed; the UTD ratio sigma must be > 0")
        for name in ("width", "depth", "batch_size", "env_steps", "chunk_env_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)!r}")
        if not self.lr > 0:
            raise ValueError(f"lr: must be > 0, got {self.lr!r}")
        if self.log_points < 0:
            raise ValueError(f"log_points: must be >= 0, got {self.log_points!r}")
        for name in ("law_noise", "law_obs_noise"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)!r}")

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown field; allowed: {', '.join(sorted(names))}")
        return cls(**d)

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_ends)

    @property
    def chunk_ends(self) -> tuple:
        """Env steps at the end of each chunk (= each logged point)."""
        if self.log_points:
            import numpy as np
            ends = np.unique(np.round(np.geomspace(self.chunk_env_steps, max(self.env_steps, self.chunk_env_steps),
                                                   self.log_points)).astype(np.int64))
            return tuple(int(e) for e in ends)
        return tuple((c + 1) * self.chunk_env_steps for c in range(max(1, self.env_steps // self.chunk_env_steps)))


def law_curve(cfg: Config, global_seed: int) -> "np.ndarray":
    """The toy/law return at every chunk end for one seed (see the module docstring)."""
    import numpy as np
    from scaling_rl.scaling import synthetic

    key = [int(global_seed), int(cfg.width), int(cfg.depth), int(round(cfg.utd * 1e6))]
    rng = np.random.default_rng(key)
    warp = math.exp(cfg.law_noise * rng.standard_normal())
    t = np.asarray(cfg.chunk_ends, float)
    R = synthetic.return_curve(synthetic.Truth(), t / warp, cfg.utd, float(cfg.width) ** 2 * cfg.depth, 0)
    return R + cfg.law_obs_noise * rng.standard_normal(len(t))


def curve(cfg: Config, seed: int, chunk: int) -> float:
    """A deterministic learning curve: bigger width and utd learn faster."""
    steps = cfg.chunk_ends[chunk]
    rate = 1e-3 * math.sqrt(cfg.width) * cfg.utd ** 0.5 * (cfg.lr / 1e-3) ** 0.1
    return 100.0 * (1 - math.exp(-rate * steps)) + 0.1 * seed


def run(config: dict, out_dir: str, seeds: int, seed: int, *, wandb=False, checkpoint_every=1,
        seed_configs=None, stop=None):
    import pandas as pd
    from scaling_rl.io import atomic_write_parquet

    cfg = Config.from_dict(config)
    # packed trials may differ in lr (the toy's only packable field): seed s follows its own config
    per_seed = [Config.from_dict(c) for c in seed_configs] if seed_configs else [cfg] * seeds
    if len(per_seed) != seeds or any(dataclasses.replace(c, lr=cfg.lr) != cfg for c in per_seed):
        raise ValueError("seed_configs: one config per seed, differing from config only in lr")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "executions.log", "a") as f:  # one small O_APPEND write per execution
        f.write(f"{os.getpid()} {time.time():.3f}\n")
    path = out / "metrics.parquet"
    df = pd.read_parquet(path) if path.exists() else pd.DataFrame()
    start = 0 if df.empty else int(df["chunk"].max()) + 1
    ends = cfg.chunk_ends
    law = ([law_curve(c, seed * seeds + s) for s, c in enumerate(per_seed)] if cfg.env == "toy/law" else None)
    # a resumed run asks `stop` again on the table it restored: a stopped run stays stopped
    if stop is not None and start and start < cfg.num_chunks and stop(start - 1, df):
        return df
    for chunk in range(start, cfg.num_chunks):
        if chunk == cfg.fail_at_chunk:
            raise RuntimeError(f"toy failure at chunk {chunk}")
        if cfg.chunk_seconds:
            time.sleep(cfg.chunk_seconds)
        steps = ends[chunk]
        if chunk == cfg.diverge_at_chunk:
            raise Diverged(steps)
        ret = [float(law[s][chunk]) if law is not None else curve(per_seed[s], seed + s, chunk) for s in range(seeds)]
        rows = [{"seed": s, "chunk": chunk, "env_steps": steps,
                 "grad_steps": int(steps * cfg.utd), "episode_return": ret[s],
                 "eval_return": ret[s], "loss/critic": 1.0 / (chunk + 1)}
                for s in range(seeds)]
        df = pd.concat([df, pd.DataFrame(rows)], ignore_index=True)
        stopped = stop is not None and chunk + 1 < cfg.num_chunks and stop(chunk, df)
        if stopped or (chunk + 1) % checkpoint_every == 0 or chunk + 1 == cfg.num_chunks:
            atomic_write_parquet(path, df)
        if stopped:
            return df
    return df


TOY = TrialKind(name="toy", config_cls=lambda: Config, run=run,
                param_count=lambda c: int(c["width"]) ** 2 * int(c["depth"]), uses_jax=False,
                packable=lambda: ("lr",), stoppable=True)
