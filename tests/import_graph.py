"""The package's import graph, read from the source (lazy imports inside functions included;
imports under `if TYPE_CHECKING:` never run and are not edges), and its circles. Used by
tests/test_import_layers.py and tests/test_sweep_imports.py."""
from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "scaling_rl"


def _modules() -> dict[str, Path]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = list(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _runtime_imports(tree: ast.AST, *, type_checking: bool = False):
    """Import nodes anywhere (module level or inside functions), except under `if TYPE_CHECKING:`
    (those too when `type_checking`)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if not type_checking and isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph(*, type_checking: bool = False) -> dict[str, set[str]]:
    """module -> the package modules it imports (a fresh copy of the cached graph: callers may edit it)."""
    return {m: set(deps) for m, deps in _import_graph(type_checking).items()}


@functools.lru_cache(maxsize=2)   # the source does not change during a test run; parsing it takes seconds
def _import_graph(type_checking: bool) -> dict[str, set[str]]:
    """module -> the package modules it imports at run time (a parent package's __init__ is not an edge);
    `type_checking`: also the imports under `if TYPE_CHECKING:` (what a reader or type checker follows)."""
    mods = _modules()

    def resolve(name: str) -> str:
        while name and name not in mods:
            name = name.rsplit(".", 1)[0] if "." in name else ""
        return name

    graph = {}
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        deps = set()
        for node in _runtime_imports(ast.parse(path.read_text()), type_checking=type_checking):
            if isinstance(node, ast.Import):
                deps |= {resolve(a.name) for a in node.names if a.name.startswith("scaling_rl")}
                continue
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            if base.startswith("scaling_rl"):
                deps |= {f"{base}.{a.name}" if f"{base}.{a.name}" in mods else resolve(base) for a in node.names}
        graph[mod] = {d for d in deps if d and d != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out
