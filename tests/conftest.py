"""Shared test set-up: a persistent XLA compilation cache so reruns of the suite compile less."""
import os
import pathlib

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
_cache = pathlib.Path(__file__).resolve().parent.parent / ".jax_cache"
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(_cache))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
