"""Residual backbones (CRL, BRO, SimBa, plain MLP) with a depth stack scanned over stacked params.

Param layout (predictable paths, see `stack_params`):
  input_dense, [input_norm]            input projection to `width`
  blocks                               scanned stack: every leaf has a leading axis of num_blocks
  blocks_0 ... blocks_{n-1}            the same blocks unrolled (config.scan=False)
  [final_norm]                         simba only
Inside a block: dense_<i>, norm_<i> (crl: 4 of each; bro: 2 of each; simba: norm, dense_0 (4w), dense_1;
mlp: dense).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

KINDS = ("crl", "bro", "simba", "mlp")
COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
ACTIVATIONS: dict[str, Callable] = {
    "relu": nn.relu,
    "swish": nn.swish,
    "silu": nn.silu,
    "gelu": nn.gelu,
    "tanh": jnp.tanh,
    "elu": nn.elu,
}
INITS: dict[str, Callable[[], Callable]] = {
    "he_uniform": nn.initializers.he_uniform,
    "he_normal": nn.initializers.he_normal,
    "lecun_uniform": nn.initializers.lecun_uniform,
    "lecun_normal": nn.initializers.lecun_normal,
    "glorot_uniform": nn.initializers.glorot_uniform,
    "glorot_normal": nn.initializers.glorot_normal,
    "orthogonal": nn.initializers.orthogonal,
}
# The activation each block family was published with; used when `activation=None`.
DEFAULT_ACTIVATION = {"crl": "swish", "bro": "relu", "simba": "relu", "mlp": "relu"}
# Dense layers per block ("depth" counts Dense layers for crl, blocks for the others).
DENSE_PER_CRL_BLOCK = 4

# What a scanned block keeps for its backward pass (docs/deep_stacks.md). Left to itself, JAX's scan
# saves every intermediate the backward needs, 7 (batch, width) arrays per CRL Dense (pre-norm,
# centred, rsqrt, normalised, sigmoid, ...), each written into a depth-stacked buffer by the forward
# while loop and read back by the backward one. XLA cannot fuse or rematerialise across the loop, so
# that memory traffic made the scanned stack up to ~2x slower than the unrolled one, where XLA fuses
# the same elementwise work into the gradient kernels.
# Saving only the matmul outputs and recomputing LayerNorm/activation inside the backward loop is
# what the unrolled program effectively does: same forward values bit for bit, 5 instead of 28
# saved (batch, width) arrays per CRL block.
# (None: no checkpoint, the old behaviour; benchmarks/crl_throughput.py --hlo compares the two.)
SCAN_SAVE_POLICY = jax.checkpoint_policies.dots_with_no_batch_dims_saveable
# remat=True: keep only each block's input (the carry); the backward recomputes the whole block.
REMAT_POLICY = jax.checkpoint_policies.nothing_saveable


@dataclasses.dataclass(frozen=True)
class BackboneConfig:
    """Shape and numerics of a backbone. `activation=None` picks the kind's own (crl: swish, else relu)."""

    kind: str = "bro"
    width: int = 256
    depth: int = 2
    activation: str | None = None
    init: str = "he_uniform"
    scan: bool = True
    remat: bool = False
    compute_dtype: str = "float32"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind: unknown {self.kind!r}; use one of {', '.join(map(repr, KINDS))}")
        _check_int("width", self.width, 1)
        if self.kind == "crl":
            _check_int("depth", self.depth, None)
            if self.depth < DENSE_PER_CRL_BLOCK or self.depth % DENSE_PER_CRL_BLOCK:
                lo = max(DENSE_PER_CRL_BLOCK, self.depth // DENSE_PER_CRL_BLOCK * DENSE_PER_CRL_BLOCK)
                hint = f"{lo}" if lo >= self.depth else f"{lo} or {lo + DENSE_PER_CRL_BLOCK}"
                raise ValueError(
                    f"depth: crl depth counts Dense layers and must be a positive multiple of 4 "
                    f"(one block = 4 Dense), got {self.depth}; use {hint}")
        else:
            _check_int("depth", self.depth, 1)
        if self.activation is not None and self.activation not in ACTIVATIONS:
            raise ValueError(f"activation: unknown {self.activation!r}; use None (the kind's default) "
                             f"or one of {', '.join(map(repr, ACTIVATIONS))}")
        if self.init not in INITS:
            raise ValueError(f"init: unknown {self.init!r}; use one of {', '.join(map(repr, INITS))}")
        for key in ("scan", "remat"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{key}: must be a bool, got {getattr(self, key)!r}; use True or False")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype: unknown {self.compute_dtype!r}; "
                             f"use one of {', '.join(map(repr, COMPUTE_DTYPES))}")

    @property
    def num_blocks(self) -> int:
        """Number of (scanned) blocks in the stack."""
        return self.depth // DENSE_PER_CRL_BLOCK if self.kind == "crl" else self.depth

    @property
    def activation_name(self) -> str:
        """The activation actually used (resolves None to the kind's default)."""
        return self.activation or DEFAULT_ACTIVATION[self.kind]


def _check_int(key: str, value: Any, minimum: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key}: must be an int, got {value!r}; use e.g. 4")
    if minimum is not None and value < minimum:
        raise ValueError(f"{key}: must be >= {minimum}, got {value}; use {minimum} or more")


def _layers(cfg: BackboneConfig):
    """Dense / LayerNorm constructors and activation for a config (params always float32)."""
    compute = COMPUTE_DTYPES[cfg.compute_dtype]
    kernel_init = INITS[cfg.init]()

    def dense(features: int, name: str) -> nn.Dense:
        return nn.Dense(features, kernel_init=kernel_init, dtype=compute, param_dtype=jnp.float32, name=name)

    def norm(name: str) -> nn.LayerNorm:
        # LayerNorm statistics and output stay in float32 even on the bf16 path.
        return nn.LayerNorm(dtype=jnp.float32, param_dtype=jnp.float32, name=name)

    return dense, norm, ACTIVATIONS[cfg.activation_name]


class Block(nn.Module):
    """One residual block of `config.kind`; scan-shaped: (carry, None) -> (carry, None).

    The carry (residual stream) is float32 in every compute dtype, so the scan carry type is fixed.
    """

    config: BackboneConfig

    @nn.compact
    def __call__(self, x: jax.Array, _: Any = None):
        cfg = self.config
        dense, norm, act = _layers(cfg)
        w = cfg.width
        if cfg.kind == "crl":
            h = x
            for i in range(DENSE_PER_CRL_BLOCK):
                h = act(norm(f"norm_{i}")(dense(w, f"dense_{i}")(h)))
            out = x + h
        elif cfg.kind == "bro":
            h = act(norm("norm_0")(dense(w, "dense_0")(x)))
            out = x + norm("norm_1")(dense(w, "dense_1")(h))
        elif cfg.kind == "simba":
            h = act(dense(4 * w, "dense_0")(norm("norm")(x)))
            out = x + dense(w, "dense_1")(h)
        else:  # mlp
            out = act(dense(w, "dense")(x))
        return out.astype(jnp.float32), None


class Backbone(nn.Module):
    """x[..., in] -> input projection Dense(width) -> stack of blocks -> [..., width] float32."""

    config: BackboneConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        dense, norm, act = _layers(cfg)
        h = dense(cfg.width, "input_dense")(jnp.asarray(x, jnp.float32))
        if cfg.kind in ("crl", "bro"):
            h = act(norm("input_norm")(h))
        elif cfg.kind == "mlp":
            h = act(h)
        h = h.astype(jnp.float32)

        if cfg.scan:
            # Always checkpointed, with a policy (see SCAN_SAVE_POLICY); prevent_cse=False is safe
            # (and faster) inside scan.
            policy = REMAT_POLICY if cfg.remat else SCAN_SAVE_POLICY
            block = Block if policy is None else nn.remat(Block, prevent_cse=False, policy=policy)
            stack = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                            length=cfg.num_blocks)
            h, _ = stack(cfg, name="blocks")(h, None)
        else:
            block = nn.remat(Block) if cfg.remat else Block
            for i in range(cfg.num_blocks):
                h, _ = block(cfg, name=f"blocks_{i}")(h, None)

        if cfg.kind == "simba":
            h = norm("final_norm")(h)
        return h.astype(jnp.float32)


_UNROLLED = re.compile(r"^blocks_(\d+)$")


def stack_params(tree: Mapping) -> dict:
    """Unrolled layout -> scanned layout: every dict holding blocks_0..blocks_{n-1} gets one `blocks`
    whose leaves are stacked on a new leading axis. Works on variables, params, or a parent's params."""
    if not isinstance(tree, Mapping):
        return tree
    indices = sorted(int(m.group(1)) for k in tree if (m := _UNROLLED.match(k)))
    out = {k: stack_params(v) for k, v in tree.items() if not _UNROLLED.match(k)}
    if indices:
        if indices != list(range(len(indices))):
            raise ValueError(f"blocks: unrolled block indices are not 0..n-1 (got {indices}); "
                             "pass the params of one whole backbone")
        if "blocks" in out:
            raise ValueError("blocks: tree has both 'blocks' and 'blocks_<i>'; pass one layout")
        out["blocks"] = jax.tree.map(lambda *xs: jnp.stack(xs), *(tree[f"blocks_{i}"] for i in indices))
    return out


def unstack_params(tree: Mapping) -> dict:
    """Scanned layout -> unrolled layout (inverse of `stack_params`)."""
    if not isinstance(tree, Mapping):
        return tree
    out = {}
    for k, v in tree.items():
        if k == "blocks":
            n = jax.tree.leaves(v)[0].shape[0]
            for i in range(n):
                out[f"blocks_{i}"] = jax.tree.map(lambda a, i=i: a[i], v)
        else:
            out[k] = unstack_params(v)
    return out
