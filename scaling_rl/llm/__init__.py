"""GRPO on `transformers` causal LMs, with the objective in JAX through `scaling_rl.bridge`.

Modules: `models` (tiny offline policies, char tokenizer), `tasks` (addition, countdown),
`rollout` (sampling, log-probs, scoring), `objectives` (GRPO math in JAX), `greso` (selective
rollouts), `passk` (unbiased pass@k), `trainer` (`run(config, out_dir)`), `grpo_config` (`GRPOConfig`),
`warm_start` (the SFT before RL), `dpo` (DPO trainer), `sams` (DPO batch schedulers), `cli`.
Kept import-light: nothing here imports torch until a submodule is used.
"""
import os as _os

# JAX shares the GPU with torch here (the policy is a torch model; the objective runs in JAX):
# without this, JAX's first GPU use grabs 75% of the card before torch has loaded the model.
# Read when JAX creates its GPU client, so setting it on import of this package is early enough
# unless JAX already ran on the GPU in this process; an explicit user setting wins.
_os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
