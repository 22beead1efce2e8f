"""Side-channel loggers for a training run: wandb (never the source of truth) and a rich
progress bar. Both are optional and both are no-ops when switched off."""
from __future__ import annotations

import hashlib
import math
import os
from typing import Any, Mapping

import numpy as np


class WandbLogger:
    """One wandb run per training run; logs the seed-mean of each metric against env steps.

    `options` is `True` (defaults) or a dict of `wandb.init` keyword arguments (project, group,
    name, mode, dir, tags, entity, ...). The mode is `$WANDB_MODE` if set, else "offline": a run
    goes online only when asked. The run id is derived from the run directory, so a resumed
    run appends to the same wandb run.
    """

    def __init__(self, options: bool | Mapping[str, Any], *, out_dir: str, agent: str,
                 config: Mapping[str, Any], seeds: int):
        import wandb  # deferred: importing wandb costs ~1 s and most runs do not use it

        opts = dict(options) if isinstance(options, Mapping) else {}
        run_id = hashlib.sha1(os.path.abspath(out_dir).encode()).hexdigest()[:16]
        env = str(config.get("env", "env"))
        kwargs: dict[str, Any] = dict(
            project="scaling_rl",
            group=f"{agent}-{env.replace('/', '-')}",
            name=os.path.basename(os.path.abspath(out_dir)),
            id=run_id,
            resume="allow",
            mode=os.environ.get("WANDB_MODE", "offline"),
            config={"agent": agent, "seeds": seeds, **dict(config)},
            dir=os.environ.get("WANDB_DIR", out_dir),
        )
        kwargs.update(opts)
        settings = kwargs.pop("settings", None) or wandb.Settings(
            console="off", silent=True, x_disable_stats=True, disable_git=True)
        os.makedirs(kwargs["dir"], exist_ok=True)
        self._wandb = wandb
        self.run = wandb.init(settings=settings, **kwargs)

    def log(self, rows: list[dict[str, Any]]) -> None:
        """Log one chunk: `rows` are that chunk's tidy rows (one per seed)."""
        if not rows:
            return
        data: dict[str, float] = {}
        for key in rows[0]:
            if key in ("seed", "chunk"):
                continue
            values = np.asarray([r[key] for r in rows], dtype=np.float64)
            finite = values[np.isfinite(values)]
            if finite.size:
                data[key] = float(finite.mean())
                if key in ("episode_return", "eval_return") and len(rows) > 1:
                    data[f"{key}_std"] = float(finite.std())
        data["chunk"] = int(rows[0]["chunk"])
        self.run.log(data, step=int(rows[0]["env_steps"]))

    def finish(self, exit_code: int = 0) -> None:
        self.run.finish(exit_code=exit_code)


class Progress:
    """A rich progress bar over chunks showing env steps, mean return and throughput."""

    def __init__(self, enabled: bool, *, total: int, completed: int = 0, description: str = ""):
        self._bar = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress,
                                   TextColumn, TimeElapsedColumn, TimeRemainingColumn)

        console = Console(stderr=True)
        if not console.is_terminal:  # logs and pipes: room for the whole line, not 80 columns
            console = Console(stderr=True, width=max(console.width, 160))
        self._bar = RichProgress(
            TextColumn("[bold]{task.description}"),
            MofNCompleteColumn(),
            BarColumn(bar_width=20),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"),
            console=console,
        )
        self._task = self._bar.add_task(description, total=total, completed=completed, info="")
        self._bar.start()

    def update(self, completed: int, **fields: float) -> None:
        if self._bar is None:
            return
        parts = []
        for name, value in fields.items():
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            parts.append(f"{name} {value:.4g}" if isinstance(value, float) else f"{name} {value:,}")
        self._bar.update(self._task, completed=completed, info="  ".join(parts))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
