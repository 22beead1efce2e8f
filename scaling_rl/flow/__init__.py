"""Flow-matching generators and Flow-GRPO in JAX.

Modules: `data` (procedural datasets: 2-D toy, coloured shapes), `model` (velocity network on
`scaling_rl.nets` backbones, flow-matching pretraining), `sde` (ODE and matching-marginals SDE
samplers, step log-probs; the derivation is in its docstring), `rewards` (plug-ins by name),
`fidelity` (distance of samples to held-out data, beside reward), `grpo` (Flow-GRPO agent: Config,
make), `sweep` (the `flow_grpo` trial kind). See docs/flow.md.
"""
