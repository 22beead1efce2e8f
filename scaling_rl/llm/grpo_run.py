"""`run(config, out_dir)` for any GRPO config: `trainer.run` with the trainer the config needs
(`VideoGRPOTrainer` for `multimodal=video`). Its own module so that the trainer never imports the
trainers built on it (no import circle); `scaling-rl grpo` calls this."""
from __future__ import annotations

from scaling_rl.llm import trainer as _trainer
from scaling_rl.llm.video_grpo import VideoGRPOTrainer


def run(config, out_dir, *, progress: bool = False, trainer_cls: type | None = None):
    cfg = config if isinstance(config, _trainer.GRPOConfig) else _trainer.GRPOConfig.from_dict(dict(config))
    if trainer_cls is None and cfg.multimodal == "video":
        trainer_cls = VideoGRPOTrainer
    return _trainer.run(cfg, out_dir, progress=progress, trainer_cls=trainer_cls)
