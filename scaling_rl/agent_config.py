"""The agent registry and agent configs: which agents exist (`scaling_rl.agents.AGENTS` or any module
path with `Config` and `make`), and an agent's Config from command-line text (each value parsed by its
field's type; one-line `ConfigError` on anything wrong). Used by `train`, the sweep engine and the CLI.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import json
import types
import typing
from typing import Any, Mapping


class ConfigError(ValueError):
    """Bad run configuration, detected before anything was written."""


def known_agents() -> list[str]:
    """Names of the registered agents (`scaling_rl.agents.AGENTS`)."""
    from scaling_rl import agents

    return sorted(agents.AGENTS)


def agent_module(name: str) -> types.ModuleType:
    """The registered agent `name`, or any importable module path containing a dot."""
    from scaling_rl import agents

    if name in agents.AGENTS:
        mod = importlib.import_module(agents.AGENTS[name])
    elif "." in name:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and name.startswith(e.name):
                raise ConfigError(f"agent: no module {name!r}; known agents: {', '.join(known_agents())}") from None
            raise
    else:
        raise ConfigError(f"agent: unknown agent {name!r}; known agents: {', '.join(known_agents())}")
    for attr in ("Config", "make"):
        if not hasattr(mod, attr):
            raise ConfigError(f"agent: module {mod.__name__} has no {attr}; not an agent")
    return mod


def _field_types(config_cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(config_cls)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(config_cls)}


_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f"}


def parse_value(text: str, tp: Any) -> Any:
    """Convert command-line text to a value of dataclass field type `tp` (ValueError if not)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and text.strip().lower() in ("none", "null"):
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return parse_value(text, arg)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError("; ".join(errors))
    if origin is typing.Literal:
        for choice in args:
            try:
                if parse_value(text, type(choice)) == choice:
                    return choice
            except ValueError:
                pass
        raise ValueError(f"{text!r} is not one of {', '.join(map(repr, args))}")
    if origin in (tuple, list):
        items = [t for t in text.split(",") if t.strip()] if text.strip() else []
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(items) != len(args):
                raise ValueError(f"{text!r}: expected {len(args)} comma-separated values")
            return tuple(parse_value(t, a) for t, a in zip(items, args))
        values = [parse_value(t, args[0] if args else Any) for t in items]
        return tuple(values) if origin is tuple else values
    if tp is bool:
        low = text.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(f"{text!r} is not a boolean (true/false)")
    if tp is int:
        try:
            return int(text)
        except ValueError:
            value = float(text)  # allow 1e6
            if not value.is_integer():
                raise ValueError(f"{text!r} is not an integer") from None
            return int(value)
    if tp is float:
        return float(text)
    if tp is str:
        return text
    if isinstance(tp, type):
        return tp(text)
    return text


def make_config(agent_name: str, overrides: Mapping[str, Any]) -> Any:
    """The agent's Config with `overrides` applied: string values are parsed by the field's
    type, other values are used as given. Raises ConfigError (one line) on any problem."""
    mod = agent_module(agent_name)
    config_cls = mod.Config
    types_ = _field_types(config_cls)
    values: dict[str, Any] = {}
    for key, raw in overrides.items():
        key = key.replace("-", "_")
        if key not in types_:
            close = difflib.get_close_matches(key, list(types_), n=3)
            hint = f"did you mean {', '.join(close)}?" if close else f"fields: {', '.join(types_)}"
            raise ConfigError(f"{key}: not a field of {agent_name}.Config; {hint}")
        if isinstance(raw, str):
            try:
                raw = parse_value(raw, types_[key])
            except (ValueError, TypeError) as e:
                raise ConfigError(f"{key}: {e}") from None
        values[key] = raw
    try:
        return config_cls(**values)
    except (ValueError, TypeError) as e:
        raise ConfigError(_one_line(e)) from None


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _config_dict(cfg: Any) -> dict:
    """JSON-normalised dict of a config (tuples become lists, so it compares with config.json)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), sort_keys=True, default=str))
