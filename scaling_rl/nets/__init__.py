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

__all__ = [
    "ACTIVATIONS", "ACTIVATION_FLOPS", "DEFAULT_ACTIVATION", "INITS", "KINDS",
    "LAYERNORM_FLOPS_PER_FEATURE", "LAYERNORM_FLOPS_PER_ROW", "Backbone", "BackboneConfig", "Block",
    "backbone_flops", "backbone_flops_breakdown", "backbone_param_count", "dense_head_flops", "dense_head_param_count",
    "param_count", "stack_params", "unstack_params", "xla_flops",
]
