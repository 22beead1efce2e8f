"""Sweep specs: YAML (safe_load only) -> validated `Spec` -> list of `Trial`s with stable ids.

A spec is plain YAML::

    name: quickstart                 # group name (wandb group, default dir name)
    agent: sac                       # a key of scaling_rl.sweep.registry (sac | dqn | crl | grpo | toy)
    out_dir: runs/sweeps/quickstart  # relative paths are relative to the current directory
    env_steps: 6000                  # env-step budget per seed (sets the config field `env_steps`)
    seeds: 2                         # seeds per trial, vmapped in one program
    base: {env: gymnax/Pendulum-v1, batch_size: 128}
    grid: {width: [32, 64, 128], utd: [1, 2, 4]}        # Cartesian product; an axis may also be a
                                                         # range with a resolution: {range: [0.5, 8],
                                                         # num: 5, log: true} (integers if both ends are)
    zip:  {lr: [1e-3, 3e-4], batch_size: [64, 256]}      # zipped (equal lengths); a list of such
                                                         # mappings gives several zipped groups
    backend: {name: local, workers: 2, slurm: {...}, ray: {...}}
                                     # workers (local): trials run at once, each in its own
                                     # process; 0 is not "automatic": it runs the trials one at a
                                     # time inside the `sweep run` process itself (no pool; for
                                     # debugging). Default 1. slurm/ray size themselves (slurm:
                                     # array_parallelism or --workers).
    wandb: false                     # or {project: ..., mode: offline|online}
    pack: false                      # trials differing only in seed / packable hyper-parameters
                                     # (the agent's PACKABLE: lr, tau, ...) run as one vmapped program
    checkpoint_every: 1              # chunks between checkpoints
    early_stop:                      # optional (sweep/early_stop.py): end a trial once its D_J is settled
      metric: eval_return            #   the logged metric the thresholds are in
      thresholds: [100, 200]         #   the study's J, ascending (required)
      margin: 0.0                    #   stop when every seed's isotonic curve (and the seed mean's)
      patience: 1                    #   is >= J_top + margin at its last `patience` logged points
      unreachable: false             #   also stop (as censored) trials that cannot reach J_low:
      min_fraction: 0.5              #   judged from min_fraction * budget on, by extrapolating the
      rate_factor: 2.0               #   steepest rise per log env step so far x rate_factor (>= 1)
                                     # stopped trials stay `done` and record stopped_early, stop_step,
                                     # saved_env_steps, saved_flops; kinds that cannot stop are refused

Axes may name any field of the agent's `Config`, plus `seed` (the first seed of a trial, so
`grid: {seed: [0, 1, 2]}` gives three trials of `seeds` seeds each). Every resolved trial is
validated through `Config.from_dict` before anything is written; so are `out_dir` (not a file, nor
under one) and, in `scaling-rl sweep run`, each trial's memory (`sweep.memory`). A key given twice
in one YAML mapping is an error (plain `yaml.safe_load` would keep the last silently).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import os
import typing
from pathlib import Path
from typing import Any

import yaml

from scaling_rl.sweep import registry
from scaling_rl.sweep.trial import ID_LEN, SpecError, Trial, canonical_json, trial_id  # noqa: F401 (re-exported)

TOP_KEYS = ("name", "agent", "out_dir", "description", "base", "grid", "zip", "seeds", "seed",
            "env_steps", "backend", "wandb", "pack", "pack_seeds", "checkpoint_every", "compile_cache",
            "early_stop", "adaptive")
BACKENDS = ("local", "slurm", "ray")
BACKEND_KEYS = ("name", "workers", "gpu_mem_fraction", "slurm", "ray")
SLURM_KEYS = ("partition", "time_min", "gpus_per_node", "cpus_per_task", "mem_gb",
              "array_parallelism", "max_num_timeout", "additional", "folder",
              "tasks_per_node", "nodes")   # > 1 task: one trial as several JAX processes
RAY_KEYS = ("address", "num_cpus", "num_gpus", "init_num_cpus")
WANDB_KEYS = ("project", "entity", "mode", "tags")


@dataclasses.dataclass(frozen=True)
class Spec:
    name: str
    agent: str
    out_dir: Path
    trials: tuple
    backend: dict
    wandb: Any
    pack: bool
    checkpoint_every: int
    compile_cache: Any       # path (str) or False
    raw: dict                # the YAML as loaded (for the record)
    early_stop: Any = None   # sweep.early_stop.Rule | None
    adaptive: Any = None     # sweep.design.Design | None (then `trials` are the candidates)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A YAML mapping names the same key twice."""

    def __init__(self, key: Any, first_line: int, mark):
        super().__init__(None, None, f"duplicate key {key!r} (first on line {first_line})", mark)
        self.key, self.first_line = key, first_line


def check_unique_keys(text: str) -> None:
    """Raise `DuplicateKeyError` if any mapping of the YAML `text` gives one of its own keys twice
    (PyYAML keeps the last value silently). Keys merged in with `<<: *anchor` may still be
    overridden, as YAML intends. Only composes the node graph (nothing is constructed but scalar
    keys, by the safe constructor), so call it after `yaml.safe_load` has accepted the text."""
    keys = yaml.SafeLoader("")            # the safe constructor, to compare keys as safe_load does
    seen_nodes: set[int] = set()
    stack = [yaml.compose(text, Loader=yaml.SafeLoader)]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict = {}
            for key_node, value_node in node.value:
                stack.append(value_node)
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = keys.construct_object(key_node, deep=True)
                try:
                    if key in first:
                        raise DuplicateKeyError(key, first[key], key_node.start_mark)
                    first[key] = key_node.start_mark.line + 1
                except TypeError:   # unhashable key: safe_load has refused it already
                    continue
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)


def safe_load_unique(text: str) -> Any:
    """`yaml.safe_load`, refusing a mapping with a key given twice (`DuplicateKeyError`)."""
    data = yaml.safe_load(text)
    check_unique_keys(text)
    return data


def load_yaml(path: str | os.PathLike) -> dict:
    """`yaml.safe_load` a spec file (`safe_load_unique`); any YAML problem (incl. `!!python/...`
    tags, a duplicated key) -> SpecError."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError(f"{path}: cannot read spec ({e.strerror or e})") from None
    try:
        data = safe_load_unique(text)
    except DuplicateKeyError as e:
        raise SpecError(f"{path}: line {e.problem_mark.line + 1}: {e.problem}; give each key once "
                        "(YAML would keep only the last)") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = str(getattr(e, "problem", None) or _one_line(e)).replace("tag:yaml.org,2002:", "!!")
        raise SpecError(f"{path}:{where}: {' '.join(str(problem).split())}; "
                        "specs are plain YAML (no tags such as !!python/...)") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a spec is a YAML mapping with keys {', '.join(TOP_KEYS)}")
    return data


def _field_types(config_cls) -> dict[str, Any]:
    try:
        hints = typing.get_type_hints(config_cls)
    except Exception:  # noqa: BLE001 - unresolvable annotations: fall back to raw ones
        hints = {}
    return {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(config_cls)}


def _canonical_value(v: Any, typ: Any) -> Any:
    """JSON-ready value with canonical numeric type (1 and 1.0 hash alike for a float field)."""
    if isinstance(v, (tuple, list)):
        return [_canonical_value(x, None) for x in v]
    if isinstance(v, dict):
        return {str(k): _canonical_value(x, None) for k, x in v.items()}
    if typ in (float, "float") and isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if hasattr(v, "item") and callable(v.item):  # numpy scalar
        return v.item()
    return v


def resolve_config(agent: str, values: dict) -> dict:
    """Build the agent Config from `values` (validated by the Config itself) and return it as a
    canonical dict with every field."""
    config_cls = registry.get(agent).config_cls()
    try:
        cfg = config_cls.from_dict(dict(values))
    except (ValueError, TypeError) as e:
        raise SpecError(_one_line(e)) from None
    types = _field_types(config_cls)
    return {k: _canonical_value(v, types.get(k)) for k, v in dataclasses.asdict(cfg).items()}


RANGE_KEYS = ("range", "num", "log")


def _expand_range(where: str, key: str, values: Any) -> Any:
    """An axis given as a range with a resolution, `{range: [lo, hi], num: n, log: true|false}`, as
    its list of n values (geometric when log, the default; integers when both ends are integers,
    rounded and without repeats). Anything else is returned unchanged."""
    if not isinstance(values, dict):
        return values
    for k in values:
        if k not in RANGE_KEYS:
            raise SpecError(f"{where}.{key}.{k}: unknown key; a range axis is {{range: [lo, hi], num: n, log: true}}")
    rng, num, log = values.get("range"), values.get("num"), values.get("log", True)
    ok_nums = isinstance(rng, list) and len(rng) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in rng)
    if not ok_nums or not rng[0] < rng[1]:
        raise SpecError(f"{where}.{key}.range: expected [lo, hi] with lo < hi, got {rng!r}")
    if isinstance(num, bool) or not isinstance(num, int) or num < 2:
        raise SpecError(f"{where}.{key}.num: expected an integer >= 2 (points, ends included), got {num!r}")
    if not isinstance(log, bool):
        raise SpecError(f"{where}.{key}.log: expected true or false, got {log!r}")
    if log and rng[0] <= 0:
        raise SpecError(f"{where}.{key}.range: a log range needs lo > 0, got {rng!r}; or set log: false")
    import numpy as np
    pts = (np.geomspace if log else np.linspace)(float(rng[0]), float(rng[1]), num)
    if all(isinstance(v, int) for v in rng):
        return list(dict.fromkeys(int(round(v)) for v in pts))
    return [float(f"{v:.6g}") for v in pts]


def _check_axis_values(where: str, key: str, values: Any) -> list:
    values = _expand_range(where, key, values)
    if not isinstance(values, list):
        raise SpecError(f"{where}.{key}: expected a list of values, got {values!r}")
    if not values:
        raise SpecError(f"{where}.{key}: empty list; give at least one value")
    if key == "utd":
        for v in values:
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not v > 0:
                raise SpecError(f"{where}.utd: {v!r} is not allowed; the UTD ratio sigma must be > 0")
    for v in values:
        if isinstance(v, float) and not math.isfinite(v):
            raise SpecError(f"{where}.{key}: {v!r} is not a finite number")
    return values


def _axes_points(spec: dict, allowed: set[str]) -> list[dict]:
    """Expand grid (Cartesian) x every zip group into a list of {key: value} points."""
    def check_key(where, key):
        if key not in allowed:
            raise SpecError(f"{where}.{key}: unknown field; allowed: {', '.join(sorted(allowed))}")

    factors: list[list[dict]] = []
    seen: dict[str, str] = {}
    grid = spec.get("grid")
    if grid is not None:
        if not isinstance(grid, dict):
            raise SpecError(f"grid: expected a mapping of field -> list of values, got {grid!r}")
        if not grid:
            raise SpecError("grid: empty; give at least one axis, e.g. grid: {width: [64, 128]}")
        for key, values in grid.items():
            check_key("grid", key)
            seen[key] = "grid"
            values = _check_axis_values("grid", key, values)
            factors.append([{key: v} for v in values])
    zips = spec.get("zip")
    if zips is not None:
        groups = zips if isinstance(zips, list) else [zips]
        if not groups:
            raise SpecError("zip: empty; give a mapping of field -> equal-length lists")
        for gi, group in enumerate(groups):
            where = "zip" if not isinstance(zips, list) else f"zip[{gi}]"
            if not isinstance(group, dict) or not group:
                raise SpecError(f"{where}: expected a non-empty mapping of field -> list of values")
            group = {k: _expand_range(where, k, v) for k, v in group.items()}
            lengths = {}
            for key, values in group.items():
                check_key(where, key)
                if key in seen:
                    raise SpecError(f"{where}.{key}: already swept in {seen[key]}; sweep a field once")
                seen[key] = where
                lengths[key] = len(_check_axis_values(where, key, values))
            if len(set(lengths.values())) != 1:
                raise SpecError(f"{where}: lists must have equal lengths, got "
                                + ", ".join(f"{k}={n}" for k, n in lengths.items()))
            n = next(iter(lengths.values()))
            factors.append([{k: group[k][i] for k in group} for i in range(n)])
    if not factors:
        raise SpecError("grid: empty; a sweep needs at least one axis under grid or zip")
    points = []
    for combo in itertools.product(*factors):
        p: dict = {}
        for part in combo:
            p.update(part)
        points.append(p)
    return points


def _check_mapping(where: str, value: Any, allowed: tuple) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(f"{where}: expected a mapping with keys {', '.join(allowed)}")
    for k in value:
        if k not in allowed:
            raise SpecError(f"{where}.{k}: unknown key; allowed: {', '.join(allowed)}")
    return dict(value)


def _int(where: str, v: Any, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise SpecError(f"{where}: expected an integer >= {lo}, got {v!r}")
    return v


def _check_dir_path(where: str, path: Path) -> None:
    """A directory the sweep will create or fill: it may not be, nor lie under, an existing file
    (read only; nothing is created)."""
    p = path
    while not p.exists() and p.parent != p:
        p = p.parent
    if p.exists() and not p.is_dir():
        what = "is a file" if p == path else f"lies under {p}, which is a file"
        raise SpecError(f"{where}: {path} {what}, not a directory; give a directory path "
                        "(created if absent)")


def parse_spec(data: dict, *, source: str = "spec", base_dir: str | os.PathLike | None = None) -> Spec:
    """Validate a loaded spec mapping and resolve every trial (nothing is written)."""
    for k in data:
        if k not in TOP_KEYS:
            raise SpecError(f"{k}: unknown spec key; allowed: {', '.join(TOP_KEYS)}")
    agent = data.get("agent")
    if not isinstance(agent, str) or agent not in registry.known():
        raise SpecError(f"agent: unknown agent {agent!r}; allowed: {', '.join(registry.known())}")
    name = data.get("name") or Path(source).stem
    if not isinstance(name, str):
        raise SpecError(f"name: expected a string, got {name!r}")
    seeds = _int("seeds", data.get("seeds", 1), 1)
    seed0 = _int("seed", data.get("seed", 0), 0)

    kind = registry.get(agent)
    try:
        config_cls = kind.config_cls()
    except ImportError as e:
        raise SpecError(f"agent: {agent!r} is not available here ({_one_line(e)})") from None
    fields = {f.name for f in dataclasses.fields(config_cls)}

    base = data.get("base") or {}
    if not isinstance(base, dict):
        raise SpecError(f"base: expected a mapping of config fields, got {base!r}")
    for k in base:
        if k not in fields:
            raise SpecError(f"base.{k}: unknown field of {agent} Config; allowed: {', '.join(sorted(fields))}")
    base = dict(base)
    if "env_steps" in data:
        if "env_steps" not in fields:
            raise SpecError(f"env_steps: {agent} Config has no env_steps field")
        base["env_steps"] = _int("env_steps", data["env_steps"], 1)
    if "utd" in base:
        _check_axis_values("base", "utd", [base["utd"]])
    if "env" in base or "env" in (data.get("grid") or {}):
        pass  # env names are checked by the agent Config / registry below
    points = _axes_points(data, fields | {"seed"})

    trials, ids = [], set()
    for p in points:
        values = {**base, **{k: v for k, v in p.items() if k != "seed"}}
        where = ", ".join(f"{k}={v}" for k, v in p.items())
        try:
            config = resolve_config(agent, values)
            kind.check(config)
        except SpecError as e:
            raise SpecError(f"trial ({where}): {e}") from None
        except ValueError as e:
            raise SpecError(f"trial ({where}): {_one_line(e)}") from None
        t = Trial(agent, config, seeds, _int("grid.seed", p.get("seed", seed0), 0), dict(p))
        if t.id in ids:
            continue  # identical resolved configs (e.g. a swept field equal to its default twice)
        ids.add(t.id)
        trials.append(t)

    backend = _check_mapping("backend", data.get("backend"), BACKEND_KEYS)
    bname = backend.setdefault("name", "local")
    if bname not in BACKENDS:
        raise SpecError(f"backend.name: unknown backend {bname!r}; allowed: {', '.join(BACKENDS)}")
    backend["workers"] = _int("backend.workers", backend.get("workers", 1), 0)
    frac = backend.get("gpu_mem_fraction")
    if frac is not None and not (isinstance(frac, (int, float)) and 0 < frac <= 1):
        raise SpecError(f"backend.gpu_mem_fraction: expected a number in (0, 1], got {frac!r}")
    backend["slurm"] = _check_mapping("backend.slurm", backend.get("slurm"), SLURM_KEYS)
    backend["ray"] = _check_mapping("backend.ray", backend.get("ray"), RAY_KEYS)

    wandb = data.get("wandb", False)
    if isinstance(wandb, dict):
        wandb = _check_mapping("wandb", wandb, WANDB_KEYS)
        mode = wandb.setdefault("mode", "offline")
        if mode not in ("offline", "online", "disabled"):
            raise SpecError(f"wandb.mode: {mode!r}; allowed: offline, online, disabled")
    elif not isinstance(wandb, bool):
        raise SpecError(f"wandb: expected true/false or a mapping with keys {', '.join(WANDB_KEYS)}")

    if "pack" in data and "pack_seeds" in data:
        raise SpecError("pack_seeds: old name of `pack`; give only `pack`")
    pack_key = "pack_seeds" if "pack_seeds" in data else "pack"
    pack = data.get(pack_key, False)
    if not isinstance(pack, bool):
        raise SpecError(f"{pack_key}: expected true or false, got {pack!r}")
    ckpt = _int("checkpoint_every", data.get("checkpoint_every", 1), 1)

    out = data.get("out_dir") or f"runs/sweeps/{name}"
    if not isinstance(out, str):
        raise SpecError(f"out_dir: expected a path string, got {out!r}")
    out_dir = Path(out)
    if not out_dir.is_absolute() and base_dir is not None:
        out_dir = Path(base_dir) / out_dir
    _check_dir_path("out_dir", out_dir)
    cache = data.get("compile_cache", True)
    if cache is True:
        cache = str(out_dir / ".jax_cache")
    elif cache is not False and not isinstance(cache, str):
        raise SpecError(f"compile_cache: expected true, false or a directory, got {cache!r}")
    elif isinstance(cache, str):
        _check_dir_path("compile_cache", Path(cache))
    early_stop = None
    if data.get("early_stop") not in (None, False):
        from scaling_rl.sweep import early_stop as es
        early_stop = es.from_spec(data["early_stop"], kind=kind, trials=trials)   # SpecError on bad input
    adaptive = None
    if data.get("adaptive") not in (None, False):
        from scaling_rl.sweep.design import parse_design
        adaptive = parse_design(data["adaptive"], trials=trials, early_stop=early_stop, seeds=seeds)
    return Spec(name=name, agent=agent, out_dir=out_dir, trials=tuple(trials), backend=backend,
                wandb=wandb, pack=pack, checkpoint_every=ckpt, compile_cache=cache, raw=data,
                early_stop=early_stop, adaptive=adaptive)


def load_spec(path: str | os.PathLike, *, out_dir: str | os.PathLike | None = None) -> Spec:
    """Load and validate a spec file. `out_dir` overrides the spec's."""
    data = load_yaml(path)
    if out_dir is not None:
        data = {**data, "out_dir": str(out_dir)}
    return parse_spec(data, source=str(path), base_dir=os.getcwd())
