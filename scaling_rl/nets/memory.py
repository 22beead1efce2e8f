"""Memory of deep stacks: what a backbone keeps for its backward pass, a training run's estimated
peak, and the budget it must fit in (docs/deep_stacks.md has the measured table).

A scanned backbone keeps, per block and per batch row, the outputs of its matmuls (the save policy
`backbone.SCAN_SAVE_POLICY`) plus the block's input; with `remat=True` only the input. These and the
parameters with their optimiser state are what grows with depth, so an agent module that defines
`memory_bytes(cfg, agent) -> {component: bytes}` (CRL does: params, Adam moments, gradients and
updates, replay buffer, activations; all analytic, nothing is traced) gets

    peak ≈ seeds · sum(memory_bytes(cfg, agent).values())

checked against XLA's own buffer assignment of the compiled update in tests/test_nets.py. Agents
without `memory_bytes` are not checked.
"""
from __future__ import annotations

import math
import os
import re
from typing import Any

import jax

from scaling_rl.nets.backbone import DENSE_PER_CRL_BLOCK, BackboneConfig

BUDGET_ENV = "SCALING_RL_MEMORY_BUDGET"
_UNITS = {"": 1, "b": 1, "k": 2 ** 10, "kb": 2 ** 10, "kib": 2 ** 10, "m": 2 ** 20, "mb": 2 ** 20,
          "mib": 2 ** 20, "g": 2 ** 30, "gb": 2 ** 30, "gib": 2 ** 30, "t": 2 ** 40, "tb": 2 ** 40,
          "tib": 2 ** 40}


def _matmul_outputs_per_row(cfg: BackboneConfig) -> int:
    """Features of all matmul outputs in one block, per batch row."""
    w = cfg.width
    return {"crl": DENSE_PER_CRL_BLOCK * w, "bro": 2 * w, "simba": 4 * w + w, "mlp": w}[cfg.kind]


def block_saved_bytes_per_row(cfg: BackboneConfig) -> int:
    """Bytes one block keeps for the backward pass per batch row: its float32 input, plus (unless
    remat) its matmul outputs in the compute dtype."""
    carry = 4 * cfg.width
    if cfg.remat:
        return carry
    return carry + _matmul_outputs_per_row(cfg) * (2 if cfg.compute_dtype == "bfloat16" else 4)


def backbone_activation_bytes(cfg: BackboneConfig, batch: int) -> int:
    """Bytes of the depth stack's saved activations for one differentiated forward pass of `batch`
    rows (the scanned layout; the unrolled one lets XLA choose, usually somewhat more)."""
    return batch * cfg.num_blocks * block_saved_bytes_per_row(cfg)


def while_loop_stacked_buffers(hlo_text: str, num_blocks: int) -> list[tuple[int, int]]:
    """For each while loop of a compiled HLO module (`compiled.as_text()`): (number of depth-stacked
    arrays it carries, their bytes). Depth-stacked = leading dimension num_blocks: stacked params,
    their gradients and moments, and the residuals each scan iteration saves for the backward."""
    itemsize = {"f32": 4, "bf16": 2, "s32": 4, "u32": 4, "pred": 1}
    out = []
    for line in hlo_text.splitlines():
        if " while(" not in line or " = " not in line:
            continue
        carried = line.split(" while(")[0].split(" = ", 1)[1]
        stacked = [(t, [int(d) for d in dims.split(",")])
                   for t, dims in re.findall(r"\b(f32|bf16|s32|u32|pred)\[([\d,]+)\]", carried)]
        stacked = [(t, d) for t, d in stacked if len(d) >= 2 and d[0] == num_blocks]
        out.append((len(stacked), sum(itemsize[t] * math.prod(d) for t, d in stacked)))
    return out


def estimate_peak_bytes(agent_module: Any, cfg: Any, agent: Any, seeds: int = 1) -> int | None:
    """Estimated peak bytes of training `seeds` vmapped seeds; None if the module has no estimate."""
    if not hasattr(agent_module, "memory_bytes"):
        return None
    return seeds * int(sum(agent_module.memory_bytes(cfg, agent).values()))


def parse_bytes(text: str) -> int:
    """'24GiB', '512 MB', '1e9' -> bytes (binary units); ValueError one-liner otherwise."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{BUDGET_ENV}: cannot read {text!r} as a size; use e.g. 24GiB or 512MiB")
    try:
        value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    except ValueError:
        raise ValueError(f"{BUDGET_ENV}: cannot read {text!r} as a size; use e.g. 24GiB or 512MiB") from None
    if not value > 0:
        raise ValueError(f"{BUDGET_ENV}: must be > 0, got {text!r}; use e.g. 24GiB")
    return int(value)


def memory_budget_bytes() -> tuple[int, str]:
    """(bytes a run may use, where that number comes from): $SCALING_RL_MEMORY_BUDGET, else the
    accelerator's memory limit, else the host's available memory (MemAvailable)."""
    if os.environ.get(BUDGET_ENV):
        return parse_bytes(os.environ[BUDGET_ENV]), f"${BUDGET_ENV}"
    device = jax.devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), f"{device.device_kind} memory"
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024, "available host memory"
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free host memory"


def check_fits(agent_module: Any, cfg: Any, agent: Any, seeds: int = 1) -> int | None:
    """Raise a one-line ValueError when the estimated peak does not fit the budget; returns the
    estimate (None when the agent module has none)."""
    need = estimate_peak_bytes(agent_module, cfg, agent, seeds)
    if need is None:
        return None
    budget, source = memory_budget_bytes()
    if need > budget:
        depth = getattr(cfg, "depth", None)
        hint = ("remat=true, a smaller depth, batch_size or buffer_size, or fewer seeds"
                if depth is not None and not getattr(cfg, "remat", True) else
                "a smaller depth, batch_size or buffer_size, or fewer seeds")
        raise ValueError(f"memory: estimated peak {need / 2 ** 30:.2f} GiB for {seeds} seed(s) exceeds "
                         f"the {budget / 2 ** 30:.2f} GiB of {source}; use {hint} "
                         f"(or set {BUDGET_ENV})")
    return need
