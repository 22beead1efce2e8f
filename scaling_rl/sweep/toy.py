"""A JAX-free fake trial with the same contract as `train.run`, for exercising the sweep machinery.

It "trains" for `chunks` chunks of `chunk_seconds` each, appends one row per seed and chunk to
`metrics.parquet` (written atomically: the table is its own checkpoint, so a rerun resumes after
the last complete chunk), records every execution in `executions.log`, and can be told to diverge
or fail at a given chunk.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path

from scaling_rl.sweep.registry import TrialKind

ENVS = ("toy/line", "toy/bowl")


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

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown field; allowed: {', '.join(sorted(names))}")
        return cls(**d)

    @property
    def num_chunks(self) -> int:
        return max(1, self.env_steps // self.chunk_env_steps)


def curve(cfg: Config, seed: int, chunk: int) -> float:
    """A deterministic learning curve: bigger width and utd learn faster."""
    steps = (chunk + 1) * cfg.chunk_env_steps
    rate = 1e-3 * math.sqrt(cfg.width) * cfg.utd ** 0.5 * (cfg.lr / 1e-3) ** 0.1
    return 100.0 * (1 - math.exp(-rate * steps)) + 0.1 * seed


def run(config: dict, out_dir: str, seeds: int, seed: int, *, wandb=False, checkpoint_every=1,
        seed_configs=None):
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
    for chunk in range(start, cfg.num_chunks):
        if chunk == cfg.fail_at_chunk:
            raise RuntimeError(f"toy failure at chunk {chunk}")
        if cfg.chunk_seconds:
            time.sleep(cfg.chunk_seconds)
        steps = (chunk + 1) * cfg.chunk_env_steps
        if chunk == cfg.diverge_at_chunk:
            raise Diverged(steps)
        rows = [{"seed": s, "chunk": chunk, "env_steps": steps,
                 "grad_steps": int(steps * cfg.utd), "episode_return": curve(per_seed[s], seed + s, chunk),
                 "eval_return": curve(per_seed[s], seed + s, chunk), "loss/critic": 1.0 / (chunk + 1)}
                for s in range(seeds)]
        df = pd.concat([df, pd.DataFrame(rows)], ignore_index=True)
        if (chunk + 1) % checkpoint_every == 0 or chunk + 1 == cfg.num_chunks:
            atomic_write_parquet(path, df)
    return df


TOY = TrialKind(name="toy", config_cls=lambda: Config, run=run,
                param_count=lambda c: int(c["width"]) ** 2 * int(c["depth"]), uses_jax=False,
                packable=lambda: ("lr",))
