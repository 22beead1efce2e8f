"""`run(config, out_dir)` for any GRPO config: `trainer.run` with the trainer the config needs
(`VideoGRPOTrainer` for `multimodal=video`). Its own module so that the trainer never imports the
trainers built on it (no import circle); `scaling-rl grpo` calls this."""
from __future__ import annotations

from scaling_rl.llm import trainer as _trainer
from scaling_rl.llm.video_grpo import VideoGRPOTrainer


def trainer_class(cfg) -> type:
    """The trainer a GRPOConfig needs: `VideoGRPOTrainer` for multimodal=video, else `GRPOTrainer`.
    Callers that add checks (the sweep's divergence test) subclass this class."""
    return VideoGRPOTrainer if cfg.multimodal == "video" else _trainer.GRPOTrainer


def run(config, out_dir, *, progress: bool = False, trainer_cls: type | None = None):
    """`trainer.run` with `trainer_class(cfg)`; a given `trainer_cls` must subclass it."""
    cfg = config if isinstance(config, _trainer.GRPOConfig) else _trainer.GRPOConfig.from_dict(dict(config))
    need = trainer_class(cfg)
    if trainer_cls is None:
        trainer_cls = need
    elif not issubclass(trainer_cls, need):
        raise ValueError(f"trainer_cls: {trainer_cls.__name__} is not a {need.__name__}, which "
                         f"multimodal={cfg.multimodal!r} needs")
    return _trainer.run(cfg, out_dir, progress=progress, trainer_cls=trainer_cls)
