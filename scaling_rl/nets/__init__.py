"""Residual backbones (CRL, BRO, SimBa, MLP), their stacked/unrolled param layouts, and cost counts."""
from scaling_rl.nets.backbone import (
    ACTIVATIONS,
    DEFAULT_ACTIVATION,
    INITS,
    KINDS,
    Backbone,
    BackboneConfig,
    Block,
    stack_params,
    unstack_params,
)
from scaling_rl.nets.costs import (
    ACTIVATION_FLOPS,
    LAYERNORM_FLOPS_PER_FEATURE,
    LAYERNORM_FLOPS_PER_ROW,
    backbone_flops,
    backbone_flops_breakdown,
    backbone_param_count,
    dense_head_flops,
    dense_head_param_count,
    param_count,
    xla_flops,
)
from scaling_rl.nets.memory import (
    backbone_activation_bytes,
    block_saved_bytes_per_row,
    check_fits,
    estimate_peak_bytes,
    memory_budget_bytes,
)

__all__ = [
    "ACTIVATIONS", "ACTIVATION_FLOPS", "DEFAULT_ACTIVATION", "INITS", "KINDS",
    "LAYERNORM_FLOPS_PER_FEATURE", "LAYERNORM_FLOPS_PER_ROW", "Backbone", "BackboneConfig", "Block",
    "backbone_flops", "backbone_flops_breakdown", "backbone_param_count", "dense_head_flops", "dense_head_param_count",
    "param_count", "stack_params", "unstack_params", "xla_flops",
    "backbone_activation_bytes", "block_saved_bytes_per_row", "check_fits", "estimate_peak_bytes",
    "memory_budget_bytes",
]
