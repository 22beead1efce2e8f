"""GRPO on `transformers` causal LMs, with the objective in JAX through `scaling_rl.bridge`.

Modules: `models` (tiny offline policies, char tokenizer), `tasks` (addition, countdown),
`rollout` (sampling, log-probs, scoring), `objectives` (GRPO math in JAX), `greso` (selective
rollouts), `passk` (unbiased pass@k), `trainer` (`run(config, out_dir)`), `dpo` (DPO trainer), `sams`
(DPO batch schedulers), `cli`.
Kept import-light: nothing here imports torch until a submodule is used.
"""
