"""A small decoder-only transformer LM (flax linen) and a synthetic sequence task, for the ACCO checks.

Task (`synthetic_batch`): sequences over a vocabulary of V tokens whose first two tokens are uniform and
every later token is x_t = (x_{t-1} + x_{t-2}) mod V, so the next-token loss falls from log V to about
(2/(T-1))·log V once the model attends to the two previous positions. Pre-LayerNorm blocks, causal
self-attention, learned position embeddings, tied nothing.
"""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True)
class LMConfig:
    vocab: int = 16
    seq_len: int = 16
    width: int = 32
    depth: int = 2
    heads: int = 2


class Block(nn.Module):
    width: int
    heads: int

    @nn.compact
    def __call__(self, x):
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2], bool))
        x = x + nn.SelfAttention(num_heads=self.heads, qkv_features=self.width)(nn.LayerNorm()(x), mask=mask)
        h = nn.Dense(4 * self.width)(nn.LayerNorm()(x))
        return x + nn.Dense(self.width)(nn.gelu(h))


class DecoderLM(nn.Module):
    cfg: LMConfig

    @nn.compact
    def __call__(self, tokens):  # (B, T) int -> (B, T, V) logits
        c = self.cfg
        x = nn.Embed(c.vocab, c.width)(tokens)
        x = x + self.param("pos", nn.initializers.normal(0.02), (c.seq_len, c.width))[: tokens.shape[1]]
        for _ in range(c.depth):
            x = Block(c.width, c.heads)(x)
        return nn.Dense(c.vocab)(nn.LayerNorm()(x))


def synthetic_batch(key, batch: int, cfg: LMConfig) -> jax.Array:
    """(batch, seq_len) int32 sequences of the additive-Fibonacci task in the module docstring."""
    first = jax.random.randint(key, (batch, 2), 0, cfg.vocab)

    def nxt(carry, _):
        a, b = carry
        c = (a + b) % cfg.vocab
        return (b, c), c

    _, rest = jax.lax.scan(nxt, (first[:, 0], first[:, 1]), None, length=cfg.seq_len - 2)
    return jnp.concatenate([first, rest.T], axis=1).astype(jnp.int32)


def make_lm(cfg: LMConfig):
    """(init(key) -> params, loss_fn(params, tokens) -> mean next-token cross-entropy)."""
    model = DecoderLM(cfg)

    def init(key):
        return model.init(key, jnp.zeros((1, cfg.seq_len), jnp.int32))["params"]

    def loss_fn(params, tokens):
        logits = model.apply({"params": params}, tokens[:, :-1])
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]))

    return init, loss_fn
