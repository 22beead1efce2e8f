"""A disk cache of traced and lowered programs, next to JAX's persistent compilation cache.

JAX's persistent cache stores compiled executables, keyed by the lowered program, so a warm trial
still pays Python tracing and lowering (for a small DQN chunk: ~1.5 s of a ~3 s warm start) before
it can look the executable up. Here each program is also stored as a `jax.export` artifact (its
StableHLO plus input/output avals), keyed by the run's *resolved config* and a fingerprint of
everything that can change the traced program: the source of the `scaling_rl` package, the
versions of jax / jaxlib / flax / optax / chex / gymnax / brax / numpy, the backend and the JAX
flags that affect tracing. A warm trial deserialises the artifact, lowers only the thin call
wrapper and gets the executable from the persistent cache.

Safety: only built-in agents (modules inside `scaling_rl`) are cached, since the fingerprint
cannot see a user's own code; any failure to read, decode or match an entry is a miss (the
program is traced as usual and the entry rewritten atomically). Set
`SCALING_RL_PROGRAM_CACHE=0` to switch it off.

An entry (`<digest>.prog`) is one JSON line — format, and the input/output tree structures as
JSON (node class `module:qualname`, its JSON-able aux data, children) — followed by the
`jax.export` serialisation. Nothing is unpickled: node classes are looked up by name in an
allowlist of packages and must be registered pytree nodes; a tree that does not round-trip
through this encoding is simply not cached.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
from pathlib import Path
from typing import Any, Callable

from scaling_rl import io

_PACKAGES = ("jax", "jaxlib", "flax", "optax", "chex", "gymnax", "brax", "numpy")
_FORMAT = 2
_NODE_PACKAGES = ("builtins", "collections", "scaling_rl", "optax", "flax", "jax", "chex", "gymnax", "brax")


def package_versions(names) -> dict[str, str]:
    """Installed versions of the distributions `names` (missing ones are left out)."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def enabled() -> bool:
    return os.environ.get("SCALING_RL_PROGRAM_CACHE", "1").lower() not in ("0", "false", "no", "off")


def default_dir() -> Path | None:
    """`<jax_compilation_cache_dir>/programs` when a persistent compilation cache is configured."""
    import jax

    base = jax.config.jax_compilation_cache_dir
    return Path(base) / "programs" if base and enabled() else None


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """Hash of the package source, library versions, backend and tracing-relevant JAX flags."""
    import jax

    h = hashlib.sha256(f"format={_FORMAT}".encode())
    root = Path(__file__).resolve().parent
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode())
        h.update(p.read_bytes())
    h.update(json.dumps(package_versions(_PACKAGES), sort_keys=True).encode())
    dev = jax.devices()[0]
    flags = (jax.default_backend(), dev.device_kind, jax.device_count(), jax.config.jax_enable_x64,
             str(jax.config.jax_default_matmul_precision), str(jax.config.jax_default_prng_impl))
    h.update(repr(flags).encode())
    return h.hexdigest()


def key_digest(key: Any) -> str:
    """Stable digest of a JSON-able key plus the fingerprint."""
    blob = json.dumps(key, sort_keys=True, default=repr)
    return hashlib.sha256(f"{fingerprint()}\n{blob}".encode()).hexdigest()[:40]


class Program:
    """A program over pytrees, compiled on first call (or `compile_now`); `status` is "hit",
    "miss" (traced and stored), "off" (no cache) or "uncacheable" (jax.export refused it); `out_abstract` is known without compiling."""

    def __init__(self, lowered, out_tree, out_abstract, status: str):
        self._lowered, self._compiled, self._out_tree = lowered, None, out_tree
        self.out_abstract, self.status = out_abstract, status

    def compile_now(self) -> "Program":
        if self._compiled is None:
            self._compiled = self._lowered().compile()
        return self

    def __call__(self, *args):
        import jax

        return jax.tree.unflatten(self._out_tree, self.compile_now()._compiled(*jax.tree.leaves(args)))


def _encode_aux(x):
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, (list, tuple)):
        return {"list" if isinstance(x, list) else "tuple": [_encode_aux(v) for v in x]}
    raise TypeError(f"aux data of type {type(x).__name__} is not JSON-able")


def _decode_aux(x):
    if isinstance(x, dict):
        ((kind, items),) = x.items()
        values = [_decode_aux(v) for v in items]
        return values if kind == "list" else tuple(values)
    return x


def encode_tree(tree) -> Any:
    """A PyTreeDef as JSON-able data (raises TypeError when an aux value is not JSON-able)."""
    node = tree.node_data()
    if node is None:
        return "*"
    cls, aux = node
    return [f"{cls.__module__}:{cls.__qualname__}", _encode_aux(aux), [encode_tree(c) for c in tree.children()]]


def decode_tree(data):
    """Inverse of `encode_tree`; node classes only from `_NODE_PACKAGES`, found by name."""
    import importlib

    import jax
    from jax.tree_util import PyTreeDef, default_registry

    if data == "*":
        return jax.tree.structure(0)
    name, aux, children = data
    module, qualname = name.split(":")
    if module.split(".")[0] not in _NODE_PACKAGES:
        raise ValueError(f"tree node class {name} is outside {_NODE_PACKAGES}")
    if name == "builtins:NoneType":
        cls = type(None)
    else:
        cls = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
    if not isinstance(cls, type):
        raise ValueError(f"{name} is not a class")
    return PyTreeDef.from_node_data_and_children(default_registry, (cls, _decode_aux(aux)),
                                                [decode_tree(c) for c in children])


def _load(path: Path, in_tree_json):
    from jax import export

    try:
        head, blob = path.read_bytes().split(b"\n", 1)
        meta = json.loads(head)
        if meta["format"] != _FORMAT or meta["in_tree"] != in_tree_json:
            return None
        return export.deserialize(bytearray(blob)), decode_tree(meta["out_tree"])
    except Exception:  # noqa: BLE001 - missing, torn, stale or foreign entry: a miss
        return None


def prepare(fn: Callable, args: tuple, *, key: Any = None, cache_dir: Path | None = None,
            donate: bool = False) -> Program:
    """Trace (or load) `fn(*args)` (pytrees in, pytree out) for exactly these argument shapes;
    the returned Program compiles on first call.

    With `cache_dir` and `key`, the traced program is loaded from / stored to
    `cache_dir/<digest(key)>.prog`; `key` must determine `fn` completely given the fingerprint.
    `donate` donates every argument buffer. Without them this is `jax.jit(fn).lower(*args)`.
    """
    import jax
    from jax import export

    leaves, in_tree = jax.tree.flatten(args)
    donate_argnums = tuple(range(len(leaves))) if donate else ()
    boxed: list = []

    def flat(*xs):
        out = fn(*jax.tree.unflatten(in_tree, xs))
        out_leaves, out_tree = jax.tree.flatten(out)
        boxed.append(out_tree)
        return out_leaves

    def plain(status: str) -> Program:
        lowered = jax.jit(flat, donate_argnums=donate_argnums).lower(*leaves)
        out_abstract = jax.tree.unflatten(boxed[-1], [jax.ShapeDtypeStruct(o.shape, o.dtype)
                                                      for o in lowered.out_info])
        return Program(lambda: lowered, boxed[-1], out_abstract, status)

    if cache_dir is None or key is None:
        return plain("off")
    try:  # JSON round trip, so that a stored entry compares equal to a fresh encoding
        in_tree_json = json.loads(json.dumps(encode_tree(in_tree)))
    except TypeError:
        return plain("uncacheable")
    path = Path(cache_dir) / f"{key_digest(key)}.prog"
    loaded = _load(path, in_tree_json)
    status = "hit"
    if loaded is None:
        status = "miss"
        try:
            exported = export.export(jax.jit(flat))(*leaves)
        except Exception:  # noqa: BLE001 - e.g. a custom call jax.export does not allow
            return plain("uncacheable")
        loaded = exported, boxed[-1]
        with contextlib.suppress(Exception):  # a tree that does not round-trip, a full disk: no entry
            out_json = encode_tree(boxed[-1])
            if decode_tree(json.loads(json.dumps(out_json))) == boxed[-1]:
                head = json.dumps({"format": _FORMAT, "in_tree": in_tree_json, "out_tree": out_json})
                path.parent.mkdir(parents=True, exist_ok=True)
                io.atomic_write_bytes(path, head.encode() + b"\n" + bytes(exported.serialize()))
    exported, out_tree = loaded
    specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]  # do not hold the buffers
    out_abstract = jax.tree.unflatten(out_tree, [jax.ShapeDtypeStruct(a.shape, a.dtype)
                                                 for a in exported.out_avals])
    return Program(lambda: jax.jit(exported.call, donate_argnums=donate_argnums).lower(*specs),
                   out_tree, out_abstract, status)
