"""The `grpo` trial kind: GRPO runs (`scaling_rl.llm.trainer`) as trials of the sweep engine.

    agent: grpo
    base: {sft_steps: 100, steps: 40}
    grid: {group_size: [4, 8], hidden_size: [32, 64], loss_type: [grpo, dapo]}

Every trial is validated through `GRPOConfig.from_dict` (plus `check`) before anything runs.
A trial of `seeds` seeds runs them one after another, each as a full GRPO run in its own
sub-directory::

    <trial>/config.json       agent, config, seeds, seed, param_count (read by the engine)
    <trial>/seed_<i>/         grpo_config.json, metrics.parquet, base_model/, checkpoints/
    <trial>/metrics.parquet   every seed's rows, rewritten at each checkpoint

Seed index i runs with GRPO seed `trial_seed * seeds + i`: the `seed` column of `sweep collect`.
Set seeds with the spec's `seed` / `seeds` keys or a `grid: {seed: [...]}` axis, not `base.seed`.
Rerunning resumes every seed from its last checkpoint (the config's own `checkpoint_every`, in
GRPO steps; the sweep's `checkpoint_every` does not apply). Columns added to the trainer's rows:
`seed` (index), `chunk` (= GRPO step; row 0 is the base policy), `env_steps` (completions sampled
so far, the data axis) and `grad_steps` (optimizer steps so far). A non-finite loss or gradient
norm raises `Diverged` (step = env_steps then). N = every parameter of the policy (embeddings
included; tied ones once; with multimodal=video the frame encoder too). A trial runs the trainer its
config needs (`grpo_run.trainer_class`: `VideoGRPOTrainer` for multimodal=video), as `scaling-rl
grpo` does.

Early stopping (a spec's `early_stop:`, sweep/early_stop.py) works seed by seed, since the seeds
run one after another: on row 0 (the base policy) and after each GRPO step but the last, the rule
is asked about the running seed's own rows (`GRPOTrainer.should_stop`); when it fires, that seed
checkpoints and ends and the next one starts. A rerun asks the rule again on a stopped seed's restored rows before training, so
it stays stopped. The trial counts as stopped ("reached") only when every seed stopped; as soon as
one seed runs its whole budget, the seeds that had stopped are resumed and run to theirs as well
(on CPU their numbers are those of a run that never stopped), so a trial's seeds are either all
stopped or all complete. The budget, in the table's env_steps unit (rollouts), is `budget`: steps *
prompts_per_step * group_size per seed (nominal: dynamic sampling may draw more per step). Saved
FLOPs are not given (None): 10*N*B*sigma per env step does not describe a rollout. The rule's
`unreachable` part is refused for grpo.

Nothing here imports torch or transformers until a trial kind function is called.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from scaling_rl.sweep.registry import TrialKind

SEED_DIR = "seed_{}"
TINY_KINDS = ("qwen2", "llama")


class Diverged(RuntimeError):
    """Non-finite GRPO loss or gradient norm; `step` is the env_steps (completions) count then."""

    def __init__(self, step: int, message: str = ""):
        self.step = int(step)
        super().__init__(message or f"diverged at env step {self.step}")


def _config_cls():
    from scaling_rl.llm.grpo_config import GRPOConfig
    return GRPOConfig


def _is_tiny(model: str) -> bool:
    return model == "tiny" or model.startswith("tiny:")


def check(config: dict) -> None:
    """What GRPOConfig cannot see: the seed belongs to the sweep, tiny-model shapes, init_from."""
    if config.get("seed", 0) != 0:
        raise ValueError(f"seed: {config['seed']!r} in the GRPO config; set seeds with the spec's "
                         "`seed`/`seeds` keys or a `grid: {seed: [...]}` axis")
    source = config.get("init_from") or config.get("model", "tiny")
    if config.get("init_from"):
        if not (Path(config["init_from"]) / "config.json").is_file():
            raise ValueError(f"init_from: {config['init_from']!r} is not a saved policy directory "
                             "(no config.json)")
    elif _is_tiny(source):
        kind = source.split(":", 1)[1] if ":" in source else "qwen2"
        if kind not in TINY_KINDS:
            raise ValueError(f"model: tiny kind {kind!r} is unknown; "
                             "use 'tiny', 'tiny:qwen2' or 'tiny:llama'")
        if config["hidden_size"] % config["num_heads"]:
            raise ValueError(f"hidden_size: {config['hidden_size']} is not divisible by "
                             f"num_heads={config['num_heads']}")


def param_count(config: dict) -> int:
    """Parameters of the policy the trial trains, built on the meta device (no weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from scaling_rl.llm.models import char_tokenizer, tiny_model

    source = config.get("init_from") or config.get("model", "tiny")
    with torch.device("meta"):
        if _is_tiny(source):
            kind = source.split(":", 1)[1] if ":" in source else "qwen2"
            model = tiny_model(char_tokenizer(), kind, int(config["hidden_size"]),
                               int(config["num_layers"]), int(config["num_heads"]))
        else:
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source))
        if config.get("multimodal") == "video":   # the policy is the LM + its frame encoder
            from scaling_rl.llm.multimodal import video_config_from
            model = AutoModelForCausalLM.from_config(video_config_from(
                model.config, frame_dim=int(config["frame_dim"]),
                encoder_hidden=int(config["frame_encoder_hidden"]),
                frames_per_token=int(config["frames_per_token"])))
    return int(sum(p.numel() for p in model.parameters()))


def _tidy(df, index: int, cfg):
    """One seed's trainer rows + seed / chunk / env_steps / grad_steps."""
    df = df.copy()
    step = df["step"].astype("int64")
    rollouts = df["rollouts"] if "rollouts" in df.columns else 0 * step
    df.insert(0, "seed", index)
    df.insert(1, "chunk", step)
    df.insert(2, "env_steps", rollouts.fillna(0).astype("int64"))
    df.insert(3, "grad_steps", step * cfg.num_iterations * cfg.num_minibatches)
    return df


def _write_combined(out: Path, seeds: int, cfg):
    """<trial>/metrics.parquet from every seed directory's metrics so far."""
    import pandas as pd

    from scaling_rl.io import atomic_write_parquet

    frames = []
    for i in range(seeds):
        path = out / SEED_DIR.format(i) / "metrics.parquet"
        if path.exists():
            frames.append(_tidy(pd.read_parquet(path), i, cfg))
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    atomic_write_parquet(out / "metrics.parquet", df)
    return df


def budget(config: dict) -> int:
    """Rollouts one seed samples in a full run (nominal): steps * prompts_per_step * group_size."""
    cfg = _config_cls().from_dict(dict(config))
    return int(cfg.steps) * int(cfg.prompts_per_step) * int(cfg.group_size)


def _checked_trainer(base, on_save, ask=None):
    """`base` (the trainer the config needs, `grpo_run.trainer_class`) that raises Diverged on a
    non-finite loss / grad norm (after writing the rows so far), reports each save, and (with
    `ask`: (step, this seed's tidy rows) -> truthy to stop) can stop early."""

    class Checked(base):
        def should_stop(self, row):
            return bool(ask is not None and ask(self.step, self.metrics_frame()))

        def train_step(self):
            row = super().train_step()
            bad = [k for k in ("loss", "grad_norm") if k in row and not math.isfinite(row[k])]
            if bad:  # keep every row up to and including the bad one (a rerun drops it again)
                self.rows.append(row)
                self._write_metrics()
                on_save()
                n = int(self.counters["rollouts"])
                raise Diverged(n, f"diverged at env step {n} (GRPO step {self.step}, seed "
                                  f"{self.cfg.seed}): {', '.join(bad)} non-finite")
            return row

        def save(self):
            super().save()
            on_save()

    return Checked


def _run_seed(cfg, out: Path, on_save, ask=None):
    """trainer.run for one seed, with the divergence check (same resume / config-change rules)."""
    from scaling_rl.llm import grpo_run

    out.mkdir(parents=True, exist_ok=True)
    # the same dispatch as `scaling-rl grpo` (multimodal=video -> VideoGRPOTrainer)
    checked = _checked_trainer(grpo_run.trainer_class(cfg), on_save, ask)
    return grpo_run.run(cfg, out, trainer_cls=checked)


def _seed_ask(stop, index: int, base):
    """The trainer's stop question for seed `index`: `stop(step, that seed's tidy rows)`."""
    return lambda step, rows: stop(step, _tidy(rows, index, base))


def run(config: dict, out_dir: str, seeds: int, seed: int, *, wandb=False, checkpoint_every: int = 1,
        stop=None):
    """Run (or resume) `seeds` GRPO runs, seeds trial_seed*seeds + 0..seeds-1, one after another.

    `checkpoint_every` (sweep chunks) is not used: the GRPO config's own field decides. `stop`
    (early stopping, module docstring): asked about one seed's rows at a time; a seed it stops ends
    early, and every seed is run to its budget once one seed was not stopped.
    """
    from scaling_rl import io as sio

    GRPOConfig = _config_cls()
    base = GRPOConfig.from_dict(dict(config))
    check(dataclasses.asdict(base))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfgs = [dataclasses.replace(base, seed=seed * seeds + i) for i in range(seeds)]
    record = {"agent": "grpo", "config": dict(config), "seeds": int(seeds), "seed": int(seed),
              "param_count": param_count(dataclasses.asdict(base)),
              "seed_dirs": {SEED_DIR.format(i): c.seed for i, c in enumerate(cfgs)}}
    sio.atomic_write_json(out / "config.json", record)
    if stop is not None and callable(getattr(stop, "sequential", None)):
        stop.sequential()     # the runner's Watcher: judge seed by seed
    on_save = lambda: _write_combined(out, seeds, base)  # noqa: E731
    stopping, stopped = stop is not None, []
    for i, cfg in enumerate(cfgs):
        ask = _seed_ask(stop, i, base) if stopping else None
        try:
            rows = _run_seed(cfg, out / SEED_DIR.format(i), on_save, ask)
        finally:
            _write_combined(out, seeds, base)
        if int(rows["step"].max()) < cfg.steps:
            stopped.append(i)
        else:
            stopping = False            # this seed ran its budget: the trial cannot count as stopped
    if stopped and not stopping:        # so the seeds that had stopped run theirs as well
        for i in stopped:
            try:
                _run_seed(cfgs[i], out / SEED_DIR.format(i), on_save)
            finally:
                _write_combined(out, seeds, base)
    df = _write_combined(out, seeds, base)
    if wandb:
        _log_wandb(wandb, out, config, seeds, df)
    return df


def _log_wandb(options, out: Path, config: dict, seeds: int, df) -> None:
    """Seed-mean of each metric per GRPO step, logged once every seed has finished."""
    from scaling_rl.logging_utils import WandbLogger

    logger = WandbLogger(options, out_dir=str(out), agent="grpo", config=config, seeds=seeds)
    numeric = df.select_dtypes("number")
    for _, rows in numeric.groupby("chunk", sort=True):
        logger.log(rows.to_dict("records"))
    logger.finish()


TRIAL_KIND = TrialKind(name="grpo", config_cls=_config_cls, run=run, param_count=param_count,
                       check=check, stoppable=True, sequential=True, budget=budget)
