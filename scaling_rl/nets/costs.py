"""Exact parameter counts and forward FLOPs per sample of the backbones, and XLA's own count.

FLOP convention (per sample, forward only) = XLA's HloCostAnalysis of the unoptimised program, so
`backbone_flops(cfg, d) == xla_flops(apply, params, x[None], compiled=False)` exactly (unrolled stack):
  Dense in->out    2·in·out (multiply + add per weight) + out (bias add)
  LayerNorm d      7·d + 4: row sum (d), square (d), sum of squares (d), centre (d), rsqrt·scale (d),
                   normalise (d), shift (d), plus 4 per-row scalars (two means, mean², var clamp);
                   the eps add and rsqrt are a transcendental, not a FLOP
  activation d     ACTIVATION_FLOPS[name]·d; transcendentals (exp, tanh) are not FLOPs (XLA convention)
  residual add d   d
Matmuls dominate: 2·N per sample up to the bias/norm/activation terms. XLA's *optimised* count
(compiled=True) differs only in elementwise bookkeeping (fusion can recompute a bias add): under 10%
at width 32 (tested in tests/test_nets.py), shrinking like 1/width.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import jax

from scaling_rl.nets.backbone import DENSE_PER_CRL_BLOCK, BackboneConfig

LAYERNORM_FLOPS_PER_FEATURE = 7
LAYERNORM_FLOPS_PER_ROW = 4
ACTIVATION_FLOPS = {  # per element, as XLA counts jax.nn's definitions (exp/tanh not counted)
    "relu": 1,   # max(x, 0)
    "swish": 4,  # x · sigmoid(x) via logistic: negate, add, divide, multiply
    "silu": 4,
    "gelu": 8,   # tanh approximation: 0.5·x·(1 + tanh(c·(x + 0.044715·x³)))
    "tanh": 0,
    "elu": 4,    # expm1, compare, select, multiply
}


def param_count(params: Any) -> int:
    """Number of scalars in any pytree of arrays or ShapeDtypeStructs (params, variables, moments...)."""
    return int(sum(math.prod(getattr(x, "shape", ())) for x in jax.tree.leaves(params)))


def dense_head_param_count(in_dim: int, out_dim: int) -> int:
    """Parameters of a final Dense(in_dim -> out_dim) head: weights + bias."""
    return in_dim * out_dim + out_dim


def dense_head_flops(in_dim: int, out_dim: int) -> int:
    """Forward FLOPs per sample of a Dense(in_dim -> out_dim) head: 2·in·out matmul + out bias."""
    return 2 * in_dim * out_dim + out_dim


def _layernorm_params(d: int) -> int:
    return 2 * d  # scale and bias


def _layernorm_flops(d: int) -> int:
    return LAYERNORM_FLOPS_PER_FEATURE * d + LAYERNORM_FLOPS_PER_ROW


def backbone_param_count(cfg: BackboneConfig, in_dim: int) -> int:
    """Exact number of parameters of `Backbone(cfg)` applied to inputs with `in_dim` features."""
    w, n = cfg.width, cfg.num_blocks
    dense = dense_head_param_count
    total = dense(in_dim, w)
    if cfg.kind in ("crl", "bro"):
        total += _layernorm_params(w)
    if cfg.kind == "crl":
        block = DENSE_PER_CRL_BLOCK * (dense(w, w) + _layernorm_params(w))
    elif cfg.kind == "bro":
        block = 2 * (dense(w, w) + _layernorm_params(w))
    elif cfg.kind == "simba":
        block = _layernorm_params(w) + dense(w, 4 * w) + dense(4 * w, w)
    else:  # mlp
        block = dense(w, w)
    total += n * block
    if cfg.kind == "simba":
        total += _layernorm_params(w)
    return total


def backbone_flops_breakdown(cfg: BackboneConfig, in_dim: int) -> dict[str, int]:
    """Forward FLOPs per sample split into matmul / bias / norm / activation / residual (module doc)."""
    w, n = cfg.width, cfg.num_blocks
    act = ACTIVATION_FLOPS[cfg.activation_name]
    ln = _layernorm_flops(w)
    c = {"matmul": 2 * in_dim * w, "bias": w, "norm": 0, "activation": 0, "residual": 0}
    if cfg.kind in ("crl", "bro"):
        c["norm"] += ln
    if cfg.kind in ("crl", "bro", "mlp"):
        c["activation"] += act * w
    if cfg.kind == "crl":
        k = DENSE_PER_CRL_BLOCK
        block = {"matmul": k * 2 * w * w, "bias": k * w, "norm": k * ln, "activation": k * act * w,
                 "residual": w}
    elif cfg.kind == "bro":
        block = {"matmul": 2 * 2 * w * w, "bias": 2 * w, "norm": 2 * ln, "activation": act * w,
                 "residual": w}
    elif cfg.kind == "simba":
        block = {"matmul": 2 * (2 * w * 4 * w), "bias": 4 * w + w, "norm": ln,
                 "activation": act * 4 * w, "residual": w}
    else:  # mlp
        block = {"matmul": 2 * w * w, "bias": w, "norm": 0, "activation": act * w, "residual": 0}
    for key, value in block.items():
        c[key] += n * value
    if cfg.kind == "simba":
        c["norm"] += ln
    return c


def backbone_flops(cfg: BackboneConfig, in_dim: int) -> int:
    """Forward FLOPs per sample of `Backbone(cfg)` (convention in the module docstring)."""
    return int(sum(backbone_flops_breakdown(cfg, in_dim).values()))


def xla_flops(fn: Callable, *args, compiled: bool = True) -> float | None:
    """XLA's cost-analysis FLOPs of `jax.jit(fn)(*args)` (whole call, not per sample); None if the
    backend reports none. compiled=False analyses the unoptimised program (no fusion recomputation).
    Loops (scan/while) are counted once, not per trip: compare against the unrolled stack."""
    lowered = jax.jit(fn).lower(*args)
    cost = lowered.compile().cost_analysis() if compiled else lowered.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    if not cost:
        return None
    flops = float(cost.get("flops", 0.0))  # XLA omits zero entries
    return flops if flops >= 0 else None
