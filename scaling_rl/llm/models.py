"""Policies: any `transformers` causal LM, or a tiny randomly initialised one built offline.

`load_policy("tiny")` (or "tiny:llama", "tiny:qwen2") builds a small Qwen2/Llama model with an
in-code character tokenizer; any other string is a local directory or hub id handed to
`from_pretrained` (set HF_HUB_OFFLINE=1 to forbid downloads). Everything round-trips through
`save_pretrained` / `load_policy(path)`.
"""
from __future__ import annotations

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (AutoModelForCausalLM, AutoTokenizer, LlamaConfig, PreTrainedTokenizerFast,
                          Qwen2Config)
from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()  # per-save/load bars would drown the training log

CHARS = "0123456789+-*/=(),:;.<> abcdefghijklmnopqrstuvwxyz"
SPECIALS = ("<pad>", "<eos>", "<unk>")


def char_tokenizer(chars: str = CHARS) -> PreTrainedTokenizerFast:
    """One token per character (plus <pad>, <eos>, <unk>); decoding concatenates characters."""
    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *dict.fromkeys(chars)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>", padding_side="left")


def one_token_per_char(tokenizer) -> bool:
    """True for the character tokenizer (`char_tokenizer`, also after a save / load round trip):
    every non-special token is one character, so lengths in characters are lengths in tokens."""
    specials = set(tokenizer.all_special_tokens)
    return all(len(t) == 1 for t in tokenizer.get_vocab() if t not in specials)


def tiny_model(tokenizer, kind: str = "qwen2", hidden_size: int = 64, num_layers: int = 2,
               num_heads: int = 4, intermediate_size: int | None = None,
               max_positions: int = 128, seed: int = 0):
    """A randomly initialised Qwen2 or Llama causal LM sized for CPU tests."""
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size: {hidden_size} is not divisible by num_heads={num_heads}")
    common = dict(vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=num_layers,
                  num_attention_heads=num_heads, num_key_value_heads=num_heads,
                  intermediate_size=intermediate_size or 4 * hidden_size,
                  max_position_embeddings=max_positions, tie_word_embeddings=True,
                  pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                  bos_token_id=None, attention_dropout=0.0)
    if kind == "qwen2":
        config = Qwen2Config(**common)
    elif kind == "llama":
        config = LlamaConfig(**common)
    else:
        raise ValueError(f"model: tiny kind {kind!r} is unknown; use 'tiny:qwen2' or 'tiny:llama'")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.float()


def load_policy(spec: str, *, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                seed: int = 0):
    """(model, tokenizer) for "tiny[:qwen2|:llama]" or a local path / hub id."""
    spec = str(spec)
    if spec == "tiny" or spec.startswith("tiny:"):
        kind = spec.split(":", 1)[1] if ":" in spec else "qwen2"
        tokenizer = char_tokenizer()
        model = tiny_model(tokenizer, kind, hidden_size, num_layers, num_heads, seed=seed)
        return model, tokenizer
    tokenizer = AutoTokenizer.from_pretrained(spec)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(spec, dtype=torch.float32)
    return model, tokenizer


def save_policy(model, tokenizer, path) -> None:
    """save_pretrained for both (safetensors)."""
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def param_count(model) -> int:
    return sum(p.numel() for p in model.parameters())
