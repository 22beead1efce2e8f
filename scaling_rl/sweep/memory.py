"""Will a trial fit in memory? A cheap, analytic lower bound, checked before a sweep writes anything.

A trial of `seeds` vmapped seeds holds, per seed, its networks' parameters (with target copies),
the optimiser state (Adam: two moments per parameter), one set of gradients, and the replay
buffer(s)::

    need ≈ seeds · 4 bytes · (params + targets + 2·params + params + replay rows · row floats)
                               (weights)          (Adam)   (grads)

The counts are those of `scaling_rl.nets` (`backbone_param_count`, `dense_head_param_count`) on the
agent's own backbone configs; nothing is traced, compiled or allocated, and no env is built: the
env's observation and action widths are taken as 1, and activations are left out, so the estimate
is a lower bound and a refusal is certain, not a guess (the finer check of `nets.memory` still
runs in `train.run`, inside each trial, for agents with `memory_bytes`). Trial kinds without an
estimate here (toy, grpo, flow_grpo) are not checked.

The budget is one trial's whole machine: $SCALING_RL_MEMORY_BUDGET when set (e.g. `24GiB`); else,
for the local backend, the GPU's total memory when JAX's default backend will be a GPU (read with
nvidia-smi, so this process never initialises a GPU client that would hold memory the workers
need), else the host's physical memory; for slurm `backend.slurm.mem_gb` when given; otherwise
(ray, or slurm without mem_gb) `REMOTE_CEILING`, more than any single machine has.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from typing import Any, Callable

from scaling_rl.sweep import registry

BUDGET_ENV = "SCALING_RL_MEMORY_BUDGET"
FLOAT = 4                       # parameters, optimiser state and replay are float32
REMOTE_CEILING = 64 * 2 ** 40   # bytes: no single node of a cluster has more
COMPONENTS = "params + optimiser + gradients + replay"


# ---- per-seed estimates (bytes) of the JAX agents -------------------------------------------
def _sac(config: dict) -> dict[str, int]:
    from scaling_rl import nets
    from scaling_rl.agents import sac
    cfg = sac.Config.from_dict(config)
    critic = cfg.num_critics * (nets.backbone_param_count(sac.critic_backbone(cfg), 2)
                                + nets.dense_head_param_count(cfg.width, 1))
    actor_bb = sac.actor_backbone(cfg)
    actor = nets.backbone_param_count(actor_bb, 1) + nets.dense_head_param_count(actor_bb.width, 2)
    learned = critic + actor + 1                      # + log alpha
    rows = cfg.buffer_size + cfg.val_buffer_size      # obs, next_obs, action, reward, discount
    return {"params": FLOAT * (learned + critic),     # + target critics
            "optimiser": FLOAT * 2 * learned,         # Adam moments
            "gradients": FLOAT * learned,
            "replay": FLOAT * 5 * rows}


def _dqn(config: dict) -> dict[str, int]:
    from scaling_rl import nets
    from scaling_rl.agents import dqn
    cfg = dqn.Config.from_dict(config)
    q = nets.backbone_param_count(dqn.q_backbone(cfg), 1) + nets.dense_head_param_count(cfg.width, 1)
    rows = cfg.buffer_size + cfg.val_buffer_size
    return {"params": FLOAT * 2 * q, "optimiser": FLOAT * 2 * q, "gradients": FLOAT * q,
            "replay": FLOAT * 5 * rows}


def _crl(config: dict) -> dict[str, int]:
    from scaling_rl import nets
    from scaling_rl.agents import crl
    cfg = crl.Config.from_dict(config)
    encoders = 2 * (nets.backbone_param_count(crl.encoder_backbone(cfg), 1)
                    + nets.dense_head_param_count(cfg.width, cfg.repr_dim))
    actor = (nets.backbone_param_count(crl.actor_backbone(cfg), 1)
             + nets.dense_head_param_count(cfg.actor_width, 2))
    learned = encoders + actor + 1
    return {"params": FLOAT * learned, "optimiser": FLOAT * 2 * learned,
            "gradients": FLOAT * learned,
            "replay": FLOAT * 4 * cfg.buffer_size}    # state, action, achieved goal + episode ids


ESTIMATES: dict[str, Callable[[dict], dict[str, int]]] = {"sac": _sac, "dqn": _dqn, "crl": _crl}
# config fields an estimate grows with, most telling first (what a refusal may name)
FIELDS = {"sac": ("width", "depth", "actor_width", "actor_depth", "num_critics", "backbone",
                  "actor_backbone", "buffer_size", "val_buffer_size"),
          "dqn": ("width", "depth", "backbone", "buffer_size", "val_buffer_size"),
          "crl": ("width", "depth", "actor_width", "actor_depth", "repr_dim", "buffer_size")}


def trial_bytes(agent: str, config: dict, seeds: int = 1) -> dict[str, int] | None:
    """Lower bound of a trial's bytes by component ({params (with target copies), optimiser,
    gradients, replay}, all seeds), or None for a trial kind without an estimate."""
    estimate = ESTIMATES.get(agent)
    if estimate is None:
        return None
    return {k: int(seeds) * int(v) for k, v in estimate(config).items()}


# ---- the budget ------------------------------------------------------------------------------
def format_bytes(n: float) -> str:
    """1234567 -> '1.18 MiB' (binary units, 3 significant digits)."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    i = 0
    while abs(n) >= 1024 and i < len(units) - 1:
        n, i = n / 1024, i + 1
    return f"{n:.3g} {units[i]}"


def _jax_will_use_gpu() -> bool:
    """Whether JAX's default backend is (or will be) a GPU, without creating a JAX client."""
    platforms = (os.environ.get("JAX_PLATFORMS") or os.environ.get("JAX_PLATFORM_NAME") or "").strip()
    if platforms:
        return platforms.split(",")[0].strip().lower() in ("cuda", "gpu", "rocm")
    if "jax" in sys.modules:
        try:
            from jax._src import xla_bridge
            if xla_bridge.backends_are_initialized():
                import jax
                return jax.default_backend() == "gpu"
        except Exception:  # noqa: BLE001 - private API moved: decide from the plugins below
            pass
    for name in ("jax_cuda13_plugin", "jax_cuda12_plugin", "jax_plugins.xla_cuda13",
                 "jax_plugins.xla_cuda12"):
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except (ImportError, ValueError):
            continue
    return False


@functools.lru_cache(maxsize=None)
def _gpu_memory() -> tuple[int, str] | None:
    """(total bytes, name) of the GPU JAX will use first (nvidia-smi), or None."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    cmd = [smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if visible:
        cmd += ["-i", visible]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout
        name, mib = out.strip().splitlines()[0].rsplit(",", 1)
        return int(float(mib)) * 2 ** 20, name.strip()
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def host_memory() -> int:
    """Physical memory of this machine in bytes."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def budget(backend: str = "local", backend_opts: dict | None = None) -> tuple[int, str]:
    """(bytes one trial may use, how to say where that number comes from) for `backend`."""
    if os.environ.get(BUDGET_ENV):
        from scaling_rl.nets.memory import parse_bytes
        n = parse_bytes(os.environ[BUDGET_ENV])
        return n, f"${BUDGET_ENV}={os.environ[BUDGET_ENV]}"
    if backend == "local":
        gpu = _gpu_memory() if _jax_will_use_gpu() else None
        if gpu is not None:
            return gpu[0], f"this machine's GPU ({gpu[1]}, {format_bytes(gpu[0])})"
        n = host_memory()
        return n, f"this machine's {format_bytes(n)}"
    mem_gb = ((backend_opts or {}).get("slurm") or {}).get("mem_gb") if backend == "slurm" else None
    if isinstance(mem_gb, (int, float)) and not isinstance(mem_gb, bool) and mem_gb > 0:
        return int(mem_gb * 2 ** 30), f"backend.slurm.mem_gb ({format_bytes(mem_gb * 2 ** 30)})"
    return REMOTE_CEILING, f"any single {backend} node ({format_bytes(REMOTE_CEILING)})"


# ---- the check -------------------------------------------------------------------------------
def _where(raw: dict, key: str) -> str:
    """Where the spec sets config field `key`: grid.key, zip.key, zip[i].key, base.key or key."""
    if isinstance(raw.get("grid"), dict) and key in raw["grid"]:
        return f"grid.{key}"
    zips = raw.get("zip")
    if isinstance(zips, dict) and key in zips:
        return f"zip.{key}"
    if isinstance(zips, list):
        for i, group in enumerate(zips):
            if isinstance(group, dict) and key in group:
                return f"zip[{i}].{key}"
    if isinstance(raw.get("base"), dict) and key in raw["base"]:
        return f"base.{key}"
    return key


def _saving(agent: str, config: dict, need: int, key: str, values) -> tuple[int, int]:
    """(most bytes of one seed's `need` saved by giving `key` one of `values` instead, the one
    seed's bytes at that value)."""
    best = (0, need)
    for v in values:
        if v == config[key]:
            continue
        try:
            lower = sum(trial_bytes(agent, {**config, key: v}).values())
        except (ValueError, TypeError):  # that value is not a valid config here
            continue
        best = max(best, (need - lower, lower))
    return best


def _culprit(spec: Any, trial: Any, need: int, limit: int) -> str:
    """The field to blame for `trial` (one seed needs `need` bytes, all seeds may use `limit`): a
    swept axis that has a value in the sweep with which the trial fits (the one saving most);
    else, among all the fields that grow the estimate, the one whose default saves most."""
    agent, config = spec.agent, trial.config
    fields = [k for k in FIELDS[agent] if k in config]

    def pick(saved: dict) -> str | None:
        saved = {k: v for k, v in saved.items() if v[0] > 0}
        return max(saved, key=lambda k: (saved[k][0], -fields.index(k))) if saved else None

    swept = {k: {t.config[k] for t in spec.trials} for k in trial.axes if k in fields}
    saved = {k: _saving(agent, config, need, k, vs) for k, vs in swept.items()}
    key = pick({k: v for k, v in saved.items() if trial.seeds * v[1] <= limit})
    if key is None:
        try:
            defaults = {f.name: f.default for f in dataclasses.fields(registry.get(agent).config_cls())}
        except Exception:  # noqa: BLE001 - no defaults to compare with
            defaults = {}
        key = pick({k: _saving(agent, config, need, k, [defaults[k]]) for k in fields if k in defaults})
    if key is None:  # everything at its default: the biggest component's field
        parts = trial_bytes(agent, config)
        key = "buffer_size" if max(parts, key=parts.get) == "replay" else fields[0]
    return key


def check_spec(spec: Any, backend: str | None = None) -> None:
    """Raise a one-line `SpecError` naming the field when a trial of `spec` cannot fit in memory on
    `backend` (default: the spec's). Nothing is written, nothing is compiled."""
    from scaling_rl.sweep.trial import SpecError

    backend = backend or spec.backend.get("name", "local")
    if spec.agent not in ESTIMATES or not spec.trials:
        return
    needs = [(sum(trial_bytes(spec.agent, t.config, t.seeds).values()), i)
             for i, t in enumerate(spec.trials)]
    worst_need, i = max(needs)
    limit, desc = budget(backend, spec.backend)
    if worst_need <= limit:
        return
    t = spec.trials[i]
    one_seed = sum(trial_bytes(spec.agent, t.config, 1).values())
    if one_seed <= limit:
        raise SpecError(f"seeds: a trial of "
                        f"{t.seeds} seeds needs ~{format_bytes(worst_need)} ({COMPONENTS}), more "
                        f"than {desc}; one seed needs ~{format_bytes(one_seed)}: use fewer seeds")
    key = _culprit(spec, t, one_seed, limit)
    raise SpecError(f"{_where(spec.raw, key)}: a trial with {key}={t.config[key]} needs "
                    f"~{format_bytes(worst_need)} for {t.seeds} seed(s) ({COMPONENTS}), more than "
                    f"{desc}; lower {key}")


# ---- how many trials one packed program may hold ---------------------------------------------
PACK_FILL = 0.8          # of the budget: what a pack may take (the rest: XLA's own workspace)
UNESTIMATED_HEADROOM = 2  # × the lower bound for agents without a peak estimate (activations)


def seed_peak_bytes(agent: str, config: dict) -> int | None:
    """Bytes one seed of `config` may need at its peak: the agent module's `memory_bytes` estimate
    (the one `train.run` checks; CRL has it) when there is one, else UNESTIMATED_HEADROOM × the lower
    bound above (activations are not in it); None for a trial kind without either."""
    try:
        from scaling_rl import agents
        mod = agents.get(agent)
    except (KeyError, ValueError, ImportError):
        mod = None
    if mod is not None and hasattr(mod, "memory_bytes"):
        from scaling_rl.nets import memory as net_memory
        cfg = mod.Config.from_dict(config)
        return int(net_memory.estimate_peak_bytes(mod, cfg, mod.make(cfg), 1))
    parts = trial_bytes(agent, config, 1)
    return None if parts is None else UNESTIMATED_HEADROOM * int(sum(parts.values()))


def pack_capacity(agent: str, config: dict, seeds: int, *, mem_fraction: float | None = None,
                  limit: int = 256) -> int:
    """How many trials of `seeds` seeds each one program may hold on this machine: as many as fit
    PACK_FILL of the local budget (× `mem_fraction`, a worker's share of a shared GPU), at least 1,
    at most `limit`; `limit` when the trial kind has no estimate."""
    per_seed = seed_peak_bytes(agent, config)
    if per_seed is None or per_seed <= 0:
        return limit
    total, _ = budget("local")
    room = PACK_FILL * total * (mem_fraction if mem_fraction else 1.0)
    return int(max(1, min(limit, room // (per_seed * max(1, int(seeds))))))
